"""PACFL's and FL+HC's server math: principal angles (hand-checked and against an independent
eigenvalue route), the three proximity matrices against plain loops, and the agglomerative
cut against the PACFL authors' merge loop (re-written here) and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import adjusted_rand_score

from clusterfl.clustering.hierarchical import (
    distance_linkage,
    feature_linkage,
    flat_clusters,
    linkage_to_clusters,
    pairwise_distances,
)
from clusterfl.clustering.subspace import principal_angles, proximity


def orth(m: np.ndarray) -> np.ndarray:
    return np.linalg.qr(m)[0]


def test_principal_angles_by_hand():
    e1, e2, e3 = np.eye(3)
    a = np.stack([e1, e2], 1)  # the xy-plane
    tilt = np.radians(30)
    b = np.stack([e1, np.cos(tilt) * e2 + np.sin(tilt) * e3], 1)  # tilted 30° about x
    np.testing.assert_allclose(np.degrees(principal_angles(a, b)), [0.0, 30.0], atol=1e-7)
    np.testing.assert_allclose(np.degrees(principal_angles(a, e3[:, None])), [90.0])
    line = (e1 + e2)[:, None]  # 45° from e1, inside the plane: a non-orthonormal column
    np.testing.assert_allclose(np.degrees(principal_angles(e1[:, None], line)), [45.0])
    assert principal_angles(a, np.zeros((3, 0))).size == 0


def test_principal_angles_against_projector_eigenvalues():
    """cos² θ_k are the eigenvalues of P_a P_b P_a (an independent route)."""
    rng = np.random.default_rng(0)
    for ra, rb in ((3, 3), (2, 5), (4, 1)):
        a, b = orth(rng.standard_normal((9, ra))), orth(rng.standard_normal((9, rb)))
        pa, pb = a @ a.T, b @ b.T
        ev = np.sort(np.linalg.eigvalsh(pa @ pb @ pa))[::-1][: min(ra, rb)]
        want = np.sort(np.arccos(np.sqrt(np.clip(ev, 0, 1))))
        np.testing.assert_allclose(principal_angles(a, b), want, atol=1e-6)
        # a stacked, non-orthonormal basis of the same span gives the same angles
        mixed = a @ rng.standard_normal((ra, ra))
        np.testing.assert_allclose(principal_angles(mixed, b), want, atol=1e-6)


def loops(bases: list[np.ndarray], kind: str) -> np.ndarray:
    """The proximity matrix written as plainly as possible (degrees)."""
    n = len(bases)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            u, w = bases[i], bases[j]
            if kind == "smallest_angle":
                # cos θ_1 = max |uᵀw| over unit vectors of the spans: the top singular value
                # of QᵢᵀQⱼ for orthonormal Q (orthonormalised here with QR)
                s = np.linalg.svd(orth(u).T @ orth(w), compute_uv=False).max()
                out[i, j] = np.degrees(np.arccos(min(1.0, s)))
            elif kind == "angle_sum":
                q = min(u.shape[1], w.shape[1])
                out[i, j] = sum(np.degrees(np.arccos(min(1.0, abs(u[:, a] @ w[:, a]))))
                                for a in range(q))
            else:
                out[i, j] = min(np.degrees(np.arccos(np.clip(u[:, a] @ w[:, b], -1, 1)))
                                for a in range(u.shape[1]) for b in range(w.shape[1]))
    return out


@pytest.mark.parametrize("kind", ["smallest_angle", "angle_sum", "min_pair"])
def test_proximity_matrices_equal_plain_loops(kind):
    rng = np.random.default_rng(3)
    bases = [orth(rng.standard_normal((12, r))) for r in (3, 3, 2, 4, 1)]
    a = proximity(bases, kind)
    np.testing.assert_allclose(a, loops(bases, kind), atol=1e-6)
    assert np.array_equal(a, a.T) and not np.diag(a).any()
    # newcomers' rows against the same clients equal the matrix's rows
    np.testing.assert_allclose(proximity(bases, kind, others=bases[1:3]), a[1:3], atol=1e-4)


def test_a_client_without_a_basis_is_farthest():
    rng = np.random.default_rng(4)
    bases = [orth(rng.standard_normal((6, 2))), np.zeros((6, 0)), orth(rng.standard_normal((6, 2)))]
    for kind in ("smallest_angle", "angle_sum", "min_pair"):
        a = proximity(bases, kind)
        assert a[1, 0] == a[1, 2] == 360.0 > a[0, 2]


def pacfl_code_merge(a: np.ndarray, thresh: float, how: str) -> np.ndarray:
    """The PACFL authors' HC loop as their code describes it: merge the closest pair while
    its distance ≤ thresh; the merged row is the max / min / plain mean of the two rows."""
    clusters = [[i] for i in range(len(a))]
    d = a.astype(float).copy()
    np.fill_diagonal(d, np.inf)
    while len(clusters) > 1:
        i, j = np.unravel_index(np.argmin(d), d.shape)
        if d[i, j] > thresh:
            break
        i, j = min(i, j), max(i, j)
        rows = np.stack([d[i], d[j]])
        new = {"maximum": rows.max(0), "minimum": rows.min(0), "average": rows.mean(0)}[how]
        d[i], d[:, i] = new, new
        d[i, i] = np.inf
        d = np.delete(np.delete(d, j, 0), j, 1)
        clusters[i] += clusters.pop(j)
    labels = np.empty(len(a), dtype=np.int64)
    for k, members in enumerate(clusters):
        labels[members] = k
    return labels


@pytest.mark.parametrize(("ours", "theirs"), [("weighted", "average"), ("complete", "maximum"),
                                              ("single", "minimum")])
def test_threshold_cut_equals_the_authors_merge_loop(ours, theirs):
    rng = np.random.default_rng(5)
    for trial in range(20):
        pts = rng.standard_normal((14, 3)) + rng.integers(0, 3, 14)[:, None] * 3.0
        a = pairwise_distances(pts, pts)
        thresh = float(np.quantile(a[a > 0], 0.2 + 0.03 * trial))
        got = flat_clusters(distance_linkage(a, ours), len(a), threshold=thresh)
        want = pacfl_code_merge(a, thresh, theirs)
        assert adjusted_rand_score(want, got) == 1.0
        assert got[0] == 0 and np.all(np.diff(np.maximum.accumulate(got)) <= 1)  # 1st seen


@pytest.mark.parametrize(("metric", "method"), [("euclidean", "ward"), ("euclidean", "average"),
                                                ("manhattan", "complete"), ("cosine", "single"),
                                                ("cosine", "average")])
def test_feature_linkage_matches_scikit_learn(metric, method):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 7)) + rng.integers(0, 4, 16)[:, None] * 2.0
    z = feature_linkage(x, metric, method)
    for k in (2, 3, 5):
        skl = AgglomerativeClustering(n_clusters=k, metric=metric, linkage=method).fit(x)
        assert adjusted_rand_score(skl.labels_, flat_clusters(z, 16, n_clusters=k)) == 1.0
    h = np.sort(z[:, 2])
    t = float(h[7] + h[8]) / 2  # between two merge heights: no tie at the threshold
    skl = AgglomerativeClustering(n_clusters=None, distance_threshold=t, metric=metric,
                                  linkage=method).fit(x)
    # scikit-learn merges below the threshold, scipy at or below: the same away from ties
    assert adjusted_rand_score(skl.labels_, flat_clusters(z, 16, threshold=t)) == 1.0
    with pytest.raises(ValueError, match="euclidean"):
        feature_linkage(x, "cosine", "ward")


def test_cosine_distances_of_a_zero_update_are_one():
    """A client whose update is zero has no direction: cosine similarity 0 to every other
    row (`pairwise_cosine`'s rule), distance 1 − 0 = 1, not NaN (scipy's 0/0, on which the
    linkage raised and FL+HC's clustering round stopped with a traceback). The others keep
    1 − cos: 1 − 0.6 = 0.4 for (3, 4) and (5, 0) / 5·5 = (1, 0)."""
    x = np.array([[3.0, 4.0], [5.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    d = pairwise_distances(x, x, "cosine")
    expect = np.array([[0.0, 1 - 0.6, 1.0, 1 - 0.8], [1 - 0.6, 0.0, 1.0, 1.0],
                       [1.0, 1.0, 1.0, 1.0], [1 - 0.8, 1.0, 1.0, 0.0]])
    np.testing.assert_allclose(d, expect, atol=1e-12)
    z = feature_linkage(x, "cosine", "average")
    np.testing.assert_allclose(np.sort(z[:, 2]), [0.2, (0.4 + 1.0) / 2, 1.0])  # by hand
    assert flat_clusters(z, 4, n_clusters=2).tolist() == [0, 0, 1, 0]


def test_linkage_distance_to_clusters_by_hand():
    d = np.array([[1.0, 3.0, 10.0, 2.0], [5.0, 4.0, 0.5, 9.0]])
    labels = np.array([0, 0, 1, 2])
    np.testing.assert_allclose(linkage_to_clusters(d, labels, "average"),
                               [[2.0, 10.0, 2.0], [4.5, 0.5, 9.0]])
    np.testing.assert_allclose(linkage_to_clusters(d, labels, "complete")[:, 0], [3.0, 5.0])
    np.testing.assert_allclose(linkage_to_clusters(d, labels, "single")[:, 0], [1.0, 4.0])


def test_cut_modes_and_errors():
    a = np.array([[0, 1, 9, 9.5], [1, 0, 9.2, 9.1], [9, 9.2, 0, 2], [9.5, 9.1, 2, 0]])
    z = distance_linkage(a, "average")
    assert flat_clusters(z, 4, threshold=1.5).tolist() == [0, 0, 1, 2]
    assert flat_clusters(z, 4, threshold=2.0).tolist() == [0, 0, 1, 1]  # ≤ β merges
    assert flat_clusters(z, 4, n_clusters=2).tolist() == [0, 0, 1, 1]
    assert flat_clusters(z, 4).tolist() == [0, 0, 1, 1]  # the largest gap
    assert flat_clusters(np.zeros((0, 4)), 1, threshold=1.0).tolist() == [0]
    with pytest.raises(ValueError, match="not both"):
        flat_clusters(z, 4, threshold=1.0, n_clusters=2)
    with pytest.raises(ValueError, match="allowed: average"):
        distance_linkage(a, "ward")
