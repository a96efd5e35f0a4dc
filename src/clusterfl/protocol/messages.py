"""The requests a server may send to clients, and their replies (floor 0).

Every request knows what one client receives and sends in floats (`unit_cost`, booked by
`Context.send`), which kind of request it is (`kind`: an update, a query or an evaluation;
`trains`: whether clients train locally on it; `counted_update`: whether each answer counts
as client updates, `updates_each` of them), the reply it gets from nobody (`empty_reply`)
and, for an update, what the uploaded rows are relative to (`update_base`,
`update_groups`); an update reply says which of its fields holds the uploaded vectors
(`update_rows`, `with_update_rows`). The robustness
layer, the backends and the Flower hooks read these instead of testing message types.

Models travel as flat vectors. A request carries a stack `models: [K, d]` and, per client,
which row(s) that client uses, so K distinct models go to many clients without copies.
Fields marked `PER_CLIENT` have one entry per listed client on their first axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

import numpy as np
import torch

from clusterfl.config_util import is_number, is_whole
from clusterfl.errors import ClusterFLError, ConfigError

Combine = Literal["single", "sum_logits", "mean_probs", "mean_outputs"]
Split = Literal["train", "test"]
Kind = Literal["update", "query", "evaluate", "steps"]
"""What a request is: an update (clients upload model-sized vectors: training, gradients,
FedEM's mixture step), a query (losses, counts, signatures, bases, mixture weights), an
evaluation (measurement, never training traffic) or a compound `Steps`."""


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

    def __post_init__(self) -> None:
        """One ConfigError naming `LocalTraining.<field>` and its allowed values for a setting
        the engines would misread (a run's `[train]` table is checked before; this is the
        Python API's): before, the stacked engine ran `optimizer = "adamw"` as SGD, a
        negative lr, weight decay or mu, `epochs = steps = 0`, and failed on betas >= 1 with
        ZeroDivisionError or a complex-number RuntimeError, on a fractional epoch count
        with a TypeError."""
        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(f"LocalTraining.{name}", f"{getattr(self, name)!r}; allowed: "
                               f"{allowed}")

        if self.optimizer not in ("sgd", "adam"):
            raise bad("optimizer", "'sgd', 'adam'")
        for name, low, high in (("lr", 0.0, math.inf), ("weight_decay", 0.0, math.inf),
                                ("mu", 0.0, math.inf), ("eps", 0.0, math.inf),
                                ("momentum", 0.0, 1.0)):
            value = getattr(self, name)
            if not is_number(value) or not low <= value < high:
                raise bad(name, f"a number in [{low:g}, 1)" if high == 1.0 else
                          "a finite number >= 0")
        betas = self.betas
        if not isinstance(betas, tuple | list) or len(betas) != 2 or not all(
                is_number(b) and 0.0 <= b < 1.0 for b in betas):
            raise bad("betas", "two numbers in [0, 1)")
        if not is_whole(self.batch_size) or self.batch_size < 1:
            raise bad("batch_size", "a whole number >= 1")
        for name in ("epochs", "steps"):
            if not is_whole(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "a whole number >= 0")
        if self.epochs == 0 and self.steps == 0:
            raise bad("epochs", "a whole number >= 1, or steps >= 1 (both are 0)")


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

    `own`: each client has a model of its own, though clients that have not trained yet
    share one row (FedSoft's personal models, `ClientModels`): an engine evaluates every
    client with its own stacked copy, as for a table of every client's model, also where
    most clients share a row (a model shared by many clients is otherwise run over all
    their rows at once, which can differ in the last bits).
    """

    models: torch.Tensor
    members: np.ndarray = field(metadata=PER_CLIENT)
    combine: Combine = "single"
    weights: np.ndarray | None = field(default=None, metadata=PER_CLIENT)
    own: bool = False

    @staticmethod
    def single(models: torch.Tensor, model_of_client: np.ndarray,
               own: bool = False) -> Predictor:
        return Predictor(models, np.asarray(model_of_client, np.int64)[:, None], "single",
                         own=own)


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


def client_seed(seed: int, client: int) -> int:
    """The seed of client `client`'s own randomness (dropout noise, k-means starts) under a
    request with `seed`: the same whichever backend computes it and in whatever order."""
    return int(seed) * 1_000_003 + int(client)


class Reply:
    """Base of every reply: the rows of the clients listed in `clients` (in request order,
    only those that answered). `nested` names the field of a compound reply that holds one
    reply per step (`StepsReply.replies`)."""

    clients: np.ndarray
    nested: ClassVar[str | None] = None

    def update_rows(self) -> torch.Tensor:
        """`[n, w]`: the vector each client uploaded (an update reply's model, gradient or K
        models, flat), what adversaries, validation and privacy act on."""
        raise TypeError(f"a {type(self).__name__} holds no update")

    def with_update_rows(self, rows: torch.Tensor, n_samples: np.ndarray | None = None) -> Self:
        """This reply with `rows` (`[n, w]`, as `update_rows`) uploaded instead, and with
        `n_samples` if given."""
        raise TypeError(f"a {type(self).__name__} holds no update")


RE = TypeVar("RE", bound=Reply)


class Asks(Generic[RE]):
    """Base of every request: `Asks[TrainReply]` is a request answered by a `TrainReply`
    (what `Context.send` and `Backend.execute` return for it)."""

    clients: np.ndarray
    kind: ClassVar[Kind] = "query"
    #: clients train locally on it: a straggler's steps are cut; on Flower a "train" message
    trains: ClassVar[bool] = False
    #: each answering client adds `updates_each()` to `Context.client_updates` (a training or
    #: a gradient of one model; FedEM's step trains K of them)
    counted_update: ClassVar[bool] = False
    #: the field of a compound request that holds its requests (`Steps.steps`)
    nested: ClassVar[str | None] = None

    def empty_reply(self) -> RE:
        """A reply with no rows, of the type and widths this request would get."""
        raise NotImplementedError

    def updates_each(self) -> int:
        """Client updates one answer counts when `counted_update` (one model trained)."""
        return 1

    def update_base(self, rows: np.ndarray) -> torch.Tensor | None:
        """What the uploaded vectors of the clients at positions `rows` are relative to: their
        start models (`[len(rows), w]`, or `[1, w]` shared by all), None when the vectors are
        the update themselves (gradients). Update requests only."""
        raise TypeError(f"a {type(self).__name__} is not an update request")

    def update_groups(self, rows: np.ndarray) -> np.ndarray:
        """The model each of the clients at positions `rows` updates (the noise's groups)."""
        raise TypeError(f"a {type(self).__name__} is not an update request")

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
    kind: ClassVar[Kind] = "update"
    trains: ClassVar[bool] = True
    counted_update: ClassVar[bool] = True

    def empty_reply(self) -> TrainReply:
        d = reply_width(self.models, self.coords)  # d̂ when narrowed to `coords`
        return TrainReply(_none(), torch.zeros(0, d, dtype=self.models.dtype), _none(),
                          np.zeros(0))

    def update_base(self, rows: np.ndarray) -> torch.Tensor:
        """θ_start of each client, at `coords` when narrowed (the reply's width)."""
        return narrow(self.models[torch.from_numpy(self.update_groups(rows))], self.coords)

    def update_groups(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_of_client, dtype=np.int64)[np.asarray(rows, np.int64)]

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
class TrainReply(Reply):
    clients: np.ndarray = field(metadata=PER_CLIENT)
    params: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)

    def update_rows(self) -> torch.Tensor:
        return self.params

    def with_update_rows(self, rows: torch.Tensor, n_samples: np.ndarray | None = None) -> Self:
        return replace(self, params=rows, n_samples=_given(n_samples, self.n_samples))


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
    kind: ClassVar[Kind] = "update"
    counted_update: ClassVar[bool] = True

    def empty_reply(self) -> GradientReply:
        d = reply_width(self.models, self.coords)
        return GradientReply(_none(), torch.zeros(0, d, dtype=self.models.dtype), _none(),
                             np.zeros(0))

    def update_base(self, rows: np.ndarray) -> None:
        return None  # a gradient is the update itself

    def update_groups(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_of_client, dtype=np.int64)[np.asarray(rows, np.int64)]

    def unit_cost(self) -> tuple[float, float]:
        down = 0 if self.models_held else int(self.models.shape[1])
        return float(down), float(reply_width(self.models, self.coords))


@dataclass
class GradientReply(Reply):
    clients: np.ndarray = field(metadata=PER_CLIENT)
    grads: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)

    def update_rows(self) -> torch.Tensor:
        return self.grads

    def with_update_rows(self, rows: torch.Tensor, n_samples: np.ndarray | None = None) -> Self:
        return replace(self, grads=rows, n_samples=_given(n_samples, self.n_samples))


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

    def empty_reply(self) -> LossReply:
        k = int(self.models.shape[0])
        return LossReply(_none(), np.zeros((0, k)), np.zeros((0, k)))

    def unit_cost(self) -> tuple[float, float]:
        k, d = (int(x) for x in self.models.shape)
        off = self.offset
        extra = 0 if off is None else off.members.shape[1] * int(off.models.shape[1])
        down = k * d - (k - 1) * self.shared_coords + extra if k else 0
        return float(down), float(k)


