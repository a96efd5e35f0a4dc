"""CFL with a sample of the clients per round (issue 21) and `CFL.placement` (Algorithm 4 through
the base interface): the clusters are still found, runs are reproducible and resume exactly,
and held-out clients land in their true clusters without changing the server state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tests.algorithms.test_cfl import BLOB, make_ctx, run
from tests.core.conftest import blob_federation
from tests.crash import crash_then_resume, timing_free

from clusterfl.algorithms.cfl import CFL, CFLConfig
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.metrics import ari
from clusterfl.protocol import EvaluateRequest, TrainRequest
from clusterfl.robust.config import FaultsConfig
from clusterfl.robust.guard import Guard
from clusterfl.state import snapshot


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _trained(ctx: Any) -> list[list[int]]:
    """Record the clients of every training request sent through `ctx`."""
    sent: list[list[int]] = []
    real = ctx.send

    def send(request: Any) -> Any:
        if isinstance(request, TrainRequest):
            sent.append(request.clients.tolist())
        return real(request)

    ctx.send = send
    return sent


@pytest.mark.parametrize(("n_clusters", "sampling"), [(3, {"per_round": 9}),
                                                      (2, {"fraction": 0.5})])
def test_sampled_cfl_finds_the_clusters(n_clusters, sampling):
    fed = blob_federation(n_clients=12, n_clusters=n_clusters)
    ctx = make_ctx(fed)
    sent = _trained(ctx)
    alg = CFL(CFLConfig(**sampling))
    extras = run(alg, ctx, 20)
    assert ari(fed.clusters, alg.assignment()) == 1.0
    assert alg.n_clusters() == n_clusters and not alg.state.pending
    k = sampling.get("per_round", 6)
    rounds = [e for e in extras if not e["placed"]]  # rounds without Algorithm-4 walks
    assert sum(sum(e["cluster_sizes"]) for e in rounds) == k * len(rounds)
    assert all(len(c) <= k for c in sent) and {len(c) for c in sent} >= {k}
    assert len({tuple(c) for c in sent}) > 5  # a new sample (nearly) every round
    # every split was decided on the round's sample, and every client was placed in the end
    for e in extras:
        for ev in e["splits"]:
            if ev["accepted"]:
                assert len(ev["members"]) <= k


def test_clients_not_sampled_keep_cluster_and_model():
    fed = blob_federation(n_clients=12, n_clusters=2)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(per_round=4))
    run(alg, ctx, 12)
    before_models = alg.predictor()
    before = alg.assignment().copy()
    rows = before_models.models[before_models.members[:, 0]]
    sent = _trained(ctx)
    alg.run_round(ctx, 13)
    sampled = set(sent[-1])
    assert len(sampled) == 4
    after = alg.predictor()
    now = after.models[after.members[:, 0]]
    for c in range(12):
        if c not in sampled and not any(c in s for s in sent[:-1]):
            # same cluster; the model is its cluster's (updated by the sampled members)
            assert alg.assignment()[c] == before[c]
    assert not torch.equal(rows, now)  # the sampled members did train


def test_full_participation_draws_nothing_and_is_unchanged():
    """fraction = 1 (the default) trains every client with no draw from the generator: the
    run equals one with an explicit per_round = n (which also draws nothing)."""
    fed = blob_federation(n_clients=8, n_clusters=2)
    a, b = CFL(CFLConfig(**BLOB)), CFL(CFLConfig(**BLOB, per_round=8))
    ctx_a, ctx_b = make_ctx(fed), make_ctx(fed)
    ea, eb = run(a, ctx_a, 6), run(b, ctx_b, 6)
    assert ea == eb
    assert ctx_a.rng.integers(1 << 30) == ctx_b.rng.integers(1 << 30)
    assert torch.equal(a.predictor().models, b.predictor().models)


def test_sampling_config_errors_name_the_field():
    from clusterfl.config import load_config

    base = {"output": {"progress": "off"}}
    for field, value in (("fraction", 0.0), ("fraction", 1.5), ("per_round", 0)):
        with pytest.raises(ConfigError) as err:
            load_config({**base, "algorithm": {"name": "cfl", field: value}})
        assert err.value.field == f"algorithm.{field}"
    with pytest.raises(ConfigError, match="not both"):
        load_config({**base, "algorithm": {"name": "cfl", "fraction": 0.5, "per_round": 3}})


# ---------------------------------------------------------------------------- end to end

SAMPLED = {
    "seed": 3, "rounds": 12, "eval_every": 4, "checkpoint_every": 3,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 10, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "momentum": 0.5, "batch_size": 16, "epochs": 1},
    "algorithm": {"name": "cfl", "per_round": 6},
    "output": {"figures": False, "progress": "off"},
}


def test_sampled_run_is_reproducible_and_resumes_bit_identically(tmp_path):
    ref = Experiment.from_config(SAMPLED, out_dir=tmp_path / "ref")
    ref_h = ref.run(progress=False)
    again = Experiment.from_config(SAMPLED, out_dir=tmp_path / "again").run(progress=False)
    assert timing_free(again.records) == timing_free(ref_h.records)
    assert all(r.participants == 6 for r in ref_h.records if not r.extras["placed"])
    assert ref_h.summary.final.participation is not None
    assert ref_h.summary.final.participation < 1.0
    assert len({tuple(r.assignment) for r in ref_h.records}) >= 1

    resumed, h = crash_then_resume(SAMPLED, tmp_path / "cut", 8)
    assert timing_free(h.records) == timing_free(ref_h.records)
    assert timing_free(h.summary) == timing_free(ref_h.summary)
    pa, pb = resumed.algorithm.predictor(), ref.algorithm.predictor()
    assert torch.equal(pa.models, pb.models) and (pa.members == pb.members).all()


# ---------------------------------------------------------------------------- placement


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.fixture(scope="module")
def trained() -> tuple[CFL, Any]:
    full = blob_federation(n_clients=12, n_clusters=3)
    alg = CFL(CFLConfig(**BLOB))
    run(alg, make_ctx(full.subset(np.arange(9))), 10)
    return alg, full


def test_placement_puts_held_out_clients_into_their_true_clusters(trained):
    alg, full = trained
    train_truth = full.clusters[:9]
    assert ari(train_truth, alg.assignment()) == 1.0
    state = snapshot(alg.state)
    ctx = make_ctx(full, seed=5)
    new = np.array([9, 10, 11, 4])
    placed = alg.placement(ctx, new)
    assert _same_state(snapshot(alg.state), state)  # nothing of the server changed
    assert placed.clients.tolist() == new.tolist()
    leaf_truth = {v.id: set(train_truth[v.clients].tolist()) for v in alg.tree.leaves()}
    for c, cluster in zip(new, placed.clusters):
        assert leaf_truth[int(cluster)] == {int(full.clusters[c])}
    assert ari(full.clusters[new], placed.clusters) == 1.0
    assert placed.clusters[-1] == alg.assignment()[4]  # a training client: its own leaf
    assert alg.place(make_ctx(full, seed=5), new).tolist() == placed.clusters.tolist()
    # the predictor serves the placed clients with their leaves' models
    for i, cluster in enumerate(placed.clusters):
        assert torch.equal(placed.predictor.models[placed.predictor.members[i, 0]],
                           alg.model_of(int(cluster)))
    assert placed.details is not None
    for d, cluster in zip(placed.details, placed.clusters):
        assert d["path"][0] == 0 and d["path"][-1] == d["node"] == cluster
        assert d["path"] == alg.tree.path(int(cluster))
        assert len(d["similarities"]) == len(d["path"]) - 1
        for (a0, a1), nxt, (v, _) in zip(d["similarities"], d["path"][1:],
                                         zip(d["path"], d["path"][1:])):
            first = alg.tree.nodes[v].children[0]
            assert (nxt == first) == (a0 > a1)
    acc = ctx.backend.execute(EvaluateRequest(new, placed.predictor)).accuracy
    root = alg.model_of(0)[None]
    from clusterfl.protocol import Predictor

    acc_root = ctx.backend.execute(
        EvaluateRequest(new, Predictor.single(root, np.zeros(len(new))))).accuracy
    assert acc.mean() > acc_root.mean() + 0.2


def test_a_client_that_does_not_answer_is_placed_nowhere(trained):
    alg, full = trained
    ctx = make_ctx(full, seed=5)
    ctx.guard = Guard(full.n_clients, 5, full.train_sizes,
                      faults=FaultsConfig(drop_clients=[10]))
    placed = alg.placement(ctx, np.array([9, 10]))
    assert placed.clusters[1] == -1 and placed.clusters[0] >= 0
    assert placed.details is not None and placed.details[1]["path"] == [0]
    # it predicts with the model of the node it reached: the root
    assert torch.equal(placed.predictor.models[placed.predictor.members[1, 0]], alg.model_of(0))


def test_placement_before_any_split_is_the_root():
    fed = blob_federation(n_clients=6, n_clusters=2)
    alg = CFL(CFLConfig())
    alg.setup(make_ctx(fed))
    placed = alg.placement(make_ctx(fed), np.array([1, 2]))
    assert placed.clusters.tolist() == [0, 0]
    assert placed.details == [{"path": [0], "node": 0, "similarities": []}] * 2
    assert len(alg.placement(make_ctx(fed), np.array([], dtype=np.int64)).clusters) == 0


def test_clusters_of_the_results_and_of_the_extras_count_the_waiting_nodes():
    """A sampled run with clients waiting at an inner node: the results table's clusters
    (`n_clusters()`, the distinct nodes of the assignment) counted that node, the extras'
    `n_clusters` (the tree's leaves) did not, and nothing said why (4 against 3 in a report).
    `n_waiting_nodes` counts those inner nodes: the two add up."""
    fed = blob_federation(n_clients=12, n_clusters=2)
    ctx = make_ctx(fed)
    alg = CFL(CFLConfig(fraction=0.5))  # the root splits in round 6; six clients wait
    alg.setup(ctx)
    waited = 0
    for t in range(1, 10):
        e = alg.run_round(ctx, t).to_dict()
        inner = set(alg.state.pending.values())
        assert all(not alg.tree.nodes[v].is_leaf for v in inner)
        assert e["n_clusters"] == len(alg.tree.leaves())
        assert e["n_waiting_nodes"] == len(inner)
        assert e["n_clusters"] + e["n_waiting_nodes"] == alg.n_clusters()
        waited += bool(inner)
    assert waited  # some round ended with clients waiting
