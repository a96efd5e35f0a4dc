"""Spectral clustering of client feature vectors with label matching (CFL-GP, Kim et al. 2024).

The server holds one feature vector per client (CFL-GP's gradient profile, the columns of
G ∈ R^{Kd×C}). Algorithm 3 of the paper (SPECTRALCLUSTERING) clusters them in three steps:

1. **Projection** (Alg. 3 line 1, eq. 12): Û = the K leading left singular vectors of G; every
   client is represented by Ûᵀ g_c ∈ R^K. Writing G = U Σ Vᵀ, Ûᵀ G = Σ_K V_Kᵀ, so the
   projection only needs the right singular vectors, i.e. the eigenvectors of the C×C Gram
   matrix GᵀG. With C ≪ Kd this is exact and costs C²·Kd (no dense SVD of the Kd×C matrix);
   for very many clients a randomized truncated SVD (scikit-learn's `randomized_svd`) is used.
2. **K-means** (Alg. 3 line 2, eq. 13) on the projected features, k-means++ seeding.
3. **Cluster–model index matching** (Alg. 3 lines 3–4, App. B.2.2): the bijection ψ from the
   new cluster ids to model ids that keeps the most clients on their previous model — a
   maximum-weight assignment on the K×K overlap matrix, solved with the Hungarian method
   (`scipy.optimize.linear_sum_assignment`) instead of enumerating the K! permutations.

Appendix G (unknown number of clusters): the singular values of G are computed, the largest
gap between consecutive ones picks s, the clients are projected on the s leading directions,
and the number of clusters is chosen on those s-dimensional features by the silhouette score
or by the gap statistic (Tibshirani, Walther & Hastie 2001). The paper leaves open the
criterion ("the Elbow method or Gap statistic") and the range of k; here k ∈ [2, k_max] for
the silhouette (it is undefined for one cluster) and k ∈ [1, k_max] for the gap statistic.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import sklearn
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import silhouette_score
from sklearn.utils.extmath import randomized_svd
from threadpoolctl import threadpool_limits

from clusterfl.clustering.cosine import SHUFFLE_DRAWS, SHUFFLE_MIN, structure_pvalue

SvdMethod = Literal["auto", "gram", "randomized"]
KCriterion = Literal["silhouette", "gap"]

GRAM_MAX_CLIENTS = 4096
"""`svd="auto"` uses the exact Gram route up to this many clients, the randomized SVD above."""

_CHUNK = 1 << 16  # columns per float64 block when accumulating the Gram matrix
SILHOUETTE_MIB = 64  # MiB of pairwise distances the silhouette holds at a time


@dataclass(frozen=True)
class Projection:
    """Clients in the leading singular directions of the profile matrix.

    `features[c, i]` = σ_i v_i[c] = û_iᵀ g_c (Alg. 3 line 1), columns in decreasing order of
    σ_i; `singular_values` holds every value the method computed (all C for "gram").
    """

    features: np.ndarray
    singular_values: np.ndarray


@dataclass(frozen=True)
class SpectralResult:
    """One SPECTRALCLUSTERING call: the matched assignment and what it was computed from."""

    assignment: np.ndarray
    raw_labels: np.ndarray
    projection: Projection


def _as_rows(rows: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Client-major `[C, D]` tensor (the transpose of the paper's G) without copying."""
    t = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.asarray(rows))
    if t.dim() != 2:
        raise ValueError(f"expected a [clients, features] matrix, got shape {tuple(t.shape)}")
    return t.reshape(t.shape[0], -1)


def gram_matrix(rows: torch.Tensor | np.ndarray, chunk: int = _CHUNK,
                device: torch.device | None = None) -> np.ndarray:
    """GᵀG (C×C, float64) for client-major rows `[C, D]`, accumulated in column blocks so a
    float32 profile never has to be copied whole into float64. With `device` (a GPU) the
    products run there, each column block moved once; only the C×C result comes back."""
    x = _as_rows(rows)
    c, d = x.shape
    where = x.device if device is None else device
    out = torch.zeros(c, c, dtype=torch.float64, device=where)
    for start in range(0, d, chunk):
        block = x[:, start : start + chunk].to(where, torch.float64)
        out += block @ block.T
    return out.cpu().numpy()


def project_gram(gram: np.ndarray, n_components: int) -> Projection:
    """The projection of `project` from a precomputed Gram matrix GᵀG (C×C): eigenvectors
    v_i and σ_i = √λ_i give the features σ_i v_i[c] exactly."""
    evals, evecs = np.linalg.eigh(np.asarray(gram, dtype=np.float64))
    order = np.argsort(evals)[::-1]
    sv = np.sqrt(np.clip(evals[order], 0.0, None))
    n = max(1, min(int(n_components), len(sv)))
    return Projection(evecs[:, order[:n]] * sv[:n], sv)


