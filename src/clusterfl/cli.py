"""The `clusterfl` command line. Errors end in one clear line, exit code 2.

Building the parser imports nothing heavy: torch, numpy, the methods, the experiment, Flower
and matplotlib are imported inside the command that needs them, so `clusterfl --help` and
every subcommand's `--help` answer at once (tests/core/test_cli.py checks both the time and
that none of those modules is loaded).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterfl.cli_util import (
    DIVERGED_EXIT,
    Parser,
    Terminated,
    console,
    encodable_streams,
    given_twice,
    stop_status,
)
from clusterfl.config_util import MAX_SEED
from clusterfl.errors import ClusterFLError, ConfigError, DataError

if TYPE_CHECKING:
    from rich.console import Console

DEMO_METHODS = [
    "fedavg", "fedprox:mu=0.01", "local", "ifca:n_clusters=4", "fesem:n_clusters=4",
    "ifca_cam:n_clusters=4:warmup_rounds=5", "cfl_gp:n_clusters=4:protocol=model", "cfl",
    "fedsoft:n_clusters=4", "flhc",
]
"""The demo's methods: every method that fits its federation (FedEM's mixture of shared-input
components cannot tell rotations apart; PACFL's default angle threshold splits 8×8 digits
into ~18 clusters: both are in the suite instead)."""


OVERWRITE_HINT = "--overwrite to replace it, or another --out"


def _console() -> Console:
    return console()


def _overrides(args: argparse.Namespace) -> list[str]:
    sets = list(args.set or [])
    if getattr(args, "data_dir", None):
        sets.append(f"data.data_dir={_toml_str(args.data_dir)}")
    if getattr(args, "device", None):
        sets.append(f"backend.device={_toml_str(args.device)}")
    return sets


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _progress(args: argparse.Namespace) -> bool | None:
    return False if getattr(args, "quiet", False) else None


def cmd_run(args: argparse.Namespace) -> int:
    from clusterfl.experiment import Experiment, claim_run_dir
    from clusterfl.report import summary_table

    out = Path(args.out or Path("runs") / Path(args.config).stem)
    config = _load(args)  # a bad config fails before anything in `out` is touched
    claim_run_dir(out, resume=args.resume, overwrite=args.overwrite,
                  hint="--resume to continue the run there or --overwrite to replace it")
    exp = Experiment(config, out)
    try:
        history = exp.run(resume=args.resume, progress=_progress(args))
    except KeyboardInterrupt as stop:
        print(_interrupted(args, out, exp), file=sys.stderr)
        return stop_status(stop)
    con = _console()
    con.print(summary_table([history.summary]))
    written = [n for n in ("summary.json", "history.jsonl", "report.md", "figures/",
                           "tensorboard/") if (out / n).exists()]
    con.print(f"results in {out}/ ({', '.join(written)})")
    return _diverged([history.summary], args)


def _interrupted(args: argparse.Namespace, out: Path, exp) -> str:
    """What Ctrl-C left behind, and the command that continues the run."""
    every, rounds = exp.config.run.checkpoint_every, exp.config.run.rounds
    held = exp.saved_round()  # what the file holds: Ctrl-C may land mid-save
    if held is None:
        why = ("checkpoints are off (checkpoint_every = 0)" if not every else
               f"before the first checkpoint (checkpoint_every = {every})")
        return (f"clusterfl: interrupted {why}: there is nothing to resume; run again with "
                f"--overwrite to start over in {out}")
    return (f"clusterfl: interrupted; the checkpoint in {out / 'checkpoint'} holds round "
            f"{held} of {rounds}. Continue with --resume: {_again(args, 'run', out)}")


def _again(args: argparse.Namespace, command: str, out: Path, *options: str) -> str:
    """The command line that continues an interrupted `run` or `compare` into `out`: its
    config, `options`, the same `--set` and `--data-dir`, and `--resume`."""
    line = ["clusterfl", command, args.config, *options, "--out", str(out)]
    for item in args.set or []:
        line += ["--set", item]
    if args.data_dir:
        line += ["--data-dir", args.data_dir]
    return shlex.join([*line, "--resume"])




def _diverged(summaries: list, args: argparse.Namespace) -> int:
    """Name the runs that diverged (stderr); DIVERGED_EXIT with --fail-on-divergence."""
    bad = [s for s in summaries if s.divergence]
    for s in bad:
        print(f"clusterfl: warning: {s.label or s.algorithm} diverged: {s.divergence['reason']}",
              file=sys.stderr)
    if bad and getattr(args, "fail_on_divergence", False):
        print(f"clusterfl: error: {len(bad)} of {len(summaries)} run(s) diverged "
              "(--fail-on-divergence); the results are kept", file=sys.stderr)
        return DIVERGED_EXIT
    return 0


def _load(args: argparse.Namespace):
    from clusterfl.config import apply_overrides, load_config, read_toml

    return load_config(apply_overrides(read_toml(args.config), _overrides(args)))


def _spec_hint(exc: ConfigError, flag: str) -> ConfigError:
    """A comparison's unknown `algorithm.*` field, with where a method's own options go: the
    shared [algorithm] table only has what its base method has."""
    if exc.field.startswith("algorithm.") and exc.message.startswith("unknown field"):
        return ConfigError(exc.field, f"{exc.message} (the shared [algorithm] table; a "
                           f"method's own options go in its spec, e.g. {flag} "
                           "cfl:auto.separation=0.9)")
    return exc


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"clusterfl: warning: {line}", file=sys.stderr)


def cmd_compare(args: argparse.Namespace) -> int:
    from clusterfl.compare import comparison_configs, run_comparison
    from clusterfl.report import comparison_warnings, summary_table
    from clusterfl.rundir import check_resume_or_overwrite

    specs = args.algorithms.split(",")
    check_resume_or_overwrite(args.resume, args.overwrite)  # --seeds would overwrite
    if args.seeds is not None:
        return _compare_seeds(args, specs)
    extra = [name for name, on in (("--jobs", args.jobs != 1), ("--ray", args.ray),
                                   ("--cpus-per-run", args.cpus_per_run is not None),
                                   ("--gpus-per-run", args.gpus_per_run != 0),
                                   ("--retry-failed", args.retry_failed)) if on]
    if extra:
        raise ClusterFLError(f"{', '.join(extra)}: only with --seeds (several runs per method)")
    try:
        config = _load(args)
    except ConfigError as exc:
        raise _spec_hint(exc, "--algorithms") from None
    folders = [f for f, _ in comparison_configs(config, specs)]  # errors before any run
    out = Path(args.out or Path("runs") / f"compare-{Path(args.config).stem}")
    try:
        results = run_comparison(config, specs, out, progress=_progress(args),
                                 overwrite=args.overwrite, resume=args.resume,
                                 hint="--resume to continue it, --overwrite to replace it, "
                                 "or another --out")
    except KeyboardInterrupt as stop:
        again = _again(args, "compare", out, "--algorithms", args.algorithms)
        print(f"clusterfl: interrupted; the finished runs in {out} are kept, interrupted ones "
              f"continue from their checkpoints with --resume: {again}", file=sys.stderr)
        return stop_status(stop)
    con = _console()
    con.print(summary_table([h.summary for _, h in results]))
    _warn(comparison_warnings([out / f for f in folders]))
    con.print(f"comparison report: {out / 'report.md'}")
    return _diverged([h.summary for _, h in results], args)


def _seed_list(text: str) -> list[int]:
    """'0,1,2', '0-4' or '0-2,10' (ranges inclusive, at most 10,000 seeds)."""
    allowed = ("distinct comma-separated integers or ranges in 0..2**63-1, e.g. 0,1,2 or "
               f"0-4; got {text!r}")
    seeds: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            a, dash, b = part.partition("-")
            first, last = int(a), int(b) if dash else int(a)
            if last < first or last - first >= 10_000 or len(seeds) > 10_000:
                raise ValueError
            seeds.extend(range(first, last + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {allowed}") from None
    if (not seeds or min(seeds) < 0 or max(seeds) > MAX_SEED
            or len(set(seeds)) != len(seeds)):
        raise argparse.ArgumentTypeError(f"expected {allowed}")
    return seeds


def _compare_seeds(args: argparse.Namespace, specs: list[str]) -> int:
    """`compare --seeds`: the sweep of the methods and seeds (clusterfl.sweep), no grid."""
    from clusterfl.cli_sweep import run_and_report
    from clusterfl.config import apply_overrides, read_toml
    from clusterfl.sweep import Sweep

    raw = apply_overrides(read_toml(args.config), _overrides(args))
    sweep = Sweep(base=raw, methods=[s.strip() for s in specs if s.strip()], seeds=args.seeds,
                  title=f"compare {Path(args.config).name}", source=f"`{args.config}`")
    out = Path(args.out or Path("runs") / f"compare-{Path(args.config).stem}")
    return run_and_report(sweep, out, args, "clusterfl compare")


def cmd_report(args: argparse.Namespace) -> int:
    import contextlib

    from clusterfl.report import comparison_warnings, write_comparison_report, write_run_report
    from clusterfl.rundir import FolderLock, check_report_out, make_folder

    dirs = [Path(d) for d in args.dirs]
    seen: set[Path] = set()
    for d in dirs:  # a run listed twice would be compared with itself
        if d.resolve() in seen:
            raise ClusterFLError(f"report: {d} is listed twice; list each run once")
        seen.add(d.resolve())
    own = len(dirs) == 1 and args.out is None  # one run, no --out: its own report.md
    out = dirs[0] if own else Path(args.out or "runs/report")
    if not own:
        dirs = _finished_runs(dirs)  # before --out is made (not left there empty)
        check_report_out(out, dirs)  # never into a run folder
        make_folder(out)
    with FolderLock(out) if out.is_dir() else contextlib.nullcontext():
        path = write_run_report(out) if own else write_comparison_report(dirs, out)
    if len(dirs) > 1:
        _warn(comparison_warnings(dirs))
    _console().print(f"report: {path}")
    return 0


def _finished_runs(dirs: list[Path]) -> list[Path]:
    """The runs a report of several compares: a comparison's or sweep's own files given
    beside its runs (`clusterfl report runs/cmp/*`: its report.md, figures, tables) are
    skipped with a note; runs that have not finished are left out with a warning (an error
    when no run has finished); any other path that is no finished run is an error."""
    from clusterfl.records import HISTORY_FILE, SUMMARY_FILE, read_summary
    from clusterfl.report.figures import COMPARISON_FIGURES
    from clusterfl.report.markdown import REPORT_FILE
    from clusterfl.sweep import CSV_FILE, PARQUET_FILE, STATE_FILE

    own = {REPORT_FILE, CSV_FILE, PARQUET_FILE, STATE_FILE,
           *(f"{name}.png" for name in COMPARISON_FIGURES)}
    folders = {d.parent.resolve() for d in dirs if d.is_dir()}
    skipped = [d for d in dirs if d.is_file() and d.name in own
               and d.parent.resolve() in folders]  # beside a run given with it
    for folder in dict.fromkeys(d.parent for d in skipped):
        names = ", ".join(d.name for d in skipped if d.parent == folder)
        print(f"clusterfl: note: skipped {names} in {folder}: the comparison's own files, not "
              "runs", file=sys.stderr)
    runs, unfinished = [], []
    for d in (d for d in dirs if d not in skipped):
        if d.is_dir() and not (d / SUMMARY_FILE).is_file() and (d / HISTORY_FILE).is_file():
            unfinished.append(d)
            continue
        read_summary(d)  # a path that is no finished run: its error
        runs.append(d)
    if unfinished:
        names = ", ".join(str(d) for d in unfinished)
        again = ("a stopped run continues with --resume (`clusterfl run CONFIG --out RUN "
                 "--resume`, or its comparison's or sweep's own command)")
        if not runs:
            raise ClusterFLError(f"report: no run has finished (no {SUMMARY_FILE}: "
                                 f"{names}); {again}")
        _warn([f"report: left out {len(unfinished)} run(s) that have not finished (no "
               f"{SUMMARY_FILE}): {names}; {again}, then report again"])
    return runs


def cmd_demo(args: argparse.Namespace) -> int:
    from importlib import resources

    from clusterfl.compare import run_comparison
    from clusterfl.config import apply_overrides, load_config, read_toml
    from clusterfl.report import summary_table

    demo = resources.files("clusterfl") / "configs" / "demo.toml"
    with resources.as_file(demo) as path:
        raw = apply_overrides(read_toml(path), list(args.set or []))
    try:
        config = load_config(raw)
    except ConfigError as exc:
        raise _spec_hint(exc, "--methods") from None
    out = Path(args.out)
    con = _console()
    con.print(f"[bold]clusterfl demo[/]: digits, rotation scenario, "
              f"{config.scenario.model_dump().get('n_clients')} clients; "
              f"methods: {', '.join(args.methods)}")
    try:
        results = run_comparison(config, args.methods, out, progress=_progress(args),
                                 overwrite=args.overwrite, hint=OVERWRITE_HINT)
    except ConfigError as exc:  # the specs are the demo's --methods, not compare's flag
        if exc.field != "--algorithms":
            raise
        raise ConfigError("--methods", exc.message.replace("--algorithms", "--methods")) \
            from None
    con.print(summary_table([h.summary for _, h in results]))
    con.print(f"report with figures: {out / 'report.md'}")
    return _diverged([h.summary for _, h in results], args)


def cmd_data(args: argparse.Namespace) -> int:
    from clusterfl.data import DATASETS, default_data_dir, download, verify
    from clusterfl.data.catalog import BUILTIN
    from clusterfl.data.download import DEFAULT_TIMEOUT, MAX_TIMEOUT

    con = _console()
    for option, value, actions in (("--out", args.out, ("shard",)),
                                   ("--set", args.set, ("shard",)),
                                   ("--base-url", args.base_url, ("download",)),
                                   ("--timeout", args.timeout, ("download",))):
        if value is not None and args.action not in actions:  # would be ignored
            raise ConfigError(option, f"only for `clusterfl data {' / '.join(actions)}`, not "
                                      f"`data {args.action}`")
    if args.action == "shard":
        return _shard(args, con)
    timeout = DEFAULT_TIMEOUT
    if args.timeout is not None:
        try:
            timeout = float(args.timeout)
        except ValueError:
            timeout = float("nan")  # refused below, as 0 or -1 is
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ConfigError("--timeout", f"must be a number of seconds > 0 and at most "
                              f"{MAX_TIMEOUT:g} (a day), got {args.timeout!r}")
    root = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    if root.exists() and not root.is_dir():
        source = "--data-dir" if args.data_dir else "$CLUSTERFL_DATA"
        raise ConfigError(source, f"{root} is a file, not a data folder")
    if args.action == "list":
        if args.name is not None:
            raise ClusterFLError(f"data list: takes no dataset name (got {args.name!r}); "
                                 f"`clusterfl data verify {args.name}` checks one")
        con.print(f"data directory: {root}")
        for name in sorted(DATASETS):
            if not DATASETS[name].files:  # made, not downloaded (FEMNIST): its folder
                there = _holds_files(root / name)
                state = (f"files present, not read here (`clusterfl data verify {name}` "
                         "reads them)" if there else "missing")
                con.print(f"  {name:15s} {state} (not downloadable: "
                          f"{DATASETS[name].how_to_get})")
                continue
            con.print(f"  {name:15s} {_list_status(name, root, verify(name, root))}"
                      f"{_leftover_note(name, root)}", soft_wrap=True)
        for name, info in BUILTIN.items():  # every source a run reads with no files
            con.print(f"  {name:15s} built in: {info.description}")
        return 0
    allowed = ", ".join(sorted(n for n in DATASETS if DATASETS[n].files))
    if args.name in BUILTIN:  # `data list` names them; a run reads them with no files
        con.print(f"{args.name}: built in: {BUILTIN[args.name].description}")
        return 0
    if args.name is not None and args.name not in DATASETS:
        raise ClusterFLError(f"dataset: unknown {args.name!r}; allowed: "
                             f"{', '.join(sorted(DATASETS))} (files), "
                             f"{', '.join(sorted(BUILTIN))} (built in)")
    if args.action == "download" and args.name is None:
        raise ClusterFLError(f"data download: name the dataset to fetch, one of: {allowed} "
                             "(e.g. `clusterfl data download mnist`)")
    if args.name is not None:
        names = [args.name]
    else:  # verify: the datasets that are there (their files, or their folder's readable
        # files: CIFAR's extracted batches, a LEAF folder), not the ones a user never fetched
        names = [n for n in sorted(DATASETS)
                 if any((root / f.path).exists() for f in DATASETS[n].files)
                 or _holds_files(root / n)]
        for n in sorted(n for n in set(DATASETS) - set(names) if DATASETS[n].files):
            con.print(f"{n}: not present in {root} (skipped; `clusterfl data download {n}` "
                      f"fetches it){_leftover_note(n, root)}", soft_wrap=True)
        if not names:
            print(f"clusterfl: error: no dataset files in {root}; name one to check, or "
                  f"fetch one with `clusterfl data download NAME` ({allowed})", file=sys.stderr)
            return 1
    bad = 0
    for name in names:
        if args.action == "download":
            download(name, root, base_url=args.base_url, timeout=timeout)
        status = verify(name, root)
        for s in status:
            con.print(f"{name}: {s}")
        if args.action == "verify" and _leftover_note(name, root):
            con.print(f"{name}: {_leftover_note(name, root).lstrip('; ')}", soft_wrap=True)
        if args.action == "verify" and not all(s.ok for s in status) and any(
                s.status != "missing" for s in status):
            bad += 1  # a wrong checksum: the reader's verdict would not change that
        elif args.action == "verify":
            ok, line = _read_check(name, root)
            bad += not ok
            con.print(f"{name}: {line}")
    return 1 if bad and args.action == "verify" else 0


def _list_status(name: str, root: Path, status: list[Any]) -> str:
    """`data list`'s word on a downloadable dataset from its files' `FileStatus`es: an
    extracted archive or loose files (CIFAR's batches, EMNIST's .gz files), which runs read,
    are not "missing"; files of the wrong size or checksum are not "incomplete"."""
    if all(s.ok for s in status):
        return "present"
    if any(s.status in ("wrong_size", "bad_checksum") for s in status):
        return f"present, not the official files (`clusterfl data verify {name}` says which)"
    folder = root / name
    if all(s.status == "missing" for s in status) and _holds_files(folder):
        return (f"present as other files (extracted or loose; `clusterfl data verify {name}` "
                "reads them)")
    return "missing or incomplete"


def _leftover_note(name: str, root: Path) -> str:
    """"; ..." naming the partial files a killed `data download` of `name` left, or ""."""
    from clusterfl.data.download import partial_downloads

    parts = partial_downloads(name, root)
    if not parts:
        return ""
    return (f"; left by an interrupted download: {', '.join(str(p) for p in parts)} (not "
            f"counted; the next `clusterfl data download {name}` removes it)")


def _holds_files(folder: Path) -> bool:
    """`folder` holds a file or folder of a dataset: hidden entries do not count (the
    `.NAME.*.part` a killed `data download` leaves, a `.DS_Store`)."""
    return folder.is_dir() and any(not f.name.startswith(".") for f in folder.iterdir())


def _read_check(name: str, root: Path) -> tuple[bool, str]:
    """Whether the reader reads dataset `name` from `root` (whatever form its files take: an
    archive, extracted batches, a LEAF folder), and a line saying what it read or why not."""
    from clusterfl.data.sources import load_source

    try:
        src = load_source(name, root, verify=False)
    except (DataError, ConfigError) as exc:
        return False, f"not readable: {exc}"
    if src.text is not None:
        texts = src.text
        sizes = f"{len(texts.train_texts):,} train and {len(texts.test_texts):,} test articles"
    else:
        sizes = f"{len(src.y_train):,} train and {len(src.y_test):,} test samples"
    return True, f"read: {sizes}, {src.n_classes} classes"


def _shard(args: argparse.Namespace, con: Any) -> int:
    """`clusterfl data shard CONFIG --out DIR`: the config's federation, written once as
    memory-mapped shards (`clusterfl.data.shards`)."""
    from clusterfl.config import apply_overrides, load_config, read_toml
    from clusterfl.data.shards import write_shards
    from clusterfl.experiment import build_federation

    if args.name is None or args.out is None:
        raise ClusterFLError("data shard: expected `clusterfl data shard CONFIG.toml --out "
                             "DIR` (the run config whose federation to write)")
    config = load_config(apply_overrides(read_toml(args.name), _overrides(args)))
    federation = build_federation(config)
    out = write_shards(federation, args.out)
    held = getattr(config.scenario, "holdout", None)
    if held:  # a run's choice, not the federation's: scenario 'given' (shards) has none
        _warn([f"scenario.holdout = {held:g} is not kept in the shards: they hold all "
               f"{federation.n_clients} clients, and a run on them trains on every one and "
               "places none (its results are not this config's)"])
    size = sum(f.stat().st_size for f in out.iterdir())
    con.print(f"{federation.describe()}\nwritten to {out} ({size / 2**20:,.1f} MiB); run on it "
              f"with [data] source = \"shards\", path = \"{out.resolve()}\" (and no "
              "[scenario] table)", markup=False)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """`clusterfl config show [CONFIG]` (`show` may be left out): the resolved config."""
    from clusterfl.config import apply_overrides, dump_toml, load_config, read_toml

    words = [w for w in (args.action, args.config) if w is not None]
    if words and words[0] == "show":
        words = words[1:]
    if len(words) > 1:
        raise ClusterFLError(f"config: expected `clusterfl config show [CONFIG.toml]`, got "
                             f"{' '.join(words)!r}")
    args.config = words[0] if words else None
    raw = {} if args.config is None else read_toml(args.config)
    config = load_config(apply_overrides(raw, _overrides(args)))
    print(dump_toml(config.to_dict()), end="")
    left = config.unwritten()
    if left:  # every default shown: those a config.toml omits as comments
        print("\n# Not written above (a run's config.toml omits them too): their values now")
        for key, value in left:
            shown = "none" if value is None else dump_toml({"v": value})[4:].strip()
            print(f"# {key} = {shown}")
    return 0


def fail_on_divergence(q: argparse.ArgumentParser, default: bool = False) -> None:
    q.add_argument("--fail-on-divergence", action=argparse.BooleanOptionalAction,
                   default=default,
                   help=f"exit with code {DIVERGED_EXIT} when a run diverged (every update of "
                   "a round rejected, or a non-finite or exploding training loss); the "
                   f"results are written either way (default: {'on' if default else 'off'})")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="clusterfl", description="Clustered federated learning: run, compare, report."
    )
    p.add_argument("--data-dir", dest="global_data_dir", metavar="DATA_DIR",
                   help="dataset folder, as the subcommands' --data-dir (default: "
                   "$CLUSTERFL_DATA, else ~/.cache/clusterfl)")
    sub = p.add_subparsers(dest="command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a config value, e.g. --set rounds=20 --set train.lr=0.05")
        q.add_argument("--data-dir", help="dataset folder, before the config's data.data_dir "
                       "(default: data.data_dir, else $CLUSTERFL_DATA, else ~/.cache/clusterfl)")
        q.add_argument("--quiet", action="store_true", help="no progress bar")
        q.add_argument("--device", help="where the simulation/sequential backend computes: "
                       "auto, cpu, cuda or cuda:N (sets backend.device; default auto)")
        fail_on_divergence(q)

    r = sub.add_parser("run", help="run one method from a TOML config")
    r.add_argument("config", help="the run config (TOML)")
    r.add_argument("--out", help="run directory (default runs/<config name>); it holds one "
                                 "run: reusing it needs --resume or --overwrite")
    again = r.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last checkpoint")
    again.add_argument("--overwrite", action="store_true",
                       help="remove the files of the run in --out first (a folder holding "
                       "anything else is refused)")
    common(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("compare", help="several methods on the same federation")
    c.add_argument("config", help="the run config (TOML) whose federation every method gets")
    c.add_argument("--algorithms", required=True,
                   help="comma-separated; parameters with ':', e.g. fedavg,fedprox:mu=0.1; "
                   "each is merged into the config's [algorithm] table: its options that a "
                   "method has (e.g. fraction) apply to that method, the spec's win; one "
                   "that no method has is named in a warning")
    c.add_argument("--out", help="output folder (default runs/compare-<config name>)")
    c.add_argument("--overwrite", action="store_true",
                   help="remove the files of an earlier comparison in --out first (a folder "
                   "holding anything else is refused)")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted comparison in --out: finished runs are kept, "
                   "interrupted ones continue from their checkpoints")
    c.add_argument("--seeds", type=_seed_list, metavar="0,1,2",
                   help="run every method on each seed, given as 0,1,2 or a range 0-4 "
                   "(OUT/<method>/seed<N>; resumable, as a "
                   "sweep) and write mean ± std, 95 %% intervals and paired comparisons "
                   "(results.csv, report.md)")
    from clusterfl.cli_sweep import add_run_options

    add_run_options(c)
    c.add_argument("--retry-failed", action="store_true",
                   help="with --seeds: run again the runs that failed before")
    common(c)
    c.set_defaults(func=cmd_compare)

    rep = sub.add_parser("report", help="(re)write the report of run directories")
    rep.add_argument("dirs", nargs="+", help="run directories (one: its own report; several: "
                     "a report comparing the finished ones; a comparison's own files given "
                     "beside its runs, as by runs/cmp/*, are skipped)")
    rep.add_argument("--out", help="output folder of a report comparing the runs (default "
                     "runs/report; never a run's folder); one run without --out: its own "
                     "report.md is rewritten")
    rep.set_defaults(func=cmd_report)

    d = sub.add_parser("demo", help="the built-in demo (no files needed)")
    d.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    d.add_argument("--overwrite", action="store_true",
                   help="replace an earlier demo in --out (only the files clusterfl "
                   "wrote; a folder holding anything else is refused)")
    d.add_argument("--methods", type=lambda s: s.split(","), default=DEMO_METHODS,
                   help="comma-separated method specs as for compare --algorithms "
                   f"(default {','.join(DEMO_METHODS)})")
    d.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="change the demo's config, e.g. rounds=10")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    fail_on_divergence(d)
    d.set_defaults(func=cmd_demo)

    data = sub.add_parser("data", help="list, verify, download or shard datasets")
    data.add_argument("action", choices=["list", "verify", "download", "shard"],
                      help="list: what is there; verify [NAME]: check the files of NAME, or "
                      "of every dataset present; download NAME: fetch and check; shard "
                      "CONFIG --out DIR: write the config's federation once, to be read "
                      "memory-mapped ([data] source = \"shards\", path = DIR)")
    data.add_argument("name", nargs="?",
                      help="a dataset of `clusterfl data list` (mnist, fashion_mnist, "
                      "cifar10, cifar100, emnist, femnist, ag_news ...; shard: a run config)")
    data.add_argument("--out", help="shard: the folder to write (new, empty, or an earlier "
                      "shard, which is replaced)")
    data.add_argument("--set", action="append", metavar="KEY=VALUE",
                      help="shard: override a config value")
    data.add_argument("--data-dir", help="data folder (default: $CLUSTERFL_DATA or cache)")
    data.add_argument("--base-url", help="mirror to download from instead of the official host")
    data.add_argument("--timeout", metavar="SECONDS", help="download: give up on a server "
                      "that sends nothing for this long (default 60; > 0, at most 86400)")
    data.set_defaults(func=cmd_data)

    cfg = sub.add_parser(
        "config", help="print a resolved config with all defaults",
        usage="clusterfl config show [CONFIG.toml] [--set KEY=VALUE ...] [--data-dir DIR]",
        description="Print CONFIG.toml (or, without it, the default config) with every "
        "default filled in and --set applied, as TOML. `show` may be left out.")
    cfg.add_argument("action", nargs="?", metavar="show", help="the only action (optional)")
    cfg.add_argument("config", nargs="?", help="a run config (default: the built-in defaults)")
    cfg.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config value (as run takes it)")
    cfg.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
    cfg.set_defaults(func=cmd_config)

    from clusterfl import cli_bench, cli_encoder, cli_flower, cli_place, cli_sweep

    cli_place.add_parser(sub)
    cli_encoder.add_parser(sub)
    cli_flower.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_sweep.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    encodable_streams()  # before --help: its text holds × and ±
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own line, not the top-level usage
        print(f"clusterfl: error: {_unrecognized(parser, args, extra)}", file=sys.stderr)
        return 2
    empty = _empty_value(parser, args)
    if empty:  # `--out "$UNSET"` would otherwise run with the default, without a word
        print(f"clusterfl: error: {empty}: an empty value; give one or leave the option out",
              file=sys.stderr)
        return 2
    folder = args.global_data_dir
    if folder:  # `clusterfl --data-dir X cmd ...` means `clusterfl cmd ... --data-dir X`
        if getattr(args, "data_dir", None) not in (None, folder):
            parser.error(f"--data-dir given twice: {folder} and {args.data_dir}")
        if hasattr(args, "data_dir"):
            args.data_dir = folder
        else:  # a command without its own option (flower, report, ...): as $CLUSTERFL_DATA
            os.environ["CLUSTERFL_DATA"] = folder
    _warn(given_twice(_path(parser, args), sys.argv[1:] if argv is None else argv))
    previous = _stop_on_sigterm()
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone (`| head -1`) is met here, not in Python's exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except ClusterFLError as exc:
        print(f"clusterfl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print(("clusterfl: stopped (SIGTERM)" if isinstance(stop, Terminated) else
               "clusterfl: interrupted") + (f"; {stop}" if stop.args else ""), file=sys.stderr)
        return stop_status(stop)
    except OSError as exc:
        print(f"clusterfl: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        line = out_of_memory(exc)
        if line is None:
            raise
        print(f"clusterfl: error: {line}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def os_error_line(exc: OSError) -> str:
    """An OS error no command turned into its own line: its words and the file it names
    (both, when it names two: a rename); a write's error names no file, and then the line
    ends with the words, not with an empty name after ': '."""
    words = exc.strerror or str(exc) or type(exc).__name__
    names = [str(n) for n in (exc.filename, exc.filename2) if n not in (None, "")]
    return f"{words}: {' -> '.join(names)}" if names else words


def _reader_gone() -> int:
    """The reader of stdout went away (`clusterfl config show | head -1`): say nothing (it
    printed `clusterfl: error: Broken pipe:`), point stdout at the null device so that
    Python's last flush does not fail again, and exit 1, as the commands that print through
    rich's console do there (rich's `Console.on_broken_pipe`)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return 1


