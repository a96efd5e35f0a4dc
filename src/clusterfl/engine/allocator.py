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
import mmap
import os
import sys

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
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
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


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero tensor whose memory the system provides only where it is written.

    Backed by its own anonymous memory map (not the heap, whose reused blocks must be
    cleared, and not madvised for huge pages, which would back whole 2 MiB runs at the
    first write): the pages of a region never written are never resident. For a large
    table most of which stays zero (CFL-GP's profile, whose blocks nobody was asked for):
    it costs the memory of what was written, and reads the rest as zeros. On a system
    without anonymous maps, a plain `torch.zeros`.
    """
    item = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= int(s)
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    # private: a page never written reads as the system's one zero page; on Linux without a
    # reservation of the whole size (MAP_NORESERVE), so a table larger than the memory can be
    # mapped as long as what is written fits
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (_MAP_NORESERVE if _LINUX else 0)
    try:
        buf = mmap.mmap(-1, n * item, flags=flags)
    except (OSError, ValueError, AttributeError, TypeError):  # no such map here
        return torch.zeros(shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=dtype, count=n)  # shares `buf`, kept alive by it
    return flat.view(shape)