def project(
    rows: torch.Tensor | np.ndarray, n_components: int, method: SvdMethod = "auto",
    seed: int = 0,
) -> Projection:
    """Project every client on the `n_components` leading left singular vectors of G.

    `rows` is G transposed (one row per client). "gram" diagonalises GᵀG exactly; "randomized"
    runs a truncated randomized SVD and returns only `n_components` singular values.
    """
    x = _as_rows(rows)
    c, d = x.shape
    n = max(1, min(int(n_components), c, d))
    if method == "auto":
        method = "gram" if c <= GRAM_MAX_CLIENTS else "randomized"
    if method == "gram":
        proj = project_gram(gram_matrix(x), n)
        return Projection(proj.features, proj.singular_values[: min(c, d)])
    if method != "randomized":
        raise ValueError(f"unknown method {method!r}; use 'auto', 'gram' or 'randomized'")
    u, s, _ = randomized_svd(x.numpy(), n_components=n, random_state=int(seed))
    return Projection(u.astype(np.float64) * s, s.astype(np.float64))


def kmeans_labels(features: np.ndarray, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """K-means with k-means++ seeding (best of `n_init` runs); labels in [0, k)."""
    feats = np.asarray(features, dtype=np.float64)
    if k <= 1 or len(feats) <= 1:
        return np.zeros(len(feats), dtype=np.int64)
    k = min(k, len(feats))
    with warnings.catch_warnings(), threadpool_limits(limits=1):  # tiny problems: no threads
        warnings.simplefilter("ignore", ConvergenceWarning)  # duplicate points: fewer clusters
        km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=int(seed))
        return km.fit_predict(feats).astype(np.int64)


def kmeans_inertia(features: np.ndarray, k: int, seed: int, n_init: int = 10) -> float:
    """Within-cluster sum of squares of the best k-means solution (W_k of the gap statistic)."""
    feats = np.asarray(features, dtype=np.float64)
    if k <= 1:
        return float(((feats - feats.mean(0)) ** 2).sum())
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        km = KMeans(n_clusters=min(k, len(feats)), init="k-means++", n_init=n_init,
                    random_state=int(seed)).fit(feats)
    return float(km.inertia_)


def match_labels(labels: np.ndarray, previous: np.ndarray | None, k: int) -> np.ndarray:
    """Relabel `labels` by the bijection ψ: [k] → [k] that maximises the number of clients
    with ψ(labels[c]) == previous[c] (Alg. 3 line 3), found by the Hungarian method."""
    labels = np.asarray(labels, dtype=np.int64)
    if previous is None:
        return labels.copy()
    previous = np.asarray(previous, dtype=np.int64)
    if previous.shape != labels.shape:
        raise ValueError("labels and previous assignment differ in length")
    overlap = np.zeros((k, k), dtype=np.int64)
    valid = (previous >= 0) & (previous < k)
    np.add.at(overlap, (labels[valid], previous[valid]), 1)
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    psi = np.empty(k, dtype=np.int64)
    psi[rows] = cols
    return psi[labels]


def spectral_clustering(
    rows: torch.Tensor | np.ndarray, k: int, previous: np.ndarray | None, seed: int,
    method: SvdMethod = "auto", n_init: int = 10, n_components: int | None = None,
    gram: np.ndarray | None = None,
) -> SpectralResult:
    """Algorithm 3: K-dim projection, k-means, then the label matching to `previous`.

    `n_components` (≥ k) asks the projection for more directions than clustering uses (they
    serve the Appendix-G estimate); clustering always reads the first k. A precomputed Gram
    matrix `gram` = GᵀG (e.g. kept up to date block by block) replaces the one `rows` would
    give whenever the Gram route is taken.
    """
    n = max(k, n_components or k)
    x = _as_rows(rows)
    use_gram = method == "gram" or (method == "auto" and x.shape[0] <= GRAM_MAX_CLIENTS)
    if gram is not None and use_gram:
        full = project_gram(gram, min(n, x.shape[1]))
        proj = Projection(full.features, full.singular_values[: min(x.shape)])
    else:
        proj = project(x, n, method, seed)
    raw = kmeans_labels(proj.features[:, :k], k, seed, n_init)
    return SpectralResult(match_labels(raw, previous, k), raw, proj)


def largest_gap(singular_values: np.ndarray, max_s: int | None = None) -> int:
    """s such that σ_s − σ_{s+1} is the largest gap between consecutive singular values
    (Appendix G step 2); 1-based, at most `max_s`."""
    sv = np.sort(np.asarray(singular_values, dtype=np.float64))[::-1]
    if len(sv) < 2:
        return 1
    gaps = sv[:-1] - sv[1:]
    if max_s is not None:
        gaps = gaps[: max(1, int(max_s))]
    return int(np.argmax(gaps)) + 1


def gap_ranking(singular_values: np.ndarray, top: int = 3) -> list[int]:
    """The positions s (1-based) of the `top` largest gaps σ_s − σ_{s+1}, largest first."""
    sv = np.sort(np.asarray(singular_values, dtype=np.float64))[::-1]
    gaps = sv[:-1] - sv[1:]
    return [int(i) + 1 for i in np.argsort(-gaps, kind="stable")[:top]]


