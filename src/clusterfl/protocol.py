"""The requests a server may send to clients, and the replies (DESIGN.md §1, floor 4).

Algorithms never touch client data: they build one of these requests for a set of clients
and hand it to a backend. Every request knows its communication cost in floats, so the
history can report what a method costs on the wire whatever backend runs it.

Models travel as flat vectors. A request carries a stack `models: [K, d]` and, per client,
which row(s) that client uses, so K distinct models go to many clients without copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from clusterfl.errors import ClusterFLError

Combine = Literal["single", "sum_logits", "mean_probs"]
Split = Literal["train", "test"]


@dataclass(frozen=True)
class LocalTraining:
    """Client-side optimisation settings (identical semantics to torch.optim.SGD / Adam).

    Exactly one of `epochs` / `steps` is used: `steps` > 0 means that many minibatch steps,
    otherwise `epochs` passes over the client's data (the last batch of an epoch may be short).
    `mu` adds the proximal term mu/2 ||w - w_start||² (FedProx; FeSEM's pull to its center).
    """

    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 32
    epochs: int = 1
    steps: int = 0
    mu: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


@dataclass(frozen=True)
class Predictor:
    """How each client predicts: `members[i]` are the rows of `models` client i combines.

    - "single": one model per client (`members` is `[n, 1]`).
    - "sum_logits": logits of the members are added (CAM: global + cluster model).
    - "mean_probs": softmax outputs are averaged (FedAvg+/FedProx+ ensembles).
    """

    models: torch.Tensor
    members: np.ndarray
    combine: Combine = "single"

    @staticmethod
    def single(models: torch.Tensor, model_of_client: np.ndarray) -> Predictor:
        return Predictor(models, np.asarray(model_of_client, np.int64)[:, None], "single")


def _n(clients: np.ndarray) -> int:
    return len(clients)


SHARED = {"shared": True}
"""Field metadata: an array the same for every client (never sliced per client on the wire)."""


def reply_width(models: torch.Tensor, coords: np.ndarray | None) -> int:
    """Floats per client in a Train/Gradient reply: d, or d̂ = len(coords) when narrowed."""
    return int(models.shape[1]) if coords is None else len(coords)


def narrow(rows: torch.Tensor, coords: np.ndarray | None) -> torch.Tensor:
    """`rows[:, coords]`, what a client sends when asked for some coordinates only
    (`rows` itself when `coords` is None)."""
    if coords is None:
        return rows
    idx = np.asarray(coords)
    d = rows.shape[1]
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer) or (
            len(idx) and (idx.min() < 0 or idx.max() >= d)):
        raise ClusterFLError(f"coords must be a 1-d integer index array into the {d} parameters, "
                         f"got shape {idx.shape}, dtype {idx.dtype}")
    return rows[:, torch.from_numpy(idx.astype(np.int64))]


@dataclass
class TrainRequest:
    """Clients train locally, each starting from `models[model_of_client[i]]`.

    `offset` (optional) is a frozen predictor whose logits are added to the trained model's
    output on every sample (CAM trains one part while the other is fixed).
    `coords` (optional, sorted int64 indices into the flat parameter vector, the same for all
    clients): each client replies with `params[:, coords]` only, the trained model at those
    coordinates (CFL-GP's compressed clustering features, Kim et al. App. E.1); the uplink
    is then d̂ = len(coords) floats per client, the downlink still the whole model.
    """

    clients: np.ndarray
    models: torch.Tensor
    model_of_client: np.ndarray
    training: LocalTraining
    seed: int
    offset: Predictor | None = None
    count_cost: bool = True
    coords: np.ndarray | None = field(default=None, metadata=SHARED)

    def cost(self) -> tuple[float, float]:
        if not self.count_cost:
            return 0.0, 0.0
        d = self.models.shape[1]
        off = self.offset
        extra = 0 if off is None else off.members.shape[1] * off.models.shape[1]
        up = reply_width(self.models, self.coords)
        return float(_n(self.clients) * (d + extra)), float(_n(self.clients) * up)


@dataclass
class TrainReply:
    params: torch.Tensor
    n_samples: np.ndarray
    loss: np.ndarray


@dataclass
class GradientRequest:
    """Each client returns the gradient of its mean loss at `models[model_of_client[i]]`,
    on one random minibatch of `batch_size` (None: all its training data).

    `coords` (optional, sorted int64 indices into the flat parameter vector, the same for all
    clients): reply with `grads[:, coords]` only, d̂ = len(coords) floats per client up; the
    model still travels whole (d floats down per client).
    """

    clients: np.ndarray
    models: torch.Tensor
    model_of_client: np.ndarray
    batch_size: int | None
    seed: int
    coords: np.ndarray | None = field(default=None, metadata=SHARED)

    def cost(self) -> tuple[float, float]:
        d, up = self.models.shape[1], reply_width(self.models, self.coords)
        return float(_n(self.clients) * d), float(_n(self.clients) * up)


@dataclass
class GradientReply:
    grads: torch.Tensor
    n_samples: np.ndarray
    loss: np.ndarray


@dataclass
class LossRequest:
    """Each client reports the loss and accuracy of every one of K models on its data
    (IFCA's cluster identity estimate)."""

    clients: np.ndarray
    models: torch.Tensor
    split: Split = "train"
    offset: Predictor | None = None

    def cost(self) -> tuple[float, float]:
        k, d = self.models.shape
        return float(_n(self.clients) * k * d), float(_n(self.clients) * k)


@dataclass
class LossReply:
    loss: np.ndarray
    accuracy: np.ndarray


@dataclass
class EvaluateRequest:
    """Each client evaluates its predictor on its own data (default: its test split).

    Evaluation is measurement, not training traffic: its cost is not counted.
    """

    clients: np.ndarray
    predictor: Predictor
    split: Split = "test"

    def cost(self) -> tuple[float, float]:
        return 0.0, 0.0


@dataclass
class EvaluateReply:
    accuracy: np.ndarray
    macro_f1: np.ndarray
    loss: np.ndarray
    n_samples: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


Request = TrainRequest | GradientRequest | LossRequest | EvaluateRequest
Reply = TrainReply | GradientReply | LossReply | EvaluateReply


# ----------------------------------------------------------------------------- signatures
# (FLT, Jamali-Rad et al. 2022, Algorithm 2 lines 1-10: a one-off client-side step, not training)


@dataclass
class EmbedRequest:
    """Each client compresses its training data into k signature vectors (FLT Alg. 2).

    `method = "encoder"`: the client loads `encoder` (the flat parameters of a ConvAE with a
    `latent`-dimensional code), optionally fine-tunes its copy `finetune_epochs` epochs on
    its own images (reconstruction loss, Adam with `finetune_lr`, minibatches of
    `finetune_batch_size`), embeds all its training images and returns the k k-means
    centroids of the embeddings. `method = "pca"` (the PCA+kM+HC baseline): the client fits
    PCA with `pca_components` components to its own images, runs k-means in that space and
    returns the centroids mapped back to input space (so clients' centroids share one space).
    Labels are never used. `signature_dim` is e, the length of one returned vector (`latent`
    for the encoder, the flattened input size for PCA); it only sizes the uplink cost.
    All fields are arrays, tensors, ints, floats or strings, so any backend can ship it.
    """

    clients: np.ndarray
    method: str
    encoder: torch.Tensor | None
    signature_dim: int
    k: int = 5
    latent: int = 128
    finetune_epochs: int = 0
    finetune_lr: float = 1e-3
    finetune_batch_size: int = 32
    pca_components: int = 10
    kmeans_n_init: int = 10
    seed: int = 0

    def cost(self) -> tuple[float, float]:
        """Floats down: the encoder once per client (0 for PCA); up: k·e per client."""
        n = _n(self.clients)
        down = 0 if self.encoder is None else int(self.encoder.numel())
        return float(n * down), float(n * self.k * self.signature_dim)


@dataclass
class EmbedReply:
    """`signatures[i]` is client i's `[k, e]` centroid set; `n_samples` its data size."""

    signatures: np.ndarray
    n_samples: np.ndarray


Request = TrainRequest | GradientRequest | LossRequest | EvaluateRequest | EmbedRequest
Reply = TrainReply | GradientReply | LossReply | EvaluateReply | EmbedReply
