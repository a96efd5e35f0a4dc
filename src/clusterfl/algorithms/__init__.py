"""One module per method. `ALGORITHMS` maps config names to the method classes;
`algorithm_class` also finds methods from outside the package (`clusterfl.plugins`)."""

from __future__ import annotations

from typing import Any

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context
from clusterfl.algorithms.cam import IFCACAM, FeSEMCAM
from clusterfl.algorithms.cfl import CFL
from clusterfl.algorithms.cfl_gp import CFLGP
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
from clusterfl.errors import ConfigError
from clusterfl.plugins import describe, resolve

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, Local, FedAvgPlus, FedProxPlus, IFCA, FeSEM, IFCACAM,
                FeSEMCAM, CFL, CFLGP, FLT, PCAKMHC, FedEM, FedSoft, PACFL, FLHC)
}


def algorithm_class(name: object, field: str = "algorithm.name") -> type[Algorithm]:
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
    return found


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


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Context", "algorithm_class",
           "algorithm_config", "method_module"]
