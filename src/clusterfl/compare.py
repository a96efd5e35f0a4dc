"""Run several methods on the same federation and write one comparison report."""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clusterfl.config import Config
from clusterfl.config_util import check_flag
from clusterfl.data.federation import Federation
from clusterfl.errors import ConfigError
from clusterfl.experiment import PROGRESS_NONE, Experiment, History, build_federation
from clusterfl.rundir import LOCK_FILE, RunDir, holds_run, runs_below, shown_names


def parse_algorithm_spec(spec: str) -> dict[str, Any]:
    """`"fedprox:mu=0.1:fraction=0.5"` → `{"name": "fedprox", "mu": 0.1, "fraction": 0.5}`.

    A method from outside the package is named by its import path, whose own `:` comes
    first: `"mypkg.methods:Mine:step=0.5"` → `{"name": "mypkg.methods:Mine", "step": 0.5}`.
    """
    from clusterfl.algorithms import ALGORITHMS

    name, *pairs = [p.strip() for p in spec.split(":")]
    if pairs and "=" not in pairs[0] and name not in ALGORITHMS:  # "module:Attr" of a path
        name = f"{name}:{pairs.pop(0)}"
    if not name:
        raise ConfigError("--algorithms", f"empty method name in {spec!r}")
    out: dict[str, Any] = {"name": name}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--algorithms", f"{pair!r} in {spec!r} has no value; write "
                                              f"{pair or 'key'}=VALUE after each ':'")
        key, text = (part.strip() for part in pair.split("=", 1))
        if not key:
            raise ConfigError("--algorithms", f"{pair!r} in {spec!r} has no option name; "
                                              "write KEY=VALUE after each ':'")
        if key == "name":
            raise ConfigError("--algorithms", f"'name' in {spec!r}: the method is the part "
                                              f"before the first ':' ({name!r}); write "
                                              f"{text or 'NAME'}:... for another one")
        if key in out:
            raise ConfigError("--algorithms", f"{key!r} is given twice in {spec!r}; give each "
                                              "option once")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text
    return out


def merged_spec(config: Config, spec: dict[str, Any]) -> dict[str, Any]:
    """The `[algorithm]` table of one method of a comparison: the options written in the
    config's `[algorithm]` table that this method has (shared options such as `fraction`),
    then the spec's own, which win. Options the method does not have are left out; those
    left at their defaults in the config are not written, so each method keeps its own. A
    spec's `fraction` or `per_round` replaces the config's sampling rule (one of the two)."""
    from clusterfl.algorithms import algorithm_class

    own = algorithm_class(spec["name"], "--algorithms").Config.model_fields
    written = config.algorithm.model_fields_set - {"name"}
    if {"fraction", "per_round"} & spec.keys():
        written -= {"fraction", "per_round"}
    table = config.to_dict()["algorithm"]
    return {**{k: table[k] for k in sorted(written) if k in own and k in table}, **spec}


def unused_options(config: Config, specs: list[str], swept: Sequence[str] = ()) -> list[str]:
    """One line per option written in the config's `[algorithm]` table that some compared
    method does not use: `merged_spec` leaves it out of a method that does not have it, and
    a spec's own value replaces it (as does a swept `algorithm.X` of a sweep, `swept`: the
    option names). Said, not silent: on stderr, in the comparison's report.md and in
    `Comparison.warnings`. An option of none of the methods, or replaced in every method
    that has it, is used by no run; one that only some methods have names the others."""
    from clusterfl.algorithms import algorithm_class

    given = [s.strip() for s in specs if s.strip()]
    parsed = [parse_algorithm_spec(s) for s in given]
    names = [p["name"] for p in parsed]
    fields = [algorithm_class(n, "--algorithms").Config.model_fields for n in names]
    lines = []
    for k in sorted(config.algorithm.model_fields_set - {"name"}):
        rule = {"fraction", "per_round"} if k in ("fraction", "per_round") else {k}
        have = [i for i, f in enumerate(fields) if k in f]
        used = [i for i in have if not rule & parsed[i].keys() and k not in swept]
        lacking = list(dict.fromkeys(n for i, n in enumerate(names) if i not in have))
        if not have:
            lines.append(f"algorithm.{k} in the config is an option of none of the compared "
                         f"methods ({', '.join(names)}): no run uses it")
        elif not used:
            by = "its spec" + (" or the sweep's grid" if k in swept else "")
            lines.append(f"algorithm.{k} in the config is replaced in every compared method "
                         f"that has it (by {by}: "
                         f"{', '.join(given[i] for i in have)}): no run uses it")
        elif lacking:
            lines.append(f"algorithm.{k} in the config applies to "
                         f"{', '.join(dict.fromkeys(names[i] for i in used))} only: "
                         f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no "
                         f"option {k!r} and run{'s' * (len(lacking) == 1)} without it")
    return lines


