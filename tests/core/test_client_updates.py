"""`client_updates` counts the local trainings and gradients clients actually computed."""

from __future__ import annotations

from clusterfl.experiment import Experiment

BASE = {
    "rounds": 3, "eval_every": 3, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 6, "angles": [0.0, 180.0]},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 16, "steps": 2},
    "output": {"figures": False, "progress": "off"},
}


def _run(algorithm: dict, **tables: dict) -> dict:
    cfg = {**BASE, "algorithm": algorithm, **tables}
    history = Experiment.from_config(cfg).run(progress=False)
    return {"client_updates": history.final.client_updates,
            "records": [r.client_updates for r in history.records]}


def test_fedavg_counts_the_sampled_clients_each_round() -> None:
    out = _run({"name": "fedavg", "fraction": 0.5})
    assert out["records"] == [3, 6, 9]
    assert out["client_updates"] == 9


def test_dropped_clients_are_not_counted() -> None:
    out = _run({"name": "fedavg"}, faults={"drop_clients": [0, 1]})
    assert out["records"] == [4, 8, 12]


def test_gradient_requests_count_too() -> None:
    out = _run({"name": "ifca", "n_clusters": 2, "averaging": "gradient"})
    assert out["client_updates"] == 18  # 6 clients x 3 rounds, one gradient each
