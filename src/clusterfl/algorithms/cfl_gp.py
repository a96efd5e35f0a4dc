"""CFL-GP: Clustered Federated Learning via Gradient-based Partitioning (Kim, Kim & de Veciana,
ICML 2024).

The server keeps K models θ_1..θ_K and an assignment of the C clients to them. What is
implemented, with the paper's line numbers:

- **Model update, gradient averaging** (Algorithm 1 lines 2–4): every round each client sends
  the gradient of its loss on one minibatch of size b (`[train] batch_size`) at the model of its
  cluster, and θ_k := θ_k − γ · agg_{c ∈ S_k} ∇f(X_c, θ_k). Algorithm 1 writes agg as the *sum*,
  which pairs with the theory's step γ = 2/(C(μ+L)); the experiments (F.4, F.5: lr 0.1) and the
  authors' code use the *mean*. With the sum, lr 0.1 is multiplied by the cluster size: measured
  here (benchmarks/cfl_gp) it still trains rotated MNIST at C = 32 (8 clients per cluster) but
  diverges at C = 128 on MNIST and at C = 48 on the linear regression, where the mean trains.
  `gradient_aggregation = "mean"` is therefore the default (the published settings train at
  every C) and "sum" is the option that follows Algorithm 1 to the letter.
  γ is `server_lr`, by default `[train] lr`.
- **Model update, model averaging** (Algorithm 4 lines 2–5 with Algorithm 5): each client runs
  the local training of `[train]` from its cluster's model and sends the model gap Δθ; the
  server adds the unweighted mean gap of the cluster (1/|S_k| Σ Δθ, as Algorithm 4 writes it).
- **Gradient profile** (Alg. 1 lines 5–9, Alg. 2 line 6): in rounds t with t mod P = 1 (every
  round when P = 1) while t < T_cl, the next model k̄ in round-robin order is broadcast to every
  client whose cluster is not k̄; each client's gradient (model gap under Algorithm 4) *on the
  same minibatch X_c^(t)* updates block k̄ of its feature vector,
  g_{c,k̄} := (1 − β) g_{c,k̄} + β ∇f(X_c^(t), θ_k̄^(t)). Clients of cluster k̄ reuse the
  gradient they sent for the model update (D.2: "we do not need to re-transmit"), so a client
  receives and computes at most P + 1 times per period (Tables 5–6).
- **β**: the paper sets β_t = 1/(⌊t/(KP)⌋ + 1) "which means that we take the cumulative
  averaging". For P ≥ 2 that formula equals 1/(n + 1) for the (n+1)-th update of a block; for
  P = 1 it does not (block K's first update would get β = 1/2), so the cumulative mean
  1/(n + 1) itself is used (`feature_average = "cumulative"`); "last" is β = 1, the ablation
  of Appendix F.1.
- **Clustering** (Alg. 1 line 10, Alg. 3): `clusterfl.clustering.spectral` — projection on the
  K leading left singular vectors of the Kd×C profile (exact via the C×C Gram matrix, or a
  randomized SVD for many clients; never a dense SVD of the Kd×C matrix), k-means++ k-means,
  and the Hungarian matching that keeps the most clients on their previous model. The Gram
  matrix GᵀG = Σ_k G_kᵀG_k is kept per block, so a clustering update recomputes only the
  block k̄ that changed (C²·d̂ instead of C²·Kd̂ operations).
- **Stopping** (Appendix F): clustering halts once the assignment has been unchanged for T/10
  rounds (`stable_rounds`); the round is recorded (`clustering_stopped_at`).
- **Compression** (Appendix E.1): features keep d̂ = round(d / ratio) coordinates drawn once,
  uniformly without replacement (one fixed index set for the whole run and all clients).
  The compression is real on the wire: the requests that serve the profile only — the
  gradients (Alg. 1) or model gaps (Alg. 4; the client sends its trained model at those
  coordinates, the server subtracts θ_k̄ there) at the broadcast model k̄ of clients not in
  cluster k̄ — carry `coords` = the feature index, and each of those clients sends d̂ floats
  instead of d. The model still goes down whole (d floats), and the vectors that update the
  models stay whole (a client of cluster k̄ sends its whole vector once; the server takes its
  feature from it, D.2). The feature values are bit-for-bit those of subsampling whole
  vectors on the server, so the clustering is unchanged; only the booked uplink drops, by
  (d − d̂) floats per clustering-only reply.
- **Selected layers** (Appendix E.2): features from the parameters whose names start with one of
  `feature_layers` (compression, if any, then samples among those); the clustering-only
  replies are narrowed to them the same way.
- **Weight sharing** (Appendix F.7, after Ghosh et al.): parameters named by `shared_layers`
  are common to the K models and updated with the gradients (or model gaps) of all clients.
- **Unknown K** (Appendix G): at every clustering update the singular values of the profile are
  computed, the largest gap picks s, and the number of clusters is estimated on the
  s-dimensional projections (silhouette or gap statistic); the estimate is reported in the
  extras (`k_estimate`, `spectral_gap_s`) but K stays fixed.
- **Costs** (Appendix D.2, Tables 5–6): per-client models received / vectors sent / gradient
  computations per period of P rounds (the paper's Y ≤ P + 1) and `uplink_floats_compressed`,
  the uplink floats of the replies this method received, counted from its own requests
  (`unit_cost` × the clients that answered: d̂-wide clustering replies included, absent
  clients send nothing). Without rejected replies it equals the history's cumulative
  `floats_up` for a CFL-GP run; a reply the guard rejects was uploaded, so `floats_up` books
  it and this count does not.

Choices the paper leaves open, made here: the initial clusters S^(0) are a random balanced
assignment drawn from the run's generator (the models θ_k^(0) are independent initialisations;
`init_range = r` draws every non-bias parameter from U(−r, r) and sets biases to 0, the
linear-regression setup of §5.1/F.4); the first round is a clustering round (t = 1); the
cluster mean of gradients is unweighted (each client's gradient already averages its minibatch);
k-means keeps the best of `kmeans_n_init` k-means++ runs; a client that did not answer (dropped
out, or rejected by the guard of `clusterfl.robust`, e.g. for a non-finite reply) is left out of
the round's averages and keeps its old feature.

**Client sampling** (`fraction` or `per_round`, `SampledConfig`; all clients by default).
Algorithm 1 has every client answer every round; with a sample, our choices (with every
client sampled each of them reduces to the paper's rule, and results are unchanged):
- Model update: only the sampled clients send a gradient (model gap) at their cluster's
  model; θ_k moves by the mean over the sampled clients of cluster k (kept if none).
- Profile: in a clustering round the sampled clients are asked for block k̄ (round robin as
  in the paper). A sampled client whose profile lacks a block that other clients were already
  asked for — it was not sampled in that block's turn — is also sent that block's model in
  the same round (same minibatch), so a client has a whole profile after its first visit
  in a clustering round, not after K lucky ones. Only clients that answer have their block
  updated; β = 1/(n+1) with n how often *that client* was asked for that block before (the
  cumulative mean of its own observations; a client asked but silent keeps its feature and
  the request still counts, exactly as a dropout at full participation).
- Clustering: spectral clustering reads the clients whose profile has every block anybody
  was asked for (`profiled`); it waits until at least K of them exist. Of those, only the
  clients sampled this round take their new cluster; everybody else keeps theirs (a client
  not sampled is not touched), including clients without a whole profile, which keep their
  initial (random) cluster until their first visit.
- Stopping: the assignment must be unchanged for `stable_rounds` / q rounds (q the expected
  share sampled, `expected_fraction`), in which every client's profile is refreshed as often
  as in `stable_rounds` full rounds, and every client must have a whole profile (with
  `stable_rounds` plain rounds, one of 8 seeds on rotated digits, 16 clients, 4 per round,
  stopped at ARI 0.82; scaled, all 8 reached ARI 1).
- Costs: models down / vectors up / gradients per client and period average over all
  clients, sampled or not (a client not sampled costs nothing that round).

Everything the server keeps between rounds is one `CFLGPState` (models, assignment, profile,
per-block Gram matrices, schedule and cost counters); the shared-layer index and the number of
unchanged rounds that stops the clustering follow from the config and are rebuilt by `setup`.

`mode = "repo"` reproduces the authors' released code instead: the round-robin index never
advances, so only block 0 of the profile is ever filled, and it is filled with each client's
gradient on *its own* cluster model (no extra broadcast); every client starts in cluster 0;
β = 1/(⌊t/(KP)⌋ + 1) literally; and the round's model update uses the assignment computed in
the same round (the code clusters before it averages).

Placing a client that did not train (`placement`; the paper does not say how, the rule is
ours): the newcomer measures its own gradient profile at the final models — one vector per
model θ_k, the gradient on all its training data (Algorithm 1; the members' running means
estimate that expectation) or the model gap of one local training (Algorithm 4), K requests
with one seed sent together as one message per client (`Steps`), narrowed to the profile's
d̂ coordinates (`coords`) like the members' clustering-only replies — and is placed in the
cluster whose mean profile (the mean of its members' K·d̂ feature vectors; with a sample, of
the members with a whole profile) is most similar by cosine similarity. Cosine rather than the
Euclidean distance of the spectral projection: the members' profiles are running means over
the whole run, taken at the models of earlier rounds, so their magnitudes differ from one
vector measured at the final models, while the directions that separate the clusters remain.
The client predicts with the chosen model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.cfl_gp_profile import (
    Probe,
    ProbeAsk,
    Rows,
    count_asks,
    feature_columns,
    model_gaps,
    profiled_clients,
    update_profile,
)
from clusterfl.algorithms.cfl_gp_records import (
    CFLGPClusteringExtras,
    CFLGPCounts,
    CFLGPEstimateExtras,
    CFLGPExtras,
    KEstimate,
)
from clusterfl.algorithms.common import Placement, SampledConfig, answered, check_k_fits
from clusterfl.clustering.aggregate import step_clusters
from clusterfl.clustering.hierarchical import MIN_SILHOUETTE
from clusterfl.clustering.spectral import (
    GRAM_MAX_CLIENTS,
    KCriterion,
    SvdMethod,
    estimate_n_clusters,
    gap_ranking,
    gram_cosines,
    gram_matrix,
    largest_gap,
    spectral_clustering,
    structure_p,
)
from clusterfl.config_util import changed_fields
from clusterfl.engine.allocator import lazy_zeros
from clusterfl.engine.transfer import STAYS
from clusterfl.errors import ConfigError
from clusterfl.models import ParamLayout
from clusterfl.protocol import (
    GradientReply,
    GradientRequest,
    Predictor,
    Steps,
    StepsReply,
    TrainReply,
    TrainRequest,
    mean_finite,
)

DEFAULT_STABLE_ROUNDS = 20
"""T/10 for the paper's T = 200, used when the context does not say how many rounds run."""