def silhouette_scores(features: np.ndarray, k_max: int, seed: int,
                      n_init: int = 10) -> dict[int, float]:
    """Mean silhouette of the k-means solution for every k in [2, min(k_max, C−1)]."""
    feats = np.asarray(features, dtype=np.float64)
    scores: dict[int, float] = {}
    for k in range(2, min(int(k_max), len(feats) - 1) + 1):
        labels = kmeans_labels(feats, k, seed, n_init)
        distinct = len(np.unique(labels))
        if not 2 <= distinct < len(feats):
            scores[k] = -1.0
            continue
        # pairwise distances a block of rows at a time (the same values: each row's sums
        # are its own), not the C×C matrix at once (0.8 GB at 10,000 clients)
        with sklearn.config_context(working_memory=SILHOUETTE_MIB):
            scores[k] = float(silhouette_score(feats, labels))
    return scores


def gap_statistic(
    features: np.ndarray, k_max: int, seed: int, n_refs: int = 10, n_init: int = 10,
) -> tuple[int, dict[int, float], dict[int, float]]:
    """Tibshirani et al.'s gap statistic for k in [1, k_max]: Gap(k) = E*[log W*_k] − log W_k,
    references uniform in the data's bounding box; returns (chosen k, gaps, s_k), the chosen k
    being the smallest with Gap(k) ≥ Gap(k+1) − s_{k+1} (k_max if none)."""
    feats = np.asarray(features, dtype=np.float64)
    k_hi = max(1, min(int(k_max), len(feats)))
    rng = np.random.default_rng(int(seed))
    lo, hi = feats.min(0), feats.max(0)
    refs = [rng.uniform(lo, hi, size=feats.shape) for _ in range(int(n_refs))]
    tiny = 1e-300
    gaps: dict[int, float] = {}
    sks: dict[int, float] = {}
    for k in range(1, k_hi + 1):
        log_w = np.log(max(kmeans_inertia(feats, k, seed, n_init), tiny))
        ref_logs = np.log([max(kmeans_inertia(r, k, seed, n_init), tiny) for r in refs])
        gaps[k] = float(ref_logs.mean() - log_w)
        sks[k] = float(ref_logs.std() * np.sqrt(1.0 + 1.0 / len(refs)))
    for k in range(1, k_hi):
        if gaps[k] >= gaps[k + 1] - sks[k + 1]:
            return k, gaps, sks
    return k_hi, gaps, sks


def gram_cosines(gram: np.ndarray, centred: bool = False) -> np.ndarray:
    """The cosine similarities of the rows whose Gram matrix is `gram` (a zero row: 0 with
    every other, 1 with itself); `centred`: of the rows minus their mean (H G H, H = I − 11ᵀ/n),
    so that a direction all rows share does not make every pair alike."""
    g = np.asarray(gram, dtype=np.float64)
    if centred:
        g = g - g.mean(0, keepdims=True) - g.mean(1, keepdims=True) + g.mean()
    norms = np.sqrt(np.clip(np.diag(g), 0.0, None))
    safe = np.where(norms > 0, norms, 1.0)
    cos = np.clip(g / safe[:, None] / safe[None, :], -1.0, 1.0)
    cos[norms == 0] = 0.0
    cos[:, norms == 0] = 0.0
    np.fill_diagonal(cos, 1.0)
    return cos


def structure_p(similarity: np.ndarray, seed: int) -> float | None:
    """Whether clients show groups at all: the shuffle test of CFL's split rule and FL+HC's
    cut (`structure_pvalue`, `SHUFFLE_DRAWS` shuffles seeded by `seed`) on their cosine
    `similarity`; None below `SHUFFLE_MIN` clients (too few cosines to shuffle)."""
    if len(similarity) < SHUFFLE_MIN:
        return None
    return structure_pvalue(np.asarray(similarity, dtype=np.float64), SHUFFLE_DRAWS,
                            np.random.default_rng(int(seed)))


def estimate_n_clusters(
    features: np.ndarray, k_max: int, seed: int, criterion: KCriterion = "silhouette",
    n_init: int = 10, min_silhouette: float = -1.0,
) -> tuple[int, dict[int, float]]:
    """Number of clusters of the (s-dim projected) client features, Appendix G step 3.

    Returns (k, scores): silhouette per k (argmax chosen; 1 when the best is below
    `min_silhouette`, which the paper's argmax never gives) or the gap statistic per k.
    """
    feats = np.asarray(features, dtype=np.float64)
    if criterion == "gap":
        k, gaps, _ = gap_statistic(feats, k_max, seed, n_init=n_init)
        return k, gaps
    scores = silhouette_scores(feats, k_max, seed, n_init)
    if not scores:
        return 1, scores
    best = max(scores, key=lambda k: (scores[k], -k))
    return (best if scores[best] >= min_silhouette else 1), scores


__all__ = [
    "GRAM_MAX_CLIENTS", "KCriterion", "Projection", "SpectralResult", "SvdMethod",
    "estimate_n_clusters", "gap_ranking", "gap_statistic", "gram_cosines", "gram_matrix",
    "kmeans_inertia",
    "kmeans_labels", "largest_gap", "match_labels", "project", "project_gram",
    "silhouette_scores", "spectral_clustering", "structure_p",
]
