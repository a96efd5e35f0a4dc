"""FedEM (Marfoq et al. 2021) and FedSoft (Ruan & Joe-Wong 2022).

- one round of each on a 2-client toy with a linear softmax model, against the paper's
  update computed here by hand (losses, E-step / least-loss counts, one full-batch gradient
  step written out, the server's average), on both in-process backends;
- the true clusters recovered on tiny federations (FedEM: argmax of each client's mixture
  weights, on label-set clusters — its mixture is over p(y|x); FedSoft: argmax of the
  importance weights, on rotations);
- new-client placement: the trained clients placed as if new land in their own clusters;
- options: FedSoft's selection of per_cluster clients.
The server steps alone (averages, selection, importance weights) on hand-built replies:
tests/algorithms/test_mixture_steps.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import adjusted_rand_score

from clusterfl.algorithms.base import Context
from clusterfl.algorithms.fedem import FedEM, FedEMConfig
from clusterfl.algorithms.fedsoft import FedSoft, FedSoftConfig
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import EvaluateRequest, LocalTraining

SIZES = (4, 6)
LR, MU = 0.5, 0.3


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def toy(backend: str) -> tuple[Context, ModelFactory, Federation]:
    """2 clients (4 and 6 samples, 3 features, 3 classes), a linear softmax model, one
    full-batch SGD step per local training."""
    g = torch.Generator().manual_seed(0)
    n = sum(SIZES)
    x = torch.randn(n, 3, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    off = np.array([0, SIZES[0], n])
    fed = Federation(x, y, off, x.clone(), y.clone(), off.copy(), np.array([0, 1]), 3)
    fac = ModelFactory(model_config({"name": "mlp", "hidden": []}), (3,), 3)
    be = (SequentialBackend if backend == "sequential" else SimulationBackend)(fed, fac)
    ctx = Context(be, fac, LocalTraining(lr=LR, batch_size=16, steps=1), 2, fed.train_sizes,
                  np.random.default_rng(0), seed=5)
    return ctx, fac, fed


def linear(fac: ModelFactory, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = fac.layout.views(flat)
    return v["layers.0.weight"], v["layers.0.bias"]


def ce_grad(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
            q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample losses and the gradient of (1/n) Σ_j q_j ℓ_j, written out:
    dℓ_j/dlogits = softmax − onehot."""
    logits = x @ w.t() + b
    loss = torch.logsumexp(logits, 1) - logits.gather(1, y[:, None])[:, 0]
    r = (torch.softmax(logits, 1) - F.one_hot(y, 3).to(x.dtype)) * (q / len(y))[:, None]
    return loss, r.t() @ x, r.sum(0)


@pytest.mark.parametrize("backend", ["sequential", "simulation"])
def test_fedem_one_round_by_hand(backend: str) -> None:
    ctx, fac, fed = toy(backend)
    alg = FedEM(FedEMConfig(name="fedem", n_components=2))
    alg.setup(ctx)
    start = alg.state.models.clone()
    alg.run_round(ctx, 1)

    new = torch.zeros_like(start)
    for c in range(2):
        x, y = fed.client_train(c)
        ells = torch.stack([ce_grad(*linear(fac, start[m]), x, y, torch.ones(len(y)))[0]
                            for m in range(2)], 1)
        q = 0.5 * torch.exp(-ells)
        q = q / q.sum(1, keepdim=True)  # E-step with π = (1/2, 1/2)
        np.testing.assert_allclose(alg.state.weights[c], q.mean(0).numpy(), rtol=1e-5)
        for m in range(2):
            w, b = linear(fac, start[m])
            _, gw, gb = ce_grad(w, b, x, y, q[:, m])
            trained = torch.cat([(w - LR * gw).reshape(-1), b - LR * gb])
            new[m] += SIZES[c] / sum(SIZES) * trained
    torch.testing.assert_close(alg.state.models, new, rtol=1e-5, atol=1e-6)
    # the predictor is each client's π-weighted mixture of the two components
    pred = alg.predictor()
    np.testing.assert_allclose(pred.weights, alg.state.weights)
    assert pred.combine == "mean_probs" and pred.members.tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("backend", ["sequential", "simulation"])
