"""PCA+kM+HC's automatic C, rule v2 (issue 36): Ward's tree of the rows of D (the minimum
distances between the clients' centroid sets, in input space), cut by the divisive
silhouette cut where a cut needs the silhouette bound and, for a cluster of five clients or
more, CFL's shuffle test of the distances between those rows (`rows_cut`). Hand-built
signatures first (the same construction as FLT's tests), then the method's run against the
composition it claims."""

from __future__ import annotations

import numpy as np
import pytest
from tests.algorithms.test_flt_auto_c import groups

from clusterfl.algorithms.flt import PCAKMHCConfig, rows_cut, signature_distances
from clusterfl.algorithms.oneshot import cut_clients
from clusterfl.clustering.cosine import (
    SHUFFLE_DRAWS,
    both_structured,
    distance_similarity,
    structure_pvalue,
)
from clusterfl.clustering.hierarchical import pairwise_distances, ward_linkage

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def cut(sig: np.ndarray, significance: float, bound: float = 0.25,
        max_clusters: int | None = None) -> list[int]:
    d = signature_distances(sig, "min")
    return rows_cut(d, ward_linkage(d), None, max_clusters, "silhouette", bound,
                    significance).labels.tolist()


def test_the_test_keeps_a_noisy_group_whole_that_the_bound_alone_cuts() -> None:
    """Three groups of six clients far apart: rule v2 finds the three; the bound alone (rule
    v1, `significance = 0`) also cuts the first group's six clients in two (their noise
    gives a best silhouette above 0.25). Eighteen clients of one group stay whole either way
    (best silhouette 0.21)."""
    truth = np.repeat(np.arange(3), 6).tolist()
    assert cut(groups([6, 6, 6], 1.0, 0), 0.002) == truth
    assert cut(groups([6, 6, 6], 1.0, 0), 0.0) == [0, 1, 1, 0, 0, 1] + [2] * 6 + [3] * 6
    for significance in (0.0, 0.002):
        assert cut(groups([18], 1.0, 0), significance) == [0] * 18


def test_structureless_clients_stay_whole_more_often_with_the_test() -> None:
    """Eighteen clients each with one centroid uniform in a square (no groups, persistent
    differences): the bound alone cuts all eight such federations (seeds 0-7) into 4-9
    clusters; with the test five of the eight stay whole. The three it cuts show that the
    test's null (exchangeable distances) is not exact for points of a plane."""
    whole = []
    for seed in range(8):
        sig = np.random.default_rng(seed).uniform(-1.0, 1.0, (18, 1, 2))
        assert 4 <= len(set(cut(sig, 0.0))) <= 9
        whole.append(set(cut(sig, 0.002)) == {0})
    assert whole == [False, True, True, True, True, False, False, True]


def test_rows_cut_is_the_silhouette_cut_of_the_rows_decided_by_bound_and_test() -> None:
    """`rows_cut` is `cut_clients` on the given linkage with the distances between the rows
    and a cut decided by the bound and the shuffle test of those distances as similarities;
    the whole federation's p-value is the brute-force count's floor 1 / (1 + 999) for two
    clear groups; without a significance the bound decides alone; a bound no cut reaches
    keeps the clients whole; `max_clusters` bounds C; two tight pairs (four clients, below
    the test's five) are cut by the bound alone."""
    sig = groups([5, 7], 0.6, 2)
    d = signature_distances(sig, "min")
    between = pairwise_distances(d, d)
    sim = distance_similarity(between)
    expected = cut_clients(ward_linkage(d), 12, np.arange(12), None, None, None, "silhouette",
                           between, 0.25, both_structured(sim, 0.002, 0.25)).labels
    assert cut(sig, 0.002) == expected.tolist() == [0] * 5 + [1] * 7
    assert structure_pvalue(sim, SHUFFLE_DRAWS, np.random.default_rng(np.arange(12))) \
        == 1 / (1 + SHUFFLE_DRAWS)
    assert cut(sig, 0.002, bound=0.999) == [0] * 12
    assert len(set(cut(groups([5, 5, 5, 5], 1.0, 4), 0.002))) == 4
    assert len(set(cut(groups([5, 5, 5, 5], 1.0, 4), 0.002, max_clusters=2))) == 2
    assert cut(groups([2, 2], 1.0, 3), 0.002) == [0, 0, 1, 1]
    assert cut(groups([2, 2], 1.0, 3), 0.002, bound=0.999) == [0] * 4
    fixed = rows_cut(d, ward_linkage(d), 3, None, "silhouette", 0.25, 0.002)
    assert len(set(fixed.labels.tolist())) == 3 and fixed.silhouette is None


def test_the_option_defaults_to_the_test_and_is_named_where_c_is_fixed() -> None:
    assert PCAKMHCConfig().significance == 0.002
    said = PCAKMHCConfig(n_clusters=3, significance=0.01).ignored_settings()
    assert said == ["algorithm.significance = 0.01 does nothing: algorithm.n_clusters = 3 "
                    "fixes C"]
    gap = PCAKMHCConfig(auto_clusters="gap", significance=0.0).ignored_settings()
    assert gap == ["algorithm.significance = 0.0 does nothing: auto_clusters = 'gap' cuts at "
                   "the largest gap of merge heights"]
    assert PCAKMHCConfig(significance=0.0).ignored_settings() == []
    with pytest.raises(ValueError, match="significance"):
        PCAKMHCConfig(significance=-0.1)


@pytest.mark.parametrize("significance", [0.002, 0.0])
def test_a_run_cuts_its_clients_by_the_rule_it_names(significance: float) -> None:
    """PCA+kM+HC's run on the prototypes federation (three clusters of six clients): the
    labels are `rows_cut` of the rows of the adjacency the run recorded (D in input space),
    with the test (default) or the bound alone, and they are the three clusters."""
    from tests.algorithms.test_flt import config, prototypes_federation

    from clusterfl.experiment import Experiment

    cfg = config({"name": "pca_km_hc", "k": 3, "pca_components": 4, "fraction": 0.5,
                  "significance": significance}, rounds=2)
    exp = Experiment.from_config(cfg, federation=prototypes_federation(n_clients=18))
    summary = exp.run(progress=False).summary
    state = exp.algorithm.state
    d = state.adjacency
    expected = rows_cut(d, ward_linkage(d), None, None, "silhouette", 0.25, significance)
    assert state.labels.tolist() == expected.labels.tolist()
    assert summary.final.ari == 1.0 and summary.final.n_clusters == 3
