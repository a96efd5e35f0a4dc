"""Sweeps: methods × a grid of settings × seeds, run resumably, tabulated with statistics.

A sweep file (`clusterfl sweep SWEEP.toml`) holds

```toml
[sweep]
title = "learning rate on digits"          # optional
config = "base.toml"                       # a run config, relative to this file (optional)
methods = ["fedavg", "ifca:n_clusters=4"]  # specs as for `clusterfl compare --algorithms`
seeds = [0, 1, 2]
set = ["rounds=20"]                        # overrides of the base config (optional)

[sweep.grid]                               # every combination is a cell (optional)
"train.lr" = [0.01, 0.1]
"scenario.n_clients" = [20, 80]

[config]                                   # a run config written here (optional; its
rounds = 10                                # tables are merged over `sweep.config`'s)
```

Each (cell, method, seed) is one run, in `OUT/<cell>/<method>/seed<N>` (`<cell>` e.g.
`train.lr=0.01,scenario.n_clients=20`, left out without a grid, cut and ending in a hash past
`MAX_CELL` bytes; `<method>` the run folder name of `clusterfl compare`). A grid key
`algorithm.X` applies to the methods that have option X, as the shared options of `compare`
do. `clusterfl compare CONFIG --seeds 0,1,2` is the sweep of its methods and seeds without a
grid.

Running a sweep again continues it: a finished run whose resolved config is unchanged is
skipped (`bench.config_difference`: fields its config.toml lacks because an older clusterfl
wrote it, at their defaults now, are no change); a run whose config changed (a cell edited
in the file, another base config) is run again from the start; an interrupted one resumes
from its checkpoint; one that failed is skipped and reported until `retry_failed`
(`--retry-failed`). Failures are kept in `OUT/sweep-state.json`. The runs go through
`clusterfl.jobs.execute` (local processes or Ray).

Results (`collect`): one row per run with every swept value, the method, the seed, the
status (done, diverged, failed, missing), every final metric and the wall time — written as
`results.csv` and `results.parquet` — and `clusterfl.sweep_report` turns them into the report.
"""

from __future__ import annotations

import copy
import csv
import io
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterfl.config import Config, dump_toml, load_config, set_dotted
from clusterfl.config_util import MAX_SEED, flatten, is_number, is_whole
from clusterfl.engine.device import check_devices
from clusterfl.errors import ClusterFLError, ConfigError, write_error
from clusterfl.files import write_whole

STATE_FILE = "sweep-state.json"
MAX_CELL = 200
"""Longest cell folder name in bytes (file systems take 255, and the cell's figure adds
`.png`); a longer one is cut and ends in a hash of the whole name (`naming.shortened`)."""
CSV_FILE = "results.csv"
PARQUET_FILE = "results.parquet"


@dataclass(frozen=True)
class Cell:
    """One combination of the grid's values (`values` in the grid's key order)."""

    values: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        """The cell's folder name ("" without a grid), e.g. "train.lr=0.01,rounds=5"; one
        longer than `MAX_CELL` bytes (a long list value) is cut and ends in a hash."""
        from clusterfl.naming import shortened

        return shortened(",".join(f"{k}={_text(v)}" for k, v in self.values), MAX_CELL)

    @property
    def title(self) -> str:
        return ", ".join(f"{k} = {_text(v)}" for k, v in self.values) or "all runs"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # 1.0 stays "1.0": another value than the integer 1
    if isinstance(value, list | tuple):
        return "[" + ";".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ";".join(f"{k}:{_text(v)}" for k, v in value.items()) + "}"
    return str(value).replace("/", "_")


@dataclass
class Run:
    """One planned run of the sweep."""

    cell: Cell
    spec: str
    seed: int
    config: Config
    target: Path
    label: str

    @property
    def what(self) -> str:
        return " / ".join(p for p in (self.cell.name, self.label, f"seed {self.seed}") if p)


