"""Figures of an FLT or PCA+kM+HC run (Jamali-Rad et al. 2022), from its one-off clustering.

- `flt_adjacency.png` (like the paper's Figs. 2, 3, 11): the distance matrix A with rows and
  columns in the dendrogram's leaf order, lines between the clusters found.
- `flt_relatedness.png`: the thresholded relatedness matrix Ã in the same order (FLT only).
- `flt_dendrogram.png` (like Fig. 3b): the Ward dendrogram with the cut that gives the clusters.
- `flt_umap.png`: the clients' UMAP points (k per client), colour = cluster found, marker =
  true cluster when known (FLT with UMAP only).

The data comes from the first round's `extras` in the history (or `flt_relatedness.npz`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from clusterfl.algorithms.flt import FLTClusteringExtras
from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report.figures import plot_matrix, save_png

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """Draw the FLT figures of a run into `run_dir / "figures"`; returns the files written."""
    data = clustering_data(Path(run_dir), records)
    if data is None:
        return []
    out = Path(run_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    labels = np.asarray(data["labels"], dtype=int)
    z = np.asarray(data["linkage"], dtype=float)
    order = leaf_order(z, len(labels))
    truth = summary.true_clusters
    paths = [plot_matrix(data["adjacency"], order, out / "flt_adjacency.png",
                         "Distance matrix A (dendrogram order)", labels)]
    related = data.get("relatedness")
    if related is not None and not np.array_equal(np.asarray(related), np.eye(len(labels))):
        paths.append(plot_matrix(related, order, out / "flt_relatedness.png",
                                 "Relatedness Ã = [A < γ] (dendrogram order)", labels))
    if len(z):
        paths.append(plot_dendrogram(z, labels, out / "flt_dendrogram.png"))
    points = data.get("umap_points")
    if points is not None and len(points):
        paths.append(plot_points(np.asarray(points, dtype=float), labels, truth,
                                 out / "flt_umap.png"))
    return paths


def clustering_data(run_dir: Path, records: list[RoundRecord]) -> dict[str, Any] | None:
    """A, Ã, linkage, labels (and UMAP points) of the run's one-off clustering, or None."""
    for rec in records:
        extras = FLTClusteringExtras.from_dict(rec.extras)
        if extras.adjacency is not None:
            a = np.asarray(extras.adjacency, dtype=float)
            a = np.where(a < 0, np.nan, a)  # clients without a signature
            return {"adjacency": a, "relatedness": extras.relatedness,
                    "linkage": extras.linkage or np.zeros((0, 4)),
                    "labels": rec.assignment, "umap_points": extras.umap_points}
    npz = run_dir / "flt_relatedness.npz"
    if npz.is_file():
        with np.load(npz) as f:
            a = np.where(np.isfinite(f["adjacency"]), f["adjacency"], np.nan)
            pts = f["points"] if "points" in f.files else None
            two_d = pts is not None and pts.ndim == 2 and pts.shape[1] == 2
            return {"adjacency": a, "relatedness": f["relatedness"], "linkage": f["linkage"],
                    "labels": f["labels"], "umap_points": pts if two_d else None}
    return None


def leaf_order(z: np.ndarray, n: int) -> np.ndarray:
    """Clients in the dendrogram's left-to-right leaf order (identity without a tree)."""
    from scipy.cluster.hierarchy import leaves_list

    return leaves_list(z) if len(z) == n - 1 and n > 1 else np.arange(n)


def cut_height(z: np.ndarray, n_clusters: int) -> float | None:
    """A height between the merges that leaves `n_clusters` clusters (None if not drawable)."""
    h = np.sort(z[:, 2])
    m = len(h) + 1
    if not 1 < n_clusters <= m:
        return None
    lo = h[m - n_clusters - 1] if m - n_clusters - 1 >= 0 else 0.0
    return float((lo + h[m - n_clusters]) / 2)


def plot_dendrogram(z: np.ndarray, labels: np.ndarray, path: Path) -> Path:
    """Ward dendrogram with the cut that yields the clusters found."""
    from scipy.cluster.hierarchy import dendrogram

    n_found = len(np.unique(labels[labels >= 0]))
    cut = cut_height(z, n_found)
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    flat = not np.asarray(z, dtype=np.float64)[:, 2].any()  # every merge at height 0
    with warnings.catch_warnings():
        if flat:  # scipy sets the limits [0, 0] and warns in the user's console
            warnings.simplefilter("ignore", UserWarning)
        dendrogram(z, ax=ax, no_labels=len(labels) > 60, leaf_font_size=6,
                   color_threshold=cut if cut is not None else 0.0,
                   above_threshold_color="0.5")
    if flat:
        ax.set_ylim(0.0, 1.0)
        ax.text(0.5, 0.5, "every merge height is 0 (the clients' rows are equal)",
                transform=ax.transAxes, ha="center", fontsize="small")
    if cut is not None:
        ax.axhline(cut, color="k", ls="--", lw=1, label=f"cut: {n_found} clusters")
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlabel("client")
    ax.set_ylabel("Ward merge height")
    ax.set_title("Hierarchical clustering of the clients", fontsize="medium")
    return save_png(fig, path, 110)


def plot_points(points: np.ndarray, labels: np.ndarray, truth: list[int] | None,
                path: Path) -> Path:
    """The k UMAP points of every client; colour = cluster found, marker = true cluster."""
    n = len(labels)
    k = len(points) // max(n, 1)
    owner = np.repeat(np.arange(n), k)
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.subplots()
    colors = colormaps["tab10"]
    groups = np.asarray(truth, dtype=int)[owner] if truth is not None else np.zeros(len(owner))
    for g in np.unique(groups):
        sel = groups == g
        ax.scatter(points[sel, 0], points[sel, 1], s=14, marker=MARKERS[int(g) % len(MARKERS)],
                   c=[colors(int(labels[o]) % 10) for o in owner[sel]], linewidths=0.3,
                   edgecolors="k", label=f"true {int(g)}" if truth is not None else None)
    if truth is not None and len(np.unique(groups)) <= len(MARKERS):
        ax.legend(loc="best", fontsize="x-small", title="marker")
    ax.set_xlabel("UMAP 1")
    ax.set_ylabel("UMAP 2")
    ax.set_title("Client centroids after UMAP (colour = cluster found)", fontsize="medium")
    return save_png(fig, path, 110)


__all__ = ["clustering_data", "cut_height", "figures", "leaf_order", "plot_dendrogram",
           "plot_points"]
