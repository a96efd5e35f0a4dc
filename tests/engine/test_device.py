"""The `[backend] device` setting (issue 37): validation, CPU results unchanged, and, where a
CUDA GPU is present, the same answers on the GPU as on the CPU.

The CUDA tests are collected everywhere; without a GPU pytest reports each of them as skipped
by name with its reason (`-ra` in the project's addopts), never silently.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.engine.test_equivalence import (
    CNN_MODELS,
    FILLED,
    MODELS,
    SIZES,
    TinyFactory,
    close,
    make_federation,
    train_request,
)
from tests.tiny import tiny_config

from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.cli import main
from clusterfl.config import dump_toml, load_config
from clusterfl.engine.device import on, resolve_device
from clusterfl.engine.stacked_cnn import CNNKernel
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment, build_backend
from clusterfl.protocol import EvaluateRequest, GradientRequest, LossRequest, Predictor

CUDA = torch.cuda.is_available()


def needs_cuda(test: Callable[..., None]) -> Callable[..., None]:
    """Skipped without CUDA, with the test's name in the reason (so `-ra` lists it)."""
    return pytest.mark.skipif(not CUDA, reason=f"{test.__name__} NOT RUN: needs a CUDA GPU "
                              "(torch.cuda.is_available() is False)")(test)

ALLOWED = "auto, cpu, cuda or cuda:N"


def _config(**backend: object):
    return load_config(tiny_config(backend={"name": "simulation", **backend}))


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("backend", ["simulation", "sequential"])
@pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda0", "", 0])
def test_an_unknown_device_is_a_one_line_error_naming_the_field(backend: str, bad) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(backend={"name": backend, "device": bad}))
    assert err.value.field == "backend.device"
    assert ALLOWED in err.value.message and "\n" not in str(err.value)


@pytest.mark.parametrize("backend", ["simulation", "sequential"])
@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_every_allowed_spelling_is_accepted(backend: str, name: str) -> None:
    config = load_config(tiny_config(backend={"name": backend, "device": name}))
    assert config.backend.device == name  # type: ignore[attr-defined]  # a DeviceConfig


def test_an_unknown_precision_names_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as err:
        _config(precision="fp16")
    assert err.value.field == "backend.precision"
    assert "'fp32', 'tf32' or 'bf16-mixed'" in err.value.message and "\n" not in str(err.value)


def test_cuda_asked_without_a_gpu_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError) as err:
            resolve_device(name)
        assert err.value.field == "backend.device" and "no CUDA GPU" in err.value.message
        assert "\n" not in str(err.value)
    config = _config(device="cuda")  # validating the config needs no GPU; building does
    fed, factory = _federation_and_factory(config)
    with pytest.raises(ConfigError, match=r"backend\.device"):
        build_backend(config, fed, factory)


def test_a_gpu_index_torch_does_not_have_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"backend.device: 'cuda:2' asked but torch sees 2 "
                                          r"GPU\(s\): cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_only_a_setting_that_is_not_the_default_is_written() -> None:
    assert _config().to_dict()["backend"] == {"name": "simulation"}
    assert _config(device="auto", precision="fp32", chunk_size="auto").to_dict()["backend"] == {
        "name": "simulation"}
    chosen = _config(device="cpu", precision="tf32", chunk_size=64)
    assert chosen.to_dict()["backend"] == {"name": "simulation", "chunk_size": 64,
                                           "device": "cpu", "precision": "tf32"}
    # a comparison's configs are rebuilt from the dict: the choice survives
    again = chosen.with_algorithm({"name": "ifca", "n_clusters": 2})
    assert again.backend.device == "cpu"


