"""The ARI ceiling: the best ARI when clients of one group must share a cluster."""

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