def comparison_configs(config: Config, specs: list[str]) -> list[tuple[str, Config]]:
    """(run folder name, config) of each method spec, merged into the config's `[algorithm]`
    table (`merged_spec`); raises ConfigError (`--algorithms`) when no method is given or two
    specs are the same method with the same options (they would be one run, in one folder,
    under one name)."""
    from clusterfl.algorithms import ALGORITHMS
    from clusterfl.naming import method_label, run_folder_name

    specs = [s for s in specs if s.strip()]
    if not specs:
        raise ConfigError("--algorithms", "no method given; list methods separated by commas, "
                          "e.g. fedavg,ifca:n_clusters=4; methods: "
                          + ", ".join(sorted(ALGORITHMS)))
    out: list[tuple[str, Config]] = []
    seen: dict[str, str] = {}
    for spec in specs:
        try:
            cfg = config.with_algorithm(merged_spec(config, parse_algorithm_spec(spec)))
        except ConfigError as exc:  # say which of the methods it is
            if not exc.field.startswith("algorithm.") or f"(spec {spec!r})" in exc.message:
                raise
            raise ConfigError(exc.field, f"{exc.message} (spec {spec!r})") from None
        folder = run_folder_name(cfg.algorithm)
        if folder in seen:
            raise ConfigError("--algorithms", f"{seen[folder]!r} and {spec!r} are the same "
                              f"method with the same options ({method_label(cfg.algorithm)}); "
                              "list each once")
        seen[folder] = spec
        out.append((folder, cfg))
    return out


def _check_arguments(config: Any, specs: Any, out_dir: Any, progress: Any, overwrite: Any,
                     resume: Any) -> None:
    """`run_comparison`'s arguments are of the kinds it takes (a truthy text for `overwrite`
    would delete the earlier comparison), or one line naming the argument."""
    if not isinstance(config, Config):
        raise ConfigError("config", f"got {type(config).__name__}: give a Config "
                          "(clusterfl.config.load_config(a dict), or of "
                          "clusterfl.config.read_toml(path))")
    if isinstance(specs, str) or not isinstance(specs, list | tuple) or not all(
            isinstance(s, str) for s in specs):
        raise ConfigError("specs", f"{specs!r}: give a list of method specs, e.g. "
                          "['fedavg', 'ifca:n_clusters=4'] (one spec a method)")
    if not isinstance(out_dir, str | os.PathLike):
        raise ConfigError("out_dir", f"got {type(out_dir).__name__}: give the comparison's "
                          "folder (str or Path)")
    check_flag("overwrite", overwrite)
    check_flag("resume", resume)
    check_flag("progress", progress, none=PROGRESS_NONE)


def _warn_other_runs(out: Path, folders: list[str]) -> None:
    """A resumed comparison whose folder holds runs of methods it does not list (an earlier
    `--algorithms`): they stay, left out of its report; said once on stderr."""
    others = sorted(e.name for e in out.iterdir()
                    if e.is_dir() and e.name not in folders and holds_run(e))
    if others:
        print(f"clusterfl: warning: {out} also holds runs of methods this comparison does not "
              f"list ({', '.join(others)}): they are kept as they are and left out of its "
              "report", file=sys.stderr, flush=True)


