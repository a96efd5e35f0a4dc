"""The mixture capabilities of the engines against the reference loop (issue 27).

- per-client proximal centers mixed from S models (`TrainRequest.prox_models` /
  `prox_weights`, FedSoft): the vectorized engine's per-client center and strength against
  the reference's literal mu/2 Σ_s a_s ||w − c_s||²;
- per-sample loss weights and the client-side EM step (`MixtureTrainRequest`, FedEM):
  E-step, π-update and the K weighted trainings;
- fitting mixture weights with frozen models (`MixtureFitRequest`) and least-loss counts
  (`BestCountRequest`);
- weighted "mean_probs" predictors (`Predictor.weights`).

Same helpers and tolerances as `test_equivalence.py` (float64: 1e-10).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.engine.test_equivalence import FILLED, SETTINGS, SIZES, close, setup

from clusterfl.engine.reference import predict
from clusterfl.engine.schedule import mixture_seed
from clusterfl.protocol import (
    BestCountRequest,
    EvaluateRequest,
    LocalTraining,
    MixtureFitRequest,
    MixtureTrainRequest,
    Predictor,
    TrainRequest,
)

NAMES = ["mlp", "lenet", "linear", "custom"]


@pytest.fixture(params=[torch.float64])
def dtype(request: pytest.FixtureRequest) -> Iterator[torch.dtype]:
    """Modules and data in float64 (the reference follows the default dtype)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    yield request.param
    torch.set_default_dtype(old)


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).random((n, k)) + 0.05
    return w / w.sum(1, keepdims=True)


@pytest.mark.parametrize("setting", ["prox", "adam_prox_steps"])
@pytest.mark.parametrize("name", NAMES)
def test_prox_mix_matches_reference(name: str, setting: str, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, SIZES)
    n = fed.n_clients
    tr = SETTINGS[setting]
    if name == "linear":
        tr = replace(tr, lr=tr.lr / 5)
    mix = fac.init_many(3, seed=9)
    weights = np.random.default_rng(1).random((n, 3)) * 1.5  # rows need not sum to 1
    weights[1] = 0.0  # a client without any pull
    req = TrainRequest(np.arange(n), fac.init_many(2, seed=1), np.arange(n) % 2, tr, seed=4,
                       prox_models=mix, prox_weights=weights)
    a, b = sim.train(req), seq.train(req)
    close(a.params, b.params, dtype)
    close(a.loss, b.loss, dtype)


def test_prox_mix_of_one_model_is_fedprox_toward_it(dtype: torch.dtype) -> None:
    """One proximal model with weight 1 is FedProx pulled toward that model: equal to a plain
    request whose start is that model (the usual center)."""
    fed, fac, seq, sim = setup("mlp", FILLED)
    n = fed.n_clients
    tr = SETTINGS["prox"]
    model = fac.init_many(1, seed=3)
    plain = TrainRequest(np.arange(n), model, np.zeros(n, np.int64), tr, seed=2)
    mixed = replace(plain, prox_models=model, prox_weights=np.ones((n, 1)))
    for backend in (seq, sim):
        close(backend.train(mixed).params, backend.train(plain).params, dtype)


def test_prox_mix_is_booked_unless_held() -> None:
    models, mix = torch.zeros(4, 10), torch.zeros(3, 10)
    req = TrainRequest(np.arange(2), models, np.arange(2), LocalTraining(mu=0.1), 0,
                       models_held=True, prox_models=mix, prox_weights=np.ones((2, 3)))
    assert req.unit_cost() == (30.0, 10.0)
    assert replace(req, prox_held=True).unit_cost() == (0.0, 10.0)


@pytest.mark.parametrize("setting", ["sgd", "momentum_wd", "adam"])
@pytest.mark.parametrize("name", NAMES)
def test_mixture_train_matches_reference(name: str, setting: str, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, SIZES, chunk_size=3)
    n = fed.n_clients
    tr = SETTINGS[setting]
    if name == "linear":
        tr = replace(tr, lr=tr.lr / 5)
    req = MixtureTrainRequest(np.arange(n), fac.init_many(3, seed=5), _weights(n, 3), tr, 8)
    a, b = sim.mixture_train(req), seq.mixture_train(req)
    assert a.params.shape == (n, 3, fac.size)
    close(a.params, b.params, dtype)
    close(a.loss, b.loss, dtype)
    close(a.weights, b.weights, dtype)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)
    np.testing.assert_allclose(a.weights.sum(1), 1.0, rtol=1e-12)
    empty = SIZES.index(0)  # no data: π kept, the K models returned unchanged, NaN loss
    np.testing.assert_array_equal(a.weights[empty], req.weights[empty])
    assert torch.equal(a.params[empty], req.models)
    assert np.isnan(a.loss[empty])


