"""FeSEM, multi-center federated learning (Xie et al. 2021), as used by CAM (Ma et al. 2023).

The server keeps K centers Θ_1..Θ_K. Each round the sampled clients train from their assigned
center with the proximal pull λ/2 ||θ_i − Θ_c(i)||² (`LocalTraining.mu`); the server then runs
a few weighted k-means iterations on the returned client models, starting from the current
centers (assignment c(i) = argmin_k ||θ_i − Θ_k||², update Θ_k = Σ_{i∈C_k} n_i θ_i / Σ n_i;
CAM Eq. 10-11, implemented in `clusterfl.clustering.kmeans.lloyd`).

Choices the papers leave open, and ours:
- Distances may read only some layers (`kmeans_layers`): "all" (default; FeSEM measures the
  whole model), "linear" (the parameters of every `nn.Linear` module — the fully-connected
  layers CAM §5 uses for FeSEM-CAM) or a list of parameter-name prefixes. Whatever the
  distance reads, the centers are the weighted means of the members' full parameter vectors.
- First clustering: before any clustering exists, clients train from one common initial model
  Θ_0 (optionally for `warmup_rounds` rounds of local training only, continuing their own
  models, as CAM's FeSEM-CAM warm-up does); the server then runs weighted k-means with
  `kmeans_restarts` seeded k-means++ starts on the uploaded models. With independent random
  centers instead, distances would be dominated by the initialisations and never by the data.
- A center left without members (no client of the whole federation assigned to it, not
  only none of the round's) is restarted from the round's client model farthest from its own
  center, among clusters that keep another member (`empty_centers = "reseed"`, the default;
  scikit-learn's k-means relocates its empty clusters the same way), and Lloyd runs again
  from the new centers on the round's clients. A center that lost its members is otherwise
  stale for good: its model stopped training when its last member left, so no client is ever
  nearest to it again, and two true clusters stay merged in another center (rotated MNIST,
  a quarter of the clients per round, seed 2: sizes 0/8/8/16 from round 5 to 100, ARI 0.69).
  `empty_centers = "keep"` keeps the empty center's parameters (FeSEM before this option).
- λ defaults to 0.01 (CAM chooses λ from {0.001, 0.01, 0.1} per experiment).
- Clients not sampled keep their cluster; a client never clustered trains from (and is
  evaluated with) Θ_0. With a sample, clients first sampled after the first clustering then
  start far from every trained center, closest to the least-trained one, and k-means tends to
  put them all there (rotated MNIST, 32 clients, fraction 0.25: final ARI 0.39-0.60 over 3
  seeds, against 1 with every client). So by default (`newcomer_start = "least_loss"`, our
  rule) such a client first gets the K centers (a `LossRequest`, K·d floats down, K losses
  up) and starts from the center of least training loss, IFCA's rule; k-means still decides
  its cluster. Its training request then books the start model once more (the request is
  the same for every client). With every client every round no client is ever a newcomer
  (all are clustered in round 1), so the option changes nothing there;
  `newcomer_start = "start"` is FeSEM's own behaviour (start from Θ_0).
- With a sample and no warm-up, the first k-means waits until `first_clustering` (default
  0.5) of the clients have sent a model trained from Θ_0 (models of one start are comparable
  whatever the round; a client sampled again replaces its model), then clusters all of them
  with the k-means++ restarts. Clustering the first sample alone (a quarter of 32 clients: 8
  models, about 2 per true cluster) can leave a local optimum that Lloyd never leaves, since
  every member trains from its own center: rotated MNIST, seed 2, two rotations shared one
  center and another rotation two centers to the end (ARI 0.62, even with the reseeding
  below). Until then every sampled client trains from Θ_0 and is evaluated with it. With
  every client every round the first round has them all: nothing changes.
  `first_clustering = 0` clusters the first round's sample (FeSEM's own).
- Sampling (`fraction` or `per_round`, `SampledConfig`) applies to every round after the
  warm-up. The warm-up's local training (no communication: the models stay on the devices)
  uses every client, and in the last warm-up round every client uploads its model for the
  first clustering, so that every client starts clustered (a round record then counts all
  clients as participants).
- Memory (ours, exact): the models gathered for the first k-means (`first`) and the
  warm-up's client models (`local`) are kept in a temporary file mapped into memory
  (`engine.allocator.disk_rows`: the bytes written, read back as they were, their pages
  given back to the system after each round), so they hold no memory between rounds; the
  first k-means reads the gathered models into memory (in id order, as before), the
  warm-up's requests and its k-means read the table. A round writes only the rows of the
  clients that answered. A checkpoint copies the table into memory (as a tensor), and a
  resumed run writes it to a new file at its next round.
- Clients absent from a reply (dropped out, or rejected by the guard — NaN/Inf parameters,
  absurd norms; `clusterfl.robust`) keep their previous cluster and are left out of k-means.

Placing a client that did not train (`placement`; the papers do not place newcomers, the rule
is ours). A trained member of cluster k trains from Θ_k with the pull λ and the E-step keeps
it at the center its trained model is nearest to. The newcomer therefore trains once from
every center, as a member of that cluster would (K `TrainRequest`s, one round of the `[train]`
local training with the pull λ, the same seed so every start sees the same minibatches), and
is placed at the center its training moves least from: argmin_k ‖θ^(k) − Θ_k‖² on the layers
the E-step reads (`kmeans_layers`). This is the E-step's distance at the one start from which
the newcomer's local model stays at its center. Training once from the common start Θ_0 and
taking the nearest center (what FeSEM does with a client sampled for the first time) is not
used: after one round from Θ_0 the distance to a center is dominated by how far that center
drifted from Θ_0, not by the client's data. Before the first clustering the client gets -1
and Θ_0. The client predicts with the chosen center.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

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
    one_cluster_ignores,
)
from clusterfl.clustering.aggregate import cluster_sizes
from clusterfl.clustering.kmeans import farthest_movable, kmeans, lloyd, weighted_centroids
from clusterfl.config_util import changed_fields
from clusterfl.engine.allocator import disk_room, disk_rows, disk_write, drop_resident
from clusterfl.engine.transfer import STAYS
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory
from clusterfl.models.params import linear_layer_prefixes
from clusterfl.protocol import (
    LossRequest,
    Pick,
    Predictor,
    Steps,
    TrainReply,
    TrainRequest,
    join,
    mean_finite,
    select,
)
from clusterfl.records import RoundExtras

LayerSpec = Literal["all", "linear"] | list[str]


class FeSEMConfig(SampledConfig):
    """Settings of FeSEM (`[algorithm] name = "fesem"`)."""

    name: Literal["fesem"] = "fesem"
    display: ClassVar[str] = "FeSEM"
    averages_noise_groups: ClassVar[bool] = False  # k-means regroups the trained models
    n_clusters: int = Field(5, ge=1, description="K, the number of centers")
    lam: float = Field(0.01, ge=0.0, description="λ, proximal pull toward the center")
    kmeans_layers: LayerSpec = Field(
        "all", description='parameters k-means measures: "all", "linear" (fully-connected '
        "layers) or a list of parameter-name prefixes")
    kmeans_iters: int = Field(10, ge=1, description="k-means iterations per round (at most)")
    kmeans_restarts: int = Field(5, ge=1, description="k-means++ starts of the first clustering")
    warmup_rounds: int = Field(
        0, ge=0, description="rounds of local training only before the first clustering")
    newcomer_start: Literal["start", "least_loss"] = Field(
        "least_loss", description="where a client not yet clustered starts once centers "
        "exist: the center of least training loss (one loss request) or the common start Θ_0")
    first_clustering: float = Field(
        0.5, ge=0.0, le=1.0, description="with a sample and no warm-up: the share of the "
        "clients whose models, trained from Θ_0, the first k-means waits for (0: the first "
        "round's sample, FeSEM's own)")
    empty_centers: Literal["reseed", "keep"] = Field(
        "reseed", description="a center left without members: restart it from the round's "
        "client farthest from its center, or keep its parameters")

    def ignored_settings(self) -> list[str]:
        """With K = 1 k-means has one center, every client's, never empty: settled at once.
        After a warm-up no client is unclustered (its last round's k-means takes every
        client's table row, answered or not), so the options for such a client never act."""
        out = one_cluster_ignores(self, ("kmeans_iters", "kmeans_restarts", "empty_centers"),
                                  what="one center, which every client joins")
        if self.warmup_rounds > 0:
            out += [f"algorithm.{o} = {getattr(self, o)!r} does nothing: algorithm."
                    f"warmup_rounds = {self.warmup_rounds} (the last warm-up round's k-means "
                    "clusters every client, so no client is ever waiting for a cluster)"
                    for o in changed_fields(self, "newcomer_start", "first_clustering")]
        return out

    def partial_round_settings(self) -> list[str]:
        """Where a client not yet clustered starts, and how many models the first k-means
        waits for: both act only while some client has sent no model (never, when every
        client answers every round: all are clustered in the first round). After a warm-up:
        never, whoever answers (`ignored_settings` says so)."""
        if self.warmup_rounds > 0:
            return []
        return [f"algorithm.{o} = {getattr(self, o)!r}"
                for o in changed_fields(self, "newcomer_start", "first_clustering")]


@dataclass(kw_only=True)
class KMeansExtras(RoundExtras):
    """The server's k-means step, in the extras of the FeSEM and FeSEM-CAM rounds it ran in."""

    kmeans_iters: int = 0  # Lloyd iterations (center updates) performed
    kmeans_converged: int = 0  # 1 if the assignment settled within kmeans_iters
    kmeans_inertia: float = math.nan  # weighted k-means objective Σ n_i ||θ_i − Θ_c(i)||²
    kmeans_reseeded: int = 0  # centers without members restarted from a far client model


@dataclass(kw_only=True)
class FeSEMExtras(KClusterExtras):
    """FeSEM's extras in a round without k-means: a warm-up round but the last, or a round in
    which no client answered."""

    train_loss: float | None = None  # mean local training loss of the clients that answered


@dataclass(kw_only=True)
class FeSEMKMeansExtras(FeSEMExtras, KMeansExtras):
    """FeSEM's extras in a round whose k-means ran: the last warm-up round and every later
    round in which a client answered."""


def layer_index(factory: ModelFactory, spec: LayerSpec) -> torch.Tensor | None:
    """Flat positions k-means reads: None for all, else the chosen layers' positions."""
    if spec == "all":
        return None
    if spec == "linear":
        prefixes = linear_layer_prefixes(factory.build())
        if not prefixes:
            raise ValueError(f"model {factory.name!r} has no nn.Linear layer for k-means")
        return factory.layout.index(prefixes)
    return factory.layout.index(list(spec))


def _select(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x[:, index.to(x.device)]


def reseed_empty(
    assign: np.ndarray, centers: torch.Tensor, clients: np.ndarray, params: torch.Tensor,
    n_samples: np.ndarray, index: torch.Tensor | None, iters: int, km: KMeansExtras,
) -> tuple[np.ndarray, torch.Tensor, KMeansExtras]:
    """Restart every center without members (in the whole federation's `assign`) from a far
    model of the round (`farthest_movable`), then Lloyd again from the new centers on the
    round's clients (module doc); unchanged when no center is empty or no client can move."""
    sizes = np.bincount(assign[assign >= 0], minlength=len(centers))
    empty = np.flatnonzero(sizes == 0)
    x = _select(params, index)
    picks = farthest_movable(x, assign[clients], _select(centers, index), sizes, len(empty))
    if not picks:
        return assign, centers, km
    start = centers.clone()
    for j, i in zip(empty, picks):
        start[int(j)] = params[i]
    res = lloyd(x, _select(start, index), n_samples, max_iter=iters)
    out = assign.copy()
    out[clients] = res.labels
    return out, weighted_centroids(params, res.labels, n_samples, start), KMeansExtras(
        kmeans_iters=km.kmeans_iters + res.n_iter, kmeans_converged=int(res.converged),
        kmeans_inertia=res.inertia, kmeans_reseeded=len(picks))


def cluster_step(
    cfg: FeSEMConfig, index: torch.Tensor | None, assign: np.ndarray,
    centers: torch.Tensor | None, start: torch.Tensor, clients: np.ndarray,
    params: torch.Tensor, n_samples: np.ndarray, seed: int,
) -> tuple[np.ndarray, torch.Tensor, KMeansExtras]:
    """FeSEM's server step: k-means on (the `index` layers of) the round's models (`clients`'
    rows of `params`) → the whole federation's assignment (clients not in the round keep
    theirs), the `[K, d]` centers (weighted means of the members' full vectors; a center
    without members keeps its value, Θ_0 at the first clustering) and the step's extras.
    `centers` None: the first clustering, `kmeans_restarts` k-means++ starts drawn from
    `seed`; otherwise Lloyd from the current centers, so cluster ids stay stable. Then, with
    `empty_centers = "reseed"`, `reseed_empty`. It runs where `params` are (a GPU's replies
    stay there; `centers` and `start` join them) and returns the centers there."""
    x, w = _select(params, index), np.asarray(n_samples)
    start = start.to(params.device)
    centers = None if centers is None else centers.to(params.device)
    if centers is None:
        res = kmeans(x, min(cfg.n_clusters, len(x)), np.random.default_rng(seed), w,
                     n_init=cfg.kmeans_restarts, max_iter=cfg.kmeans_iters)
        previous = start[None].repeat(cfg.n_clusters, 1)
    else:
        res = lloyd(x, _select(centers, index), w, max_iter=cfg.kmeans_iters)
        previous = centers
    km = KMeansExtras(kmeans_iters=res.n_iter, kmeans_converged=int(res.converged),
                      kmeans_inertia=res.inertia)
    new = weighted_centroids(params, res.labels, w, previous)
    out = assign.copy()
    out[clients] = res.labels
    if cfg.empty_centers == "reseed":
        return reseed_empty(out, new, clients, params, w, index, cfg.kmeans_iters, km)
    return out, new, km


@dataclass
class KMeansInput:
    """The models a round hands to its k-means (the `KMEANS` phase): kept in the state from
    the round's replies to its k-means only, so None between rounds (and in checkpoints)."""

    clients: np.ndarray  # whose models, row by row
    params: torch.Tensor = field(metadata=STAYS)  # [n, d], where the replies left them
    n_samples: np.ndarray  # the k-means weights
    losses: list[float | None]  # the round's mean training loss(es), for its extras
    warmup: int  # 1 in the last warm-up round


@dataclass
class FeSEMState:
    start: torch.Tensor  # [d], Θ_0, the common start before clustering
    assign: np.ndarray  # [n_clients], cluster of each client (-1: never clustered)
    centers: torch.Tensor | None  # [K, d] once the first clustering ran
    #: [n_clients, d], the warm-up's client models (a `disk_rows` table, written in place;
    #: None before the first warm-up round's reply and after the warm-up)
    local: torch.Tensor | None = field(metadata=STAYS)  # in host memory (`STAYS`)
    #: models trained from Θ_0 kept for the first k-means while a sample gathers them
    #: (`first_clustering`; None otherwise): one row per client that sent one, in the order
    #: they first sent one (a `disk_rows` table, written in place), so the file grows with
    #: the clients sampled and memory not at all
    first: torch.Tensor | None = field(default=None, kw_only=True, metadata=STAYS)
    #: [n_clients], each client's row of `first` (-1: none sent yet)
    first_row: np.ndarray | None = field(default=None, kw_only=True)
    pending: KMeansInput | None = field(default=None, kw_only=True)  # see `KMeansInput`


def _gather_first(first: torch.Tensor | None, row: np.ndarray | None, n: int,
                  clients: np.ndarray, params: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The models trained from Θ_0 gathered so far (`first`, client i's in row `row[i]`)
    with the round's (`clients`' rows of `params`; a client sent again has its row
    rewritten): rows of the clients seen, in the order they first sent one, in a
    `disk_rows` table written in place (only the round's rows), its pages then given back.
    A table of another kind (read from a checkpoint) is first copied into a new file."""
    row = np.full(n, -1, dtype=np.int64) if row is None else row.copy()
    used = 0 if first is None else len(first)
    new = clients[row[clients] < 0]
    row[new] = used + np.arange(len(new))
    room = disk_room(first)
    if room is None or len(room) < used + len(new):
        room = disk_rows(n, params.shape[1], params.dtype)
        for a in range(0, used, _CHUNK):  # a checkpoint's table
            assert first is not None
            b = min(used, a + _CHUNK)
            disk_write(room, np.arange(a, b), first[a:b])
    table = room[:used + len(new)]
    disk_write(table, row[clients], params)
    drop_resident(table)  # what the system mapped in, if anything
    return table, row


#: rows written into a `disk_rows` table at a time: 100 MB of MLP rows
_CHUNK = 1024


def is_sorted(clients: np.ndarray) -> bool:
    """Ids in increasing order, none twice (a round's sample, as drawn)."""
    return bool(np.all(np.diff(clients) > 0))


def first_models(first: torch.Tensor, row: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    """The clients that sent a model trained from Θ_0, by id, and their models (in memory,
    in that order): the first k-means' input."""
    ids = np.flatnonzero(row >= 0)
    return ids, first[torch.from_numpy(row[ids])]


@dataclass(frozen=True, kw_only=True)
class FeSEMAsk(Ask[Any]):
    """A round's message and how to read its reply: `clients` the round's clients (the order
    of every reply's rows), `parts` the requests each of them got (FeSEM 1, FeSEM-CAM 2),
    `newcomers` whether the message starts with the newcomers' `LossRequest`."""

    clients: np.ndarray
    parts: int
    newcomers: bool


#: the phase of the warm-up's local training, and of a round's k-means (after the replies:
#: it draws the k-means seed, so a round without k-means draws none, as before)
WARMUP, KMEANS = "warmup", "kmeans"


class FeSEM(Algorithm[FeSEMConfig, FeSEMState]):
    """FeSEM: proximal local training from the assigned center, then k-means on the models."""

    name = "fesem"
    Config = FeSEMConfig
    State: ClassVar[type] = FeSEMState  # FeSEM-CAM's State extends it
    #: on a GPU the round's models stay there for its k-means (`KMeansInput.params`); the
    #: host tables (`local`, `first`) receive only the rows of the clients that answered
    device_update = True

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_clusters, n_clients)
        check_warmup_leaves_rounds(self.config.warmup_rounds, rounds, "local training only",
                                   clusters_in_last=True)
        cfg = self.config  # without a warm-up the first k-means waits for `first_clustering`
        k, need = cfg.per_round_count(n_clients), math.ceil(cfg.first_clustering * n_clients)
        if rounds is not None and cfg.warmup_rounds == 0 and k * rounds < need:
            raise ConfigError("algorithm.first_clustering", f"{cfg.first_clustering} waits for "
                              f"the models of {need} of the {n_clients} clients before the "
                              f"first k-means, and {k} a round ({cfg.sampling_setting()}) send "
                              f"at most {k * rounds} in {rounds} rounds: the run would never "
                              f"cluster; allowed: at most {k * rounds / n_clients:.4g}, or more "
                              "rounds, a larger sample or warmup_rounds")

    def setup(self, ctx: Context) -> None:
        self.fits(ctx.n_clients, ctx.rounds)
        self.state = FeSEMState(ctx.factory.init(ctx.seed),
                                np.full(ctx.n_clients, -1, dtype=np.int64), None, None)
        self.index = layer_index(ctx.factory, self.config.kmeans_layers)
        self.train_sizes = np.asarray(ctx.train_sizes)  # the first k-means' weights

    def migrate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Checkpoints of before kept the gathered models in id order, marked by
        `first_seen` (a table of every client's, earlier still): to rows and `first_row`."""
        if "first_seen" not in state:
            return state
        out = {k: v for k, v in state.items() if k != "first_seen"}
        seen, first = state["first_seen"], state.get("first")
        if seen is not None:
            seen = np.asarray(seen, dtype=bool)
            if first is not None and first.shape[0] != np.count_nonzero(seen):
                first = first[torch.from_numpy(seen)]
            out["first_row"] = np.where(seen, np.cumsum(seen) - 1, -1).astype(np.int64)
            out["first"] = first
        return out

    # ------------------------------------------------------------------ rounds
    def ask(self, state: FeSEMState, t: int, phase: str,
            ctx: Context) -> Ask[Any] | Update[FeSEMState]:
        """Warm-up: every client continues its own model (the last warm-up round uploads it
        for the first clustering). Then: the sampled clients train from their center (with
        the pull λ), in one message with the newcomers' center losses (`_message`). The
        k-means phase needs no message: it draws its seed and runs `cluster_step`."""
        if phase == KMEANS:
            return self._kmeans(state, ctx.next_seed())
        if t <= self.config.warmup_rounds:
            clients = np.arange(ctx.n_clients)
            models, rows = self._local(state)
            return Ask(TrainRequest(clients, models, rows, ctx.training,
                                    ctx.next_seed(), models_held=True,
                                    keep_local=t != self.config.warmup_rounds), WARMUP)
        clients = ctx.sample_round(self.config)
        starts, start_of = self.starts(state, clients)
        return self._message(state, clients, [TrainRequest(
            clients, starts, start_of, replace(ctx.training, mu=self.config.lam),
            ctx.next_seed())], ["model"])

    def update(self, state: FeSEMState, t: int, ask: Ask[Any],
               reply: Any) -> Update[FeSEMState]:
        if ask.phase == WARMUP:
            return self._warm_update(state, t, reply)
        assert isinstance(ask, FeSEMAsk)
        (trained,) = self._replies(ask, reply)
        return self._gather(state, trained.clients, trained.params, trained.n_samples,
                            [mean_finite(trained.loss)])

    @staticmethod
    def _local(state: FeSEMState) -> tuple[torch.Tensor, np.ndarray]:
        """The warm-up's client models and each client's row (Θ_0 for everybody before the
        first round: one row)."""
        n = len(state.assign)
        if state.local is None:
            return state.start[None], np.zeros(n, dtype=np.int64)
        return state.local, np.arange(n)

    def _warm_update(self, state: FeSEMState, t: int,
                     reply: TrainReply) -> Update[FeSEMState]:
        """Keep the returned local models (absent clients keep theirs), written in place
        into the warm-up's table (a `disk_rows` table made at the first reply, the clients
        absent from it at Θ_0); the last warm-up round hands every client's model to the
        first k-means."""
        local = state.local
        if local is None:
            n = len(state.assign)
            local = disk_rows(n, state.start.shape[0], state.start.dtype)
            absent = np.setdiff1d(np.arange(n), reply.clients)
            for a in range(0, len(absent), _CHUNK):
                part = absent[a:a + _CHUNK]
                disk_write(local, part, state.start[None].expand(len(part), -1))
        disk_write(local, reply.clients, reply.params)
        drop_resident(local)  # the pages the round's request read
        loss = mean_finite(reply.loss)
        if t < self.config.warmup_rounds:
            return Update(replace(state, local=local), self._extras(state, [loss], 1, None))
        every = np.arange(len(state.assign))
        pending = KMeansInput(every, local, self.train_sizes, [loss], warmup=1)
        return Update(replace(state, local=None, pending=pending), then=KMEANS)

    def _gather(self, state: FeSEMState, clients: np.ndarray, params: torch.Tensor,
                n_samples: np.ndarray, losses: list[float | None]) -> Update[FeSEMState]:
        """The round's models for its k-means; before the first clustering, gather the models
        trained from Θ_0 until `first_clustering` of the clients have sent one, then the first
        k-means on all of them (every client every round: in the first round, as before).
        No k-means phase when there is nothing to cluster."""
        pending = KMeansInput(clients, params, n_samples, losses, warmup=0)
        if state.centers is None:
            n = len(state.assign)
            need = min(n, math.ceil(self.config.first_clustering * n))
            if state.first is None and len(clients) >= need and is_sorted(clients):
                # the round's models alone start the clustering: they are the table
                pending = KMeansInput(clients, params, self.train_sizes[clients], losses,
                                      warmup=0)
                return Update(replace(state, pending=pending), then=KMEANS)
            first, row = _gather_first(state.first, state.first_row, n, clients, params)
            if np.count_nonzero(row >= 0) < need:
                state = replace(state, first=first, first_row=row)
                return Update(state, self._extras(state, losses, 0, None))
            ids, models = first_models(first, row)
            pending = KMeansInput(ids, models, self.train_sizes[ids], losses, warmup=0)
            state = replace(state, first=None, first_row=None)
        if not len(pending.clients):
            return Update(state, self._extras(state, losses, 0, None))
        return Update(replace(state, pending=pending), then=KMEANS)

    def _kmeans(self, state: FeSEMState, seed: int) -> Update[FeSEMState]:
        """The k-means phase: `cluster_step` on the round's models (where the replies left
        them: on a GPU, there), then the round's extras; the centers come back to the host."""
        got = state.pending
        assert got is not None
        assign, centers, km = cluster_step(self.config, self.index, state.assign, state.centers,
                                           state.start, got.clients, got.params, got.n_samples,
                                           seed)
        centers = centers.to(state.start.device)
        new = replace(state, assign=assign, centers=centers, pending=None)
        return Update(new, self._extras(new, got.losses, got.warmup, km))

    def _message(self, state: FeSEMState, clients: np.ndarray, requests: list[Any],
                 intos: list[Literal["model", "offset"]]) -> FeSEMAsk:
        """The round's `requests` (each for all of `clients`) as one message per client.

        `newcomer_start = "least_loss"` (module doc): a client not yet clustered, once centers
        exist, first computes the K centers' training losses (a `LossRequest`) and starts
        from the least-loss center, IFCA's rule, in the same message: its part of each
        request takes that center by a `Pick` (`intos[i]`: the request's model, or the member
        of its offset predictor, FeSEM-CAM's global step). A newcomer whose loss step fails
        does not train this round. k-means still decides its cluster."""
        new = np.zeros(0, dtype=np.int64)
        if self.config.newcomer_start == "least_loss" and state.centers is not None:
            new = clients[state.assign[clients] < 0]
        if not len(new):
            one = requests[0] if len(requests) == 1 else Steps.of(*requests)
            return FeSEMAsk(one, clients=clients, parts=len(requests), newcomers=False)
        assert state.centers is not None  # newcomers exist only once centers do
        old = clients[state.assign[clients] >= 0]
        parts: list[Any] = [LossRequest(new, state.centers)]
        picks = []
        for request, into in zip(requests, intos, strict=True):
            parts.append(select(request, new))
            picks.append(Pick(len(parts) - 1, 0, "loss", into))
        if len(old):
            parts += [select(request, old) for request in requests]
        return FeSEMAsk(Steps.of(*parts, picks=picks), clients=clients, parts=len(requests),
                        newcomers=True)

    @staticmethod
    def _replies(ask: FeSEMAsk, reply: Any) -> list[Any]:
        """One reply per request of `_message`, its rows in the round's client order."""
        if not ask.newcomers:
            return [reply] if ask.parts == 1 else list(reply.replies)
        got, n = reply.replies, ask.parts
        old = len(got) > 1 + n  # the clients already clustered got their own requests
        return [join([got[1 + i]] + ([got[1 + n + i]] if old else []), order=ask.clients)
                for i in range(n)]

    def _extras(self, state: FeSEMState, losses: list[float | None], warmup: int,
                km: KMeansExtras | None) -> RoundExtras:
        """The round's `FeSEMExtras` (`FeSEMKMeansExtras` when k-means ran)."""
        extras = FeSEMExtras(train_loss=losses[0], warmup=warmup,
                             cluster_sizes=cluster_sizes(state.assign, self.config.n_clusters))
        if km is None:
            return extras
        return FeSEMKMeansExtras(**extras.to_dict(), **km.to_dict())

    def starts(self, state: FeSEMState,
               clients: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Start models `[K+1, d]` (centers, then Θ_0) and each client's row in it."""
        k = self.config.n_clusters
        centers = state.centers if state.centers is not None else state.start[None].repeat(k, 1)
        rows = torch.cat([centers, state.start[None]])
        a = state.assign[clients]
        return rows, np.where(a >= 0, a, k).astype(np.int64)

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.state.assign.copy()

    def predictor(self) -> Predictor:
        st = self.state
        if st.local is not None:
            return Predictor.single(st.local, np.arange(len(st.local)))
        rows, row_of = self.starts(st, np.arange(len(st.assign)))
        return Predictor.single(rows, row_of)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """The center the newcomer's local training moves least from (module doc)."""
        st, cfg = self.state, self.config
        ids = np.asarray(clients, dtype=np.int64)
        if st.local is not None or st.centers is None:  # before the first clustering
            return Placement.nowhere(ids, st.start[None])
        k = len(st.centers)
        seed = ctx.next_seed()  # one seed: every start sees the same minibatches
        training = replace(ctx.training, mu=cfg.lam)
        dist = np.full((len(ids), k), np.inf)
        for j in range(k):
            reply = ctx.send(TrainRequest(ids, st.centers[j : j + 1],
                                          np.zeros(len(ids), np.int64), training, seed))
            moved = _select(reply.params - st.centers[j][None], self.index)
            d2 = moved.double().square().sum(1).numpy()
            dist[:, j] = answered(ids, reply.clients, d2, np.inf)
        ok = np.isfinite(dist).any(1)
        clusters = np.where(ok, np.argmin(dist, axis=1), -1).astype(np.int64)
        rows, _ = self.starts(st, np.zeros(0, np.int64))
        predictor = Predictor.single(rows, np.where(clusters >= 0, clusters, k))
        details = [{"moved": [round(float(v), 6) for v in row]} for row in np.sqrt(dist)]
        return Placement(ids, clusters, predictor, details)


__all__ = [
    "FeSEM",
    "FeSEMConfig",
    "FeSEMExtras",
    "FeSEMKMeansExtras",
    "FeSEMState",
    "KMeansExtras",
    "KMeansInput",
    "cluster_step",
    "layer_index",
    "reseed_empty",
]
