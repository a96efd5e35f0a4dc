"""The GPU path's server side and memory settings, checked on the CPU (issue 37).

- `engine.transfer`: whole states, requests and replies move between devices (the "meta"
  device stands in for a GPU here: it is another device, so every tensor must move);
- the driver: a method with `device_update` gets its reply where the backend left it, the
  others on the CPU, and the state always comes back to the CPU;
- `chunk_size = "auto"`: 64 clients on the CPU (every earlier CPU result), not written into
  configs; a bad value is one line naming the field;
- 8-bit inputs kept as uint8 codes (`compact_inputs`): replies bit-identical to float inputs;
- `--resume` accepts a checkpoint made with another device, precision or chunk_size.

The same on a real GPU: tests/gpu/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tests.engine.test_equivalence import FILLED, make_federation, train_request
from tests.tiny import tiny_config

from clusterfl.algorithms.base import Ask, Update
from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig, FedAvgState
from clusterfl.backends.simulation import SimulationBackend, SimulationConfig
from clusterfl.checkpoint import comparable
from clusterfl.config import load_config
from clusterfl.engine.transfer import STAYS, device_of, move, to_cpu
from clusterfl.engine.vectorized import CPU_CHUNK, compact_inputs
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LossRequest,
    Predictor,
    TrainReply,
    TrainRequest,
)

META = torch.device("meta")


@dataclass(frozen=True)
class Inner:
    a: torch.Tensor
    tag: str


@dataclass
class Outer:
    inner: Inner
    items: list[torch.Tensor]
    table: dict[str, torch.Tensor]
    pair: tuple[torch.Tensor, np.ndarray]
    counts: np.ndarray


def _outer() -> Outer:
    return Outer(Inner(torch.ones(2), "x"), [torch.zeros(3)], {"k": torch.ones(1, 2)},
                 (torch.arange(4), np.arange(2)), np.ones(3))


def test_move_takes_every_tensor_inside_to_the_device_and_back() -> None:
    value = _outer()
    assert device_of(value) is None  # everything on the CPU
    there = move(value, META)
    assert device_of(there) == META
    assert there.inner.a.device == META and there.inner.tag == "x"  # frozen dataclass
    assert there.items[0].device == META and there.table["k"].device == META
    assert there.pair[0].device == META and isinstance(there.pair[1], np.ndarray)
    assert there.counts is value.counts  # numpy stays as it is
    assert value.inner.a.device.type == "cpu"  # the original is not changed
    assert to_cpu(value) is value


@dataclass
class _WithTable:
    model: torch.Tensor
    table: torch.Tensor = dataclasses.field(metadata=STAYS)


def test_move_leaves_a_field_declared_stays_where_it_is() -> None:
    value = _WithTable(torch.ones(2), torch.zeros(3, 2))
    there = move(value, META)
    assert there.model.device == META
    assert there.table is value.table  # the host table is not copied to the device
    left = _WithTable(torch.ones(2), torch.zeros(3, 2, device=META))
    assert to_cpu(left).table is left.table  # nor back: it stays where it was put


def test_the_host_tables_of_fesem_and_cfl_gp_are_what_move_leaves() -> None:
    """FeSEM's file-backed tables and CFL-GP's profile stay in host memory when their update
    runs on a GPU; FeSEM's k-means input stays where the replies are until its phase."""
    from clusterfl.algorithms.cam import FeSEMCAM
    from clusterfl.algorithms.cfl_gp import CFLGP, CFLGPState
    from clusterfl.algorithms.fesem import FeSEM, FeSEMState, KMeansInput

    def stays(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.metadata.get("stays")}

    assert stays(FeSEMState) == {"local", "first"}
    assert stays(KMeansInput) == {"params"}
    assert stays(CFLGPState) == {"features"}
    assert FeSEM.device_update and FeSEMCAM.device_update and CFLGP.device_update
    table = torch.zeros(4, 3)
    state = FeSEMState(torch.ones(3), np.zeros(4, dtype=np.int64), torch.ones(2, 3), table,
                       pending=KMeansInput(np.arange(2), torch.ones(2, 3), np.ones(2), [None],
                                           0))
    there = move(state, META)
    assert there.start.is_meta and there.centers.is_meta and there.local is table
    assert there.pending.params is state.pending.params


def test_the_gram_matrix_on_a_named_device_is_the_same_on_the_cpu() -> None:
    from clusterfl.clustering.spectral import gram_matrix

    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    want = (x.double() @ x.double().T).numpy()
    for got in (gram_matrix(x, chunk=16), gram_matrix(x, chunk=16, device=torch.device("cpu"))):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.array_equal(gram_matrix(x, chunk=16),
                          gram_matrix(x, chunk=16, device=torch.device("cpu")))


