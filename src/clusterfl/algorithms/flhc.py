"""FL+HC, federated learning with hierarchical clustering of local updates (Briggs, Fan,
Andras; IJCNN 2020, arXiv 2004.11791).

What the paper says (its abstract and a summary quoting it; no author code exists, and the
paper's body could not be read, see docs/flhc.md):
1. Plain FedAvg for a set number of rounds n (the warm-up).
2. At round n the server clusters the clients by the similarity of their local updates to
   the global model, Δθ_k = θ_k − θ^n, with agglomerative hierarchical clustering: every
   client starts as its own cluster and the closest pair is merged until a distance
   threshold, so the number of clusters is not fixed beforehand.
3. Afterwards every cluster trains its own model with FedAvg, independently; a client uses
   its cluster's model. The communication protocol is FedAvg's (d down, d up per client).

Our choices (the paper's values could not be read; every one is an option):
- Distance and linkage: `metric` euclidean (default) / manhattan / cosine and `linkage` ward
  (default) / average / complete / single, the options the paper studies as we recall it;
  Ward needs the Euclidean metric. Updates are flattened over all layers.
- The cut: a distance `threshold` (the paper's rule), or a fixed `n_clusters`, or, with
  neither (the default), `auto_cut`: the cut whose clusters have the highest mean silhouette
  under `metric` (`silhouette_cut`), and one cluster when that silhouette is below
  `min_silhouette` (0.25); or `"gap"`, the largest gap between consecutive merge heights
  (`auto_n_clusters`), which always cuts somewhere, iid federations included. A raw
  threshold depends on the model, the learning rate and the local work, and the paper's
  recommended value is not known. Evidence for the default: docs/transfer.md.
- `warmup_rounds` n = 10 FedAvg rounds (ours; one third-party version uses 20); the
  clustering happens in round n + 1. A run of at most n rounds would never cluster (FedAvg
  under FL+HC's name): `setup` refuses it, naming `warmup_rounds`.
- Who takes part in the clustering round: every client, whatever the sampling (the paper
  does not say; the one third-party version leaves unsampled clients as a TODO). The
  clustering round costs N × (d down, d up) instead of the sampled share. Warm-up and
  per-cluster rounds sample (`fraction` / `per_round`, `Context.sample_round`).
- The clustering round is also the first round of per-cluster FedAvg: each cluster model
  becomes the sample-weighted mean of its members' models θ_k of that round (all of them
  started from θ^n, so this is FedAvg from θ^n inside each cluster).
- A client absent from the clustering round (it dropped out, or its update was rejected) has
  no update: it becomes its own cluster, whose model starts at θ^n. A fixed `n_clusters`
  larger than the updates that arrived is lowered to their number.
- The clustering is never repeated.
- Placement of a newcomer (`placement`, not in the paper): it trains from θ^n, kept by the
  server, with the run's local training and sends its model; its update Δθ goes to the
  cluster whose mean update (the centroid of the members' clustering-round updates, kept by
  the server) is nearest under `metric`. The server keeps K centroids, not N updates.
  During the warm-up (one model) a newcomer joins cluster 0 with the global model, as
  FedAvg places.

The maths: `clusterfl.clustering.hierarchical` (`feature_linkage`, `flat_clusters`,
`pairwise_distances`); aggregation: `clusterfl.clustering.aggregate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import Placement, SampledConfig, check_k_fits
from clusterfl.algorithms.oneshot import (
    AutoCut,
    Cut,
    Threshold,
    auto_cut_field,
    cut_clients,
    min_silhouette_field,
)
from clusterfl.clustering.aggregate import average_members, cluster_sizes, weighted_mean
from clusterfl.clustering.hierarchical import feature_linkage, pairwise_distances
from clusterfl.errors import ConfigError
from clusterfl.protocol import Predictor, TrainReply, TrainRequest, mean_finite
from clusterfl.records import RoundExtras

HISTORY_MAX_CLIENTS = 200  # above this, the linkage is not written into the history


class FLHCConfig(SampledConfig):
    """Settings of FL+HC (`[algorithm] name = "flhc"`)."""

    name: Literal["flhc"] = "flhc"
    display: ClassVar[str] = "FL+HC"
    warmup_rounds: int = Field(10, ge=0, description="FedAvg rounds before the clustering "
                               "round (n); the clustering happens in round n + 1")
    metric: Literal["euclidean", "manhattan", "cosine"] = Field(
        "euclidean", description="distance between the clients' updates")
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="agglomerative linkage (ward needs euclidean)")
    threshold: Threshold = Field(None, gt=0.0, description="merge while the linkage "
                                 "distance ≤ threshold (the paper's rule; \"none\": no threshold)")
    n_clusters: int | None = Field(None, ge=1, description="cut into C clusters instead")
    max_clusters: int | None = Field(None, ge=1, description="bound on the automatic C "
                                     "(threshold and n_clusters unset)")
    auto_cut: AutoCut = auto_cut_field()
    min_silhouette: float = min_silhouette_field()

    @model_validator(mode="after")
    def _consistent(self) -> FLHCConfig:
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError(f"linkage 'ward' needs metric 'euclidean', not {self.metric!r}; "
                             "allowed with other metrics: average, complete, single")
        if self.threshold is not None and self.n_clusters is not None:
            raise ValueError("set algorithm.threshold or algorithm.n_clusters, not both")
        return self


@dataclass(kw_only=True)
class FLHCExtras(RoundExtras):
    """FL+HC's extras in every round."""

    train_loss: float | None = None  # mean local training loss of the clients that answered
    warmup: int = 0  # 1 in a FedAvg warm-up round, else 0
    n_clusters_found: int = 0  # clusters after the clustering round (0 before)
    cluster_sizes: list[int] = field(default_factory=list)  # clients per cluster


