"""Server-side aggregation shared by the methods: weighted means, per-cluster averages,
cluster identities from reported losses, cluster sizes."""

from __future__ import annotations

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


__all__ = ["average_members", "choose_clusters", "cluster_sizes", "weighted_mean"]
