"""CFL's server math: cosine similarity, Algorithm 1, complete linkage, separation gap, γ test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import cut_tree, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import adjusted_rand_score
from sklearn.metrics.pairwise import cosine_similarity

from clusterfl.clustering.cosine import (
    TIE,
    Cohesion,
    bipartition,
    cohesion,
    combined_floor,
    combined_pvalue,
    complete_linkage_bipartition,
    cross_cosine,
    gamma_bound,
    gamma_criterion,
    intra_min_similarity,
    max_cross_similarity,
    optimal_bipartition,
    pairwise_cosine,
    separation_gap,
    shuffle_floor,
    shuffle_pvalue,
    single_linkage_labels,
    stationarity_ratio,
    structure_pvalue,
)


def brute_force(sim: np.ndarray) -> float:
    """min over all bipartitions of the maximal cross similarity (2^(n-1) - 1 candidates)."""
    n = len(sim)
    best = math.inf
    for mask in range(1, 2 ** (n - 1)):
        second = np.array([(mask >> i) & 1 for i in range(n)], dtype=bool)
        best = min(best, sim[np.ix_(~second, second)].max())
    return float(best)


def random_similarity(n: int, rng: np.random.Generator) -> np.ndarray:
    s = rng.uniform(-1, 1, size=(n, n))
    s = (s + s.T) / 2
    np.fill_diagonal(s, 1.0)
    return s


def test_pairwise_cosine_matches_sklearn_and_handles_zero_rows():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(7, 30))
    np.testing.assert_allclose(pairwise_cosine(torch.tensor(u)), cosine_similarity(u), atol=1e-12)
    u[3] = 0.0
    s = pairwise_cosine(u)
    assert s[3, 3] == 1.0 and np.all(s[3, np.arange(7) != 3] == 0.0)
    np.testing.assert_allclose(cross_cosine(u[:2], u[2:]), s[:2, 2:], atol=1e-12)


def test_cosine_similarity_is_invariant_to_a_permutation_of_coordinates():
    """Eq. (41): the privacy permutation P leaves α unchanged."""
    rng = np.random.default_rng(1)
    u = torch.tensor(rng.normal(size=(5, 200)), dtype=torch.float32)
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(3))
    np.testing.assert_allclose(pairwise_cosine(u[:, perm]), pairwise_cosine(u), atol=1e-12)


def test_algorithm1_hand_example():
    # clients 0,1 agree, 2,3 agree; the closest cross pair is (1, 2) with 0.1
    s = np.array([
        [1.0, 0.9, -0.5, -0.2],
        [0.9, 1.0, 0.1, -0.3],
        [-0.5, 0.1, 1.0, 0.8],
        [-0.2, -0.3, 0.8, 1.0],
    ])
    bp = optimal_bipartition(s)
    assert bp.first.tolist() == [0, 1] and bp.second.tolist() == [2, 3]
    assert bp.max_cross == pytest.approx(0.1)
    assert bp.labels(4).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("n", range(2, 13))
def test_algorithm1_equals_brute_force_minimum(n):
    rng = np.random.default_rng(100 + n)
    for _ in range(3 if n < 12 else 1):
        s = random_similarity(n, rng)
        bp = optimal_bipartition(s)
        assert len(bp.first) + len(bp.second) == n and len(bp.first) and len(bp.second)
        assert sorted([*bp.first, *bp.second]) == list(range(n))
        assert bp.max_cross == pytest.approx(brute_force(s), abs=1e-12)
        assert bp.max_cross == pytest.approx(max_cross_similarity(s, bp.first, bp.second))


def test_algorithm1_reads_nonsymmetric_input_as_max_of_both_entries():
    rng = np.random.default_rng(5)
    s = rng.uniform(-1, 1, size=(8, 8))
    bp = optimal_bipartition(s)
    assert bp.max_cross == pytest.approx(brute_force(np.maximum(s, s.T)))


def test_complete_linkage_matches_scipy_and_can_differ_from_optimal():
    rng = np.random.default_rng(2)
    for n in (3, 6, 10):
        s = random_similarity(n, rng)
        bp = complete_linkage_bipartition(s)
        ref = cut_tree(linkage(squareform(1 - s, checks=False), "complete"), n_clusters=2)
        assert adjusted_rand_score(ref.ravel(), bp.labels(n)) == pytest.approx(1.0)
    # a chain 0-1-2-3-4 (neighbours 0.85..0.92): single linkage cuts the weakest link (3-4),
    # complete linkage ({0,1} | {2,3,4}) cuts 1-2 and leaves a larger cross similarity
    s = np.full((5, 5), -0.5)
    np.fill_diagonal(s, 1.0)
    for i, j, v in ((0, 1, 0.9), (1, 2, 0.88), (2, 3, 0.92), (3, 4, 0.85), (0, 2, 0.2),
                    (1, 3, 0.2), (2, 4, 0.6)):
        s[i, j] = s[j, i] = v
    opt = bipartition(s, "optimal")
    comp = bipartition(s, "complete")
    assert opt.second.tolist() == [4] and opt.max_cross == pytest.approx(0.85)
    assert comp.first.tolist() == [0, 1] and comp.max_cross == pytest.approx(0.88)
    with pytest.raises(ValueError, match="unknown bipartition"):
        bipartition(s, "single")  # type: ignore[arg-type]


def test_separation_gap_hand_values():
    s = np.array([
        [1.0, 0.7, -0.4, -0.6],
        [0.7, 1.0, -0.2, -0.5],
        [-0.4, -0.2, 1.0, 0.5],
        [-0.6, -0.5, 0.5, 1.0],
    ])
    truth = np.array([0, 0, 1, 1])
    assert intra_min_similarity(s, truth) == pytest.approx(0.5)
    assert separation_gap(s, truth) == pytest.approx(0.5 - (-0.2))
    # one true cluster: the gap can only be <= 0 (the cross pairs are some of the pairs)
    assert separation_gap(s, np.zeros(4)) == pytest.approx(-0.6 - (-0.2))
    # every client alone: α_intra^min = α_ii = 1 (eq. 19 with i = j)
    assert intra_min_similarity(s, np.arange(4)) == 1.0
    assert math.isnan(separation_gap(np.ones((1, 1)), np.zeros(1)))


def test_positive_gap_implies_correct_bipartition():
    """Corollary 1 on random clustered updates: g > 0 ⇒ no true cluster is cut."""
    rng = np.random.default_rng(4)
    seen_positive = 0
    for trial in range(40):
        k = rng.integers(2, 5)
        centers = rng.normal(size=(k, 50))
        labels = rng.integers(0, k, size=12)
        labels[:k] = np.arange(k)
        u = centers[labels] + rng.uniform(0.2, 2.0) * rng.normal(size=(12, 50))
        s = pairwise_cosine(u)
        if separation_gap(s, labels) > 0:
            seen_positive += 1
            part = optimal_bipartition(s).labels(12)
            for c in range(k):
                assert len(set(part[labels == c])) == 1, trial
    assert seen_positive >= 10


def test_gamma_criterion():
    assert gamma_bound(-1.0) == pytest.approx(1.0)
    assert gamma_bound(0.0) == pytest.approx(math.sqrt(0.5))
    assert gamma_bound(1.0) == 0.0
    assert gamma_criterion(0.0, 0.7) and not gamma_criterion(0.0, 0.75)
    assert not gamma_criterion(1.0, 0.0)  # identical directions are never split
    assert gamma_criterion(0.999, 0.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="square"):
        optimal_bipartition(np.ones((2, 3)))
    with pytest.raises(ValueError, match="at least 2"):
        optimal_bipartition(np.ones((1, 1)))
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        pairwise_cosine(np.ones(3))


# ------------------------------------------------------- quantities of the "auto" split rule


def test_stationarity_ratio_matches_brute_force_and_is_scale_free():
    rng = np.random.default_rng(5)
    for n in range(1, 7):
        u = rng.normal(size=(n, 11))
        w = rng.uniform(0.1, 3.0, size=n)
        mean = sum(w[i] * u[i] for i in range(n))
        spread = sum(w[i] * math.sqrt(sum(x * x for x in u[i])) for i in range(n))
        expect = math.sqrt(sum(x * x for x in mean)) / spread
        assert stationarity_ratio(torch.tensor(u), w) == pytest.approx(expect, rel=1e-12)
        assert stationarity_ratio(u * 1e-4, w * 7) == pytest.approx(expect, rel=1e-9)
        assert 0.0 <= expect <= 1.0 + 1e-12
    same = np.tile(rng.normal(size=(1, 9)), (4, 1)) * np.array([[1.0], [2.0], [0.5], [3.0]])
    assert stationarity_ratio(same) == pytest.approx(1.0)
    assert stationarity_ratio(np.array([[1.0, 2.0], [-1.0, -2.0]])) == pytest.approx(0.0)
    assert math.isnan(stationarity_ratio(np.zeros((3, 4))))
    with pytest.raises(ValueError):
        stationarity_ratio(np.ones((2, 3)), np.array([1.0, -1.0]))


def test_cohesion_matches_brute_force_means():
    rng = np.random.default_rng(6)
    for n in range(2, 8):
        sim = rng.uniform(-1, 1, size=(n, n))  # not symmetric: both orders count
        np.fill_diagonal(sim, 1.0)
        labels = rng.integers(0, 2, size=n)
        labels[0], labels[-1] = 0, 1
        first, second = np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)

        def mean_over(pairs: list[tuple[int, int]], sim: np.ndarray = sim) -> float:
            return sum(sim[i, j] for i, j in pairs) / len(pairs) if pairs else math.nan

        within = [mean_over([(i, j) for i in g for j in g if i != j]) for g in (first, second)]
        cross = mean_over([(i, j) for i in first for j in second]
                          + [(j, i) for i in first for j in second])
        c = cohesion(sim, first, second)
        for got, want in zip((c.within_first, c.within_second, c.cross), (*within, cross)):
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)
        if len(first) > 1 and len(second) > 1:
            assert c.within_min == pytest.approx(min(within))
        else:
            assert math.isnan(c.within_min)
    with pytest.raises(ValueError):
        cohesion(np.eye(3), np.array([0, 1, 2]), np.array([], dtype=np.int64))


def test_cohesion_of_block_structure():
    """Two clean blocks: within means 1, cross mean −1 (the split the auto rule wants)."""
    u = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [-1.0, 0.0], [-5.0, 0.0]])
    sim = pairwise_cosine(u)
    part = optimal_bipartition(sim)
    c = cohesion(sim, part.first, part.second)
    assert (c.within_first, c.within_second, c.cross) == pytest.approx((1.0, 1.0, -1.0))


def test_contrast_is_the_side_mean_distance_over_its_noise_level_by_brute_force():
    """contrast = ‖ū_A − ū_B‖² / (1/a + 1/b) − 1 with ū the mean of the unit updates."""
    rng = np.random.default_rng(11)
    for n in range(2, 9):
        u = rng.normal(size=(n, 6)) + rng.normal(size=6)  # a shared direction, some noise
        sim = pairwise_cosine(u)
        labels = rng.integers(0, 2, size=n)
        labels[0], labels[-1] = 0, 1
        first, second = np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)
        unit = u / np.linalg.norm(u, axis=1, keepdims=True)
        d2 = float(((unit[first].mean(0) - unit[second].mean(0)) ** 2).sum())
        want = d2 / (1 / len(first) + 1 / len(second)) - 1
        assert cohesion(sim, first, second).contrast == pytest.approx(want)


def test_contrast_is_zero_for_orthogonal_updates_and_grows_with_the_sides():
    eye = np.eye(8)  # eight pairwise orthogonal updates: no common direction
    assert cohesion(pairwise_cosine(eye), np.arange(5), np.arange(5, 8)).contrast == \
        pytest.approx(0.0)
    # the same cosine structure (within 0.3, cross 0) is stronger evidence with more clients
    def block(a: int, b: int) -> float:
        sim = np.zeros((a + b, a + b))
        sim[:a, :a] = sim[a:, a:] = 0.3
        np.fill_diagonal(sim, 1.0)
        return cohesion(sim, np.arange(a), np.arange(a, a + b)).contrast

    assert block(2, 2) < block(4, 4) < block(16, 16)
    assert block(6, 2) < 1.0 < block(16, 16)
    assert math.isnan(Cohesion(0.5, 0.5, 0.0).contrast)  # sizes not given


# ------------------------------------------------------------- the shuffle test (auto rule)


def test_single_linkage_labels_are_algorithm_1s_cut():
    """The fast cut (maximum spanning tree without its weakest edge) is Algorithm 1's, on
    random matrices (no ties) of 2 to 30 clients, and on block matrices."""
    rng = np.random.default_rng(21)
    for n in [2, 3, 4, 5, 8, 13, 30]:
        for _ in range(40):
            sim = pairwise_cosine(rng.normal(size=(n, 12)))
            want = optimal_bipartition(sim)
            labels = single_linkage_labels(sim)
            assert labels[0] == 0
            assert np.array_equal(np.flatnonzero(labels == 0), want.first)
            assert np.array_equal(np.flatnonzero(labels == 1), want.second)


def reference_pvalue(sim: np.ndarray, observed: float, draws: int,
                     rng: np.random.Generator) -> float:
    """The shuffle test written out: the same permutations, Algorithm 1 and `cohesion`."""
    n = len(sim)
    rows, cols = np.triu_indices(n, k=1)
    hits = 0
    for _ in range(draws):
        order = rng.permutation(len(rows))
        null = np.eye(n)
        for k, src in enumerate(order):
            null[rows[k], cols[k]] = null[cols[k], rows[k]] = sim[rows[src], cols[src]]
        cut = optimal_bipartition(null)
        hits += cohesion(null, cut.first, cut.second).contrast >= observed - TIE
    return (1 + hits) / (1 + draws)


def test_shuffle_pvalue_equals_the_reference_loop():
    rng = np.random.default_rng(5)
    for n in [3, 5, 9, 16]:
        sim = pairwise_cosine(rng.normal(size=(n, 8)) + rng.normal(size=8))
        cut = optimal_bipartition(sim)
        observed = cohesion(sim, cut.first, cut.second).contrast
        got = shuffle_pvalue(sim, observed, 60, np.random.default_rng(n))
        assert got == pytest.approx(reference_pvalue(sim, observed, 60,
                                                     np.random.default_rng(n)))


def groups(sizes: list[int], signal: float, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Updates of clients in groups: a direction per group (length `signal`) plus unit-scale
    noise in `dim` dimensions."""
    centres = rng.normal(size=(len(sizes), dim))
    centres *= signal / np.linalg.norm(centres, axis=1, keepdims=True)
    return np.concatenate([c + rng.normal(size=(k, dim)) / math.sqrt(dim)
                           for c, k in zip(centres, sizes)])


