"""CFL (Sattler et al. 2020): clustering found, congruent clients kept together, privacy,
parameter tree and Algorithm 4, checkpoint/resume, CLI and figures."""

from __future__ import annotations

import argparse
import io
import json
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
    return [alg.run_round(ctx, t) for t in range(1, rounds + 1)]


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
    original = ClientSide.train

    def watched(self: ClientSide, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        received.append(out[0])  # what the server gets back
        return out

    monkeypatch.setattr(ClientSide, "train", watched)
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
        c = CFLConfig()
        assert e["refused"][k] is None and e["stationarity"][k] < c.stationarity_max
        assert e["cross_mean"][k] < c.separation * min(e["within_mean"][k])
        assert ev["streak"] == c.patience
    # the rounds before a split count the patience, with the reason recorded
    before = history.records[splits[0].round - 2].extras
    assert before["refused"][0] == "patience 2/3"


def test_auto_rule_does_not_split_an_iid_federation(tmp_path: Path):
    history = Experiment.from_config(tiny_rotation([0]), out_dir=tmp_path).run()
    assert all(r.n_clusters == 1 for r in history.records)
    reasons = {x for r in history.records for x in r.extras["refused"]}
    assert "not stationary" in reasons and None not in reasons


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


def test_auto_rule_waits_until_fl_has_left_the_initial_plateau(tmp_path: Path):
    """Progress: no split while a cluster's mean training loss is at least (1 − progress) ×
    the first round's; the first split comes in a round below it, and without the condition
    the same federation splits earlier (its first cuts, on the untrained model). The root's
    significance test is off in both runs: it refuses those first cuts as well."""
    raw = tiny_rotation([0, 90, 180, 270])
    raw["algorithm"]["significance"] = 0.0
    history = Experiment.from_config(raw, out_dir=tmp_path).run()
    first = history.records[0].extras["train_loss"]
    bar = (1 - CFLConfig().progress) * first
    waited = [r for r in history.records if any(
        str(x).startswith("no progress") for x in r.extras["refused"])]
    assert waited and all(r.extras["loss"][0] >= bar for r in waited)
    split = next(r for r in history.records if r.extras["split"])
    assert split.extras["loss"][0] < bar and split.round > waited[-1].round
    assert history.records[-1].ari == 1.0
    raw["algorithm"]["progress"] = 0.0
    off = Experiment.from_config(raw, out_dir=tmp_path / "off").run()
    assert next(r.round for r in off.records if r.extras["split"]) < split.round
    assert not any(str(x).startswith("no progress")
                   for r in off.records for x in r.extras["refused"])


def test_progress_passes_without_a_usable_loss():
    """The progress condition compares a cluster's loss with the first round's; with no loss
    reported (NaN), no first loss, a first loss that is not positive, or `progress = 0`, it
    lets the other conditions decide."""
    from clusterfl.algorithms.cfl import _ClusterStep
    fed = blob_federation(n_clients=4, n_clusters=2)
    alg = CFL(CFLConfig())
    alg.setup(make_ctx(fed))
    node = alg.tree.root
    step = _ClusterStep(node, node.clients, torch.zeros(4, 3), np.ones(4), torch.zeros(3), 0.0,
                        0.0, None, None, None)
    assert alg.state.first_loss is None and alg._progressed(step)
    alg.state.first_loss = 2.0
    step.loss = 1.95  # above 0.95 × 2.0
    assert not alg._progressed(step)
    step.loss = 1.8
    assert alg._progressed(step)
    step.loss = float("nan")
    assert alg._progressed(step)
    step.loss, alg.state.first_loss = 5.0, -1.0
    assert alg._progressed(step)
    alg.state.first_loss = 2.0
    assert not alg._progressed(step)
    off = CFL(CFLConfig(progress=0.0))
    off.state = alg.state
    assert off._progressed(step)


def test_nesting_keeps_a_pure_child_whole(tmp_path: Path):
    """Nesting: after the correct first split of two rotation groups of four (seed 11), the
    two pure children are cut 2 | 2 by noise three rounds running (rounds 29 and 30) unless a
    cut must set its sides further apart than the split that formed the cluster did. The
    recorded quantities are the ones compared."""
    raw = tiny_rotation([0, 180], seed=11)
    history = Experiment.from_config(raw, out_dir=tmp_path).run()
    assert history.records[-1].ari == 1.0 and history.records[-1].n_clusters == 2
    split = next(r for r in history.records if r.extras["split"])
    ev = split.extras["splits"][0]
    formed = [w - ev["cross"] for w in ev["within"]]
    later = history.records[split.round].extras  # the round after: the two children
    assert later["formed_separation"] == pytest.approx(formed)
    refusals = [(r.extras["separation"][k], r.extras["formed_separation"][k])
                for r in history.records[split.round:]
                for k, x in enumerate(r.extras["refused"])
                if x == "sides less apart than when the cluster formed"]
    assert refusals and all(now <= then for now, then in refusals)
    # the children are judged against their split, never by the root's shuffle test
    assert all(p is None for r in history.records[split.round:] for p in r.extras["p_value"])
    raw["algorithm"]["nesting"] = False
    off = Experiment.from_config(raw, out_dir=tmp_path / "off").run()
    assert off.records[-1].n_clusters > 2 and off.records[-1].ari < 1.0


def test_significance_keeps_a_one_distribution_root_whole(tmp_path: Path):
    """Significance: the root of the one-group federation, seed 2, splits at round 29 (a few
    clients a little alike for three rounds) unless its cut is beyond what the same cosines
    shuffled give; the p-value is recorded whenever the test ran, and only at the root."""
    raw = tiny_rotation([0], seed=2)
    history = Experiment.from_config(raw, out_dir=tmp_path).run()
    assert all(r.n_clusters == 1 for r in history.records)
    tested = [(r.extras["p_value"][0], r.extras["refused"][0]) for r in history.records
              if r.extras["p_value"][0] is not None]
    refused = [p for p, why in tested if why == "root: cut not beyond shuffled cosines"]
    assert refused and all(p >= CFLConfig().significance for p in refused)
    assert all(p < CFLConfig().significance for p, why in tested if why not in
               ("root: cut not beyond shuffled cosines",))
    raw["algorithm"]["significance"] = 0.0
    off = Experiment.from_config(raw, out_dir=tmp_path / "off").run()
    assert off.records[-1].n_clusters > 1
    assert all(p is None for r in off.records for p in r.extras["p_value"])


def test_a_round_not_shown_beyond_the_shuffles_keeps_the_streak(monkeypatch):
    """A root round whose cut the shuffle test does not show significant is no evidence
    either way: the patience streak neither grows nor restarts, so the split comes exactly
    one round later (a reset would cost `patience` rounds)."""
    fed = blob_federation(n_clients=8, n_clusters=2)
    base = run(CFL(CFLConfig()), make_ctx(fed), 8)
    first = next(t for t, e in enumerate(base, 1) if e["split"])
    start = first - CFLConfig().patience + 1  # the streak's first round
    assert [e["refused"][0] for e in base[start - 1:first - 1]] == ["patience 1/3",
                                                                   "patience 2/3"]
    real = CFL._significant

    def not_in_round(self: CFL, s: Any, t: int) -> bool:
        return real(self, s, t) and t != start + 1

    monkeypatch.setattr(CFL, "_significant", not_in_round)
    again = run(CFL(CFLConfig()), make_ctx(fed), 8)
    assert [e["refused"][0] for e in again[start - 1:first]] == [
        "patience 1/3", "root: cut not beyond shuffled cosines", "patience 2/3"]
    assert next(t for t, e in enumerate(again, 1) if e["split"]) == first + 1


def test_eps_without_a_rule_selects_epsilon_and_contradictions_are_errors():
    assert CFLConfig(eps1=0.2).split_rule == "epsilon"
    assert CFLConfig(eps2=0.2, split_rule="epsilon").split_rule == "epsilon"
    assert CFLConfig(patience=5).split_rule == "auto"
    with pytest.raises(ValueError, match="split_rule"):
        CFLConfig(eps1=0.2, split_rule="auto")
    dumped = CFLConfig().model_dump()  # what config.toml holds: loads again, still auto
    assert CFLConfig(**dumped).split_rule == "auto"


def test_auto_rule_state_survives_a_checkpoint():
    """The patience streak and the candidate blocks are server state: a resumed run splits in
    the same round as an uninterrupted one."""
    fed = blob_federation(n_clients=8, n_clusters=2)
    whole = CFL(CFLConfig())
    full = run(whole, make_ctx(fed), 6)
    first = CFL(CFLConfig())
    ctx = make_ctx(fed)
    head = run(first, ctx, 2)
    assert first.state.streak  # mid-streak
    second = CFL(CFLConfig())
    second.setup(make_ctx(fed))
    second.load_state_dict(first.state_dict())
    tail = [second.run_round(ctx, t) for t in range(3, 7)]
    assert [e["refused"] for e in head + tail] == [e["refused"] for e in full]
    assert ari(fed.clusters, second.assignment()) == ari(fed.clusters, whole.assignment()) == 1.0


def test_meet_of_candidate_bipartitions():
    from clusterfl.algorithms.cfl import _meet
    assert _meet(None, [[0, 1], [2, 3]], 2) is None
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a union of the same groups: kept, refined
    assert _meet(blocks, [[0, 1, 2, 3, 4, 5], [6, 7]], 2) == [[0, 1, 2, 3], [4, 5], [6, 7]]
    assert _meet(blocks, [[0, 1, 2], [3, 4, 5, 6, 7]], 2) is None  # cuts off a single client
    # a sample (client 7 did not answer): blocks the cut leaves whole stay whole ...
    assert _meet(blocks, [[0, 1, 2, 3], [4, 5, 6]], 2) == blocks
    # ... a block it cuts loses its silent members; new clients join by their side
    assert _meet([[0, 1, 2, 3, 9], [4, 5, 6, 7]], [[0, 1, 4, 5, 8], [2, 3, 6, 7]], 2) == \
        [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    assert _meet(blocks, [[0, 1, 2, 4], [5, 6]], 2) is None  # 4 | 5 6: one of block 2 alone


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


def test_cli_place(label_swap_run, capsys):
    from clusterfl.cli_place import add_parser, parse_clients

    out, _ = label_swap_run
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    dest = out / "placed.json"
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
