"""Scenario invariants (clusterfl.data.scenarios) on scikit-learn's digits and synthetic labels."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
import torch

from clusterfl.data import SCENARIOS, Federation, Source, load_source, make_federation
from clusterfl.data.leaf import WriterSource
from clusterfl.data.params import CFLGP_ANGLES
from clusterfl.data.plans import Plan, group_sizes, proportional_counts
from clusterfl.data.scenarios import plan_dirichlet, power_law_sizes, scenario_params
from clusterfl.data.transforms import rotate_each
from clusterfl.errors import ConfigError

SMALL: dict[str, dict[str, Any]] = {  # parameters that fit digits (1,347 train / 450 test)
    "iid": {},
    "label_swap": {},
    "label_permutation": {},
    "rotation": {"n_clients": 8},
    "rotation_mixture": {},
    "dirichlet": {"n_clients": 30},
    "cluster_dirichlet": {"n_clients": 30, "n_clusters": 3},
    "n_class": {"n_clients": 30},
    "cluster_n_class": {"n_clients": 30, "n_clusters": 3},
    "cluster_labels": {"n_clients": 20},
    "power_law": {"n_clients": 20},
    "linear_regression": {},
    "label_shift_half": {},
    "cluster_partitioner": {"n_clients": 8, "partitioner": "dirichlet",
                            "options": {"alpha": 0.5, "min_partition_size": 5}},
    # clusterfl.data.paper_scenarios (tests/data/test_paper_scenarios.py, test_femnist.py)
    "writers": {"n_clients": 5},
    "structured_femnist": {"n_clients": 12, "n_clusters": 3, "classes_per_cluster": 4},
    "dirichlet_rotation": {"n_clients": 8, "n_samples": 600},
}


@pytest.fixture(scope="module")
def digits() -> Source:
    return load_source("digits")


def _source_for(name: str, digits: Source) -> Source:
    if name == "writers":  # the digits with 12 made-up writers (FEMNIST's kind of source)
        return WriterSource(**{f.name: getattr(digits, f.name) for f in fields(digits)},
                            train_writers=np.arange(len(digits.y_train)) % 12,
                            test_writers=np.arange(len(digits.y_test)) % 12,
                            writer_names=tuple(f"w{i}" for i in range(12)))
    return load_source("synthetic_regression") if name == "linear_regression" else digits


def _plan(source: Source, name: str, params: dict[str, Any], seed: int) -> Plan:
    """The plan `make_federation` uses: planners are the first to draw from the generator."""
    spec = SCENARIOS[name]
    return spec.plan(source, scenario_params(name, params), np.random.default_rng(seed))


def _client_labels(fed: Federation, split: str, i: int) -> set[int]:
    _, y = fed.client_train(i) if split == "train" else fed.client_test(i)
    return set(y.tolist())


def _source_rows(source: Source, index: np.ndarray, split: str) -> tuple[torch.Tensor, ...]:
    x = torch.cat([source.x_train, source.x_test]) if split == "all" else getattr(
        source, f"x_{split}")
    y = torch.cat([source.y_train, source.y_test]) if split == "all" else getattr(
        source, f"y_{split}")
    idx = torch.from_numpy(index)
    return x[idx], y[idx]


def _same_data(a: Federation, b: Federation) -> bool:
    """The same clients holding the same rows (inputs, labels, split per client, clusters).

    `meta` is left out on purpose: it records the seed, so two seeds always differ there.
    """
    return (torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
            and torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
            and np.array_equal(a.train_offsets, b.train_offsets)
            and np.array_equal(a.test_offsets, b.test_offsets)
            and np.array_equal(a.clusters, b.clusters))


# ====================================================================== every scenario


def test_every_design_row_is_registered() -> None:
    # `topics` builds token sequences, no row plan: tests/data/test_text.py covers it
    assert set(SMALL) | {"topics"} == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_invariants_of_every_scenario(name: str, digits: Source) -> None:
    source = _source_for(name, digits)
    params = SMALL[name]
    fed = make_federation(source, name, params, seed=3)
    assert fed.n_clients == scenario_params(name, params).n_clients
    assert fed.train_sizes.min() >= 1 and fed.test_sizes.min() >= 1
    json.dumps(fed.meta)  # JSON-able
    assert fed.meta["scenario"] == name and fed.meta["seed"] == 3
    if fed.clusters is not None:
        assert len(fed.meta["clusters"]) == fed.n_true_clusters
        assert np.all(np.diff(fed.clusters) >= 0)  # contiguous cluster ids
    plan = _plan(source, name, params, seed=3)
    assert np.array_equal(plan.train.offsets, fed.train_offsets)
    same_pool = plan.train_pool is plan.test_pool
    rows = [plan.train.index, plan.test.index + (0 if same_pool else 10**9)]
    all_rows = np.concatenate(rows)
    assert len(np.unique(all_rows)) == len(all_rows)  # no sample shared by two clients


@pytest.mark.parametrize("name", sorted(SMALL))
def test_seed_determinism(name: str, digits: Source) -> None:
    source = _source_for(name, digits)
    a = make_federation(source, name, SMALL[name], seed=11)
    b = make_federation(source, name, SMALL[name], seed=11)
    c = make_federation(source, name, SMALL[name], seed=12)
    assert _same_data(a, b) and a.meta == b.meta
    assert not _same_data(a, c), "seeds 11 and 12 gave the same federation"


# ====================================================================== label maps


def test_label_swap_applies_to_train_and_test(digits: Source) -> None:
    params = {"n_clients": 6, "n_clusters": 2, "pairs": [[1, 7], [3, 5]]}
    fed = make_federation(digits, "label_swap", params, seed=0)
    plan = _plan(digits, "label_swap", params, seed=0)
    assert fed.clusters.tolist() == [0, 0, 0, 1, 1, 1]
    assert [c["swap"] for c in fed.meta["clusters"]] == [[1, 7], [3, 5]]
    swap = {0: {1: 7, 7: 1}, 1: {3: 5, 5: 3}}
    for split, part in (("train", plan.train), ("test", plan.test)):
        x_orig, y_orig = _source_rows(digits, part.index, split)
        x, y, _ = fed.split(split)
        assert torch.equal(x, x_orig)
        owner_cluster = fed.clusters[part.owner()]
        expected = [swap[g].get(v, v) for g, v in zip(owner_cluster, y_orig.tolist())]
        assert y.tolist() == expected
    seven_in_cluster0 = (fed.y_test[: fed.test_offsets[3]] == 7).sum()
    assert seven_in_cluster0 > 0  # the swap is visible in the test data too


def test_label_swap_random_pairs_are_disjoint(digits: Source) -> None:
    fed = make_federation(digits, "label_swap", {}, seed=5)
    pairs = [tuple(c["swap"]) for c in fed.meta["clusters"]]
    assert len(pairs) == 4 and len({v for p in pairs for v in p}) == 8
    with pytest.raises(ConfigError) as err:
        make_federation(digits, "label_swap", {"n_clusters": 6, "n_clients": 12}, seed=0)
    assert err.value.field == "scenario.n_clusters"


def test_label_permutation(digits: Source) -> None:
    fed = make_federation(digits, "label_permutation", {"n_clients": 8}, seed=2)
    plan = _plan(digits, "label_permutation", {"n_clients": 8}, seed=2)
    maps = np.array([c["label_map"] for c in fed.meta["clusters"]])
    assert len({m.tobytes() for m in maps}) == 4
    assert all(sorted(m) == list(range(10)) for m in maps)
    for split, part in (("train", plan.train), ("test", plan.test)):
        _, y_orig = _source_rows(digits, part.index, split)
        expected = maps[fed.clusters[part.owner()], y_orig.numpy()]
        assert fed.split(split)[1].tolist() == expected.tolist()


def test_label_shift_half(digits: Source) -> None:
    fed = make_federation(digits, "label_shift_half", {"n_clients": 10}, seed=0)
    plan = _plan(digits, "label_shift_half", {"n_clients": 10}, seed=0)
    assert fed.clusters.tolist() == [0] * 5 + [1] * 5
    _, y_orig = _source_rows(digits, plan.test.index, "test")
    shifted = fed.clusters[plan.test.owner()] == 1
    expected = np.where(shifted, (y_orig.numpy() + 5) % 10, y_orig.numpy())
    assert fed.y_test.tolist() == expected.tolist()
    with pytest.raises(ConfigError, match="shift"):
        make_federation(digits, "label_shift_half", {"shift": 10}, seed=0)


# ====================================================================== rotations


def test_rotation_split_layout_rotates_train_and_test(digits: Source) -> None:
    params = {"n_clients": 8, "angles": [0, 90, 180, 15]}
    fed = make_federation(digits, "rotation", params, seed=1)
    plan = _plan(digits, "rotation", params, seed=1)
    assert fed.clusters.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [c["angle"] for c in fed.meta["clusters"]] == [0, 90, 180, 15]
    for split, part in (("train", plan.train), ("test", plan.test)):
        x_orig, y_orig = _source_rows(digits, part.index, split)
        x, y, off = fed.split(split)
        assert torch.equal(y, y_orig)
        assert torch.equal(x[off[2]:off[4]], torch.rot90(x_orig[off[2]:off[4]], 1, (-2, -1)))
        assert torch.equal(x[off[0]:off[2]], x_orig[off[0]:off[2]])
        angles = np.array([0, 90, 180, 15.0])[fed.clusters[part.owner()]]
        torch.testing.assert_close(x, rotate_each(x_orig, angles))
    assert len(plan.train.index) == len(digits.y_train)  # all rows used, disjoint (above)


def test_rotation_clients_per_group_sets_unequal_groups(digits: Source) -> None:
    params = {"n_clients": 10, "angles": [0, 180], "clients_per_group": [8, 2]}
    fed = make_federation(digits, "rotation", params, seed=1)
    assert fed.clusters.tolist() == [0] * 8 + [1] * 2
    x, _, off = fed.split("train")
    x0, _ = _source_rows(digits, _plan(digits, "rotation", params, seed=1).train.index, "train")
    assert torch.equal(x[off[8]:], torch.rot90(x0[off[8]:], 2, (-2, -1)))
    assert torch.equal(x[:off[8]], x0[:off[8]])


@pytest.mark.parametrize("counts", [[8, 3], [10], [10, 0]])
def test_rotation_clients_per_group_refuses_counts_that_do_not_fit(digits: Source,
                                                                   counts: list[int]) -> None:
    with pytest.raises(ConfigError, match="clients_per_group needs 2 positive counts"):
        make_federation(digits, "rotation",
                        {"n_clients": 10, "angles": [0, 180], "clients_per_group": counts})


def test_rotation_cflgp_layout(digits: Source) -> None:
    params = {"n_clients": 16, "angles": "cflgp", "layout": "cflgp"}
    fed = make_federation(digits, "rotation", params, seed=0)
    plan = _plan(digits, "rotation", params, seed=0)
    assert tuple(c["angle"] for c in fed.meta["clusters"]) == CFLGP_ANGLES
    n_all = len(digits.y_train) + len(digits.y_test)
    rows = np.concatenate([plan.train.index, plan.test.index])
    assert np.array_equal(np.sort(rows), np.arange(n_all))  # merged data, all used once
    blocks = np.repeat(np.arange(8), group_sizes(n_all, 8))
    for i in range(16):
        own = np.sort(np.concatenate([plan.train.index[plan.train.offsets[i]:
                                                       plan.train.offsets[i + 1]],
                                      plan.test.index[plan.test.offsets[i]:
                                                      plan.test.offsets[i + 1]]]))
        assert np.array_equal(own, np.arange(own[0], own[0] + len(own)))  # contiguous slice
        assert np.all(blocks[own] == fed.clusters[i])  # inside its angle's block
        assert abs(fed.train_sizes[i] / len(own) - 0.7) < 0.01
    x_orig, _ = _source_rows(digits, plan.test.index, "all")
    angles = np.asarray(CFLGP_ANGLES)[fed.clusters[plan.test.owner()]]
    torch.testing.assert_close(fed.x_test, rotate_each(x_orig, angles))
    with pytest.raises(ConfigError, match="divisible") as err:
        make_federation(digits, "rotation", {**params, "n_clients": 12}, seed=0)
    assert err.value.field == "scenario.n_clients"


def test_rotation_mixture(digits: Source) -> None:
    params = {"kappa": 0.3, "n_clients": 6}
    fed = make_federation(digits, "rotation_mixture", params, seed=4)
    plan = _plan(digits, "rotation_mixture", params, seed=4)
    assert fed.clusters.tolist() == [0, 0, 1, 1, 2, 2]
    group = fed.clusters[plan.train.owner()]
    assert np.all(plan.train_angles[group == 0] == 0)
    assert np.all(plan.train_angles[group == 1] == 180)
    share = np.mean(plan.train_angles[group == 2] == 0)
    assert abs(share - 0.3) < 0.08 and set(plan.train_angles[group == 2]) == {0.0, 180.0}
    x_orig, _ = _source_rows(digits, plan.test.index, "test")
    torch.testing.assert_close(fed.x_test, rotate_each(x_orig, plan.test_angles))
    near = _plan(digits, "rotation_mixture", {**params, "kappa": 0.999}, seed=4)
    assert np.mean(near.test_angles[fed.clusters[near.test.owner()] == 2] == 0) > 0.98


@pytest.mark.parametrize("kappa", [0.0, 1.0])
def test_a_mixture_that_is_not_mixed_is_refused(digits: Source, kappa: float) -> None:
    """Before: κ = 0 or 1 accepted, the third true cluster then the same distribution as
    one of the others (every method scored against three clusters of two)."""
    with pytest.raises(ConfigError, match=r"makes the mixture group the (first|second) "
                                          r"angle's group again") as err:
        make_federation(digits, "rotation_mixture", {"kappa": kappa, "n_clients": 6}, seed=4)
    assert err.value.field == "scenario.kappa"


# ====================================================================== label skew


def _counts(fed: Federation, split: str) -> np.ndarray:
    _, y, off = fed.split(split)
    owner = np.repeat(np.arange(fed.n_clients), np.diff(off))
    return np.bincount(owner * 10 + y.numpy(), minlength=fed.n_clients * 10).reshape(-1, 10)


def _test_classes_follow_train(fed: Federation) -> None:
    train, test = _counts(fed, "train"), _counts(fed, "test")
    assert np.all((test > 0) <= (train > 0))  # a client is tested on classes it trains on


def test_dirichlet(digits: Source) -> None:
    skewed = make_federation(digits, "dirichlet", {"n_clients": 20, "alpha": 0.05}, seed=0)
    flat = make_federation(digits, "dirichlet", {"n_clients": 20, "alpha": 1000.0}, seed=0)
    assert skewed.clusters is None
    assert skewed.train_sizes.sum() == len(digits.y_train)  # every sample used once
    def held(f: Federation) -> float:
        return float((_counts(f, "train") > 0).sum(axis=1).mean())

    assert held(skewed) < 4 and held(flat) == 10
    _test_classes_follow_train(skewed)
    many = make_federation(digits, "dirichlet", {"n_clients": 100, "min_samples": 5}, seed=0)
    assert many.train_sizes.min() >= 5


def test_cluster_dirichlet(digits: Source) -> None:
    params = {"n_clients": 12, "n_clusters": 3, "alpha1": 0.1, "alpha2": 10.0}
    fed = make_federation(digits, "cluster_dirichlet", params, seed=1)
    train = _counts(fed, "train")
    per_cluster = np.stack([train[fed.clusters == g].sum(0) for g in range(3)])
    assert per_cluster.tolist() == [c["train_class_counts"] for c in fed.meta["clusters"]]
    shares = per_cluster / per_cluster.sum(axis=0, keepdims=True)
    assert np.mean(shares.max(axis=0)) > 0.6  # α1 = 0.1: most of a class in one cluster
    _test_classes_follow_train(fed)


def test_n_class(digits: Source) -> None:
    fed = make_federation(digits, "n_class", {"n_clients": 40, "n": 3}, seed=2)
    train = _counts(fed, "train")
    assert np.all((train > 0).sum(axis=1) == 3)
    chosen = np.array(fed.meta["client_classes"])
    assert all(set(np.flatnonzero(train[i])) == set(chosen[i]) for i in range(40))
    _test_classes_follow_train(fed)
    even = make_federation(digits, "n_class", {"n_clients": 20, "n": 2,
                                                "samples_per_client": 20}, seed=2)
    assert np.all(even.train_sizes == 20) and set(_counts(even, "train").ravel()) <= {0, 10}
    with pytest.raises(ConfigError) as err:
        make_federation(digits, "n_class", {"n": 11}, seed=0)
    assert err.value.field == "scenario.n"


def test_cluster_n_class(digits: Source) -> None:
    params = {"n_clients": 30, "n_clusters": 5, "n1": 3, "n2": 2}
    fed = make_federation(digits, "cluster_n_class", params, seed=3)
    train = _counts(fed, "train")
    sets = [set(c["classes"]) for c in fed.meta["clusters"]]
    assert all(len(s) == 3 for s in sets)
    uses = np.bincount([k for s in sets for k in s], minlength=10)
    assert set(uses) <= {1, 2}  # 15 slots over 10 classes, balanced
    for i in range(30):
        held = set(np.flatnonzero(train[i]))
        assert len(held) == 2 and held <= sets[fed.clusters[i]]
    _test_classes_follow_train(fed)


def test_cluster_labels_disjoint_and_overlapping(digits: Source) -> None:
    fed = make_federation(digits, "cluster_labels", {"n_clients": 20}, seed=0)
    sets = [set(c["classes"]) for c in fed.meta["clusters"]]
    assert all(len(s) == 2 for s in sets) and len(set.union(*sets)) == 10
    assert len(set(fed.train_sizes)) == 1  # equal samples per client
    train = _counts(fed, "train")
    assert all(set(np.flatnonzero(train[i])) <= sets[fed.clusters[i]] for i in range(20))
    _test_classes_follow_train(fed)
    over = make_federation(digits, "cluster_labels",
                           {"n_clients": 20, "label_sets": "overlapping"}, seed=0)
    osets = [set(c["classes"]) for c in over.meta["clusters"]]
    assert all(len(s) == 3 for s in osets)
    assert all(len(osets[g] & osets[(g + 1) % 5]) == 1 for g in range(5))


def test_cluster_labels_explicit_sets_and_sizes(digits: Source) -> None:
    params = {"n_clients": 4, "n_clusters": 2, "class_sets": [[0, 1, 2], [2, 3, 7]],
              "samples_per_client": 50}
    fed = make_federation(digits, "cluster_labels", params, seed=0)
    assert [c["classes"] for c in fed.meta["clusters"]] == [[0, 1, 2], [2, 3, 7]]
    assert fed.train_sizes.tolist() == [50] * 4
    with pytest.raises(ConfigError) as err:
        make_federation(digits, "cluster_labels", {**params, "samples_per_client": 500}, seed=0)
    assert err.value.field == "scenario.samples_per_client"


def test_power_law_sizes_hand_values() -> None:
    sizes, beta = power_law_sizes(44, 4, 10, 1.0)  # exactly (α + 1) each: β = 0
    assert sizes.tolist() == [11, 11, 11, 11] and beta == 0.0
    sizes, beta = power_law_sizes(1000, 5, 2, 1.0)
    exact = 2 + np.exp(beta * np.arange(1, 6))
    assert exact.sum() == pytest.approx(1000)
    assert sizes.tolist() == np.floor(exact).astype(int).tolist()
    with pytest.raises(ConfigError):
        power_law_sizes(40, 4, 10, 1.0)


def test_power_law(digits: Source) -> None:
    params = {"n_clients": 20, "alpha": 3, "delta": 1.0}
    fed = make_federation(digits, "power_law", params, seed=0)
    for g in range(5):
        sizes = fed.train_sizes[fed.clusters == g]
        assert np.all(np.diff(sizes) >= 0) and sizes[0] >= 4 and sizes[-1] > 3 * sizes[0]
    _test_classes_follow_train(fed)
    assert all("beta" in c for c in fed.meta["clusters"])


# ====================================================================== regression


def test_linear_regression() -> None:
    params = {"n_clients": 6, "samples_per_client": 2000, "noise_std": 0.2}
    fed = make_federation("synthetic_regression", "linear_regression", params, seed=0)
    assert fed.task == "regression" and fed.input_shape == (1,)
    assert [c["angle"] for c in fed.meta["clusters"]] == [20.0, 0.0, -20.0]
    for g, phi in enumerate(np.deg2rad([20.0, 0.0, -20.0])):
        rows = np.concatenate([np.arange(fed.train_offsets[i], fed.train_offsets[i + 1])
                               for i in np.flatnonzero(fed.clusters == g)])
        x, y = fed.x_train[rows, 0].double().numpy(), fed.y_train[rows].double().numpy()
        assert x.min() >= 0 and x.max() <= np.cos(phi) + 1e-6
        slope, intercept = np.polyfit(x, y, 1)
        assert slope == pytest.approx(np.tan(phi), abs=0.05)
        assert np.std(y - slope * x - intercept) == pytest.approx(0.2, abs=0.01)
    assert fed.test_sizes.tolist() == [100] * 6


def test_incompatible_sources(digits: Source) -> None:
    with pytest.raises(ConfigError, match="synthetic_regression") as err:
        make_federation(digits, "linear_regression", {}, seed=0)
    assert err.value.field == "source"
    with pytest.raises(ConfigError, match="classification") as err:
        make_federation("synthetic_regression", "rotation", {}, seed=0)
    assert err.value.field == "source"


# ====================================================================== validation


@pytest.mark.parametrize(("name", "raw", "field", "text"), [
    ("dirichlet", {"alpha": -1}, "scenario.alpha", "greater than 0"),
    ("dirichlet", {"alpha": "abc"}, "scenario.alpha", "valid number"),
    ("dirichlet", {"alfa": 0.1}, "scenario.alfa",
     "allowed: n_clients, holdout, alpha, min_samples"),
    ("rotation", {"layout": "diagonal"}, "scenario.layout", "'split' or 'cflgp'"),
    ("rotation", {"angles": "tilted"}, "scenario.angles", "ifca, cflgp"),
    ("rotation", {"angles": []}, "scenario.angles", "at least one angle"),
    # two clusters of one distribution, each accepted silently (a "true K" nobody can find)
    ("rotation", {"angles": [0, 90, 0]}, "scenario.angles", "0 and 0 are the same rotation"),
    ("rotation", {"angles": [0, 360]}, "scenario.angles", "0 and 360 are the same rotation"),
    ("rotation", {"angles": [90, -270]}, "scenario.angles", "90 and -270 are the same"),
    ("cluster_partitioner", {"angles": [0, 0]}, "scenario.angles", "the same rotation"),
    ("rotation_mixture", {"angles": [180, -180]}, "scenario.angles",
     "180 and -180 are the same rotation: the three groups would share one distribution"),
    ("iid", {"n_clients": 0}, "scenario.n_clients", "greater than or equal to 1"),
    ("rotation_mixture", {"kappa": 1.5}, "scenario.kappa", "less than or equal to 1"),
])
def test_scenario_params_errors(name: str, raw: dict, field: str, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        scenario_params(name, raw)
    assert err.value.field == field
    assert text in err.value.message


@pytest.mark.parametrize(("name", "raw", "text"), [
    ("label_swap", {"n_clusters": 2, "pairs": [[1, 2], [1, 2]]}, "the swap [1, 2] is given twice"),
    ("label_swap", {"n_clusters": 3, "pairs": [[1, 2], [3, 4], [2, 1]]},
     "the swap [2, 1] is given twice"),
])
def test_a_label_swap_given_twice_is_refused(digits: Source, name: str, raw: dict,
                                             text: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_federation(digits, name, raw, seed=0)
    assert err.value.field == "scenario.pairs" and text in err.value.message
    distinct = make_federation(digits, name, {**raw, "pairs": [[1, 2], [3, 4], [5, 6]][
        :raw["n_clusters"]]}, seed=0)
    assert len(np.unique(distinct.clusters)) == raw["n_clusters"]


@pytest.mark.parametrize("name", ["cluster_labels", "power_law"])
def test_a_label_set_given_twice_is_refused(digits: Source, name: str) -> None:
    raw = {"n_clients": 8, "n_clusters": 2, "class_sets": [[0, 1], [1, 0]]}
    with pytest.raises(ConfigError) as err:
        make_federation(digits, name, raw, seed=0)
    assert err.value.field == "scenario.class_sets"
    assert "the label set [0, 1] is given twice" in err.value.message
    fed = make_federation(digits, name, {**raw, "class_sets": [[0, 1], [1, 2]]}, seed=0)
    assert len(np.unique(fed.clusters)) == 2


def test_regression_angles_given_twice_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        make_federation("synthetic_regression", "linear_regression",
                        {"n_clusters": 3, "angles": [10, 10, -10]}, seed=0)
    assert err.value.field == "scenario.angles" and "lists an angle twice" in err.value.message
    assert make_federation("synthetic_regression", "linear_regression",
                           {"n_clusters": 3, "angles": [10, 0, -10]}, seed=0).clusters.max() == 2


def test_a_validators_own_words_come_without_pydantics_tag() -> None:
    with pytest.raises(ConfigError) as err:
        scenario_params("rotation", {"angles": [0, 0]})
    assert err.value.message.startswith("0 and 0 are the same rotation")  # no "Value error, "


def test_unknown_scenario_and_prefix(digits: Source) -> None:
    with pytest.raises(ConfigError, match="allowed: iid, label_swap") as err:
        scenario_params("spiral", {})
    assert err.value.field == "scenario"
    with pytest.raises(ConfigError) as err:
        scenario_params("dirichlet", {"alpha": 0}, field_prefix="data.scenario")
    assert err.value.field == "data.scenario.alpha"
    assert scenario_params("rotation", {"angles": "cflgp"}).angles == list(CFLGP_ANGLES)
    with pytest.raises(ConfigError) as err:
        make_federation(digits, "iid", {"n_clients": 5000}, seed=0)
    assert err.value.field == "scenario.n_clients"


def test_defaults_on_real_sizes() -> None:
    """Default parameters of the label-skew scenarios on MNIST-sized labels."""
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 10, 60000))
    source = Source(torch.zeros(60000, 1), labels, torch.zeros(10000, 1),
                    torch.from_numpy(rng.integers(0, 10, 10000)), 10, "classification", "fake")
    fed = make_federation(source, "cluster_labels", {}, seed=0)
    assert fed.n_clients == 100 and fed.train_sizes.min() > 500


# ====================================================================== speed and helpers


def test_dirichlet_60k_over_1000_clients_is_fast() -> None:
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 10, 60000))
    test_labels = torch.from_numpy(rng.integers(0, 10, 10000))
    source = Source(torch.zeros(60000, 1), labels, torch.zeros(10000, 1), test_labels, 10,
                    "classification", "fake")
    params = scenario_params("dirichlet", {"n_clients": 1000, "alpha": 0.1})
    start = time.perf_counter()
    plan = plan_dirichlet(source, params, np.random.default_rng(0))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"Dirichlet partition took {elapsed:.2f} s"
    assert plan.train.sizes.min() >= 1 and plan.test.sizes.min() >= 1
    assert len(np.unique(plan.train.index)) == 60000


def test_proportional_counts_exact() -> None:
    weights = np.array([[1, 0], [1, 3], [1, 1]])
    counts = proportional_counts(weights, np.array([10, 7]))
    assert counts.sum(axis=0).tolist() == [10, 7]
    assert counts[:, 0].tolist() in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    assert counts[:, 1].tolist() == [0, 5, 2]  # 5.25 → 5, 1.75 → 2


@pytest.mark.parametrize("scenario", ["rotation", "cluster_partitioner"])
def test_too_few_clients_for_the_angles_names_the_angles_not_a_missing_field(
        digits: Source, scenario: str) -> None:
    # it said "scenario.n_clusters: 4 clusters need ...", a field rotation does not have
    with pytest.raises(ConfigError) as err:
        make_federation(digits, scenario, {"n_clients": 2, "angles": [0, 90, 180, 270]},
                        seed=0)
    assert err.value.field == "scenario.angles"
    assert "4 angles make 4 clusters, which need at least as many clients (n_clients = 2)" \
        in str(err.value)
    assert "n_clusters" not in str(err.value)


@pytest.mark.parametrize(("scenario", "params", "field", "words"), [
    ("rotation", {"n_clients": 4, "angles": [0, float("nan")]}, "scenario.angles.1",
     "finite number"),  # made every image of clients 2 and 3 nan
    ("rotation", {"n_clients": 4, "angles": [0, float("inf")]}, "scenario.angles.1",
     "finite number"),
    ("dirichlet", {"n_clients": 4, "alpha": float("inf")}, "scenario.alpha", "finite number"),
    ("dirichlet_rotation", {"n_clients": 4, "angles": [0, 360]}, "scenario.angles",
     "0 and 360 are the same rotation"),  # two true clusters of one distribution
    ("cluster_n_class", {"n_clients": 6, "n_clusters": 3, "n1": 5, "n2": 2},
     "scenario.n_clusters", "repeat a class set (2 distinct)"),
    # a check of several fields names the one it blames (it said "scenario"), and its value
    ("n_class", {"n_clients": 4, "n": 3, "samples_per_client": 2}, "scenario.samples_per_client",
     "samples_per_client = 2 cannot hold n = 3 classes"),  # meta listed 3, data held 2
    ("cluster_partitioner", {"n_clients": 6, "n_train_per_client": 10},
     "scenario.n_train_per_client",
     "n_train_per_client is not used by cluster_partitioner"),  # accepted and ignored
    ("cluster_partitioner", {"n_clients": 6, "layout": "cflgp"}, "scenario.layout",
     "layout is not used by cluster_partitioner"),
    ("rotation", {"angles": [0, 90], "clients_per_group": [1, 2, 29]},
     "scenario.clients_per_group", "needs 2 positive counts (one per angle) summing to "
     "n_clients = 32 (got [1, 2, 29])"),  # said "scenario" and the whole table
    ("dirichlet_rotation", {"n_clients": 4, "n_samples": 10**6}, "scenario.n_samples",
     "1000000 training rows asked, the split has 1347"),  # clamped without a word
    # more clients than rows: a billion ran out of memory making the plan (every scenario),
    # cluster_partitioner raised flwr_datasets' IndexError
    *((name, {"n_clients": n}, "scenario.n_clients", f"{n} clients need a training and a test "
       "row each; 'digits' has 1347 training and 450 test rows; allowed: 1..450")
      for name in ("iid", "dirichlet", "power_law", "cluster_partitioner")
      for n in (451, 10**9)),
    ("cluster_partitioner", {"n_clients": 4, "partitioner": "shard",
                             "options": {"num_shards_per_partition": 10**6}},
     "scenario.options", "ShardPartitioner of flwr_datasets refused"),  # ZeroDivisionError
    ("rotation", {"n_clients": 4, "angles": [0, 1e308]}, "scenario.angles",
     "1e+308 is no angle in degrees; allowed: -360..360"),  # taken, a float remainder
    ("rotation_mixture", {"angles": [0, 400]}, "scenario.angles", "allowed: -360..360"),
    ("linear_regression", {"n_clients": 10**9}, "scenario.n_clients",
     "= 110000000000 rows to generate; allowed: at most 10000000"),  # out of memory
    ("linear_regression", {"samples_per_client": 10**7}, "scenario.samples_per_client",
     "= 120001200 rows to generate"),
    ("linear_regression", {"noise_std": 1e39}, "scenario.noise_std",
     "less than or equal to 1000000"),  # overflowed float32: targets inf, unsaid
], ids=["nan_angle", "inf_angle", "inf_alpha", "same_rotation", "repeated_class_set",
        "fewer_rows_than_classes", "partitioner_sizes", "partitioner_layout",
        "group_counts", "more_rows_than_the_split",
        *(f"{name}_{n}_clients" for name in ("iid", "dirichlet", "power_law",
                                             "cluster_partitioner") for n in (451, 10**9)),
        "shards_beyond_rows", "huge_angle", "mixture_angle", "regression_clients",
        "regression_rows", "regression_noise"])
def test_scenario_settings_that_contradict_their_data_are_refused(
        digits: Source, scenario: str, params: dict[str, Any], field: str, words: str) -> None:
    source = load_source("synthetic_regression") if scenario == "linear_regression" else digits
    with pytest.raises(ConfigError) as err:
        make_federation(source, scenario, params, seed=0)
    assert err.value.field == field and words in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_the_refusals_leave_the_valid_neighbours_alone(digits: Source) -> None:
    fed = make_federation(digits, "cluster_n_class",
                          {"n_clients": 10, "n_clusters": 5, "n1": 3, "n2": 2}, seed=0)
    sets = [frozenset(c["classes"]) for c in fed.meta["clusters"]]
    assert len(set(sets)) == 5  # overlapping windows, each its own set
    fed = make_federation(digits, "n_class", {"n_clients": 4, "n": 3, "samples_per_client": 3},
                          seed=0)
    _, y, offsets = fed.split("train")
    for i, classes in enumerate(fed.meta["client_classes"]):
        assert set(y[offsets[i]:offsets[i + 1]].tolist()) == set(classes)
    fed = make_federation(digits, "dirichlet_rotation", {"n_clients": 4}, seed=0)
    assert fed.meta["n_samples"] == len(digits.y_train)  # the default 200,000: all 1347


@pytest.mark.parametrize("scenario", ["cluster_partitioner", "dirichlet_rotation"])
def test_the_written_back_defaults_of_the_new_refusals_load_again(digits: Source,
                                                                  scenario: str) -> None:
    # a run's config.toml writes every default (layout, n_samples = 200000 ...): the checks
    # refuse values set away from the defaults, not defaults written out
    from clusterfl.data.scenarios import scenario_params

    dumped = scenario_params(scenario, {"n_clients": 6}).model_dump()
    fed = make_federation(digits, scenario, {k: v for k, v in dumped.items() if v is not None},
                          seed=0)
    assert fed.n_clients == 6


def _class_mixes(fed: Federation, split: str) -> np.ndarray:
    """Each client's class counts `[C, K]` of one split, counted row by row."""
    _, y, offsets = fed.split(split)
    return np.stack([np.bincount(y[a:b].numpy(), minlength=fed.n_classes)
                     for a, b in pairwise(offsets)])


