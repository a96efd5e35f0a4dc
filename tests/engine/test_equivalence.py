"""The simulation backend (vectorized engine) against the sequential reference backend.

From the same start models and the same schedule, both backends must return the same replies:
in float64 to 1e-10, in float32 within 1e-5 (relative to the parameters' scale). Every built-in
model (MLP, LeNet with and without GroupNorm, a stride-2 CNN with a one-layer head,
LEAF CNN, linear regression) and one custom
module (generic torch.func path) is checked under every optimizer setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.engine.generic import GenericKernel
from clusterfl.engine.stacked_cnn import CNNKernel
from clusterfl.engine.stacked_mlp import MLPKernel
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LocalTraining,
    LossRequest,
    Predictor,
    TrainRequest,
)

SIZES = [13, 40, 5, 27, 0, 9]  # unequal clients, short last batches, one without data
# the reference cannot run a model on zero rows (zoo.MLP / LinearRegression reshape [0, ...]
# to [0, -1]), so requests that need outputs on every client's rows use clients with data
FILLED = [13, 40, 5, 27, 3, 9]


class TinyNet(nn.Module):
    """A user module no fast path knows: conv → tanh → LayerNorm → linear."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv = nn.Conv2d(c, 3, 3, padding=1)
        self.norm = nn.LayerNorm(3 * h * w)
        self.fc = nn.Linear(3 * h * w, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(torch.tanh(self.conv(x)).flatten(1)))


class TinyFactory(ModelFactory):
    """A factory for `TinyNet` (a custom architecture)."""

    def build(self) -> nn.Module:
        return TinyNet(tuple(self.input_shape), self.n_outputs)


# name: (model config, input shape, task, kernel class the auto choice must pick)
MODELS: dict[str, tuple[dict, tuple[int, ...], str, type]] = {
    "mlp": ({"name": "mlp", "hidden": [16, 8]}, (1, 6, 6), "classification", MLPKernel),
    # dropout: each client's noise from its own generator (`protocol.client_seed`), as the
    # loop seeds it; one generator per chunk gave other masks (2.8e-3 apart after a round)
    "mlp_dropout": ({"name": "mlp", "hidden": [16, 8], "dropout": 0.3}, (1, 6, 6),
                    "classification", MLPKernel),
    "lenet": ({"name": "lenet", "channels": [4, 6], "hidden": [16, 12]}, (1, 8, 8),
              "classification", CNNKernel),
    "lenet_gn": ({"name": "lenet", "channels": [4, 6], "hidden": [16, 12], "groups": 2},
                 (3, 8, 8), "classification", CNNKernel),
    "cnn_stride": ({"name": "lenet", "channels": [3, 5], "hidden": [], "downsample": "stride"},
                   (1, 8, 8), "classification", CNNKernel),
    "leaf_cnn": ({"name": "leaf_cnn", "hidden": 16}, (1, 4, 4), "classification", CNNKernel),
    "leaf_cnn_gn": ({"name": "leaf_cnn", "hidden": 12, "groups": 4}, (1, 4, 4),
                    "classification", CNNKernel),
    "linear": ({"name": "linear"}, (5,), "regression", MLPKernel),
    "custom": ({"name": "mlp"}, (2, 4, 4), "classification", GenericKernel),
}

SETTINGS: dict[str, LocalTraining] = {
    "sgd": LocalTraining(lr=0.05, batch_size=8),
    "momentum_wd": LocalTraining(lr=0.05, momentum=0.9, weight_decay=0.01, batch_size=8, epochs=2),
    "adam": LocalTraining(optimizer="adam", lr=0.01, weight_decay=1e-3, batch_size=8),
    "prox": LocalTraining(lr=0.05, momentum=0.5, mu=0.5, batch_size=8),
    "adam_prox_steps": LocalTraining(optimizer="adam", lr=0.01, mu=0.2, steps=4, batch_size=8),
    "steps_big_batch": LocalTraining(lr=0.05, steps=3, batch_size=16),  # clients < batch
    "offset": LocalTraining(lr=0.05, momentum=0.9, batch_size=8),
}


