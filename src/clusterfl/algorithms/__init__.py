"""One module per method. `ALGORITHMS` maps config names to the method classes;
`algorithm_class` also finds methods from outside the package (`clusterfl.plugins`)."""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any

import numpy as np

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.cam import IFCACAM, FeSEMCAM
from clusterfl.algorithms.cfl import CFL
from clusterfl.algorithms.cfl_gp import CFLGP
from clusterfl.algorithms.common import AlgorithmConfig, LossExtras
from clusterfl.algorithms.ensemble import FedAvgPlus, FedProxPlus
from clusterfl.algorithms.fedavg import FedAvg, FedProx
from clusterfl.algorithms.fedem import FedEM
from clusterfl.algorithms.fedsoft import FedSoft
from clusterfl.algorithms.fesem import FeSEM
from clusterfl.algorithms.flhc import FLHC
from clusterfl.algorithms.flt import FLT, PCAKMHC
from clusterfl.algorithms.ifca import IFCA
from clusterfl.algorithms.local import Local
from clusterfl.algorithms.pacfl import PACFL
from clusterfl.config_util import parse
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.plugins import describe, resolve

ALGORITHMS: dict[str, type[Algorithm[Any, Any]]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, Local, FedAvgPlus, FedProxPlus, IFCA, FeSEM, IFCACAM,
                FeSEMCAM, CFL, CFLGP, FLT, PCAKMHC, FedEM, FedSoft, PACFL, FLHC)
}


def algorithm_class(name: object, field: str = "algorithm.name") -> type[Algorithm[Any, Any]]:
    """The method class `name` stands for: a built-in, an import path `"pkg.mod:MyMethod"` or
    a `clusterfl.algorithms` entry point; ConfigError naming `field` otherwise (also when the
    object is not an `Algorithm` subclass with a pydantic `Config`)."""
    found = resolve("algorithm", name, ALGORITHMS, field)
    if found is None:
        return ALGORITHMS[str(name)]
    if not (isinstance(found, type) and issubclass(found, Algorithm)):
        raise ConfigError(field, f"{name!r} is {describe(found)}, not a subclass of "
                                 "clusterfl.algorithms.Algorithm")
    config_cls = getattr(found, "Config", None)
    if not (isinstance(config_cls, type) and issubclass(config_cls, AlgorithmConfig)):
        raise ConfigError(field, f"{describe(found)}.Config must be a subclass of "
                                 "clusterfl.algorithms.AlgorithmConfig (its options)")
    missing = set(getattr(found, "__abstractmethods__", ()))
    state = getattr(found, "State", None)
    if found.load_state_dict is Algorithm.load_state_dict and not is_dataclass(state):
        missing.add("State")  # the dataclass checkpoints are restored into
    if missing:
        raise ConfigError(field, f"{describe(found)} does not define "
                                 f"{', '.join(sorted(missing))} (what every "
                                 "clusterfl.algorithms.Algorithm needs; see docs/extending.md)")
    return found


def checked_assignment(algorithm: Algorithm[Any, Any], n_clients: int) -> np.ndarray:
    """`algorithm.assignment()` as int64 ids, one per client; a `ClusterFLError` naming the
    method when it returns another number of ids (or no integer ids)."""
    a = np.asarray(algorithm.assignment())
    whole = a.dtype.kind in "iub" or (a.dtype.kind == "f" and bool(np.all(a == np.round(a))))
    if a.shape != (n_clients,) or not whole:
        what = f"{a.size} ids" if a.ndim == 1 else f"an array of shape {list(a.shape)}"
        what += "" if whole else f" of {a.dtype}"
        raise ClusterFLError(f"{describe(type(algorithm))}.assignment() returned {what} for "
                             f"{n_clients} clients; it must return one integer cluster id per "
                             "client (-1 where none)")
    return a.astype(np.int64, copy=False)


def algorithm_config(raw: dict[str, Any], prefix: str = "algorithm") -> AlgorithmConfig:
    """Validate an `[algorithm]` table with its method's own `Config`.

    A method from outside the package keeps the name it was given (its import path or entry
    point name) in the validated config, so the run's `config.toml` finds it again; its
    `Config` is validated as if `name` were the class's own `name`.
    """
    name = raw.get("name", "fedavg")
    cls = algorithm_class(name, f"{prefix}.name")
    if name in ALGORITHMS:
        return parse(cls.Config, raw, prefix)
    own = getattr(cls, "name", None) or str(name)
    config = parse(cls.Config, {**raw, "name": own}, prefix)
    object.__setattr__(config, "name", str(name))  # the name that finds the class again
    return config


def method_module(name: str) -> str | None:
    """The module (inside `clusterfl.algorithms`) that implements method `name`."""
    cls = ALGORITHMS.get(name)
    return None if cls is None else cls.__module__.rsplit(".", 1)[-1]


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Ask", "Context", "LossExtras",
           "Update", "algorithm_class", "algorithm_config", "checked_assignment",
           "method_module"]
