"""The ARI of an assignment (clients without a cluster included) and the ARI ceiling: the best
ARI when clients of one group must share a cluster."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfl.metrics import ari_ceiling


def test_pure_groups_reach_one():
    true = np.repeat([0, 1, 2], 4)
    groups = np.arange(12) // 2  # each group inside one true cluster
    assert ari_ceiling(true, groups) == 1.0


def test_a_group_shared_by_two_clusters_caps_the_ari_at_the_exhaustive_maximum():
    # clusters 0 and 1 of 6 clients each; 2 clients of each hold the same classes (group 9)
    true = np.repeat([0, 1, 2], 6)
    groups = np.array([0, 0, 0, 0, 9, 9, 1, 1, 1, 1, 9, 9, 2, 2, 2, 2, 2, 2])
    found = ari_ceiling(true, groups)
    ids = np.unique(groups)
    inverse = np.searchsorted(ids, groups)
    exhaustive = max(adjusted_rand_score(true, np.array(lab)[inverse])
                     for lab in itertools.product(range(len(ids)), repeat=len(ids)))
    assert found == pytest.approx(exhaustive) and found < 0.9


def test_lengths_must_agree():
    with pytest.raises(ValueError, match="differ in length"):
        ari_ceiling(np.zeros(3, int), np.zeros(4, int))


def _brute_ari(true: list[int], found: list[int]) -> float:
    """ARI from its definition: pair counts of the contingency table (Hubert & Arabie)."""
    from math import comb

    n = len(true)
    pairs = sum(comb(sum(1 for t, f in zip(true, found) if (t, f) == cell), 2)
                for cell in set(zip(true, found)))
    rows = sum(comb(true.count(t), 2) for t in set(true))
    cols = sum(comb(found.count(f), 2) for f in set(found))
    expected = rows * cols / comb(n, 2)
    return (pairs - expected) / ((rows + cols) / 2 - expected)


def test_clients_without_a_cluster_count_as_a_cluster_each() -> None:
    from clusterfl.metrics import ari

    true = [0, 0, 0, 0, 1, 1, 1, 1]
    found = [-1, -1, -1, -1, 1, 1, -1, 1]  # three of group 1 together, five unassigned
    singletons = [10, 11, 12, 13, 1, 1, 14, 1]
    assert ari(np.array(true), np.array(found)) == pytest.approx(_brute_ari(true, singletons))
    assert ari(np.array(true), np.array(found)) == pytest.approx(0.27586, abs=1e-5)
    # −1 as one shared label would have grouped the unassigned clients: higher, and wrong
    assert _brute_ari(true, found) == pytest.approx(0.49485, abs=1e-5)
    # nobody assigned: no pair together, nothing agrees beyond chance
    assert ari(np.array(true), np.full(8, -1)) == 0.0
    assert ari(np.array(true), np.array([0, 0, 0, 0, 1, 1, 1, 1])) == 1.0
    assert ari(None, np.array(found)) is None
