"""Local: every client trains only its own model; nothing is communicated.

The models live on the devices (`keep_local`, `models_held`: no floats booked); in
simulation the server holds them for the devices, to continue and to evaluate them.

Sampling (our choice, `SampledConfig`): each round the sampled clients (`fraction` or
`per_round`; all by default) train their own model; the others keep theirs unchanged, as a
client that is offline would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from clusterfl.algorithms.base import Algorithm, Context, SampledConfig
from clusterfl.protocol import Predictor, TrainRequest, mean_finite


class LocalConfig(SampledConfig):
    name: Literal["local"] = "local"
    display: ClassVar[str] = "Local"


@dataclass
class LocalState:
    models: torch.Tensor  # [n_clients, d], client i's own model in row i


class Local(Algorithm[LocalConfig, LocalState]):
    name = "local"
    Config = LocalConfig
    State = LocalState

    def setup(self, ctx: Context) -> None:
        init = ctx.factory.init(ctx.seed)
        self.state = LocalState(init[None].repeat(ctx.n_clients, 1))

    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        models = self.state.models
        clients = ctx.sample_round(self.config)  # row i of `models` is client i's model
        reply = ctx.send(TrainRequest(clients, models, clients, ctx.training, ctx.next_seed(),
                                      models_held=True, keep_local=True))
        models = models.clone()  # clients not sampled or absent keep their model
        models[torch.from_numpy(reply.clients)] = reply.params
        self.state.models = models
        return {"train_loss": mean_finite(reply.loss)}

    def assignment(self) -> np.ndarray:
        return np.arange(len(self.state.models), dtype=np.int64)

    def n_clusters(self) -> int:
        return len(self.state.models)

    def predictor(self) -> Predictor:
        return Predictor.single(self.state.models, self.assignment())
