"""Figures of a CFL run (Sattler et al. 2020), drawn from the per-round `extras` of CFL.

- `cfl_norms.png` (like the paper's Fig. 8): per cluster (tree node) the norm of the mean
  update ‖Δθ_c‖ (solid) and the largest client update norm max_i ‖Δθ_i‖ (dashed), with the
  thresholds ε1 and ε2 and the split rounds.
- `cfl_accuracy_gap.png` (like Fig. 9): top, the mean test accuracy of the clients of each
  true cluster (or of each final cluster when the truth is unknown); bottom, the separation
  gap g(α) of every cluster per round; split rounds marked.
- `cfl_similarity_<round>_<node>.png`: for every accepted split, the cosine similarity of the
  split cluster's updates, ordered by the two groups (and by true cluster inside them).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from clusterfl.algorithms.cfl import CFLExtras
from clusterfl.records import RoundRecord, RunSummary


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """Draw the CFL figures of a run into `run_dir / "figures"`; returns the files written."""
    out = Path(run_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    records = [r for r in records if CFLExtras.from_dict(r.extras).mean_norm]  # CFL rounds
    if not records:
        return []
    eps = _thresholds(Path(run_dir))
    truth = summary.true_clusters
    paths = [
        plot_norms(records, out / "cfl_norms.png", eps),
        plot_accuracy_gap(records, out / "cfl_accuracy_gap.png", truth),
    ]
    paths += plot_split_similarities(records, out, truth)
    return paths


# --------------------------------------------------------------------------- series


def split_rounds(records: list[RoundRecord]) -> list[int]:
    """Rounds in which a cluster split."""
    return [r.round for r in records if CFLExtras.from_dict(r.extras).split]


def node_series(records: list[RoundRecord], values: Callable[[CFLExtras], Sequence[float | None]]
                ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """`node id -> (rounds, values)` of a per-cluster extra, e.g. `lambda e: e.mean_norm`
    (`mean_norm`, `max_norm`, `gap`)."""
    acc: dict[int, tuple[list[int], list[float]]] = {}
    for r in records:
        e = CFLExtras.from_dict(r.extras)
        for node, value in zip(e.clusters, values(e)):
            xs, ys = acc.setdefault(int(node), ([], []))
            xs.append(r.round)
            ys.append(np.nan if value is None else float(value))
    return {k: (np.array(x), np.array(y)) for k, (x, y) in sorted(acc.items())}


def group_accuracy(records: list[RoundRecord], groups: np.ndarray
                   ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """`group -> (rounds, mean client accuracy of the group)` over evaluated rounds."""
    rows = [(r.round, r.client_accuracy) for r in records if r.client_accuracy]
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if not rows:
        return out
    rounds = np.array([t for t, _ in rows])
    acc = np.array([[np.nan if a is None else a for a in row] for _, row in rows], dtype=float)
    for g in np.unique(groups):
        out[int(g)] = (rounds, np.nanmean(acc[:, groups == g], axis=1))
    return out


def _thresholds(run_dir: Path) -> dict[str, float]:
    """ε1, ε2 from the run's config.toml (empty if unreadable)."""
    try:
        algo = tomllib.loads((run_dir / "config.toml").read_text()).get("algorithm", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {k: float(algo[k]) for k in ("eps1", "eps2") if k in algo}


# --------------------------------------------------------------------------- figures


def _marks(ax: Any, rounds: list[int]) -> None:
    for i, t in enumerate(rounds):
        ax.axvline(t, color="0.35", ls=":", lw=1.2, label="split" if i == 0 else None)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, format="png")
    return path


def plot_norms(records: list[RoundRecord], path: Path, eps: dict[str, float]) -> Path:
    """Fig. 8: mean update norm (solid) and max client norm (dashed) per cluster."""
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.subplots()
    mean = node_series(records, lambda e: e.mean_norm)
    peak = node_series(records, lambda e: e.max_norm)
    for i, node in enumerate(mean):
        color = f"C{i % 10}"
        ax.plot(*mean[node], color=color, lw=1.5, label=f"‖mean Δθ‖ node {node}")
        ax.plot(*peak[node], color=color, lw=1.2, ls="--", label=f"max ‖Δθ_i‖ node {node}")
    for key, style in (("eps1", "-."), ("eps2", (0, (5, 2, 1, 2)))):
        if key in eps:
            ax.axhline(eps[key], color="k", lw=0.9, ls=style, label=f"ε{key[-1]} = {eps[key]:.3g}")
    _marks(ax, split_rounds(records))
    ax.set_xlabel("round")
    ax.set_ylabel("update norm")
    ax.set_title("CFL update norms (solid: cluster mean, dashed: largest client)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2, loc="best")
    return _save(fig, path)


def plot_accuracy_gap(records: list[RoundRecord], path: Path, truth: Any) -> Path:
    """Fig. 9: accuracy per client group (top) and separation gap per cluster (bottom)."""
    fig = Figure(figsize=(7.5, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    if truth is not None:
        groups, name = np.asarray(truth, dtype=int), "true cluster"
    else:
        groups, name = np.asarray(records[-1].assignment, dtype=int), "final cluster"
    for g, (x, y) in group_accuracy(records, groups).items():
        top.plot(x, y, marker="o" if len(x) <= 40 else None, ms=3, label=f"{name} {g}")
    top.set_ylabel("mean test accuracy")
    top.set_title("CFL: accuracy per client group (top), separation gap g(α) per cluster")
    gaps = node_series(records, lambda e: e.gap)
    for node, (x, y) in gaps.items():
        if np.isfinite(y).any():
            bottom.plot(x, y, lw=1.3, label=f"node {node}")
    bottom.axhline(0.0, color="k", lw=0.8)
    if not any(np.isfinite(y).any() for _, y in gaps.values()):
        bottom.text(0.5, 0.5, "true clusters unknown: no gap", transform=bottom.transAxes,
                    ha="center", va="center", color="0.4")
    bottom.set_ylabel("separation gap g(α)")
    bottom.set_xlabel("round")
    splits = split_rounds(records)
    for ax in (top, bottom):
        _marks(ax, splits)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", ncol=2, loc="best")
    return _save(fig, path)


def plot_split_similarities(records: list[RoundRecord], out: Path, truth: Any) -> list[Path]:
    """One heatmap per accepted split: similarity ordered by group, then by true cluster."""
    from clusterfl.report.figures import plot_matrix

    paths = []
    for r in records:
        for event in CFLExtras.from_dict(r.extras).splits:
            if not event["accepted"] or "similarity" not in event:
                continue
            members = np.asarray(event["members"], dtype=int)
            group = np.isin(members, event["groups"][1]).astype(int)
            true = None if truth is None else np.asarray(truth, dtype=int)[members]
            key = (group, members) if true is None else (group, true, members)
            order = np.lexsort(key[::-1])
            labels = group if true is None else true
            name = f"cfl_similarity_{r.round}_{int(event['node'])}.png"
            title = (f"round {r.round}: split of node {event['node']} "
                     f"(α_cross_max = {event['alpha_cross_max']:.3f})")
            paths.append(plot_matrix(np.asarray(event["similarity"]), order, out / name, title,
                                     labels=labels))
    return paths
