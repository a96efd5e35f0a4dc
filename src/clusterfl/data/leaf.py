"""FEMNIST (LEAF, Caldas et al. 2018): EMNIST's handwritten characters grouped by writer.

Two on-disk forms are read, both under `DATA_DIR/femnist/`::

    DATA_DIR/femnist/
    ├── train/*.json  test/*.json    LEAF's files (`preprocess.sh ... -t sample` writes them
    │                                to leaf/data/femnist/data/{train,test}; `data/train` and
    │                                `data/test` under femnist/ are read as well)
    └── hf/                          the same data as a Hugging Face dataset on disk
                                     (flwrlabs/femnist: `save_to_disk`, or its parquet files)

LEAF's JSON file: `{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784
floats]], "y": [ints]}}}` — each image flattened row by row, pixel values in [0, 1] as LEAF
writes them (we keep them as they are), labels 0..61 (digits 0-9, upper-case letters 10-35,
lower-case 36-61). The Hugging Face form has the columns `image` (28x28), `character` (the
label) and `writer_id`; without a `test` split, each writer's samples are cut 90 / 10 at random
(seed 0), LEAF's default `--tf 0.9` with `-t sample`.

The result is a `WriterSource`: a pooled `Source` (any scenario can split it) that also knows
the writer of every row, which the `writers` scenario (`clusterfl.data.paper_scenarios`) uses
to make each writer a client. FEMNIST has no true clusters.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.data.sources import DECODE_CACHES, READERS, Source
from clusterfl.errors import DataError

FEMNIST_CLASSES = 62
LEAF_PIXELS = 28 * 28
HF_FOLDER = "hf"
HF_COLUMNS = ("image", "character", "writer_id")
HF_TEST_FRACTION = 0.1  # LEAF's default --tf 0.9
HF_SPLIT_SEED = 0
LEAF_GET = ("make LEAF's files (github.com/TalwalkarLab/leaf, data/femnist: ./preprocess.sh -s "
            "niid --sf 1.0 -k 0 -t sample) and copy its data/train and data/test folders to "
            "{folder}/train and {folder}/test, or save the Hugging Face dataset flwrlabs/femnist "
            "there (datasets.load_dataset('flwrlabs/femnist').save_to_disk('{folder}/hf'))")
"""What to fetch and where: FEMNIST has no single official file to download."""


@dataclass(frozen=True, kw_only=True)
class WriterSource(Source):
    """A `Source` whose every row has a writer: `train_writers[i]` / `test_writers[i]` index
    `writer_names`."""

    train_writers: np.ndarray
    test_writers: np.ndarray
    writer_names: tuple[str, ...]


def load_femnist(root: Path, origin: str) -> WriterSource:
    """FEMNIST from `root/femnist` (LEAF's JSON folders, else the Hugging Face dataset)."""
    folder = root / "femnist"
    for base in (folder, folder / "data"):
        train, test = base / "train", base / "test"
        if train.is_dir() or test.is_dir():
            files = []
            for part in (train, test):
                found = sorted(part.glob("*.json")) if part.is_dir() else []
                if not found:
                    raise DataError(f"femnist: no LEAF .json files in {part}; "
                                    f"{LEAF_GET.format(folder=folder)}.")
                files.append(tuple(_key(f) for f in found))
            return _decode_leaf(files[0], files[1])
    hf = folder / HF_FOLDER
    if hf.exists():
        return _decode_hf(_tree_key(hf))
    raise DataError(f"femnist: neither LEAF's {folder}/train/ and test/ nor a Hugging Face "
                    f"dataset {hf}/ found; {LEAF_GET.format(folder=folder)}; "
                    f"{_origin(root, origin)}.")


def _origin(root: Path, origin: str) -> str:
    """Where the data folder came from (FEMNIST has no `clusterfl data download`)."""
    came = {"data.data_dir": "data.data_dir (the config or --data-dir)",
            "CLUSTERFL_DATA": "$CLUSTERFL_DATA"}.get(origin, "the default (set CLUSTERFL_DATA "
                                                              "or pass --data-dir to change it)")
    return f"the data folder {root} is {came}"


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _tree_key(path: Path) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """Cache key of the Hugging Face form: its resolved path and every file under it (name,
    size, mtime). A parquet file copied over, or a new `save_to_disk`, changes files inside
    `hf/` (its `train/` folder) but not the time of `hf/` itself: keyed on that alone, the
    old rows were read again."""
    root = path.resolve()
    files = [root] if root.is_file() else sorted(f for f in root.rglob("*") if f.is_file())
    stats = ((f, f.stat()) for f in files)
    return str(root), tuple((f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns)
                            for f, st in stats)


def _bad(path: Path | str, why: str) -> DataError:
    return DataError(f"femnist: {path} is not a LEAF FEMNIST file ({why}); make it again "
                     "with LEAF's preprocess.sh (or check that the copy finished)")


# ---------------------------------------------------------------------- LEAF's JSON


def read_leaf_json(path: Path) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """One LEAF file → (users, images `[n, 1, 28, 28]` float32 per user, labels per user).

    LEAF's `split_data.py -t sample` keeps an empty `{"x": [], "y": []}` in `user_data` for
    every writer it drops from `users` (those with under two samples): such entries are
    skipped, but one with samples that `users` does not list is refused, as is a user listed
    twice: either would read the wrong rows without a word."""
    try:
        with open(path, encoding="utf-8") as fh:
            blob = json.load(fh)
    except json.JSONDecodeError as exc:
        raise _bad(path, f"truncated or not JSON: {exc.msg} at line {exc.lineno}") from None
    except UnicodeDecodeError:
        raise _bad(path, "not UTF-8 text") from None
    except OSError as exc:  # a folder named *.json, no permission
        raise DataError(f"femnist: cannot read {path} ({exc.strerror})") from None
    if not isinstance(blob, dict):
        raise _bad(path, f"a JSON {type(blob).__name__}, not an object")
    missing = [k for k in ("users", "num_samples", "user_data") if k not in blob]
    if missing:
        raise _bad(path, f"no {', '.join(missing)}; a LEAF file has users, num_samples and "
                         "user_data")
    users, counts, data = blob["users"], blob["num_samples"], blob["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
        raise _bad(path, "users and num_samples must be lists of one length")
    odd = next((u for u in users if isinstance(u, bool) or not isinstance(u, str | int)), None)
    if odd is not None:
        raise _bad(path, f"users holds {json.dumps(odd)[:40]}; user ids must be strings "
                         "(or integers)")
    wrong = [n for n in counts if not _count(n)]
    if wrong:  # "2" printed as 2 in the count mismatch below
        raise _bad(path, f"num_samples holds {json.dumps(wrong[0])[:40]}; counts must be whole "
                         "numbers >= 0 (one per user)")
    names = [str(u) for u in users]  # JSON's keys of user_data are strings
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _bad(path, f"user {name!r} listed twice in users")
        seen.add(name)
    if not isinstance(data, dict):
        raise _bad(path, f"user_data is a JSON {type(data).__name__}, not an object of users")
    unlisted = [u for u, e in data.items() if u not in seen and not _empty_entry(e)]
    if unlisted:
        shown = ", ".join(repr(u) for u in unlisted[:3]) + (", ..." if len(unlisted) > 3 else "")
        raise _bad(path, f"user_data holds {len(unlisted)} user(s) with samples that users "
                         f"does not list: {shown}")
    xs, ys = [], []
    for user, n in zip(names, counts, strict=True):
        entry = data.get(user)
        if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
            raise _bad(path, f"user_data has no x and y for user {user!r}")
        labels = entry["y"]
        odd = next((v for v in labels if isinstance(v, str | bool)), None) \
            if isinstance(labels, list) else None
        if odd is not None:  # numpy would read "3" as 3 and true as 1
            raise _bad(path, f"user {user!r}: y holds {json.dumps(odd)}; LEAF's labels are "
                             f"integers 0..{FEMNIST_CLASSES - 1}")
        try:
            x = np.asarray(entry["x"], dtype=np.float32)
            y = np.asarray(labels, dtype=np.float64)
        except (TypeError, ValueError):
            raise _bad(path, f"user {user!r}: x or y holds something other than numbers "
                             f"(rows of {LEAF_PIXELS} pixels, integer labels)") from None
        if x.size == 0:  # a writer without samples (`x: []`): no rows, not a wrong shape
            x = x.reshape(0, LEAF_PIXELS)
        if x.ndim != 2 or x.shape[1] != LEAF_PIXELS:
            raise _bad(path, f"user {user!r}: x has shape {x.shape}, expected rows of "
                             f"{LEAF_PIXELS} pixels")
        if y.shape != (len(x),) or len(x) != n:
            raise _bad(path, f"user {user!r}: {len(x)} images, {y.size} labels, num_samples "
                             f"{n}")
        if len(y) and (np.any(y != np.round(y)) or y.min() < 0 or y.max() >= FEMNIST_CLASSES):
            raise _bad(path, f"user {user!r}: labels outside 0..{FEMNIST_CLASSES - 1}")
        if len(x) and (x.min() < 0.0 or x.max() > 1.0 or not np.isfinite(x).all()):
            raise _bad(path, f"user {user!r}: pixel values outside [0, 1]")
        xs.append(x.reshape(-1, 1, 28, 28))
        ys.append(y.astype(np.int64))
    return names, xs, ys


def _count(n: object) -> bool:
    """A sample count as JSON writes it: a whole number >= 0 (not text, not true/false)."""
    return isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) and \
        n >= 0 and n == int(n)


def _empty_entry(entry: object) -> bool:
    """A `user_data` entry without samples (LEAF's `{"x": [], "y": []}` of a dropped writer)."""
    return isinstance(entry, dict) and not entry.get("x") and not entry.get("y")


@functools.lru_cache(maxsize=2)
def _decode_leaf(train: tuple[tuple[str, int, int], ...],
                 test: tuple[tuple[str, int, int], ...]) -> WriterSource:
    """Both splits, writers numbered in order of appearance. LEAF writes each writer into one
    file of a split (`all_data_N`'s writers stay in `all_data_N_..._train`), so a writer in
    two files of one split is a copied file (a second copy, or a test file put in train/) and
    is refused; so is a writer whose training rows are its test rows (a test file of
    `-t user`, whose writers are not in train/, copied there)."""
    names: dict[str, int] = {}
    parts = []
    found: list[dict[str, tuple[str, np.ndarray]]] = []
    for split, keys in (("train", train), ("test", test)):
        xs, ys, ws = [], [], []
        where: dict[str, tuple[str, np.ndarray]] = {}
        for key in keys:
            users, ux, uy = read_leaf_json(Path(key[0]))
            for user, x, y in zip(users, ux, uy, strict=True):
                if user in where:
                    raise DataError(f"femnist: writer {user!r} appears in {where[user][0]} and "
                                    f"{key[0]}; LEAF puts each writer in one {split} file: "
                                    "remove the copy")
                where[user] = (key[0], x)
                wid = names.setdefault(user, len(names))
                xs.append(x)
                ys.append(y)
                ws.append(np.full(len(y), wid, np.int64))
        found.append(where)
        parts.append(_concat(xs, ys, ws))
    for user, (test_file, x) in found[1].items():
        train_file, x_train = found[0].get(user, ("", None))
        if x_train is not None and len(x) and np.array_equal(x, x_train):
            raise DataError(f"femnist: writer {user!r} has the same images in {train_file} "
                            f"and {test_file}; a test file copied into train/? LEAF's train "
                            "and test samples are disjoint")
    return _writer_source(parts, tuple(names))


def _concat(xs: list[np.ndarray], ys: list[np.ndarray],
            ws: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not xs:
        return (np.zeros((0, 1, 28, 28), np.float32), np.zeros(0, np.int64),
                np.zeros(0, np.int64))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)


def _writer_source(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                   names: tuple[str, ...]) -> WriterSource:
    (x_tr, y_tr, w_tr), (x_te, y_te, w_te) = parts
    return WriterSource(
        x_train=torch.from_numpy(np.ascontiguousarray(x_tr, dtype=np.float32)),
        y_train=torch.from_numpy(y_tr), x_test=torch.from_numpy(
            np.ascontiguousarray(x_te, dtype=np.float32)),
        y_test=torch.from_numpy(y_te), n_classes=FEMNIST_CLASSES, task="classification",
        name="femnist", train_writers=w_tr, test_writers=w_te, writer_names=names)


# ---------------------------------------------------------------------- Hugging Face


@functools.lru_cache(maxsize=2)
def _decode_hf(key: tuple[str, tuple[tuple[str, int, int], ...]]) -> WriterSource:
    from clusterfl.data.own import _hf_splits

    try:
        import datasets
    except ModuleNotFoundError:
        raise DataError("femnist: reading the Hugging Face form needs the `datasets` package: "
                        "pip install 'clusterfl[hf]'") from None
    path = Path(key[0])
    try:
        splits = _hf_splits(datasets, path, "train", "test", "data.data_dir")
    except Exception as exc:  # a broken save_to_disk folder or parquet file: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _bad(path, f"not a readable Hugging Face dataset: {first}") from None
    train = splits["train"]
    missing = [c for c in HF_COLUMNS if c not in train.column_names]
    if missing:
        raise _bad(path, f"no column {', '.join(missing)}; flwrlabs/femnist has "
                         f"{', '.join(HF_COLUMNS)} (columns here: "
                         f"{', '.join(train.column_names)})")
    names: dict[str, int] = {}
    tables = {s: _hf_table(ds, path, names) for s, ds in splits.items() if s in ("train", "test")}
    if "test" in tables:
        return _writer_source([tables["train"], tables["test"]], tuple(names))
    x, y, w = tables["train"]
    test = _per_writer_test(w, HF_TEST_FRACTION, HF_SPLIT_SEED)
    return _writer_source([(x[~test], y[~test], w[~test]), (x[test], y[test], w[test])],
                          tuple(names))


def _hf_table(ds: Any, path: Path,
              names: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from clusterfl.data.own import _hf_arrays

    x, y = _hf_arrays(ds, "image", "character")
    if x.shape[1:] != (1, 28, 28):
        raise _bad(path, f"images of shape {x.shape[1:]}, expected 28x28 grey-scale")
    if len(y) and (y.min() < 0 or y.max() >= FEMNIST_CLASSES):
        raise _bad(path, f"character labels outside 0..{FEMNIST_CLASSES - 1}")
    writers = np.array([names.setdefault(str(v), len(names)) for v in ds["writer_id"]],
                       dtype=np.int64)
    return x.astype(np.float32), y.astype(np.int64), writers


def _per_writer_test(writers: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Test mask: round(fraction · n_w) random samples of every writer w (at least one when it
    has two or more, never all of them)."""
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(writers)), writers))
    sorted_w = writers[order]
    rank = np.arange(len(writers)) - np.searchsorted(sorted_w, sorted_w, side="left")
    counts = np.bincount(writers)
    quota = np.clip(np.round(fraction * counts), 1, np.maximum(counts - 1, 0)).astype(np.int64)
    mask = np.zeros(len(writers), dtype=bool)
    mask[order] = rank < quota[sorted_w]
    return mask


READERS["femnist"] = load_femnist
DECODE_CACHES += [_decode_leaf.cache_clear, _decode_hf.cache_clear]
