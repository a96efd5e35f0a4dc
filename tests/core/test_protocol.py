"""The protocol's one way to take some clients of a message and to put replies together, and
what each request says it costs per client."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from clusterfl import protocol

TR = protocol.LocalTraining()


def _train(n: int = 5, d: int = 4) -> protocol.TrainRequest:
    models = torch.arange(3 * d, dtype=torch.float64).reshape(3, d)
    off = protocol.Predictor(torch.ones(2, d), np.arange(2 * n).reshape(n, 2) % 2, "sum_logits")
    return protocol.TrainRequest(np.arange(10, 10 + n), models, np.arange(n) % 3, TR, 7, offset=off,
                        coords=np.array([0, 2]))


def test_every_reply_declares_its_clients_first():
    for cls in protocol.REPLY_TYPES:
        first = dataclasses.fields(cls)[0]
        assert first.name == "clients" and first.metadata.get("per_client"), cls
        assert all(f.metadata.get("per_client") for f in dataclasses.fields(cls)), cls
    for cls in protocol.REQUEST_TYPES:
        assert dataclasses.fields(cls)[0].name == "clients", cls


def test_subset_slices_per_client_fields_only():
    req = _train()
    part = protocol.subset(req, [3, 1])
    np.testing.assert_array_equal(part.clients, [13, 11])
    np.testing.assert_array_equal(part.model_of_client, req.model_of_client[[3, 1]])
    np.testing.assert_array_equal(part.offset.members, req.offset.members[[3, 1]])
    assert part.models is req.models and part.offset.models is req.offset.models
    np.testing.assert_array_equal(part.coords, req.coords)  # the same for every client
    assert part.seed == req.seed and part.training is req.training


def test_select_by_client_id_and_unknown_clients_fail():
    req = _train()
    np.testing.assert_array_equal(protocol.select(req, [14, 10]).model_of_client,
                                  req.model_of_client[[4, 0]])
    np.testing.assert_array_equal(protocol.positions_of(req, [12, 10]), [2, 0])
    with pytest.raises(ValueError, match="client 99 is not listed"):
        protocol.select(req, [99])


def test_join_restores_request_order_and_keeps_only_who_answered():
    a = protocol.TrainReply(np.array([13, 10]), torch.tensor([[3.0], [0.0]]), np.array([3, 0]),
                   np.array([0.3, 0.0]))
    b = protocol.TrainReply(np.array([12]), torch.tensor([[2.0]]), np.array([2]), np.array([0.2]))
    out = protocol.join([a, b], order=np.arange(10, 15))
    np.testing.assert_array_equal(out.clients, [10, 12, 13])
    assert out.params[:, 0].tolist() == [0.0, 2.0, 3.0]
    np.testing.assert_array_equal(out.n_samples, [0, 2, 3])
    with pytest.raises(ValueError, match="not asked"):
        protocol.join([a], order=np.array([10]))
    ev = protocol.EvaluateReply(np.array([1]), np.ones(1), np.ones(1), np.ones(1), np.ones(1, int),
                       {"mse": np.array([0.5])})
    both = protocol.join([ev, dataclasses.replace(ev, clients=np.array([0]))], order=np.arange(2))
    np.testing.assert_array_equal(both.clients, [0, 1])
    assert both.extras["mse"].tolist() == [0.5, 0.5]


def test_empty_replies_have_the_request_widths():
    req = _train()
    assert tuple(protocol.empty_reply(req).params.shape) == (0, 2)  # d̂ = len(coords)
    loss = protocol.empty_reply(protocol.LossRequest(np.arange(3), torch.zeros(4, 6)))
    assert isinstance(loss, protocol.LossReply) and loss.loss.shape == (0, 4)
    emb = protocol.empty_reply(protocol.EmbedRequest(np.arange(2), "pca", None, 9, k=3))
    assert emb.signatures.shape == (0, 3, 9) and len(emb.clients) == 0


def test_start_models_are_the_rows_each_client_was_sent():
    req = _train()
    got = protocol.start_models(req, np.array([14, 11]))
    expected = req.models[[req.model_of_client[4], req.model_of_client[1]]][:, [0, 2]]
    assert torch.equal(got, expected)


def test_unit_costs_per_client():
    d, n = 4, 5
    req = _train(n, d)
    assert req.unit_cost() == (d + 2 * d, 2)  # model + two offset members down; d̂ up
    assert req.cost() == (n * 3 * d, n * 2)
    assert dataclasses.replace(req, models_held=True).unit_cost() == (0, 2)
    assert dataclasses.replace(req, keep_local=True, coords=None).unit_cost() == (3 * d, 0)
    grad = protocol.GradientRequest(np.arange(n), torch.zeros(2, d), np.zeros(n, int), None, 0)
    assert grad.unit_cost() == (d, d)
    assert dataclasses.replace(grad, models_held=True).unit_cost() == (0, d)
    loss = protocol.LossRequest(np.arange(n), torch.zeros(3, 10))
    assert loss.unit_cost() == (30, 3)
    assert dataclasses.replace(loss, shared_coords=6).unit_cost() == (6 + 3 * 4, 3)
    one = protocol.Predictor.single(torch.zeros(1, d), np.zeros(n))
    ev = protocol.EvaluateRequest(np.arange(n), one)
    assert ev.unit_cost() == (0, 0)
