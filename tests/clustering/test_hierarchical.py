"""Ward hierarchical clustering of clients: the linkage against a naive agglomeration, the
automatic number of clusters against an exhaustive gap search, and the cut."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster.hierarchy import linkage
from sklearn.metrics import adjusted_rand_score

from clusterfl.clustering.hierarchical import (
    auto_n_clusters,
    connected_groups,
    cut_tree,
    feature_linkage,
    flat_clusters,
    ward_linkage,
)
from clusterfl.clustering.relatedness import min_distance_adjacency, threshold


def separated_points(sizes=(4, 3, 5), k=3, spread=0.05, seed=0):
    """Clients of group g have k points near centre 10·g (2-d), well separated groups."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    pts = 10.0 * truth[:, None, None] + spread * rng.normal(size=(len(truth), k, 2))
    return pts, truth


def naive_ward(x: np.ndarray) -> tuple[list[float], dict[int, list[frozenset[int]]]]:
    """Merge heights and the partition into C clusters (every C), by trying every pair.

    Ward's distance between clusters u, v (scipy's convention): sqrt(2|u||v|/(|u|+|v|)) ·
    ‖c_u − c_v‖, the square root of twice the increase of the within-cluster sum of squares.
    """
    clusters = [frozenset([i]) for i in range(len(x))]
    heights: list[float] = []
    partitions = {len(clusters): list(clusters)}
    while len(clusters) > 1:
        best = None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                u, v = clusters[a], clusters[b]
                cu, cv = x[list(u)].mean(0), x[list(v)].mean(0)
                d = np.sqrt(2 * len(u) * len(v) / (len(u) + len(v))) * np.linalg.norm(cu - cv)
                if best is None or d < best[0]:
                    best = (d, a, b)
        assert best is not None
        d, a, b = best
        merged = clusters[a] | clusters[b]
        clusters = [c for i, c in enumerate(clusters) if i not in (a, b)] + [merged]
        heights.append(float(d))
        partitions[len(clusters)] = list(clusters)
    return heights, partitions


def as_partition(labels: np.ndarray) -> set[frozenset[int]]:
    return {frozenset(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)}


@pytest.mark.parametrize("seed", range(4))
def test_ward_linkage_and_cut_equal_naive_agglomeration(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(9, 3))
    z = ward_linkage(x)
    heights, partitions = naive_ward(x)
    assert z.shape == (8, 4)
    np.testing.assert_allclose(z[:, 2], heights, rtol=1e-10)
    for c in range(1, 10):
        labels = cut_tree(z, c, 9)
        assert as_partition(labels) == set(partitions[c])
        _, first = np.unique(labels, return_index=True)
        assert labels[np.sort(first)].tolist() == list(range(c))  # numbered by first appearance


def test_ward_linkage_and_cut_of_tiny_inputs():
    assert ward_linkage(np.zeros((1, 3))).shape == (0, 4)
    assert ward_linkage(np.zeros((0, 3))).shape == (0, 4)
    assert cut_tree(np.zeros((0, 4)), 3, 0).shape == (0,)
    assert cut_tree(np.zeros((0, 4)), 3, 1).tolist() == [0]
    z = ward_linkage(np.array([[0.0], [1.0], [5.0]]))
    assert cut_tree(z, 1, 3).tolist() == [0, 0, 0]
    assert cut_tree(z, 7, 3).tolist() == [0, 1, 2]  # more clusters than clients: singletons
    np.testing.assert_array_equal(z, linkage(np.array([[0.0], [1.0], [5.0]]), method="ward"))


def test_cut_into_c_clusters_when_merge_heights_tie():
    """Four clients at equal distances (a regular simplex, ‖e_i − e_j‖ = √2): every merge
    height ties (Ward's too: √(2·2·1/3)·√(3/2) = √2). Asked for C clusters, the cut has C
    (scipy's `fcluster(maxclust)` finds no height giving 2 or 3 and returned 1), each the
    cut into C + 1 with two clusters merged, as agglomeration stopped at C clusters."""
    x = np.eye(4)
    for method in ("ward", "average", "complete", "single"):
        z = feature_linkage(x, "euclidean", method)
        np.testing.assert_allclose(z[:, 2], [np.sqrt(2.0)] * 3)
        parts = {c: as_partition(cut_tree(z, c, 4)) for c in range(1, 5)}
        assert [len(parts[c]) for c in range(1, 5)] == [1, 2, 3, 4]
        for c in range(1, 4):
            assert all(any(p <= q for q in parts[c]) for p in parts[c + 1])
        assert len(set(flat_clusters(z, 4, n_clusters=2).tolist())) == 2
        assert flat_clusters(z, 4).tolist() == [0, 0, 0, 0]  # no gap anywhere: one cluster
        assert auto_n_clusters(z) == 1
    # two pairs of identical clients: 3 clusters asked, 3 given (one pair stays merged)
    z = feature_linkage(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]))
    labels = cut_tree(z, 3, 4)
    assert len(set(labels.tolist())) == 3 and labels[0] == 0
    assert labels[0] == labels[1] or labels[2] == labels[3]


