"""FLT, federated learning with taskonomy (Jamali-Rad, Abdizadeh, Szabó 2022, Alg. 2-3), and
the PCA+kM+HC baseline of the same paper (§4.3).

One-off clustering, FCR (Algorithm 2), before the first training round:
1. (lines 1-10) every client receives the ConvAE G(·) (App. C.3), optionally fine-tunes it for
   F epochs on its own images ("Enc2"), embeds its data, E_m = G(D_m) ⊂ R^e, and sends the k
   k-means centroids M_m = {μ_1..μ_k} (an `EmbedRequest`; k·e floats up, the encoder down);
2. (lines 12-14) the server maps all k·M centroids with UMAP to R^u, u = 2: Z_m = {u_m,1..u_m,k};
3. (line 15) adjacency A_ij = min_{r,s} ‖u_i,r − u_j,s‖₂;
4. (line 17) thresholding Ã_ij = 1 if A_ij < γ else 0 (γ = 1);
5. (line 19) Ward hierarchical clustering of the clients into C clusters.

Training (Algorithm 3), T rounds; each round a fraction ρ of the clients trains E epochs:
- Case I, `aggregation = "relatedness"` (line 17): every client m gets the average of the latest
  models of the clients related to it, w_m ← Σ_j Ã_mj p_j w̄_j / Σ_j Ã_mj p_j. All rows are
  computed from one snapshot W̄ (the returned models of this round's participants, the last
  known model of everybody else), never from rows already updated in the same round.
- Case II, `aggregation = "clusters"` (lines 19-20): FedAvg inside each HC cluster.

Choices the paper leaves open (or states differently from the authors' code), and ours:
- Thresholding: the paper writes Ã = Sign(A − γ); we use the indicator [A_ij < γ] ("close means
  related"), as the authors' code does (`distance < 1 → 1`); Ã_ii = 1.
- `distance = "matched"` is the authors' code instead of the paper's minimum: the mean squared
  distance of the best one-to-one matching of the two centroid sets (Hungarian matching, which
  equals their search over all permutations). Their code also takes k from the true number of
  labels of the client's cluster; we never do: k is a parameter (default 5).
- Case I weights: Alg. 3 writes W̄ Ã diag(p_m/‖Ã_m‖₀), which read literally scales every model by
  p_m; we use the p-weighted mean over the related clients (rows normalised to sum to one, the
  unit-row-sum matrix of the convergence analysis, eq. 12-13). Every client's model is updated
  each round, including clients that did not train (they take their neighbours' average).
- Case II weights: line 19 writes (1/|C_c|) Σ p_m w̄_m; we use the sample-weighted mean of the
  cluster's participants (FedAvg); a cluster without participants keeps its model.
- What HC reads: the rows of Ã (each client's 0/1 relatedness profile) as Euclidean points,
  Ward linkage (scipy). Without a threshold (`threshold = None`, the PCA+kM+HC default), the
  rows of A instead.
- Number of clusters C when `n_clusters` is not given (the paper: "HC proposes the best fitting
  number of clusters"): cut the dendrogram in the largest gap between consecutive merge
  heights h_1 ≤ … ≤ h_{M−1}; cutting between h_j and h_{j+1} gives M − j clusters, j ≥ 1
  (never all singletons). If every merge height is 0 (all profiles equal), C = 1.
  `max_clusters` bounds the search. Ties go to fewer clusters.
- UMAP: umap-learn, 2 components, `random_state` from the run's seed, library defaults
  otherwise (n_neighbors 15, min_dist 0.1); n_neighbors is lowered to (points − 1) for tiny
  federations. umap-learn is imported only when FLT clusters (numba compiles on first use).
- All clients take part in the one-off clustering (Alg. 3 line 2 calls FCR on S, all clients).
  A client whose signature is not finite, or who dropped out of the clustering request
  (`clusterfl.robust`), is left out of UMAP and the adjacency and becomes its own cluster
  (logged in the round's `rejected_signatures`).
- Initial models: one PyTorch default initialisation (seed of the run) for every client (Case I)
  or every cluster (Case II), as FedAvg starts.
- Encoder fine-tuning (Enc2): Adam, lr 1e-3, binary cross-entropy, minibatch 32, F = 5 epochs
  (the authors' code uses Adam 1e-3 and BCE; the paper says "F epochs of SGD").

PCA+kM+HC (§4.3, after Dennis & Smith): the same pipeline with client-side PCA instead of the
encoder (centroids mapped back to input space, see `clusterfl.engine.signatures`), no UMAP and,
by default, no threshold (HC on the rows of the raw distance matrix), Case II aggregation.

Communication (Table 6): M·W_enc + k·M·e once, then 2ρ·M·W_local per round. The one-off part is
booked by the `EmbedRequest` and reported as `clustering_floats_down/up` in every round.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context
from clusterfl.algorithms.ifca import average_members, finite_rows, mean_finite
from clusterfl.errors import ConfigError
from clusterfl.protocol import EmbedReply, EmbedRequest, Predictor, TrainRequest
from clusterfl.robust.replies import answered

ARTIFACT = "flt_relatedness.npz"
HISTORY_MAX_CLIENTS = 500  # above this, A/Ã/linkage/points go to ARTIFACT only, not history


# ============================================================================ server-side math


def min_distance_adjacency(points: np.ndarray, block: int = 256) -> np.ndarray:
    """A_ij = min over r, s of ‖points[i, r] − points[j, s]‖₂ for `points` of shape `[M, k, u]`.

    Computed in blocks of clients so memory stays O(block · M · k²).
    """
    pts = np.asarray(points, dtype=np.float64)
    m, k, u = pts.shape
    flat = pts.reshape(m * k, u)
    sq = (flat**2).sum(1)
    out = np.empty((m, m))
    for a in range(0, m, block):
        b = min(m, a + block)
        rows = flat[a * k : b * k]
        d2 = (rows**2).sum(1)[:, None] + sq[None, :] - 2.0 * rows @ flat.T
        d2 = np.maximum(d2, 0.0).reshape(b - a, k, m, k)
        out[a:b] = np.sqrt(d2.min(axis=(1, 3)))
    np.fill_diagonal(out, 0.0)
    return np.minimum(out, out.T)  # exact symmetry despite rounding


def matched_distance_adjacency(points: np.ndarray) -> np.ndarray:
    """The authors' code: mean squared distance of the best one-to-one matching of centroids."""
    from scipy.optimize import linear_sum_assignment

    pts = np.asarray(points, dtype=np.float64)
    m = len(pts)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            cost = ((pts[i][:, None, :] - pts[j][None, :, :]) ** 2).sum(-1)
            r, c = linear_sum_assignment(cost)
            out[i, j] = out[j, i] = float(cost[r, c].mean())
    return out