def test_the_device_flag_sets_backend_device(tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(tiny_config()))
    rc = main(["run", str(path), "--device", "tpu", "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("clusterfl: error: backend.device: ") and ALLOWED in err[0]
    rc = main(["compare", str(path), "--algorithms", "fedavg", "--device", "cpu",
               "--out", str(tmp_path / "cmp"), "--quiet"])
    assert rc == 0
    stored = (tmp_path / "cmp" / "fedavg" / "config.toml").read_text()
    assert 'device = "cpu"' in stored


def test_cuda_without_a_gpu_stops_a_comparison_of_seeds_and_a_bench_before_any_run(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare --seeds` and `bench` with `--device cuda` where torch finds no GPU: one line
    naming backend.device before any run (each run failed with it in turn, a folder, a
    results table and a line per run; `run` and a plain `compare` stopped at once)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(tiny_config()))
    rc = main(["compare", str(path), "--algorithms", "fedavg,local", "--seeds", "0,1",
               "--device", "cuda", "--out", str(tmp_path / "cmp"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("clusterfl: error: backend.device: 'cuda' asked but torch finds "
                             "no CUDA GPU")
    assert not (tmp_path / "cmp").exists()
    suite = _tiny_suite(tmp_path)
    rc = main(["bench", "--suite", str(suite), "--runs", str(tmp_path / "runs"),
               "--results", str(tmp_path / "RESULTS.md"), "--device", "cuda:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("clusterfl: error: backend.device: 'cuda:1' asked but torch")
    assert not (tmp_path / "RESULTS.md").exists()
    assert not (tmp_path / "runs").exists()  # was left empty (made for its lock first)


def _tiny_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "tiny.toml").write_text(dump_toml({"config": tiny_config(), "suite": {
        "title": "tiny", "source": "test", "methods": ["fedavg", "local"], "seeds": [0]}}))
    return suite


def test_a_quote_in_bench_device_is_named_as_given(tmp_path: Path, capsys) -> None:
    """`bench --device` pasted the value into a TOML string unescaped: `c"u` was named
    '"c"u"' in the error."""
    suite = _tiny_suite(tmp_path)
    rc = main(["bench", "--suite", str(suite), "--runs", str(tmp_path / "runs"),
               "--results", str(tmp_path / "RESULTS.md"), "--device", 'c"u'])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"clusterfl: error: backend.device: allowed: {ALLOWED} (N a GPU "
                               "index) (got 'c\"u')"], err
    assert not (tmp_path / "runs").exists()


def _federation_and_factory(config):
    exp = Experiment(config, None)
    return exp.full_federation, exp.factory


def _history(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "time" not in k and "wall" not in k} for r in rows]


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "ifca", "n_clusters": 2}])
def test_device_cpu_gives_the_same_numbers_as_no_setting(tmp_path: Path, algorithm: dict,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # "no setting" is device = "auto": the CPU on a machine without CUDA, which the runs
    # without a setting stand for (on a CUDA machine the GPU is hidden from them)
    for name, backend in (("plain", {}), ("cpu", {"device": "cpu"}),
                          ("seq", {"name": "sequential"}),
                          ("seq_cpu", {"name": "sequential", "device": "cpu"})):
        cfg = tiny_config(algorithm=algorithm, backend={"name": "simulation", **backend})
        with monkeypatch.context() as m:
            if "device" not in backend:
                m.setattr(torch.cuda, "is_available", lambda: False)
            Experiment(load_config(cfg), tmp_path / name).run(progress=False)
    plain = _history(tmp_path / "plain")
    assert len(plain) == 2 and plain[-1]["metrics"]["accuracy"] is not None
    assert _history(tmp_path / "cpu") == plain
    assert _history(tmp_path / "seq_cpu") == _history(tmp_path / "seq")


def test_moving_to_where_it_is_already_copies_nothing() -> None:
    fed = make_federation((1, 4, 4), "classification", [3, 2])
    assert fed.to("cpu") is fed
    pred = Predictor.single(torch.zeros(2, 5), np.array([0, 1]))
    assert on(pred, torch.device("cpu")) is pred
    t = torch.ones(3)
    assert on(t, torch.device("cpu")) is t and on(None, torch.device("cpu")) is None


# --------------------------------------------------------------------------- CUDA


def _backends(name: str, device: str, sizes: list[int] = FILLED):
    """(factory, CPU simulation, simulation on `device`, sequential on `device`)."""
    from clusterfl.models import ModelFactory, model_config

    cfg, shape, task, _ = MODELS[name]
    fed = make_federation(shape, task, sizes)
    make = TinyFactory if name == "custom" else ModelFactory
    fac = make(model_config(cfg), shape, fed.n_outputs)
    return (fac, SimulationBackend(fed, fac, 4), SimulationBackend(fed, fac, 4, device=device),
            SequentialBackend(fed, fac, device=device))


#: dropout draws other numbers on CUDA (CUDA generators; the loop's fused kernel): the
#: CUDA comparisons hold for the models without it (docs/engine.md, "Determinism")
CUDA_MODELS = [name for name in MODELS if name != "mlp_dropout"]


@needs_cuda
@pytest.mark.parametrize("setting", ["sgd", "adam", "prox", "offset"])
@pytest.mark.parametrize("name", CUDA_MODELS)
def test_cuda_training_matches_the_cpu_and_the_cuda_reference(name: str, setting: str) -> None:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # float64: differences are the kernels' rounding
    try:
        fac, cpu, gpu, seq = _backends(name, "cuda", FILLED if setting == "offset" else SIZES)
        req = train_request(fac, name, setting, len(FILLED))
        want, got, ref = cpu.train(req), gpu.train(req), seq.train(req)
    finally:
        torch.set_default_dtype(old)
    assert got.params.device.type == "cuda" and ref.params.device.type == "cuda"  # left there
    close(got.params, want.params, torch.float64)
    close(got.loss, want.loss, torch.float64)
    close(ref.params, got.params, torch.float64)
    again = gpu.train(req)  # the same GPU, the same seed: the same numbers
    assert torch.equal(again.params, got.params)


@needs_cuda
@pytest.mark.parametrize("name", CUDA_MODELS)
def test_cuda_gradients_losses_and_metrics_match_the_cpu(name: str) -> None:
    fac, cpu, gpu, seq = _backends(name, "cuda")
    n = len(FILLED)
    models = fac.init_many(3, seed=2)
    which = np.arange(n) % 3
    grad = GradientRequest(np.arange(n), models, which, 8, seed=5)
    for b in (gpu, seq):
        close(b.gradient(grad).grads, cpu.gradient(grad).grads, torch.float32)
        loss = LossRequest(np.arange(n), models, "test", None)
        close(b.losses(loss).loss, cpu.losses(loss).loss, torch.float32)
        ev = EvaluateRequest(np.arange(n), Predictor.single(models, which), "test")
        close(b.evaluate(ev).loss, cpu.evaluate(ev).loss, torch.float32)


@needs_cuda
@pytest.mark.parametrize("name", CNN_MODELS)
def test_cuda_cnns_convolve_by_unfolded_products_like_the_grouped_convolution(name: str
                                                                               ) -> None:
    """On CUDA "auto" convolves by unfolded products (im2col); the grouped convolution on the
    same GPU trains to the same parameters (float32, 1e-5), and both are deterministic."""
    fac, _, gpu, _ = _backends(name, "cuda")
    assert isinstance(gpu.engine.kernel, CNNKernel) and gpu.engine.kernel.im2col(gpu.device)
    grouped = SimulationBackend(gpu.federation, fac, 4, device="cuda", kernel="cnn-grouped")
    assert not grouped.engine.kernel.im2col(gpu.device)
    req = train_request(fac, name, "momentum_wd", len(FILLED))
    got, want = gpu.train(req), grouped.train(req)
    close(got.params, want.params, torch.float32)
    close(got.loss, want.loss, torch.float32)
    assert torch.equal(gpu.train(req).params, got.params)
    assert torch.equal(grouped.train(req).params, want.params)


@needs_cuda
def test_a_run_on_cuda_ends_where_the_cpu_run_ends(tmp_path: Path) -> None:
    for device in ("cpu", "cuda"):
        cfg = tiny_config(algorithm={"name": "ifca", "n_clusters": 2},
                          backend={"name": "simulation", "device": device})
        Experiment(load_config(cfg), tmp_path / device).run(progress=False)
    cpu, gpu = _history(tmp_path / "cpu"), _history(tmp_path / "cuda")
    assert [r["metrics"]["accuracy"] for r in gpu] == pytest.approx(
        [r["metrics"]["accuracy"] for r in cpu], abs=0.02)


@pytest.mark.parametrize("shape", [(), (3,)])
def test_the_gpu_way_of_summing_per_client_equals_a_plain_loop(shape: tuple[int, ...]) -> None:
    from clusterfl.engine.common import segment_sum

    sizes = np.array([3, 0, 5, 1, 0, 4])
    values = torch.randn(int(sizes.sum()), *shape, generator=torch.Generator().manual_seed(0))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    want = torch.stack([values[a:b].double().sum(0) for a, b in itertools.pairwise(bounds)])
    for padded in (True, False):  # padded: the GPU's layout, here on the CPU
        torch.testing.assert_close(segment_sum(values, sizes, padded=padded), want)
    assert segment_sum(values[:0], np.zeros(0, np.int64), padded=True).shape == (0, *shape)


def test_out_of_device_memory_is_one_line_naming_chunk_size(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    # what torch raises when a CUDA allocation fails, raised here by the training kernel
    def full(self: SimulationBackend, req: object) -> object:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(SimulationBackend, "train", full)
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(tiny_config(backend={"name": "simulation", "chunk_size": 16})))
    assert main(["run", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("clusterfl: error: backend.chunk_size: out of "
                                               "memory on cpu while computing a TrainRequest")
    assert "(now 16)" in err[0]