@dataclass
class Sweep:
    """A sweep: a base config (raw tables), method specs, seeds and a grid of overrides."""

    base: dict[str, Any]
    methods: list[str]
    seeds: list[int]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    title: str = "sweep"
    source: str = ""
    """Where the base config came from (a file, or "the sweep file")."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of a sweep file's values, wherever the sweep was made (`load_sweep`, or
        `Sweep(...)` in Python); a ConfigError names the field. Normalises `methods` (stripped),
        `seeds` (a list) and `grid` (flat dotted keys, lists of values). `plan` checks again,
        so a sweep changed after it was made is checked too."""
        if not isinstance(self.base, dict):
            raise ConfigError("sweep.base", "expected a run config as a table (a dict), got "
                              + _got(self.base))
        methods = self.methods
        if not isinstance(methods, list | tuple) or not methods or not all(
                isinstance(m, str) and m.strip() for m in methods):
            raise ConfigError("sweep.methods", "expected a non-empty list of method specs, e.g. "
                              f"[\"fedavg\", \"ifca:n_clusters=4\"], got {_got(methods)}")
        self.methods = [m.strip() for m in methods]
        seeds = self.seeds
        if not isinstance(seeds, list | tuple) or not seeds or not all(
                is_whole(s) and 0 <= s <= MAX_SEED
                for s in seeds):
            raise ConfigError("sweep.seeds", "expected a non-empty list of integers in "
                              f"0..2**63-1, got {_got(seeds)}")
        if len(set(seeds)) != len(seeds):
            raise ConfigError("sweep.seeds", f"a seed is listed twice: {list(seeds)}")
        self.seeds = list(seeds)
        if not isinstance(self.grid, dict):
            raise ConfigError("sweep.grid", f"expected a table of key = [values], got "
                              f"{_got(self.grid)}")
        grid = flatten(self.grid, field="sweep.grid")
        for key, values in grid.items():
            if not isinstance(key, str) or not all(key.split(".")):
                raise ConfigError("sweep.grid", f"expected dotted keys such as \"train.lr\" "
                                  f"(no empty part between dots), got the key {key!r}")
            if key in ("seed", "seeds"):
                raise ConfigError(f"sweep.grid.{key}", "the seeds go in sweep.seeds, not in "
                                  "the grid (each cell runs every seed)")
            if key == "algorithm.name":
                raise ConfigError("sweep.grid.algorithm.name", "list the methods in "
                                  "sweep.methods")
            if not isinstance(values, list | tuple) or not values:
                raise ConfigError(f"sweep.grid.{key}", "expected a non-empty list of values, "
                                  f"got {_got(values)}")
            names = [_text(v) for v in values]  # 1 and 1.0: one setting, one cell
            same = [float(v) if is_number(v) else n for v, n in zip(values, names, strict=True)]
            if len(set(names)) != len(names) or len(set(same)) != len(same):
                raise ConfigError(f"sweep.grid.{key}", f"a value is listed twice: "
                                  f"{list(values)}")
        self.grid = {k: list(v) for k, v in grid.items()}
        for name in ("title", "source"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"sweep.{name}", "expected a string, got "
                                  + _got(getattr(self, name)))

    def cells(self) -> list[Cell]:
        keys = list(self.grid)
        return [Cell(tuple(zip(keys, combo)))
                for combo in itertools.product(*(self.grid[k] for k in keys))]

    def plan(self, out: str | os.PathLike[str]) -> list[Run]:
        """Every run, validated (a bad value names its cell and field) before anything runs.

        Ordered seed by seed, then cell by cell, so a sweep stopped early has whole tables of
        its first seeds. `out`: the sweep's folder (a str or a Path); nothing is written.
        """
        from clusterfl.algorithms import algorithm_class
        from clusterfl.compare import merged_spec, parse_algorithm_spec
        from clusterfl.naming import method_label, run_folder_name

        out = _folder(out, "out")
        self.check()
        specs = []
        for spec in self.methods:
            try:
                parsed = parse_algorithm_spec(spec)
                _no_comma(spec, parsed)
                options = algorithm_class(parsed["name"], "sweep.methods").Config.model_fields
            except ConfigError as exc:
                raise ConfigError("sweep.methods", exc.message) from None
            specs.append((spec, parsed, options))
        for key in self.grid:
            option = key.removeprefix("algorithm.")
            if option != key and not any(option in opts for _, _, opts in specs):
                raise ConfigError(f"sweep.grid.{key}", f"no method of the sweep has option "
                                  f"{option!r}; methods: {', '.join(self.methods)}")
            if option != key and all(option in parsed for _, parsed, opts in specs
                                     if option in opts):  # the specs' own values win
                raise ConfigError(f"sweep.grid.{key}", f"every method with option {option!r} "
                                  f"sets it in its spec ({', '.join(self.methods)}), so the "
                                  "grid's values would apply to none; drop it from the spec "
                                  "or from the grid")
        runs: dict[tuple[int, int], list[Run]] = {}
        for c, cell in enumerate(self.cells()):
            raw = copy.deepcopy(self.base)
            algo = {}  # algorithm.X: each method that has option X, unless its spec sets X
            for key, value in cell.values:
                if key.startswith("algorithm."):
                    algo[key.removeprefix("algorithm.")] = value
                else:
                    _set(raw, key, value, f"sweep.grid.{key}")
            for seed in self.seeds:
                raw["seed"] = seed
                where = f" (cell {cell.title})" if cell.values else ""
                try:
                    config = load_config(raw)
                    configs = []
                    for _spec, parsed, options in specs:
                        table = {**{k: v for k, v in algo.items() if k in options}, **parsed}
                        cfg = config.with_algorithm(merged_spec(config, table))
                        configs.append((run_folder_name(cfg.algorithm), cfg))
                except ConfigError as exc:
                    raise ConfigError(exc.field, f"{exc.message}{where}") from None
                folders = [f for f, _ in configs]
                for i, folder in enumerate(folders):
                    if folder in folders[:i]:
                        first = self.methods[folders.index(folder)]
                        raise ConfigError("sweep.methods", f"{first!r} and {self.methods[i]!r} "
                                          f"are the same method with the same options{where}; "
                                          "list each once")
                for (folder, cfg), spec in zip(configs, self.methods):
                    target = out / cell.name / folder / f"seed{seed}" if cell.name else (
                        out / folder / f"seed{seed}")
                    runs.setdefault((seed, c), []).append(
                        Run(cell, spec, seed, cfg, target, method_label(cfg.algorithm)))
        ordered = sorted(runs, key=lambda k: (self.seeds.index(k[0]), k[1]))
        return [r for k in ordered for r in runs[k]]


