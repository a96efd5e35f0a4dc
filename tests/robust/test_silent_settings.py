"""Issue 35, "Settings that do nothing, silently", in the robustness tables: each of these
configs ran to exit 0 as if the setting were not there. Now each fails in one line naming
it; the defaults, and the tables every run writes back, still load."""

from __future__ import annotations

import pytest

from clusterfl.config import dump_toml, load_config
from clusterfl.errors import ConfigError

from .conftest import config


@pytest.mark.parametrize(("tables", "field", "words"), [
    ({"faults": {"drop_rounds": [1]}}, "faults.drop_rounds", "without faults.drop_clients"),
    ({"faults": {"drop_clients": [1], "drop_rounds": [2, 50]}}, "faults.drop_rounds",
     "rounds [50] come after the run's last round"),
    ({"faults": {"straggler_work": 0.1}}, "faults.straggler_work", "stragglers = 0"),
    ({"validation": {"enabled": False, "max_norm": 1.0}}, "validation.max_norm",
     "validation.enabled = false"),
    ({"validation": {"enabled": False, "median_multiple": 10.0}},
     "validation.median_multiple", "validation.enabled = false"),
    ({"privacy": {"noise": "local"}}, "privacy.noise", "privacy.clip is not set"),
    ({"privacy": {"delta": 1e-3}}, "privacy.delta", "privacy.clip is not set"),
    ({"privacy": {"clip": 1.0, "noise": "local"}}, "privacy.noise", "adds no noise"),
    ({"privacy": {"clip": 1.0, "delta": 1e-3}}, "privacy.delta", "no (ε, δ) is reported"),
])
def test_a_robustness_setting_that_would_do_nothing_fails_naming_it(tables, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(config(**tables))
    assert err.value.field == field and words in err.value.message


@pytest.mark.parametrize("tables", [
    {},  # the defaults
    {"faults": {"drop_clients": [1], "drop_rounds": [1]}},
    {"faults": {"stragglers": 0.2, "straggler_work": 0.1}},
    {"validation": {"enabled": False}},
    {"privacy": {"clip": 1.0, "noise_multiplier": 0.5, "noise": "local", "delta": 1e-3}},
    {"privacy": {"clip": 1.0}},
])
def test_settings_that_act_and_the_written_back_tables_load(tables):
    loaded = load_config(config(**tables))
    again = load_config(_toml_roundtrip(loaded.to_dict()))  # what a run writes back
    assert again.to_dict() == loaded.to_dict()


def _toml_roundtrip(raw: dict) -> dict:
    import tomllib

    return tomllib.loads(dump_toml(raw))


@pytest.mark.parametrize(("faults", "words"), [
    ({"drop_clients": [0, 1, 2, 3]}, "all 4 clients drop out in every round"),
    ({"drop_clients": [3, 2, 1, 0], "drop_rounds": [1, 2]}, "all 4 clients drop out in rounds "
     "[1, 2]"),
])
def test_every_client_dropping_out_in_every_round_is_refused(faults, words):
    """Listing every client in `drop_clients` (for every round) ran with nobody training,
    ending in a "did not learn" warning only."""
    from clusterfl.experiment import Experiment
    from tests.tiny import tiny_config

    with pytest.raises(ConfigError) as err:
        Experiment(load_config(tiny_config(rounds=2, n_clients=4, faults=faults)))
    assert err.value.field == "faults.drop_clients" and words in err.value.message
    some = {**faults, "drop_rounds": [1]}  # one round of two: the other trains
    Experiment(load_config(tiny_config(rounds=2, n_clients=4, faults=some)))


@pytest.mark.parametrize(("tables", "field"), [
    ({"faults": {"drop_clients": [5]}}, "faults.drop_clients"),
    ({"adversary": {"kind": "sign_flip", "clients": [5]}}, "adversary.clients"),
])
def test_an_id_beyond_the_training_clients_says_that_holdout_renumbers_them(tables, field):
    """With `scenario.holdout` the ids of these tables count the clients that train; the
    error said only "the federation has clients 0..3" of a federation of 8."""
    from clusterfl.experiment import Experiment
    from tests.tiny import tiny_config

    cfg = tiny_config(n_clients=8, **tables)
    cfg["scenario"]["holdout"] = 0.5
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(cfg))
    assert err.value.field == field and err.value.message == (
        "ids [5] do not exist; the federation has clients 0..3 that train (4 more are held out "
        "by scenario.holdout; these ids count the clients that train)")
    del cfg["scenario"]["holdout"]
    Experiment(load_config(cfg))  # without the holdout, client 5 exists


def test_privacy_on_local_training_is_not_applied_and_says_so(capsys) -> None:
    """Local sends nothing, yet [privacy] clipped and noised its local training (accuracy
    24.4 → 9.6 %) and reported an ε of 9.09 for releases that never happened."""
    from clusterfl.experiment import Experiment

    plain = Experiment.from_config(config(rounds=2, algorithm={"name": "local"})).run(
        progress=False)
    private = config(rounds=2, algorithm={"name": "local"},
                     privacy={"clip": 1.0, "noise_multiplier": 1.0})
    capsys.readouterr()
    history = Experiment.from_config(private).run(progress=False)
    assert "[privacy] does not apply to Local: it sends nothing to the server" in \
        capsys.readouterr().err
    assert history.summary.robust is not None and history.summary.robust["privacy"] is None
    assert history.summary.final.metrics == plain.summary.final.metrics
    # a method that sends updates still gets it
    sent = Experiment.from_config(config(rounds=2, algorithm={"name": "fedavg"},
                                         privacy={"clip": 1.0, "noise_multiplier": 1.0}))
    assert sent.run(progress=False).summary.robust["privacy"]["releases"] == 2


