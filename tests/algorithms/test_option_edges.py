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


ONE = "algorithm.n_clusters = 1 (one cluster model, which every client joins)"
ONE_CENTER = "algorithm.n_clusters = 1 (one center, which every client joins)"


@pytest.mark.parametrize(("settings", "lines"), [
    ({"name": "ifca", "assign_by": "accuracy", "weight_sharing": True},
     [f"algorithm.assign_by = 'accuracy' does nothing: {ONE}",
      f"algorithm.weight_sharing = True does nothing: {ONE}"]),
    ({"name": "fesem", "kmeans_iters": 3, "kmeans_restarts": 2, "empty_centers": "keep",
      "lam": 0.5},  # λ still pulls toward the one center
     [f"algorithm.kmeans_iters = 3 does nothing: {ONE_CENTER}",
      f"algorithm.kmeans_restarts = 2 does nothing: {ONE_CENTER}",
      f"algorithm.empty_centers = 'keep' does nothing: {ONE_CENTER}"]),
    ({"name": "fesem_cam", "kmeans_restarts": 2, "warmup_rounds": 1},
     [f"algorithm.kmeans_restarts = 2 does nothing: {ONE_CENTER}"]),
    ({"name": "fedsoft", "sigma": 0.5, "mu": 0.5}, [f"algorithm.sigma = 0.5 does nothing: {ONE}"]),
])
def test_an_option_that_chooses_between_clusters_is_named_with_one_cluster(settings, lines):
    """Before: these options ran without a word beside n_clusters = 1, where there is no
    other cluster to choose, pull away from or weigh; with two clusters they act."""
    config = load_config(tiny_config(algorithm={**settings, "n_clusters": 1})).algorithm
    assert config.ignored_settings() == lines
    assert load_config(tiny_config(algorithm={**settings, "n_clusters": 2})).algorithm \
        .ignored_settings() == []


def test_with_one_cluster_model_ifca_runs_the_same_whatever_its_cluster_estimate(capsys):
    """The warning holds: IFCA with K = 1 and assign_by = 'accuracy' gives the losses of the
    default 'loss', and says so (stderr)."""
    def losses(**more):
        exp = Experiment(load_config(tiny_config(algorithm={"name": "ifca", "n_clusters": 1,
                                                            **more})))
        return [(r.extras["train_loss"], r.metrics, r.assignment)
                for r in exp.run(progress=False).records]

    assert losses(assign_by="accuracy") == losses()
    assert f"clusterfl: warning: algorithm.assign_by = 'accuracy' does nothing: {ONE}" in \
        capsys.readouterr().err


def test_a_fedsoft_sigma_above_one_is_refused():
    # σ weighs a cluster no sample chose; above 1 it outweighed the clusters they all chose
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(algorithm={"name": "fedsoft", "sigma": 1.5}))
    assert err.value.field == "algorithm.sigma"
    assert "less than or equal to 1 (got 1.5)" in err.value.message
