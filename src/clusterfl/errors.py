"""Errors that the CLI turns into one clear message (never a bare traceback)."""

from __future__ import annotations


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
