"""A federation written once to disk and read back memory-mapped (`[data] source = "shards"`).

`clusterfl data shard CONFIG --out DIR` builds the federation a run config describes and
writes it to `DIR` as plain `.npy` arrays in client order (each client's rows contiguous:
its shard), with a `federation.json` of the rest (offsets, true clusters, classes, task,
name, scenario details). A run with

    [data]
    source = "shards"
    path = "DIR"

maps those files instead of building the federation again: nothing is read until a round
gathers the rows of the clients it asked, so a federation costs its bytes on disk, and the
memory of a round grows with the clients sampled, not with all clients (the system keeps the
pages it read in its page cache and drops them under pressure). Inputs stored as uint8 codes
(`Federation.x_scale`) stay codes on disk: a quarter of their float32 size.

The arrays are mapped copy-on-write (`numpy.load(mmap_mode="c")`): a run never writes the
files. They were checked when the federation was built (labels, NaN inputs, sizes); reading
checks that every file is there and has the shape and type `federation.json` gives, and
refuses a missing, truncated or foreign file in one line naming it. The results of a run on
the shards are those of a run that builds the same federation (the same bits are read).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.data.federation import TASKS, Federation
from clusterfl.errors import ConfigError, DataError

FORMAT = "clusterfl-shards/1"
INDEX = "federation.json"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def write_shards(federation: Federation, folder: str | Path) -> Path:
    """Write `federation` to `folder` (created; an existing folder must be empty or hold
    shards this function wrote, which are replaced). Returns the folder."""
    out = Path(folder).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file, not a folder")
    if out.is_dir():
        foreign = sorted(f.name for f in out.iterdir() if not _ours(f))
        if foreign:
            raise ConfigError("--out", f"{out} holds {foreign[0]}, which `clusterfl data "
                                       "shard` did not write: give a new or empty folder "
                                       "(nothing is overwritten)")
    tmp = out.with_name(out.name + ".writing")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise ConfigError("--out", f"cannot create a folder beside {out} "
                          f"({exc.strerror or exc}); choose another one") from None
    arrays: dict[str, dict[str, Any]] = {}
    for name in ARRAYS:
        a = getattr(federation, name).numpy()
        np.save(tmp / f"{name}.npy", a, allow_pickle=False)
        arrays[name] = {"shape": list(a.shape), "dtype": a.dtype.str}
    index = {
        "format": FORMAT,
        "arrays": arrays,
        "train_offsets": federation.train_offsets.tolist(),
        "test_offsets": federation.test_offsets.tolist(),
        "clusters": None if federation.clusters is None else federation.clusters.tolist(),
        "n_classes": federation.n_classes,
        "task": federation.task,
        "name": federation.name,
        "x_scale": federation.x_scale,
        "meta": federation.meta,
    }
    (tmp / INDEX).write_text(json.dumps(index, default=_plain), encoding="utf-8")
    if out.is_dir():
        for f in out.iterdir():  # only shards (checked above)
            f.unlink()
        out.rmdir()
    os.replace(tmp, out)
    return out


def read_shards(folder: str | Path, field: str = "data.path") -> Federation:
    """The federation written by `write_shards`, its arrays memory-mapped."""
    root = Path(folder).expanduser()
    index_file = root / INDEX
    if not root.is_dir():
        raise ConfigError(field, f"{root} is not a folder (a folder written by `clusterfl "
                                 "data shard`)")
    if not index_file.is_file():
        raise DataError(f"{index_file}: missing; {root} is not a folder written by "
                        "`clusterfl data shard`")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{index_file}: not readable JSON ({exc}); write the shards again "
                        "with `clusterfl data shard`") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{index_file}: not a clusterfl shard index (format "
                        f"{index.get('format') if isinstance(index, dict) else None!r}, "
                        f"expected {FORMAT!r})")
    if index.get("task") not in TASKS:
        raise DataError(f"{index_file}: task {index.get('task')!r} is not one of "
                        f"{', '.join(TASKS)}")
    tensors = {name: _mapped(root, name, index["arrays"].get(name)) for name in ARRAYS}
    try:
        return Federation(
            tensors["x_train"], tensors["y_train"], np.asarray(index["train_offsets"]),
            tensors["x_test"], tensors["y_test"], np.asarray(index["test_offsets"]),
            None if index["clusters"] is None else np.asarray(index["clusters"]),
            int(index["n_classes"]), index["task"], str(index["name"]),
            dict(index.get("meta") or {}), x_scale=index.get("x_scale"), mapped=True,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{index_file}: does not describe its arrays ({exc})") from None


def _mapped(root: Path, name: str, spec: dict[str, Any] | None) -> torch.Tensor:
    path = root / f"{name}.npy"
    if not path.is_file():
        raise DataError(f"{path}: missing; write the shards again with `clusterfl data shard`")
    try:
        a = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc}); truncated or not "
                        "written by `clusterfl data shard`") from None
    if spec is None or list(a.shape) != list(spec["shape"]) or a.dtype.str != spec["dtype"]:
        raise DataError(f"{path}: holds {a.dtype.str} {list(a.shape)}, but {INDEX} says "
                        f"{spec}; the files do not belong together")
    return torch.from_numpy(a)


def _ours(f: Path) -> bool:
    """A file `write_shards` writes."""
    return f.is_file() and (f.name == INDEX or (f.suffix == ".npy" and f.stem in ARRAYS))


def _plain(value: Any) -> Any:
    """numpy scalars and arrays in a federation's meta as JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} in the federation's meta is not JSON-able")


__all__ = ["read_shards", "write_shards"]
