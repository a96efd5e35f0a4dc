"""The generic checkpoint mechanism: a method's State dataclass → plain containers → back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from clusterfl.algorithms import ALGORITHMS
from clusterfl.state import restore, snapshot


@dataclass
class Node:
    id: int
    clients: np.ndarray
    model: torch.Tensor
    split_round: int | None = None
    children: list[int] = field(default_factory=list)
    updates: torch.Tensor | None = None


@dataclass
class State:
    nodes: list[Node]
    pending: dict[int, int]
    counts: dict[str, float]
    best: np.ndarray | None
    info: dict[str, Any]
    kbar: int = -1


def _state() -> State:
    n0 = Node(0, np.arange(4), torch.randn(3), children=[1, 2], split_round=5)
    n1 = Node(1, np.array([0, 2]), torch.randn(3), updates=torch.randn(2, 3))
    return State([n0, n1], {3: 1}, {"rounds": 2.0}, None, {"encoder": "x", "k": [1, 2]})


def test_round_trip_rebuilds_nested_dataclasses_and_copies():
    s = _state()
    plain = snapshot(s)
    assert isinstance(plain, dict) and isinstance(plain["nodes"][0], dict)  # nothing pickled
    back = restore(State, plain)
    assert isinstance(back.nodes[1], Node) and back.nodes[0].updates is None
    assert back.pending == {3: 1} and back.nodes[0].split_round == 5 and back.kbar == -1
    assert torch.equal(back.nodes[1].updates, s.nodes[1].updates)
    np.testing.assert_array_equal(back.nodes[1].clients, s.nodes[1].clients)
    back.nodes[0].model += 1  # a copy: the original does not move
    plain["nodes"][0]["clients"][0] = 99
    assert not torch.equal(back.nodes[0].model, s.nodes[0].model)
    assert s.nodes[0].clients[0] == 0


def test_missing_fields_fail_loudly():
    plain = snapshot(_state())
    del plain["pending"]
    with pytest.raises(ValueError, match="lacks \\['pending'\\]"):
        restore(State, plain)


def test_every_method_declares_a_state_dataclass():
    import dataclasses

    for name, cls in ALGORITHMS.items():
        assert dataclasses.is_dataclass(cls.State), name
        own = {k for k in vars(cls) if k in ("state_dict", "load_state_dict")}
        assert not own, f"{name} writes its own {own}: derive it from State"


@dataclass
class _Table:
    profile: torch.Tensor
    small: torch.Tensor


def test_a_large_mostly_zero_tensor_is_kept_as_its_nonzero_rows(monkeypatch):
    """Rows (last dimension) of a [3, 2, 4] table: (0, 1) and (2, 0) hold values, (1, 1) was
    written with zeros (the same as never written); flat row index c·2 + k."""
    from clusterfl import state as state_module
    from clusterfl.engine.allocator import lazy_zeros

    monkeypatch.setattr(state_module, "SPARSE_MIN_BYTES", 64)  # this 96-byte table counts
    table = lazy_zeros((3, 2, 4), torch.float32)
    table[0, 1] = torch.tensor([1.0, -2.0, 0.0, 0.5])
    table[2, 0] = torch.tensor([0.0, 0.0, 3.0, 0.0])
    table[1, 1] = 0.0
    small = torch.ones(2, 3)  # 24 bytes: copied whole
    out = snapshot(_Table(table, small))
    kept = out["profile"]
    assert kept["shape"] == [3, 2, 4] and kept["dtype"] == "float32"
    assert kept["rows"].tolist() == [1, 4]
    torch.testing.assert_close(kept["values"], torch.tensor(
        [[1.0, -2.0, 0.0, 0.5], [0.0, 0.0, 3.0, 0.0]]), rtol=0, atol=0)
    assert torch.equal(out["small"], small)
    for zeros in (None, lazy_zeros):  # plain zeros, or the lazy table the algorithms pass
        back = restore(_Table, out, zeros=zeros)
        assert back.profile.dtype == torch.float32 and torch.equal(back.profile, table)
    dense = torch.ones(3, 2, 4)  # more than half the rows hold values: copied whole
    assert isinstance(snapshot(_Table(dense, small))["profile"], torch.Tensor)


CHECKPOINT_MEMORY = """
import resource, torch
from dataclasses import dataclass
from clusterfl.engine.allocator import lazy_zeros
from clusterfl.state import restore, snapshot
@dataclass
class S:
    features: torch.Tensor
features = lazy_zeros((50_000, 4, 500), torch.float32)  # 400 MB if it were all there
features[::100, 2] = 1.5                                # 500 rows written: 1 MB
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kept = snapshot(S(features))
back = restore(S, kept, zeros=lazy_zeros)
assert torch.equal(back.features[::100, 2], features[::100, 2])
assert len(kept["features"]["rows"]) == 500
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_checkpoint_of_a_large_mostly_unwritten_table_costs_what_was_written():
    """CFL-GP's profile at 10,000 clients is a [C, K, d̂] table of which a run fills one block
    in K: a 400 MB table with 1 MB written grows the process's peak by far less than the
    table through `snapshot` and `restore` (a copy of the whole table would add 400 MB)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHECKPOINT_MEMORY], capture_output=True,
                         text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    grown_mib = int(out.stdout.strip().splitlines()[-1])
    assert grown_mib < 60, f"the checkpoint grew the peak by {grown_mib} MiB"


def test_cfl_gp_resumes_exactly_with_its_profile_kept_as_rows(monkeypatch, tmp_path):
    """Every tensor counts as large here, so CFL-GP's profile (and any mostly-zero table) goes
    through the nonzero-rows form: the resumed run equals the uninterrupted one."""
    from clusterfl import state as state_module
    from clusterfl.experiment import Experiment
    from tests.crash import crash_then_resume, timing_free
    from tests.tiny import tiny_config

    monkeypatch.setattr(state_module, "SPARSE_MIN_BYTES", 0)
    cfg = tiny_config(rounds=5, n_clients=6, checkpoint_every=2,
                      algorithm={"name": "cfl_gp", "n_clusters": 2, "fraction": 0.5})
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)
    _, resumed = crash_then_resume(cfg, tmp_path / "cut", 4)
    assert timing_free(resumed.records) == timing_free(ref.records)
    assert timing_free(resumed.summary) == timing_free(ref.summary)
