"""Keep freed large blocks in the process heap so the engine's big tensors reuse memory.

glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with a
fresh `mmap`, and returns it to the system on free. A round of the engine allocates reply
tensors of tens of megabytes (e.g. 128 client gradients of an MLP: 80 MB), so every round
pays the page faults of touching fresh memory again — measured here at 35 ms per 80 MB,
as much as the gradient computation itself. Raising the mmap and trim thresholds makes
glibc keep those blocks in the heap and hand them out again (22 ms, mostly the write).

The price is that freed memory stays with the process instead of returning to the system.
Blocks above 256 MiB (the reply of 10,000 MLP clients is 1 GB) still get their own map and
go back on free: a heap that kept them would hold the largest round's tables for the rest
of the run, and its holes would add up across rounds.
Set `CLUSTERFL_MALLOC_TUNING=0` to leave the allocator alone. Other C libraries (musl,
macOS) are left untouched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import sys
import tempfile
import weakref
from typing import Any

import numpy as np
import torch

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 1 << 28  # blocks up to 256 MiB come from the heap
_TRIM_THRESHOLD = 1 << 31  # keep up to 2 GiB of free heap before returning it

_done: bool | None = None
_LINUX = sys.platform.startswith("linux")
_MAP_NORESERVE = 0x4000  # Linux's value (the mmap module does not name it)


def tune_allocator() -> bool:
    """Apply the thresholds once per process; True when they are in effect."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("CLUSTERFL_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith(
        "linux"
    ):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # no C library, or not glibc
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1 and ok
    _done = ok
    return ok


_ALIGN_BYTES = 64  # one cache line, the width of an AVX-512 store


