"""The ClientApp for in-process use (Flower's Ray simulation, `flwr.simulation`).

The implementation lives in the Flower App shipped to SuperNodes,
`app/clusterfl_app/client.py` (it must import nothing heavy, see there); this module loads
that same file so both paths run identical code. Under Ray the actors are long-lived, so the
ClientApp answers in-process (`node.handle_raw`) instead of through a node worker.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

_FILE = Path(__file__).parent / "app" / "clusterfl_app" / "client.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clusterfl_flower_app_client", _FILE)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with us
        raise ImportError(f"cannot load {_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


app = _load().app
"""The `flwr.clientapp.ClientApp`."""
