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


def _one_of_each(n: int = 3, k: int = 2, d: int = 4) -> list[protocol.Asks]:
    """One request of every ordinary type, for clients 0..n−1 and K = k models of d floats."""
    ids, models, zeros = np.arange(n), torch.zeros(k, d), np.zeros(n, dtype=np.int64)
    w = np.full((n, k), 1.0 / k)
    one = protocol.Predictor.single(models, zeros)
    return [protocol.TrainRequest(ids, models, zeros, TR, 0),
            protocol.GradientRequest(ids, models, zeros, None, 0),
            protocol.LossRequest(ids, models),
            protocol.EvaluateRequest(ids, one),
            protocol.EmbedRequest(ids, "pca", None, 9, k=3),
            protocol.MixtureTrainRequest(ids, models, w, TR, 0),
            protocol.MixtureFitRequest(ids, models, w),
            protocol.BestCountRequest(ids, models),
            protocol.SubspaceRequest(ids, 5, p=2)]


def test_every_request_says_its_kind():
    """Updates upload model-sized vectors (the guard attacks, checks and clips them); clients
    train locally on Train and MixtureTrain (stragglers, Flower's "train" messages); the
    client-update count counts trainings and gradients of one model (FedEM's step, K of
    them, since 2026-11-29)."""
    table = {r.__class__.__name__: (r.kind, r.trains, r.counted_update) for r in _one_of_each()}
    assert table == {
        "TrainRequest": ("update", True, True),
        "GradientRequest": ("update", False, True),
        "LossRequest": ("query", False, False),
        "EvaluateRequest": ("evaluate", False, False),
        "EmbedRequest": ("query", False, False),
        "MixtureTrainRequest": ("update", True, True),
        "MixtureFitRequest": ("query", False, False),
        "BestCountRequest": ("query", False, False),
        "SubspaceRequest": ("query", False, False),
    }
    assert {type(r) for r in _one_of_each()} == set(protocol.REQUEST_TYPES)
    assert {type(r).__name__: r.updates_each() for r in _one_of_each() if r.counted_update} \
        == {"TrainRequest": 1, "GradientRequest": 1,
            "MixtureTrainRequest": next(r for r in _one_of_each() if isinstance(
                r, protocol.MixtureTrainRequest)).models.shape[0]}
    steps = protocol.Steps.of(*_one_of_each()[:3])
    assert steps.kind == "steps" and [type(p) for p in protocol.parts_of(steps)] == [
        protocol.TrainRequest, protocol.GradientRequest, protocol.LossRequest]


def test_every_empty_reply_has_no_rows_and_the_widths_of_a_full_one():
    k, d = 2, 4
    widths = {  # a reply row's shape in each per-client field, written out per type
        "TrainReply": {"params": (d,)}, "GradientReply": {"grads": (d,)},
        "LossReply": {"loss": (k,), "accuracy": (k,)}, "EvaluateReply": {"accuracy": ()},
        "EmbedReply": {"signatures": (3, 9)}, "MixtureTrainReply": {"params": (k, d),
                                                                     "weights": (k,)},
        "MixtureFitReply": {"weights": (k,)}, "BestCountReply": {"counts": (k,)},
        "SubspaceReply": {"bases": (5, 2)}}
    replies = [r.empty_reply() for r in _one_of_each(k=k, d=d)]
    assert [type(r) for r in replies] == list(protocol.REPLY_TYPES)
    for reply in replies:
        for f in dataclasses.fields(reply):
            value = getattr(reply, f.name)
            assert len(value) == 0 or isinstance(value, dict), (reply, f.name)
        for name, shape in widths[type(reply).__name__].items():
            assert tuple(getattr(reply, name).shape) == (0, *shape), (reply, name)
    steps = protocol.Steps.of(*_one_of_each()[:2]).empty_reply()
    assert len(steps.clients) == 0
    assert [type(r) for r in steps.replies] == [protocol.TrainReply, protocol.GradientReply]


def test_update_rows_and_their_base_per_update_type():
    """Train: the uploaded model less the start model it was sent (at `coords`); Gradient:
    the gradient itself; MixtureTrain: the K models as one K·d row less the K models sent."""
    req = _train()  # clients 10..14 on models 0,1,2,0,1; coords 0 and 2 of d = 4
    params = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    reply = protocol.TrainReply(np.array([14, 12]), params, np.array([5, 6]), np.zeros(2))
    # client 14 got model 1 = [4, 5, 6, 7] → [4, 6]; client 12 model 2 = [8 .. 11] → [8, 10]
    expected = torch.tensor([[1.0 - 4, 2.0 - 6], [3.0 - 8, 4.0 - 10]], dtype=torch.float64)
    assert torch.equal(protocol.update_vectors(req, reply), expected)
    assert req.update_groups(np.array([4, 2])).tolist() == [1, 2]
    swapped = reply.with_update_rows(params.flip(0), np.ones(2, dtype=np.int64))
    assert torch.equal(swapped.params, params.flip(0)) and swapped.n_samples.tolist() == [1, 1]

    grad = protocol.GradientRequest(np.arange(2), torch.ones(1, 2), np.zeros(2, int), None, 0)
    g = protocol.GradientReply(np.arange(2), torch.tensor([[1.0, -1.0], [2.0, 0.5]]),
                               np.array([3, 3]), np.zeros(2))
    assert grad.update_base(np.arange(2)) is None
    assert torch.equal(protocol.update_vectors(grad, g), g.grads)

    models = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # K = 2 models of d = 2
    mix = protocol.MixtureTrainRequest(np.array([7]), models, np.full((1, 2), 0.5), TR, 0)
    m = protocol.MixtureTrainReply(np.array([7]), torch.tensor([[[2.0, 2.0], [3.0, 5.0]]]),
                                   np.array([4]), np.zeros(1), np.full((1, 2), 0.5))
    assert protocol.update_vectors(mix, m).tolist() == [[2.0 - 1, 2.0 - 2, 3.0 - 3, 5.0 - 4]]
    assert mix.update_groups(np.array([0])).tolist() == [0]
    back = m.with_update_rows(torch.tensor([[9.0, 8.0, 7.0, 6.0]]))
    assert back.params.tolist() == [[[9.0, 8.0], [7.0, 6.0]]]
    with pytest.raises(TypeError, match="not an update request"):
        protocol.LossRequest(np.arange(2), models).update_base(np.arange(2))


def test_client_seed_is_the_request_seed_spread_by_client():
    assert protocol.client_seed(3, 5) == 3 * 1_000_003 + 5
    assert protocol.client_seed(0, 7) == 7


def test_backend_execute_dispatches_every_request_type_to_its_method():
    from clusterfl.backends.base import Backend

    def answer(name: str):  # the method `name`: note the call, answer with no rows
        def method(self, req):
            self.called.append(name)
            return req.empty_reply()
        return method

    names = ["train", "gradient", "losses", "evaluate", "embed", "mixture_train", "mixture_fit",
             "best_counts", "subspace"]  # in the order of `_one_of_each`
    echo = type("Echo", (Backend,), {n: answer(n) for n in names})
    backend = echo.__new__(echo)
    backend.called = []
    replies = [backend.execute(r) for r in _one_of_each()]
    assert backend.called == names
    assert [type(r) for r in replies] == list(protocol.REPLY_TYPES)
    backend.called.clear()
    out = backend.execute(protocol.Steps.of(*_one_of_each()[:3]))  # each step in turn
    assert backend.called == names[:3] and len(out.replies) == 3
    with pytest.raises(TypeError, match="unknown request type"):
        backend.execute(protocol.Pick(1, 0))
