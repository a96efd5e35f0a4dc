"""CIFAR-100 and EMNIST readers (clusterfl.data.sources) on tiny files in the official formats."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.config import load_config
from clusterfl.data.catalog import DATASETS
from clusterfl.data.sources import (
    EMNIST_SPLITS,
    IMAGE_SOURCES,
    emnist_files,
    load_source,
    parse_cifar_batch,
)
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import build_federation


def _idx_bytes(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic + dims + array.astype(np.uint8).tobytes()


def _one_line(err: pytest.ExceptionInfo[Exception], *parts: str) -> None:
    text = str(err.value)
    assert "\n" not in text
    for part in parts:
        assert part in text, (part, text)


# ---------------------------------------------------------------------- CIFAR-100


def _cifar100_part(n: int, seed: int) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    arrays = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
              "fine": rng.integers(0, 100, n), "coarse": rng.integers(0, 20, n)}
    part = {b"filenames": [b"f.png"] * n, b"batch_label": b"part",
            b"fine_labels": [int(v) for v in arrays["fine"]],
            b"coarse_labels": [int(v) for v in arrays["coarse"]], b"data": arrays["data"]}
    return pickle.dumps(part, protocol=2), arrays


def _cifar100_files() -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    meta = pickle.dumps({b"fine_label_names": [b"apple"] * 100,
                         b"coarse_label_names": [b"fruit"] * 20}, protocol=2)
    return {"train": _cifar100_part(4, 0), "test": _cifar100_part(2, 1), "meta": (meta, {})}


def _write_cifar100_tar(root: Path, files: dict[str, tuple[bytes, dict]]) -> Path:
    (root / "cifar100").mkdir(parents=True, exist_ok=True)
    path = root / "cifar100" / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, (blob, _) in files.items():
            info = tarfile.TarInfo(f"cifar-100-python/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def test_cifar100_tar_fine_and_coarse_labels(tmp_path: Path) -> None:
    files = _cifar100_files()
    _write_cifar100_tar(tmp_path, files)
    with pytest.raises(DataError, match=r"is not the cifar100 file") as err:
        load_source("cifar100", tmp_path)  # a made-up archive is not the official one
    _one_line(err, "cifar-100-python.tar.gz")
    src = load_source("cifar100", tmp_path, verify=False)
    assert src.x_train.shape == (4, 3, 32, 32) and src.x_test.shape == (2, 3, 32, 32)
    assert src.x_train.dtype == torch.float32 and src.y_train.dtype == torch.int64
    assert float(src.x_train.min()) >= 0.0 and float(src.x_train.max()) <= 1.0
    train, test = files["train"][1], files["test"][1]
    green = train["data"][2, 1024:2048].reshape(32, 32) / 255.0
    torch.testing.assert_close(src.x_train[2, 1], torch.from_numpy(green.astype(np.float32)))
    assert src.y_train.tolist() == train["fine"].tolist()
    assert src.y_test.tolist() == test["fine"].tolist()
    assert src.n_classes == 100 and src.name == "cifar100" and src.task == "classification"
    coarse = load_source("cifar100", tmp_path, verify=False, labels="coarse")
    assert coarse.n_classes == 20 and coarse.y_train.tolist() == train["coarse"].tolist()
    assert coarse.y_test.tolist() == test["coarse"].tolist()
    torch.testing.assert_close(coarse.x_train, src.x_train)


def test_cifar100_extracted_folder_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_source("cifar100", tmp_path)
    _one_line(err, "cifar-100-python.tar.gz", "clusterfl data download cifar100")
    folder = tmp_path / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    files = _cifar100_files()
    (folder / "train").write_bytes(files["train"][0])
    with pytest.raises(DataError) as err:
        load_source("cifar100", tmp_path)
    _one_line(err, str(folder / "test"), "clusterfl data download cifar100")
    (folder / "test").write_bytes(files["test"][0])
    src = load_source("cifar100", tmp_path, labels="coarse")
    assert src.y_test.tolist() == files["test"][1]["coarse"].tolist() and src.n_classes == 20


def test_cifar100_truncated_and_wrong_files(tmp_path: Path) -> None:
    files = _cifar100_files()
    path = _write_cifar100_tar(tmp_path, files)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(DataError) as err:
        load_source("cifar100", tmp_path, verify=False)
    _one_line(err, str(path), "corrupt or truncated")
    _write_cifar100_tar(tmp_path, {"test": files["test"]})
    with pytest.raises(DataError) as err:
        load_source("cifar100", tmp_path, verify=False)
    _one_line(err, str(path), "lacks cifar-100-python/train")
    cifar10_like = pickle.dumps({b"data": files["train"][1]["data"], b"labels": [0] * 4})
    _write_cifar100_tar(tmp_path, {"train": (cifar10_like, {}), "test": files["test"]})
    with pytest.raises(DataError) as err:  # a CIFAR-10 batch has no fine_labels
        load_source("cifar100", tmp_path, verify=False)
    _one_line(err, str(path), "fine_labels")


def _batch(**changes: object) -> bytes:
    rng = np.random.default_rng(0)
    batch: dict[object, object] = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                                   b"labels": [0, 3, 9, 1]}
    batch.update({k.encode() if isinstance(k, str) else k: v for k, v in changes.items()})
    return pickle.dumps(batch, protocol=2)


@pytest.mark.parametrize(("blob", "says"), [
    (_batch(data=np.full((4, 3072), 0.5, np.float32)), "pixels of dtype float32"),  # [0, 1]
    (_batch(data=np.full((4, 3072), 510, np.int16)), "pixels of dtype int16, values"),
    (_batch(labels=np.array([0.0, 3.5, 9.0, 1.0])), "labels like 3.5 are not class ids"),
    (_batch(labels=np.array([[0], [3], [9], [1]])), "labels shape (4, 1)"),
    (pickle.dumps(np.zeros((4, 3072), np.uint8)), "holds a ndarray, not the dict"),
    (pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}), "no key b'labels' (it has b'data')"),
])
def test_a_cifar_batch_that_is_not_the_official_kind_is_refused_not_cast(
        tmp_path: Path, blob: bytes, says: str) -> None:
    """Before: float pixels in [0, 1] were read as zeros, int16 pixels wrapped at 256, labels
    3.5 truncated to 3 (all with exit 0); a bare array or (N, 1) labels ended in an
    IndexError / a torch RuntimeError; a missing key read `bad batch pickle: b'labels'`."""
    with pytest.raises(DataError) as err:
        parse_cifar_batch(blob, tmp_path / "data_batch_1")
    _one_line(err, "data_batch_1", says)


def test_cifar_batches_of_other_integer_kinds_empty_or_with_text_keys_still_read(
        tmp_path: Path) -> None:
    pixels = np.arange(4 * 3072).reshape(4, 3072) % 256
    x, y = parse_cifar_batch(_batch(data=pixels.astype(np.int64)), tmp_path / "b")
    assert x.dtype == np.uint8 and x.reshape(4, -1).tolist() == pixels.tolist()
    x, y = parse_cifar_batch(pickle.dumps({"data": pixels.astype(np.uint8), "labels": [1] * 4}),
                             tmp_path / "b")
    assert y.tolist() == [1] * 4
    empty = pickle.dumps({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}, protocol=2)
    x, y = parse_cifar_batch(empty, tmp_path / "b")  # was: refusing to load __builtin__.bytes
    assert x.shape == (0, 3, 32, 32) and y.shape == (0,)


def test_mnist_test_images_of_another_size_than_the_training_ones_are_named(
        tmp_path: Path) -> None:
    """Before: the run started and failed in the model (`mat1 and mat2 shapes cannot be
    multiplied (200x1024 and 784x16)`)."""
    from clusterfl.data.sources import IDX_FILES
    from tests.paper_files import idx_bytes, write_idx_set

    folder = write_idx_set(tmp_path, "mnist")
    big = np.zeros((20, 32, 32), np.uint8)
    (folder / IDX_FILES["x_test"]).write_bytes(gzip.compress(idx_bytes(big)))
    with pytest.raises(DataError) as err:
        load_source("mnist", tmp_path, verify=False)
    _one_line(err, "training images are 1×28×28 and the test images 1×32×32")


# ---------------------------------------------------------------------- EMNIST


def _emnist_arrays(split: str, n_train: int = 6, n_test: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(len(split))
    first = 1 if split == "letters" else 0
    n = EMNIST_SPLITS[split]
    arrays = {"x_train": rng.integers(0, 256, (n_train, 28, 28)),
              "y_train": rng.integers(first, first + n, n_train),
              "x_test": rng.integers(0, 256, (n_test, 28, 28)),
              "y_test": rng.integers(first, first + n, n_test)}
    arrays["y_train"][:2] = [first, first + n - 1]  # both ends of the range
    arrays["x_train"][0] = 0
    arrays["x_train"][0, 3, :] = 255  # stored: row 3 lit, so the image has column 3 lit
    return arrays


def _emnist_blobs(split: str, arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {fname: gzip.compress(_idx_bytes(arrays[key]))
            for key, fname in emnist_files(split).items()}


def _check_emnist(root: Path, split: str, arrays: dict[str, np.ndarray]) -> None:
    src = load_source("emnist", root, split=split)
    assert src.x_train.shape == (6, 1, 28, 28) and src.x_test.shape == (3, 1, 28, 28)
    assert src.x_train.dtype == torch.float32 and src.y_train.dtype == torch.int64
    assert float(src.x_train.min()) >= 0.0 and float(src.x_train.max()) <= 1.0
    image = src.x_train[0, 0]
    assert image[:, 3].tolist() == [1.0] * 28 and float(image.sum()) == 28.0  # transposed
    expected = arrays["x_train"][1].T / 255.0
    torch.testing.assert_close(src.x_train[1, 0], torch.from_numpy(expected.astype(np.float32)))
    shift = 1 if split == "letters" else 0
    assert src.y_train.tolist() == (arrays["y_train"] - shift).tolist()
    assert src.y_test.tolist() == (arrays["y_test"] - shift).tolist()
    assert src.y_train[:2].tolist() == [0, EMNIST_SPLITS[split] - 1]
    assert src.n_classes == EMNIST_SPLITS[split] and src.name == "emnist"


def test_emnist_gz_files_letters_and_balanced(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    folder.mkdir()
    written = {}
    for split in ("letters", "balanced"):
        written[split] = _emnist_arrays(split)
        for fname, blob in _emnist_blobs(split, written[split]).items():
            (folder / fname).write_bytes(blob)
    _check_emnist(tmp_path, "letters", written["letters"])
    _check_emnist(tmp_path, "balanced", written["balanced"])
    assert load_source("emnist", tmp_path).n_classes == 47  # balanced by default
    assert EMNIST_SPLITS == {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26,
                             "digits": 10, "mnist": 10}
    with pytest.raises(DataError) as err:  # the digits split is not there
        load_source("emnist", tmp_path, split="digits")
    _one_line(err, "gzip.zip", "emnist-digits-train-images-idx3-ubyte.gz",
              "clusterfl data download emnist")


def test_emnist_files_of_another_split_name_that_split(tmp_path: Path) -> None:
    """Before: `neither gzip.zip nor the files ... of split 'balanced' found` and where to
    fetch them, though the byclass files were there."""
    from tests.paper_files import write_emnist

    write_emnist(tmp_path, "byclass", per_class=1, test_per_class=1)
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path)
    _one_line(err, "of split 'balanced' found", "(it holds the files of split 'byclass': set "
              "data.split = 'byclass' to use them)")


def test_emnist_zip_as_nist_distributes_it(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    folder.mkdir()
    written = {s: _emnist_arrays(s) for s in ("letters", "digits")}
    with zipfile.ZipFile(folder / "gzip.zip", "w") as zf:
        for split, arrays in written.items():
            for fname, blob in _emnist_blobs(split, arrays).items():
                zf.writestr(f"gzip/{fname}", blob)
    _check_emnist(tmp_path, "letters", written["letters"])
    _check_emnist(tmp_path, "digits", written["digits"])
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path, split="byclass")
    _one_line(err, "gzip.zip", "lacks gzip/emnist-byclass-train-images-idx3-ubyte.gz")


def test_emnist_truncated_wrong_magic_and_bad_labels(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    folder.mkdir()
    arrays = _emnist_arrays("letters")
    blobs = _emnist_blobs("letters", arrays)
    for fname, blob in blobs.items():
        (folder / fname).write_bytes(blob)
    images = folder / emnist_files("letters")["x_train"]
    images.write_bytes(blobs[images.name][:-30])
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path, split="letters")
    _one_line(err, str(images), "corrupt or truncated", "clusterfl data download emnist")
    labels = folder / emnist_files("letters")["y_test"]
    images.write_bytes(blobs[images.name])
    labels.write_bytes(gzip.compress(_idx_bytes(arrays["x_test"])))  # images as labels
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path, split="letters")
    _one_line(err, str(labels), "magic number")
    labels.write_bytes(gzip.compress(_idx_bytes(np.array([0, 1, 2]))))  # 0: not a letter
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path, split="letters")
    _one_line(err, str(labels), "labels outside 1..26")
    (folder / "gzip.zip").write_bytes(b"not a zip")
    for fname in blobs:
        (folder / fname).unlink()
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path)
    _one_line(err, str(folder / "gzip.zip"), "zip")


# ---------------------------------------------------------------------- options and catalog


def test_bad_options_name_the_field_and_the_values(tmp_path: Path) -> None:
    cases = [({"source": "emnist", "split": "lettres"}, "data.split", "letters"),
             ({"source": "cifar100", "labels": "medium"}, "data.labels", "coarse"),
             ({"source": "mnist", "split": "letters"}, "data.split", "emnist"),
             ({"source": "emnist", "labels": "fine"}, "data.labels", "cifar100")]
    for data, field, allowed in cases:
        with pytest.raises(ConfigError) as err:
            load_config({"data": data})
        assert err.value.field == field
        _one_line(err, field, allowed)
    with pytest.raises(ConfigError) as err:
        load_source("emnist", tmp_path, split="lettres")
    _one_line(err, "data.split", "byclass, bymerge, balanced, letters, digits, mnist")
    with pytest.raises(ConfigError) as err:
        load_source("cifar100", tmp_path, labels="medium")
    _one_line(err, "data.labels", "fine, coarse")


def test_catalog_and_image_sources() -> None:
    assert {"cifar100", "emnist"} <= set(IMAGE_SOURCES)
    cifar = DATASETS["cifar100"].files[0]
    assert cifar.path == "cifar100/cifar-100-python.tar.gz" and cifar.sha256 is None
    assert cifar.url == "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    assert cifar.md5 == "eb9058c3a382ffc7106e4002c42a8d85" and cifar.size == 169001437
    emnist = DATASETS["emnist"].files[0]
    assert emnist.url == "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"
    assert emnist.path == "emnist/gzip.zip" and emnist.sha256 is None and emnist.md5 is None


def test_run_config_with_emnist_builds_a_federation(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    folder.mkdir()
    for fname, blob in _emnist_blobs("letters", _emnist_arrays("letters")).items():
        (folder / fname).write_bytes(blob)
    config = load_config({"data": {"source": "emnist", "split": "letters",
                                   "data_dir": str(tmp_path)},
                          "scenario": {"name": "iid", "n_clients": 2}})
    federation = build_federation(config)
    assert federation.n_classes == 26 and federation.x_train.shape[1:] == (1, 28, 28)
    assert len(federation.train_offsets) == 3 and int(federation.y_train.max()) <= 25


def test_emnist_files_left_in_the_gzip_folder_of_an_unzipped_archive_are_pointed_at(
        tmp_path: Path) -> None:
    """`unzip gzip.zip` puts the files in emnist/gzip/: the message said neither the archive
    nor the files were found and where to download them, not where they were."""
    folder = tmp_path / "emnist" / "gzip"
    folder.mkdir(parents=True)
    for fname, blob in _emnist_blobs("balanced", _emnist_arrays("balanced")).items():
        (folder / fname).write_bytes(blob)
    with pytest.raises(DataError) as err:
        load_source("emnist", tmp_path)
    _one_line(err, f"(they are in {folder}/, where unzipping gzip.zip puts them: move them up "
              f"into {tmp_path / 'emnist'})")
