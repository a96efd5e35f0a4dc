"""Principal angles between client data subspaces and PACFL's proximity matrix (Vahidian et
al. 2023, §3; used by `clusterfl.algorithms.pacfl`).

Every client sends a basis U_i ∈ R^{e×r_i} of its data subspace (`clusterfl.engine.subspace`:
orthonormal for the whole data; with `per_label`, orthonormal bases of each label stacked,
which as a whole are not). The principal angles 0 ≤ θ_1 ≤ … ≤ θ_q, q = min(dim span U_i,
dim span U_j), are the arccos of the singular values of Q_iᵀQ_j for orthonormal bases Q of the
two spans (Björck & Golub; scipy's `subspace_angles`), and the smallest one is
cos θ_1 = max |uᵀw| / (‖u‖‖w‖) over u ∈ span U_i, w ∈ span U_j.

`proximity` builds the N×N matrix A the server clusters, in degrees, one of:

- `"smallest_angle"` (the paper, eq. 2 as we read it): A_ij = θ_1(U_i, U_j);
- `"angle_sum"` (the paper's other variant, eq. 3): A_ij = tr arccos(U_iᵀU_j) = Σ_a ∠(u_a^i,
  u_a^j), the angles between corresponding basis vectors (a = 1..q). Singular vectors have
  no sign, so we take the angle between the lines, arccos |u_aᵀw_a| ∈ [0°, 90°]; the formula
  read literally would depend on LAPACK's sign choice;
- `"min_pair"` (the authors' code, `calculating_adjacency`): A_ij = min_{a,b}
  arccos(clip(u_aᵀw_b, −1, 1)), the angle of the most aligned pair of basis vectors, signs
  as they come (an anti-aligned pair gives ~180°).

A client with an empty basis (no data direction) is farther from everybody than any two
clients with one: its row holds 180° · max(1, widest basis). The diagonal is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Proximity = Literal["smallest_angle", "angle_sum", "min_pair"]
PROXIMITIES: tuple[str, ...] = ("smallest_angle", "angle_sum", "min_pair")


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The principal angles (radians, ascending) between span(a) and span(b), `a` and `b`
    `[e, ·]` with any columns (scipy's `subspace_angles`, which orthonormalises both first:
    a per-label stack of bases is not orthonormal as a whole)."""
    from scipy.linalg import subspace_angles

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape[1] == 0 or b.shape[1] == 0:
        return np.zeros(0)
    return np.sort(subspace_angles(a, b))


def _pair(a: np.ndarray, b: np.ndarray, kind: Proximity) -> float:
    if kind == "smallest_angle":
        return float(np.degrees(principal_angles(a, b)[0]))
    if kind == "angle_sum":
        q = min(a.shape[1], b.shape[1])
        cos = np.abs(np.einsum("ea,ea->a", a[:, :q], b[:, :q]))
        return float(np.degrees(np.arccos(np.clip(cos, 0.0, 1.0))).sum())
    if kind == "min_pair":
        return float(np.degrees(np.arccos(np.clip(a.T @ b, -1.0, 1.0))).min())
    raise ValueError(f"unknown proximity {kind!r}; allowed: {', '.join(PROXIMITIES)}")


def proximity(bases: Sequence[np.ndarray], kind: Proximity = "smallest_angle",
              others: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """PACFL's proximity matrix in degrees (see the module docstring).

    `bases[i]` is client i's `[e, r_i]` orthonormal basis. Without `others`: the symmetric
    `[N, N]` matrix A with a zero diagonal. With `others` (newcomers' bases): the `[M, N]`
    block of their proximities to the N clients.
    """
    if kind not in PROXIMITIES:
        raise ValueError(f"unknown proximity {kind!r}; allowed: {', '.join(PROXIMITIES)}")
    rows = list(bases if others is None else others)
    cols = list(bases)
    widest = max([u.shape[1] for u in rows + cols] + [1])
    far = 180.0 * widest
    out = np.zeros((len(rows), len(cols)))
    for i, u in enumerate(rows):
        for j, w in enumerate(cols):
            if others is None and j <= i:
                continue
            out[i, j] = far if u.shape[1] == 0 or w.shape[1] == 0 else _pair(u, w, kind)
    if others is None:
        out = out + out.T
    return out


__all__ = ["PROXIMITIES", "Proximity", "principal_angles", "proximity"]
