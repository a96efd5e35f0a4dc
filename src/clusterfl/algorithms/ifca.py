"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020, Alg. 1).

The server keeps K cluster models θ_1..θ_K. Each round a sample of the clients is drawn
(`fraction` or `per_round`); each receives all K models (a `LossRequest`, whose cost is the K
models sent down) and estimates its cluster identity ĵ = argmin_j F_i(θ_j), the least loss
on its training data. Then, per Alg. 1:

- model averaging (option II, the default): the client trains θ_ĵ locally and the server sets
  each θ_j to the sample-weighted mean of the returned models of the clients that chose j;
- gradient averaging (option I): the client returns ∇F_i(θ_ĵ) and the server steps
  θ_j ← θ_j − γ · (sample-weighted mean of the gradients of the clients that chose j).

Models nobody chose this round are kept. The method also serves as the IFCA baseline of CAM
(Ma et al. 2023), CFL-GP (Kim et al. 2024; gradient averaging on one minibatch) and FLT
(Jamali-Rad et al. 2022; FedAvg initialisation).

Options and the choices the paper leaves open:
- `weight_sharing`: every layer but the last is shared by all clusters (IFCA §5); the shared
  part is averaged over all participants, the last layer per cluster. The shared part is then
  sent once per client, so the downlink cost books it once (d_shared + K · d_last).
- `assign_by = "accuracy"`: argmax of training accuracy, as some published code does (ties are
  broken by the lower loss). The paper's criterion is the loss.
