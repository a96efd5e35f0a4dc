"""The backend seam: something that executes protocol requests for many clients."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from clusterfl.data.federation import Federation
from clusterfl.models import ModelFactory
from clusterfl.protocol import (
    EvaluateReply,
    EvaluateRequest,
    GradientReply,
    GradientRequest,
    LossReply,
    LossRequest,
    Reply,
    Request,
    TrainReply,
    TrainRequest,
)


class Backend(ABC):
    """Executes requests. In simulation it holds the federation; on Flower, the clients do."""

    def __init__(self, federation: Federation, factory: ModelFactory) -> None:
        self.federation = federation
        self.factory = factory

    def execute(self, request: Request) -> Reply:
        if isinstance(request, TrainRequest):
            return self.train(request)
        if isinstance(request, GradientRequest):
            return self.gradient(request)
        if isinstance(request, LossRequest):
            return self.losses(request)
        if isinstance(request, EvaluateRequest):
            return self.evaluate(request)
        raise TypeError(f"unknown request type {type(request).__name__}")

    @abstractmethod
    def train(self, req: TrainRequest) -> TrainReply: ...

    @abstractmethod
    def gradient(self, req: GradientRequest) -> GradientReply: ...

    @abstractmethod
    def losses(self, req: LossRequest) -> LossReply: ...

    @abstractmethod
    def evaluate(self, req: EvaluateRequest) -> EvaluateReply: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, connections)."""


def as_index(clients: np.ndarray) -> np.ndarray:
    return np.asarray(clients, dtype=np.int64)


def seeded(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g
