"""Placing clients that did not train (`Algorithm.placement`) and held-out clients
(`[scenario] holdout`): every method places newcomers as it clusters, without changing its
state; the held-out split is stratified and seeded; the summary tells the truth; a resumed run
places exactly as an uninterrupted one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tests.algorithms.test_flt import FAST_FLT, prototypes_federation
from tests.algorithms.test_flt import config as flt_config
from tests.crash import crash_then_resume
from tests.tiny import tiny_config

from clusterfl.algorithms import ALGORITHMS
from clusterfl.algorithms.base import Algorithm
from clusterfl.backends.subset import SubsetBackend
from clusterfl.data.federation import holdout_split
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment, build_backend
from clusterfl.protocol import EvaluateRequest

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def rotation(algorithm: dict[str, Any], rounds: int = 8, holdout: float = 0.34,
             **top: Any) -> dict[str, Any]:
    """Digits in two rotation groups, 12 clients, a third of them held out (2 per group)."""
    cfg = tiny_config(rounds=rounds, n_clients=12, hidden=32, steps=0, algorithm=algorithm,
                      **top)
    cfg["scenario"]["holdout"] = holdout
    cfg["train"].update(lr=0.1, epochs=2)
    return cfg


#: methods that find the two groups on `rotation` within 8 rounds (trained ARI 1)
CLUSTERING = {
    "ifca": {"name": "ifca", "n_clusters": 2},
    "fesem": {"name": "fesem", "n_clusters": 2},
    "ifca_cam": {"name": "ifca_cam", "n_clusters": 2, "warmup_rounds": 2, "cluster_update": "mean"},
    "fesem_cam": {"name": "fesem_cam", "n_clusters": 2, "warmup_rounds": 2},
    "cfl_gp_model": {"name": "cfl_gp", "n_clusters": 2, "period": 1, "estimate_k": False,
                     "protocol": "model"},
    "cfl_gp_gradient": {"name": "cfl_gp", "n_clusters": 2, "period": 1, "estimate_k": False},
    "pca_km_hc": {"name": "pca_km_hc", "fraction": 1.0, "n_clusters": 2},
    "pacfl": {"name": "pacfl", "fraction": 1.0, "n_clusters": 2},
    "flhc": {"name": "flhc", "warmup_rounds": 2},
}


def _state(alg: Algorithm) -> dict[str, Any]:
    return alg.state_dict()


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return bool(a == b)


def _place_again(exp: Experiment) -> tuple[dict[str, Any], dict[str, Any]]:
    """The held-out placement once more on a fresh backend, and the state after it."""
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    try:
        again = exp.place_holdout(backend)
    finally:
        backend.close()
    return again, _state(exp.algorithm)


@pytest.mark.parametrize("name", list(CLUSTERING), ids=list(CLUSTERING))
def test_newcomers_are_placed_in_their_true_cluster_without_changing_the_method(name):
    exp = Experiment.from_config(rotation(CLUSTERING[name]))
    summary = exp.run(progress=False).summary
    final, held = summary.final, summary.holdout
    assert final.ari == 1.0, f"{name} did not cluster the trained clients"
    assert held is not None and final.placement_ari == 1.0, held
    assert final.placement_match == held["placement_match"] == 1.0
    assert held["true_clusters"] == [0, 0, 1, 1]
    assert held["placed_clusters"][0] == held["placed_clusters"][1] != held["placed_clusters"][2]
    # the placed cluster is the one holding the trained clients of the same true cluster
    assign, truth = np.asarray(summary.assignment), np.asarray(summary.true_clusters)
    for t, c in zip(held["true_clusters"], held["placed_clusters"], strict=True):
        assert set(truth[assign == c]) == {t}
    assert final.metrics is not None and final.holdout_accuracy is not None
    assert final.holdout_accuracy > final.metrics.accuracy - 0.1
    before = _state(exp.algorithm)
    again, after = _place_again(exp)
    assert _equal(before, after), "placement changed the method's state"
    assert again == held  # deterministic (its own generator, seeded by the run's seed)


def test_ifca_placement_follows_assign_by():
    from clusterfl.clustering.aggregate import choose_clusters
    from clusterfl.protocol import LossRequest

    exp = Experiment.from_config(rotation({"name": "ifca", "n_clusters": 2}, rounds=2))
    exp.run(progress=False)
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    ctx = exp.placing_context(backend, exp.holdout_ids)
    losses = ctx.backend.execute(LossRequest(np.arange(4), exp.algorithm.state.models))
    for by in ("loss", "accuracy"):
        exp.algorithm.config = exp.algorithm.config.model_copy(update={"assign_by": by})
        placed = exp.algorithm.place(ctx, np.arange(4))
        assert placed.tolist() == choose_clusters(losses.loss, losses.accuracy, by).tolist()


def test_flt_places_in_the_same_umap_embedding():
    """FLT with UMAP: the newcomers' signatures mapped into the clustering's embedding (and
    joined by Ward's criterion on their rows of Ã: rule v1's automatic C)."""
    cfg = flt_config({**FAST_FLT, "aggregation": "clusters", "auto_on": "relatedness",
                      "significance": 0.0}, rounds=3)
    cfg["scenario"]["holdout"] = 1 / 3
    exp = Experiment.from_config(cfg, federation=prototypes_federation(n_clients=18))
    summary = exp.run(progress=False).summary
    assert summary.final.ari == 1.0 and summary.final.placement_ari == 1.0
    assert summary.final.holdout_accuracy is not None and summary.final.holdout_accuracy > 0.9
    held = summary.holdout
    assert held is not None and [d["nearest_client"] for d in held["details"]]


def test_flt_case_one_gives_a_newcomer_its_related_clients_mean_model():
    algo = {**FAST_FLT, "umap": False, "distance": "matched", "threshold": 0.003, "k": 2,
            "finetune_epochs": 0, "fraction": 1.0, "auto_on": "relatedness",
            "significance": 0.0}  # HC on the rows of Ã: its clusters are the related ones
    cfg = flt_config(algo, rounds=3)
    cfg["scenario"]["holdout"] = 1 / 3
    exp = Experiment.from_config(cfg, federation=prototypes_federation(n_clients=18))
    summary = exp.run(progress=False).summary
    assert summary.final.placement_ari == 1.0 and summary.final.holdout_accuracy > 0.9
    # each placed client's model is its related (same-cluster) trained clients' mean model
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    ctx = exp.placing_context(backend, exp.holdout_ids)
    placed = exp.algorithm.placement(ctx, np.arange(len(exp.holdout_ids)))
    models = exp.algorithm.state.models
    truth = exp.federation.clusters
    for i, t in enumerate(exp.full_federation.clusters[exp.holdout_ids]):
        own = placed.predictor.models[int(placed.predictor.members[i, 0])]
        members = torch.from_numpy(np.flatnonzero(truth == t))
        torch.testing.assert_close(own, models[members].mean(0))  # equal sizes: plain mean


def test_flt_says_when_the_placements_embedding_differs_from_the_clusterings(
        monkeypatch, capsys, tmp_path):
    """Before: FLT's "the embedding fitted again differs" line went to `ctx.log`, which
    nothing reads: the placement in another map was silent. Now it is a run warning
    (console, `summary.warnings`, `holdout.warnings`), and `clusterfl place` warns too."""
    from clusterfl.algorithms.flt import FLT
    from clusterfl.cli import main

    map_new = FLT._map_new

    def moved(self, signatures, new, seed):  # as if UMAP fitted another map
        train, mapped = map_new(self, signatures, new, seed)
        return train + 1.0, mapped

    monkeypatch.setattr(FLT, "_map_new", moved)
    algo = {**FAST_FLT, "umap": False, "k": 2, "finetune_epochs": 0, "fraction": 1.0}
    cfg = flt_config(algo, rounds=2, checkpoint_every=2)
    cfg["scenario"]["holdout"] = 1 / 3
    summary = Experiment.from_config(cfg, out_dir=tmp_path / "run").run(
        progress=False).summary
    line = (f"{summary.label}: the embedding fitted again differs from the clustering's "
            "(UMAP not reproducible here); placing in the new fit")
    assert summary.holdout is not None and summary.holdout["warnings"] == [line]
    assert summary.warnings is not None and line in summary.warnings
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err.splitlines()
    assert main(["place", str(tmp_path / "run"), "--clients", "0"]) == 0
    assert capsys.readouterr().err.splitlines() == [f"clusterfl: warning: {line}"]


def test_umap_fitted_again_is_the_clustering_map():
    from clusterfl.clustering.relatedness import umap_embed, umap_embed_new

    pts = np.random.default_rng(0).normal(size=(30, 5))
    fitted, mapped = umap_embed_new(pts, pts[:4] + 1e-3, seed=3, n_neighbors=5)
    np.testing.assert_array_equal(fitted, umap_embed(pts, 3, 5))
    assert mapped.shape == (4, 2)
    assert np.linalg.norm(mapped - fitted[:4], axis=1).max() < 1.0  # next to their twins


def test_fedavg_and_ensembles_place_everyone_in_cluster_zero_with_the_shared_model():
    for algo in ({"name": "fedavg"}, {"name": "fedprox_plus", "n_models": 2}):
        exp = Experiment.from_config(rotation(algo, rounds=3))
        s = exp.run(progress=False).summary
        assert s.holdout is not None and s.holdout["placed_clusters"] == [0, 0, 0, 0]
        assert s.holdout["floats_down"] == 0 == s.holdout["floats_up"]  # nothing sent
        backend = build_backend(exp.config, exp.full_federation, exp.factory)
        ctx = exp.placing_context(backend, exp.holdout_ids)
        placed = exp.algorithm.placement(ctx, np.arange(4))
        ref = exp.algorithm.predictor()
        assert torch.equal(placed.predictor.models, ref.models)
        assert placed.predictor.combine == ref.combine and placed.predictor.members.shape[0] == 4


def test_local_newcomers_train_alone_with_a_trained_clients_budget():
    exp = Experiment.from_config(rotation({"name": "local"}, rounds=6))
    s = exp.run(progress=False).summary
    assert s.holdout is not None and s.holdout["placed_clusters"] == [-1] * 4
    assert s.final.metrics is not None
    assert abs(s.final.holdout_accuracy - s.final.metrics.accuracy) < 0.1
    assert s.holdout["details"][0] == {"local_rounds": 6}
    # no shared clusters: no placement ARI or match (they read 0.0: "0 % placed in the
    # group's cluster")
    assert s.holdout["placement_ari"] is None and s.holdout["placement_match"] is None
    # with one round's budget the newcomers learn less than with six
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    ctx = exp.placing_context(backend, exp.holdout_ids)
    ctx.rounds = 1
    short = exp.algorithm.placement(ctx, np.arange(4))
    acc = ctx.backend.execute(EvaluateRequest(short.clients, short.predictor)).accuracy
    assert acc.mean() < s.final.holdout_accuracy - 0.05


def test_local_newcomers_start_from_the_runs_start_whatever_the_placing_seed():
    """`clusterfl place --set seed=7` draws fresh data: the newcomer still trains from the
    common initial model of the run (it started from `factory.init(7)`, another model)."""
    exp = Experiment.from_config(rotation({"name": "local"}, rounds=1))
    exp.run(progress=False)
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    try:
        own = exp.placing_context(backend, exp.holdout_ids)
        other = exp.placing_context(backend, exp.holdout_ids)
        other.seed = exp.config.run.seed + 7  # the same generator, another seed
        a = exp.algorithm.placement(own, np.arange(4))
        b = exp.algorithm.placement(other, np.arange(4))
    finally:
        backend.close()
    assert torch.equal(a.predictor.models, b.predictor.models)


# --------------------------------------------------------------------------- the split


def test_holdout_is_stratified_seeded_and_leaves_every_cluster_trained():
    clusters = np.repeat(np.arange(4), 10)
    train, hold = holdout_split(clusters, 40, 0.2, seed=0)
    assert len(hold) == 8 and np.bincount(clusters[hold]).tolist() == [2, 2, 2, 2]
    assert np.array_equal(np.sort(np.concatenate([train, hold])), np.arange(40))
    again = holdout_split(clusters, 40, 0.2, seed=0)
    assert np.array_equal(hold, again[1])
    assert not np.array_equal(hold, holdout_split(clusters, 40, 0.2, seed=1)[1])
    # unequal clusters: each gives at least one, none gives its last
    uneven = np.array([0] * 7 + [1] * 2 + [2])
    _, hold = holdout_split(uneven, 10, 0.3, seed=0)
    assert sorted(uneven[hold].tolist()) == [0, 0, 1]
    _, hold = holdout_split(None, 10, 0.25, seed=0)  # no true clusters: one group
    assert len(hold) == 2


@pytest.mark.parametrize(("n_clients", "holdout", "algorithm", "match"), [
    (4, 0.8, {"name": "fedavg"}, "leaving a true cluster with no trained client"),
    (8, 0.5, {"name": "ifca", "n_clusters": 5}, "fewer than algorithm.n_clusters = 5"),
    (8, 0.01, {"name": "fedavg"}, "holds out none"),
    (8, 1.0, {"name": "fedavg"}, "less than 1"),
])
def test_bad_holdout_is_a_config_error_naming_the_field(n_clients, holdout, algorithm, match):
    cfg = tiny_config(n_clients=n_clients, algorithm=algorithm)
    cfg["scenario"]["holdout"] = holdout
    with pytest.raises(ConfigError, match=match) as err:
        Experiment.from_config(cfg)
    assert err.value.field == "scenario.holdout" and "\n" not in str(err.value)


def test_a_method_that_cannot_place_refuses_holdout(monkeypatch):
    monkeypatch.setattr(ALGORITHMS["ifca"], "placement", Algorithm.placement)
    cfg = tiny_config(n_clients=8, algorithm={"name": "ifca", "n_clusters": 2})
    cfg["scenario"]["holdout"] = 0.25
    with pytest.raises(ConfigError, match="cannot place new clients"):
        Experiment.from_config(cfg)


def test_summary_counts_trained_and_held_out_clients(tmp_path):
    cfg = rotation({"name": "ifca", "n_clusters": 2}, rounds=2)
    exp = Experiment.from_config(cfg, out_dir=tmp_path)
    s = exp.run(progress=False).summary
    held = s.holdout
    assert held is not None and s.n_clients == held["n_trained"] == 8
    assert held["n_held_out"] == 4 and len(held["clients"]) == 4
    assert sorted(held["clients"] + held["trained_clients"]) == list(range(12))
    assert s.true_clusters is not None and len(s.true_clusters) == 8
    assert s.assignment is not None and len(s.assignment) == 8
    assert s.client_accuracy is not None and len(s.client_accuracy) == 8
    full = exp.full_federation.clusters
    assert held["true_clusters"] == full[held["clients"]].tolist()
    assert s.true_clusters == full[held["trained_clients"]].tolist()
    assert held["floats_down"] > 0 and held["floats_up"] == 4 * 2  # K losses up per client
    assert np.mean(held["accuracy"]) == pytest.approx(s.final.holdout_accuracy)
    from clusterfl.records import read_summary

    assert read_summary(tmp_path) == s
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else ""
    if report:
        assert "## Held-out clients" in report and "8 clients trained and 4 held out" in report


def test_training_never_reaches_a_held_out_client(monkeypatch):
    exp = Experiment.from_config(rotation({"name": "ifca", "n_clusters": 2}, rounds=2))
    seen: list[tuple[bool, list[int]]] = []  # (a training-side request?, whole-federation ids)
    real = SubsetBackend.execute

    def spy(self, request):
        seen.append((self.ids is exp.train_ids, self.ids[np.asarray(request.clients)].tolist()))
        return real(self, request)

    monkeypatch.setattr(SubsetBackend, "execute", spy)
    exp.run(progress=False)
    held = set(exp.holdout_ids.tolist())
    training = [ids for is_training, ids in seen if is_training]
    placing = [ids for is_training, ids in seen if not is_training]
    assert training and not held & {c for ids in training for c in ids}
    assert placing and {c for ids in placing for c in ids} == held
    assert [t for t, _ in seen] == sorted((t for t, _ in seen), reverse=True)  # placing last


def test_resumed_run_places_exactly_like_an_uninterrupted_one(tmp_path):
    cfg = rotation({"name": "ifca", "n_clusters": 2}, rounds=5, checkpoint_every=2)
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False).summary

    _, resumed = crash_then_resume(cfg, tmp_path / "cut", 4)
    assert resumed.summary.holdout == ref.holdout and ref.holdout is not None
    assert resumed.summary.final.placement_ari == ref.final.placement_ari
    assert resumed.summary.final.holdout_accuracy == ref.final.holdout_accuracy


def test_placement_match_asks_whether_each_newcomer_joined_its_groups_cluster():
    """Hand values. Trained: group 0 in cluster 5 (twice) and 7 (once), group 1 in cluster 7,
    group 2 unassigned (-1). One newcomer per group, so the placement ARI of any placement
    that keeps them apart is 1: placed [7, 5, 9] keeps them apart (ARI 1) but each joined
    another group's cluster: match 0 of 2 (group 2 has no cluster to join: not counted);
    placed [5, 7, 9] matches both."""
    from clusterfl import metrics
    from clusterfl.holdout import placement_match

    trained_truth = np.array([0, 0, 0, 1, 1, 2])
    assignment = np.array([5, 5, 7, 7, 7, -1])
    truth = np.array([0, 1, 2])
    assert metrics.ari(truth, np.array([7, 5, 9])) == 1.0
    assert placement_match(truth, np.array([7, 5, 9]), trained_truth, assignment) == 0.0
    assert placement_match(truth, np.array([5, 7, 9]), trained_truth, assignment) == 1.0
    assert placement_match(truth, np.array([5, 5, 9]), trained_truth, assignment) == 0.5
    assert placement_match(None, np.array([5]), None, assignment) is None


def test_the_smallest_holdout_the_error_allows_holds_out_one_client():
    # it said "at least 0.1" for 5 clients, and 0.1 of 5 rounds to 0 (round half to even)
    with pytest.raises(ConfigError, match=r"allowed: 0 \(off\) or at least 0\.2 \(one client\)"):
        holdout_split(None, 5, 0.05, seed=0)
    _, hold = holdout_split(None, 5, 0.2, seed=0)
    assert len(hold) == 1


def _gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact ε of one Gaussian mechanism of noise multiplier σ at δ (Balle & Wang 2018,
    Thm. 8: δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ)), by bisection: no accountant
    may report less."""
    from scipy.stats import norm

    def gap(eps: float) -> float:
        return float(norm.cdf(0.5 / sigma - eps * sigma)
                     - np.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)) - delta

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return hi


