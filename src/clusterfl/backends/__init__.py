"""Backends execute protocol requests: `sequential` (reference loop), `simulation` (vectorized)."""

from __future__ import annotations

from clusterfl.backends.base import Backend
from clusterfl.backends.flower.backend import FlowerBackend  # imports flwr only when used
from clusterfl.backends.flower.standard import StandardBackend  # standard ClientApps
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend

BACKENDS: dict[str, type[Backend]] = {
    "simulation": SimulationBackend,
    "sequential": SequentialBackend,
    "flower": FlowerBackend,
    "flower_standard": StandardBackend,
}

__all__ = ["BACKENDS", "Backend", "SequentialBackend", "SimulationBackend"]
