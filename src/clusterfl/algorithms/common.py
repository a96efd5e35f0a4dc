"""What the methods share besides the driver (`clusterfl.algorithms.base`): the config bases
(`AlgorithmConfig`, `SampledConfig`), the `Placement` of clients that did not train, the
common extras (`LossExtras`, `KClusterExtras`), the compact table of per-client models
(`ClientModels`) and small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from clusterfl.config_util import Settings, changed_fields
from clusterfl.engine.allocator import lazy_rows
from clusterfl.errors import ConfigError
from clusterfl.protocol import Predictor
from clusterfl.records import RoundExtras


class AlgorithmConfig(Settings):
    """Settings shared by convention (each method adds its own fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    #: the method's name in tables, figures and reports (each method's Config sets its own)
    display: ClassVar[str] = ""
    #: options that only say where files are: left out of labels and folder names
    locations: ClassVar[frozenset[str]] = frozenset()
    #: whether the method sends the clients' updates to the server (Local does not: nothing
    #: for [privacy] to protect)
    shares_updates: ClassVar[bool] = True
    #: whether the method averages exactly the clients that started from one model row of a
    #: request (the noise groups of `[privacy] noise = "aggregate"`); FeSEM regroups them by
    #: k-means after training, so the reported ε needs `noise = "local"` there
    averages_noise_groups: ClassVar[bool] = True
    #: what the method's clustering receives from every client beside its updates, derived
    #: from its data and neither clipped nor noised by `[privacy]` (a run warns: its ε does
    #: not cover it); "" when nothing
    unnoised_signatures: ClassVar[str] = ""
    name: str

    def ignored_settings(self) -> list[str]:
        """One line for each option set away from its default that the chosen variant never
        reads (the run goes on; `Experiment` warns on the console and in the report)."""
        return []

    def sample_counts(self) -> dict[str, tuple[int, str]]:
        """Options that count a client's training samples, set: name → (value, what a value
        above every client's count does). `Experiment` warns when one is more than any
        client holds (as it does for `train.batch_size`)."""
        return {}

    def partial_round_settings(self) -> list[str]:
        """The options set away from their defaults that act only in a round in which some
        of the clients asked did not answer (`name = value`, e.g. CFL's
        `algorithm.auto.significance_sampled = 0.05`): `Experiment`, which also knows
        `[faults]`, warns when no round of the run can be such a round."""
        return []


class SampledConfig(AlgorithmConfig):
    """A method that trains a sample of the clients each round: `fraction` of them (at least
    one), or a fixed number `per_round`. One meaning in every method (`Context.sample_round`);
    set one of the two, not both."""

    fraction: float = Field(1.0, gt=0.0, le=1.0, description="share of the clients sampled "
                            "each round (at least one)")
    per_round: int | None = Field(None, ge=1, description="a fixed number of clients sampled "
                                  "each round (instead of fraction; all when larger)")

    @model_validator(mode="after")
    def _one_sampling_rule(self) -> SampledConfig:
        if self.per_round is not None and "fraction" in self.model_fields_set:
            raise ValueError("set algorithm.fraction or algorithm.per_round, not both")
        return self

    @model_serializer(mode="wrap")
    def _dump_one_rule(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A dump (the run's resolved `config.toml`, `config show`) holds only the rule in
        force: without `fraction` when `per_round` is set, so that it loads again."""
        data = handler(self)
        if self.per_round is not None and isinstance(data, dict):
            data.pop("fraction", None)
        return data

    def per_round_count(self, n_clients: int) -> int:
        """How many of `n_clients` answer a round when none drops out (`Context.sample_round`)."""
        if self.per_round is not None:
            return min(self.per_round, n_clients)
        return n_clients if self.fraction >= 1.0 else max(1, round(self.fraction * n_clients))

    def sampling_warnings(self, n_clients: int) -> list[str]:
        """A `per_round` above the `n_clients` that train: every client answers each round."""
        if self.per_round is None or self.per_round <= n_clients:
            return []
        return [f"algorithm.per_round = {self.per_round} is more than the {n_clients} clients "
                f"that train: every client is asked every round (as with {n_clients})"]

    def sampling_setting(self) -> str:
        """The sampling rule as written: `algorithm.per_round = 3` or `algorithm.fraction = 0.1`."""
        return (f"algorithm.per_round = {self.per_round}" if self.per_round is not None
                else f"algorithm.fraction = {self.fraction:g}")

    def expected_fraction(self, n_clients: int) -> float:
        """The share of the `n_clients` sampled each round (privacy accounting, reports): the
        count `per_round_count` samples, so a fraction that rounds up or down counts as the
        clients it asks (0.2 of 8 clients asks 2: 0.25)."""
        return self.per_round_count(max(1, n_clients)) / max(1, n_clients)


@dataclass
class Placement:
    """Where `Algorithm.placement` put clients that did not train (newcomers, held-out ones).

    `clients` are ids in the federation of the placing context's backend, in the order asked;
    `clusters[i]` is client i's cluster id in the id space of `Algorithm.assignment()` (-1: none,
    e.g. it did not answer); `predictor` serves exactly these clients (its `members` has one
    row per placed client, in the same order), so `EvaluateRequest(clients, predictor)` scores
    them with the models they were placed on. `details` (optional, JSON-ready, one dict per
    client) is what the method wants to show about each decision (CFL: the tree path).
    """

    clients: np.ndarray
    clusters: np.ndarray
    predictor: Predictor
    details: list[dict[str, Any]] | None = None

    @classmethod
    def by_cluster(cls, clients: np.ndarray, clusters: np.ndarray, models: Any,
                   details: list[dict[str, Any]] | None = None) -> Placement:
        """Each client on its cluster's row of `models` (row 0 for one placed nowhere, -1)."""
        return cls(clients, clusters, Predictor.single(models, np.maximum(clusters, 0)), details)

    @classmethod
    def nowhere(cls, clients: np.ndarray, model: Any) -> Placement:
        """No client in a cluster (-1), each predicting with the one `model` (`[1, d]`)."""
        n = len(clients)
        return cls(clients, np.full(n, -1, np.int64),
                   Predictor.single(model, np.zeros(n, np.int64)))


def answered(asked: np.ndarray, reply_clients: np.ndarray, values: np.ndarray,
             fill: Any = -1) -> np.ndarray:
    """One entry per client of `asked`: its row of `values` (the rows of `reply_clients`, in
    reply order) where it answered, `fill` where it did not (dropped out or rejected)."""
    asked = np.asarray(asked, dtype=np.int64)
    vals = np.asarray(values)
    out = np.full((len(asked), *vals.shape[1:]), fill, dtype=vals.dtype if len(vals) else
                  np.asarray(fill).dtype)
    where = {int(c): i for i, c in enumerate(asked.tolist())}
    for row, c in enumerate(np.asarray(reply_clients, dtype=np.int64).tolist()):
        out[where[int(c)]] = vals[row]
    return out


@dataclass(kw_only=True)
class LossExtras(RoundExtras):
    """The extras of a method whose rounds report only the clients' mean local loss."""

    train_loss: float | None = None  # mean local loss of the answering clients


@dataclass(kw_only=True)
class KClusterExtras(RoundExtras):
    """What IFCA, FeSEM, IFCA-CAM and FeSEM-CAM write in every round (their extras classes
    extend it), so that one reader serves all four (`clusterfl.report.methods.cam`)."""

    #: clients assigned to each of the K clusters after the round
    cluster_sizes: list[int] = field(default_factory=list)
    warmup: int = 0  # 1 in a warm-up round (before the clustering starts), else 0


def check_warmup_leaves_rounds(warmup: int, rounds: int | None, alone: str,
                               clusters_in_last: bool = False) -> None:
    """A warm-up of `warmup` rounds must leave the run of `rounds` (None: unknown, not
    checked) a round that clusters (the last warm-up round itself where `clusters_in_last`,
    as FeSEM's first k-means ends it); otherwise the run would be `alone` under the method's
    name: a `ConfigError` naming `algorithm.warmup_rounds`."""
    most = None if rounds is None else rounds - (0 if clusters_in_last else 1)
    if most is not None and warmup > most:
        raise ConfigError("algorithm.warmup_rounds", f"{warmup} warm-up rounds leave no round "
                          f"to cluster in a run of {rounds} rounds (it would be {alone}); "
                          f"allowed: 0..{most}, or more rounds")


def too_few_per_round(config: SampledConfig, n_clients: int, need: int,
                      setting: str = "", allowed: str = "") -> list[str]:
    """The warning when the sampling rule gives a round fewer clients than the `need` of one
    cluster that must answer in the same round for it to split (CFL), or, with `setting`
    (which sets `need`), when the whole federation has fewer (but a pair, which splits as
    one); else none."""
    k, words = config.per_round_count(n_clients), f"a cluster splits only when at least {need}"
    if k < min(need, n_clients):
        return [f"{config.sampling_setting()}: {k} of {n_clients} clients answer a round, and "
                f"{words} of its clients answer in the same round: the run will never split "
                "(it is FedAvg)"]
    return [f"{setting}: {words} of its clients answer in the same round, and the federation "
            f"has {n_clients}: the run will never split (it is FedAvg); allowed: {allowed}"
            ] if setting and 2 < n_clients < need else []


def one_cluster_ignores(config: AlgorithmConfig, names: tuple[str, ...], k: str = "n_clusters",
                        what: str = "one cluster model, which every client joins") -> list[str]:
    """The options among `names` that `config` sets away from their defaults while its
    `k` is 1 (`what` there is), where they choose between clusters that are not there: one
    line each for `ignored_settings` (the run goes on, as FedAvg under the method's name)."""
    if getattr(config, k) != 1:
        return []
    return [f"algorithm.{o} = {getattr(config, o)!r} does nothing: algorithm.{k} = 1 ({what})"
            for o in changed_fields(config, *names)]


def check_k_fits(k: int, n_clients: int, field: str = "algorithm.n_clusters",
                 what: str = "K = {k} cluster models") -> None:
    """K cluster models (FedEM: M components, `what`) need at least K clients: a
    `ConfigError` naming `field` otherwise."""
    if k > n_clients:
        raise ConfigError(field, f"{what.format(k=k)} need at least {k} clients, the "
                                 f"federation has {n_clients}; allowed: 1..{n_clients}")


@dataclass
class ClientModels:
    """A model per client, kept so that memory grows with the clients that trained (Local's
    and FedSoft's personal models): row 0 of `models` is the common start, the model of
    every client that has not trained yet; each client that trained has a row of its own,
    numbered in the order they first trained.

    `put` writes the rows of the clients that trained **in place**: only the rows that
    change are written, the table is not copied. The rows live in room for every client
    made once (`engine.allocator.lazy_rows`: memory only for the rows written) and `models`
    is the view of the rows in use, so a checkpoint (`state.snapshot`) copies those only.
    Because of the writes in place, a state holding a `ClientModels` is not kept by its
    method once `put` made the next one (`Algorithm.update`). A table read from a
    checkpoint is copied into new room at its first `put`.
    """

    #: row 0 the common start, then one row per client trained (`[1 + trained, d]`)
    models: torch.Tensor
    #: `[n_clients]`, client i's row of `models` (None: row i, a table of every client's,
    #: as Local's checkpoints of before)
    row_of: np.ndarray | None = None

    @classmethod
    def start(cls, model: torch.Tensor, n_clients: int) -> ClientModels:
        """Every client at the one start `model` (`[d]`)."""
        return cls(model[None].clone(), np.zeros(n_clients, dtype=np.int64))

    def rows(self) -> np.ndarray:
        """Client i's row of `models`, for every client."""
        return np.arange(len(self.models)) if self.row_of is None else self.row_of

    def of(self, clients: np.ndarray) -> torch.Tensor:
        """The models of `clients` (`[len(clients), d]`, a copy)."""
        return self.models[torch.from_numpy(self.rows()[np.asarray(clients, np.int64)])]

    def put(self, clients: np.ndarray, params: torch.Tensor) -> ClientModels:
        """The table with the models of `clients` replaced by `params` (row j: client j's),
        each client that trained for the first time given a new row; written in place."""
        clients = np.asarray(clients, dtype=np.int64)
        used, row_of = len(self.models), self.rows().copy()
        new = np.zeros(0, dtype=np.int64)
        if self.row_of is not None:  # (a table of every client's has a row for each)
            new = np.unique(clients[row_of[clients] == 0])  # trained for the first time
            row_of[new] = used + np.arange(len(new))
        room = self._room(used + len(new), len(row_of) + 1)
        models = room[:used + len(new)]
        models[torch.from_numpy(row_of[clients])] = params.to(models.device, models.dtype)
        out = ClientModels(models, None if self.row_of is None else row_of)
        object.__setattr__(out, "_spare", room)
        return out

    def _room(self, rows: int, most: int) -> torch.Tensor:
        """A `[≥ rows, d]` buffer whose first rows are `models`: this table's own when it
        has the room, else new room (for `most` rows: every client and the start, taken
        from the system only where written; where none can be had, twice the rows needed)
        with `models` copied in. A table of every client's (`row_of` None) is copied."""
        spare: torch.Tensor | None = getattr(self, "_spare", None)
        if (spare is not None and len(spare) >= rows
                and spare.data_ptr() == self.models.data_ptr()):
            return spare
        if self.row_of is None:  # a table of every client's: no row is added
            return self.models.clone()
        room = lazy_rows(max(most, rows), self.models.shape[1], self.models.dtype)
        if room is None:
            room = self.models.new_empty(max(rows, 2 * len(self.models)),
                                         self.models.shape[1])
        room[:len(self.models)] = self.models
        return room

    def members(self) -> tuple[torch.Tensor, np.ndarray]:
        """The rows in use (the start only while a client has not trained), numbered in row
        order, and each client's number: what a predictor of every client's own model needs
        (no copy when every row is in use)."""
        used, model_of = np.unique(self.rows(), return_inverse=True)
        models = self.models
        if len(used) < len(models):
            models = models[torch.from_numpy(used)]
        return models, model_of.astype(np.int64)
