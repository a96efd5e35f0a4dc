"""PACFL's rule v2 (`significance = 0.002`; docs/transfer.md, grid version v13, not kept as
the default): the silhouette cut of the principal angles A is made only where the bound 0.25
holds and, for a cluster of 5 clients or more, CFL's shuffle test of the members' angles (as
similarities) gives p < 0.002; hand-built A, no federation run."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfl.algorithms.oneshot import cut_clients
from clusterfl.algorithms.pacfl import PACFLConfig, pacfl_clusters
from clusterfl.clustering.cosine import (
    SHUFFLE_DRAWS,
    both_structured,
    distance_similarity,
    structure_pvalue,
)
from clusterfl.clustering.hierarchical import distance_linkage

V2 = {"significance": 0.002}  # rule v2


def _angles(groups: np.ndarray, within: float, across: float) -> np.ndarray:
    a = np.where(groups[:, None] == groups[None, :], within, across)
    np.fill_diagonal(a, 0.0)
    return a


def test_five_clients_in_groups_of_two_and_three_pass_the_bound_not_the_test():
    """Angles 10° within a group and 14° across: each client's silhouette is 1 − 10/14 =
    0.286 ≥ 0.25, so rule v1 cuts. The shuffle test: the 4 within angles (1 + 3) are the
    smallest of the 10, and a shuffle puts them into the blocks of one of the 10 cuts of 2 | 3
    with probability about 10 / C(10, 4) = 10 / 210; p ≈ 0.048 is not below 0.002, so rule
    v2 keeps one cluster."""
    a = _angles(np.array([0, 0, 1, 1, 1]), 10.0, 14.0)
    v1, _ = pacfl_clusters(a, 5, np.arange(5), PACFLConfig())
    assert v1.labels.tolist() == [0, 0, 1, 1, 1]
    assert v1.silhouette == pytest.approx(1 - 10 / 14)
    p = structure_pvalue(distance_similarity(a), SHUFFLE_DRAWS, np.random.default_rng(0))
    assert 0.03 < p < 0.07
    v2, _ = pacfl_clusters(a, 5, np.arange(5), PACFLConfig(**V2))
    assert v2.labels.tolist() == [0] * 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_three_groups_of_six_are_found_and_the_rule_is_its_composition(seed):
    """Angles 10° within, 30° across, noise of 1°: rule v2 finds the 3 groups, and its labels
    are those of `cut_clients` with `both_structured` of A as similarities (the composition
    it claims). A given cut (n_clusters, threshold) reads no test."""
    rng = np.random.default_rng(seed)
    truth = np.repeat([0, 1, 2], 6)
    a = _angles(truth, 10.0, 30.0) + rng.normal(0.0, 1.0, (18, 18))
    a = (a + a.T) / 2
    np.fill_diagonal(a, 0.0)
    cut, _ = pacfl_clusters(a, 18, np.arange(18), PACFLConfig(**V2))
    assert cut.labels.tolist() == truth.tolist()
    rule = both_structured(distance_similarity(a), 0.002, 0.25)
    same = cut_clients(distance_linkage(a, "average"), 18, np.arange(18), None, None, None,
                       "silhouette", a, 0.25, rule)
    assert same.labels.tolist() == cut.labels.tolist()
    fixed, _ = pacfl_clusters(a, 18, np.arange(18), PACFLConfig(n_clusters=2, **V2))
    assert len(set(fixed.labels.tolist())) == 2


def test_significance_is_named_when_a_fixed_cut_ignores_it():
    assert PACFLConfig().significance == 0.0  # rule v1 (v14)
    assert any(w.startswith("algorithm.significance = 0.01 does nothing")
               for w in PACFLConfig(n_clusters=2, significance=0.01).ignored_settings())
