"""Data of one's own: a federation from per-client arrays, a folder of per-client `.npz` files,
a Hugging Face `datasets` dataset on disk, or a loader function named by the config.

`[data] source` says where the data comes from (`DataConfig` in `clusterfl.config`):

- `digits`, `mnist`, ...: the built-in datasets (`clusterfl.data.sources`), one pool of
  samples that `[scenario]` splits into clients;
- `npz`: `path` = a folder of per-client `.npz` files in the format `clusterfl flower
  export-partitions` writes (`x_train, y_train, x_test, y_test, client_id, n_classes`,
  optional `task` and `cluster`, the true cluster id); split into clients already;
- `huggingface`: `path` = a `save_to_disk` folder, or parquet / arrow files (train / test
  by file name), columns `input` and `label`; one pool, split by `[scenario]` (default `iid`);
- `shards`: `path` = a folder `clusterfl data shard` wrote (`clusterfl.data.shards`): a
  federation built once, its arrays memory-mapped; split into clients already;
- `python`: a federation built in Python (`Federation.from_clients`) and given to
  `Experiment(..., federation=...)`; split into clients already;
- `"pkg.mod:load"` or a `clusterfl.datasets` entry point: a function; the `[data]` table's
  other keys are its keyword arguments (plus `seed` when it takes one). It returns a
  `Federation` (split into clients already) or a `Source` (one pool for `[scenario]`).

A per-client source takes its clients as they are (`scenario.name = "given"`, the default for
it); a pooled one is split by any scenario (rotation needs image inputs `[C, H, W]`). The
federation's `name` says where the data came from ("npz:parts", "hf:my_ds/iid", ...) and the
run's `config.toml` keeps the `[data]` table, so summary, report, `--resume` and `compare`
describe the real data. Our choices: files are read in client-id order and must hold the ids
0..N-1 once each; a true cluster id counts only when every client has one (ARI), else none.
"""

from __future__ import annotations

import inspect
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict

from clusterfl.config_util import Settings
from clusterfl.data.federation import Federation, Task, assemble_clients, check_numbers
from clusterfl.data.shards import read_shards
from clusterfl.data.sources import SOURCE_NAMES, Source, stratified_test_mask
from clusterfl.errors import ConfigError, DataError
from clusterfl.plugins import describe, resolve

PER_CLIENT_SOURCES = ("npz", "python", "shards")
"""Sources whose clients are given (scenario `given`)."""
POOLED_SOURCES = ("huggingface",)
OWN_SOURCES = PER_CLIENT_SOURCES + POOLED_SOURCES
GIVEN = "given"
"""The scenario of data already split into clients: each client as given."""

NPZ_REQUIRED = ("x_train", "y_train", "x_test", "y_test", "client_id", "n_classes")


def is_per_client(source: str) -> bool | None:
    """True for sources split into clients already, False for pooled ones, None when only
    the loader's result tells (a function named by the config)."""
    if source in PER_CLIENT_SOURCES:
        return True
    if source in SOURCE_NAMES or source in POOLED_SOURCES:
        return False
    return None


def default_scenario(source: str) -> str:
    """The scenario a config without `[scenario] name` gets for `source`."""
    if source == "femnist":  # LEAF's writers, each one client
        return "writers"
    if source in SOURCE_NAMES:
        return "rotation"
    return "iid" if source in POOLED_SOURCES else GIVEN


# ---------------------------------------------------------------------- npz folder
def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one client file (DataError naming the file and what is wrong)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_REQUIRED if k not in z.files]
            if missing:
                raise DataError(f"{path}: missing arrays {missing}; required: "
                                f"{', '.join(NPZ_REQUIRED)}")
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc}); is it truncated?") from None