@dataclass
class LossReply(Reply):
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
    kind: ClassVar[Kind] = "evaluate"

    def empty_reply(self) -> EvaluateReply:
        return EvaluateReply(_none(), np.zeros(0), np.zeros(0), np.zeros(0), _none())

    def unit_cost(self) -> tuple[float, float]:
        return 0.0, 0.0


WORD_ACCURACY = "accuracy_no_oov_no_eos"
"""A language model's token accuracy on the targets that are words of the vocabulary (not
`<unk>`, not `<eos>`; TFF's Stack Overflow next-word metric of that name): an evaluation
reply's extra, beside `WORD_TARGETS`, the number of such targets per client."""
WORD_TARGETS = "n_word_targets"


@dataclass
class EvaluateReply(Reply):
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

    def empty_reply(self) -> EmbedReply:
        return EmbedReply(_none(), np.zeros((0, int(self.k), int(self.signature_dim))), _none())

    def unit_cost(self) -> tuple[float, float]:
        """Floats down: the encoder (0 for PCA); up: k·e."""
        down = 0 if self.encoder is None else int(self.encoder.numel())
        return float(down), float(self.k * self.signature_dim)


@dataclass
class EmbedReply(Reply):
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
    kind: ClassVar[Kind] = "update"
    trains: ClassVar[bool] = True

    counted_update: ClassVar[bool] = True

    def updates_each(self) -> int:
        """Each client trains the K models: K client updates."""
        return int(self.models.shape[0])

    def empty_reply(self) -> MixtureTrainReply:
        k, d = (int(x) for x in self.models.shape)
        return MixtureTrainReply(_none(), torch.zeros(0, k, d, dtype=self.models.dtype),
                                 _none(), np.zeros(0), np.zeros((0, k)))

    def update_base(self, rows: np.ndarray) -> torch.Tensor:
        """The K models as one K·d row: every client starts from the same ones."""
        return self.models.reshape(1, -1)

    def update_groups(self, rows: np.ndarray) -> np.ndarray:
        return np.zeros(len(rows), dtype=np.int64)  # all clients share the K models

    def unit_cost(self) -> tuple[float, float]:
        kd = int(self.models.numel())
        return float(0 if self.models_held else kd), float(kd)


