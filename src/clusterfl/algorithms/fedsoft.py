"""FedSoft: soft clustered federated learning with proximal local updating (Ruan & Joe-Wong,
AAAI 2022, arXiv 2112.06053).

What the paper says (abstract; the steps as in the authors' code, ycruan/FedSoft):

- Each client's data is a mixture of S source distributions. The server trains S cluster
  models c_1..c_S and every client a personalised model w_k.
- Importance estimation, every τ rounds (the first round included): every client evaluates
  the S cluster models on each of its samples and counts the samples on which each model has
  the least loss (`BestCountRequest`); u_ks = count_ks / n_k, a zero count replaced by σ
  (u_ks = σ, not renormalised). v_sk = u_ks n_k / Σ_j u_js n_j is client k's share of cluster s.
- Client selection: for each cluster s, `per_cluster` clients drawn without replacement with
  probabilities v_s·; the union trains.
- Proximal local update: each selected client trains from its own previous w_k on
  f_k(w) + λ/2 Σ_s u_ks ||w − c_s||² (`TrainRequest` with per-client proximal centers mixed
  from the S cluster models) and sends the result, its new w_k.
- Aggregation: c_s = the uniform mean of the new w_k of the clients selected for s (with
  selection), or Σ_k v_sk w_k (without).
- Prediction: each client its personalised w_k; each c_s serves its source distribution.

Our choices and the authors' code's departures:

- `per_cluster = None` (default): no selection; every client of the round's sample
  (`fraction` / `per_round`, all by default) trains and c_s = Σ_k v_sk w_k over those that
  answered (the code's `do_selection = False`). Why not the paper's selection by default:
  it needs per_cluster well below the number of clients (the code's default is 30 of 100,
  its CIFAR run 15 of 20) — close to it, the uniform mean runs over almost everyone and the
  cluster models lose their identity. With `per_cluster = K` (the paper), the selection
  draws from the round's sample; when K is at least the sample's size, nobody would be left
  out and the no-selection rule is used.
- Initialisation: S independent PyTorch default initialisations (seeds seed..seed+S−1); all
  personalised models start from one shared model of its own (seed+S), as the code's
  `client_init_model`. u starts uniform (1/S) until a client's first estimate.
- Importance estimation asks all clients (the code), whatever the round's sample; clients
  that did not answer keep their last u. `estimate_among = "sampled"` (ours, for a
  federation too large to ask everyone each estimation round) asks only the round's sample:
  the others keep their last u (uniform 1/S before their first estimate). With τ = 1 (the
  default) every client that trains has just been estimated either way and the rule draws
  the same sample, so the training, the cluster models and the personal models are the
  same; what changes is the u of the clients not sampled, hence `assignment()` (its ARI and
  `cluster_sizes`), `predict_with = "cluster"` and the booked communication. With τ > 1 a
  client first sampled in a round without estimation trains with uniform u. Losses are
  those of the models in evaluation mode on the client's training data; ties go to the
  lower cluster index.
- The local optimiser is the run's [train] setting (the code uses Adam with a constant
  learning rate, and keeps each client's Adam state across rounds: here the optimiser state
  starts afresh at each participation, as for every method), λ = `mu` (the code: 0.1 for
  MNIST, 0.01 for CIFAR-10, 1.0 for linear regression).
- `predict_with = "cluster"` serves each client the cluster model of its largest importance
  weight instead of its personalised model. `assignment()` is argmax_s u_ks (-1 before a
  client's first estimate).
- Placement of a new client (the code has none): it estimates u over the frozen cluster
  models (one `BestCountRequest`); cluster = argmax u, predictor = that cluster model (it has
  no personalised model yet).
- Communication: in an estimation round every client receives the S models (S·d) and sends
  S counts; a selected client then trains against the models it already holds (no second
  download: `prox_held`, as IFCA's training after its loss request), in other rounds it
  receives them (S·d); it sends its w_k (d). The personalised model stays on the device
  between rounds (not booked, like Local; the simulated server keeps it for the device,
  as Local's models: `ClientModels`, the shared start and a row per client that trained,
  written in place, so that memory grows with the clients trained).
- Clients absent from a reply (dropped, rejected by the guard) keep their w_k and u and are
  left out of that round's averages; a cluster nobody trained for keeps its model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import FIRST, Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    ClientModels,
    Placement,
    SampledConfig,
    check_k_fits,
    one_cluster_ignores,
)
from clusterfl.clustering.aggregate import cluster_sizes
from clusterfl.engine.transfer import STAYS
from clusterfl.protocol import (
    Asks,
    BestCountReply,
    BestCountRequest,
    Predictor,
    TrainReply,
    TrainRequest,
    mean_finite,
)
from clusterfl.records import RoundExtras


class FedSoftConfig(SampledConfig):
    """Settings of FedSoft (`[algorithm] name = "fedsoft"`)."""

    name: Literal["fedsoft"] = "fedsoft"
    display: ClassVar[str] = "FedSoft"
    n_clusters: int = Field(2, ge=1, description="S, the number of cluster models")
    mu: float = Field(0.1, ge=0.0, description="λ, the weight of the proximal term "
                      "λ/2 Σ_s u_ks ||w − c_s||²")
    estimation_interval: int = Field(1, ge=1, description="τ: importance weights are "
                                     "re-estimated every τ rounds (round 1 included)")
    per_cluster: int | None = Field(
        None, ge=1, description="clients selected per cluster with probabilities v_s (the "
        "paper's selection); None: every sampled client trains, cluster models are the "
        "v-weighted means")
    sigma: float = Field(1e-4, ge=0.0, le=1.0, description="σ, the importance weight of a "
                         "cluster no sample chose (at most 1, the weight of one all chose)")
    predict_with: Literal["personal", "cluster"] = Field(
        "personal", description="each client predicts with its personalised model (paper) "
        "or with the cluster model of its largest importance weight")
    estimate_among: Literal["all", "sampled"] = Field(
        "all", description="the clients an estimation round asks for their least-loss "
        "counts: all of them (the authors' code) or only the round's sample")

    def ignored_settings(self) -> list[str]:
        """With S = 1 every sample chooses the one cluster: σ is never given."""
        return one_cluster_ignores(self, ("sigma",))


@dataclass(kw_only=True)
class FedSoftExtras(RoundExtras):
    """FedSoft's per-round extras."""

    train_loss: float | None = None  # mean local loss of the clients that trained
    #: clients whose largest importance weight is on each cluster
    cluster_sizes: list[int] = field(default_factory=list)
    estimated: int = 0  # 1 in a round that re-estimated the importance weights
    selected: int = 0  # clients asked to train this round


