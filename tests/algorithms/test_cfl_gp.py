"""CFL-GP (Kim et al. 2024): Algorithm 1/4 arithmetic, clustering quality, options, resume."""

import json
import shutil

import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import Context
from clusterfl.algorithms.cfl_gp import CFLGP, CFLGPConfig
from clusterfl.backends.base import Backend
from clusterfl.clustering.spectral import gram_matrix, project_gram
from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import GradientReply, GradientRequest, LocalTraining
from clusterfl.records import RoundRecord, RunSummary, read_history

DIGITS = {
    "seed": 0, "rounds": 9, "eval_every": 100, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 90, 180, 270]},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.1, "batch_size": 128, "steps": 1},  # b ≥ client size: full gradients
    "algorithm": {"name": "cfl_gp", "n_clusters": 4, "period": 2, "stable_rounds": 0,
                  "estimate_k": False},
    "output": {"figures": False, "progress": "off"},
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run(overrides: dict | None = None, algorithm: dict | None = None, **top):
    cfg = json.loads(json.dumps(DIGITS))
    cfg.update(top)
    cfg["algorithm"].update(algorithm or {})
    for key, value in (overrides or {}).items():
        cfg[key].update(value)
    exp = Experiment.from_config(cfg)
    return exp, exp.run(progress=False)


def clustering_records(history):
    return [r for r in history.records if r.extras["clustering"]]


# ------------------------------------------------------------------ clustering on real data


def test_rotated_digits_clustered_perfectly_within_five_periods():
    _, h = run(seed=1)
    aris = [r.ari for r in clustering_records(h)]
    assert len(aris) == 5  # rounds 1, 3, 5, 7, 9 (t mod P = 1)
    assert aris[-1] == pytest.approx(1.0)
    assert h.records[-1].n_clusters == 4


def test_labels_stay_on_their_models_across_periods():
    _, h = run(rounds=17)
    recs = clustering_records(h)
    first = next(i for i, r in enumerate(recs) if r.ari == pytest.approx(1.0))
    assert first <= 4
    kept = [r.assignment for r in recs[first:]]
    assert len(kept) >= 4 and all(a == kept[0] for a in kept)  # same ids, not just same sets
    # the k-means ids alone would be arbitrary: the matched ones follow the previous round
    assert all(r.extras["assignment_changes"] == 0 for r in recs[first + 1:])


def test_randomized_svd_route_clusters_the_same():
    exp, h = run(algorithm={"svd": "randomized"})
    assert exp.algorithm.state.block_gram.shape[0] == 0  # no Gram matrix kept on this route
    assert clustering_records(h)[-1].ari == pytest.approx(1.0)


def test_compressed_features_ratio_10_keep_ari_one():
    exp, h = run(seed=3, algorithm={"compression_ratio": 10.0})
    d = exp.factory.size
    assert h.records[-1].extras["feature_dim"] == round(d / 10)
    assert exp.algorithm.state.features.shape == (8, 4, round(d / 10))
    assert clustering_records(h)[-1].ari == pytest.approx(1.0)


def test_model_averaging_protocol_clusters_and_learns():
    _, h = run(overrides={"train": {"batch_size": 32, "steps": 5}}, rounds=9, eval_every=9,
               algorithm={"protocol": "model"})
    assert all(r.ari == pytest.approx(1.0) for r in clustering_records(h))
    assert h.records[-1].metrics.accuracy > 0.4  # 10 classes: chance is 0.1


def test_linear_regression_reaches_the_noise_floor():
    """§5.1 / F.4 at small scale: C = 12, b = 10, Δφ = 20°, lr 0.1: optimal MSE is 0.2² = 0.04."""
    cfg = {
        "seed": 1, "rounds": 80, "eval_every": 80, "checkpoint_every": 0,
        "data": {"source": "synthetic_regression"},
        "scenario": {"name": "linear_regression", "n_clients": 12, "delta_phi": 20.0,
                     "samples_per_client": 1000, "test_samples_per_client": 500},
        "model": {"name": "linear"},
        "train": {"lr": 0.1, "batch_size": 10, "steps": 1},
        "algorithm": {"name": "cfl_gp", "n_clusters": 3, "init_range": 0.8,
                      "stable_rounds": 20, "estimate_k": False},
        "output": {"figures": False, "progress": "off"},
    }
    h = Experiment.from_config(cfg).run(progress=False)
    final = h.records[-1]
    assert final.ari == pytest.approx(1.0)
    assert 0.035 < final.metrics.mse < 0.05
    assert final.extras["clustering_stopped_at"] is not None  # unchanged for 20 rounds