def test_a_private_runs_newcomers_send_clipped_noised_updates_and_their_epsilon_is_reported(
        monkeypatch):
    """Before: the placement's guard was the default one, whatever `[privacy]` said: FL+HC's
    newcomers sent their trained models unclipped and unnoised, and no ε was reported. Now
    each newcomer's update is clipped to S and gets N(0, σ²S²) of its own (the placement uses
    every update alone), drawn from round T + 1's noise stream, and `holdout.privacy` reports
    the ε of the one release."""
    from clusterfl.algorithms.base import Context
    from clusterfl.protocol import TrainRequest
    from clusterfl.robust.privacy import DEFAULT_ORDERS

    clip, sigma, rounds = 0.05, 1.0, 4
    cfg = rotation({"name": "flhc", "warmup_rounds": 2}, rounds=rounds,
                   privacy={"clip": clip, "noise_multiplier": sigma})
    exp = Experiment.from_config(cfg)
    raw: list[Any] = []  # the placing side's replies as the newcomers computed them
    sent: list[tuple[Any, Any]] = []  # (request, reply) as the method received them
    execute, send = SubsetBackend.execute, Context.send

    def spy_execute(self, request):
        reply = execute(self, request)
        if self.ids is not exp.train_ids and isinstance(request, TrainRequest):
            raw.append(reply)
        return reply

    def spy_send(self, request):
        reply = send(self, request)
        if isinstance(request, TrainRequest):
            sent.append((request, reply))
        return reply

    monkeypatch.setattr(SubsetBackend, "execute", spy_execute)
    monkeypatch.setattr(Context, "send", spy_send)
    held = exp.run(progress=False).summary.holdout
    assert held is not None and len(raw) == 1  # FL+HC places with one training request
    request, got = sent[-1]
    assert got.clients.tolist() == raw[0].clients.tolist() == [0, 1, 2, 3]
    base = request.models[0].double()
    delta = raw[0].params.double() - base
    norms = torch.linalg.vector_norm(delta, dim=1)
    assert (norms > clip).all()  # every newcomer's update is clipped: S binds
    clipped = delta * (clip / norms)[:, None]
    g = torch.Generator()  # the guard's noise stream of round T + 1, its first request
    g.manual_seed(int(np.random.default_rng([0, rounds + 1, 1, 31337]).integers(0, 2**63 - 1)))
    noise = sigma * clip * torch.randn(tuple(delta.shape), generator=g, dtype=torch.float64)
    torch.testing.assert_close(got.params.double(), base + clipped + noise,
                               atol=1e-6, rtol=1e-5)
    assert got.n_samples.tolist() == [1, 1, 1, 1]
    report = held["privacy"]
    assert (report["clip"], report["noise_multiplier"], report["noise"]) == (clip, sigma, "local")
    assert (report["releases"], report["unsampled_releases"], report["sampling_rate"]) == \
        (1, 0, 1.0)
    # one Gaussian(σ) release: between the exact ε and the plain RDP conversion's
    rdp = min(a / (2 * sigma**2) + np.log(1 / 1e-5) / (a - 1) for a in DEFAULT_ORDERS)
    assert _gaussian_epsilon(sigma, 1e-5) <= report["epsilon"] <= rdp
    assert report["note"] == (f"the newcomers' updates were clipped to S = 0.05 (4 above "
                              f"it); ε = {report['epsilon']:.4g} at δ = 1e-05 over 1 "
                              "release(s), each newcomer's update noised alone (σ = 1)")


