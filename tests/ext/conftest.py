"""Small data and a module of one's own (model, method, loader, tracker) for the extension
tests; everything is made here, offline."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

from clusterfl.data.federation import Federation

BASE = {
    "seed": 0, "rounds": 3, "eval_every": 1, "checkpoint_every": 0,
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.2, "batch_size": 16, "epochs": 2},
    "output": {"figures": False, "progress": "off"},
}

MODULE = '''
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field
from torch import nn

from clusterfl.algorithms import Algorithm, AlgorithmConfig, Ask, Update
from clusterfl.data.federation import Federation
from clusterfl.data.sources import Source
from clusterfl.protocol import Predictor, TrainRequest, mean_finite
from clusterfl.records import RoundExtras


class TinyNet(nn.Module):
    def __init__(self, input_shape, n_outputs, width=8):
        super().__init__()
        d = int(np.prod(input_shape))
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(d, width), nn.ReLU(),
                                 nn.Linear(width, n_outputs))

    def forward(self, x):
        return self.net(x)


def not_a_module(input_shape, n_outputs):
    return 3


class DampedConfig(AlgorithmConfig):
    display: ClassVar[str] = "Damped"
    step: float = Field(0.5, gt=0.0, le=1.0)


@dataclass(kw_only=True)
class DampedExtras(RoundExtras):
    train_loss: float | None = None
    step: float = 1.0


@dataclass
class DampedState:
    model: torch.Tensor
    n_clients: int


class Damped(Algorithm[DampedConfig, DampedState]):
    """FedAvg that moves only `step` of the way to the clients' mean."""

    name = "damped"
    Config = DampedConfig
    State = DampedState

    def setup(self, ctx):
        self.state = DampedState(ctx.factory.init(ctx.seed)[None], ctx.n_clients)

    def ask(self, state, t, phase, ctx):
        clients = np.arange(ctx.n_clients)
        return Ask(TrainRequest(clients, state.model, np.zeros(len(clients), np.int64),
                                ctx.training, ctx.next_seed()))

    def update(self, state, t, ask, r):
        model = state.model
        if len(r.clients):
            w = torch.as_tensor(r.n_samples, dtype=r.params.dtype)[:, None]
            mean = (r.params * w).sum(0) / w.sum()
            model = model + self.config.step * (mean - model)
        return Update(DampedState(model, state.n_clients),
                      DampedExtras(train_loss=mean_finite(r.loss), step=self.config.step))

    def assignment(self):
        return np.zeros(self.state.n_clients, np.int64)

    def predictor(self):
        return Predictor.single(self.state.model, self.assignment())


def blobs(n_clients=6, seed=0, pooled=False):
    """Two groups of clients whose labels are opposite functions of the inputs."""
    rng = np.random.default_rng(seed)
    clients = []
    for i in range(n_clients):
        x = rng.normal(size=(60, 6)).astype(np.float32)
        sign = 1.0 if i < n_clients // 2 else -1.0
        y = (sign * x[:, 0] > 0).astype(np.int64)
        clients.append((x[:45], y[:45], x[45:], y[45:]))
    if pooled:
        x = np.concatenate([c[0] for c in clients]); y = np.concatenate([c[1] for c in clients])
        xt = np.concatenate([c[2] for c in clients]); yt = np.concatenate([c[3] for c in clients])
        return Source(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt),
                      torch.from_numpy(yt), 2, "classification", "blobs")
    groups = [0] * (n_clients // 2) + [1] * (n_clients - n_clients // 2)
    return Federation.from_clients(clients, clusters=groups, name="blobs")


class Recorder:
    rounds = []

    def on_round_end(self, record):
        Recorder.rounds.append(record.round)
'''


@pytest.fixture
def own_module(tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module `ownstuff` (model, method, loaders, tracker) importable from a temp folder
    (not the test's tmp_path, which stays empty for run directories)."""
    folder = tmp_path_factory.mktemp("pkg")
    (folder / "ownstuff.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    yield "ownstuff"
    sys.modules.pop("ownstuff", None)


def two_group_clients(n_clients: int = 6, seed: int = 0) -> tuple[list, list[int]]:
    rng = np.random.default_rng(seed)
    clients = []
    for i in range(n_clients):
        x = rng.normal(size=(60, 6)).astype(np.float32)
        sign = 1.0 if i < n_clients // 2 else -1.0
        y = (sign * x[:, 0] > 0).astype(np.int64)
        clients.append((x[:45], y[:45], x[45:], y[45:]))
    return clients, [0] * (n_clients // 2) + [1] * (n_clients - n_clients // 2)


def blob_federation(n_clients: int = 6) -> Federation:
    clients, groups = two_group_clients(n_clients)
    return Federation.from_clients(clients, clusters=groups, name="blobs")
