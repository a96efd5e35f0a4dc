"""Errors that the CLI turns into one clear message (never a bare traceback)."""

from __future__ import annotations

import errno
from pathlib import Path


class ClusterFLError(Exception):
    """Base of every error clusterfl raises on purpose."""


class ConfigError(ClusterFLError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    `field` is the dotted path of the offending field (e.g. "scenario.n_clients").
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class DataError(ClusterFLError):
    """A dataset file is missing, truncated, corrupted or of the wrong format."""


EXTRAS: dict[str, tuple[str, str]] = {
    "flower": ("flwr", "Flower (`clusterfl flower`, backend 'flower')"),
    "ray": ("flwr[simulation]", "Ray (`clusterfl flower run --mode ray`; `--ray` of sweep, "
            "compare and bench)"),
    "flt": ("umap-learn", "FLT's UMAP step (algorithm.umap = true)"),
    "privacy": ("dp-accounting", "the (ε, δ) accountant of privacy.noise_multiplier > 0"),
    "tensorboard": ("tensorboard", "output.tensorboard = true"),
}
"""The optional extras of `pip install 'clusterfl[...]'`: extra → (what it installs, what
needs it). Without them the core install runs every method (FLT with `umap = false`)."""


NO_SPACE = {errno.ENOSPC: "no space left on {}", errno.EDQUOT: "the disk quota is full on {}",
            errno.EFBIG: "the file-size limit (ulimit -f) was reached on {}"}
"""The errors of a write that ran out of room → their words (`{}`: the file's folder)."""


def write_error(exc: OSError, path: Path, what: str, kept: str) -> ClusterFLError:
    """One line for a write of `path` (`what` it holds) that failed with `exc`: a full disk
    or file-size limit (`NO_SPACE`), a file where a folder belongs, or another OS error
    (its words), then `kept`: what is intact and how the run can go on."""
    if exc.errno in NO_SPACE:
        why = NO_SPACE[exc.errno].format(path.parent)
    elif exc.errno in (errno.EEXIST, errno.ENOTDIR):
        why = f"{exc.filename or path.parent} is a file where a folder belongs"
    else:
        why = f"{exc.strerror or exc}"
    return ClusterFLError(f"{why}: cannot write {path} ({what}); {kept}")


class MissingExtraError(ClusterFLError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, missing: str) -> None:
        self.extra, self.missing = extra, missing.split(".")[0]
        package, feature = EXTRAS[extra]
        super().__init__(f"{feature} needs {package} (no module named {self.missing!r}): "
                         f"pip install 'clusterfl[{extra}]'")


def require(extra: str, module: str, load: bool = True) -> None:
    """Import `module` (`load=False`: only find it, for a package used by a subprocess or
    imported later), or raise `MissingExtraError` naming `extra`. Call it before every import of
    an optional package, then import as usual (the module is already loaded)."""
    import importlib
    import importlib.util

    try:
        if load:
            importlib.import_module(module)
            return
        if importlib.util.find_spec(module) is not None:
            return
        missing = module
    except ModuleNotFoundError as exc:
        missing = exc.name or module
    raise MissingExtraError(extra, missing)
