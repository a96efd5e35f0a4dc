"""IFCA-CAM's server update (Eq. 2 assignment, Eq. 6 cluster update, Eq. 9 global update) and
FeSEM-CAM's global step, from hand-made replies, with hand-computed values (no federation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import Context
from clusterfl.algorithms.cam import (
    IFCACAM,
    FeSEMCAM,
    FeSEMCAMConfig,
    FeSEMCAMState,
    IFCACAMConfig,
    IFCACAMState,
)
from clusterfl.algorithms.fesem import KMEANS, FeSEMAsk
from clusterfl.protocol import LocalTraining, LossReply, StepsReply, TrainReply

CLIENTS = np.array([0, 1, 2])
N_SAMPLES = np.array([1, 2, 1])  # n = 4


def _ctx() -> Context:
    return Context(backend=None, factory=None,  # type: ignore[arg-type]  # never used here
                   training=LocalTraining(lr=0.1), n_clients=4, train_sizes=np.full(4, 10),
                   rng=np.random.default_rng(0), seed=0)


def _trained(params: list[list[float]], loss: float) -> TrainReply:
    return TrainReply(CLIENTS.copy(), torch.tensor(params), N_SAMPLES.copy(), np.full(3, loss))


def _ifca_cam(rule: str) -> tuple[IFCACAM, IFCACAMState]:
    alg = IFCACAM(IFCACAMConfig(n_clusters=2, warmup_rounds=1, cluster_update=rule,
                                per_round=3))
    state = IFCACAMState(g=torch.tensor([1.0, 1.0]),
                         clusters=torch.tensor([[0.0, 0.0], [10.0, 10.0]]),
                         assign=np.array([-1, -1, -1, 1]))
    return alg, state


@pytest.mark.parametrize("rule", ["eq6", "mean"])
def test_ifca_cam_round_by_hand(rule):
    alg, state = _ifca_cam(rule)
    ctx = _ctx()
    ask = alg.ask(state, 2, "round", ctx)
    losses = LossReply(CLIENTS.copy(), np.array([[0.2, 0.9], [0.8, 0.1], [0.3, 0.5]]),
                       np.zeros((3, 2)))
    rep_k = _trained([[2.0, 0.0], [12.0, 10.0], [4.0, 4.0]], 0.7)  # θ_i, Θ_g frozen
    rep_g = _trained([[1.0, 3.0], [3.0, 1.0], [2.0, 2.0]], 0.4)  # θ_i^0, cluster part frozen
    out = alg.update(state, 2, ask, StepsReply(CLIENTS.copy(), [losses, rep_k, rep_g]))
    new = out.state
    np.testing.assert_array_equal(new.assign, [0, 1, 0, 1])  # Eq. 2; client 3 keeps its own
    if rule == "eq6":  # Θ_k ← (1 − Σ_{C_k} n_i/n) Θ_k + Σ_{C_k} (n_i/n) θ_i
        expected = [[(1 - 2 / 4) * 0 + 1 / 4 * 2 + 1 / 4 * 4,
                      (1 - 2 / 4) * 0 + 1 / 4 * 0 + 1 / 4 * 4],
                     [(1 - 2 / 4) * 10 + 2 / 4 * 12, (1 - 2 / 4) * 10 + 2 / 4 * 10]]
    else:  # the members' weighted mean (IFCA)
        expected = [[(2 + 4) / 2, (0 + 4) / 2], [12.0, 10.0]]
    torch.testing.assert_close(new.clusters, torch.tensor(expected))
    # Eq. 9: Θ_g ← Σ_i (n_i/n) θ_i^0 over all three clients
    torch.testing.assert_close(new.g, torch.tensor([(1 * 1 + 2 * 3 + 1 * 2) / 4,
                                                    (1 * 3 + 2 * 1 + 1 * 2) / 4]))
    extras = out.extras
    assert extras.assign_loss == pytest.approx((0.2 + 0.1 + 0.3) / 3)
    assert extras.train_loss_cluster == pytest.approx(0.7)
    assert extras.train_loss_global == pytest.approx(0.4)
    assert extras.cluster_sizes == [2, 2] and extras.warmup == 0
    # the given state is not modified
    assert state.assign.tolist() == [-1, -1, -1, 1] and state.g.tolist() == [1.0, 1.0]


def test_ifca_cam_warmup_round_is_fedavg_on_the_global_part():
    alg, state = _ifca_cam("eq6")
    ask = alg.ask(state, 1, "round", _ctx())
    assert ask.phase == "warmup" and torch.equal(ask.request.models, state.g[None])
    out = alg.update(state, 1, ask, _trained([[1.0, 3.0], [3.0, 1.0], [2.0, 2.0]], 0.5))
    torch.testing.assert_close(out.state.g, torch.tensor([9 / 4, 7 / 4]))
    assert torch.equal(out.state.clusters, state.clusters)  # cluster parts untouched
    assert out.extras.warmup == 1 and out.extras.assign_loss is None


def test_fesem_cam_updates_the_global_part_then_hands_the_cluster_parts_to_kmeans():
    alg = FeSEMCAM(FeSEMCAMConfig(n_clusters=2, warmup_rounds=0))
    alg.train_sizes, alg.index = np.full(4, 10), None  # what `setup` derives
    state = FeSEMCAMState(torch.zeros(2), np.array([0, 1, 0, 1]),
                          torch.tensor([[0.0, 0.0], [10.0, 10.0]]), None, g=torch.ones(2))
    ask = FeSEMAsk(None, clients=CLIENTS, parts=2, newcomers=False)  # type: ignore[arg-type]
    rep_k = _trained([[2.0, 0.0], [12.0, 10.0], [4.0, 4.0]], 0.7)
    rep_g = _trained([[1.0, 3.0], [3.0, 1.0], [2.0, 2.0]], 0.4)
    out = alg.update(state, 1, ask, StepsReply(CLIENTS.copy(), [rep_k, rep_g]))
    assert out.then == KMEANS
    torch.testing.assert_close(out.state.g, torch.tensor([9 / 4, 7 / 4]))  # Eq. 9
    pending = out.state.pending
    assert torch.equal(pending.params, rep_k.params)
    np.testing.assert_array_equal(pending.n_samples, N_SAMPLES)
    assert pending.losses == pytest.approx([0.7, 0.4])
    # the k-means phase (Lloyd from the centers: {0, 2} and {1}) and the round's extras
    done = alg.ask(out.state, 1, KMEANS, _ctx())
    np.testing.assert_array_equal(done.state.assign, [0, 1, 0, 1])
    torch.testing.assert_close(done.state.centers, torch.tensor([[3.0, 2.0], [12.0, 10.0]]))
    assert done.state.pending is None and done.then is None
    assert done.extras.train_loss_cluster == pytest.approx(0.7)
    assert done.extras.kmeans_iters == 1 and done.extras.cluster_sizes == [2, 2]