def brute_force_n_clusters(heights: np.ndarray, max_clusters: int | None) -> int:
    """Every cut between consecutive sorted heights h_j < h_{j+1} (j ≥ 1) gives M − j clusters;
    the largest gap wins, ties to fewer clusters; only cuts with ≤ max_clusters clusters."""
    h = np.sort(heights)
    m = len(h) + 1
    cuts = [(h[j] - h[j - 1], -(m - j)) for j in range(1, m - 1)
            if max_clusters is None or m - j <= max_clusters]
    if not cuts or (max_clusters is not None and max_clusters < 2):
        return 1
    return -max(cuts)[1]


@pytest.mark.parametrize("seed", range(30))
def test_auto_n_clusters_equals_exhaustive_gap_search(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(3, 12))
    z = ward_linkage(rng.normal(size=(m, 2)) + 6.0 * rng.integers(0, 3, (m, 1)))
    bound = None if seed % 3 == 0 else int(rng.integers(1, m + 1))
    assert auto_n_clusters(z, bound) == brute_force_n_clusters(z[:, 2], bound)


@pytest.mark.parametrize("sizes", [(4, 3, 5), (2, 2, 2, 2, 2), (6, 6)])
def test_automatic_number_of_clusters_on_separated_clients(sizes):
    pts, truth = separated_points(sizes)
    related = threshold(min_distance_adjacency(pts), 1.0)
    z = ward_linkage(related)
    c = auto_n_clusters(z)
    assert c == len(sizes)
    labels = cut_tree(z, c, len(truth))
    assert adjusted_rand_score(truth, labels) == 1.0
    assert labels[0] == 0  # numbered by first appearance


def test_automatic_number_of_clusters_edge_cases():
    pts, _ = separated_points((3, 3, 3, 3))
    z = ward_linkage(threshold(min_distance_adjacency(pts), 1.0))
    assert auto_n_clusters(z, max_clusters=2) == 2  # bounded search
    assert auto_n_clusters(z, max_clusters=1) == 1
    assert auto_n_clusters(ward_linkage(np.ones((6, 6)))) == 1  # nothing to split
    assert auto_n_clusters(ward_linkage(np.array([[0.0], [5.0]]))) == 2
    assert auto_n_clusters(ward_linkage(np.array([[0.0], [5.0]])), max_clusters=1) == 1
    assert auto_n_clusters(ward_linkage(np.zeros((1, 2)))) == 1
    # raw distances as profiles (PCA+kM+HC without threshold) also find the groups
    a = min_distance_adjacency(separated_points((3, 4, 3))[0])
    assert auto_n_clusters(ward_linkage(a)) == 3


def _partial_blocks(sizes: list[int], fill: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """0/1 symmetric relatedness: each group a random block about `fill` full, kept connected
    by a chain through its members; no link between groups."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    same = truth[:, None] == truth[None, :]
    upper = np.triu(rng.random(same.shape) < fill, 1)
    r = (upper | upper.T) & same
    for i in range(len(truth) - 1):
        if truth[i] == truth[i + 1]:
            r[i, i + 1] = r[i + 1, i] = True
    np.fill_diagonal(r, True)
    return r.astype(np.int64), truth


def test_connected_groups_recover_partly_filled_blocks():
    r, truth = _partial_blocks([20, 20, 20, 20, 20], fill=0.45, seed=0)
    perm = np.random.default_rng(1).permutation(len(truth))
    labels = connected_groups(r[np.ix_(perm, perm)])
    assert adjusted_rand_score(truth[perm], labels) == 1.0
    assert labels[0] == 0 and set(labels) == set(range(5))  # numbered by first appearance


def test_connected_groups_merge_linked_groups_and_check_the_shape():
    r, _ = _partial_blocks([6, 6, 6], fill=0.5, seed=2)
    r[0, 7] = 1  # one link from group 0 to group 1 (read as undirected)
    labels = connected_groups(r)
    np.testing.assert_array_equal(labels, np.repeat([0, 0, 1], 6))
    np.testing.assert_array_equal(connected_groups(np.eye(3)), [0, 1, 2])
    assert len(connected_groups(np.zeros((0, 0)))) == 0
    with pytest.raises(ValueError, match="square"):
        connected_groups(np.ones((2, 3)))
