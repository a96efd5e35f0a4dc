"""`[backend] precision = "bf16-mixed"` (issue 37): the engine's kernels under bfloat16
autocast (`engine.device.compute_scope`), called directly, here on the CPU (torch runs bf16
autocast there too) and, where a GPU is present, on CUDA.

What bf16-mixed promises: the products and convolutions run in bfloat16, while parameters,
optimizer state, gradients, outputs and losses come back float32. So:

- the results are float32 and close to the float32 ones, client by client (each client's
  parameters, gradient, loss; each sample's outputs). bfloat16 keeps 8 significant bits
  (unit roundoff u = 2^-9 ≈ 2e-3): every product rounds its inputs and its result to that,
  and a few u per layer, forward and backward, give relative distances of about 1e-2. The
  median over clients must be below `TOL` (3e-2; measured at most 9.4e-3 on the CPU). Two
  cases are looser. Adam divides by sqrt(v): coordinates whose gradient is near zero take
  steps of size ~lr whatever its rounding (`TOL_ADAM`; measured 1.3e-2). GroupNorm subtracts
  the group mean from convolution outputs whose mean dominates (inputs in [0, 1]), so the
  bfloat16 rounding of those outputs, u times their magnitude, is a larger share of what
  remains, and its backward cancels the same way (`TOL_GN`; measured 5.3e-2; torch's own
  autocast of the module, the reference, is as far: 7.7e-2 on these gradients);
- no client is far off: a ReLU or max-pool decision whose input lies within rounding of the
  tie flips, and with it that unit's whole share of the gradient; in networks of 8 to 16
  hidden units and batches of 8 one flip moves a client's gradient by 5 to 20 % (measured
  over 40 dropout seeds on the CPU: 3 of them gave one such client). Hence the median above,
  and the largest per-client distance only bounded by `TOL_ANY` (4e-1; measured 1.9e-1);
- they differ from the float32 ones by much more than float32 rounding could (~1e-7):
  at least `BF16_FLOOR` = 5e-4 (about u/4), which proves that bfloat16 ran;
- "fp32" (and "tf32" on the CPU) is no scope at all: bit for bit the results without it;
- a few local epochs lower the loss under bf16-mixed as they do in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tests.engine.test_equivalence import MODELS, TinyFactory, make_federation
from tests.tiny import tiny_config

from clusterfl.config import load_config
from clusterfl.engine import reference as ref
from clusterfl.engine.common import per_sample_loss
from clusterfl.engine.device import PRECISIONS, compute_scope, low_precision
from clusterfl.engine.generic import GenericKernel
from clusterfl.engine.schedule import batch_schedule, gradient_batches
from clusterfl.engine.signatures import build_conv_ae, client_signature
from clusterfl.engine.stacked import GradientSink, StepBatch
from clusterfl.engine.stacked_cnn import CNNKernel
from clusterfl.engine.stacked_mlp import MLPKernel
from clusterfl.engine.vectorized import Rows, SplitData, VectorizedEngine
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory, model_config
from clusterfl.models.params import get_flat
from clusterfl.protocol import EmbedRequest, LocalTraining

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="bf16-mixed on CUDA NOT RUN: needs a CUDA GPU "
    "(torch.cuda.is_available() is False)"))]
#: median over clients of the relative distance to float32 allowed (module doc)
TOL = 3e-2
TOL_ADAM = 1e-1
TOL_GN = 2e-1
#: the largest relative distance of one client allowed (module doc: ReLU / max-pool flips)
TOL_ANY = 4e-1
#: the least median distance: below it the products did not run in bfloat16 (module doc)
BF16_FLOOR = 5e-4
SIZES = [13, 30, 5, 22, 9]
#: kernel name → model of `test_equivalence.MODELS` (plus an MLP with dropout)
KERNELS = {"mlp": "mlp", "mlp_dropout": "mlp", "lenet": "lenet", "lenet_gn": "lenet_gn",
           "lenet_im2col": "lenet", "lenet_gn_im2col": "lenet_gn", "generic": "custom"}
SGD = LocalTraining(lr=0.05, momentum=0.9, weight_decay=1e-3, batch_size=8)
ADAM = LocalTraining(optimizer="adam", lr=0.01, eps=1e-4, batch_size=8, mu=0.1)


@dataclass
class Setup:
    engine: VectorizedEngine
    data: SplitData
    rows: Rows
    sizes: np.ndarray
    task: str
    models: torch.Tensor
    factory: ModelFactory


def _setup(kernel: str, device: str = "cpu") -> Setup:
    cfg, shape, task, kind = MODELS[KERNELS[kernel]]
    if kernel == "mlp_dropout":
        cfg = {**cfg, "dropout": 0.25}
    fed = make_federation(shape, task, SIZES)
    make = TinyFactory if kernel == "generic" else ModelFactory
    fac = make(model_config(cfg), shape, fed.n_outputs)
    dev = torch.device(device)
    forced = "cnn-im2col" if kernel.endswith("_im2col") else "auto"  # CUDA's way, on the CPU
    engine = VectorizedEngine(fac.build().to(dev), fac.layout, forced, 4, input_shape=shape)
    assert type(engine.kernel) is kind
    x, y, off = fed.split("train")
    data = SplitData(x.to(dev).contiguous(), y.to(dev).contiguous(), off)
    clients = np.arange(fed.n_clients)
    return Setup(engine, data, Rows.of(off, clients), fed.train_sizes, task,
                 fac.init_many(3, seed=1).to(dev), fac)


def _train(s: Setup, tr: LocalTraining, models: torch.Tensor | None = None,
           seed: int = 11) -> tuple[torch.Tensor, np.ndarray]:
    clients = np.arange(len(s.sizes))
    sched = batch_schedule(s.sizes, clients, tr.batch_size, tr.epochs, tr.steps, seed)
    models = s.models if models is None else models
    which = np.arange(len(clients)) % len(models)
    return s.engine.train(s.data, s.rows, models, which, sched, tr, s.task, None, seed)


def _gradients(s: Setup) -> tuple[torch.Tensor, np.ndarray]:
    clients = np.arange(len(s.sizes))
    batches = gradient_batches(s.sizes, clients, 8, seed=5)
    which = np.array([2, 0, 1, 0, 2])
    return s.engine.gradients(s.data, s.rows, s.models, which, batches, s.task, 5)


def _outputs(s: Setup) -> list[torch.Tensor]:
    """Each client's own model (stacked kernels), and, where the kernel has one, its other
    evaluation path: K models on all rows (MLP) or one model's faster forward (CNN)."""
    outs = [s.engine.model_outputs(s.data, s.rows, s.models, np.arange(len(s.sizes)) % 3)]
    kernel = s.engine.kernel
    if isinstance(kernel, MLPKernel):
        outs.append(s.engine.all_model_outputs(s.data, s.rows, s.models))
    if isinstance(kernel, CNNKernel):
        outs.append(s.engine.model_outputs(s.data, s.rows, s.models, np.zeros(5, np.int64)))
    return outs


