"""Messages per participating client per round (issue 26): one, except where the method's
paper puts a server decision between two client steps (docs/architecture.md names them).

Counted by `benchmarks/flower/messages.py` (the script that writes the table of
benchmarks/flower/RESULTS.md): a `Steps` is one message per client, as on Flower."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "flower" / "messages.py"


def _messages() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flower_messages", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["ifca", "cfl_gp", "fedavg_plus", "ifca_cam", "fesem_cam",
                                  "fedavg"])
def test_one_message_per_client_and_round(name):
    out = _messages().count(name)
    assert out["max"] == 1 and out["mean"] == 1.0, out["per_round"]
    assert out["evaluate_messages"] == 8  # the last round's evaluation, apart


def test_ifca_with_gradient_averaging_and_sampling_too():
    out = _messages().count("ifca", {"averaging": "gradient", "fraction": 0.5})
    assert out["max"] == 1 and all(len(c) == 4 for c in out["per_round"].values())


@pytest.mark.parametrize(("name", "rounds"), [("flt", [1]), ("fedsoft", [1, 3])])
def test_named_exceptions_send_two_only_in_their_decision_rounds(name, rounds):
    """FLT: the one-off clustering needs every signature before the first training (round
    1); FedSoft: the server selects clients from every client's counts (every τ = 2)."""
    out = _messages().count(name)
    twice = sorted({t for t, c in out["per_round"].items() if max(c.values()) == 2})
    assert twice == rounds and out["max"] == 2


@pytest.mark.parametrize("name", ["fesem", "fesem_cam"])
def test_fesem_newcomers_get_the_losses_and_their_training_in_one_message(name):
    """With a sample, clients first sampled after the first k-means start from the
    least-loss center: the center losses and the training(s) travel together."""
    m = _messages()
    options = {"per_round": 3, "first_clustering": 0, "warmup_rounds": 0}
    out = m.count(name, options, {"rounds": 6, "eval_every": 6})
    assert out["max"] == 1 and out["mean"] == 1.0, out["per_round"]
    start = m.count(name, {**options, "newcomer_start": "start"}, {"rounds": 6, "eval_every": 6})
    assert out["floats"][0] > start["floats"][0]  # the newcomers' K center losses cost
