"""The requests a server may send to clients, and the replies (floor 0, docs/architecture.md).

Algorithms never touch client data: they build one of these requests for a set of clients
and hand it to `Context.send`. Every request knows what one client receives and sends in
floats (`unit_cost`), so `Context.send` books what a method costs on the wire, whatever
backend runs it, in one place.

Models travel as flat vectors. A request carries a stack `models: [K, d]` and, per client,
which row(s) that client uses, so K distinct models go to many clients without copies.

Clients on the first axis: a request lists its `clients`; a reply lists the clients whose
rows it holds (`clients`, in request order, only those that answered). Fields marked
`PER_CLIENT` have one entry per listed client on their first axis (in a nested `Predictor`,
its `members`); every other field is the same for all clients. `subset` and `join` are the one
way to take some clients of a request or reply and to put replies together; robustness,
backends and the Flower codec all use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np
import torch

from clusterfl.errors import ClusterFLError

Combine = Literal["single", "sum_logits", "mean_probs", "mean_outputs"]
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


PER_CLIENT = {"per_client": True}
"""Field metadata: one entry per listed client on the first axis (sliced by `subset`)."""


@dataclass(frozen=True)
class Predictor:
    """How each client predicts: `members[i]` are the rows of `models` client i combines.

    - "single": one model per client (`members` is `[n, 1]`).
    - "sum_logits": logits of the members are added (CAM: global + cluster model).
    - "mean_probs": softmax outputs are averaged (FedAvg+/FedProx+ ensembles); with
      `weights` (`[n, members]`, one row per client, each row summing to 1), the weighted
      mean Σ_j weights[i, j] · softmax(member j) (FedEM's mixture prediction, Σ_m π_m h_m).
    - "mean_outputs": the members' raw outputs are averaged (with `weights`: weighted), the
      mixture's mean for regression (FedEM on a regression task).
    """

    models: torch.Tensor
    members: np.ndarray = field(metadata=PER_CLIENT)
    combine: Combine = "single"
    weights: np.ndarray | None = field(default=None, metadata=PER_CLIENT)

    @staticmethod
    def single(models: torch.Tensor, model_of_client: np.ndarray) -> Predictor:
        return Predictor(models, np.asarray(model_of_client, np.int64)[:, None], "single")


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


RE = TypeVar("RE")


class Asks(Generic[RE]):
    """Base of every request: `Asks[TrainReply]` is a request answered by a `TrainReply`
    (what `Context.send` and `Backend.execute` return for it)."""

    clients: np.ndarray

    def unit_cost(self) -> tuple[float, float]:
        """(floats down, floats up) of one client: down for every client the request reaches,
        up for every client that uploads a reply."""
        raise NotImplementedError

    def cost(self) -> tuple[float, float]:
        """(floats down, floats up) if every listed client answers."""
        down, up = self.unit_cost()
        n = len(self.clients)
        return float(n * down), float(n * up)


@dataclass
class TrainRequest(Asks["TrainReply"]):
    """Clients train locally, each starting from `models[model_of_client[i]]`.

    `offset` (optional) is a frozen predictor whose logits are added to the trained model's
    output on every sample (CAM trains one part while the other is fixed).
    `coords` (optional, sorted int64 indices into the flat parameter vector, the same for all
    clients): each client replies with `params[:, coords]` only, the trained model at those
    coordinates (CFL-GP's compressed clustering features, Kim et al. App. E.1); the uplink
    is then d̂ = len(coords) floats per client, the downlink still the whole model.

    `prox_models` (optional, `[S, d]`) with `prox_weights` (`[n, S]`, one row per client):
    the proximal term becomes mu/2 Σ_s prox_weights[i, s] ||w − prox_models[s]||², a pull
    toward the client's own mix of S models instead of toward its start model (FedSoft, Ruan
    & Joe-Wong 2022: each client's importance weights over the S cluster models). Needs
    `training.mu` > 0 to act.

    What travels (booked by `Context.send` from `unit_cost`): down, the client's start model
    and the offset's member models — nothing when `models_held` (the clients already hold
    them: sent with an earlier message of the same round, as IFCA's K models go with its loss
    request, or the client's own model kept on the device) — and the S proximal models
    unless `prox_held`; up, the trained model (d̂ floats
    with `coords`) — nothing when `keep_local` (the model stays on the device: Local, FeSEM's
    warm-up; the simulated reply still reaches the server, which plays the device's storage).
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    model_of_client: np.ndarray = field(metadata=PER_CLIENT)
    training: LocalTraining
    seed: int
    offset: Predictor | None = field(default=None, metadata=PER_CLIENT)
    coords: np.ndarray | None = None
    models_held: bool = False
    keep_local: bool = False
    # per-client proximal centers mixed from S models (FedSoft)
    prox_models: torch.Tensor | None = None
    prox_weights: np.ndarray | None = field(default=None, metadata=PER_CLIENT)
    prox_held: bool = False

    def unit_cost(self) -> tuple[float, float]:
        """(floats down, floats up) of one client."""
        d = int(self.models.shape[1])
        off = self.offset
        extra = 0 if off is None else off.members.shape[1] * int(off.models.shape[1])
        down = 0 if self.models_held else d + extra
        if self.prox_models is not None and not self.prox_held:
            down += int(self.prox_models.numel())
        up = 0 if self.keep_local else reply_width(self.models, self.coords)
        return float(down), float(up)



@dataclass
class TrainReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    params: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)


@dataclass
class GradientRequest(Asks["GradientReply"]):
    """Each client returns the gradient of its mean loss at `models[model_of_client[i]]`,
    on one random minibatch of `batch_size` (None: all its training data).

    `coords` (optional, sorted int64 indices into the flat parameter vector, the same for all
    clients): reply with `grads[:, coords]` only, d̂ = len(coords) floats per client up; the
    model still travels whole (d floats down per client) unless `models_held` (the clients
    already hold it from an earlier message of the round).
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    model_of_client: np.ndarray = field(metadata=PER_CLIENT)
    batch_size: int | None
    seed: int
    coords: np.ndarray | None = None
    models_held: bool = False

    def unit_cost(self) -> tuple[float, float]:
        down = 0 if self.models_held else int(self.models.shape[1])
        return float(down), float(reply_width(self.models, self.coords))



@dataclass
class GradientReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    grads: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)


@dataclass
class LossRequest(Asks["LossReply"]):
    """Each client reports the loss and accuracy of every one of K models on its data
    (IFCA's cluster identity estimate). With an `offset`, model k's logits are added to the
    offset's (CAM: the loss of the sum h(x; Θ_g) + f(x; Θ_k)).

    Down: the K models and the offset's members; `shared_coords` coordinates that are the
    same in all K models (IFCA's weight sharing) travel once instead of K times. Up: K losses.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    split: Split = "train"
    offset: Predictor | None = field(default=None, metadata=PER_CLIENT)
    shared_coords: int = 0

    def unit_cost(self) -> tuple[float, float]:
        k, d = (int(x) for x in self.models.shape)
        off = self.offset
        extra = 0 if off is None else off.members.shape[1] * int(off.models.shape[1])
        down = k * d - (k - 1) * self.shared_coords + extra if k else 0
        return float(down), float(k)



@dataclass
class LossReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)
    accuracy: np.ndarray = field(metadata=PER_CLIENT)


@dataclass
class EvaluateRequest(Asks["EvaluateReply"]):
    """Each client evaluates its predictor on its own data (default: its test split).

    Evaluation is measurement, not training traffic: its cost is not counted.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    predictor: Predictor = field(metadata=PER_CLIENT)
    split: Split = "test"

    def unit_cost(self) -> tuple[float, float]:
        return 0.0, 0.0


@dataclass
class EvaluateReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    accuracy: np.ndarray = field(metadata=PER_CLIENT)
    macro_f1: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    extras: dict[str, np.ndarray] = field(default_factory=dict, metadata=PER_CLIENT)


# ----------------------------------------------------------------------------- signatures
# (FLT, Jamali-Rad et al. 2022, Algorithm 2 lines 1-10: a one-off client-side step, not training)


@dataclass
class EmbedRequest(Asks["EmbedReply"]):
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

    clients: np.ndarray = field(metadata=PER_CLIENT)
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

    def unit_cost(self) -> tuple[float, float]:
        """Floats down: the encoder (0 for PCA); up: k·e."""
        down = 0 if self.encoder is None else int(self.encoder.numel())
        return float(down), float(self.k * self.signature_dim)



@dataclass
class EmbedReply:
    """`signatures[i]` is client i's `[k, e]` centroid set; `n_samples` its data size."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    signatures: np.ndarray = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)


# ----------------------------------------------------------------------------- mixtures
# (FedEM, Marfoq et al. 2021: client-side E-step and weighted M-step of a mixture of K models;
# FedSoft, Ruan & Joe-Wong 2022: per-sample least-loss counts, its importance estimate)


@dataclass
class MixtureTrainRequest(Asks["MixtureTrainReply"]):
    """One federated EM step of a mixture of the K `models`, done by each client locally.

    Client i, with its mixture weights π_i = `weights[i]` (`[n, K]`, rows summing to 1):

    1. E-step: for every training sample j, q_j(k) ∝ π_ik · exp(−ℓ(models[k]; x_j, y_j)),
       with the per-sample loss ℓ of the model in evaluation mode (a softmax over k of
       log π_ik − ℓ_jk);
    2. π_i ← the mean of q_j over its samples (returned in the reply's `weights`);
    3. M-step: each of the K models is trained locally from `models[k]` with `training`,
       sample j's loss weighted by q_j(k) (a batch's loss is Σ_j q_j(k) ℓ_j / |batch|). The
       K trainings read independent minibatch orders (`engine.schedule.mixture_seed`).

    The server sends the K models (K·d down, nothing when `models_held`) and receives the K
    trained models (K·d up). π stays on the device: it is not booked; the simulated reply
    carries it because the server plays the device's storage.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    weights: np.ndarray = field(metadata=PER_CLIENT)
    training: LocalTraining
    seed: int
    models_held: bool = False

    def unit_cost(self) -> tuple[float, float]:
        kd = int(self.models.numel())
        return float(0 if self.models_held else kd), float(kd)


@dataclass
class MixtureTrainReply:
    """`params[i]` the K trained models `[K, d]` of client i, `weights[i]` its new π,
    `loss[i]` Σ_k of the K trainings' mean (weighted) batch losses."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    params: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)
    weights: np.ndarray = field(metadata=PER_CLIENT)


@dataclass
class MixtureFitRequest(Asks["MixtureFitReply"]):
    """Each client fits its mixture weights over the K frozen `models` on its own data:
    `iterations` EM steps (E-step and π-update of `MixtureTrainRequest`, no training),
    starting from `weights` (`[n, K]`). FedEM's rule for clients unseen in training.

    Down: the K models (K·d). Up: the K weights, so that the server can say where the client
    was placed; `loss` is the mixture's negative log-likelihood on the data after fitting,
    −mean_j log Σ_k π_k exp(−ℓ_jk).
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    weights: np.ndarray = field(metadata=PER_CLIENT)
    iterations: int = 1
    split: Split = "train"

    def unit_cost(self) -> tuple[float, float]:
        return float(self.models.numel()), float(self.models.shape[0])


@dataclass
class MixtureFitReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    weights: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)


@dataclass
class BestCountRequest(Asks["BestCountReply"]):
    """Each client counts, for each of the K `models`, its samples on which that model has
    the least loss (ties to the lower index; a non-finite loss never wins). FedSoft's
    importance estimate: u_ik = count_ik / n_i.

    Down: the K models (K·d). Up: K counts.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    models: torch.Tensor
    split: Split = "train"

    def unit_cost(self) -> tuple[float, float]:
        return float(self.models.numel()), float(self.models.shape[0])


@dataclass
class BestCountReply:
    clients: np.ndarray = field(metadata=PER_CLIENT)
    counts: np.ndarray = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)


# ----------------------------------------------------------------------------- data subspaces
# (PACFL, Vahidian et al. 2023: a one-off client-side truncated SVD; the basis only travels)


@dataclass
class SubspaceRequest(Asks["SubspaceReply"]):
    """Each client returns an orthonormal basis of the span of its own training inputs.

    The client stacks its flattened training inputs as the columns of D ∈ R^{e×n} (no
    centring, no scaling: the inputs as the client holds them) and keeps the `p` leading left
    singular vectors of a truncated SVD, D ≈ U_p Σ_p V_pᵀ. With `per_label` (the PACFL
    authors' code) it does so for the inputs of each label it holds and stacks the bases side
    by side, label by label in increasing order. Singular vectors whose singular value is not
    above `rtol` × the largest one of that matrix are dropped (a client with fewer samples, or
    rank, than `p` has fewer columns). Only the basis travels, never samples or labels.

    The reply has a fixed width, `columns()` = p (whole data) or `n_labels` · p (per label):
    client i's basis is `bases[i, :, :ranks[i]]` and the rest of its columns are zeros. What
    travels is that fixed width: nothing down, e · columns() floats up per client (the zero
    padding included: the wire carries it; the PACFL authors' code sends #labels-held · p · e).
    `input_dim` is e, the flattened input size; `n_labels` the classes of the task.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    input_dim: int
    p: int = 3
    per_label: bool = False
    n_labels: int = 0
    rtol: float = 1e-6

    def columns(self) -> int:
        """Basis columns of every reply row: p, or n_labels · p per label."""
        return int(self.p) * (int(self.n_labels) if self.per_label else 1)

    def unit_cost(self) -> tuple[float, float]:
        """Floats down: 0 (the request carries no model); up: e · columns()."""
        return 0.0, float(int(self.input_dim) * self.columns())


@dataclass
class SubspaceReply:
    """`bases[i]` is client i's `[e, columns]` basis: its first `ranks[i]` columns are unit
    singular vectors (orthonormal for the whole data; per label, orthonormal within each
    label's block), the rest zeros. `n_samples` is its data size."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    bases: np.ndarray = field(metadata=PER_CLIENT)
    ranks: np.ndarray = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)

    def basis(self, row: int) -> np.ndarray:
        """The `[e, ranks[row]]` basis of the client at position `row`."""
        return np.asarray(self.bases[row][:, : int(self.ranks[row])])


# ----------------------------------------------------------------------------- compound requests
# (issue 26: a client's whole round in one message)


@dataclass(frozen=True)
class Pick:
    """Step `step` of a `Steps` takes each client's model from that client's own result of
    step `source` (a `LossRequest`): the row of the source's models with the least loss
    (`by = "loss"`, IFCA's cluster identity estimate ĵ = argmin_j F_i(θ_j)) or the highest
    accuracy, ties to the lower loss (`"accuracy"`); `pick_rows` is the rule, the same on the
    device and on the server. `into = "model"`: the row becomes the step's `model_of_client`
    (train / take the gradient of θ_ĵ); `"offset"`: the one member of the step's `offset`
    predictor (IFCA-CAM trains Θ_g with the picked cluster part frozen). A client that did
    not answer the source step is not asked for step `step`."""

    step: int
    source: int
    by: Literal["loss", "accuracy"] = "loss"
    into: Literal["model", "offset"] = "model"


def pick_rows(loss: np.ndarray, accuracy: np.ndarray | None = None,
              by: Literal["loss", "accuracy"] = "loss") -> np.ndarray:
    """Row per client from its `[n, K]` losses: argmin loss, or argmax accuracy with ties to
    the lower loss. Non-finite losses count as +inf (a diverged model is never chosen)."""
    finite = np.where(np.isfinite(loss), loss, np.inf)
    if by == "loss":
        return np.argmin(finite, axis=1).astype(np.int64)
    if accuracy is None:
        raise ValueError("choosing by accuracy needs the accuracies")
    acc = np.nan_to_num(accuracy, nan=-1.0)
    best = acc.max(axis=1, keepdims=True)
    return np.argmin(np.where(acc == best, finite, np.inf), axis=1).astype(np.int64)


@dataclass
class Steps(Asks["StepsReply"]):
    """Several ordinary requests a client executes in order, sent as ONE message per client.

    `steps[j]` is any request but `Steps` and `EvaluateRequest`; its `clients` are some of
    `clients` (a step may go to a part of them, CFL-GP's profile probes). `picks` bind a later
    step's models to an earlier step's local result (`Pick`: IFCA's "train the least-loss of
    the K models" as its paper describes the client's step); a picked step's
    `model_of_client` is a placeholder. Every step is computed as if it had been sent alone
    (same seeds, same engine), so the replies are those of the separate requests.

    Costs: each step is booked by `Context.send` as if it had been sent alone (its
    `unit_cost` for the clients it reached / that uploaded it), so a method's communication is
    unchanged; `unit_cost` here is the sum, what one client in every step receives and sends.
    The reply (`StepsReply`) holds one reply per step.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    steps: list[Any] = field(metadata=PER_CLIENT)
    picks: list[Pick] = field(default_factory=list)

    def __post_init__(self) -> None:
        for s in self.steps:
            if isinstance(s, Steps | EvaluateRequest) or not isinstance(s, REQUEST_TYPES):
                raise ClusterFLError(f"a Steps step must be an ordinary request other than "
                                     f"EvaluateRequest, got {type(s).__name__}")
        for p in self.picks:
            ok = 0 <= p.source < p.step < len(self.steps)
            target = self.steps[p.step] if ok else None
            fits = (getattr(target, "offset", None) is not None if p.into == "offset"
                    else hasattr(target, "model_of_client"))
            if not ok or not isinstance(self.steps[p.source], LossRequest) or not fits:
                raise ClusterFLError(f"Pick(step={p.step}, source={p.source}) must take a "
                                     "later step's models from an earlier LossRequest step")

    @staticmethod
    def of(*steps: Any, picks: list[Pick] | None = None) -> Steps:
        """The steps, for the union of their clients (in first-seen order)."""
        seen: dict[int, None] = {}
        for s in steps:
            seen.update((int(c), None) for c in np.asarray(s.clients).tolist())
        return Steps(np.array(list(seen), dtype=np.int64), list(steps), list(picks or []))

    def unit_cost(self) -> tuple[float, float]:
        down = up = 0.0
        for s in self.steps:
            d, u = s.unit_cost()
            down, up = down + d, up + u
        return down, up

    def picks_of(self, j: int) -> list[Pick]:
        return [p for p in self.picks if p.step == j]


@dataclass
class StepsReply:
    """`replies[j]` is the reply of step j (its rows: the clients of that step that answered,
    in that step's order — after `join`, in the order it was given); `clients` are the
    clients that answered at least one step, in request order. `subset` keeps each step's
    own order."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    replies: list[Any] = field(metadata=PER_CLIENT)


def present(message: M, clients: np.ndarray | list[int]) -> M:
    """`message` restricted to those of the client ids `clients` it lists (in that order)."""
    listed = {int(c) for c in np.asarray(message.clients).tolist()}  # type: ignore[attr-defined]
    keep = [int(c) for c in np.asarray(clients).tolist() if int(c) in listed]
    return select(message, keep)


def resolve_step(request: Steps, j: int, replies: list[Any]) -> Any:
    """Step j as the client executes it, given the replies of steps 0..j−1: with a `Pick`,
    for the clients that answered the source step only, each on its picked model."""
    step = request.steps[j]
    for pick in request.picks_of(j):
        step = _apply(step, pick, replies)
    return step


def _apply(step: Any, pick: Pick, replies: list[Any]) -> Any:
    src = replies[pick.source]
    step = present(step, src.clients)
    rows = pick_rows(np.asarray(src.loss), np.asarray(src.accuracy), pick.by)
    picked = rows[positions_of(src, step.clients)]
    if pick.into == "offset":
        return replace(step, offset=replace(step.offset, members=picked[:, None]))
    return replace(step, model_of_client=picked)


def run_steps(execute: Any, request: Steps) -> StepsReply:
    """Execute the steps in order with `execute` (a backend's), each step as the separate
    request it stands for (`resolve_step`): what every backend and node does with a `Steps`."""
    replies: list[Any] = []
    for j in range(len(request.steps)):
        step = resolve_step(request, j, replies)
        replies.append(execute(step) if len(step.clients) else empty_reply(step))
    return steps_reply(request.clients, replies)


def request_name(request: Any) -> str:
    """A request's name in logs and errors: its type, a `Steps` with its steps'
    (`Steps[LossRequest+TrainRequest]`)."""
    if isinstance(request, Steps):
        return "Steps[" + "+".join(type(s).__name__ for s in request.steps) + "]"
    return type(request).__name__


def steps_reply(order: np.ndarray, replies: list[Any]) -> StepsReply:
    """A `StepsReply` of the step replies; its clients: those in any step, in `order`."""
    got = {int(c) for r in replies for c in np.asarray(r.clients).tolist()}
    who = [int(c) for c in np.asarray(order).tolist() if int(c) in got]
    return StepsReply(np.array(who, dtype=np.int64), list(replies))


MIXTURE_REQUESTS: tuple[type, ...] = (MixtureTrainRequest, MixtureFitRequest, BestCountRequest)


Request = (TrainRequest | GradientRequest | LossRequest | EvaluateRequest | EmbedRequest
           | MixtureTrainRequest | MixtureFitRequest | BestCountRequest | SubspaceRequest
           | Steps)
Reply = (TrainReply | GradientReply | LossReply | EvaluateReply | EmbedReply
         | MixtureTrainReply | MixtureFitReply | BestCountReply | SubspaceReply | StepsReply)

REQUEST_TYPES: tuple[type, ...] = (TrainRequest, GradientRequest, LossRequest, EvaluateRequest,
                                   EmbedRequest, *MIXTURE_REQUESTS, SubspaceRequest)
REPLY_TYPES: tuple[type, ...] = (TrainReply, GradientReply, LossReply, EvaluateReply,
                                 EmbedReply, MixtureTrainReply, MixtureFitReply, BestCountReply,
                                 SubspaceReply)


class Executor(Protocol):
    """Anything that executes requests (a backend); what the robustness layer drives."""

    def execute(self, request: Any) -> Any: ...


# ----------------------------------------------------------------------------- subsets, joins

M = TypeVar("M")


def _take(value: Any, rows: np.ndarray) -> Any:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(rows)]
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, dict):
        return {k: _take(v, rows) for k, v in value.items()}
    if isinstance(value, Predictor):
        return subset(value, rows)
    raise TypeError(f"cannot take client rows of a {type(value).__name__}")


def subset(message: M, rows: np.ndarray | list[int]) -> M:
    """`message` (a request, a reply or a `Predictor`) restricted to the clients at positions
    `rows` of its client axis, in that order: every `PER_CLIENT` field follows."""
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    msg: Any = message
    if isinstance(msg, Steps | StepsReply):  # each step: those of the clients it lists
        ids = np.asarray(msg.clients, dtype=np.int64)[idx]
        name = "steps" if isinstance(msg, Steps) else "replies"
        keep = {int(c) for c in ids.tolist()}
        parts = [subset(p, [i for i, c in enumerate(np.asarray(p.clients).tolist())
                            if int(c) in keep]) for p in getattr(msg, name)]
        compound: Any = replace(msg, clients=ids)
        setattr(compound, name, parts)  # a fresh copy: its own list of steps / replies
        done: M = compound
        return done
    changes = {f.name: _take(getattr(msg, f.name), idx) for f in fields(msg)
               if f.metadata.get("per_client")}
    out: M = replace(msg, **changes)
    return out


def positions_of(message: Any, clients: np.ndarray | list[int]) -> np.ndarray:
    """Positions of client ids `clients` on `message.clients` (each must be listed)."""
    where = {int(c): i for i, c in enumerate(np.asarray(message.clients).tolist())}
    try:
        return np.array([where[int(c)] for c in np.asarray(clients).tolist()], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"client {exc.args[0]} is not listed in the "
                         f"{type(message).__name__}") from None


def select(message: M, clients: np.ndarray | list[int]) -> M:
    """`message` restricted to the client ids `clients` (in that order)."""
    return subset(message, positions_of(message, clients))


def _cat(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values)
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    if isinstance(first, dict):
        return {k: _cat([v[k] for v in values]) for k in first}
    raise TypeError(f"cannot join client rows of a {type(first).__name__}")


def join(replies: list[M], order: np.ndarray | None = None) -> M:
    """The rows of several replies of one type as one reply; with `order` (client ids, e.g.
    the request's `clients`), the rows are put in that order (clients not in any reply are
    absent)."""
    if not replies:
        raise ValueError("join needs at least one reply")
    first: Any = replies[0]
    if isinstance(first, StepsReply):  # step by step, then the clients of any step
        parts: list[Any] = list(replies)
        if order is None:
            order = np.concatenate([np.asarray(r.clients, np.int64) for r in parts])
        steps = [join([r.replies[j] for r in parts], order)
                 for j in range(len(first.replies))]
        joined: Any = steps_reply(order, steps)
        return joined
    out: Any = first
    if len(replies) > 1:
        out = replace(first, **{
            f.name: _cat([getattr(r, f.name) for r in replies])
            for f in fields(first) if f.metadata.get("per_client")})
    if order is None:
        done: M = out
        return done
    rank = {int(c): i for i, c in enumerate(np.asarray(order).tolist())}
    have = np.asarray(out.clients).tolist()
    missing = [c for c in have if int(c) not in rank]
    if missing:
        raise ValueError(f"reply rows for clients {missing} that were not asked")
    ranks = np.array([rank[int(c)] for c in have], dtype=np.int64)
    if np.all(ranks[1:] > ranks[:-1]):  # already in order (the usual case): no copy
        done = out
        return done
    ordered: M = subset(out, np.argsort(ranks, kind="stable"))
    return ordered


def empty_reply(request: Request) -> Reply:
    """A reply with no rows, of the type and widths `request` would get."""
    none = np.zeros(0, dtype=np.int64)
    if isinstance(request, TrainRequest):
        d = reply_width(request.models, request.coords)  # d̂ when narrowed to `coords`
        return TrainReply(none, torch.zeros(0, d, dtype=request.models.dtype), none.copy(),
                          np.zeros(0))
    if isinstance(request, GradientRequest):
        d = reply_width(request.models, request.coords)
        return GradientReply(none, torch.zeros(0, d, dtype=request.models.dtype), none.copy(),
                             np.zeros(0))
    if isinstance(request, LossRequest):
        k = int(request.models.shape[0])
        return LossReply(none, np.zeros((0, k)), np.zeros((0, k)))
    if isinstance(request, EvaluateRequest):
        return EvaluateReply(none, np.zeros(0), np.zeros(0), np.zeros(0), none.copy())
    if isinstance(request, EmbedRequest):
        return EmbedReply(none, np.zeros((0, int(request.k), int(request.signature_dim))),
                          none.copy())
    if isinstance(request, MixtureTrainRequest):
        k, d = (int(x) for x in request.models.shape)
        return MixtureTrainReply(none, torch.zeros(0, k, d, dtype=request.models.dtype),
                                 none.copy(), np.zeros(0), np.zeros((0, k)))
    if isinstance(request, MixtureFitRequest):
        k = int(request.models.shape[0])
        return MixtureFitReply(none, np.zeros((0, k)), np.zeros(0), none.copy())
    if isinstance(request, BestCountRequest):
        k = int(request.models.shape[0])
        return BestCountReply(none, np.zeros((0, k), dtype=np.int64), none.copy())
    if isinstance(request, SubspaceRequest):
        return SubspaceReply(none, np.zeros((0, int(request.input_dim), request.columns())),
                             none.copy(), none.copy())
    if isinstance(request, Steps):
        return StepsReply(none, [empty_reply(s) for s in request.steps])
    raise TypeError(f"unknown request type {type(request).__name__}")


def start_models(request: TrainRequest | GradientRequest,
                 clients: np.ndarray | None = None) -> torch.Tensor:
    """θ_start of `clients` (default: all listed), the row of `request.models` each was sent,
    at the request's `coords` when it asked for some coordinates only (a reply's shape)."""
    rows = np.asarray(request.model_of_client, dtype=np.int64)
    if clients is not None:
        rows = rows[positions_of(request, clients)]
    return narrow(request.models[torch.from_numpy(rows)], request.coords)


def mean_finite(values: np.ndarray | list[float]) -> float | None:
    """Mean of the finite entries (None when there is none, e.g. nobody answered)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None
