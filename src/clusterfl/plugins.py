"""Models, methods and datasets from outside the package: import paths and entry points.

A config names a built-in by its name (`[model] name = "mlp"`); anything else it names in
one of two ways, resolved here for the three kinds (`KINDS`):

- an import path `"package.module:Name"` (`Name` may be dotted: `"pkg.mod:Outer.Inner"`).
  The module is imported the usual way (installed, or on `PYTHONPATH`); the current working
  directory is also searched, as `python -m` does, so a `mynet.py` beside a config is found
  by `clusterfl run` too;
- the name of a Python entry point of the kind's group (`clusterfl.models`,
  `clusterfl.algorithms`, `clusterfl.datasets`): an installed package registers itself with
  `[project.entry-points."clusterfl.algorithms"] mymethod = "mypkg.method:MyMethod"` in its
  pyproject.toml.

The name is kept as written (the import path, or the entry point's name) in the run's
`config.toml`, so `--resume`, `compare`, `report` and other processes (Flower nodes) find
the same object again. Every failure is a `ConfigError` naming the field: a malformed path,
a module that cannot be imported (or raises while importing), a missing attribute.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from clusterfl.errors import ClusterFLError, ConfigError

KINDS = {"model": "clusterfl.models", "algorithm": "clusterfl.algorithms",
         "dataset": "clusterfl.datasets"}
"""Kind → entry-point group."""

IMPORT_HINT = "or an import path 'package.module:Name'"


def is_import_path(name: object) -> bool:
    """Whether `name` is written as an import path (`"pkg.mod:Name"`)."""
    return isinstance(name, str) and ":" in name


def load_object(ref: str, field: str) -> Any:
    """The object an import path `"package.module:Name"` names (ConfigError naming `field`)."""
    module, _, attr = ref.partition(":")
    if not module.strip() or not attr.strip() or ":" in attr:
        raise ConfigError(field, f"{ref!r} is not an import path; write "
                                 "'package.module:Name'")
    mod = _import(module.strip(), field)
    obj: Any = mod
    for part in attr.strip().split("."):
        if not hasattr(obj, part):
            raise ConfigError(field, f"module {module!r} has no attribute {attr!r} "
                                     f"({part!r} is missing)")
        obj = getattr(obj, part)
    return obj


def _import(module: str, field: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # like `python -m`: the current folder
        sys.path.append(cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise ConfigError(field, f"cannot import module {module!r}: not installed and "
                                     f"not on the Python path (nor in the current folder "
                                     f"{cwd}); install it or add its folder to PYTHONPATH") \
                from None
        raise ConfigError(field, f"importing {module!r} failed: {exc}") from None
    except Exception as exc:  # the user's module raised while being imported
        raise ConfigError(field, f"importing {module!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from None


def registered(kind: str) -> dict[str, EntryPoint]:
    """The entry points of `kind`'s group (name → entry point), from installed packages."""
    return {ep.name: ep for ep in entry_points(group=KINDS[kind])}


def resolve(kind: str, name: object, builtins: Iterable[str], field: str) -> Any | None:
    """The object `name` stands for, or None when it is one of `builtins`.

    `name` is an import path or the name of an entry point of `kind`; anything else is a
    `ConfigError` naming `field` and listing what is allowed.
    """
    known = sorted(builtins)
    if isinstance(name, str) and name in known:
        _warn_shadowed(kind, name, field)
        return None
    if is_import_path(name):
        return load_object(str(name), field)
    found = registered(kind) if isinstance(name, str) else {}
    if isinstance(name, str) and name in found:
        _check_unique(kind, name, field)
        ep = found[name]
        try:
            return ep.load()
        except Exception as exc:
            raise ConfigError(field, f"the entry point {name!r} ({ep.value}, group "
                                     f"{KINDS[kind]}) failed to load: "
                                     f"{type(exc).__name__}: {exc}") from None
    names = sorted({*known, *found})
    raise ConfigError(field, f"unknown value {name!r}{_near(name, names)}; allowed: "
                      f"{', '.join(names)}, {IMPORT_HINT}")


def _check_unique(kind: str, name: str, field: str) -> None:
    """ConfigError when installed packages register `name` for `kind` with different targets:
    which one loaded would hang on the order of the Python path."""
    targets = {ep.value: ep for ep in entry_points(group=KINDS[kind]) if ep.name == name}
    if len(targets) > 1:
        listed = "; ".join(f"{value} (package {_package(ep)})" for value, ep in targets.items())
        raise ConfigError(field, f"the entry point {name!r} (group {KINDS[kind]}) is registered "
                                 f"by several installed packages: {listed}; name the one "
                                 "meant by its import path")


def _package(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", None) or "?")


@functools.cache
def _shadowing(kind: str) -> dict[str, str]:
    """Entry points of `kind` named like a built-in (name → their target), read once."""
    return {ep.name: ep.value for ep in entry_points(group=KINDS[kind])}


_WARNED: set[tuple[str, str]] = set()


def _warn_shadowed(kind: str, name: str, field: str) -> None:
    """Say once per process that the built-in `name` hides an installed package's entry point
    of the same name (the built-in wins: a config means the same everywhere)."""
    target = _shadowing(kind).get(name)
    if target is None or (kind, name) in _WARNED:
        return
    _WARNED.add((kind, name))
    print(f"clusterfl: warning: {field}: {name!r} is the built-in; the entry point {name!r} "
          f"of an installed package ({target}, group {KINDS[kind]}) is not used: name it "
          f"by its import path {target!r} to use it", file=sys.stderr, flush=True)


def _near(name: object, names: list[str]) -> str:
    """A hint for a name that is almost one of `names`: another case ('IFCA'), or an option
    written where a name goes ('averaging=model' after a comma of `--algorithms`)."""
    if not isinstance(name, str):
        return ""
    folded = [n for n in names if n.lower() == name.strip().lower()]
    if folded:
        return f" (names are lower case: {folded[0]!r})"
    if "=" in name:
        return (" (an option? a method's options follow it after ':', e.g. "
                "ifca:n_clusters=4:averaging=model; ',' separates methods)")
    return ""


def describe(obj: Any) -> str:
    """`module:qualname` of an object (for messages)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


class OwnCodeError(ClusterFLError):
    """A model or method of one's own raised during a run (`own_code_error`)."""


def own_code_error(exc: BaseException, objects: dict[str, Any], when: str) -> OwnCodeError | None:
    """One line naming the code of one's own in which `exc` was raised, when its traceback
    passes through the file of one of `objects` (config field → the model class or method
    class that field names); None when it does not (an error of clusterfl, left as it is).
    The deepest such frame is named: the user's line that called into torch, or raised."""
    import inspect
    import traceback

    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return None  # the command's own out-of-memory line says what to change
    files: dict[str, str] = {}
    for field, obj in objects.items():
        try:
            path = inspect.getsourcefile(obj)
        except TypeError:
            path = None
        if path:
            files[os.path.realpath(path)] = field
    if not files:
        return None
    mine = [f for f in traceback.extract_tb(exc.__traceback__)
            if os.path.realpath(f.filename) in files]
    if not mine:
        return None
    frame = mine[-1]
    field = files[os.path.realpath(frame.filename)]
    first = (str(exc).strip().splitlines() or [""])[0]
    return OwnCodeError(f"{field} {describe(objects[field])} raised {type(exc).__name__} "
                        f"{when}: {first} ({os.path.basename(frame.filename)}:{frame.lineno}, "
                        f"in {frame.name})")
