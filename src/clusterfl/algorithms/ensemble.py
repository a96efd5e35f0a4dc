"""FedAvg+ and FedProx+: the ensemble baselines of CAM (Ma et al. 2023, §5 "Ensemble FL").

"We train FedAvg and FedProx K times and then learn an ensemble model via soft voting to
serve all clients." The server keeps K global models from K independent initialisations
(seeds seed..seed+K−1); every round each model runs one FedAvg (McMahan et al. 2017, Alg. 1)
or FedProx (Li et al. 2020; local objective + μ/2 ||w − w_global||²) round of its own, with
its own client sample and its own local minibatch order, as K separate runs would. Every
client predicts with the mean of the K models' softmax outputs (`"mean_probs"`).

Choices left open: the K runs share the round loop (one round of each per round) and the
sampling rule (`fraction` or `per_round`; each model draws its own sample);
sample-weighted averaging as in FedAvg; μ defaults to 0.01 like FedProx here. The K
trainings of a round reach a client in one message (`protocol.Steps`, issue 26): a client
sampled for several models trains each of them in turn, exactly as the separate requests.
Clients absent from a reply (dropped out, or rejected by the guard, e.g. NaN/Inf parameters)
are left out of the averages.

On a GPU the K weighted means are built where the backend left the trained models
(`device_update`); the K models come back to the CPU between rounds.

Placing a client that did not train (`placement`): cluster 0 and the K-model ensemble, as
every client (nothing is sent).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import Placement, SampledConfig
from clusterfl.algorithms.fedavg import proximal_off
from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.protocol import Predictor, Steps, StepsReply, TrainReply, TrainRequest, mean_finite
from clusterfl.records import RoundExtras


class FedAvgPlusConfig(SampledConfig):
    """Settings of FedAvg+ (`[algorithm] name = "fedavg_plus"`)."""

    name: Literal["fedavg_plus"] = "fedavg_plus"
    display: ClassVar[str] = "FedAvg+"
    n_models: int = Field(5, ge=1, description="K, the number of independent global models")


class FedProxPlusConfig(FedAvgPlusConfig):
    """Settings of FedProx+ (`[algorithm] name = "fedprox_plus"`)."""

    name: Literal["fedprox_plus"] = "fedprox_plus"  # type: ignore[assignment]  # narrows the literal
    display: ClassVar[str] = "FedProx+"
    mu: float = Field(0.01, ge=0.0, description="proximal weight μ")

    def ignored_settings(self) -> list[str]:
        return proximal_off(self.mu, "fedavg_plus")


@dataclass(kw_only=True)
class EnsembleExtras(RoundExtras):
    """The mean local loss of each of the K runs' samples (None where nobody answered)."""

    train_loss: list[float | None] = field(default_factory=list)


@dataclass
class EnsembleState:
    models: torch.Tensor  # [K, d], the K global models
    n_clients: int


class FedAvgPlus(Algorithm[FedAvgPlusConfig, EnsembleState]):
    """K independent FedAvg runs, served as one soft-voting ensemble."""

    name = "fedavg_plus"
    Config = FedAvgPlusConfig
    State = EnsembleState
    device_update = True  # the K weighted means where the backend left the models

    def setup(self, ctx: Context) -> None:
        self.state = EnsembleState(ctx.factory.init_many(self.config.n_models, ctx.seed),
                                   ctx.n_clients)

    def _mu(self) -> float:
        return 0.0

    def ask(self, state: EnsembleState, t: int, phase: str, ctx: Context) -> Ask[StepsReply]:
        """K independent samples (a client may be in several), one message per client."""
        training = replace(ctx.training, mu=self._mu()) if self._mu() else ctx.training
        requests = []
        for k in range(len(state.models)):
            clients = ctx.sample_round(self.config)
            requests.append(TrainRequest(clients, state.models[k : k + 1],
                                         np.zeros(len(clients), np.int64), training,
                                         ctx.next_seed()))
        return Ask(Steps.of(*requests))

    def update(self, state: EnsembleState, t: int, ask: Ask[Any],
               reply: StepsReply) -> Update[EnsembleState]:
        """Model k becomes the weighted mean of its own sample's models (kept if none)."""
        new = state.models.clone()
        for k, part in enumerate(cast(list[TrainReply], reply.replies)):
            if len(part.clients):
                new[k] = weighted_mean(part.params, part.n_samples)
        losses = [mean_finite(part.loss) for part in reply.replies]
        return Update(replace(state, models=new), EnsembleExtras(train_loss=losses))

    def assignment(self) -> np.ndarray:
        return np.zeros(self.state.n_clients, dtype=np.int64)

    def predictor(self) -> Predictor:
        k = len(self.state.models)
        members = np.tile(np.arange(k, dtype=np.int64), (self.state.n_clients, 1))
        return Predictor(self.state.models, members, "mean_probs")

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Cluster 0, the soft-voting ensemble of the K models."""
        ids = np.asarray(clients, dtype=np.int64)
        members = np.tile(np.arange(len(self.state.models), dtype=np.int64), (len(ids), 1))
        return Placement(ids, np.zeros(len(ids), dtype=np.int64),
                         Predictor(self.state.models, members, "mean_probs"))


class FedProxPlus(FedAvgPlus):
    """K independent FedProx runs, served as one soft-voting ensemble."""

    name = "fedprox_plus"
    Config = FedProxPlusConfig
    config: FedProxPlusConfig

    def _mu(self) -> float:
        return float(self.config.mu)


__all__ = ["FedAvgPlus", "FedAvgPlusConfig", "FedProxPlus", "FedProxPlusConfig"]
