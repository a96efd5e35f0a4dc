"""What the methods that cluster once (FL+HC, PACFL, FLT, PCA+kM+HC) share: the cut of the
clients that answered with every absent client its own cluster, a threshold that a TOML file
can switch off (`threshold = "none"`), the automatic cut when neither a threshold nor a number
of clusters is set (`auto_cut`: the silhouette cut, scale-free, one cluster when no cut shows
structure; or the largest gap of merge heights, which always cuts), and the request of the
one-off step with the time it was asked (the step's wall time is reported in the round's
extras).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field

from clusterfl.algorithms.base import Ask
from clusterfl.clustering.hierarchical import MIN_SILHOUETTE, flat_clusters, silhouette_cut
from clusterfl.config_util import changed_fields
from clusterfl.protocol import RE


def _none_word(value: Any) -> Any:
    """TOML has no null: the word "none" (any case) stands for no threshold."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    if isinstance(value, str):
        raise ValueError(f'{value!r}: expected a number > 0 or "none" (no threshold)')
    return value


#: a distance threshold, or None (written `"none"` in TOML and in `--algorithms` specs)
Threshold = Annotated[float | None, BeforeValidator(_none_word)]


def dump_cut(data: Any, threshold: float | None, n_clusters: int | None) -> Any:
    """A config dump that loads again: the threshold left out when `n_clusters` cuts
    instead, and written "none" when there is none (leaving it out would bring back a
    non-None default)."""
    if isinstance(data, dict):
        if n_clusters is not None:
            data.pop("threshold", None)
        elif threshold is None:
            data["threshold"] = "none"
    return data


def own_clusters(labels: np.ndarray, absent: np.ndarray) -> np.ndarray:
    """`labels` with each of the `absent` clients in a new cluster of its own, numbered
    after the others (a copy)."""
    out = np.asarray(labels, dtype=np.int64).copy()
    out[absent] = out.max(initial=-1) + 1 + np.arange(len(absent))
    return out


AutoCut = Literal["silhouette", "gap"]


def auto_cut_field() -> Any:
    """The `auto_cut` setting, one description for every method that has it."""
    return Field("silhouette", description="the cut when neither threshold nor n_clusters "
                 "is set: 'silhouette' (the cut of highest mean silhouette, one cluster when "
                 "it is below min_silhouette) or 'gap' (the largest gap of merge heights, "
                 "which always cuts)")


def ignored_cut_options(config: Any, names: tuple[str, ...]) -> list[str]:
    """The options of the automatic cut among `names` that `config` sets away from their
    defaults while `threshold` or `n_clusters` decides the cut instead (they do nothing)."""
    fixed = "threshold" if config.threshold is not None else \
        "n_clusters" if config.n_clusters is not None else None
    if fixed is None:
        return []
    return [f"algorithm.{o} = {getattr(config, o)!r} does nothing: algorithm.{fixed} = "
            f"{getattr(config, fixed)!r} fixes the cut (the option applies to the automatic "
            "cut only)" for o in changed_fields(config, *names)]


def unbound_max_clusters(config: Any, n_clients: int) -> list[str]:
    """The line for a `max_clusters` of at least the `n_clients` that train, where the cut
    reads it (`ignored_settings` names it otherwise): a cut of at most `n_clients` clients
    has at most that many clusters, so the bound never binds (for `Algorithm.check`)."""
    bound = config.max_clusters
    if bound is None or bound < n_clients or any(
            w.startswith("algorithm.max_clusters = ") for w in config.ignored_settings()):
        return []
    return [f"algorithm.max_clusters = {bound} does nothing: the automatic cut of the "
            f"{n_clients} clients that train has at most {n_clients} clusters"]


def max_clusters_field(description: str) -> Any:
    """The `max_clusters` bound on the automatic C: at least 2, since a bound of 1 would put
    every client into one cluster whatever the cut finds (`n_clusters = 1` says that)."""
    return Field(None, ge=2, description=f"{description}; at least 2 (n_clusters = 1 for one "
                 "cluster)")


def significance_field(description: str) -> Any:
    """A `significance` setting of the shuffle test deciding a cut (FL+HC's, FLT's): 0.002,
    the level of CFL's test where every client answered; 0 turns the test off."""
    return Field(0.002, ge=0.0, lt=1.0, description=description)


