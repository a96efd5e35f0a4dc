"""Weighted k-means on flat parameter vectors: FeSEM's server step.

FeSEM (Xie et al., "Multi-center federated learning", 2021) and FeSEM-CAM (Ma et al.,
"Structured federated learning through clustered additive modeling", 2023, Eq. 10-11) cluster
client models by the sample-weighted k-means objective

    min_{Θ_1..K} Σ_i (n_i / n) min_k ||θ_i − Θ_k||²,

alternating the assignment c(i) = argmin_k ||θ_i − Θ_k||² and the centroid update
Θ_k = Σ_{i∈C_k} n_i θ_i / Σ_{i∈C_k} n_i (Eq. 11) "for a few steps until convergence".

`lloyd` is that alternation from given initial centers (FeSEM continues from the current
cluster models, so cluster ids stay stable across rounds). It returns exactly what
scikit-learn's `KMeans(init=centers, n_init=1, algorithm="lloyd", tol=0)` returns on the same
data and weights, with one documented difference: a cluster that loses all its members keeps
its previous center (FeSEM keeps that cluster's model) instead of being moved to a far point.
`kmeans` adds a seeded weighted k-means++ initialisation with restarts for the first
clustering, when no centers exist yet. `farthest_movable` picks the points that may restart
clusters left without members (FeSEM's `empty_centers = "reseed"`), the farthest from their
own centers first, as scikit-learn relocates the empty clusters of its Lloyd iterations.

Distances are computed from explicit differences (no ||x||² − 2x·c + ||c||² expansion), so
they stay accurate for long float32 parameter vectors. Everything runs on the device of the
points (a GPU's round of models stays there; centers given elsewhere are used there); only
labels and scalars come back to the host, as numpy arrays and floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class KMeansResult:
    """Outcome of a k-means run.

    Attributes:
        labels: `[n]` int64 cluster of every point (nearest to the returned centers).
        centers: `[K, p]` centers (weighted means of the members of the last update).
        inertia: Σ_i w_i ||x_i − centers[labels_i]||².
        n_iter: number of center updates performed.
        converged: True when the assignment stopped changing before `max_iter`.
    """

    labels: np.ndarray
    centers: torch.Tensor
    inertia: float
    n_iter: int
    converged: bool


def squared_distances(x: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """`[n, K]` squared Euclidean distances between the rows of x and of centers."""
    if x.shape[-1] != centers.shape[-1]:
        raise ValueError(f"points have {x.shape[-1]} coordinates, centers {centers.shape[-1]}")
    return torch.stack([((x - c) ** 2).sum(dim=1) for c in centers], dim=1)


def nearest(x: torch.Tensor, centers: torch.Tensor) -> np.ndarray:
    """Index of the nearest center of every row (ties: the lowest index)."""
    return torch.argmin(squared_distances(x, centers), dim=1).cpu().numpy().astype(np.int64)


def weighted_centroids(
    x: torch.Tensor, labels: np.ndarray, weights: np.ndarray, previous: torch.Tensor
) -> torch.Tensor:
    """`[K, p]`: row k the weighted mean of the points labelled k; `previous[k]` if none."""
    out = previous.to(x.device, copy=True)
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=x.dtype, device=x.device)
    for k in np.unique(labels):
        sel = torch.from_numpy(labels == k).to(x.device)
        wk = w[sel]
        out[int(k)] = (wk[:, None] * x[sel]).sum(0) / wk.sum()
    return out


def inertia(x: torch.Tensor, labels: np.ndarray, centers: torch.Tensor,
            weights: np.ndarray) -> float:
    """Σ_i w_i ||x_i − centers[labels_i]||² (the weighted k-means objective, Eq. 10)."""
    d = ((x - centers[_on(labels, x)]) ** 2).sum(dim=1).double()
    return float((torch.as_tensor(np.asarray(weights, dtype=np.float64), device=x.device)
                  * d).sum())


def _on(index: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """`index` as a tensor on the device of `x`."""
    return torch.from_numpy(np.asarray(index)).to(x.device)


def _check_weights(x: torch.Tensor, weights: np.ndarray | None) -> np.ndarray:
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(x),):
        raise ValueError(f"need one weight per point ({len(x)}), got shape {w.shape}")
    if np.any(w < 0) or not np.any(w > 0):
        raise ValueError("weights must be non-negative and not all zero")
    return w


def lloyd(
    x: torch.Tensor, init: torch.Tensor, weights: np.ndarray | None = None, max_iter: int = 10
) -> KMeansResult:
    """Weighted Lloyd iterations from the centers `init` (CAM Eq. 11, iterated).

    Each iteration recomputes the centers from the current assignment, then reassigns every
    point to its nearest center; it stops when the assignment no longer changes or after
    `max_iter` updates. The returned labels are always those nearest to the returned centers.
    """
    if max_iter < 1:
        raise ValueError("max_iter must be >= 1")
    w = _check_weights(x, weights)
    centers = init.to(x.device, x.dtype, copy=True)
    labels = nearest(x, centers)
    converged, n_iter = False, 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 - n_iter is reported
        centers = weighted_centroids(x, labels, w, centers)
        new = nearest(x, centers)
        if np.array_equal(new, labels):
            converged = True
            break
        labels = new
    return KMeansResult(labels, centers, inertia(x, labels, centers, w), n_iter, converged)


def farthest_movable(
    x: torch.Tensor, labels: np.ndarray, centers: torch.Tensor, sizes: np.ndarray, count: int,
) -> list[int]:
    """Up to `count` rows of x, the farthest from their own center first, that can leave it.

    `sizes[k]` counts the members cluster k has in all (`x` may hold only some of them); a
    row is taken only while its cluster keeps at least one other member, so moving the
    chosen rows to new clusters never empties one. Ties: the lower row first.
    """
    left = np.asarray(sizes, dtype=np.int64).copy()
    d2 = ((x - centers[_on(labels, x)]) ** 2).sum(dim=1).double().cpu().numpy()
    chosen: list[int] = []
    for i in np.argsort(-d2, kind="stable"):
        if len(chosen) == count:
            break
        if left[labels[i]] >= 2:
            left[labels[i]] -= 1
            chosen.append(int(i))
    return chosen


def kmeans_plus_plus(
    x: torch.Tensor, k: int, rng: np.random.Generator, weights: np.ndarray | None = None
) -> torch.Tensor:
    """`[k, p]` initial centers by weighted D² sampling (Arthur & Vassilvitskii 2007).

    The first center is drawn with probability ∝ w_i, each next one ∝ w_i · D(x_i)², where D
    is the distance to the closest center chosen so far. If every remaining point coincides
    with a chosen center, the next one is drawn ∝ w_i (duplicates are then unavoidable).
    """
    if not 1 <= k <= len(x):
        raise ValueError(f"k = {k} centers need 1 <= k <= {len(x)} points")
    w = _check_weights(x, weights)
    first = int(rng.choice(len(x), p=w / w.sum()))
    chosen = [first]
    d2 = ((x - x[first]) ** 2).sum(dim=1).double().cpu().numpy()
    for _ in range(1, k):
        score = w * d2
        p = score / score.sum() if score.sum() > 0 else w / w.sum()
        nxt = int(rng.choice(len(x), p=p))
        chosen.append(nxt)
        d2 = np.minimum(d2, ((x - x[nxt]) ** 2).sum(dim=1).double().cpu().numpy())
    return x[_on(np.asarray(chosen, dtype=np.int64), x)].clone()


def kmeans(
    x: torch.Tensor, k: int, rng: np.random.Generator, weights: np.ndarray | None = None,
    n_init: int = 5, max_iter: int = 100,
) -> KMeansResult:
    """Weighted k-means with `n_init` k-means++ restarts; the lowest inertia wins."""
    if n_init < 1:
        raise ValueError("n_init must be >= 1")
    best: KMeansResult | None = None
    for _ in range(n_init):
        result = lloyd(x, kmeans_plus_plus(x, k, rng, weights), weights, max_iter)
        if best is None or result.inertia < best.inertia:
            best = result
    assert best is not None
    return best


__all__ = [
    "KMeansResult",
    "farthest_movable",
    "inertia",
    "kmeans",
    "kmeans_plus_plus",
    "lloyd",
    "nearest",
    "squared_distances",
    "weighted_centroids",
]