def test_fedsoft_one_round_by_hand(backend: str) -> None:
    ctx, fac, fed = toy(backend)
    alg = FedSoft(FedSoftConfig(name="fedsoft", n_clusters=2, mu=MU, sigma=1e-4))
    alg.setup(ctx)
    centers, personal = alg.state.models.clone(), alg.state.personal.of(np.arange(2))
    alg.run_round(ctx, 1)

    trained, u = [], []
    for c in range(2):
        x, y = fed.client_train(c)
        ells = torch.stack([ce_grad(*linear(fac, centers[s]), x, y, torch.ones(len(y)))[0]
                            for s in range(2)], 1)
        counts = torch.bincount(ells.argmin(1), minlength=2).double()
        u_c = counts / len(y)
        u_c = torch.where(u_c > 0, u_c, torch.tensor(1e-4, dtype=torch.float64))
        u.append(u_c)
        w, b = linear(fac, personal[c])
        _, gw, gb = ce_grad(w, b, x, y, torch.ones(len(y)))
        flat = personal[c]
        prox = sum(float(u_c[s]) * (flat - centers[s]) for s in range(2))  # ∇ of Σ u/2 ||·||²
        grad = torch.cat([gw.reshape(-1), gb]) + MU * prox
        trained.append(flat - LR * grad)
    np.testing.assert_allclose(alg.state.importance, torch.stack(u).numpy())
    torch.testing.assert_close(alg.state.personal.of(np.arange(2)), torch.stack(trained),
                               rtol=1e-5, atol=1e-6)
    expect = torch.zeros_like(centers)
    for s in range(2):  # c_s = Σ_k v_sk w_k, v_sk ∝ u_ks n_k
        v = torch.tensor([float(u[c][s]) * SIZES[c] for c in range(2)])
        expect[s] = sum(v[c] / v.sum() * trained[c] for c in range(2))
    torch.testing.assert_close(alg.state.models, expect, rtol=1e-5, atol=1e-6)
    assert alg.assignment().tolist() == [int(torch.argmax(u[c])) for c in range(2)]


# ----------------------------------------------------------------------------- federations
def tiny(algorithm: dict[str, Any], scenario: dict[str, Any], rounds: int,
         **tables: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "seed": 0, "rounds": rounds, "eval_every": 1, "checkpoint_every": 0,
        "data": {"source": "digits"}, "scenario": scenario,
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"lr": 0.1, "batch_size": 16, "steps": 5},
        "output": {"figures": False, "progress": "off"}, "algorithm": algorithm}
    cfg.update(tables)
    return cfg


LABEL_SETS = {"name": "cluster_labels", "n_clients": 8, "n_clusters": 2}
ROTATIONS = {"name": "rotation", "n_clients": 8, "angles": [0, 180]}


def _run(cfg: dict[str, Any]) -> tuple[Experiment, Any]:
    exp = Experiment.from_config(cfg)
    return exp, exp.run(progress=False)


def _ctx(exp: Experiment) -> Context:
    """A fresh context on the run's federation (what placing new clients talks through)."""
    return exp._context(SimulationBackend(exp.federation, exp.factory))


def test_fedem_finds_the_label_set_clusters_and_places_them_again() -> None:
    exp, h = _run(tiny({"name": "fedem", "n_components": 2}, LABEL_SETS, 10))
    truth = exp.federation.clusters
    first, last = h.records[0], h.records[-1]
    assert last.ari == pytest.approx(1.0)  # argmax of each client's mixture weights
    assert last.metrics.accuracy > first.metrics.accuracy + 0.2
    weights = exp.algorithm.state.weights
    assert weights.max(1).min() > 0.9  # the mixtures became (nearly) hard assignments
    # the same clients placed as if new: π fitted with the components frozen
    ctx = _ctx(exp)
    placed = exp.algorithm.placement(ctx, np.arange(8))
    assert adjusted_rand_score(truth, placed.clusters) == pytest.approx(1.0)
    assert placed.clusters.tolist() == exp.algorithm.assignment().tolist()
    ev = ctx.send(EvaluateRequest(placed.clients, placed.predictor))
    np.testing.assert_allclose(ev.accuracy, last.client_accuracy, atol=0.05)