def test_shuffle_pvalue_of_one_distribution_and_of_groups():
    """One distribution (a common direction plus independent noise): the p-value of
    Algorithm 1's cut falls below 0.05 in about 5 % of the matrices (a little more is
    possible: clients that align better with the common direction make a matrix a little more
    structured than its shuffles); four groups of five clients, or two of four, give the
    smallest p-value there is."""
    rng = np.random.default_rng(8)
    ps = []
    for _ in range(300):
        sim = pairwise_cosine(groups([20], 0.5, 200, rng))
        cut = optimal_bipartition(sim)
        ps.append(shuffle_pvalue(sim, cohesion(sim, cut.first, cut.second).contrast, 99, rng))
    ps = np.array(ps)
    assert 0.01 <= (ps < 0.05).mean() <= 0.1
    assert np.median(ps) > 0.1
    for sizes in ([5, 5, 5, 5], [4, 4]):
        for _ in range(3):
            sim = pairwise_cosine(groups(sizes, 1.0, 200, rng))
            cut = optimal_bipartition(sim)
            assert shuffle_pvalue(sim, cohesion(sim, cut.first, cut.second).contrast, 99,
                                  rng) == pytest.approx(1 / 100)


def test_shuffle_pvalue_of_four_clients_cannot_fall_below_a_fifth():
    """Six cosines: the two largest land on disjoint pairs in 3 of the 15 orders, and then the
    shuffled cut is the observed one, however clear the groups are."""
    sim = pairwise_cosine(np.array([[1.0, 0.0], [1.0, 0.01], [-1.0, 0.0], [-1.0, 0.01]]))
    cut = optimal_bipartition(sim)
    p = shuffle_pvalue(sim, cohesion(sim, cut.first, cut.second).contrast, 2000,
                       np.random.default_rng(0))
    assert p == pytest.approx(0.2, abs=0.03)
    with pytest.raises(ValueError, match="3 clients"):
        shuffle_pvalue(np.eye(2), 0.0, 10, np.random.default_rng(0))


