"""CFL-GP's spectral clustering (Alg. 3) and the Appendix-G estimate, against brute force."""

from itertools import permutations

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfl.clustering.spectral import (
    estimate_n_clusters,
    gap_ranking,
    gap_statistic,
    gram_matrix,
    kmeans_labels,
    largest_gap,
    match_labels,
    project,
    silhouette_scores,
    spectral_clustering,
)


def profile(n_per: int = 4, k: int = 3, dim: int = 300, noise: float = 0.3,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Client-major rows: cluster means far apart plus Gaussian noise (a toy G transposed)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 1, size=(k, dim))
    truth = np.repeat(np.arange(k), n_per)
    return means[truth] + noise * rng.normal(0, 1, size=(len(truth), dim)), truth


def _same_up_to_sign(a: np.ndarray, b: np.ndarray, tol: float = 1e-6) -> bool:
    signs = np.sign((a * b).sum(0))
    return bool(np.allclose(a, b * signs, atol=tol))


def test_gram_route_equals_full_svd():
    rows, _ = profile(dim=50)
    g = rows.T  # the paper's G: Kd x C
    u, s, _ = np.linalg.svd(g, full_matrices=False)
    expected = (u[:, :3].T @ g).T  # Û^T g_c, eq. (12)
    proj = project(rows, 3, method="gram")
    assert np.allclose(proj.singular_values, s, atol=1e-8)
    assert _same_up_to_sign(proj.features, expected)


def test_randomized_svd_agrees_with_gram_on_top_directions():
    rows, _ = profile(dim=400, noise=0.05)
    exact = project(rows, 3, method="gram")
    approx = project(torch.tensor(rows, dtype=torch.float64), 3, method="randomized", seed=1)
    assert np.allclose(approx.singular_values, exact.singular_values[:3], rtol=1e-6)
    assert _same_up_to_sign(approx.features, exact.features, tol=1e-5)


