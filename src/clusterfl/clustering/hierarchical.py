"""Ward hierarchical clustering of clients, and where to cut the dendrogram (FLT, Jamali-Rad
et al. 2022, Alg. 2 line 19, and its PCA+kM+HC baseline; used by `clusterfl.algorithms.flt`).

- `ward_linkage`: scipy's Ward linkage of the rows of a feature matrix, each row one client
  read as a Euclidean point (FLT: the rows of the relatedness matrix Ã, each client's 0/1
  profile, or the rows of the distance matrix A).
- `auto_n_clusters`: the number of clusters C when it is not given ("HC proposes the best
  fitting number of clusters"). With the M − 1 merge heights sorted, h_1 ≤ … ≤ h_{M−1},
  cutting between h_j and h_{j+1} gives M − j clusters, j ≥ 1 (never all singletons); the
  cut at the largest gap wins, ties go to fewer clusters, and `max_clusters` bounds the
  search. If every merge height is 0 (all rows equal), or all M − 1 ≥ 2 heights are equal
  (no gap), C = 1; two clients at a positive distance give C = 2.
- `cut_tree`: the cut into C clusters (the first M − C merges, so C even where merge heights
  tie), numbered 0..C−1 by first appearance in client order.
- `connected_groups`: the alternative automatic rule (ours, issue 25): the connected
  components of the 0/1 relatedness graph Ã (clients i, j in one group when a chain of
  related pairs joins them), numbered the same way. It needs no gap in the merge heights, so
  partly filled blocks of Ã (every true group connected, no link between groups) still give
  the true groups; a single link between two groups merges them.

Agglomerative clustering with a choice of linkage, cut at a distance threshold or into a
fixed number of clusters (PACFL on its proximity matrix, FL+HC on the clients' updates):

- `distance_linkage` / `feature_linkage`: scipy's linkage of a precomputed distance matrix,
  or of observation rows under a metric ("euclidean", "manhattan", "cosine": 1 − cos, and 1
  for a zero row; Ward only with Euclidean rows). Linkages: "average" (UPGMA, the size-weighted
  mean distance), "weighted" (WPGMA: the plain mean of the two merged clusters' distances,
  which is what the PACFL authors' own routine calls "average"), "complete", "single",
  "ward".
- `flat_clusters`: the clusters at a threshold (every merge at height ≤ threshold is made:
  the PACFL authors' loop "merge the closest pair while its distance ≤ β", which scipy's
  `fcluster(..., "distance")` equals for these monotone linkages), or C clusters, or the
  largest-gap C (`auto_n_clusters`); numbered by first appearance in client order.
- `linkage_to_clusters`: the linkage distance of new points to each flat cluster from their
  distances to its members ("average"/"weighted": mean, "complete": max, "single": min).
- `nearest_centroid`: the cluster of new points by the nearest cluster mean under a metric
  (FL+HC places the clients that were not clustered so).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

Linkage = Literal["average", "weighted", "complete", "single", "ward"]
Metric = Literal["euclidean", "manhattan", "cosine"]
LINKAGES: tuple[str, ...] = ("average", "weighted", "complete", "single", "ward")
_SCIPY_METRIC = {"euclidean": "euclidean", "manhattan": "cityblock", "cosine": "cosine"}


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
    at most `max_clusters` clusters are considered; ties go to fewer clusters. One client,
    all heights ≤ tol, or three clients or more merged at one height (no gap) give 1
    cluster; two clients at a positive distance give 2.
    """
    m = len(z) + 1
    h = np.sort(np.asarray(z[:, 2], dtype=np.float64)) if len(z) else np.zeros(0)
    if m <= 1 or h[-1] <= tol or (m > 2 and h[-1] - h[0] <= tol):
        return 1  # nothing apart, or every merge at one height: no gap to cut in
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


MIN_SILHOUETTE = 0.25
"""The mean silhouette a cut needs to count as structure: Kaufman & Rousseeuw (1990, *Finding
Groups in Data*, ch. 2) read a best mean silhouette of 0.25 or less as "no substantial
structure has been found". Below it, the clients stay one cluster. Evidence (the transfer
grid's development half; 0.5, their "reasonable structure", kept most true groups of FL+HC
together): docs/transfer.md. FL+HC's rule v2 asks a shuffle test instead for clusters of five
clients or more (`silhouette_cut`'s `structured`, `clusterfl.algorithms.flhc`)."""