def npz_folder(path: str | Path, field: str = "data.path") -> Federation:
    """The federation of a folder of per-client `.npz` files (one file per client, any
    names ending in `.npz`, ordered by their `client_id`)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(field, f"{folder} is not a folder (a folder of per-client .npz "
                                 "files, e.g. from `clusterfl flower export-partitions`)")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise ConfigError(field, f"{folder} holds no .npz files")
    by_id: dict[int, tuple[Path, dict[str, np.ndarray]]] = {}
    for f in files:
        d = read_npz(f)
        cid = npz_int(d, "client_id", f)
        if cid in by_id:
            raise DataError(f"{by_id[cid][0].name} and {f.name} in {folder} both hold "
                            f"client_id {cid}")
        by_id[cid] = (f, d)
    ids = sorted(by_id)
    if ids[0] < 0:  # the gaps below would read "missing []"
        raise DataError(f"{by_id[ids[0]][0]}: client_id {ids[0]}; client ids must be 0..N-1, "
                        "one file each")
    if ids != list(range(len(ids))):
        gaps = sorted(set(range(max(ids) + 1)) - set(ids))
        raise DataError(f"{folder}: client ids must be 0..N-1, one file each; missing {gaps}")
    rows = [by_id[c][1] for c in ids]
    tasks = {str(d.get("task", "classification")) for d in rows}
    if not tasks <= {"classification", "regression"}:
        raise DataError(f"{folder}: task {sorted(tasks - {'classification', 'regression'})[0]!r}"
                        " in a file is not a task; allowed: classification, regression")
    if len(tasks) != 1:
        raise DataError(f"{folder}: the files disagree on the task {sorted(tasks)}; every "
                        "file must give the same one")
    task: Task = "regression" if tasks == {"regression"} else "classification"
    with_cluster = [c for c in ids if "cluster" in by_id[c][1]]
    if with_cluster and len(with_cluster) != len(ids):
        lacking = [by_id[c][0].name for c in ids if "cluster" not in by_id[c][1]][:3]
        raise DataError(f"{folder}: some files have a true `cluster` id and others not "
                        f"(e.g. {', '.join(lacking)}); give it in every file or in none")
    clusters = [npz_int(by_id[c][1], "cluster", by_id[c][0]) for c in ids] \
        if with_cluster else None
    classes = {by_id[c][0].name: npz_int(by_id[c][1], "n_classes", by_id[c][0]) for c in ids}
    if len(set(classes.values())) > 1:
        shown = ", ".join(f"{k} {v}" for k, v in list(classes.items())[:4])
        raise DataError(f"{folder}: the files disagree on n_classes ({shown}, ...); every "
                        "client's file must give the federation's one number of classes")
    splits = {s: [(npz_numbers(by_id[c][1], f"x_{s}", by_id[c][0]),
                   npz_numbers(by_id[c][1], f"y_{s}", by_id[c][0])) for c in ids]
              for s in ("train", "test")}
    n_classes = classes[by_id[ids[0]][0].name]
    return assemble_clients(splits, clusters, n_classes, task, f"npz:{folder.name}",
                     {"source": "npz", "path": str(path)})


def npz_int(d: dict[str, np.ndarray], key: str, f: Path) -> int:
    """The integer scalar `d[key]` of file `f` (DataError naming both otherwise)."""
    a = d[key]
    whole = a.dtype.kind in "iu" or (a.dtype.kind == "f" and bool(np.all(a == np.round(a))))
    if a.size != 1 or not whole:
        raise DataError(f"{f}: {key} must be one integer, got {a.dtype} {a.reshape(-1)[:3]}")
    return int(a.reshape(()))


def npz_numbers(d: dict[str, np.ndarray], key: str, f: Path) -> torch.Tensor:
    """Array `d[key]` of file `f` as a tensor: numbers only (DataError naming both)."""
    a = d[key]
    what = "class ids 0, 1, ..." if key.startswith("y") else "real numbers"
    check_numbers(a, f"{f}: {key}", what)
    if a.ndim == 0:  # len() of it would be a bare TypeError further on
        raise DataError(f"{f}: {key} is a single number (shape ()); it must hold one entry "
                        "per sample (shape [N, ...])")
    return torch.from_numpy(a)


def _finite(x: torch.Tensor, what: str, offsets: np.ndarray | None = None,
            kind: str = "inputs") -> None:
    """DataError naming `what` and the first sample (and its client, given the split's
    `offsets`) when `x` (the `kind`: inputs or targets) holds NaN or infinity."""
    if not x.is_floating_point() or not len(x):
        return
    bad = ~torch.isfinite(x.reshape(len(x), -1)).all(1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        if offsets is not None:
            client = int(np.searchsorted(offsets, row, side="right")) - 1
            what, row = f"{what}: client {client}", row - int(offsets[client])
        raise DataError(f"{what}: sample {row} (and {int(bad.sum()) - 1} more) holds NaN or "
                        f"infinite {kind}; clean or drop them first (no model trains on them)")


# ---------------------------------------------------------------------- Hugging Face
def huggingface_source(path: str | Path, input: str = "image", label: str = "label",
                       train_split: str = "train", test_split: str = "test",
                       test_fraction: float = 0.2, seed: int = 0,
                       field: str = "data.path") -> Source:
    """A pooled `Source` from a Hugging Face `datasets` dataset on disk.

    `path`: a folder written by `save_to_disk` (a Dataset or a DatasetDict), or a parquet /
    arrow file or a folder of them (files whose name starts with `test_split` are the test
    split, the others the train split). Without a test split, a stratified `test_fraction`
    of the rows is held out (seeded). Images (the `Image` feature, or arrays `[H, W]`,
    `[H, W, C]`) become `[C, H, W]` float32 in [0, 1] for uint8 pixels; other numeric
    arrays are taken as they are. Integer labels make a classification task (classes from a
    `ClassLabel` feature, else max + 1), float labels a regression.
    """
    try:
        import datasets
    except ModuleNotFoundError:
        raise ConfigError("data.source", "'huggingface' needs the `datasets` package: "
                                         "pip install 'clusterfl[hf]'") from None
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(field, f"{p} does not exist (a save_to_disk folder, or parquet / "
                                 "arrow files)")
    splits = _hf_splits(datasets, p, train_split, test_split, field)
    train = splits[train_split]
    for col in (input, label):
        if col not in train.column_names:
            raise ConfigError("data.input" if col == input else "data.label",
                              f"no column {col!r} in {p}; columns: "
                              f"{', '.join(train.column_names)}")
    n_classes = None
    feature = train.features.get(label)
    if isinstance(feature, datasets.ClassLabel):
        n_classes = int(feature.num_classes)
    x_tr, y_tr = _hf_arrays(train, input, label)
    if test_split in splits:
        x_te, y_te = _hf_arrays(splits[test_split], input, label)
        if x_te.shape[1:] != x_tr.shape[1:]:
            raise DataError(f"data.input: column {input!r} holds inputs of shape "
                            f"{x_tr.shape[1:]} in split {train_split!r} and {x_te.shape[1:]} in "
                            f"{test_split!r}; both splits need one shape")
    else:
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError("data.test_fraction", f"must be in (0, 1), got {test_fraction}")
        regression = np.issubdtype(y_tr.dtype, np.floating)
        _class_ids(y_tr, label, train_split, n_classes)
        keys = np.zeros(len(y_tr), np.int64) if regression else y_tr.astype(np.int64)
        mask = stratified_test_mask(keys, test_fraction, seed)
        x_tr, y_tr, x_te, y_te = x_tr[~mask], y_tr[~mask], x_tr[mask], y_tr[mask]
    task: Task = "regression" if np.issubdtype(y_tr.dtype, np.floating) else "classification"
    if task == "classification":
        n_classes = n_classes or int(max(y_tr.max(initial=0), y_te.max(initial=0))) + 1
        for y, split in ((y_tr, train_split), (y_te, test_split)):
            _class_ids(y, label, split, n_classes)
    return Source(torch.from_numpy(x_tr), _targets(y_tr, task), torch.from_numpy(x_te),
                  _targets(y_te, task), int(n_classes or 1), task, f"hf:{p.name}")


def _class_ids(y: np.ndarray, label: str, split: str, n_classes: int | None) -> None:
    """Integer labels are class ids 0..n_classes−1 (a -1 for "unlabelled" or an id beyond the
    train split's `ClassLabel` would fail far away, in a stratified split or the loss)."""
    if not np.issubdtype(y.dtype, np.integer) or not len(y):
        return
    low, high = int(y.min()), int(y.max())
    if low < 0 or (n_classes is not None and high >= n_classes):
        allowed = f"0..{n_classes - 1}" if n_classes is not None else "0, 1, ..."
        bad = low if low < 0 else high
        raise DataError(f"data.label: column {label!r} of split {split!r} holds the label "
                        f"{bad}; class ids are {allowed} (drop or relabel such rows first)")


def _targets(y: np.ndarray, task: Task) -> torch.Tensor:
    return torch.from_numpy(y.astype(np.int64 if task == "classification" else np.float32))


def _hf_splits(datasets: Any, p: Path, train_split: str, test_split: str,
               field: str) -> dict[str, Any]:
    """Split name → `datasets.Dataset` of a dataset on disk."""
    try:
        return _hf_load(datasets, p, train_split, test_split, field)
    except (ConfigError, DataError):
        raise
    except Exception as exc:  # pyarrow's ArrowInvalid of a truncated file, a bad json, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"data.path: {p} cannot be read as a Hugging Face dataset "
                        f"({type(exc).__name__}: {first}); is a file truncated?") from None