@dataclass
class MixtureTrainReply(Reply):
    """`params[i]` the K trained models `[K, d]` of client i, `weights[i]` its new π,
    `loss[i]` Σ_k of the K trainings' mean (weighted) batch losses."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    params: torch.Tensor = field(metadata=PER_CLIENT)
    n_samples: np.ndarray = field(metadata=PER_CLIENT)
    loss: np.ndarray = field(metadata=PER_CLIENT)
    weights: np.ndarray = field(metadata=PER_CLIENT)

    def update_rows(self) -> torch.Tensor:
        """Client i's K models as one K·d row."""
        return self.params.reshape(len(self.params), -1)

    def with_update_rows(self, rows: torch.Tensor, n_samples: np.ndarray | None = None) -> Self:
        return replace(self, params=rows.view(self.params.shape),
                       n_samples=_given(n_samples, self.n_samples))


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

    def empty_reply(self) -> MixtureFitReply:
        k = int(self.models.shape[0])
        return MixtureFitReply(_none(), np.zeros((0, k)), np.zeros(0), _none())

    def unit_cost(self) -> tuple[float, float]:
        return float(self.models.numel()), float(self.models.shape[0])


@dataclass
class MixtureFitReply(Reply):
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

    def empty_reply(self) -> BestCountReply:
        k = int(self.models.shape[0])
        return BestCountReply(_none(), np.zeros((0, k), dtype=np.int64), _none())

    def unit_cost(self) -> tuple[float, float]:
        return float(self.models.numel()), float(self.models.shape[0])


