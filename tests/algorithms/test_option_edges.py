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


@pytest.mark.parametrize("name", ["fesem", "fesem_cam"])
def test_a_first_clustering_the_sample_can_never_reach_is_refused_before_the_run(name):
    # 3 of 4 clients' models awaited, 1 a round for 2 rounds: FeSEM never clustered, unsaid
    algorithm = {"name": name, "n_clusters": 2, "per_round": 1, "first_clustering": 0.75,
                 "warmup_rounds": 0}
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(tiny_config(rounds=2, algorithm=algorithm)))
    assert err.value.field == "algorithm.first_clustering"
    assert err.value.message == (
        "0.75 waits for the models of 3 of the 4 clients before the first k-means, and 1 a "
        "round (algorithm.per_round = 1) send at most 2 in 2 rounds: the run would never "
        "cluster; allowed: at most 0.5, or more rounds, a larger sample or warmup_rounds")
    # three rounds can bring three models; a warm-up clusters every client in its last round
    Experiment(load_config(tiny_config(rounds=3, algorithm=algorithm)))
    Experiment(load_config(tiny_config(rounds=2, algorithm={**algorithm, "warmup_rounds": 1})))


def test_fesem_options_for_clients_not_yet_clustered_are_named_when_every_client_answers():
    """Before: newcomer_start and first_clustering ran without a word with every client
    every round, where all are clustered in round 1 (docs/cam.md: "both values give the
    same run"); with a sample they act, and nothing is said."""
    settings = {"name": "fesem", "n_clusters": 2, "newcomer_start": "start",
                "first_clustering": 0.25}
    said = Experiment(load_config(tiny_config(algorithm=settings))).method_warnings
    assert [w.split(" does nothing here: ")[0] for w in said] == [
        "algorithm.newcomer_start = 'start'", "algorithm.first_clustering = 0.25"]
    assert "this run asks all 4 clients every round (algorithm.fraction = 1)" in said[0]
    sampled = Experiment(load_config(tiny_config(algorithm={**settings, "fraction": 0.5})))
    assert sampled.method_warnings == []


@pytest.mark.parametrize("name", ["fesem", "fesem_cam"])
def test_fesem_options_for_clients_not_yet_clustered_are_named_after_a_warm_up(name):
    """Before: with a warm-up, whose last round's k-means clusters every client (those that
    did not answer with their last model), newcomer_start and first_clustering never act,
    with a sample too, and nothing was said (every client every round: a line that blamed
    the sample, not the warm-up)."""
    settings = {"name": name, "n_clusters": 2, "newcomer_start": "start",
                "first_clustering": 0.25, "warmup_rounds": 1}
    why = ("does nothing: algorithm.warmup_rounds = 1 (the last warm-up round's k-means "
           "clusters every client, so no client is ever waiting for a cluster)")
    for more in ({}, {"fraction": 0.5}):
        exp = Experiment(load_config(tiny_config(algorithm={**settings, **more})))
        assert exp.config.algorithm.ignored_settings() == [
            f"algorithm.newcomer_start = 'start' {why}", f"algorithm.first_clustering = 0.25 "
            f"{why}"]
        assert exp.method_warnings == []  # said once, not again as a round's option
    default = load_config(tiny_config(algorithm={**settings, "warmup_rounds": 0}))
    assert default.algorithm.ignored_settings() == []


def test_fedem_place_iterations_with_one_component_is_named():
    """Before: with M = 1 the mixture weight π is [1] from its start 1/M, so no EM step of
    a placement moves it, and place_iterations set anyway was silent."""
    def said(**settings):
        return load_config(tiny_config(algorithm={"name": "fedem", **settings})
                           ).algorithm.ignored_settings()

    assert said(n_components=1, place_iterations=5) == [
        "algorithm.place_iterations = 5 does nothing: algorithm.n_components = 1 (one "
        "component, whose mixture weight is 1 before any EM step)"]
    assert said(n_components=2, place_iterations=5) == said(n_components=1) == []


ONE_SHOT = {"flhc": {"warmup_rounds": 1}, "pacfl": {}, "pca_km_hc": {},
            "flt": {"encoder": "none", "latent": 16, "k": 3, "finetune_epochs": 0,
                    "umap": False}}


