"""FLT's automatic C, rule v2 (issue 36): the signatures' distances in the encoder's space,
Ward on their rows, the divisive silhouette cut where a cut needs the silhouette bound and,
for a cluster of five clients or more, CFL's shuffle test. Hand-built signatures (no
federation), distances written as the sums they are, the shuffle test's p-values against a
brute-force count; then one run to show the method uses it and places a client by it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clusterfl.algorithms.flt import (
    FLTConfig,
    signature_cut,
    signature_distances,
)
from clusterfl.algorithms.oneshot import cut_clients
from clusterfl.clustering.cosine import (
    SHUFFLE_DRAWS,
    both_structured,
    distance_similarity,
    single_linkage_labels,
    structure_pvalue,
)
from clusterfl.clustering.hierarchical import pairwise_distances, ward_linkage


def test_signature_distances_are_the_papers_minimum_or_the_matched_mean_by_hand() -> None:
    """Two clients, k = 2 centroids in R²: client 0 at (0, 0) and (4, 0), client 1 at (0, 3)
    and (4, 1). The paper's minimum: min of the four distances 3, 5, √(16 + 9) = 5, 1 → 1;
    the authors' matched distance: the mean squared distance of the best one-to-one matching
    ((0,0)↔(0,3), (4,0)↔(4,1): (9 + 1) / 2 = 5, the other matching (25 + 17) / 2 = 21)."""
    sig = np.array([[[0.0, 0.0], [4.0, 0.0]], [[0.0, 3.0], [4.0, 1.0]]])
    np.testing.assert_allclose(signature_distances(sig, "min"), [[0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(signature_distances(sig, "matched"),
                               [[0.0, (9 + 1) / 2], [(9 + 1) / 2, 0.0]])


def groups(sizes: list[int], spread: float, seed: int, k: int = 3, e: int = 6) -> np.ndarray:
    """Signatures `[M, k, e]`: group g's clients hold its k prototype centroids (g's own,
    `spread` apart from the others') plus noise of scale 0.05."""
    rng = np.random.default_rng(seed)
    protos = spread * rng.standard_normal((len(sizes), k, e))
    return np.concatenate([protos[g] + 0.05 * rng.standard_normal((n, k, e))
                           for g, n in enumerate(sizes)])


def test_three_groups_are_found_and_one_group_stays_whole() -> None:
    """Three groups of six clients apart by far more than their noise: C = 3, the groups
    themselves; eighteen clients of one group (the same prototypes): C = 1. The bound alone
    (significance 0, rule v1's decision) cuts the first group's six clients in two, its noise
    giving a best silhouette above 0.25; the shuffle test keeps them together."""
    truth = np.repeat(np.arange(3), 6)
    cut, z = signature_cut(groups([6, 6, 6], 1.0, 0), "min", 0.002, 0.25, None)
    assert cut.labels.tolist() == truth.tolist()
    assert z.shape == (17, 4)  # the linkage of the 18 clients, returned for the records
    bound = signature_cut(groups([6, 6, 6], 1.0, 0), "min", 0.0, 0.25, None)[0]
    assert bound.labels.tolist() == [0, 1, 1, 0, 0, 1] + [2] * 6 + [3] * 6
    for significance in (0.0, 0.002):
        best = signature_cut(groups([18], 1.0, 1), "min", significance, 0.25, None)[0]
        assert best.labels.tolist() == [0] * 18
        assert best.silhouette is not None and best.silhouette < 0.25  # 0.19: no structure


def test_the_shuffle_test_keeps_structureless_clients_whole_where_the_bound_cuts() -> None:
    """Eighteen clients whose one centroid lies uniformly in a square (no groups, but client
    differences that persist, as in an iid federation's signatures): the silhouette bound
    alone (significance 0, rule v1's decision) cuts every one of five such federations into
    5-9 clusters (best silhouettes 0.42-0.53); with the test, four of the five stay whole.
    The fifth (seed 0) is cut: distances between points of a plane are not exchangeable, so
    the test's null is not exact for them (docs/transfer.md)."""
    whole = 0
    for seed in range(5):
        sig = np.random.default_rng(seed).uniform(-1.0, 1.0, (18, 1, 2))
        bound = signature_cut(sig, "min", 0.0, 0.25, None)[0]
        assert len(set(bound.labels.tolist())) >= 5 and bound.silhouette is not None
        assert 0.4 < bound.silhouette < 0.55
        whole += set(signature_cut(sig, "min", 0.002, 0.25, None)[0].labels.tolist()) == {0}
    assert whole == 4


