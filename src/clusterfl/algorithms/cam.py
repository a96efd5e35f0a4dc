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
- Communication per selected client and round: Θ_g and the K cluster models down (IFCA-CAM;
  FeSEM-CAM sends Θ_g and Θ_c(i)), θ_i and θ_i^0 up.
- A client not yet assigned (partial participation): IFCA-CAM predicts it with Θ_g plus an
  all-zero cluster model, i.e. h(x; Θ_g) alone for the built-in models (whose last layer is
  linear); FeSEM-CAM uses FeSEM's common start Θ_0 as its cluster part (for training and
  prediction) until k-means assigns it. After FeSEM-CAM's warm-up every client is assigned.
- Replies with NaN/Inf parameters are left out of every average, and so are clients absent
  from a reply (dropped out or rejected, `clusterfl.robust`); they keep their cluster.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context, weighted_mean
from clusterfl.algorithms.fesem import FeSEM, FeSEMConfig, LayerSpec
from clusterfl.algorithms.ifca import (
    average_members,
    book,
    choose_clusters,
    cluster_sizes,
    finite_rows,
    mean_finite,
)
from clusterfl.protocol import LossRequest, Predictor, TrainReply, TrainRequest
from clusterfl.robust.replies import answered, positions

# ----------------------------------------------------------------------------- shared parts


def train_both(
    ctx: Context, clients: np.ndarray, global_model: torch.Tensor, rows: torch.Tensor,
    row_of: np.ndarray, mu: float = 0.0,
) -> tuple[TrainReply, TrainReply]:
    """Alg. 1 lines 4-7: θ_i from rows[row_of[i]] with Θ_g frozen, θ_i^0 from Θ_g with the
    cluster part frozen. Uploads (2d per client) are booked here; downloads by the caller."""
    n = len(clients)
    zeros = np.zeros(n, dtype=np.int64)
    cluster_training = replace(ctx.training, mu=mu) if mu else ctx.training
    rep_k = ctx.send(TrainRequest(clients, rows, row_of, cluster_training, ctx.next_seed(),
                                  offset=Predictor.single(global_model[None], zeros),
                                  count_cost=False))
    rep_g = ctx.send(TrainRequest(clients, global_model[None], zeros, ctx.training,
                                  ctx.next_seed(), offset=Predictor.single(rows, row_of),
                                  count_cost=False))
    book(ctx, up=2 * n * global_model.shape[0])
    return rep_k, rep_g


def update_global(global_model: torch.Tensor, reply: TrainReply) -> tuple[torch.Tensor, int]:
    """Eq. 9: Θ_g ← Σ_i (n_i/n) θ_i^0 over the finite replies; returns it and the rejects."""
    ok = finite_rows(reply.params)
    if not ok.any():
        return global_model, len(ok)
    return weighted_mean(reply.params[torch.from_numpy(ok)], reply.n_samples[ok]), int(
        (~ok).sum())


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
        share = torch.as_tensor(w[sel] / total, dtype=params.dtype)
        delta = params[torch.from_numpy(sel)] - models[int(k)]
        out[int(k)] = models[int(k)] + (share[:, None] * delta).sum(0)
    return out


def cam_predictor(global_model: torch.Tensor, rows: torch.Tensor,
                  row_of: np.ndarray) -> Predictor:
    """Eq. 1: client i combines Θ_g and rows[row_of[i]] by adding their logits."""
    models = torch.cat([global_model[None], rows])
    members = np.stack([np.zeros(len(row_of), np.int64), 1 + np.asarray(row_of)], axis=1)
    return Predictor(models, members.astype(np.int64), "sum_logits")


# ----------------------------------------------------------------------------- IFCA-CAM


class IFCACAMConfig(AlgorithmConfig):
    """Settings of IFCA-CAM (`[algorithm] name = "ifca_cam"`)."""

    name: Literal["ifca_cam"] = "ifca_cam"
    n_clusters: int = Field(5, ge=1, description="K, the number of cluster models")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="clients selected per round")
    warmup_rounds: int = Field(
        30, ge=0, description="β: rounds of FedAvg training Θ_g alone before CAM starts")
    cluster_update: Literal["eq6", "mean"] = Field(
        "eq6", description='"eq6": Θ_k moves by its members\' share of all samples (Eq. 6); '
        '"mean": Θ_k becomes its members\' weighted mean (IFCA)')


