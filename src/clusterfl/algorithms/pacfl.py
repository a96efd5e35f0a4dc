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
- Angles in degrees, as in the code. β is not set by default: an angle threshold depends
  on the data's dimension and sample count (3.5°, the code's value, puts the 20 clients of
  the demo federation into 16 clusters). The default cut is `auto_cut = "silhouette"`: the
  cut of the tree whose clusters have the highest mean silhouette under A, made (and each
  part examined again) only when that silhouette reaches `min_silhouette` (0.25; rule v1).
  With `significance` > 0 (rule v2, grid version v13, tried at 0.002 and not kept), a
  cluster of 5 clients or more also needs CFL's shuffle test of the members' angles (as
  similarities) below it. `"gap"` is the largest gap between merge heights.
  `threshold = 3.5` is the authors' rule; `n_clusters` cuts into C clusters. Evidence:
  docs/transfer.md. p is at most e (a basis of R^e has at most e vectors; more
  would only book zero padding): a larger p is refused.
- Every client takes part in the one-off subspace step, at the start of round 1 (the code
  does the same: no sampling for the signatures); sampling (`fraction` / `per_round`,
  `Context.sample_round`) applies to training. The code draws max(⌊frac·N⌋, 1) clients; we
  round, as every method here does.
- A client absent from the subspace reply (it dropped out, or its basis was rejected as
  non-finite) has no signature: it becomes its own cluster, as in FLT. A fixed `n_clusters`
  larger than the bases that arrived is lowered to their number, with a warning
  (`oneshot.lowered_cut`).
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

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from clusterfl.algorithms.base import FIRST, Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import Placement, SampledConfig, check_k_fits
from clusterfl.algorithms.oneshot import (
    AutoCut,
    Cut,
    OneOffAsk,
    Threshold,
    auto_cut_field,
    cut_clients,
    dump_cut,
    ignored_cut_options,
    lowered_cut,
    max_clusters_field,
    min_silhouette_field,
    unbound_max_clusters,
)
from clusterfl.clustering.aggregate import average_members, cluster_sizes
from clusterfl.clustering.cosine import SHUFFLE_MIN, both_structured, distance_similarity
from clusterfl.clustering.hierarchical import distance_linkage, linkage_to_clusters
from clusterfl.clustering.subspace import proximity
from clusterfl.errors import ConfigError
from clusterfl.protocol import (
    Predictor,
    SubspaceReply,
    SubspaceRequest,
    TrainReply,
    TrainRequest,
    mean_finite,
)
from clusterfl.records import RoundExtras

HISTORY_MAX_CLIENTS = 200  # above this, A and the linkage are not written into the history


