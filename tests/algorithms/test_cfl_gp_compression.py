"""CFL-GP compression on the wire (Kim et al. 2024, App. E.1, D.2, Tables 5–6).

Requests with `coords` make clients send only those coordinates; CFL-GP's clustering-only
requests carry its feature index, so the booked uplink is what is sent. Checked here:
narrowed replies equal whole replies restricted to `coords` (both simulated backends, both
request types), the robustness layer (validation, attacks, clipping and noise) works on the
narrowed rows, and a CFL-GP run with compression clusters exactly like the former
server-side subsampling while its uplink drops by (d − d̂) floats per clustering-only reply.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clusterfl.algorithms.cfl_gp import CFLGP
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.scenarios import make_federation
from clusterfl.errors import ClusterFLError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    GradientReply,
    GradientRequest,
    LocalTraining,
    TrainRequest,
    empty_reply,
    narrow,
)
from clusterfl.robust.config import AdversaryConfig, PrivacyConfig, ValidationConfig
from clusterfl.robust.guard import Guard
from clusterfl.robust.validate import check_reply

DIGITS = {
    "seed": 0, "rounds": 9, "eval_every": 100, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 90, 180, 270]},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.1, "batch_size": 128, "steps": 1},
    "algorithm": {"name": "cfl_gp", "n_clusters": 4, "period": 2, "stable_rounds": 0,
                  "estimate_k": False, "compression_ratio": 10.0},
    "output": {"figures": False, "progress": "off"},
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", "rotation", {"n_clients": 6, "angles": [0, 180]}, seed=0)


@pytest.fixture(scope="module")
def factory(fed):
    return ModelFactory(model_config({"name": "mlp", "hidden": [16]}), fed.input_shape,
                        fed.n_outputs)


def _coords(d: int, keep: int, seed: int = 3) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(d, keep, replace=False)).astype(np.int64)


def _requests(factory, n: int, coords: np.ndarray | None) -> list:
    models = factory.init_many(3, seed=1).double()
    clients, which = np.arange(n), np.arange(n) % 3
    tr = LocalTraining(lr=0.1, batch_size=8, steps=3, momentum=0.5)
    return [GradientRequest(clients, models, which, batch_size=8, seed=7, coords=coords),
            TrainRequest(clients, models, which, tr, seed=5, coords=coords)]


def _rows(reply) -> torch.Tensor:
    return reply.grads if isinstance(reply, GradientReply) else reply.params


# ------------------------------------------------------------------ backends


@pytest.mark.parametrize("backend", [SequentialBackend, SimulationBackend])
def test_narrowed_replies_equal_whole_replies_restricted(fed, factory, backend):
    be = backend(fed, factory)
    d = factory.size
    coords = _coords(d, d // 10)
    for whole_req, narrow_req in zip(_requests(factory, fed.n_clients, None),
                                     _requests(factory, fed.n_clients, coords), strict=True):
        whole, small = be.execute(whole_req), be.execute(narrow_req)
        assert _rows(whole).shape == (fed.n_clients, d)
        assert _rows(small).shape == (fed.n_clients, len(coords))
        assert _rows(small).dtype == _rows(whole).dtype
        torch.testing.assert_close(_rows(small), _rows(whole)[:, coords], rtol=0, atol=1e-10)
        np.testing.assert_array_equal(small.n_samples, whole.n_samples)
        np.testing.assert_allclose(small.loss, whole.loss, rtol=0, atol=1e-12)
        # the cost is what travels: the whole model down, d̂ floats up per client
        assert narrow_req.cost() == (whole_req.cost()[0], fed.n_clients * len(coords))
        assert whole_req.cost()[1] == fed.n_clients * d


def test_sequential_and_simulation_agree_on_narrowed_gradients(fed, factory):
    coords = _coords(factory.size, 50)
    for req in _requests(factory, fed.n_clients, coords):
        req.models = req.models.float()  # the reference loop computes in float32
        a = _rows(SequentialBackend(fed, factory).execute(req))
        b = _rows(SimulationBackend(fed, factory).execute(req))
        assert a.shape == b.shape == (fed.n_clients, 50)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_coords_fail_clearly():
    rows = torch.zeros(2, 5)
    with pytest.raises(ClusterFLError, match="coords"):
        narrow(rows, np.array([0, 5]))
    with pytest.raises(ClusterFLError, match="coords"):
        narrow(rows, np.array([0.5]))
    assert torch.equal(narrow(rows, None), rows)


# ------------------------------------------------------------------ robustness layer


def test_validation_accepts_narrowed_and_rejects_wrong_widths(fed, factory):
    be = SequentialBackend(fed, factory)
    coords = _coords(factory.size, 40)
    clients = np.arange(fed.n_clients)
    cfg = ValidationConfig()
    for req in _requests(factory, fed.n_clients, coords):
        reply = be.execute(req)
        keep, rejected = check_reply(req, reply, cfg)
        assert keep.all() and rejected == []
        whole = be.execute(type(req)(**{**req.__dict__, "coords": None}))
        keep, rejected = check_reply(req, whole, cfg)  # d wide where d̂ was asked
        assert not keep.any() and {r.reason for r in rejected} == {"shape"}
        assert _rows(empty_reply(req)).shape == (0, len(coords))
    # a training reply's norm is that of the update at the coordinates sent
    req = _requests(factory, fed.n_clients, coords)[1]
    reply = be.execute(req)
    start = req.models[torch.as_tensor(req.model_of_client)][:, coords]
    norms = torch.linalg.vector_norm(reply.params - start, dim=1).numpy()
    bound = float(np.median(norms)) * 1.01
    keep, rejected = check_reply(req, reply, ValidationConfig(max_norm=bound))
    np.testing.assert_array_equal(keep, norms <= bound)
    assert {r.client for r in rejected} == set(clients[norms > bound].tolist())


def test_clipping_and_attacks_act_on_the_narrowed_rows(fed, factory):
    be = SequentialBackend(fed, factory)
    coords = _coords(factory.size, 40)
    n = fed.n_clients
    for req in _requests(factory, n, coords):
        start = 0.0
        if isinstance(req, TrainRequest):
            start = req.models[torch.as_tensor(req.model_of_client)][:, coords]
        sent = _rows(be.execute(req)) - start  # the honest d̂-wide updates
        norms = torch.linalg.vector_norm(sent, dim=1, keepdim=True)
        clip = float(norms.median())  # about half the clients are clipped
        guard = Guard(n, 0, fed.train_sizes, privacy=PrivacyConfig(clip=clip),
                      adversary=AdversaryConfig(kind="sign_flip", clients=[1]),
                      adversaries=np.array([1]))
        reply, reached, uploaded = guard.send(be, req)
        assert reached == uploaded == n  # the cost booked: the whole model down, d̂ floats up
        assert req.unit_cost() == (float(factory.size), float(len(coords)))
        np.testing.assert_array_equal(reply.clients, np.arange(n))
        sent[1] = -sent[1]  # client 1 flips its sign before sending
        expected = sent * torch.clamp(clip / norms, max=1.0)
        got = _rows(reply) - start
        assert got.shape == (n, len(coords))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)  # float32 replies
        assert guard.totals["clipped"] == int((norms[:, 0] > clip).sum()) > 0
        np.testing.assert_array_equal(reply.n_samples, np.ones(n))


# ------------------------------------------------------------------ CFL-GP runs


def _run(rounds: int = 9, **algorithm):
    cfg = json.loads(json.dumps(DIGITS))
    cfg["rounds"] = rounds
    cfg["algorithm"].update(algorithm)
    exp = Experiment.from_config(cfg)
    return exp, exp.run(progress=False)


def _expected_uplink(history, d: int, width: int, k: int) -> float:
    """Σ_rounds C·d (every client's whole vector) + Σ_clustering rounds |{c ∉ S_k̄}|·width,
    with the assignment before each round read from the previous record (round 1: the random
    balanced start, C/K clients per cluster)."""
    recs = history.records
    c = len(recs[0].assignment)
    total = 0.0
    for i, r in enumerate(recs):
        total += c * d
        if r.extras["clustering"]:
            kbar = r.extras["broadcast_model"]
            before = (np.asarray(recs[i - 1].assignment) if i else None)
            others = c - c // k if before is None else int((before != kbar).sum())
            total += others * width
    return total


@pytest.mark.parametrize("protocol", ["gradient", "model"])
def test_compressed_run_clusters_like_server_side_subsampling(monkeypatch, protocol):
    extra = {"protocol": protocol}
    exp, h = _run(**extra)
    d, d_hat = exp.factory.size, len(exp.algorithm.state.feature_index)
    assert d_hat == round(d / 10)
    assert exp.algorithm.coords is not None and len(exp.algorithm.coords) == d_hat
    recs = [r for r in h.records if r.extras["clustering"]]
    assert recs[-1].ari == pytest.approx(1.0)
    assert all(r.rejected == 0 for r in h.records)  # validation took the d̂-wide replies
    up = h.records[-1].floats_up
    assert up == _expected_uplink(h, d, d_hat, 4)
    assert h.records[-1].extras["uplink_floats_compressed"] == up
    # the former behaviour: whole vectors sent, subsampled by the server
    monkeypatch.setattr(CFLGP, "_wire_coords", lambda self, state: None)
    old_exp, old = _run(**extra)
    assert old_exp.algorithm.coords is None
    assert [r.assignment for r in old.records] == [r.assignment for r in h.records]
    assert torch.equal(old_exp.algorithm.state.features, exp.algorithm.state.features)
    assert torch.equal(old_exp.algorithm.state.models, exp.algorithm.state.models)
    assert old.records[-1].floats_up == _expected_uplink(old, d, d, 4)
    # 9 rounds × 8 clients send whole vectors; the rest are the clustering-only replies
    others = (old.records[-1].floats_up - 9 * 8 * d) / d
    assert len(recs) == 5 and others >= 5 * 6  # ≥ 6 clients off k̄ in each clustering round
    assert old.records[-1].floats_up - up == others * (d - d_hat)
    assert h.records[-1].floats_down == old.records[-1].floats_down  # models go whole


def test_uncompressed_run_sends_whole_vectors():
    exp, h = _run(compression_ratio=1.0)
    d = exp.factory.size
    assert exp.algorithm.coords is None
    assert h.records[-1].floats_up == _expected_uplink(h, d, d, 4)


def test_selected_layers_are_narrowed_on_the_wire():
    exp, h = _run(rounds=3, compression_ratio=1.0, feature_layers=["layers.1"])
    idx = exp.factory.layout.index(["layers.1"])
    np.testing.assert_array_equal(exp.algorithm.coords, idx.numpy())
    assert h.records[-1].floats_up == _expected_uplink(h, exp.factory.size, len(idx), 4)


def test_dropouts_book_only_what_answering_clients_send():
    """Clients 2 and 5 unreachable in rounds 1 and 3: they send nothing, whole or narrowed."""
    cfg = json.loads(json.dumps(DIGITS))
    cfg["rounds"] = 3
    cfg["faults"] = {"drop_clients": [2, 5], "drop_rounds": [1, 3]}
    exp = Experiment.from_config(cfg)
    h = exp.run(progress=False)
    d, d_hat = exp.factory.size, len(exp.algorithm.state.feature_index)
    ups = np.diff([0.0] + [r.floats_up for r in h.records])
    assert h.records[-1].extras["uplink_floats_compressed"] == ups.sum()
    assert ups[1] == 8 * d  # round 2: no clustering, everybody answers with whole vectors
    # round 1: 6 whole vectors, and the answering clients off k̄ = 0 (6 minus those dropped)
    narrowed_1 = (ups[0] - 6 * d) / d_hat
    assert narrowed_1 == int(narrowed_1) and 4 <= narrowed_1 <= 6
    # round 3: exact, from the assignment after round 2
    before = np.asarray(h.records[1].assignment)
    kbar = h.records[2].extras["broadcast_model"]
    off = [c for c in range(8) if c not in (2, 5) and before[c] != kbar]
    assert ups[2] == 6 * d + len(off) * d_hat
