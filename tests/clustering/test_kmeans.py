"""FeSEM's weighted k-means step against scikit-learn and hand-computed values."""

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from clusterfl.clustering.kmeans import (
    inertia,
    kmeans,
    kmeans_plus_plus,
    lloyd,
    nearest,
    squared_distances,
)


def _blobs(seed: int = 0, n: int = 60, p: int = 7, k: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(k, p))
    return centers[rng.integers(0, k, size=n)] + rng.normal(0, 1.5, size=(n, p))


def _sklearn(x: np.ndarray, init: np.ndarray, w: np.ndarray, max_iter: int) -> KMeans:
    return KMeans(len(init), init=init, n_init=1, max_iter=max_iter, tol=0.0,
                  algorithm="lloyd").fit(x, sample_weight=w)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lloyd_equals_sklearn_until_convergence(seed):
    x = _blobs(seed)
    w = np.random.default_rng(seed + 10).integers(1, 50, size=len(x)).astype(float)
    init = x[[0, 1, 2]] + 0.5  # a poor start, so several iterations are needed
    ours = lloyd(torch.from_numpy(x), torch.from_numpy(init), w, max_iter=100)
    ref = _sklearn(x, init, w, 100)
    assert ours.converged
    np.testing.assert_array_equal(ours.labels, ref.labels_)
    np.testing.assert_allclose(ours.centers.numpy(), ref.cluster_centers_, rtol=1e-10)
    assert ours.inertia == pytest.approx(ref.inertia_, rel=1e-9)


@pytest.mark.parametrize("max_iter", [1, 2])
def test_lloyd_stopped_early_equals_sklearn(max_iter):
    x = _blobs(3, n=80)
    w = np.linspace(1.0, 3.0, len(x))
    init = x[[5, 6, 7]]
    ours = lloyd(torch.from_numpy(x), torch.from_numpy(init), w, max_iter=max_iter)
    ref = _sklearn(x, init, w, max_iter)
    assert ours.n_iter == max_iter
    np.testing.assert_array_equal(ours.labels, ref.labels_)
    np.testing.assert_allclose(ours.centers.numpy(), ref.cluster_centers_, rtol=1e-10)


def test_one_step_by_hand_and_empty_cluster_keeps_its_center():
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0]], dtype=torch.float64)
    w = np.array([1.0, 3.0, 2.0])
    init = torch.tensor([[0.0, 0.0], [9.0, 0.0], [100.0, 100.0]], dtype=torch.float64)
    res = lloyd(x, init, w, max_iter=5)
    # cluster 0 = {0, 2} with weights 1, 3 -> mean 1.5; cluster 1 = {10}; cluster 2 empty
    np.testing.assert_array_equal(res.labels, [0, 0, 1])
    np.testing.assert_allclose(res.centers.numpy(), [[1.5, 0.0], [10.0, 0.0], [100.0, 100.0]])
    assert res.inertia == pytest.approx(1 * 1.5**2 + 3 * 0.5**2)
    assert res.converged and res.n_iter == 1


def test_distances_match_brute_force_in_float32_on_long_vectors():
    rng = np.random.default_rng(0)
    base = rng.normal(size=100_000)
    x = np.stack([base + rng.normal(0, 1e-3, size=base.size) for _ in range(4)])
    c = np.stack([base, base + 1e-3])
    d = squared_distances(torch.from_numpy(x).float(), torch.from_numpy(c).float()).numpy()
    brute = ((x[:, None, :] - c[None]) ** 2).sum(-1)
    np.testing.assert_allclose(d, brute, rtol=1e-3)
    np.testing.assert_array_equal(nearest(torch.from_numpy(x), torch.from_numpy(c)),
                                  brute.argmin(1))


def test_kmeans_plus_plus_is_seeded_and_never_picks_a_zero_weight_point():
    x = torch.from_numpy(_blobs(4))
    w = np.ones(len(x))
    w[:30] = 0.0
    a = kmeans_plus_plus(x, 3, np.random.default_rng(7), w)
    b = kmeans_plus_plus(x, 3, np.random.default_rng(7), w)
    assert torch.equal(a, b)
    chosen = [int(torch.where((x == row).all(1))[0][0]) for row in a]
    assert len(set(chosen)) == 3 and min(chosen) >= 30


def test_kmeans_recovers_separated_groups_and_beats_a_bad_start():
    rng = np.random.default_rng(5)
    truth = np.repeat(np.arange(4), 15)
    x = rng.normal(0, 8, size=(4, 20))[truth] + rng.normal(0, 0.5, size=(60, 20))
    res = kmeans(torch.from_numpy(x), 4, np.random.default_rng(0), n_init=5)
    assert adjusted_rand_score(truth, res.labels) == 1.0
    bad = lloyd(torch.from_numpy(x), torch.from_numpy(x[:4]), None, max_iter=100)
    assert res.inertia <= bad.inertia + 1e-9
    assert res.inertia == pytest.approx(
        inertia(torch.from_numpy(x), res.labels, res.centers, np.ones(60)))


def test_farthest_movable_takes_far_points_first_and_never_empties_a_cluster():
    from clusterfl.clustering.kmeans import farthest_movable

    rng = np.random.default_rng(3)
    for _ in range(20):
        n, k = int(rng.integers(2, 12)), int(rng.integers(1, 4))
        x = torch.from_numpy(rng.normal(size=(n, 3)))
        labels = rng.integers(0, k, size=n)
        centers = torch.from_numpy(rng.normal(size=(k, 3)))
        sizes = np.bincount(labels, minlength=k) + rng.integers(0, 2, size=k)  # some elsewhere
        count = int(rng.integers(0, n + 1))
        got = farthest_movable(x, labels, centers, sizes, count)
        # brute force: each row's distance by hand; walk them from the farthest
        d = [float(((x[i] - centers[labels[i]]) ** 2).sum()) for i in range(n)]
        left, want = sizes.copy(), []
        for i in sorted(range(n), key=lambda i: (-d[i], i)):
            if len(want) < count and left[labels[i]] > 1:
                left[labels[i]] -= 1
                want.append(i)
        assert got == want
        after = sizes - np.bincount(labels[got], minlength=k) if got else sizes
        assert (after[sizes > 0] >= 1).all()


def test_farthest_movable_by_hand():
    from clusterfl.clustering.kmeans import farthest_movable

    x = torch.tensor([[0.0], [1.0], [5.0], [10.0], [12.0]])
    labels = np.array([0, 0, 0, 1, 1])
    centers = torch.tensor([[0.0], [11.0]])
    # distances²: 0, 1, 25, 1, 1 → row 2 first; cluster 0 keeps rows 0 and 1
    assert farthest_movable(x, labels, centers, np.array([3, 2]), 1) == [2]
    # cluster 1 has only its two rows here and nowhere else: one may go, not both
    assert farthest_movable(x, labels, centers, np.array([3, 2]), 5) == [2, 1, 3]
    assert farthest_movable(x, labels, centers, np.array([1, 1]), 3) == []
