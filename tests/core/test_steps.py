"""`protocol.Steps`: several requests in one message per client (issue 26).

A compound request must give exactly the replies of its steps sent one by one — on every
backend, through client subsets and the wire format — and cost what they cost."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl import protocol
from clusterfl.algorithms.base import Context
from clusterfl.backends.flower import codec
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.backends.subset import SubsetBackend
from clusterfl.clustering.aggregate import choose_clusters
from clusterfl.errors import ClusterFLError
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    GradientRequest,
    LocalTraining,
    LossRequest,
    Pick,
    Predictor,
    Steps,
    StepsReply,
    TrainRequest,
)
from tests.core.conftest import blob_federation

TR = LocalTraining(lr=0.1, batch_size=8, steps=3)


@pytest.fixture
def setting():
    fed = blob_federation(n_clients=6)
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [8]}), fed.input_shape, 3)
    models = factory.init_many(3, 0).double()
    return fed, factory, models


def _ifca_steps(clients: np.ndarray, models: torch.Tensor) -> Steps:
    """IFCA's round: the losses of the K models, then training of the least-loss one."""
    zeros = np.zeros(len(clients), np.int64)
    return Steps.of(LossRequest(clients, models),
                    TrainRequest(clients, models, zeros, TR, 11, models_held=True),
                    picks=[Pick(1, 0)])


def _same(a: protocol.Reply, b: protocol.Reply) -> None:
    assert type(a) is type(b)
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f)


@pytest.mark.parametrize("backend_cls", [SimulationBackend, SequentialBackend])
def test_steps_with_a_pick_equal_the_separate_requests(setting, backend_cls):
    fed, factory, models = setting
    be = backend_cls(fed, factory)
    clients = np.array([4, 0, 2, 5])
    reply = be.execute(_ifca_steps(clients, models))
    losses = be.execute(LossRequest(clients, models))
    chosen = choose_clusters(losses.loss, losses.accuracy)
    assert len(set(chosen.tolist())) > 1  # the pick really differs between clients
    trained = be.execute(TrainRequest(clients, models, chosen, TR, 11, models_held=True))
    assert isinstance(reply, StepsReply)
    np.testing.assert_array_equal(reply.clients, clients)
    _same(reply.replies[0], losses)
    _same(reply.replies[1], trained)


def test_pick_into_the_offset_and_steps_for_some_clients(setting):
    fed, factory, models = setting
    be = SimulationBackend(fed, factory)
    clients = np.array([1, 3, 5])
    zeros = np.zeros(3, np.int64)
    g = models[:1]
    ask = LossRequest(clients, models, offset=Predictor.single(g, zeros))
    step = TrainRequest(clients, g, zeros, TR, 5, offset=Predictor.single(models, zeros))
    only = GradientRequest(np.array([5, 1]), models[2:], np.zeros(2, np.int64), None, 9)
    reply = be.execute(Steps.of(ask, step, only, picks=[Pick(1, 0, into="offset")]))
    losses = be.execute(ask)
    chosen = choose_clusters(losses.loss)
    ref = be.execute(TrainRequest(clients, g, zeros, TR, 5,
                                  offset=Predictor.single(models, chosen)))
    _same(reply.replies[1], ref)
    _same(reply.replies[2], be.execute(only))  # in the step's own client order


def test_subset_join_empty_reply_and_cost(setting):
    fed, factory, models = setting
    steps = Steps.of(LossRequest(np.array([0, 1, 2]), models),
                     TrainRequest(np.array([2, 3]), models[:1], np.zeros(2, np.int64), TR, 1))
    np.testing.assert_array_equal(steps.clients, [0, 1, 2, 3])
    one = protocol.subset(steps, [2])  # client 2: in both steps
    assert [s.clients.tolist() for s in one.steps] == [[2], [2]]
    three = protocol.subset(steps, [3])
    assert [s.clients.tolist() for s in three.steps] == [[], [3]]
    k, d = models.shape
    assert steps.unit_cost() == (k * d + d, k + d)  # the two steps' costs together
    be = SimulationBackend(fed, factory)
    parts = [be.execute(protocol.subset(steps, [i])) for i in (3, 0, 2, 1)]
    whole = protocol.join(parts, order=steps.clients)
    ref = be.execute(steps)
    np.testing.assert_array_equal(whole.clients, ref.clients)
    for a, b in zip(whole.replies, ref.replies, strict=True):
        _same(a, b)
    empty = protocol.empty_reply(steps)
    assert len(empty.clients) == 0 and empty.replies[0].loss.shape == (0, k)
    assert empty.replies[1].params.shape == (0, d)


def test_steps_travel_through_the_codec_and_a_client_subset(setting):
    fed, factory, models = setting
    steps = _ifca_steps(np.array([0, 1]), models)
    skeleton, arrays = codec.encode(steps)
    back = codec.decode(skeleton, arrays)
    assert back.picks == steps.picks and len(back.steps) == 2
    inner = SimulationBackend(fed, factory)
    sub = SubsetBackend(inner, [5, 3, 1])  # local 0, 1 are clients 5, 3 of the federation
    reply = sub.execute(back)
    ref = inner.execute(_ifca_steps(np.array([5, 3]), models))
    np.testing.assert_array_equal(reply.clients, [0, 1])
    assert [r.clients.tolist() for r in reply.replies] == [[0, 1], [0, 1]]
    torch.testing.assert_close(reply.replies[1].params, ref.replies[1].params, rtol=0, atol=0)
    skeleton, arrays = codec.encode(reply)
    assert isinstance(codec.decode(skeleton, arrays), StepsReply)


def test_bad_steps_fail_clearly(setting):
    _, _, models = setting
    c = np.array([0])
    with pytest.raises(ClusterFLError, match="Pick"):
        Steps.of(TrainRequest(c, models, c, TR, 1), LossRequest(c, models), picks=[Pick(0, 1)])
    with pytest.raises(ClusterFLError, match="ordinary request"):
        Steps.of(protocol.EvaluateRequest(c, Predictor.single(models, c)))


def test_context_books_each_step_as_if_sent_alone(setting):
    fed, factory, models = setting
    clients = np.arange(6)

    def ctx() -> Context:
        return Context(SimulationBackend(fed, factory), factory, TR, 6, fed.train_sizes,
                       np.random.default_rng(0), 0)

    together, apart = ctx(), ctx()
    reply = together.send(_ifca_steps(clients, models))
    losses = apart.send(LossRequest(clients, models))
    chosen = choose_clusters(losses.loss, losses.accuracy)
    trained = apart.send(TrainRequest(clients, models, chosen, TR, 11, models_held=True))
    assert (together.floats_down, together.floats_up) == (apart.floats_down, apart.floats_up)
    assert together.client_updates == apart.client_updates == 6
    assert together.participants == apart.participants == set(range(6))
    _same(reply.replies[1], trained)
