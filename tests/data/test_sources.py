"""Dataset readers (clusterfl.data.sources): real MNIST, hand-written IDX and CIFAR files."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.data.sources import (
    IDX_FILES,
    default_data_dir,
    load_source,
    read_idx,
    standardize,
    stratified_test_mask,
)
from clusterfl.errors import ConfigError, DataError
from tests.datasets import require, skip_unless


def _idx_bytes(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic + dims + array.astype(np.uint8).tobytes()


def _write_idx_dataset(root: Path, n_train: int = 5, n_test: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28)),
        "y_train": rng.integers(0, 10, n_train),
        "x_test": rng.integers(0, 256, (n_test, 28, 28)),
        "y_test": rng.integers(0, 10, n_test),
    }
    (root / "mnist").mkdir(parents=True)
    for key, fname in IDX_FILES.items():
        (root / "mnist" / fname).write_bytes(gzip.compress(_idx_bytes(arrays[key])))
    return arrays


# ---------------------------------------------------------------------- real files


@skip_unless("mnist")
def test_real_mnist() -> None:
    shared = require("mnist")
    src = load_source("mnist", shared)
    assert src.x_train.shape == (60000, 1, 28, 28) and src.x_test.shape == (10000, 1, 28, 28)
    assert src.x_train.dtype == torch.float32 and src.y_train.dtype == torch.int64
    assert float(src.x_train.min()) >= 0.0 and float(src.x_train.max()) == 1.0
    assert src.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert torch.bincount(src.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028,
                                                   974, 1009]
    assert src.n_classes == 10 and src.task == "classification" and src.name == "mnist"
    assert load_source("mnist", shared) is src  # decoded once per process


@skip_unless("fashion_mnist")
def test_real_fashion_mnist() -> None:
    src = load_source("fashion_mnist", require("fashion_mnist"))
    assert src.x_train.shape == (60000, 1, 28, 28) and len(src.y_test) == 10000
    assert torch.bincount(src.y_train).tolist() == [6000] * 10


def test_digits_fixed_stratified_split() -> None:
    src = load_source("digits")
    assert src.x_train.shape[1:] == (1, 8, 8)
    assert len(src.y_train) + len(src.y_test) == 1797
    assert float(src.x_train.max()) == 1.0 and float(src.x_train.min()) == 0.0
    share = torch.bincount(src.y_test, minlength=10) / (
        torch.bincount(src.y_test, minlength=10) + torch.bincount(src.y_train, minlength=10))
    assert torch.all((share - 0.25).abs() < 0.01)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    mask = stratified_test_mask(labels, 0.25, 0)
    assert mask[:4].sum() == 1 and mask[4:].sum() == 2
    assert np.array_equal(mask, stratified_test_mask(labels, 0.25, 0))


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLUSTERFL_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("CLUSTERFL_DATA")
    assert default_data_dir() == Path.home() / ".cache" / "clusterfl"


def test_unknown_source() -> None:
    with pytest.raises(ConfigError, match="allowed: digits"):
        load_source("imagenet")


# ---------------------------------------------------------------------- IDX files


def test_tiny_idx_dataset(tmp_path: Path) -> None:
    arrays = _write_idx_dataset(tmp_path)
    with pytest.raises(DataError, match="is not the mnist file"):  # not the real MNIST files
        load_source("mnist", tmp_path)
    src = load_source("mnist", tmp_path, verify=False)
    assert src.x_train.shape == (5, 1, 28, 28) and src.x_test.shape == (3, 1, 28, 28)
    expected = torch.from_numpy(arrays["x_train"].astype(np.float32) / 255)[:, None]
    torch.testing.assert_close(src.x_train, expected)
    assert src.y_test.tolist() == arrays["y_test"].tolist()
    assert src.n_classes == 10


def test_missing_file_names_path_and_command(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="clusterfl data download mnist") as err:
        load_source("mnist", tmp_path)
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in str(err.value)


def test_not_found_names_where_the_folder_came_from(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The message says which setting chose the data folder and what to change."""
    env, cfg = tmp_path / "env", tmp_path / "cfg"
    monkeypatch.setenv("CLUSTERFL_DATA", str(env))
    with pytest.raises(DataError) as err:
        load_source("mnist")
    text = str(err.value)
    assert f"the data folder {env} is $CLUSTERFL_DATA" in text and "--data-dir" in text
    with pytest.raises(DataError) as err:
        load_source("mnist", cfg)  # a config's data.data_dir comes first...
    text = str(err.value)
    assert f"the data folder {cfg} is data.data_dir" in text
    assert f"$CLUSTERFL_DATA = {env} is set, but data.data_dir comes first" in text  # ...loudly
    assert f"clusterfl data download mnist --data-dir {cfg}" in text and "\n" not in text
    monkeypatch.delenv("CLUSTERFL_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(DataError, match=r"is the default \(neither data\.data_dir nor "
                                        r"\$CLUSTERFL_DATA is set\)"):
        load_source("fashion_mnist")
    # a data "folder" that is a file: said so, with no download into it suggested
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("CLUSTERFL_DATA", str(tmp_path / "afile"))
    with pytest.raises(DataError) as err:
        load_source("mnist")
    assert str(err.value).endswith(f"{tmp_path / 'afile'} is a file, not a folder; it is "
                                   "$CLUSTERFL_DATA: set it (or pass --data-dir) to the folder "
                                   "that contains mnist/.")


def test_truncated_gzip(tmp_path: Path) -> None:
    _write_idx_dataset(tmp_path)
    path = tmp_path / "mnist" / IDX_FILES["x_train"]
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataError, match="clusterfl data verify mnist") as err:
        load_source("mnist", tmp_path)
    assert str(path) in str(err.value)


