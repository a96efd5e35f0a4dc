"""One module per method. `ALGORITHMS` maps config names to the method classes."""

from __future__ import annotations

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context
from clusterfl.algorithms.cam import IFCACAM, FeSEMCAM
from clusterfl.algorithms.cfl import CFL
from clusterfl.algorithms.cfl_gp import CFLGP
from clusterfl.algorithms.ensemble import FedAvgPlus, FedProxPlus
from clusterfl.algorithms.fedavg import FedAvg, FedProx
from clusterfl.algorithms.fesem import FeSEM
from clusterfl.algorithms.flhc import FLHC
from clusterfl.algorithms.flt import FLT, PCAKMHC
from clusterfl.algorithms.ifca import IFCA
from clusterfl.algorithms.local import Local
from clusterfl.algorithms.pacfl import PACFL

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (FedAvg, FedProx, Local, FedAvgPlus, FedProxPlus, IFCA, FeSEM, IFCACAM,
                FeSEMCAM, CFL, CFLGP, FLT, PCAKMHC, PACFL, FLHC)
}


def method_module(name: str) -> str | None:
    """The module (inside `clusterfl.algorithms`) that implements method `name`."""
    cls = ALGORITHMS.get(name)
    return None if cls is None else cls.__module__.rsplit(".", 1)[-1]


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Context", "method_module"]
