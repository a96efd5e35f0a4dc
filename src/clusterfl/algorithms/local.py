"""Local: every client trains only its own model; nothing is communicated."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context
from clusterfl.protocol import Predictor, TrainRequest
from clusterfl.robust.replies import answered, mean_finite


class LocalConfig(AlgorithmConfig):
    name: Literal["local"] = "local"


class Local(Algorithm):
    name = "local"
    Config = LocalConfig

    def setup(self, ctx: Context) -> None:
        init = ctx.factory.init(ctx.seed)
        self.models = init[None].repeat(ctx.n_clients, 1)

    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        clients = np.arange(len(self.models))
        reply = ctx.send(
            TrainRequest(clients, self.models, clients, ctx.training, ctx.next_seed(),
                         count_cost=False)
        )
        who = torch.from_numpy(answered(reply, clients))  # absent clients keep their model
        self.models = self.models.clone()
        self.models[who] = reply.params
        return {"train_loss": mean_finite(reply.loss)}

    def assignment(self) -> np.ndarray:
        return np.arange(len(self.models), dtype=np.int64)

    def n_clusters(self) -> int:
        return len(self.models)

    def predictor(self) -> Predictor:
        return Predictor.single(self.models, self.assignment())

    def state_dict(self) -> dict[str, Any]:
        return {"models": self.models.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = state["models"].clone()
