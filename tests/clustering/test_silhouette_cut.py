"""The silhouette cut of a dendrogram (`silhouette_cut`), the automatic cut of FL+HC, PACFL,
FLT and PCA+kM+HC: every cut's score against a brute-force silhouette written from its
definition (Rousseeuw 1987), the choice of C, the bound under which there is no structure,
and the cases with nothing to cut."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfl.clustering.hierarchical import (
    MIN_SILHOUETTE,
    cut_tree,
    distance_linkage,
    feature_linkage,
    pairwise_distances,
    silhouette_cut,
)


def brute_silhouette(d: np.ndarray, labels: np.ndarray) -> float:
    """Mean over points of (b − a) / max(a, b): a the mean distance to the other members of
    the own cluster, b the least mean distance to another cluster; 0 for a singleton."""
    out = []
    for i in range(len(d)):
        own = (labels == labels[i]) & (np.arange(len(d)) != i)
        if not own.any():
            out.append(0.0)
            continue
        a = d[i, own].mean()
        b = min(d[i, labels == c].mean() for c in set(labels.tolist()) if c != labels[i])
        out.append((b - a) / max(a, b))
    return float(np.mean(out))


def blobs(rng: np.random.Generator, sizes: list[int], spread: float, dim: int = 50) -> np.ndarray:
    centres = rng.normal(0.0, 10.0, (len(sizes), dim))
    return np.concatenate([rng.normal(c, spread, (n, dim)) for c, n in zip(centres, sizes)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_score_is_the_brute_force_silhouette_of_its_cut(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = blobs(rng, [4, 5, 3], 2.0)
    z, d = feature_linkage(x), pairwise_distances(x, x)
    cut = silhouette_cut(z, d)
    assert sorted(cut.scores) == list(range(2, len(x)))
    for c, score in cut.scores.items():
        assert score == pytest.approx(brute_silhouette(d, cut_tree(z, c, len(x))))
    assert cut.best == max(cut.scores, key=lambda c: cut.scores[c])


@pytest.mark.parametrize(("sizes", "spread"), [([5, 5, 5, 5], 0.5), ([9, 3], 0.5),
                                               ([10, 2, 6], 1.0), ([2, 2], 0.1)])
def test_separated_groups_are_found_whatever_their_sizes(sizes: list[int],
                                                        spread: float) -> None:
    x = blobs(np.random.default_rng(7), sizes, spread)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    cut = silhouette_cut(feature_linkage(x), pairwise_distances(x, x))
    assert cut.n_clusters == len(sizes)
    assert (cut.labels == truth).all()  # numbered by first appearance, as the truth is


@pytest.mark.parametrize("m", [8, 20, 60])
def test_no_structure_stays_one_cluster(m: int) -> None:
    """iid points: every cut scores far below 0.5 (the largest-gap rule would cut)."""
    x = np.random.default_rng(m).normal(size=(m, 50))
    cut = silhouette_cut(feature_linkage(x), pairwise_distances(x, x))
    assert cut.n_clusters == 1 and (cut.labels == 0).all()
    assert max(cut.scores.values()) < MIN_SILHOUETTE


def test_the_bound_and_max_clusters() -> None:
    x = blobs(np.random.default_rng(3), [4, 4, 4], 1.0)
    z, d = feature_linkage(x), pairwise_distances(x, x)
    found = silhouette_cut(z, d)
    assert found.n_clusters == 3
    high = silhouette_cut(z, d, min_silhouette=found.scores[3] + 1e-9)
    assert high.n_clusters == 1 and high.best == 3  # the best C is kept for the record
    two = silhouette_cut(z, d, max_clusters=2)
    assert sorted(two.scores) == [2]
    assert two.n_clusters == (2 if two.scores[2] >= MIN_SILHOUETTE else 1)


def test_distance_matrix_input_as_pacfl_gives_it() -> None:
    """PACFL's proximity matrix (degrees), average linkage: two pairs far apart."""
    a = np.array([[0, 2, 30, 40], [2, 0, 35, 45], [30, 35, 0, 3], [40, 45, 3, 0]], float)
    cut = silhouette_cut(distance_linkage(a, "average"), a)
    assert cut.labels.tolist() == [0, 0, 1, 1]
    assert cut.scores[2] == pytest.approx(brute_silhouette(a, np.array([0, 0, 1, 1])))


