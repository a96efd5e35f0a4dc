"""CAM, clustered additive modeling (Ma et al. 2023, "Structured federated learning through
clustered additive modeling", §3, Algorithm 1 Fed-CAM): IFCA-CAM and FeSEM-CAM.

A client of cluster k predicts with h(x; Θ_g) + f(x; Θ_k) in logit space (Eq. 1; the
`"sum_logits"` predictor). Every round, from one cluster assignment, each selected client runs
two local trainings in parallel (Alg. 1 lines 4-7; FedSim):
- θ_i from Θ_c(i) with Θ_g frozen (Eq. 5; FeSEM-CAM Eq. 13 adds the pull λ toward Θ_c(i)),
- θ_i^0 from Θ_g with Θ_c(i) frozen (Eq. 8 / 15),
each as a `TrainRequest` whose `offset` is the frozen other part. The server averages θ^0
into Θ_g by sample weight over all selected clients (Eq. 9) and updates the cluster models:

- IFCA-CAM (§3.1): the assignment is the least training loss of the *sum* (Eq. 2), computed
  before training with a `LossRequest` carrying Θ_g as offset; Θ_k moves by Eq. 6,
  Θ_k ← (1 − Σ_{i∈C_k} n_i/n) Θ_k + Σ_{i∈C_k} (n_i/n) θ_i, n the samples of all selected
  clients (`cluster_update = "eq6"`), or to the members' weighted mean ("mean", IFCA's rule).
  Warm-up (Alg. 1): β rounds of FedAvg train Θ_g alone.
- FeSEM-CAM (§3.2): after training, weighted k-means on the uploaded θ_i (Eq. 10-11, a few
  Lloyd iterations from the current Θ_1..K) gives the next assignment and Θ_k = the members'
  weighted mean. Warm-up (Alg. 1): β rounds of local training only (each client continues its
  own model from one common initialisation, no communication), then k-means with k-means++
  restarts on those models gives the first Θ_1..K and assignment.

Choices the paper leaves open, and ours:
- Warm-up length β: `warmup_rounds`, default 30 of the 100 rounds (§5 "including 30 warm-up
  rounds"); warm-up rounds count toward the run's rounds. FeSEM-CAM's "β epochs" are read as
  β rounds of the configured local training.
- Layers FeSEM-CAM's k-means reads: default "linear", the fully-connected layers (§5), settable
  like FeSEM's `kmeans_layers`; centers are always full-model means.
- λ: default 0.01 (§5 picks from {0.001, 0.01, 0.1} per experiment). Eq. 13 also scales the
  loss gradient by n_i/n; we train the usual mean loss plus λ/2 ||θ_i − Θ_c(i)||², i.e. the
  same objective with λ rescaled by n/n_i, so λ means what it means in FeSEM and FedProx.
- Eq. 15 writes f(X_i; θ_i^0), a typo: Θ_g's local training uses the frozen cluster part,
  which at the start of the round is θ_i = Θ_c(i) (Alg. 1 line 4), exactly as in IFCA-CAM.
- Initialisation: Θ_g and Θ_1..K independent PyTorch default initialisations.
- Communication per selected client and round: Θ_g and the K cluster models down (IFCA-CAM,
  with the loss request; FeSEM-CAM sends Θ_g and Θ_c(i) with the first training request),
  θ_i and θ_i^0 up. The second training request reuses what the client already holds
  (`models_held`).
- A client not yet assigned (partial participation): IFCA-CAM predicts it with Θ_g plus an
  all-zero cluster model, i.e. h(x; Θ_g) alone for the built-in models (whose last layer is
  linear); FeSEM-CAM uses FeSEM's common start Θ_0 as its cluster part (for training and
  prediction) until k-means assigns it. After FeSEM-CAM's warm-up every client is assigned.
- Sampling (`fraction` or `per_round`, `SampledConfig`): the clients of a round — IFCA-CAM's
  warm-up included — are one sample; clients not sampled keep their cluster. FeSEM-CAM's
  warm-up is FeSEM's: local training of every client, then every client's model for the
  first k-means (see `clusterfl.algorithms.fesem`).
- Clients absent from a reply (dropped out, or rejected by the guard — NaN/Inf parameters,
  absurd norms; `clusterfl.robust`) are left out of every average and keep their cluster.

Placing a client that did not train (`placement`, both methods): the least training loss of
the sum h(x; Θ_g) + f(x; Θ_k) over the K cluster parts (Eq. 2, one `LossRequest` with Θ_g as
the offset), and the client predicts with Θ_g + Θ_k̂ (Eq. 1). For IFCA-CAM this is the paper's
own assignment step. For FeSEM-CAM it is our choice: its paper assigns trained clients by
k-means on their uploaded cluster parts, which a newcomer does not have; the loss of the
additive model it will be served with is the criterion that needs no training. Before any
cluster exists (IFCA-CAM's warm-up: Θ_g alone; FeSEM-CAM's warm-up: clients' own local
models) the client gets -1 and Θ_g alone (IFCA-CAM) or FeSEM's common start Θ_0 (FeSEM-CAM).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    KClusterExtras,
    Placement,
    SampledConfig,
    answered,
    check_k_fits,
    check_warmup_leaves_rounds,
)
from clusterfl.algorithms.fesem import (
    KMEANS,
    WARMUP,
    FeSEM,
    FeSEMAsk,
    FeSEMConfig,
    FeSEMState,
    KMeansExtras,
    LayerSpec,
)
from clusterfl.clustering.aggregate import (
    average_members,
    choose_clusters,
    cluster_sizes,
    weighted_mean,
)
from clusterfl.protocol import (
    LossRequest,
    Pick,
    Predictor,
    Steps,
    StepsReply,
    TrainReply,
    TrainRequest,
    mean_finite,
)
from clusterfl.records import RoundExtras

# ----------------------------------------------------------------------------- shared parts


@dataclass(kw_only=True)
class CAMExtras(KClusterExtras):
    """What both CAM methods write: IFCA-CAM in every round, FeSEM-CAM after its warm-up."""

    train_loss_cluster: float | None = None  # mean loss training θ_i, Θ_g frozen (None: warm-up)
    train_loss_global: float | None = None  # mean loss training θ_i^0, cluster part frozen


def train_both(
    ctx: Context, clients: np.ndarray, global_model: torch.Tensor, rows: torch.Tensor,
    row_of: np.ndarray, mu: float = 0.0, held: bool = False,
) -> tuple[TrainRequest, TrainRequest]:
    """Alg. 1 lines 4-7: θ_i from rows[row_of[i]] with Θ_g frozen, θ_i^0 from Θ_g with the
    cluster part frozen. The first request carries Θ_g and the client's cluster model down
    unless the clients already hold them (`held`: IFCA-CAM sent them with its loss request);
    the second reuses them. The two requests (sent together as one `Steps`, one message per
    client) are returned."""
    n = len(clients)
    zeros = np.zeros(n, dtype=np.int64)
    cluster_training = replace(ctx.training, mu=mu) if mu else ctx.training
    req_k = TrainRequest(clients, rows, row_of, cluster_training, ctx.next_seed(),
                         offset=Predictor.single(global_model[None], zeros), models_held=held)
    req_g = TrainRequest(clients, global_model[None], zeros, ctx.training, ctx.next_seed(),
                         offset=Predictor.single(rows, row_of), models_held=True)
    return req_k, req_g


def update_global(global_model: torch.Tensor, reply: TrainReply) -> torch.Tensor:
    """Eq. 9: Θ_g ← Σ_i (n_i/n) θ_i^0 over the answering clients (kept if none)."""
    if not len(reply.clients):
        return global_model
    return weighted_mean(reply.params, reply.n_samples)


def eq6_update(models: torch.Tensor, params: torch.Tensor, groups: np.ndarray,
               weights: np.ndarray) -> torch.Tensor:
    """Eq. 6: Θ_k ← (1 − Σ_{i∈C_k} n_i/n) Θ_k + Σ_{i∈C_k} (n_i/n) θ_i, n = Σ_i n_i (all rows)."""
    out = models.clone()
    w = np.asarray(weights, dtype=np.float64)
    total = w.sum()
    if len(params) == 0 or total <= 0:
        return out
    for k in np.unique(groups):
        sel = groups == k
        share = torch.as_tensor(w[sel] / total, dtype=params.dtype, device=params.device)
        rows = torch.from_numpy(np.flatnonzero(sel)).to(params.device)
        delta = params[rows] - models[int(k)]
        out[int(k)] = models[int(k)] + (share[:, None] * delta).sum(0)
    return out


def cam_predictor(global_model: torch.Tensor, rows: torch.Tensor,
                  row_of: np.ndarray) -> Predictor:
    """Eq. 1: client i combines Θ_g and rows[row_of[i]] by adding their logits."""
    models = torch.cat([global_model[None], rows])
    members = np.stack([np.zeros(len(row_of), np.int64), 1 + np.asarray(row_of)], axis=1)
    return Predictor(models, members.astype(np.int64), "sum_logits")


def place_by_sum(ctx: Context, ids: np.ndarray, global_model: torch.Tensor,
                 parts: torch.Tensor, fallback: torch.Tensor) -> Placement:
    """Both CAM methods' placement (module doc): least loss of Θ_g + Θ_k over the K cluster
    `parts`; a client that does not answer gets -1 and Θ_g + `fallback` (a `[d]` part)."""
    k = len(parts)
    zeros = np.zeros(len(ids), dtype=np.int64)
    losses = ctx.send(LossRequest(ids, parts, offset=Predictor.single(global_model[None],
                                                                      zeros)))
    clusters = answered(ids, losses.clients, choose_clusters(losses.loss))
    loss = answered(ids, losses.clients, losses.loss, np.nan)
    rows = torch.cat([parts, fallback[None]])
    predictor = cam_predictor(global_model, rows, np.where(clusters >= 0, clusters, k))
    details = [{"losses": [round(float(v), 5) for v in row]} for row in loss]
    return Placement(ids, clusters, predictor, details)


# ----------------------------------------------------------------------------- IFCA-CAM


class IFCACAMConfig(SampledConfig):
    """Settings of IFCA-CAM (`[algorithm] name = "ifca_cam"`)."""

    name: Literal["ifca_cam"] = "ifca_cam"
    display: ClassVar[str] = "IFCA-CAM"
    n_clusters: int = Field(5, ge=1, description="K, the number of cluster models")
    warmup_rounds: int = Field(
        30, ge=0, description="β: rounds of FedAvg training Θ_g alone before CAM starts")
    cluster_update: Literal["eq6", "mean"] = Field(
        "eq6", description='"eq6": Θ_k moves by its members\' share of all samples (Eq. 6); '
        '"mean": Θ_k becomes its members\' weighted mean (IFCA)')


@dataclass(kw_only=True)
class IFCACAMExtras(CAMExtras):
    """IFCA-CAM's per-round extras (every round, warm-up included)."""

    assign_loss: float | None = None  # mean loss of the sum h + f_k chosen (None: warm-up)


