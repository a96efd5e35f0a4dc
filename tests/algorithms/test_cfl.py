"""CFL (Sattler et al. 2020) end to end: clustering found against the true clusters, congruent
clients kept together, privacy, parameter tree and Algorithm 4, checkpoint/resume, config
layouts, CLI and figures. The split rules' conditions are tested on hand-built clusters in
tests/clustering/test_split_rule.py."""

from __future__ import annotations

import argparse
import io
import json
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.core.conftest import blob_federation

from clusterfl.algorithms.base import Context
from clusterfl.algorithms.cfl import CFL, CFLConfig, ClientSide, ParameterTree, TreeNode
from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.clustering.split_rule import AutoRuleConfig, Refusal
from clusterfl.config import load_config
from clusterfl.data.federation import Federation
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.metrics import ari
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import EvaluateRequest, LocalTraining, LossRequest, TrainRequest

TRAIN = LocalTraining(lr=0.1, batch_size=16, epochs=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """The machine is shared: one intra-op thread keeps these small models fast."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_ctx(fed: Federation, backend: Any = None, seed: int = 0) -> Context:
    f = ModelFactory(model_config({"name": "mlp", "hidden": [16]}), fed.input_shape,
                     fed.n_outputs)
    be = backend if backend is not None else SequentialBackend(fed, f)
    return Context(be, f, TRAIN, fed.n_clients, fed.train_sizes,
                   np.random.default_rng(seed), seed=seed, true_clusters=fed.clusters)


def run(alg: CFL, ctx: Context, rounds: int) -> list[dict[str, Any]]:
    alg.setup(ctx)
    return [alg.run_round(ctx, t).to_dict() for t in range(1, rounds + 1)]


def accuracy(predictor: Any, ctx: Context) -> np.ndarray:
    return ctx.backend.execute(EvaluateRequest(np.arange(ctx.n_clients), predictor)).accuracy


# thresholds from the norms of these blob federations: incongruent clients keep a max update
# norm of ~0.5 while the mean falls below 0.1; congruent ones fall below 0.2 together
BLOB = {"split_rule": "epsilon", "eps1": 0.1, "eps2": 0.3}


# ---------------------------------------------------------------------------- clustering


def test_successive_splits_find_three_clusters_and_beat_fedavg():
    fed = blob_federation(n_clients=9, n_clusters=3)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(**BLOB))
    extras = run(alg, ctx, 9)
    split_rounds = [t for t, e in enumerate(extras, 1) if e["split"]]
    assert len(split_rounds) == 2 and split_rounds[0] < split_rounds[1]  # one split at a time
    assert ari(fed.clusters, alg.assignment()) == 1.0
    assert alg.n_clusters() == 3 and extras[-1]["n_clusters"] == 3
    # the tree: root → 2 children, one of which splits again; leaves hold disjoint clients
    assert len(alg.tree.nodes) == 5 and alg.tree.root.split_round == split_rounds[0]
    leaves = alg.tree.leaves()
    assert sorted(np.concatenate([v.clients for v in leaves]).tolist()) == list(range(9))
    for v in alg.tree.nodes[1:]:
        assert v.updates is not None and v.updates.shape == (len(v.clients), ctx.factory.size)
    # the separation gap was positive before each split and non-positive in the final clusters
    first = extras[split_rounds[0] - 1]
    assert first["gap"][0] > 0 and first["splits"][0]["accepted"]
    assert all(g <= 0 for g in extras[-1]["gap"])
    fedavg_ctx = make_ctx(fed)
    fedavg = FedAvg(FedAvgConfig())
    fedavg.setup(fedavg_ctx)
    for t in range(1, 10):
        fedavg.run_round(fedavg_ctx, t)
    ours, theirs = accuracy(alg.predictor(), ctx), accuracy(fedavg.predictor(), fedavg_ctx)
    assert ours.mean() > 0.9 and ours.min() > theirs.max()
    json.dumps(extras)  # history-ready


def test_no_split_on_congruent_clients():
    fed = blob_federation(n_clients=8, n_clusters=1)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(**BLOB))
    extras = run(alg, ctx, 15)
    assert not any(e["split"] for e in extras) and alg.n_clusters() == 1
    # FL converges (mean norm below ε1) while no client stays above ε2 (eqs. 30-31)
    assert extras[-1]["mean_norm"][0] < BLOB["eps1"]
    assert max(e["max_client_norm"] for e in extras[3:]) < BLOB["eps2"]
    assert accuracy(alg.predictor(), ctx).mean() > 0.9


@pytest.mark.parametrize("options", [{"bipartition": "complete"}, {"aggregation": "mean"},
                                     {"gamma_max": 0.5}])
def test_options_still_recover_the_clusters(options):
    fed = blob_federation(n_clients=6, n_clusters=2)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(**BLOB, **options))
    run(alg, ctx, 6)
    assert ari(fed.clusters, alg.assignment()) == 1.0


def test_gamma_max_rejects_splits_and_records_them():
    fed = blob_federation(n_clients=6, n_clusters=2)
    alg = CFL(CFLConfig(**BLOB, gamma_max=0.99))  # needs α_cross_max < -0.96
    extras = run(alg, make_ctx(fed), 6)
    events = [ev for e in extras for ev in e["splits"]]
    assert events and not any(ev["accepted"] for ev in events)
    assert all(ev["gamma_bound"] < 0.99 for ev in events) and alg.n_clusters() == 1


def test_warmup_and_min_split_size():
    fed = blob_federation(n_clients=6, n_clusters=2)
    early = run(CFL(CFLConfig(**BLOB)), make_ctx(fed), 6)
    t_split = next(t for t, e in enumerate(early, 1) if e["split"])
    late = run(CFL(CFLConfig(**BLOB, warmup_rounds=t_split + 1)), make_ctx(fed), t_split + 3)
    assert not any(e["split"] for e in late[: t_split + 1])
    assert any(e["split"] for e in late[t_split + 1:])
    big = CFL(CFLConfig(**BLOB, min_split_size=7))
    assert not any(e["split"] for e in run(big, make_ctx(fed), 6))


def test_weighted_cfl_before_any_split_is_fedavg():
    """Eq. (2): until the first split, CFL with weighted aggregation is FedAvg."""
    fed = blob_federation(n_clients=6, n_clusters=2)  # unequal client sizes
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(split_rule="epsilon", eps1=1e-9))
    alg.setup(ctx)
    ref_ctx = make_ctx(fed)
    ref_ctx.rng.bit_generator.state = ctx.rng.bit_generator.state
    ref = FedAvg(FedAvgConfig())
    ref.setup(ref_ctx)
    for t in range(1, 4):
        alg.run_round(ctx, t)
        ref.run_round(ref_ctx, t)
    torch.testing.assert_close(alg.model_of(0), ref.state.model[0], atol=1e-6, rtol=0)
    unweighted = CFL(CFLConfig(split_rule="epsilon", eps1=1e-9, aggregation="mean"))
    u_ctx = make_ctx(fed)
    run(unweighted, u_ctx, 3)
    assert (unweighted.model_of(0) - ref.state.model[0]).abs().max() > 1e-5


class Spy(SequentialBackend):
    """Records every train request and the plain updates clients computed."""

    def __init__(self, fed: Federation, factory: ModelFactory) -> None:
        super().__init__(fed, factory)
        self.lrs: list[float] = []
        self.plain: list[torch.Tensor] = []

    def train(self, req: TrainRequest):  # type: ignore[no-untyped-def]
        reply = super().train(req)
        self.lrs.append(req.training.lr)
        start = req.models[torch.as_tensor(req.model_of_client, dtype=torch.long)]
        self.plain.append(reply.params - start)
        return reply


def test_lr_decay_per_round():
    fed = blob_federation(n_clients=4, n_clusters=1)
    f = ModelFactory(model_config({"name": "mlp", "hidden": [16]}), fed.input_shape, 3)
    spy = Spy(fed, f)
    run(CFL(CFLConfig(lr_decay=0.9)), make_ctx(fed, spy), 3)
    np.testing.assert_allclose(spy.lrs, [0.1, 0.09, 0.081])


# ---------------------------------------------------------------------------- privacy


def test_privacy_same_clustering_and_no_plain_update_reaches_the_server(monkeypatch):
    fed = blob_federation(n_clients=9, n_clusters=3)
    plain_alg = CFL(CFLConfig(**BLOB))
    plain_extras = run(plain_alg, make_ctx(fed), 8)

    f = ModelFactory(model_config({"name": "mlp", "hidden": [16]}), fed.input_shape, 3)
    spy = Spy(fed, f)
    received: list[torch.Tensor] = []
    original = ClientSide.uploads

    def watched(self: ClientSide, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        received.append(out)  # what the server gets back
        return out

    monkeypatch.setattr(ClientSide, "uploads", watched)
    private = CFL(CFLConfig(**BLOB, privacy=True))
    private_extras = run(private, make_ctx(fed, spy), 8)

    assert [e["split"] for e in private_extras] == [e["split"] for e in plain_extras]
    np.testing.assert_array_equal(private.assignment(), plain_alg.assignment())
    assert ari(fed.clusters, private.assignment()) == 1.0
    np.testing.assert_allclose([e["max_client_norm"] for e in private_extras],
                               [e["max_client_norm"] for e in plain_extras], rtol=1e-6)
    # the clients' models are the same: permuting commutes with averaging (eq. 42)
    for v in private.tree.nodes:
        torch.testing.assert_close(private.model_of(v.id), plain_alg.model_of(v.id))
    # the server only ever received permuted updates ...
    assert len(received) == len(spy.plain) == 8
    for got, plain in zip(received, spy.plain):
        assert not torch.allclose(got, plain)
        torch.testing.assert_close(got.sort(dim=1).values, plain.sort(dim=1).values)
    # ... and keeps no plain update or model in its tree
    plain_rows = torch.cat(spy.plain)
    for v in private.tree.nodes[1:]:
        assert v.updates is not None
        for row in v.updates:
            assert not torch.isclose(plain_rows, row[None]).all(dim=1).any()
    server_view = private.tree.nodes[1].model
    assert not torch.allclose(private.clients.base + server_view, private.model_of(1))


# ---------------------------------------------------------------------------- state


def test_state_round_trip_continues_identically():
    """The checkpoint is `CFLState` (tree, devices, pending, choices); a CFL loaded from it
    without `setup` (as `clusterfl cfl-place` does) continues exactly, privacy included."""
    fed = blob_federation(n_clients=6, n_clusters=2)
    cfg = CFLConfig(**BLOB, privacy=True, keep_best="train")
    ctx = make_ctx(fed)
    alg = CFL(cfg)
    run(alg, ctx, 6)
    assert alg.n_clusters() == 2 and alg.state.choice is not None
    buffer = io.BytesIO()
    torch.save(alg.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    assert "tree" in saved  # what `cfl-place` checks a checkpoint for
    copy = CFL(cfg)
    copy.load_state_dict(saved)
    assert isinstance(copy.tree, ParameterTree) and all(
        isinstance(v, TreeNode) for v in copy.tree.nodes)
    assert copy.tree.nodes[1].updates is not None and copy.tree.root.updates is None
    assert copy.state.pending == alg.state.pending and copy.clients is not alg.clients
    torch.testing.assert_close(copy.clients.base, alg.clients.base, rtol=0, atol=0)
    twin = make_ctx(fed)
    twin.rng.bit_generator.state = ctx.rng.bit_generator.state
    for t in range(7, 10):
        assert copy.run_round(twin, t) == alg.run_round(ctx, t)
    a, b = alg.predictor(), copy.predictor()
    assert torch.equal(a.models, b.models) and np.array_equal(a.members, b.members)
    assert all(torch.equal(v.model, w.model) for v, w in zip(alg.tree.nodes, copy.tree.nodes,
                                                             strict=True))


# ---------------------------------------------------------------------------- Algorithm 4


def test_held_out_clients_land_in_their_true_cluster():
    full = blob_federation(n_clients=12, n_clusters=3)
    train = full.subset(np.arange(9))
    alg = CFL(CFLConfig(**BLOB))
    run(alg, make_ctx(train), 10)
    assert ari(train.clusters, alg.assignment()) == 1.0
    ctx_full = make_ctx(full, seed=5)
    placed = alg.walk(ctx_full, [9, 10, 11, 0])
    leaf_truth = {v.id: set(train.clusters[v.clients].tolist()) for v in alg.tree.leaves()}
    for p in placed:
        assert leaf_truth[p.leaf] == {int(full.clusters[p.client])}
        assert p.path[0] == 0 and p.path[-1] == p.leaf and len(p.similarities) == len(p.path) - 1
        assert alg.tree.path(p.leaf) == p.path
    # client 0 took part in training: it goes back to its own leaf
    assert placed[-1].leaf == alg.assignment()[0]


def test_keep_best_picks_the_best_model_on_the_path():
    fed = blob_federation(n_clients=6, n_clusters=2)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(**BLOB, keep_best="train"))
    run(alg, ctx, 6)
    assert alg.n_clusters() == 2
    choice = alg.predictor().members[:, 0]
    for leaf in alg.tree.leaves():
        path = alg.tree.path(leaf.id)
        models = torch.stack([alg.model_of(v) for v in path])
        acc = ctx.backend.execute(LossRequest(leaf.clients, models, "train")).accuracy
        for k, c in enumerate(leaf.clients):
            best = max(range(len(path)), key=lambda j, k=k: (acc[k, j], j))
            assert choice[c] == path[best]
    # choices stay on each client's own path
    for c in range(6):
        assert choice[c] in alg.tree.path(int(alg.assignment()[c]))


# ---------------------------------------------------------------------------- the auto rule


def tiny_rotation(angles: list[int], seed: int = 0) -> dict[str, Any]:
    """A demo-like federation (digits, rotation groups), 8 clients, CFL with its defaults."""
    return {"seed": seed, "rounds": 40, "eval_every": 40, "checkpoint_every": 0,
            "data": {"source": "digits"},
            "scenario": {"name": "rotation", "n_clients": 8, "angles": angles},
            "model": {"name": "mlp", "hidden": [32]},
            "train": {"lr": 0.1, "momentum": 0.5, "batch_size": 16, "epochs": 1},
            "algorithm": {"name": "cfl"}, "output": {"figures": False, "progress": "off"}}


def test_auto_rule_is_the_default_and_finds_the_rotation_groups(tmp_path: Path):
    assert CFLConfig().split_rule == "auto"
    history = Experiment.from_config(tiny_rotation([0, 90, 180, 270]), out_dir=tmp_path).run()
    last = history.records[-1]
    assert last.ari == 1.0 and last.n_clusters == 4
    splits = [r for r in history.records if r.extras["split"]]
    events = [(r, ev) for r in splits for ev in r.extras["splits"] if ev["accepted"]]
    assert len(events) == 3
    for r, ev in events:  # every accepted split met the rule, with the extras to show it
        e = r.extras
        k = e["clusters"].index(ev["node"])
        c = CFLConfig().auto
        assert e["refused"][k] is None and e["stationarity"][k] < c.stationarity_max
        assert e["cross_mean"][k] < c.separation * min(e["within_mean"][k])
        assert ev["streak"] == c.patience
        # the children record how far apart this split set them (what nesting compares)
        after = history.records[r.round].extras
        for child, within in zip(ev["children"], ev["within"]):
            k = after["clusters"].index(child)
            assert after["formed_separation"][k] == pytest.approx(within - ev["cross"])
    # the rounds before a split count the patience, with the reason recorded
    before = history.records[splits[0].round - 2].extras
    assert before["refused"][0] == "patience 2/3"
    # below the root the shuffle test needs 5 answering clients (SHUFFLE_MIN); these
    # clusters of 4 are left to nesting
    below = [p for r in history.records for k, p in enumerate(r.extras["p_value"])
             if r.extras["clusters"][k] != 0]
    assert below and all(p is None for p in below)


def test_auto_rule_does_not_split_an_iid_federation(tmp_path: Path):
    history = Experiment.from_config(tiny_rotation([0]), out_dir=tmp_path).run()
    assert all(r.n_clusters == 1 for r in history.records)
    reasons = {Refusal.read(x)[0] for r in history.records for x in r.extras["refused"]}
    assert Refusal.NOT_STATIONARY in reasons
    # a root cut refused by the shuffle test had p ≥ significance; one that went on, below
    level = CFLConfig().auto.significance
    for r in history.records:
        p, why = r.extras["p_value"][0], r.extras["refused"][0]
        if p is not None:
            assert (p >= level) == (why == Refusal.NOT_SIGNIFICANT.value)


def test_auto_rule_splits_an_incongruent_pair_and_keeps_a_congruent_one():
    """The paper's Fig. 8 on blobs: two clients with permuted labels split 1 | 1 after
    2 × patience rounds of the pair test; two clients of one distribution never split (their
    update norms collapse below 0.25 × the run's peak, or FL on them is not stationary)."""
    fed = blob_federation(n_clients=2, n_clusters=2, seed=3, per_client=60)
    alg = CFL(CFLConfig())
    extras = run(alg, make_ctx(fed, seed=3), 30)
    split = [e for e in extras if e["split"]]
    assert len(split) == 1 and split[0]["splits"][0]["groups"] == [[0], [1]]
    k = extras.index(split[0])
    assert [e["refused"][0] for e in extras[k - 5:k]] == [f"patience {i}/6" for i in range(1, 6)]
    assert all(d < 0 for e in extras[k - 5:k + 1] for d in e["drift"])
    assert ari(fed.clusters, alg.assignment()) == 1.0
    for seed in (0, 2):
        same = blob_federation(n_clients=2, n_clusters=1, seed=seed, per_client=60)
        alg = CFL(CFLConfig())
        extras = run(alg, make_ctx(same, seed=seed), 60)
        assert not any(e["split"] for e in extras)
        reasons = {e["refused"][0] for e in extras}
        assert "pair: client updates below 0.25 × peak" in reasons


def test_eps_without_a_rule_selects_epsilon_and_contradictions_are_errors():
    assert CFLConfig(eps1=0.2).split_rule == "epsilon"
    assert CFLConfig(eps2=0.2, split_rule="epsilon").split_rule == "epsilon"
    assert CFLConfig(patience=5).split_rule == "auto"
    with pytest.raises(ValueError, match="split_rule"):
        CFLConfig(eps1=0.2, split_rule="auto")
    dumped = CFLConfig().model_dump()  # what config.toml holds: loads again, still auto
    assert CFLConfig(**dumped).split_rule == "auto"


def test_eps_beside_the_auto_rule_is_an_error_naming_the_field():
    """The error named `algorithm` and quoted the whole table (every field and the auto
    sub-table) where one of eps1, eps2 was the field to change; a text equal to the default
    counted as a change."""
    base = {"output": {"progress": "off"}}
    for field in ("eps1", "eps2"):
        with pytest.raises(ConfigError) as err:
            load_config({**base, "algorithm": {"name": "cfl", "split_rule": "auto",
                                               "privacy": False, field: 0.25}})
        assert err.value.field == f"algorithm.{field}"
        assert "split_rule = 'epsilon'" in str(err.value) and "privacy" not in str(err.value)
    with pytest.raises(ConfigError) as err:  # a number as text is refused before (Settings)
        load_config({**base, "algorithm": {"name": "cfl", "split_rule": "auto",
                                           "eps1": "0.4"}})
    assert err.value.field == "algorithm.eps1" and "not text" in str(err.value)
    cfg = load_config({**base, "algorithm": {"name": "cfl", "split_rule": "auto",
                                             "eps1": 0.4}})  # the default, not a change
    assert cfg.algorithm.split_rule == "auto"  # type: ignore[attr-defined]


def test_auto_rule_state_survives_a_checkpoint():
    """The patience streak and the candidate blocks are server state: a resumed run splits in
    the same round as an uninterrupted one."""
    fed = blob_federation(n_clients=8, n_clusters=2)
    whole = CFL(CFLConfig())
    full = run(whole, make_ctx(fed), 6)
    first = CFL(CFLConfig())
    ctx = make_ctx(fed)
    head = run(first, ctx, 2)
    assert any(v.streak for v in first.state.rule.nodes.values())  # mid-streak
    second = CFL(CFLConfig())
    second.setup(make_ctx(fed))
    second.load_state_dict(first.state_dict())
    tail = [second.run_round(ctx, t).to_dict() for t in range(3, 7)]
    assert [e["refused"] for e in head + tail] == [e["refused"] for e in full]
    assert ari(fed.clusters, second.assignment()) == ari(fed.clusters, whole.assignment()) == 1.0


# ---------------------------------------------------------------------------- config layouts


def test_flat_auto_options_of_older_configs_move_into_the_sub_table():
    """The auto rule's options were flat in [algorithm]; they are read there still (and as
    `auto.<option>`, a compare spec's way), and win over the same option of the sub-table."""
    old = CFLConfig(significance=0.0, patience=5, nesting=False)
    assert (old.auto.significance, old.auto.patience, old.auto.nesting) == (0.0, 5, False)
    assert CFLConfig(**{"auto.patience": 4}).auto.patience == 4
    assert CFLConfig(auto={"patience": 4, "min_side": 3}, patience=6).auto.model_dump() == \
        {**AutoRuleConfig().model_dump(), "patience": 6, "min_side": 3}
    assert CFLConfig(auto={"separation": 0.3}).auto.separation == 0.3
    # every one of the nine older flat options still loads (and those of issue 36)
    flat = {"stationarity_max": 0.6, "separation": 0.4, "min_side": 3, "contrast_min": 1.0,
            "progress": 0.1, "progress_from": "first", "nesting": False, "significance": 0.01,
            "significance_sampled": 0.02, "null_draws": 99, "patience": 4, "test_every": False,
            "cut": "raw", "sampled_evidence": "each"}
    assert set(flat) == set(AutoRuleConfig.model_fields)
    cfg = load_config({"algorithm": {"name": "cfl", **flat}, "output": {"progress": "off"}})
    assert cfg.algorithm.auto.model_dump() == flat  # type: ignore[attr-defined]


def test_auto_options_that_another_auto_option_turns_off_are_warnings():
    """`progress_from` with progress = 0 (the default since rule v6), and the shuffle test's
    `significance_sampled`, `sampled_evidence`, `null_draws` with significance = 0, ran
    without a word; the options they depend on, set, give none."""
    assert CFLConfig(auto={"progress_from": "first"}).ignored_settings() == [
        "algorithm.auto.progress_from = 'first' does nothing: algorithm.auto.progress = 0 "
        "turns the progress condition off"]
    off = CFLConfig(auto={"significance": 0, "significance_sampled": 0.05, "null_draws": 99,
                          "sampled_evidence": "each"}).ignored_settings()
    assert [w.split(" = ")[0] for w in off] == [
        "algorithm.auto.significance_sampled", "algorithm.auto.sampled_evidence",
        "algorithm.auto.null_draws"]
    assert all(w.endswith("algorithm.auto.significance = 0 turns the shuffle test off")
               for w in off)
    assert CFLConfig(significance=0, null_draws=99).ignored_settings()[0].startswith(
        "algorithm.auto.null_draws = 99 does nothing")  # flat, as older configs have it
    for auto in ({"progress": 0.05, "progress_from": "first"}, {"significance": 0},
                 {"significance_sampled": 0.05, "null_draws": 1999, "sampled_evidence": "each"}):
        assert CFLConfig(auto=auto).ignored_settings() == []


def test_null_draws_is_bounded_and_too_few_for_a_level_is_a_warning():
    """`null_draws` had no upper bound (10**9 loaded: a billion cuts per cluster and round),
    and 99 draws beside significance = 0.002 (the smallest p-value 1 / 100 = 0.01) never let
    the test pass, without a word."""
    for value in (18, 100_000, 10**9):
        with pytest.raises(ConfigError, match=r"allowed: 19\.\.99999 \(the smallest p-value is "
                           r"1 / \(1 \+ null_draws\), 0\.05 to 1e-05\)") as err:
            load_config({"algorithm": {"name": "cfl", "auto": {"null_draws": value}}})
        assert err.value.field == "algorithm.auto.null_draws"
    assert CFLConfig(auto={"null_draws": 99_999}).auto.null_draws == 99_999
    # 1 / (1 + 499) = 0.002 is not below 0.002; 1 / 501 is
    assert CFLConfig(auto={"null_draws": 499}).ignored_settings() == [
        "algorithm.auto.null_draws = 499: the smallest p-value in a round in which every "
        "client of a cluster answered is 0.002, not below algorithm.auto.significance = "
        "0.002: the shuffle test never passes there; allowed: null_draws >= 500"]
    assert CFLConfig(auto={"null_draws": 500}).ignored_settings() == []
    # a sampled round: 1 / 100 against 0.005 (each round alone), or Fisher's combination of
    # patience = 1 p-value, 1 / 20 itself, against 0.01 (the fewest: 1 / (1 + 100) < 0.01)
    each = CFLConfig(auto={"null_draws": 99, "significance": 0.05, "sampled_evidence": "each",
                           "significance_sampled": 0.005}).ignored_settings()
    assert each == ["algorithm.auto.null_draws = 99: the smallest p-value in a sampled round "
                    "is 0.01, not below algorithm.auto.significance_sampled = 0.005: the "
                    "shuffle test never passes there; allowed: null_draws >= 200"]
    combined = CFLConfig(auto={"null_draws": 19, "significance": 0.1, "patience": 1})
    assert combined.ignored_settings() == [
        "algorithm.auto.null_draws = 19: the smallest p-value in a sampled round (Fisher's "
        "combination of 1) is 0.05, not below algorithm.auto.significance_sampled = 0.01: the "
        "shuffle test never passes there; allowed: null_draws >= 100"]
    # three rounds of 1 / 20: -2 · 3 · ln(1/20) = 17.97, chi-square(6) tail 0.0063 < 0.01
    assert CFLConfig(auto={"null_draws": 19, "significance": 0.1}).ignored_settings() == []


def test_min_side_or_min_split_size_above_the_answering_clients_is_a_warning():
    """A split needs 2 · min_side answering clients of a cluster (auto rule) and
    min_split_size of them: min_side = 11 with 20 clients, or min_split_size = 6 with 4 a
    round, ran as FedAvg without a word (the warning only compared the sample with 2 ·
    min_side, and never the whole federation)."""
    def warnings(n_clients: int, **config: Any) -> list[str]:
        return CFL(CFLConfig(**config)).check((64,), n_clients, 5)

    words = ("algorithm.auto.min_side = 11: a cluster splits only when at least 22 of its "
             "clients answer in the same round, and the federation has 20: the run will never "
             "split (it is FedAvg); allowed: 1..10")
    assert warnings(20, auto={"min_side": 11}) == [words]
    assert warnings(3) == [words.replace("= 11", "= 2").replace("22", "4")
                           .replace("has 20", "has 3").replace("1..10", "1..1")]
    assert warnings(20, auto={"min_side": 10}) == warnings(2) == warnings(6) == []
    for rule in ("auto", "epsilon"):
        [line] = warnings(20, split_rule=rule, per_round=4, min_split_size=6)
        assert line.startswith("algorithm.per_round = 4: 4 of 20 clients answer a round, and "
                               "a cluster splits only when at least 6 of its clients answer")
        assert warnings(20, split_rule=rule, per_round=6, min_split_size=6) == []


def test_a_root_too_small_for_the_shuffle_test_is_a_warning():
    """Four or five clients answering a round never pass the root's shuffle test at 0.002
    (no order of their cosines is below an exact p-value of 0.2, 1 / 84: `shuffle_floor`),
    so the run was FedAvg without a word; six can (1 / 3003)."""
    def warnings(n_clients: int, **config: Any) -> list[str]:
        return CFL(CFLConfig(**config)).check((64,), n_clients, 5)

    assert warnings(5) == [
        "algorithm.auto.significance = 0.002: the shuffle test of the 5 clients that answer a "
        "round has an exact p-value of at least 0.0119 whatever their updates, so the root "
        "never passes it: the run will not split (it is FedAvg); allowed: significance above "
        "0.0119, or at least 6 clients a round"]
    assert warnings(4)[0].startswith("algorithm.auto.significance = 0.002: the shuffle test "
                                     "of the 4 clients that answer a round has an exact "
                                     "p-value of at least 0.2 ")
    assert warnings(5, auto={"significance": 0.02}) == warnings(6) == []
    assert warnings(5, auto={"significance": 0}) == warnings(5, split_rule="epsilon") == []
    # four of twenty a round: Fisher's combination of three rounds of 0.2 is 0.14, not below
    # significance_sampled = 0.01; five a round pass it together (1.7e-4)
    [line] = warnings(20, per_round=4)
    assert line == (
        "algorithm.auto.significance_sampled = 0.01: the shuffle test of the 4 clients that "
        "answer a round has an exact p-value of at least 0.2 whatever their updates, Fisher's "
        "combination of 3 such rounds at least 0.14, so the root never passes it: the run will "
        "not split (it is FedAvg); allowed: significance_sampled above 0.14, or at least 5 "
        "clients a round")
    assert warnings(20, per_round=4, auto={"significance_sampled": 0.15}) == []
    assert warnings(20, per_round=4, auto={"sampled_evidence": "each"})[0].endswith(
        "allowed: significance_sampled above 0.2, or at least 6 clients a round")  # 1/84 > 0.01
    assert warnings(20, per_round=5) == []


def test_a_written_config_loads_again_and_names_stay():
    """A run's config.toml (the sub-table written out) loads to the same config; labels and
    run folders name the auto options as before (the compare specs of older runs)."""
    from clusterfl.compare import parse_algorithm_spec
    from clusterfl.config import dump_toml
    from clusterfl.naming import method_label, run_folder_name

    cfg = load_config({"algorithm": {"name": "cfl", "significance": 0, "gamma_max": 0.1},
                       "output": {"progress": "off"}})
    text = dump_toml(cfg.to_dict())
    assert "[algorithm.auto]" in text
    again = load_config(tomllib.loads(text))
    assert again.algorithm == cfg.algorithm
    assert method_label(cfg.algorithm) == "CFL (significance=0, gamma_max=0.1)"
    assert run_folder_name(cfg.algorithm) == "cfl_significance=0_gamma_max=0.1"
    spec = CFLConfig(**parse_algorithm_spec("cfl:auto.significance=0:gamma_max=0.1"))
    assert spec == cfg.algorithm
    assert run_folder_name(CFLConfig(split_rule="epsilon")) == "cfl_split_rule=epsilon"


def test_a_checkpoint_of_the_older_layout_loads():
    """Before the split rule had its own state, CFLState held `streak`, `candidate`,
    `last_mean`, `peak` and `first_loss` itself; such a checkpoint (or cfl_tree.pt) loads."""
    fed = blob_federation(n_clients=8, n_clusters=2)
    alg = CFL(CFLConfig())
    run(alg, make_ctx(fed), 2)
    new = alg.state_dict()
    rule = new.pop("rule")
    old = {**new, "first_loss": rule["first_loss"], "peak": rule["peak"],
           "streak": {v: s["streak"] for v, s in rule["nodes"].items() if s["streak"]},
           "candidate": {v: s["candidate"] for v, s in rule["nodes"].items()
                         if s["candidate"] is not None},
           "last_mean": {v: s["last_mean"] for v, s in rule["nodes"].items()}}
    copy = CFL(CFLConfig())
    copy.load_state_dict(old)
    assert copy.state.rule.peak == alg.state.rule.peak > 0
    assert copy.state.rule.first_loss == alg.state.rule.first_loss
    for v, s in alg.state.rule.nodes.items():
        assert copy.state.rule.nodes[v].streak == s.streak
        assert copy.state.rule.nodes[v].candidate == s.candidate
        assert torch.equal(copy.state.rule.nodes[v].last_mean, s.last_mean)


# ---------------------------------------------------------------------------- config


def test_config_errors_name_the_field():
    base = {"algorithm": {"name": "cfl"}, "output": {"progress": "off"}}
    assert load_config(base).algorithm.eps1 == 0.4  # type: ignore[attr-defined]
    for field, value in (("eps1", -1.0), ("eps2", 0), ("gamma_max", 1.0),
                         ("bipartition", "single"), ("min_split_size", 1), ("lr_decay", 1.5),
                         ("keep_best", "val"), ("warmup_rounds", -1)):
        with pytest.raises(ConfigError) as err:
            load_config({**base, "algorithm": {"name": "cfl", field: value}})
        assert err.value.field == f"algorithm.{field}"
    for field, value in (("significance", -1.0), ("patience", 0), ("null_draws", 5)):
        for raw in ({field: value}, {"auto": {field: value}}):  # flat (older) or sub-table
            with pytest.raises(ConfigError) as err:
                load_config({**base, "algorithm": {"name": "cfl", **raw}})
            assert err.value.field == f"algorithm.auto.{field}"
    with pytest.raises(ConfigError, match="unknown field"):
        load_config({**base, "algorithm": {"name": "cfl", "auto": {"patiense": 2}}})
    with pytest.raises(ConfigError, match="unknown field"):
        load_config({**base, "algorithm": {"name": "cfl", "epsilon": 1}})


# ---------------------------------------------------------------------------- end to end


LABEL_SWAP = {
    "seed": 0, "rounds": 14, "eval_every": 7, "checkpoint_every": 10,
    "data": {"source": "digits"},
    "scenario": {"name": "label_swap", "n_clients": 8, "n_clusters": 2,
                 "n_train_per_client": 150},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.1, "batch_size": 20, "epochs": 3},
    "algorithm": {"name": "cfl", "split_rule": "epsilon", "eps1": 0.35, "eps2": 0.6},
    "output": {"figures": False, "progress": "off"},
}


@pytest.fixture(scope="module")
def label_swap_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("cfl_label_swap")
    exp = Experiment.from_config(LABEL_SWAP, out_dir=out)
    history = exp.run()
    exp.algorithm.save_artifacts(out, LABEL_SWAP["rounds"])  # type: ignore[attr-defined]
    return out, history


def test_label_swap_digits_recovers_clusters(label_swap_run):
    _, history = label_swap_run
    first, last = history.records[0], history.records[-1]
    assert last.ari == 1.0 and last.n_clusters == 2
    splits = [r.round for r in history.records if r.extras["split"]]
    assert len(splits) == 1
    before = next(r for r in history.records if r.metrics and r.round < splits[0])
    assert last.metrics.accuracy > before.metrics.accuracy + 0.1
    assert first.n_clusters == 1 and first.floats_up == first.floats_down > 0


def test_resume_from_checkpoint_ends_identically(label_swap_run):
    out, history = label_swap_run
    resumed = Experiment.from_config(LABEL_SWAP, out_dir=out).run(resume=True)
    for a, b in zip(history.records, resumed.records, strict=True):
        assert replace(a, wall_time=0.0) == replace(b, wall_time=0.0)


def test_figures_hook(label_swap_run):
    from clusterfl.report.methods.cfl import figures

    out, history = label_swap_run
    paths = figures(out, history.records, history.summary)
    names = {p.name for p in paths}
    assert {"cfl_norms.png", "cfl_accuracy_gap.png"} <= names
    assert any(n.startswith("cfl_similarity_") for n in names)
    assert all(p.is_file() and p.stat().st_size > 1000 for p in paths)


def test_split_test_figure_names_each_refusal():
    """The decision rows of `cfl_split_test.png` read the history's reasons back as `Refusal`s
    (numbers dropped from patience and progress, kept for the pair's norm share)."""
    from clusterfl.report.methods.cfl import _short

    assert _short("patience 2/3") == _short("patience 5/6") == "patience"
    assert _short("no progress: loss ≥ 0.95 × first round's") == "no progress"
    assert _short("pair: client updates below 0.25 × peak") == "pair: norms below 0.25 × peak"
    assert _short("sides less apart than when the cluster formed") == \
        "less apart than when formed"
    assert _short("not stationary") == "not stationary" and _short("other") == "other"
    assert _short("cut not beyond shuffled cosines (5 clients never reach p < 0.002: exact "
                  "p ≥ 0.0119)") == "not beyond shuffles (5: too few)"


def test_cli_place(label_swap_run, capsys, tmp_path):
    from clusterfl.cli_place import add_parser, parse_clients

    out, _ = label_swap_run
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    dest = tmp_path / "placed.json"  # outside the run's folder (a run's folder is its own)
    # ten clients of 130 samples: new data, the same label swaps (drawn before the split);
    # client 4 now belongs to cluster 0 (it was in cluster 1 during training)
    args = parser.parse_args(["cfl-place", str(out), "--clients", "4,8-9", "--json",
                              str(dest), "--set", "scenario.n_clients=10",
                              "--set", "scenario.n_train_per_client=130"])
    assert args.func(args) == 0
    rows = json.loads(dest.read_text())
    assert [(r["client"], r["true_cluster"]) for r in rows] == [(4, 0), (8, 1), (9, 1)]
    for r in rows:
        assert r["cluster_true_clusters"] == [r["true_cluster"]]  # the leaf's trained clients
        assert r["details"]["path"][0] == 0 and r["details"]["path"][-1] == r["cluster"]
        assert r["accuracy"] > 0.8
    assert "placement of clients" in capsys.readouterr().out
    assert parse_clients("3,1-2", 5).tolist() == [1, 2, 3]
    from clusterfl.errors import ClusterFLError

    with pytest.raises(ClusterFLError, match="ids must be"):
        parse_clients("9", 5)


def _regressions(**auto: object) -> dict[str, Any]:
    """CFL-GP's four clusters of linear regressions: the transfer grid's linreg4_synth_2
    (seed 1607, 8 of its 50 rounds), on which rule v1 never split."""
    return {"seed": 1607, "rounds": 8, "eval_every": 8, "checkpoint_every": 0,
            "data": {"source": "synthetic_regression"},
            "scenario": {"name": "linear_regression", "n_clients": 20, "n_clusters": 4,
                         "delta_phi": 30.0, "samples_per_client": 100,
                         "test_samples_per_client": 100},
            "model": {"name": "linear"},
            "train": {"optimizer": "sgd", "lr": 0.1, "batch_size": 10, "epochs": 1},
            "algorithm": {"name": "cfl", "auto": auto},
            "output": {"figures": False, "progress": "off"}}


def test_the_progress_reference_of_rule_v2_lets_conflicting_regressions_split():
    """Issue 36, rule v2: on this federation the joint loss of the conflicting regressions
    never falls 5 % below the first round's, so v1's reference refuses every round; against
    ln C (v2; one output: no plateau, no condition) CFL splits them. The method hands the
    rule its model's outputs."""
    v1 = Experiment.from_config(_regressions(progress=0.05, progress_from="first")).run(
        progress=False)
    assert all(r.n_clusters == 1 for r in v1.records)
    assert {why for r in v1.records for why in r.extras["refused"]} == \
        {"no progress: loss ≥ 0.95 × first round's"}
    exp = Experiment.from_config(_regressions(progress=0.05))
    v2 = exp.run(progress=False)
    assert exp.algorithm.split_rule(0).n_outputs == 1  # type: ignore[attr-defined]
    assert v2.records[-1].n_clusters >= 2 and v2.records[-1].ari > 0.3
    assert not any(why and why.startswith("no progress") for r in v2.records
                   for why in r.extras["refused"])
    # a classifier's reference is ln C for its C classes (the built-in digits: 10)
    digits = Experiment.from_config(tiny_rotation([0, 180]))
    digits.run(progress=False)
    assert digits.algorithm.split_rule(0).n_outputs == 10  # type: ignore[attr-defined]


def test_accuracy_gap_figure_of_a_regression_shows_each_groups_mse(tmp_path, monkeypatch):
    """Before: `cfl_accuracy_gap.png` of a regression run (synthetic_regression) had an empty
    top panel, "mean test accuracy" over a -0.04..0.04 axis: its clients have no accuracy."""
    from clusterfl.records import RoundMetrics, RoundRecord
    from clusterfl.report.methods import cfl as cfl_figures

    drawn = []
    monkeypatch.setattr(cfl_figures, "_save", lambda fig, path: drawn.append(fig) or path)
    truth = [0, 0, 1, 1]
    records = [
        RoundRecord(round=t, wall_time=0.1 * t, n_clusters=1, assignment=[0] * 4, ari=0.0,
                    floats_down=8.0 * t, floats_up=8.0 * t,
                    metrics=RoundMetrics(loss=mse.mean(), mse=mse.mean()),
                    client_accuracy=[None] * 4, client_mse=mse.tolist(),
                    extras={"clusters": [0], "mean_norm": [0.1], "max_norm": [0.2],
                            "gap": [-0.1], "split": False})
        for t, mse in ((1, np.array([0.4, 0.2, 0.9, 0.7])), (2, np.array([0.2, 0.1, 0.5, 0.3])))
    ]
    cfl_figures.plot_accuracy_gap(records, tmp_path / "gap.png", truth)
    top = drawn[0].axes[0]
    assert top.get_ylabel() == "mean test MSE"
    curves = {line.get_label(): line.get_ydata().tolist() for line in top.get_lines()}
    assert curves == {"true cluster 0": pytest.approx([0.3, 0.15]),
                      "true cluster 1": pytest.approx([0.8, 0.4])}