def _check_no_seeds(out: Path, folders: list[str]) -> None:
    """A comparison without seeds resumed where `compare --seeds` wrote its runs
    (`METHOD/seedN`): refused naming them, before anything is written (a method's folder
    was then claimed as a fresh run and refused as holding other runs, in words of
    --overwrite)."""
    for folder in folders:
        below = runs_below(out / folder) if (out / folder).is_dir() else []
        if below:
            shown = shown_names([f"{folder}/{b}" for b in below])
            raise ConfigError("--resume", f"{out} holds the runs of a comparison with --seeds "
                              f"({shown}); continue it with --seeds (the seeds it ran with, "
                              "or more), or give a comparison without --seeds another --out")


class Comparison(list[tuple[str, History]]):
    """What `run_comparison` returns: a list of (label, history), one per method, with
    `warnings`, the comparison's own warnings (`unused_options`: config options no compared
    method has), as its report.md and the console give them."""

    def __init__(self, results: list[tuple[str, History]], warnings: list[str]) -> None:
        super().__init__(results)
        self.warnings = warnings


def run_comparison(
    config: Config, specs: list[str], out_dir: str | Path, progress: bool | None = None,
    overwrite: bool = False, hint: str = "overwrite=True to replace it",
    federation: Federation | None = None, resume: bool = False,
) -> Comparison:
    """Each method on the one federation built from `config`; returns (label, history) of
    each, as a `Comparison` (a list) whose `warnings` are the comparison's own (printed on
    stderr before the first run and written at the top of its report).

    Every run goes to `out_dir/<run folder name>` (`naming.run_folder_name`: the
    method and its non-default options); the comparison report to `out_dir/report.md`.
    `out_dir` holds one comparison, locked while it runs: when it is not empty, `overwrite`
    removes the files of the earlier one first (otherwise `RunDirInUseError`, whose message
    ends with `hint`; `rundir.claim_run_dir`). `federation`: data of
    one's own built in Python (`Federation.from_clients`) instead of the config's `[data]`.
    `resume` continues an interrupted comparison in `out_dir` (`resume_run`).
    """
    _check_arguments(config, specs, out_dir, progress, overwrite, resume)
    out = Path(out_dir)
    runs = comparison_configs(config, specs)
    unused = unused_options(config, specs)
    if len(runs) == 1:  # a table of one row: said, as a one-method --algorithms is a slip
        unused.append(f"one method ({next(s.strip() for s in specs if s.strip())}): "
                      "the comparison has nothing to compare it with; list two or more, "
                      "separated by commas (`clusterfl run` runs one method)")
    from clusterfl.report import write_comparison_report

    # after the specs were validated; locked until the report is written
    if resume and not (out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir())):
        raise ConfigError("--resume", f"{out} holds no comparison to continue; run without "
                                      "--resume")
    if resume and holds_run(out):
        raise ConfigError("--resume", f"{out} holds one run (its config.toml, history or "
                          "summary), not a comparison: `clusterfl run CONFIG --out "
                          f"{out} --resume` continues it; give compare another --out")
    if resume:
        _check_no_seeds(out, [folder for folder, _ in runs])
    with RunDir(out).claimed(resume=resume, overwrite=overwrite, hint=hint,
                             runs_inside=True):
        if resume:
            _warn_other_runs(out, [folder for folder, _ in runs])
        for line in unused:
            print(f"clusterfl: warning: {line}", file=sys.stderr, flush=True)
        if federation is None:
            federation = build_federation(config)
        # every method checked (its settings against the federation) before the first runs
        experiments = [(out / folder, Experiment(cfg, out / folder, federation))
                       for folder, cfg in runs]
        for _, experiment in experiments:
            experiment.name_in_warnings = True
        # a resumed method's folder checked (its config, its continuation) before any runs
        saved = [_checked_config(*pair) if resume else None for pair in experiments]
        results, run_dirs = [], []
        for (run_dir, experiment), (folder, _), was in zip(experiments, runs, saved,
                                                           strict=True):
            history = (resume_run(run_dir, experiment, progress, was) if resume else
                       experiment.run(progress=progress))
            results.append((history.summary.label or folder, history))
            run_dirs.append(run_dir)
        write_comparison_report(run_dirs, out, figures=config.output.figures,
                                warnings=unused)
    return Comparison(results, unused)