def _hf_load(datasets: Any, p: Path, train_split: str, test_split: str,
             field: str) -> dict[str, Any]:
    saved = p.is_dir() and any((p / f).exists() for f in
                               ("dataset_dict.json", "state.json", "dataset_info.json"))
    if saved:
        loaded = datasets.load_from_disk(str(p))
        if isinstance(loaded, datasets.DatasetDict):
            if train_split not in loaded:
                raise ConfigError("data.train_split", f"no split {train_split!r} in {p}; "
                                  f"splits: {', '.join(loaded)}")
            return dict(loaded)
        return {train_split: loaded}
    files = [p] if p.is_file() else sorted(
        f for f in p.rglob("*") if f.suffix in (".parquet", ".arrow"))
    if not files:
        raise ConfigError(field, f"{p} holds neither a save_to_disk dataset nor parquet / "
                                 "arrow files")
    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(test_split if f.name.startswith(test_split) else train_split,
                          []).append(f)
    if train_split not in groups:
        raise ConfigError(field, f"{p}: every file is a {test_split!r} file; no training data")
    out = {}
    for split, group in groups.items():
        if group[0].suffix == ".parquet":
            out[split] = datasets.Dataset.from_parquet([str(f) for f in group],
                                                       keep_in_memory=True)
        else:
            out[split] = datasets.concatenate_datasets(
                [datasets.Dataset.from_file(str(f)) for f in group])
    return out