@dataclass
class IFCACAMState:
    g: torch.Tensor  # [d], the global part Θ_g
    clusters: torch.Tensor  # [K, d], the cluster parts Θ_1..Θ_K
    assign: np.ndarray  # [n_clients], cluster of each client (-1: never selected)


class IFCACAM(Algorithm[IFCACAMConfig, IFCACAMState]):
    """IFCA-CAM: least-loss assignment of h(x; Θ_g) + f(x; Θ_k), parallel two-part training."""

    name = "ifca_cam"
    Config = IFCACAMConfig
    State = IFCACAMState
    device_update = True  # Eq. 6 / the members' means and Eq. 9 where the replies are

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_clusters, n_clients)
        check_warmup_leaves_rounds(self.config.warmup_rounds, rounds, "FedAvg on Θ_g")

    def setup(self, ctx: Context) -> None:
        k = self.config.n_clusters
        self.fits(ctx.n_clients, ctx.rounds)
        self.state = IFCACAMState(ctx.factory.init(ctx.seed),
                                  ctx.factory.init_many(k, ctx.seed + 1),
                                  np.full(ctx.n_clients, -1, dtype=np.int64))

    def ask(self, state: IFCACAMState, t: int, phase: str, ctx: Context) -> Ask[Any]:
        """Warm-up: FedAvg on Θ_g alone. Then one message per client (`Steps`): (i) Eq. 2,
        the losses of the sum with Θ_g sent along as the offset; (ii)+(iii) Eq. 5 and Eq. 8
        in parallel, on the cluster part each client picked from its losses (the `Pick`s
        fill in ĵ on the device)."""
        clients = ctx.sample_round(self.config)
        zeros = np.zeros(len(clients), dtype=np.int64)
        if t <= self.config.warmup_rounds:
            return Ask(TrainRequest(clients, state.g[None], zeros, ctx.training,
                                    ctx.next_seed()), WARMUP)
        ask = LossRequest(clients, state.clusters, offset=Predictor.single(state.g[None], zeros))
        req_k, req_g = train_both(ctx, clients, state.g, state.clusters, zeros, held=True)
        return Ask(Steps.of(ask, req_k, req_g, picks=[Pick(1, 0), Pick(2, 0, into="offset")]))

    def update(self, state: IFCACAMState, t: int, ask: Ask[Any],
               reply: Any) -> Update[IFCACAMState]:
        k = self.config.n_clusters
        if ask.phase == WARMUP:
            warm = cast(TrainReply, reply)
            return Update(replace(state, g=update_global(state.g, warm)), IFCACAMExtras(
                train_loss_global=mean_finite(warm.loss), train_loss_cluster=None,
                assign_loss=None, warmup=1, cluster_sizes=cluster_sizes(state.assign, k)))
        losses, rep_k, rep_g = cast(StepsReply, reply).replies
        chosen = choose_clusters(losses.loss)
        assign = state.assign.copy()
        assign[losses.clients] = chosen  # dropped clients are absent from every reply
        step = eq6_update if self.config.cluster_update == "eq6" else average_members
        clusters = step(state.clusters, rep_k.params, assign[rep_k.clients], rep_k.n_samples)
        new = replace(state, g=update_global(state.g, rep_g), clusters=clusters, assign=assign)
        return Update(new, IFCACAMExtras(
            train_loss_cluster=mean_finite(rep_k.loss),
            train_loss_global=mean_finite(rep_g.loss),
            assign_loss=mean_finite(losses.loss[np.arange(len(losses.clients)), chosen]),
            warmup=0, cluster_sizes=cluster_sizes(assign, k)))

    def assignment(self) -> np.ndarray:
        return self.state.assign.copy()

    def predictor(self) -> Predictor:
        st = self.state
        n = len(st.assign)
        if (st.assign < 0).all():  # warm-up: Θ_g alone
            return Predictor.single(st.g[None], np.zeros(n, np.int64))
        rows, row_of = st.clusters, st.assign
        if (row_of < 0).any():  # never selected yet: Θ_g plus an all-zero cluster model
            rows = torch.cat([rows, torch.zeros_like(rows[:1])])
            row_of = np.where(row_of >= 0, row_of, len(st.clusters))
        return cam_predictor(st.g, rows, row_of)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Eq. 2 for a client that did not train (module doc)."""
        st = self.state
        ids = np.asarray(clients, dtype=np.int64)
        if (st.assign < 0).all():  # warm-up: Θ_g alone
            return Placement.nowhere(ids, st.g[None])
        return place_by_sum(ctx, ids, st.g, st.clusters, torch.zeros_like(st.clusters[0]))


# ----------------------------------------------------------------------------- FeSEM-CAM


class FeSEMCAMConfig(FeSEMConfig):
    """Settings of FeSEM-CAM (`[algorithm] name = "fesem_cam"`); FeSEM's, other defaults."""

    name: Literal["fesem_cam"] = "fesem_cam"  # type: ignore[assignment]  # narrows the literal
    display: ClassVar[str] = "FeSEM-CAM"
    kmeans_layers: LayerSpec = Field(
        "linear", description='parameters k-means measures: "linear" (fully-connected layers, '
        'CAM §5), "all" or a list of parameter-name prefixes')
    warmup_rounds: int = Field(
        30, ge=0, description="β: rounds of local training only before the first clustering")


