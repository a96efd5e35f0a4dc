"""Adversarial clients: who attacks, what each attack sends, and how it is reported."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.protocol import TrainRequest
from clusterfl.robust.adversary import (
    benign_vs_adversarial,
    choose_adversaries,
    flip_labels,
    poison,
)
from clusterfl.robust.config import AdversaryConfig, ValidationConfig
from clusterfl.robust.guard import Guard

from .conftest import TRAIN, config
from .test_faults import _fedavg_round


def test_choose_adversaries():
    cfg = AdversaryConfig(kind="sign_flip", fraction=0.25)
    a = choose_adversaries(cfg, 8, seed=3)
    assert len(a) == 2 and np.array_equal(a, choose_adversaries(cfg, 8, seed=3))
    assert np.array_equal(choose_adversaries(AdversaryConfig(kind="scale", clients=[5, 1]), 8, 0),
                          [1, 5])
    assert len(choose_adversaries(AdversaryConfig(kind="none", fraction=0.5), 8, 0)) == 0
    with pytest.raises(ConfigError) as err:
        choose_adversaries(AdversaryConfig(kind="scale", clients=[9]), 8, 0)
    assert err.value.field == "adversary.clients"


@pytest.mark.parametrize("adversary, field", [
    ({"kind": "label_flip", "fraction": 1.0}, "adversary.fraction"),
    ({"kind": "sign_flip", "fraction": 0.95}, "adversary.fraction"),  # 7.6 of 8 rounds to 8
    ({"kind": "scale", "clients": list(range(8))}, "adversary.clients"),
])
def test_no_honest_client_left_is_refused(adversary, field):
    """Every client attacking ran, exit 0, with numpy's "Mean of empty slice" warnings and
    metrics of no honest client."""
    with pytest.raises(ConfigError, match="all 8 clients would attack, leaving no honest "
                                          "client") as err:
        choose_adversaries(AdversaryConfig(**adversary), 8, seed=0)
    assert err.value.field == field
    assert len(choose_adversaries(AdversaryConfig(kind="scale", fraction=0.9), 8, 0)) == 7


def test_flip_labels_touches_only_the_attackers_training_labels(digits):
    out = flip_labels(digits, np.array([2, 6]))
    off = digits.train_offsets
    for c in range(8):
        old, new = digits.y_train[off[c]:off[c + 1]], out.y_train[off[c]:off[c + 1]]
        assert torch.equal(new, 9 - old) if c in (2, 6) else torch.equal(new, old)
    assert torch.equal(out.y_test, digits.y_test) and out.meta["adversaries"] == [2, 6]


def test_poisoned_updates():
    g = torch.Generator().manual_seed(0)
    delta = torch.tensor([[3.0, 4.0, 0.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(poison("sign_flip", delta, 2.0, g), -2 * delta)
    torch.testing.assert_close(poison("scale", delta, 10.0, g), 10 * delta)
    rnd = poison("random", delta, 1.0, g)
    torch.testing.assert_close(torch.linalg.vector_norm(rnd, dim=1), torch.tensor([5.0, 1.0]))
    assert not torch.allclose(rnd, delta)


def test_guard_poisons_only_the_attackers(digits):
    adv = AdversaryConfig(kind="sign_flip", clients=[1, 4], scale=3.0)
    guard = Guard(8, 0, digits.train_sizes, adversary=adv, adversaries=np.array([1, 4]))
    _ctx, algo, start, seed, clean = _fedavg_round(digits, guard)
    ref = clean.execute(TrainRequest(np.arange(8), start, np.zeros(8, np.int64), TRAIN, seed))
    params = ref.params.clone()
    params[[1, 4]] = start[0] - 3.0 * (params[[1, 4]] - start[0])
    torch.testing.assert_close(algo.state.model[0], weighted_mean(params, ref.n_samples))


def test_norm_rule_rejects_scaled_attackers(digits):
    adv = AdversaryConfig(kind="scale", clients=[3], scale=50.0)
    guard = Guard(8, 0, digits.train_sizes, ValidationConfig(median_multiple=5.0),
                  adversary=adv, adversaries=np.array([3]))
    _fedavg_round(digits, guard)
    assert [(r["client"], r["reason"]) for r in guard.end_round()["rejected"]] == [(3, "norm")]


def test_benign_vs_adversarial_by_hand():
    a = np.array([0, 0, 1, 1, 2, 2])
    out = benign_vs_adversarial(a, np.array([4, 5]))  # attackers alone in cluster 2
    assert out["isolated"] == 1.0 and out["benign_exposed"] == 0.0
    # contingency pairs 3, rows 6+1, columns 1+1+1, of C(6,2)=15: (3-1.4)/(5-1.4) = 4/9
    assert out["ari_adversarial"] == pytest.approx(4 / 9)
    mixed = benign_vs_adversarial(np.array([0, 0, 0, 1, 1, 1]), np.array([2, 5]))
    assert mixed["isolated"] == 0.0 and mixed["benign_exposed"] == 1.0


def test_run_reports_attackers_and_benign_accuracy():
    cfg = config(rounds=4, eval_every=4, adversary={"kind": "label_flip", "fraction": 0.25},
                 algorithm={"name": "local"})
    exp = Experiment.from_config(cfg)
    h = exp.run(progress=False)
    rob = h.summary.robust
    assert rob is not None
    assert rob["adversaries"] == exp.adversaries.tolist() and len(rob["adversaries"]) == 2
    acc = np.asarray(h.summary.client_accuracy)
    benign = np.setdiff1d(np.arange(8), exp.adversaries)
    assert rob["benign_accuracy"] == pytest.approx(acc[benign].mean())
    # local models of label flippers are wrong on their (clean) test data
    assert acc[exp.adversaries].max() < acc[benign].min()
    assert rob["isolated"] == 1.0  # local: every client is its own cluster


@pytest.mark.parametrize(("table", "field", "words"), [
    # each of these ran to exit 0 with no attacker at all
    ({"kind": "none", "fraction": 1.0}, "adversary.fraction", "kind = 'none'"),
    ({"kind": "none", "clients": [2]}, "adversary.clients", "kind = 'none'"),
    ({"kind": "none", "scale": 5.0}, "adversary.scale", "kind = 'none'"),
    ({"kind": "sign_flip"}, "adversary.fraction", "attacks nobody"),
    ({"kind": "label_flip", "fraction": 0.25, "scale": 3.0}, "adversary.scale",
     "label_flip has no strength"),
])
def test_an_adversary_table_that_would_do_nothing_fails_naming_the_setting(table, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(config(adversary=table))
    assert err.value.field == field and words in err.value.message


def test_a_fraction_that_rounds_to_no_attacker_fails_naming_it():
    with pytest.raises(ConfigError) as err:  # 0.02 of 8 clients: round(0.16) = 0
        choose_adversaries(AdversaryConfig(kind="scale", fraction=0.02), 8, 0)
    assert err.value.field == "adversary.fraction" and "above 0.0625" in err.value.message
    assert len(choose_adversaries(AdversaryConfig(kind="scale", fraction=0.07), 8, 0)) == 1
    # a valid table loads, and so does the table every run writes back (kind "none")
    assert load_config(config(adversary={"kind": "scale", "fraction": 0.25})).adversary.kind \
        == "scale"
    assert load_config(config(adversary={"kind": "none", "fraction": 0.0,
                                         "clients": []})).adversary.kind == "none"
