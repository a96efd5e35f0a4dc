"""Ward hierarchical clustering of clients, and where to cut the dendrogram (FLT, Jamali-Rad
et al. 2022, Alg. 2 line 19, and its PCA+kM+HC baseline; used by `clusterfl.algorithms.flt`).

- `ward_linkage`: scipy's Ward linkage of the rows of a feature matrix, each row one client
  read as a Euclidean point (FLT: the rows of the relatedness matrix Ã, each client's 0/1
  profile, or the rows of the distance matrix A).
- `auto_n_clusters`: the number of clusters C when it is not given ("HC proposes the best
  fitting number of clusters"). With the M − 1 merge heights sorted, h_1 ≤ … ≤ h_{M−1},
  cutting between h_j and h_{j+1} gives M − j clusters, j ≥ 1 (never all singletons); the
  cut at the largest gap wins, ties go to fewer clusters, and `max_clusters` bounds the
  search. If every merge height is 0 (all rows equal), C = 1; two clients at a positive
  distance give C = 2.
- `cut_tree`: the cut into C clusters, numbered 0..C−1 by first appearance in client order.
- `connected_groups`: the alternative automatic rule (ours, issue 25): the connected
  components of the 0/1 relatedness graph Ã (clients i, j in one group when a chain of
  related pairs joins them), numbered the same way. It needs no gap in the merge heights, so
  partly filled blocks of Ã (every true group connected, no link between groups) still give
  the true groups; a single link between two groups merges them.
"""

from __future__ import annotations

import warnings

import numpy as np


def ward_linkage(features: np.ndarray) -> np.ndarray:
    """scipy's Ward linkage matrix `[M−1, 4]` of the rows of `features`."""
    from scipy.cluster.hierarchy import ClusterWarning, linkage

    f = np.asarray(features, dtype=np.float64)
    if len(f) < 2:
        return np.zeros((0, 4))
    with warnings.catch_warnings():  # rows of a distance matrix are meant as observations here
        warnings.simplefilter("ignore", ClusterWarning)
        return linkage(f, method="ward")


def auto_n_clusters(z: np.ndarray, max_clusters: int | None = None, tol: float = 1e-9) -> int:
    """Number of clusters at the largest gap between consecutive merge heights (see module doc).

    Cutting between heights h_j and h_{j+1} (j = 1..M−2) gives M − j clusters; only cuts with
    at most `max_clusters` clusters are considered; ties go to fewer clusters. One client, or
    all heights ≤ tol, gives 1 cluster; two clients at a positive distance give 2.
    """
    m = len(z) + 1
    h = np.sort(np.asarray(z[:, 2], dtype=np.float64)) if len(z) else np.zeros(0)
    if m <= 1 or h[-1] <= tol:
        return 1
    if m == 2:
        return 2 if max_clusters is None or max_clusters >= 2 else 1
    best_c, best_gap = 1, -1.0
    for j in range(1, m - 1):  # cut between h[j-1] and h[j] (0-based): m - j clusters
        c = m - j
        if max_clusters is not None and c > max_clusters:
            continue
        gap = h[j] - h[j - 1]
        if gap >= best_gap - tol:  # later j = fewer clusters wins ties
            best_c, best_gap = c, gap
    if max_clusters is not None and max_clusters < 2:
        return 1
    return best_c


def cut_tree(z: np.ndarray, n_clusters: int, m: int) -> np.ndarray:
    """Cluster ids 0..C−1 of the M leaves, numbered by first appearance in client order."""
    from scipy.cluster.hierarchy import fcluster

    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if n_clusters <= 1 or m == 1:
        return np.zeros(m, dtype=np.int64)
    raw = fcluster(z, t=min(n_clusters, m), criterion="maxclust")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


def ward_nearest(features: np.ndarray, labels: np.ndarray,
                 new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cluster each new row joins at the least Ward cost, the increase of the within-
    cluster sum of squares n_c/(n_c + 1) ‖x − μ_c‖² (μ_c: the mean of cluster c's rows of
    `features`, labelled 0..C−1 by `labels`); returns (cluster per new row, `[N, C]` costs)."""
    f = np.asarray(features, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.int64)
    x = np.asarray(new, dtype=np.float64)
    c = int(lab.max(initial=-1)) + 1
    costs = np.full((len(x), max(c, 0)), np.inf)
    for k in range(c):
        rows = f[lab == k]
        if len(rows):
            n = len(rows)
            costs[:, k] = n / (n + 1) * ((x - rows.mean(0)) ** 2).sum(1)
    best = np.argmin(costs, axis=1) if c else np.full(len(x), -1)
    return best.astype(np.int64), costs



def connected_groups(related: np.ndarray) -> np.ndarray:
    """Connected components of the graph with adjacency `related` (`[M, M]`, nonzero =
    related; read as undirected), ids 0..C−1 by first appearance in client order."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    r = np.asarray(related)
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ValueError(f"related must be a square matrix, got shape {r.shape}")
    if len(r) == 0:
        return np.zeros(0, dtype=np.int64)
    _, raw = connected_components(csr_matrix(r != 0), directed=True, connection="weak")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse].astype(np.int64)


__all__ = ["auto_n_clusters", "connected_groups", "cut_tree", "ward_linkage", "ward_nearest"]