def out_of_memory(exc: BaseException) -> str | None:
    """One line for an allocation that failed (torch's CPU allocator, a GPU's, Python's
    MemoryError); None for any other error."""
    text = str(exc)
    if not (isinstance(exc, MemoryError) or "can't allocate memory" in text
            or type(exc).__name__ == "OutOfMemoryError"):
        return None
    cpu = re.search(r"allocate (\d+) bytes", text)
    gpu = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]?i?B)", text)
    size = (f" {int(cpu.group(1)) / 2**30:,.1f} GiB" if cpu else
            f" {gpu.group(1)}" if gpu else "")
    where = "on the GPU" if gpu or "CUDA" in text else "in memory"
    return (f"out of memory: {size.strip() or 'an array'} could not be allocated {where}; a "
            "run needs less with a smaller model ([model]), fewer clients per round, fewer "
            "clients computed at once (backend.chunk_size) or backend.name = \"sequential\" "
            "(its checkpoint, if one was written, resumes with --resume)")


def _path(parser: argparse.ArgumentParser,
          args: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """The parsers `args` went through: clusterfl's, then each (sub)command's (`flower`,
    `flower run`)."""
    for action in parser._actions:
        name = getattr(args, action.dest, None)
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return [parser, *_path(action.choices[name], args)]
    return [parser]


def _unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  extra: list[str]) -> str:
    """What argparse's "unrecognized arguments" says, for the command given, with the
    nearest option of that command."""
    import difflib

    command = _path(parser, args)[-1]
    options = [o for a in command._actions for o in a.option_strings]
    near = difflib.get_close_matches(extra[0].split("=", 1)[0], options, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near and extra[0].startswith("-") else ""
    return (f"unrecognized arguments for `{command.prog}`: {' '.join(extra)}{hint} "
            f"(`{command.prog} --help` lists its options)")


#: options whose command refuses an empty value itself, with more to say (what to list)
OWN_EMPTY_CHECK = ("algorithms", "methods", "clients")


def _empty_value(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first option (or argument) of the command given, or of the commands above it,
    that holds an empty or blank string (alone or in a list); None if there is none."""
    for action in (a for p in _path(parser, args) for a in p._actions):
        value = getattr(args, action.dest, None)
        if action.dest in OWN_EMPTY_CHECK or isinstance(action, argparse._SubParsersAction):
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values) and value != action.default:
            return action.option_strings[-1] if action.option_strings else action.dest
    return None


def _raise_terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise Terminated


def _stop_on_sigterm() -> Any:
    """Install `_raise_terminated` for SIGTERM while a command runs (main thread, and only
    over the default handler: an embedding program's own stays); the handler it replaced,
    or None."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