class PACFLConfig(SampledConfig):
    """Settings of PACFL (`[algorithm] name = "pacfl"`)."""

    name: Literal["pacfl"] = "pacfl"
    display: ClassVar[str] = "PACFL"
    unnoised_signatures: ClassVar[str] = ("the top singular vectors of each client's data "
                                          "(its subspace signature)")
    fraction: float = Field(0.1, gt=0.0, le=1.0, description="share of the clients sampled "
                            "each round (the paper's and code's 0.1)")
    p: int = Field(3, ge=1, description="leading left singular vectors per basis (the "
                   "authors' headline script: 3; at most the input size)")
    per_label: bool = Field(False, description="one SVD per label held, stacked (the authors' "
                            "code) instead of one of the whole data (the paper)")
    proximity: Literal["smallest_angle", "angle_sum", "min_pair"] = Field(
        "smallest_angle", description="smallest principal angle (eq. 2), sum of angles of "
        "corresponding vectors (eq. 3) or the code's most aligned pair")
    linkage: Literal["average", "weighted", "complete", "single"] = Field(
        "average", description="HC linkage (weighted = the code's 'average')")
    threshold: Threshold = Field(
        None, gt=0.0, description="β in degrees: merge while the linkage distance ≤ β (the "
        "authors' code: 3.5; default none: the automatic cut, auto_cut)")
    n_clusters: int | None = Field(None, ge=1, description="cut into C clusters instead of β")
    max_clusters: int | None = max_clusters_field(
        "bound on the automatic C (threshold and n_clusters unset)")
    auto_cut: AutoCut = auto_cut_field()
    min_silhouette: float = min_silhouette_field()
    significance: float = Field(
        0.0, ge=0.0, lt=1.0, description=f"auto_cut 'silhouette': a cluster of at least "
        f"{SHUFFLE_MIN} clients is cut only if, beside min_silhouette, Algorithm 1's cut of its "
        "members' angles A (as similarities) is beyond shuffled ones at this level (CFL's "
        "shuffle test; rule v2, e.g. 0.002, not kept); 0 (default): min_silhouette alone")

    @model_validator(mode="after")
    def _one_cut(self) -> PACFLConfig:
        if self.n_clusters is not None and "threshold" in self.model_fields_set \
                and self.threshold is not None:
            raise ValueError("set algorithm.threshold or algorithm.n_clusters, not both")
        return self

    def ignored_settings(self) -> list[str]:
        return ignored_cut_options(self, ("auto_cut", "max_clusters", "min_silhouette",
                                          "significance"))

    @model_serializer(mode="wrap")
    def _dump_one_rule(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A dump that loads again: one sampling rule (as `SampledConfig`), no default β
        beside `n_clusters`, and `threshold = "none"` for no β (`dump_cut`)."""
        data = handler(self)
        if self.per_round is not None and isinstance(data, dict):
            data.pop("fraction", None)
        return dump_cut(data, self.threshold, self.n_clusters)

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
    silhouette: float | None = None  # best mean silhouette of the automatic cut (None: none)


@dataclass
class PACFLState:
    """What the PACFL server keeps between rounds.

    `models`: `[1, d]` (the initial model) until the clustering, then one row per cluster.
    `labels`: every client's cluster (-1 before). `bases` / `ranks`: the clients' bases
    (float32, zero-padded; rank 0 = none) for placing newcomers. `proximity`: A (degrees, +inf
    where a client has no basis); `linkage`: of the clients with a basis. The one-off step's
    numbers, repeated in every round's extras: `n_clusters_found`, `missing_signatures`,
    `signature_floats_up` / `_used` (see `PACFLExtras`), `clustering_seconds`, and
    `clustering_round`, the round it happened in.
    """

    models: torch.Tensor
    labels: np.ndarray
    clustering_round: int  # 0 before (no default: a checkpoint without it is refused)
    bases: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), np.float32))
    ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proximity: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    linkage: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    n_clusters_found: int = 0
    missing_signatures: int = 0
    signature_floats_up: float = 0.0
    signature_floats_used: float = 0.0
    clustering_seconds: float = 0.0
    silhouette: float | None = None  # best mean silhouette of the automatic cut (None: none)

    @property
    def clustered(self) -> bool:
        return self.clustering_round > 0


#: the phases of a round: the one-off bases (round 1 only), the training
SUBSPACES, TRAIN = "subspaces", "train"


def _bases(reply: SubspaceReply) -> list[np.ndarray]:
    return [reply.basis(i) for i in range(len(reply.clients))]


def pacfl_clusters(a: np.ndarray, n: int, good: np.ndarray,
                   cfg: PACFLConfig) -> tuple[Cut, np.ndarray]:
    """PACFL's cut: the proximity matrix `a` (degrees) of the clients `good` clustered by
    `linkage` and cut at β, into `n_clusters` or by `auto_cut` (`PACFLConfig.cut`); each of
    the other of the `n` clients its own cluster. Returns (the cut, the linkage)."""
    z = distance_linkage(a, cfg.linkage)
    threshold, k = cfg.cut()
    # rule v2 only (no copy of A for rule v1); cut_clients reads it in the silhouette cut only
    structured = both_structured(distance_similarity(a), cfg.significance,
                                 cfg.min_silhouette) if cfg.significance else None
    return cut_clients(z, n, good, threshold, k, cfg.max_clusters, cfg.auto_cut, a,
                       cfg.min_silhouette, structured), z


class PACFL(Algorithm[PACFLConfig, PACFLState]):
    """PACFL: one-shot clustering by principal angles of client data subspaces."""

    name = "pacfl"
    needs_real_inputs = "the subspaces of the clients' real-valued inputs"
    Config = PACFLConfig
    State = PACFLState
    device_update = True  # per-cluster means on the device (the subspaces come on the CPU)

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_clusters or 1, n_clients)

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        return unbound_max_clusters(self.config, n_clients)

    def check_input(self, input_shape: tuple[int, ...]) -> None:
        e = int(np.prod(input_shape))
        if self.config.p > e:  # a basis of R^e has at most e vectors: the rest is padding
            raise ConfigError("algorithm.p", f"p = {self.config.p} basis vectors exceed the "
                              f"input size e = {e}; allowed: 1..{e}")

    def setup(self, ctx: Context) -> None:
        cfg, n = self.config, ctx.n_clients
        self.check_input(tuple(ctx.factory.input_shape))
        self.input_dim = int(np.prod(ctx.factory.input_shape))
        self.n_labels = int(ctx.factory.n_outputs) if cfg.per_label else 0
        if cfg.per_label and self.n_labels < 2:
            raise ConfigError("algorithm.per_label", "a per-label SVD needs a classification "
                              "task (labels); allowed here: false")
        self.fits(n, ctx.rounds)
        self.state = PACFLState(ctx.factory.init(ctx.seed)[None].clone(),
                                np.full(n, -1, dtype=np.int64), 0)

    def _request(self, clients: np.ndarray) -> SubspaceRequest:
        cfg = self.config
        return SubspaceRequest(np.asarray(clients, dtype=np.int64), self.input_dim, p=cfg.p,
                               per_label=cfg.per_label, n_labels=self.n_labels)

    # ------------------------------------------------------------------ rounds
    def ask(self, state: PACFLState, t: int, phase: str, ctx: Context) -> Ask[Any]:
        """Before the first training: every client's basis (the one-off step). Each round: the
        sampled clients train their cluster's model."""
        if phase == FIRST and not state.clustered:
            return OneOffAsk(self._request(np.arange(len(state.labels))), SUBSPACES)
        clients = ctx.sample_round(self.config)
        return Ask(TrainRequest(clients, state.models, state.labels[clients], ctx.training,
                                ctx.next_seed()), TRAIN)

    def update(self, state: PACFLState, t: int, ask: Ask[Any],
               reply: Any) -> Update[PACFLState]:
        if ask.phase == SUBSPACES:
            assert isinstance(ask, OneOffAsk)
            done = self._clustered(state, t, ask, reply)
            return Update(done, then=TRAIN, warnings=lowered_cut(
                self.config.n_clusters, t, len(ask.request.clients),
                len(ask.request.clients) - done.missing_signatures, "a basis"))
        trained: TrainReply = reply
        models = average_members(state.models, trained.params, state.labels[trained.clients],
                                 trained.n_samples)
        state = replace(state, models=models)
        extras = PACFLExtras(
            train_loss=mean_finite(trained.loss), n_clusters_found=state.n_clusters_found,
            missing_signatures=state.missing_signatures,
            signature_floats_up=state.signature_floats_up,
            signature_floats_used=state.signature_floats_used,
            cluster_sizes=cluster_sizes(state.labels, len(models)))
        if state.clustering_round != t:
            return Update(state, extras)
        small = len(state.labels) <= HISTORY_MAX_CLIENTS
        a = state.proximity
        return Update(state, PACFLClusteringExtras(
            **extras.to_dict(),
            proximity=np.round(np.where(np.isfinite(a), a, -1.0), 4).tolist() if small
            else None,
            linkage=np.round(state.linkage, 6).tolist() if small else None,
            clustering_seconds=state.clustering_seconds,
            silhouette=None if state.silhouette is None else round(state.silhouette, 6)))

    def _clustered(self, state: PACFLState, t: int, ask: OneOffAsk[SubspaceReply],
                   reply: SubspaceReply) -> PACFLState:
        """The one-off step: A of the bases that arrived, the cut (`pacfl_clusters`), one
        model per cluster (all the initial model), the bases kept for placement."""
        request = ask.request
        assert isinstance(request, SubspaceRequest)
        n = len(state.labels)
        good = np.asarray(reply.clients, dtype=np.int64)
        a_good = proximity(_bases(reply), self.config.proximity)
        cut, z = pacfl_clusters(a_good, n, good, self.config)
        labels = cut.labels
        n_groups = int(labels.max(initial=-1)) + 1
        a = np.full((n, n), np.inf)
        a[np.ix_(good, good)] = a_good
        np.fill_diagonal(a, 0.0)
        bases = np.zeros((n, request.input_dim, request.columns()), dtype=np.float32)
        bases[good] = reply.bases.astype(np.float32)
        ranks = np.zeros(n, dtype=np.int64)
        ranks[good] = reply.ranks
        _, up = request.unit_cost()
        return replace(
            state, models=state.models[:1].repeat(max(n_groups, 1), 1),  # one start for all
            labels=labels, bases=bases, ranks=ranks, proximity=a, linkage=z,
            n_clusters_found=n_groups, missing_signatures=n - len(good),
            signature_floats_up=up * len(good),
            signature_floats_used=float(request.input_dim * int(ranks.sum())),
            clustering_seconds=ask.seconds(), clustering_round=t, silhouette=cut.silhouette)

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
            return Placement.nowhere(clients, st.models[:1])
        reply = ctx.send(self._request(clients))
        known = np.flatnonzero(st.ranks > 0)
        old = [st.bases[i, :, : st.ranks[i]].astype(np.float64) for i in known]
        dist = proximity(old, cfg.proximity, others=_bases(reply))
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
        return Placement.by_cluster(clients, out, st.models, details)


__all__ = ["PACFL", "PACFLClusteringExtras", "PACFLConfig", "PACFLExtras", "PACFLState",
           "pacfl_clusters"]
