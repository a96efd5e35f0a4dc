"""Vectorized engine details: masking, chunking, the stacked optimizer, fallbacks, metrics."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.engine import reference as ref
from clusterfl.engine.common import client_metrics
from clusterfl.engine.generic import GenericKernel
from clusterfl.engine.stacked import StackedOptimizer, Workspace
from clusterfl.engine.stacked_cnn import CNNKernel
from clusterfl.engine.stacked_mlp import MLPKernel
from clusterfl.engine.vectorized import (
    Rows,
    SplitData,
    VectorizedEngine,
    client_metrics_batched,
    select_kernel,
)
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LocalTraining,
    LossRequest,
    Predictor,
    TrainRequest,
)


@pytest.fixture
def f64() -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def federation(sizes: list[int], shape: tuple[int, ...] = (1, 4, 4), seed: int = 0) -> Federation:
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    off = np.concatenate([[0], np.cumsum(sizes)])
    x = torch.rand(n, *shape, generator=g, dtype=torch.float64).to(torch.get_default_dtype())
    y = torch.randint(0, 3, (n,), generator=g)
    return Federation(x, y, off, x.clone(), y.clone(), off, None, 3)


def mlp_factory(fed: Federation, **cfg: object) -> ModelFactory:
    return ModelFactory(model_config({"name": "mlp", "hidden": [6], **cfg}), fed.input_shape, 3)


@pytest.mark.parametrize(
    "tr",
    [
        LocalTraining(lr=0.1, momentum=0.9, weight_decay=0.01, mu=0.3, batch_size=4),
        LocalTraining(optimizer="adam", lr=0.05, weight_decay=0.01, batch_size=4),
    ],
    ids=["momentum", "adam"],
)
def test_schedule_with_holes_matches_reference(tr: LocalTraining, f64: None) -> None:
    """Steps where a client has no batch leave it (and its optimizer state) unchanged, even
    when the active clients are not a prefix (not produced by batch_schedule, but handled)."""
    fed = federation([6, 7, 5])
    fac = mlp_factory(fed)
    module = fac.build()
    sched = np.full((3, 4, 4), -1)
    sched[0, 0, :3], sched[0, 2, :4], sched[0, 3, :2] = [0, 1, 2], [3, 4, 5, 0], [1, 2]
    sched[1, 1, :4], sched[1, 2, :3] = [0, 1, 2, 3], [4, 5, 6]
    sched[2, 0, :4], sched[2, 3, :1] = [0, 1, 2, 3], [4]
    models = fac.init_many(2, seed=3)
    which = np.array([0, 1, 0])
    engine = VectorizedEngine(fac.build(), fac.layout, chunk_size=3)
    data = SplitData(fed.x_train, fed.y_train, fed.train_offsets)
    rows = Rows.of(fed.train_offsets, np.arange(3))
    params, loss = engine.train(data, rows, models, which, sched, tr, fed.task, None, seed=0)
    for i in range(3):
        x, y = fed.client_train(i)
        p, ell = ref.train_client(module, models[which[i]], x, y, torch.from_numpy(sched[i]),
                                  tr, fed.task)
        torch.testing.assert_close(params[i], p, rtol=1e-10, atol=1e-10)
        assert loss[i] == pytest.approx(ell, rel=1e-10)


def test_stacked_optimizer_matches_torch_optim_per_client(f64: None) -> None:
    """Prefix steps with per-client step counts (Adam bias corrections) against torch.optim."""
    torch.manual_seed(0)
    n, shape = 3, (4, 5)
    start = torch.randn(n, *shape)
    steps_active = [3, 3, 2, 1, 1]  # clients active at each step: a prefix of that length
    grads = [torch.randn(n, *shape) for _ in steps_active]
    for tr in (
        LocalTraining(lr=0.1, momentum=0.9, weight_decay=0.05, mu=0.5),
        LocalTraining(optimizer="adam", lr=0.1, weight_decay=0.05, mu=0.5),
        LocalTraining(lr=0.1),
    ):
        params = [start.clone()]
        opt = StackedOptimizer(params, tr, [start.clone()])
        for s, a in enumerate(steps_active):
            opt.begin(a, np.ones(a, bool))
            if s % 2:  # both sink entry points: a product, and a plain gradient
                eye = torch.eye(4).expand(a, 4, 4)
                opt.matmul(0, eye, grads[s][:a].clone())
            else:
                opt.grad(0, grads[s][:a].clone())
        for i in range(n):
            w = nn.Parameter(start[i].clone())
            torch_opt = ref.make_optimizer([w], tr)
            for s, a in enumerate(steps_active):
                if i < a:
                    torch_opt.zero_grad()
                    (0.5 * tr.mu * ((w - start[i]) ** 2).sum() + (w * grads[s][i]).sum()).backward()
                    torch_opt.step()
            torch.testing.assert_close(params[0][i], w.detach(), rtol=1e-12, atol=1e-12)


def test_clients_outside_the_prefix_are_untouched() -> None:
    params = [torch.randn(4, 3, 2)]
    before = params[0].clone()
    opt = StackedOptimizer(params, LocalTraining(optimizer="adam", lr=0.1), None)
    opt.begin(2, np.ones(2, bool))
    opt.grad(0, torch.ones(2, 3, 2))
    assert torch.equal(params[0][2:], before[2:])
    assert torch.equal(opt.exp_avg[0][2:], torch.zeros(2, 3, 2))
    assert list(opt.steps) == [1, 1, 0, 0]
    assert not torch.equal(params[0][:2], before[:2])


def test_chunking_and_memory_budget_do_not_change_results(f64: None) -> None:
    fed = federation([9, 3, 12, 5, 7])
    fac = mlp_factory(fed)
    req = TrainRequest(np.arange(5), fac.init_many(2, 1), np.array([0, 1, 0, 1, 0]),
                       LocalTraining(optimizer="adam", lr=0.05, batch_size=4, epochs=2), seed=3)
    full = SimulationBackend(fed, fac, chunk_size=64).train(req)
    one = SimulationBackend(fed, fac, chunk_size=1).train(req)
    tight = SimulationBackend(fed, fac)
    tight.engine.state_budget = 1  # forces one client per chunk
    torch.testing.assert_close(one.params, full.params, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tight.train(req).params, full.params, rtol=1e-12, atol=1e-12)


def test_repeated_clients_and_any_order_match_reference(f64: None) -> None:
    fed = federation([9, 3, 12, 5])
    fac = mlp_factory(fed)
    seq, sim = SequentialBackend(fed, fac), SimulationBackend(fed, fac, chunk_size=2)
    req = TrainRequest(np.array([2, 0, 2, 3]), fac.init_many(3, 1), np.array([0, 1, 2, 1]),
                       LocalTraining(lr=0.1, momentum=0.5, batch_size=4), seed=1)
    torch.testing.assert_close(sim.train(req).params, seq.train(req).params, rtol=1e-10, atol=1e-10)
    ev = EvaluateRequest(np.array([3, 1, 3]), Predictor.single(req.models, np.array([0, 2, 1])))
    np.testing.assert_allclose(sim.evaluate(ev).loss, seq.evaluate(ev).loss, rtol=1e-10)


class Branchy(nn.Module):
    """Data-dependent control flow: vmap cannot trace it, so the generic kernel loops."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        self.fc = nn.Linear(int(np.prod(input_shape)), n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.flatten(1))
        if float(h.detach().sum()) > 0:
            h = h * 2
        return h


