"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020, Alg. 1).

The server keeps K cluster models θ_1..θ_K. Each round a fraction of the clients is sampled;
each receives all K models (a `LossRequest`, whose cost is the K models sent down) and
estimates its cluster identity ĵ = argmin_j F_i(θ_j), the least loss on its training data.
Then, per Alg. 1:

- model averaging (option II, the default): the client trains θ_ĵ locally and the server sets
  each θ_j to the sample-weighted mean of the returned models of the clients that chose j;
- gradient averaging (option I): the client returns ∇F_i(θ_ĵ) and the server steps
  θ_j ← θ_j − γ · (sample-weighted mean of the gradients of the clients that chose j).

Models nobody chose this round are kept. The method also serves as the IFCA baseline of CAM
(Ma et al. 2023), CFL-GP (Kim et al. 2024; gradient averaging on one minibatch) and FLT
(Jamali-Rad et al. 2022; FedAvg initialisation).

Options and the choices the paper leaves open:
- `weight_sharing`: every layer but the last is shared by all clusters (IFCA §5); the shared
  part is averaged over all participants, the last layer per cluster. The shared part is then
  sent once per client, so the downlink cost books it once (d_shared + K · d_last).
- `assign_by = "accuracy"`: argmax of training accuracy, as some published code does (ties are
  broken by the lower loss). The paper's criterion is the loss.
- `warmup_rounds`: β rounds of FedAvg on one model first (the FEMNIST recipe IFCA and FLT
  use); afterwards every cluster model takes the warm model's parameters except its last
  layer, which keeps its own independent initialisation so the K models differ.