def _no_comma(spec: str, parsed: dict[str, Any]) -> None:
    """Refuse a `,` in a method spec outside a value (a list `[1, 2]`, a quoted text): as in
    `--algorithms` it would separate methods, but a sweep lists its methods as items, and
    `ifca:n_clusters=4,averaging=model` read `4,averaging=model` as the value of n_clusters."""
    import tomllib

    def bare(text: str) -> bool:  # a value that is no TOML value is kept as text
        try:
            tomllib.loads(f"v = {text}")
        except tomllib.TOMLDecodeError:
            return True
        return False

    texts = [p.partition("=")[2].strip() for p in spec.split(":")[1:]]
    if "," not in parsed["name"] and not any("," in t and bare(t) for t in texts):
        return
    raise ConfigError("sweep.methods", f"{spec!r}: ',' separates methods only in `compare "
                      "--algorithms`; here each method is its own item (e.g. [\"fedavg\", "
                      "\"ifca\"]) and a method's options follow it after ':' (e.g. "
                      "\"ifca:n_clusters=4:averaging=model\")")


def _got(value: Any) -> str:
    """What a wrong argument was, for an error line: `'2' (str)`."""
    text = repr(value)
    return f"{text[:40] + '…' if len(text) > 41 else text} ({type(value).__name__})"


def _folder(value: Any, name: str) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(name, f"expected a folder (a str or pathlib.Path), got {_got(value)}")
    return Path(value)


