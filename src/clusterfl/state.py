"""Checkpoints of server state: one generic mechanism for every method.

A method keeps everything it needs to continue a run exactly in one dataclass (its `State`).
`snapshot` turns such a dataclass into plain containers — dicts, lists, tensors (cloned),
numpy arrays (copied), numbers, strings, None — and `restore` rebuilds the dataclass from
them, reading the field types (nested dataclasses, `list[...]`, `dict[..., ...]`, `X | None`)
from its annotations. Nothing method-specific is written by hand, and a checkpoint holds no
pickled class of ours, so code can move without breaking old checkpoints of the same layout.

A large tensor most of whose rows (along its last dimension) are zero — CFL-GP's profile,
of which a run fills the blocks it asks for — is kept as its nonzero rows and their indices
(`SPARSE_MIN_BYTES`), not copied whole; `restore` writes them into a table made by the
caller's `zeros` (the algorithms pass `lazy_zeros`, so only those rows take memory). Zero
rows read back as zeros, so this is exact.

`write_checkpoint` / `read_checkpoint` are the checkpoint file: written whole or not at all (a
temporary file, flushed to disk, renamed over the old one), and read back with a one-line
error for a full disk, a file-size limit, and an empty, truncated or foreign file.
"""

from __future__ import annotations

import dataclasses
import io
import os
import types
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from clusterfl.errors import NO_SPACE, ClusterFLError

T = TypeVar("T")

#: a CPU tensor of at least this many bytes, most of whose rows (last dimension) are zero, is
#: checkpointed as its nonzero rows (module docstring)
SPARSE_MIN_BYTES = 64 * 2**20
#: rows read at a time while looking for the nonzero ones (the pages of rows never written
#: are not made resident)
SCAN_ROWS = 128
_SPARSE = "__nonzero_rows__"
Zeros = Callable[..., torch.Tensor]
"""`zeros(shape, dtype=...)`: the table a tensor kept as its nonzero rows is restored into."""


def snapshot(value: Any) -> Any:
    """A deep, plain copy of `value` (see the module docstring)."""
    if isinstance(value, torch.Tensor):
        return _tensor_copy(value.detach())
    if isinstance(value, np.ndarray):
        return value.copy()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


def _tensor_copy(t: torch.Tensor) -> Any:
    """A copy of `t`, or, for a large CPU tensor most of whose rows are zero, its nonzero
    rows: `{_SPARSE: True, shape, dtype, rows (flat indices), values}`."""
    if t.device.type != "cpu" or t.ndim < 2 or not t.is_contiguous() \
            or t.numel() * t.element_size() < SPARSE_MIN_BYTES:
        return t.clone()
    flat = t.view(-1, t.shape[-1])
    rows = torch.cat([torch.nonzero(flat[a:a + SCAN_ROWS].ne(0).any(1)).flatten() + a
                      for a in range(0, len(flat), SCAN_ROWS)])
    if 2 * len(rows) > len(flat):
        return t.clone()
    return {_SPARSE: True, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
            "rows": rows, "values": flat[rows]}


def _from_rows(value: dict[str, Any], zeros: Zeros) -> torch.Tensor:
    """The tensor of `_tensor_copy`'s nonzero rows, in a table made by `zeros`."""
    shape = tuple(int(n) for n in value["shape"])
    out = zeros(shape, dtype=getattr(torch, value["dtype"]))
    out.view(-1, shape[-1])[value["rows"]] = value["values"].to(out.dtype)
    return out


def restore(cls: type[T], data: dict[str, Any], zeros: Zeros | None = None) -> T:
    """The `cls` dataclass rebuilt from `snapshot(...)` output (values copied); a tensor kept
    as its nonzero rows is written into `zeros(shape, dtype=...)` (default `torch.zeros`)."""
    zeros = zeros or torch.zeros
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _restore(hints[f.name], data[f.name], zeros)
              for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # cls: a dataclass
              if f.init and f.name in data}
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # as above
               if f.init and f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"checkpoint of {cls.__name__} lacks {missing}")
    return cls(**kwargs)


def _restore(hint: Any, value: Any, zeros: Zeros) -> Any:
    if value is None:
        return None
    if isinstance(value, dict) and value.get(_SPARSE) is True:
        return _from_rows(value, zeros)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        for option in options:
            if _fits(option, value):
                return _restore(option, value, zeros)
        return _restore(options[0], value, zeros)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return [_restore(item, v, zeros) for v in value]
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_restore(args[0], v, zeros) for v in value)
        return tuple(_restore(a, v, zeros) for a, v in zip(args, value, strict=True)) if args \
            else tuple(value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return {_restore(key, k, zeros): _restore(item, v, zeros) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return restore(hint, value, zeros)
    if hint is torch.Tensor:
        return value.clone()
    if hint is np.ndarray:
        return np.array(value, copy=True)
    if hint in (int, float, bool, str):
        return hint(value)
    return snapshot(value)  # Any and other plain values


def _fits(hint: Any, value: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        return isinstance(value, dict)
    if origin is float:
        return isinstance(value, int | float)
    return isinstance(origin, type) and isinstance(value, origin)


class CheckpointError(ClusterFLError):
    """A checkpoint file could not be written (no space) or read (empty, truncated, foreign)."""


RESTART = "the run can restart with --overwrite"


def write_checkpoint(path: Path, payload: dict[str, Any], round_: int,
                     intact: int | None) -> None:
    """Write `payload`, the checkpoint of round `round_`, to `path`: serialized in memory,
    written to `path.tmp`, flushed to disk and renamed over `path`, so that `path` holds a
    whole checkpoint at every moment (round `intact`'s, or none, while this one is written).
    A full disk or a file-size limit is a one-line `CheckpointError` naming both rounds."""
    data = io.BytesIO()
    torch.save(payload, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # Ctrl-C or SIGTERM too: no half-written file is left
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
            raise
        kept = ("no earlier checkpoint was written" if intact is None
                else f"the checkpoint of round {intact} is intact")
        raise CheckpointError(f"{NO_SPACE[exc.errno].format(path.parent)} while writing the "
                              f"checkpoint of round {round_}; {kept}") from None


def _failed_checksum(path: Path) -> str | None:
    """The first part of the zip file at `path` whose CRC-32 does not match its data (torch's
    reader does not check them: a changed byte of a tensor loads as a changed weight); None
    when every part matches or the file is not a readable zip (torch.load then says why)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None


def read_checkpoint(path: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """The checkpoint at `path`, which must hold `keys`; a one-line `CheckpointError` for an
    empty, truncated (a torch zip file that ends early) or foreign file."""
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path} is empty: it is not a clusterfl checkpoint; {RESTART}")
    bad = _failed_checksum(path)
    if bad is not None:
        raise CheckpointError(f"{path} is damaged: its part {bad} fails its checksum (a bit "
                              f"changed on disk or in a copy); {RESTART}")
    try:
        state = torch.load(path, weights_only=False)
    except Exception:  # torch's zip reader and pickle raise many kinds of errors
        with open(path, "rb") as fh:
            zipped = fh.read(4) == b"PK\x03\x04"
        what = "is truncated or damaged" if zipped else "is not a clusterfl checkpoint"
        raise CheckpointError(f"{path} {what} ({size} bytes that torch cannot read); "
                              f"{RESTART}") from None
    if not isinstance(state, dict) or not all(k in state for k in keys):
        raise CheckpointError(f"{path} is not a clusterfl checkpoint (it does not hold a run's "
                              f"state); {RESTART}")
    return state


__all__ = ["CheckpointError", "read_checkpoint", "restore", "snapshot", "write_checkpoint"]
