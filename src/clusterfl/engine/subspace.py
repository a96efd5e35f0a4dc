"""Client-side data subspaces of PACFL (Vahidian et al. 2023, §3 "client signature").

A client compresses its training inputs into an orthonormal basis of their leading left
singular vectors: D = [x_1 … x_n] ∈ R^{e×n} (flattened inputs as columns), D ≈ U_p Σ_p V_pᵀ,
and U_p ∈ R^{e×p} is what it sends (a `SubspaceRequest`). Only the basis leaves the client.

What the paper says and what we chose:
- The paper: one truncated SVD of the client's whole data matrix, p small. The authors' code
  (`per_label`): one SVD per label the client holds, p vectors each, stacked side by side.
  Both are here; the request says which.
- Data as the client holds it: no centring and no scaling (the authors' code feeds raw uint8
  pixels; ours are the federation's inputs after its transforms, so the first singular
  vector is close to the client's mean input in both).
- The truncated SVD is exact, not randomized: the top p eigenpairs of the smaller Gram matrix
  (DDᵀ, e × e, or DᵀD) by LAPACK's symmetric eigensolver (`scipy.linalg.eigh`), ~10× faster
  than a thin SVD of a 784 × 3000 client here and the same span (tested against numpy's
  SVD). Singular vectors with σ ≤ rtol · σ_max (1e-6) are dropped (the data spans fewer
  than p directions). A singular vector has no sign; we flip each so that the sum of its
  entries is ≥ 0 (deterministic; with non-negative pixels the leading one then points along
  the client's mean image). Only the code's `min_pair` proximity reads signs.
- The basis is returned in float64 and zero-padded to the request's fixed width.

Everything is a pure function of (data, request): the same inputs give the same basis.
"""

from __future__ import annotations

import numpy as np
import torch

from clusterfl.protocol import SubspaceRequest


def leading_left_singular_vectors(data: np.ndarray, p: int, rtol: float = 1e-6) -> np.ndarray:
    """The `[e, r]` leading left singular vectors of `data` `[e, n]`, r ≤ p (σ > rtol·σ_max).

    Columns are ordered by decreasing singular value; r < p when the data spans fewer
    directions (fewer samples than p, repeated samples, zeros). Computed from the smaller
    Gram matrix (DDᵀ or DᵀD) with LAPACK's symmetric eigensolver for the top p pairs only:
    σ_a² are its eigenvalues, u_a its eigenvectors (or D v_a / σ_a).
    """
    from scipy.linalg import eigh

    d = np.asarray(data, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"data must be a 2-d [e, n] matrix, got shape {d.shape}")
    e, n = d.shape
    m = min(e, n)
    if m == 0 or p <= 0:
        return np.zeros((e, 0))
    wide = n >= e
    gram = d @ d.T if wide else d.T @ d
    q = min(p, m)
    lam, vec = eigh(gram, subset_by_index=[m - q, m - 1], check_finite=True)
    lam, vec = lam[::-1], vec[:, ::-1]  # decreasing
    if lam[0] <= 0.0:
        return np.zeros((e, 0))
    keep = int(np.sum(lam > (rtol**2) * lam[0]))
    lam, vec = lam[:keep], vec[:, :keep]
    u = vec if wide else (d @ vec) / np.sqrt(lam)
    u = u / np.linalg.norm(u, axis=0)  # unit columns (they are, up to rounding)
    u = u * np.where(u.sum(axis=0) < 0.0, -1.0, 1.0)  # the sign convention (module doc)
    return np.ascontiguousarray(u)


def client_subspace(x: torch.Tensor, y: torch.Tensor | None,
                    request: SubspaceRequest) -> tuple[np.ndarray, int]:
    """One client's `([e, columns], rank)` basis for `request` (see `SubspaceRequest`).

    Args:
        x: the client's training inputs `[n, ...]` (flattened to e = request.input_dim).
        y: its labels `[n]` (read only with `request.per_label`).
        request: what to compute.
    """
    flat = x.reshape(len(x), -1).to(torch.float64).numpy()
    e, cols = int(request.input_dim), request.columns()
    if flat.shape[1] != e:
        raise ValueError(f"the request expects inputs of {e} values, the client holds "
                         f"{flat.shape[1]}")
    if request.per_label:
        if y is None or y.is_floating_point():
            raise ValueError("a per-label subspace needs class labels (a classification task)")
        labels = y.numpy().astype(np.int64)
        held = np.unique(labels)
        if len(held) and (held.min() < 0 or held.max() >= request.n_labels):
            raise ValueError(f"labels {held.tolist()} outside 0..{request.n_labels - 1}")
        parts = [leading_left_singular_vectors(flat[labels == c].T, request.p, request.rtol)
                 for c in held]
        basis = np.concatenate(parts, axis=1) if parts else np.zeros((e, 0))
    else:
        basis = leading_left_singular_vectors(flat.T, request.p, request.rtol)
    out = np.zeros((e, cols))
    out[:, : basis.shape[1]] = basis
    return out, int(basis.shape[1])


__all__ = ["client_subspace", "leading_left_singular_vectors"]