def test_a_placement_that_sends_no_update_says_privacy_does_not_cover_it():
    """IFCA's newcomers send K losses, which no noise covers: no ε (before the note: an ε of
    0.0 from the 0 releases, as if nothing were revealed)."""
    held = Experiment.from_config(rotation(
        {"name": "ifca", "n_clusters": 2}, rounds=2,
        privacy={"clip": 1.0, "noise_multiplier": 1.0})).run(progress=False).summary.holdout
    assert held is not None
    report = held["privacy"]
    assert report["releases"] == 0 and report["epsilon"] is None
    assert report["note"] == (
        "IFCA (K=2)'s placement sends no update (model or gradient) to clip or noise: what "
        "its newcomers send (losses, signatures, bases, counts, mixture weights) is not "
        "covered by [privacy], as in the run (docs/security.md)")


def test_a_placement_checks_the_newcomers_updates_with_the_runs_validation(monkeypatch):
    """Before: a placement checked replies with the default `[validation]` whatever the run
    set; a newcomer whose update is 5 times the others' was placed under the run's
    `median_multiple = 2`. Now it is rejected (placed nowhere, -1), as in the run."""
    from clusterfl.protocol import TrainRequest

    cfg = rotation({"name": "flhc", "warmup_rounds": 2}, rounds=4,
                   validation={"median_multiple": 2.0})
    exp = Experiment.from_config(cfg)
    execute = SubsetBackend.execute

    def inflate(self, request):  # newcomer 1 sends 5 × its update
        reply = execute(self, request)
        if self.ids is not exp.train_ids and isinstance(request, TrainRequest):
            params = reply.params.clone()
            base = request.models[request.model_of_client[1]]
            params[1] = base + 5 * (params[1] - base)
            reply = reply.with_update_rows(params)
        return reply

    monkeypatch.setattr(SubsetBackend, "execute", inflate)
    summary = exp.run(progress=False).summary
    assert summary.robust is not None and summary.robust["rejected"] == 0  # the run's own
    held = summary.holdout
    assert held is not None and held["placed_clusters"][1] == -1
    assert held["details"][1] == {"answered": False}
    assert min(held["placed_clusters"][k] for k in (0, 2, 3)) >= 0