@dataclass(frozen=True)
class SilhouetteCut:
    """The silhouette cut of a dendrogram: its clusters and the scores of the top level."""

    labels: np.ndarray  # cluster of each leaf, 0..C−1 by first appearance
    scores: dict[int, float]  # C → mean silhouette of the whole tree cut into C clusters
    best: int  # the C of the highest of those scores (1 when no cut was possible)

    @property
    def n_clusters(self) -> int:
        return int(self.labels.max(initial=-1)) + 1


def _cuts(node: object) -> Iterator[list[object]]:
    """The subtrees of scipy `ClusterNode` `node` that cutting it into 2, 3, … clusters
    leaves, each from the one before by undoing its highest merge (as
    `fcluster(..., "maxclust")` for monotone trees), until only leaves are left."""
    parts = [node]
    while True:
        inner = [p for p in parts if not p.is_leaf()]  # type: ignore[attr-defined]
        if not inner:
            return
        top = max(inner, key=lambda p: p.dist)  # type: ignore[attr-defined]
        parts = [p for p in parts if p is not top] + [top.left, top.right]  # type: ignore[attr-defined]
        yield parts


def _best_cut(node: object, d: np.ndarray, top: int,
              min_part: int = 1) -> tuple[dict[int, float], int]:
    """Mean silhouette of each cut of `node`'s subtree into 2..min(top, n − 1) clusters of at
    least `min_part` members under the members' distances, and the best C (ties to fewer
    clusters; 1 if none)."""
    from sklearn.metrics import silhouette_score

    members = node.pre_order()  # type: ignore[attr-defined]
    sub = d[np.ix_(members, members)]
    pos = {leaf: i for i, leaf in enumerate(members)}
    scores: dict[int, float] = {}
    if len(members) < 3 or sub.max() <= 0:
        return scores, 1
    for parts in _cuts(node):
        c = len(parts)
        if c > min(top, len(members) - 1):
            break
        sizes = [p.pre_order() for p in parts]  # type: ignore[attr-defined]
        if min(len(leaves) for leaves in sizes) < min_part:
            continue
        labels = np.zeros(len(members), dtype=np.int64)
        for k, leaves in enumerate(sizes):
            labels[[pos[leaf] for leaf in leaves]] = k
        scores[c] = float(silhouette_score(sub, labels, metric="precomputed"))
    if not scores:
        return scores, 1
    return scores, max(scores, key=lambda c: (scores[c], -c))


def silhouette_cut(z: np.ndarray, distances: np.ndarray, max_clusters: int | None = None,
                   min_silhouette: float = MIN_SILHOUETTE,
                   structured: Callable[[np.ndarray, float], bool] | None = None
                   ) -> SilhouetteCut:
    """Divisive silhouette cut of linkage `z` under the leaves' `distances` (`[M, M]`, the
    distances the clustering used). Top-down from the whole tree: a cluster is cut into the C
    subtrees (C = 2..its clients − 1) whose mean silhouette, on its own members' distances, is
    highest, if that silhouette reaches `min_silhouette`; each part is then examined the same
    way, with parts of two clients or more (a lone client is cut off only at the top); a
    cluster whose best cut stays below the bound (no substantial structure), or of fewer
    than three clients, is kept. A hierarchy of groups is therefore followed down to its
    finest level that still shows structure (the widest split need not be the last).
    `structured(leaves, score)`, when given, decides instead of the bound whether a cluster
    (its leaves, the positions in `distances`) whose best cut scores `score` shows structure.
    `max_clusters` bounds the total. Scale-free: silhouettes are ratios of distances. The
    scores returned are those of the whole tree (the first level)."""
    from scipy.cluster.hierarchy import to_tree

    d = np.asarray(distances, dtype=np.float64)
    m = len(d)
    limit = m if max_clusters is None else max(1, max_clusters)
    if m < 3 or not np.isfinite(d).all() or d.max() <= 0:
        return SilhouetteCut(np.zeros(m, dtype=np.int64), {}, 1)
    d = (d + d.T) / 2.0
    np.fill_diagonal(d, 0.0)
    root = to_tree(np.asarray(z, dtype=np.float64))
    first, best = _best_cut(root, d, limit)
    shows = structured or (lambda leaves, score: score >= min_silhouette)
    final: list[object] = []
    todo = [root]
    while todo:
        node = todo.pop(0)
        room = limit - len(final) - len(todo)  # clusters this node may become
        scores, c = (first, best) if node is root else _best_cut(node, d, room, 2)
        if c < 2 or room < 2 or not shows(np.asarray(node.pre_order()), scores[c]):
            final.append(node)
            continue
        todo += next(parts for parts in _cuts(node) if len(parts) == c)
    raw = np.zeros(m, dtype=np.int64)
    for k, node in enumerate(final):
        raw[node.pre_order()] = k  # type: ignore[attr-defined]
    return SilhouetteCut(_first_appearance(raw), first, best)