@dataclass(kw_only=True)
class FeSEMCAMExtras(CAMExtras):
    """FeSEM-CAM's extras after the warm-up in a round in which no client answered. Its
    warm-up rounds are FeSEM's and write `FeSEMExtras` (`FeSEMKMeansExtras` in the last)."""


@dataclass(kw_only=True)
class FeSEMCAMKMeansExtras(FeSEMCAMExtras, KMeansExtras):
    """FeSEM-CAM's extras after the warm-up in a round whose k-means ran."""


@dataclass
class FeSEMCAMState(FeSEMState):
    g: torch.Tensor  # [d], the global part Θ_g


class FeSEMCAM(FeSEM):
    """FeSEM-CAM: FeSEM's k-means on the cluster parts, plus a shared global model Θ_g."""

    name = "fesem_cam"
    Config = FeSEMCAMConfig
    State = FeSEMCAMState
    config: FeSEMCAMConfig
    state: FeSEMCAMState

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        base = self.state
        self.state = FeSEMCAMState(base.start, base.assign, base.centers, base.local,
                                   ctx.factory.init(ctx.seed + 1))

    def ask(self, state: FeSEMState, t: int, phase: str,
            ctx: Context) -> Ask[Any] | Update[FeSEMState]:
        """FeSEM's warm-up and k-means phases; otherwise the two trainings of Alg. 1 lines
        4-7 (cluster part with the pull λ, Θ_g), newcomers' losses first (`_message`)."""
        if phase == KMEANS or t <= self.config.warmup_rounds:
            return super().ask(state, t, phase, ctx)
        assert isinstance(state, FeSEMCAMState)
        clients = ctx.sample_round(self.config)
        rows, row_of = self.starts(state, clients)
        return self._message(state, clients, list(train_both(
            ctx, clients, state.g, rows, row_of, mu=self.config.lam)), ["model", "offset"])

    def update(self, state: FeSEMState, t: int, ask: Ask[Any],
               reply: Any) -> Update[FeSEMState]:
        """Eq. 9 for Θ_g, then FeSEM's k-means on the cluster parts (Eq. 10-11)."""
        if ask.phase == WARMUP:
            return super().update(state, t, ask, reply)
        assert isinstance(ask, FeSEMAsk) and isinstance(state, FeSEMCAMState)
        rep_k, rep_g = self._replies(ask, reply)
        state = replace(state, g=update_global(state.g, rep_g))
        return self._gather(state, rep_k.clients, rep_k.params, rep_k.n_samples,
                            [mean_finite(rep_k.loss), mean_finite(rep_g.loss)])

    def _extras(self, state: FeSEMState, losses: list[float | None], warmup: int,
                km: KMeansExtras | None) -> RoundExtras:
        """FeSEM's extras in the warm-up; then `FeSEMCAMExtras` (`FeSEMCAMKMeansExtras` when
        k-means ran)."""
        if warmup:
            return super()._extras(state, losses, warmup, km)
        extras = FeSEMCAMExtras(
            train_loss_cluster=losses[0], train_loss_global=losses[1],
            cluster_sizes=cluster_sizes(state.assign, self.config.n_clusters), warmup=0)
        if km is None:
            return extras
        return FeSEMCAMKMeansExtras(**extras.to_dict(), **km.to_dict())

    def predictor(self) -> Predictor:
        st = self.state
        if st.local is not None:  # warm-up: each client's own local model
            return Predictor.single(st.local, np.arange(len(st.local)))
        rows, row_of = self.starts(st, np.arange(len(st.assign)))
        return cam_predictor(st.g, rows, row_of)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """The least loss of Θ_g + Θ_k (module doc: our choice for FeSEM-CAM)."""
        st = self.state
        ids = np.asarray(clients, dtype=np.int64)
        if st.local is not None or st.centers is None:  # warm-up: no centers yet
            return Placement.nowhere(ids, st.start[None])
        return place_by_sum(ctx, ids, st.g, st.centers, st.start)


__all__ = [
    "IFCACAM",
    "CAMExtras",
    "FeSEMCAM",
    "FeSEMCAMConfig",
    "FeSEMCAMExtras",
    "FeSEMCAMKMeansExtras",
    "FeSEMCAMState",
    "IFCACAMConfig",
    "IFCACAMExtras",
    "IFCACAMState",
    "cam_predictor",
    "eq6_update",
    "place_by_sum",
    "train_both",
    "update_global",
]
