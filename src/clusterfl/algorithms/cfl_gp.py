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
  the uplink floats this method's requests booked (what was sent, d̂-wide clustering replies
  included; it equals the history's cumulative `floats_up` for a CFL-GP run).

Choices the paper leaves open, made here: the initial clusters S^(0) are a random balanced
assignment drawn from the run's generator (the models θ_k^(0) are independent initialisations;
`init_range = r` draws every non-bias parameter from U(−r, r) and sets biases to 0, the
linear-regression setup of §5.1/F.4); the first round is a clustering round (t = 1); the
cluster mean of gradients is unweighted (each client's gradient already averages its minibatch);
k-means keeps the best of `kmeans_n_init` k-means++ runs; a client whose reply is not finite, or
that did not answer (dropped out or rejected, `clusterfl.robust`), is left out of the round's
averages and keeps its old feature.

`mode = "repo"` reproduces the authors' released code instead: the round-robin index never
advances, so only block 0 of the profile is ever filled, and it is filled with each client's
gradient on *its own* cluster model (no extra broadcast); every client starts in cluster 0;
β = 1/(⌊t/(KP)⌋ + 1) literally; and the round's model update uses the assignment computed in
the same round (the code clusters before it averages).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context
from clusterfl.clustering.spectral import (
    GRAM_MAX_CLIENTS,
    KCriterion,
    SvdMethod,
    estimate_n_clusters,
    gap_ranking,
    gram_matrix,
    largest_gap,
    spectral_clustering,
)
from clusterfl.errors import ConfigError
from clusterfl.models import ParamLayout
from clusterfl.protocol import GradientRequest, Predictor, TrainRequest, narrow
from clusterfl.robust.replies import answered, mean_finite, positions

DEFAULT_STABLE_ROUNDS = 20
"""T/10 for the paper's T = 200, used when the context does not say how many rounds run."""

MAX_SPECTRUM = 64  # singular values kept in the round's extras


class CFLGPConfig(AlgorithmConfig):
    """Settings of CFL-GP (`[algorithm] name = "cfl_gp"`)."""

    name: Literal["cfl_gp"] = "cfl_gp"
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
    cluster_rounds: int | None = Field(
        None, ge=1, description="T_cl: clustering only in rounds t < T_cl (default: no limit)")
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

    @model_validator(mode="after")
    def _consistent(self) -> CFLGPConfig:
        if self.protocol == "model" and self.gradient_aggregation == "sum":
            raise ValueError("gradient_aggregation = 'sum' only applies to protocol = "
                             "'gradient' (Algorithm 4 averages the model gaps)")
        if self.protocol == "model" and self.server_lr is not None:
            raise ValueError("server_lr only applies to protocol = 'gradient' (Algorithm 4 "
                             "adds the mean model gap)")
        return self


def _in_request_order(vectors: torch.Tensor, loss: np.ndarray, who: np.ndarray,
                      clients: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """One row per requested client; clients absent from the reply (dropped out, rejected)
    get NaN rows, which every later step already treats as "no finite reply"."""
    rows = torch.from_numpy(positions(who, clients))
    full = torch.full((len(clients), vectors.shape[1]), float("nan"), dtype=vectors.dtype)
    full[rows] = vectors
    out_loss = np.full(len(clients), np.nan)
    out_loss[rows.numpy()] = np.asarray(loss, dtype=np.float64)
    return full, out_loss


def _layer_index(layout: ParamLayout, prefixes: list[str] | None, field: str) -> torch.Tensor:
    try:
        return layout.index(prefixes)
    except KeyError as exc:
        raise ConfigError(field, str(exc.args[0])) from None


class CFLGP(Algorithm):
    """CFL-GP with the gradient (Alg. 1) or model averaging (Alg. 4) protocol."""

    name = "cfl_gp"
    Config = CFLGPConfig
    config: CFLGPConfig

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: Context) -> None:
        cfg, k, c = self.config, self.config.n_clusters, ctx.n_clients
        if c < k:
            raise ConfigError("algorithm.n_clusters",
                              f"K = {k} models need at least {k} clients, the federation has {c}")
        layout = ctx.factory.layout
        self.models = self._initial_models(ctx)
        self.shared: torch.Tensor | None = None
        if cfg.shared_layers is not None:
            self.shared = _layer_index(layout, cfg.shared_layers, "algorithm.shared_layers")
            self.models[:, self.shared] = self.models[0, self.shared]
        selected = _layer_index(layout, cfg.feature_layers, "algorithm.feature_layers")
        if cfg.compression_ratio > 1.0:
            keep = max(1, round(len(selected) / cfg.compression_ratio))
            pick = np.random.default_rng(ctx.next_seed()).choice(len(selected), keep,
                                                                 replace=False)
            selected = selected[torch.from_numpy(np.sort(pick))]
        self.feature_index: torch.Tensor = selected
        self.coords = self._wire_coords()
        self.features = torch.zeros(c, k, len(selected), dtype=torch.float32)
        use_gram = cfg.svd == "gram" or (cfg.svd == "auto" and c <= GRAM_MAX_CLIENTS)
        # G_kᵀG_k per block (GᵀG is their sum), only when the Gram route is taken
        self.block_gram = np.zeros((k, c, c) if use_gram else (0, c, c))
        self.block_updates = np.zeros(k, dtype=np.int64)
        if cfg.mode == "repo":
            self.assign = np.zeros(c, dtype=np.int64)
        else:
            self.assign = ctx.rng.permutation(np.arange(c) % k).astype(np.int64)
        self.kbar = -1
        self.last_change = 0
        self.stopped_at: int | None = None
        self.stable = self._stable_rounds(ctx)
        self.counts = {"models_down": 0.0, "vectors_up": 0.0, "gradients": 0.0,
                       "uplink_floats_compressed": 0.0, "rounds": 0.0}
        self._up_before = 0.0
        self.estimate: dict[str, Any] = {"k_estimate": None, "spectral_gap_s": None}

    def _wire_coords(self) -> np.ndarray | None:
        """`coords` of the clustering-only requests: the feature index (App. E.1/E.2), or
        None when the features are every coordinate (the reply is then the whole vector)."""
        d, idx = self.models.shape[1], self.feature_index
        if len(idx) == d and torch.equal(idx, torch.arange(d)):
            return None
        return idx.numpy().astype(np.int64)

    def _to_features(self, rows: torch.Tensor) -> torch.Tensor:
        """Client vectors in feature space: whole vectors (d wide) are subsampled at the
        feature index; replies already narrowed on the wire (d̂ wide) are taken as they are."""
        if rows.shape[1] == self.models.shape[1]:
            return rows[:, self.feature_index]
        if rows.shape[1] != len(self.feature_index):
            raise ValueError(f"client vectors of width {rows.shape[1]}: expected "
                             f"{self.models.shape[1]} or {len(self.feature_index)}")
        return rows

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
        if self.config.stable_rounds is not None:
            return self.config.stable_rounds
        rounds = getattr(ctx, "rounds", None)
        if rounds is None:
            ctx.log.append(f"cfl_gp: the context does not give the number of rounds T; "
                           f"clustering stops after {DEFAULT_STABLE_ROUNDS} unchanged rounds "
                           f"(T/10 for T = 200). Set algorithm.stable_rounds to choose.")
            return DEFAULT_STABLE_ROUNDS
        return max(1, math.ceil(int(rounds) / 10))

    # ------------------------------------------------------------------ one round
    def clustering_round(self, t: int) -> bool:
        """Alg. 1 line 5: t mod P = 1 (every round for P = 1), t < T_cl, not yet stopped."""
        cfg = self.config
        return (self.stopped_at is None and (t - 1) % cfg.period == 0
                and (cfg.cluster_rounds is None or t < cfg.cluster_rounds))

    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        cfg = self.config
        self._up_before = ctx.floats_up
        seed = ctx.next_seed()
        clients = np.arange(ctx.n_clients)
        own, loss = self._client_vectors(ctx, self.models, clients, self.assign, seed)
        ok = torch.isfinite(own).all(dim=1).numpy()
        if not ok.all():
            ctx.log.append(f"cfl_gp round {t}: no finite reply (absent or non-finite) from "
                           f"clients {np.flatnonzero(~ok).tolist()}")
        extras: dict[str, Any] = {"train_loss": mean_finite(np.where(ok, loss, np.nan))}
        down = np.ones(ctx.n_clients)
        new_assign = self.assign
        clustering = self.clustering_round(t)
        if clustering:
            probe, probed = self._probe(ctx, own, seed)
            down += probed
            finite = torch.isfinite(probe).all(dim=1).numpy()
            extras.update(self._update_features(t, probe, finite))
            result, more = self._cluster(ctx, t)
            new_assign = result
            extras.update(more)
        update_with = new_assign if cfg.mode == "repo" else self.assign
        self._update_models(own, update_with, ok, self._lr(ctx))
        changed = int((new_assign != self.assign).sum())
        self.assign = np.asarray(new_assign, dtype=np.int64)
        if clustering and changed:
            self.last_change = t
        if (self.stopped_at is None and self.stable > 0
                and t - self.last_change >= self.stable):
            self.stopped_at = t
        self._book(ctx, down)
        extras.update({
            "clustering": clustering, "broadcast_model": self.kbar if clustering else -1,
            "assignment_changes": changed, "clustering_stopped_at": self.stopped_at,
            **self.estimate, **self._cost_extras(),
        })
        return extras

    def _client_vectors(
        self, ctx: Context, models: torch.Tensor, clients: np.ndarray, model_of: np.ndarray,
        seed: int, coords: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Gradients (Alg. 1) or model gaps Δθ = θ' − θ (Alg. 4/5) of `clients` at their models;
        the same seed gives every client the same minibatch(es). With `coords` the clients
        send those coordinates only (d̂ floats each) and the rows are d̂ wide."""
        if self.config.protocol == "gradient":
            g = ctx.send(GradientRequest(clients, models, model_of, ctx.training.batch_size,
                                         seed, coords=coords))
            return _in_request_order(g.grads, g.loss, answered(g, clients), clients)
        r = ctx.send(TrainRequest(clients, models, model_of, ctx.training, seed,
                                  coords=coords))
        rows = positions(answered(r, clients), clients)
        start = models[torch.from_numpy(np.asarray(model_of, dtype=np.int64)[rows])]
        if r.params.shape[1] != start.shape[1]:  # narrowed to `coords` on the wire
            start = narrow(start, coords)
        return _in_request_order(r.params - start, r.loss, answered(r, clients), clients)

    def _probe(self, ctx: Context, own: torch.Tensor, seed: int) -> tuple[torch.Tensor,
                                                                          np.ndarray]:
        """Alg. 2 lines 6–7: the next model k̄ goes to the clients not already on it; returns
        every client's feature (d̂ coordinates) at θ_k̄ and which clients received an extra
        model. These vectors serve the profile only, so the clients send the d̂ feature
        coordinates (`coords`, App. E.1); clients of cluster k̄ reuse the whole vector they
        sent for the model update (D.2: no re-transmission)."""
        k = self.config.n_clusters
        extra = np.zeros(len(own))
        probe = self._to_features(own)
        if self.config.mode == "repo":
            self.kbar = 0
            return probe, extra
        self.kbar = (self.kbar + 1) % k
        others = np.flatnonzero(self.assign != self.kbar)
        if len(others):
            rows, _ = self._client_vectors(ctx, self.models[self.kbar : self.kbar + 1], others,
                                           np.zeros(len(others), dtype=np.int64), seed,
                                           coords=self.coords)
            probe[torch.from_numpy(others)] = self._to_features(rows)
            extra[others] = 1.0
        return probe, extra

    def _beta(self, t: int) -> float:
        cfg = self.config
        if cfg.feature_average == "last":
            return 1.0
        if cfg.mode == "repo":
            return 1.0 / (t // (cfg.n_clusters * cfg.period) + 1)
        return 1.0 / (int(self.block_updates[self.kbar]) + 1)

    def _update_features(self, t: int, probe: torch.Tensor, ok: np.ndarray) -> dict[str, Any]:
        """Alg. 1 lines 8–9: running mean of block k̄ (clients with finite replies only)."""
        beta = self._beta(t)
        rows = torch.from_numpy(np.flatnonzero(ok))
        block = self.features[:, self.kbar]
        fresh = probe[rows].to(block.dtype)
        block[rows] = (1.0 - beta) * block[rows] + beta * fresh
        self.block_updates[self.kbar] += 1
        if len(self.block_gram):
            self.block_gram[self.kbar] = gram_matrix(block)  # only block k̄ changed
        return {"beta": beta}

    def _cluster(self, ctx: Context, t: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Alg. 1 line 10 / Alg. 3, plus the Appendix-G spectrum and estimate."""
        cfg = self.config
        c = ctx.n_clients
        rows = self.features.reshape(c, -1)
        want = max(cfg.n_clusters, 2 * cfg.k_max) if cfg.estimate_k else cfg.n_clusters
        res = spectral_clustering(rows, cfg.n_clusters, self.assign, ctx.next_seed(),
                                  cfg.svd, cfg.kmeans_n_init, n_components=want,
                                  gram=self.block_gram.sum(0) if len(self.block_gram) else None)
        sv = res.projection.singular_values
        extras: dict[str, Any] = {
            "singular_values": sv[:MAX_SPECTRUM].tolist(),
            "largest_gaps_after": gap_ranking(sv[:MAX_SPECTRUM]),
            "projected_features": res.projection.features[:, : cfg.n_clusters].tolist(),
        }
        if cfg.estimate_k:
            extras.update(self._estimate(ctx, res.projection.features, sv))
        return res.assignment, extras

    def _estimate(self, ctx: Context, feats: np.ndarray, sv: np.ndarray) -> dict[str, Any]:
        cfg = self.config
        s = largest_gap(sv, max_s=feats.shape[1])
        k_hi = min(cfg.k_max, ctx.n_clients - 1)
        k, scores = estimate_n_clusters(feats[:, :s], k_hi, ctx.next_seed(), cfg.k_criterion,
                                        cfg.kmeans_n_init)
        self.estimate = {"k_estimate": int(k), "spectral_gap_s": int(s)}
        return {"k_scores": {str(key): float(v) for key, v in scores.items()}}

    def _update_models(self, own: torch.Tensor, groups: np.ndarray, ok: np.ndarray,
                       lr: float) -> None:
        """Alg. 1 line 4 (θ_k −= γ agg ∇) or Alg. 4 line 5 (θ_k += mean Δθ), then the shared
        coordinates from all clients."""
        cfg = self.config
        sign, scale = (-1.0, lr) if cfg.protocol == "gradient" else (1.0, 1.0)
        shared_base = None if self.shared is None else self.models[0, self.shared].clone()
        for k in range(cfg.n_clusters):
            members = np.flatnonzero((groups == k) & ok)
            if len(members):
                self.models[k] += sign * scale * self._aggregate(own[torch.from_numpy(members)])
        if self.shared is not None and shared_base is not None and ok.any():
            rows = own[torch.from_numpy(np.flatnonzero(ok))][:, self.shared]
            self.models[:, self.shared] = shared_base + sign * scale * self._aggregate(rows)

    def _aggregate(self, rows: torch.Tensor) -> torch.Tensor:
        if self.config.gradient_aggregation == "sum":
            return rows.sum(0)
        return rows.mean(0)

    def _lr(self, ctx: Context) -> float:
        lr = self.config.server_lr
        return float(lr if lr is not None else ctx.training.lr)

    # ------------------------------------------------------------------ costs (Tables 5–6)
    def _book(self, ctx: Context, down: np.ndarray) -> None:
        self.counts["models_down"] += float(down.sum())
        self.counts["vectors_up"] += float(down.sum())
        self.counts["gradients"] += float(down.sum())
        # the uplink this round's requests booked, i.e. what was sent (d̂-wide clustering
        # replies, whole vectors for the model update; absent clients send nothing)
        self.counts["uplink_floats_compressed"] += ctx.floats_up - self._up_before
        self.counts["rounds"] += 1.0

    def _cost_extras(self) -> dict[str, Any]:
        """Per client and per period of P rounds (the paper's Y ≤ P + 1), running averages."""
        n = max(self.counts["rounds"], 1.0) * len(self.assign)
        p = self.config.period
        return {
            "models_down_per_client_period": self.counts["models_down"] / n * p,
            "vectors_up_per_client_period": self.counts["vectors_up"] / n * p,
            "gradients_per_client_period": self.counts["gradients"] / n * p,
            "feature_dim": len(self.feature_index),
            "uplink_floats_compressed": self.counts["uplink_floats_compressed"],
        }

    # ------------------------------------------------------------------ interface
    def assignment(self) -> np.ndarray:
        return self.assign.copy()

    def predictor(self) -> Predictor:
        return Predictor.single(self.models, self.assign)

    def label(self) -> str:
        return f"CFL-GP (K={self.config.n_clusters})"

    def state_dict(self) -> dict[str, Any]:
        return {
            "models": self.models.clone(), "assign": self.assign.copy(),
            "features": self.features.clone(), "block_gram": self.block_gram.copy(),
            "block_updates": self.block_updates.copy(),
            "kbar": self.kbar, "last_change": self.last_change, "stopped_at": self.stopped_at,
            "feature_index": self.feature_index.clone(),
            "shared": None if self.shared is None else self.shared.clone(),
            "counts": dict(self.counts), "estimate": dict(self.estimate),
            "stable": self.stable,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = state["models"].clone()
        self.assign = np.asarray(state["assign"], dtype=np.int64).copy()
        self.features = state["features"].clone()
        self.block_gram = np.asarray(state["block_gram"], dtype=np.float64).copy()
        self.block_updates = np.asarray(state["block_updates"], dtype=np.int64).copy()
        self.kbar = int(state["kbar"])
        self.last_change = int(state["last_change"])
        self.stopped_at = None if state["stopped_at"] is None else int(state["stopped_at"])
        self.feature_index = state["feature_index"].clone()
        self.coords = self._wire_coords()
        self.shared = None if state["shared"] is None else state["shared"].clone()
        self.counts = dict(state["counts"])
        self.estimate = dict(state["estimate"])
        self.stable = int(state["stable"])
