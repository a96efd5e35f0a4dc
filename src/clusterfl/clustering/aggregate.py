"""Server-side aggregation shared by the methods: weighted means, per-cluster averages,
cluster identities from reported losses, cluster sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from clusterfl.protocol import pick_rows


def weighted_mean(params: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Σ w_i p_i / Σ w_i over the rows of `params`."""
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=params.dtype,
                        device=params.device)
    return torch.mv(params.t(), w / w.sum())  # one pass over [n, d], no [n, d] temporary


def average_members(
    models: torch.Tensor, params: torch.Tensor, groups: np.ndarray, weights: np.ndarray,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """New `[K, d]` models: each row the weighted mean of its members (kept if none).

    With a `shared` mask, those coordinates of every model become the weighted mean over all
    rows (weight sharing).
    """
    out = models.clone()
    if len(params) == 0:
        return out
    for k in np.unique(groups):
        sel = groups == k
        out[int(k)] = weighted_mean(params[torch.from_numpy(sel).to(params.device)],
                                    weights[sel])
    if shared is not None and bool(shared.any()):
        shared = shared.to(params.device)
        out[:, shared] = weighted_mean(params[:, shared], weights)
    return out


def step_clusters(
    models: torch.Tensor, rows: torch.Tensor, groups: np.ndarray, present: np.ndarray,
    step: float, how: Literal["mean", "sum"] = "mean", shared: torch.Tensor | None = None,
    table: Callable[[tuple[int, int], torch.dtype], torch.Tensor] | None = None,
) -> torch.Tensor:
    """New `[K, d]` models θ_k + step · agg_{c ∈ S_k} rows[c], over the clients of cluster k
    (`groups[c] == k`) that answered (`present`; kept if none), agg the unweighted mean or
    the sum of the rows (CFL-GP's model step, Alg. 1 line 4 / Alg. 4 line 5). With `shared`
    (indices of the coordinates common to the K models), those coordinates of every model
    become θ_1's + step · agg over every row that answered.

    Each cluster's rows are copied into one table made once for the largest cluster (by
    `table(shape, dtype)`, default `torch.empty`; on the CPU only): copies of different sizes
    leave holes in the heap that the next cannot reuse (at 10,000 MLP clients in 4 clusters,
    two ~250 MB copies were resident at once instead of one).
    """
    def agg(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0) if how == "sum" else x.mean(0)

    out = models.clone()
    base = None if shared is None else out[0, shared].clone()
    members = [np.flatnonzero((groups == k) & present) for k in range(len(models))]
    shape = (max(map(len, members)), rows.shape[1])
    held = (torch.empty(shape, dtype=rows.dtype, device=rows.device)
            if table is None or rows.device.type != "cpu" else table(shape, rows.dtype))
    for k, ids in enumerate(members):
        if len(ids):
            picked = torch.index_select(rows, 0, torch.from_numpy(ids).to(rows.device),
                                        out=held[: len(ids)])
            out[k] += step * agg(picked)
    del held
    if shared is not None and base is not None and present.any():
        everyone = torch.from_numpy(np.flatnonzero(present)).to(rows.device)
        out[:, shared] = base + step * agg(rows[:, shared][everyone])  # [n, |shared|] only
    return out


def choose_clusters(loss: np.ndarray, accuracy: np.ndarray | None = None,
                    by: Literal["loss", "accuracy"] = "loss") -> np.ndarray:
    """Cluster estimate per client from its `[n, K]` losses: argmin loss, or argmax accuracy
    with ties to the lower loss.

    Non-finite losses count as +inf (a model that diverged is never chosen over another).
    """
    return pick_rows(loss, accuracy, by)  # the rule a client applies to a `Pick` step


def cluster_sizes(assignment: np.ndarray, k: int) -> list[int]:
    """Number of clients currently assigned to each of the k clusters."""
    a = np.asarray(assignment)
    return np.bincount(a[a >= 0], minlength=k)[:k].astype(int).tolist()


__all__ = ["average_members", "choose_clusters", "cluster_sizes", "step_clusters",
           "weighted_mean"]