MAX_SPECTRUM = 64  # singular values kept in the round's extras


class CFLGPConfig(SampledConfig):
    """Settings of CFL-GP (`[algorithm] name = "cfl_gp"`)."""

    name: Literal["cfl_gp"] = "cfl_gp"
    display: ClassVar[str] = "CFL-GP"
    n_clusters: int = Field(4, ge=1, description="K, the number of models (and clusters)")
    period: int = Field(2, ge=1, description="P: a clustering update in rounds t with "
                        "t mod P = 1 (every round when P = 1)")
    protocol: Literal["gradient", "model"] = Field(
        "gradient", description="'gradient': Algorithm 1 (one SGD step per round from one "
        "minibatch gradient per client); 'model': Algorithm 4 (local training, model gaps)")
    gradient_aggregation: Literal["mean", "sum"] = Field(
        "mean", description="how a cluster's gradients make the step: 'mean' (the paper's "
        "experiments and code) or 'sum' (Algorithm 1 as written)")
    server_lr: float | None = Field(
        None, gt=0.0, description="γ of the gradient protocol (default: [train] lr)")
    cluster_rounds: int | None = Field(None, ge=2, description="T_cl: clustering only in "
                                       "rounds t < T_cl, so at least 2 (default: no limit)")
    stable_rounds: int | None = Field(
        None, ge=0, description="stop clustering once the assignment is unchanged for this "
        "many rounds; default T/10 (the paper), 0 = never stop")
    feature_average: Literal["cumulative", "last"] = Field(
        "cumulative", description="β: cumulative mean of each block (the paper) or β = 1 (F.1)")
    compression_ratio: float = Field(
        1.0, ge=1.0, description="d/d̂: features keep one fixed random d̂-subset of coordinates")
    feature_layers: list[str] | None = Field(
        None, description="features from parameters whose names start with these (App. E.2)")
    shared_layers: list[str] | None = Field(
        None, description="parameters shared by all K models (weight sharing, App. F.7)")
    init_range: float | None = Field(
        None, gt=0.0, description="initialise non-bias parameters U(-r, r), biases 0 (F.4)")
    mode: Literal["paper", "repo"] = Field(
        "paper", description="'paper' (default) or 'repo': the authors' released code")
    svd: SvdMethod = Field("auto", description="leading singular vectors: exact Gram route, "
                           "randomized SVD, or auto (Gram up to 4096 clients)")
    kmeans_n_init: int = Field(10, ge=1, description="k-means++ restarts (best kept)")
    estimate_k: bool = Field(True, description="Appendix G estimate of the number of clusters")
    k_criterion: KCriterion = Field("silhouette", description="'silhouette' or 'gap' statistic")
    k_max: int = Field(10, ge=2, description="largest number of clusters the estimate tries")
    k_min_silhouette: float = Field(
        MIN_SILHOUETTE, ge=-1.0, le=1.0, description="silhouette estimate: 1 cluster when the "
        "best silhouette is below this (Kaufman & Rousseeuw's 0.25; -1: the paper's argmax, "
        "never 1)")
    k_significance: float = Field(
        0.0, ge=0.0, lt=1.0, description="0 = off (the default); else the estimate is 1 unless "
        "the shuffle test of the centred profile's cosines (CFL's and FL+HC's) is below this "
        "(docs/transfer.md: iid found, small groups lost)")

    @model_validator(mode="after")
    def _consistent(self) -> CFLGPConfig:
        if self.protocol == "model" and self.gradient_aggregation == "sum":
            raise ValueError("gradient_aggregation = 'sum' only applies to protocol = "
                             "'gradient' (Algorithm 4 averages the model gaps)")
        if self.protocol == "model" and self.server_lr is not None:
            raise ValueError("server_lr only applies to protocol = 'gradient' (Algorithm 4 "
                             "adds the mean model gap)")
        return self

    def ignored_settings(self) -> list[str]:
        """The Appendix-G estimate's options without it; `k_min_silhouette` under 'gap'."""
        names: tuple[str, ...] = ("k_criterion", "k_max", "k_min_silhouette", "k_significance")
        why = "estimate_k = false (no estimate of the number of clusters)"
        if self.estimate_k:
            names, why = ("k_min_silhouette",), "k_criterion = 'gap' (no silhouette)"
        return [f"algorithm.{o} = {getattr(self, o)!r} does nothing: {why}"
                for o in changed_fields(self, *names)
                if not self.estimate_k or self.k_criterion == "gap"]