def test_move_returns_the_same_object_when_nothing_moves() -> None:
    value = _outer()
    assert move(value, torch.device("cpu")) is value
    assert to_cpu(np.ones(2)).shape == (2,)


class _LeftThere(SimulationBackend):
    """A backend that leaves its train replies' models on another device (as on a GPU)."""

    def train(self, req: TrainRequest) -> TrainReply:
        reply = super().train(req)
        return TrainReply(reply.clients, reply.params.to(META), reply.n_samples, reply.loss)


def _context(backend: SimulationBackend):
    from clusterfl.algorithms.base import Context
    from clusterfl.protocol import LocalTraining

    fed = backend.federation
    return Context(backend, backend.factory, LocalTraining(lr=0.1, batch_size=8),
                   fed.n_clients, fed.train_sizes, np.random.default_rng(0), 0)


def test_the_driver_keeps_replies_on_the_device_only_for_a_device_update(monkeypatch) -> None:
    fed = make_federation((1, 6, 6), "classification", FILLED)
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [8]}), fed.input_shape,
                           fed.n_outputs)
    ctx = _context(_LeftThere(fed, factory))
    seen: list[torch.device] = []

    def update(self, state: FedAvgState, t: int, ask: Ask, reply: TrainReply) -> Update:
        seen.append(reply.params.device)
        assert state.model.device == reply.params.device  # the state went where the reply is
        assert ask.request.models.device == reply.params.device  # and so did the request
        return Update(FedAvgState(reply.params[:1].clone(), state.n_clients))

    def back(value):  # to_cpu, but a meta tensor has no values to copy: zeros instead
        if isinstance(value, torch.Tensor):
            return torch.zeros(value.shape, dtype=value.dtype) if value.is_meta else value
        if dataclasses.is_dataclass(value):
            return dataclasses.replace(value, **{f.name: back(getattr(value, f.name))
                                                 for f in dataclasses.fields(value) if f.init})
        return value

    def no_checks(request, reply, config):  # the validation reads values: meta has none
        return np.ones(len(reply.clients), dtype=bool), []

    monkeypatch.setattr(FedAvg, "update", update)
    monkeypatch.setattr("clusterfl.algorithms.base.to_cpu", back)
    monkeypatch.setattr("clusterfl.robust.guard.check_reply", no_checks)
    method = FedAvg(FedAvgConfig())
    method.setup(ctx)
    method.run_round(ctx, 1)
    assert seen == [META]
    assert method.state.model.device.type == "cpu"  # kept on the CPU between steps
    assert not ctx.keep_device  # the driver's setting does not outlive its send
    monkeypatch.undo()
    monkeypatch.setattr("clusterfl.robust.guard.check_reply", no_checks)
    monkeypatch.setattr("clusterfl.algorithms.base.to_cpu", back)
    monkeypatch.setattr(FedAvg, "update", update)
    monkeypatch.setattr(FedAvg, "device_update", False)
    method.run_round(ctx, 3)
    assert seen[-1] == torch.device("cpu")  # Context.send brought it to the CPU


def test_chunk_size_auto_is_64_on_the_cpu_and_is_not_written_into_configs() -> None:
    fed = make_federation((1, 6, 6), "classification", [30] * 100)
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [8]}), fed.input_shape,
                           fed.n_outputs)
    auto = SimulationBackend(fed, factory)
    assert auto.engine.chunk_size is None
    assert auto.engine._chunk_len(2, 8, torch.float32, torch.device("cpu")) == CPU_CHUNK
    assert SimulationBackend(fed, factory, chunk_size=7).engine._chunk_len(
        2, 8, torch.float32, torch.device("cpu")) == 7
    assert "chunk_size" not in SimulationConfig().model_dump()
    assert SimulationConfig(chunk_size=12).model_dump()["chunk_size"] == 12
    req = train_request(factory, "mlp", "sgd", 100)
    a = SimulationBackend(fed, factory, chunk_size=64).train(req).params
    assert torch.equal(auto.train(req).params, a)  # auto on the CPU is the 64 of before


@pytest.mark.parametrize("bad", [0, -3, "big", 2.5, True])
def test_a_bad_chunk_size_is_one_line_naming_the_field(bad) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(backend={"name": "simulation", "chunk_size": bad}))
    assert err.value.field == "backend.chunk_size"
    assert "'auto'" in err.value.message and "\n" not in str(err.value)


