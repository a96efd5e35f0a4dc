"""The files of a run directory as types: one `RoundRecord` per line of `history.jsonl`, one
`RunSummary` in `summary.json`, and the one place that reads them (`read_history`,
`read_summary`). `RoundExtras` is the base of the methods' typed per-round extras.

Every reader (the report, the benchmark suite, the CLI) goes through these types; the JSON
layout lives only in `to_json_dict` / `from_json_dict`. The JSON is the one the experiment
runner has always written: `to_json_dict()` gives the same keys in the same order, and
`from_json_dict(d).to_json_dict() == d` for every record and summary the runner writes, old
files included (they lack the newer optional keys, which then stay absent).

This module is the bottom floor: it imports only the standard library, numpy and
`clusterfl.errors`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Self

import numpy as np

from clusterfl.errors import ClusterFLError, ConfigError

HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"


class RunDirError(ClusterFLError):
    """A directory is not a readable run directory (missing, empty or malformed file)."""


def json_ready(value: Any) -> Any:
    """JSON-safe copy: numpy (and torch) arrays and scalars → Python, NaN/inf → None, tuples →
    lists, dict keys → str."""
    if isinstance(value, dict):
        return {str(k): json_ready(x) for k, x in value.items()}
    if isinstance(value, list | tuple):
        # plain ints or floats (a per-client list of 100,000 clients): one pass, no calls
        if all(type(x) is int for x in value):
            return list(value)
        if all(type(x) is float for x in value):
            return [x if math.isfinite(x) else None for x in value]
        return [json_ready(x) for x in value]
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iu":  # whole numbers: Python ints as they are
            return value.tolist()
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return json_ready(value.item())
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if not isinstance(value, str | int | bool | None) and callable(getattr(value, "tolist", None)):
        return json_ready(value.tolist())  # torch.Tensor (this module does not import torch)
    return value


def _version() -> str:
    from clusterfl import __version__

    return __version__


def _check_keys(d: Mapping[str, Any], required: Iterable[str], optional: Iterable[str],
                what: str) -> None:
    """Raise ValueError naming the missing required keys or the unknown keys of `d`."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(d).__name__}")
    required = tuple(required)
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(map(repr, missing))}")
    known = set(required) | set(optional)
    unknown = [k for k in d if k not in known]
    if unknown:
        raise ValueError(f"{what} has unknown key(s) {', '.join(map(repr, unknown))} (written "
                         f"by another clusterfl than this {_version()}, or edited by hand?)")


# --------------------------------------------------------------------------- metrics


@dataclass(kw_only=True)
class RoundMetrics:
    """Client metrics of an evaluated round (`clusterfl.metrics.summarize`).

    Means over the clients whose value is defined; None when no client has one (e.g. `mse`
    of a classification run, the accuracies of a regression run).
    """

    accuracy: float | None = None
    """Mean client accuracy in 0..1."""
    accuracy_weighted: float | None = None
    """Client accuracy weighted by the clients' test-set sizes."""
    macro_f1: float | None = None
    fairness_var: float | None = None
    """Variance of client accuracy in %²."""
    loss: float | None = None
    mse: float | None = None
    perplexity: float | None = None
    """A language model's perplexity over all clients' test tokens (lower is better;
    `metrics.token_perplexity`); written only when known."""
    accuracy_no_oov_no_eos: float | None = None
    """A language model's accuracy on all clients' test targets other than `<unk>` and
    `<eos>` (`metrics.word_accuracy`); written only when known."""

    KEYS = ("accuracy", "accuracy_weighted", "macro_f1", "fairness_var", "loss", "mse",
            "perplexity", "accuracy_no_oov_no_eos")
    OPTIONAL = ("perplexity", "accuracy_no_oov_no_eos")
    """The keys written only when known (a language model's)."""

    @classmethod
    def check_key(cls, key: object, field: str) -> None:
        """ConfigError naming the argument `field` when `key` is not one of `KEYS`."""
        if key not in cls.KEYS:
            raise ConfigError(field, f"{key!r} is not a round metric; allowed: "
                              f"{', '.join(cls.KEYS)}")

    def to_json_dict(self) -> dict[str, Any]:
        d = {
            "accuracy": self.accuracy, "accuracy_weighted": self.accuracy_weighted,
            "macro_f1": self.macro_f1, "fairness_var": self.fairness_var, "loss": self.loss,
            "mse": self.mse,
        }
        for key in self.OPTIONAL:
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> RoundMetrics:
        required = tuple(k for k in cls.KEYS if k not in cls.OPTIONAL)
        _check_keys(d, required, cls.OPTIONAL, "metrics")
        return cls(
            accuracy=d["accuracy"], accuracy_weighted=d["accuracy_weighted"],
            macro_f1=d["macro_f1"], fairness_var=d["fairness_var"], loss=d["loss"],
            mse=d["mse"], perplexity=d.get("perplexity"),
            accuracy_no_oov_no_eos=d.get("accuracy_no_oov_no_eos"),
        )