def exact_pvalue(sim: np.ndarray) -> float:
    """The share of all orders of the off-diagonal entries of `sim` whose Algorithm 1 cut is
    at least as contrasting as that of `sim` (the p-value of infinitely many draws)."""
    n = len(sim)
    rows, cols = np.triu_indices(n, k=1)
    cut = optimal_bipartition(sim)
    observed = cohesion(sim, cut.first, cut.second).contrast
    hits = orders = 0
    for order in itertools.permutations(sim[rows, cols]):
        null = np.eye(n)
        null[rows, cols] = null[cols, rows] = order
        found = optimal_bipartition(null)
        hits += cohesion(null, found.first, found.second).contrast >= observed - TIE
        orders += 1
    return hits / orders


def blocks(sizes: tuple[int, int], values: np.ndarray) -> np.ndarray:
    """A matrix of the cut (a | b): the largest of `values` within the first side, the next
    within the second, the rest across (the most contrasting order of those values)."""
    a, b = sizes
    values = np.sort(values)[::-1]
    sim = np.eye(a + b)
    pairs = [*itertools.combinations(range(a), 2), *itertools.combinations(range(a, a + b), 2),
             *itertools.product(range(a), range(a, a + b))]
    for (i, j), value in zip(pairs, values):
        sim[i, j] = sim[j, i] = value
    return sim


