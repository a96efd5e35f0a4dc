"""Tiny data files in the official formats (EMNIST's gzip IDX files, the CIFAR-10 / CIFAR-100
python tarballs, LEAF's FEMNIST JSON folders), written by tests that run the papers' scenarios
and configs without the real data. Every class has a few samples, so any label skew works."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np

from clusterfl.data.sources import EMNIST_SPLITS, emnist_files


def idx_bytes(array: np.ndarray) -> bytes:
    magic = (0x0800 | array.ndim).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic + dims + array.astype(np.uint8).tobytes()


def _per_class(n_classes: int, per_class: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(n_classes), per_class))


def write_emnist(root: Path, split: str = "balanced", per_class: int = 20,
                 test_per_class: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """emnist/emnist-SPLIT-*.gz with `per_class` training images of every class (letters:
    labels 1..26 as NIST stores them). Returns the arrays as written."""
    rng = np.random.default_rng(seed)
    k, first = EMNIST_SPLITS[split], int(split == "letters")
    arrays = {}
    for part, n in (("train", per_class), ("test", test_per_class)):
        y = _per_class(k, n, rng) + first
        arrays[f"x_{part}"] = rng.integers(0, 256, (len(y), 28, 28)).astype(np.uint8)
        arrays[f"y_{part}"] = y.astype(np.uint8)
    folder = root / "emnist"
    folder.mkdir(parents=True, exist_ok=True)
    for key, fname in emnist_files(split).items():
        (folder / fname).write_bytes(gzip.compress(idx_bytes(arrays[key]), compresslevel=1))
    return arrays


def _add(tar: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    tar.addfile(info, io.BytesIO(blob))


def write_cifar10(root: Path, per_batch: int = 20, test: int = 20, seed: int = 0) -> Path:
    """cifar10/cifar-10-python.tar.gz: five training batches and the test batch."""
    rng = np.random.default_rng(seed)
    path = root / "cifar10" / "cifar-10-python.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for i, name in enumerate(names):
            n = test if name == "test_batch" else per_batch
            labels = _per_class(10, max(1, n // 10), rng)[:n]
            batch = {b"batch_label": name.encode(), b"labels": [int(v) for v in labels],
                     b"data": rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8),
                     b"filenames": [f"{i}.png".encode()] * len(labels)}
            _add(tar, f"cifar-10-batches-py/{name}", pickle.dumps(batch, protocol=2))
    return path


def write_cifar100(root: Path, train: int = 200, test: int = 100, seed: int = 0) -> Path:
    """cifar100/cifar-100-python.tar.gz: train and test pickles (fine and coarse labels)."""
    rng = np.random.default_rng(seed)
    path = root / "cifar100" / "cifar-100-python.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, n in (("train", train), ("test", test)):
            fine = _per_class(100, max(1, n // 100), rng)[:n]
            part = {b"fine_labels": [int(v) for v in fine],
                    b"coarse_labels": [int(v) // 5 for v in fine],
                    b"data": rng.integers(0, 256, (len(fine), 3072), dtype=np.uint8)}
            _add(tar, f"cifar-100-python/{name}", pickle.dumps(part, protocol=2))
    return path


def write_femnist(root: Path, n_writers: int = 6, train: int = 8, test: int = 2,
                  seed: int = 0) -> Path:
    """femnist/{train,test}/*.json in LEAF's format (every writer in both, `-t sample`)."""
    rng = np.random.default_rng(seed)
    folder = root / "femnist"
    for part, n in (("train", train), ("test", test)):
        (folder / part).mkdir(parents=True, exist_ok=True)
        users = [f"f{w:04d}_{w % 90:02d}" for w in range(n_writers)]
        data = {u: {"x": np.round(rng.random((n, 784)), 3).tolist(),
                    "y": rng.integers(0, 62, n).tolist()} for u in users}
        blob = {"users": users, "num_samples": [n] * n_writers, "user_data": data}
        (folder / part / f"all_data_0_niid_0_keep_0_{part}_9.json").write_text(json.dumps(blob))
    return folder


def write_idx_set(root: Path, name: str, train: int = 60, test: int = 20,
                  seed: int = 0) -> Path:
    """NAME/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz: MNIST's layout (Fashion-MNIST's
    too); the catalog's checksums will not match, so read them with verification off."""
    from clusterfl.data.sources import IDX_FILES

    rng = np.random.default_rng(seed)
    arrays = {}
    for part, n in (("train", train), ("test", test)):
        arrays[f"y_{part}"] = _per_class(10, max(1, n // 10), rng)[:n].astype(np.uint8)
        arrays[f"x_{part}"] = rng.integers(0, 256, (len(arrays[f"y_{part}"]), 28, 28))
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for key, fname in IDX_FILES.items():
        (folder / fname).write_bytes(gzip.compress(idx_bytes(arrays[key]), compresslevel=1))
    return folder


def write_ag_news(root: Path, per_topic: int = 12, test: int = 4, seed: int = 0) -> Path:
    """ag_news/{train,test}.csv as the authors' ag_news_csv has them: no header, every field
    quoted, "class index (1-4)","title","description"; each topic its own words."""
    rng = np.random.default_rng(seed)
    folder = root / "ag_news"
    folder.mkdir(parents=True, exist_ok=True)
    for part, n in (("train", per_topic), ("test", test)):
        rows = []
        for topic in range(4):
            words = [f"t{topic}w{i}" for i in range(8)]
            for _ in range(n):
                title = " ".join(rng.choice(words, 4))
                text = " ".join(rng.choice(words, 12)) + " \\ and more"
                rows.append(f'"{topic + 1}","{title}","{text}"')
        (folder / f"{part}.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


WRITERS = {"emnist": write_emnist, "cifar10": write_cifar10, "cifar100": write_cifar100,
           "femnist": write_femnist, "ag_news": write_ag_news}
