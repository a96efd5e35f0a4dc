"""A federation written once to disk and read back memory-mapped (`[data] source = "shards"`).

`clusterfl data shard CONFIG --out DIR` builds the federation a run config describes and
writes it to `DIR` as plain `.npy` arrays in client order (each client's rows contiguous:
its shard), with a `federation.json` of the rest (offsets, true clusters, classes, task,
name, scenario details). A run with

    [data]
    source = "shards"
    path = "DIR"

maps those files instead of building the federation again: no input is read until a round
gathers the rows of the clients it asked (the targets are read once, to check them against
the classes, and each client's first and last rows, to check them against `ends`), so a
federation costs its bytes on disk, and the memory of a round grows with
the clients sampled, not with all clients (the system keeps the pages it read in its page
cache and drops them under pressure). Inputs stored as uint8 codes (`Federation.x_scale`)
stay codes on disk: a quarter of their float32 size.

The arrays are mapped copy-on-write (`numpy.load(mmap_mode="c")`): a run never writes the
files. They were checked when the federation was built (labels, NaN inputs, sizes); reading
checks that every file is there and has the shape and type `federation.json` gives, and
that the index's task, classes and input scale agree with the arrays (a hand-edited index),
and refuses a missing, truncated or foreign file, or a wrong field, in one line naming it:
a foreign file of the same shape (another seed's, or one a concurrent `data shard` rewrote)
by the digest of each client's first and last rows that the index keeps per array (`ends`;
shards written before it was kept are read unchecked).
The results of a run on the shards are those of a run that builds the same federation (the
same bits are read).

`data shard` replaces only an earlier shard output (a folder with a `federation.json` of
ours) and writes through a temporary folder it makes itself: it never deletes a file or
folder it did not write.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.config_util import is_number, is_whole
from clusterfl.data.federation import TASKS, Federation
from clusterfl.errors import ConfigError, DataError

FORMAT = "clusterfl-shards/1"
WRITING = ".shards-writing-"
"""The name of `write_shards`' temporary folder inside the output folder, and a suffix."""
INDEX = "federation.json"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def write_shards(federation: Federation, folder: str | Path) -> Path:
    """Write `federation` to `folder` (created; an existing folder must be empty or hold
    shards this function wrote, which are replaced). Returns the folder (resolved: `.` is
    the working folder itself).

    The files are written into a temporary folder that this call makes inside `folder` (never
    a folder of a fixed name, which may be someone else's), then moved over the old ones:
    `federation.json` goes first and comes back last, so a folder left half-replaced by a
    killed process is refused when read, never read as a mix of two federations. The folder
    itself is kept (its permissions, and a shell standing in it)."""
    out = Path(folder).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file, not a folder")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", f"cannot create the output folder {out} "
                          f"({exc.strerror or exc}); choose another one") from None
    try:
        _check_out(out)
        _write_into(federation, out)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):  # ours, and empty again
            out.rmdir()
        raise
    return out


def _check_out(out: Path) -> None:
    """Refuse `out` unless it is empty or an earlier shard output: a `federation.json` of
    ours (its `format`) beside nothing but the arrays it names. The names alone prove
    nothing: a folder of one's own `x_train.npy` is not ours to replace."""
    entries = sorted(out.iterdir())
    if not entries:
        return
    foreign = next((f for f in entries if not _ours(f)), None)
    if foreign is not None and foreign.name.startswith(WRITING) and foreign.is_dir():
        raise ConfigError("--out", f"{out} holds {foreign.name}, the temporary folder of a "
                                   "`clusterfl data shard` writing there now or of one that was "
                                   "killed: wait for it to end, or remove that folder if none "
                                   "is running")
    if foreign is not None:
        raise ConfigError("--out", f"{out} holds {foreign.name}, which `clusterfl data "
                                   "shard` did not write: give a new or empty folder "
                                   "(nothing is overwritten)")
    if not _is_shard_index(out / INDEX):
        first = next((f for f in entries if f.name != INDEX), entries[0])
        raise ConfigError("--out", f"{out} holds {first.name}, which `clusterfl data shard` "
                                   f"did not write (the folder has no {INDEX} of an earlier "
                                   "shard output): give a new or empty folder (nothing is "
                                   "overwritten)")