def cut_tree(z: np.ndarray, n_clusters: int, m: int) -> np.ndarray:
    """Cluster ids 0..C−1 of the M leaves, numbered by first appearance in client order:
    the first M − C merges of `z` made (agglomeration stopped at C clusters), so that tied
    merge heights still give C clusters (scipy's `fcluster(..., "maxclust")` cuts at a
    height and returns fewer when the heights around the cut tie)."""
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if n_clusters <= 1 or m == 1:
        return np.zeros(m, dtype=np.int64)
    parent = np.arange(2 * m - 1)  # scipy's ids: leaves 0..M−1, merge i is node M + i

    def root(i: int) -> int:
        while parent[i] != i:
            i = int(parent[i])
        return i

    for i, row in enumerate(np.asarray(z)[: m - min(n_clusters, m)]):
        parent[root(int(row[0]))] = parent[root(int(row[1]))] = m + i
    return _first_appearance(np.array([root(i) for i in range(m)]))


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


def distance_linkage(distances: np.ndarray, method: Linkage = "average") -> np.ndarray:
    """scipy's linkage `[M−1, 4]` of a symmetric distance matrix `[M, M]` (zero diagonal).

    Ward needs Euclidean observations (`feature_linkage`), not arbitrary distances.
    """
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    if method not in LINKAGES or method == "ward":
        raise ValueError(f"linkage {method!r} on a distance matrix; allowed: average, "
                         "weighted, complete, single")
    a = np.asarray(distances, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"distances must be a square matrix, got shape {a.shape}")
    if len(a) < 2:
        return np.zeros((0, 4))
    a = (a + a.T) / 2.0
    np.fill_diagonal(a, 0.0)
    return linkage(squareform(a, checks=False), method=method)


