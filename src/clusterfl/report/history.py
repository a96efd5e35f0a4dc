"""Read a run directory (`history.jsonl`, `summary.json`, `config.toml`) into numpy series.

A run directory is written by the experiment runner: `history.jsonl` holds one JSON object per
round, `summary.json` the final metrics. The helpers here are the only place that knows the
record layout; figures and tables go through them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.errors import ClusterFLError

HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.toml"

Record = dict[str, Any]


class RunDirError(ClusterFLError):
    """A directory is not a readable run directory (missing, empty or malformed file)."""


def _require_file(run_dir: str | Path, name: str) -> Path:
    """Return `run_dir/name`, or raise a RunDirError naming the missing file."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected a run directory)")
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not a run directory: missing {name} ({path})")
    return path


def load_history(run_dir: str | Path) -> list[Record]:
    """Load `history.jsonl`: one record per round, sorted by round.

    If a round occurs twice (a resumed run that replayed it), the last record wins.
    Raises RunDirError when the file is missing, empty or holds a line that is not JSON.
    """
    path = _require_file(run_dir, HISTORY_FILE)
    by_round: dict[int, Record] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = _parse_line(path, lineno, line)
        by_round[int(record["round"])] = record
    if not by_round:
        raise RunDirError(f"{path}: {HISTORY_FILE} is empty (no round was recorded)")
    return [by_round[t] for t in sorted(by_round)]


def _parse_line(path: Path, lineno: int, line: str) -> Record:
    """Parse one history line; raise RunDirError with file and line number on failure."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
    if not isinstance(record, dict) or "round" not in record:
        raise RunDirError(f"{path}:{lineno}: a history record must be an object with 'round'")
    return record


def load_summary(run_dir: str | Path) -> Record:
    """Load `summary.json`; raise RunDirError when it is missing or malformed."""
    path = _require_file(run_dir, SUMMARY_FILE)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    if not isinstance(summary, dict):
        raise RunDirError(f"{path}: {SUMMARY_FILE} must hold a JSON object")
    return summary


def load_config_text(run_dir: str | Path) -> str | None:
    """Return the text of `config.toml`, or None when the run directory has none."""
    path = Path(run_dir) / CONFIG_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def run_label(summary: Record, run_dir: str | Path | None = None) -> str:
    """Display name of a run: summary["label"], else the algorithm, else the folder name."""
    label = summary.get("label") or summary.get("algorithm")
    if label:
        return str(label)
    return Path(run_dir).name if run_dir is not None else "run"


# --------------------------------------------------------------------------- numpy series


def _rounds(history: Sequence[Record]) -> np.ndarray:
    return np.array([int(r["round"]) for r in history], dtype=int)


def evaluated_rounds(history: Sequence[Record]) -> np.ndarray:
    """Rounds whose record carries metrics (the evaluated rounds)."""
    return np.array([int(r["round"]) for r in history if r.get("metrics")], dtype=int)


def metric_series(history: Sequence[Record], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of `metrics[name]` over evaluated rounds where it is not null."""
    rounds, values = [], []
    for r in history:
        value = (r.get("metrics") or {}).get(name)
        if value is not None:
            rounds.append(int(r["round"]))
            values.append(float(value))
    return np.array(rounds, dtype=int), np.array(values, dtype=float)


def accuracy_series(history: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, mean client accuracy in 0..1) over evaluated rounds."""
    return metric_series(history, "accuracy")


def is_regression(history: Sequence[Record]) -> bool:
    """True when the run reports MSE and no accuracy (a regression task)."""
    return metric_series(history, "accuracy")[0].size == 0 and (
        metric_series(history, "mse")[0].size > 0
    )


def client_accuracy_matrix(history: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, [R, N] per-client accuracy) over rounds where `client_accuracy` is present."""
    rows = [(int(r["round"]), r["client_accuracy"]) for r in history if r.get("client_accuracy")]
    if not rows:
        return np.zeros(0, dtype=int), np.zeros((0, 0))
    rounds = np.array([t for t, _ in rows], dtype=int)
    matrix = np.array([[np.nan if a is None else a for a in acc] for _, acc in rows], dtype=float)
    return rounds, matrix


def client_accuracy_quantiles(
    history: Sequence[Record], low: float = 0.1, high: float = 0.9
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, low quantile, high quantile) of per-client accuracy per evaluated round."""
    rounds, matrix = client_accuracy_matrix(history)
    if rounds.size == 0:
        return rounds, np.zeros(0), np.zeros(0)
    return rounds, np.nanquantile(matrix, low, axis=1), np.nanquantile(matrix, high, axis=1)


def ari_series(history: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, ARI) over the rounds whose ARI is not null."""
    pairs = [(int(r["round"]), float(r["ari"])) for r in history if r.get("ari") is not None]
    return np.array([t for t, _ in pairs], dtype=int), np.array([a for _, a in pairs], dtype=float)


def n_clusters_series(history: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, number of clusters) for every round."""
    return _rounds(history), np.array([int(r["n_clusters"]) for r in history], dtype=int)


def comm_series(history: Sequence[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, cumulative floats down, cumulative floats up) for every round."""
    down = np.array([float(r.get("floats_down") or 0.0) for r in history])
    up = np.array([float(r.get("floats_up") or 0.0) for r in history])
    return _rounds(history), down, up


def split_rounds(history: Sequence[Record]) -> list[int]:
    """Rounds whose extras report a cluster split (`extras["split"]` true), e.g. for CFL."""
    return [int(r["round"]) for r in history if (r.get("extras") or {}).get("split")]


def cluster_size_matrix(
    assignments: Sequence[Sequence[int]],
) -> tuple[np.ndarray, np.ndarray]:
    """Count clients per cluster id in each row of `assignments`.

    Returns (ids, counts): `ids` the sorted distinct ids over all rows (-1, "no cluster", is
    kept as an id when it occurs) and `counts[t, k]` the number of clients of row t assigned to
    `ids[k]`. Each row of counts sums to that row's number of clients.
    """
    if len(assignments) == 0:
        return np.zeros(0, dtype=int), np.zeros((0, 0), dtype=int)
    ids = np.unique(np.concatenate([np.asarray(a, dtype=int).ravel() for a in assignments]))
    counts = np.zeros((len(assignments), ids.size), dtype=int)
    for t, row in enumerate(assignments):
        columns = np.searchsorted(ids, np.asarray(row, dtype=int))
        np.add.at(counts[t], columns, 1)
    return ids, counts


def cluster_sizes_series(
    history: Sequence[Record],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, cluster ids, [T, K] client counts) from each round's assignment."""
    ids, counts = cluster_size_matrix([r["assignment"] for r in history])
    return _rounds(history), ids, counts


def final_client_accuracy(summary: Record, history: Sequence[Record]) -> np.ndarray | None:
    """Final per-client accuracy: the summary's, else the last evaluated round's, else None."""
    values = summary.get("client_accuracy")
    if not values:
        _, matrix = client_accuracy_matrix(history)
        values = matrix[-1] if matrix.size else None
    if values is None:
        return None
    return np.array([np.nan if v is None else v for v in values], dtype=float)
