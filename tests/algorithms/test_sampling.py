"""Client sampling (issue 21): one rule in every method but CFL — `[algorithm] fraction` or a
fixed `per_round` (`SampledConfig`, drawn by `Context.sample_round`). Each round takes part
with that many clients, the others keep their cluster (and Local's their model), the draws
follow the run's seed and survive a checkpoint, and CFL-GP still finds the clusters."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from tests.crash import crash_then_resume, timing_free
from tests.robust.conftest import EXPECTED_METHODS, config

from clusterfl.algorithms import ALGORITHMS
from clusterfl.algorithms.common import SampledConfig
from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment

N = 8  # clients of the robustness tests' federation (`config`)
K = 3  # per_round

#: every method that samples, with small settings (FLT: an untrained encoder, no UMAP)
SAMPLED: dict[str, dict[str, Any]] = {
    "fedavg": {}, "fedprox": {}, "local": {}, "fedavg_plus": {"n_models": 2},
    "fedprox_plus": {"n_models": 2}, "ifca": {"n_clusters": 2}, "fesem": {"n_clusters": 2},
    "ifca_cam": {"n_clusters": 2, "warmup_rounds": 1},
    "fesem_cam": {"n_clusters": 2, "warmup_rounds": 1},
    "cfl_gp": {"n_clusters": 2, "period": 1},
    "fedem": {"n_components": 2},
    # FedSoft estimates importance on every client every τ rounds (the authors' code): τ
    # longer than the runs leaves round 1 the only round of all clients
    "fedsoft": {"n_clusters": 2, "estimation_interval": 100},
    "pca_km_hc": {"k": 3, "pca_components": 4, "n_clusters": 2},
    "flt": {"k": 3, "encoder": "none", "umap": False, "finetune_epochs": 0, "latent": 8,
            "n_clusters": 2},
    "pacfl": {"n_clusters": 2},
    "flhc": {"warmup_rounds": 1},
}
#: rounds in which every client takes part whatever the rule: FeSEM-CAM's warm-up (local
#: training, then every model for the first k-means), FLT's one-shot signatures
#: PACFL's one-shot subspaces (round 1), FL+HC's clustering round (after 1 warm-up round)
EVERYONE = {"fesem_cam": {1}, "flt": {1}, "pca_km_hc": {1}, "fedsoft": {1}, "pacfl": {1},
            "flhc": {2}}
#: FedAvg+/FedProx+: each of the ensemble's models draws its own sample (as separate runs
#: would); a round's participants are their union
UNION = {"fedavg_plus", "fedprox_plus"}
NOT_SAMPLED_HERE = {"cfl": "tests/algorithms/test_cfl_sampling.py (its split test needs a "
                            "federation CFL splits)"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_every_method_samples_through_sampled_config():
    assert sorted(SAMPLED) == sorted(set(EXPECTED_METHODS) - set(NOT_SAMPLED_HERE))
    for name in [*SAMPLED, *NOT_SAMPLED_HERE]:
        assert issubclass(ALGORITHMS[name].Config, SampledConfig), name


def _cfg(method: str, rule: dict[str, Any], seed: int = 1, rounds: int = 4,
         **tables: Any) -> dict[str, Any]:
    return config(seed=seed, rounds=rounds, eval_every=2,
                  algorithm={"name": method, **SAMPLED[method], **rule}, **tables)


def _spied_run(cfg: dict[str, Any]) -> tuple[Experiment, Any, list[dict[str, Any]]]:
    """Run `cfg`, noting per round who took part and every client's cluster (and, for
    Local, model) before and after the round."""
    exp = Experiment.from_config(cfg)
    alg, seen = exp.algorithm, []
    real = alg.run_round

    def own_models():  # each client's model (client order), however the rows are numbered
        p = alg.predictor()
        return p.models[torch.from_numpy(p.members[:, 0])].clone()

    def spy(ctx, t):
        before, models = alg.assignment(), own_models()
        out = real(ctx, t)
        seen.append({"t": t, "who": set(ctx.participants), "before": before,
                     "after": alg.assignment(), "models": models,
                     "models_after": own_models()})
        return out

    alg.run_round = spy  # type: ignore[method-assign]
    return exp, exp.run(progress=False), seen


@pytest.mark.parametrize("method", list(SAMPLED))
def test_per_round_clients_take_part_and_the_others_keep_their_cluster(method):
    _, h, seen = _spied_run(_cfg(method, {"per_round": K}))
    for rec, s in zip(h.records, seen, strict=True):
        assert rec.participants == len(s["who"])
        if method in UNION:  # 2 models, 3 clients each
            assert K <= len(s["who"]) <= 2 * K
            continue
        want = N if s["t"] in EVERYONE.get(method, ()) else K
        assert len(s["who"]) == want, (s["t"], s["who"])
        idle = np.setdiff1d(np.arange(N), sorted(s["who"]))
        if method == "fesem":  # its first k-means also clusters the models gathered before
            idle = idle[s["before"][idle] >= 0]
        assert (s["after"][idle] == s["before"][idle]).all(), (s["t"], idle)
        if method == "local":  # a client's own model: untouched unless it trained
            assert torch.equal(s["models_after"][idle], s["models"][idle])
            assert not torch.equal(s["models_after"][sorted(s["who"])],
                                   s["models"][sorted(s["who"])])
    rounds = len(h.records)
    everyone = len(EVERYONE.get(method, ()))
    share = (everyone * N + (rounds - everyone) * K) / (rounds * N)
    if method in UNION:
        share = float(np.mean([len(s["who"]) for s in seen])) / N
    assert h.summary.final.participation == pytest.approx(share)


def test_clients_that_drop_out_are_not_counted():
    faults = {"drop_clients": [0, 1, 2, 3]}
    _, h, seen = _spied_run(_cfg("fedavg", {"per_round": K}, rounds=6, faults=faults))
    assert all(not s["who"] & {0, 1, 2, 3} for s in seen)
    assert [r.participants for r in h.records] == [len(s["who"]) for s in seen]
    assert max(r.participants for r in h.records) <= K
    assert min(r.participants for r in h.records) < K  # some round sampled a dropped client


@pytest.mark.parametrize("method", list(SAMPLED))
def test_sampling_follows_the_seed(method):
    rule = {"per_round": K}
    _, a, seen_a = _spied_run(_cfg(method, rule, seed=1))
    _, b, seen_b = _spied_run(_cfg(method, rule, seed=1))
    assert timing_free(a.records) == timing_free(b.records)
    assert [s["who"] for s in seen_a] == [s["who"] for s in seen_b]
    _, _, seen_c = _spied_run(_cfg(method, rule, seed=2))
    assert [s["who"] for s in seen_a] != [s["who"] for s in seen_c]


@pytest.mark.parametrize("rule", [{"per_round": K}, {"fraction": 0.5}],
                         ids=["per_round", "fraction"])
@pytest.mark.parametrize("method", list(SAMPLED))
def test_sampled_run_resumes_bit_identically(method, rule, tmp_path):
    cfg = _cfg(method, rule, rounds=5)
    cfg["checkpoint_every"] = 2
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    ref_h = ref.run(progress=False)
    resumed, h = crash_then_resume(cfg, tmp_path / "cut", 4)
    assert timing_free(h.summary) == timing_free(ref_h.summary)
    assert timing_free(h.records) == timing_free(ref_h.records)
    assert h.summary.final.participation is not None and h.summary.final.participation < 1
    pa, pb = resumed.algorithm.predictor(), ref.algorithm.predictor()
    assert torch.equal(pa.models, pb.models) and (pa.members == pb.members).all()


@pytest.mark.parametrize("method", ["fedavg", "ifca", "cfl_gp", "flt"])
@pytest.mark.parametrize(("rule", "field", "words"), [
    ({"fraction": 0.5, "per_round": 3}, "algorithm",
     "set algorithm.fraction or algorithm.per_round, not both"),
    ({"per_round": 0}, "algorithm.per_round", "greater than or equal to 1"),
    ({"fraction": 0.0}, "algorithm.fraction", "greater than 0"),
    ({"fraction": 1.5}, "algorithm.fraction", "less than or equal to 1"),
])
def test_bad_sampling_rules_fail_in_one_line_naming_the_field(method, rule, field, words):
    with pytest.raises(ConfigError) as info:
        load_config({"algorithm": {"name": method, **rule}})
    assert info.value.field == field and words in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("method", ["fedavg", "flt"])
def test_a_per_round_config_is_written_with_its_one_rule_and_loads_again(method):
    cfg = load_config({"algorithm": {"name": method, "per_round": 3}})
    table = cfg.to_dict()["algorithm"]
    assert table["per_round"] == 3 and "fraction" not in table  # FLT's ρ default left out
    again = load_config(copy.deepcopy(cfg.to_dict()))
    assert again.algorithm.per_round == 3
    assert "fraction" in load_config({"algorithm": {"name": method}}).to_dict()["algorithm"]


def test_privacy_accounting_samples_at_per_round_over_clients():
    cfg = _cfg("fedavg", {"per_round": 2}, privacy={"clip": 1.0, "noise_multiplier": 1.0})
    h = Experiment.from_config(cfg).run(progress=False)
    assert h.summary.robust is not None
    assert h.summary.robust["privacy"]["sampling_rate"] == pytest.approx(2 / N)


# ------------------------------------------------------------------ CFL-GP with a sample


def _rotated_digits(seed: int, n_clients: int, rounds: int, algorithm: dict[str, Any],
                    train: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "seed": seed, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
        "data": {"source": "digits"},
        "scenario": {"name": "rotation", "n_clients": n_clients, "angles": [0, 90, 180, 270]},
        "model": {"name": "mlp", "hidden": [32]},
        "train": train or {"lr": 0.1, "batch_size": 128, "steps": 1},
        "algorithm": {"name": "cfl_gp", "n_clusters": 4, "estimate_k": False, **algorithm},
        "output": {"figures": False, "progress": "off"},
    }


@pytest.mark.parametrize(("seed", "n_clients", "rounds", "algorithm", "train"), [
    (0, 12, 30, {"period": 1, "fraction": 0.5}, None),
    (1, 12, 30, {"period": 1, "fraction": 0.5}, None),
    (3, 16, 60, {"period": 2, "per_round": 4}, None),
    (0, 16, 100, {"period": 2, "fraction": 0.25, "protocol": "model"},
     {"lr": 0.1, "batch_size": 32, "steps": 2}),
])
def test_cfl_gp_with_a_sample_finds_the_four_rotations(seed, n_clients, rounds, algorithm,
                                                       train):
    exp = Experiment.from_config(_rotated_digits(seed, n_clients, rounds, algorithm, train))
    h = exp.run(progress=False)
    share = algorithm.get("fraction", algorithm.get("per_round", 0) / n_clients)
    assert all(r.participants == round(share * n_clients) for r in h.records)
    assert h.records[-1].ari == pytest.approx(1.0)
    assert h.records[0].ari < 1.0  # found over the rounds, not by the initial draw
    assert exp.algorithm.profiled().all()  # every client has its whole profile


def test_cfl_gp_refreshes_only_the_profiles_of_the_clients_that_answered():
    exp = Experiment.from_config(_rotated_digits(2, 12, 12, {"period": 1, "per_round": 3,
                                                             "stable_rounds": 0}))
    alg = exp.algorithm
    real = alg.run_round
    rounds: list[dict[str, Any]] = []

    def spy(ctx, t):
        feats, asked = alg.state.features.clone(), alg.asked.copy()
        out = real(ctx, t)
        rounds.append({"who": sorted(ctx.participants), "feats": feats, "asked": asked,
                       "feats_after": alg.state.features.clone(),
                       "asked_after": alg.asked.copy(), "kbar": alg.state.kbar})
        return out

    alg.run_round = spy  # type: ignore[method-assign]
    exp.run(progress=False)
    for r in rounds:
        idle = np.setdiff1d(np.arange(12), r["who"])
        assert torch.equal(r["feats_after"][idle], r["feats"][idle])
        assert (r["asked_after"][idle] == r["asked"][idle]).all()
        grown = r["asked_after"][r["who"]] - r["asked"][r["who"]]
        assert (grown[:, r["kbar"]] == 1).all()  # everyone sampled is asked for k̄ ...
        ever = r["asked"].sum(0) > 0  # ... and for each block it lacks that others have
        lacking = (r["asked"][r["who"]] == 0) & ever[None, :]
        assert (grown[lacking] == 1).all()
        assert (grown.sum(1) == 1 + lacking.sum(1) - lacking[:, r["kbar"]]).all()


# ------------------------------------------------------------------ FeSEM's newcomers


def test_fesem_least_loss_newcomers_ask_the_centers_once_and_change_nothing_at_full():
    from clusterfl.protocol import LossRequest

    def run(rule: dict[str, Any], start: str) -> tuple[Any, list[tuple[int, list[int]]]]:
        exp = Experiment.from_config(_cfg("fesem", {**rule, "newcomer_start": start},
                                          rounds=6))
        alg, asks = exp.algorithm, []
        real_round = alg.run_round

        def spy(ctx, t):
            unclustered = set(np.flatnonzero(alg.assignment() < 0).tolist())
            real_send = ctx.send

            def send(request):
                for step in getattr(request, "steps", [request]):  # in a Steps, or alone
                    if isinstance(step, LossRequest):
                        assert set(step.clients.tolist()) <= unclustered
                        assert alg.state.centers is not None  # only once centers exist
                        asks.append((t, step.clients.tolist()))
                return real_send(request)

            ctx.send = send
            try:
                return real_round(ctx, t)
            finally:
                ctx.send = real_send

        alg.run_round = spy  # type: ignore[method-assign]
        return exp.run(progress=False), asks

    _, asks = run({"per_round": K}, "least_loss")
    assert asks and all(t > 1 for t, _ in asks)  # clients first sampled after round 1
    asked = [c for _, who in asks for c in who]
    assert len(asked) == len(set(asked))  # a client is a newcomer once
    assert not run({"per_round": K}, "start")[1]
    full, none = run({}, "least_loss")
    assert not none  # every client is clustered in round 1: nothing changes
    assert timing_free(full.records) == timing_free(run({}, "start")[0].records)


def test_cfl_gp_checkpoint_of_an_earlier_version_rebuilds_who_was_asked():
    exp = Experiment.from_config(_cfg("cfl_gp", {}, rounds=3))
    exp.run(progress=False)
    state = exp.algorithm.state_dict()
    now = state.pop("asked").copy()
    assert (now == exp.algorithm.state.block_updates[None, :]).all()  # all asked, each time
    exp.algorithm.load_state_dict(state)
    assert exp.algorithm.state.asked is None
    assert (exp.algorithm.asked == now).all() and exp.algorithm.profiled().all()


def test_fesem_first_kmeans_waits_for_half_the_clients_then_clusters_them_at_once():
    """With a sample, models trained from Θ_0 gather until `first_clustering` of the
    clients sent one; the first k-means then clusters all of them. 0: the first sample."""
    _, _, seen = _spied_run(_cfg("fesem", {"per_round": K}, rounds=5))
    gathered: set[int] = set()
    for r in seen:
        gathered |= r["who"]
        clustered = set(np.flatnonzero(r["after"] >= 0).tolist())
        if len(gathered) < N / 2:  # still gathering: nobody clustered, all start from Θ_0
            assert not clustered
            assert torch.equal(r["models_after"], r["models"])  # predict with Θ_0
        else:
            assert gathered <= clustered
            break
    else:
        raise AssertionError("the first k-means never ran")
    assert r["t"] > 1  # K = 3 of 8 per round: at least two rounds to gather 4
    _, _, first = _spied_run(_cfg("fesem", {"per_round": K, "first_clustering": 0},
                                  rounds=1))
    assert set(np.flatnonzero(first[0]["after"] >= 0).tolist()) == first[0]["who"]


@pytest.mark.parametrize(("fraction", "n", "asked"), [(0.2, 8, 2), (0.15, 10, 2), (0.3, 8, 2),
                                                      (0.001, 8, 1), (1.0, 7, 7)])
def test_the_accounted_rate_is_the_share_of_clients_a_round_asks(fraction, n, asked):
    # 0.2 of 8 clients asks round(1.6) = 2 of them: ε must be accounted at 2/8, not 0.2
    cfg = load_config({"algorithm": {"name": "fedavg", "fraction": fraction}}).algorithm
    assert cfg.per_round_count(n) == asked
    assert cfg.expected_fraction(n) == pytest.approx(asked / n)


def test_privacy_accounting_of_a_fraction_that_rounds_up_uses_the_clients_asked():
    cfg = _cfg("fedavg", {"fraction": 0.2}, privacy={"clip": 1.0, "noise_multiplier": 1.0})
    h = Experiment.from_config(cfg).run(progress=False)
    asked = max(1, round(0.2 * N))
    assert {r.participants for r in h.records} == {asked}
    assert h.summary.robust is not None
    assert h.summary.robust["privacy"]["sampling_rate"] == pytest.approx(asked / N)
