"""Cosine-similarity tools of Clustered Federated Learning (Sattler et al., IEEE TNNLS 2020).

Server-side math only; `clusterfl.algorithms.cfl` builds the method on top of it.

- `pairwise_cosine`: α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖ ‖Δθ_j‖), eq. (13) / (40), for all pairs at
  once (one normalised matrix product in float64, so permuted and plain updates give the same
  matrix up to the last bits, eq. (41)).
- `optimal_bipartition`: Algorithm 1. Pairs are merged in order of decreasing similarity until
  two groups remain; this is single linkage and returns the bipartition of eq. (23)/(33), the
  one that minimises the maximal cross-cluster similarity α_cross^max.
- `complete_linkage_bipartition`: what the authors' released code does instead
  (agglomerative clustering with complete linkage on −α, here 1 − α, which merges in the same
  order); scikit-learn does the clustering.
- `separation_gap`: g(α) = α_intra^min − α_cross^max, Definition 2, eq. (26)-(27), given the
  true clusters (diagnostics only).
- `gamma_bound` / `gamma_criterion`: the accept rule of Algorithm 3 line 6 / Algorithm 5 line 18,
  sqrt((1 − α_cross^max)/2) > γ_max, eq. (36).

Quantities of our scale-free split rule (`split_rule = "auto"` of CFL; not in the paper, built
from the paper's quantities):
- `stationarity_ratio`: ‖Σ_i w_i Δθ_i‖ / Σ_i w_i ‖Δθ_i‖ (weights normalised), the norm of the
  cluster's mean update (eq. (30)'s ‖Δθ_c‖) relative to the mean client update norm (eq. (31)'s
  ‖Δθ_i‖). It lies in [0, 1] by the triangle inequality, is 1 when all updates point the same
  way and falls towards 0 at a stationary point of the cluster's FL objective whose clients
  still move (the situation eqs. (30)-(31) describe with absolute thresholds).
- `cohesion`: the mean similarity within each side of a bipartition and across it (the means
  of the entries whose extremes α_intra^min and α_cross^max define the separation gap).
- `shuffle_pvalue`: how often Algorithm 1 (or complete linkage, where it found the cut), run
  on the same matrix with its off-diagonal entries shuffled (the same similarity values with
  no client structure), finds a bipartition at least as contrasting (`Cohesion.contrast`) as
  the observed one: a permutation test of "these clients come from one distribution" that
  corrects for Algorithm 1 choosing the cut.
  No scale enters: the null is made of the matrix's own values.

Choices the paper leaves open, made here:
- A zero update (a client without data or a vanished update) has similarity 0 to every other
  client and 1 to itself.
- Algorithm 1 reads the full M×M matrix; an entry (i, j) merges i and j whichever of α_ij and
  α_ji is reached first, so a non-symmetric input is treated as max(α, αᵀ). Diagonal entries
  merge nothing and are skipped. Ties are broken by the position of the pair (row-major), so
  the result is deterministic.
- α_intra^min follows eq. (19) literally: the minimum over pairs (i, j) with I(i) = I(j),
  i = j included (α_ii = 1). It is therefore 1 when no two clients share a distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import torch
from scipy.stats import combine_pvalues

BipartitionMethod = Literal["optimal", "complete"]


@dataclass(frozen=True)
class Bipartition:
    """Two groups of positions (sorted; `first` holds the smallest position) and α_cross^max."""

    first: np.ndarray
    second: np.ndarray
    max_cross: float

    def labels(self, n: int) -> np.ndarray:
        """0/1 group of each of the n positions."""
        out = np.zeros(n, dtype=np.int64)
        out[self.second] = 1
        return out


def pairwise_cosine(updates: torch.Tensor | np.ndarray) -> np.ndarray:
    """`[n, n]` cosine similarities of the rows of `updates` (`[n, d]`), float64 in [-1, 1].

    Rows of zero norm have similarity 0 to all other rows; the diagonal is 1.
    """
    u = torch.as_tensor(updates).to(torch.float64)
    if u.ndim != 2:
        raise ValueError(f"updates must be [n, d], got shape {tuple(u.shape)}")
    norms = torch.linalg.vector_norm(u, dim=1)
    unit = u / torch.where(norms > 0, norms, torch.ones_like(norms))[:, None]
    sim = (unit @ unit.T).clamp_(-1.0, 1.0).cpu().numpy().copy()  # [n, n]: small
    np.fill_diagonal(sim, 1.0)
    return sim


def _check_square(sim: np.ndarray) -> np.ndarray:
    a = np.asarray(sim, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"similarity must be a square matrix, got shape {a.shape}")
    if a.shape[0] < 2:
        raise ValueError("a bipartition needs at least 2 clients")
    return a


def max_cross_similarity(sim: np.ndarray, first: np.ndarray, second: np.ndarray) -> float:
    """max_{i ∈ first, j ∈ second} α_ij (both orientations of a non-symmetric matrix)."""
    a = np.asarray(sim, dtype=np.float64)
    i, j = np.asarray(first, np.int64), np.asarray(second, np.int64)
    return float(max(a[np.ix_(i, j)].max(), a[np.ix_(j, i)].max()))


def _ordered(labels: np.ndarray, sim: np.ndarray) -> Bipartition:
    """Turn 0/1-style labels into a Bipartition whose first group holds position 0."""
    first = np.flatnonzero(labels == labels[0])
    second = np.flatnonzero(labels != labels[0])
    return Bipartition(first, second, max_cross_similarity(sim, first, second))


def optimal_bipartition(sim: np.ndarray) -> Bipartition:
    """Algorithm 1: the bipartition minimising the maximal cross similarity, eq. (23).

    Kruskal-style: visit the pairs by decreasing similarity and merge the groups of the two
    clients (union-find) until two groups remain. O(M² log M).
    """
    a = _check_square(sim)
    n = a.shape[0]
    sym = np.maximum(a, a.T)
    rows, cols = np.triu_indices(n, k=1)
    order = np.argsort(-sym[rows, cols], kind="stable")
    parent = np.arange(n)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    groups = n
    for k in order:
        ri, rj = root(int(rows[k])), root(int(cols[k]))
        if ri == rj:
            continue
        if groups == 2:
            break
        parent[max(ri, rj)] = min(ri, rj)
        groups -= 1
    labels = np.array([root(i) for i in range(n)])
    return _ordered(labels, a)


def complete_linkage_bipartition(sim: np.ndarray) -> Bipartition:
    """The authors' code: complete-linkage agglomerative clustering into two groups.

    scikit-learn's `AgglomerativeClustering` on the precomputed distance 1 − α (the code uses
    −α; a constant shift does not change complete linkage).
    """
    from sklearn.cluster import AgglomerativeClustering

    a = _check_square(sim)
    sym = np.maximum(a, a.T)
    dist = np.clip(1.0 - sym, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    labels = AgglomerativeClustering(
        n_clusters=2, metric="precomputed", linkage="complete"
    ).fit_predict(dist)
    return _ordered(np.asarray(labels), a)


def bipartition(sim: np.ndarray, method: BipartitionMethod = "optimal") -> Bipartition:
    """Split by `method`: "optimal" (Algorithm 1, the paper) or "complete" (authors' code)."""
    if method == "optimal":
        return optimal_bipartition(sim)
    if method == "complete":
        return complete_linkage_bipartition(sim)
    raise ValueError(f"unknown bipartition method {method!r}; use 'optimal' or 'complete'")


def intra_min_similarity(sim: np.ndarray, true_labels: np.ndarray) -> float:
    """α_intra^min of eq. (19): the least similarity between clients of one distribution."""
    a = np.asarray(sim, dtype=np.float64)
    lab = np.asarray(true_labels)
    same = lab[:, None] == lab[None, :]
    np.fill_diagonal(same, False)
    return float(min(1.0, a[same].min())) if same.any() else 1.0


def separation_gap(sim: np.ndarray, true_labels: np.ndarray) -> float:
    """g(α) = α_intra^min − α_cross^max (Definition 2); NaN for fewer than two clients.

    `g > 0` guarantees that the optimal bipartition is correct (Corollary 1). Uses the true
    clusters, so it is a diagnostic, never an input to a decision.
    """
    a = np.asarray(sim, dtype=np.float64)
    if a.shape[0] < 2:
        return math.nan
    return intra_min_similarity(a, true_labels) - optimal_bipartition(a).max_cross


def stationarity_ratio(updates: torch.Tensor | np.ndarray,
                       weights: np.ndarray | None = None) -> float:
    """‖Σ w_i Δθ_i‖ / Σ w_i ‖Δθ_i‖ of the rows of `updates` (`[n, d]`), in [0, 1].

    `weights` (default: equal) need not sum to 1. NaN when every update is zero (or all weights
    are). Computed in float64.
    """
    u = torch.as_tensor(updates).to(torch.float64)
    if u.ndim != 2:
        raise ValueError(f"updates must be [n, d], got shape {tuple(u.shape)}")
    w = torch.ones(u.shape[0], dtype=torch.float64, device=u.device) if weights is None else \
        torch.as_tensor(np.asarray(weights, dtype=np.float64), device=u.device)
    if w.shape != (u.shape[0],) or bool((w < 0).any()):
        raise ValueError("weights must be one non-negative number per row")
    spread = float((w * torch.linalg.vector_norm(u, dim=1)).sum())
    if spread <= 0.0:
        return math.nan
    return min(1.0, float(torch.linalg.vector_norm(w @ u)) / spread)


@dataclass(frozen=True)
class Cohesion:
    """Mean similarities of a bipartition: within each side (over pairs i ≠ j; NaN for a side
    of one) and across the two sides."""

    within_first: float
    within_second: float
    cross: float
    size_first: int = 0  # clients on each side (0: not given)
    size_second: int = 0

    @property
    def within_min(self) -> float:
        """The smaller of the two within-side means (NaN if a side has one member)."""
        if math.isnan(self.within_first) or math.isnan(self.within_second):
            return math.nan
        return min(self.within_first, self.within_second)

    @property
    def contrast(self) -> float:
        """How far apart the two sides' mean directions are, beyond what their sizes alone give.

        With unit updates u_i and side means ū_A, ū_B (a and b clients), ‖ū_A‖² =
        (1 + (a − 1) ᾱ_A) / a and ū_A · ū_B = ᾱ_×, so D² = ‖ū_A − ū_B‖² follows from the three
        means. Updates without any common direction (pairwise orthogonal: noise in many
        dimensions) give D² = 1/a + 1/b. The contrast is D² / (1/a + 1/b) − 1: 0 for such
        updates, large when each side shares a direction the other does not; it grows with
        the side sizes, as a two-sample statistic does. NaN without sizes.
        """
        a, b = self.size_first, self.size_second
        if a < 1 or b < 1:
            return math.nan
        wa = 0.0 if a == 1 else (a - 1) * self.within_first
        wb = 0.0 if b == 1 else (b - 1) * self.within_second
        d2 = (1 + wa) / a + (1 + wb) / b - 2 * self.cross
        return d2 / (1 / a + 1 / b) - 1


def _within_mean(a: np.ndarray, idx: np.ndarray) -> float:
    if len(idx) < 2:
        return math.nan
    block = a[np.ix_(idx, idx)]
    return float((block.sum() - np.trace(block)) / (len(idx) * (len(idx) - 1)))


def cohesion(sim: np.ndarray, first: np.ndarray, second: np.ndarray) -> Cohesion:
    """Within-side and cross mean similarities of the bipartition (`first`, `second`).

    Means over ordered pairs, so a non-symmetric matrix counts both α_ij and α_ji.
    """
    a = np.asarray(sim, dtype=np.float64)
    i, j = np.asarray(first, np.int64), np.asarray(second, np.int64)
    if len(i) == 0 or len(j) == 0:
        raise ValueError("both sides of a bipartition need at least one client")
    cross = float((a[np.ix_(i, j)].sum() + a[np.ix_(j, i)].sum()) / (2 * len(i) * len(j)))
    return Cohesion(_within_mean(a, i), _within_mean(a, j), cross, len(i), len(j))


def single_linkage_labels(sim: np.ndarray) -> np.ndarray:
    """0/1 labels of Algorithm 1's bipartition, computed as a maximum spanning tree (Prim's
    algorithm on the dense matrix, n vectorised steps) without its weakest edge: single
    linkage cut at two groups, the same cut as `optimal_bipartition` when no two
    similarities tie. Fast enough to be run a few hundred times a round (about 50 µs for 20
    clients). Label 0 is the group of position 0."""
    a = _check_square(sim)
    return _single_linkage_side(np.maximum(a, a.T)).astype(np.int64)


def _single_linkage_side(sym: np.ndarray) -> np.ndarray:
    """`single_linkage_labels` of a symmetric matrix, unchecked: True for the side without
    position 0."""
    n = sym.shape[0]
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    best = sym[0].copy()  # strongest link of each outside node into the tree ...
    parent = np.zeros(n, dtype=np.int64)  # ... and the tree node it links to
    order = [0]
    link = np.full(n, np.inf)  # similarity of the edge that brought each node in
    for _ in range(n - 1):
        v = int(np.argmax(np.where(in_tree, -np.inf, best)))
        in_tree[v] = True
        link[v] = best[v]
        order.append(v)
        closer = ~in_tree & (sym[v] > best)
        best[closer] = sym[v][closer]
        parent[closer] = v
    cut = int(np.argmin(link))  # the weakest tree edge joins `cut` to its parent
    side = np.zeros(n, dtype=bool)
    for v in order[1:]:  # parents come first in Prim's order
        side[v] = v == cut or side[parent[v]]
    return side


SHUFFLE_MIN = 5
"""The fewest clients whose shuffle test can pass some level below 0.2: with four (six
cosines) a 2 | 2 cut is the best of three ways to place its two within cosines, so its
p-value is never below 0.2; five never go below 1 / 84 (`shuffle_floor`)."""

SHUFFLE_DRAWS = 999
"""Shuffled matrices of a shuffle test by default (the smallest p-value is 1 / 1000)."""

SHUFFLE_DRAWS_RANGE = (19, 99_999)
"""The fewest and most shuffles a test may draw: p-values from 1 / 20 = 0.05 down to 1e-5; a
draw is one more cut of the cluster's matrix (about 50 µs for 20 clients), so the most cost a
few seconds per cluster and round."""

TIE = 1e-9
"""A shuffled contrast within this of the observed one reaches it (`shuffle_pvalue`). A
shuffle that puts the same cosines within and between the blocks of a cut has the observed
contrast, summed in another order: 1e-16 above or below it. Counted only when rounding put it
at or above, such a draw decided p = 0.001 or 0.002 for six clients, against a level of
0.002: FL+HC's cut of the same run differed between the sequential and simulation backends
(their updates agree to 1e-8)."""


def _complete_linkage_side(sym: np.ndarray) -> np.ndarray:
    """The complete-linkage cut into two groups (`complete_linkage_bipartition`'s method, on
    the distance 1 − α) of a symmetric matrix, unchecked: True for the side without position
    0. SciPy's linkage (about 0.3 ms for 20 clients; scikit-learn's, which the observed cut
    uses, takes 50 ms, too slow for hundreds of shuffles): the two give the same cut but where
    distances tie."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    n = sym.shape[0]
    dist = np.clip(1.0 - sym, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    merges = linkage(squareform(dist, checks=False), method="complete")
    side, stack = np.zeros(n, dtype=bool), [int(merges[-1, 1])]  # one of the last two groups
    while stack:
        k = stack.pop()
        if k < n:
            side[k] = True
        else:
            stack.extend(int(c) for c in merges[k - n, :2])
    return side if not side[0] else ~side


def shuffle_pvalue(sim: np.ndarray, observed: float, draws: int,
                   rng: np.random.Generator, method: BipartitionMethod = "optimal") -> float:
    """Permutation p-value of a bipartition's contrast `observed` on the similarity matrix
    `sim` (n ≥ 3, symmetric): (1 + k) / (1 + draws), with k the number of `draws` matrices
    made of `sim`'s off-diagonal entries in a random order whose bipartition by `method`
    (Algorithm 1, `single_linkage_labels`; "complete": complete linkage, the bipartition the
    observed cut was found by) has a contrast ≥ `observed` (a tie within `TIE` counts).

    If the entries were exchangeable (which pair of clients has which similarity is chance)
    the shuffled matrices would be as likely as the observed one and the p-value uniform on
    its grid. Clients of one distribution come close: their differences are independent
    noise, except that clients aligned better or worse with the common direction have all
    their similarities a little higher or lower, which leans p-values a little small
    (`tests/clustering/test_cosine.py`: 1-10 % below 0.05). Clients of several
    distributions give a block structure that shuffling destroys. Comparing the contrast
    of Algorithm 1's cut on both sides accounts for the cut being chosen (a statistic of a
    fixed partition would not). The smallest value is 1 / (1 + draws); with four clients
    (six entries) a 2 | 2 cut is never below 0.2 (its two within entries are the two largest
    in a fifth of the orders)."""
    a = _check_square(sim)
    n = a.shape[0]
    if n < 3:
        raise ValueError("a shuffle test needs at least 3 clients")
    rows, cols = np.triu_indices(n, k=1)
    values = np.maximum(a, a.T)[rows, cols]
    shuffled = np.eye(n)
    hits = 0
    for _ in range(draws):
        v = values[rng.permutation(len(values))]
        shuffled[rows, cols] = v
        shuffled[cols, rows] = v
        side = _single_linkage_side(shuffled) if method == "optimal" else \
            _complete_linkage_side(shuffled)
        hits += bool(_block_cohesion(shuffled, side).contrast >= observed - TIE)
    return (1 + hits) / (1 + draws)


def shuffle_floor(n: int) -> float:
    """The smallest exact p-value of `shuffle_pvalue` for `n` clients (n ≥ 3), whatever their
    cosines: the chance a random order of the matrix's m = n(n − 1)/2 entries reaches the
    observed contrast cannot fall below it (the estimate (1 + k) / (1 + draws) from finitely
    many draws falls below it only by the luck of the draws).

    Why: among all orders of the entries, the most contrasting cut (a | b clients, a ≤ b)
    puts the largest a(a − 1)/2 entries within the smaller side, the next b(b − 1)/2 within
    the other and the rest across (the contrast weighs an entry 2/a², 2/b² and −2/(ab)
    there; with a = b only the sum within counts), and Algorithm 1 finds that cut. Every order
    that only relabels the clients or moves entries inside those three blocks has the same
    contrast, so it reaches any observed contrast: C(n, a) · W_a! · W_b! · (ab)! of the m!
    orders (with a = b, C(n, a)/2 · W! · (ab)!, W = W_a + W_b). The floor is the least of
    these shares over a = 1 … n/2: 0.2 for 4 clients, 0.0119 for 5, 3.3e-4 for 6 (a bound:
    measured minima are higher from 6 on, as other orders also reach the cut)."""
    if n < 3:
        raise ValueError("a shuffle test needs at least 3 clients")
    if n > SHUFFLE_FLOOR_EXACT:
        return 0.0  # below 1e-180 from 30 clients on
    m = n * (n - 1) // 2

    def share(a: int) -> Fraction:  # exact: orders of the entries over their blocks' orders
        b = n - a
        wa, wb = a * (a - 1) // 2, b * (b - 1) // 2
        blocks = math.comb(m, wa + wb) if a == b else math.comb(m, wa) * math.comb(m - wa, wb)
        return Fraction(math.comb(n, a), blocks * (2 if a == b else 1))

    return float(min(share(a) for a in range(1, n // 2 + 1)))


SHUFFLE_FLOOR_EXACT = 40
"""`shuffle_floor` is computed exactly up to this many clients (0 beyond: it underflows)."""


def combined_pvalue(p_values: Sequence[float]) -> float:
    """Fisher's combination of independent p-values (−2 Σ ln p against χ² with 2m degrees of
    freedom; `scipy.stats.combine_pvalues`); NaN for none, 0 if one is 0."""
    if not p_values:
        return math.nan
    if min(p_values) <= 0:
        return 0.0
    return float(combine_pvalues(p_values, method="fisher").pvalue)


def combined_floor(sizes: Sequence[int]) -> float:
    """The smallest exact p-value of Fisher's combination of shuffle tests of rounds in which
    `sizes` clients answered (each ≥ 2; two clients have one cosine: p = 1): Fisher's p falls
    as any of its p-values falls, so it is least with each at its round's `shuffle_floor`."""
    return combined_pvalue([shuffle_floor(n) if n > 2 else 1.0 for n in sizes])