def _layer_index(layout: ParamLayout, prefixes: list[str] | None, field: str) -> torch.Tensor:
    try:
        return layout.index(prefixes)
    except KeyError as exc:
        raise ConfigError(field, str(exc.args[0])) from None


@dataclass
class _Spectrum:
    """What a clustering update reports (`CFLGP._cluster`)."""

    singular_values: list[float]
    largest_gaps_after: list[int]
    projected_features: list[list[float]]
    k_scores: dict[str, float] | None  # None: estimate_k off


@dataclass(frozen=True, kw_only=True)
class CFLGPAsk(Ask[Any]):
    """A round's message (`Steps`: the update's vectors, then the probes) and its plan."""

    sampled: np.ndarray  # the round's clients
    clustering: bool  # a clustering round (Alg. 1 line 5)
    kbar: int  # k̄ after this round
    plan: list[ProbeAsk]  # the blocks asked for (clustering rounds)
    cluster_seed: int | None  # the spectral clustering's seed (None: no clustering update)
    estimate_seed: int | None  # the Appendix-G estimate's seed (None: no estimate)


@dataclass
class CFLGPState:
    """Everything the CFL-GP server keeps to continue a run."""

    models: torch.Tensor  # [K, d], θ_1..θ_K
    assign: np.ndarray  # [C] int64, each client's cluster S^(t)
    feature_index: torch.Tensor  # [d̂] int64, the coordinates the features keep (E.1/E.2)
    #: [C, K, d̂] float32, the gradient profile, block k = g_{·,k}; in host memory (a lazily
    #: zero table) also on a GPU, where a step moves only the rows it touches (`STAYS`)
    features: torch.Tensor = field(metadata=STAYS)
    block_gram: np.ndarray  # [K, C, C] G_kᵀG_k per block; [0, C, C] off the Gram route
    block_updates: np.ndarray  # [K] int64, clustering rounds that probed each block
    kbar: int = -1  # k̄, the model broadcast in the last clustering round
    last_change: int = 0  # the last round whose clustering changed the assignment
    stopped_at: int | None = None  # the round the clustering stopped (stable_rounds)
    counts: CFLGPCounts = field(default_factory=CFLGPCounts)  # Tables 5–6, run totals
    estimate: KEstimate = field(default_factory=KEstimate)  # App. G
    #: [C, K] int64, how often each client was asked for block k (sampling; None in the
    #: checkpoints of earlier versions, which asked every client: see `CFLGP.asked`)
    asked: np.ndarray | None = None


