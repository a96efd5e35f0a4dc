"""The GPU set of issue 37: collected everywhere, run where torch finds a CUDA GPU.

Without a GPU every test here is reported as skipped with "NOT RUN" and its name (`-ra`),
never silently. On a GPU they check, on tiny federations:
- every method: the simulation backend on CUDA ends where the per-client reference loop
  (`sequential`) on CUDA ends (models to 1e-5, same assignment), and within rounding of the
  CPU run (same assignment, accuracy within 0.02);
- the server's state stays on the CPU between steps (device-independent checkpoints), and a
  method with a device update gets its replies on the GPU; FeSEM's k-means runs there and
  CFL-GP's model step too, their per-client tables staying in host memory;
- a run cut on the GPU resumes on the CPU, and the other way round, and ends where a run
  that never stopped ends (same assignment; accuracy within rounding);
- chunks by free memory: "auto" stacks more than the CPU's 64 clients when memory allows,
  and a small budget (more, smaller chunks) gives the same replies to 1e-5;
- 8-bit inputs are kept as uint8 codes on the GPU;
- bf16-mixed runs and stays close to fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import clusterfl.engine.vectorized as vectorized
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import TrainRequest
from tests.engine.test_equivalence import make_federation
from tests.robust.conftest import config
from tests.robust.test_faults import METHOD_SETTINGS

CUDA = torch.cuda.is_available()


def needs_cuda(test: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.skipif(not CUDA, reason=f"{test.__name__} NOT RUN: needs a CUDA GPU "
                              "(torch.cuda.is_available() is False)")(test)


def _run(method: str, tmp: Path, name: str, **backend: Any) -> Experiment:
    cfg = config(rounds=3, eval_every=3, algorithm={"name": method, **METHOD_SETTINGS[method]},
                 backend={"name": name, **backend})
    runs = len(list(tmp.iterdir())) if tmp.exists() else 0
    exp = Experiment.from_config(cfg, out_dir=tmp / f"{name}-{runs}")
    exp.history_ = exp.run(progress=False)  # type: ignore[attr-defined]
    return exp


def _accuracy(exp: Experiment) -> float:
    return float(exp.history_.records[-1].metrics.accuracy)  # type: ignore[attr-defined]


@needs_cuda
@pytest.mark.parametrize("method", list(METHOD_SETTINGS))
def test_every_method_on_cuda_matches_the_cuda_reference_and_the_cpu(method: str,
                                                                      tmp_path: Path) -> None:
    sim = _run(method, tmp_path, "simulation", device="cuda")
    seq = _run(method, tmp_path, "sequential", device="cuda")
    cpu = _run(method, tmp_path, "simulation", device="cpu")
    a, b = sim.algorithm.predictor(), seq.algorithm.predictor()
    assert a.models.device.type == "cpu"  # the server's state stays on the CPU
    torch.testing.assert_close(a.models, b.models, atol=1e-5, rtol=1e-4)
    assert (sim.algorithm.assignment() == seq.algorithm.assignment()).all()
    assert (sim.algorithm.assignment() == cpu.algorithm.assignment()).all()
    assert abs(_accuracy(sim) - _accuracy(cpu)) <= 0.02


@needs_cuda
@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedavg_plus", "fedprox_plus", "ifca",
                                    "cfl", "fesem", "fesem_cam", "cfl_gp", "fedem", "fedsoft",
                                    "ifca_cam", "flhc", "pacfl", "pca_km_hc"])
def test_a_device_update_gets_its_replies_on_the_gpu(method: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterfl.algorithms import ALGORITHMS

    cls = ALGORITHMS[method]
    assert cls.device_update
    seen: list[str] = []
    real = cls.update

    def spy(self: Any, state: Any, t: int, ask: Any, reply: Any) -> Any:
        from clusterfl.engine.transfer import device_of

        dev = device_of(reply)
        seen.append("cpu" if dev is None else dev.type)
        return real(self, state, t, ask, reply)

    monkeypatch.setattr(cls, "update", spy)
    _run(method, tmp_path, "simulation", device="cuda")
    assert "cuda" in seen


@needs_cuda
def test_fesem_clusters_on_the_gpu_and_keeps_its_tables_in_host_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The k-means of the rounds after the warm-up runs where the replies are (its input
    stays on the GPU between the round's phases); the warm-up's table is in host memory,
    and the state comes back to the CPU."""
    import clusterfl.algorithms.fesem as fesem

    seen: list[str] = []
    real = fesem.cluster_step

    def spy(cfg: Any, index: Any, assign: Any, centers: Any, start: Any, clients: Any,
            params: torch.Tensor, *rest: Any) -> Any:
        seen.append(params.device.type)
        out = real(cfg, index, assign, centers, start, clients, params, *rest)
        assert out[1].device == params.device  # the centers are computed there
        return out

    monkeypatch.setattr(fesem, "cluster_step", spy)
    exp = _run("fesem", tmp_path, "simulation", device="cuda")
    assert seen[0] == "cpu" and set(seen[1:]) == {"cuda"}  # the warm-up's table, then replies
    st = exp.algorithm.state
    assert st.centers.device.type == "cpu" and st.pending is None