def _write_into(federation: Federation, out: Path) -> None:
    """The files of `federation` written into a fresh temporary folder inside `out`, then
    moved into `out` (see `write_shards`). The temporary folder is removed whatever happens:
    this call made it, so it is ours."""
    try:
        tmp = Path(tempfile.mkdtemp(dir=out, prefix=WRITING))
    except OSError as exc:
        raise ConfigError("--out", f"cannot write into {out} ({exc.strerror or exc}); "
                          "choose another folder") from None
    try:
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
            "ends": _ends(federation),
        }
        (tmp / INDEX).write_text(json.dumps(index, default=_plain), encoding="utf-8")
        (out / INDEX).unlink(missing_ok=True)  # checked ours (`_check_out`)
        for name in ARRAYS:
            os.replace(tmp / f"{name}.npy", out / f"{name}.npy")
        os.replace(tmp / INDEX, out / INDEX)
    except OSError as exc:
        raise ConfigError("--out", f"cannot write the shards to {out} "
                          f"({exc.strerror or exc}); free some space or choose another "
                          "folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_shards(folder: str | Path, field: str = "data.path") -> Federation:
    """The federation written by `write_shards`, its arrays memory-mapped. Every field of
    `federation.json` is checked against the arrays (`_check_index`): a hand-edited file is
    refused in one line naming the field, never left to fail inside a round."""
    root = Path(folder).expanduser()
    index_file = root / INDEX
    if not root.is_dir():
        where = "" if root.is_absolute() else f", relative to the working folder {Path.cwd()}"
        raise ConfigError(field, f"{root} is not a folder (a folder written by `clusterfl "
                                 f"data shard`{where})")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        writing = next((f.name for f in root.glob(f"{WRITING}*") if f.is_dir()), None)
        if writing is not None or index_file.is_file():  # `write_shards` takes the index
            # away while it replaces the arrays (and may have put it back since)
            raise DataError(f"{index_file}: missing: a `clusterfl data shard` is rewriting "
                            f"{root} (its temporary folder {writing or WRITING + '…'}) or "
                            "was killed doing so; run again when it has ended, or write the "
                            "shards again") from None
        raise DataError(f"{index_file}: missing; {root} is not a folder written by "
                        "`clusterfl data shard`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{index_file}: not readable JSON ({exc}); write the shards again "
                        "with `clusterfl data shard`") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{index_file}: not a clusterfl shard index (format "
                        f"{index.get('format') if isinstance(index, dict) else None!r}, "
                        f"expected {FORMAT!r})")
    missing = [k for k in _FIELDS if k not in index]
    if missing:
        raise DataError(f"{index_file}: the field {missing[0]!r} is missing; write the "
                        "shards again with `clusterfl data shard`")
    if index["task"] not in TASKS:
        raise DataError(f"{index_file}: task {index['task']!r} is not one of "
                        f"{', '.join(TASKS)}")
    specs = index["arrays"]
    if not isinstance(specs, dict):
        raise DataError(f"{index_file}: arrays is {specs!r}; expected the shape and dtype of "
                        f"each of {', '.join(ARRAYS)}")
    tensors = {name: _mapped(root, name, specs.get(name)) for name in ARRAYS}
    _check_index(index_file, index, tensors)
    try:
        federation = Federation(
            tensors["x_train"], tensors["y_train"], np.asarray(index["train_offsets"]),
            tensors["x_test"], tensors["y_test"], np.asarray(index["test_offsets"]),
            None if index["clusters"] is None else np.asarray(index["clusters"]),
            index["n_classes"], index["task"], str(index["name"]),
            dict(index.get("meta") or {}), x_scale=index["x_scale"], mapped=True,
        )
    except (KeyError, TypeError, ValueError, DataError) as exc:
        raise DataError(f"{index_file}: does not describe its arrays ({exc})") from None
    written = index.get("ends")  # absent from shards written before it was kept
    if isinstance(written, dict):
        now = _ends(federation)
        for name in ARRAYS:
            if written.get(name) != now[name]:
                raise DataError(f"{root / f'{name}.npy'}: its rows are not the ones {INDEX} "
                                "was written with (a file of another shard output, or one "
                                "rewritten since); write the shards again with `clusterfl "
                                "data shard`")
    return federation


def _ends(federation: Federation) -> dict[str, str]:
    """Per array, a digest of the first and last rows of every client (what a foreign file
    of the same shape, from another config or seed or from a `data shard` rewriting the
    folder meanwhile, changes): a few pages of each file, not the whole of it."""
    out = {}
    for split in ("train", "test"):
        x, y, off = federation.stored(split)
        full = np.diff(off) > 0
        rows = np.unique(np.concatenate([off[:-1][full], off[1:][full] - 1]))
        for name, t in ((f"x_{split}", x), (f"y_{split}", y)):
            a = t.numpy()
            h = hashlib.blake2b(repr((a.dtype.str, a.shape)).encode(), digest_size=16)
            h.update(np.ascontiguousarray(a[rows]).tobytes())
            out[name] = h.hexdigest()
    return out


_FIELDS = ("arrays", "train_offsets", "test_offsets", "clusters", "n_classes", "task",
           "name", "x_scale")
"""The fields of `federation.json` that `read_shards` needs (`meta` may be left out)."""


def _check_index(index_file: Path, index: dict[str, Any],
                 tensors: dict[str, torch.Tensor]) -> None:
    """`task`, `n_classes` and `x_scale` of `index` against the arrays, as `write_shards`
    wrote them: class ids (int64) for a classification, float targets for a regression, token
    ids for a language model; every class id or token below `n_classes`; uint8 inputs with
    a positive `x_scale`, other inputs without one. The targets are read once for this (the
    inputs are not: their dtype says what is needed)."""
    task, n_classes, scale = index["task"], index["n_classes"], index["x_scale"]
    ys, xs = (tensors["y_train"], tensors["y_test"]), (tensors["x_train"], tensors["x_test"])
    for key in ("train_offsets", "test_offsets", "clusters"):
        values = index[key]
        bad = next((v for v in values if not is_whole(v)), None) \
            if isinstance(values, list) else values
        if bad is not None and not (key == "clusters" and values is None):
            raise DataError(f"{index_file}: {key} holds {bad!r}; expected a list of whole "
                            "numbers (write the shards again)")
    if not is_whole(n_classes) or n_classes < 1:
        raise DataError(f"{index_file}: n_classes = {n_classes!r}; expected a whole number, "
                        "at least 1")
    integral = not any(y.is_floating_point() or y.dtype == torch.bool for y in ys)
    if task == "regression" and integral:
        raise DataError(f"{index_file}: task 'regression', but y_train.npy holds "
                        f"{ys[0].dtype} class ids, not float targets; the shards were written "
                        "as a classification (write them again to change the task)")
    if task != "regression" and not integral:
        raise DataError(f"{index_file}: task {task!r}, but y_train.npy holds {ys[0].dtype} "
                        "targets, not class ids; the shards were written as a regression "
                        "(write them again to change the task)")
    if task == "regression" and n_classes != 1:
        raise DataError(f"{index_file}: n_classes = {n_classes} for a regression; expected 1 "
                        "(one output)")
    if task == "classification" and n_classes < 2:
        raise DataError(f"{index_file}: n_classes = {n_classes}; a classification needs at "
                        "least 2")
    if task != "regression":
        for name, y in zip(("y_train", "y_test"), ys, strict=True):
            if y.numel() == 0:
                continue
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= n_classes:
                bad = low if low < 0 else high
                raise DataError(f"{index_file}: n_classes = {n_classes}, but {name}.npy holds "
                                f"the {'class' if task == 'classification' else 'token'} "
                                f"id {bad}; allowed ids are 0 to {n_classes - 1} (was "
                                "n_classes edited? write the shards again)")
    codes = all(x.dtype == torch.uint8 for x in xs)
    if codes and task != "language_model":
        if not is_number(scale) \
                or not math.isfinite(scale) or scale <= 0:
            raise DataError(f"{index_file}: x_scale = {scale!r}, but x_train.npy holds uint8 "
                            "codes; x_scale must be their scale, a positive number (input = "
                            "code / x_scale)")
    elif scale is not None:
        raise DataError(f"{index_file}: x_scale = {scale!r}, but x_train.npy holds "
                        f"{xs[0].dtype} inputs, not uint8 codes; expected null")


def _mapped(root: Path, name: str, spec: Any) -> torch.Tensor:
    path = root / f"{name}.npy"
    if not path.is_file():
        raise DataError(f"{path}: missing; write the shards again with `clusterfl data shard`")
    try:
        a = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy file ({exc}); truncated or not "
                        "written by `clusterfl data shard`") from None
    shape = spec.get("shape") if isinstance(spec, dict) else None
    dtype = spec.get("dtype") if isinstance(spec, dict) else None
    if not isinstance(shape, list) or list(a.shape) != shape or a.dtype.str != dtype:
        raise DataError(f"{path}: holds {a.dtype.str} {list(a.shape)}, but {INDEX} says "
                        f"{spec}; the files do not belong together")
    return torch.from_numpy(a)


def _ours(f: Path) -> bool:
    """A file `write_shards` writes, by its name (a link never is). Whether the folder is
    a shard output at all is `_is_shard_index`'s question."""
    return f.is_file() and not f.is_symlink() and (
        f.name == INDEX or (f.suffix == ".npy" and f.stem in ARRAYS))


def _is_shard_index(path: Path) -> bool:
    """`path` is a `federation.json` that `write_shards` wrote: a plain file of JSON whose
    `format` is ours."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(index, dict) and index.get("format") == FORMAT


def _plain(value: Any) -> Any:
    """numpy scalars and arrays in a federation's meta as JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} in the federation's meta is not JSON-able")


__all__ = ["read_shards", "write_shards"]