def test_wrong_magic_and_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros(4, np.uint8))))
    with pytest.raises(DataError, match="magic number"):
        read_idx(path, ndim=3)
    header_says_5 = _idx_bytes(np.zeros((5, 2, 2), np.uint8))[:-4]
    path.write_bytes(gzip.compress(header_says_5))
    with pytest.raises(DataError, match="expected 36"):
        read_idx(path, ndim=3)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=str(path)):
        read_idx(path, ndim=1)


# ---------------------------------------------------------------------- CIFAR-10


def _cifar_batch(n: int, seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    batch = {b"batch_label": b"batch", b"labels": [int(v) for v in labels], b"data": data,
             b"filenames": [b"f.png"] * n}
    return pickle.dumps(batch, protocol=2), data, labels


def _cifar_files() -> dict[str, tuple[bytes, np.ndarray, np.ndarray]]:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return {name: _cifar_batch(3, seed) for seed, name in enumerate(names)}


def _check_cifar(src_root: Path, files: dict) -> None:
    src = load_source("cifar10", src_root, verify=False)  # made-up batches
    assert src.x_train.shape == (15, 3, 32, 32) and src.x_test.shape == (3, 3, 32, 32)
    _, data, labels = files["data_batch_2"]
    red = data[0, :1024].reshape(32, 32) / 255.0  # row-major 1024 red, 1024 green, 1024 blue
    torch.testing.assert_close(src.x_train[3, 0], torch.from_numpy(red.astype(np.float32)))
    blue = data[1, 2048:].reshape(32, 32) / 255.0
    torch.testing.assert_close(src.x_train[4, 2], torch.from_numpy(blue.astype(np.float32)))
    assert src.y_train[3:6].tolist() == labels.tolist()
    assert src.y_test.tolist() == files["test_batch"][2].tolist()


def _write_cifar_tar(root: Path, files: dict) -> None:
    (root / "cifar10").mkdir()
    with tarfile.open(root / "cifar10" / "cifar-10-python.tar.gz", "w:gz") as tar:
        for name, (blob, _, _) in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def test_cifar_tar(tmp_path: Path) -> None:
    files = _cifar_files()
    _write_cifar_tar(tmp_path, files)
    with pytest.raises(DataError, match=r"is not the cifar10 file cifar10/cifar-10-python\.tar"):
        load_source("cifar10", tmp_path)  # a made-up archive is not the official one
    _check_cifar(tmp_path, files)


def test_cifar_partly_extracted_folder_beside_the_tarball_reads_the_tarball(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "file not found: .../cifar-10-batches-py/test_batch", the tarball beside it
    unused (an extraction stopped half-way)."""
    files = _cifar_files()
    _write_cifar_tar(tmp_path, files)
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(files["data_batch_1"][0])
    _check_cifar(tmp_path, files)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clusterfl: warning: cifar10: " in err
    assert "is incomplete (no data_batch_2, data_batch_3, data_batch_4, data_batch_5, " \
        "test_batch); reading " in err and "cifar-10-python.tar.gz instead" in err


def test_cifar_extracted_dir(tmp_path: Path) -> None:
    files = _cifar_files()
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, (blob, _, _) in files.items():
        (folder / name).write_bytes(blob)
    _check_cifar(tmp_path, files)


def test_cifar_refuses_foreign_pickles_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="clusterfl data download cifar10"):
        load_source("cifar10", tmp_path)
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, (blob, _, _) in _cifar_files().items():
        (folder / name).write_bytes(blob)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": os.system}, protocol=2))
    with pytest.raises(DataError, match="refusing to load"):
        load_source("cifar10", tmp_path)


def test_standardize_uses_training_statistics_per_channel() -> None:
    raw = load_source("digits")
    std = standardize(raw)
    assert std.x_train.mean().abs() < 1e-5 and abs(float(std.x_train.std()) - 1.0) < 1e-3
    # the test split is mapped by the same affine map (the training constants), not its own
    mean, scale = raw.x_train.mean(), raw.x_train.std()
    assert torch.allclose(std.x_test, (raw.x_test - mean) / scale, atol=1e-5)
    assert torch.equal(std.y_train, raw.y_train) and std.x_train.shape == raw.x_train.shape
    with pytest.raises(ConfigError, match=r"data\.standardize"):
        standardize(load_source("synthetic_regression"))


def test_an_idx_header_with_a_negative_size_is_named_not_a_traceback(tmp_path: Path) -> None:
    """The sizes (-1, -1, 4) made numpy's reshape fail with a bare ValueError ("can only
    specify one unknown dimension"); (-1, 2, 2) was "20 bytes, expected 12"."""
    path = tmp_path / "x.gz"
    for dims in ((-1, -1, 4), (-1, 2, 2)):
        header = (0x0803).to_bytes(4, "big") + b"".join(
            d.to_bytes(4, "big", signed=True) for d in dims)
        path.write_bytes(gzip.compress(header + bytes(4)))
        with pytest.raises(DataError, match="sizes are never negative") as err:
            read_idx(path, ndim=3)
        assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_an_idx_images_file_of_zero_images_is_named(tmp_path: Path) -> None:
    """A well-formed header of 0 images was read as an empty training split; the scenario then
    said "4 of 4 clients would get no train sample; use fewer clients", which no number of
    clients helps."""
    _write_idx_dataset(tmp_path)
    for key in ("x_train", "y_train"):
        empty = np.zeros((0, 28, 28) if key == "x_train" else (0,), np.uint8)
        (tmp_path / "mnist" / IDX_FILES[key]).write_bytes(gzip.compress(_idx_bytes(empty)))
    with pytest.raises(DataError, match="its header gives 0 images") as err:
        load_source("mnist", tmp_path, verify=False)
    assert str(tmp_path / "mnist" / IDX_FILES["x_train"]) in str(err.value)
    from tests.paper_files import write_emnist

    write_emnist(tmp_path / "e", per_class=0)  # EMNIST's files: the same
    with pytest.raises(DataError, match="its header gives 0 images") as err:
        load_source("emnist", tmp_path / "e", verify=False)
    assert "emnist-balanced-train-images-idx3-ubyte.gz" in str(err.value)
