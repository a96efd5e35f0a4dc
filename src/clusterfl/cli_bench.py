"""`clusterfl bench`: run the benchmark suite (or its quick pass) and write the results table.

The suite machinery (`clusterfl.bench`, torch, the methods) is imported when the command runs,
not when the parser is built, so `clusterfl --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from clusterfl.errors import ClusterFLError

SUITE = Path("benchmarks/suite")


def _names(text: str) -> list[str]:
    """A comma-separated list of names; empty (`--only "$UNSET"`) is refused, not read as
    the whole suite."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no name given; list names separated by commas")
    return names


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    b = subparsers.add_parser(
        "bench", help="run the reproduction suite and write benchmarks/RESULTS.md",
        description="Runs every suite scenario × method × seed (finished runs are skipped, "
        "interrupted ones resume), then writes the results table beside the papers' numbers.",
    )
    b.add_argument("--quick", action="store_true",
                   help="the reduced pass (minutes): fewer rounds/clients, one seed")
    b.add_argument("--suite", default=SUITE, help=f"suite folder (default {SUITE})")
    b.add_argument("--runs",
                   help="run folders (default benchmarks/runs/full or benchmarks/runs/quick)")
    b.add_argument("--results", help="results file (default benchmarks/RESULTS.md, "
                   "or benchmarks/RESULTS_quick.md with --quick)")
    b.add_argument("--only", type=_names, default=[],
                   help="comma-separated scenario names (suite file stems)")
    b.add_argument("--methods", type=_names, default=[],
                   help="comma-separated algorithm names (e.g. fedem,pacfl): run and tabulate "
                   "only the suite methods of those algorithms")
    b.add_argument("--report-only", action="store_true",
                   help="write the results from finished runs without running anything")
    from clusterfl.cli_sweep import add_run_options

    add_run_options(b)  # --jobs, --ray, --cpus-per-run, --gpus-per-run (as `clusterfl sweep`)
    b.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
    b.add_argument("--device", help="where the runs compute: auto, cpu, cuda or cuda:N "
                   "(sets backend.device of every run; default auto)")
    b.add_argument("--fail-on-divergence", action=argparse.BooleanOptionalAction, default=None,
                   help="a diverged run (every update of a round rejected, or a non-finite or "
                   "exploding training loss) counts as a failed run: the command exits "
                   "non-zero after writing the table (default: on)")
    b.set_defaults(func=cmd_bench)
    return b


def cmd_bench(args: argparse.Namespace) -> int:
    from clusterfl.bench import (
        BenchError,
        finished_runs,
        load_suite,
        migrate_run_dirs,
        run_suite,
        write_results,
    )
    from clusterfl.cli_sweep import check_run_options
    from clusterfl.rundir import check_folder

    check_run_options(args, "report_only" if args.report_only else None,  # before any file
                      {"fail_on_divergence": None})  # only run_suite reads it
    if args.fail_on_divergence is None:
        args.fail_on_divergence = True  # on by default
    if args.data_dir:
        os.environ["CLUSTERFL_DATA"] = str(args.data_dir)
    kind = "quick" if args.quick else "full"
    runs = Path(args.runs) if args.runs else Path("benchmarks/runs") / kind
    results = Path(args.results) if args.results else Path(
        "benchmarks/RESULTS_quick.md" if args.quick else "benchmarks/RESULTS.md")
    if results.is_dir():  # found before the runs, not after them
        raise ClusterFLError(f"--results: {results} is a folder; give the results file's "
                             f"path, e.g. {results / 'RESULTS.md'}")
    check_folder(results, "--results", file=True)
    scenarios = load_suite(Path(args.suite), args.quick, args.only, args.methods)
    _warn_unused(scenarios)
    if args.device:
        from clusterfl.config import apply_overrides

        for s in scenarios:
            s.config = apply_overrides(s.config, [f"backend.device={json.dumps(args.device)}"])
        if args.ray is None and not args.report_only:  # before --runs is made (its lock)
            from clusterfl.config import load_config
            from clusterfl.engine.device import check_devices

            check_devices(load_config(s.config) for s in scenarios)
    failed: BenchError | None = None
    if args.report_only:
        migrate_run_dirs(scenarios, runs, log=lambda m: print(m, flush=True))
        if not finished_runs(scenarios, runs):
            raise ClusterFLError(f"--report-only: {runs} holds no finished run of these "
                                 f"scenarios, so {results} is not written; give the suite's "
                                 "run folder with --runs")
    else:
        try:
            run_suite(scenarios, runs, log=lambda m: print(m, flush=True), jobs=args.jobs,
                      fail_on_divergence=args.fail_on_divergence, ray=args.ray,
                      cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run)
        except BenchError as exc:  # the table is still written from the runs that finished
            failed = exc
    command = " ".join(["clusterfl", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] \
        else "clusterfl bench" + (" --quick" if args.quick else "")
    preamble = ("- **quick pass**: fewer rounds and clients and one seed (each suite file's "
                "`[suite.quick]`): a check that every method runs end to end, *not* a "
                "reproduction — the paper columns are there for orientation only\n"
                if args.quick else "")
    try:
        path = write_results(scenarios, runs, results, command, preamble=preamble,
                             sections=_extra_sections())
    except ClusterFLError:  # a full disk: the runs' own failure is said too, not lost
        if failed is not None:
            print(f"clusterfl: error: {failed}", file=sys.stderr)
        raise
    print(f"results written to {path}")
    if failed is not None and failed.diverged:  # as run/compare/sweep: status 3, not 2
        from clusterfl.cli_util import DIVERGED_EXIT

        print(f"clusterfl: error: {failed}", file=sys.stderr)
        return DIVERGED_EXIT
    if failed is not None:
        raise failed
    return 0


def _warn_unused(scenarios: list[Any]) -> None:
    """Each scenario's `[config.algorithm]` options that some of its methods do not use
    (`compare.unused_options`, as compare and sweep say them), on stderr."""
    from clusterfl.compare import unused_options
    from clusterfl.config import load_config

    for s in scenarios:
        for line in unused_options(load_config(s.config), s.methods):
            print(f"clusterfl: warning: {s.name}: {line}", file=sys.stderr)


def _extra_sections() -> list[str]:
    """The engine and scaling tables, when their benchmark files exist."""
    out = []
    for title, name in (("Performance: the engine", "benchmarks/engine_results.md"),
                        ("Scaling", "benchmarks/scaling_results.md")):
        path = Path(name)
        if path.is_file():
            body = path.read_text(encoding="utf-8").split("\n", 1)[-1].strip()
            out.append(f"## {title}\n\nFrom `{name}`:\n\n{body}\n")
    return out
