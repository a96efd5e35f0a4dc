"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2020): one global model.

Each round a sample of the clients (`fraction` or `per_round`, `SampledConfig`) trains
locally from the global model; the server sets the model to the sample-weighted mean of the
returned models (FedAvg Alg. 1). FedProx adds mu/2 ||w - w_global||² to every local
objective; FedAvg is FedProx with mu = 0. Clients not sampled take no part in the round.

Placing a client that did not train (`placement`): there is one model, so it joins cluster 0
and predicts with the global model (nothing is sent).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import LossExtras, Placement, SampledConfig
from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.protocol import Predictor, TrainReply, TrainRequest, mean_finite


class FedAvgConfig(SampledConfig):
    name: Literal["fedavg"] = "fedavg"
    display: ClassVar[str] = "FedAvg"


class FedProxConfig(FedAvgConfig):
    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]  # narrows the literal
    display: ClassVar[str] = "FedProx"
    mu: float = Field(0.01, ge=0.0, description="proximal weight")

    def ignored_settings(self) -> list[str]:
        return proximal_off(self.mu, "fedavg")


def proximal_off(mu: float, plain: str) -> list[str]:
    """FedProx (or FedProx+) with mu = 0: no proximal term, the run of `plain`, said."""
    return [] if mu != 0 else [f"algorithm.mu = 0 turns off the proximal term: the run is "
                               f"{plain}'s under another name (use name = {plain!r})"]


@dataclass
class FedAvgState:
    model: torch.Tensor  # [1, d]
    n_clients: int


class FedAvg(Algorithm[FedAvgConfig, FedAvgState]):
    name = "fedavg"
    Config = FedAvgConfig
    State = FedAvgState
    device_update = True  # one weighted mean, where the backend left the models

    def setup(self, ctx: Context) -> None:
        self.state = FedAvgState(ctx.factory.init(ctx.seed)[None], ctx.n_clients)

    def _mu(self) -> float:
        return 0.0

    def ask(self, state: FedAvgState, t: int, phase: str, ctx: Context) -> Ask[TrainReply]:
        """The sampled clients train from the global model."""
        clients = ctx.sample_round(self.config)
        training = replace(ctx.training, mu=self._mu()) if self._mu() else ctx.training
        return Ask(TrainRequest(clients, state.model, np.zeros(len(clients), np.int64),
                                training, ctx.next_seed()))

    def update(self, state: FedAvgState, t: int, ask: Ask[Any],
               reply: TrainReply) -> Update[FedAvgState]:
        """The sample-weighted mean of the returned models (kept when nobody answered)."""
        if not len(reply.clients):
            return Update(state, LossExtras(train_loss=None))
        model = weighted_mean(reply.params, reply.n_samples)[None]
        return Update(replace(state, model=model), LossExtras(train_loss=mean_finite(reply.loss)))

    def assignment(self) -> np.ndarray:
        return np.zeros(self.state.n_clients, dtype=np.int64)

    def predictor(self) -> Predictor:
        return Predictor.single(self.state.model, self.assignment())

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Cluster 0, the global model."""
        zeros = np.zeros(len(clients), dtype=np.int64)
        return Placement(np.asarray(clients, dtype=np.int64), zeros,
                         Predictor.single(self.state.model, zeros))


class FedProx(FedAvg):
    name = "fedprox"
    Config = FedProxConfig
    config: FedProxConfig

    def _mu(self) -> float:
        return float(self.config.mu)
