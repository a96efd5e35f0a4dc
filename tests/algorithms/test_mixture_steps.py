"""FedEM's and FedSoft's server steps on hand-built replies (no federation): the component
and cluster averages, the selection, the importance weights, and `update` returning a new
state (the given one unchanged) with the round's extras. Every expected value is written as
the sum it is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import Ask
from clusterfl.algorithms.common import ClientModels
from clusterfl.algorithms.fedem import (
    FedEM,
    FedEMConfig,
    FedEMExtras,
    FedEMState,
    aggregate_components,
)
from clusterfl.algorithms.fedsoft import (
    ESTIMATE,
    TRAIN,
    FedSoft,
    FedSoftConfig,
    FedSoftExtras,
    FedSoftState,
    SelectionAsk,
    aggregate_clusters,
    importance_weights,
    select_clients,
)
from clusterfl.protocol import (
    BestCountReply,
    BestCountRequest,
    LocalTraining,
    MixtureTrainReply,
    MixtureTrainRequest,
    TrainReply,
    TrainRequest,
)

MODELS = torch.tensor([[10.0], [20.0]], dtype=torch.float64)  # two components / clusters, d = 1


# ----------------------------------------------------------------------------- FedEM
#: clients 0 and 1 answer with their trained components θ_{m,t} (rows m) and 1 and 3 samples
PARAMS = torch.tensor([[[1.0], [2.0]], [[3.0], [5.0]]], dtype=torch.float64)
N_SAMPLES = np.array([1, 3])


def test_fedem_components_are_the_sample_weighted_means() -> None:
    got = np.array([0, 1])
    new = aggregate_components(MODELS, PARAMS, N_SAMPLES, got)
    want = [[(1 * 1 + 3 * 3) / 4], [(1 * 2 + 3 * 5) / 4]]
    torch.testing.assert_close(new, torch.tensor(want, dtype=torch.float64))


def test_fedem_all_client_average_counts_the_others_with_the_current_component() -> None:
    """`aggregate = "all"`: p_t = n_t / n over all three clients (sizes 1, 3, 4); client 2
    did not train and counts with the current θ_m."""
    new = aggregate_components(MODELS, PARAMS, N_SAMPLES, np.array([0, 1]),
                               sizes=np.array([1.0, 3.0, 4.0]))
    want = [[1 / 8 * 1 + 3 / 8 * 3 + 4 / 8 * 10], [1 / 8 * 2 + 3 / 8 * 5 + 4 / 8 * 20]]
    torch.testing.assert_close(new, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("aggregate", ["sampled", "all"])
def test_fedem_update_keeps_the_answers_and_leaves_the_given_state(aggregate: str) -> None:
    alg = FedEM(FedEMConfig(n_components=2, aggregate=aggregate))  # type: ignore[arg-type]
    alg.sizes = np.array([1.0, 3.0, 4.0])  # what `setup` keeps from the context
    state = FedEMState(MODELS.clone(), np.full((3, 2), 0.5), np.zeros(3, dtype=bool))
    pi = np.array([[0.9, 0.1], [0.2, 0.8]])
    reply = MixtureTrainReply(np.array([0, 1]), PARAMS, N_SAMPLES, np.array([0.5, 1.5]), pi)
    ask = Ask(MixtureTrainRequest(np.array([0, 1]), MODELS, state.weights[:2],
                                  LocalTraining(), 0))
    out = alg.update(state, 1, ask, reply)
    new = out.state
    assert out.then is None and isinstance(out.extras, FedEMExtras)
    np.testing.assert_array_equal(new.weights, [[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    assert new.trained.tolist() == [True, True, False]
    sizes = alg.sizes if aggregate == "all" else None
    torch.testing.assert_close(new.models,
                               aggregate_components(MODELS, PARAMS, N_SAMPLES,
                                                    np.array([0, 1]), sizes))
    entropy = [-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)),
               -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))]
    assert out.extras.weight_entropy == pytest.approx(sum(entropy) / 2)
    assert out.extras.train_loss == pytest.approx((0.5 + 1.5) / 2)
    assert out.extras.cluster_sizes == [1, 1]  # argmax π: client 0 on 0, client 1 on 1
    # the given state did not move
    assert (state.weights == 0.5).all() and not state.trained.any()
    torch.testing.assert_close(state.models, MODELS)


def test_fedem_update_without_answers_keeps_everything() -> None:
    alg = FedEM(FedEMConfig(n_components=2))
    state = FedEMState(MODELS.clone(), np.full((3, 2), 0.5), np.zeros(3, dtype=bool))
    empty = MixtureTrainReply(np.zeros(0, np.int64), torch.zeros(0, 2, 1, dtype=torch.float64),
                              np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 2)))
    ask = Ask(MixtureTrainRequest(np.array([0]), MODELS, state.weights[:1], LocalTraining(), 0))
    out = alg.update(state, 1, ask, empty)
    assert out.state is state and isinstance(out.extras, FedEMExtras)
    assert out.extras.weight_entropy is None and out.extras.cluster_sizes == [0, 0]


# ----------------------------------------------------------------------------- FedSoft
def test_importance_weights_smooth_zero_counts() -> None:
    u = importance_weights(np.array([[3, 0, 1], [0, 0, 0]]), np.array([4, 0]), 0.01)
    np.testing.assert_allclose(u, [[3 / 4, 0.01, 1 / 4], [0.01, 0.01, 0.01]])


def test_fedsoft_cluster_models_without_selection_are_v_weighted_means() -> None:
    """Clients 0 and 2 answer (new w_k = 1 and 3, 4 and 2 samples); v_sk ∝ u_ks n_k."""
    u = np.array([[0.75, 0.25], [0.5, 0.5]])
    new = aggregate_clusters(MODELS, torch.tensor([[1.0], [3.0]], dtype=torch.float64), u,
                             np.array([4, 2]), np.array([0, 2]), None)
    v0 = np.array([0.75 * 4, 0.5 * 2])  # 3, 1
    v1 = np.array([0.25 * 4, 0.5 * 2])  # 1, 1
    want = [[(v0[0] * 1 + v0[1] * 3) / v0.sum()], [(v1[0] * 1 + v1[1] * 3) / v1.sum()]]
    torch.testing.assert_close(new, torch.tensor(want, dtype=torch.float64))


def test_fedsoft_cluster_models_with_selection_are_uniform_means() -> None:
    """Cluster 0 selected clients 0 and 5 (5 did not answer): the mean of client 0's w;
    cluster 1 selected nobody who answered: kept."""
    params = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    new = aggregate_clusters(MODELS, params, np.ones((2, 2)), np.array([4, 2]),
                             np.array([0, 2]), [np.array([0, 5]), np.array([7])])
    torch.testing.assert_close(new, torch.tensor([[1.0], [20.0]], dtype=torch.float64))


def test_fedsoft_selection_draws_by_v_and_only_among_nonzero_shares() -> None:
    pool = np.array([3, 5, 7])
    u = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    rng = np.random.default_rng(0)
    selected, chosen = select_clients(rng, pool, u, np.ones(3), per_cluster=2)
    assert chosen is not None
    assert chosen[0].tolist() == [3]  # one client with a nonzero share: one drawn, not two
    assert chosen[1].tolist() == [5, 7] and selected.tolist() == [3, 5, 7]
    same, none = select_clients(rng, pool, u, np.ones(3), per_cluster=3)  # ≥ the pool
    assert none is None and same.tolist() == pool.tolist()


def test_fedsoft_estimation_then_training_update() -> None:
    alg = FedSoft(FedSoftConfig(n_clusters=2, sigma=0.01))
    state = FedSoftState(MODELS.clone(),
                         ClientModels.start(torch.zeros(1, dtype=torch.float64), 3),
                         np.full((3, 2), 0.5), np.zeros(3, dtype=bool))
    counts = BestCountReply(np.array([0, 2]), np.array([[3, 1], [0, 2]]), np.array([4, 2]))
    est = alg.update(state, 1, Ask(BestCountRequest(np.arange(3), MODELS), ESTIMATE), counts)
    assert est.then == TRAIN and est.extras is None
    np.testing.assert_allclose(est.state.importance, [[3 / 4, 1 / 4], [0.5, 0.5], [0.01, 2 / 2]])
    assert est.state.estimated.tolist() == [True, False, True]
    assert (state.importance == 0.5).all() and not state.estimated.any()  # not modified

    selected = np.array([0, 1, 2])
    request = TrainRequest(selected, est.state.personal.of(selected), selected, LocalTraining(),
                           0)
    reply = TrainReply(np.array([0, 2]), torch.tensor([[1.0], [3.0]], dtype=torch.float64),
                       np.array([4, 2]), np.array([1.0, 2.0]))
    out = alg.update(est.state, 1, SelectionAsk(request, TRAIN, chosen=None), reply)
    assert out.then is None and isinstance(out.extras, FedSoftExtras)
    # client 1 did not answer: it keeps the start; 0 and 2 got rows of their own
    assert out.state.personal.of(np.arange(3))[:, 0].tolist() == [1.0, 0.0, 3.0]
    assert len(out.state.personal.models) == 3
    v0, v1 = np.array([3 / 4 * 4, 0.01 * 2]), np.array([1 / 4 * 4, 1.0 * 2])
    want = [[(v0[0] * 1 + v0[1] * 3) / v0.sum()], [(v1[0] * 1 + v1[1] * 3) / v1.sum()]]
    torch.testing.assert_close(out.state.models, torch.tensor(want, dtype=torch.float64))
    assert out.extras.selected == 3 and out.extras.estimated == 1
    assert out.extras.cluster_sizes == [1, 1]  # client 0 → 0, client 2 → 1, client 1 none
    # the rows the state given to update reads did not move
    assert est.state.personal.of(np.arange(3)).abs().sum() == 0