def test_test_rows_matched_makes_each_clients_test_mix_follow_its_training_mix(
        digits: Source) -> None:
    """With samples_per_client leaving rows unused, a class few clients hold gave them all of
    its test rows: n_class (10 clients, n = 2, 31 rows each) had clients whose test mix was a
    total-variation distance 0.249 from their training mix (mean 0.160). `test_rows =
    "matched"` hands out each class's test rows in the share its used training rows make."""
    params = {"n_clients": 10, "n": 2, "samples_per_client": 31}
    results = {}
    for rows in ("all", "matched"):
        fed = make_federation(digits, "n_class", {**params, "test_rows": rows}, seed=0)
        train, test = _class_mixes(fed, "train"), _class_mixes(fed, "test")
        tvd = 0.5 * np.abs(train / train.sum(1, keepdims=True)
                           - test / test.sum(1, keepdims=True)).sum(1)
        results[rows] = (train, test, tvd)
    train, test, tvd = results["all"]
    assert round(float(tvd.max()), 3) == 0.249 and test.sum() == 405  # every held class's rows
    train_m, test_m, tvd_m = results["matched"]
    assert (train_m == train).all()  # the training rows are the same
    assert tvd_m.max() < 0.03
    # per class: round(test rows · used training rows / training rows), by hand
    have_train = np.bincount(digits.y_train.numpy(), minlength=10)
    have_test = np.bincount(digits.y_test.numpy(), minlength=10)
    used = train.sum(0)
    assert test_m.sum(0).tolist() == [int(a * u / t + 0.5) for a, u, t in
                                      zip(have_test, used, have_train, strict=True)]
    # the default is "all": the federation of every config without test_rows is unchanged
    default = make_federation(digits, "n_class", params, seed=0)
    assert (_class_mixes(default, "test") == test).all()
    with pytest.raises(ConfigError) as err:  # no row unused: matched would change nothing
        make_federation(digits, "n_class", {"n_clients": 10, "test_rows": "matched"}, seed=0)
    assert err.value.field == "scenario.test_rows" and "changes nothing here" in str(err.value)