@dataclass(kw_only=True)
class FLHCClusteringExtras(FLHCExtras):
    """The extras of the clustering round (n + 1)."""

    missing_updates: int = 0  # clients without a (valid) update: each its own cluster
    silhouette: float | None = None  # best mean silhouette of the automatic cut (None: none)
    linkage: list[list[float]] | None = None  # scipy linkage (None above HISTORY_MAX_CLIENTS)


@dataclass
class FLHCState:
    """What the FL+HC server keeps between rounds.

    `models`: `[1, d]` (the global model) during the warm-up, one row per cluster after.
    `labels`: every client's cluster (-1 before the clustering). `rounds_done`: rounds run.
    `anchor`: θ^n, the model of the clustering round; `centroids`: each cluster's mean
    clustering-round update (both for placing newcomers; empty before the clustering).
    """

    models: torch.Tensor
    labels: np.ndarray
    rounds_done: int = 0
    clustered: bool = False
    anchor: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    centroids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))


#: the phase of the clustering round (n + 1)
CLUSTERING = "clustering"


def flhc_clusters(updates: np.ndarray, n: int, good: np.ndarray,
                  cfg: FLHCConfig) -> tuple[Cut, np.ndarray]:
    """FL+HC's cut: the clients `good`'s updates (rows of `updates`) clustered by `metric` and
    `linkage`, cut at `threshold`, into `n_clusters` or by `auto_cut`; each of the other of
    the `n` clients its own cluster. Returns (the cut of the n clients, the linkage)."""
    z = feature_linkage(updates, cfg.metric, cfg.linkage)
    distances = pairwise_distances(updates, updates, cfg.metric) \
        if cfg.auto_cut == "silhouette" else None
    return cut_clients(z, n, good, cfg.threshold, cfg.n_clusters, cfg.max_clusters,
                       cfg.auto_cut, distances, cfg.min_silhouette), z