def test_8_bit_inputs_are_kept_as_codes_and_give_the_same_replies_bit_for_bit() -> None:
    fed = make_federation((1, 8, 8), "classification", FILLED)
    gen = torch.Generator().manual_seed(3)
    for split in ("train", "test"):  # pixels read from bytes: k / 255
        x = getattr(fed, f"x_{split}")
        x.copy_(torch.randint(0, 256, x.shape, generator=gen).float() / 255.0)
    factory = ModelFactory(model_config({"name": "lenet", "channels": [4, 6],
                                         "hidden": [16, 12]}), fed.input_shape, fed.n_outputs)
    plain = SimulationBackend(fed, factory, compact=False)
    packed = SimulationBackend(fed, factory, compact=True)
    assert packed._split("train", torch.float32).x.dtype == torch.uint8
    assert plain._split("train", torch.float32).x.dtype == torch.float32
    n = len(FILLED)
    models = factory.init_many(2, seed=1)
    which = np.arange(n) % 2
    req = TrainRequest(np.arange(n), models, which, train_request(factory, "lenet", "sgd",
                                                                  n).training, seed=4)
    assert torch.equal(packed.train(req).params, plain.train(req).params)
    grad = GradientRequest(np.arange(n), models, which, 8, seed=5)
    assert torch.equal(packed.gradient(grad).grads, plain.gradient(grad).grads)
    loss = LossRequest(np.arange(n), models, "test", None)
    np.testing.assert_array_equal(packed.losses(loss).loss, plain.losses(loss).loss)
    ev = EvaluateRequest(np.arange(n), Predictor.single(models, which), "test")
    np.testing.assert_array_equal(packed.evaluate(ev).loss, plain.evaluate(ev).loss)


def test_inputs_that_are_not_8_bit_values_are_kept_as_they_are() -> None:
    x = torch.tensor([0.0, 1.0 / 255, 0.5, 1.0])  # 0.5 is no k / 255
    assert compact_inputs(x, torch.float32) is None
    assert compact_inputs(torch.tensor([0.0, 2.0]), torch.float32) is None  # out of range
    ok = torch.tensor([0.0, 3.0, 255.0]) / 255.0
    assert torch.equal(compact_inputs(ok, torch.float32), torch.tensor([0, 3, 255],
                                                                       dtype=torch.uint8))


def test_resume_compares_configs_without_where_they_compute() -> None:
    base = load_config(tiny_config()).to_dict()
    other = load_config(tiny_config(rounds=5, backend={
        "name": "simulation", "device": "cpu", "precision": "tf32", "chunk_size": 16})).to_dict()
    assert comparable(base) == comparable(other)
    old = {**base, "backend": {**base["backend"], "chunk_size": 64}}  # written before "auto"
    assert comparable(old) == comparable(base)
    lr = load_config(tiny_config(train={"lr": 0.2, "batch_size": 16, "steps": 2})).to_dict()
    assert comparable(lr) != comparable(base)  # what it computes still counts