@needs_cuda
def test_cfl_gp_keeps_its_profile_in_host_memory_and_steps_its_models_on_the_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import clusterfl.algorithms.cfl_gp as cfl_gp

    seen: list[tuple[str, str]] = []
    real = cfl_gp.update_profile

    def spy(features: torch.Tensor, probes: Any, *rest: Any, **kw: Any) -> torch.Tensor:
        piece = probes[0].pieces()[0][1]
        rows = piece.table if hasattr(piece, "table") else piece
        seen.append((features.device.type, rows.device.type))
        out = real(features, probes, *rest, **kw)
        assert out.device.type == "cpu"
        return out

    monkeypatch.setattr(cfl_gp, "update_profile", spy)
    exp = _run("cfl_gp", tmp_path, "simulation", device="cuda")
    assert seen and set(seen) == {("cpu", "cuda")}
    assert exp.algorithm.state.features.device.type == "cpu"
    assert exp.algorithm.state.models.device.type == "cpu"


@needs_cuda
@pytest.mark.parametrize(("first", "then"), [("cuda", "cpu"), ("cpu", "cuda")])
@pytest.mark.parametrize("method", ["fedavg", "ifca", "cfl"])
def test_a_run_cut_on_one_device_resumes_on_the_other(first: str, then: str, method: str,
                                                      tmp_path: Path) -> None:
    def cfg(device: str) -> dict[str, Any]:
        return config(rounds=5, eval_every=5, checkpoint_every=2,
                      algorithm={"name": method, **METHOD_SETTINGS[method]},
                      backend={"name": "simulation", "device": device})

    ref = Experiment.from_config(cfg(then), out_dir=tmp_path / "ref")
    ref_h = ref.run(progress=False)
    out = tmp_path / "cut"
    broken = Experiment.from_config(cfg(first), out_dir=out)
    real = broken.algorithm.run_round

    class StopError(Exception):
        pass

    def dies(ctx: Any, t: int) -> Any:
        if t == 4:
            raise StopError
        return real(ctx, t)

    broken.algorithm.run_round = dies  # type: ignore[method-assign]
    with pytest.raises(StopError):
        broken.run(progress=False)
    resumed = Experiment.from_config(cfg(then), out_dir=out)
    h = resumed.run(resume=True, progress=False)
    assert [r.round for r in h.records][-1] == 5
    assert (resumed.algorithm.assignment() == ref.algorithm.assignment()).all()
    assert abs(h.records[-1].metrics.accuracy - ref_h.records[-1].metrics.accuracy) < 0.02


def _backend(chunk: Any = None, **kw: Any) -> tuple[SimulationBackend, ModelFactory]:
    fed = make_federation((1, 8, 8), "classification", [20] * 300)
    fac = ModelFactory(model_config({"name": "lenet", "channels": [4, 6], "hidden": [16, 12]}),
                       fed.input_shape, fed.n_outputs)
    return SimulationBackend(fed, fac, chunk, device="cuda", **kw), fac


@needs_cuda
def test_auto_chunks_follow_free_memory_and_small_budgets_give_the_same_replies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fac = _backend()
    size = backend.engine._chunk_len(2, 8, torch.float32, backend.device)
    assert size > vectorized.CPU_CHUNK  # a GPU holds more than the CPU's 64 at once
    from tests.engine.test_equivalence import SETTINGS

    n = 300
    req = TrainRequest(np.arange(n), fac.init_many(2, seed=1), np.arange(n) % 2,
                       SETTINGS["sgd"], seed=3)
    whole = backend.train(req).params.cpu()
    monkeypatch.setattr(vectorized, "GPU_SAMPLE_SHARE", 1e-7)  # a few samples per step
    small = backend.engine._chunk_len(2, 8, torch.float32, backend.device)
    assert small < size
    torch.testing.assert_close(backend.train(req).params.cpu(), whole, atol=1e-5, rtol=1e-4)


@needs_cuda
def test_8_bit_inputs_are_kept_as_uint8_on_the_gpu() -> None:
    backend, _ = _backend()
    fed = backend.federation
    fed.x_train.copy_(torch.randint(0, 256, fed.x_train.shape).float() / 255.0)
    assert backend._split("train", torch.float32).x.dtype == torch.uint8


@needs_cuda
@pytest.mark.parametrize("method", ["fedavg", "ifca"])
def test_bf16_mixed_runs_close_to_fp32(method: str, tmp_path: Path) -> None:
    fp32 = _run(method, tmp_path / "a", "simulation", device="cuda")
    bf16 = _run(method, tmp_path / "b", "simulation", device="cuda", precision="bf16-mixed")
    assert abs(_accuracy(fp32) - _accuracy(bf16)) <= 0.05
    assert not torch.equal(fp32.algorithm.predictor().models, bf16.algorithm.predictor().models)