class BranchyFactory(ModelFactory):
    def build(self) -> nn.Module:
        return Branchy(tuple(self.input_shape), self.n_outputs)


def test_generic_kernel_falls_back_to_a_loop(f64: None) -> None:
    fed = federation([6, 9, 4])
    fac = BranchyFactory(model_config({"name": "mlp"}), fed.input_shape, 3)
    seq, sim = SequentialBackend(fed, fac), SimulationBackend(fed, fac)
    assert isinstance(sim.engine.kernel, GenericKernel)
    req = TrainRequest(np.arange(3), fac.init_many(1, 0), np.zeros(3, int),
                       LocalTraining(lr=0.1, batch_size=4), seed=0)
    torch.testing.assert_close(sim.train(req).params, seq.train(req).params, rtol=1e-10, atol=1e-10)
    assert sim.engine.kernel.use_vmap is False  # type: ignore[attr-defined]
    ev = EvaluateRequest(np.arange(3), Predictor.single(fac.init_many(3, 0), np.arange(3)))
    np.testing.assert_allclose(sim.evaluate(ev).loss, seq.evaluate(ev).loss, rtol=1e-10)


def test_dropout_is_seeded_and_applied() -> None:
    fed = federation([20, 15])
    fac = mlp_factory(fed, dropout=0.5)
    sim = SimulationBackend(fed, fac)
    tr = LocalTraining(lr=0.1, batch_size=5)
    req = TrainRequest(np.arange(2), fac.init_many(1, 0), np.zeros(2, int), tr, seed=4)
    a, b = sim.train(req), sim.train(req)
    assert torch.equal(a.params, b.params)
    other = sim.train(TrainRequest(np.arange(2), req.models, np.zeros(2, int), tr, seed=5))
    assert not torch.equal(a.params, other.params)
    plain = SimulationBackend(fed, mlp_factory(fed)).train(req)
    assert not torch.allclose(a.params, plain.params)
    assert np.all(np.isfinite(a.loss))
    g = sim.gradient(GradientRequest(np.arange(2), req.models, np.zeros(2, int), 5, seed=1))
    assert torch.isfinite(g.grads).all()


