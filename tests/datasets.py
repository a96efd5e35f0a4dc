"""Where tests find the real datasets: `$CLUSTERFL_DATA`, as the library does, and nowhere else.

Tests that need MNIST or Fashion-MNIST files skip with the reason when the variable is unset
or its folder lacks them (`.ci/run` sets it). No test names a folder of one machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def data_dir() -> Path | None:
    """`$CLUSTERFL_DATA`, or None when it is not set."""
    value = os.environ.get("CLUSTERFL_DATA")
    return Path(value).expanduser() if value else None


def missing(*folders: str) -> str | None:
    """Why the real data is not available for `folders` (None when it is)."""
    root = data_dir()
    if root is None:
        return ("CLUSTERFL_DATA is not set: point it to the data folder (with "
                f"{', '.join(f + '/' for f in folders)}) to run this test")
    absent = [f for f in folders if not (root / f / "train-images-idx3-ubyte.gz").is_file()]
    if absent:
        return f"no {', '.join(f + '/' for f in absent)} files in $CLUSTERFL_DATA = {root}"
    return None


def require(*folders: str) -> Path:
    """The data folder holding `folders`, or skip the test saying what is missing."""
    reason = missing(*folders)
    if reason is not None:
        pytest.skip(reason)
    root = data_dir()
    assert root is not None
    return root


def skip_unless(*folders: str) -> pytest.MarkDecorator:
    """`@skip_unless("mnist")`: a skipif mark with the reason."""
    reason = missing(*folders)
    return pytest.mark.skipif(reason is not None, reason=reason or "")
