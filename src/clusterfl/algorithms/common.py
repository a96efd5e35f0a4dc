"""What the methods share besides the driver (`clusterfl.algorithms.base`): the config bases
(`AlgorithmConfig`, `SampledConfig`), the `Placement` of clients that did not train, the
common extras (`LossExtras`, `KClusterExtras`) and small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from clusterfl.errors import ConfigError
from clusterfl.protocol import Predictor
from clusterfl.records import RoundExtras


class AlgorithmConfig(BaseModel):
    """Settings shared by convention (each method adds its own fields)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    #: the method's name in tables, figures and reports (each method's Config sets its own)
    display: ClassVar[str] = ""
    #: options that only say where files are: left out of labels and folder names
    locations: ClassVar[frozenset[str]] = frozenset()
    name: str


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

    def expected_fraction(self, n_clients: int) -> float:
        """The share of the `n_clients` sampled each round (privacy accounting, reports)."""
        if self.per_round is not None:
            return min(1.0, self.per_round / max(1, n_clients))
        return max(self.fraction, 1.0 / max(1, n_clients))


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


def check_k_fits(k: int, n_clients: int, field: str = "algorithm.n_clusters") -> None:
    """K cluster models need at least K clients: a `ConfigError` naming `field` otherwise."""
    if k > n_clients:
        raise ConfigError(field, f"K = {k} cluster models need at least {k} clients, the "
                                 f"federation has {n_clients}; allowed: 1..{n_clients}")