@dataclass
class FedSoftState:
    models: torch.Tensor  # [S, d], the cluster models c_1..c_S
    #: the personalised models w_k (on the devices): the shared start and a row per client
    #: that trained (`ClientModels`)
    personal: ClientModels = field(metadata=STAYS)  # in host memory: `put` brings rows there
    importance: np.ndarray  # [n_clients, S], u_ks
    estimated: np.ndarray  # [n_clients] bool, the client reported an estimate
    #: `estimate_among = "sampled"`: the round's sample, drawn for its estimation and
    #: trained after it (None between rounds, so in checkpoints)
    pool: np.ndarray | None = field(default=None, kw_only=True)


#: the phases of a round: the importance estimation (every τ rounds), the training
ESTIMATE, TRAIN = "estimate", "train"


@dataclass(frozen=True)
class SelectionAsk(Ask[TrainReply]):
    """The training request and, per cluster, the clients selected for it (None: none). The
    request (its personal models, `[n, d]`) stays on the host when the update runs on a
    device: the update reads only its clients."""

    request: Asks[TrainReply] = field(metadata=STAYS)
    chosen: list[np.ndarray] | None = None


class FedSoft(Algorithm[FedSoftConfig, FedSoftState]):
    """FedSoft (Ruan & Joe-Wong 2022): S cluster models, soft importance weights, proximal
    updates of personalised models."""

    name = "fedsoft"
    Config = FedSoftConfig
    State = FedSoftState
    device_update = True  # the cluster models where the backend left the personal models

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_clusters, n_clients)

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        """A `per_cluster` not below the clients of a round leaves nobody out: the selection
        never runs (`select_clients`), every round uses the rule without it."""
        cfg, k = self.config, self.config.per_round_count(n_clients)
        if cfg.per_cluster is None or cfg.per_cluster < k:
            return []
        return [f"algorithm.per_cluster = {cfg.per_cluster} does nothing: it is not below the "
                f"{k} clients a round asks ({cfg.sampling_setting()}), so no client would be "
                "left out and every round aggregates without selection (c_s = the v-weighted "
                "mean of the answering clients' models), as with per_cluster unset; allowed: "
                f"per_cluster below {k}, or a smaller fraction / per_round"]

    def setup(self, ctx: Context) -> None:
        s = self.config.n_clusters
        self.fits(ctx.n_clients, ctx.rounds)
        shared = ctx.factory.init(ctx.seed + s)
        self.state = FedSoftState(
            ctx.factory.init_many(s, ctx.seed), ClientModels.start(shared, ctx.n_clients),
            np.full((ctx.n_clients, s), 1.0 / s), np.zeros(ctx.n_clients, dtype=bool))

    def migrate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Checkpoints of before held a `[n_clients, d]` table of personal models."""
        if isinstance(state.get("personal"), torch.Tensor):
            state = {**state, "personal": {"models": state["personal"], "row_of": None}}
        return state

    # ------------------------------------------------------------------ rounds
    def _estimating(self, t: int) -> bool:
        return (t - 1) % self.config.estimation_interval == 0

    def ask(self, state: FedSoftState, t: int, phase: str, ctx: Context) -> Ask[Any]:
        """An estimation round first asks every client (`estimate_among = "sampled"`: the
        round's sample) for its least-loss counts; then the round's sample, the selected
        clients (`per_cluster`), the proximal training."""
        cfg = self.config
        if phase == FIRST and self._estimating(t):
            among = (ctx.sample_round(cfg) if cfg.estimate_among == "sampled"
                     else np.arange(ctx.n_clients))
            return Ask(BestCountRequest(among, state.models), ESTIMATE)
        pool = state.pool if state.pool is not None else ctx.sample_round(cfg)
        selected, chosen = select_clients(ctx.rng, pool, state.importance[pool],
                                          np.asarray(ctx.train_sizes, dtype=np.float64)[pool],
                                          cfg.per_cluster)
        training = replace(ctx.training, mu=float(cfg.mu))
        return SelectionAsk(TrainRequest(
            selected, state.personal.of(selected), np.arange(len(selected)),
            training, ctx.next_seed(), models_held=True, prox_models=state.models,
            prox_weights=state.importance[selected], prox_held=self._estimating(t)), TRAIN,
            chosen=chosen)

    def update(self, state: FedSoftState, t: int, ask: Ask[Any],
               reply: Any) -> Update[FedSoftState]:
        if ask.phase == ESTIMATE:  # u_ks = (samples c_s fits best) / n_k, zeros → σ
            counts: BestCountReply = reply
            if self.config.estimate_among == "sampled":  # the round trains this sample
                state = replace(state, pool=np.asarray(ask.request.clients))
            if len(counts.clients):
                importance, estimated = state.importance.copy(), state.estimated.copy()
                importance[counts.clients] = importance_weights(
                    counts.counts, counts.n_samples, self.config.sigma)
                estimated[counts.clients] = True
                state = replace(state, importance=importance, estimated=estimated)
            return Update(state, then=TRAIN)
        assert isinstance(ask, SelectionAsk)
        trained: TrainReply = reply
        got = trained.clients
        if state.pool is not None:
            state = replace(state, pool=None)
        if len(got):
            state = replace(state, personal=state.personal.put(got, trained.params),
                            models=aggregate_clusters(
                                state.models, trained.params, state.importance[got],
                                trained.n_samples, got, ask.chosen))
        return Update(state, FedSoftExtras(
            train_loss=mean_finite(trained.loss),
            cluster_sizes=cluster_sizes(_argmax(state), self.config.n_clusters),
            estimated=int(self._estimating(t)), selected=len(ask.request.clients)))

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return _argmax(self.state)

    def predictor(self) -> Predictor:
        st = self.state
        if self.config.predict_with == "cluster":
            return Predictor.single(st.models, np.maximum(self.assignment(), 0))
        return Predictor.single(*st.personal.members(), own=True)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Each client estimates its importance weights over the frozen cluster models (one
        least-loss count); cluster = argmax u (-1 if it did not answer, served by model 0)."""
        st = self.state
        clients = np.asarray(clients, dtype=np.int64)
        reply = ctx.send(BestCountRequest(clients, st.models))
        where = {int(c): i for i, c in enumerate(clients.tolist())}
        rows = np.array([where[int(c)] for c in reply.clients], dtype=np.int64)
        clusters = np.full(len(clients), -1, dtype=np.int64)
        u = importance_weights(reply.counts, reply.n_samples, self.config.sigma)
        clusters[rows] = np.argmax(u, axis=1) if len(rows) else clusters[rows]
        details: list[dict[str, Any]] = [{"importance": None} for _ in clients]
        for r, row in zip(rows, u):
            details[int(r)] = {"importance": [round(float(v), 6) for v in row]}
        return Placement.by_cluster(clients, clusters, st.models, details)


def _argmax(state: FedSoftState) -> np.ndarray:
    """argmax_s u_ks of every client (-1 before its first estimate)."""
    return np.where(state.estimated, np.argmax(state.importance, axis=1), -1).astype(np.int64)


def select_clients(rng: np.random.Generator, pool: np.ndarray, importance: np.ndarray,
                   sizes: np.ndarray, per_cluster: int | None,
                   ) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """The clients of `pool` that train and, per cluster s, those selected for it: `per_cluster`
    drawn without replacement with probabilities v_s ∝ u_ks n_k (`importance`, `sizes`: the
    pool's rows). None: no selection (`per_cluster` unset or not below the pool's size), the
    whole pool trains."""
    if per_cluster is None or per_cluster >= len(pool):
        return pool, None
    chosen = []
    for s in range(importance.shape[1]):
        share = importance[:, s] * sizes
        total = share.sum()
        p = share / total if total > 0 else np.full(len(pool), 1.0 / len(pool))
        take = min(per_cluster, int(np.count_nonzero(p)))
        chosen.append(np.sort(rng.choice(pool, size=take, replace=False, p=p)))
    return np.unique(np.concatenate(chosen)), chosen


def aggregate_clusters(models: torch.Tensor, params: torch.Tensor, importance: np.ndarray,
                       n_samples: np.ndarray, got: np.ndarray,
                       chosen: list[np.ndarray] | None) -> torch.Tensor:
    """New `[S, d]` cluster models from the answering clients `got` (their new w_k `params`,
    their u_ks `importance`): c_s = the uniform mean over those selected for s (`chosen`),
    or without selection Σ_k v_sk w_k, v_sk ∝ u_ks n_k; a cluster nobody counts for keeps
    its model."""
    out = models.clone()
    for s in range(len(models)):
        if chosen is None:
            w = importance[:, s] * np.asarray(n_samples, dtype=np.float64)
        else:
            w = np.isin(got, chosen[s]).astype(np.float64)
        if w.sum() > 0:
            out[s] = torch.mv(params.t(), torch.as_tensor(w / w.sum(), dtype=params.dtype,
                                                          device=params.device))
    return out


def importance_weights(counts: np.ndarray, n_samples: np.ndarray, sigma: float) -> np.ndarray:
    """u_ks = count_ks / n_k, a zero count (or a client without samples) → σ (FedSoft's
    smoothing; rows are not renormalised)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = np.asarray(n_samples, dtype=np.float64)[:, None]
    u = np.divide(counts, n, out=np.zeros_like(counts), where=n > 0)
    return np.where(u > 0, u, sigma)


__all__ = ["FedSoft", "FedSoftConfig", "FedSoftExtras", "FedSoftState", "aggregate_clusters",
           "importance_weights", "select_clients"]