def test_fedem_and_fedsoft_server_steps_stay_on_the_device_of_the_replies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FedEM's and FedSoft's updates run where the replies are (`device_update`): their
    averages built on the device of the trained models (here torch's shape-only "meta"
    device, which refuses any mix of devices, as CUDA does), FedSoft's personal models in
    host memory (`STAYS`: `put` brings the rows there)."""
    from clusterfl.algorithms.base import Ask
    from clusterfl.algorithms.common import ClientModels
    from clusterfl.algorithms.fedem import FedEM, FedEMConfig, FedEMState, aggregate_components
    from clusterfl.algorithms.fedsoft import FedSoft, FedSoftState, aggregate_clusters
    from clusterfl.protocol import LocalTraining, MixtureTrainReply, MixtureTrainRequest

    assert FedEM.device_update and FedSoft.device_update
    einsum = torch.einsum  # on "meta" a CPU operand passes einsum silently: checked here

    def one_device(equation: str, *ops: torch.Tensor) -> torch.Tensor:
        assert len({o.device for o in ops}) == 1, [o.device for o in ops]
        return einsum(equation, *ops)

    monkeypatch.setattr(torch, "einsum", one_device)
    assert {f.name for f in dataclasses.fields(FedSoftState) if f.metadata.get("stays")} == {
        "personal"}
    models = torch.ones(2, 3, device=META)
    params = torch.ones(2, 2, 3, device=META)  # two clients' two components
    for sizes in (None, np.array([1.0, 3.0, 4.0])):
        assert aggregate_components(models, params, np.array([1, 3]), np.array([0, 1]),
                                    sizes).is_meta
    rows = torch.ones(2, 3, device=META)
    for chosen in (None, [np.array([0]), np.array([1])]):
        assert aggregate_clusters(models, rows, np.full((2, 2), 0.5), np.array([1, 3]),
                                  np.array([0, 1]), chosen).is_meta
    alg = FedEM(FedEMConfig(n_components=2))
    state = FedEMState(torch.ones(2, 3), np.full((3, 2), 0.5), np.zeros(3, dtype=bool))
    reply = MixtureTrainReply(np.array([0, 1]), params, np.array([1, 3]), np.ones(2),
                              np.full((2, 2), 0.5))
    ask = Ask(MixtureTrainRequest(np.array([0, 1]), state.models, state.weights[:2],
                                  LocalTraining(), 0))
    out = alg.update(move(state, META), 1, move(ask, META), reply)
    assert out.state.models.is_meta and out.state.trained.tolist() == [True, True, False]
    from clusterfl.algorithms.fedsoft import TRAIN, SelectionAsk
    from clusterfl.protocol import TrainRequest

    request = TrainRequest(np.arange(2), torch.ones(2, 3), np.arange(2), LocalTraining(), 0)
    assert move(SelectionAsk(request, TRAIN), META).request is request  # personal rows stay
    personal = ClientModels.start(torch.zeros(3), 3)
    new = personal.put(np.array([2]), torch.ones(1, 3, dtype=torch.float64))
    assert new.models.device.type == "cpu" and new.models.dtype == torch.float32
    assert torch.equal(new.members()[0][new.rows()[2]], torch.ones(3))


def test_ifca_cams_cluster_step_runs_on_the_device_of_the_replies() -> None:
    """IFCA-CAM's Eq. 6 (its default cluster step) with the trained parts on a device (torch's
    "meta" device, which refuses a CPU operand as CUDA does): built there, shares included."""
    from clusterfl.algorithms.cam import IFCACAM, eq6_update

    assert IFCACAM.device_update
    out = eq6_update(torch.ones(3, 4, device=META), torch.ones(5, 4, device=META),
                     np.array([0, 2, 2, 0, 1]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert out.is_meta and out.shape == (3, 4)


def test_the_one_shot_methods_update_on_the_device_and_relatedness_averages_there() -> None:
    """FL+HC, PACFL, FLT and PCA+kM+HC run their per-cluster rounds where the replies are
    (their one clustering reads the host: FL+HC moves its updates there, the others'
    signatures come on the CPU); FLT's Case I average Ω · W̄ is built on the snapshot's
    device (torch's "meta" device, which refuses a CPU operand as CUDA does)."""
    from clusterfl.algorithms.flhc import FLHC
    from clusterfl.algorithms.flt import FLT, PCAKMHC
    from clusterfl.algorithms.pacfl import PACFL
    from clusterfl.clustering.relatedness import relatedness_average

    assert FLHC.device_update and PACFL.device_update and FLT.device_update
    assert PCAKMHC.device_update
    weights = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    out = relatedness_average(torch.ones(3, 4, device=META), weights)
    assert out.is_meta and out.shape == (3, 4)


def test_fedavg_plus_averages_its_k_models_on_the_device_and_local_on_the_host() -> None:
    """FedAvg+ and FedProx+ build their K weighted means where the replies are (torch's "meta"
    device, which refuses a CPU operand as CUDA does); Local's update only copies the trained
    models into its host table, so its replies come to the CPU (no `device_update`)."""
    from clusterfl.algorithms.ensemble import (
        EnsembleState,
        FedAvgPlus,
        FedAvgPlusConfig,
        FedProxPlus,
    )
    from clusterfl.algorithms.local import Local
    from clusterfl.protocol import LocalTraining, Steps, StepsReply

    assert FedAvgPlus.device_update and FedProxPlus.device_update and not Local.device_update
    alg = FedAvgPlus(FedAvgPlusConfig(n_models=2))
    state = EnsembleState(torch.zeros(2, 3), 4)
    parts = [TrainReply(np.array([0, 2]), torch.ones(2, 3, device=META), np.array([1, 3]),
                        np.ones(2)),
             TrainReply(np.array([], dtype=np.int64), torch.ones(0, 3, device=META),
                        np.zeros(0), np.zeros(0))]
    requests = [TrainRequest(np.array([0, 2]), state.models[k : k + 1], np.zeros(2, np.int64),
                             LocalTraining(), k) for k in range(2)]
    ask = Ask(Steps.of(*requests))
    out = alg.update(move(state, META), 1, move(ask, META), StepsReply(np.array([0, 2]), parts))
    assert out.state.models.is_meta and out.state.models.shape == (2, 3)
    assert out.extras.train_loss == [1.0, None]
