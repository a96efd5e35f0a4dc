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

Training (Algorithm 3), T rounds; each round a fraction ρ of the clients trains E epochs
(`fraction`, default ρ = 0.2 as in the paper; or a fixed number `per_round`, `SampledConfig`):
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
  Ward linkage (scipy). Without a threshold (`threshold = "none"`, the PCA+kM+HC default), the
  rows of A instead.
- Number of clusters C when `n_clusters` is not given (the paper: "HC proposes the best fitting
  number of clusters", without saying how; ours): by default (`auto_clusters =
  "silhouette"`, `auto_on = "signatures"`, rule v2, issue 36) Ward's tree of the rows of
  the signatures' own distances D (`distance` between the clients' centroid sets in the
  encoder's space, before UMAP), cut by the divisive silhouette cut under the distances of
  those rows: a cluster is cut where its best cut's silhouette reaches `min_silhouette`
  and, for a cluster of `SHUFFLE_MIN` (5) clients or more, CFL's shuffle test of its
  members' D gives p < `significance` (0.002, FL+HC's and CFL's level) (`signature_cut`).
  Why: UMAP and the threshold γ make tight sub-groups of one group's clients, the bound
  alone cuts small groups of noise, the test alone the many clients of an iid federation
  (docs/transfer.md, "FLT's rule v2"). The relatedness Ã (Case I) and a given C still read
  the UMAP pipeline. Rule v1 (`auto_on = "relatedness"`, `significance = 0`): the divisive
  silhouette cut of the Ward tree under the Euclidean distances of the rows HC reads, one
  cluster when no cut reaches `min_silhouette` (`silhouette_cut`). PCA+kM+HC (no UMAP, no
  threshold: HC reads the rows of D in input space) cuts that tree where the bound is
  reached and, for a cluster of 5 clients or more, the shuffle test of the distances between
  those rows gives p < `significance` (its rule v2, `rows_cut`; `significance = 0`: rule v1,
  the bound alone; docs/transfer.md, "PCA+kM+HC's rule v2"). `"gap"`: cut the
  dendrogram in the largest gap between consecutive merge
  heights h_1 ≤ … ≤ h_{M−1}; cutting between h_j and h_{j+1} gives M − j clusters, j ≥ 1
  (never all singletons). If every merge height is 0 (all profiles equal), C = 1.
  `max_clusters` bounds the search. Ties go to fewer clusters. Alternative (ours, issue 25;
  `auto_clusters = "components"`): the connected components of Ã are the clusters (HC's
  dendrogram is still computed and recorded). The gap rule assumes every true group is a
  near-complete block of Ã; with the authors' matched distance in MNIST Scenario 2 the
  blocks are only 42–60 % filled and the gap rule finds 2 clusters (ARI 0.20), while the
  components need only that each group is connected and no link crosses groups. Needs a
  threshold (without one Ã is the identity); `max_clusters` does not apply to it.
- UMAP: umap-learn, 2 components, `random_state` from the run's seed, library defaults
  otherwise (n_neighbors 15, min_dist 0.1); n_neighbors is lowered to (points − 1) for tiny
  federations. umap-learn is imported only when FLT clusters (numba compiles on first use).
- All clients take part in the one-off clustering (Alg. 3 line 2 calls FCR on S, all clients),
  whatever the sampling rule: the first round's record counts every client that sent a
  signature among its participants; the rule samples the training requests only.
  A client absent from the reply — it dropped out of the clustering request, or the
  validation of `clusterfl.robust` rejected its signature (non-finite values) — has no
  signature: it is left out of UMAP and the adjacency and becomes its own cluster (counted
  in the round's `rejected_signatures`). A fixed `n_clusters` larger than the signatures that
  arrived is lowered to their number (as PACFL and FL+HC; `oneshot.cut_clients`): each of
  those clients its own cluster, recorded in `n_clusters_found` and `rejected_signatures`
  and said in a warning (`oneshot.lowered_cut`).
- Initial models: one PyTorch default initialisation (seed of the run) for every client (Case I)
  or every cluster (Case II), as FedAvg starts.
- Encoder fine-tuning (Enc2): Adam, lr 1e-3, binary cross-entropy, minibatch 32, F = 5 epochs
  (the authors' code uses Adam 1e-3 and BCE; the paper says "F epochs of SGD").
- Where the encoder comes from (`encoder` a dataset name): its pretraining dataset is read from
  `algorithm.data_dir`, else from the run's data folder as the federation's is found
  (`data.data_dir`, which `--data-dir` sets, handed to the method as `FLT.data_dir`; else
  `$CLUSTERFL_DATA`, else ~/.cache/clusterfl), and the encoder is cached in `encoder_dir`,
  else `<that folder>/encoders`; a cache folder that cannot be written (or is read-only) is a
  one-line error naming `algorithm.encoder_dir` before anything is pretrained.

PCA+kM+HC (§4.3, after Dennis & Smith): the same pipeline with client-side PCA instead of the
encoder (centroids mapped back to input space, see `clusterfl.engine.signatures`), no UMAP and,
by default, no threshold (HC on the rows of the raw distance matrix), Case II aggregation.

Communication (Table 6): M·W_enc + k·M·e once, then 2ρ·M·W_local per round. `Context.send`
books all of it; the one-off part is also reported in every round as `clustering_floats_down`
(the `EmbedRequest`'s per-client downlink × the clients it listed) and `clustering_floats_up`
(its per-client uplink × the clients whose signature arrived).

Placing a client that did not train (`placement`; the paper clusters once and does not place
newcomers, the rule is ours): the client computes its signature exactly as the clustered
clients did (the same `EmbedRequest`: encoder, fine-tuning, k, PCA settings), the server maps
it into the SAME embedding (the UMAP of the clustering, fitted again from the stored
signatures with the stored seed — the same map — and UMAP's `transform` for the new points;
no map for PCA+kM+HC), computes its distances A_new,j to every clustered client with the
clustering's distance (`distance`), thresholds them with γ (Ã_new,j = [A_new,j < γ]) when
the clustering did, and joins the cluster that Ward's criterion — the one the hierarchical
clustering merged by — would merge it into: the least increase n_c/(n_c+1)‖x − μ_c‖² of the
within-cluster sum of squares, x its row of Ã (or of A without a threshold; of D, its
signature's distances in the encoder's space, under rule v2's automatic C), μ_c the mean of
the members' rows. Case II: it predicts with its cluster's model. Case I: with the p-weighted
mean of the current models of the clients related to it (Alg. 3's case-I rule applied to its
row Ã_new; the nearest client's model when it is related to none). The clustering state
keeps what this needs (the signatures, the UMAP seed, the clients' data sizes).

Code: the server math lives in `clusterfl.clustering.relatedness` (UMAP, A, Ã, Case-I
weights and average) and `clusterfl.clustering.hierarchical` (Ward linkage, the automatic C,
the cut); the client side in `clusterfl.engine.signatures`. Everything the server keeps
between rounds is `FLTState`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from clusterfl.algorithms.base import FIRST, Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import Placement, SampledConfig, answered, check_k_fits
from clusterfl.algorithms.oneshot import (
    AutoCut,
    Cut,
    OneOffAsk,
    Threshold,
    cut_clients,
    dump_cut,
    lowered_cut,
    max_clusters_field,
    min_silhouette_field,
    own_clusters,
    significance_field,
    unbound_max_clusters,
)
from clusterfl.clustering.aggregate import average_members
from clusterfl.clustering.cosine import both_structured, distance_similarity
from clusterfl.clustering.hierarchical import (
    connected_groups,
    pairwise_distances,
    ward_linkage,
    ward_nearest,
)
from clusterfl.clustering.relatedness import (
    adjacency,
    cross_distances,
    relatedness_average,
    relatedness_weights,
    threshold,
    umap_embed,
    umap_embed_new,
)
from clusterfl.config_util import MAX_SEED, changed_fields
from clusterfl.errors import ConfigError
from clusterfl.files import write_whole
from clusterfl.protocol import (
    EmbedReply,
    EmbedRequest,
    Predictor,
    TrainReply,
    TrainRequest,
    mean_finite,
)
from clusterfl.records import RoundExtras

ARTIFACT = "flt_relatedness.npz"
HISTORY_MAX_CLIENTS = 500  # above this, A/Ã/linkage/points go to ARTIFACT only, not history


# ============================================================================ configs


class _OneShotConfig(SampledConfig):
    """Settings shared by FLT and PCA+kM+HC."""

    #: options that only the automatic silhouette cut reads (FLT's rule v2: auto_on, ...)
    silhouette_only: ClassVar[tuple[str, ...]] = ("significance",)
    unnoised_signatures: ClassVar[str] = ("each client's k-means centroids of its embedded "
                                          "data (its signature)")
    fraction: float = Field(0.2, gt=0.0, le=1.0, description="ρ, the share of the clients "
                          "sampled per round (at least one); or set per_round")
    k: int = Field(5, ge=1, description="k-means centroids per client (never from labels)")
    distance: Literal["min", "matched"] = Field(
        "min", description="adjacency: minimum pairwise distance (paper) or the authors' "
        "permutation-matched mean squared distance")
    threshold: Threshold = Field(
        1.0, gt=0.0, description="γ: clients with A_ij < γ are related (\"none\": no "
        "threshold)")
    aggregation: Literal["relatedness", "clusters"] = Field(
        "relatedness", description="Alg. 3 case I (relatedness matrix) or case II (clusters)")
    n_clusters: int | None = Field(
        None, ge=1, description="C for hierarchical clustering (None: chosen automatically)")
    max_clusters: int | None = max_clusters_field("upper bound on the automatic C")
    auto_clusters: Literal["silhouette", "gap", "components"] = Field(
        "silhouette", description="automatic C: the cut of highest mean silhouette (one "
        "cluster below min_silhouette), the largest gap of Ward's merge heights, or the "
        "connected components of the thresholded adjacency Ã")
    min_silhouette: float = min_silhouette_field()
    significance: float = significance_field(
        "the automatic C cuts a cluster of 5 clients or more only where, beside the "
        "min_silhouette bound, CFL's shuffle test of the distances it reads gives a p-value "
        "below this (999 shuffles; FL+HC's level); 0: the bound alone")
    kmeans_n_init: int = Field(10, ge=1, description="k-means restarts on each client")

    @model_validator(mode="after")
    def _case_one_needs_threshold(self) -> _OneShotConfig:
        if self.aggregation == "relatedness" and self.threshold is None:
            raise ValueError("aggregation = 'relatedness' (case I) needs a threshold γ; set "
                             "threshold or use aggregation = 'clusters'")
        if self.auto_clusters == "components" and self.threshold is None:
            raise ValueError("auto_clusters = 'components' needs a threshold γ (without one "
                             "every client is its own component); set threshold or use "
                             "auto_clusters = 'gap'")
        return self

    def sample_counts(self) -> dict[str, tuple[int, str]]:
        return {"k": (self.k, "k-means does nothing: each client's centroids are its own "
                      "samples, repeated to k rows")}

    def ignored_settings(self) -> list[str]:
        """The options of the automatic C that the rule in force never reads: all three
        beside `n_clusters`, `max_clusters` and `min_silhouette` under `auto_clusters =
        "components"`, `min_silhouette` under `"gap"`; and the options only the silhouette
        cut reads (`silhouette_only`) whenever C is not the silhouette cut's."""
        if self.n_clusters is not None:
            why = f"algorithm.n_clusters = {self.n_clusters} fixes C"
            names: tuple[str, ...] = ("auto_clusters", "max_clusters", "min_silhouette",
                                      *self.silhouette_only)
        elif self.auto_clusters == "components":
            why = "auto_clusters = 'components' takes the connected components of Ã"
            names = ("max_clusters", "min_silhouette", *self.silhouette_only)
        elif self.auto_clusters == "gap":
            why = "auto_clusters = 'gap' cuts at the largest gap of merge heights"
            names = ("min_silhouette", *self.silhouette_only)
        else:
            return []
        return [f"algorithm.{o} = {getattr(self, o)!r} does nothing: {why}"
                for o in changed_fields(self, *names)]

    @model_serializer(mode="wrap")
    def _dump_one_rule(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A dump that loads again: one sampling rule (as `SampledConfig`) and `threshold =
        "none"` for no γ (left out, the default γ would come back)."""
        data = handler(self)
        if self.per_round is not None and isinstance(data, dict):
            data.pop("fraction", None)
        return dump_cut(data, self.threshold, None)


class FLTConfig(_OneShotConfig):
    """Settings of FLT (`[algorithm] name = "flt"`)."""

    name: Literal["flt"] = "flt"
    display: ClassVar[str] = "FLT"
    silhouette_only: ClassVar[tuple[str, ...]] = ("auto_on", "significance")
    locations: ClassVar[frozenset[str]] = frozenset({"encoder_dir", "data_dir"})
    encoder: str = Field(
        "fashion_mnist", description="encoder file (.pt), a dataset to pretrain on (cached), "
        "or 'none' (untrained)")
    pretrain_epochs: int = Field(30, ge=1, description="epochs when the encoder is pretrained")
    encoder_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the pretrained encoder")
    encoder_dir: str | None = Field(None, description="encoder cache (default <data "
                                    "dir>/encoders, the folder of the pretraining dataset)")
    data_dir: str | None = Field(None, description="where the pretraining dataset lives "
                                 "(default: the run's data folder: data.data_dir or "
                                 "--data-dir, else $CLUSTERFL_DATA, else ~/.cache/clusterfl)")
    latent: int = Field(128, ge=1, description="e, the encoder's code size")
    finetune_epochs: int = Field(5, ge=0, description="F (Enc2); 0 = frozen encoder (Enc1)")
    finetune_lr: float = Field(1e-3, gt=0.0)
    finetune_batch_size: int = Field(32, ge=1)
    umap: bool = Field(True, description="map the centroids with UMAP (2-d) before distances")
    umap_neighbors: int = Field(15, ge=2)
    umap_min_dist: float = Field(0.1, ge=0.0)
    auto_on: Literal["signatures", "relatedness"] = Field(
        "signatures", description="what the automatic C reads: the distances (`distance`) "
        "between the clients' signatures in the encoder's space, before UMAP (rule v2, issue "
        "36), or the rows of Ã after UMAP, as HC does for a given C (rule v1)")

    def ignored_settings(self) -> list[str]:
        """`_OneShotConfig`'s (`auto_on` and `significance` among them), UMAP's options
        without UMAP, fine-tuning's without it."""
        return [*super().ignored_settings(), *[
            f"algorithm.{o} = {getattr(self, o)!r} does nothing: umap = false (no UMAP)"
            for o in (changed_fields(self, "umap_neighbors", "umap_min_dist")
                      if not self.umap else [])], *[
            f"algorithm.{o} = {getattr(self, o)!r} does nothing: finetune_epochs = 0 (the "
            "encoder is not fine-tuned)"
            for o in (changed_fields(self, "finetune_lr", "finetune_batch_size")
                      if self.finetune_epochs == 0 else [])]]


class PCAKMHCConfig(_OneShotConfig):
    """Settings of PCA+kM+HC (`[algorithm] name = "pca_km_hc"`)."""

    name: Literal["pca_km_hc"] = "pca_km_hc"
    display: ClassVar[str] = "PCA+kM+HC"
    pca_components: int = Field(10, ge=1, description="PCA components on each client")
    threshold: Threshold = Field(None, gt=0.0, description="γ (\"none\": HC on raw distances)")
    aggregation: Literal["relatedness", "clusters"] = Field("clusters")


# ============================================================================ extras


@dataclass(kw_only=True)
class FLTExtras(RoundExtras):
    """FLT's (and PCA+kM+HC's) per-round extras in the rounds after the one-off clustering."""

    train_loss: float | None = None  # mean local training loss of the clients that answered
    clustering_floats_down: float = 0.0  # downlink: per-client floats × clients listed
    clustering_floats_up: float = 0.0  # uplink: per-client floats × signatures received
    n_clusters_found: int = 0  # clusters (a client without signature: its own)
    rejected_signatures: int = 0  # clients without a (valid) signature: dropped out or rejected
    clustering_seconds: float = 0.0  # wall time of the one-off clustering in seconds


@dataclass(kw_only=True)
class FLTClusteringExtras(FLTExtras):
    """The extras of the round of the one-off clustering (the first). The matrices are None
    above `HISTORY_MAX_CLIENTS` clients (they are then in `ARTIFACT` only)."""

    #: the distance matrix A, 5 digits (-1 where a client has no signature)
    adjacency: list[list[float]] | None = None
    #: the Ward linkage of the clients with a signature (scipy's [M−1, 4] rows), 6 digits
    linkage: list[list[float]] | None = None
    #: the relatedness matrix Ã, 0/1 (the identity without a threshold)
    relatedness: list[list[int]] | None = None
    #: the UMAP points, k per client with a signature, 5 digits (None without UMAP)
    umap_points: list[list[float]] | None = None
    encoder: dict[str, Any] | None = None  # the encoder used (None for PCA+kM+HC)
    silhouette: float | None = None  # best mean silhouette of the automatic cut (None: none)


# ============================================================================ the automatic C


def signature_distances(signatures: np.ndarray, distance: Literal["min", "matched"]
                        ) -> np.ndarray:
    """`[M, M]` `distance` (`adjacency`) between the M clients' signatures `[M, k, e]` in
    the encoder's space, with a zero diagonal."""
    d = adjacency(signatures, distance)
    np.fill_diagonal(d, 0.0)
    return d


def signature_cut(signatures: np.ndarray, distance: Literal["min", "matched"],
                  significance: float, min_silhouette: float,
                  max_clusters: int | None) -> tuple[Cut, np.ndarray]:
    """FLT's automatic C, rule v2 (module doc): Ward's linkage of the rows of the
    signatures' distances D (`signature_distances`), cut by the divisive silhouette cut under
    the distances between those rows where the best cut reaches `min_silhouette` and (with
    `significance` > 0, for a cluster of `SHUFFLE_MIN` clients or more) CFL's shuffle test of
    the members' D gives a smaller p-value (`both_structured`). Returns the cut and the
    linkage."""
    d = signature_distances(signatures, distance)
    z = ward_linkage(d)
    return rows_cut(d, z, None, max_clusters, "silhouette", min_silhouette, significance,
                    tested=d), z


def rows_cut(rows: np.ndarray, z: np.ndarray, n_clusters: int | None,
             max_clusters: int | None, auto_cut: AutoCut, min_silhouette: float,
             significance: float, tested: np.ndarray | None = None) -> Cut:
    """The cut of the M clients whose Ward linkage `z` was built on `rows` (`[M, ·]`, the
    rows HC reads: Ã's, or D's without a threshold): into `n_clusters`, else `auto_cut`; the
    silhouette cut reads the distances between the rows and, with `significance` > 0 (for a
    cluster of `SHUFFLE_MIN` clients or more), needs the shuffle test of `tested` (default:
    those distances; FLT's rule v2: D itself) as well as the bound (`both_structured`;
    PCA+kM+HC's rule v2, FLT's with `auto_on = "relatedness"`)."""
    between = pairwise_distances(rows, rows)
    structured = both_structured(distance_similarity(between if tested is None else tested),
                                 significance, min_silhouette)
    m = len(rows)
    return cut_clients(z, m, np.arange(m), None, n_clusters, max_clusters, auto_cut, between,
                       min_silhouette, structured)


# ============================================================================ the method


@dataclass
class FLTState:
    """What the FLT (and PCA+kM+HC) server keeps between rounds.

    `models`: `[1, d]`, the initial model, until the one-off clustering; then one row per
    client (Case I) or per cluster (Case II). `labels`: the cluster of every client (-1 before
    the clustering). The clustering's arrays (`relatedness()`, the artifact): `adjacency` A,
    `relatedness` Ã, the Ward `linkage`, the (UMAP) `points` and the `signature_clients` that
    sent a signature; kept to place new clients in the same embedding: the `signatures`, the
    UMAP `map_seed` and the clients' data `sizes`. What every round's extras repeat: the
    one-off cost (`clustering_floats_down` / `_up`), `n_clusters_found`,
    `rejected_signatures`, `clustering_seconds`, the `encoder` used (its description; None
    for PCA+kM+HC) and `clustering_round`, the round of the clustering.
    """

    models: torch.Tensor
    labels: np.ndarray
    clustering_round: int  # 0 before (no default: a checkpoint without it is refused)
    adjacency: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    relatedness: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    linkage: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    points: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    signature_clients: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    signatures: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    map_seed: int = 0
    encoder: dict[str, Any] | None = None
    clustering_floats_down: float = 0.0
    clustering_floats_up: float = 0.0
    n_clusters_found: int = 0
    rejected_signatures: int = 0
    clustering_seconds: float = 0.0
    silhouette: float | None = None  # best mean silhouette of the automatic cut (None: none)

    @property
    def clustered(self) -> bool:
        return self.clustering_round > 0


#: the arrays of the one-off clustering (`FLT.relatedness`, the artifact's keys)
ARRAYS = ("adjacency", "relatedness", "linkage", "points", "signature_clients", "signatures",
          "sizes")
#: the phases of a round: the one-off signatures (round 1 only), the training
SIGNATURES, TRAIN = "signatures", "train"


@dataclass(frozen=True)
class SignatureAsk(OneOffAsk[EmbedReply]):
    """The signature request, the UMAP seed drawn with it and the encoder it carries."""

    map_seed: int = 0
    encoder: dict[str, Any] | None = None


class FLT(Algorithm[_OneShotConfig, FLTState]):
    """FLT (Jamali-Rad et al. 2022): one-off client relatedness, then (clustered) FedAvg."""

    name = "flt"
    needs_real_inputs = "signatures of the clients' images (an encoder or PCA)"
    Config: ClassVar[type[_OneShotConfig]] = FLTConfig
    State = FLTState
    device_update = True  # the clusters' averages on the device (signatures come on the CPU)

    # ------------------------------------------------------------------ setup
    def pretraining_data_dir(self) -> str | Path | None:
        """The folder the encoder's pretraining dataset is read from (and, without
        `encoder_dir`, the encoder cached in `<that folder>/encoders`): `algorithm.data_dir`,
        else the run's data folder (`data_dir`), resolved as the federation's is: None means
        `$CLUSTERFL_DATA`, else ~/.cache/clusterfl."""
        cfg = self.config
        own = cfg.data_dir if isinstance(cfg, FLTConfig) else None
        return own if own is not None else self.data_dir

    def fits(self, n_clients: int, rounds: int | None) -> None:
        """A fixed C above the number of clients is refused before the run, as PACFL and
        FL+HC do (C above the signatures that arrived is lowered to them, with a warning:
        `oneshot.lowered_cut`)."""
        check_k_fits(self.config.n_clusters or 1, n_clients)

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        self.check_input(input_shape)
        return unbound_max_clusters(self.config, n_clients)

    def check_input(self, input_shape: tuple[int, ...]) -> None:
        cfg = self.config
        if isinstance(cfg, FLTConfig):
            from clusterfl import encoders

            encoders.check(cfg.encoder, tuple(input_shape), cfg.latent, cfg.pretrain_epochs,
                           cfg.encoder_seed, cfg.encoder_dir, self.pretraining_data_dir(),
                           verify=self.data_verify)
        d = int(np.prod(input_shape))
        if isinstance(cfg, PCAKMHCConfig) and cfg.pca_components > d:  # PCA keeps at most e
            raise ConfigError("algorithm.pca_components", f"{cfg.pca_components} PCA "
                              f"components exceed the input size e = {d}; allowed: 1..{d}")

    def setup(self, ctx: Context) -> None:
        self.fits(ctx.n_clients, ctx.rounds)
        self.sizes = np.asarray(ctx.train_sizes)  # Case I's p_m, kept for placement
        self.state = FLTState(ctx.factory.init(ctx.seed)[None].clone(),
                              np.full(ctx.n_clients, -1, dtype=np.int64), 0)

    # ------------------------------------------------------------------ clustering (Alg. 2)
    def _request(self, ctx: Context,
                 clients: np.ndarray) -> tuple[EmbedRequest, dict[str, Any] | None]:
        """The signature request for `clients` and the encoder it carries (its description;
        None for PCA)."""
        cfg = self.config
        assert isinstance(cfg, FLTConfig)
        from clusterfl import encoders

        enc = encoders.resolve(cfg.encoder, tuple(ctx.factory.input_shape), cfg.latent,
                               cfg.pretrain_epochs, cfg.encoder_seed, cfg.encoder_dir,
                               self.pretraining_data_dir(), verify=self.data_verify)
        return EmbedRequest(
            clients, "encoder", enc.params, cfg.latent, k=cfg.k,
            latent=cfg.latent, finetune_epochs=cfg.finetune_epochs,
            finetune_lr=cfg.finetune_lr, finetune_batch_size=cfg.finetune_batch_size,
            kmeans_n_init=cfg.kmeans_n_init, seed=ctx.next_seed()), encoders.describe(enc)

    def _map(self, signatures: np.ndarray, seed: int) -> np.ndarray:
        """Server-side manifold step: UMAP of all centroids (FLT), identity otherwise."""
        cfg = self.config
        if not isinstance(cfg, FLTConfig) or not cfg.umap:
            return signatures
        m, k, e = signatures.shape
        flat = umap_embed(signatures.reshape(m * k, e), seed, cfg.umap_neighbors,
                          cfg.umap_min_dist)
        return flat.reshape(m, k, 2)

    def _map_new(self, signatures: np.ndarray, new: np.ndarray,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The clustering's map fitted again (same seed) and new signatures mapped into it:
        (clustered clients' points, new clients' points); no map without UMAP."""
        cfg = self.config
        if not isinstance(cfg, FLTConfig) or not cfg.umap:
            return signatures, new
        (m, k, e), n = signatures.shape, len(new)
        fitted, mapped = umap_embed_new(signatures.reshape(m * k, e), new.reshape(n * k, e),
                                        seed, cfg.umap_neighbors, cfg.umap_min_dist)
        return fitted.reshape(m, k, 2), mapped.reshape(n, k, 2)

    def _auto_on_signatures(self) -> bool:
        """Whether the automatic C reads the signatures' distances (FLT's rule v2)."""
        cfg = self.config
        return (isinstance(cfg, FLTConfig) and cfg.n_clusters is None
                and cfg.auto_clusters == "silhouette" and cfg.auto_on == "signatures")

    def _clustered(self, state: FLTState, t: int, ask: SignatureAsk,
                   reply: EmbedReply) -> FLTState:
        """Alg. 2 on the server: the signatures mapped (UMAP), A, Ã, Ward, the cut; every
        client without a signature its own cluster."""
        cfg = self.config
        request = ask.request
        assert isinstance(request, EmbedRequest)
        n = len(state.labels)
        good = np.array(reply.clients, dtype=np.int64)  # anybody absent has no signature
        signatures = np.array(reply.signatures, dtype=np.float64)
        points = self._map(signatures, ask.map_seed)
        a = np.full((n, n), np.inf)
        a[np.ix_(good, good)] = adjacency(points, cfg.distance)
        np.fill_diagonal(a, 0.0)
        related = threshold(a, cfg.threshold) if cfg.threshold is not None else np.eye(n)
        feats = related if cfg.threshold is not None else a
        labels = np.full(n, -1, dtype=np.int64)
        score = None
        if self._auto_on_signatures():  # rule v2: the signatures' own distances
            assert isinstance(cfg, FLTConfig)
            cut, z = signature_cut(signatures, cfg.distance, cfg.significance,
                                   cfg.min_silhouette, cfg.max_clusters)
            labels[good], score = cut.labels, cut.silhouette
        else:
            z = ward_linkage(feats[np.ix_(good, good)])
            if cfg.n_clusters is None and cfg.auto_clusters == "components":
                labels[good] = connected_groups(related[np.ix_(good, good)])
            else:
                cut = rows_cut(feats[np.ix_(good, good)], z, cfg.n_clusters,
                               cfg.max_clusters, "gap" if cfg.auto_clusters == "gap"
                               else "silhouette", cfg.min_silhouette, cfg.significance)
                labels[good], score = cut.labels, cut.silhouette
        labels = own_clusters(labels, np.setdiff1d(np.arange(n), good))
        n_groups = int(labels.max(initial=-1)) + 1
        rows = n if cfg.aggregation == "relatedness" else max(n_groups, 1)
        down, up = request.unit_cost()  # = what `Context.send` booked if nobody dropped out
        return replace(
            state, models=state.models[:1].repeat(rows, 1),  # the initial model: none trained
            labels=labels, adjacency=a, relatedness=related, linkage=z,
            points=points.reshape(-1, points.shape[-1]) if points.size else np.zeros((0, 2)),
            signature_clients=good, signatures=signatures, sizes=self.sizes,
            map_seed=ask.map_seed, encoder=ask.encoder,
            clustering_floats_down=down * len(request.clients),
            clustering_floats_up=up * len(reply.clients), n_clusters_found=n_groups,
            rejected_signatures=n - len(good), clustering_seconds=ask.seconds(),
            clustering_round=t, silhouette=score)

    def _clustering_extras(self, state: FLTState, extras: FLTExtras) -> FLTClusteringExtras:
        """`extras` plus the one-off clustering's matrices (history-sized: None for big
        federations, whose M² numbers per line stay in the npz only)."""
        cfg = self.config
        if len(state.labels) > HISTORY_MAX_CLIENTS:
            return FLTClusteringExtras(**extras.to_dict(), encoder=state.encoder,
                                       silhouette=state.silhouette)
        a = state.adjacency
        umap_used = isinstance(cfg, FLTConfig) and cfg.umap
        return FLTClusteringExtras(
            **extras.to_dict(),
            adjacency=np.round(np.where(np.isfinite(a), a, -1.0), 5).tolist(),
            linkage=np.round(state.linkage, 6).tolist(),
            relatedness=state.relatedness.astype(np.int8).tolist(),
            umap_points=np.round(state.points, 5).tolist() if umap_used else None,
            encoder=state.encoder, silhouette=state.silhouette)

    # ------------------------------------------------------------------ rounds (Alg. 3)
    def ask(self, state: FLTState, t: int, phase: str, ctx: Context) -> Ask[Any]:
        """Before the first training: every client's signature (Alg. 2, with the UMAP seed).
        Each round: the sampled clients train their own (Case I) or cluster's (Case II)
        model."""
        if phase == FIRST and not state.clustered:
            request, encoder = self._request(ctx, np.arange(ctx.n_clients))
            return SignatureAsk(request, SIGNATURES, map_seed=ctx.next_seed(), encoder=encoder)
        clients = ctx.sample_round(self.config)
        rows = clients if self.config.aggregation == "relatedness" else state.labels[clients]
        return Ask(TrainRequest(clients, state.models, rows, ctx.training, ctx.next_seed()),
                   TRAIN)

    def update(self, state: FLTState, t: int, ask: Ask[Any], reply: Any) -> Update[FLTState]:
        if ask.phase == SIGNATURES:
            assert isinstance(ask, SignatureAsk)
            done = self._clustered(state, t, ask, reply)
            return Update(done, then=TRAIN, warnings=lowered_cut(
                self.config.n_clusters, t, len(ask.request.clients),
                len(done.signature_clients), "a signature"))
        trained: TrainReply = reply
        if self.config.aggregation == "relatedness":  # Case I: every model ← Ω · snapshot
            snapshot = state.models.clone()
            rows = torch.from_numpy(np.asarray(trained.clients, dtype=np.int64))
            snapshot[rows.to(snapshot.device)] = trained.params
            models = relatedness_average(snapshot, relatedness_weights(state.relatedness,
                                                                       state.sizes))
        else:  # Case II: FedAvg inside each cluster (without participants: kept)
            models = average_members(state.models, trained.params,
                                     state.labels[trained.clients], trained.n_samples)
        state = replace(state, models=models)
        extras = FLTExtras(
            train_loss=mean_finite(trained.loss),
            clustering_floats_down=state.clustering_floats_down,
            clustering_floats_up=state.clustering_floats_up,
            n_clusters_found=state.n_clusters_found,
            rejected_signatures=state.rejected_signatures,
            clustering_seconds=state.clustering_seconds)
        if state.clustering_round == t:
            extras = self._clustering_extras(state, extras)
        return Update(state, extras)

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.state.labels.copy()

    def predictor(self) -> Predictor:
        st = self.state
        n = len(st.labels)
        if not st.clustered:
            return Predictor.single(st.models[:1], np.zeros(n, np.int64))
        if self.config.aggregation == "relatedness":
            return Predictor.single(st.models, np.arange(n))
        return Predictor.single(st.models, np.maximum(st.labels, 0))

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """The client's signature in the clustering's embedding, joined to the cluster by
        Ward's criterion on its relatedness row (module doc)."""
        cfg, st = self.config, self.state
        ids = np.asarray(clients, dtype=np.int64)
        if not st.clustered:  # before the one-off clustering: everybody has the start model
            return Placement.nowhere(ids, st.models[:1])
        reply = ctx.send(self._request(ctx, ids)[0])
        good = st.signature_clients
        train, new = self._map_new(st.signatures, np.array(reply.signatures, dtype=np.float64),
                                   st.map_seed)
        stored = st.points.reshape(train.shape)
        if not np.allclose(train, stored, atol=1e-6):
            ctx.warn(f"{self.label()}: the embedding fitted again differs from the "
                     "clustering's (UMAP not reproducible here); placing in the new fit")
        dist = cross_distances(new, train, cfg.distance)  # [answered, clustered]
        related = (dist < cfg.threshold).astype(np.float64) if cfg.threshold is not None \
            else dist
        feats = (st.relatedness if cfg.threshold is not None
                 else st.adjacency)[np.ix_(good, good)]
        row = related
        if self._auto_on_signatures():  # Ward's criterion on what the clustering read
            feats = signature_distances(st.signatures, cfg.distance)
            row = cross_distances(np.array(reply.signatures, dtype=np.float64), st.signatures,
                                  cfg.distance)
        best, cost = ward_nearest(feats, st.labels[good], row)
        clusters = answered(ids, reply.clients, best)
        models, rows = self._placed_models(ids, reply.clients, dist, related, clusters)
        costs = answered(ids, reply.clients, cost, np.nan)
        nearest = answered(ids, reply.clients, good[np.argmin(dist, axis=1)] if len(good)
                           else np.full(len(dist), -1, np.int64), -1)
        details = [{"ward_cost": [round(float(v), 5) for v in row],
                    "nearest_client": int(c)} for row, c in zip(costs, nearest, strict=True)]
        return Placement(ids, clusters, Predictor.single(models, rows), details)

    def _placed_models(self, ids: np.ndarray, who: np.ndarray, dist: np.ndarray,
                       related: np.ndarray, clusters: np.ndarray,
                       ) -> tuple[torch.Tensor, np.ndarray]:
        """The placed clients' models and each one's row: Case II its cluster's model, Case I
        the p-weighted mean over its related clients (module doc); row 0 (the initial model)
        if it did not answer or no client was clustered with a signature."""
        st = self.state
        if self.config.aggregation == "clusters":
            return st.models, np.maximum(clusters, 0)
        good = st.signature_clients
        sizes = np.asarray(st.sizes, dtype=np.float64)[good]
        own = np.zeros((len(who), len(good)))
        if self.config.threshold is not None:
            own = related.copy()
        for i in range(len(who)):
            if own[i].sum() == 0 and len(good):  # related to nobody: its nearest client
                own[i, np.argmin(dist[i])] = 1.0
        w = own * sizes[None, :]
        w = w / np.maximum(w.sum(1, keepdims=True), 1e-300)
        mine = torch.as_tensor(w, dtype=st.models.dtype) @ st.models[torch.from_numpy(good)]
        models = torch.cat([st.models[:1], mine])
        rows = answered(ids, who, np.where(own.sum(1) > 0, 1 + np.arange(len(who)), 0), 0)
        return models, rows

    def relatedness(self) -> dict[str, np.ndarray]:
        """A, Ã, the Ward linkage and the (UMAP) points of the one-off clustering."""
        return {k: np.array(getattr(self.state, k), copy=True) for k in ARRAYS}

    def save_artifacts(self, run_dir: Path, round_: int) -> list[Path]:
        """Write A, Ã, the linkage, points and labels to `run_dir/flt_relatedness.npz`."""
        if not self.state.clustered:
            return []
        arrays: dict[str, Any] = {"labels": self.state.labels, **self.relatedness()}
        path = Path(run_dir) / ARTIFACT
        data = io.BytesIO()  # whole or not at all: a full disk leaves no cut-off archive
        np.savez_compressed(data, **arrays)
        write_whole(path, data.getvalue())
        return [path]


class PCAKMHC(FLT):
    """PCA+kM+HC (FLT paper §4.3): client PCA + k-means, server HC, FedAvg per cluster."""

    name = "pca_km_hc"
    Config = PCAKMHCConfig

    def _request(self, ctx: Context,
                 clients: np.ndarray) -> tuple[EmbedRequest, dict[str, Any] | None]:
        cfg = self.config
        assert isinstance(cfg, PCAKMHCConfig)
        d = int(np.prod(ctx.factory.input_shape))
        # an empty tensor rather than None: serializers that ship tensors need no special case
        return EmbedRequest(clients, "pca", torch.zeros(0), d, k=cfg.k,
                            pca_components=cfg.pca_components,
                            kmeans_n_init=cfg.kmeans_n_init, seed=ctx.next_seed()), None


__all__ = ["FLT", "PCAKMHC", "FLTClusteringExtras", "FLTConfig", "FLTExtras", "FLTState",
           "PCAKMHCConfig", "rows_cut", "signature_cut", "signature_distances"]
