"""Where FLT's encoder pretraining reads its dataset and caches the encoder.

The bug: a run's data folder (`data.data_dir`, which `--data-dir` sets) was not handed to the
pretraining, which read `$CLUSTERFL_DATA` or ~/.cache/clusterfl instead, and named them in its
error although the folder was set. Now the pretraining reads `algorithm.data_dir`, else the
run's data folder, resolved as the federation's; its cache defaults to `<that folder>/encoders`,
and a cache that cannot be written is one line naming `algorithm.encoder_dir`, before anything
is pretrained. The datasets here are small made-up files in the official IDX format.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from clusterfl import encoders
from clusterfl.algorithms import flt
from clusterfl.cli import main
from clusterfl.config import dump_toml, load_config
from clusterfl.data import sources
from clusterfl.data.sources import IDX_FILES
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CACHED = "conv_ae-fashion_mnist-l8-e1-s0.pt"


def _idx_bytes(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic + dims + array.astype(np.uint8).tobytes()


def write_idx(root: Path, name: str, n_train: int = 120, n_test: int = 40) -> None:
    """`root/name/` with the four gzipped IDX files of an MNIST-like dataset (28×28)."""
    rng = np.random.default_rng(len(name))
    arrays = {"x_train": rng.integers(0, 256, (n_train, 28, 28)),
              "y_train": np.arange(n_train) % 10,
              "x_test": rng.integers(0, 256, (n_test, 28, 28)),
              "y_test": np.arange(n_test) % 10}
    (root / name).mkdir(parents=True)
    for key, fname in IDX_FILES.items():
        (root / name / fname).write_bytes(gzip.compress(_idx_bytes(arrays[key])))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No `$CLUSTERFL_DATA`, a home folder of the test's own (its ~/.cache/clusterfl empty),
    the made-up files accepted (they are not the catalog's)."""
    monkeypatch.delenv("CLUSTERFL_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sources, "check_known_files", lambda *a, **k: None)
    sources.forget_decoded()
    yield tmp_path
    sources.forget_decoded()


def run_config(run_data: Path | None, **algorithm: object) -> dict:
    """A one-round FLT run on made-up MNIST read from `run_data` (`data.data_dir`; None: not
    set), pretraining a tiny encoder on Fashion-MNIST for one epoch."""
    data: dict[str, object] = {"source": "mnist", "verify": False}
    if run_data is not None:
        data["data_dir"] = str(run_data)
    return {"seed": 0, "rounds": 1, "eval_every": 1, "checkpoint_every": 0, "data": data,
            "scenario": {"name": "iid", "n_clients": 4},
            "model": {"name": "mlp", "hidden": [8]},
            "train": {"lr": 0.1, "batch_size": 10, "epochs": 1},
            "algorithm": {"name": "flt", "encoder": "fashion_mnist", "pretrain_epochs": 1,
                          "latent": 8, "k": 2, "finetune_epochs": 0, "umap": False,
                          "threshold": 1.0, **algorithm},
            "output": {"figures": False, "progress": "off"}}


def no_pretraining(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pytest.fail("pretrained"))


# ============================================================================ the data folder


def test_pretraining_reads_the_runs_data_dir(env: Path) -> None:
    """`data.data_dir` only (the repro): the check before round 1 looked in
    ~/.cache/clusterfl and refused the run, naming neither folder that was set."""
    write_idx(env / "data", "mnist")
    write_idx(env / "data", "fashion_mnist")
    cfg = run_config(env / "data", encoder_dir=str(env / "enc"))
    hist = Experiment.from_config(cfg).run(progress=False)
    assert hist.records[0].extras["encoder"]["source"] == "fashion_mnist"
    assert (env / "enc" / CACHED).is_file()
    assert not (env / "home").exists()  # nothing looked for or written in ~/.cache


@pytest.mark.parametrize("where", ["global", "run"])
def test_data_dir_option_reaches_the_pretraining(env: Path, where: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`clusterfl --data-dir D run CFG` and `clusterfl run CFG --data-dir D`."""
    write_idx(env / "data", "mnist")
    write_idx(env / "data", "fashion_mnist")
    path = env / "cfg.toml"
    path.write_text(dump_toml(run_config(None, encoder_dir=str(env / "enc"))))
    data = ["--data-dir", str(env / "data")]
    run = ["run", str(path), "--out", str(env / "run"), "--quiet"]
    argv = [*data, *run] if where == "global" else [*run, *data]
    assert main(argv) == 0, capsys.readouterr().err
    assert (env / "enc" / CACHED).is_file()


def test_algorithm_data_dir_still_comes_first(env: Path) -> None:
    """The federation from `data.data_dir`, the pretraining dataset from `algorithm.data_dir`
    (the run's folder has no Fashion-MNIST); the default cache is under the latter."""
    write_idx(env / "run_data", "mnist")
    write_idx(env / "pretrain_data", "fashion_mnist")
    cfg = run_config(env / "run_data", data_dir=str(env / "pretrain_data"))
    Experiment.from_config(cfg).run(progress=False)
    assert (env / "pretrain_data" / "encoders" / CACHED).is_file()
    assert not (env / "run_data" / "encoders").exists()
    own, plain = (load_config(c).algorithm for c in (cfg, run_config(env / "run_data")))
    assert isinstance(own, flt.FLTConfig) and isinstance(plain, flt.FLTConfig)
    method = flt.FLT(own)
    method.data_dir = str(env / "run_data")  # what the runner hands every method
    assert method.pretraining_data_dir() == str(env / "pretrain_data")
    method.config = plain
    assert method.pretraining_data_dir() == str(env / "run_data")


def test_default_cache_is_the_runs_data_dir_and_is_reused(env: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `encoder_dir` the encoder is cached in `<data.data_dir>/encoders`, the folder
    `clusterfl encoder train --data-dir` writes, and a second run reads it from there."""
    write_idx(env / "data", "mnist")
    write_idx(env / "data", "fashion_mnist")
    cfg = run_config(env / "data")
    Experiment.from_config(cfg).run(progress=False)
    cached = env / "data" / "encoders" / CACHED
    assert cached.is_file()
    no_pretraining(monkeypatch)
    assert Experiment.from_config(cfg).run(progress=False).records[0].extras["encoder"][
        "sha256"] == encoders.load(cached).sha256


def test_missing_pretraining_data_names_the_runs_folder(env: Path) -> None:
    write_idx(env / "data", "mnist")
    with pytest.raises(ConfigError) as err:
        Experiment.from_config(run_config(env / "data", encoder_dir=str(env / "enc")))
    assert err.value.field == "algorithm.encoder"
    assert str(env / "data" / "fashion_mnist") in err.value.message
    assert ".cache" not in err.value.message


# ============================================================================ the cache folder


@pytest.mark.parametrize("how", ["read_only", "file"])
def test_unwritable_cache_is_one_line_naming_encoder_dir_before_pretraining(
        env: Path, how: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only data folder (as a shared dataset folder; refused even for root, who could
    write it) or an `encoders` that is a file: pretrained for minutes, then a traceback (or,
    as root, an encoder written into the read-only folder)."""
    data = env / "data"
    write_idx(data, "mnist")
    write_idx(data, "fashion_mnist")
    if how == "file":
        (data / "encoders").write_text("not a folder")
    no_pretraining(monkeypatch)
    path = env / "cfg.toml"
    path.write_text(dump_toml(run_config(data)))
    if how == "read_only":
        data.chmod(0o555)
    try:
        with pytest.raises(ConfigError) as err:
            Experiment.from_config(run_config(data))
        assert main(["run", str(path), "--out", str(env / "run"), "--quiet",
                     "--data-dir", str(data)]) == 2
    finally:
        data.chmod(0o755)
    assert err.value.field == "algorithm.encoder_dir"
    assert f"the encoder cache {data / 'encoders'} cannot be written" in err.value.message
    assert "set algorithm.encoder_dir to a writable folder" in err.value.message
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "algorithm.encoder_dir" in lines[0], lines
    assert not (data / "encoders").is_dir()


def test_a_failed_save_is_one_line(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder passed the check, the write did not (disk full, a race)."""
    write_idx(env / "data", "fashion_mnist")

    def full(*a: object, **k: object) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(encoders, "save", full)
    with pytest.raises(ConfigError, match=r"cannot be saved to .*No space left on device\): "
                                          r"set algorithm\.encoder_dir") as err:
        encoders.resolve("fashion_mnist", (1, 28, 28), 8, 1, 0, data_dir=env / "data")
    assert err.value.field == "algorithm.encoder_dir"


def test_default_encoder_dir_follows_the_data_dir_resolution(env: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    assert encoders.default_encoder_dir(env / "d") == env / "d" / "encoders"
    assert encoders.default_encoder_dir() == env / "home" / ".cache" / "clusterfl" / "encoders"
    monkeypatch.setenv("CLUSTERFL_DATA", str(env / "env_data"))
    assert encoders.default_encoder_dir() == env / "env_data" / "encoders"
    assert encoders.default_encoder_dir(env / "d") == env / "d" / "encoders"


# ============================================================================ encoder train


def test_encoder_train_uses_the_data_dir_and_checks_the_cache_first(
        env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`clusterfl --data-dir D encoder train` reads D and caches in D/encoders (what a run with
    `--data-dir D` reads); a read-only D is refused before training, naming --out."""
    data = env / "data"
    write_idx(data, "fashion_mnist")
    train = ["encoder", "train", "--source", "fashion_mnist", "--epochs", "1", "--latent", "8",
             "--max-samples", "40", "--quiet"]
    assert main(["--data-dir", str(data), *train]) == 0, capsys.readouterr().err
    assert encoders.load(data / "encoders" / CACHED).source == "fashion_mnist"
    capsys.readouterr()
    assert main(["encoder", "show", str(data / "encoders" / CACHED)]) == 0
    assert '"source": "fashion_mnist"' in capsys.readouterr().out
    (data / "encoders" / CACHED).unlink()
    (data / "encoders").rmdir()
    no_pretraining(monkeypatch)
    data.chmod(0o555)
    try:
        assert main([*train, "--data-dir", str(data)]) == 2
    finally:
        data.chmod(0o755)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--out: the encoder cache" in lines[0], lines
    assert "is read-only" in lines[0]
    assert not (data / "encoders").exists()
    assert os.access(data, os.W_OK)


def test_pretraining_follows_the_runs_data_verify(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of one's own under the catalog's names with `data.verify = false`: the federation
    was read unchecked, but the pretraining checked its dataset anyway and failed, telling the
    user to set the data.verify = false they had set."""
    monkeypatch.delenv("CLUSTERFL_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    sources.forget_decoded()
    write_idx(tmp_path / "data", "mnist")
    write_idx(tmp_path / "data", "fashion_mnist")
    try:
        cfg = run_config(tmp_path / "data", encoder_dir=str(tmp_path / "enc"))
        hist = Experiment.from_config(cfg).run(progress=False)
        assert hist.records[0].extras["encoder"]["source"] == "fashion_mnist"
        checked = {**cfg, "data": {**cfg["data"], "verify": True}}
        with pytest.raises((ConfigError, sources.DataError)):  # the made-up files: refused
            Experiment.from_config(checked)
    finally:
        sources.forget_decoded()


def test_encoder_train_into_the_cache_with_settings_its_name_lacks_warns(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cache name holds source, latent, epochs and seed only: `--max-samples 40` (or
    another --lr / --batch-size) wrote an encoder a run would load as its default one without
    a word; with --out it is the user's own file and nothing is said."""
    data = env / "data"
    write_idx(data, "fashion_mnist")
    train = ["--data-dir", str(data), "encoder", "train", "--source", "fashion_mnist",
             "--epochs", "1", "--latent", "8", "--quiet"]
    assert main([*train, "--max-samples", "40", "--lr", "0.01"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "clusterfl: warning: --max-samples 40, --lr 0.01 is not in the cache name: an FLT run "
        "with encoder = 'fashion_mnist' (latent 8, pretrain_epochs 1, encoder_seed 0) will "
        "load this encoder as its default one; write a variant elsewhere with --out"]
    assert main([*train, "--max-samples", "40", "--out", str(env / "mine.pt")]) == 0
    assert capsys.readouterr().err == ""
    before = encoders.load(data / "encoders" / CACHED)
    assert main(train) == 0  # an existing cache entry is trained again, as asked
    again = encoders.load(data / "encoders" / CACHED)
    assert again.sha256 != before.sha256 and again.lr == 1e-3
    assert "wrote " in capsys.readouterr().out
