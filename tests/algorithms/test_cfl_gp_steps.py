"""CFL-GP's server steps with hand-built inputs and hand-computed values, no federation: the
profile's running mean (Alg. 1 lines 8–9), who the clustering reads, and one round's update
from hand-made replies (Alg. 1 lines 2–10)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from clusterfl.algorithms.base import FIRST, Context
from clusterfl.algorithms.cfl_gp import CFLGP, CFLGPAsk, CFLGPConfig, CFLGPState
from clusterfl.algorithms.cfl_gp_profile import (
    Probe,
    Rows,
    count_asks,
    feature_columns,
    profiled_clients,
    update_profile,
)
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import GradientReply, GradientRequest, LocalTraining, StepsReply


def _profile() -> torch.Tensor:
    """C = 3 clients, K = 2 blocks, d̂ = 2: block 0 all 1, block 1 by hand."""
    features = torch.ones(3, 2, 2)
    features[:, 1] = torch.tensor([[3.0, 6.0], [9.0, 0.0], [1.0, 1.0]])
    return features


def test_profile_update_with_one_beta_is_the_running_mean():
    features = _profile()
    before = features.clone()
    # block 1 asked of all three; clients 2 and 0 answered (in that order), 1 stayed silent
    probe = Probe(block=1, asked=np.array([0, 1, 2]), who=np.array([2, 0]),
                  rows=torch.tensor([[4.0, 7.0], [0.0, 3.0]]))
    out = update_profile(features, [probe], [np.full(3, 1 / 3)])
    expected = before.clone()
    expected[0, 1] = torch.tensor([2 / 3 * 3 + 1 / 3 * 0, 2 / 3 * 6 + 1 / 3 * 3])  # [2, 5]
    expected[2, 1] = torch.tensor([2 / 3 * 1 + 1 / 3 * 4, 2 / 3 * 1 + 1 / 3 * 7])  # [2, 3]
    torch.testing.assert_close(out, expected)
    assert torch.equal(features, before)  # a new profile; the given one is not modified


def test_profile_update_with_a_beta_per_client():
    """β_c = 1/(n_c + 1): client 0 asked for the first time (β = 1, its block is replaced),
    client 2 asked once before (β = 1/2); they answered in the order 2, 0."""
    features = _profile()
    probe = Probe(block=1, asked=np.array([0, 2]), who=np.array([2, 0]),
                  rows=torch.tensor([[5.0, 9.0], [8.0, 2.0]]))
    out = update_profile(features, [probe], [np.array([1 / (0 + 1), 1 / (1 + 1)])])
    expected = _profile()
    expected[0, 1] = torch.tensor([0 * 3 + 1 * 8.0, 0 * 6 + 1 * 2.0])
    expected[2, 1] = torch.tensor([1 / 2 * 1 + 1 / 2 * 5, 1 / 2 * 1 + 1 / 2 * 9])  # [3, 5]
    torch.testing.assert_close(out, expected)


def test_feature_columns_of_whole_and_narrowed_vectors():
    every, some = torch.arange(5), torch.tensor([1, 4])
    assert feature_columns(5, 5, every) is None  # whole vectors, every coordinate kept
    assert torch.equal(feature_columns(5, 5, some), some)  # whole vectors: subsampled
    assert feature_columns(2, 5, some) is None  # narrowed on the wire: taken as they are
    with pytest.raises(ValueError, match="width 3: expected 5 or 2"):
        feature_columns(3, 5, some)


def test_rows_read_some_clients_features_a_slice_at_a_time():
    table = torch.arange(20.0).reshape(5, 4)  # client c's vector: 4c .. 4c + 3
    rows = Rows(table, np.array([3, 0, 4]), torch.tensor([1, 3]))
    assert len(rows) == 3
    assert torch.equal(rows[0:2], torch.tensor([[13.0, 15.0], [1.0, 3.0]]))
    assert torch.equal(rows[2:3], torch.tensor([[17.0, 19.0]]))
    assert torch.equal(Rows(table, np.array([1]))[0:1], table[1:2])  # every column
    # as a probe's piece: the profile gets the same values as from the copied rows
    features = _profile()
    piece = Rows(torch.tensor([[9.0, 4.0, 7.0], [0.0, 2.0, 5.0]]), np.array([1, 0]),
                 torch.tensor([0, 2]))
    out = update_profile(features, [Probe(1, np.array([0, 2]), np.array([2, 0]), piece)],
                         [np.full(2, 0.5)])
    expected = _profile()
    expected[2, 1] = torch.tensor([0.5 * 1 + 0.5 * 0.0, 0.5 * 1 + 0.5 * 5.0])
    expected[0, 1] = torch.tensor([0.5 * 3 + 0.5 * 9.0, 0.5 * 6 + 0.5 * 7.0])
    torch.testing.assert_close(out, expected)


def test_asks_counted_and_who_has_a_whole_profile():
    asked = np.array([[1, 0], [0, 0], [2, 0]])
    # block 1 was never asked of anybody: a client asked for block 0 has its whole profile
    np.testing.assert_array_equal(profiled_clients(asked), [True, False, True])
    asked = count_asks(asked, [(1, np.array([1, 2])), (0, np.array([1]))])
    np.testing.assert_array_equal(asked, [[1, 0], [1, 1], [2, 1]])
    # now block 1 was asked of someone: client 0 lacks it
    np.testing.assert_array_equal(profiled_clients(asked), [False, True, True])
    np.testing.assert_array_equal(profiled_clients(np.zeros((2, 3), np.int64)), [True, True])


def _algorithm(**options) -> tuple[CFLGP, Context]:
    """C = 4 clients, K = 2 models of d = 2 coordinates (a linear model: weight, bias)."""
    factory = ModelFactory(model_config({"name": "linear"}), (1,), 1)
    ctx = Context(backend=None, factory=factory,  # type: ignore[arg-type]  # never sent to
                  training=LocalTraining(lr=0.5, batch_size=4), n_clients=4,
                  train_sizes=np.full(4, 10), rng=np.random.default_rng(0), seed=0)
    alg = CFLGP(CFLGPConfig(n_clusters=2, period=1, stable_rounds=0, estimate_k=False,
                            **options))
    alg.setup(ctx)
    alg.state = replace(alg.state, models=torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
                        assign=np.array([0, 1, 0, 1]))
    return alg, ctx


def _reply(request: GradientRequest, grads: list[list[float]]) -> GradientReply:
    n = len(request.clients)
    return GradientReply(request.clients.copy(), torch.tensor(grads),
                         np.ones(n, np.int64), np.arange(n, dtype=np.float64))


@pytest.mark.parametrize("aggregation", ["mean", "sum"])
def test_one_clustering_round_from_hand_made_replies(aggregation):
    alg, ctx = _algorithm(gradient_aggregation=aggregation)
    state: CFLGPState = alg.state
    ask = alg.ask(state, 1, FIRST, ctx)
    assert isinstance(ask, CFLGPAsk) and ask.clustering and ask.kbar == 0
    own, probe = ask.request.steps  # every client at its model; θ_0 to clients 1 and 3
    np.testing.assert_array_equal(own.model_of_client, [0, 1, 0, 1])
    np.testing.assert_array_equal(probe.clients, [1, 3])
    assert torch.equal(probe.models, state.models[:1]) and ask.cluster_seed is not None
    g = [[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0]]  # client c's gradient at θ_{S(c)}
    reply = StepsReply(np.arange(4), [_reply(own, g), _reply(probe, [[5.0, 5.0], [7.0, 7.0]])])
    out = alg.update(state, 1, ask, reply)
    new, extras = out.state, out.extras
    assert out.then is None and new is not state
    # Alg. 1 line 4: θ_k −= γ · agg of its members' gradients (γ = lr = 0.5)
    if aggregation == "mean":
        step0, step1 = [(1 + 3) / 2, (0 + 0) / 2], [(0 + 0) / 2, (2 + 4) / 2]
    else:
        step0, step1 = [1 + 3, 0 + 0], [0 + 0, 2 + 4]
    expected = torch.tensor([[1 - 0.5 * step0[0], 2 - 0.5 * step0[1]],
                             [3 - 0.5 * step1[0], 4 - 0.5 * step1[1]]])
    torch.testing.assert_close(new.models, expected)
    assert torch.equal(state.models, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # not in place
    # lines 8–9, first visit (β = 1): block 0 is the vector at θ_0 — the update's own vector
    # for the members of cluster 0, the probe's for the others; block 1 is not asked yet
    torch.testing.assert_close(new.features[:, 0], torch.tensor(
        [[1.0, 0.0], [5.0, 5.0], [3.0, 0.0], [7.0, 7.0]]))
    assert torch.count_nonzero(new.features[:, 1]) == 0
    np.testing.assert_array_equal(new.asked, [[1, 0]] * 4)
    # line 10: {0, 2} along the first axis, {1, 3} on the diagonal; ids kept (matching)
    np.testing.assert_array_equal(new.assign, [0, 1, 0, 1])
    # Tables 5–6: 4 models down for the update + 2 for the probe, d floats up for each
    assert new.counts.models_down == 4 + 2 and new.counts.rounds == 1
    assert new.counts.uplink_floats_compressed == (4 + 2) * 2
    assert extras.models_down_per_client_period == (4 + 2) / 4
    assert extras.beta == 1.0 and extras.broadcast_model == 0
    assert extras.train_loss == (0 + 1 + 2 + 3) / 4


def test_a_silent_client_keeps_its_feature_and_is_left_out_of_the_step():
    alg, ctx = _algorithm()
    state = alg.state
    ask = alg.ask(state, 1, FIRST, ctx)
    _, probe = ask.request.steps
    # client 2 (cluster 0) did not answer: it is absent from the update's reply
    update = GradientReply(np.array([0, 1, 3]), torch.tensor([[1.0, 0.0], [0.0, 2.0],
                                                              [0.0, 4.0]]),
                           np.ones(3, np.int64), np.zeros(3))
    reply = StepsReply(np.arange(4), [update, _reply(probe, [[5.0, 5.0], [7.0, 7.0]])])
    new = alg.update(state, 1, ask, reply).state
    torch.testing.assert_close(new.models[0], torch.tensor([1 - 0.5 * 1.0, 2 - 0.5 * 0.0]))
    assert torch.count_nonzero(new.features[2]) == 0  # kept its (empty) feature
    np.testing.assert_array_equal(new.asked[:, 0], [1, 1, 1, 1])  # it was asked all the same
    assert new.counts.uplink_floats_compressed == (3 + 2) * 2  # what was received