- `warmup_rounds`: β rounds of FedAvg on one model first (the FEMNIST recipe IFCA and FLT
  use; neither paper says how the K models are then derived from the warm one). Our choice:
  the warm model is a model of its own (initialised from `seed`), none of the K; after the
  warm-up every cluster model takes the warm model's parameters except its last layer, which
  keeps its own independent initialisation (seeds seed+1..seed+K, the cluster models of
  IFCA-CAM, whose Θ_g is likewise initialised from `seed`). So no cluster is favoured: the K
  heads are exchangeable with respect to the warm body. (Until issue 25 the warm model began
  as cluster 0's model, so the body had co-adapted with cluster 0's initial head; with a small
  lr the head hardly moves during warm-up, and cluster 0 then won every client — at the
  paper's CAM scale all 200 clients from the first clustering round.) The warm model's own
  last layer is not used afterwards.
- Initialisation: K independent PyTorch default initialisations (seeds seed..seed+K−1; with
  a warm-up seed+1..seed+K, see above).
- Weights: averages are weighted by client sample counts (Alg. 1 averages uniformly; the two
  agree when clients hold equal amounts of data, as in IFCA's experiments).
- Gradient step: the paper writes γ/m Σ_{i∈S_j} g_i with m the number of all machines; we use
  the mean over the cluster's clients with γ = `server_lr` (default: the [train] lr), which is
  what CFL-GP's experiments and code do.
- Clients not sampled keep their last cluster; a client never sampled has cluster -1 and is
  served by model 0 in evaluation.
- Clients absent from a reply (dropped out, or rejected by the guard: NaN/Inf parameters or
  gradients, absurd norms; `clusterfl.robust`) keep their cluster and are left out of that
  round's averages.
- Communication: the K models go down once per round, with the loss request; the training
  (or gradient) request that follows reuses them (`models_held`), so a client costs K·d down
  (d_shared + K·d_last with weight sharing) and d up (K losses besides).
- One message per client and round (issue 26): the loss request and the update travel
  together as a `protocol.Steps` whose second step takes its model by a `Pick` of the first
  (the client computes the K losses, takes ĵ, trains θ_ĵ: Alg. 1's client step as written).
  The server applies the same rule (`choose_clusters`) to the returned losses to know ĵ;
  results and booked costs are those of the two separate requests.

Placing a client that did not train (`placement`): the paper's own cluster identity estimate
(Alg. 1, ĵ = argmin_j F_i(θ_j)): one `LossRequest` with the K models, the least training loss
(or `assign_by = "accuracy"`), and the client predicts with θ_ĵ. During the warm-up nobody has
a cluster: the placed client gets -1 and the warm FedAvg model, as every trained client.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    KClusterExtras,
    Placement,
    SampledConfig,
    answered,
    check_k_fits,
    check_warmup_leaves_rounds,
    one_cluster_ignores,
)
from clusterfl.clustering.aggregate import (
    average_members,
    choose_clusters,
    cluster_sizes,
    weighted_mean,
)
from clusterfl.models.params import last_layer_mask
from clusterfl.protocol import (
    GradientReply,
    GradientRequest,
    LossReply,
    LossRequest,
    Pick,
    Predictor,
    Steps,
    StepsReply,
    TrainReply,
    TrainRequest,
    mean_finite,
)


class IFCAConfig(SampledConfig):
    """Settings of IFCA (`[algorithm] name = "ifca"`)."""

    name: Literal["ifca"] = "ifca"
    display: ClassVar[str] = "IFCA"
    n_clusters: int = Field(5, ge=1, description="K, the number of cluster models")
    averaging: Literal["model", "gradient"] = Field(
        "model", description="Alg. 1 option II (local training, model averaging) or option I "
        "(one gradient per client, gradient averaging)")
    assign_by: Literal["loss", "accuracy"] = Field(
        "loss", description="cluster estimate: least training loss (paper) or highest "
        "training accuracy (some published code)")
    weight_sharing: bool = Field(
        False, description="share every layer but the last among all clusters")
    warmup_rounds: int = Field(
        0, ge=0, description="rounds of FedAvg on one model before clustering starts")
    gradient_batch_size: int | None = Field(
        None, ge=1, description="gradient averaging: minibatch per client (None: all its data)")
    server_lr: float | None = Field(
        None, gt=0.0, description="gradient averaging step γ (None: the [train] lr)")

    @model_validator(mode="after")
    def _gradient_options(self) -> IFCAConfig:
        """The two options of option I are refused with option II, which never reads them."""
        for option in ("server_lr", "gradient_batch_size"):
            if self.averaging == "model" and getattr(self, option) is not None:
                raise ValueError(f"{option} only applies to averaging = 'gradient' (option "
                                 "I); averaging = 'model' trains locally with [train]")
        return self

    def sample_counts(self) -> dict[str, tuple[int, str]]:
        if self.gradient_batch_size is None:
            return {}
        return {"gradient_batch_size": (self.gradient_batch_size, "each gradient takes all of "
                                        "a client's samples (as gradient_batch_size unset)")}

    def ignored_settings(self) -> list[str]:
        """With K = 1 the cluster estimate has one choice and every layer is shared anyway."""
        return one_cluster_ignores(self, ("assign_by", "weight_sharing"))


@dataclass(kw_only=True)
class IFCAExtras(KClusterExtras):
    """IFCA's per-round extras (every round, warm-up included)."""

    train_loss: float | None = None  # mean local loss of the answering clients
    assign_loss: float | None = None  # mean loss of the chosen models (None: warm-up)


@dataclass
class IFCAState:
    models: torch.Tensor  # [K, d], the cluster models θ_1..θ_K
    assign: np.ndarray  # [n_clients], last estimated cluster (-1: never sampled)
    warm: torch.Tensor | None  # [d], the FedAvg model during warm-up, None after


#: the phase of a warm-up round (FedAvg on the warm model)
WARMUP = "warmup"

# ----------------------------------------------------------------------------- IFCA


class IFCA(Algorithm[IFCAConfig, IFCAState]):
    """IFCA (Ghosh et al. 2020): K models, least-loss cluster identity, per-cluster averaging."""

    name = "ifca"
    Config = IFCAConfig
    State = IFCAState
    device_update = True  # per-cluster means where the backend left the models

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_clusters, n_clients)
        check_warmup_leaves_rounds(self.config.warmup_rounds, rounds, "FedAvg")

    def setup(self, ctx: Context) -> None:
        cfg = self.config
        self.fits(ctx.n_clients, ctx.rounds)
        warm = ctx.factory.init(ctx.seed) if cfg.warmup_rounds > 0 else None
        # with a warm-up, the warm model is none of the K (module docstring: no cluster favoured)
        models = ctx.factory.init_many(cfg.n_clusters, ctx.seed + (warm is not None))
        self.head = last_layer_mask(ctx.factory.layout)
        self.shared = ~self.head if cfg.weight_sharing else None
        if self.shared is not None:
            models[:, self.shared] = models[0, self.shared]
        self.server_lr = cfg.server_lr if cfg.server_lr is not None else ctx.training.lr
        self.state = IFCAState(models, np.full(ctx.n_clients, -1, dtype=np.int64), warm)

    # ------------------------------------------------------------------ rounds
    def ask(self, state: IFCAState, t: int, phase: str, ctx: Context) -> Ask[Any]:
        """Warm-up: the sampled clients train the warm model. Then one message: the K losses,
        and the update at the least-loss model (`Pick`: model averaging trains θ_ĵ, gradient
        averaging takes ∇F_i(θ_ĵ))."""
        cfg = self.config
        clients = ctx.sample_round(cfg)
        zeros = np.zeros(len(clients), np.int64)
        if self._warming(state, t):
            assert state.warm is not None
            return Ask(TrainRequest(clients, state.warm[None], zeros, ctx.training,
                                    ctx.next_seed()), WARMUP)
        shared = 0 if self.shared is None else int(self.shared.sum())
        update: TrainRequest | GradientRequest
        if cfg.averaging == "model":  # `model_of_client` is filled in by the `Pick`
            update = TrainRequest(clients, state.models, zeros, ctx.training, ctx.next_seed(),
                                  models_held=True)
        else:
            update = GradientRequest(clients, state.models, zeros, cfg.gradient_batch_size,
                                     ctx.next_seed(), models_held=True)
        ask = LossRequest(clients, state.models, shared_coords=shared)
        return Ask(Steps.of(ask, update, picks=[Pick(1, 0, cfg.assign_by)]))

    def update(self, state: IFCAState, t: int, ask: Ask[Any], reply: Any) -> Update[IFCAState]:
        if ask.phase == WARMUP:
            return self._warm_update(state, t, reply)
        steps = cast(StepsReply, reply)
        losses, update = cast(tuple[LossReply, TrainReply | GradientReply], steps.replies)
        chosen = choose_clusters(losses.loss, losses.accuracy, self.config.assign_by)
        assign = state.assign.copy()
        assign[losses.clients] = chosen  # what each client picked (`Pick` applies this rule)
        members = assign[update.clients]  # dropped clients are absent from every reply
        if self.config.averaging == "model":  # option II: per-cluster weighted model averaging
            params = cast(TrainReply, update).params
            models = average_members(state.models, params, members, update.n_samples,
                                     self.shared)
        else:  # option I: θ_j ← θ_j − γ · mean gradient of C_j
            grads = cast(GradientReply, update).grads
            mean = average_members(torch.zeros_like(state.models), grads, members,
                                   update.n_samples, self.shared)
            models = state.models - self.server_lr * mean
        extras = IFCAExtras(
            train_loss=mean_finite(update.loss),
            assign_loss=mean_finite(losses.loss[np.arange(len(losses.clients)), chosen]),
            cluster_sizes=cluster_sizes(assign, self.config.n_clusters), warmup=0)
        return Update(replace(state, models=models, assign=assign), extras)

    def _warming(self, state: IFCAState, t: int) -> bool:
        return state.warm is not None and t <= self.config.warmup_rounds

    def _warm_update(self, state: IFCAState, t: int, reply: TrainReply) -> Update[IFCAState]:
        """FedAvg on the warm model; on the last warm-up round the K cluster models take its
        body (every layer but the last) and keep their own independent heads."""
        assert state.warm is not None
        warm = weighted_mean(reply.params, reply.n_samples) if len(reply.clients) else state.warm
        models: torch.Tensor = state.models
        if t == self.config.warmup_rounds:
            body = (~self.head).to(state.models.device)
            models = state.models.clone()
            models[:, body] = warm[body]
        new = replace(state, models=models,
                      warm=None if t == self.config.warmup_rounds else warm)
        return Update(new, IFCAExtras(train_loss=mean_finite(reply.loss), assign_loss=None,
                                      cluster_sizes=cluster_sizes(state.assign,
                                                                  self.config.n_clusters),
                                      warmup=1))

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.state.assign.copy()

    def predictor(self) -> Predictor:
        st = self.state
        if st.warm is not None:
            return Predictor.single(st.warm[None], np.zeros(len(st.assign), np.int64))
        return Predictor.single(st.models, np.maximum(st.assign, 0))

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Least training loss over the K models (`assign_by`), as in every round (module
        doc); a client that does not answer gets -1 and model 0."""
        st, cfg = self.state, self.config
        ids = np.asarray(clients, dtype=np.int64)
        if st.warm is not None:  # warm-up: one model, no clusters yet
            return Placement.nowhere(ids, st.warm[None])
        shared = 0 if self.shared is None else int(self.shared.sum())
        losses = ctx.send(LossRequest(ids, st.models, shared_coords=shared))
        chosen = choose_clusters(losses.loss, losses.accuracy, cfg.assign_by)
        clusters = answered(ids, losses.clients, chosen)
        loss = answered(ids, losses.clients, losses.loss, np.nan)
        details = [{"losses": [round(float(v), 5) for v in row]} for row in loss]
        return Placement.by_cluster(ids, clusters, st.models, details)


__all__ = ["IFCA", "IFCAConfig", "IFCAExtras", "IFCAState"]
