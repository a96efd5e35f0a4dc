"""FedEM's mixture training through the robustness layer: bad rows are rejected before the
components are averaged, stragglers train fewer steps, clipping bounds the K·d-float update,
and an attacker's update is replaced."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from clusterfl.algorithms.fedem import FedEM, FedEMConfig
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.protocol import (
    BestCountReply,
    BestCountRequest,
    MixtureFitReply,
    MixtureFitRequest,
    MixtureTrainReply,
    MixtureTrainRequest,
)
from clusterfl.robust.config import (
    AdversaryConfig,
    FaultsConfig,
    PrivacyConfig,
    ValidationConfig,
)
from clusterfl.robust.faults import FaultPlan, partial_steps
from clusterfl.robust.guard import Guard
from clusterfl.robust.validate import check_reply

from .conftest import TRAIN, Tamper, factory_for, make_context


def _request(fed, k: int = 2) -> MixtureTrainRequest:
    models = factory_for(fed).init_many(k, seed=3)
    n = fed.n_clients
    return MixtureTrainRequest(np.arange(n), models, np.full((n, k), 1.0 / k), TRAIN, 9)


def test_check_reply_names_each_bad_mixture_row():
    req = MixtureTrainRequest(np.arange(6), torch.zeros(2, 3), np.full((6, 2), 0.5), TRAIN, 0)
    params = torch.ones(6, 2, 3)
    params[1, 1, 2] = float("nan")
    params[2] *= 1e4
    weights = np.full((6, 2), 0.5)
    weights[3, 0] = np.nan
    reply = MixtureTrainReply(req.clients, params, np.full(6, 5), np.zeros(6), weights)
    keep, rej = check_reply(req, reply, ValidationConfig(median_multiple=100.0,
                                                          min_replies_for_median=2))
    assert keep.tolist() == [True, False, False, False, True, True]
    assert [(r.client, r.reason) for r in rej] == [(1, "non_finite"), (2, "norm"),
                                                  (3, "non_finite")]
    bad_shape = replace(reply, params=torch.ones(4, 3, 3))
    assert not check_reply(req, bad_shape, ValidationConfig())[0].any()
    fit = MixtureFitReply(np.arange(2), np.array([[0.5, 0.5], [np.nan, 1]]), np.zeros(2),
                          np.array([3, 3]))
    fit_req = MixtureFitRequest(np.arange(2), torch.zeros(2, 3), np.full((2, 2), 0.5))
    assert check_reply(fit_req, fit, ValidationConfig())[0].tolist() == [True, False]
    cnt_req = BestCountRequest(np.arange(2), torch.zeros(2, 3))
    wrong = BestCountReply(np.arange(2), np.zeros((2, 3), np.int64), np.array([3, 3]))
    assert not check_reply(cnt_req, wrong, ValidationConfig())[0].any()


def test_fedem_averages_only_the_valid_replies(digits):
    def poison(request, reply):
        if isinstance(reply, MixtureTrainReply):
            params = reply.params.clone()
            params[2] = float("nan")
            return replace(reply, params=params)
        return reply

    ctx = make_context(digits, Tamper(SimulationBackend(digits, factory_for(digits)), poison))
    alg = FedEM(FedEMConfig(name="fedem", n_components=2))
    alg.setup(ctx)
    weights_before = alg.state.weights.copy()
    alg.run_round(ctx, 1)
    clean = make_context(digits)
    ref = FedEM(FedEMConfig(name="fedem", n_components=2))
    ref.setup(clean)
    req = MixtureTrainRequest(np.arange(8), ref.state.models, ref.state.weights, TRAIN,
                              make_context(digits).next_seed())
    rep = clean.backend.execute(req)
    keep = np.arange(8) != 2
    w = digits.train_sizes[keep] / digits.train_sizes[keep].sum()
    expect = torch.einsum("n,nmd->md", torch.as_tensor(w, dtype=rep.params.dtype),
                          rep.params[torch.from_numpy(keep)])
    torch.testing.assert_close(alg.state.models, expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(alg.state.weights[2], weights_before[2])  # its π is kept
    assert not alg.state.trained[2] and alg.state.trained[keep].all()


def test_a_straggler_trains_each_component_fewer_steps(digits):
    work = 0.5
    faults = FaultsConfig(stragglers=0.5, straggler_work=work)
    guard = Guard(8, 0, digits.train_sizes, faults=faults)
    slow = FaultPlan(faults, 8, 0).round(0).stragglers
    assert 0 < len(slow) < 8
    backend = SimulationBackend(digits, factory_for(digits))
    req = _request(digits)
    got, _, _ = guard.send(backend, req)
    for c in range(8):
        alone = replace(req, clients=np.array([c]), weights=req.weights[c : c + 1])
        if c in slow:  # each of its K trainings stops after `work` of its steps
            steps = partial_steps(req.training, int(digits.train_sizes[c]), work)
            alone = replace(alone, training=replace(req.training, steps=steps))
        torch.testing.assert_close(got.params[c], backend.execute(alone).params[0])


def test_clipping_bounds_the_whole_mixture_update(digits):
    guard = Guard(8, 0, digits.train_sizes, privacy=PrivacyConfig(clip=0.01,
                                                                   noise_multiplier=0.0))
    req = _request(digits)
    got, _, _ = guard.send(SimulationBackend(digits, factory_for(digits)), req)
    delta = got.params.reshape(8, -1) - req.models.reshape(1, -1)
    norms = torch.linalg.vector_norm(delta.double(), dim=1)
    assert (norms <= 0.01 + 1e-6).all() and (norms > 0.009).all()
    assert got.n_samples.tolist() == [1] * 8


def test_an_attacker_replaces_its_mixture_update(digits):
    guard = Guard(8, 0, digits.train_sizes, adversary=AdversaryConfig(kind="sign_flip"),
                  adversaries=np.array([4]))
    backend = SimulationBackend(digits, factory_for(digits))
    req = _request(digits)
    honest = backend.execute(req)
    got, _, _ = guard.send(backend, req)
    start = req.models
    torch.testing.assert_close(got.params[3], honest.params[3])
    assert not torch.allclose(got.params[4], honest.params[4])
    # a sign flip points the update the other way
    cos = torch.nn.functional.cosine_similarity(
        (got.params[4] - start).reshape(1, -1), (honest.params[4] - start).reshape(1, -1))
    assert float(cos) < 0
