"""How related clients are, from one small point set per client (FLT, Jamali-Rad et al. 2022,
Alg. 2 lines 12-17 and Alg. 3 case I; used by `clusterfl.algorithms.flt`).

Client m is represented by k points, `points[m]` of shape `[k, u]` (its signature centroids,
mapped to the plane by UMAP or not). From these sets the server computes:

- `umap_embed`: the manifold step, all k·M points mapped together to 2 dimensions;
- the client × client distance matrix A (`adjacency`): `min_distance_adjacency`, the paper's
  A_ij = min_{r,s} ‖u_i,r − u_j,s‖₂ (the closest pair of points of the two sets), or
  `matched_distance_adjacency`, the authors' code: the mean squared distance of the best
  one-to-one matching of the two sets (Hungarian matching);
- the relatedness matrix Ã = [A < γ] with Ã_ii = 1 (`threshold`): close means related;
- Case I aggregation: Ω_mj = Ã_mj p_j / Σ_j Ã_mj p_j, each row a p-weighted mean over the
  clients related to m (`relatedness_weights`), and new models Ω · W̄, all rows computed
  from one snapshot W̄ of the models (`relatedness_average`).
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch

from clusterfl.errors import require


def min_distance_adjacency(points: np.ndarray, block: int = 256) -> np.ndarray:
    """A_ij = min over r, s of ‖points[i, r] − points[j, s]‖₂ for `points` of shape `[M, k, u]`.

    Computed in blocks of clients so memory stays O(block · M · k²).
    """
    pts = np.asarray(points, dtype=np.float64)
    m, k, u = pts.shape
    flat = pts.reshape(m * k, u)
    sq = (flat**2).sum(1)
    out = np.empty((m, m))
    for a in range(0, m, block):
        b = min(m, a + block)
        rows = flat[a * k : b * k]
        d2 = (rows**2).sum(1)[:, None] + sq[None, :] - 2.0 * rows @ flat.T
        d2 = np.maximum(d2, 0.0).reshape(b - a, k, m, k)
        out[a:b] = np.sqrt(d2.min(axis=(1, 3)))
    np.fill_diagonal(out, 0.0)
    return np.minimum(out, out.T)  # exact symmetry despite rounding


def cross_distances(new: np.ndarray, points: np.ndarray,
                    kind: Literal["min", "matched"] = "min") -> np.ndarray:
    """`[N, M]` distances from N new point sets `[N, k, u]` to M point sets `[M, k, u]`, the
    same distance as `adjacency` (placing new clients next to the clustered ones)."""
    a = np.asarray(new, dtype=np.float64)
    b = np.asarray(points, dtype=np.float64)
    out = np.zeros((len(a), len(b)))
    if not len(a) or not len(b):
        return out
    if kind == "min":
        n, k, u = a.shape
        m, kb, _ = b.shape
        fa, fb = a.reshape(n * k, u), b.reshape(m * kb, u)
        d2 = (fa**2).sum(1)[:, None] + (fb**2).sum(1)[None, :] - 2.0 * fa @ fb.T
        return np.sqrt(np.maximum(d2, 0.0).reshape(n, k, m, kb).min(axis=(1, 3)))
    from scipy.optimize import linear_sum_assignment

    for i in range(len(a)):
        for j in range(len(b)):
            cost = ((a[i][:, None, :] - b[j][None, :, :]) ** 2).sum(-1)
            r, c = linear_sum_assignment(cost)
            out[i, j] = float(cost[r, c].mean())
    return out


def matched_distance_adjacency(points: np.ndarray) -> np.ndarray:
    """The authors' code: mean squared distance of the best one-to-one matching of centroids."""
    from scipy.optimize import linear_sum_assignment

    pts = np.asarray(points, dtype=np.float64)
    m = len(pts)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            cost = ((pts[i][:, None, :] - pts[j][None, :, :]) ** 2).sum(-1)
            r, c = linear_sum_assignment(cost)
            out[i, j] = out[j, i] = float(cost[r, c].mean())
    return out


def adjacency(points: np.ndarray, kind: Literal["min", "matched"] = "min") -> np.ndarray:
    """Client × client distance matrix A from per-client point sets `[M, k, u]`."""
    return min_distance_adjacency(points) if kind == "min" else matched_distance_adjacency(points)


def threshold(a: np.ndarray, gamma: float) -> np.ndarray:
    """Ã_ij = 1 where A_ij < γ (related), else 0; the diagonal is 1."""
    out = (np.asarray(a) < gamma).astype(np.float64)
    np.fill_diagonal(out, 1.0)
    return out


def relatedness_weights(related: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Ω_mj = Ã_mj p_j / Σ_j Ã_mj p_j (each row sums to one; p_j ∝ client data size)."""
    w = np.asarray(related, dtype=np.float64) * np.asarray(sizes, dtype=np.float64)[None, :]
    total = w.sum(1, keepdims=True)
    total[total == 0] = 1.0
    return w / total


def relatedness_average(snapshot: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Case I: new models Ω · W̄, every row computed from the same snapshot W̄ `[M, d]`.

    Clients with identical rows of Ω (a block of mutually related clients) share one product,
    so a block-diagonal Ã costs C rows instead of M. Computed in the snapshot's dtype.
    """
    uniq, inverse = np.unique(np.asarray(weights, dtype=np.float64), axis=0,
                              return_inverse=True)
    omega = torch.as_tensor(uniq, dtype=snapshot.dtype, device=snapshot.device)
    rows = torch.from_numpy(np.asarray(inverse).reshape(-1)).to(snapshot.device)
    return (omega @ snapshot)[rows]


def umap_embed(points: np.ndarray, seed: int, n_neighbors: int = 15,
               min_dist: float = 0.1) -> np.ndarray:
    """UMAP (umap-learn) of `[n, e]` points to 2 dimensions, seeded (imported lazily)."""
    require("flt", "umap")
    import umap

    pts = np.asarray(points, dtype=np.float64)
    if len(pts) < 3:
        return np.zeros((len(pts), 2)) if len(pts) else np.zeros((0, 2))
    reducer = umap.UMAP(n_components=2, n_neighbors=max(2, min(n_neighbors, len(pts) - 1)),
                        min_dist=min_dist, random_state=int(seed) % (2**31 - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n_jobs overridden by random_state", tiny-n notes
        return np.asarray(reducer.fit_transform(pts), dtype=np.float64)


def umap_embed_new(points: np.ndarray, new: np.ndarray, seed: int, n_neighbors: int = 15,
                   min_dist: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The `umap_embed` of `points` fitted again (same seed and settings: the same map), and
    new points `[m, e]` mapped into it with UMAP's `transform`: (points', new')."""
    require("flt", "umap")
    import umap

    pts = np.asarray(points, dtype=np.float64)
    add = np.asarray(new, dtype=np.float64)
    if len(pts) < 3:
        return np.zeros((len(pts), 2)), np.zeros((len(add), 2))
    reducer = umap.UMAP(n_components=2, n_neighbors=max(2, min(n_neighbors, len(pts) - 1)),
                        min_dist=min_dist, random_state=int(seed) % (2**31 - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = np.asarray(reducer.fit_transform(pts), dtype=np.float64)
        mapped = (np.asarray(reducer.transform(add), dtype=np.float64) if len(add)
                  else np.zeros((0, 2)))
    return fitted, mapped


__all__ = [
    "adjacency",
    "cross_distances",
    "matched_distance_adjacency",
    "min_distance_adjacency",
    "relatedness_average",
    "relatedness_weights",
    "threshold",
    "umap_embed",
    "umap_embed_new",
]
