"""Small federations, configs and a tampering backend for the robustness tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from clusterfl.algorithms.base import Context
from clusterfl.backends.base import Backend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import make_federation
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import LocalTraining, Reply, Request, Steps, run_steps
from clusterfl.robust.guard import Guard

SMALL: dict[str, Any] = {
    "seed": 1, "rounds": 6, "eval_every": 2, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 32, "epochs": 1},
    "algorithm": {"name": "fedavg"},
    "output": {"figures": False, "progress": "off"},
}
TRAIN = LocalTraining(lr=0.1, batch_size=32, epochs=1)

# Every method `clusterfl.algorithms.ALGORITHMS` must hold. The registry leaves out a method
# whose module is missing, so the tests assert this list against it rather than filtering
# their cases by it: a missing method fails, it is not quietly skipped.
EXPECTED_METHODS = (
    "fedavg", "fedprox", "local", "fedavg_plus", "fedprox_plus", "ifca", "fesem", "ifca_cam",
    "fesem_cam", "cfl", "cfl_gp", "flt", "pca_km_hc", "fedem", "fedsoft", "pacfl",
    "flhc",
)


def assert_registry_complete(registered: Any) -> None:
    """The registry holds exactly EXPECTED_METHODS (a missing module shows up here by name)."""
    missing = sorted(set(EXPECTED_METHODS) - set(registered))
    unknown = sorted(set(registered) - set(EXPECTED_METHODS))
    assert not missing, f"methods missing from clusterfl.algorithms.ALGORITHMS: {missing}"
    assert not unknown, f"new methods {unknown}: add them to EXPECTED_METHODS and their tests"


def config(**tables: Any) -> dict[str, Any]:
    """SMALL with whole tables (or top-level values) replaced."""
    out = copy.deepcopy(SMALL)
    out.update(copy.deepcopy(tables))
    return out


@pytest.fixture(autouse=True)
def _one_thread(one_thread):  # tests/conftest.py
    yield


@pytest.fixture(scope="session")
def digits() -> Federation:
    return make_federation("digits", "rotation", {"n_clients": 8, "angles": [0, 180]}, seed=1)


def factory_for(fed: Federation) -> ModelFactory:
    return ModelFactory(model_config({"name": "mlp", "hidden": [16]}), fed.input_shape,
                        fed.n_outputs)


class Tamper(Backend):
    """Wraps a backend; `hook(request, reply)` may corrupt the reply before it is returned."""

    def __init__(self, inner: Backend,
                 hook: Callable[[Request, Reply], Reply] | None = None) -> None:
        super().__init__(inner.federation, inner.factory)
        self.inner = inner
        self.hook = hook
        self.seen: list[Request] = []

    def execute(self, request: Request) -> Reply:
        self.seen.append(request)
        if isinstance(request, Steps):  # a round's steps: each one is tampered with alone
            return run_steps(self.execute, request)
        reply = self.inner.execute(request)
        return reply if self.hook is None else self.hook(request, reply)

    def train(self, req):  # pragma: no cover - execute is overridden
        raise NotImplementedError

    gradient = losses = evaluate = train


def make_context(fed: Federation, backend: Backend | None = None, guard: Guard | None = None,
                 seed: int = 0) -> Context:
    f = factory_for(fed)
    be = backend if backend is not None else SimulationBackend(fed, f)
    return Context(be, f, TRAIN, fed.n_clients, fed.train_sizes, np.random.default_rng(seed),
                   seed=seed, true_clusters=fed.clusters, guard=guard)
