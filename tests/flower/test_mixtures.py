"""FedEM's and FedSoft's messages on the Flower backend: the mixture requests and the proximal
mix round-trip the wire format exactly, a client's view keeps its own rows only, and whole
runs on the in-process Grid end like the in-process runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.backends.flower import codec
from clusterfl.deploy.server_app import FINAL_STATE, run_on_grid
from clusterfl.experiment import Experiment
from clusterfl.protocol import (
    BestCountReply,
    BestCountRequest,
    LocalTraining,
    MixtureFitReply,
    MixtureFitRequest,
    MixtureTrainReply,
    MixtureTrainRequest,
    Predictor,
    TrainRequest,
    join,
    subset,
)
from tests.flower.conftest import BASE, FakeGrid
from tests.flower.test_codec import _same

TR = LocalTraining(lr=0.1, batch_size=8, epochs=1, mu=0.2)


def _messages() -> list:
    models = torch.randn(3, 20)
    clients = np.arange(4)
    pi = np.random.default_rng(0).dirichlet(np.ones(3), 4)
    return [
        MixtureTrainRequest(clients, models, pi, TR, seed=3),
        MixtureTrainReply(clients, torch.randn(4, 3, 20), np.array([5, 6, 7, 8]),
                          np.array([0.1, 0.2, np.nan, 0.4]), pi),
        MixtureFitRequest(clients, models, pi, iterations=4, split="test"),
        MixtureFitReply(clients, pi, np.arange(4.0), np.array([5, 6, 7, 8])),
        BestCountRequest(clients, models),
        BestCountReply(clients, np.arange(12).reshape(4, 3), np.array([5, 6, 7, 8])),
        TrainRequest(clients, torch.randn(4, 20), clients, TR, 1, models_held=True,
                     prox_models=models, prox_weights=pi * 1.5, prox_held=True),
        Predictor(models, np.tile(np.arange(3), (4, 1)), "mean_probs", pi),
    ]


def test_mixture_messages_round_trip_exactly():
    for msg in _messages():
        _same(codec.decode(*codec.encode(msg)), msg)
        back, _ = codec.from_recorddict(codec.to_recorddict(msg))
        _same(back, msg)


def test_a_client_view_keeps_its_own_weights():
    for msg in _messages():
        view = subset(msg, [2])
        for name in ("weights", "prox_weights"):
            if getattr(msg, name, None) is not None:
                np.testing.assert_array_equal(getattr(view, name), getattr(msg, name)[2:3])
        if hasattr(msg, "models"):
            assert torch.equal(view.models, msg.models)  # the shared stack travels whole
    reply = _messages()[1]
    parts = [subset(reply, [3]), subset(reply, [0, 1]), subset(reply, [2])]
    _same(join(parts, order=reply.clients), reply)


@pytest.mark.parametrize("algo", [{"name": "fedem", "n_components": 2},
                                  {"name": "fedsoft", "n_clusters": 2, "per_cluster": 2}],
                         ids=["fedem", "fedsoft"])
def test_flower_run_equals_inprocess_run(algo, tmp_path):
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    history = run_on_grid(grid, {**BASE, "algorithm": algo}, out_dir=tmp_path)
    exp = Experiment.from_config({**BASE, "algorithm": algo})
    summary = exp.run(progress=False).summary
    assert history.summary.assignment == summary.assignment
    assert history.final.metrics is not None and summary.final.metrics is not None
    assert history.final.metrics.accuracy == pytest.approx(summary.final.metrics.accuracy,
                                                           abs=1e-6)
    ours = torch.load(tmp_path / FINAL_STATE, weights_only=False)
    ref = exp.algorithm.state_dict()
    tensors = [k for k, v in ref.items() if isinstance(v, torch.Tensor)]
    assert tensors
    for k in tensors:
        torch.testing.assert_close(ours[k], ref[k], rtol=1e-5, atol=1e-6)
