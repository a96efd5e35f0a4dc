"""Dataset files are checked against the catalog's checksums when first read, once per file
version (clusterfl.data.integrity); a wrong file fails naming the file and the dataset."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from clusterfl.data import integrity
from clusterfl.data.catalog import DATASETS, DatasetInfo, RemoteFile
from clusterfl.data.sources import IDX_FILES, load_source
from clusterfl.errors import DataError
from tests.datasets import require


@pytest.fixture(autouse=True)
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test gets its own cache file and an empty in-process memory."""
    path = tmp_path / "cache" / "verified.json"
    monkeypatch.setenv("CLUSTERFL_CACHE", str(path))
    integrity.forget()
    yield path
    integrity.forget()


def _idx(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return gzip.compress(magic + dims + array.astype(np.uint8).tobytes(), mtime=0)


def _files(seed: int) -> dict[str, bytes]:
    """Four valid tiny IDX files (a made-up dataset of its own: the seed tells them apart)."""
    rng = np.random.default_rng(seed)
    return {
        IDX_FILES["x_train"]: _idx(rng.integers(0, 256, (6, 28, 28))),
        IDX_FILES["y_train"]: _idx(rng.integers(0, 10, 6)),
        IDX_FILES["x_test"]: _idx(rng.integers(0, 256, (3, 28, 28))),
        IDX_FILES["y_test"]: _idx(rng.integers(0, 10, 3)),
    }


def _catalog(monkeypatch: pytest.MonkeyPatch, name: str, files: dict[str, bytes]) -> None:
    """Make `files` the catalog's files of dataset `name` (checksums of these bytes)."""
    remote = tuple(
        RemoteFile(f"{name}/{fname}", f"https://example.invalid/{fname}", len(data),
                   hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest())
        for fname, data in files.items())
    monkeypatch.setitem(DATASETS, name, DatasetInfo(name, "test", remote))


def _place(root: Path, folder: str, files: dict[str, bytes]) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    for fname, data in files.items():
        (root / folder / fname).write_bytes(data)


def test_fashion_files_under_mnist_fail_naming_the_file_and_the_dataset(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mnist, fashion = _files(1), _files(2)
    _catalog(monkeypatch, "mnist", mnist)
    _catalog(monkeypatch, "fashion_mnist", fashion)
    _place(tmp_path, "mnist", fashion)  # a valid archive of the wrong dataset
    with pytest.raises(DataError) as err:
        load_source("mnist", tmp_path)
    text = str(err.value)
    assert text.startswith("mnist: ") and "\n" not in text
    assert str(tmp_path / "mnist") in text and "is not the mnist file mnist/" in text
    assert "it is the fashion_mnist file fashion_mnist/" in text
    _place(tmp_path, "mnist", mnist)
    assert load_source("mnist", tmp_path).x_train.shape == (6, 1, 28, 28)


def test_an_unknown_file_names_expected_and_found_checksums(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _catalog(monkeypatch, "mnist", _files(1))
    _place(tmp_path, "mnist", _files(3))  # valid IDX files, but nobody's
    with pytest.raises(DataError, match=r"is not the mnist file .*sha256 .*expected sha256 .*"
                                        r"data\.verify = false"):
        load_source("mnist", tmp_path)
    src = load_source("mnist", tmp_path, verify=False)  # files of one's own, on purpose
    assert len(src.y_train) == 6


def test_checked_once_per_file_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       private_cache: Path) -> None:
    mnist = _files(1)
    _catalog(monkeypatch, "mnist", mnist)
    _place(tmp_path, "mnist", mnist)
    hashed: list[Path] = []
    real = integrity.file_digests

    def counting(path: Path) -> tuple[int, str, str]:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(integrity, "file_digests", counting)
    load_source("mnist", tmp_path)
    assert len(hashed) == 4 and private_cache.is_file()
    integrity.forget()  # as a new process: only the JSON cache remains
    load_source("mnist", tmp_path)
    assert len(hashed) == 4  # later runs pay nothing
    target = tmp_path / "mnist" / IDX_FILES["y_test"]
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: checked again
    load_source("mnist", tmp_path)
    assert hashed[4:] == [target]


def test_a_cache_that_cannot_be_written_costs_only_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mnist = _files(1)
    _catalog(monkeypatch, "mnist", mnist)
    _place(tmp_path, "mnist", mnist)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLUSTERFL_CACHE", str(blocker / "sub" / "verified.json"))
    assert load_source("mnist", tmp_path).n_classes == 10


def test_the_real_fashion_mnist_under_mnist_is_refused(tmp_path: Path) -> None:
    shared = require("fashion_mnist")
    shutil.copytree(shared / "fashion_mnist", tmp_path / "mnist")
    with pytest.raises(DataError, match=r"it is the fashion_mnist file fashion_mnist/"
                                        r"train-images-idx3-ubyte\.gz"):
        load_source("mnist", tmp_path)


def test_cli_run_on_a_wrong_file_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from clusterfl.cli import main

    mnist, fashion = _files(1), _files(2)
    _catalog(monkeypatch, "mnist", mnist)
    _catalog(monkeypatch, "fashion_mnist", fashion)
    _place(tmp_path / "data", "mnist", fashion)
    config = tmp_path / "c.toml"
    config.write_text('rounds = 1\n[data]\nsource = "mnist"\n'
                      '[scenario]\nname = "label_swap"\nn_clients = 2\nn_clusters = 2\n')
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--quiet",
                 "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "is not the mnist file" in err and "it is the fashion_mnist file" in err
