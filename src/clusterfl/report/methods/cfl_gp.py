"""Figures of a CFL-GP run (Kim et al. 2024), drawn from the per-round `extras` of CFL-GP.

- `cfl_gp_spectrum.png` (like the paper's Fig. 19): the singular values of the gradient
  profile matrix at several clustering rounds (darker = later), log scale, with the position s
  of the largest gap of the last one (Appendix G) and the estimated number of clusters.
- `cfl_gp_features.png` (like Figs. 5, 12): every client's projected feature Ûᵀ g_c in its first
  two coordinates, at the first and at the last clustering round; colour = assigned model,
  marker = true cluster when known.
- `cfl_gp_k_estimate.png`: the Appendix-G estimate of the number of clusters and the gap
  position s per clustering round, with the round where clustering stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from clusterfl.algorithms.cfl_gp import CFLGPClusteringExtras, CFLGPExtras
from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report.figures import integer_ticks, save_png

MAX_SPECTRA = 6  # spectra drawn in one figure
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """Draw the CFL-GP figures of a run into `run_dir / "figures"`; returns the files written."""
    out = Path(run_dir) / "figures"
    rounds = clustering_records(records)
    if not rounds:
        return []
    out.mkdir(parents=True, exist_ok=True)
    truth = summary.true_clusters
    paths = [plot_spectrum(rounds, out / "cfl_gp_spectrum.png"),
             plot_features(rounds, out / "cfl_gp_features.png", truth)]
    if any(CFLGPExtras.from_dict(r.extras).k_estimate is not None for r in rounds):
        stopped = CFLGPExtras.from_dict(records[-1].extras).clustering_stopped_at
        paths.append(plot_k_estimate(rounds, out / "cfl_gp_k_estimate.png", stopped))
    return paths


def clustering_records(records: list[RoundRecord]) -> list[RoundRecord]:
    """The records of rounds with a clustering update (those carry the spectrum)."""
    return [r for r in records if CFLGPClusteringExtras.from_dict(r.extras).singular_values]


def _picked(n: int, k: int) -> list[int]:
    """Up to k indices spread over range(n), always the first and the last."""
    if n <= k:
        return list(range(n))
    return sorted({round(float(x)) for x in np.linspace(0, n - 1, k)})


def _new_figure(width: float = 7.0, height: float = 4.2, ncols: int = 1) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=True)
    for ax in np.atleast_1d(axes):
        ax.grid(True, alpha=0.3)
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    return save_png(fig, path, 110)


def plot_spectrum(rounds: list[RoundRecord], path: Path) -> Path:
    """Singular values per clustering round (log y), the last round's largest gap marked."""
    fig, ax = _new_figure()
    chosen = _picked(len(rounds), MAX_SPECTRA)
    cmap = colormaps["Reds"]
    for j, i in enumerate(chosen):
        sv = np.asarray(CFLGPClusteringExtras.from_dict(rounds[i].extras).singular_values,
                        dtype=float)
        idx = np.arange(1, len(sv) + 1)
        keep = sv > 0
        shade = 0.35 + 0.65 * (j + 1) / len(chosen)
        ax.plot(idx[keep], sv[keep], marker="o", ms=3, color=cmap(shade),
                label=f"round {rounds[i].round}")
    last = CFLGPExtras.from_dict(rounds[chosen[-1]].extras)
    s = last.spectral_gap_s
    title = "Singular values of the gradient profile"
    if s is not None:
        ax.axvline(s + 0.5, color="0.3", ls=":", lw=1.2, label=f"largest gap (s = {s})")
        title += f" — estimated K = {last.k_estimate}"
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    integer_ticks(ax)
    ax.set_ylabel("σ_i")
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def _scatter(ax: Any, feats: np.ndarray, assign: np.ndarray, truth: np.ndarray | None,
             title: str) -> None:
    xy = feats[:, :2] if feats.shape[1] >= 2 else np.c_[feats[:, 0], np.zeros(len(feats))]
    colors = colormaps["tab10"]
    groups = truth if truth is not None else np.zeros(len(xy), dtype=int)
    for g in np.unique(groups):
        sel = groups == g
        ax.scatter(xy[sel, 0], xy[sel, 1], c=[colors(int(a) % 10) for a in assign[sel]],
                   marker=MARKERS[int(g) % len(MARKERS)], s=36, edgecolors="k", linewidths=0.4,
                   label=f"true {g}" if truth is not None else None)
    ax.set_xlabel("projected feature 1")
    ax.set_ylabel("projected feature 2")
    ax.set_title(title, fontsize="medium")


def plot_features(rounds: list[RoundRecord], path: Path, truth: list[int] | None) -> Path:
    """Projected client features (first two coordinates) at the first and last clustering."""
    ends = [rounds[0], rounds[-1]] if len(rounds) > 1 else [rounds[0]]
    fig, axes = _new_figure(width=5.0 * len(ends), height=4.4, ncols=len(ends))
    true = None if truth is None else np.asarray(truth, dtype=int)
    for ax, rec in zip(np.atleast_1d(axes), ends):
        feats = np.asarray(CFLGPClusteringExtras.from_dict(rec.extras).projected_features,
                           dtype=float)
        assign = np.asarray(rec.assignment, dtype=int)
        note = "" if rec.ari is None else f", ARI {rec.ari:.2f}"
        _scatter(ax, feats, assign, true, f"round {rec.round}{note} (colour = model)")
    if true is not None and len(np.unique(true)) <= len(MARKERS):
        legend = np.atleast_1d(axes)[-1].legend(loc="best", fontsize="x-small", title="marker")
        for handle in legend.legend_handles:
            if handle is not None:
                handle.set_facecolor("0.75")  # the marker names the true cluster, not a model
    return _save(fig, path)


def plot_k_estimate(rounds: list[RoundRecord], path: Path, stopped: int | None = None
                    ) -> Path:
    """Estimated number of clusters and gap position s per clustering round."""
    fig, ax = _new_figure()
    t = [r.round for r in rounds]
    extras = [CFLGPExtras.from_dict(r.extras) for r in rounds]
    for values, label, style in (([e.k_estimate for e in extras], "estimated K", "-o"),
                                 ([e.spectral_gap_s for e in extras], "largest gap s", "--s")):
        y = [np.nan if v is None else float(v) for v in values]
        ax.plot(t, y, style, ms=4, label=label)
    if stopped is not None:
        ax.axvline(stopped, color="0.35", ls=":", label=f"clustering stopped (round {stopped})")
    ax.set_xlabel("round")
    integer_ticks(ax)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # K and s are counts
    ax.set_ylabel("number")
    ax.set_title("Appendix-G estimate of the number of clusters", fontsize="medium")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)