def _run(s: Setup, what: str, precision: str | None) -> list[torch.Tensor]:
    """The float results of `what`, under `precision` (None: outside any scope)."""
    def go() -> list[torch.Tensor]:
        if what == "train_sgd":
            params, loss = _train(s, SGD)
            return [params, torch.from_numpy(loss)]
        if what == "train_adam":
            params, loss = _train(s, ADAM)
            return [params, torch.from_numpy(loss)]
        if what == "gradients":
            grads, loss = _gradients(s)
            return [grads, torch.from_numpy(loss)]
        return _outputs(s)

    if precision is None:
        return go()
    with compute_scope(s.data.x.device, precision):
        return go()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 (NaN entries of `b`, clients without data, left out)."""
    keep = torch.isfinite(b)
    a, b = a[keep].double(), b[keep].double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _per_row(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """`_rel` of each row (a client's parameters, gradient or loss; a sample's outputs);
    rows where `b` is NaN (clients without data) left out."""
    keep = torch.isfinite(b).reshape(len(b), -1).all(1)
    a, b = a[keep].double().reshape(int(keep.sum()), -1), b[keep].double().reshape(
        int(keep.sum()), -1)
    return ((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).cpu().numpy()


WHAT = ["train_sgd", "train_adam", "gradients", "outputs"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_bf16_mixed_is_float32_close_to_fp32_and_not_equal(kernel: str, device: str) -> None:
    s = _setup(kernel, device)
    start = s.models[np.arange(len(SIZES)) % 3]
    for what in WHAT:
        if what == "train_adam" and kernel != "mlp":
            continue  # one kernel suffices for Adam with the proximal term (the sink's update)
        want = _run(s, what, None)
        got = _run(s, what, "bf16-mixed")
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device
            assert torch.equal(torch.isnan(g), torch.isnan(w))  # the same clients without data
        assert got[0].dtype == torch.float32 and got[0].device.type == device
        if what.startswith("train"):  # compare the updates: the parameters move little
            dist = _per_row(got[0] - start, want[0] - start)
        else:
            dist = _per_row(got[0], want[0])
        tol = TOL_ADAM if what == "train_adam" else TOL_GN if "gn" in kernel else TOL
        assert BF16_FLOOR < np.median(dist) < tol, (what, dist)
        assert dist.max() < TOL_ANY, (what, dist)
        for g, w in zip(got[1:], want[1:]):  # losses, the other evaluation path
            other = _per_row(g, w)
            assert np.median(other) < tol and other.max() < TOL_ANY, (what, other)
            if what == "outputs":
                assert np.median(other) > BF16_FLOOR, what


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_a_kernel_step_under_bf16_gives_float32(kernel: str, device: str) -> None:
    """One step of the kernel itself: the loss, the gradients handed to the sink and the
    outputs are float32 (bf16 losses would be multiples of 2^-8 of their magnitude)."""
    s = _setup(kernel, device)
    k, dev = s.engine.kernel, s.data.x.device
    idx = torch.arange(4 * 8, device=dev).view(4, 8)
    x, y = k.gather(s.data.x, idx), s.data.y[idx]
    w = torch.full((4, 8), 1 / 8, device=dev)
    params = list(s.factory.layout.views(s.models[np.arange(4) % 3]).values())
    batch = StepBatch(x, y, w, None, s.task, torch.Generator(dev).manual_seed(0))
    with compute_scope(dev, "bf16-mixed"):
        sink = GradientSink(k.shapes, 4, torch.float32, None, dev)
        loss = k.train_step(params, batch, sink)
        out = k.forward(params, x)
    assert loss.dtype == torch.float32 and out.dtype == torch.float32
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in sink.out)
    assert not torch.equal(loss.bfloat16().float(), loss)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_scope_changes_nothing(kernel: str, precision: str) -> None:
    s = _setup(kernel)
    for what in WHAT:
        plain = _run(s, what, None)
        scoped = _run(s, what, precision)
        for a, b in zip(scoped, plain):
            assert torch.equal(a, b) or (torch.equal(torch.isnan(a), torch.isnan(b))
                                         and torch.equal(a.nan_to_num(), b.nan_to_num()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["mlp", "lenet", "lenet_gn", "generic"])
def test_local_epochs_under_bf16_lower_the_loss_as_fp32_does(kernel: str, device: str) -> None:
    s = _setup(kernel, device)
    flat = s.data.x.flatten(1)  # labels a model can learn: the best of 4 fixed projections
    proj = torch.randn(flat.shape[1], 4, generator=torch.Generator().manual_seed(0))
    s.data.y = ((flat - flat.mean(0)) @ proj.to(flat.device)).argmax(1)
    tr = LocalTraining(optimizer="adam", lr=0.02, batch_size=8, epochs=5)
    start = s.models[:1]

    def mean_loss(models: torch.Tensor) -> float:
        with compute_scope(s.data.x.device, "bf16-mixed"):  # evaluation under bf16 too
            out = s.engine.model_outputs(s.data, s.rows, models, np.arange(len(SIZES)))
        assert out.dtype == torch.float32
        return float(per_sample_loss(out, s.data.y, s.task).mean())

    before = mean_loss(start.expand(len(SIZES), -1))
    after = {}
    for precision in ("fp32", "bf16-mixed"):
        with compute_scope(s.data.x.device, precision):
            params, loss = _train(s, tr, start)
        assert params.dtype == torch.float32 and np.isfinite(loss).all()
        after[precision] = mean_loss(params)
    gain = before - after["fp32"]  # measured on the CPU: 0.09 (LeNet) to 1.1 (generic)
    assert gain > 0.05
    assert abs(after["bf16-mixed"] - after["fp32"]) < 0.2 * gain  # measured: < 0.03 · gain


def test_the_reference_under_bf16_mixed() -> None:
    """The sequential backend's per-client loop: float32 results close to fp32, and the
    same under a plain `torch.autocast` (whose weight cache `_fresh_casts` turns off: with
    it, every step after the first would see the first step's bfloat16 weights)."""
    s = _setup("mlp")
    module = s.factory.build()
    x, y = s.data.x[: SIZES[0]], s.data.y[: SIZES[0]]
    sched = torch.from_numpy(batch_schedule(s.sizes[:1], np.zeros(1, np.int64), 4, 1, 0,
                                            1)[0])
    start = s.models[0]

    def train() -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
        p, loss = ref.train_client(module, start, x, y, sched, SGD, s.task)
        g, _ = ref.gradient_client(module, start, x, y, torch.arange(8), s.task)
        return p, loss, g, ref.predict(module, start, x)

    want = train()
    with compute_scope(torch.device("cpu"), "bf16-mixed"):
        got = train()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the cache on
        plain = train()
    assert all(t.dtype == torch.float32 for t in (got[0], got[2], got[3]))
    assert BF16_FLOOR < _rel(got[0] - start, want[0] - start) < TOL
    assert got[1] == pytest.approx(want[1], rel=TOL)
    assert BF16_FLOOR < _rel(got[2], want[2]) < TOL
    assert BF16_FLOOR < _rel(got[3], want[3]) < TOL
    for a, b in zip(plain, got):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def test_the_mixed_path_is_taken_only_for_float32_under_autocast() -> None:
    f32, f64 = torch.zeros(1), torch.zeros(1, dtype=torch.float64)
    assert low_precision(f32) is None
    with compute_scope(torch.device("cpu"), "bf16-mixed"):
        assert low_precision(f32) == torch.bfloat16
        assert low_precision(f64) is None  # float64 runs ignore autocast, as torch does
    with compute_scope(torch.device("cpu"), "fp32"):
        assert low_precision(f32) is None


def test_float64_ignores_bf16_mixed() -> None:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        s = _setup("lenet")
        want = _run(s, "train_sgd", None)
        got = _run(s, "train_sgd", "bf16-mixed")
    finally:
        torch.set_default_dtype(old)
    assert got[0].dtype == torch.float64 and torch.equal(got[0], want[0])


def test_the_generic_kernel_loop_fallback_under_bf16() -> None:
    s = _setup("generic")
    assert isinstance(s.engine.kernel, GenericKernel)
    want = _run(s, "gradients", None)
    s.engine.kernel.use_vmap = False  # the per-client autograd loop
    got = _run(s, "gradients", "bf16-mixed")
    assert got[0].dtype == torch.float32 and BF16_FLOOR < _rel(got[0], want[0]) < TOL


def test_signatures_stay_float32_under_bf16_mixed() -> None:
    """FLT's client signatures (a one-off CPU step feeding k-means) ignore the precision:
    with fine-tuning, autocast's weight cache would even train on stale weights."""
    x = torch.rand(12, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    encoder = build_conv_ae((1, 8, 8), 8)
    req = EmbedRequest(np.array([0]), "encoder", get_flat(encoder), 8, k=2, latent=8,
                       finetune_epochs=2, finetune_batch_size=4, kmeans_n_init=1)
    want = client_signature(x, None, req, seed=3)
    with compute_scope(torch.device("cpu"), "bf16-mixed"):
        got = client_signature(x, None, req, seed=3)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- the setting


def test_bf16_mixed_is_an_allowed_precision() -> None:
    assert PRECISIONS == ("fp32", "tf32", "bf16-mixed")
    config = load_config(tiny_config(backend={"name": "simulation", "precision": "bf16-mixed"}))
    assert config.backend.precision == "bf16-mixed"  # type: ignore[attr-defined]
    assert config.to_dict()["backend"]["precision"] == "bf16-mixed"


@pytest.mark.parametrize("backend", ["simulation", "sequential"])
@pytest.mark.parametrize("bad", ["fp16", "bf16", "BF16-mixed", "", 16])
def test_an_unknown_precision_is_a_one_line_error_naming_the_allowed_ones(backend: str,
                                                                          bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(backend={"name": backend, "precision": bad}))
    assert err.value.field == "backend.precision"
    assert "'fp32', 'tf32' or 'bf16-mixed'" in err.value.message
    assert "\n" not in str(err.value)


def test_compute_scope_refuses_an_unknown_precision() -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp16'; allowed: fp32, tf32, "
                                         "bf16-mixed"), compute_scope(torch.device("cpu"),
                                                                      "fp16"):
        pass
    with compute_scope(torch.device("cpu"), "bf16-mixed"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
