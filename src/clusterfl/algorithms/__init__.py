"""One module per method. `ALGORITHMS` maps config names to the classes that are installed.

The registry is lazy: each entry names `module:Class`; entries whose module is not present
are left out, so a method lands by adding its module (and its line here).
"""

from __future__ import annotations

import importlib

from clusterfl.algorithms.base import Algorithm, AlgorithmConfig, Context

_ENTRIES: dict[str, str] = {
    "fedavg": "fedavg:FedAvg",
    "fedprox": "fedavg:FedProx",
    "local": "local:Local",
    "fedavg_plus": "ensemble:FedAvgPlus",
    "fedprox_plus": "ensemble:FedProxPlus",
    "ifca": "ifca:IFCA",
    "fesem": "fesem:FeSEM",
    "ifca_cam": "cam:IFCACAM",
    "fesem_cam": "cam:FeSEMCAM",
    "cfl": "cfl:CFL",
    "cfl_gp": "cfl_gp:CFLGP",
    "flt": "flt:FLT",
    "pca_km_hc": "flt:PCAKMHC",
}


def _load() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for name, target in _ENTRIES.items():
        module, cls = target.split(":")
        full = f"clusterfl.algorithms.{module}"
        try:
            mod = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name == full:
                continue
            raise
        found[name] = getattr(mod, cls)
    return found


ALGORITHMS: dict[str, type[Algorithm]] = _load()


def method_module(name: str) -> str | None:
    """The module (inside `clusterfl.algorithms`) that implements method `name`."""
    target = _ENTRIES.get(name)
    return None if target is None else target.split(":")[0]

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Context", "method_module"]
