"""The package's floors: no module imports a module of a higher floor, and no import circle.

Every module under src/clusterfl is read with `ast` (not imported): `import x`, `from x import
y` and relative imports, at module level and inside functions, classes, `if` and `try`
blocks, plus `importlib.import_module("clusterfl....")` with a literal name (an f-string
counts as an import of every module under its literal prefix). An import of `a.b.c` is an edge
to `a.b.c` only: Python also runs the `__init__` of `a` and `a.b`, but a package's `__init__`
is on the floor of its modules, and a package re-exporting its own modules is not a circle.

The floors, lowest first, are described in docs/architecture.md.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "clusterfl"

# The first name under `clusterfl` (a module or a package with everything in it) -> its floor.
# A module may import modules of its own floor or lower ones, never a higher one.
FLOORS: dict[str, int] = {
    # 0 core: errors, small shared helpers, the wire protocol and what it is made of.
    "": 0,  # clusterfl/__init__.py: every import runs it, so it imports nothing of ours
    "errors": 0,
    "config_util": 0,
    "files": 0,  # a lock that names its holder, a write whole or not at all
    "metrics": 0,
    "protocol": 0,
    "records": 0,
    "naming": 0,
    "state": 0,
    "plugins": 0,  # import paths and entry points (imports only errors)
    # 1: data, model definitions and clustering maths.
    "data": 1,
    "models": 1,
    "clustering": 1,
    # 2: computing answers (engine, encoders) and checking/perturbing them (robust).
    "engine": 2,
    "robust": 2,
    "encoders": 2,
    # 3: backends execute requests for the clients.
    "backends": 3,
    # 4: the methods.
    "algorithms": 4,
    # 5 run: configs, experiments, reports, the suite.
    "config": 5,
    "experiment": 5,
    "report": 5,
    "bench": 5,
    "compare": 5,
    "tracking": 5,
    "rundir": 5,  # the run folder: its files, its lock, claiming it
    "checkpoint": 5,
    "recorder": 5,
    "holdout": 5,
    "progress": 5,
    "jobs": 5,  # many runs: here, in worker processes or as Ray tasks (bench and sweeps)
    "stats": 0,  # mean ± interval, paired tests (numpy and scipy only)
    "sweep": 5,
    "sweep_report": 5,
    # 6 interface: command line and deployment (Flower ServerApp / ClientApp / launcher).
    "cli": 6,
    "cli_bench": 6,
    "cli_place": 6,
    "cli_encoder": 6,
    "cli_flower": 6,
    "cli_sweep": 6,
    "cli_util": 6,
    "deploy": 6,
    "flower": 6,  # ClusteredStrategy: the methods over a Grid of standard ClientApps
}

FLOOR_NAMES = {0: "core", 1: "data/models/clustering", 2: "engine/robust/encoders",
               3: "backends", 4: "algorithms", 5: "run", 6: "interface"}

# Imports up a floor that are tolerated for now, as (importer, imported). Each entry must still
# occur (test_known_violations_are_not_stale): whoever removes the import removes its line.
# None today: keep it that way (an entry needs a comment saying why and what removes it).
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    """One edge of the import graph: `source` imports `target` at `path:line`."""

    source: str
    target: str
    path: Path
    line: int
    lazy: bool  # inside a function (runs when called, not when the module is imported)

    def where(self) -> str:
        return f"{self.path}:{self.line}" + (" (inside a function)" if self.lazy else "")


def find_modules(root: Path, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package `__init__`), for every .py file under root."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


class _Collector(ast.NodeVisitor):
    """Every import statement and literal `import_module` call, with whether it is lazy."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.AST, bool]] = []
        self._depth = 0

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "import_module" and node.args:
            self.found.append((node, self._depth > 0))
        self.generic_visit(node)


def _dynamic_name(call: ast.Call) -> tuple[str, bool] | None:
    """(name, is a prefix) of `import_module("a.b")` or `import_module(f"a.b.{x}")`."""
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, False
    if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
            and isinstance(arg.values[0].value, str)):
        return arg.values[0].value, True
    return None


def import_graph(root: Path, package: str = PACKAGE) -> tuple[list[Import], list[str]]:
    """All imports between modules of `package` under `root`, and imports of missing modules."""
    modules = find_modules(root, package)
    edges: list[Import] = []
    missing: list[str] = []

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    for source, (path, is_package) in modules.items():
        collector = _Collector()
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        here = source if is_package else source.rpartition(".")[0]
        rel = path.relative_to(root.parent) if root.parent in path.parents else path

        def add(target: str, node: ast.AST, lazy: bool, *, source: str = source,
                rel: Path = rel) -> None:
            edge = Import(source, target, rel, node.lineno, lazy)
            if target != source and edge not in edges:
                edges.append(edge)

        def lost(name: str, node: ast.AST, *, source: str = source, rel: Path = rel) -> None:
            missing.append(f"{source} imports {name}, which is not a module of the package "
                           f"({rel}:{node.lineno})")

        for node, lazy in collector.found:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if not ours(alias.name):
                        continue
                    if alias.name in modules:
                        add(alias.name, node, lazy)
                    else:
                        lost(alias.name, node)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = here.split(".")
                    if node.level - 1 > len(base_parts) - 1:
                        lost("." * node.level + (node.module or ""), node)
                        continue
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if not ours(base):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        add(sub, node, lazy)
                    elif base in modules and modules[base][1]:
                        add(base, node, lazy)  # a name from a package's __init__
                    elif base in modules:
                        add(base, node, lazy)
                    else:
                        lost(base, node)
            else:
                assert isinstance(node, ast.Call)
                dynamic = _dynamic_name(node)
                if dynamic is None or not ours(dynamic[0]):
                    continue
                name, prefix = dynamic
                targets = ([m for m in modules if m.startswith(name)] if prefix
                           else [name] if name in modules else [])
                if not targets:
                    lost(name + ("*" if prefix else ""), node)
                for target in targets:
                    add(target, node, lazy)
    return edges, missing