def test_the_smallest_exact_pvalue_of_n_clients_by_hand_and_brute_force():
    """`shuffle_floor`: three clients, any order is a relabelling (1); four: 3 of the 15 ways
    to place the two within entries of a 2 | 2 cut, or 4 of the 20 ways for the three of a
    1 | 3 cut (0.2 both); five: C(5, 2) = 10 places for a 2 | 3 cut over C(10, 1) · C(9, 3) =
    840 ways to place its 1 and 3 within entries (1 / 84; 1 | 4: 5 / C(10, 6) = 1 / 42)."""
    assert shuffle_floor(3) == 1.0 and shuffle_floor(4) == pytest.approx(0.2, rel=1e-12)
    assert shuffle_floor(5) == pytest.approx(1 / 84, rel=1e-12)
    # six: a 2 | 4 cut, 15 / (C(15, 1) · C(14, 6)) = 1 / 3003, below 3 | 3's 10 / C(15, 6)
    assert shuffle_floor(6) == pytest.approx(1 / 3003, rel=1e-12)
    assert shuffle_floor(41) == 0.0
    with pytest.raises(ValueError, match="3 clients"):
        shuffle_floor(2)
    # brute force over all 720 orders of four clients' six cosines: the most contrasting
    # order of a 2 | 2 cut reaches the floor; other matrices stay above it (a 1 | 3 block
    # order among them: a 2 | 2 order of its values is more contrasting)
    rng = np.random.default_rng(0)
    assert exact_pvalue(blocks((2, 2), rng.uniform(-1, 1, 6))) == pytest.approx(0.2)
    others = [blocks((1, 3), rng.uniform(-1, 1, 6)),
              *(pairwise_cosine(rng.normal(size=(4, 3))) for _ in range(4))]
    assert all(exact_pvalue(sim) >= shuffle_floor(4) - 1e-12 for sim in others)
    # five clients: the 2 | 3 cut of the most contrasting order, against 10000 shuffles
    sim = blocks((2, 3), rng.uniform(-1, 1, 10))
    cut = optimal_bipartition(sim)
    p = shuffle_pvalue(sim, cohesion(sim, cut.first, cut.second).contrast, 10_000,
                       np.random.default_rng(1))
    assert p == pytest.approx(1 / 84, abs=4 * math.sqrt(1 / 84 / 10_000))