# --------------------------------------------------------------------------- extras


@dataclass(kw_only=True)
class RoundExtras:
    """Base of a method's typed per-round extras (`RoundRecord.extras`).

    A method declares, in its own module, a subclass whose fields are exactly the keys it
    writes in (a kind of) round, every field with a default; its `run_round` returns
    `XExtras(...).to_dict()`. Readers (the report, the benchmarks) read a record's extras with
    `XExtras.from_dict(rec.extras).field` instead of string keys. A method whose rounds write
    different key sets (e.g. clustering rounds carry more) declares one subclass per kind of
    round, the larger extending the smaller.
    """

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The keys this class writes: its field names, in field order."""
        return tuple(f.name for f in fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """Every field, in field order (a shallow dict: values are not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Read the declared fields of an extras dict, values as they are (e.g. as in the
        JSON: lists, not arrays). A missing key reads as the field's default; keys the class
        does not declare are ignored (they stay readable in `d`)."""
        return cls(**{k: d[k] for k in cls.field_names() if k in d})

    @classmethod
    def matches(cls, d: Mapping[str, Any]) -> bool:
        """Whether `d` holds every key this class declares (a round of this kind wrote it)."""
        return all(k in d for k in cls.field_names())


# --------------------------------------------------------------------------- one round


@dataclass(kw_only=True)
class RoundRecord:
    """What happened in one round: a line of `history.jsonl`.

    Built by `Experiment._record` with JSON-ready values (`cleaned()`). The optional keys
    (`client_updates`, `robust`, `client_macro_f1`, `client_mse`) are written only when not
    None, as the runner always did: `robust` when a robustness option is on or something
    happened, `client_macro_f1` in evaluated rounds, `client_mse` in evaluated rounds of a
    regression run, `client_updates` always (files older than it lack it).
    """

    round: int
    wall_time: float
    """Seconds since the start of the run (resumed runs continue the count)."""
    n_clusters: int
    assignment: list[int]
    """Cluster id of each client (-1: none)."""
    ari: float | None
    """ARI of the assignment against the true clusters (None when they are unknown)."""
    floats_down: float
    """Cumulative floats sent server → clients."""
    floats_up: float
    """Cumulative floats sent clients → server."""
    client_updates: int | None = None
    """Cumulative client updates (local trainings and gradients) computed."""
    metrics: RoundMetrics | None = None
    """None in rounds that were not evaluated."""
    client_accuracy: list[float | None] | None = None
    rejected: int = 0
    """Replies the guard rejected this round."""
    extras: dict[str, Any] = field(default_factory=dict)
    """The algorithm's own per-round values (`Algorithm.run_round`); read them through the
    method's `RoundExtras` subclass (`IFCAExtras.from_dict(rec.extras).cluster_sizes`)."""
    robust: dict[str, Any] | None = None
    """The guard's events of the round (rejected, clipped, dropped, ...)."""
    client_macro_f1: list[float | None] | None = None
    client_mse: list[float | None] | None = None
    participants: int | None = None
    """Clients that answered a training, gradient, loss or embedding request in the round
    (files older than it lack it)."""

    REQUIRED = ("round", "wall_time", "n_clusters", "assignment", "ari", "floats_down",
                "floats_up", "metrics", "client_accuracy", "rejected", "extras")
    OPTIONAL = ("client_updates", "robust", "client_macro_f1", "client_mse", "participants")

    @property
    def evaluated(self) -> bool:
        return self.metrics is not None

    def to_json_dict(self) -> dict[str, Any]:
        """The line of `history.jsonl` (keys in the order the runner has always written)."""
        d: dict[str, Any] = {
            "round": self.round, "wall_time": self.wall_time, "n_clusters": self.n_clusters,
            "assignment": self.assignment, "ari": self.ari, "floats_down": self.floats_down,
            "floats_up": self.floats_up,
        }
        if self.client_updates is not None:
            d["client_updates"] = self.client_updates
        if self.participants is not None:
            d["participants"] = self.participants
        d.update({
            "metrics": None if self.metrics is None else self.metrics.to_json_dict(),
            "client_accuracy": self.client_accuracy, "rejected": self.rejected,
            "extras": self.extras,
        })
        for key, value in (("robust", self.robust), ("client_macro_f1", self.client_macro_f1),
                           ("client_mse", self.client_mse)):
            if value is not None:
                d[key] = value
        return d

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> RoundRecord:
        """Read a line of `history.jsonl`; ValueError on missing or unknown keys."""
        _check_keys(d, cls.REQUIRED, cls.OPTIONAL, "a history record")
        m = d["metrics"]
        return cls(
            round=d["round"], wall_time=d["wall_time"], n_clusters=d["n_clusters"],
            assignment=d["assignment"], ari=d["ari"], floats_down=d["floats_down"],
            floats_up=d["floats_up"], client_updates=d.get("client_updates"),
            metrics=None if m is None else RoundMetrics.from_json_dict(m),
            client_accuracy=d["client_accuracy"], rejected=d["rejected"], extras=d["extras"],
            robust=d.get("robust"), client_macro_f1=d.get("client_macro_f1"),
            client_mse=d.get("client_mse"), participants=d.get("participants"),
        )

    def cleaned(self) -> RoundRecord:
        """A copy whose values are JSON-ready (`json_ready`): what the runner records."""
        return RoundRecord.from_json_dict(json_ready(self.to_json_dict()))


# --------------------------------------------------------------------------- the run


@dataclass(kw_only=True)
class FinalMetrics:
    """`summary.json`'s "final": the metrics of the last evaluated round and the clustering,
    costs and time of the last round. In the JSON the metrics' keys come first, flat (absent
    when no round was evaluated)."""

    metrics: RoundMetrics | None = None
    ari: float | None = None
    n_clusters: int | None = None
    floats_down: float | None = None
    floats_up: float | None = None
    client_updates: int | None = None
    wall_time: float | None = None
    rejected: int | None = None
    """Replies the guard rejected over the whole run (written when known; older files lack
    it)."""
    participation: float | None = None
    """Mean share of the (trained) clients that took part in a round (`RoundRecord.
    participants` / clients), over the run's rounds."""
    placement_ari: float | None = None
    """ARI of the held-out clients' placed clusters against their true clusters
    (`[scenario] holdout`; absent without held-out clients)."""
    holdout_accuracy: float | None = None
    """Mean test accuracy of the held-out clients with the models they were placed on."""
    holdout_mse: float | None = None
    """A regression's held-out clients' mean test MSE (`held_out_mse` of `holdout.mse`);
    older files lack it (`held_out_mse(summary.holdout)` gives it from their `holdout`)."""
    placement_match: float | None = None
    """Share of the held-out clients placed in the cluster holding most trained clients of
    their true group (`holdout.placement_match`)."""

    KEYS = ("ari", "n_clusters", "floats_down", "floats_up", "client_updates", "wall_time",
            "rejected", "participation", "placement_ari", "holdout_accuracy", "holdout_mse",
            "placement_match")
    OPTIONAL = ("rejected", "participation", "placement_ari", "holdout_accuracy",
                "holdout_mse", "placement_match")

    def to_json_dict(self) -> dict[str, Any]:
        d = {} if self.metrics is None else self.metrics.to_json_dict()
        d.update({
            "ari": self.ari, "n_clusters": self.n_clusters, "floats_down": self.floats_down,
            "floats_up": self.floats_up, "client_updates": self.client_updates,
            "wall_time": self.wall_time,
        })
        for key in self.OPTIONAL:  # written when known
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> FinalMetrics:
        """Lenient: a missing key reads as None (files older than `client_updates` lack it)."""
        _check_keys(d, (), RoundMetrics.KEYS + cls.KEYS, "summary 'final'")
        evaluated = any(k in d for k in RoundMetrics.KEYS)
        return cls(
            metrics=RoundMetrics(**{k: d.get(k) for k in RoundMetrics.KEYS}) if evaluated
            else None,
            ari=d.get("ari"), n_clusters=d.get("n_clusters"), floats_down=d.get("floats_down"),
            floats_up=d.get("floats_up"), client_updates=d.get("client_updates"),
            wall_time=d.get("wall_time"), rejected=d.get("rejected"),
            participation=d.get("participation"), placement_ari=d.get("placement_ari"),
            holdout_accuracy=d.get("holdout_accuracy"), holdout_mse=d.get("holdout_mse"),
            placement_match=d.get("placement_match"),
        )


def held_out_mse(holdout: Mapping[str, Any] | None) -> tuple[float | None, int, int]:
    """(mean, finite, clients) of the held-out clients' MSE (`holdout.mse`, a regression's):
    the mean over the clients with a finite one (null in `summary.json`: none, or an
    overflow); (None, 0, 0) without."""
    mse = (holdout or {}).get("mse") or []
    values = [float(v) for v in mse if v is not None and math.isfinite(float(v))]
    return (sum(values) / len(values) if values else None), len(values), len(mse)


@dataclass(kw_only=True)
class RunSummary:
    """`summary.json`: what the run was and how it ended.

    Every field may be None (or empty) when read from a partial file; a summary written by
    the runner has them all. `robust` is written only when a robustness option is on,
    `divergence` only when the run diverged.
    """

    algorithm: str | None = None
    label: str | None = None
    """Display name of the method (e.g. "ifca(K=4)")."""
    federation: str | None = None
    n_clients: int | None = None
    rounds: int | None = None
    true_clusters: list[int] | None = None
    final: FinalMetrics = field(default_factory=FinalMetrics)
    client_accuracy: list[float | None] | None = None
    """Per-client accuracy of the last evaluated round."""
    client_macro_f1: list[float | None] | None = None
    assignment: list[int] | None = None
    """Cluster id of each client after the last round."""
    extras: dict[str, Any] = field(default_factory=dict)
    """The last round's extras."""
    robust: dict[str, Any] | None = None
    """The guard's totals, adversary exposure and privacy (ε, δ)."""
    divergence: dict[str, Any] | None = None
    """The first diverged round, when the run diverged (`clusterfl.robust.divergence`):
    `round`, `kind`, `reason` (a sentence naming the round and the likely cause) and
    `rounds` (how many rounds were diverged). Absent from the file otherwise."""
    holdout: dict[str, Any] | None = None
    """The held-out clients (`[scenario] holdout`), placed after the run: `fraction`,
    `n_trained` (= `n_clients`), `n_held_out`, `trained_clients` and `clients` (ids in the whole
    federation), `true_clusters`, `placed_clusters`, `accuracy` (per held-out client),
    `placement_ari`, `holdout_accuracy`, the placement's `floats_down` / `floats_up` and the
    method's `details`. Absent from the file without held-out clients."""

    warnings: list[str] | None = None
    """What the run warned of on the console while it went on (a client whose every reply was
    rejected, ...), for the report. Absent from the file when there was none."""

    KEYS = ("algorithm", "label", "federation", "n_clients", "rounds", "true_clusters",
            "final", "client_accuracy", "client_macro_f1", "assignment", "extras", "robust",
            "divergence", "holdout", "warnings")

    def to_json_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "algorithm": self.algorithm, "label": self.label, "federation": self.federation,
            "n_clients": self.n_clients, "rounds": self.rounds,
            "true_clusters": self.true_clusters, "final": self.final.to_json_dict(),
            "client_accuracy": self.client_accuracy, "client_macro_f1": self.client_macro_f1,
            "assignment": self.assignment, "extras": self.extras,
        }
        if self.robust is not None:
            d["robust"] = self.robust
        if self.divergence is not None:
            d["divergence"] = self.divergence
        if self.holdout is not None:
            d["holdout"] = self.holdout
        if self.warnings:
            d["warnings"] = self.warnings
        return d

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        """Lenient about missing keys (None), ValueError on unknown ones."""
        _check_keys(d, (), cls.KEYS, "a summary")
        return cls(
            algorithm=d.get("algorithm"), label=d.get("label"), federation=d.get("federation"),
            n_clients=d.get("n_clients"), rounds=d.get("rounds"),
            true_clusters=d.get("true_clusters"),
            final=FinalMetrics.from_json_dict(d.get("final") or {}),
            client_accuracy=d.get("client_accuracy"), client_macro_f1=d.get("client_macro_f1"),
            assignment=d.get("assignment"), extras=d.get("extras") or {},
            robust=d.get("robust"), divergence=d.get("divergence"), holdout=d.get("holdout"),
            warnings=d.get("warnings"),
        )

    def cleaned(self) -> RunSummary:
        """A copy whose values are JSON-ready (`json_ready`): what the runner writes."""
        return RunSummary.from_json_dict(json_ready(self.to_json_dict()))


