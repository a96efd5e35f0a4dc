import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import Context
from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig, FedProx, FedProxConfig
from clusterfl.algorithms.local import Local, LocalConfig
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.data.federation import Federation
from clusterfl.models import ModelFactory, model_config, set_flat
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LocalTraining,
    LossRequest,
    Predictor,
    TrainRequest,
)


def tiny_regression() -> Federation:
    x = torch.tensor([[1.0], [2.0], [1.0]])
    y = torch.tensor([1.0, 3.0, 0.0])
    return Federation(x, y, [0, 2, 3], x, y, [0, 2, 3], clusters=None, n_classes=1,
                      task="regression")


def test_one_sgd_step_matches_hand_computation():
    fed = tiny_regression()
    f = ModelFactory(model_config({"name": "linear"}), (1,), 1)
    be = SequentialBackend(fed, f)
    tr = LocalTraining(lr=0.1, batch_size=2, epochs=1)
    reply = be.train(TrainRequest(np.array([0]), torch.zeros(1, 2), np.array([0]), tr, seed=0))
    # loss = mean((w x + b - y)^2): grad_w = -7, grad_b = -4 at w = b = 0
    assert torch.allclose(reply.params[0], torch.tensor([0.7, 0.4]))
    assert reply.loss[0] == pytest.approx(5.0)
    g = be.gradient(GradientRequest(np.array([0]), torch.zeros(1, 2), np.array([0]), None, 0))
    assert torch.allclose(g.grads[0], torch.tensor([-7.0, -4.0]))


def test_proximal_term_pulls_toward_start():
    fed = tiny_regression()
    f = ModelFactory(model_config({"name": "linear"}), (1,), 1)
    be = SequentialBackend(fed, f)
    start = torch.tensor([[1.0, 0.0]])
    far = LocalTraining(lr=0.05, batch_size=2, epochs=30)
    near = LocalTraining(lr=0.05, batch_size=2, epochs=30, mu=5.0)
    a = be.train(TrainRequest(np.array([0]), start, np.array([0]), far, 0)).params[0]
    b = be.train(TrainRequest(np.array([0]), start, np.array([0]), near, 0)).params[0]
    assert (b - start[0]).norm() < (a - start[0]).norm()


def test_losses_and_ensemble_evaluation(blobs):
    f = ModelFactory(model_config({"name": "mlp", "hidden": [8]}), blobs.input_shape, 3)
    be = SequentialBackend(blobs, f)
    models = f.init_many(3, seed=0)
    rep = be.losses(LossRequest(np.arange(4), models))
    assert rep.loss.shape == (4, 3) and np.all(rep.loss > 0)
    members = np.tile(np.arange(3), (blobs.n_clients, 1))
    ev = be.evaluate(EvaluateRequest(np.arange(blobs.n_clients),
                                     Predictor(models, members, "mean_probs")))
    assert ev.accuracy.shape == (blobs.n_clients,)
    assert np.all((ev.accuracy >= 0) & (ev.accuracy <= 1))
    # CAM-style sum of logits equals adding the offsets by hand
    two = Predictor(models[:2], np.tile([0, 1], (blobs.n_clients, 1)), "sum_logits")
    x, _ = blobs.client_test(0)
    m = f.build()
    set_flat(m, models[0])
    o0 = m(x)
    set_flat(m, models[1])
    o1 = m(x)
    assert torch.allclose(be._outputs(two, 0, x), o0 + o1, atol=1e-6)


def _ctx(fed: Federation, factory: ModelFactory, tr: LocalTraining) -> Context:
    return Context(SequentialBackend(fed, factory), factory, tr, fed.n_clients,
                   fed.train_sizes, np.random.default_rng(0), seed=0,
                   true_clusters=fed.clusters)


def _accuracy(alg, ctx) -> float:
    ev = ctx.backend.execute(EvaluateRequest(np.arange(ctx.n_clients), alg.predictor()))
    return float(ev.accuracy.mean())


def test_fedavg_learns_iid_and_local_beats_it_on_conflicting_clusters():
    from tests.core.conftest import blob_federation

    tr = LocalTraining(lr=0.1, batch_size=16, epochs=1)
    iid = blob_federation(n_clusters=1)
    f = ModelFactory(model_config({"name": "mlp", "hidden": [16]}), iid.input_shape, 3)
    ctx = _ctx(iid, f, tr)
    alg = FedAvg(FedAvgConfig())
    alg.setup(ctx)
    before = _accuracy(alg, ctx)
    for t in range(1, 11):
        alg.run_round(ctx, t)
    after = _accuracy(alg, ctx)
    assert after > before + 0.3 and after > 0.85

    conflicting = blob_federation(n_clusters=3)  # each cluster its own label permutation
    ctx2 = _ctx(conflicting, f, tr)
    fedavg, local = FedAvg(FedAvgConfig()), Local(LocalConfig())
    for a in (fedavg, local):
        a.setup(ctx2)
        for t in range(1, 11):
            a.run_round(ctx2, t)
    assert _accuracy(local, ctx2) > 0.85
    assert _accuracy(fedavg, ctx2) < _accuracy(local, ctx2) - 0.3


def test_fraction_and_communication_cost(blobs):
    f = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), blobs.input_shape, 3)
    ctx = _ctx(blobs, f, LocalTraining(lr=0.1, batch_size=8, epochs=1))
    alg = FedProx(FedProxConfig(fraction=0.5, mu=0.1))
    alg.setup(ctx)
    alg.run_round(ctx, 1)
    assert ctx.floats_up == 3 * f.size and ctx.floats_down == 3 * f.size
    local = Local(LocalConfig())
    local.setup(ctx)
    local.run_round(ctx, 1)
    assert ctx.floats_up == 3 * f.size  # local training communicates nothing
