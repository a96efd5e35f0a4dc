"""The run's checkpoint, `checkpoint/state.pt`: what it holds and putting it back.

It holds everything that continues a run exactly: the method's state, the run's generators
(numpy's and torch's), the communication and client-update counts, the guard's ledgers, the
divergence watch, the records so far and the config. It is written whole or not at all
(`state.write_checkpoint`), so a run killed at any moment resumes from the last one written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.algorithms import Algorithm, Context
from clusterfl.config import Config, load_config
from clusterfl.config_util import flatten
from clusterfl.data.federation import Federation
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.records import RoundRecord
from clusterfl.rundir import LOCK_FILE, runs_in, shown_names
from clusterfl.state import RESTART, read_checkpoint, write_checkpoint

CHECKPOINT = "checkpoint/state.pt"
KEYS = ("round", "elapsed", "algorithm", "rng", "floats", "records", "torch_rng", "config")
"""What every checkpoint holds (older ones lack the later keys: guard, divergence, ...)."""


class Checkpoints:
    """The checkpoint of the run folder `run_dir` (None: a run without files) of a run on
    `federation` (whose per-client digests it keeps, so that `--resume` refuses data that
    changed since; None: not checked)."""

    def __init__(self, run_dir: Path | None, federation: Federation | None = None) -> None:
        self.path = None if run_dir is None else run_dir / CHECKPOINT
        self.round: int | None = None
        """The round the file holds (None: none written or loaded yet)."""
        self.federation = federation
        self._digests: np.ndarray | None = None
        self.resume_warnings: list[str] = []
        """After `load`: what a resume with other settings changes while rounds are left to
        run (other `WHERE` settings; checkpoints turned off), for the run to warn."""
        self.resume_notes: list[str] = []
        """After `load`: what the run says on resuming that changes nothing (fields the
        checkpoint's config lacks, taken at their defaults; `finished_note`)."""
        self.extras: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
        """State of the run's driver beyond the method's (a Flower strategy's nodes and
        learned sizes): name → (what to save, how to put it back: given None when the
        checkpoint holds none), saved with each checkpoint under `extras` and put back by
        `load`."""

    def digests(self) -> np.ndarray | None:
        """The federation's `Federation.digests`, computed once (None without one)."""
        if self._digests is None and self.federation is not None:
            self._digests = self.federation.digests()
        return self._digests

    def save(self, t: int, elapsed: float, ctx: Context, algorithm: Algorithm, config: Config,
             records: list[RoundRecord], watch: dict[str, Any]) -> None:
        """Write round t's checkpoint (`watch`: the divergence watch's state)."""
        if self.path is None:
            return
        state = {
            "round": t, "elapsed": elapsed, "algorithm": algorithm.state_dict(),
            "rng": ctx.rng.bit_generator.state, "floats": (ctx.floats_down, ctx.floats_up),
            "client_updates": ctx.client_updates,
            "records": [r.to_json_dict() for r in records],
            "torch_rng": torch.get_rng_state(),
            "config": config.to_dict(),
            "guard": None if ctx.guard is None else ctx.guard.state_dict(),
            "federation": self.digests(),
            "extras": {name: get() for name, (get, _) in self.extras.items()},
            **watch,
        }
        write_checkpoint(self.path, state, t, self.round)
        self.round = t

    def saved_round(self) -> int | None:
        """The round the file holds (None: none there, or unreadable). Read from the file,
        not `round`: an interrupt may land between the file's replacement and the update."""
        if self.path is None or not self.path.is_file():
            return None
        try:
            return int(read_checkpoint(self.path, KEYS)["round"])
        except ClusterFLError:  # a torn or foreign file: what this process last saved
            return self.round

    def _resume_warnings(self, saved: dict[str, Any], now: dict[str, Any],
                         config: Config) -> list[str]:
        """`resume_warnings` of a run resumed from round `self.round` with `config` (`now`,
        its dict) from a checkpoint of the config `saved`."""
        held, rounds = int(self.round or 0), config.run.rounds
        if held >= rounds:
            return []
        out = []
        moved = where_changes(saved, now, config)
        if moved:
            how = ("more than in the last digits: another precision rounds every product "
                   "anew" if any(m.startswith("backend.precision") for m in moved) else
                   "in the last digits, by rounding")
            out.append(f"resumed with {'; '.join(moved)}: rounds {held + 1} to {rounds} "
                       f"compute so, and the results may differ from an uninterrupted run's "
                       f"({how})")
        if config.run.checkpoint_every == 0:
            out.append(f"resumed with checkpoint_every = 0: rounds {held + 1} to {rounds} "
                       f"write no checkpoint, so {self.path} keeps round {held} (a later "
                       "--resume starts there again, and `clusterfl place` places with "
                       f"round {held}'s models)")
        return out

    def unreadable(self) -> str | None:
        """Why the checkpoint file cannot be read (empty, truncated, damaged, foreign), as
        `read_checkpoint` says it without its advice; None: no file there, or a readable one."""
        if self.path is None or not self.path.is_file():
            return None
        try:
            read_checkpoint(self.path, KEYS)
        except ClusterFLError as exc:
            return str(exc).removesuffix(f"; {RESTART}")
        return None

    def load(self, ctx: Context, algorithm: Algorithm,
             config: Config) -> tuple[int, float, list[RoundRecord], dict[str, Any]]:
        """Put the checkpoint back into `ctx` and `algorithm`; returns the first round to
        run, the seconds run so far, the records so far and the whole saved state."""
        path = self.path
        if path is None:
            raise ClusterFLError("--resume: a run without an output folder (out_dir) has no "
                                 "checkpoint to resume; run without resume")
        if not path.is_file():
            if path.exists():
                raise ClusterFLError(f"--resume: {path} is not a file (a checkpoint is one "
                                     "file); move it away, or restart the run with --overwrite")
            folder = path.parent.parent
            runs = runs_in(folder) if folder.is_dir() else []
            if runs:
                raise ClusterFLError(
                    f"--resume: {folder} holds the runs of a comparison ({shown_names(runs)}), "
                    "not one run: `clusterfl compare CONFIG --algorithms ... --resume` "
                    "continues a comparison; give run another --out")
            started = folder.is_dir() and any(
                e.name not in (LOCK_FILE, path.parent.name) for e in folder.iterdir())
            why = ("the run keeps none (checkpoint_every = 0): run it again with --overwrite, "
                   "with checkpoint_every > 0 to continue it later" if config.run.checkpoint_every
                   == 0 else "the run stopped before its first checkpoint: start it again with "
                   "--overwrite (instead of --resume)")
            raise ClusterFLError(f"--resume: no checkpoint at {path}; "
                                 + (why if started else "run without --resume"))
        state = read_checkpoint(path, KEYS)
        saved, now = dict(state["config"]), config.to_dict()
        change, added = config_change(saved, now, f"the checkpoint in {path.parent}")
        if change is not None:
            raise ClusterFLError(
                f"--resume: the checkpoint in {path.parent} was made with another config "
                f"({change}); use the same config (see its config.toml) or a new --out")
        kept, digests = state.get("federation"), self.digests()
        if kept is not None and digests is not None:  # older checkpoints hold none
            _check_same_data(path.parent, np.asarray(kept), digests)
        continued = saved.get("rounds") != now["rounds"]
        if continued:
            check_continuation(path.parent, algorithm, config, int(state["round"]),
                                saved.get("rounds"))
        try:
            algorithm.load_state_dict(state["algorithm"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterFLError(
                f"--resume: the checkpoint in {path.parent} does not fit this clusterfl's "
                f"{algorithm.name} state ({exc}); it was probably written by an older "
                "version: rerun without --resume into a new --out") from None
        ctx.rng.bit_generator.state = state["rng"]
        ctx.floats_down, ctx.floats_up = state["floats"]
        ctx.client_updates = int(state.get("client_updates", 0))
        torch.set_rng_state(state["torch_rng"])
        if ctx.guard is not None and state.get("guard") is not None:
            ctx.guard.load_state_dict(state["guard"])
        for name, (_, put) in self.extras.items():
            put(dict(state.get("extras") or {}).get(name))
        records = [RoundRecord.from_json_dict(r) for r in state["records"]]
        self.round = int(state["round"])
        self.resume_warnings = self._resume_warnings(saved, now, config)
        self.resume_notes = [] if not added else [
            older_config_note(f"the checkpoint in {path.parent}", added)]
        return self.round + 1, float(state["elapsed"]), records, state

    def finished_note(self, config: Config, algorithm: Algorithm, placed: bool) -> str | None:
        """After `load`: what a resume of a run with no round left to run (finished, or
        `rounds` down to the checkpoint's round) does, for the run to say: it runs no round
        and writes its files again from the checkpoint; None: rounds are left."""
        held, rounds = int(self.round or 0), config.run.rounds
        if self.path is None or held < rounds:
            return None
        files = "config.toml, history.jsonl and summary.json" + (
            ", report.md and figures/" if config.output.figures else "")
        again = ("; the held-out clients are placed again" if placed else "")
        more = ("" if getattr(type(algorithm), "uses_planned_rounds", False) else
                f"; --set rounds=N (N > {rounds}) continues it")
        return (f"{self.path.parent.parent} had run all {rounds} rounds (its checkpoint holds "
                f"round {held}): no round is run again, and its {files} are written again "
                f"from the checkpoint{again}{more}")


#: `[backend]` settings that say where a run computes, not what: a checkpoint resumes under
#: other values of them (a run started on a GPU goes on on the CPU, and the other way round)
WHERE = ("device", "precision", "chunk_size")


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A config as `--resume` compares it: without `rounds` (a run may be continued), the
    backend's `WHERE` settings, `checkpoint_every` and the `[output]` table (figures,
    progress, trackers): none changes a result, and a run stopped by a failing callback
    resumes without it."""
    out = {**config, "rounds": None, "checkpoint_every": None, "output": None}
    if isinstance(out.get("backend"), dict):
        out["backend"] = {k: v for k, v in out["backend"].items() if k not in WHERE}
    return out


def where_changes(then: dict[str, Any], now: dict[str, Any], config: Config) -> list[str]:
    """The `WHERE` settings of the backend that differ between the configs `then` (a
    checkpoint's) and `now` (`config`'s), as "backend.precision: 'fp32' then, 'bf16-mixed'
    now"; a setting left out is its default, and values that compute the same here do not
    differ (device auto and cpu on a machine without a GPU, chunk_size auto and 64 on the
    CPU, tf32 and fp32 on the CPU)."""
    fields = type(config.backend).model_fields
    tables = [{k: dict(c.get("backend") or {}).get(k, fields[k].default if k in fields
                                                   else None) for k in WHERE}
              for c in (then, now)]
    same = [_computed(t) for t in tables]
    return [f"backend.{k}: {tables[0][k]!r} then, {tables[1][k]!r} now" for k in WHERE
            if tables[0][k] != tables[1][k] and same[0][k] != same[1][k]]


def _computed(backend: dict[str, Any]) -> dict[str, Any]:
    """The `WHERE` settings `backend` holds, as this machine computes them."""
    from clusterfl.engine.device import resolve_device
    from clusterfl.engine.vectorized import CPU_CHUNK

    try:
        device = str(resolve_device(str(backend["device"])))
    except ClusterFLError:  # a device this machine lacks
        device = str(backend["device"])
    cpu = device == "cpu"
    return {"device": device,
            "precision": "fp32" if cpu and backend["precision"] == "tf32" else
            backend["precision"],
            "chunk_size": CPU_CHUNK if cpu and backend["chunk_size"] == "auto" else
            backend["chunk_size"]}


def config_change(saved: dict[str, Any], now: dict[str, Any],
                  where: str) -> tuple[str | None, dict[str, Any]]:
    """How the config `saved` (a checkpoint's, or a run's config.toml, in `where`) differs
    from `now` (the resumed run's `Config.to_dict`) as `--resume` compares them
    (`comparable`): the first difference as "key: value then, value now" (None: the same
    run), and the fields `saved` lacks because an older clusterfl wrote it (dotted key → the
    default this version reads it with). Such a field is unchanged when `now` holds that
    default. A field `saved` holds that this version does not know (removed or renamed
    since; none is mapped to a new name) is a ConfigError naming it."""
    then, later = comparable(saved), comparable(now)
    if then == later:
        return None, {}
    fa, fb = flatten(then), flatten(later)
    try:  # the saved config as this version reads it: the fields it lacks at their defaults
        read: dict[str, Any] | None = flatten(comparable(load_config(
            {k: v for k, v in saved.items() if k != "output"}).to_dict()))
    except ConfigError as exc:
        read = None
        if exc.message.startswith("unknown") and exc.field not in fb and not any(
                k.startswith(f"{exc.field}.") for k in fb):
            value: Any = saved
            for part in exc.field.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            raise ConfigError("--resume", (
                f"{where} was made by a clusterfl whose config had {exc.field} ({value!r}), "
                "a field this version does not know (removed or renamed since): this "
                "version cannot continue that run; rerun it into a new --out, or resume it "
                "with the clusterfl that made it")) from None
    added = {k: v for k, v in (read or {}).items() if k not in fa}
    fa = {**fa, **added}
    key = _first_key(fa, fb)
    if key is None:
        return None, added
    was = f"absent then (its default {fa[key]!r})" if key in added else f"{fa.get(key)!r} then"
    return f"{key}: {was}, {fb.get(key)!r} now", added


def older_config_note(where: str, added: dict[str, Any]) -> str:
    """What a run says of a config (`where`: a checkpoint's, a run's config.toml) that an
    older clusterfl wrote without the fields `added` (dotted key → the default it is read
    with), which it takes as unchanged."""
    return (f"{where} was written by an older clusterfl, without {' and '.join(added)}: "
            f"taken as unchanged, at the default{'s' * (len(added) > 1)} this config has "
            f"({', '.join(repr(v) for v in added.values())})")


def _first_key(fa: dict[str, Any], fb: dict[str, Any]) -> str | None:
    """The first dotted key whose values differ in the flat tables `fa` and `fb` (None:
    none): a table's `name` (the method, the data source, the model...) before its other
    keys, which depend on it, and otherwise in sorted order."""
    order = sorted(fa.keys() | fb.keys(), key=lambda k: (k.rsplit(".", 1)[-1] not in
                                                         ("name", "source"), k))
    return next((k for k in order if fa.get(k) != fb.get(k)), None)


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, Any, Any]:
    """The first dotted key whose values differ in `a` and `b`, with both values (None:
    missing), in `_first_key`'s order; ("the tables", a, b) when only an empty table
    differs."""
    fa, fb = flatten(a), flatten(b)
    key = _first_key(fa, fb)
    return ("the tables", a, b) if key is None else (key, fa.get(key), fb.get(key))


def data_changes(then: np.ndarray, now: np.ndarray) -> str | None:
    """What differs between the federation of per-client digests `then` (a checkpoint's)
    and `now` (`Federation.digests`), e.g. "the training data of client 3"; None: nothing."""
    if then.shape != now.shape:
        return f"{len(then)} clients then, {len(now)} now"
    parts = []
    for col, split in enumerate(("training", "test")):
        ids = np.flatnonzero(then[:, col] != now[:, col]).tolist()
        if ids:
            more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
            name = "client" if len(ids) == 1 else "clients"
            parts.append(f"the {split} data of {name} {', '.join(map(str, ids[:3]))}{more}")
    return "; ".join(parts) or None


def _check_same_data(where: Path, then: np.ndarray, now: np.ndarray) -> None:
    """Refuse to resume on data other than the checkpoint's: the rounds run so far trained
    on the old data, so the run would be neither the old nor the new data's run."""
    what = data_changes(then, now)
    if what is not None:
        raise ClusterFLError(
            f"--resume: the data changed since the checkpoint in {where} was written "
            f"({what}); resume on the data the run started with (its config.toml names it) "
            "or start a new --out")


def check_continuation(where: Path, algorithm: Algorithm, config: Config, held: int,
                        planned: Any) -> None:
    """`--resume --set rounds=N` continues a run (finished or not) to N rounds: allowed
    when N reaches the checkpoint's round and the method does not schedule by the
    planned number of rounds T (`Algorithm.uses_planned_rounds`), which it could not
    change in the rounds already run."""
    rounds = config.run.rounds
    if rounds < held:
        raise ClusterFLError(
            f"--resume: the checkpoint in {where} already holds round {held}; rounds = "
            f"{rounds} would end before it: set rounds >= {held} (or a new --out)")
    if getattr(type(algorithm), "uses_planned_rounds", False):
        raise ClusterFLError(
            f"--resume: {algorithm.label()} schedules by the planned number of rounds "
            f"(T = {planned} in this run), so continuing it to {rounds} rounds would not "
            f"equal a {rounds}-round run; start a new run with rounds = {rounds} (or "
            f"resume with rounds = {planned})")
