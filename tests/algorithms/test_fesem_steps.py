"""FeSEM's server step (k-means on the uploaded models, CAM Eq. 10-11) and its gathering of
the first clustering's models, with hand-built inputs and hand-computed values."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import FIRST
from clusterfl.algorithms.fesem import (
    KMEANS,
    FeSEM,
    FeSEMAsk,
    FeSEMConfig,
    FeSEMState,
    cluster_step,
    first_models,
)
from clusterfl.engine.allocator import disk_room
from clusterfl.protocol import LocalTraining, TrainReply, TrainRequest
from clusterfl.state import snapshot

#: four client models on a line, the second counting three samples
PARAMS = torch.tensor([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [14.0, 0.0]])
WEIGHTS = np.array([1, 3, 1, 1])
START = torch.zeros(2)


def test_lloyd_from_the_current_centers_by_hand():
    """Nearest of Θ = [1, 0], [9, 0]: {0, 1} and {2, 3}; the weighted means then keep them."""
    cfg = FeSEMConfig(n_clusters=2)
    assign = np.array([1, 0, 0, 1, -1, 1])  # 6 clients; 4 and 5 not in this round
    centers = torch.tensor([[1.0, 0.0], [9.0, 0.0]])
    new, out, km = cluster_step(cfg, None, assign, centers, START, np.arange(4), PARAMS,
                                WEIGHTS, seed=0)
    np.testing.assert_array_equal(new, [0, 0, 1, 1, -1, 1])  # 4 and 5 keep theirs
    torch.testing.assert_close(out, torch.tensor([[(1 * 0 + 3 * 2) / (1 + 3), 0.0],
                                                  [(1 * 10 + 1 * 14) / (1 + 1), 0.0]]))
    assert km.kmeans_iters == 1 and km.kmeans_converged == 1 and km.kmeans_reseeded == 0
    # Σ n_i ||θ_i − Θ_c(i)||²
    assert km.kmeans_inertia == pytest.approx(1 * 1.5**2 + 3 * 0.5**2 + 1 * 2**2 + 1 * 2**2)
    np.testing.assert_array_equal(assign, [1, 0, 0, 1, -1, 1])  # the input is not modified


@pytest.mark.parametrize("rule", ["reseed", "keep"])
def test_a_center_without_members_restarts_from_the_farthest_model(rule):
    """Θ_2 = [100, 100] is nobody's nearest. "reseed": the farthest model from its center
    among clusters keeping another member (client 2, 2 away from 12 — client 3 is as far, the
    lower row wins) becomes Θ_2, and Lloyd runs again: {0, 1}, {3}, {2}."""
    cfg = FeSEMConfig(n_clusters=3, empty_centers=rule)
    centers = torch.tensor([[1.0, 0.0], [9.0, 0.0], [100.0, 100.0]])
    new, out, km = cluster_step(cfg, None, np.zeros(4, np.int64), centers, START,
                                np.arange(4), PARAMS, WEIGHTS, seed=0)
    if rule == "keep":
        np.testing.assert_array_equal(new, [0, 0, 1, 1])
        torch.testing.assert_close(out, torch.tensor([[1.5, 0.0], [12.0, 0.0],
                                                      [100.0, 100.0]]))
        assert km.kmeans_reseeded == 0
        return
    np.testing.assert_array_equal(new, [0, 0, 2, 1])
    torch.testing.assert_close(out, torch.tensor([[(0 + 3 * 2) / 4, 0.0], [14.0, 0.0],
                                                  [10.0, 0.0]]))
    assert km.kmeans_reseeded == 1 and km.kmeans_iters == 1 + 1
    assert km.kmeans_inertia == pytest.approx(1 * 1.5**2 + 3 * 0.5**2 + 0 + 0)


def test_distances_read_only_the_chosen_coordinates():
    """k-means reads coordinate 1 only (where clients 0 and 3 agree); the centers are still
    the weighted means of the whole models."""
    params = torch.tensor([[0.0, 1.0], [5.0, 9.0], [6.0, 8.0], [20.0, 1.0]])
    centers = torch.tensor([[0.0, 0.0], [0.0, 10.0]])
    new, out, _ = cluster_step(FeSEMConfig(n_clusters=2), torch.tensor([1]),
                               np.zeros(4, np.int64), centers, START, np.arange(4), params,
                               np.ones(4), seed=0)
    np.testing.assert_array_equal(new, [0, 1, 1, 0])
    torch.testing.assert_close(out, torch.tensor([[(0 + 20) / 2, (1 + 1) / 2],
                                                  [(5 + 6) / 2, (9 + 8) / 2]]))


def test_first_kmeans_waits_for_half_the_clients():
    """With `first_clustering` = 0.5 of 4 clients: one model trained from Θ_0 is kept and
    waits; the second completes the half, and the k-means phase gets both, by client id."""
    alg = FeSEM(FeSEMConfig(n_clusters=2, first_clustering=0.5))
    alg.train_sizes, alg.index = np.array([10, 20, 30, 40]), None  # what `setup` derives
    state = FeSEMState(START, np.full(4, -1, np.int64), None, None)

    def round_(state: FeSEMState, client: int, model: list[float]):
        clients = np.array([client])
        ask = FeSEMAsk(TrainRequest(clients, START[None], np.zeros(1, np.int64),
                                    LocalTraining(), 0), FIRST, clients=clients, parts=1,
                       newcomers=False)
        reply = TrainReply(clients, torch.tensor([model]), np.array([7]), np.array([0.5]))
        return alg.update(state, 1, ask, reply)

    first = round_(state, 2, [3.0, 3.0])
    assert first.then is None and first.state.pending is None
    assert first.state.first_row.tolist() == [-1, -1, 0, -1]  # its row, the first
    assert first.extras.train_loss == 0.5 and (first.state.assign == -1).all()
    second = round_(first.state, 0, [1.0, 1.0])
    assert second.then == KMEANS
    got = second.state.pending
    np.testing.assert_array_equal(got.clients, [0, 2])
    torch.testing.assert_close(got.params, torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    np.testing.assert_array_equal(got.n_samples, [10, 30])  # their sizes, not the reply's
    assert second.state.first is None and first.state.first is not None  # not in place


def test_first_models_are_kept_for_the_clients_seen_only_and_match_a_full_table():
    """Sampled rounds with repeats (1,000 clients, 30 a round): the gathered table has one
    row per client seen (in the order they first sent one), in a file-backed table written
    in place, and holds exactly what a [n_clients, d] table written round by round holds (a
    client sampled again replaces its row), so it grows with the clients sampled. The first
    k-means reads them back in id order. A checkpoint of before (the rows in id order marked
    by `first_seen`, or a table of every client's) gathers to the same models."""
    n, d = 1000, 3
    alg = FeSEM(FeSEMConfig(n_clusters=2, first_clustering=0.9))
    alg.train_sizes, alg.index = np.arange(1, n + 1), None
    state = FeSEMState(START, np.full(n, -1, np.int64), None, None)
    full, seen = torch.zeros(n, d), np.zeros(n, dtype=bool)
    rng = np.random.default_rng(0)
    order: list[int] = []  # clients in the order they first sent a model
    for r in range(5):
        clients = np.sort(rng.choice(n, size=30, replace=False))
        if r:
            clients[:5] = np.flatnonzero(seen)[:5]  # some sent before: replaced
            clients = np.unique(clients)
        params = torch.from_numpy(rng.normal(size=(len(clients), d)).astype(np.float32))
        full[torch.from_numpy(clients)] = params
        order += [int(c) for c in clients if not seen[c]]
        seen[clients] = True
        ask = FeSEMAsk(TrainRequest(clients, torch.zeros(1, d),
                                    np.zeros(len(clients), np.int64), LocalTraining(), 0),
                       FIRST, clients=clients, parts=1, newcomers=False)
        before = state.first
        out = alg.update(state, r + 1, ask,
                         TrainReply(clients, params, np.full(len(clients), 7),
                                    np.full(len(clients), 0.5)))
        assert out.then is None
        state = out.state
        assert state.first.shape == (seen.sum(), d)  # the clients seen, not all clients
        assert disk_room(state.first) is not None  # in the file-backed table
        if before is not None:  # the same table, grown: written in place
            assert state.first.data_ptr() == before.data_ptr()
        np.testing.assert_array_equal(state.first_row >= 0, seen)
        np.testing.assert_array_equal(state.first_row[order], np.arange(len(order)))
        torch.testing.assert_close(state.first, full[torch.tensor(order)], rtol=0, atol=0)
        ids, models = first_models(state.first, state.first_row)
        np.testing.assert_array_equal(ids, np.flatnonzero(seen))
        torch.testing.assert_close(models, full[torch.from_numpy(ids)], rtol=0, atol=0)
    # checkpoints of before: the seen rows in id order, or a [n_clients, d] table
    clients, params = np.array([3, 999]), torch.ones(2, d)
    ask = FeSEMAsk(TrainRequest(clients, full[:1], np.zeros(2, np.int64), LocalTraining(), 0),
                   FIRST, clients=clients, parts=1, newcomers=False)
    reply = TrainReply(clients, params, np.full(2, 7), np.full(2, 0.5))
    expect = full.clone()
    expect[torch.from_numpy(clients)] = params
    seen[clients] = True
    for table in (full[torch.from_numpy(np.flatnonzero(state.first_row >= 0))], full.clone()):
        old = {**snapshot(replace(state, first=None, first_row=None)), "first": table,
               "first_seen": state.first_row >= 0}
        alg.load_state_dict(old)
        got = alg.update(alg.state, 6, ask, reply).state
        ids, models = first_models(got.first, got.first_row)
        np.testing.assert_array_equal(ids, np.flatnonzero(seen))
        torch.testing.assert_close(models, expect[torch.from_numpy(ids)], rtol=0, atol=0)


def test_the_first_kmeans_gets_the_gathered_models_in_id_order():
    """Two rounds of 2 of 4 clients (first_clustering 1.0): the k-means phase gets the four
    models in id order (as the table of every client's would give them), the file-backed
    table is dropped from the state."""
    alg = FeSEM(FeSEMConfig(n_clusters=2, first_clustering=1.0))
    alg.train_sizes, alg.index = np.array([10, 20, 30, 40]), None
    state = FeSEMState(START, np.full(4, -1, np.int64), None, None)
    models = {3: [3.0, 0.5], 1: [1.0, 0.5], 0: [0.0, 1.5], 2: [2.0, 2.5]}
    for clients in ([1, 3], [0, 2]):
        ids = np.array(clients)
        ask = FeSEMAsk(TrainRequest(ids, START[None], np.zeros(2, np.int64), LocalTraining(),
                                    0), FIRST, clients=ids, parts=1, newcomers=False)
        out = alg.update(state, 1, ask, TrainReply(ids, torch.tensor([models[c] for c in
                                                                      clients]),
                                                   np.full(2, 7), np.full(2, 0.5)))
        state = out.state
    assert out.then == KMEANS and state.first is None and state.first_row is None
    np.testing.assert_array_equal(state.pending.clients, [0, 1, 2, 3])
    torch.testing.assert_close(state.pending.params,
                               torch.tensor([models[c] for c in range(4)]), rtol=0, atol=0)
    np.testing.assert_array_equal(state.pending.n_samples, [10, 20, 30, 40])
