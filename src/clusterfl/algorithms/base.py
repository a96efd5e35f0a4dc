"""The interface every method implements (DESIGN.md §2), and the context it runs in.

An algorithm is server logic only. It reaches clients through `ctx.send(request)`, which
executes the request on the backend and books its communication cost. Each method lives
in its own module with its own pydantic `Config` (no shared flag parser).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from clusterfl.backends.base import Backend
from clusterfl.models import ModelFactory
from clusterfl.protocol import (
    GradientRequest,
    LocalTraining,
    Predictor,
    Reply,
    Request,
    TrainRequest,
)
from clusterfl.robust.guard import Guard
from clusterfl.robust.replies import answered, mark_answered


class AlgorithmConfig(BaseModel):
    """Settings shared by convention (each method adds its own fields)."""

    model_config = ConfigDict(extra="forbid")
    name: str


@dataclass
class Context:
    """What an algorithm may use: clients only through `send`, never their data.

    `rounds` is the run's planned number of rounds T (some methods schedule by it).
    `true_clusters` is given for diagnostics only (e.g. CFL's separation gap); an algorithm
    must never use it to decide anything.
    """

    backend: Backend
    factory: ModelFactory
    training: LocalTraining
    n_clients: int
    train_sizes: np.ndarray
    rng: np.random.Generator
    seed: int
    true_clusters: np.ndarray | None = None
    rounds: int | None = None
    floats_down: float = 0.0
    floats_up: float = 0.0
    log: list[str] = field(default_factory=list)
    guard: Guard | None = None
    #: local trainings and gradients computed by clients so far (answered requests only)
    client_updates: int = 0

    def send(self, request: Request) -> Reply:
        """Execute `request` and book its cost; the reply holds the clients that answered.

        A client that dropped out, missed the deadline or sent a rejected reply is *absent*
        from the reply: its rows are the clients `answered(reply, request.clients)` (from
        `clusterfl.robust.replies`), in request order. With a `guard` (`clusterfl.robust`:
        faults, adversaries, validation, privacy) the request runs through it; without one
        the backend's reply is returned as is (a backend may still mark fewer clients).
        """
        if self.guard is not None:
            reply, down, up = self.guard.send(self.backend, request)
        else:
            down, up = request.cost()
            reply = self.backend.execute(request)
            mark_answered(reply, answered(reply, request.clients))
        self.floats_down += down
        self.floats_up += up
        if isinstance(request, TrainRequest | GradientRequest):
            self.client_updates += len(answered(reply, request.clients))
        return reply

    def next_seed(self) -> int:
        """A fresh request seed from the run's (checkpointed) generator."""
        return int(self.rng.integers(0, 2**31 - 1))

    def sample(self, fraction: float, among: np.ndarray | None = None) -> np.ndarray:
        """A sorted random subset of clients (at least one) of the given fraction."""
        pool = np.arange(self.n_clients) if among is None else np.asarray(among)
        if fraction >= 1.0:
            return pool.copy()
        k = max(1, round(fraction * len(pool)))
        return np.sort(self.rng.choice(pool, size=k, replace=False))


class Algorithm(ABC):
    """One federated method. Subclasses set `name`, `Config`, and implement the hooks."""

    name: ClassVar[str]
    Config: ClassVar[type[AlgorithmConfig]]

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config

    @abstractmethod
    def setup(self, ctx: Context) -> None:
        """Create the initial state (models, assignments)."""

    @abstractmethod
    def run_round(self, ctx: Context, t: int) -> dict[str, Any]:
        """One communication round; returns algorithm-specific extras for the history."""

    @abstractmethod
    def assignment(self) -> np.ndarray:
        """Cluster (or model) id of every client; -1 where none."""

    @abstractmethod
    def predictor(self) -> Predictor:
        """How each client predicts (the models the method gives every client)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (tensors, arrays, numbers)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def n_clusters(self) -> int:
        a = self.assignment()
        return len(np.unique(a[a >= 0]))

    def label(self) -> str:
        return self.name


def weighted_mean(params: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
    """Σ w_i p_i / Σ w_i over the rows of `params`."""
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=params.dtype)
    return torch.mv(params.t(), w / w.sum())  # one pass over [n, d], no [n, d] temporary


def average_per_group(
    models: torch.Tensor, params: torch.Tensor, groups: np.ndarray, weights: np.ndarray
) -> torch.Tensor:
    """New `[K, d]` models: each row the weighted mean of its members' params (kept if none)."""
    out = models.clone()
    for k in np.unique(groups):
        sel = groups == k
        out[int(k)] = weighted_mean(params[torch.from_numpy(sel)], weights[sel])
    return out