# ------------------------------------------------------------------ arithmetic, fake clients


class FakeClients(Backend):
    """Client c's "gradient" at θ is θ + c (every coordinate): easy to follow by hand."""

    def __init__(self) -> None:
        self.calls: list[GradientRequest] = []

    def gradient(self, req: GradientRequest) -> GradientReply:
        self.calls.append(req)
        rows = req.models[torch.as_tensor(req.model_of_client)].clone()
        rows += torch.as_tensor(req.clients, dtype=rows.dtype)[:, None]
        n = len(req.clients)
        return GradientReply(req.clients.copy(), rows, np.ones(n, dtype=np.int64), np.zeros(n))

    def train(self, req):  # pragma: no cover - not used
        raise NotImplementedError

    def losses(self, req):  # pragma: no cover
        raise NotImplementedError

    def evaluate(self, req):  # pragma: no cover
        raise NotImplementedError


def fake_context(n_clients: int = 5, lr: float = 0.5) -> Context:
    factory = ModelFactory(model_config({"name": "linear"}), (1,), 1)
    return Context(backend=FakeClients(), factory=factory,
                   training=LocalTraining(lr=lr, batch_size=4), n_clients=n_clients,
                   train_sizes=np.full(n_clients, 10), rng=np.random.default_rng(0), seed=0)


@pytest.mark.parametrize("aggregation", ["mean", "sum"])
def test_algorithm_1_by_hand(aggregation):
    """Model step (line 4), round-robin broadcast (lines 6-7), cumulative block means (line 8)
    and the communication: all checked against a hand computation with fake gradients."""
    ctx, k, lr, c = fake_context(), 2, 0.5, 5
    algo = CFLGP(CFLGPConfig(n_clusters=k, period=2, stable_rounds=0, estimate_k=False,
                             gradient_aggregation=aggregation))
    algo.setup(ctx)
    d = ctx.factory.size
    ids = torch.arange(c, dtype=torch.float32)[:, None]
    history: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    kbar = -1
    for t in range(1, 9):
        models, assign = algo.state.models.clone(), algo.assignment()
        down_before = ctx.floats_down
        extras = algo.run_round(ctx, t).to_dict()
        clustering = t % 2 == 1
        assert extras["clustering"] is clustering
        extra_clients = 0
        if clustering:
            kbar = (kbar + 1) % k
            assert extras["broadcast_model"] == kbar
            history[kbar].append(models[kbar][None] + ids)  # every client's vector at θ_k̄
            assert torch.allclose(algo.state.features[:, kbar],
                                  torch.stack(history[kbar]).mean(0))
            extra_clients = int((assign != kbar).sum())  # the others already hold θ_k̄
        assert ctx.floats_down - down_before == (c + extra_clients) * d
        for j in range(k):
            members = torch.as_tensor(np.flatnonzero(assign == j))
            if len(members) == 0:
                assert torch.equal(algo.state.models[j], models[j])
                continue
            grads = models[j][None] + ids[members]
            step = grads.mean(0) if aggregation == "mean" else grads.sum(0)
            assert torch.allclose(algo.state.models[j], models[j] - lr * step)
    assert len(history[0]) == len(history[1]) == 2
    full = gram_matrix(algo.state.features.reshape(c, -1))  # the per-block Gram sums to GᵀG
    assert np.allclose(algo.state.block_gram.sum(0), full, rtol=1e-10, atol=1e-10)
    y = extras["models_down_per_client_period"]
    assert 2.0 <= y <= 3.0  # Table 5: Y ≤ P + 1 per client and period