class FLHC(Algorithm[FLHCConfig, FLHCState]):
    """FL+HC: FedAvg warm-up, one hierarchical clustering of updates, FedAvg per cluster."""

    name = "flhc"
    Config = FLHCConfig
    State = FLHCState

    def setup(self, ctx: Context) -> None:
        cfg, n = self.config, ctx.n_clients
        if ctx.rounds is not None and cfg.warmup_rounds >= ctx.rounds:
            raise ConfigError("algorithm.warmup_rounds", f"{cfg.warmup_rounds} warm-up rounds "
                              f"leave no round to cluster in a run of {ctx.rounds} rounds (it "
                              f"would be FedAvg); allowed: 0..{ctx.rounds - 1}, or more rounds")
        check_k_fits(cfg.n_clusters or 1, n)
        self.state = FLHCState(models=ctx.factory.init(ctx.seed)[None].clone(),
                               labels=np.full(n, -1, dtype=np.int64))

    def ask(self, state: FLHCState, t: int, phase: str, ctx: Context) -> Ask[TrainReply]:
        """Warm-up and cluster rounds: the sampled clients train their (cluster's) model. The
        clustering round: every client trains from θ^n."""
        if not state.clustered and state.rounds_done + 1 > self.config.warmup_rounds:
            n = len(state.labels)
            return Ask(TrainRequest(np.arange(n), state.models[:1].clone(),
                                    np.zeros(n, np.int64), ctx.training, ctx.next_seed()),
                       CLUSTERING)
        clients = ctx.sample_round(self.config)
        return Ask(TrainRequest(clients, state.models, np.maximum(state.labels[clients], 0),
                                ctx.training, ctx.next_seed()))

    def update(self, state: FLHCState, t: int, ask: Ask[Any],
               reply: TrainReply) -> Update[FLHCState]:
        state = replace(state, rounds_done=state.rounds_done + 1)
        if ask.phase == CLUSTERING:
            return self._clustered(state, reply)
        loss = mean_finite(reply.loss)
        if not state.clustered:  # FedAvg warm-up
            if len(reply.clients):
                state = replace(state, models=weighted_mean(reply.params, reply.n_samples)[None])
            return Update(state, FLHCExtras(train_loss=loss, warmup=1))
        models = average_members(state.models, reply.params, state.labels[reply.clients],
                                 reply.n_samples)
        k = len(models)
        return Update(replace(state, models=models), FLHCExtras(
            train_loss=loss, n_clusters_found=k, cluster_sizes=cluster_sizes(state.labels, k)))

    def _clustered(self, state: FLHCState, reply: TrainReply) -> Update[FLHCState]:
        """The clustering round: the updates Δθ_k = θ_k − θ^n cut into clusters
        (`flhc_clusters`), each cluster's model the mean of its members' θ_k."""
        n = len(state.labels)
        anchor = state.models[:1].clone()
        good = np.asarray(reply.clients, dtype=np.int64)
        updates = (reply.params - anchor).to(torch.float64)
        cut, z = flhc_clusters(updates.numpy(), n, good, self.config)
        labels = cut.labels
        k = max(int(labels.max(initial=-1)) + 1, 1)
        models = average_members(anchor.repeat(k, 1), reply.params, labels[good],
                                 reply.n_samples)
        centroids = torch.full((k, anchor.shape[1]), float("nan"), dtype=torch.float64)
        for c in np.unique(labels[good]):  # a cluster of absent clients has no centroid
            centroids[int(c)] = updates[torch.from_numpy(labels[good] == c)].mean(0)
        new = replace(state, models=models, labels=labels, clustered=True, anchor=anchor,
                      centroids=centroids)
        return Update(new, FLHCClusteringExtras(
            train_loss=mean_finite(reply.loss), n_clusters_found=k,
            cluster_sizes=cluster_sizes(labels, k), missing_updates=n - len(good),
            silhouette=None if cut.silhouette is None else round(cut.silhouette, 6),
            linkage=np.round(z, 6).tolist() if n <= HISTORY_MAX_CLIENTS else None))

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        st = self.state
        return st.labels.copy() if st.clustered else np.zeros(len(st.labels), np.int64)

    def predictor(self) -> Predictor:
        return Predictor.single(self.state.models, np.maximum(self.assignment(), 0))

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Newcomers train from θ^n; each joins the cluster whose mean clustering-round
        update is nearest to its own update under `metric` (see the module docstring)."""
        st, cfg = self.state, self.config
        clients = np.asarray(clients, dtype=np.int64)
        if not st.clustered:  # the warm-up: one model, cluster 0 (as `assignment()`)
            zeros = np.zeros(len(clients), dtype=np.int64)
            return Placement(clients, zeros, Predictor.single(st.models[:1], zeros))
        reply = ctx.send(TrainRequest(clients, st.anchor, np.zeros(len(clients), np.int64),
                                      ctx.training, ctx.next_seed()))
        updates = (reply.params - st.anchor).to(torch.float64).numpy()
        have = np.flatnonzero(~torch.isnan(st.centroids).any(1).numpy())
        dist = pairwise_distances(updates, st.centroids[torch.from_numpy(have)].numpy(),
                                  cfg.metric)
        out = np.full(len(clients), -1, dtype=np.int64)
        details: list[dict[str, Any]] = [{"answered": False} for _ in clients]
        for row, c in enumerate(np.asarray(reply.clients).tolist()):
            i = int(np.flatnonzero(clients == c)[0])
            j = int(np.argmin(dist[row]))
            out[i] = int(have[j])
            details[i] = {"answered": True, "distance": round(float(dist[row, j]), 6)}
        return Placement.by_cluster(clients, out, st.models, details)


__all__ = ["FLHC", "FLHCClusteringExtras", "FLHCConfig", "FLHCExtras", "FLHCState",
           "flhc_clusters"]