@pytest.mark.parametrize(("name", "params", "before", "after"), [
    ("cluster_n_class", {"n_clients": 10, "samples_per_client": 31}, 0.238, 0.029),
    ("cluster_labels", {"n_clients": 10, "samples_per_client": 20}, 0.105, 0.05),
])
def test_test_rows_matched_in_the_other_subsampling_scenarios(
        digits: Source, name: str, params: dict, before: float, after: float) -> None:
    """The largest distance between a client's training and test class mix, measured."""
    worst = {}
    for rows in ("all", "matched"):
        fed = make_federation(digits, name, {**params, "test_rows": rows}, seed=0)
        train, test = _class_mixes(fed, "train"), _class_mixes(fed, "test")
        worst[rows] = round(float((0.5 * np.abs(train / train.sum(1, keepdims=True) - test
                                                / test.sum(1, keepdims=True)).sum(1)).max()), 3)
    assert worst == {"all": before, "matched": after}


def test_power_law_takes_test_rows_as_the_other_label_set_scenarios(digits: Source) -> None:
    """power_law had no test_rows ("unknown parameter"), though cluster_labels, its sibling,
    has. Its clients share out every row of their cluster's classes (but the sizes' rounding:
    534 of the 539 rows of two clusters here), so "all" is its data as it was and "matched",
    which would move one test row of 179, is refused as for n_class without
    samples_per_client."""
    params = {"n_clients": 10, "n_clusters": 2}
    default = make_federation(digits, "power_law", params, seed=0)
    explicit = make_federation(digits, "power_law", {**params, "test_rows": "all"}, seed=0)
    for split in ("train", "test"):
        assert (_class_mixes(explicit, split) == _class_mixes(default, split)).all()
    assert _class_mixes(default, "train").sum() == 534
    assert _class_mixes(default, "test").sum() == 179
    with pytest.raises(ConfigError) as err:
        make_federation(digits, "power_law", {**params, "test_rows": "matched"}, seed=0)
    assert err.value.field == "scenario.test_rows"
    assert "changes nothing here: power_law hands out every training row" in str(err.value)
    assert "allowed: 'all'" in str(err.value)