# --------------------------------------------------------------------------- reading


def _require_file(run_dir: str | Path, name: str) -> Path:
    """Return `run_dir/name`, or raise a RunDirError naming the missing file."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected a run directory)")
    path = run_dir / name
    if not path.is_file():
        if name == SUMMARY_FILE and (run_dir / HISTORY_FILE).is_file():  # begun, not ended
            last = _last_round(run_dir / HISTORY_FILE)
            raise RunDirError(f"{run_dir} is a run that has not finished (no {name}; its "
                              f"history ends at round {last}): it is still running, or was "
                              "stopped (with checkpoints, `clusterfl run CONFIG --out "
                              f"{run_dir} --resume` continues it)")
        raise RunDirError(f"{run_dir} is not a run directory: missing {name} ({path})"
                          f"{_runs_below(run_dir)}")
    return path


def _last_round(history: Path) -> str:
    """The last round a history file records ('none' when it holds no round yet)."""
    last = "none"
    for line in history.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            last = str(json.loads(line)["round"])
        except (ValueError, KeyError, TypeError):
            continue
    return last


def _runs_below(folder: Path) -> str:
    """'; it holds the runs A, B, …: give those' for a folder whose subfolders (3 levels
    down: a comparison's, a sweep's) are run folders; '' when none is."""
    runs = sorted({p.parent for depth in ("*", "*/*", "*/*/*")
                   for p in folder.glob(f"{depth}/summary.json")})
    if not runs:
        return ""
    shown = ", ".join(str(r) for r in runs[:3]) + (f" and {len(runs) - 3} more"
                                                   if len(runs) > 3 else "")
    return f"; it holds the runs {shown}: give those"


def read_history(run_dir: str | Path) -> list[RoundRecord]:
    """The records of `run_dir/history.jsonl`, one per round, sorted by round.

    If a round occurs twice (a resumed run that replayed it), the last record wins.
    Raises RunDirError when the file is missing or empty, or a line is not a record (with the
    file and line number).
    """
    path = _require_file(run_dir, HISTORY_FILE)
    by_round: dict[int, RoundRecord] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = RoundRecord.from_json_dict(json.loads(line))
        except json.JSONDecodeError as err:
            raise RunDirError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
        except (ValueError, TypeError) as err:
            raise RunDirError(f"{path}:{lineno}: {err}") from err
        by_round[int(record.round)] = record
    if not by_round:
        raise RunDirError(f"{path}: {HISTORY_FILE} is empty (no round was recorded)")
    return [by_round[t] for t in sorted(by_round)]


def read_summary(run_dir: str | Path) -> RunSummary:
    """The summary in `run_dir/summary.json`; RunDirError when it is missing or malformed."""
    path = _require_file(run_dir, SUMMARY_FILE)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    if not isinstance(raw, dict):
        raise RunDirError(f"{path}: {SUMMARY_FILE} must hold a JSON object")
    try:
        return RunSummary.from_json_dict(raw)
    except (ValueError, TypeError) as err:
        raise RunDirError(f"{path}: {err}") from err


__all__ = [
    "HISTORY_FILE",
    "SUMMARY_FILE",
    "FinalMetrics",
    "RoundExtras",
    "RoundMetrics",
    "RoundRecord",
    "RunDirError",
    "RunSummary",
    "json_ready",
    "read_history",
    "read_summary",
]