def test_gram_matrix_accumulates_float32_blocks_in_float64():
    rows = torch.randn(5, 1003)
    got = gram_matrix(rows, chunk=100)
    want = rows.double() @ rows.double().T
    assert np.allclose(got, want.numpy(), atol=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_hungarian_matching_equals_brute_force_over_permutations(seed):
    rng = np.random.default_rng(seed)
    k = 4
    previous = rng.integers(0, k, size=30)
    labels = rng.integers(0, k, size=30)
    best = max(int((np.array(p)[labels] == previous).sum()) for p in permutations(range(k)))
    matched = match_labels(labels, previous, k)
    assert int((matched == previous).sum()) == best
    assert adjusted_rand_score(labels, matched) == pytest.approx(1.0)  # only a relabelling


def test_matching_undoes_a_pure_permutation():
    previous = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    shuffled = np.array([2, 3, 0, 1])[previous]
    assert np.array_equal(match_labels(shuffled, previous, 4), previous)
    assert np.array_equal(match_labels(shuffled, None, 4), shuffled)


def test_spectral_clustering_recovers_clusters_and_keeps_model_ids():
    rows, truth = profile(n_per=5, k=4, noise=0.5)
    previous = (truth + 1) % 4  # the models these clusters used before
    res = spectral_clustering(rows, 4, previous, seed=0)
    assert np.array_equal(res.assignment, previous)
    assert adjusted_rand_score(truth, res.raw_labels) == pytest.approx(1.0)
    assert res.projection.features.shape == (20, 4)


def test_kmeans_on_separated_blobs():
    rows, truth = profile(n_per=6, k=3, dim=2, noise=0.05, seed=3)
    assert adjusted_rand_score(truth, kmeans_labels(rows, 3, seed=0)) == pytest.approx(1.0)
    assert np.array_equal(kmeans_labels(rows, 1, seed=0), np.zeros(18))


def test_largest_gap_by_hand():
    sv = np.array([10.0, 9.0, 8.5, 3.0, 2.9, 0.4])
    assert largest_gap(sv) == 3  # 8.5 - 3.0 = 5.5
    assert largest_gap(sv, max_s=2) == 1  # among 1.0 and 0.5
    assert gap_ranking(sv, top=2) == [3, 5]  # 5.5 then 2.5
    assert largest_gap(np.array([4.0])) == 1


def test_spectrum_gap_of_a_rank_k_profile_is_k():
    rows, _ = profile(n_per=6, k=5, dim=200, noise=0.05, seed=2)
    proj = project(rows, 10)
    assert largest_gap(proj.singular_values) in (4, 5)  # the mean may absorb one direction
    rows_c = rows - rows.mean(0)
    assert largest_gap(project(rows_c, 10).singular_values) == 4  # centred: K - 1 directions


@pytest.mark.parametrize("k_true", [3, 5])
def test_silhouette_estimate_finds_the_number_of_blobs(k_true):
    rows, _ = profile(n_per=6, k=k_true, dim=200, noise=0.1, seed=k_true)
    feats = project(rows, k_true).features
    k, scores = estimate_n_clusters(feats, k_max=8, seed=0, criterion="silhouette")
    assert k == k_true
    assert set(scores) == set(range(2, 9))
    assert scores == silhouette_scores(feats, 8, seed=0)


def test_gap_statistic_finds_the_number_of_blobs_and_one_for_noise():
    rows, _ = profile(n_per=8, k=3, dim=2, noise=0.05, seed=4)
    k, gaps, sks = gap_statistic(rows, k_max=5, seed=0, n_init=2)
    assert k == 3
    assert set(gaps) == set(sks) == set(range(1, 6))
    noise = np.random.default_rng(0).uniform(size=(40, 2))
    assert gap_statistic(noise, k_max=5, seed=0, n_init=2)[0] == 1
    assert estimate_n_clusters(rows, 5, seed=0, criterion="gap", n_init=2)[0] == 3


def test_silhouette_estimate_says_one_cluster_below_the_bound() -> None:
    """The paper's argmax never answers 1; with `min_silhouette` (CFL-GP's k_min_silhouette,
    0.25 by default) features without groups give 1 and grouped features their groups."""
    from clusterfl.clustering.spectral import estimate_n_clusters

    rng = np.random.default_rng(0)
    flat = rng.normal(size=(30, 5))
    k, scores = estimate_n_clusters(flat, 6, seed=1)
    assert k >= 2 and max(scores.values()) < 0.25  # the paper's rule: some cut
    assert estimate_n_clusters(flat, 6, seed=1, min_silhouette=0.25)[0] == 1
    groups = np.concatenate([rng.normal(c, 0.3, (10, 5)) for c in (0.0, 6.0, -6.0)])
    assert estimate_n_clusters(groups, 6, seed=1, min_silhouette=0.25)[0] == 3


def test_gram_cosines_are_the_rows_cosines() -> None:
    """Against the brute-force cosines of the rows (a zero row is 0 with the others), and of
    the rows minus their mean (`centred`)."""
    from clusterfl.clustering.spectral import gram_cosines

    rows = np.random.default_rng(3).normal(size=(7, 11))
    rows[4] = 0.0
    cos = gram_cosines(rows @ rows.T)
    for i in range(7):
        for j in range(7):
            if i == j:
                want = 1.0
            elif 4 in (i, j):
                want = 0.0
            else:
                want = rows[i] @ rows[j] / np.linalg.norm(rows[i]) / np.linalg.norm(rows[j])
            assert cos[i, j] == pytest.approx(want, abs=1e-12)
    centred = rows - rows.mean(0)
    unit = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    np.testing.assert_allclose(gram_cosines(rows @ rows.T, centred=True), unit @ unit.T,
                               atol=1e-12)


def test_structure_p_tells_groups_from_one_distribution() -> None:
    """The shuffle test on cosines: profiles of three groups (each a direction of its own
    beside a common one) give the smallest p of 999 shuffles; profiles of one distribution
    (the common direction plus noise) a p far above CFL's 0.002; four clients: no test."""
    from clusterfl.clustering.spectral import gram_cosines, structure_p

    rng = np.random.default_rng(5)
    common = rng.normal(size=400)
    groups = np.concatenate([common + 2.0 * rng.normal(size=400) + rng.normal(size=(6, 400))
                             for _ in range(3)])
    assert structure_p(gram_cosines(groups @ groups.T), seed=0) == pytest.approx(1 / 1000)
    pvals = [structure_p(gram_cosines(x @ x.T), seed=s) for s, x in enumerate(
        [common + np.random.default_rng(10 + s).normal(size=(18, 400)) for s in range(5)])]
    assert sum(p > 0.002 for p in pvals) == 5, pvals
    assert structure_p(gram_cosines(groups[:4] @ groups[:4].T), seed=0) is None
