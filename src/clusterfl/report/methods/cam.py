"""Figures of IFCA, FeSEM and CAM runs (Ma et al. 2023, Fig. 1 and 3: clustering collapse).

The generic report already draws `cluster_sizes.png` (clients per cluster per round, stacked
areas). These add, from the per-round `assignment` and `extras`:

- `cluster_balance.png`: the share of clients in the largest cluster and the number of
  non-empty clusters divided by K, per round. A collapse toward single-model FL shows as the
  largest share climbing to 1; the end of the warm-up is marked.
- `cam_train_losses.png` (IFCA-CAM, FeSEM-CAM): the mean local training loss of the cluster
  part (θ_i, global frozen) and of the global part (θ_i^0, cluster frozen) per round, and the
  warm-up loss; both fit the residual of the other, so they fall together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clusterfl.algorithms.cam import CAMExtras
from clusterfl.algorithms.common import KClusterExtras
from clusterfl.algorithms.fesem import FeSEMExtras
from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report.figures import plot_series
from clusterfl.report.history import run_label


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """Draw the clustering-balance (and, for CAM, part-loss) figures into `run_dir/figures`."""
    out = Path(run_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    if not records:
        return []
    label = run_label(summary)
    paths = [plot_balance(records, out / "cluster_balance.png", label)]
    if any(CAMExtras.matches(r.extras) for r in records):  # a CAM round (after any warm-up)
        paths.append(plot_part_losses(records, out / "cam_train_losses.png", label))
    return paths


def warmup_end(records: list[RoundRecord]) -> list[int]:
    """The last warm-up round, as a one-element list (empty when there was no warm-up)."""
    warm = [r.round for r in records if KClusterExtras.from_dict(r.extras).warmup]
    return [max(warm)] if warm else []


def balance_series(records: list[RoundRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, share of clients in the largest cluster, non-empty clusters / K).

    Unassigned clients (-1) count in the denominator of the share; K is the length of the
    `cluster_sizes` extra when present, else the number of distinct ids ever seen.
    """
    seen = {int(a) for r in records for a in r.assignment if a is not None and a >= 0}
    rounds, largest, used = [], [], []
    for r in records:
        a = np.array([-1 if v is None else v for v in r.assignment], int)
        k = len(KClusterExtras.from_dict(r.extras).cluster_sizes or []) or max(len(seen), 1)
        counts = np.bincount(a[a >= 0], minlength=k) if len(a) else np.zeros(k, int)
        rounds.append(r.round)
        largest.append(counts.max() / len(a) if len(a) else np.nan)
        used.append((counts > 0).sum() / k)
    return np.array(rounds), np.array(largest, float), np.array(used, float)


def plot_balance(records: list[RoundRecord], path: Path, label: str) -> Path:
    """Largest-cluster share and used-cluster fraction per round (collapse → share 1)."""
    rounds, largest, used = balance_series(records)
    return plot_series(
        {"largest cluster / clients": (rounds, largest), "non-empty clusters / K": (rounds, used)},
        path, f"{label}: cluster balance", "fraction", marks=warmup_end(records),
        mark_label="end of warm-up")


def plot_part_losses(records: list[RoundRecord], path: Path, label: str) -> Path:
    """Mean local training loss of the cluster part and of the global part per round."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in records:
        cam, warm = CAMExtras.from_dict(r.extras), FeSEMExtras.from_dict(r.extras)
        for name, value in (("cluster part θ_i (global frozen)", cam.train_loss_cluster),
                            ("global part θ_i^0 (cluster frozen)", cam.train_loss_global),
                            # FeSEM-CAM's warm-up rounds are FeSEM's
                            ("warm-up local training", warm.train_loss)):
            if isinstance(value, int | float):
                xs, ys = series.setdefault(name, ([], []))
                xs.append(float(r.round))
                ys.append(float(value))
    return plot_series({k: (np.array(x), np.array(y)) for k, (x, y) in series.items()}, path,
                       f"{label}: local training loss", "mean training loss",
                       marks=warmup_end(records), mark_label="end of warm-up")


__all__ = ["balance_series", "figures", "plot_balance", "plot_part_losses", "warmup_end"]
