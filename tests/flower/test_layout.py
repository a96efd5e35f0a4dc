"""Layering: the backends (`clusterfl/backends/**`) never import the floors above them.

`clusterfl.experiment`, `clusterfl.config`, the CLI modules (`clusterfl.cli*`) and the Flower
deployment (`clusterfl.deploy`) build on the backends; an import the other way, even one
inside a function, would tie a backend to them. Every module is parsed with `ast`, so lazy
imports, relative imports and `importlib.import_module("...")` with a literal name count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "clusterfl"
BACKENDS = PACKAGE / "backends"
FORBIDDEN = ("clusterfl.experiment", "clusterfl.config", "clusterfl.deploy")


def forbidden(module: str) -> bool:
    """True for the modules a backend must not import (and their submodules)."""
    return module.startswith("clusterfl.cli") or any(
        module == f or module.startswith(f + ".") for f in FORBIDDEN)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """`(line, module)` of every import in `source` (the code of `module`), at any depth."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from clusterfl import config` imports the module clusterfl.config
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}")
                                             for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            out.append((node.lineno, node.args[0].value))
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    return [f"{module}:{line} imports {name}"
            for line, name in imported_modules(source, module, is_package) if forbidden(name)]


def test_no_backend_module_imports_experiment_config_cli_or_deploy():
    files = sorted(BACKENDS.rglob("*.py"))
    assert {"base.py", "simulation.py", "sequential.py", "backend.py", "codec.py"} <= {
        f.name for f in files}
    found = [v for f in files
             for v in violations(f.read_text(), module_name(f), f.name == "__init__.py")]
    assert found == [], "backends must not import the floors above them:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "import clusterfl.config",
    "from clusterfl.config import load_config",
    "from clusterfl import experiment",
    "def f():\n    from clusterfl.cli_flower import n_clients_of\n",
    "class A:\n    def f(self):\n        import clusterfl.cli\n",
    "from clusterfl.deploy.server_app import FINAL_STATE",
    "from ...deploy import node",
    "from ... import config",
    "import importlib\nimportlib.import_module('clusterfl.experiment')",
])
def test_the_check_sees_every_kind_of_import(source):
    assert violations(source, "clusterfl.backends.flower.backend")


@pytest.mark.parametrize("source", [
    "from clusterfl.config_util import parse",
    "from clusterfl.backends.base import BackendConfig",
    "from clusterfl.protocol import join, subset",
    "from . import codec",
    "from clusterfl.errors import ConfigError",
])
def test_the_check_allows_the_floors_below(source):
    assert violations(source, "clusterfl.backends.flower.backend") == []