@pytest.mark.parametrize("per_cluster", [None, 3])
def test_fedsoft_finds_the_rotations(per_cluster: int | None) -> None:
    exp, h = _run(tiny({"name": "fedsoft", "n_clusters": 2, "per_cluster": per_cluster},
                       ROTATIONS, 15))
    first, last = h.records[0], h.records[-1]
    assert last.ari == pytest.approx(1.0)  # argmax of the importance weights
    assert last.metrics.accuracy > first.metrics.accuracy + 0.1
    if per_cluster is not None:  # at most 2 x 3 clients train in a round
        assert all(r.extras["selected"] <= 6 for r in h.records)
    ctx = _ctx(exp)
    placed = exp.algorithm.placement(ctx, np.arange(8))
    assert adjusted_rand_score(exp.federation.clusters, placed.clusters) == pytest.approx(1.0)


def test_fedsoft_cluster_predictor_uses_the_argmax_cluster_model() -> None:
    exp, _ = _run(tiny({"name": "fedsoft", "n_clusters": 2, "predict_with": "cluster"},
                       ROTATIONS, 3))
    pred = exp.algorithm.predictor()
    assert torch.equal(pred.models, exp.algorithm.state.models)
    assert pred.members[:, 0].tolist() == np.maximum(exp.algorithm.assignment(), 0).tolist()


def test_fedem_on_regression_predicts_the_mixture_mean() -> None:
    """Squared error as the loss: the E-step still weighs the components, the mixture
    predicts Σ_m π_m h_m(x) and the test error falls."""
    cfg = tiny({"name": "fedem", "n_components": 3},
               {"name": "linear_regression", "n_clients": 6, "delta_phi": 40.0,
                "samples_per_client": 200, "test_samples_per_client": 50}, 8,
               data={"source": "synthetic_regression"}, model={"name": "linear"},
               train={"lr": 0.1, "batch_size": 32, "steps": 5})
    exp, h = _run(cfg)
    assert exp.algorithm.predictor().combine == "mean_outputs"
    mse = [r.metrics.mse for r in h.records]
    assert all(np.isfinite(mse)) and mse[-1] < 0.95 * mse[0], mse


@pytest.mark.parametrize(("algorithm", "field"), [
    ({"name": "fedem", "n_components": 9}, "algorithm.n_components"),
    ({"name": "fedsoft", "n_clusters": 9}, "algorithm.n_clusters"),
])
def test_more_models_than_clients_is_a_config_error(algorithm, field) -> None:
    with pytest.raises(ConfigError) as err:
        _run(tiny(algorithm, ROTATIONS, 1))
    assert err.value.field == field and "allowed: 1..8" in str(err.value)


@pytest.mark.parametrize(("algorithm", "field"), [
    ({"name": "fedem", "aggregate": "some"}, "algorithm.aggregate"),
    ({"name": "fedsoft", "per_cluster": 0}, "algorithm.per_cluster"),
    ({"name": "fedsoft", "mu": -1}, "algorithm.mu"),
])
def test_bad_options_name_the_field(algorithm, field) -> None:
    with pytest.raises(ConfigError) as err:
        Experiment.from_config(tiny(algorithm, ROTATIONS, 1))
    assert field in str(err.value)


def test_more_fedem_components_than_clients_names_components_not_cluster_models() -> None:
    # it said "K = 20 cluster models need at least 20 clients" of FedEM's M components
    with pytest.raises(ConfigError, match=r"^algorithm\.n_components: M = 20 mixture "
                                          r"components need at least 20 clients, the "
                                          r"federation has 8; allowed: 1\.\.8$"):
        Experiment.from_config(tiny({"name": "fedem", "n_components": 20}, ROTATIONS, 1))


def test_fedem_counts_each_clients_k_trainings_as_client_updates() -> None:
    # FedEM's client_updates stayed 0 though every client trains M models each round
    rounds, m = 3, 2
    _, h = _run(tiny({"name": "fedem", "n_components": m}, ROTATIONS, rounds))
    asked = [r.participants for r in h.records]
    assert h.records[-1].client_updates == m * sum(asked) > 0