@pytest.mark.parametrize(("algorithm", "noise", "warned"), [
    ({"name": "fesem", "n_clusters": 2}, "aggregate", True),
    ({"name": "fesem_cam", "n_clusters": 2, "warmup_rounds": 1}, "aggregate", True),
    ({"name": "fesem", "n_clusters": 2}, "local", False),
    ({"name": "ifca", "n_clusters": 2}, "aggregate", False),
])
def test_aggregate_noise_on_fesem_says_its_epsilon_does_not_hold(algorithm, noise, warned):
    """docs/security.md: FeSEM regroups the trained models by k-means, so the noise shared
    over the clients of one start model is not what its averages carry; a run with
    noise = 'aggregate' reported an ε for it without a word."""
    from clusterfl.experiment import Experiment

    cfg = config(rounds=2, algorithm=algorithm,
                 privacy={"clip": 1.0, "noise_multiplier": 1.0, "noise": noise})
    said = [w for w in Experiment(load_config(cfg)).method_warnings
            if "noise = 'aggregate' does not give" in w]
    assert len(said) == int(warned)


@pytest.mark.parametrize(("algorithm", "kind", "warned"), [
    ("local", "sign_flip", True), ("local", "scale", True), ("local", "random", True),
    ("local", "label_flip", False), ("fedavg", "sign_flip", False),
])
def test_model_poisoning_under_local_says_it_reaches_nobody(algorithm, kind, warned):
    """Local sends no update: a sign_flip attacker only spoiled its own model (accuracy
    0.35 → 0.02 on the digits), the summary called it isolated, and nothing said so."""
    from clusterfl.experiment import Experiment

    cfg = config(rounds=2, algorithm={"name": algorithm},
                 adversary={"kind": kind, "clients": [1]})
    said = [w for w in Experiment(load_config(cfg)).method_warnings
            if "reaches nobody" in w]
    assert len(said) == int(warned)


@pytest.mark.parametrize(("algorithm", "validation", "said"), [
    ({"name": "fedavg"}, {"min_replies_for_median": 20},
     "at least validation.min_replies_for_median = 20 clients, and only 8 clients train: it "
     "never applies; allowed min_replies_for_median: 1..8"),
    ({"name": "fedavg", "fraction": 0.25}, {"median_multiple": 5.0},
     "median_multiple = 5 applies only to replies of at least validation.min_replies_for_median "
     "= 3 clients, and a sampled round asks 2 (algorithm.fraction = 0.25)"),
    ({"name": "fedavg", "per_round": 3}, {"median_multiple": 5.0}, None),
    ({"name": "fedavg", "fraction": 0.25}, {}, None),  # defaults never warn
    ({"name": "fedavg"}, {"min_replies_for_median": 20, "median_multiple": None}, None),
])
def test_a_median_rule_no_reply_is_large_enough_for_is_said(algorithm, validation, said):
    """8 clients: `min_replies_for_median = 20`, or 2 clients a round (fraction 0.25) with the
    default 3, and the median rule the user set never looked at a reply, without a word."""
    from clusterfl.experiment import Experiment

    cfg = config(rounds=2, algorithm=algorithm, validation=validation)
    lines = [w for w in Experiment(load_config(cfg)).method_warnings if "median" in w]
    assert len(lines) == (0 if said is None else 1), lines
    if said is not None:
        assert said in lines[0]


@pytest.mark.parametrize(("algorithm", "sigma", "sent"), [
    ({"name": "pacfl"}, 1.0, "the top singular vectors of each client's data"),
    ({"name": "pca_km_hc"}, 1.0, "each client's k-means centroids of its embedded data"),
    ({"name": "pacfl"}, 0.0, None),  # clipping only: no ε is reported
    ({"name": "ifca", "n_clusters": 2}, 1.0, None),
])
def test_an_epsilon_that_leaves_out_the_clustering_signatures_says_so(algorithm, sigma, sent):
    """PACFL's subspace signatures (each client's top singular vectors of its raw data) and
    FLT / PCA+kM+HC's centroids go to the server unclipped and un-noised; a private run
    reported an ε for it as if it covered everything the clients sent."""
    from clusterfl.experiment import Experiment

    cfg = config(rounds=2, algorithm=algorithm,
                 privacy={"clip": 1.0, "noise_multiplier": sigma})
    said = [w for w in Experiment(load_config(cfg)).method_warnings
            if "covers the training replies only" in w]
    assert len(said) == (0 if sent is None else 1), said
    if sent is not None:
        assert f"clustering receives {sent}" in said[0] and "neither clipped nor noised" in said[0]


@pytest.mark.parametrize(("privacy", "warned"), [
    ({"clip": 1.0, "noise_multiplier": 1.0, "delta": 0.125}, True),  # 1/8 of SMALL's 8
    ({"clip": 1.0, "noise_multiplier": 1.0, "delta": 0.5}, True),
    ({"clip": 1.0, "noise_multiplier": 1.0, "delta": 0.12}, False),
    ({"clip": 1.0, "noise_multiplier": 1.0}, False),  # the default 1e-5
])
def test_a_delta_of_one_over_n_or_more_says_the_epsilon_protects_nobody(privacy, warned):
    """client-level (ε, δ)-DP with δ ≥ 1/n is met by publishing one client's update outright;
    δ = 0.5 over 8 clients ran and reported its ε without a word."""
    from clusterfl.experiment import Experiment

    said = [w for w in Experiment(load_config(config(rounds=2, privacy=privacy))).method_warnings
            if w.startswith("privacy.delta")]
    assert len(said) == int(warned), said
    if warned:
        assert f"privacy.delta = {privacy['delta']:g} is not below 1/n = 1/8" in said[0]
        assert "allowed for a guarantee: delta < 0.125" in said[0]
