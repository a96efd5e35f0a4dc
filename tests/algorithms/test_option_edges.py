"""Each method's own options at their edges: a value the federation or the model makes
meaningless fails in one line naming the field and the allowed values, before round 1."""

from __future__ import annotations

import pytest
from tests.tiny import tiny_config

from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment


@pytest.mark.parametrize("algorithm", [
    {"name": "flhc", "warmup_rounds": 1}, {"name": "pacfl"}, {"name": "pca_km_hc"},
    {"name": "flt", "encoder": "none", "umap": False}])
def test_a_bound_of_one_cluster_on_the_automatic_cut_is_refused(algorithm):
    # max_clusters = 1 put every client into one cluster whatever the cut found, silently
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(algorithm={**algorithm, "max_clusters": 1}))
    assert err.value.field == "algorithm.max_clusters"
    assert "greater than or equal to 2 (got 1)" in err.value.message
    # two is a bound that can still split
    assert load_config(tiny_config(algorithm={**algorithm, "max_clusters": 2})) \
        .algorithm.max_clusters == 2


def test_more_pca_components_than_the_input_has_are_refused_before_the_run():
    # the 8x8 digits have e = 64 pixels; PCA kept min(1000, 64, n) components, unsaid
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(tiny_config(algorithm={"name": "pca_km_hc",
                                                      "pca_components": 65})))
    assert err.value.field == "algorithm.pca_components"
    assert err.value.message == ("65 PCA components exceed the input size e = 64; "
                                 "allowed: 1..64")
    Experiment(load_config(tiny_config(algorithm={"name": "pca_km_hc", "pca_components": 64})))
