"""Dropouts and stragglers: who fails is reproducible, failed clients vanish from the replies,
and every method completes its rounds with the clients that answered."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from clusterfl.algorithms import ALGORITHMS
from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.experiment import Experiment
from clusterfl.protocol import EvaluateRequest, TrainRequest, subset
from clusterfl.robust.config import FaultsConfig
from clusterfl.robust.faults import FaultPlan, partial_steps
from clusterfl.robust.guard import Guard

from .conftest import (
    EXPECTED_METHODS,
    TRAIN,
    Tamper,
    assert_registry_complete,
    config,
    factory_for,
    make_context,
)


def test_fault_plan_is_a_function_of_seed_and_round():
    plan = FaultPlan(FaultsConfig(dropout=0.3, stragglers=0.2), 200, seed=5)
    a, b = plan.round(3), plan.round(3)
    assert a == b and plan.round(4) != a
    assert FaultPlan(FaultsConfig(dropout=0.3), 200, seed=6).round(3).dropped != a.dropped
    rates = [len(plan.round(t).dropped) / 200 for t in range(1, 41)]
    assert abs(np.mean(rates) - 0.3) < 0.02
    assert all(not (plan.round(t).dropped & plan.round(t).stragglers) for t in range(1, 20))
    named = FaultPlan(FaultsConfig(drop_clients=[1, 4], drop_rounds=[2, 3]), 6, seed=0)
    assert [sorted(named.round(t).dropped) for t in (1, 2, 3, 4)] == [[], [1, 4], [1, 4], []]
    always = FaultPlan(FaultsConfig(drop_clients=[0]), 6, seed=0)
    assert all(always.round(t).dropped == {0} for t in range(1, 5))


def _fedavg_round(fed, guard, backend=None):
    f = factory_for(fed)
    ctx = make_context(fed, backend or Tamper(SimulationBackend(fed, f)), guard)
    algo = FedAvg(FedAvgConfig())
    algo.setup(ctx)
    start = algo.state.model.clone()
    seed = make_context(fed).next_seed()  # the request seed the round will use
    guard.begin_round(1)
    algo.run_round(ctx, 1)
    return ctx, algo, start, seed, SimulationBackend(fed, f)


def test_dropped_clients_get_nothing_and_vanish_from_the_average(digits):
    guard = Guard(8, 0, digits.train_sizes, faults=FaultsConfig(drop_clients=[1, 4]))
    ctx, algo, start, seed, clean = _fedavg_round(digits, guard)
    assert [c.tolist() for c in (r.clients for r in ctx.backend.seen)] == [[0, 2, 3, 5, 6, 7]]
    ref = clean.execute(TrainRequest(np.array([0, 2, 3, 5, 6, 7]), start,
                                     np.zeros(6, np.int64), TRAIN, seed))
    torch.testing.assert_close(algo.state.model[0], weighted_mean(ref.params, ref.n_samples))
    assert guard.end_round()["dropped"] == [1, 4]
    d = start.shape[1]
    assert ctx.floats_down == 6 * d and ctx.floats_up == 6 * d  # only who was reached / sent


def test_nobody_answers_keeps_the_model(digits):
    guard = Guard(8, 0, digits.train_sizes, faults=FaultsConfig(drop_clients=list(range(8))))
    ctx, algo, start, _, _ = _fedavg_round(digits, guard)
    assert ctx.backend.seen == [] and torch.equal(algo.state.model, start)


def test_a_backend_may_report_dead_nodes(digits):
    """A backend (e.g. Flower) answers for fewer clients: its reply lists who answered."""
    def lose_two(request, reply):
        keep = np.array([i for i, c in enumerate(request.clients) if c not in (3, 6)])
        return subset(reply, keep)

    f = factory_for(digits)
    guard = Guard(8, 0, digits.train_sizes)
    _ctx, algo, start, seed, clean = _fedavg_round(
        digits, guard, Tamper(SimulationBackend(digits, f), lose_two))
    ok = np.array([0, 1, 2, 4, 5, 7])
    ref = clean.execute(TrainRequest(ok, start, np.zeros(6, np.int64), TRAIN, seed))
    torch.testing.assert_close(algo.state.model[0], weighted_mean(ref.params, ref.n_samples))
    assert guard.end_round()["dropped"] == [3, 6]


def test_stragglers_return_their_partial_work(digits):
    faults = FaultsConfig(stragglers=0.5, straggler_work=0.25)
    guard = Guard(8, 0, digits.train_sizes, faults=faults)
    slow = sorted(FaultPlan(faults, 8, 0).round(1).stragglers)
    assert 0 < len(slow) < 8
    _ctx, algo, start, seed, clean = _fedavg_round(digits, guard)
    fast = [c for c in range(8) if c not in slow]
    parts = [clean.execute(TrainRequest(np.array(fast), start, np.zeros(len(fast), np.int64),
                                        TRAIN, seed))]
    for c in slow:
        steps = partial_steps(TRAIN, int(digits.train_sizes[c]), 0.25)
        assert steps == max(1, int(np.ceil(digits.train_sizes[c] / 32) * 0.25))
        parts.append(clean.execute(TrainRequest(np.array([c]), start, np.zeros(1, np.int64),
                                                replace(TRAIN, steps=steps), seed)))
    params = torch.cat([p.params for p in parts])
    sizes = np.concatenate([p.n_samples for p in parts])
    torch.testing.assert_close(algo.state.model[0], weighted_mean(params, sizes))
    assert guard.end_round()["stragglers"] == slow


def test_stragglers_missing_the_deadline_are_dropped_from_training(digits):
    faults = FaultsConfig(stragglers=0.5, straggler_work=0.0)
    guard = Guard(8, 0, digits.train_sizes, faults=faults)
    slow = sorted(FaultPlan(faults, 8, 0).round(1).stragglers)
    ctx, *_ = _fedavg_round(digits, guard)
    assert sorted(set(range(8)) - set(ctx.backend.seen[0].clients.tolist())) == slow


def test_a_straggler_asked_twice_in_a_round_counts_once_as_the_history_lists_it(digits):
    """The summary's `straggled` total is the history's per-round `stragglers` summed (it
    counted a straggler once per training request: CFL-GP's clustering rounds ask twice)."""
    faults = FaultsConfig(stragglers=0.5)
    guard = Guard(8, 0, digits.train_sizes, faults=faults)
    slow = sorted(FaultPlan(faults, 8, 0).round(1).stragglers)
    f = factory_for(digits)
    backend = SimulationBackend(digits, f)
    start = f.init(0)[None]
    guard.begin_round(1)
    for seed in (1, 2):  # two training requests of the same round
        guard.send(backend, TrainRequest(np.arange(8), start, np.zeros(8, np.int64), TRAIN,
                                         seed))
    events = guard.end_round()
    guard.count_round(events)
    assert events["stragglers"] == slow
    assert guard.summary()["straggled"] == len(slow)


# ------------------------------------------------------------------ every method, with dropout

METHOD_SETTINGS = {
    "fedavg": {}, "fedprox": {}, "local": {}, "fedavg_plus": {"n_models": 2},
    "fedprox_plus": {"n_models": 2},
    "ifca": {"n_clusters": 2}, "fesem": {"n_clusters": 2, "warmup_rounds": 1},
    "ifca_cam": {"n_clusters": 2, "warmup_rounds": 1},
    "fesem_cam": {"n_clusters": 2, "warmup_rounds": 1},
    "cfl": {"eps1": 100.0, "eps2": 0.01}, "cfl_gp": {"n_clusters": 2, "period": 1},
    "pca_km_hc": {"fraction": 1.0, "k": 3, "pca_components": 4},
    "fedem": {"n_components": 2},
    "fedsoft": {"n_clusters": 2, "per_cluster": 3},
    "pacfl": {"fraction": 1.0, "threshold": 10.0}, "flhc": {"warmup_rounds": 1},
}
NOT_RUN_HERE = {"flt": "pretrains its encoder on another dataset (too slow for this loop)"}


def test_every_expected_method_is_registered_and_run_here():
    assert_registry_complete(ALGORITHMS)
    assert sorted(METHOD_SETTINGS) == sorted(set(EXPECTED_METHODS) - set(NOT_RUN_HERE))


@pytest.mark.parametrize("method", list(METHOD_SETTINGS))
def test_every_method_runs_with_dropouts_and_stragglers(method, monkeypatch):
    import clusterfl.experiment as experiment

    faults = {"dropout": 0.3, "drop_clients": [0], "drop_rounds": [2], "stragglers": 0.2}
    cfg = config(rounds=5, eval_every=1, faults=faults,
                 algorithm={"name": method, **METHOD_SETTINGS[method]})
    sent: list[tuple[int, list[int]]] = []
    current = {"t": 0}
    real_begin = Guard.begin_round

    def begin(self, t):
        current["t"] = t
        real_begin(self, t)

    def spying(config_, fed, factory):
        inner = SimulationBackend(fed, factory)

        class _Spy(Tamper):
            def execute(self, request):
                if not isinstance(request, EvaluateRequest):
                    sent.append((current["t"], request.clients.tolist()))
                return super().execute(request)

        return _Spy(inner)

    monkeypatch.setattr(Guard, "begin_round", begin)
    monkeypatch.setattr(experiment, "build_backend", spying)
    exp = Experiment.from_config(cfg)
    h = exp.run(progress=False)
    plan = FaultPlan(FaultsConfig(**faults), 8, seed=cfg["seed"])
    assert sent, "no request reached the backend"
    for t, clients in sent:  # an unreachable client never receives a request of its round
        assert not set(clients) & plan.round(t).dropped, (t, clients)
    for r in h.records:  # the history names the dropped clients that were asked
        asked = {c for t, cl in sent if t == r.round for c in cl}
        wanted = plan.round(r.round).dropped & (asked | plan.round(r.round).dropped)
        assert r.robust is not None and set(r.robust["dropped"]) == wanted
    acc = h.series("accuracy")
    assert all(np.isfinite(acc)) and acc[-1] > acc[0] + 0.02, acc  # still learning
    a = np.asarray(h.records[-1].assignment)
    assert len(a) == 8 and a.min() >= -1


def test_cfl_places_clients_absent_at_the_split_by_algorithm_4():
    """Clients 2 and 5 are away in rounds 3-5; the split happens in round 3 without them.
    They wait at the root (assignment = node 0) and join the right child in round 6."""
    cfg = config(rounds=7, eval_every=7,
                 faults={"drop_clients": [2, 5], "drop_rounds": [3, 4, 5]},
                 algorithm={"name": "cfl", "eps1": 0.12, "eps2": 0.15, "warmup_rounds": 2})
    h = Experiment.from_config(cfg).run(progress=False)
    rec = {r.round: r for r in h.records}
    assert rec[3].extras["split"] and rec[3].extras["pending"] == [2, 5]
    assert rec[3].assignment[2] == rec[3].assignment[5] == 0  # waiting at the root
    assert rec[6].extras["placed"] == [2, 5] and rec[6].extras["pending"] == []
    assert rec[6].ari == pytest.approx(1.0) and h.final.ari == pytest.approx(1.0)