def _set(raw: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(where, "empty key")
    set_dotted(raw, parts, copy.deepcopy(value), where)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep file (module docstring); every error names its field."""
    from clusterfl.config import apply_overrides, read_toml

    if not isinstance(path, str | os.PathLike):
        raise ConfigError("sweep", "expected the path of a sweep file (a str or pathlib.Path), "
                          f"got {_got(path)}; a sweep made in Python is Sweep(base=..., "
                          "methods=..., seeds=..., grid=...)")
    path = Path(path)
    if not path.is_file():
        raise ConfigError("sweep", f"sweep file not found: {path}")
    raw = read_toml(path)
    unknown = sorted(set(raw) - {"sweep", "config"})
    if unknown:
        raise ConfigError(f"{path}", f"unknown table(s) {unknown}; a sweep file holds [sweep] "
                          "(with [sweep.grid]) and optionally [config]")
    sweep = raw.get("sweep")
    if not isinstance(sweep, dict):
        raise ConfigError(f"{path}", "no [sweep] table; see `clusterfl sweep --help`")
    allowed = {"title", "config", "methods", "seeds", "set", "grid"}
    extra = sorted(set(sweep) - allowed)
    if extra:
        raise ConfigError(f"sweep.{extra[0]}", f"unknown key; allowed: {sorted(allowed)}")
    base: dict[str, Any] = {}
    source = "the sweep file's [config]"
    if "config" in sweep:
        if not isinstance(sweep["config"], str):
            raise ConfigError("sweep.config", "expected the path of a run config (a string)")
        file = (path.parent / sweep["config"]).resolve()
        if not file.is_file():
            raise ConfigError("sweep.config", f"config file not found: {file}")
        base, source = read_toml(file), sweep["config"]
    if isinstance(raw.get("config"), dict):
        base = _merge(base, raw["config"])
        if "config" in sweep:
            source += " with the sweep file's [config]"
    sets = sweep.get("set", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise ConfigError("sweep.set", "expected a list of \"key=value\" strings")
    for item in sets:
        if "=" in item and not all(item.split("=", 1)[0].strip().split(".")):
            raise ConfigError("sweep.set", f"expected keys such as \"train.lr\" (no empty "
                              f"part between dots), got {item!r}")
    base = apply_overrides(base, sets)
    methods = sweep.get("methods", [])  # checked by Sweep.check
    grid = sweep.get("grid", {})
    if not isinstance(grid, dict):
        raise ConfigError("sweep.grid", "expected a table of key = [values]")
    grid = flatten(grid, field="sweep.grid")
    if "grid" in sweep and not grid:  # a table left without its keys: not a silent no-op
        print(f"clusterfl: warning: sweep.grid in {path} is empty: the sweep has one cell "
              "(each method once per seed); give settings as \"key\" = [values] or remove "
              "the table", file=sys.stderr)
    for alias in ("seeds", "seed"):  # the seeds may be written among the grid's keys
        if alias in grid:
            if "seeds" in sweep:
                raise ConfigError(f"sweep.grid.{alias}", "the seeds are given twice (here and "
                                  "in sweep.seeds); keep one")
            sweep["seeds"] = grid.pop(alias)
    seeds = sweep.get("seeds", [base.get("seed", 0)])
    title = sweep.get("title", path.stem)
    return Sweep(base=base, methods=methods, seeds=seeds, grid=grid, title=str(title),
                 source=source)  # Sweep.check: the methods, seeds and grid


# ---------------------------------------------------------------------------- running
def _state(out: Path) -> dict[str, Any]:
    path = out / STATE_FILE
    if not path.is_file():
        return {"failed": {}}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ClusterFLError(f"{path}: not a sweep state file (not valid JSON); remove it to "
                             "start over (finished runs are kept in their folders)") from None
    if not isinstance(state, dict) or not isinstance(state.get("failed"), dict):
        raise ClusterFLError(f"{path}: not a sweep state file; remove it to start over")
    return state


def _write_state(out: Path, state: dict[str, Any]) -> None:
    path = out / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _key(run: Run, out: Path) -> str:
    return run.target.relative_to(out).as_posix()


def _config_text(run: Run) -> str:
    """The run's config as `config.toml` holds it, kept with a failure in the sweep state."""
    return dump_toml(run.config.to_dict())


def config_changed(run: Run) -> bool:
    """Whether the run's folder holds a run of another config: what makes `bench.prepare_run`
    (and so `run_sweep`) start it again from the start. Its results are not this run's."""
    from clusterfl.bench import stale_config

    return stale_config(run.target, run.config)


def _failed_with(run: Run, before: dict[str, Any]) -> bool:
    """Whether the failure record `before` is of the run's present config: its config text is
    the same run (`bench.config_difference`: fields an older clusterfl did not write, at the
    defaults the run has, are no change)."""
    from clusterfl.bench import config_difference

    text = before.get("config")
    return isinstance(text, str) and not config_difference(text, run.config)[0]


def _failed_before(run: Run, failed: dict[str, Any], out: Path) -> dict[str, Any] | None:
    """The run's failure record in the sweep state, when it failed with its present config
    (one of another config is dropped by `run_sweep`: the run is new)."""
    before = failed.get(_key(run, out))
    return before if before is not None and _failed_with(run, before) else None


def run_states(runs: Sequence[Run], out: str | os.PathLike[str]) -> list[str]:
    """What `run_sweep` would do with each run, reading only: "done" (finished with this
    config: skipped), "config changed" (its folder or failure is of another config: run again
    from the start), "failed" (failed before: skipped unless `retry_failed`) or "to run"."""
    from clusterfl.records import SUMMARY_FILE

    out = _check_runs(runs, out)
    failed = _state(out)["failed"] if (out / STATE_FILE).is_file() else {}
    states = []
    for run in runs:
        if config_changed(run) or (_key(run, out) in failed
                                   and _failed_before(run, failed, out) is None):
            states.append("config changed")
        elif (run.target / SUMMARY_FILE).is_file():
            states.append("done")
        elif _key(run, out) in failed:
            states.append("failed")
        else:
            states.append("to run")
    return states


def _check_runs(runs: Any, out: Any) -> Path:
    """`out` as a Path, after checking that `runs` are runs of `Sweep.plan(out)`."""
    out = _folder(out, "out")
    if isinstance(runs, str | bytes) or not isinstance(runs, Sequence) or not all(
            isinstance(r, Run) for r in runs):
        raise ConfigError("runs", f"expected the list of runs of Sweep.plan(out), got "
                          f"{_got(runs)}")
    seen: set[Path] = set()
    for run in runs:
        if not run.target.is_relative_to(out):
            raise ConfigError("out", f"the runs were planned into another folder than {out} "
                              f"({run.what} goes to {run.target}); give the folder given to "
                              "Sweep.plan")
        if run.target in seen:
            raise ConfigError("runs", f"{run.what} is listed twice ({run.target})")
        seen.add(run.target)
    return out


def other_runs(runs: Sequence[Run], out: str | os.PathLike[str]) -> list[str]:
    """The run folders in `out` (`METHOD/seedN`, `CELL/METHOD/seedN`) that are none of
    `runs`: another sweep's, or an earlier version of this one's; left out of its table."""
    from clusterfl.rundir import holds_run

    out = _check_runs(runs, out)
    planned = {r.target for r in runs}
    found = sorted({p for pattern in ("*/seed*", "*/*/seed*") for p in out.glob(pattern)
                    if p not in planned and p.is_dir() and holds_run(p)})
    return [p.relative_to(out).as_posix() for p in found]


def _unreadable_checkpoint(target: Path) -> bool:
    """A run folder whose checkpoint is there but cannot be read (truncated, damaged,
    foreign): `--retry-failed` starts such a run again instead of failing on it again."""
    from clusterfl.checkpoint import CHECKPOINT, KEYS
    from clusterfl.state import CheckpointError, read_checkpoint

    path = target / CHECKPOINT
    if not path.is_file():
        return False
    try:
        read_checkpoint(path, KEYS)
    except CheckpointError:
        return True
    return False


def _check_no_other_runs(runs: Sequence[Run], out: Path) -> None:
    """Refuse a sweep folder that is (or holds) a run that is not one of a sweep's: a run's
    own folder, or a comparison's run folder where a sweep keeps a method's or cell's seeds.
    A sweep's runs lie two or three folders down (`METHOD/seedN`, `CELL/METHOD/seedN`)."""
    from clusterfl.rundir import RUN_SUBDIRS, RunDirInUseError, holds_run

    tops = [out, *(e for e in sorted(out.iterdir()) if e.is_dir() and not e.is_symlink()
                   and e.name not in RUN_SUBDIRS)]
    between = {p for r in runs for p in r.target.parents if p != out and p.is_relative_to(out)}
    found = next((p for p in [*tops, *sorted(between)] if holds_run(p)), None)
    if found is not None:
        what = "is" if found == out else f"holds {found.relative_to(out).as_posix()}, which is"
        hint = "" if found == out else (" (a comparison without --seeds continues with "
                                        "`compare --resume` without --seeds)")
        raise RunDirInUseError(
            f"{out} {what} the folder of a run, not of a sweep's runs (`compare` without "
            "--seeds or `run` wrote it); a sweep writes each run into METHOD/seedN: give "
            f"another --out{hint}")


def _check_run_options(jobs: Any, ray: Any, cpus_per_run: Any, gpus_per_run: Any,
                       threads: Any, flags: dict[str, Any], log: Any) -> None:
    from clusterfl.jobs import check_resources

    for name, value, ok, allowed in (
            ("jobs", jobs, is_whole(jobs),
             "an integer of at least 1"),
            ("ray", ray, ray is None or isinstance(ray, str), "None or a Ray address (a str)"),
            ("cpus_per_run", cpus_per_run, cpus_per_run is None or is_number(cpus_per_run),
             "None or a positive number"),
            ("gpus_per_run", gpus_per_run, is_number(gpus_per_run), "a number of 0 or more"),
            ("threads", threads, threads is None or (is_whole(threads) and threads >= 1),
             "None or an integer of at least 1"),
            ("log", log, callable(log), "a function of one str"),
            *((k, v, isinstance(v, bool), "True or False") for k, v in flags.items())):
        if not ok:
            raise ConfigError(name, f"expected {allowed}, got {_got(value)}")
    check_resources(jobs, cpus_per_run, gpus_per_run)


class SweepError(ClusterFLError):
    """Some runs of a sweep failed (the others finished; the results are written)."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        super().__init__(f"{len(failures)} run(s) failed (kept in the table as failed; "
                         "--retry-failed runs them again):\n  " + "\n  ".join(failures))


def run_sweep(
    runs: Sequence[Run], out: str | os.PathLike[str], *, jobs: int = 1, ray: str | None = None,
    cpus_per_run: float | None = None, gpus_per_run: float = 0, threads: int | None = None,
    retry_failed: bool = False, overwrite: bool = False, log: Callable[[str], None] = print,
    progress: bool | None = False,
) -> list[str]:
    """Run what is missing of `runs` (module docstring), the runs of `Sweep.plan(out)`, into
    `out`; returns the failures ("what: error"), those of this call and those kept from before
    (not retried)."""
    from clusterfl.bench import prepare_run
    from clusterfl.jobs import RunTask, execute
    from clusterfl.rundir import FolderLock, claim_run_dir, make_folder

    out = _check_runs(runs, out)  # before any folder is touched
    _check_run_options(jobs, ray, cpus_per_run, gpus_per_run, threads,
                       {"retry_failed": retry_failed, "overwrite": overwrite}, log)
    if ray is None:  # the runs compute here: a CUDA device this machine lacks, in one line
        check_devices(r.config for r in runs)
    make_folder(out)
    with FolderLock(out):
        _check_no_other_runs(runs, out)
        state = _state(out)
        failed: dict[str, Any] = state["failed"]
        todo: list[Run] = []
        kept: list[str] = []
        for run in runs:
            key = _key(run, out)
            if overwrite and run.target.exists():
                claim_run_dir(run.target, overwrite=True)  # only clusterfl's files
                failed.pop(key, None)
            before = failed.get(key)
            if before is not None and not _failed_with(run, before):
                failed.pop(key)  # its cell changed: a new run
                before = None
            if not prepare_run(run.target, run.config, run.what, log):
                failed.pop(key, None)
                continue
            if before is not None and retry_failed and _unreadable_checkpoint(run.target):
                claim_run_dir(run.target, overwrite=True)  # only clusterfl's files
                log(f"{run.what}: its checkpoint cannot be read: started again")
            if before is not None and not retry_failed:
                kept.append(f"{run.what}: {before['error']}")
                log(f"{run.what}: failed before ({before['error']}); --retry-failed runs it "
                    "again")
                continue
            todo.append(run)
        _write_state(out, state)
        by_target = {r.target: r for r in todo}
        now: list[str] = []
        outcomes = execute(
            [RunTask(r.what, r.config.to_dict(), r.target) for r in todo], jobs=jobs,
            threads=threads, ray=ray, cpus=cpus_per_run, gpus=gpus_per_run, log=log,
            progress=progress, skipped=len(runs) - len(todo))
        for outcome in outcomes:
            run = by_target[outcome.task.target]
            if outcome.ok:
                failed.pop(_key(run, out), None)
            else:
                failed[_key(run, out)] = {"error": outcome.error, "config": _config_text(run)}
                now.append(f"{run.what}: {outcome.error}")
        _write_state(out, state)
    return now + kept


# ---------------------------------------------------------------------------- results
METRICS = ("accuracy", "accuracy_weighted", "macro_f1", "fairness_var", "loss", "mse",
           "perplexity", "accuracy_no_oov_no_eos", "ari",
           "n_clusters", "rounds_to_ari1", "floats_down", "floats_up", "client_updates",
           "rejected", "participation", "placement_ari", "holdout_accuracy", "holdout_mse",
           "placement_match", "wall_time")
"""Columns of the tidy table after the run's identity: accuracy and F1 in 0..1 as in
`summary.json` (a language model's `accuracy_no_oov_no_eos` too), fairness variance in %²,
the rest in their own units (`holdout_mse`: a
regression's held-out clients' mean MSE, from `holdout.mse` for a summary older than it)."""


def collect(runs: Sequence[Run], out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One row per planned run: identity, swept values, status and final metrics.

    The status "stale": the run's folder (or its failure) is of another config than the
    run's now (`config_changed`); its numbers are not this run's and are left out."""
    from clusterfl.bench import rounds_to_perfect
    from clusterfl.records import SUMMARY_FILE, held_out_mse, read_history, read_summary

    out = _check_runs(runs, out)
    failed = _state(out)["failed"] if (out / STATE_FILE).is_file() else {}
    rows = []
    for run in runs:
        row: dict[str, Any] = {"cell": run.cell.name or None}
        row.update({key: _cell_value(v) for key, v in run.cell.values})
        row.update({"method": run.label, "spec": run.spec, "algorithm": run.config.algorithm.name,
                    "seed": run.seed})
        values: dict[str, Any] = dict.fromkeys(METRICS)
        status, error, rounds = "missing", None, None
        if config_changed(run) and (run.target / SUMMARY_FILE).is_file():
            status, error = "stale", ("ran with another config than the sweep's now (its "
                                      "config.toml differs); running the sweep runs it again")
        elif (run.target / SUMMARY_FILE).is_file():
            summary = read_summary(run.target)
            final = summary.final.to_json_dict()
            values.update({k: final.get(k) for k in METRICS if k in final})
            if values["holdout_mse"] is None:  # written before `final` held it
                values["holdout_mse"] = held_out_mse(summary.holdout)[0]
            values["rounds_to_ari1"] = rounds_to_perfect(read_history(run.target))
            rounds = summary.rounds
            status = "diverged" if summary.divergence else "done"
            if summary.divergence:
                error = str(summary.divergence.get("reason", "diverged"))
        elif _key(run, out) in failed and _failed_before(run, failed, out) is None:
            status, error = "stale", (f"failed with another config than the sweep's now "
                                      f"({failed[_key(run, out)]['error']}); running the "
                                      "sweep runs it again")
        elif _key(run, out) in failed:
            status, error = "failed", failed[_key(run, out)]["error"]
        swept = {k for k, _ in run.cell.values}  # a swept `rounds` keeps its value
        row.update({"status": status, **({} if "rounds" in swept else {"rounds": rounds}),
                    **values, "error": error, "path": _key(run, out)})
        rows.append(row)
    return rows


def _cell_value(value: Any) -> Any:
    """A swept value as a table entry: scalars as they are, lists and tables as JSON text."""
    return json.dumps(value) if isinstance(value, list | dict) else value


def write_table(rows: list[dict[str, Any]], out: str | os.PathLike[str]
                ) -> tuple[Path, Path | None, str | None]:
    """`results.csv` (always) and `results.parquet` (needs pandas and pyarrow: the `sweep`
    extra) in the folder `out`; returns both paths and, when Parquet could not be written,
    why."""
    out = _folder(out, "out")
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    csv_path = out / CSV_FILE
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv(row.get(k)) for k in columns})
    try:
        write_whole(csv_path, text.getvalue().encode("utf-8"))
    except OSError as exc:
        raise write_error(exc, csv_path, "the sweep's table", "every run's folder is intact: "
                          "the same command with --report-only writes the table and report "
                          "again") from None
    try:
        import pandas as pd
        import pyarrow  # noqa: F401  (pandas' Parquet engine)
    except ImportError as exc:
        return csv_path, None, (f"results.parquet not written: it needs pandas and pyarrow "
                                f"(no module named {exc.name!r}): pip install "
                                "'clusterfl[sweep]'; results.csv holds the same table")
    frame = pd.DataFrame(rows, columns=columns)
    parquet = out / PARQUET_FILE
    frame.to_parquet(parquet, index=False)
    return csv_path, parquet, None


def _csv(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else value
