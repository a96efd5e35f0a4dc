"""Numpy series of a run's records (`clusterfl.records.RoundRecord`) for figures and tables.

The records and the summary are read by `clusterfl.records.read_history` and
`read_summary` (re-exported by `clusterfl.report`); the helpers below turn them into arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clusterfl.records import (
    RoundMetrics,
    RoundRecord,
    RunSummary,
)

CONFIG_FILE = "config.toml"


def load_config_text(run_dir: str | Path) -> str | None:
    """Return the text of `config.toml`, or None when the run directory has none."""
    path = Path(run_dir) / CONFIG_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def run_label(summary: RunSummary, run_dir: str | Path | None = None) -> str:
    """Display name of a run: its label, else the algorithm, else the folder name."""
    label = summary.label or summary.algorithm
    if label:
        return str(label)
    return Path(run_dir).name if run_dir is not None else "run"


# --------------------------------------------------------------------------- numpy series


def _rounds(history: Sequence[RoundRecord]) -> np.ndarray:
    return np.array([r.round for r in history], dtype=int)


def evaluated_rounds(history: Sequence[RoundRecord]) -> np.ndarray:
    """Rounds whose record carries metrics (the evaluated rounds)."""
    return np.array([r.round for r in history if r.metrics is not None], dtype=int)


def metric_series(history: Sequence[RoundRecord], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of the metric `name` (a `RoundMetrics` field, e.g. "accuracy") over
    the evaluated rounds where it is not null."""
    RoundMetrics.check_key(name, "name")  # ConfigError, as `History.series`
    rounds, values = [], []
    for r in history:
        value = None if r.metrics is None else getattr(r.metrics, name)
        if value is not None:
            rounds.append(r.round)
            values.append(float(value))
    return np.array(rounds, dtype=int), np.array(values, dtype=float)


def accuracy_series(history: Sequence[RoundRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, mean client accuracy in 0..1) over evaluated rounds."""
    return metric_series(history, "accuracy")


def is_regression(history: Sequence[RoundRecord]) -> bool:
    """True when the run reports MSE and no accuracy (a regression task)."""
    return metric_series(history, "accuracy")[0].size == 0 and (
        metric_series(history, "mse")[0].size > 0
    )


def is_language_model(history: Sequence[RoundRecord]) -> bool:
    """True when the run reports a perplexity (a language model; lower is better)."""
    return metric_series(history, "perplexity")[0].size > 0


def client_accuracy_matrix(history: Sequence[RoundRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, [R, N] per-client accuracy) over rounds where `client_accuracy` is present."""
    rows = [(r.round, r.client_accuracy) for r in history if r.client_accuracy]
    if not rows:
        return np.zeros(0, dtype=int), np.zeros((0, 0))
    rounds = np.array([t for t, _ in rows], dtype=int)
    matrix = np.array([[np.nan if a is None else a for a in acc] for _, acc in rows], dtype=float)
    return rounds, matrix


def client_accuracy_quantiles(
    history: Sequence[RoundRecord], low: float = 0.1, high: float = 0.9
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, low quantile, high quantile) of per-client accuracy per evaluated round."""
    rounds, matrix = client_accuracy_matrix(history)
    if rounds.size == 0:
        return rounds, np.zeros(0), np.zeros(0)
    return rounds, np.nanquantile(matrix, low, axis=1), np.nanquantile(matrix, high, axis=1)


def ari_series(history: Sequence[RoundRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, ARI) over the rounds whose ARI is not null."""
    pairs = [(r.round, float(r.ari)) for r in history if r.ari is not None]
    return np.array([t for t, _ in pairs], dtype=int), np.array([a for _, a in pairs], dtype=float)


def n_clusters_series(history: Sequence[RoundRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, number of clusters) for every round."""
    return _rounds(history), np.array([r.n_clusters for r in history], dtype=int)


def comm_series(history: Sequence[RoundRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, cumulative floats down, cumulative floats up) for every round."""
    down = np.array([float(r.floats_down) for r in history])
    up = np.array([float(r.floats_up) for r in history])
    return _rounds(history), down, up


def split_rounds(history: Sequence[RoundRecord]) -> list[int]:
    """Rounds in which a cluster split (`CFLExtras.split`; only CFL splits clusters)."""
    # imported here: the methods (and torch) load only when a figure needs them
    from clusterfl.algorithms.cfl import CFLExtras

    return [r.round for r in history if CFLExtras.from_dict(r.extras).split]


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
    history: Sequence[RoundRecord],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, cluster ids, [T, K] client counts) from each round's assignment."""
    ids, counts = cluster_size_matrix([r.assignment for r in history])
    return _rounds(history), ids, counts


def final_client_accuracy(
    summary: RunSummary, history: Sequence[RoundRecord]
) -> np.ndarray | None:
    """Final per-client accuracy: the summary's, else the last evaluated round's, else None
    (also when no client has one: a regression's are all null)."""
    values = summary.client_accuracy
    if not values:
        _, matrix = client_accuracy_matrix(history)
        values = matrix[-1] if matrix.size else None
    if values is None:
        return None
    out = np.array([np.nan if v is None else v for v in values], dtype=float)
    return None if np.isnan(out).all() else out