def _leaf_dtype(feature: Any) -> str | None:
    """The element type a `datasets` feature declares (`Value`, `Array2D`..`Array5D`,
    `Sequence`/`List` of them; an `Image` is uint8), or None."""
    if type(feature).__name__ == "Image":
        return "uint8"
    dtype = getattr(feature, "dtype", None)
    if isinstance(dtype, str) and dtype not in ("list", "dict"):
        return dtype
    inner = getattr(feature, "feature", None)
    return None if inner is None else _leaf_dtype(inner)


def _hf_arrays(ds: Any, input: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    declared = _leaf_dtype(ds.features.get(input))
    table = ds.select_columns([input, label]).with_format("numpy")[:]
    x = np.asarray(table[input])
    if x.dtype == object:  # images of one shape decoded one by one
        shapes = sorted({np.shape(v) for v in x})
        if len(shapes) > 1:
            shown = ", ".join(map(str, shapes[:3])) + (", ..." if len(shapes) > 3 else "")
            raise DataError(f"data.input: column {input!r} holds inputs of different shapes "
                            f"({shown}); every sample needs one shape (pad, crop or resize)")
        x = np.stack([np.asarray(v) for v in x])
    y = np.asarray(table[label])
    for key, col, a in (("input", input, x), ("label", label, y)):
        if a.dtype.kind not in "biuf":
            raise DataError(f"data.{key}: column {col!r} holds {a.dtype} values, not numbers "
                            "(map them to numbers, labels to class ids 0, 1, ..., first)")
    if declared == "uint8" and x.dtype != np.uint8 and x.dtype.kind in "iu" and (
            not x.size or (int(x.min()) >= 0 and int(x.max()) <= 255)):
        x = x.astype(np.uint8)  # uint8 arrays (Array2D, lists) come back as int64
    if x.dtype == np.uint8 and x.ndim in (3, 4):  # images: [N, H, W] or [N, H, W, C]
        x = x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)
        return (x.astype(np.float32) / 255.0), y
    return x.astype(np.float32), y


# ---------------------------------------------------------------------- loaders
def load(data: Mapping[str, Any], seed: int) -> Federation | Source:
    """The data of a `[data]` table whose source is not built in: a `Federation` (per-client
    data) or a pooled `Source` for a scenario to split."""
    source = str(data["source"])
    if source == "npz":
        return npz_folder(_need(data, "path"))
    if source == "shards":
        return read_shards(_need(data, "path"))
    if source == "python":
        raise ConfigError("data.source", "'python' is a federation built in Python "
                                         "(Federation.from_clients): pass it again, "
                                         "Experiment(config, federation=...)")
    if source == "huggingface":
        keys = ("input", "label", "train_split", "test_split", "test_fraction")
        return huggingface_source(_need(data, "path"), seed=seed,
                                  **{k: data[k] for k in keys if data.get(k) is not None})
    return call_loader(source, _loader_options(data), seed)