def test_dropout_noise_does_not_depend_on_the_chunk_or_the_other_clients() -> None:
    """One generator per chunk drew a client's masks after those of the clients before it:
    chunk_size 1 and 3 gave models 2e-3 apart, and a client's training changed with the
    sample it was drawn in. Each client now draws from its own (`protocol.client_seed`)."""
    fed = federation([20, 15, 9, 12, 7])
    fac = mlp_factory(fed, dropout=0.5)
    tr = LocalTraining(lr=0.1, batch_size=4, epochs=2)
    models = fac.init_many(1, 0)
    req = TrainRequest(np.arange(5), models, np.zeros(5, int), tr, seed=4)
    whole = [SimulationBackend(fed, fac, chunk).train(req).params for chunk in (1, 3, 64)]
    assert torch.equal(whole[0], whole[1]) and torch.equal(whole[0], whole[2])
    alone = SimulationBackend(fed, fac).train(
        TrainRequest(np.array([3]), models, np.zeros(1, int), tr, seed=4)).params
    assert torch.equal(alone[0], whole[2][3])  # client 3 trains the same in any company


def test_kernel_selection() -> None:
    shape = (1, 8, 8)
    for name, kind in (("mlp", MLPKernel), ("linear", MLPKernel), ("lenet", CNNKernel),
                       ("leaf_cnn", CNNKernel), ("conv_ae", GenericKernel)):
        fac = ModelFactory(model_config({"name": name}), shape, 3)
        assert type(select_kernel(fac.build(), fac.layout)) is kind
    fac = ModelFactory(model_config({"name": "mlp"}), shape, 3)
    assert type(select_kernel(fac.build(), fac.layout, "generic")) is GenericKernel
    with pytest.raises(ValueError, match="does not handle"):
        select_kernel(fac.build(), fac.layout, "cnn")


def test_empty_requests_and_clients_without_data() -> None:
    fed = federation([5, 0, 7], shape=(1, 8, 8))
    fac = ModelFactory(model_config({"name": "lenet", "channels": [2, 3], "hidden": [8, 6]}),
                       fed.input_shape, 3)
    seq, sim = SequentialBackend(fed, fac), SimulationBackend(fed, fac)
    m = fac.init_many(2, 0)
    none = np.zeros(0, int)
    tr = LocalTraining(batch_size=4)
    assert sim.train(TrainRequest(none, m, none, tr, 0)).params.shape == (0, fac.size)
    assert sim.gradient(GradientRequest(none, m, none, 4, 0)).grads.shape == (0, fac.size)
    assert sim.losses(LossRequest(none, m)).loss.shape == (0, 2)
    assert len(sim.evaluate(EvaluateRequest(none, Predictor.single(m, none))).accuracy) == 0
    req = GradientRequest(np.arange(3), m, np.array([0, 1, 1]), 4, seed=2)
    a, b = sim.gradient(req), seq.gradient(req)
    torch.testing.assert_close(a.grads, b.grads, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-5)  # NaN for the client without data
    tr_req = TrainRequest(np.arange(3), m, np.array([0, 1, 0]), tr, seed=2)
    out = sim.train(tr_req)
    assert torch.equal(out.params[1], m[1]) and np.isnan(out.loss[1])


