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
  neither (the default), `auto_cut`: the divisive silhouette cut (`silhouette_cut`): a
  cluster is cut into the subtrees of highest mean silhouette under `metric` if it shows
  structure, and each part examined again. Whether a cluster of at least `SHUFFLE_MIN` clients
  shows structure is a test (issue 36): Algorithm 1's cut of its members' similarities is
  beyond `SHUFFLE_DRAWS` shuffles of them at level `significance` (0.002 since rule v3, 0.01
  in v2; `structure_pvalue`, CFL's shuffle test), on the members' update cosines (`tested =
  "cosines"`, the default), whatever the silhouette. Rule v4 (`"distance_rows"`, an option:
  tried as grid version v11 and not kept, docs/transfer.md): the similarities of the
  members' rows of the update distances (`profile_similarity`), and the best cut's
  silhouette must reach `min_silhouette` as well (`both_structured`). A smaller cluster, or
  any with `significance = 0` (rule v1), needs a silhouette of `min_silhouette` (0.25). Or
  `"gap"`, the largest gap between consecutive merge heights (`auto_n_clusters`), which
  always cuts somewhere, iid federations included. A raw threshold depends on the model, the
  learning rate and the local work, and the paper's recommended value is not known.
  Evidence for the defaults: docs/transfer.md.
- `warmup_rounds` n = 10 FedAvg rounds (ours; one third-party version uses 20); the
  clustering happens in round n + 1. A run of at most n rounds would never cluster (FedAvg
  under FL+HC's name): `setup` refuses it, naming `warmup_rounds`.
- Who takes part in the clustering round (`cluster_clients`): by default ("all") every
  client, whatever the sampling (the paper does not say; the one third-party version leaves
  unsampled clients as a TODO). The clustering round then costs N × (d down, d up) instead of
  the sampled share, and the server holds N updates and their pairwise distances: `setup`
  refuses "all" when those alone (`clustering_round_bytes`) exceed the machine's physical
  memory, naming `algorithm.cluster_clients`. Warm-up and per-cluster rounds sample
  (`fraction` / `per_round`, `Context.sample_round`).
- `cluster_clients` = a number M ≥ 2 or a fraction f in (0, 1] (ours, for cross-device
  federations): the clustering round asks M (or max(1, round(f·N))) clients, drawn without
  replacement from the run's generator (no draw when that is every client), and clusters
  their updates only. Every other client, and every asked client that did not answer, has
  no cluster yet (label -1, predicting with θ^n): in the first round after the clustering
  that samples it, it is placed first, by the newcomer rule below (it trains from θ^n, its
  update joins the cluster of the nearest mean clustering-round update; a second message
  of that round, before the cluster training), then trains its cluster's model with the
  others sampled. A client that does not answer its placement waits for its next sample.
  The server keeps one label per client and K centroids, nothing per client of size d.
- The clustering round is also the first round of per-cluster FedAvg: each cluster model
  becomes the sample-weighted mean of its members' models θ_k of that round (all of them
  started from θ^n, so this is FedAvg from θ^n inside each cluster).
- A client absent from the clustering round (it dropped out, or its update was rejected) has
  no update: with `cluster_clients` "all" it becomes its own cluster, whose model starts at
  θ^n (with a sample it is placed later, above). A fixed `n_clusters`
  larger than the updates that arrived is lowered to their number, with a warning
  (`oneshot.lowered_cut`).
- The clustering is never repeated.
- Placement of a newcomer (`placement`, not in the paper): it trains from θ^n, kept by the
  server, with the run's local training and sends its model; its update Δθ goes to the
  cluster whose mean update (the centroid of the members' clustering-round updates, kept by
  the server) is nearest under `metric`. The server keeps K centroids, not N updates.
  During the warm-up (one model) a newcomer joins cluster 0 with the global model, as
  FedAvg places.

The maths: `clusterfl.clustering.hierarchical` (`feature_linkage`, `flat_clusters`,
`pairwise_distances`, `nearest_centroid`); aggregation: `clusterfl.clustering.aggregate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BeforeValidator, Field, model_validator

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    Placement,
    SampledConfig,
    check_k_fits,
    check_warmup_leaves_rounds,
)
from clusterfl.algorithms.oneshot import (
    AutoCut,
    Cut,
    Threshold,
    auto_cut_field,
    cut_clients,
    ignored_cut_options,
    lowered_cut,
    max_clusters_field,
    min_silhouette_field,
    significance_field,
    unbound_max_clusters,
)
from clusterfl.clustering.aggregate import average_members, cluster_sizes, weighted_mean
from clusterfl.clustering.cosine import (
    SHUFFLE_MIN,
    both_structured,
    pairwise_cosine,
    profile_similarity,
    shuffle_structured,
)
from clusterfl.clustering.hierarchical import (
    feature_linkage,
    nearest_centroid,
    pairwise_distances,
)
from clusterfl.config_util import physical_memory_bytes
from clusterfl.errors import ConfigError
from clusterfl.protocol import Predictor, TrainReply, TrainRequest, mean_finite
from clusterfl.records import RoundExtras

HISTORY_MAX_CLIENTS = 200  # above this, the linkage is not written into the history
SIGNIFICANCE_HELP = (
    f"auto_cut 'silhouette': a cluster of at least {SHUFFLE_MIN} clients is cut (into its "
    "best-silhouette cut) only if Algorithm 1's cut of its members' similarities (see "
    "tested) is beyond shuffled ones at this level (CFL's shuffle test); smaller clusters, "
    "or all with 0 (rule v1), need min_silhouette")
CLUSTER_CLIENTS_ALLOWED = '"all", a number of clients >= 2, or a fraction in (0, 1]'


def _cluster_clients(value: Any) -> Any:
    """`cluster_clients`: "all" (any case), an integer ≥ 2 or a fraction in (0, 1]."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 2) or (
        isinstance(value, float) and 0.0 < value <= 1.0)
    if not ok:
        raise ValueError(f"allowed: {CLUSTER_CLIENTS_ALLOWED}")
    return value


#: who takes part in the clustering round: "all", a number of clients, or a fraction
ClusterClients = Annotated[Literal["all"] | int | float, BeforeValidator(_cluster_clients)]


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
    max_clusters: int | None = max_clusters_field(
        "bound on the automatic C (threshold and n_clusters unset)")
    auto_cut: AutoCut = auto_cut_field()
    min_silhouette: float = min_silhouette_field()
    significance: float = significance_field(SIGNIFICANCE_HELP)
    test_every: bool = Field(
        True, description="the structure test (significance) for every cluster the cut "
        "examines; false: for the whole federation only, min_silhouette below it")
    tested: Literal["cosines", "distance_rows"] = Field(
        "cosines", description="what the structure test reads: 'cosines' (rules v2, v3), the "
        "update cosines, the test alone; 'distance_rows' (rule v4, not kept), the "
        "similarities of the clients' rows of update distances, and a cut needs "
        "min_silhouette too")
    cluster_clients: ClusterClients = Field(
        "all", description="clients asked in the clustering round: 'all' (the paper's), a "
        "number >= 2 or a fraction in (0, 1] drawn at random; the others are placed by the "
        "newcomer rule when first sampled after it")

    @model_validator(mode="after")
    def _consistent(self) -> FLHCConfig:
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError(f"linkage 'ward' needs metric 'euclidean', not {self.metric!r}; "
                             "allowed with other metrics: average, complete, single")
        if self.threshold is not None and self.n_clusters is not None:
            raise ValueError("set algorithm.threshold or algorithm.n_clusters, not both")
        return self

    def ignored_settings(self) -> list[str]:
        return ignored_cut_options(self, ("auto_cut", "max_clusters", "min_silhouette",
                                          "significance", "test_every", "tested"))


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


@dataclass(kw_only=True)
class FLHCSampledClusteringExtras(FLHCClusteringExtras):
    """The clustering round when it clusters a sample (`cluster_clients` not "all")."""

    asked: int = 0  # clients asked for an update in the clustering round
    unplaced: int = 0  # clients without a cluster after it (not asked, or no update)


@dataclass(kw_only=True)
class FLHCPlacedExtras(FLHCExtras):
    """A round after a clustering of a sample: who was placed in it, who is still waiting."""

    placed: int = 0  # sampled clients placed into a cluster at the start of this round
    unplaced: int = 0  # clients without a cluster after the round


@dataclass
class FLHCRound:
    """A round after a clustering of a sample, between its two messages: the round's sample
    and how many of it were just placed (never in a checkpoint: a round ends without it)."""

    sample: np.ndarray
    placed: int = 0


@dataclass
class FLHCState:
    """What the FL+HC server keeps between rounds.

    `models`: `[1, d]` (the global model) during the warm-up, one row per cluster after.
    `labels`: every client's cluster (-1 before the clustering, and after a clustering of a
    sample for a client not placed yet). `rounds_done`: rounds run. `anchor`: θ^n, the model
    of the clustering round; `centroids`: each cluster's mean clustering-round update (both
    for placing newcomers and not yet clustered clients; empty before the clustering).
    `round`: the work of a round in progress (None between rounds).
    """

    models: torch.Tensor
    labels: np.ndarray
    rounds_done: int = 0
    clustered: bool = False
    anchor: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    centroids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    round: FLHCRound | None = None


#: the phase of the clustering round (n + 1)
CLUSTERING = "clustering"
#: after a clustering of a sample: not yet clustered sampled clients are placed first
PLACE = "place"
#: ... then the round's placed clients train their clusters' models
TRAIN = "train"


def clustering_round_bytes(n_clients: int, d: int, auto_cut: str, cut_by_default: bool) -> int:
    """A lower bound on the memory of a clustering round of all `n_clients`: their float32
    models (4·N·d B) and float64 updates (8·N·d), the linkage's condensed distances
    (8·N(N−1)/2) and, for the silhouette cut, the `[N, N]` float64 distances, symmetrised
    (3 · 8·N²: the matrix, its symmetric copy and the root's block)."""
    n = int(n_clients)
    total = 12 * n * int(d) + 4 * n * (n - 1)
    if cut_by_default and auto_cut == "silhouette":
        total += 24 * n * n
    return total


def flhc_clusters(updates: np.ndarray, n: int, good: np.ndarray,
                  cfg: FLHCConfig) -> tuple[Cut, np.ndarray]:
    """FL+HC's cut: the clients `good`'s updates (rows of `updates`) clustered by `metric` and
    `linkage`, cut at `threshold`, into `n_clusters` or by `auto_cut`; each of the other of
    the `n` clients its own cluster. Returns (the cut of the n clients, the linkage)."""
    z = feature_linkage(updates, cfg.metric, cfg.linkage)
    distances = pairwise_distances(updates, updates, cfg.metric) \
        if cfg.auto_cut == "silhouette" else None
    structured = None  # a cluster shows groups: the shuffle test (module docstring)
    if distances is not None and cfg.significance > 0:
        structured = shuffle_structured(pairwise_cosine(updates), cfg.significance,
                                        cfg.min_silhouette, cfg.test_every) \
            if cfg.tested == "cosines" else both_structured(
                profile_similarity(distances), cfg.significance, cfg.min_silhouette,
                cfg.test_every)
    return cut_clients(z, n, good, cfg.threshold, cfg.n_clusters, cfg.max_clusters,
                       cfg.auto_cut, distances, cfg.min_silhouette, structured), z


class FLHC(Algorithm[FLHCConfig, FLHCState]):
    """FL+HC: FedAvg warm-up, one hierarchical clustering of updates, FedAvg per cluster."""

    name = "flhc"
    Config = FLHCConfig
    State = FLHCState
    device_update = True  # per-cluster means on the device; the one clustering on the host

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_warmup_leaves_rounds(self.config.warmup_rounds, rounds, "FedAvg")
        check_k_fits(self.config.n_clusters or 1, n_clients)

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        return unbound_max_clusters(self.config, n_clients)

    def setup(self, ctx: Context) -> None:
        cfg, n = self.config, ctx.n_clients
        self.fits(n, ctx.rounds)
        self.state = FLHCState(models=ctx.factory.init(ctx.seed)[None].clone(),
                               labels=np.full(n, -1, dtype=np.int64))
        if cfg.cluster_clients == "all":
            self._check_fits(n, int(self.state.models.shape[1]))

    def _check_fits(self, n: int, d: int) -> None:
        """Refuse a clustering round of every client whose updates and distances alone
        exceed the machine's physical memory (it would be killed, or swap for hours)."""
        cfg, have = self.config, physical_memory_bytes()
        need = clustering_round_bytes(n, d, cfg.auto_cut,
                                      cfg.threshold is None and cfg.n_clusters is None)
        if have is not None and need > have:
            raise ConfigError("algorithm.cluster_clients", f"'all' clusters the updates of "
                              f"all {n:,} clients at once, at least {need / 2**30:.1f} GiB, "
                              f"more than this machine's {have / 2**30:.1f} GiB; allowed: "
                              f"{CLUSTER_CLIENTS_ALLOWED} (e.g. the clients sampled a round)")

    def _clustering_sample(self, ctx: Context) -> np.ndarray:
        """The clients asked in the clustering round (`cluster_clients`, module docstring)."""
        value, n = self.config.cluster_clients, ctx.n_clients
        if value == "all":
            return np.arange(n)
        m = value if isinstance(value, int) else max(1, round(value * n))
        if m >= n:
            return np.arange(n)
        return np.sort(ctx.rng.choice(n, size=m, replace=False))

    def ask(self, state: FLHCState, t: int, phase: str,
            ctx: Context) -> Ask[TrainReply] | Update[FLHCState]:
        """Warm-up and cluster rounds: the sampled clients train their (cluster's) model. The
        clustering round: every client (or `cluster_clients` of them) trains from θ^n. After
        a clustering of a sample, a round whose sample holds clients not placed yet asks them
        first (PLACE: they train from θ^n), then its placed clients train (TRAIN)."""
        if phase == PLACE:
            assert state.round is not None
            waiting = state.round.sample[state.labels[state.round.sample] < 0]
            return Ask(TrainRequest(waiting, state.anchor, np.zeros(len(waiting), np.int64),
                                    ctx.training, ctx.next_seed()), PLACE)
        if phase == TRAIN:
            assert state.round is not None
            clients = state.round.sample[state.labels[state.round.sample] >= 0]
            return Ask(TrainRequest(clients, state.models, state.labels[clients],
                                    ctx.training, ctx.next_seed()), TRAIN)
        if not state.clustered and state.rounds_done + 1 > self.config.warmup_rounds:
            clients = self._clustering_sample(ctx)
            return Ask(TrainRequest(clients, state.models[:1].clone(),
                                    np.zeros(len(clients), np.int64), ctx.training,
                                    ctx.next_seed()), CLUSTERING)
        clients = ctx.sample_round(self.config)
        if state.clustered and (state.labels[clients] < 0).any():  # only after a sample
            return Update(replace(state, round=FLHCRound(clients)), then=PLACE)
        return Ask(TrainRequest(clients, state.models, np.maximum(state.labels[clients], 0),
                                ctx.training, ctx.next_seed()))

    def update(self, state: FLHCState, t: int, ask: Ask[Any],
               reply: TrainReply) -> Update[FLHCState]:
        if ask.phase == PLACE:
            return self._placed(state, reply)
        work = state.round
        state = replace(state, rounds_done=state.rounds_done + 1, round=None)
        if ask.phase == CLUSTERING:
            return self._clustered(state, t, ask, reply)
        loss = mean_finite(reply.loss)
        if not state.clustered:  # FedAvg warm-up
            if len(reply.clients):
                state = replace(state, models=weighted_mean(reply.params, reply.n_samples)[None])
            return Update(state, FLHCExtras(train_loss=loss, warmup=1))
        models = average_members(state.models, reply.params, state.labels[reply.clients],
                                 reply.n_samples)
        k = len(models)
        new = replace(state, models=models)
        if self.config.cluster_clients == "all":
            return Update(new, FLHCExtras(train_loss=loss, n_clusters_found=k,
                                          cluster_sizes=cluster_sizes(state.labels, k)))
        return Update(new, FLHCPlacedExtras(
            train_loss=loss, n_clusters_found=k, cluster_sizes=cluster_sizes(state.labels, k),
            placed=0 if work is None else work.placed,
            unplaced=int(np.count_nonzero(state.labels < 0))))

    def _placed(self, state: FLHCState, reply: TrainReply) -> Update[FLHCState]:
        """PLACE: each answering client's update from θ^n joins the cluster of the nearest
        centroid (`nearest_centroid`), as a newcomer's would (`placement`)."""
        assert state.round is not None
        labels = state.labels.copy()
        if len(reply.clients):
            updates = (reply.params - state.anchor).to(torch.float64).cpu().numpy()
            labels[reply.clients] = nearest_centroid(updates, state.centroids.cpu().numpy(),
                                                     self.config.metric)[0]
        work = replace(state.round, placed=int(np.count_nonzero(labels[reply.clients] >= 0)))
        return Update(replace(state, labels=labels, round=work), then=TRAIN)

    def _clustered(self, state: FLHCState, t: int, ask: Ask[Any],
                   reply: TrainReply) -> Update[FLHCState]:
        """The clustering round: the updates Δθ_k = θ_k − θ^n cut into clusters
        (`flhc_clusters`), each cluster's model the mean of its members' θ_k. Of all clients,
        an absent one is its own cluster; of a sample, only the answering ones get a cluster
        (the others: -1, placed later)."""
        n, every = len(state.labels), self.config.cluster_clients == "all"
        anchor = state.models[:1].clone()
        good = np.asarray(reply.clients, dtype=np.int64)
        updates = (reply.params - anchor).to(torch.float64)
        m = n if every else len(good)
        cut, z = flhc_clusters(updates.cpu().numpy(), m, good if every else np.arange(m),
                               self.config)  # the one clustering: on the host
        if every:
            labels = cut.labels
        else:
            labels = np.full(n, -1, dtype=np.int64)
            labels[good] = cut.labels
        k = max(int(labels.max(initial=-1)) + 1, 1)
        models = average_members(anchor.repeat(k, 1), reply.params, labels[good],
                                 reply.n_samples)
        centroids = torch.full((k, anchor.shape[1]), float("nan"), dtype=torch.float64,
                               device=updates.device)
        for c in np.unique(labels[good]):  # a cluster of absent clients has no centroid
            rows = torch.from_numpy(np.flatnonzero(labels[good] == c)).to(updates.device)
            centroids[int(c)] = updates[rows].mean(0)
        new = replace(state, models=models, labels=labels, clustered=True, anchor=anchor,
                      centroids=centroids)
        asked = len(ask.request.clients)
        common: dict[str, Any] = dict(
            train_loss=mean_finite(reply.loss), n_clusters_found=k,
            cluster_sizes=cluster_sizes(labels, k), missing_updates=asked - len(good),
            silhouette=None if cut.silhouette is None else round(cut.silhouette, 6),
            linkage=np.round(z, 6).tolist() if m <= HISTORY_MAX_CLIENTS else None)
        said = lowered_cut(self.config.n_clusters, t, asked, len(good), "an update", every)
        if every:
            return Update(new, FLHCClusteringExtras(**common), warnings=said)
        return Update(new, FLHCSampledClusteringExtras(
            **common, asked=asked, unplaced=int(np.count_nonzero(labels < 0))), warnings=said)

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        st = self.state
        return st.labels.copy() if st.clustered else np.zeros(len(st.labels), np.int64)

    def predictor(self) -> Predictor:
        """Each client on its cluster's model; after a clustering of a sample, a client not
        placed yet on θ^n (an extra last row of the models)."""
        st = self.state
        if st.clustered and (st.labels < 0).any():
            k = len(st.models)
            return Predictor.single(torch.cat([st.models, st.anchor.to(st.models.dtype)]),
                                    np.where(st.labels < 0, k, st.labels))
        return Predictor.single(st.models, np.maximum(self.assignment(), 0))

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
        nearest, dist = nearest_centroid(updates, st.centroids.numpy(), cfg.metric)
        out = np.full(len(clients), -1, dtype=np.int64)
        details: list[dict[str, Any]] = [{"answered": False} for _ in clients]
        for row, c in enumerate(np.asarray(reply.clients).tolist()):
            i = int(np.flatnonzero(clients == c)[0])
            out[i] = int(nearest[row])
            details[i] = {"answered": True, "distance": round(float(dist[row]), 6)}
        return Placement.by_cluster(clients, out, st.models, details)


__all__ = ["FLHC", "FLHCClusteringExtras", "FLHCConfig", "FLHCExtras", "FLHCPlacedExtras",
           "FLHCRound", "FLHCSampledClusteringExtras", "FLHCState", "clustering_round_bytes",
           "flhc_clusters"]