@pytest.mark.parametrize("name", list(ONE_SHOT))
def test_a_max_clusters_of_at_least_the_clients_is_named(name):
    """Before: max_clusters = 4 with 4 clients that train bounds nothing (a cut of 4 clients
    has at most 4 clusters) and was silent; 3 can bind, and with a fixed n_clusters the
    existing line says it does nothing (not twice)."""
    def said(**settings):
        config = load_config(tiny_config(algorithm={"name": name, **ONE_SHOT[name],
                                                    **settings}))
        exp = Experiment(config)
        return [w for w in [*config.algorithm.ignored_settings(), *exp.method_warnings]
                if w.startswith("algorithm.max_clusters")]

    assert said(max_clusters=4) == [
        "algorithm.max_clusters = 4 does nothing: the automatic cut of the 4 clients that "
        "train has at most 4 clusters"]
    assert said(max_clusters=3) == []
    assert [w.split(" does nothing: ")[1] for w in said(max_clusters=4, n_clusters=2)] == [
        "algorithm.n_clusters = 2 fixes " + ("C" if name in ("flt", "pca_km_hc") else
                                             "the cut (the option applies to the automatic "
                                             "cut only)")]


def test_a_cfl_gp_cluster_rounds_of_one_is_refused():
    # T_cl = 1: clustering only in rounds t < 1, so never; the run went on without a word
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(algorithm={"name": "cfl_gp", "n_clusters": 2,
                                           "cluster_rounds": 1}))
    assert err.value.field == "algorithm.cluster_rounds"
    assert "greater than or equal to 2 (got 1)" in err.value.message


@pytest.mark.parametrize(("settings", "lines"), [
    ({"estimate_k": False, "k_max": 5, "k_significance": 0.05, "kmeans_n_init": 3},
     ["algorithm.k_max = 5 does nothing: estimate_k = false (no estimate of the number of "
      "clusters)", "algorithm.k_significance = 0.05 does nothing: estimate_k = false (no "
      "estimate of the number of clusters)"]),
    ({"k_criterion": "gap", "k_min_silhouette": 0.5, "k_max": 3},
     ["algorithm.k_min_silhouette = 0.5 does nothing: k_criterion = 'gap' (no silhouette)"]),
    ({"k_min_silhouette": 0.5, "k_max": 3}, []),  # the silhouette estimate reads both
])
def test_cfl_gp_options_of_the_estimate_it_does_not_make_are_named(settings, lines):
    config = load_config(tiny_config(algorithm={"name": "cfl_gp", "n_clusters": 2,
                                                **settings})).algorithm
    assert config.ignored_settings() == lines


@pytest.mark.parametrize(("name", "plain", "more"), [
    ("fedprox", "fedavg", {}), ("fedprox_plus", "fedavg_plus", {"n_models": 2})])
def test_fedprox_without_its_proximal_term_says_it_is_fedavg(name, plain, more, capsys):
    """mu = 0 gives FedAvg's (FedAvg+'s) run to the last loss, under FedProx's name: said."""
    def run(**algorithm):
        exp = Experiment(load_config(tiny_config(algorithm={**more, **algorithm})))
        return [(r.extras, r.metrics) for r in exp.run(progress=False).records]

    assert run(name=name, mu=0.0) == run(name=plain)
    line = (f"algorithm.mu = 0 turns off the proximal term: the run is {plain}'s under another "
            f"name (use name = '{plain}')")
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err
    assert load_config(tiny_config(algorithm={**more, "name": name, "mu": 0.1})) \
        .algorithm.ignored_settings() == []


@pytest.mark.parametrize(("algorithm", "line"), [
    ({"name": "ifca", "n_clusters": 2, "averaging": "gradient", "gradient_batch_size": 400},
     "algorithm.gradient_batch_size = 400 is more than any client's training samples (at most "
     "337): each gradient takes all of a client's samples (as gradient_batch_size unset)"),
    ({"name": "pca_km_hc", "k": 400},
     "algorithm.k = 400 is more than any client's training samples (at most 337): k-means "
     "does nothing: each client's centroids are its own samples, repeated to k rows"),
])
def test_a_count_of_samples_above_every_client_s_is_said(algorithm, line, capsys):
    # the 4 digits clients hold at most 337 training samples; the number held for none, unsaid
    Experiment(load_config(tiny_config(algorithm=algorithm))).run(progress=False)
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err
    key = "gradient_batch_size" if "gradient_batch_size" in algorithm else "k"
    Experiment(load_config(tiny_config(algorithm={**algorithm, key: 337}))).run(progress=False)
    assert "is more than any client's training samples" not in capsys.readouterr().err