def structure_pvalue(sim: np.ndarray, draws: int, rng: np.random.Generator) -> float:
    """Whether clients show groups at all: the `shuffle_pvalue` of the contrast of
    Algorithm 1's cut (`optimal_bipartition`) of their similarities `sim` (n ≥ 3)."""
    split = optimal_bipartition(sim)
    return shuffle_pvalue(sim, cohesion(sim, split.first, split.second).contrast, draws, rng)


def shuffle_structured(sim: np.ndarray, significance: float, min_silhouette: float,
                       test_every: bool = True) -> Callable[[np.ndarray, float], bool]:
    """`silhouette_cut`'s `structured` rule by the shuffle test: a cluster (its `leaves`,
    positions in `sim`) shows groups when `structure_pvalue` of its members' similarities,
    `SHUFFLE_DRAWS` shuffles seeded by the sorted members, is below `significance`; a
    cluster of fewer than `SHUFFLE_MIN` clients (or, with `test_every` off, any but the
    whole) when its best cut's silhouette `score` reaches `min_silhouette`."""
    everyone = len(sim)

    def structured(leaves: np.ndarray, score: float) -> bool:
        if len(leaves) < SHUFFLE_MIN or (not test_every and len(leaves) < everyone):
            return score >= min_silhouette
        rng = np.random.default_rng(np.sort(leaves))
        return structure_pvalue(sim[np.ix_(leaves, leaves)], SHUFFLE_DRAWS,
                                rng) < significance
    return structured


