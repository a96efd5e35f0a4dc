"""Client failures: dropouts and stragglers, drawn per round (docs/security.md).

- **Dropout**: a client unreachable in round t receives no request of that round and sends
  nothing (it is missing from every reply of the round). Each client drops independently with
  probability `dropout`; `drop_clients` are unreachable in `drop_rounds` (every round if that
  list is empty).
- **Stragglers** (systems heterogeneity, as in FedProx, Li et al. 2020 §5.2): a reachable client
  is a straggler with probability `stragglers`. It finishes `straggler_work` of its local steps
  before the deadline and returns that partial model; with `straggler_work = 0` it misses the
  deadline and its training reply is lost. Gradient and loss queries (one pass, cheap) are
  answered normally.

Who fails in round t depends only on (run seed, t): `numpy.random.default_rng([seed, t, ...])`,
not on the run's generator, so turning faults on does not change any other random choice of
the run, and a resumed run draws the same failures without extra checkpoint state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from clusterfl.protocol import LocalTraining, MixtureTrainRequest, TrainRequest, subset
from clusterfl.robust.config import FaultsConfig

_DROP, _STRAGGLE = 1, 2


@dataclass(frozen=True)
class RoundFaults:
    """The failures of one round: unreachable clients, and the straggler set."""

    dropped: frozenset[int]
    stragglers: frozenset[int]


class FaultPlan:
    """Draws each round's failures from (seed, round)."""

    def __init__(self, config: FaultsConfig, n_clients: int, seed: int) -> None:
        self.config = config
        self.n_clients = n_clients
        self.seed = seed

    @property
    def active(self) -> bool:
        c = self.config
        return bool(c.dropout > 0 or c.drop_clients or c.stragglers > 0)

    def round(self, t: int) -> RoundFaults:
        """Who is unreachable and who straggles in round t."""
        c, n = self.config, self.n_clients
        down = np.zeros(n, dtype=bool)
        if c.dropout > 0:
            down |= np.random.default_rng([self.seed, t, _DROP]).random(n) < c.dropout
        if c.drop_clients and (not c.drop_rounds or t in c.drop_rounds):
            down[np.asarray(c.drop_clients, dtype=np.int64)] = True
        slow = np.zeros(n, dtype=bool)
        if c.stragglers > 0:
            slow = np.random.default_rng([self.seed, t, _STRAGGLE]).random(n) < c.stragglers
            slow &= ~down
        return RoundFaults(frozenset(np.flatnonzero(down).tolist()),
                           frozenset(np.flatnonzero(slow).tolist()))


def partial_steps(training: LocalTraining, n_samples: int, work: float) -> int:
    """Local steps a straggler finishes: `work` × its full number of steps (at least 1).

    The full number is `training.steps`, or epochs × ⌈n_samples / batch_size⌉ in epoch mode.
    """
    full = training.steps if training.steps > 0 else (
        training.epochs * math.ceil(n_samples / training.batch_size))
    return max(1, math.floor(full * work))


TR = TypeVar("TR", bound=TrainRequest | MixtureTrainRequest)


def straggler_requests(request: TR, slow: frozenset[int], work: float,
                       sizes: np.ndarray) -> list[TR]:
    """Split a training request: the punctual clients as asked, each group of stragglers with
    the same reduced step count as one request of its own (`work` > 0). A mixture request's
    straggler trains each of its K models that many steps."""
    clients = np.asarray(request.clients, dtype=np.int64)
    is_slow = np.array([int(c) in slow for c in clients], dtype=bool)
    if not is_slow.any():
        return [request]
    out: list[TR] = []
    if (~is_slow).any():
        out.append(subset(request, np.flatnonzero(~is_slow)))
    steps = np.array([partial_steps(request.training, int(sizes[c]), work) for c in clients])
    for s in np.unique(steps[is_slow]):
        rows = np.flatnonzero(is_slow & (steps == s))
        part = subset(request, rows)
        out.append(replace(part, training=replace(request.training, steps=int(s))))
    return out


__all__ = ["FaultPlan", "RoundFaults", "partial_steps", "straggler_requests"]