class IFCACAM(Algorithm):
    """IFCA-CAM: least-loss assignment of h(x; Θ_g) + f(x; Θ_k), parallel two-part training."""

    name = "ifca_cam"
    Config = IFCACAMConfig
    config: IFCACAMConfig

    def setup(self, ctx: Context) -> None:
        k = self.config.n_clusters
        self.g = ctx.factory.init(ctx.seed)
        self.clusters = ctx.factory.init_many(k, ctx.seed + 1)
        self.assign = np.full(ctx.n_clients, -1, dtype=np.int64)

    def _warm(self, t: int) -> bool:
        return t <= self.config.warmup_rounds

    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        cfg = self.config
        clients = ctx.sample(cfg.fraction)
        n, d = len(clients), self.g.shape[0]
        zeros = np.zeros(n, dtype=np.int64)
        if self._warm(t):  # FedAvg on Θ_g alone
            reply = ctx.send(TrainRequest(clients, self.g[None], zeros, ctx.training,
                                          ctx.next_seed()))
            self.g, rejected = update_global(self.g, reply)
            return {"train_loss_global": mean_finite(reply.loss), "train_loss_cluster": None,
                    "assign_loss": None, "rejected": rejected, "warmup": 1,
                    "cluster_sizes": cluster_sizes(self.assign, cfg.n_clusters)}
        # (i) Eq. 2: least loss of the sum, Θ_g sent along as the offset
        losses = ctx.send(LossRequest(clients, self.clusters,
                                      offset=Predictor.single(self.g[None], zeros)))
        clients = answered(losses, clients)  # dropped clients are absent from every reply
        n = len(clients)
        book(ctx, down=n * d)
        chosen = choose_clusters(losses, "loss")
        self.assign[clients] = chosen
        # (ii)+(iii) Eq. 5 and Eq. 8 in parallel
        rep_k, rep_g = train_both(ctx, clients, self.g, self.clusters, chosen)
        ok = finite_rows(rep_k.params)
        keep = torch.from_numpy(ok)
        update = eq6_update if cfg.cluster_update == "eq6" else average_members
        chosen_k = chosen[positions(answered(rep_k, clients), clients)]
        self.clusters = update(self.clusters, rep_k.params[keep], chosen_k[ok],
                               rep_k.n_samples[ok])
        self.g, rejected_g = update_global(self.g, rep_g)
        return {
            "train_loss_cluster": mean_finite(rep_k.loss),
            "train_loss_global": mean_finite(rep_g.loss),
            "assign_loss": mean_finite(losses.loss[np.arange(n), chosen]),
            "rejected": int((~ok).sum()) + rejected_g, "warmup": 0,
            "cluster_sizes": cluster_sizes(self.assign, cfg.n_clusters),
        }

    def assignment(self) -> np.ndarray:
        return self.assign.copy()

    def predictor(self) -> Predictor:
        n = len(self.assign)
        if (self.assign < 0).all():  # warm-up: Θ_g alone
            return Predictor.single(self.g[None], np.zeros(n, np.int64))
        rows, row_of = self.clusters, self.assign
        if (row_of < 0).any():  # never selected yet: Θ_g plus an all-zero cluster model
            rows = torch.cat([rows, torch.zeros_like(rows[:1])])
            row_of = np.where(row_of >= 0, row_of, len(self.clusters))
        return cam_predictor(self.g, rows, row_of)

    def state_dict(self) -> dict[str, Any]:
        return {"g": self.g.clone(), "clusters": self.clusters.clone(),
                "assign": self.assign.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.g = state["g"].clone()
        self.clusters = state["clusters"].clone()
        self.assign = np.asarray(state["assign"], dtype=np.int64).copy()


# ----------------------------------------------------------------------------- FeSEM-CAM


class FeSEMCAMConfig(FeSEMConfig):
    """Settings of FeSEM-CAM (`[algorithm] name = "fesem_cam"`); FeSEM's, other defaults."""

    name: Literal["fesem_cam"] = "fesem_cam"  # type: ignore[assignment]
    kmeans_layers: LayerSpec = Field(
        "linear", description='parameters k-means measures: "linear" (fully-connected layers, '
        'CAM §5), "all" or a list of parameter-name prefixes')
    warmup_rounds: int = Field(
        30, ge=0, description="β: rounds of local training only before the first clustering")


class FeSEMCAM(FeSEM):
    """FeSEM-CAM: FeSEM's k-means on the cluster parts, plus a shared global model Θ_g."""

    name = "fesem_cam"
    Config = FeSEMCAMConfig
    config: FeSEMCAMConfig

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.g = ctx.factory.init(ctx.seed + 1)

    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        if t <= self.config.warmup_rounds:
            return self._warmup_round(ctx, t)
        clients = ctx.sample(self.config.fraction)
        rows, row_of = self.starts(clients)
        book(ctx, down=2 * len(clients) * self.g.shape[0])  # Θ_g and Θ_c(i)
        rep_k, rep_g = train_both(ctx, clients, self.g, rows, row_of, mu=self.config.lam)
        self.g, rejected_g = update_global(self.g, rep_g)
        info = self._recluster(ctx, answered(rep_k, clients), rep_k.params, rep_k.n_samples)
        info["rejected"] += rejected_g
        return {"train_loss_cluster": mean_finite(rep_k.loss),
                "train_loss_global": mean_finite(rep_g.loss), **info, "warmup": 0}

    def predictor(self) -> Predictor:
        if self.local is not None:  # warm-up: each client's own local model
            return Predictor.single(self.local, np.arange(len(self.local)))
        rows, row_of = self.starts(np.arange(len(self.assign)))
        return cam_predictor(self.g, rows, row_of)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "g": self.g.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.g = state["g"].clone()


__all__ = [
    "IFCACAM",
    "FeSEMCAM",
    "FeSEMCAMConfig",
    "IFCACAMConfig",
    "cam_predictor",
    "eq6_update",
    "train_both",
    "update_global",
]