def adjacency(points: np.ndarray, kind: Literal["min", "matched"] = "min") -> np.ndarray:
    """Client × client distance matrix A from per-client point sets `[M, k, u]`."""
    return min_distance_adjacency(points) if kind == "min" else matched_distance_adjacency(points)


def threshold(a: np.ndarray, gamma: float) -> np.ndarray:
    """Ã_ij = 1 where A_ij < γ (related), else 0; the diagonal is 1."""
    out = (np.asarray(a) < gamma).astype(np.float64)
    np.fill_diagonal(out, 1.0)
    return out


def ward_linkage(features: np.ndarray) -> np.ndarray:
    """scipy's Ward linkage matrix `[M−1, 4]` of the rows of `features`."""
    from scipy.cluster.hierarchy import ClusterWarning, linkage

    f = np.asarray(features, dtype=np.float64)
    if len(f) < 2:
        return np.zeros((0, 4))
    with warnings.catch_warnings():  # rows of a distance matrix are meant as observations here
        warnings.simplefilter("ignore", ClusterWarning)
        return linkage(f, method="ward")


def auto_n_clusters(z: np.ndarray, max_clusters: int | None = None, tol: float = 1e-9) -> int:
    """Number of clusters at the largest gap between consecutive merge heights (see module doc).

    Cutting between heights h_j and h_{j+1} (j = 1..M−2) gives M − j clusters; only cuts with
    at most `max_clusters` clusters are considered; ties go to fewer clusters. One client, or
    all heights ≤ tol, gives 1 cluster; two clients at a positive distance give 2.
    """
    m = len(z) + 1
    h = np.sort(np.asarray(z[:, 2], dtype=np.float64)) if len(z) else np.zeros(0)
    if m <= 1 or h[-1] <= tol:
        return 1
    if m == 2:
        return 2 if max_clusters is None or max_clusters >= 2 else 1
    best_c, best_gap = 1, -1.0
    for j in range(1, m - 1):  # cut between h[j-1] and h[j] (0-based): m - j clusters
        c = m - j
        if max_clusters is not None and c > max_clusters:
            continue
        gap = h[j] - h[j - 1]
        if gap >= best_gap - tol:  # later j = fewer clusters wins ties
            best_c, best_gap = c, gap
    if max_clusters is not None and max_clusters < 2:
        return 1
    return best_c