def aligned_rows(n: int, d: int, dtype: torch.dtype,
                 device: torch.device | None = None) -> torch.Tensor:
    """An uninitialised `[n, d]` tensor whose rows start on 64-byte boundaries.

    The row stride is `d` rounded up to a whole cache line, so the result is a view (not
    contiguous when `d` is not a multiple). Products written into a row's blocks (e.g. the
    per-client weight gradients of a round) then store whole cache lines: with a plain
    `[n, d]` tensor and an odd `d` every row after the first starts mid-line, and the
    stacked weight-gradient products for 128 MLP clients ran 1.45x slower (53 vs 37 ms,
    one thread). On a GPU (`device`) the rows are plain `[n, d]`.
    """
    if device is not None and device.type != "cpu":
        return torch.empty(n, d, dtype=dtype, device=device)
    item = torch.empty((), dtype=dtype).element_size()
    per_line = max(1, _ALIGN_BYTES // item)
    stride = -(-d // per_line) * per_line
    return torch.empty(n, stride, dtype=dtype)[:, :d]


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               device: torch.device | None = None) -> torch.Tensor:
    """A zero tensor whose memory the system provides only where it is written.

    Backed by its own anonymous memory map (not the heap, whose reused blocks must be
    cleared, and not madvised for huge pages, which would back whole 2 MiB runs at the
    first write): the pages of a region never written are never resident. For a large
    table most of which stays zero (CFL-GP's profile, whose blocks nobody was asked for):
    it costs the memory of what was written, and reads the rest as zeros. On a system
    without anonymous maps, a plain `torch.zeros`; on a `device` other than the CPU (a GPU's
    memory has no such pages) too, there.
    """
    if device is not None and device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    if math.prod(int(s) for s in shape) == 0:
        return torch.zeros(shape, dtype=dtype)
    # private: a page never written reads as the system's one zero page; on Linux without a
    # reservation of the whole size (MAP_NORESERVE), so a table larger than the memory can be
    # mapped as long as what is written fits
    lazy = _lazy_map(shape, dtype)
    return torch.zeros(shape, dtype=dtype) if lazy is None else lazy


def _lazy_map(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """`lazy_zeros`'s map, or None where the system gives none."""
    item = torch.empty((), dtype=dtype).element_size()
    n = math.prod(int(s) for s in shape)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (_MAP_NORESERVE if _LINUX else 0)
    try:
        buf = mmap.mmap(-1, n * item, flags=flags)
    except (OSError, ValueError, AttributeError, TypeError, OverflowError):  # no such map
        return None
    flat = torch.frombuffer(buf, dtype=dtype, count=n)  # shares `buf`, kept alive by it
    return flat.view(shape)


def lazy_rows(n: int, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Room for `n` rows of `d` values (`[n, d]`, uninitialised as far as the caller is
    concerned) of which only the rows written take memory: a `lazy_zeros` map. None where
    the system gives no such map (or not one this large): the caller then grows its table
    the ordinary way. For a table that grows by rows up to a bound known in advance (a row
    per client, `algorithms.common.ClientModels`): no copy when it grows."""
    if n <= 0 or d <= 0:
        return None
    return _lazy_map((n, d), dtype)


#: the disk maps of `disk_rows` alive: start address → their length in bytes and their file
_DISK_MAPS: dict[int, tuple[int, Any]] = {}
_MADV_DONTNEED = 4  # Linux's value


def disk_rows(n: int, d: int, dtype: torch.dtype = torch.float32,
              directory: str | None = None) -> torch.Tensor:
    """An `[n, d]` table kept in a temporary file (in `directory`, the system's temporary
    folder by default) that is mapped into memory: its values are exact (the bytes written),
    but its pages belong to the file, so the system can write them out and take them out of
    memory (`drop_resident` does at once). The file has no name from the start (it is
    removed when the table is freed, or when the process ends) and takes disk space only
    for the rows written. For a large table read rarely (FeSEM's models gathered for its
    first k-means). Where no such map can be made, an ordinary tensor."""
    item = torch.empty((), dtype=dtype).element_size()
    size = n * d * item
    if size == 0:
        return torch.empty(n, d, dtype=dtype)
    fh = None
    try:
        fh = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115  # lives with the map
        fh.truncate(size)  # a sparse file: blocks only where rows are written
        buf = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_SHARED)
    except (OSError, ValueError, AttributeError, OverflowError):
        if fh is not None:
            fh.close()
        return torch.empty(n, d, dtype=dtype)
    table = torch.frombuffer(buf, dtype=dtype, count=n * d).view(n, d)
    start = table.data_ptr()
    _DISK_MAPS[start] = (size, fh)
    weakref.finalize(buf, _forget, start, fh)  # when the last view of the table goes
    return table


def _forget(start: int, fh: Any) -> None:
    _DISK_MAPS.pop(start, None)
    fh.close()


def disk_write(table: torch.Tensor, rows: np.ndarray, values: torch.Tensor) -> None:
    """`table[rows] = values` (`table` in host memory, `values` on any device). Into a
    `disk_rows` table (or a view that starts where it starts) the rows are written through
    its file (`pwrite`): the same bytes, without faulting the map's pages into this process
    (several times faster than writing through the map, and nothing to give back)."""
    rows = np.asarray(rows, dtype=np.int64)
    values = values.cpu()  # a GPU's rows (the table is in host memory): copied once
    start = table.untyped_storage().data_ptr()
    entry = _DISK_MAPS.get(start)
    if (entry is None or table.data_ptr() != start or not table.is_contiguous()
            or len(rows) != len(values)):
        table[torch.from_numpy(rows)] = values.to(table.dtype)
        return
    if len(rows) and (rows.min() < 0 or rows.max() >= len(table)):
        raise IndexError(f"rows out of the table's {len(table)} rows")
    raw = values.to(table.dtype).contiguous().reshape(len(rows), -1).view(torch.uint8)
    width = raw.shape[1]
    view = raw.numpy().reshape(-1).data  # the bytes, row after row
    fd = entry[1].fileno()
    for i, r in enumerate(rows.tolist()):
        os.pwrite(fd, view[i * width:(i + 1) * width], r * width)


def disk_room(table: torch.Tensor | None) -> torch.Tensor | None:
    """The whole `disk_rows` table whose first rows `table` is (a contiguous view starting
    where it starts), to write more rows into; None for any other tensor."""
    if table is None or table.dim() != 2 or not table.is_contiguous():
        return None
    start = table.untyped_storage().data_ptr()
    entry = _DISK_MAPS.get(start)
    if entry is None or table.data_ptr() != start or table.shape[1] == 0:
        return None
    rows = entry[0] // (table.shape[1] * table.element_size())
    return table.new_empty(0).set_(table.untyped_storage(), 0, (rows, table.shape[1]),
                                   (table.shape[1], 1))


def drop_resident(table: torch.Tensor) -> None:
    """Take the pages of a `disk_rows` table (or of a view that starts where it starts) out
    of this process's memory now: what was written stays in the file (and in the system's
    cache while there is room), and is read back when next read. Anything else: nothing."""
    entry = _DISK_MAPS.get(table.untyped_storage().data_ptr())
    libc = _libc()
    if entry is None or libc is None:
        return
    libc.madvise(ctypes.c_void_p(table.untyped_storage().data_ptr()),
                 ctypes.c_size_t(entry[0]), _MADV_DONTNEED)


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    """The C library (looked up once), None where it cannot be loaded or not on Linux."""
    if not _LIBC:
        name = ctypes.util.find_library("c") if _LINUX else None
        try:
            _LIBC.append(ctypes.CDLL(name) if name else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