def test_models_in_float64_on_float32_data() -> None:
    fed = federation([6, 4])
    fac = mlp_factory(fed)
    sim = SimulationBackend(fed, fac)
    m = fac.init_many(1, 0).double()
    out = sim.train(TrainRequest(np.arange(2), m, np.zeros(2, int), LocalTraining(batch_size=4), 0))
    assert out.params.dtype == torch.float64 and torch.isfinite(out.params).all()


def test_batched_metrics_match_per_client_metrics() -> None:
    g = torch.Generator().manual_seed(0)
    sizes = np.array([7, 0, 12, 1, 30])
    out = torch.randn(int(sizes.sum()), 4, generator=g)
    y = torch.randint(0, 4, (int(sizes.sum()),), generator=g)
    got = client_metrics_batched(out, y, sizes, "classification", 4)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for i in range(len(sizes)):
        want = client_metrics(out[starts[i] : starts[i + 1]], y[starts[i] : starts[i + 1]],
                              "classification", 4)
        for key, value in want.items():
            np.testing.assert_allclose(got[key][i], value, rtol=1e-6)


def test_workspace_reuses_buffers() -> None:
    ws = Workspace()
    a = ws.get("k", (4, 5), torch.float32)
    b = ws.get("k", (2, 3), torch.float32)
    assert a.data_ptr() == b.data_ptr() and b.shape == (2, 3)
    c = ws.get("k", (10, 10), torch.float32)
    assert c.shape == (10, 10)
    assert ws.get("k", (2,), torch.float64).dtype == torch.float64


def test_allocator_tuning_applies_once_and_can_be_disabled() -> None:
    import subprocess
    import sys

    code = (
        "from clusterfl.engine.allocator import tune_allocator as t;"
        "print(t(), t())"
    )
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    env = {**__import__("os").environ, "CLUSTERFL_MALLOC_TUNING": "0"}
    off = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert off.stdout.split() == ["False", "False"]
    if sys.platform.startswith("linux"):  # glibc here; the call reports success both times
        assert on.stdout.split() == ["True", "True"]


@pytest.mark.parametrize(
    ("d", "dtype"), [(159010, torch.float32), (7, torch.float64), (32, torch.float32)]
)
def test_aligned_rows_start_every_row_on_a_cache_line(d: int, dtype: torch.dtype) -> None:
    from clusterfl.engine.allocator import aligned_rows

    t = aligned_rows(5, d, dtype)
    assert t.shape == (5, d) and t.dtype == dtype and t.stride(1) == 1
    assert t.stride(0) >= d and t.stride(0) * t.element_size() % 64 == 0
    assert all(t[i].data_ptr() % 64 == 0 for i in range(5))
    assert t.is_contiguous() == (d * t.element_size() % 64 == 0)


def test_gradient_reply_rows_are_aligned_and_equal_the_loop() -> None:
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [7]}), (1, 3, 3), 3)
    g = torch.Generator().manual_seed(0)
    n, per = 6, 10
    x = torch.rand(n * per, 1, 3, 3, generator=g)
    y = torch.randint(0, 3, (n * per,), generator=g)
    off = np.arange(n + 1) * per
    fed = Federation(x, y, off, x[:n].clone(), y[:n].clone(), np.arange(n + 1), None, 3)
    req = GradientRequest(np.arange(n), fac.init_many(1, 0), np.zeros(n, int), 4, seed=3)
    got = SimulationBackend(fed, fac).gradient(req).grads
    want = SequentialBackend(fed, fac).gradient(req).grads
    assert fac.size % 16 != 0 and got.stride(0) % 16 == 0  # padded rows
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_forward_fuses_first_layer_in_float32_only(dtype: torch.dtype) -> None:
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [12, 6]}), (1, 4, 4), 3)
    kernel = MLPKernel(fac.build(), fac.layout)
    models = fac.init_many(3, seed=1).to(dtype)
    params = [list(fac.layout.views(models[j]).values()) for j in range(3)]
    prepared = kernel.prepare_shared(params)
    assert (prepared.weight is not None) == (dtype == torch.float32)
    x = torch.rand(9, 1, 4, 4, dtype=dtype)
    got = [o.clone() for o in kernel.forward_shared(prepared, x)]
    for j in range(3):
        module = fac.build().to(dtype)
        torch.nn.utils.vector_to_parameters(models[j], module.parameters())
        with torch.no_grad():
            torch.testing.assert_close(got[j], module(x))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("temp", [None, 100_000, 400_000])  # 6 in one piece; 1; 5 + 1