def _need(data: Mapping[str, Any], key: str) -> str:
    if not data.get(key):
        raise ConfigError(f"data.{key}", f"required for source {data['source']!r}")
    return str(data[key])


#: `[data]` keys of clusterfl itself (the rest of the table goes to a loader function)
DATA_KEYS = ("source", "data_dir", "standardize", "verify")


class GivenParams(Settings):
    """Scenario `given`: the clients as the data gives them (no parameters)."""

    model_config = ConfigDict(extra="forbid")


def build(data: Mapping[str, Any], scenario: str, params: dict[str, Any], seed: int,
          standardize: bool = False) -> Federation:
    """The federation of a `[data]` table whose source is not built in, under `scenario`
    (`given` for per-client data, else a scenario of `clusterfl.data.scenarios`)."""
    from clusterfl.data.scenarios import make_federation
    from clusterfl.data.sources import standardize as standardized

    source = str(data["source"])
    loaded = load(data, seed)
    if isinstance(loaded, Federation):
        if scenario != GIVEN:
            raise ConfigError("scenario.name", f"data.source {source!r} gave per-client data "
                                               f"({loaded.n_clients} clients): use scenario."
                                               f"name = 'given' (the default), not {scenario!r}")
        if standardize:
            raise ConfigError("data.standardize", "per-client data is used as given; "
                                                  "standardize it in the loader")
        for split in ("train", "test"):
            x, _, offsets = loaded.stored(split)
            if source != "shards":  # shards: checked when the federation was built
                _finite(x, f"data.source {source!r} ({split})", offsets)
        federation = loaded
    else:
        if scenario == GIVEN:
            raise ConfigError("scenario.name", f"data.source {source!r} gave one pool of "
                                               "samples (a Source): choose a scenario to split "
                                               "it into clients (iid, dirichlet, rotation, ...)")
        for split in ("train", "test"):
            x, y = getattr(loaded, f"x_{split}"), getattr(loaded, f"y_{split}")
            if len(x) != len(y):
                raise DataError(f"data.source {source!r} ({split}): {len(x)} inputs but "
                                f"{len(y)} targets (x_{split} and y_{split} of the Source "
                                "must have one row per sample)")
            _finite(getattr(loaded, f"x_{split}"), f"data.source {source!r} ({split})")
            _finite(getattr(loaded, f"y_{split}"), f"data.source {source!r} ({split})",
                    kind="targets")
        if standardize:
            loaded = standardized(loaded)
        federation = make_federation(loaded, scenario, params, seed=seed)
    federation.meta["data"] = {k: v for k, v in data.items() if v is not None}
    return federation


def _loader_options(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in DATA_KEYS}


def loader_function(source: str) -> Any:
    """The function `[data] source` names (import path or `clusterfl.datasets` entry point)."""
    fn = resolve("dataset", source, [*SOURCE_NAMES, *OWN_SOURCES], "data.source")
    if not callable(fn):
        raise ConfigError("data.source", f"{source!r} is a {type(fn).__name__}, not a "
                                         "function returning a Federation or a Source")
    return fn


def call_loader(source: str, options: dict[str, Any], seed: int) -> Federation | Source:
    fn = loader_function(source)
    kwargs = dict(options)
    try:
        params = inspect.signature(fn).parameters
        if "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs.setdefault("seed", seed)
    except (TypeError, ValueError):
        pass
    try:
        out = fn(**kwargs)
    except ConfigError:
        raise
    except DataError as exc:  # Federation.from_clients' checks inside the loader: name it
        raise DataError(f"data.source {source!r}: {exc}") from None
    except Exception as exc:
        raise ConfigError("data.source", f"{describe(fn)}({', '.join(kwargs)}) failed: "
                                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(out, Federation | Source):
        raise ConfigError("data.source", f"{describe(fn)} returned a {type(out).__name__}; "
                                         "return a Federation (Federation.from_clients) or a "
                                         "Source (pooled data for a scenario)")
    if isinstance(out, Federation):
        out.meta.setdefault("data", {"source": source, **options})
        if not out.name:
            out.name = source
    return out