def both_structured(sim: np.ndarray, significance: float, min_silhouette: float,
                    test_every: bool = True) -> Callable[[np.ndarray, float], bool] | None:
    """A cluster shows groups when its best cut's silhouette reaches `min_silhouette` and,
    with `significance` > 0, the shuffle test of its members' similarities `sim` agrees
    (`shuffle_structured`, with its `test_every`; below `SHUFFLE_MIN` members the bound
    alone). None (the bound alone, `silhouette_cut`'s default) without a significance."""
    if not significance:
        return None
    test = shuffle_structured(sim, significance, min_silhouette, test_every)
    return lambda leaves, score: score >= min_silhouette and test(leaves, score)


def profile_similarity(distances: np.ndarray) -> np.ndarray:
    """How alike the rows of `distances` (`[M, M]`, every client's distances to all) are:
    their Euclidean distances, from one matrix product (‖a‖² + ‖b‖² − 2 a·b, clipped at 0),
    as similarities (`distance_similarity`). Two clients of one group lie at about the same
    distances from everyone else, whatever their own noise, so the rows show groups more
    plainly than the distances themselves (FL+HC's rule v4, docs/transfer.md)."""
    x = np.asarray(distances, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    d = np.sqrt(np.maximum(d2, 0.0))
    np.fill_diagonal(d, 0.0)
    return distance_similarity((d + d.T) / 2.0)


def distance_similarity(distances: np.ndarray) -> np.ndarray:
    """Distances (`[M, M]`, symmetric, ≥ 0) as similarities for the shuffle test: 1 − d /
    max d with a unit diagonal. Algorithm 1's cut and a cut's contrast relative to the
    shuffled ones do not change under any increasing affine map of the off-diagonal entries,
    so the distances' scale does not matter."""
    d = np.asarray(distances, dtype=np.float64)
    top = float(d.max()) if d.size else 0.0
    sim = 1.0 - d / top if top > 0 else np.ones_like(d)
    np.fill_diagonal(sim, 1.0)
    return sim


def _block_cohesion(sim: np.ndarray, second: np.ndarray) -> Cohesion:
    """`cohesion` of the bipartition (not `second`, `second`) of a symmetric matrix with unit
    diagonal, from its block sums (no index copies: the shuffle test's inner loop)."""
    onehot = np.stack([~second, second], axis=1).astype(np.float64)
    sums = onehot.T @ sim @ onehot
    a, b = (int(k) for k in onehot.sum(axis=0))

    def within(total: float, k: int) -> float:
        return math.nan if k < 2 else (total - k) / (k * (k - 1))

    return Cohesion(within(sums[0, 0], a), within(sums[1, 1], b), float(sums[0, 1] / (a * b)),
                    a, b)


def gamma_bound(alpha_cross_max: float) -> float:
    """sqrt((1 − α_cross^max) / 2): the largest γ_max for which a split is accepted, eq. (36)."""
    return math.sqrt(max(0.0, 1.0 - float(alpha_cross_max)) / 2.0)


def gamma_criterion(alpha_cross_max: float, gamma_max: float) -> bool:
    """Algorithm 5 line 18: accept the bipartition iff γ_max < sqrt((1 − α_cross^max)/2)."""
    return gamma_bound(alpha_cross_max) > gamma_max


def cross_cosine(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> np.ndarray:
    """`[n_a, n_b]` cosine similarities between the rows of `a` and the rows of `b` (float64).

    Used by Algorithm 4 (placing a new client): its update against the cached updates Δ_e.
    Zero rows have similarity 0.
    """
    u = torch.as_tensor(a).to(torch.float64)
    v = torch.as_tensor(b).to(torch.float64)
    if u.ndim != 2 or v.ndim != 2 or u.shape[1] != v.shape[1]:
        raise ValueError(f"need [n_a, d] and [n_b, d], got {tuple(u.shape)} and {tuple(v.shape)}")

    def unit(x: torch.Tensor) -> torch.Tensor:
        n = torch.linalg.vector_norm(x, dim=1)
        return x / torch.where(n > 0, n, torch.ones_like(n))[:, None]

    return (unit(u) @ unit(v.to(u.device)).T).clamp_(-1.0, 1.0).cpu().numpy().copy()