def test_strided_bmm_writes_only_its_block_and_keeps_the_thread_count(
    threads: int, temp: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterfl.engine import stacked
    from clusterfl.engine.stacked import strided_bmm

    if temp is not None:
        monkeypatch.setattr(stacked, "_STRIDED_TEMP", temp)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        lhs, rhs = torch.randn(6, 300, 8, generator=g), torch.randn(6, 8, 260, generator=g)
        rows = torch.full((6, 300 * 260 + 7), float("nan"))  # rows of a flat reply
        out = rows[:, : 300 * 260].view(6, 300, 260)
        assert not out.is_contiguous()
        strided_bmm(out, lhs.transpose(1, 2).contiguous().transpose(1, 2), rhs)
        torch.testing.assert_close(out, torch.bmm(lhs, rhs))
        assert torch.isnan(rows[:, 300 * 260 :]).all()  # nothing written past the block
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("setting", "message"), [
    # ran as SGD on the stacked engine (torch.optim's names are lower case, no AdamW here)
    ({"optimizer": "adamw"}, "LocalTraining.optimizer: 'adamw'; allowed: 'sgd', 'adam'"),
    ({"optimizer": "SGD"}, "LocalTraining.optimizer: 'SGD'; allowed: 'sgd', 'adam'"),
    # gradient ascent on the stacked engine, refused by torch.optim on the sequential one
    ({"lr": -0.1}, "LocalTraining.lr: -0.1; allowed: a finite number >= 0"),
    ({"lr": float("nan")}, "LocalTraining.lr: nan; allowed: a finite number >= 0"),
    ({"weight_decay": -1.0}, "LocalTraining.weight_decay: -1.0; allowed: a finite number >= 0"),
    ({"mu": -1.0}, "LocalTraining.mu: -1.0; allowed: a finite number >= 0"),  # dropped
    ({"momentum": 1.5}, "LocalTraining.momentum: 1.5; allowed: a number in [0, 1)"),
    # ZeroDivisionError, and a complex-number RuntimeError, from the stacked Adam
    ({"optimizer": "adam", "betas": (1.0, 0.999)},
     "LocalTraining.betas: (1.0, 0.999); allowed: two numbers in [0, 1)"),
    ({"optimizer": "adam", "betas": (0.9, 1.5)},
     "LocalTraining.betas: (0.9, 1.5); allowed: two numbers in [0, 1)"),
    ({"batch_size": 2.5}, "LocalTraining.batch_size: 2.5; allowed: a whole number >= 1"),
    ({"epochs": 2.7}, "LocalTraining.epochs: 2.7; allowed: a whole number >= 0"),  # TypeError
    ({"steps": -1}, "LocalTraining.steps: -1; allowed: a whole number >= 0"),  # ran epochs
    ({"epochs": 0, "steps": 0},  # trained anyway
     "LocalTraining.epochs: 0; allowed: a whole number >= 1, or steps >= 1 (both are 0)"),
])
def test_local_training_out_of_range_is_one_line_naming_the_field(setting, message) -> None:
    """The Python API's LocalTraining (a run's [train] table is checked before it): settings
    the engines misread, or the two backends read differently, are refused when made."""
    from clusterfl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        LocalTraining(**{"lr": 0.1, **setting})
    assert str(err.value) == message
    fed = Federation.from_clients([(np.ones((3, 2), np.float32), np.array([0, 1, 0]),
                                    np.ones((1, 2), np.float32), np.array([1]))], n_classes=2)
    fac = ModelFactory(model_config({"name": "linear"}), fed.input_shape, fed.n_outputs)
    ok = LocalTraining(lr=0.0, eps=0.0, betas=(0.0, 0.5), optimizer="adam", steps=1)
    start = fac.init(0)[None]  # lr = 0: the bounds' edges are taken, and leave the model
    reply = SimulationBackend(fed, fac).execute(TrainRequest(np.arange(1), start,
                                                             np.zeros(1, np.int64), ok, 1))
    assert torch.equal(reply.params, start)