def test_the_smallest_combined_pvalue_of_sampled_rounds_by_hand_and_brute_force():
    """`combined_floor`: Fisher's combined p falls as any of its p-values falls, so the least
    it reaches is the combination of each round's `shuffle_floor`. By hand, χ² with 2m degrees
    of freedom has the tail e^(−x/2) Σ_{k<m} (x/2)^k / k!: three rounds of four clients
    (x/2 = 3 ln 5): (1 + 3 ln 5 + 4.5 ln² 5) / 125 = 0.140; five clients: (1 + 3 ln 84 +
    4.5 ln² 84) / 84³ = 1.7e-4; a round of three (p = 1) and one of four: 0.2 (1 + ln 5)."""
    five, l84 = math.log(5), math.log(84)
    assert combined_floor([4, 4, 4]) == pytest.approx((1 + 3 * five + 4.5 * five ** 2) / 125,
                                                      rel=1e-9)
    assert combined_floor([4, 4, 4]) == pytest.approx(0.1399, abs=1e-4)
    assert combined_floor([5, 5, 5]) == pytest.approx((1 + 3 * l84 + 4.5 * l84 ** 2) / 84 ** 3,
                                                      rel=1e-9)
    assert combined_floor([3, 4]) == pytest.approx(0.2 * (1 + five), rel=1e-9)
    assert combined_floor([2]) == combined_floor([3]) == 1.0
    assert combined_floor([41, 4]) == 0.0 and math.isnan(combined_floor([]))
    # brute force: every order of four clients' six cosines (three value sets) and its exact
    # p-value (the share of orders whose cut is at least as contrasting); Fisher's p of every
    # three of these p-values never falls below the floor, and reaches it
    rng = np.random.default_rng(3)
    rows, cols = np.triu_indices(4, k=1)
    grid = set()
    for _ in range(3):
        contrasts = []
        for order in itertools.permutations(rng.uniform(-1, 1, 6)):
            sim = np.eye(4)
            sim[rows, cols] = sim[cols, rows] = order
            cut = optimal_bipartition(sim)
            contrasts.append(cohesion(sim, cut.first, cut.second).contrast)
        c = np.array(contrasts)
        grid |= {round(float(np.mean(c >= x - TIE)), 12) for x in c}
    assert min(grid) == pytest.approx(shuffle_floor(4))
    least = min(combined_pvalue(t) for t in itertools.combinations_with_replacement(grid, 3))
    assert least == pytest.approx(combined_floor([4, 4, 4]), rel=1e-9)