def test_beta_matches_the_papers_formula_for_p_at_least_2():
    """Blocks are updated at t = 1 + (k-1)P + nKP; 1/(n+1) equals 1/(⌊t/(KP)⌋+1) there."""
    k, p = 3, 2
    ctx = fake_context(n_clients=6)
    algo = CFLGP(CFLGPConfig(n_clusters=k, period=p, stable_rounds=0, estimate_k=False))
    algo.setup(ctx)
    for t in range(1, 4 * k * p):
        extras = algo.run_round(ctx, t).to_dict()
        if extras["clustering"]:
            assert extras["beta"] == pytest.approx(1.0 / (t // (k * p) + 1))


def test_repo_mode_fills_block_zero_with_own_model_gradients():
    ctx = fake_context()
    algo = CFLGP(CFLGPConfig(n_clusters=2, period=1, stable_rounds=0, estimate_k=False,
                             mode="repo"))
    algo.setup(ctx)
    assert np.array_equal(algo.assignment(), np.zeros(5))  # the code starts all on model 0
    for t in range(1, 6):
        algo.run_round(ctx, t)
    assert torch.count_nonzero(algo.state.features[:, 1]) == 0
    assert torch.count_nonzero(algo.state.features[:, 0]) > 0
    assert all(len(r.clients) == 5 for r in ctx.backend.calls)  # no extra broadcast


def test_stops_clustering_after_stable_rounds_and_respects_t_cl():
    ctx = fake_context()
    algo = CFLGP(CFLGPConfig(n_clusters=2, period=1, stable_rounds=3, estimate_k=False))
    algo.setup(ctx)
    flags = [algo.run_round(ctx, t).clustering for t in range(1, 12)]
    stopped = algo.state.stopped_at
    assert stopped is not None and stopped - algo.state.last_change == 3
    assert not any(flags[stopped:])  # rounds after the stop do not cluster
    algo = CFLGP(CFLGPConfig(n_clusters=2, period=2, cluster_rounds=5, stable_rounds=0,
                             estimate_k=False))
    algo.setup(fake_context())
    assert [algo.clustering_round(algo.state, t) for t in range(1, 8)] == [
        True, False, True, False, False, False, False]


class NaNClient(FakeClients):
    """Client 3 diverged: its gradients are NaN, which the context's guard rejects."""

    def gradient(self, req: GradientRequest) -> GradientReply:
        reply = super().gradient(req)
        reply.grads[torch.from_numpy(np.flatnonzero(reply.clients == 3))] = float("nan")
        return reply


def test_a_rejected_client_is_left_out_and_keeps_its_feature():
    ctx = fake_context()
    ctx.backend = NaNClient()
    algo = CFLGP(CFLGPConfig(n_clusters=2, period=1, stable_rounds=0, estimate_k=False))
    algo.setup(ctx)
    models, assign, d = algo.state.models.clone(), algo.assignment(), ctx.factory.size
    ctx.guard.begin_round(1)
    extras = algo.run_round(ctx, 1).to_dict()
    rejected = ctx.guard.end_round()["rejected"]
    # both of client 3's replies (its model update and the broadcast θ_0, or only the first
    # if it is in cluster 0) are rejected by the guard, not by the algorithm
    assert {r["client"] for r in rejected} == {3} and len(rejected) == 1 + int(assign[3] != 0)
    ids = torch.arange(5, dtype=torch.float32)[:, None]
    # block 0 of the profile: every other client's vector at θ_0; client 3 keeps its old (0)
    assert torch.count_nonzero(algo.state.features[3]) == 0
    for c in (0, 1, 2, 4):
        assert torch.allclose(algo.state.features[c, 0], models[0] + ids[c, 0])
    for j in range(2):  # the model step averages the clients that answered
        members = torch.as_tensor([c for c in np.flatnonzero(assign == j) if c != 3])
        step = (models[j][None] + ids[members]).mean(0)
        assert torch.allclose(algo.state.models[j], models[j] - 0.5 * step)
    # a rejected reply was uploaded and is booked; the method counts the replies it received
    others = int((assign != 0).sum())
    assert ctx.floats_up == (5 + others) * d
    assert extras["uplink_floats_compressed"] == (5 + others - len(rejected)) * d


# ------------------------------------------------------------------ options


def test_weight_sharing_keeps_shared_layers_identical():
    exp, _ = run(rounds=6, algorithm={"shared_layers": ["layers.0"]})
    models = exp.algorithm.state.models
    idx = exp.factory.layout.index(["layers.0"])
    rest = exp.factory.layout.index(["layers.1"])
    assert torch.equal(models[:, idx], models[0, idx].expand(4, -1))
    assert not torch.equal(models[0, rest], models[1, rest])


@pytest.mark.parametrize("shared", [["layers"], [""], ["layers.0", "layers.1"]])
def test_weight_sharing_of_every_parameter_is_refused(shared):
    """`shared_layers = ["layers"]` made the K models one (the accuracy of K = 1) while the
    run reported 4 clusters and an ARI."""
    with pytest.raises(ConfigError, match=r"^algorithm\.shared_layers: .* names every "
                                          r"parameter of the model: the 4 models would be one"):
        run(rounds=1, algorithm={"shared_layers": shared})


def test_selected_layer_features_and_init_range():
    exp, _ = run(rounds=1, algorithm={"feature_layers": ["layers.1"], "init_range": 0.3})
    layout = exp.factory.layout
    assert torch.equal(exp.algorithm.state.feature_index, layout.index(["layers.1"]))
    linear = CFLGP(CFLGPConfig(n_clusters=3, init_range=0.3))
    linear.setup(fake_context())
    w = linear.state.models  # [K, (weight, bias)]
    assert torch.all(w[:, 0].abs() <= 0.3) and torch.all(w[:, 1] == 0)  # weight, bias


def test_k_estimate_is_one_without_groups_in_the_profile():
    """`_estimate` on hand-made Gram matrices: a profile of one distribution (a common
    direction plus noise) gives 1 whatever the silhouettes say, three groups their count;
    `k_significance = 0` (the default) is the estimate without the test (no p)."""
    rng = np.random.default_rng(2)
    common = rng.normal(size=300)
    flat = common + rng.normal(size=(24, 300))
    groups = np.concatenate([common + 3.0 * rng.normal(size=300) + rng.normal(size=(8, 300))
                             for _ in range(3)])
    algo = CFLGP(CFLGPConfig(n_clusters=3, k_max=6, k_significance=0.002))
    for rows, want in ((flat, 1), (groups, 3)):
        gram = rows @ rows.T
        proj = project_gram(gram, 12)
        _, est = algo._estimate(proj.features, proj.singular_values, 0, gram)
        assert est.k_estimate == want and est.structure_p is not None
        assert (est.structure_p >= 0.002) == (want == 1)
    gram = flat @ flat.T
    proj = project_gram(gram, 12)
    old = CFLGP(CFLGPConfig(n_clusters=3, k_max=6))
    _, est = old._estimate(proj.features, proj.singular_values, 0, gram)
    assert est.structure_p is None and est.k_estimate >= 1


def test_k_estimate_reported_in_extras_and_summary(tmp_path):
    exp = Experiment.from_config({**DIGITS, "rounds": 7, "algorithm": {
        **DIGITS["algorithm"], "estimate_k": True, "k_max": 6}}, out_dir=tmp_path)
    h = exp.run(progress=False)
    last = h.records[-1].extras
    assert 1 <= last["k_estimate"] <= 6 and last["spectral_gap_s"] >= 1
    assert last["k_structure_p"] is None  # the structure test is off by default
    assert h.summary.extras["k_estimate"] == last["k_estimate"]
    spectra = [r.extras["singular_values"] for r in clustering_records(h)]
    assert all(np.all(np.diff(s) <= 1e-9) for s in spectra)  # descending
    from clusterfl.report.methods.cfl_gp import figures

    paths = figures(tmp_path, read_history(tmp_path), h.summary)
    assert {p.name for p in paths} == {"cfl_gp_spectrum.png", "cfl_gp_features.png",
                                       "cfl_gp_k_estimate.png"}
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize(("field", "value"), [
    ("period", 0), ("n_clusters", 0), ("compression_ratio", 0.5), ("mode", "code"),
    ("gradient_aggregation", "median"), ("init_range", -1.0),
])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(ConfigError) as err:
        load_config({**DIGITS, "algorithm": {"name": "cfl_gp", field: value}})
    assert err.value.field == f"algorithm.{field}"


def test_cross_field_and_setup_errors():
    with pytest.raises(ConfigError, match="only applies to protocol"):
        load_config({**DIGITS, "algorithm": {"name": "cfl_gp", "protocol": "model",
                                             "gradient_aggregation": "sum"}})
    with pytest.raises(ConfigError) as err:
        run(algorithm={"feature_layers": ["nope"]})
    assert err.value.field == "algorithm.feature_layers"
    with pytest.raises(ConfigError) as err:
        run(algorithm={"n_clusters": 9})
    assert err.value.field == "algorithm.n_clusters"


# ------------------------------------------------------------------ checkpoint / resume


def _strip(obj):
    if isinstance(obj, RoundRecord | RunSummary):  # compared in their JSON form
        return _strip(obj.to_json_dict())
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k != "wall_time"}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def test_resume_from_checkpoint_ends_identically(tmp_path):
    cfg = {**DIGITS, "rounds": 10, "checkpoint_every": 4, "eval_every": 5,
           "train": {"lr": 0.1, "batch_size": 16, "steps": 1},
           "algorithm": {**DIGITS["algorithm"], "estimate_k": True, "k_max": 4,
                         "compression_ratio": 4.0, "stable_rounds": 3}}
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)
    killed = tmp_path / "killed"  # what a run killed after its round-8 checkpoint leaves
    (killed / "checkpoint").mkdir(parents=True)
    shutil.copy(tmp_path / "ref" / "checkpoint" / "state.pt", killed / "checkpoint")
    resumed = Experiment.from_config(cfg, out_dir=killed).run(resume=True, progress=False)
    assert _strip(resumed.records) == _strip(ref.records)
    assert _strip(resumed.summary) == _strip(ref.summary)
