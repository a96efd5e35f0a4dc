"""Test-session settings shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_checksum_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Dataset checksums verified during the tests go to a throwaway cache file, never to the
    user's cache folder (subprocesses inherit the variable)."""
    old = os.environ.get("CLUSTERFL_CACHE")
    os.environ["CLUSTERFL_CACHE"] = str(tmp_path_factory.mktemp("cache") / "verified.json")
    yield
    if old is None:
        os.environ.pop("CLUSTERFL_CACHE", None)
    else:
        os.environ["CLUSTERFL_CACHE"] = old


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models: one torch thread is faster, and fair to other jobs on a shared CPU.
    A test module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