def feature_linkage(features: np.ndarray, metric: Metric = "euclidean",
                    method: Linkage = "ward") -> np.ndarray:
    """scipy's linkage `[M−1, 4]` of the rows of `features` under `metric`."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import pdist

    if metric not in _SCIPY_METRIC:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(_SCIPY_METRIC)}")
    if method not in LINKAGES:
        raise ValueError(f"unknown linkage {method!r}; allowed: {', '.join(LINKAGES)}")
    if method == "ward" and metric != "euclidean":
        raise ValueError(f"Ward linkage needs the euclidean metric, not {metric!r}")
    f = np.asarray(features, dtype=np.float64)
    if len(f) < 2:
        return np.zeros((0, 4))
    if method == "ward":
        return linkage(f, method="ward")
    if metric == "cosine" and not _norms(f).all():  # a zero row: 1 − 0, not scipy's NaN
        from scipy.spatial.distance import squareform

        d = pairwise_distances(f, f, metric)
        np.fill_diagonal(d, 0.0)
        return linkage(squareform(d, checks=False), method=method)
    return linkage(pdist(f, _SCIPY_METRIC[metric]), method=method)


def _norms(x: np.ndarray) -> np.ndarray:
    """Whether each row of `x` is nonzero."""
    return np.asarray(np.any(x != 0, axis=1))


def pairwise_distances(a: np.ndarray, b: np.ndarray, metric: Metric = "euclidean") -> np.ndarray:
    """`[len(a), len(b)]` distances between the rows of `a` and of `b` under `metric`. Under
    "cosine" a zero row has no direction: similarity 0 (`pairwise_cosine`'s rule), distance 1
    to every row, itself included (scipy's 0/0 gave NaN)."""
    from scipy.spatial.distance import cdist

    if metric not in _SCIPY_METRIC:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(_SCIPY_METRIC)}")
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if metric != "cosine" or not len(x) or not len(y) or (_norms(x).all() and _norms(y).all()):
        return np.asarray(cdist(x, y, _SCIPY_METRIC[metric]))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.asarray(cdist(x, y, "cosine"))
    d[~_norms(x)] = 1.0
    d[:, ~_norms(y)] = 1.0
    return d


def nearest_centroid(points: np.ndarray, centroids: np.ndarray,
                     metric: Metric = "euclidean") -> tuple[np.ndarray, np.ndarray]:
    """For each row of `points`, the nearest row of `centroids` (`[K, d]`) under `metric`
    and its distance; a centroid row holding NaN (a cluster without a mean) is never chosen.
    Ties go to the lower row. No centroid at all: row -1, distance NaN."""
    c = np.asarray(centroids, dtype=np.float64)
    have = np.flatnonzero(~np.isnan(c).any(axis=1)) if c.ndim == 2 else np.zeros(0, np.int64)
    if not len(have):
        return np.full(len(points), -1, np.int64), np.full(len(points), np.nan)
    dist = pairwise_distances(points, c[have], metric)
    best = np.argmin(dist, axis=1)
    return have[best].astype(np.int64), dist[np.arange(len(dist)), best]


def _first_appearance(raw: np.ndarray) -> np.ndarray:
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


def flat_clusters(z: np.ndarray, m: int, threshold: float | None = None,
                  n_clusters: int | None = None, max_clusters: int | None = None) -> np.ndarray:
    """The M leaves' cluster ids (0..C−1 by first appearance in client order).

    With `threshold`: every merge at height ≤ threshold is made. With `n_clusters`: C
    clusters. With neither: C at the largest gap of merge heights (`auto_n_clusters`,
    bounded by `max_clusters`).
    """
    from scipy.cluster.hierarchy import fcluster

    if threshold is not None and n_clusters is not None:
        raise ValueError("give a threshold or a number of clusters, not both")
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if m == 1:
        return np.zeros(1, dtype=np.int64)
    if threshold is not None:
        return _first_appearance(fcluster(z, t=float(threshold), criterion="distance"))
    c = n_clusters if n_clusters is not None else auto_n_clusters(z, max_clusters)
    return cut_tree(z, c, m)


def linkage_to_clusters(distances: np.ndarray, labels: np.ndarray,
                        method: Linkage = "average") -> np.ndarray:
    """`[M, C]` linkage distances of M new points to the C clusters of `labels`, from their
    `[M, N]` distances to the N clustered points (mean for "average" and "weighted", max for
    "complete", min for "single"; a cluster without members: +inf)."""
    d = np.asarray(distances, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.int64)
    c = int(lab.max(initial=-1)) + 1
    out = np.full((len(d), c), np.inf)
    if method not in ("average", "weighted", "complete", "single"):
        raise ValueError(f"linkage {method!r}; allowed: average, weighted, complete, single")
    for k in range(c):
        members = lab == k
        if not members.any() or not len(d):
            continue
        block = d[:, members]
        if method == "complete":
            out[:, k] = block.max(axis=1)
        elif method == "single":
            out[:, k] = block.min(axis=1)
        else:
            out[:, k] = block.mean(axis=1)
    return out



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


__all__ = ["LINKAGES", "MIN_SILHOUETTE", "Linkage", "Metric", "SilhouetteCut",
           "auto_n_clusters", "connected_groups", "cut_tree",
           "distance_linkage", "feature_linkage", "flat_clusters", "linkage_to_clusters",
           "nearest_centroid", "pairwise_distances", "silhouette_cut", "ward_linkage",
           "ward_nearest"]
