"""Bad replies (NaN/Inf, wrong shape, absurd norm) are rejected before aggregation, recorded in
the history, and the round goes on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import clusterfl.experiment as experiment
from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig
from clusterfl.algorithms.ifca import IFCA, IFCAConfig
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.experiment import Experiment
from clusterfl.protocol import (
    GradientReply,
    GradientRequest,
    TrainReply,
    TrainRequest,
)
from clusterfl.robust.config import ValidationConfig
from clusterfl.robust.guard import Guard
from clusterfl.robust.validate import check_reply

from .conftest import TRAIN, Tamper, config, factory_for, make_context


def _train_request(n: int, d: int = 3) -> TrainRequest:
    return TrainRequest(np.arange(10, 10 + n), torch.zeros(1, d), np.zeros(n, np.int64), TRAIN, 0)


def test_check_reply_names_each_bad_row():
    req = _train_request(6)
    params = torch.tensor([[1.0, 0, 0], [0, 1, 0], [float("nan"), 0, 0], [0, 0, float("inf")],
                           [0, 500.0, 0], [0, 0, 1]])
    sizes = np.array([5, 5, 5, 5, 5, 0])
    keep, rej = check_reply(req, TrainReply(req.clients, params, sizes, np.zeros(6)),
                            ValidationConfig())
    assert keep.tolist() == [True, True, False, False, False, False]
    assert [(r.client, r.reason) for r in rej] == [(12, "non_finite"), (13, "non_finite"),
                                                   (14, "norm"), (15, "n_samples")]
    assert rej[2].value == pytest.approx(500.0)  # 500 > 100 × median(1, 1, 500) = 100


def test_norm_bounds_absolute_and_relative_and_off():
    req = _train_request(4)
    params = torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [0, 40.0, 0]])
    reply = TrainReply(req.clients, params, np.ones(4), np.zeros(4))
    keep, _ = check_reply(req, reply, ValidationConfig(max_norm=2.5))
    assert keep.tolist() == [True, True, False, False]
    keep, _ = check_reply(req, reply, ValidationConfig(median_multiple=10.0))
    assert keep.tolist() == [True, True, True, False]  # median 2.5 → bound 25
    keep, _ = check_reply(req, reply, ValidationConfig(enabled=False))
    assert keep.all()
    # the norm is that of the *update*: a start model far from 0 changes nothing
    moved = replace(req, models=torch.full((1, 3), 1000.0))
    keep, _ = check_reply(moved, replace(reply, params=params + 1000.0),
                          ValidationConfig(median_multiple=10.0))
    assert keep.tolist() == [True, True, True, False]


def test_wrong_shape_rejects_the_whole_reply():
    req = _train_request(3)
    keep, rej = check_reply(req, TrainReply(req.clients, torch.zeros(3, 4), np.ones(3),
                                            np.zeros(3)), ValidationConfig())
    assert not keep.any() and {r.reason for r in rej} == {"shape"} and len(rej) == 3


def _poison_rows(rows: dict[int, float]):
    """Hook: in training replies, client c's params := start + value (NaN stays NaN)."""

    def hook(request, reply):
        if not isinstance(reply, TrainReply):
            return reply
        params = reply.params.clone()
        for i, c in enumerate(request.clients):
            if int(c) in rows:
                params[i] = request.models[request.model_of_client[i]] + rows[int(c)]
        return replace(reply, params=params)

    return hook


def test_fedavg_averages_only_the_valid_replies(digits):
    f = factory_for(digits)
    clean = SimulationBackend(digits, f)
    bad = {2: float("nan"), 5: 1e6, 6: float("inf")}
    guard = Guard(digits.n_clients, 0, digits.train_sizes)
    ctx = make_context(digits, Tamper(SimulationBackend(digits, f), _poison_rows(bad)), guard)
    algo = FedAvg(FedAvgConfig())
    algo.setup(ctx)
    start = algo.state.model.clone()
    seed_ctx = make_context(digits)  # same generator: the same request seed
    seed = seed_ctx.next_seed()
    guard.begin_round(1)
    algo.run_round(ctx, 1)
    good = np.array([c for c in range(8) if c not in bad])
    ref = clean.execute(TrainRequest(good, start, np.zeros(len(good), np.int64), TRAIN,
                                     seed))
    torch.testing.assert_close(algo.state.model[0], weighted_mean(ref.params, ref.n_samples))
    events = guard.end_round()
    assert [(r["client"], r["reason"]) for r in events["rejected"]] == [
        (2, "non_finite"), (5, "norm"), (6, "non_finite")]


def test_gradient_replies_are_checked_too(digits):
    f = factory_for(digits)

    def hook(request, reply):
        if isinstance(reply, GradientReply):
            g = reply.grads.clone()
            g[1] = float("nan")
            return replace(reply, grads=g)
        return reply

    guard = Guard(digits.n_clients, 0, digits.train_sizes)
    ctx = make_context(digits, Tamper(SimulationBackend(digits, f), hook), guard)
    algo = IFCA(IFCAConfig(n_clusters=2, averaging="gradient"))
    algo.setup(ctx)
    guard.begin_round(1)
    algo.run_round(ctx, 1)
    assert torch.isfinite(algo.state.models).all()
    assert [r["reason"] for r in guard.end_round()["rejected"]] == ["non_finite"]
    sent = [r for r in ctx.backend.seen if isinstance(r, GradientRequest)]
    assert len(sent) == 1 and len(sent[0].clients) == 8


def test_history_records_rejections_and_the_run_goes_on(monkeypatch):
    """A client sends NaN in round 2 and an absurd update in round 4; both are logged in the
    history, the model stays finite and keeps learning."""
    calls = {"n": 0}

    def tampering(cfg, fed, factory):
        inner = SimulationBackend(fed, factory)

        def hook(request, reply):
            if not isinstance(reply, TrainReply):
                return reply
            calls["n"] += 1
            values = {2: {3: float("nan")}, 4: {0: 1e4}}.get(calls["n"], {})
            return _poison_rows(values)(request, reply)

        return Tamper(inner, hook)

    monkeypatch.setattr(experiment, "build_backend", tampering)
    h = Experiment.from_config(config(eval_every=1)).run(progress=False)
    assert [r.rejected for r in h.records] == [0, 1, 0, 1, 0, 0]
    events = [r.robust or {} for r in h.records]
    assert events[1]["rejected"] == [
        {"client": 3, "request": "train", "reason": "non_finite", "value": None}]
    assert events[3]["rejected"][0]["reason"] == "norm"
    acc = h.series("accuracy")
    assert all(np.isfinite(acc)) and acc[-1] > acc[0] + 0.1