def test_mixture_of_one_model_is_plain_training(dtype: torch.dtype) -> None:
    """K = 1: every responsibility is 1, so the M-step is ordinary local training with the
    component's minibatch order."""
    fed, fac, seq, sim = setup("mlp", FILLED)
    n, tr = fed.n_clients, SETTINGS["momentum_wd"]
    model = fac.init_many(1, seed=2)
    mix = MixtureTrainRequest(np.arange(n), model, np.ones((n, 1)), tr, 21)
    plain = TrainRequest(np.arange(n), model, np.zeros(n, np.int64), tr, mixture_seed(21, 0))
    for backend in (seq, sim):
        close(backend.mixture_train(mix).params[:, 0], backend.train(plain).params, dtype)


def test_responsibilities_follow_the_losses(dtype: torch.dtype) -> None:
    """Hand check of the E-step and π-update on one client: q_j(k) ∝ π_k e^{−ℓ_jk}."""
    fed, fac, seq, sim = setup("mlp", FILLED)
    models = fac.init_many(2, seed=4)
    prior = np.array([[0.3, 0.7]])
    x, y = fed.client_train(0)
    ell = torch.stack([F.cross_entropy(predict(seq.module, m, x), y, reduction="none")
                       for m in models], 1).double()
    q = torch.tensor(prior) * torch.exp(-ell)
    q = q / q.sum(1, keepdim=True)
    req = MixtureTrainRequest(np.array([0]), models, prior, SETTINGS["sgd"], 3)
    for backend in (seq, sim):
        close(backend.mixture_train(req).weights[0], q.mean(0).numpy(), dtype)


@pytest.mark.parametrize("name", NAMES)
def test_mixture_fit_and_best_counts_match_reference(name: str, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, SIZES)
    n = fed.n_clients
    models = fac.init_many(3, seed=6)
    for split in ("train", "test"):
        fit = MixtureFitRequest(np.arange(n), models, _weights(n, 3, 2), iterations=5,
                                split=split)
        a, b = sim.mixture_fit(fit), seq.mixture_fit(fit)
        close(a.weights, b.weights, dtype)
        close(a.loss, b.loss, dtype)
        np.testing.assert_array_equal(a.n_samples, b.n_samples)
        cnt = BestCountRequest(np.arange(n), models, split)
        c, e = sim.best_counts(cnt), seq.best_counts(cnt)
        np.testing.assert_array_equal(c.counts, e.counts)
        np.testing.assert_array_equal(c.counts.sum(1), c.n_samples)


def test_best_counts_count_the_least_loss_model(dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup("mlp", FILLED)
    models = fac.init_many(3, seed=6)
    x, y = fed.client_train(1)
    ell = torch.stack([F.cross_entropy(predict(seq.module, m, x), y, reduction="none")
                       for m in models], 1)
    want = np.bincount(ell.argmin(1).numpy(), minlength=3)
    for backend in (seq, sim):
        got = backend.best_counts(BestCountRequest(np.array([1]), models)).counts[0]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("how", ["mean_probs", "mean_outputs"])
@pytest.mark.parametrize("name", NAMES)
def test_weighted_mixtures_match_reference(name: str, how: str, dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup(name, FILLED)
    n = fed.n_clients
    models = fac.init_many(3, seed=7)
    pred = Predictor(models, np.tile(np.arange(3), (n, 1)), how, _weights(n, 3, 4))
    for split in ("test", "train"):
        a = sim.evaluate(EvaluateRequest(np.arange(n), pred, split))
        b = seq.evaluate(EvaluateRequest(np.arange(n), pred, split))
        for field in ("accuracy", "loss"):
            close(getattr(a, field), getattr(b, field), dtype)


def test_mean_outputs_is_the_weighted_mean_of_the_members(dtype: torch.dtype) -> None:
    """Regression: the mixture predicts Σ_m π_m h_m(x); its MSE is that of the mean."""
    fed, fac, seq, sim = setup("linear", FILLED)
    n = fed.n_clients
    models = fac.init_many(2, seed=9)
    w = _weights(n, 2, 5)
    pred = Predictor(models, np.tile(np.arange(2), (n, 1)), "mean_outputs", w)
    x, y = fed.client_test(3)
    mean = w[3, 0] * predict(seq.module, models[0], x) + w[3, 1] * predict(seq.module, models[1], x)
    want = float(((mean.reshape(-1) - y) ** 2).mean())
    for backend in (seq, sim):
        got = backend.evaluate(EvaluateRequest(np.arange(n), pred)).loss[3]
        close(np.array([got]), np.array([want]), dtype)


def test_one_hot_weights_predict_like_that_member(dtype: torch.dtype) -> None:
    fed, fac, seq, sim = setup("mlp", FILLED)
    n = fed.n_clients
    models = fac.init_many(3, seed=8)
    pick = np.arange(n) % 3
    onehot = np.eye(3)[pick]
    mixed = Predictor(models, np.tile(np.arange(3), (n, 1)), "mean_probs", onehot)
    single = Predictor.single(models, pick)
    for backend in (seq, sim):
        a = backend.evaluate(EvaluateRequest(np.arange(n), mixed))
        b = backend.evaluate(EvaluateRequest(np.arange(n), single))
        close(a.accuracy, b.accuracy, dtype)
        close(a.loss, b.loss, dtype)