def cut_tree(z: np.ndarray, n_clusters: int, m: int) -> np.ndarray:
    """Cluster ids 0..C−1 of the M leaves, numbered by first appearance in client order."""
    from scipy.cluster.hierarchy import fcluster

    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if n_clusters <= 1 or m == 1:
        return np.zeros(m, dtype=np.int64)
    raw = fcluster(z, t=min(n_clusters, m), criterion="maxclust")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


def relatedness_weights(related: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Ω_mj = Ã_mj p_j / Σ_j Ã_mj p_j (each row sums to one; p_j ∝ client data size)."""
    w = np.asarray(related, dtype=np.float64) * np.asarray(sizes, dtype=np.float64)[None, :]
    total = w.sum(1, keepdims=True)
    total[total == 0] = 1.0
    return w / total


def relatedness_average(snapshot: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Case I: new models Ω · W̄, every row computed from the same snapshot W̄ `[M, d]`.

    Clients with identical rows of Ω (a block of mutually related clients) share one product,
    so a block-diagonal Ã costs C rows instead of M. Computed in the snapshot's dtype.
    """
    uniq, inverse = np.unique(np.asarray(weights, dtype=np.float64), axis=0,
                              return_inverse=True)
    omega = torch.as_tensor(uniq, dtype=snapshot.dtype)
    return (omega @ snapshot)[torch.from_numpy(np.asarray(inverse).reshape(-1))]


def umap_embed(points: np.ndarray, seed: int, n_neighbors: int = 15,
               min_dist: float = 0.1) -> np.ndarray:
    """UMAP (umap-learn) of `[n, e]` points to 2 dimensions, seeded (imported lazily)."""
    import umap

    pts = np.asarray(points, dtype=np.float64)
    if len(pts) < 3:
        return np.zeros((len(pts), 2)) if len(pts) else np.zeros((0, 2))
    reducer = umap.UMAP(n_components=2, n_neighbors=max(2, min(n_neighbors, len(pts) - 1)),
                        min_dist=min_dist, random_state=int(seed) % (2**31 - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n_jobs overridden by random_state", tiny-n notes
        return np.asarray(reducer.fit_transform(pts), dtype=np.float64)


# ============================================================================ configs


class _OneShotConfig(AlgorithmConfig):
    """Settings shared by FLT and PCA+kM+HC."""

    fraction: float = Field(0.2, gt=0.0, le=1.0, description="clients sampled per round (ρ)")
    k: int = Field(5, ge=1, description="k-means centroids per client (never from labels)")
    distance: Literal["min", "matched"] = Field(
        "min", description="adjacency: minimum pairwise distance (paper) or the authors' "
        "permutation-matched mean squared distance")
    threshold: float | None = Field(
        1.0, gt=0.0, description="γ: clients with A_ij < γ are related (None: no threshold)")
    aggregation: Literal["relatedness", "clusters"] = Field(
        "relatedness", description="Alg. 3 case I (relatedness matrix) or case II (clusters)")
    n_clusters: int | None = Field(
        None, ge=1, description="C for hierarchical clustering (None: chosen automatically)")
    max_clusters: int | None = Field(
        None, ge=1, description="upper bound on the automatic C")
    kmeans_n_init: int = Field(10, ge=1, description="k-means restarts on each client")

    @model_validator(mode="after")
    def _case_one_needs_threshold(self) -> _OneShotConfig:
        if self.aggregation == "relatedness" and self.threshold is None:
            raise ValueError("aggregation = 'relatedness' (case I) needs a threshold γ; set "
                             "threshold or use aggregation = 'clusters'")
        return self


class FLTConfig(_OneShotConfig):
    """Settings of FLT (`[algorithm] name = "flt"`)."""

    name: Literal["flt"] = "flt"
    encoder: str = Field(
        "fashion_mnist", description="encoder file (.pt), a dataset to pretrain on (cached), "
        "or 'none' (untrained)")
    pretrain_epochs: int = Field(30, ge=1, description="epochs when the encoder is pretrained")
    encoder_seed: int = Field(0, ge=0, description="seed of the pretrained encoder")
    encoder_dir: str | None = Field(None, description="encoder cache (default <data>/encoders)")
    data_dir: str | None = Field(None, description="where the pretraining dataset lives")
    latent: int = Field(128, ge=1, description="e, the encoder's code size")
    finetune_epochs: int = Field(5, ge=0, description="F (Enc2); 0 = frozen encoder (Enc1)")
    finetune_lr: float = Field(1e-3, gt=0.0)
    finetune_batch_size: int = Field(32, ge=1)
    umap: bool = Field(True, description="map the centroids with UMAP (2-d) before distances")
    umap_neighbors: int = Field(15, ge=2)
    umap_min_dist: float = Field(0.1, ge=0.0)


class PCAKMHCConfig(_OneShotConfig):
    """Settings of PCA+kM+HC (`[algorithm] name = "pca_km_hc"`)."""

    name: Literal["pca_km_hc"] = "pca_km_hc"
    pca_components: int = Field(10, ge=1, description="PCA components on each client")
    threshold: float | None = Field(None, gt=0.0, description="γ (None: HC on raw distances)")
    aggregation: Literal["relatedness", "clusters"] = Field("clusters")


# ============================================================================ the method


class FLT(Algorithm):
    """FLT (Jamali-Rad et al. 2022): one-off client relatedness, then (clustered) FedAvg."""

    name = "flt"
    Config = FLTConfig
    config: _OneShotConfig

    # ------------------------------------------------------------------ setup
    def setup(self, ctx: Context) -> None:
        self._n = ctx.n_clients
        self._init = ctx.factory.init(ctx.seed)
        self.models = self._init[None].clone()
        self.labels = np.full(self._n, -1, dtype=np.int64)
        self.clustered = False
        self.info: dict[str, Any] = {}
        self.arrays: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ clustering (Alg. 2)
    def _request(self, ctx: Context) -> EmbedRequest:
        cfg = self.config
        assert isinstance(cfg, FLTConfig)
        from clusterfl import encoders

        enc = encoders.resolve(cfg.encoder, tuple(ctx.factory.input_shape), cfg.latent,
                               cfg.pretrain_epochs, cfg.encoder_seed, cfg.encoder_dir,
                               cfg.data_dir)
        self.info["encoder"] = encoders.describe(enc)
        return EmbedRequest(
            np.arange(ctx.n_clients), "encoder", enc.params, cfg.latent, k=cfg.k,
            latent=cfg.latent, finetune_epochs=cfg.finetune_epochs,
            finetune_lr=cfg.finetune_lr, finetune_batch_size=cfg.finetune_batch_size,
            kmeans_n_init=cfg.kmeans_n_init, seed=ctx.next_seed())

    def _map(self, signatures: np.ndarray, seed: int) -> np.ndarray:
        """Server-side manifold step: UMAP of all centroids (FLT), identity otherwise."""
        cfg = self.config
        if not getattr(cfg, "umap", False):
            return signatures
        m, k, e = signatures.shape
        flat = umap_embed(signatures.reshape(m * k, e), seed, cfg.umap_neighbors,  # type: ignore[attr-defined]
                          cfg.umap_min_dist)  # type: ignore[attr-defined]
        return flat.reshape(m, k, 2)

    def _cluster(self, ctx: Context) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        before = (ctx.floats_down, ctx.floats_up)
        request = self._request(ctx)
        reply = ctx.send(request)
        assert isinstance(reply, EmbedReply)
        sig = np.asarray(reply.signatures, dtype=np.float64)
        who = answered(reply, np.asarray(request.clients))  # dropped clients have no row
        fine = np.isfinite(sig.reshape(len(sig), -1)).all(1) if sig.size else np.zeros(0, bool)
        ok = np.zeros(self._n, dtype=bool)
        ok[who[fine]] = True
        good = np.flatnonzero(ok)
        points = self._map(sig[fine], ctx.next_seed())
        a = np.full((self._n, self._n), np.inf)
        a[np.ix_(good, good)] = adjacency(points, cfg.distance)
        np.fill_diagonal(a, 0.0)
        related = (threshold(a, cfg.threshold) if cfg.threshold is not None
                   else np.eye(self._n))
        feats = related if cfg.threshold is not None else a
        z = ward_linkage(feats[np.ix_(good, good)])
        if cfg.n_clusters is not None and cfg.n_clusters > len(good):
            raise ConfigError("algorithm.n_clusters", f"{cfg.n_clusters} clusters asked, only "
                              f"{len(good)} clients have a signature")
        c = cfg.n_clusters or auto_n_clusters(z, cfg.max_clusters)
        labels = np.full(self._n, -1, dtype=np.int64)
        labels[good] = cut_tree(z, c, len(good))
        bad = np.flatnonzero(~ok)
        labels[bad] = labels.max(initial=-1) + 1 + np.arange(len(bad))  # own clusters
        self.labels = labels
        n_groups = int(labels.max(initial=-1)) + 1
        self.models = (self._init[None].repeat(self._n, 1) if cfg.aggregation == "relatedness"
                       else self._init[None].repeat(max(n_groups, 1), 1))
        self.clustered = True
        self.arrays = {"adjacency": a, "relatedness": related, "linkage": z,
                       "points": points.reshape(-1, points.shape[-1]) if points.size
                       else np.zeros((0, 2)), "signature_clients": good}
        self.info.update({
            "clustering_floats_down": ctx.floats_down - before[0],
            "clustering_floats_up": ctx.floats_up - before[1],
            "n_clusters_found": n_groups, "rejected_signatures": len(bad),
            "clustering_seconds": round(time.perf_counter() - t0, 3),
        })
        if self._n > HISTORY_MAX_CLIENTS:  # M² numbers per line: keep them in the npz only
            return {"adjacency": None, "linkage": None, "relatedness": None, "umap_points": None}
        finite_a = np.where(np.isfinite(a), a, -1.0)
        return {"adjacency": np.round(finite_a, 5), "linkage": np.round(z, 6),
                "relatedness": related.astype(np.int8), "umap_points":
                np.round(self.arrays["points"], 5) if getattr(cfg, "umap", False) else None}

    # ------------------------------------------------------------------ rounds (Alg. 3)
    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        big = self._cluster(ctx) if not self.clustered else {}
        clients = ctx.sample(self.config.fraction)
        if self.config.aggregation == "relatedness":
            loss, rejected = self._relatedness_step(ctx, clients)
        else:
            loss, rejected = self._cluster_step(ctx, clients)
        out = {"train_loss": loss, "rejected": rejected,
               **{k: v for k, v in self.info.items() if k != "encoder"}}
        if big:
            out.update(big)
            out["encoder"] = self.info.get("encoder")
        return out

    def _relatedness_step(self, ctx: Context, clients: np.ndarray) -> tuple[float | None, int]:
        """Case I: participants train their own model; every model ← Ω · snapshot."""
        reply = ctx.send(TrainRequest(clients, self.models, clients, ctx.training,
                                      ctx.next_seed()))
        who = answered(reply, clients)
        ok = finite_rows(reply.params)
        snapshot = self.models.clone()
        snapshot[torch.from_numpy(who[ok])] = reply.params[torch.from_numpy(ok)]
        omega = relatedness_weights(self.arrays["relatedness"], ctx.train_sizes)
        self.models = relatedness_average(snapshot, omega)
        return mean_finite(reply.loss), int((~ok).sum())

    def _cluster_step(self, ctx: Context, clients: np.ndarray) -> tuple[float | None, int]:
        """Case II: FedAvg inside each cluster (clusters without participants keep theirs)."""
        groups = self.labels[clients]
        reply = ctx.send(TrainRequest(clients, self.models, groups, ctx.training,
                                      ctx.next_seed()))
        ok = finite_rows(reply.params)
        keep = torch.from_numpy(ok)
        groups = self.labels[answered(reply, clients)]
        self.models = average_members(self.models, reply.params[keep], groups[ok],
                                      reply.n_samples[ok])
        return mean_finite(reply.loss), int((~ok).sum())

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.labels.copy()

    def predictor(self) -> Predictor:
        if not self.clustered:
            return Predictor.single(self.models[:1], np.zeros(self._n, np.int64))
        if self.config.aggregation == "relatedness":
            return Predictor.single(self.models, np.arange(self._n))
        return Predictor.single(self.models, np.maximum(self.labels, 0))

    def relatedness(self) -> dict[str, np.ndarray]:
        """A, Ã, the Ward linkage and the (UMAP) points of the one-off clustering."""
        return {k: v.copy() for k, v in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"models": self.models.clone(), "labels": self.labels.copy(),
                "clustered": self.clustered, "info": dict(self.info),
                "arrays": {k: v.copy() for k, v in self.arrays.items()}, "n": self._n,
                "init": self._init.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = state["models"].clone()
        self.labels = np.asarray(state["labels"], dtype=np.int64).copy()
        self.clustered = bool(state["clustered"])
        self.info = dict(state["info"])
        self.arrays = {k: np.asarray(v).copy() for k, v in state["arrays"].items()}
        self._n = int(state["n"])
        self._init = state["init"].clone()

    def save_artifacts(self, out_dir: Path, rounds: int) -> None:
        """Write A, Ã, the linkage, points and labels to `out_dir/flt_relatedness.npz`."""
        if self.clustered:
            np.savez_compressed(Path(out_dir) / ARTIFACT, labels=self.labels, **self.arrays)


class PCAKMHC(FLT):
    """PCA+kM+HC (FLT paper §4.3): client PCA + k-means, server HC, FedAvg per cluster."""

    name = "pca_km_hc"
    Config = PCAKMHCConfig

    def _request(self, ctx: Context) -> EmbedRequest:
        cfg = self.config
        assert isinstance(cfg, PCAKMHCConfig)
        d = int(np.prod(ctx.factory.input_shape))
        # an empty tensor rather than None: serializers that ship tensors need no special case
        return EmbedRequest(np.arange(ctx.n_clients), "pca", torch.zeros(0), d, k=cfg.k,
                            pca_components=cfg.pca_components,
                            kmeans_n_init=cfg.kmeans_n_init, seed=ctx.next_seed())


__all__ = [
    "FLT",
    "PCAKMHC",
    "FLTConfig",
    "PCAKMHCConfig",
    "adjacency",
    "auto_n_clusters",
    "cut_tree",
    "matched_distance_adjacency",
    "min_distance_adjacency",
    "relatedness_average",
    "relatedness_weights",
    "threshold",
    "umap_embed",
    "ward_linkage",
]
