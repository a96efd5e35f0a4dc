"""The backend seam: something that executes protocol requests for many clients.

Each backend has its own pydantic `Config` (the `[backend]` table of a run config, chosen by
`name` like the algorithms' tables) and builds itself from it with `from_config`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Self, cast

import numpy as np
import torch
from pydantic import ConfigDict, Field

from clusterfl import protocol as pr
from clusterfl.config_util import Settings
from clusterfl.data.federation import Federation
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory
from clusterfl.protocol import (
    RE,
    Asks,
    Reply,
    Steps,
    StepsReply,
    client_seed,
    request_name,
    run_steps,
)


class BackendConfig(Settings):
    """Settings every backend accepts (each backend adds its own fields)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    chunk_size: int = Field(64, ge=1, description="used by `simulation` only (clients computed "
                            "together); the other backends accept and ignore it")
    #: why this backend does not read `chunk_size` ("": it does); a value other than the
    #: default (which runs write back) is then a warning
    chunk_unused: ClassVar[str] = ""

    def ignored_settings(self) -> list[str]:
        """One line per setting of this table that the run will not act on as written (the
        run goes on; `Experiment` warns on the console and in the report)."""
        if not self.chunk_unused or \
                self.chunk_size == type(self).model_fields["chunk_size"].default:
            return []
        return [f"backend.chunk_size = {self.chunk_size} does nothing with the {self.name} "
                f"backend ({self.chunk_unused}); it sets the simulation backend's batch of "
                "clients"]


class Backend(ABC):
    """Executes requests. In simulation it holds the federation; on Flower, the clients do.

    A backend listed in `clusterfl.backends.BACKENDS` sets `name`, `Config` (its
    `BackendConfig` subclass) and `from_config`.
    """

    name: ClassVar[str]
    Config: ClassVar[type[BackendConfig]]

    def __init__(self, federation: Federation, factory: ModelFactory) -> None:
        self.federation = federation
        self.factory = factory

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        """The backend for a validated `[backend]` table (`config` is a `cls.Config`)."""
        raise NotImplementedError(f"{cls.__name__} does not say how to build it from a config")

    def execute(self, request: Asks[RE]) -> RE:
        """The reply of the clients that answered (all of them, in simulation). A `Steps`
        runs its steps in order through `execute` itself (`protocol.run_steps`), so each step
        is computed exactly as the separate request (vectorized where that one is)."""
        table = self.handlers()
        for cls in type(request).__mro__:
            if cls in table:
                try:
                    return cast(RE, table[cls](request))
                except torch.OutOfMemoryError:  # the device's memory, not a bug: one line
                    raise self._out_of_memory(request) from None
        raise TypeError(f"unknown request type {type(request).__name__}")

    def _out_of_memory(self, request: Asks[Any]) -> ConfigError:
        device = getattr(self, "device", "the device")
        engine = getattr(self, "engine", None)
        chunk = getattr(engine, "chunk_size", None)
        now = "" if engine is None else f" (now {'auto' if chunk is None else chunk})"
        return ConfigError("backend.chunk_size", f"out of memory on {device} while computing "
                           f"a {request_name(request)} for {len(request.clients)} clients; "
                           f"set a smaller chunk_size{now}, a smaller model or batch_size, "
                           "or device = \"cpu\"")

    def handlers(self) -> dict[type[Any], Callable[[Any], Reply]]:
        """Request type → the bound method that answers it (`execute`'s dispatch table)."""
        return {
            pr.TrainRequest: self.train, pr.GradientRequest: self.gradient,
            pr.LossRequest: self.losses, pr.EvaluateRequest: self.evaluate,
            pr.EmbedRequest: self.embed, pr.SubspaceRequest: self.subspace,
            pr.MixtureTrainRequest: self.mixture_train, pr.MixtureFitRequest: self.mixture_fit,
            pr.BestCountRequest: self.best_counts, Steps: self.steps,
        }

    def steps(self, req: Steps) -> StepsReply:
        """Each step as the request it stands for (`protocol.run_steps`)."""
        return run_steps(self.execute, req)

    @abstractmethod
    def train(self, req: pr.TrainRequest) -> pr.TrainReply: ...

    @abstractmethod
    def gradient(self, req: pr.GradientRequest) -> pr.GradientReply: ...

    @abstractmethod
    def losses(self, req: pr.LossRequest) -> pr.LossReply: ...

    @abstractmethod
    def evaluate(self, req: pr.EvaluateRequest) -> pr.EvaluateReply: ...

    def embed(self, req: pr.EmbedRequest) -> pr.EmbedReply:
        """FLT's one-off client signatures (Alg. 2): `client_signature` for each client.

        A plain loop over the clients' own training data; each client's seed is derived from
        the request seed and its id, so the result does not depend on the backend or order.
        """
        from clusterfl.engine.signatures import client_signature

        fed, clients = self.federation, as_index(req.clients)
        rows = []
        for c in clients:
            x, y = fed.client_train(int(c))
            rows.append(client_signature(x, y, req, client_seed(req.seed, int(c))))
        sigs = np.stack(rows) if rows else np.zeros((0, req.k, req.signature_dim))
        return pr.EmbedReply(clients.copy(), sigs, fed.train_sizes[clients].copy())

    def subspace(self, req: pr.SubspaceRequest) -> pr.SubspaceReply:
        """PACFL's one-off data subspaces: `client_subspace` for each client, a plain loop
        over the clients' own training data (deterministic: no seed, no order effect)."""
        from clusterfl.engine.subspace import client_subspace

        fed, clients = self.federation, as_index(req.clients)
        bases, ranks = [], []
        for c in clients:
            x, y = fed.client_train(int(c))
            basis, rank = client_subspace(x, y, req)
            bases.append(basis)
            ranks.append(rank)
        out = (np.stack(bases) if bases
               else np.zeros((0, int(req.input_dim), req.columns())))
        return pr.SubspaceReply(clients.copy(), out, np.asarray(ranks, dtype=np.int64),
                                fed.train_sizes[clients].copy())
    # mixtures (FedEM, FedSoft): the in-process backends implement them
    def mixture_train(self, req: pr.MixtureTrainRequest) -> pr.MixtureTrainReply:
        raise NotImplementedError(f"{type(self).__name__} cannot run a pr.MixtureTrainRequest")

    def mixture_fit(self, req: pr.MixtureFitRequest) -> pr.MixtureFitReply:
        raise NotImplementedError(f"{type(self).__name__} cannot run a pr.MixtureFitRequest")

    def best_counts(self, req: pr.BestCountRequest) -> pr.BestCountReply:
        raise NotImplementedError(f"{type(self).__name__} cannot run a pr.BestCountRequest")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, connections)."""


class Relay(Backend):
    """A backend whose own `execute` takes whole requests of any type (Flower, a subset of
    another backend): every per-type hook goes through it."""

    @abstractmethod
    def execute(self, request: Asks[RE]) -> RE: ...

    def train(self, req: Any) -> Any:
        return self.execute(req)

    gradient = losses = evaluate = embed = subspace = train


def as_index(clients: np.ndarray) -> np.ndarray:
    """Client ids as an int64 index array."""
    return np.asarray(clients, dtype=np.int64)