@pytest.fixture(params=[torch.float64])
def dtype(request: pytest.FixtureRequest) -> Iterator[torch.dtype]:
    """Builds modules and data in the given dtype (the reference follows the default dtype)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    yield request.param
    torch.set_default_dtype(old)


def make_federation(
    shape: tuple[int, ...], task: str, sizes: list[int], seed: int = 0
) -> Federation:
    """Random data in the default dtype; the test split has other sizes than the train split."""
    g = torch.Generator().manual_seed(seed)
    test_sizes = [max(1, s // 2) for s in sizes]

    def part(sz: list[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        n = sum(sz)
        x = torch.rand(n, *shape, generator=g, dtype=torch.float64).to(torch.get_default_dtype())
        if task == "regression":
            y = torch.randn(n, generator=g, dtype=torch.float64).to(torch.get_default_dtype())
        else:
            y = torch.randint(0, 4, (n,), generator=g)
        return x, y, np.concatenate([[0], np.cumsum(sz)])

    return Federation(*part(sizes), *part(test_sizes), clusters=None,
                      n_classes=4 if task == "classification" else 1, task=task)


def setup(name: str, sizes: list[int] = SIZES, chunk_size: int = 4, kernel: str = "auto"):
    """(federation, factory, sequential backend, simulation backend) for one model."""
    cfg, shape, task, _ = MODELS[name]
    fed = make_federation(shape, task, sizes)
    make = TinyFactory if name == "custom" else ModelFactory
    fac = make(model_config(cfg), shape, fed.n_outputs)
    sim = SimulationBackend(fed, fac, chunk_size, kernel=kernel)
    return fed, fac, SequentialBackend(fed, fac), sim


def close(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray, dtype: torch.dtype) -> None:
    """Equal to 1e-10 (float64) or to 1e-5 of the scale of `b` (float32)."""
    a, b = (x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
            for x in (a, b))  # a GPU backend's models and gradients stay on the GPU
    assert a.shape == b.shape
    if dtype == torch.float64:
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, equal_nan=True)
    else:
        scale = float(b[torch.isfinite(b)].abs().max()) if torch.isfinite(b).any() else 1.0
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * max(scale, 1.0),
                                   equal_nan=True)


def train_request(fac: ModelFactory, name: str, setting: str, n: int) -> TrainRequest:
    tr = SETTINGS[setting]
    if name == "linear":
        tr = replace(tr, lr=tr.lr / 5)
    models = fac.init_many(3, seed=1)
    offset = None
    if setting == "offset":
        off_models = fac.init_many(2, seed=7)
        offset = Predictor(off_models, np.tile([0, 1], (n, 1)), "sum_logits")
    which = np.arange(n) % 3
    return TrainRequest(np.arange(n), models, which, tr, seed=11, offset=offset)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", list(MODELS))
def test_train_matches_reference(name: str, setting: str, dtype: torch.dtype) -> None:
    sizes = FILLED if setting == "offset" else SIZES
    fed, fac, seq, sim = setup(name, sizes)
    assert type(sim.engine.kernel) is MODELS[name][3]
    req = train_request(fac, name, setting, fed.n_clients)
    a, b = sim.train(req), seq.train(req)
    assert a.params.dtype == dtype
    close(a.params, b.params, dtype)
    close(a.loss, b.loss, dtype)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)
    if 0 in sizes:  # the client without data is returned unchanged, with a NaN loss
        i = sizes.index(0)
        assert torch.equal(a.params[i], req.models[req.model_of_client[i]])
        assert np.isnan(a.loss[i])


@pytest.mark.parametrize("setting", ["momentum_wd", "adam", "offset"])
@pytest.mark.parametrize("name", list(MODELS))
def test_train_matches_reference_float32(name: str, setting: str) -> None:
    fed, fac, seq, sim = setup(name, FILLED)
    req = train_request(fac, name, setting, fed.n_clients)
    if setting == "adam":
        # Adam divides by sqrt(v): on coordinates whose gradient is ~0 (dead ReLU units) it
        # turns float32 rounding noise into steps of size ~lr. A larger eps bounds that gain.
        req.training = replace(req.training, eps=1e-4)
    a, b = sim.train(req), seq.train(req)
    assert a.params.dtype == torch.float32
    close(a.params, b.params, torch.float32)
    close(a.loss, b.loss, torch.float32)


def test_generic_path_matches_on_builtin_models(dtype: torch.dtype) -> None:
    """Forcing the torch.func path on a CNN gives the reference too."""
    fed, fac, seq, sim = setup("lenet_gn", kernel="generic")
    req = train_request(fac, "lenet_gn", "adam", fed.n_clients)
    close(sim.train(req).params, seq.train(req).params, dtype)


CNN_MODELS = [name for name, spec in MODELS.items() if spec[3] is CNNKernel]


@pytest.mark.parametrize("setting", ["sgd", "adam_prox_steps", "offset"])
@pytest.mark.parametrize("name", CNN_MODELS)
def test_im2col_convolutions_match_reference(name: str, setting: str,
                                             dtype: torch.dtype) -> None:
    """The unfolded-product convolutions (CUDA's default, forced here on the CPU) give the
    reference's training, gradients and outputs; on the CPU "cnn" stays grouped."""
    sizes = FILLED if setting == "offset" else SIZES
    fed, fac, seq, sim = setup(name, sizes, kernel="cnn-im2col")
    kernel = sim.engine.kernel
    assert isinstance(kernel, CNNKernel) and kernel.im2col(torch.device("cpu"))
    assert not setup(name, sizes)[3].engine.kernel.im2col(torch.device("cpu"))
    req = train_request(fac, name, setting, fed.n_clients)
    a, b = sim.train(req), seq.train(req)
    close(a.params, b.params, dtype)
    close(a.loss, b.loss, dtype)
    grad = GradientRequest(np.arange(fed.n_clients), req.models, req.model_of_client, 8, seed=5)
    close(sim.gradient(grad).grads, seq.gradient(grad).grads, dtype)


def test_auto_unfolds_on_cuda_outside_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measured choice (`stacked_cnn`): unfolded products on CUDA in float32 and TF32,
    the grouped convolution on the CPU and under bfloat16 autocast; forcing wins."""
    fac = setup("lenet")[1]
    module = fac.build()
    auto, grouped, unfolded = (CNNKernel(module, fac.layout, c)
                               for c in ("auto", "grouped", "im2col"))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert auto.im2col(cuda) and not auto.im2col(cpu)
    assert unfolded.im2col(cpu) and not grouped.im2col(cuda)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: True)
    assert not auto.im2col(cuda) and unfolded.im2col(cuda)
    with pytest.raises(ValueError, match="allowed: auto, grouped, im2col"):
        CNNKernel(module, fac.layout, "winograd")


def test_im2col_chunks_count_the_unfolded_patches() -> None:
    """GPU chunk sizes count each convolution's patches and their gradient under im2col:
    LeNet (5×5 kernels, padding 2) on 3×32×32 unfolds 3·5·5·32·32 + 6·5·5·16·16 floats per
    sample, twice."""
    fed = make_federation((3, 32, 32), "classification", [4, 4])
    fac = ModelFactory(model_config({"name": "lenet"}), (3, 32, 32), fed.n_outputs)
    grouped, unfolded = (SimulationBackend(fed, fac, kernel=k).engine
                         for k in ("cnn-grouped", "cnn-im2col"))
    extra = 2 * (3 * 25 * 32 * 32 + 6 * 25 * 16 * 16)
    bits = torch.finfo(torch.float64).bits // 8
    assert (unfolded.sample_bytes(torch.float64) - grouped.sample_bytes(torch.float64)
            == extra * bits)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("batch", [8, None])
@pytest.mark.parametrize("name", list(MODELS))
def test_gradient_matches_reference(name: str, batch: int | None, shared: bool,
                                    dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, sizes=[13, 40, 5, 27, 9], chunk_size=3)
    models = fac.init_many(3, seed=2)
    which = np.zeros(fed.n_clients, int) if shared else np.array([2, 0, 1, 0, 2])
    req = GradientRequest(np.arange(fed.n_clients), models, which, batch, seed=5)
    a, b = sim.gradient(req), seq.gradient(req)
    close(a.grads, b.grads, dtype)
    close(a.loss, b.loss, dtype)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)


@pytest.mark.parametrize("with_offset", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_losses_match_reference(name: str, with_offset: bool, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, FILLED)
    models = fac.init_many(3, seed=3)
    clients = np.array([5, 0, 1, 3, 4])
    offset = None
    if with_offset:
        offset = Predictor.single(fac.init_many(2, seed=4), np.array([0, 1, 1, 0, 1]))
    for split in ("train", "test"):
        req = LossRequest(clients, models, split, offset)
        a, b = sim.losses(req), seq.losses(req)
        close(a.loss, b.loss, dtype)
        close(a.accuracy, b.accuracy, dtype)


def predictor_for(fac: ModelFactory, n: int, how: str) -> Predictor:
    """A predictor for `n` clients (n = 6) that takes each evaluation path: "single" (two
    models shared by all clients: the grouped path), "own_models" (one model per client: the
    stacked path), or two members per client combined by `how`."""
    if how == "single":
        return Predictor.single(fac.init_many(2, seed=5), np.arange(n) % 2)
    if how == "own_models":
        return Predictor.single(fac.init_many(n, seed=5), np.arange(n)[::-1].copy())
    return Predictor(fac.init_many(3, seed=6), np.array([[0, 1], [1, 2], [2, 0]] * 2), how)


@pytest.mark.parametrize("how", ["single", "own_models", "sum_logits", "mean_probs"])
@pytest.mark.parametrize("name", list(MODELS))
def test_evaluate_matches_reference(name: str, how: str, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, FILLED)
    n = fed.n_clients
    pred = predictor_for(fac, n, how)
    for split in ("test", "train"):
        req = EvaluateRequest(np.arange(n), pred, split)
        a, b = sim.evaluate(req), seq.evaluate(req)
        for field in ("accuracy", "macro_f1", "loss"):
            close(getattr(a, field), getattr(b, field), dtype)
        close(a.extras["mse"], b.extras["mse"], dtype)
        np.testing.assert_array_equal(a.n_samples, b.n_samples)
