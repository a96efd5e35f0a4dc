"""The typed round record and run summary reproduce the runner's JSON exactly."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clusterfl.errors import ClusterFLError
from clusterfl.experiment import CHECKPOINT, Experiment
from clusterfl.records import (
    FinalMetrics,
    RoundExtras,
    RoundMetrics,
    RoundRecord,
    RunDirError,
    RunSummary,
    json_ready,
    read_history,
    read_summary,
)

CLASSIFICATION: dict[str, Any] = {
    "seed": 1, "rounds": 5, "eval_every": 2, "checkpoint_every": 2,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 32, "epochs": 1},
    "algorithm": {"name": "cfl", "eps1": 100.0, "eps2": 0.01},
    "output": {"figures": False, "progress": "off"},
}
REGRESSION: dict[str, Any] = {
    "seed": 1, "rounds": 5, "eval_every": 2, "checkpoint_every": 2,
    "data": {"source": "synthetic_regression"},
    "scenario": {"name": "linear_regression", "n_clients": 6, "delta_phi": 20.0,
                 "samples_per_client": 100, "test_samples_per_client": 50},
    "model": {"name": "linear"},
    "train": {"lr": 0.1, "batch_size": 10, "steps": 1},
    "algorithm": {"name": "cfl_gp", "n_clusters": 3, "init_range": 0.8, "period": 1},
    "output": {"figures": False, "progress": "off"},
}
ROBUST = {
    **copy.deepcopy(CLASSIFICATION),
    "algorithm": {"name": "ifca", "n_clusters": 2},
    "faults": {"dropout": 0.2, "stragglers": 0.25},
    "adversary": {"kind": "sign_flip", "clients": [7]},
    "privacy": {"clip": 5.0, "noise_multiplier": 0.05},
}
RUNS = {"classification": CLASSIFICATION, "regression": REGRESSION, "robust": ROBUST}


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("records")
    torch.set_num_threads(1)
    out = {}
    for name, cfg in RUNS.items():
        Experiment.from_config(cfg, out_dir=base / name).run(progress=False)
        out[name] = base / name
    return out


@pytest.mark.parametrize("kind", list(RUNS))
def test_history_lines_round_trip_byte_for_byte(run_dirs: dict[str, Path], kind: str) -> None:
    lines = (run_dirs[kind] / "history.jsonl").read_text().splitlines()
    assert len(lines) == 5
    for line in lines:
        raw = json.loads(line)
        record = RoundRecord.from_json_dict(raw)
        assert record.to_json_dict() == raw
        assert json.dumps(record.to_json_dict()) == line  # same keys in the same order
    records = read_history(run_dirs[kind])
    assert [r.round for r in records] == [1, 2, 3, 4, 5]
    assert [r.evaluated for r in records] == [False, True, False, True, True]
    last = records[-1]
    assert last.metrics is not None and last.client_macro_f1 is not None
    if kind == "regression":
        assert last.metrics.mse is not None and last.metrics.accuracy is None
        assert last.client_mse is not None and records[0].client_mse is None
        assert '"client_mse"' in lines[-1] and '"client_mse"' not in lines[0]
    else:
        assert last.metrics.accuracy is not None and last.metrics.mse is None
        assert '"client_mse"' not in "".join(lines)
    assert (last.robust is not None) == (kind == "robust")
    assert ('"robust"' in lines[0]) == (kind == "robust")


@pytest.mark.parametrize("kind", list(RUNS))
def test_summary_round_trips_byte_for_byte(run_dirs: dict[str, Path], kind: str) -> None:
    text = (run_dirs[kind] / "summary.json").read_text()
    summary = read_summary(run_dirs[kind])
    assert json.dumps(summary.to_json_dict(), indent=2) == text
    assert summary.final.metrics is not None
    assert summary.final.n_clusters == read_history(run_dirs[kind])[-1].n_clusters
    assert (summary.robust is not None) == (kind == "robust")
    if kind == "robust":
        assert summary.robust is not None and summary.robust["privacy"]["epsilon"] > 0


def test_checkpoint_records_are_the_history(run_dirs: dict[str, Path]) -> None:
    """The checkpoint (written at the last round too) holds every record up to its round,
    which read back identically."""
    for run in run_dirs.values():
        state = torch.load(run / CHECKPOINT, weights_only=False)
        stored = [RoundRecord.from_json_dict(r) for r in state["records"]]
        history = read_history(run)
        assert state["round"] == history[-1].round and len(stored) == len(history)
        assert stored == history


def test_old_lines_without_newer_keys_read_and_round_trip() -> None:
    """Files written before `client_updates` and `robust` existed."""
    old = {"round": 3, "wall_time": 1.5, "n_clusters": 2, "assignment": [0, 1, -1],
           "ari": None, "floats_down": 10, "floats_up": 20.0, "metrics": None,
           "client_accuracy": None, "rejected": 0, "extras": {"split": True}}
    record = RoundRecord.from_json_dict(old)
    assert record.client_updates is None and record.robust is None
    assert json.dumps(record.to_json_dict()) == json.dumps(old)  # ints stay ints
    final = {"accuracy": 0.5, "accuracy_weighted": 0.5, "macro_f1": 0.4, "fairness_var": 1.0,
             "loss": 1.2, "mse": None, "ari": 1.0, "n_clusters": 2, "floats_down": 1.0,
             "floats_up": 2.0, "wall_time": 3.0}
    summary = RunSummary.from_json_dict({"algorithm": "ifca", "final": final})
    assert summary.final.metrics == RoundMetrics(accuracy=0.5, accuracy_weighted=0.5,
                                                 macro_f1=0.4, fairness_var=1.0, loss=1.2)
    assert summary.final.client_updates is None and summary.label is None
    assert FinalMetrics.from_json_dict({"ari": None}).metrics is None


def test_malformed_records_are_refused(tmp_path: Path) -> None:
    good = RoundRecord(round=1, wall_time=0.1, n_clusters=1, assignment=[0], ari=None,
                       floats_down=1.0, floats_up=1.0).to_json_dict()
    with pytest.raises(ValueError, match="lacks 'assignment'"):
        RoundRecord.from_json_dict({k: v for k, v in good.items() if k != "assignment"})
    with pytest.raises(ValueError, match="unknown key"):
        RoundRecord.from_json_dict({**good, "accuracy": 0.5})
    with pytest.raises(ValueError, match=r"metrics lacks .*'mse'"):
        RoundRecord.from_json_dict({**good, "metrics": {"accuracy": 0.5}})
    lines = [json.dumps(good), json.dumps({"round": 2})]
    (tmp_path / "history.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=r"history\.jsonl:2: a history record lacks"):
        read_history(tmp_path)
    (tmp_path / "summary.json").write_text('{"final": {}, "bogus": 1}')
    with pytest.raises(ClusterFLError, match=r"summary\.json: a summary has unknown key"):
        read_summary(tmp_path)


def test_an_unknown_key_names_the_version_that_cannot_read_it(tmp_path: Path) -> None:
    from clusterfl import __version__

    (tmp_path / "summary.json").write_text('{"final": {}, "written_later": 1}')
    with pytest.raises(ClusterFLError) as info:
        read_summary(tmp_path)
    message = str(info.value)
    assert "'written_later'" in message and f"this {__version__}" in message
    assert "\n" not in message


def test_json_ready_matches_the_runner_cleaning() -> None:
    value = {1: np.float32(0.5), "a": (np.int64(3), float("nan")), "t": torch.tensor([1.0]),
             "b": np.array([[1, 2]]), "inf": float("-inf"), "s": "x", "n": None, "ok": True}
    assert json_ready(value) == {"1": 0.5, "a": [3, None], "t": [1.0], "b": [[1, 2]],
                                 "inf": None, "s": "x", "n": None, "ok": True}


@dataclass(kw_only=True)
class _Extras(RoundExtras):
    loss: float | None = None
    sizes: list[int] = field(default_factory=list)
    warm: int = 0


@dataclass(kw_only=True)
class _MoreExtras(_Extras):
    spectrum: list[float] = field(default_factory=list)


def test_round_extras_to_dict_and_from_dict() -> None:
    e = _Extras(loss=0.5, sizes=[3, 5])
    assert list(e.to_dict().items()) == [("loss", 0.5), ("sizes", [3, 5]), ("warm", 0)]
    assert _Extras.field_names() == ("loss", "sizes", "warm")
    assert _MoreExtras.field_names() == ("loss", "sizes", "warm", "spectrum")
    assert _Extras.from_dict(e.to_dict()) == e
    # missing keys read as the defaults; unknown keys are ignored (and stay in the dict)
    line = {"sizes": [1], "other": {"kept": True}}
    read = _Extras.from_dict(line)
    assert read == _Extras(sizes=[1]) and line["other"] == {"kept": True}
    assert _Extras.from_dict({}) == _Extras()
    # values are taken as they are (no conversion)
    assert _Extras.from_dict({"loss": None, "warm": 1}).to_dict() == {
        "loss": None, "sizes": [], "warm": 1}
    # a round of the larger kind matches both classes, one of the smaller only the smaller
    more = _MoreExtras(spectrum=[2.0, 1.0]).to_dict()
    assert _MoreExtras.matches(more) and _Extras.matches(more)
    assert _Extras.matches(e.to_dict()) and not _MoreExtras.matches(e.to_dict())
    assert _MoreExtras.from_dict(e.to_dict()).spectrum == []