def floor_key(module: str, package: str = PACKAGE) -> str:
    """The FLOORS key of a module: the first name under the package ('' for the package)."""
    rest = module[len(package):].lstrip(".")
    return rest.split(".")[0]


def floor_of(module: str, floors: dict[str, int] = FLOORS) -> int | None:
    return floors.get(floor_key(module))


def upward_imports(edges: Iterable[Import], floors: dict[str, int] = FLOORS) -> list[Import]:
    """The imports whose target is on a higher floor than their source."""
    out = []
    for e in edges:
        src, dst = floors.get(floor_key(e.source)), floors.get(floor_key(e.target))
        if src is not None and dst is not None and dst > src:
            out.append(e)
    return out


def import_cycles(edges: Iterable[Import]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), as a closed path."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, group) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest closed path inside `group`, from its smallest member back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


@pytest.fixture(scope="module")
def graph() -> tuple[list[Import], list[str]]:
    return import_graph(SRC)


def test_every_module_has_a_floor() -> None:
    unassigned = [
        f"{name} ({path.relative_to(SRC.parent)})"
        for name, (path, _) in find_modules(SRC).items() if floor_of(name) is None
    ]
    assert not unassigned, (
        "modules without a floor: " + ", ".join(unassigned) + ". Add their first name under "
        "clusterfl (e.g. 'records' for clusterfl/records.py, 'deploy' for clusterfl/deploy/) "
        "to FLOORS in tests/core/test_layers.py, and to the floor table of docs/architecture.md."
    )


def test_imports_name_modules_that_exist(graph: tuple[list[Import], list[str]]) -> None:
    _, missing = graph
    assert not missing, "\n".join(missing)


def test_no_import_up_a_floor(graph: tuple[list[Import], list[str]]) -> None:
    edges, _ = graph
    bad = [e for e in upward_imports(edges) if (e.source, e.target) not in KNOWN_VIOLATIONS]
    lines = [
        f"{e.source} (floor {floor_of(e.source)} {FLOOR_NAMES[floor_of(e.source)]}) imports "
        f"{e.target} (floor {floor_of(e.target)} {FLOOR_NAMES[floor_of(e.target)]}) at "
        f"{e.where()}"
        for e in bad
    ]
    assert not lines, "imports up a floor (see docs/architecture.md):\n" + "\n".join(lines)


def test_known_violations_are_not_stale(graph: tuple[list[Import], list[str]]) -> None:
    edges, _ = graph
    upward = {(e.source, e.target) for e in upward_imports(edges)}
    stale = sorted(KNOWN_VIOLATIONS - upward)
    assert not stale, (
        "KNOWN_VIOLATIONS lists imports that no longer go up a floor; remove these entries "
        f"from tests/core/test_layers.py: {stale}"
    )


def test_no_import_cycle(graph: tuple[list[Import], list[str]]) -> None:
    edges, _ = graph
    cycles = import_cycles(edges)
    assert not cycles, "import circles (lazy imports count too):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


# ---------------------------------------------------------------- the checker itself can fail


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "clusterfl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_checker_sees_lazy_relative_and_dynamic_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "data/__init__.py": "from .sources import load\n",
        "data/sources.py": """\
            import clusterfl.errors
            def load():
                from . import download  # lazy, relative
                from ..backends import Backend  # lazy, up two floors (a package's name)
            """,
        "data/download.py": "from clusterfl.data.sources import load\n",
        "backends/__init__.py": "",
        "backends/base.py": """\
            import importlib
            def get(name):
                return importlib.import_module(f"clusterfl.data.{name}")
            """,
        "cli.py": "from clusterfl.missing import thing\n",
    })
    edges, missing = import_graph(root)
    pairs = {(e.source, e.target, e.lazy) for e in edges}
    assert ("clusterfl.data.sources", "clusterfl.data.download", True) in pairs
    assert ("clusterfl.data.sources", "clusterfl.errors", False) in pairs
    assert ("clusterfl.data", "clusterfl.data.sources", False) in pairs
    assert ("clusterfl.backends.base", "clusterfl.data.download", True) in pairs
    up = {(e.source, e.target) for e in upward_imports(edges)}
    assert up == {("clusterfl.data.sources", "clusterfl.backends")}
    cycles = import_cycles(edges)
    assert cycles == [["clusterfl.data.download", "clusterfl.data.sources",
                       "clusterfl.data.download"]]
    assert len(missing) == 1 and "clusterfl.missing" in missing[0]