@dataclass
class BestCountReply(Reply):
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

    def empty_reply(self) -> SubspaceReply:
        return SubspaceReply(_none(), np.zeros((0, int(self.input_dim), self.columns())),
                             _none(), _none())

    def columns(self) -> int:
        """Basis columns of every reply row: p, or n_labels · p per label."""
        return int(self.p) * (int(self.n_labels) if self.per_label else 1)

    def unit_cost(self) -> tuple[float, float]:
        """Floats down: 0 (the request carries no model); up: e · columns()."""
        return 0.0, float(int(self.input_dim) * self.columns())


@dataclass
class SubspaceReply(Reply):
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


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _given(value: np.ndarray | None, default: np.ndarray) -> np.ndarray:
    return default if value is None else value


MIXTURE_REQUESTS: tuple[type[Asks[Any]], ...] = (MixtureTrainRequest, MixtureFitRequest,
                                                 BestCountRequest)
REQUEST_TYPES: tuple[type[Asks[Any]], ...] = (
    TrainRequest, GradientRequest, LossRequest, EvaluateRequest, EmbedRequest, *MIXTURE_REQUESTS,
    SubspaceRequest)
REPLY_TYPES: tuple[type[Reply], ...] = (
    TrainReply, GradientReply, LossReply, EvaluateReply, EmbedReply, MixtureTrainReply,
    MixtureFitReply, BestCountReply, SubspaceReply)


def empty_reply(request: Asks[RE]) -> RE:
    """A reply with no rows, of the type and widths `request` would get."""
    return request.empty_reply()


class Executor(Protocol):
    """Anything that executes requests (a backend); what the robustness layer drives."""

    def execute(self, request: Asks[RE]) -> RE: ...


def mean_finite(values: np.ndarray | list[float]) -> float | None:
    """Mean of the finite entries (None when there is none, e.g. nobody answered)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None


__all__ = [
    "MIXTURE_REQUESTS",
    "PER_CLIENT",
    "RE",
    "REPLY_TYPES",
    "REQUEST_TYPES",
    "WORD_ACCURACY",
    "WORD_TARGETS",
    "Asks",
    "BestCountReply",
    "BestCountRequest",
    "Combine",
    "EmbedReply",
    "EmbedRequest",
    "EvaluateReply",
    "EvaluateRequest",
    "Executor",
    "GradientReply",
    "GradientRequest",
    "Kind",
    "LocalTraining",
    "LossReply",
    "LossRequest",
    "MixtureFitReply",
    "MixtureFitRequest",
    "MixtureTrainReply",
    "MixtureTrainRequest",
    "Predictor",
    "Reply",
    "Split",
    "SubspaceReply",
    "SubspaceRequest",
    "TrainReply",
    "TrainRequest",
    "client_seed",
    "empty_reply",
    "mean_finite",
    "narrow",
    "reply_width",
]