def test_a_shuffled_cut_tying_the_observed_contrast_counts_whatever_its_rounding():
    """Four clients: a fifth of the shuffles put the two largest cosines on the observed
    cut's pairs, and their contrast is the observed one summed in another order. An observed
    contrast one rounding step higher (as another backend's updates give) must not turn those
    ties into misses: before, p fell from 0.2 to 1 / 2001."""
    sim = pairwise_cosine(np.array([[1.0, 0.0], [1.0, 0.01], [-1.0, 0.0], [-1.0, 0.01]]))
    cut = optimal_bipartition(sim)
    observed = cohesion(sim, cut.first, cut.second).contrast
    p = [shuffle_pvalue(sim, o, 2000, np.random.default_rng(0))
         for o in (np.nextafter(observed, -np.inf), observed, np.nextafter(observed, np.inf))]
    assert p[0] == p[1] == p[2] == pytest.approx(0.2, abs=0.03)


def test_structure_pvalue_is_the_shuffle_test_of_algorithm_1s_cut():
    """FL+HC's structure test: the same draws as `shuffle_pvalue` of the contrast of the cut
    Algorithm 1 finds; two groups reach the smallest value."""
    rng = np.random.default_rng(9)
    for sizes in ([7], [3, 4], [5, 5, 2]):
        sim = pairwise_cosine(groups(sizes, 0.8, 100, rng))
        cut = optimal_bipartition(sim)
        contrast = cohesion(sim, cut.first, cut.second).contrast
        assert structure_pvalue(sim, 49, np.random.default_rng(3)) == \
            shuffle_pvalue(sim, contrast, 49, np.random.default_rng(3))
    sim = pairwise_cosine(groups([5, 5], 1.0, 200, rng))
    assert structure_pvalue(sim, 99, rng) == pytest.approx(1 / 100)