class CFLGP(Algorithm[CFLGPConfig, CFLGPState]):
    """CFL-GP with the gradient (Alg. 1) or model averaging (Alg. 4) protocol."""

    name = "cfl_gp"
    Config = CFLGPConfig
    State = CFLGPState
    uses_planned_rounds = True  # T/10 unchanged rounds stop the clustering (stable_rounds)
    #: on a GPU the model step and the Gram matrices run there; the profile stays in host
    #: memory and receives the rows of the clients asked (`update_profile`)
    device_update = True

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        """A `k_max` set to the clients or more: the estimate tries one fewer than the
        clients it profiled at most (`_estimate`), not k_max."""
        cfg = self.config
        if not cfg.estimate_k or not changed_fields(cfg, "k_max") or cfg.k_max < n_clients:
            return []
        return [f"algorithm.k_max = {cfg.k_max}: the estimate of the number of clusters tries "
                f"at most {n_clients - 1} (one fewer than the {n_clients} clients), not "
                f"{cfg.k_max}"]

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: Context) -> None:
        cfg, k, c = self.config, self.config.n_clusters, ctx.n_clients
        check_k_fits(k, c)
        layout = ctx.factory.layout
        models = self._initial_models(ctx)
        #: weight sharing: the coordinates common to the K models (from the config)
        self.shared: torch.Tensor | None = None
        if cfg.shared_layers is not None:
            self.shared = _layer_index(layout, cfg.shared_layers, "algorithm.shared_layers")
            if len(self.shared) == layout.size and k > 1:
                raise ConfigError("algorithm.shared_layers", f"{cfg.shared_layers} names every "
                                  f"parameter of the model: the {k} models would be one model "
                                  "under K labels; name the layers to share, leaving out at "
                                  f"least the last (parameters: {', '.join(layout.names)})")
            models[:, self.shared] = models[0, self.shared]
        selected = _layer_index(layout, cfg.feature_layers, "algorithm.feature_layers")
        if cfg.compression_ratio > 1.0:
            keep = max(1, round(len(selected) / cfg.compression_ratio))
            pick = np.random.default_rng(ctx.next_seed()).choice(len(selected), keep,
                                                                 replace=False)
            selected = selected[torch.from_numpy(np.sort(pick))]
        use_gram = cfg.svd == "gram" or (cfg.svd == "auto" and c <= GRAM_MAX_CLIENTS)
        if cfg.mode == "repo":
            assign = np.zeros(c, dtype=np.int64)
        else:
            assign = ctx.rng.permutation(np.arange(c) % k).astype(np.int64)
        self.state = CFLGPState(
            # lazily zero: the blocks nobody was asked for cost no memory (`lazy_zeros`)
            models, assign, selected, lazy_zeros((c, k, len(selected)), torch.float32),
            # G_kᵀG_k per block (GᵀG is their sum), only when the Gram route is taken
            np.zeros((k, c, c) if use_gram else (0, c, c)), np.zeros(k, dtype=np.int64),
            asked=np.zeros((c, k), dtype=np.int64))
        #: stop clustering after this many unchanged rounds (from the config and T)
        self.stable = self._stable_rounds(ctx)
        #: γ of the gradient protocol
        self.server_lr = float(cfg.server_lr if cfg.server_lr is not None else ctx.training.lr)

    @property
    def asked(self) -> np.ndarray:
        """`[C, K]`: how often each client was asked for block k of its profile."""
        return self._asked(self.state)

    @staticmethod
    def _asked(state: CFLGPState) -> np.ndarray:
        if state.asked is None:  # a checkpoint of an earlier version: it asked every client
            return np.tile(state.block_updates, (len(state.assign), 1)).astype(np.int64)
        return state.asked

    def profiled(self) -> np.ndarray:
        """`[C]` bool: the clients the clustering reads (`profiled_clients`)."""
        return profiled_clients(self.asked)

    @property
    def coords(self) -> np.ndarray | None:
        """`coords` of the clustering-only requests (see `_wire_coords`)."""
        return self._wire_coords(self.state)

    def _wire_coords(self, state: CFLGPState) -> np.ndarray | None:
        """`coords` of the clustering-only requests: the feature index (App. E.1/E.2), or
        None when the features are every coordinate (the reply is then the whole vector)."""
        d, idx = state.models.shape[1], state.feature_index
        if len(idx) == d and torch.equal(idx, torch.arange(d, device=idx.device)):
            return None
        return idx.cpu().numpy().astype(np.int64)

    @staticmethod
    def _to_features(state: CFLGPState, rows: torch.Tensor) -> torch.Tensor:
        """Client vectors in feature space (`feature_columns`; the rows themselves, no copy,
        when the features are every coordinate)."""
        cols = feature_columns(rows.shape[1], state.models.shape[1], state.feature_index)
        return rows if cols is None else rows[:, cols]

    def _initial_models(self, ctx: Context) -> torch.Tensor:
        k, seed = self.config.n_clusters, ctx.next_seed()
        models = ctx.factory.init_many(k, seed)
        r = self.config.init_range
        if r is None:
            return models
        gen = torch.Generator().manual_seed(seed)
        for entry in ctx.factory.layout.entries:
            block = models[:, entry.start : entry.stop]
            if entry.name.endswith("bias"):
                block.zero_()
            else:
                block.copy_(torch.rand(block.shape, generator=gen) * 2 * r - r)
        return models

    def _stable_rounds(self, ctx: Context) -> int:
        """Unchanged rounds that stop the clustering: `stable_rounds` (default T/10) at full
        participation; with a sample of share q per round, stable_rounds / q rounds, in which
        every client's profile is refreshed as often as in stable_rounds full rounds."""
        base = self.config.stable_rounds
        if base is None:
            rounds = getattr(ctx, "rounds", None)
            if rounds is None:
                ctx.warn(f"cfl_gp: the context does not give the number of rounds T; "
                         f"clustering stops after {DEFAULT_STABLE_ROUNDS} unchanged "
                         f"rounds (T/10 for T = 200). Set algorithm.stable_rounds to "
                         f"choose.")
                base = DEFAULT_STABLE_ROUNDS
            else:
                base = max(1, math.ceil(int(rounds) / 10))
        share = self.config.expected_fraction(ctx.n_clients)
        return base if share >= 1.0 else math.ceil(base / share)

    # ------------------------------------------------------------------ one round
    def clustering_round(self, state: CFLGPState, t: int) -> bool:
        """Alg. 1 line 5: t mod P = 1 (every round for P = 1), t < T_cl, not yet stopped."""
        cfg = self.config
        return (state.stopped_at is None and (t - 1) % cfg.period == 0
                and (cfg.cluster_rounds is None or t < cfg.cluster_rounds))

    def ask(self, state: CFLGPState, t: int, phase: str, ctx: Context) -> CFLGPAsk:
        """One message per client (`Steps`): the model update's vectors, then (clustering
        rounds) the probes of `_probe_plan`. The clustering's (and App. G's) seeds are drawn
        when it will run: when K clients will have a whole profile (`profiled_clients`)."""
        cfg = self.config
        sampled = ctx.sample_round(cfg)  # every client by default (no draw)
        seed = ctx.next_seed()
        clustering = self.clustering_round(state, t)
        own = self._vector_request(ctx, state.models, sampled, state.assign[sampled], seed)
        kbar, plan = state.kbar, list[ProbeAsk]()
        cluster_seed = estimate_seed = None
        if clustering:
            kbar, plan = self._probe_plan(state, ctx, sampled, seed)
            asks = count_asks(self._asked(state), [(p.block, p.asked) for p in plan])
            if profiled_clients(asks).sum() >= cfg.n_clusters:
                cluster_seed = ctx.next_seed()
                estimate_seed = ctx.next_seed() if cfg.estimate_k else None
        probes = [p.request for p in plan if p.request is not None]
        return CFLGPAsk(Steps.of(own, *probes), sampled=sampled, clustering=clustering,
                        kbar=kbar, plan=plan, cluster_seed=cluster_seed,
                        estimate_seed=estimate_seed)

    def update(self, state: CFLGPState, t: int, ask: Ask[Any],
               reply: Any) -> Update[CFLGPState]:
        """Alg. 1 lines 2–10 (Alg. 4): profile, clustering, model step, stop, costs."""
        assert isinstance(ask, CFLGPAsk)
        cfg, c = self.config, len(state.assign)
        replies = cast(StepsReply, reply).replies
        own_req = cast(GradientRequest | TrainRequest, cast(Steps, ask.request).steps[0])
        rows, loss, who = self._vectors(own_req, replies[0])
        uplink = state.counts.uplink_floats_compressed + own_req.unit_cost()[1] * len(who)
        # one row per client id; `present` marks who answered (absent: not sampled, dropped
        # or rejected; the guard reports those)
        present = np.zeros(c, dtype=bool)
        present[who] = True
        if len(who) == c and np.array_equal(who, np.arange(c)):
            own = rows  # everyone answered, in order: no copy
        else:
            # costs the rows written (on a GPU: a table there, the size of an all-reply)
            own = lazy_zeros((c, rows.shape[1]), rows.dtype, device=rows.device)
            own[torch.from_numpy(who).to(rows.device)] = rows
        down = np.zeros(c)
        down[ask.sampled] = 1.0
        new = replace(state, kbar=ask.kbar, asked=self._asked(state))
        new_assign, beta, spectrum = state.assign, 0.0, None
        # the paper's step uses the clusters S^(t) the round started with: taken first, its
        # copies are not held beside the new profile ("repo": the round's new ones, below)
        models = (None if cfg.mode == "repo"
                  else self._update_models(state.models, own, state.assign, present))
        if ask.clustering:
            probes, probed, uplink = self._probe(state, own, present, ask, replies[1:], uplink)
            down += probed
            new, beta = self._profile_step(new, t, probes)
            new_assign, spectrum, estimate = self._cluster(new, ask)
            new = replace(new, estimate=estimate)
        if models is None:
            models = self._update_models(state.models, own, new_assign, present)
        changed = int((new_assign != state.assign).sum())
        last_change = t if ask.clustering and changed else state.last_change
        stopped = state.stopped_at
        if (stopped is None and self.stable > 0 and t - last_change >= self.stable
                and profiled_clients(self._asked(new)).all()):  # nobody waits for a profile
            stopped = t
        n, was = float(down.sum()), state.counts  # a model down, a vector up, a gradient each
        counts = CFLGPCounts(was.models_down + n, was.vectors_up + n, was.gradients + n, uplink,
                             was.rounds + 1.0)
        new = replace(new, models=models, assign=np.asarray(new_assign, dtype=np.int64),
                      last_change=last_change, stopped_at=stopped, counts=counts)
        extras = self._extras(new, mean_finite(loss), ask.clustering, changed)
        if spectrum is None:
            return Update(new, extras)
        clustered = CFLGPClusteringExtras(
            **extras.to_dict(), beta=beta, singular_values=spectrum.singular_values,
            largest_gaps_after=spectrum.largest_gaps_after,
            projected_features=spectrum.projected_features)
        if spectrum.k_scores is None:
            return Update(new, clustered)
        return Update(new, CFLGPEstimateExtras(**clustered.to_dict(),
                                               k_scores=spectrum.k_scores))

    def _vector_request(
        self, ctx: Context, models: torch.Tensor, clients: np.ndarray, model_of: np.ndarray,
        seed: int, coords: np.ndarray | None = None,
    ) -> GradientRequest | TrainRequest:
        """The request for gradients (Alg. 1) or model gaps Δθ = θ' − θ (Alg. 4/5, the
        client trains and sends θ') at their models. The same seed gives every client the
        same minibatch(es). With `coords` the clients send those coordinates only (d̂ floats
        each)."""
        if self.config.protocol == "gradient":
            return GradientRequest(clients, models, model_of, ctx.training.batch_size, seed,
                                   coords=coords)
        return TrainRequest(clients, models, model_of, ctx.training, seed, coords=coords)

    def _vectors(self, request: GradientRequest | TrainRequest,
                 reply: GradientReply | TrainReply) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """The vectors (gradients or model gaps, `model_gaps`; d̂ wide with `coords`) and
        losses of the clients that answered `request`, and who they are (in request order)."""
        if self.config.protocol == "gradient":
            return cast(GradientReply, reply).grads, reply.loss, reply.clients
        gaps = model_gaps(cast(TrainRequest, request), cast(TrainReply, reply))
        return gaps, reply.loss, reply.clients

    def _probe_plan(self, state: CFLGPState, ctx: Context, sampled: np.ndarray,
                    seed: int) -> tuple[int, list[ProbeAsk]]:
        """Alg. 2 lines 6–7, the requests: the next model k̄ goes to the sampled clients not
        already on it. A sampled client whose profile lacks a block that other clients were
        already asked for (it was not sampled when that block's turn came) also receives that
        block's model (`_asks`); with every client sampled, every client is asked for k̄ only.
        Returns k̄ and, per block asked for, who is asked and the request to those of them
        not in the block's cluster. These vectors serve the profile only, so the clients send
        the d̂ feature coordinates (`coords`, App. E.1); a client asked for its own cluster's
        block reuses the whole vector it sent for the model update (D.2: no
        re-transmission). Every request of the round uses the same seed: the same
        minibatch. `mode = "repo"`: block 0 from the update vectors, nothing is sent."""
        k = self.config.n_clusters
        if self.config.mode == "repo":
            return 0, [ProbeAsk(0, sampled, None)]
        kbar = (state.kbar + 1) % k
        ask = self._asks(state, sampled, kbar)
        plan: list[ProbeAsk] = []
        for b in range(k):
            asked = sampled[ask[:, b]]
            if not len(asked):
                continue
            others = asked[state.assign[asked] != b]
            req = None if not len(others) else self._vector_request(
                ctx, state.models[b : b + 1], others, np.zeros(len(others), dtype=np.int64),
                seed, coords=self._wire_coords(state))
            plan.append(ProbeAsk(b, asked, req))
        return kbar, plan

    def _probe(self, state: CFLGPState, own: torch.Tensor, present: np.ndarray, ask: CFLGPAsk,
               replies: list[Any], uplink: float) -> tuple[list[Probe], np.ndarray, float]:
        """Alg. 2 lines 6–7, the answers (`_probe_plan`'s requests, `replies` in order):
        per block, who was asked and the features (d̂ coordinates) of those that answered,
        how many extra models each client received, and the uplink count with the replies'
        floats added."""
        extra = np.zeros(len(own))
        cols = feature_columns(own.shape[1], state.models.shape[1], state.feature_index)
        def feats(ids: np.ndarray) -> Rows:  # features of some clients' own vectors, not copied
            return Rows(own, ids, cols)

        if self.config.mode == "repo":
            got = np.flatnonzero(present)
            return [Probe(0, ask.sampled, got, feats(got))], extra, uplink
        probes: list[Probe] = []
        rest = iter(replies)
        for p in ask.plan:
            mine = p.asked[(state.assign[p.asked] == p.block) & present[p.asked]]
            who: list[np.ndarray] = [mine]
            rows: list[torch.Tensor | Rows] = [feats(mine)]
            if p.request is not None:
                vectors, _, replied = self._vectors(p.request, next(rest))
                uplink += p.request.unit_cost()[1] * len(replied)
                who.append(np.asarray(replied, dtype=np.int64))
                rows.append(self._to_features(state, vectors))
                extra[p.request.clients] += 1.0
            probes.append(Probe(p.block, p.asked, np.concatenate(who), tuple(rows)))
        return probes, extra, uplink

    def _asks(self, state: CFLGPState, clients: np.ndarray, kbar: int) -> np.ndarray:
        """`[len(clients), K]` bool: the blocks each of `clients` is asked for this clustering
        round — k̄, and every block the client was never asked for that some client was."""
        asked = np.asarray(self._asked(state) > 0)
        ever = np.asarray(asked.any(axis=0))
        ask = ~asked[clients] & ever[None, :]
        ask[:, kbar] = True
        return np.asarray(ask)

    def _betas(self, t: int, asked: np.ndarray, clients: np.ndarray, block: int) -> np.ndarray:
        """β of each client's update of `block` (Alg. 1 line 9), `asked` the counts before."""
        cfg = self.config
        if cfg.feature_average == "last":
            return np.ones(len(clients))
        if cfg.mode == "repo":
            return np.full(len(clients), 1.0 / (t // (cfg.n_clusters * cfg.period) + 1))
        return np.asarray(1.0 / (asked[clients, block] + 1.0))

    def _profile_step(self, state: CFLGPState, t: int,
                      probes: list[Probe]) -> tuple[CFLGPState, float]:
        """Alg. 1 lines 8–9 (`update_profile`, β = 1/(n+1), n the asks before; a silent
        client keeps its feature, the ask still counts), and the Gram matrices of the blocks
        asked. Returns the state and β (the mean over the clients asked, when they differ)."""
        before = self._asked(state)  # each block is probed once: its β read the counts before
        betas = [self._betas(t, before, probe.asked, probe.block) for probe in probes]
        asked = count_asks(before, [(probe.block, probe.asked) for probe in probes])
        updates = state.block_updates + np.bincount([p.block for p in probes],
                                                    minlength=self.config.n_clusters)
        features = update_profile(state.features, probes, betas, filled=before > 0)
        gram = state.block_gram
        if len(gram):
            gram = gram.copy()
            for probe in probes:  # only the blocks asked changed
                gram[probe.block] = gram_matrix(features[:, probe.block],
                                                device=state.models.device)
        new = replace(state, features=features, asked=asked, block_updates=updates,
                      block_gram=gram)
        every = np.concatenate(betas)  # a clustering round asks for k̄ at least
        return new, float(every[0]) if len(np.unique(every)) == 1 else float(every.mean())

    def _cluster(self, state: CFLGPState, ask: CFLGPAsk
                 ) -> tuple[np.ndarray, _Spectrum | None, KEstimate]:
        """Alg. 1 line 10 / Alg. 3, plus the Appendix-G spectrum and estimate, on the
        profiled clients (`profiled_clients`); of those, the clients sampled this round take
        their new cluster, the others keep theirs. None for the spectrum when fewer than K
        clients are profiled (no clustering yet)."""
        cfg = self.config
        c = len(state.assign)
        inc = profiled_clients(self._asked(state))
        if inc.sum() < cfg.n_clusters:
            return state.assign, None, state.estimate
        assert ask.cluster_seed is not None  # `ask` drew it: it saw the same profile
        everyone = bool(inc.all())
        idx = np.flatnonzero(inc)
        rows = (state.features.reshape(c, -1) if everyone
                else state.features[idx].reshape(len(idx), -1))
        gram = None
        if len(state.block_gram):
            gram = state.block_gram.sum(0)
            gram = gram if everyone else gram[np.ix_(idx, idx)]
        want = max(cfg.n_clusters, 2 * cfg.k_max) if cfg.estimate_k else cfg.n_clusters
        res = spectral_clustering(rows, cfg.n_clusters, state.assign[idx], ask.cluster_seed,
                                  cfg.svd, cfg.kmeans_n_init, n_components=want, gram=gram)
        sv = res.projection.singular_values
        projected = np.full((c, cfg.n_clusters), np.nan)
        head = res.projection.features[:, : cfg.n_clusters]
        projected[idx, : head.shape[1]] = head
        scores, estimate = None, state.estimate
        if cfg.estimate_k:
            assert ask.estimate_seed is not None
            scores, estimate = self._estimate(res.projection.features, sv, ask.estimate_seed,
                                              gram)
        spectrum = _Spectrum(
            singular_values=sv[:MAX_SPECTRUM].tolist(),
            largest_gaps_after=gap_ranking(sv[:MAX_SPECTRUM]),
            projected_features=(head if everyone else projected).tolist(), k_scores=scores)
        if everyone and len(ask.sampled) == c:
            return res.assignment, spectrum, estimate
        new = state.assign.copy()
        take = np.zeros(c, dtype=bool)
        take[ask.sampled] = True
        take = take[idx]  # among the profiled: the sampled ones move
        new[idx[take]] = res.assignment[take]
        return new, spectrum, estimate

    def _estimate(self, feats: np.ndarray, sv: np.ndarray, seed: int,
                  gram: np.ndarray | None) -> tuple[dict[str, float], KEstimate]:
        """Appendix G: its criterion's value per k, and the estimate (kept in the state); 1
        when the cosines of the profile rows minus their mean (from `gram`, else from the
        projections) show no groups."""
        cfg = self.config
        s = largest_gap(sv, max_s=feats.shape[1])
        k_hi = min(cfg.k_max, len(feats) - 1)
        k, scores = estimate_n_clusters(feats[:, :s], k_hi, seed, cfg.k_criterion,
                                        cfg.kmeans_n_init, cfg.k_min_silhouette)
        p = None if cfg.k_significance == 0 else structure_p(
            gram_cosines(feats @ feats.T if gram is None else gram, centred=True), seed)
        k = 1 if p is not None and p >= cfg.k_significance else k
        return ({str(key): float(v) for key, v in scores.items()},
                KEstimate(k_estimate=int(k), spectral_gap_s=int(s), structure_p=p))

    def _update_models(self, models: torch.Tensor, own: torch.Tensor, groups: np.ndarray,
                       present: np.ndarray) -> torch.Tensor:
        """Alg. 1 line 4 (θ_k −= γ agg ∇) or Alg. 4 line 5 (θ_k += mean Δθ), then the shared
        coordinates from all clients (those that answered): `step_clusters`, whose copies
        of the clusters' rows sit in their own map (`lazy_zeros`), given back when done."""
        cfg = self.config
        step = -self.server_lr if cfg.protocol == "gradient" else 1.0
        return step_clusters(models, own, groups, present, step, cfg.gradient_aggregation,
                             self.shared, table=lazy_zeros)

    # ------------------------------------------------------------------ costs (Tables 5–6)
    def _extras(self, st: CFLGPState, loss: float | None, clustering: bool,
                changed: int) -> CFLGPExtras:
        """What every round reports; the costs per client and per period of P rounds (the
        paper's Y ≤ P + 1) as running averages."""
        n = max(st.counts.rounds, 1.0) * len(st.assign)
        p = self.config.period
        return CFLGPExtras(
            train_loss=loss, clustering=clustering,
            broadcast_model=st.kbar if clustering else -1, assignment_changes=changed,
            clustering_stopped_at=st.stopped_at, k_estimate=st.estimate.k_estimate,
            spectral_gap_s=st.estimate.spectral_gap_s, k_structure_p=st.estimate.structure_p,
            models_down_per_client_period=st.counts.models_down / n * p,
            vectors_up_per_client_period=st.counts.vectors_up / n * p,
            gradients_per_client_period=st.counts.gradients / n * p,
            feature_dim=len(st.feature_index),
            uplink_floats_compressed=st.counts.uplink_floats_compressed,
        )

    # ------------------------------------------------------------------ interface
    def assignment(self) -> np.ndarray:
        return self.state.assign.copy()

    def predictor(self) -> Predictor:
        return Predictor.single(self.state.models, self.state.assign)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """The cluster whose mean gradient profile is most cosine-similar (module doc)."""
        cfg, st = self.config, self.state
        ids = np.asarray(clients, dtype=np.int64)
        k, width = cfg.n_clusters, len(st.feature_index)
        seed = ctx.next_seed()
        zeros = np.zeros(len(ids), dtype=np.int64)
        profile = torch.zeros(len(ids), k, width, dtype=torch.float64)
        got = np.ones(len(ids), dtype=bool)
        asks: list[GradientRequest | TrainRequest] = [
            GradientRequest(ids, st.models[j : j + 1], zeros, None, seed, coords=self.coords)
            if cfg.protocol == "gradient" else
            TrainRequest(ids, st.models[j : j + 1], zeros, ctx.training, seed,
                         coords=self.coords) for j in range(k)]
        replies = ctx.send(Steps.of(*asks)).replies  # the K vectors in one message
        for j, (req, reply) in enumerate(zip(asks, replies, strict=True)):
            rows, _, who = self._vectors(req, reply)
            pos = answered(ids, who, np.arange(len(who)), -1)
            got &= pos >= 0
            feats = self._to_features(st, rows).double()
            for i, r_ in enumerate(pos.tolist()):
                if r_ >= 0:
                    profile[i, j] = feats[r_]
        members = st.features.reshape(len(st.assign), -1).double()
        means = torch.zeros(k, members.shape[1], dtype=torch.float64)
        # with a sample, only clients with a whole profile (`profiled`; all without sampling)
        whole = np.where(self.profiled(), st.assign, -1)
        for j in range(k):
            sel = np.flatnonzero(whole == j)
            if len(sel):
                means[j] = members[torch.from_numpy(sel)].mean(0)
        flat = profile.reshape(len(ids), -1)
        sim = torch.nn.functional.cosine_similarity(flat[:, None, :], means[None, :, :], dim=2)
        empty = torch.from_numpy(np.bincount(whole[whole >= 0], minlength=k)[:k] == 0)
        sim[:, empty] = -torch.inf  # a model without members is no cluster
        clusters = np.where(got, sim.argmax(1).numpy(), -1).astype(np.int64)
        details = [{"similarity": [round(float(v), 5) for v in row]} for row in sim.numpy()]
        return Placement.by_cluster(ids, clusters, st.models, details)