@pytest.mark.parametrize("m", [0, 1, 2])
def test_too_few_clients_to_score_a_cut(m: int) -> None:
    x = np.arange(float(m * 2)).reshape(m, 2)
    cut = silhouette_cut(feature_linkage(x), pairwise_distances(x, x))
    assert cut.n_clusters == (1 if m else 0) and cut.scores == {}


def test_all_equal_points_are_one_cluster() -> None:
    x = np.ones((5, 3))
    cut = silhouette_cut(feature_linkage(x), pairwise_distances(x, x))
    assert cut.n_clusters == 1 and cut.scores == {}


def test_a_hierarchy_of_groups_is_followed_to_its_finest_level() -> None:
    """Two far pairs of close groups (the demo federation's shape under PACFL: 0° and 180°
    close, 90° and 270° close, the pairs far apart): the whole tree's best cut is the two
    pairs; each pair, examined on its own distances, splits into its two groups; each group
    of five, noise only, stays."""
    rng = np.random.default_rng(11)
    dim = 50
    far = rng.normal(0.0, 40.0, (2, dim))
    centres = [far[0], far[0] + rng.normal(0, 4.0, dim), far[1], far[1] + rng.normal(0, 4.0, dim)]
    x = np.concatenate([rng.normal(c, 0.2, (5, dim)) for c in centres])
    z, d = feature_linkage(x), pairwise_distances(x, x)
    cut = silhouette_cut(z, d)
    assert cut.best == 2  # the first level alone: the two pairs
    assert cut.labels.tolist() == np.repeat(np.arange(4), 5).tolist()
    assert silhouette_cut(z, d, max_clusters=3).n_clusters == 3


def test_below_the_top_no_client_is_cut_off_alone() -> None:
    """An outlier inside one of two groups stays with its group: below the top, every part of
    a cut holds two clients or more."""
    rng = np.random.default_rng(12)
    x = blobs(rng, [6, 6], 0.3)
    x[0] += 3.0  # far from its group, still much nearer to it than to the other
    cut = silhouette_cut(feature_linkage(x), pairwise_distances(x, x))
    assert cut.labels.tolist() == [0] * 6 + [1] * 6


def test_a_structure_test_decides_instead_of_the_bound() -> None:
    """`structured(leaves, score)` replaces `score >= min_silhouette`: it is asked about the
    whole tree first (every leaf, the best score of the first level), then about each part."""
    x = blobs(np.random.default_rng(3), [4, 4, 4], 1.0)
    z, d = feature_linkage(x), pairwise_distances(x, x)
    found = silhouette_cut(z, d)
    asked: list[tuple[list[int], float]] = []

    def never(leaves: np.ndarray, score: float) -> bool:
        asked.append((sorted(leaves.tolist()), score))
        return False

    assert silhouette_cut(z, d, structured=never).n_clusters == 1
    assert asked == [(list(range(12)), found.scores[found.best])]
    # iid points, whose best cut is far below the bound, are cut when the test says so; the
    # parts, asked in turn, are cut again until parts of two or three are left
    y = np.random.default_rng(5).normal(size=(12, 50))
    zy, dy = feature_linkage(y), pairwise_distances(y, y)
    assert silhouette_cut(zy, dy).n_clusters == 1
    always = silhouette_cut(zy, dy, structured=lambda leaves, score: len(leaves) >= 4)
    assert always.n_clusters > 1 and np.bincount(always.labels).max() <= 3
