"""FL+HC's rule v4 (`tested = "distance_rows"`; docs/transfer.md, grid version v11, not kept as
the default): a cluster of 5 or more clients is cut when its best cut reaches the silhouette
bound and the shuffle test of its members' rows of update distances (`profile_similarity`)
agrees; hand-built inputs, no federation run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from tests.tiny import tiny_config

from clusterfl.algorithms.flhc import FLHCConfig, flhc_clusters
from clusterfl.clustering.cosine import (
    both_structured,
    distance_similarity,
    profile_similarity,
    shuffle_structured,
)
from clusterfl.clustering.hierarchical import pairwise_distances
from clusterfl.config import load_config
from clusterfl.errors import ConfigError


def test_profile_similarity_by_hand():
    """Rows a = (0, 1, 2), b = (1, 0, 1), c = (2, 1, 0): |a − b| = √(1 + 1 + 1) = √3,
    |a − c| = √(4 + 0 + 4) = √8, |b − c| = √3; as similarities 1 − d / √8."""
    d = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
    s = 1 - math.sqrt(3) / math.sqrt(8)
    assert np.allclose(profile_similarity(d), [[1, s, 0], [s, 1, s], [0, s, 1]], atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_profile_similarity_is_the_rows_euclidean_distances_as_similarities(seed):
    """The matrix product form against scipy's distances between the rows (brute force)."""
    x = np.random.default_rng(seed).normal(size=(30, 7))
    d = pairwise_distances(x, x)
    assert np.allclose(profile_similarity(d), distance_similarity(cdist(d, d)), atol=1e-9)


def test_both_structured_needs_the_bound_and_the_test_and_keeps_test_every():
    """Constant similarities: every shuffle ties the observed cut, p = 1, the test never
    passes. With `test_every` off a cluster smaller than the whole is judged by the bound
    alone; below 5 clients always by the bound."""
    sim = np.full((12, 12), 0.5)
    np.fill_diagonal(sim, 1.0)
    every, top = both_structured(sim, 0.002, 0.25), both_structured(sim, 0.002, 0.25, False)
    assert every is not None and top is not None
    assert not every(np.arange(12), 0.9) and not top(np.arange(12), 0.9)
    assert not every(np.arange(6), 0.3) and top(np.arange(6), 0.3)
    assert not top(np.arange(6), 0.2)
    assert every(np.arange(4), 0.3) and not every(np.arange(4), 0.2)
    assert both_structured(sim, 0.0, 0.25) is None
    alone = shuffle_structured(sim, 0.002, 0.25)
    assert not alone(np.arange(12), 0.9) and alone(np.arange(4), 0.3)


def _updates(seed: int, separation: float, groups: int = 2, size: int = 10,
             d: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Δθ = a common direction (norm 3) + `separation` × a unit group direction + noise of
    norm 1, `groups` groups of `size` clients."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=d)
    common *= 3 / np.linalg.norm(common)
    direction = rng.normal(size=(groups, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    truth = np.repeat(np.arange(groups), size)
    noise = rng.normal(size=(len(truth), d)) / math.sqrt(d)
    return common + separation * direction[truth] + noise, truth


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rule_v4_finds_separated_groups_and_keeps_noise_whole(seed):
    """Three groups of ten, group directions of norm 3 against noise of norm 1: both tests
    find them. The same clients without groups (separation 0): both keep one cluster."""
    x, truth = _updates(seed, 3.0, groups=3)
    for config in (FLHCConfig(tested="distance_rows"), FLHCConfig()):
        cut, _ = flhc_clusters(x, len(x), np.arange(len(x)), config)
        assert cut.labels.tolist() == truth.tolist()
    flat, _ = _updates(seed, 0.0, groups=3)
    for config in (FLHCConfig(tested="distance_rows"), FLHCConfig()):
        assert set(flhc_clusters(flat, 30, np.arange(30), config)[0].labels.tolist()) == {0}


def test_rule_v4_options():
    """The default is rule v3 (the cosines); `tested` does nothing (and is named) when
    n_clusters fixes the cut; an unknown value is one line naming the field and the allowed
    values."""
    assert FLHCConfig().tested == "cosines"
    assert any(w.startswith("algorithm.tested = 'distance_rows' does nothing")
               for w in FLHCConfig(n_clusters=2, tested="distance_rows").ignored_settings())
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(algorithm={"name": "flhc", "tested": "updates"}))
    msg = str(err.value)
    assert "algorithm.tested" in msg and "distance_rows" in msg and "cosines" in msg
    assert "\n" not in msg