- Initialisation: K independent PyTorch default initialisations (seeds seed..seed+K−1).
- Weights: averages are weighted by client sample counts (Alg. 1 averages uniformly; the two
  agree when clients hold equal amounts of data, as in IFCA's experiments).
- Gradient step: the paper writes γ/m Σ_{i∈S_j} g_i with m the number of all machines; we use
  the mean over the cluster's clients with γ = `server_lr` (default: the [train] lr), which is
  what CFL-GP's experiments and code do.
- Clients not sampled keep their last cluster; a client never sampled has cluster -1 and is
  served by model 0 in evaluation.
- Replies with NaN/Inf parameters or gradients are left out of every average (counted in the
  round's `rejected` extra).
- Clients absent from a reply (dropped out or rejected by `clusterfl.robust`) keep their
  cluster and are left out of that round's averages.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context, weighted_mean
from clusterfl.models import ParamLayout
from clusterfl.protocol import GradientRequest, LossReply, LossRequest, Predictor, TrainRequest
from clusterfl.robust.replies import answered, positions


class IFCAConfig(AlgorithmConfig):
    """Settings of IFCA (`[algorithm] name = "ifca"`)."""

    name: Literal["ifca"] = "ifca"
    n_clusters: int = Field(5, ge=1, description="K, the number of cluster models")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="clients sampled per round")
    averaging: Literal["model", "gradient"] = Field(
        "model", description="Alg. 1 option II (local training, model averaging) or option I "
        "(one gradient per client, gradient averaging)")
    assign_by: Literal["loss", "accuracy"] = Field(
        "loss", description="cluster estimate: least training loss (paper) or highest "
        "training accuracy (some published code)")
    weight_sharing: bool = Field(
        False, description="share every layer but the last among all clusters")
    warmup_rounds: int = Field(
        0, ge=0, description="rounds of FedAvg on one model before clustering starts")
    gradient_batch_size: int | None = Field(
        None, ge=1, description="gradient averaging: minibatch per client (None: all its data)")
    server_lr: float | None = Field(
        None, gt=0.0, description="gradient averaging step γ (None: the [train] lr)")


# ----------------------------------------------------------------------------- shared helpers


def book(ctx: Context, down: float = 0.0, up: float = 0.0) -> None:
    """Add communication the protocol requests cannot express (or remove double counts)."""
    ctx.floats_down += float(down)
    ctx.floats_up += float(up)


def last_layer_mask(layout: ParamLayout) -> torch.Tensor:
    """Boolean `[d]` mask of the last layer: the parameters of the module owning the last one.

    E.g. `classifier.4.weight` and `classifier.4.bias` for LeNet, `layers.1.*` for an MLP.
    """
    last = layout.entries[-1].name
    owner = last.rsplit(".", 1)[0] + "." if "." in last else last
    mask = torch.zeros(layout.size, dtype=torch.bool)
    for e in layout.entries:
        if e.name == last or e.name.startswith(owner):
            mask[e.start : e.stop] = True
    return mask


def finite_rows(params: torch.Tensor) -> np.ndarray:
    """Boolean mask of the rows without NaN/Inf (replies that may be averaged in)."""
    return torch.isfinite(params).all(dim=1).numpy()


def choose_clusters(reply: LossReply, by: Literal["loss", "accuracy"] = "loss") -> np.ndarray:
    """Cluster estimate per client: argmin loss, or argmax accuracy with ties to lower loss.

    Non-finite losses count as +inf (a model that diverged is never chosen over another).
    """
    loss = np.where(np.isfinite(reply.loss), reply.loss, np.inf)
    if by == "loss":
        return np.argmin(loss, axis=1).astype(np.int64)
    acc = np.nan_to_num(reply.accuracy, nan=-1.0)
    best = acc.max(axis=1, keepdims=True)
    return np.argmin(np.where(acc == best, loss, np.inf), axis=1).astype(np.int64)


def cluster_sizes(assignment: np.ndarray, k: int) -> list[int]:
    """Number of clients currently assigned to each of the k clusters."""
    a = np.asarray(assignment)
    return np.bincount(a[a >= 0], minlength=k)[:k].astype(int).tolist()


def average_members(
    models: torch.Tensor, params: torch.Tensor, groups: np.ndarray, weights: np.ndarray,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """New `[K, d]` models: each row the weighted mean of its members (kept if none).

    With a `shared` mask, those coordinates of every model become the weighted mean over all
    rows (weight sharing). Callers drop non-finite rows first.
    """
    out = models.clone()
    if len(params) == 0:
        return out
    for k in np.unique(groups):
        sel = groups == k
        out[int(k)] = weighted_mean(params[torch.from_numpy(sel)], weights[sel])
    if shared is not None and bool(shared.any()):
        out[:, shared] = weighted_mean(params[:, shared], weights)
    return out


# ----------------------------------------------------------------------------- IFCA


class IFCA(Algorithm):
    """IFCA (Ghosh et al. 2020): K models, least-loss cluster identity, per-cluster averaging."""

    name = "ifca"
    Config = IFCAConfig
    config: IFCAConfig

    def setup(self, ctx: Context) -> None:
        cfg = self.config
        self.models = ctx.factory.init_many(cfg.n_clusters, ctx.seed)
        self.head = last_layer_mask(ctx.factory.layout)
        self.shared = ~self.head if cfg.weight_sharing else None
        if self.shared is not None:
            self.models[:, self.shared] = self.models[0, self.shared]
        self.assign = np.full(ctx.n_clients, -1, dtype=np.int64)
        self.warm: torch.Tensor | None = (
            self.models[0].clone() if cfg.warmup_rounds > 0 else None
        )

    # ------------------------------------------------------------------ rounds
    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        if self.warm is not None and t <= self.config.warmup_rounds:
            return self._warmup_round(ctx, t)
        cfg = self.config
        clients = ctx.sample(cfg.fraction)
        reply = ctx.send(LossRequest(clients, self.models))
        clients = answered(reply, clients)  # dropped clients are absent from every reply
        if self.shared is not None:  # shared layers travel once, not K times
            book(ctx, down=-len(clients) * (cfg.n_clusters - 1) * int(self.shared.sum()))
        chosen = choose_clusters(reply, cfg.assign_by)
        self.assign[clients] = chosen
        if cfg.averaging == "model":
            loss, rejected = self._model_step(ctx, clients, chosen)
        else:
            loss, rejected = self._gradient_step(ctx, clients, chosen)
        return {
            "train_loss": loss,
            "assign_loss": mean_finite(reply.loss[np.arange(len(clients)), chosen]),
            "cluster_sizes": cluster_sizes(self.assign, cfg.n_clusters),
            "rejected": rejected,
            "warmup": 0,
        }

    def _warmup_round(self, ctx: Context, t: int) -> dict[str, Any]:
        """FedAvg on the warm model; on the last warm-up round, seed the K cluster models."""
        assert self.warm is not None
        clients = ctx.sample(self.config.fraction)
        reply = ctx.send(TrainRequest(clients, self.warm[None], np.zeros(len(clients), np.int64),
                                      ctx.training, ctx.next_seed()))
        ok = finite_rows(reply.params)
        if ok.any():
            self.warm = weighted_mean(reply.params[torch.from_numpy(ok)], reply.n_samples[ok])
        if t == self.config.warmup_rounds:
            body = ~self.head
            self.models[:, body] = self.warm[body]
            self.warm = None
        return {"train_loss": mean_finite(reply.loss), "assign_loss": None,
                "cluster_sizes": cluster_sizes(self.assign, self.config.n_clusters),
                "rejected": int((~ok).sum()), "warmup": 1}

    def _model_step(self, ctx: Context, clients: np.ndarray,
                    chosen: np.ndarray) -> tuple[float, int]:
        """Option II: local training from θ_ĵ, per-cluster weighted model averaging."""
        reply = ctx.send(TrainRequest(clients, self.models, chosen, ctx.training,
                                      ctx.next_seed(), count_cost=False))
        chosen = chosen[positions(answered(reply, clients), clients)]
        book(ctx, up=len(chosen) * self.models.shape[1])  # the models were sent with the loss
        ok = finite_rows(reply.params)
        keep = torch.from_numpy(ok)
        self.models = average_members(self.models, reply.params[keep], chosen[ok],
                                      reply.n_samples[ok], self.shared)
        return mean_finite(reply.loss), int((~ok).sum())

    def _gradient_step(self, ctx: Context, clients: np.ndarray,
                       chosen: np.ndarray) -> tuple[float, int]:
        """Option I: one gradient per client at θ_ĵ; θ_j ← θ_j − γ · mean gradient of C_j."""
        cfg = self.config
        reply = ctx.send(GradientRequest(clients, self.models, chosen, cfg.gradient_batch_size,
                                         ctx.next_seed()))
        book(ctx, down=-len(clients) * self.models.shape[1])  # already sent with the loss
        chosen = chosen[positions(answered(reply, clients), clients)]
        ok = finite_rows(reply.grads)
        keep = torch.from_numpy(ok)
        zero = torch.zeros_like(self.models)
        mean_grads = average_members(zero, reply.grads[keep], chosen[ok], reply.n_samples[ok],
                                     self.shared)
        lr = cfg.server_lr if cfg.server_lr is not None else ctx.training.lr
        self.models = self.models - lr * mean_grads
        return mean_finite(reply.loss), int((~ok).sum())

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return self.assign.copy()

    def predictor(self) -> Predictor:
        if self.warm is not None:
            return Predictor.single(self.warm[None], np.zeros(len(self.assign), np.int64))
        return Predictor.single(self.models, np.maximum(self.assign, 0))

    def state_dict(self) -> dict[str, Any]:
        return {
            "models": self.models.clone(), "assign": self.assign.copy(),
            "warm": None if self.warm is None else self.warm.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = state["models"].clone()
        self.assign = np.asarray(state["assign"], dtype=np.int64).copy()
        self.warm = None if state["warm"] is None else state["warm"].clone()


def mean_finite(values: np.ndarray) -> float | None:
    """Mean of the finite entries (None if there is none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None


__all__ = [
    "IFCA", "IFCAConfig", "average_members", "book", "choose_clusters", "cluster_sizes",
    "finite_rows", "last_layer_mask", "mean_finite",
]