def test_the_cut_is_the_silhouette_cut_of_the_distance_rows_decided_by_bound_and_test(
        ) -> None:
    """`signature_cut` is `cut_clients` on Ward's linkage of the distance rows D, the
    distances between those rows, a cut decided by the silhouette bound and the shuffle test
    of D as similarities (1 − D / max D): the same labels as that composition; the whole
    federation's p-value is the brute-force count (1 + #{shuffles whose Algorithm 1 cut is at
    least as contrasting}) / (1 + 999); a bound no cut reaches keeps it whole whatever the
    test says, and without a significance the bound decides alone."""
    sig = groups([5, 7], 0.6, 2)
    d = signature_distances(sig, "min")
    sim = distance_similarity(d)
    assert sim[0, 0] == 1.0 and sim.max() == 1.0 and math.isclose(sim.min(), 0.0, abs_tol=1e-12)
    expected = cut_clients(ward_linkage(d), 12, np.arange(12), None, None, None, "silhouette",
                           pairwise_distances(d, d), 0.25,
                           both_structured(sim, 0.002, 0.25)).labels
    assert signature_cut(sig, "min", 0.002, 0.25, None)[0].labels.tolist() == expected.tolist()
    assert expected.tolist() == [0] * 5 + [1] * 7
    p = structure_pvalue(sim, SHUFFLE_DRAWS, np.random.default_rng(np.arange(12)))
    assert p == 1 / (1 + SHUFFLE_DRAWS)  # no shuffle reaches two groups this clear
    side = single_linkage_labels(sim)  # Algorithm 1's cut of the observed matrix: the groups
    assert sorted(np.bincount(side).tolist()) == [5, 7]
    rule = both_structured(sim, 0.002, 0.25)
    assert rule is not None and rule(np.arange(12), 0.3) and not rule(np.arange(12), 0.2)
    assert both_structured(sim, 0.0, 0.25) is None
    assert signature_cut(sig, "min", 0.002, 0.999, None)[0].labels.tolist() == [0] * 12


def test_a_cluster_below_five_clients_is_cut_by_the_silhouette_bound_only() -> None:
    """Four clients (two pairs) cannot pass a shuffle test (its floor is 0.2): the bound of
    `min_silhouette` decides, as in FL+HC. Two tight pairs far apart: a silhouette near 1,
    cut; with the bound above it, kept whole."""
    sig = groups([2, 2], 1.0, 3)
    assert signature_cut(sig, "min", 0.002, 0.25, None)[0].labels.tolist() == [0, 0, 1, 1]
    assert signature_cut(sig, "min", 0.002, 0.999, None)[0].labels.tolist() == [0] * 4


def test_max_clusters_bounds_the_automatic_c() -> None:
    sig = groups([5, 5, 5, 5], 1.0, 4)
    assert len(set(signature_cut(sig, "min", 0.002, 0.25, None)[0].labels.tolist())) == 4
    assert len(set(signature_cut(sig, "min", 0.002, 0.25, 2)[0].labels.tolist())) == 2


def test_the_rules_options_are_said_to_do_nothing_when_c_is_not_the_silhouette_cuts() -> None:
    assert FLTConfig().auto_on == "signatures" and FLTConfig().significance == 0.002
    said = FLTConfig(n_clusters=3, auto_on="relatedness", significance=0.01).ignored_settings()
    assert "algorithm.auto_on = 'relatedness' does nothing: algorithm.n_clusters = 3 fixes C" \
        in said
    assert "algorithm.significance = 0.01 does nothing: algorithm.n_clusters = 3 fixes C" \
        in said
    gap = FLTConfig(auto_clusters="gap", significance=0.01).ignored_settings()
    assert any(s.startswith("algorithm.significance = 0.01 does nothing: auto_clusters = "
                            "'gap'") for s in gap)
    assert FLTConfig(significance=0.01).ignored_settings() == []
    with pytest.raises(ValueError, match="significance"):
        FLTConfig(significance=1.0)


def test_a_run_clusters_and_places_by_the_signatures_distances() -> None:
    """FLT's run with its default automatic C (a frozen encoder, so every client embeds in
    the same space): the clusters are `signature_cut` of the signatures the clients sent,
    the prototypes' three groups; the held-out third is placed by Ward's criterion on its
    rows of those distances, into its own group."""
    from tests.algorithms.test_flt import FAST_FLT, config, prototypes_federation

    from clusterfl.experiment import Experiment

    cfg = config({**FAST_FLT, "aggregation": "clusters", "finetune_epochs": 0}, rounds=2)
    cfg["scenario"]["holdout"] = 1 / 3
    exp = Experiment.from_config(cfg, federation=prototypes_federation(n_clients=18))
    summary = exp.run(progress=False).summary
    state = exp.algorithm.state
    cut, z = signature_cut(state.signatures, "min", 0.002, 0.25, None)
    assert state.labels.tolist() == cut.labels.tolist()
    np.testing.assert_array_equal(state.linkage, z)
    assert summary.final.ari == 1.0 and summary.final.n_clusters == 3
    assert summary.final.placement_ari == 1.0
