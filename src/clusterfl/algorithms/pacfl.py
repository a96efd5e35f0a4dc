"""PACFL, principal angles between client data subspaces (Vahidian, Morafah, Wang, Kungurtsev,
Chen, Shah, Lin; AAAI 2023): one-shot clustering before training, then FedAvg per cluster.

What the paper says (the abstract; the rest as we recall it, see docs/pacfl.md for sources):
1. Once, before training, every client computes a truncated SVD of its own data matrix
   D_k ∈ R^{e×n_k} (inputs as columns) and sends the p leading left singular vectors
   U_p^k ∈ R^{e×p}, never the data (a `SubspaceRequest`: e·p floats up, nothing down).
2. The server builds the proximity matrix A of the clients' subspaces from principal angles
   (eq. 2: the smallest principal angle; eq. 3: the sum of angles between corresponding
   vectors) and clusters it by agglomerative hierarchical clustering stopped at a threshold
   β, so the number of clusters is not given beforehand.
3. Each round a fraction of the clients trains locally from its cluster's model; each cluster
   model becomes the sample-weighted mean of its sampled members' models (FedAvg inside the
   cluster); a cluster without a sampled member keeps its model.
4. A client predicts with its cluster's model. A newcomer only sends its U_p; the server
   extends A by one row and column and assigns it, without re-clustering.

Where the authors' code (MMorafah/PACFL) departs, available as options:
- `per_label = true`: one SVD per label the client holds, p vectors each, stacked (the code's
  `main_pacfl.py`; it reads labels). Default: one SVD of the whole data (the paper; the
  code's MIX-4 experiment).
- `proximity = "min_pair"`: min over basis-vector pairs of arccos(u_aᵀw_b), signs as they
  come (the code's `calculating_adjacency`). Default `"smallest_angle"` (eq. 2); `"angle_sum"`
  is eq. 3 (angles between lines: |u_aᵀw_a|, as singular vectors have no sign).
- `linkage = "weighted"`: the code's own HC merges with the plain mean of the two clusters'
  distances (WPGMA), which it calls "average". Default `"average"` (UPGMA, the usual
  meaning); `"complete"` and `"single"` are the code's other two.
- Not done: the code reports each client's accuracy with its own model after its last local
  training (stale for clients not sampled at the end); we evaluate the cluster model (step 4).

Our choices where neither says:
- Angles and β in degrees, as in the code. Default β = `threshold` (see docs/pacfl.md for
  how it was chosen); `n_clusters` instead cuts the tree into C clusters, and with neither the
  cut is at the largest gap between merge heights (`auto_n_clusters`, as FLT).
- Every client takes part in the one-off subspace step, at the start of round 1 (the code
  does the same: no sampling for the signatures); sampling (`fraction` / `per_round`,
  `Context.sample_round`) applies to training. The code draws max(⌊frac·N⌋, 1) clients; we
  round, as every method here does.
- A client absent from the subspace reply (it dropped out, or its basis was rejected as
  non-finite) has no signature: it becomes its own cluster, as in FLT. A fixed `n_clusters`
  larger than the bases that arrived is lowered to their number.
- All cluster models start from one initial model (the code's `initial_state_dict`).
- Placement of a newcomer (`placement`): its basis from a `SubspaceRequest`, its proximity
  to the N clustered clients, and the cluster at the smallest linkage distance (mean of its
  proximities to the members for average and weighted linkage, max for complete, min for
  single). It joins that cluster even when the distance exceeds β (the paper's "assign";
  there is no model for a new cluster); `details` say whether it was within β. Before the
  clustering (no round run yet): -1 and the initial model. The code
  instead clusters the newcomers with everybody at the start and fine-tunes them E epochs.

The server keeps (`PACFLState`): the cluster models, every client's cluster, A, the linkage
and the bases (float32, for placement). The maths: `clusterfl.clustering.subspace`
(principal angles, A) and `clusterfl.clustering.hierarchical` (linkage, cut); the client side:
`clusterfl.engine.subspace`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, Context, Placement, SampledConfig
from clusterfl.clustering.aggregate import average_members, cluster_sizes
from clusterfl.clustering.hierarchical import distance_linkage, flat_clusters, linkage_to_clusters
from clusterfl.clustering.subspace import proximity
from clusterfl.errors import ConfigError
from clusterfl.protocol import Predictor, SubspaceReply, SubspaceRequest, TrainRequest, mean_finite
from clusterfl.records import RoundExtras

HISTORY_MAX_CLIENTS = 200  # above this, A and the linkage are not written into the history


class PACFLConfig(SampledConfig):
    """Settings of PACFL (`[algorithm] name = "pacfl"`)."""

    name: Literal["pacfl"] = "pacfl"
    display: ClassVar[str] = "PACFL"
    fraction: float = Field(0.1, gt=0.0, le=1.0, description="share of the clients sampled "
                            "each round (the paper's and code's 0.1)")
    p: int = Field(3, ge=1, description="leading left singular vectors per basis (the "
                   "authors' headline script: 3)")
    per_label: bool = Field(False, description="one SVD per label held, stacked (the authors' "
                            "code) instead of one of the whole data (the paper)")
    proximity: Literal["smallest_angle", "angle_sum", "min_pair"] = Field(
        "smallest_angle", description="smallest principal angle (eq. 2), sum of angles of "
        "corresponding vectors (eq. 3) or the code's most aligned pair")
    linkage: Literal["average", "weighted", "complete", "single"] = Field(
        "average", description="HC linkage (weighted = the code's 'average')")
    threshold: float | None = Field(
        3.5, gt=0.0, description="β in degrees: merge while the linkage distance ≤ β (the "
        "authors' code default)")
    n_clusters: int | None = Field(None, ge=1, description="cut into C clusters instead of β")
    max_clusters: int | None = Field(None, ge=1, description="bound on the largest-gap C "
                                     "(threshold and n_clusters unset)")

    @model_validator(mode="after")
    def _one_cut(self) -> PACFLConfig:
        if self.n_clusters is not None and "threshold" in self.model_fields_set \
                and self.threshold is not None:
            raise ValueError("set algorithm.threshold or algorithm.n_clusters, not both")
        return self

    def cut(self) -> tuple[float | None, int | None]:
        """(threshold, n_clusters) of the cut: n_clusters wins over the default β."""
        if self.n_clusters is not None:
            return None, self.n_clusters
        return self.threshold, None


@dataclass(kw_only=True)
class PACFLExtras(RoundExtras):
    """PACFL's extras in every round."""

    train_loss: float | None = None  # mean local training loss of the clients that answered
    n_clusters_found: int = 0  # clusters after the one-off clustering (singletons included)
    missing_signatures: int = 0  # clients without a (valid) basis: each its own cluster
    signature_floats_up: float = 0.0  # one-off uplink: per-client width × bases received
    signature_floats_used: float = 0.0  # of which basis columns (no padding): e · Σ ranks
    cluster_sizes: list[int] = field(default_factory=list)  # clients per cluster


