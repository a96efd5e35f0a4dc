"""`clusterfl sweep SWEEP.toml` and the multi-seed path of `clusterfl compare --seeds`.

The sweep machinery (`clusterfl.sweep`, torch, the methods) is imported when the command runs,
not when the parser is built, so `clusterfl --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from clusterfl.errors import ClusterFLError


def add_run_options(q: argparse.ArgumentParser) -> None:
    """Where the runs go, shared by `sweep`, `compare --seeds` and `bench`."""
    q.add_argument("--jobs", type=int, default=1,
                   help="runs at once in local worker processes, each with cores/jobs torch "
                   "threads (default 1: one after the other in this process)")
    q.add_argument("--ray", metavar="ADDRESS",
                   help="run each run as a Ray task on the cluster at ADDRESS (as printed by "
                   "`ray start --head`), `auto` (the running cluster) or `local` (a cluster "
                   "started in this process); needs clusterfl[ray]")
    q.add_argument("--cpus-per-run", type=float,
                   help="CPUs of each run: its torch threads, and what Ray reserves for it "
                   "(default: Ray 1; local cores/jobs). Runs give identical numbers wherever "
                   "they run with the same value")
    q.add_argument("--gpus-per-run", type=float, default=0,
                   help="GPUs Ray reserves for each run (default 0; fractions share a GPU)")


RUN_OPTIONS = {"jobs": 1, "ray": None, "cpus_per_run": None, "gpus_per_run": 0}
"""The options of `add_run_options` (as argparse names them) and their defaults."""


IDLE_WORDS = {"quiet": "hides the line per run",
              "fail_on_divergence": "sets the exit status when a run diverged"}
"""What an option that `check_run_options` refuses in a mode that runs nothing does (else
"says how to run")."""


def check_run_options(args: argparse.Namespace, idle: str | None,
                      also: dict[str, Any] | None = None) -> None:
    """`--jobs`, `--cpus-per-run` and `--gpus-per-run` checked in every mode
    (`jobs.check_resources`); with `idle` (`plan`, `report_only`: a mode that runs nothing),
    an option that would do nothing (one of `RUN_OPTIONS`, or of `also`: name → default, off
    its default) is refused in one line. A default of None is a `--X/--no-X` pair not given:
    False is said as --no-X."""
    from clusterfl.jobs import check_resources

    check_resources(args.jobs, args.cpus_per_run, args.gpus_per_run)
    moot = [n for n, default in {**(also or {}), **RUN_OPTIONS}.items()
            if getattr(args, n, default) != default]
    if idle and moot:
        name = moot[0]
        flag = ("no-" if getattr(args, name) is False else "") + name.replace("_", "-")
        raise ClusterFLError(f"--{flag}: {IDLE_WORDS.get(name, 'says how to run')}, and "
                             f"--{idle.replace('_', '-')} runs nothing; give one of the two")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    s = subparsers.add_parser(
        "sweep", help="methods × a grid of settings × seeds, with mean ± std and paired tests",
        description="Runs every cell of SWEEP.toml's grid × method × seed (finished runs are "
        "skipped, interrupted ones resume, changed cells run again), then writes results.csv, "
        "results.parquet and report.md (mean ± std, 95 % intervals, paired comparisons, "
        "curves with a band over seeds). See docs/sweeps.md.",
        epilog="A sweep file: [sweep] config = \"base.toml\", methods = [\"fedavg\", "
        "\"ifca:n_clusters=4\"], seeds = [0, 1, 2]; [sweep.grid] \"train.lr\" = [0.01, 0.1].")
    s.add_argument("sweep", help="the sweep file (TOML)")
    s.add_argument("--out", help="output folder (default runs/sweep-<sweep file name>)")
    add_run_options(s)
    s.add_argument("--retry-failed", action="store_true",
                   help="run again the runs that failed before (they are skipped otherwise)")
    s.add_argument("--overwrite", action="store_true",
                   help="start every run afresh (removes only clusterfl's files of each run)")
    nothing = s.add_mutually_exclusive_group()  # the two that run nothing
    for flag, text in (("--plan", "list the runs and whether each is done, without running "
                                  "anything"),
                       ("--report-only", "write the table and report from the finished runs, "
                                         "running nothing")):
        nothing.add_argument(flag, action="store_true", help=text)
    s.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
    s.add_argument("--device", help="auto, cpu, cuda or cuda:N for every run "
                   "(sets backend.device)")
    s.add_argument("--quiet", action="store_true",
                   help="no line per run (the table, the failures and the paths are printed)")
    s.add_argument("--fail-on-divergence", action=argparse.BooleanOptionalAction,
                   default=None, help="exit with code 3 when a run diverged (the results "
                   "are written; default: off)")
    s.set_defaults(func=cmd_sweep)
    return s


def cmd_sweep(args: argparse.Namespace) -> int:
    from clusterfl.sweep import load_sweep

    if args.data_dir:
        os.environ["CLUSTERFL_DATA"] = str(args.data_dir)
    sweep = load_sweep(args.sweep)
    if args.device:
        sweep.base.setdefault("backend", {})["device"] = args.device
    out = Path(args.out or Path("runs") / f"sweep-{Path(args.sweep).stem}")
    return run_and_report(sweep, out, args, "clusterfl sweep")


def run_and_report(sweep: Any, out: Path, args: argparse.Namespace, command: str) -> int:
    """Plan, run (unless --plan/--report-only), tabulate, report; the exit code."""
    from clusterfl.cli_util import DIVERGED_EXIT, console
    from clusterfl.rundir import check_folder
    from clusterfl.sweep import (
        SweepError,
        collect,
        other_runs,
        run_states,
        run_sweep,
        write_table,
    )
    from clusterfl.sweep_report import console_table, range_note, write_report

    idle = next((f for f in ("plan", "report_only") if getattr(args, f, False)), None)
    moot: dict[str, bool | None] = {"overwrite": False, "retry_failed": False, "quiet": False}
    if idle == "plan":  # reads no result: no exit status for a diverged run either
        moot["fail_on_divergence"] = None
    check_run_options(args, idle, moot)
    check_folder(out)  # --plan and --report-only too: a run would stop on it
    if getattr(args, "ray", None):
        from clusterfl.errors import require

        require("ray", "ray")  # before any folder is touched
    runs = sweep.plan(out)  # every config validated before anything runs
    unused = _warn_unused(sweep)
    con = console()
    if idle == "plan":
        states = run_states(runs, out)  # what a run would do: as run_sweep decides
        from clusterfl.bench import older_note

        for r, state in zip(runs, states):
            con.print(f"{state:14s} {r.what}  ({r.target})", markup=False, soft_wrap=True)
            note = older_note(r.target, r.config)  # as the sweep says it when it runs
            if note is not None:
                con.print(f"{'':14s} {r.what}: {note}", markup=False, soft_wrap=True)
        count = {s: states.count(s) for s in ("done", "to run", "config changed", "failed")}
        con.print(f"{len(runs)} runs in {len(sweep.cells())} cell(s): {count['done']} done, "
                  f"{count['to run'] + count['config changed']} to run"
                  + (f" ({count['config changed']} of them again, as their config changed)"
                     if count["config changed"] else "")
                  + (f", {count['failed']} failed before (run again with --retry-failed)"
                     if count["failed"] else ""))
        return 0
    if idle == "report_only":
        rows = collect(runs, out)
        if not any(r["status"] in ("done", "diverged") for r in rows):
            stale = sum(r["status"] == "stale" for r in rows)
            raise ClusterFLError(
                f"--report-only: {out} holds no finished run of this sweep"
                + (f" as it is now ({stale} ran with another config: config changed); run it "
                   "again (without --report-only) to redo them" if stale else
                   "; run it first (without --report-only), or give its folder with --out"))
    failures: list[str] = []
    argv = sys.argv[1:] if sys.argv[1:2] == [command.split()[-1]] else []
    shown = shlex.join(["clusterfl", *argv]) if argv else command
    if not getattr(args, "report_only", False):
        try:
            failures = run_sweep(
                runs, out, jobs=args.jobs, ray=args.ray, cpus_per_run=args.cpus_per_run,
                gpus_per_run=args.gpus_per_run,
                retry_failed=getattr(args, "retry_failed", False),
                overwrite=getattr(args, "overwrite", False),
                log=(lambda m: None) if getattr(args, "quiet", False) else (
                    lambda m: print(m, flush=True)))
        except KeyboardInterrupt as stop:
            from clusterfl.cli_util import stop_status

            done = run_states(runs, out).count("done")
            again = shlex.join(["clusterfl", *(a for a in argv if a != "--overwrite")]) \
                if argv else command
            print(f"clusterfl: interrupted; {done} of {len(runs)} runs finished in {out}. The "
                  "same command continues (finished runs are kept, interrupted ones resume "
                  f"from their checkpoints): {again}", file=sys.stderr)
            return stop_status(stop)
    rows = collect(runs, out)
    others = other_runs(runs, out)
    if others:
        print(f"clusterfl: warning: {out} also holds {len(others)} run(s) this sweep does not "
              f"list (e.g. {others[0]}): they are kept as they are and left out of its table "
              "and report", file=sys.stderr)
    csv_path, parquet, why = write_table(rows, out)
    if why:
        print(f"clusterfl: warning: {why}", file=sys.stderr)
    stale = [r for r in rows if r["status"] == "stale"]
    if stale:
        print(f"clusterfl: warning: {len(stale)} of {len(rows)} runs are stale: they ran with "
              f"another config than the sweep's now (e.g. {stale[0]['path']}); they are marked "
              "stale in the table and the report, not counted as results; running the sweep "
              "(without --report-only) runs them again", file=sys.stderr)
    report = write_report(sweep, runs, rows, out, shown, failures, warnings=unused)
    con.print(console_table(rows, sweep.seeds))
    note = range_note(rows, sweep.seeds, plain=True)  # as the report's footnote
    if note:
        con.print(note, markup=False, soft_wrap=True)
    con.print(f"table of every run: {csv_path}" + (f", {parquet}" if parquet else ""))
    con.print(f"report: {report}")
    if failures:
        raise SweepError(failures)
    diverged = [r for r in rows if r["status"] == "diverged"]
    for r in diverged:
        print(f"clusterfl: warning: {r['path']} diverged: {r['error']}", file=sys.stderr)
    if diverged and getattr(args, "fail_on_divergence", False):
        return DIVERGED_EXIT
    return 0


def _warn_unused(sweep: Any) -> list[str]:
    """The base config's `[algorithm]` options that some of the sweep's methods do not use
    (`compare.unused_options`), and the grid's `algorithm.X` keys that some methods do not
    have, printed on stderr and returned (for the report)."""
    from clusterfl.algorithms import algorithm_class
    from clusterfl.compare import parse_algorithm_spec, unused_options
    from clusterfl.config import load_config
    from clusterfl.errors import ConfigError

    swept = [k.removeprefix("algorithm.") for k in sweep.grid if k.startswith("algorithm.")]
    names = [parse_algorithm_spec(m)["name"] for m in sweep.methods]  # checked by plan
    lines = []
    with contextlib.suppress(ConfigError):  # else valid only with the grid's values: each
        lines = unused_options(load_config(sweep.base), sweep.methods, swept)  # cell checked
    for option in swept:  # one that no method has was refused by plan
        lacking = list(dict.fromkeys(
            n for n in names if option not in algorithm_class(n, "sweep.methods").Config
            .model_fields))
        if lacking:
            lines.append(f"sweep.grid.algorithm.{option} applies only to the methods with "
                         f"option {option!r}: {', '.join(lacking)} "
                         f"{'has' if len(lacking) == 1 else 'have'} none and run"
                         f"{'s' * (len(lacking) == 1)} every cell without it")
    for line in lines:
        print(f"clusterfl: warning: {line}", file=sys.stderr)
    return lines