def _checked_config(run_dir: Path, experiment: Experiment) -> dict[str, Any] | None:
    """The config of the method's run in `run_dir` (None: no run there, or its config.toml
    is missing beside a checkpoint or cannot be read, said on stderr), checked before the
    first method runs, so that no method is run or continued before another is refused: a
    run of another config is refused naming the first difference, and one whose `rounds`
    differ is checked as a continuation (`checkpoint.check_continuation`)."""
    from clusterfl.checkpoint import CHECKPOINT, check_continuation, config_change

    if not (run_dir / "config.toml").is_file():
        if experiment.saved_round() is not None:  # resumed: its checkpoint holds its config
            print(experiment.console_warning(
                f"{run_dir / 'config.toml'} is missing: the run is checked against its "
                "checkpoint's config instead"), file=sys.stderr, flush=True)
        return None
    saved = _saved_config(run_dir / "config.toml", experiment)
    if saved is None:
        return None
    change, _ = config_change(saved, experiment.config.to_dict(), str(run_dir))
    if change is not None:
        raise ConfigError("--resume", f"{run_dir} was run with another config ({change}); "
                          "resume with the same config and --set, or use --overwrite or a "
                          "new --out")
    planned = saved.get("rounds")
    held = None if planned == experiment.config.run.rounds else experiment.saved_round()
    if held is not None:
        check_continuation((run_dir / CHECKPOINT).parent, experiment.algorithm,
                           experiment.config, held, planned)
    return saved


def resume_run(run_dir: Path, experiment: Experiment, progress: bool | None,
               saved: dict[str, Any] | None) -> History:
    """One method of a comparison resumed, its folder's config `saved` checked
    (`_checked_config`): a finished run is read back, an interrupted one continues from its
    checkpoint (and a finished one to more `rounds`, as `run --resume`), one stopped before
    any checkpoint starts over, as does one whose checkpoint cannot be read (said on
    stderr), one not begun runs. A readable checkpoint without config.toml continues as an
    interrupted run's (`_checked_config` said so)."""
    from clusterfl.records import SUMMARY_FILE, RunDirError, read_history, read_summary
    from clusterfl.rundir import claim_run_dir

    if (run_dir / "config.toml").is_file() or experiment.saved_round() is not None:
        finished = (run_dir / SUMMARY_FILE).is_file() and (  # its report too, if it writes one
            not experiment.config.output.figures or (run_dir / "report.md").is_file())
        if finished and saved is not None and saved.get("rounds") == \
                experiment.config.run.rounds:
            try:
                return History(read_history(run_dir), read_summary(run_dir))
            except RunDirError as exc:  # damaged since: its checkpoint writes them again
                if experiment.saved_round() is None:
                    raise
                print(experiment.console_warning(f"{exc}: the run's files are written again "
                                                 "from its checkpoint"),
                      file=sys.stderr, flush=True)
        if experiment.saved_round() is not None:
            return experiment.run(resume=True, progress=progress)
        torn = experiment.checkpoints.unreadable()
        if torn is not None:  # started again, as a run stopped before its first checkpoint
            print(experiment.console_warning(f"{torn}: this run starts again from round 1"),
                  file=sys.stderr, flush=True)
    claim_run_dir(run_dir, overwrite=True)  # not begun, or no checkpoint: its files, by name
    return experiment.run(progress=progress)


def _saved_config(path: Path, experiment: Experiment) -> dict[str, Any] | None:
    """The config a method's `config.toml` holds; None, said on stderr, when the file is
    empty, not TOML (its write cut short) or holds a value no config allows (edited by hand):
    the run's checkpoint, which holds its config, is compared with it instead
    (`Checkpoints.load`)."""
    from clusterfl.config import load_config, read_toml

    try:
        saved = read_toml(path)
        if saved:
            load_config(saved)  # a value edited by hand since the run (rounds = "two")
            return saved
        why = f"{path} is empty"
    except ConfigError as exc:
        why = str(exc) if not exc.field else f"{path}: {exc}"
    print(experiment.console_warning(f"{why}: the run is checked against its checkpoint's "
                                     "config instead"), file=sys.stderr, flush=True)
    return None