@dataclass(kw_only=True)
class PACFLClusteringExtras(PACFLExtras):
    """The extras of round 1 (the one-off clustering); the matrices are None above
    `HISTORY_MAX_CLIENTS` clients."""

    proximity: list[list[float]] | None = None  # A in degrees, 4 digits (-1: no basis)
    linkage: list[list[float]] | None = None  # scipy linkage of the clients with a basis
    clustering_seconds: float = 0.0


@dataclass
class PACFLState:
    """What the PACFL server keeps between rounds.

    `models`: `[1, d]` (the initial model) until the clustering, then one row per cluster.
    `labels`: every client's cluster (-1 before). `bases` / `ranks`: the clients' bases
    (float32, zero-padded; rank 0 = none) for placing newcomers. `proximity`: A (degrees, +inf
    where a client has no basis); `linkage`: of the clients with a basis. `info`: the one-off
    step's numbers, repeated in every round's extras.
    """

    models: torch.Tensor
    labels: np.ndarray
    clustered: bool = False
    bases: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), np.float32))
    ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proximity: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    linkage: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    info: dict[str, Any] = field(default_factory=dict)


class PACFL(Algorithm[PACFLConfig, PACFLState]):
    """PACFL: one-shot clustering by principal angles of client data subspaces."""

    name = "pacfl"
    Config = PACFLConfig
    State = PACFLState

    def setup(self, ctx: Context) -> None:
        self.state = PACFLState(models=ctx.factory.init(ctx.seed)[None].clone(),
                                labels=np.full(ctx.n_clients, -1, dtype=np.int64))

    # ------------------------------------------------------------------ the one-off step
    def _request(self, ctx: Context, clients: np.ndarray) -> SubspaceRequest:
        cfg = self.config
        e = int(np.prod(ctx.factory.input_shape))
        n_labels = int(ctx.factory.n_outputs) if cfg.per_label else 0
        if cfg.per_label and n_labels < 2:
            raise ConfigError("algorithm.per_label", "a per-label SVD needs a classification "
                              "task (labels); allowed here: false")
        return SubspaceRequest(np.asarray(clients, dtype=np.int64), e, p=cfg.p,
                               per_label=cfg.per_label, n_labels=n_labels)

    def _bases(self, reply: SubspaceReply) -> list[np.ndarray]:
        return [reply.basis(i) for i in range(len(reply.clients))]

    def _cluster(self, ctx: Context) -> None:
        cfg, st = self.config, self.state
        n = len(st.labels)
        t0 = time.perf_counter()
        request = self._request(ctx, np.arange(n))
        reply = ctx.send(request)
        good = np.asarray(reply.clients, dtype=np.int64)
        bad = np.setdiff1d(np.arange(n), good)
        a_good = proximity(self._bases(reply), cfg.proximity)
        z = distance_linkage(a_good, cfg.linkage)
        threshold, k = cfg.cut()
        if k is not None and k > n:
            raise ConfigError("algorithm.n_clusters", f"{k} clusters asked, the federation "
                              f"has {n} clients; allowed: 1..{n}")
        if k is not None:  # fewer bases arrived (dropouts, rejections): at most one each
            k = max(1, min(k, len(good)))
        labels = np.full(n, -1, dtype=np.int64)
        labels[good] = flat_clusters(z, len(good), threshold, k, cfg.max_clusters)
        labels[bad] = labels.max(initial=-1) + 1 + np.arange(len(bad))  # own clusters
        n_groups = int(labels.max(initial=-1)) + 1
        a = np.full((n, n), np.inf)
        a[np.ix_(good, good)] = a_good
        np.fill_diagonal(a, 0.0)
        bases = np.zeros((n, request.input_dim, request.columns()), dtype=np.float32)
        bases[good] = reply.bases.astype(np.float32)
        ranks = np.zeros(n, dtype=np.int64)
        ranks[good] = reply.ranks
        st.models = st.models[:1].repeat(max(n_groups, 1), 1)  # one start for every cluster
        st.labels, st.clustered = labels, True
        st.bases, st.ranks, st.proximity, st.linkage = bases, ranks, a, z
        _, up = request.unit_cost()
        st.info = {
            "n_clusters_found": n_groups, "missing_signatures": len(bad),
            "signature_floats_up": up * len(good),
            "signature_floats_used": float(request.input_dim * int(ranks.sum())),
            "clustering_seconds": round(time.perf_counter() - t0, 3),
        }

    # ------------------------------------------------------------------ rounds
    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        first = not self.state.clustered
        if first:
            self._cluster(ctx)
        st = self.state
        clients = ctx.sample_round(self.config)
        reply = ctx.send(TrainRequest(clients, st.models, st.labels[clients], ctx.training,
                                      ctx.next_seed()))
        st.models = average_members(st.models, reply.params, st.labels[reply.clients],
                                    reply.n_samples)
        info = st.info
        extras = PACFLExtras(
            train_loss=mean_finite(reply.loss), n_clusters_found=info["n_clusters_found"],
            missing_signatures=info["missing_signatures"],
            signature_floats_up=info["signature_floats_up"],
            signature_floats_used=info["signature_floats_used"],
            cluster_sizes=cluster_sizes(st.labels, len(st.models)))
        if not first:
            return extras.to_dict()
        small = len(st.labels) <= HISTORY_MAX_CLIENTS
        a = st.proximity
        return PACFLClusteringExtras(
            **extras.to_dict(),
            proximity=np.round(np.where(np.isfinite(a), a, -1.0), 4).tolist() if small
            else None,
            linkage=np.round(st.linkage, 6).tolist() if small else None,
            clustering_seconds=info["clustering_seconds"]).to_dict()

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.state.labels.copy()

    def predictor(self) -> Predictor:
        st = self.state
        return Predictor.single(st.models, np.maximum(st.labels, 0))

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Newcomers send their basis; each joins the cluster at the smallest linkage
        distance of its proximities to the clustered clients (see the module docstring)."""
        st, cfg = self.state, self.config
        clients = np.asarray(clients, dtype=np.int64)
        if not st.clustered:  # before round 1 nobody has a cluster: -1, the initial model
            none = np.full(len(clients), -1, dtype=np.int64)
            return Placement(clients, none, Predictor.single(st.models[:1], none * 0))
        reply = ctx.send(self._request(ctx, clients))
        known = np.flatnonzero(st.ranks > 0)
        old = [st.bases[i, :, : st.ranks[i]].astype(np.float64) for i in known]
        dist = proximity(old, cfg.proximity, others=self._bases(reply))
        to_cluster = linkage_to_clusters(dist, st.labels[known], cfg.linkage)
        out = np.full(len(clients), -1, dtype=np.int64)
        details: list[dict[str, Any]] = [{"answered": False} for _ in clients]
        threshold, _ = cfg.cut()
        for row, c in enumerate(np.asarray(reply.clients).tolist()):
            i = int(np.flatnonzero(clients == c)[0])
            best = int(np.argmin(to_cluster[row])) if to_cluster.shape[1] else -1
            out[i] = best
            d = float(to_cluster[row, best]) if best >= 0 else float("inf")
            details[i] = {"answered": True, "distance": round(d, 4),
                          "within_threshold": None if threshold is None else d <= threshold}
        return Placement(clients, out, Predictor.single(st.models, np.maximum(out, 0)), details)


__all__ = ["PACFL", "PACFLClusteringExtras", "PACFLConfig", "PACFLExtras", "PACFLState"]
