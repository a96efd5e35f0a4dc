"""FLT's relatedness math: the distance matrices A (minimum pair, matched sets), the threshold Ã,
the Case-I weights Ω and snapshot average, and the UMAP step, against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from clusterfl.clustering.relatedness import (
    adjacency,
    matched_distance_adjacency,
    min_distance_adjacency,
    relatedness_average,
    relatedness_weights,
    threshold,
    umap_embed,
)


def test_min_distance_adjacency_equals_brute_force():
    rng = np.random.default_rng(1)
    pts = rng.normal(size=(7, 4, 3))
    a = min_distance_adjacency(pts, block=3)  # blocks that do not divide M
    for i, j in itertools.product(range(7), repeat=2):
        brute = min(np.linalg.norm(pts[i, r] - pts[j, s]) for r in range(4) for s in range(4))
        assert a[i, j] == pytest.approx(0.0 if i == j else brute, abs=1e-9)
    assert np.array_equal(a, a.T)
    np.testing.assert_array_equal(adjacency(pts), min_distance_adjacency(pts))


def test_matched_distance_equals_permutation_search():
    rng = np.random.default_rng(2)
    pts = rng.normal(size=(5, 4, 2))
    a = matched_distance_adjacency(pts)
    for i, j in itertools.combinations(range(5), 2):
        brute = min(np.mean([np.sum((pts[i, r] - pts[j, p[r]]) ** 2) for r in range(4)])
                    for p in itertools.permutations(range(4)))
        assert a[i, j] == pytest.approx(brute, abs=1e-12)
        assert a[j, i] == a[i, j]
    assert np.all(np.diag(a) == 0.0)
    np.testing.assert_array_equal(adjacency(pts, "matched"), a)


def test_threshold_and_relatedness_weights_by_hand():
    a = np.array([[0.0, 0.5, 3.0], [0.5, 0.0, 0.99], [3.0, 0.99, 0.0]])
    related = threshold(a, 1.0)
    assert related.tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    omega = relatedness_weights(related, np.array([10, 30, 60]))
    np.testing.assert_allclose(omega, [[0.25, 0.75, 0.0], [0.1, 0.3, 0.6], [0.0, 1 / 3, 2 / 3]])


def test_threshold_is_strict_and_keeps_the_diagonal():
    a = np.array([[5.0, 1.0, np.inf], [1.0, 5.0, 0.2], [np.inf, 0.2, 5.0]])
    related = threshold(a, 1.0)  # A_ij = γ is not related; a client is related to itself
    assert related.tolist() == [[1, 0, 0], [0, 1, 1], [0, 1, 1]]
    assert related.dtype == np.float64


def test_relatedness_weights_equal_brute_force():
    rng = np.random.default_rng(4)
    related = (rng.random((6, 6)) < 0.4).astype(float)
    related[2] = 0.0  # a row without any related client stays all zero
    sizes = rng.integers(1, 50, 6)
    omega = relatedness_weights(related, sizes)
    for m in range(6):
        total = sum(related[m, j] * sizes[j] for j in range(6))
        for j in range(6):
            want = related[m, j] * sizes[j] / total if total else 0.0
            assert omega[m, j] == pytest.approx(want, abs=1e-15)
    sums = omega.sum(1)
    np.testing.assert_allclose(sums[related.any(1)], 1.0)


def test_case_one_reads_a_snapshot_and_ignores_client_order():
    rng = np.random.default_rng(3)
    snapshot = torch.from_numpy(rng.normal(size=(5, 4)))
    related = threshold(min_distance_adjacency(rng.normal(size=(5, 2, 2)) * 0.7), 1.0)
    sizes = np.array([5, 10, 20, 7, 3])
    omega = relatedness_weights(related, sizes)
    new = relatedness_average(snapshot, omega)
    by_hand = torch.stack([sum(omega[m, j] * snapshot[j] for j in range(5)) for m in range(5)])
    torch.testing.assert_close(new, by_hand)
    in_place = snapshot.clone()  # the bug the snapshot prevents: reading updated rows
    for m in range(5):
        in_place[m] = sum(omega[m, j] * in_place[j] for j in range(5))
    assert not torch.allclose(in_place, new)
    perm = rng.permutation(5)
    permuted = relatedness_average(snapshot[perm],
                                   relatedness_weights(related[np.ix_(perm, perm)], sizes[perm]))
    torch.testing.assert_close(permuted, new[perm])


def test_relatedness_average_of_blocks_keeps_dtype_and_shares_rows():
    snapshot = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    related = np.kron(np.eye(2), np.ones((2, 2)))  # two blocks of mutually related clients
    new = relatedness_average(snapshot, relatedness_weights(related, np.array([1, 3, 2, 2])))
    assert new.dtype == torch.float32
    torch.testing.assert_close(new[0], 0.25 * snapshot[0] + 0.75 * snapshot[1])
    torch.testing.assert_close(new[2], 0.5 * snapshot[2] + 0.5 * snapshot[3])
    assert torch.equal(new[0], new[1]) and torch.equal(new[2], new[3])


def test_umap_embed_is_seeded_and_keeps_separated_groups_apart():
    assert umap_embed(np.zeros((0, 4)), 0).shape == (0, 2)
    assert np.array_equal(umap_embed(np.ones((2, 4)), 0), np.zeros((2, 2)))  # too few points
    rng = np.random.default_rng(5)
    pts = np.concatenate([rng.normal(size=(12, 6)) * 0.05, 5.0 + rng.normal(size=(12, 6)) * 0.05])
    z = umap_embed(pts, seed=7, n_neighbors=5)
    assert z.shape == (24, 2) and z.dtype == np.float64
    np.testing.assert_array_equal(z, umap_embed(pts, seed=7, n_neighbors=5))
    groups = np.repeat([0, 1], 12)
    d = np.linalg.norm(z[:, None] - z[None], axis=-1)
    same = groups[:, None] == groups[None]
    assert d[same].max() < d[~same].min()
