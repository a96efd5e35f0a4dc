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