def min_silhouette_field() -> Any:
    """The `min_silhouette` setting (`MIN_SILHOUETTE`, Kaufman & Rousseeuw's bound)."""
    return Field(MIN_SILHOUETTE, ge=-1.0, le=1.0, description="mean silhouette a cut needs "
                 "to count as structure (auto_cut 'silhouette'; at or below 0.25 Kaufman & "
                 "Rousseeuw find 'no substantial structure')")


@dataclass(frozen=True)
class Cut:
    """Every client's cluster, and the silhouette of the automatic cut (None otherwise)."""

    labels: np.ndarray
    silhouette: float | None = None  # best mean silhouette over the cuts tried
    silhouette_c: int | None = None  # the C of that best score (cut or not, as the bound says)


def cut_clients(z: np.ndarray, n: int, good: np.ndarray, threshold: float | None,
                n_clusters: int | None, max_clusters: int | None,
                auto_cut: AutoCut = "gap", distances: np.ndarray | None = None,
                min_silhouette: float = MIN_SILHOUETTE,
                structured: Callable[[np.ndarray, float], bool] | None = None) -> Cut:
    """The cluster of each of `n` clients: the clients `good` (in linkage `z`'s order) cut
    at `threshold`, into `n_clusters` (lowered to the clients that answered), or else by
    `auto_cut`: the silhouette cut under `distances` (`[len(good)]²`, `silhouette_cut`) or
    the largest gap (`flat_clusters`), with `structured` deciding instead of the bound
    `min_silhouette` (`silhouette_cut`); every other client its own cluster."""
    good = np.asarray(good, dtype=np.int64)
    k = None if n_clusters is None else max(1, min(n_clusters, len(good)))
    labels = np.full(n, -1, dtype=np.int64)
    score = best = None
    if threshold is None and k is None and auto_cut == "silhouette":
        if distances is None:
            raise ValueError("auto_cut 'silhouette' needs the clients' distances")
        cut = silhouette_cut(z, distances, max_clusters, min_silhouette, structured)
        labels[good] = cut.labels
        if cut.scores:
            score, best = max(cut.scores.values()), cut.best
    else:
        labels[good] = flat_clusters(z, len(good), threshold, k, max_clusters)
    return Cut(own_clusters(labels, np.setdiff1d(np.arange(n), good)), score, best)


def lowered_cut(n_clusters: int | None, t: int, asked: int, good: int, what: str,
                absent_own: bool = True) -> tuple[str, ...]:
    """The warning (`Update.warnings`) when a fixed `n_clusters` is more than the `good` of
    the `asked` clients that sent `what` in the clustering round `t`: `cut_clients` lowers C
    to them, so each is a cluster of its own; the others are too (`absent_own`), or are
    placed later (FL+HC after a sample). Nothing when C was kept."""
    if n_clusters is None or good >= n_clusters:
        return ()
    others = asked - good
    if good:
        head = (f"only {good} of the {asked} clients asked in round {t} sent {what} (the "
                "others did not answer or were rejected)")
        cut = f"C was lowered to {good}: each of them is a cluster of its own" + (
            f", as is each of the {others} others ({asked} clusters of one client)"
            if absent_own else f"; the {others} others are placed in a cluster later, as "
            "the clients not asked")
    else:
        head = (f"none of the {asked} clients asked in round {t} sent {what} (they did not "
                "answer or were rejected)")
        cut = (f"each of them is a cluster of its own ({asked} clusters of one client)"
               if absent_own else "nobody was clustered: all are placed in a cluster later, "
               "as the clients not asked")
    return (f"algorithm.n_clusters = {n_clusters}: {head}, so {cut}",)


@dataclass(frozen=True)
class OneOffAsk(Ask[RE]):
    """The request of a one-off step and when it was built (for the step's wall time)."""

    started: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        return round(time.perf_counter() - self.started, 3)


__all__ = ["AutoCut", "Cut", "OneOffAsk", "Threshold", "auto_cut_field", "cut_clients",
           "dump_cut", "lowered_cut", "min_silhouette_field", "own_clusters"]
