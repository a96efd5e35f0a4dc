"""The benchmark suite: every method's reproduction configs, run and tabulated beside the papers.

A suite is a folder of TOML files, one per scenario (`benchmarks/suite/*.toml`). Each holds

- `[suite]`: `title`, `source` (where the paper's numbers come from), `seeds`, `methods`
  (specs as for `clusterfl compare`: `"ifca:n_clusters=4"`), and `[suite.quick]` with `set`
  (overrides, like `--set`), `seeds` and optionally `methods` for the `--quick` pass;
  a method is named in tables and figures as everywhere else (`method_label`: its display
  name and non-default options, e.g. "IFCA (K=4)"), so a suite file gives no labels;
- `[paper."<spec>"]`: the paper's numbers for that method (`accuracy`, `macro_f1`, `ari`,
  `mse`, in the paper's units: percent for accuracy and F1), and optionally `note`;
- `[config]`: a complete run config (the tables of `clusterfl run`); options of its
  `[config.algorithm]` table that a method has (e.g. `fraction`) apply to every method spec,
  whose own options win, as in `clusterfl compare` (`merged_spec`).

`run_suite` runs every (scenario, method, seed) into `RUNS/<scenario>/<method>/seed<N>/`
(`<method>`: `run_folder_name`, e.g. `ifca_n_clusters=4`), skipping finished runs (their
`summary.json` exists) and resuming interrupted ones from their checkpoint, so a killed suite
continues where it stopped. Run folders of the older naming (the spec with `:` → `_` and
`=` → `-`, e.g. `ifca_n_clusters-4`) are renamed to the new name when found, by `run_suite`
and by `write_results` (`--report-only`), so finished runs are neither lost nor rerun.

`write_results` writes the results markdown (`benchmarks/RESULTS.md` for the full suite):
per scenario a table of methods × (accuracy, macro-F1, ARI, fairness variance, rounds until
ARI = 1, floats communicated, wall time) as mean ± std over seeds (the population std, n in
its denominator, as the tables have always been written; sweeps give the sample std), with the
paper's number
and our difference beside it, and the comparison figures of the first seed.
"""

from __future__ import annotations

import math
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.algorithms import ALGORITHMS, AlgorithmConfig
from clusterfl.compare import merged_spec, parse_algorithm_spec
from clusterfl.config import Config, apply_overrides, dump_toml, load_config
from clusterfl.config_util import flatten
from clusterfl.engine.device import check_devices
from clusterfl.errors import ClusterFLError, ConfigError, write_error
from clusterfl.files import write_whole
from clusterfl.jobs import RunTask, divergence_reason, execute
from clusterfl.naming import method_label, run_folder_name
from clusterfl.records import (
    SUMMARY_FILE,
    RoundMetrics,
    RoundRecord,
    read_history,
    read_summary,
)
from clusterfl.rundir import claim_run_dir, locking


@dataclass
class Scenario:
    """One suite file: a base config, the methods to run on it and the paper's numbers."""

    name: str
    title: str
    source: str
    config: dict[str, Any]
    methods: list[str]
    seeds: list[int]
    paper: dict[str, dict[str, Any]] = field(default_factory=dict)
    _algorithms: dict[str, AlgorithmConfig] = field(default_factory=dict, repr=False)

    def algorithm(self, spec: str) -> AlgorithmConfig:
        """The validated `[algorithm]` table of a method spec on this scenario."""
        if spec not in self._algorithms:
            base = load_config(self.config)
            table = merged_spec(base, parse_algorithm_spec(spec))
            self._algorithms[spec] = base.with_algorithm(table).algorithm
        return self._algorithms[spec]

    def label(self, spec: str) -> str:
        """The method's name in tables and figures, e.g. "IFCA (K=4)"."""
        return method_label(self.algorithm(spec))

    def folder(self, spec: str) -> str:
        """The method's run folder name, e.g. "ifca_n_clusters=4"."""
        return run_folder_name(self.algorithm(spec))


def _list(table: dict[str, Any], key: str, kind: type, where: str) -> list[Any]:
    value = table.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) for v in value):
        raise ConfigError(f"{where}.{key}", f"expected a non-empty list of {kind.__name__}")
    return value


def load_scenario(path: Path, quick: bool = False) -> Scenario:
    """Read one suite file (with its `--quick` overrides applied when `quick`)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read the suite file: {exc}") from None
    suite = raw.get("suite")
    if not isinstance(suite, dict) or not isinstance(raw.get("config"), dict):
        raise ConfigError(str(path), "a suite file needs a [suite] and a [config] table")
    methods = _list(suite, "methods", str, "suite")
    seeds = _list(suite, "seeds", int, "suite")
    if "labels" in suite:
        raise ConfigError(f"{path}: suite.labels", "no longer read: methods are named by "
                          "their display name and non-default options (e.g. \"IFCA (K=4)\"); "
                          "remove it and put explanations in [paper.\"<spec>\"] note")
    config = raw["config"]
    if quick:
        q = suite.get("quick", {})
        config = apply_overrides(config, list(q.get("set", [])))
        seeds = q.get("seeds", seeds[:1])
        methods = q.get("methods", methods)  # may hold quick-only specs (shorter warm-ups)
    scenario = Scenario(
        name=path.stem, title=str(suite.get("title", path.stem)),
        source=str(suite.get("source", "")), config=config, methods=list(methods),
        seeds=[int(s) for s in seeds], paper=dict(raw.get("paper", {})),
    )
    seen: dict[str, str] = {}
    for spec in scenario.methods:  # validates every method; one run folder per method
        folder = scenario.folder(spec)
        if folder in seen:
            raise ConfigError(f"{path}: suite.methods", f"{seen[folder]!r} and {spec!r} are "
                              f"the same method with the same options "
                              f"({scenario.label(spec)}); list it once")
        seen[folder] = spec
    return scenario


def load_suite(folder: Path, quick: bool = False, only: Sequence[str] = (),
               methods: Sequence[str] = ()) -> list[Scenario]:
    """All suite files of `folder` (sorted), or only the named ones; with `methods`
    (algorithm names, e.g. "fedem"), each scenario keeps only the specs of those algorithms
    and a scenario that lists none of them is left out."""
    if not folder.is_dir():
        raise ConfigError("--suite", f"{folder} is not a folder (the default is relative to "
                          "the folder the command runs in: run bench from the repository's "
                          "root, or give --suite the suite folder)")
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ConfigError("--suite", f"no suite files (*.toml) in {folder}")
    names = [f.stem for f in files]
    for flag, given in (("--only", only), ("--methods", methods)):
        twice = next((x for i, x in enumerate(given) if x in given[:i]), None)
        if twice is not None:  # as a sweep's method listed twice: refused, not dropped
            raise ConfigError(flag, f"{twice!r} is listed twice; list each once")
    missing = sorted(set(only) - set(names))
    if missing:
        raise ConfigError("--only", f"unknown scenario(s) {missing}; available: {names}")
    scenarios = [load_scenario(f, quick) for f in files if not only or f.stem in only]
    if not methods:
        return scenarios
    listed = sorted({s.algorithm(spec).name for s in scenarios for spec in s.methods})
    unknown = sorted(set(methods) - set(listed))
    if unknown:
        raise ConfigError("--methods", f"{unknown} not in the chosen scenarios; they list "
                          f"{listed}")
    kept = []
    for s in scenarios:
        specs = [spec for spec in s.methods if s.algorithm(spec).name in methods]
        if specs:
            kept.append(replace(s, methods=specs))
    return kept


def run_dir(out: Path, scenario: Scenario, spec: str, seed: int) -> Path:
    """`out/<scenario>/<run folder name of the method>/seed<N>`."""
    return out / scenario.name / scenario.folder(spec) / f"seed{seed}"


def legacy_run_dir(out: Path, scenario: Scenario, spec: str, seed: int) -> Path:
    """Where clusterfl before the one naming scheme put the run (`ifca_n_clusters-4`)."""
    old = spec.replace(":", "_").replace("=", "-").replace("/", "-")
    return out / scenario.name / old / f"seed{seed}"


def migrate_run_dirs(scenarios: Sequence[Scenario], out: Path,
                     log: Callable[[str], None] = print) -> int:
    """Rename the run folders of the older naming to `run_dir`; returns how many moved.

    A folder is moved only when the new one does not exist yet (nothing is overwritten).
    """
    moved = 0
    for scenario in scenarios:
        for spec in scenario.methods:
            for seed in scenario.seeds:
                old, new = legacy_run_dir(out, scenario, spec, seed), run_dir(
                    out, scenario, spec, seed)
                if old != new and old.is_dir() and not new.exists():
                    new.parent.mkdir(parents=True, exist_ok=True)
                    old.rename(new)
                    moved += 1
                    log(f"{scenario.name} / {spec} / seed {seed}: run folder renamed "
                        f"{old.parent.name} → {new.parent.name}")
                    if old.parent.is_dir() and not any(old.parent.iterdir()):
                        old.parent.rmdir()
    return moved


def _configs(scenario: Scenario, seed: int) -> tuple[Config, list[Config]]:
    base = load_config(apply_overrides(scenario.config, [f"seed={seed}"]))
    return base, [base.with_algorithm(merged_spec(base, parse_algorithm_spec(s)))
                  for s in scenario.methods]


def config_difference(text: str, cfg: Config) -> tuple[bool, dict[str, Any]]:
    """Whether the config `text` (a run's `config.toml`, as `dump_toml` wrote it) is of
    another run than `cfg`, and the fields it lacks because an older clusterfl wrote it
    (dotted key → the default this version reads it with).

    Text equal to `cfg`'s dump is the same run at once. Otherwise the text is read as this
    version reads a config (`load_config`): the same resolved config (the fields it lacks at
    their defaults, as `cfg` has them) is the same run, as for `--resume`
    (`checkpoint.config_change`). Unlike `--resume`, every field counts: `rounds` (a finished
    run of other rounds is not this one's result), `checkpoint_every`, the backend's
    device, precision and chunk_size (they change the numbers in the last digits) and
    `[output]` (it decides what a finished run's folder holds: figures, report.md,
    TensorBoard events), as the text compare counted them. Text this version cannot read
    (a field it does not know, removed or renamed since; a value it refuses) is of another
    run."""
    if text == dump_toml(cfg.to_dict()):
        return False, {}
    try:
        raw = tomllib.loads(text)
        read = load_config(raw).to_dict()
    except (tomllib.TOMLDecodeError, ClusterFLError):
        return True, {}
    if read != cfg.to_dict():
        return True, {}
    written = flatten(raw)
    return False, {k: v for k, v in flatten(read).items() if k not in written}


def stored_difference(target: Path, cfg: Config) -> tuple[bool, dict[str, Any]]:
    """`config_difference` of the `config.toml` in `target` (no difference without one)."""
    stored = target / "config.toml"
    if not stored.is_file():
        return False, {}
    return config_difference(stored.read_text(encoding="utf-8"), cfg)


def stale_config(target: Path, cfg: Config) -> bool:
    """Whether `target` holds a run of another config than `cfg` (`config_difference` of its
    `config.toml`): its results are not `cfg`'s (`prepare_run` starts it again; a sweep's
    plan counts it as to run)."""
    return stored_difference(target, cfg)[0]


def older_note(target: Path, cfg: Config) -> str | None:
    """The line a run in `target` whose `config.toml` an older clusterfl wrote (without
    fields `cfg` has at their defaults) gets: it is taken as the same run; None otherwise."""
    from clusterfl.checkpoint import older_config_note

    stale, added = stored_difference(target, cfg)
    return older_config_note("its config.toml", added) if added and not stale else None


def prepare_run(target: Path, cfg: Config, what: str, log: Callable[[str], None]) -> bool:
    """Clear a run whose config changed; True when the run still has to be done. A run whose
    `config.toml` an older clusterfl wrote without fields this config has at their defaults
    is the same run (`config_difference`): said in one line, then skipped or resumed."""
    from clusterfl.checkpoint import older_config_note

    stale, added = stored_difference(target, cfg)
    if stale:
        log(f"{what}: config changed, run again")
        claim_run_dir(target, overwrite=True)  # only its files: refuses anything else
    elif added:
        log(f"{what}: {older_config_note('its config.toml', added)}")
    if (target / SUMMARY_FILE).is_file():
        log(f"{what}: done before, skipped")
        return False
    return True


@locking("out")  # one suite at a time in `out`
def run_suite(
    scenarios: Sequence[Scenario], out: Path, log: Callable[[str], None] = print,
    progress: bool | None = False, jobs: int = 1, fail_on_divergence: bool = True,
    threads: int | None = None, ray: str | None = None, cpus_per_run: float | None = None,
    gpus_per_run: float = 0,
) -> None:
    """Run every (scenario, method, seed) not finished yet; resume interrupted runs.

    The runs go through `clusterfl.jobs.execute`: `jobs > 1` runs that many at once in
    worker processes, each with `threads` (default `max(1, cores // jobs)`) torch threads;
    `ray` runs them as Ray tasks of `cpus_per_run` CPUs and `gpus_per_run` GPUs. A failed
    run is logged and the others go on; the failures are raised together at the end. With
    `fail_on_divergence` a diverged run (its summary's `divergence`, finished now or before)
    counts as a failure; its results are kept and tabulated.
    """
    if jobs < 1:
        raise ConfigError("--jobs", f"must be at least 1, got {jobs}")
    migrate_run_dirs(scenarios, out, log)
    # seed by seed across scenarios: a suite stopped early still has whole tables of its
    # first seeds
    ordered = sorted(
        ((i, s, scenario, seed) for s, scenario in enumerate(scenarios)
         for i, seed in enumerate(scenario.seeds)), key=lambda t: (t[0], t[1]))
    todo: list[tuple[Scenario, int, str, Config, Path, str]] = []
    failures: list[str] = []
    divergences: list[str] = []  # the failures that are divergences (fail_on_divergence)
    done_before = 0

    def diverged(what: str, reason: str | None) -> None:
        if reason is not None:
            log(f"{what}: DIVERGED ({reason})")
            if fail_on_divergence:
                divergences.append(f"{what}: diverged: {reason}")

    for _i, _s, scenario, seed in ordered:
        _base, configs = _configs(scenario, seed)  # validates every method first
        for spec, cfg in zip(scenario.methods, configs):
            target = run_dir(out, scenario, spec, seed)
            what = f"{scenario.name} / {spec} / seed {seed}"
            if prepare_run(target, cfg, what, log):
                todo.append((scenario, seed, spec, cfg, target, what))
            else:
                done_before += 1
                diverged(what, divergence_reason(read_summary(target).divergence))
    if ray is None:  # the runs compute here: a CUDA device this machine lacks, in one line
        check_devices(cfg for *_, cfg, _, _ in todo)
    check_data([(scenario.name, cfg) for scenario, _, _, cfg, _, _ in todo],
               keep=jobs == 1 and ray is None)
    for outcome in execute(
            [RunTask(what, cfg.to_dict(), target) for *_, cfg, target, what in todo],
            jobs=jobs, threads=threads, ray=ray, cpus=cpus_per_run, gpus=gpus_per_run,
            log=log, progress=progress, skipped=done_before):
        if not outcome.ok:
            failures.append(f"{outcome.task.what}: {outcome.error}")
        elif outcome.divergence is not None and fail_on_divergence:
            divergences.append(f"{outcome.task.what}: diverged: {outcome.divergence}")
    if failures or divergences:
        raise BenchError(failures + divergences, diverged=len(divergences))


def check_data(runs: Sequence[tuple[str, Config]], keep: bool = True) -> None:
    """Read each dataset the runs `(scenario name, config)` need once, before any runs: a
    missing or damaged file is one error naming the scenarios that need it, instead of every
    run of them failing with it in turn (and a results table of dashes). `keep`: leave the
    decoded data in this process's caches (the runs happen here), else drop it."""
    from clusterfl.data.sources import SOURCE_NAMES, forget_decoded, load_source

    needs: dict[tuple[Any, ...], list[str]] = {}
    for name, cfg in runs:
        data = cfg.data
        if data.source in SOURCE_NAMES:  # the built-in readers (own data: its own checks)
            key = (data.source, data.data_dir, data.verify is not False,
                   tuple(data.reader_options().items()))
            if name not in needs.setdefault(key, []):
                needs[key].append(name)
    for (source, data_dir, verify, options), names in needs.items():
        try:
            load_source(source, data_dir, verify, **dict(options))
        except ClusterFLError as exc:
            raise ClusterFLError(f"{', '.join(names)}: nothing was run: {exc}") from None
        finally:
            if not keep:
                forget_decoded()


class BenchError(ClusterFLError):
    """Some suite runs failed or diverged (the others finished and are kept); `diverged`:
    every failure is a divergence (the command's exit status is then DIVERGED_EXIT)."""

    def __init__(self, failures: list[str], diverged: int = 0) -> None:
        self.failures = failures
        self.diverged = 0 < diverged == len(failures)
        super().__init__(f"{len(failures)} suite run(s) "
                         f"{'diverged' if self.diverged else 'failed'}:\n  "
                         + "\n  ".join(failures))


# ---------------------------------------------------------------------------- results
def rounds_to_perfect(history: Sequence[RoundRecord]) -> int | None:
    """First round from which the ARI stays 1 to the end of the run (None if never)."""
    first = None
    for r in history:
        if r.ari is None:
            continue
        perfect = r.ari >= 1.0 - 1e-12
        first = (r.round if first is None else first) if perfect else None
    return first


def run_metrics(target: Path) -> dict[str, float | None] | None:
    """The suite's metrics of one finished run (None if it has not finished)."""
    if not (target / SUMMARY_FILE).is_file():
        return None
    summary = read_summary(target)
    final = summary.final
    m = final.metrics or RoundMetrics()
    history = read_history(target)
    perfect = rounds_to_perfect(history)
    values = {"accuracy": m.accuracy, "macro_f1": m.macro_f1, "ari": final.ari,
              "fairness_var": m.fairness_var, "mse": m.mse, "wall_time": final.wall_time}
    pct = {"accuracy", "macro_f1"}
    out: dict[str, float | None] = {}
    for key, v in values.items():
        out[key] = None if v is None else float(v) * (100.0 if key in pct else 1.0)
    out["floats"] = float(final.floats_down or 0.0) + float(final.floats_up or 0.0)
    updates, wall = final.client_updates, final.wall_time
    out["updates_per_s"] = float(updates) / float(wall) if updates and wall else None
    out["rounds_to_ari1"] = None if perfect is None else float(perfect)
    out["rounds"] = float(summary.rounds if summary.rounds is not None else len(history))
    return out


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None, int]:
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return None, None, 0
    return float(np.mean(xs)), float(np.std(xs)) if len(xs) > 1 else None, len(xs)


def _cell(values: list[float | None], digits: int = 1, human: bool = False) -> str:
    mean, std, _ = _mean_std(values)
    if mean is None:
        return "–"
    if human:  # the spread in the same units: "352.6M ± 2.8M", not "± 2782692.5"
        return _human(mean) if std is None else f"{_human(mean)} ± {_human(std)}"
    text = f"{mean:.{digits}f}"
    return text if std is None else f"{text} ± {std:.{digits}f}"


def _human(x: float) -> str:
    """One decimal in the largest unit the value reaches once rounded (999,960 is "1.0M",
    not "1000.0k")."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(round(x / scale, 1)) >= 1:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _paper_cell(ours: list[float | None], paper: Any, digits: int = 1) -> str:
    if paper is None:
        return "–"
    mean, _, _ = _mean_std(ours)
    if mean is None:
        return f"{paper}"
    return f"{paper} ({mean - float(paper):+.{digits}f})"


def scenario_table(scenario: Scenario, out: Path) -> tuple[str, int]:
    """The markdown table of one scenario and how many runs it covers."""
    regression = scenario.config.get("model", {}).get("name") == "linear"
    head = ["method", "seeds", "accuracy (%)", "paper (ours − paper)", "macro-F1 (%)",
            "paper F1", "ARI", "rounds to ARI 1", "fairness var (%²)", "floats ↓+↑",
            "wall time (s)", "client updates/s"]
    if regression:
        head[2:6] = ["MSE", "paper MSE"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    done = 0
    for spec in scenario.methods:
        runs = [run_metrics(run_dir(out, scenario, spec, s)) for s in scenario.seeds]
        finished = [r for r in runs if r is not None]
        done += len(finished)
        col = {k: [r[k] for r in finished] for k in (finished[0] if finished else {})}
        paper = scenario.paper.get(spec, {})
        perfect = col.get("rounds_to_ari1", [])
        reached = sum(v is not None for v in perfect)
        to_one = "–" if not finished else (
            f"{_cell(perfect, 0)} ({reached}/{len(finished)})" if reached else "never")
        if regression:
            acc_cells = [_cell(col.get("mse", []), 4), _paper_cell(col.get("mse", []),
                                                                   paper.get("mse"), 4)]
        else:
            acc_cells = [
                _cell(col.get("accuracy", [])),
                _paper_cell(col.get("accuracy", []), paper.get("accuracy")),
                _cell(col.get("macro_f1", [])),
                "–" if paper.get("macro_f1") is None else str(paper["macro_f1"]),
            ]
        row = [scenario.label(spec), f"{len(finished)}/{len(scenario.seeds)}", *acc_cells,
               _cell(col.get("ari", []), 2), to_one, _cell(col.get("fairness_var", [])),
               _cell(col.get("floats", []), human=True), _cell(col.get("wall_time", []), 0),
               _cell(col.get("updates_per_s", []), 1)]
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"- {scenario.label(s)}: {p['note']}" for s, p in scenario.paper.items()
             if isinstance(p, dict) and p.get("note") and s in scenario.methods]
    text = "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")
    return text, done


def overview_table(scenarios: Sequence[Scenario], out: Path) -> str:
    """Every method (by algorithm) × every scenario: mean accuracy in % (or test MSE for
    regression) over the finished seeds, with the final ARI in parentheses; a scenario that
    runs a method in two configurations shows both, in its method order ("a / b")."""
    names: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for scenario in scenarios:
        regression = scenario.config.get("model", {}).get("name") == "linear"
        for spec in scenario.methods:
            name = spec.split(":", 1)[0]
            if name not in names:
                names.append(name)
            runs = [run_metrics(run_dir(out, scenario, spec, s)) for s in scenario.seeds]
            finished = [r for r in runs if r is not None]
            if not finished:
                continue
            metric = "mse" if regression else "accuracy"
            value, _, _ = _mean_std([r[metric] for r in finished])
            ari, _, _ = _mean_std([r["ari"] for r in finished])
            if value is None:
                continue
            text = f"{value:.4f}" if regression else f"{value:.1f}"
            if ari is not None and name not in ("fedavg", "fedprox", "local", "fedavg_plus",
                                                "fedprox_plus"):
                text += f" ({ari:.2f})"
            cell = (name, scenario.name)  # two configurations of one method: "a / b"
            cells[cell] = f"{cells[cell]} / {text}" if cell in cells else text
    head = ["method", *[f"`{s.name}`" for s in scenarios]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        display = ALGORITHMS[name].Config.display if name in ALGORITHMS else name
        row = [display, *[cells.get((name, s.name), "–") for s in scenarios]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def finished_runs(scenarios: Sequence[Scenario], runs: Path) -> int:
    """How many of the scenarios' runs under `runs` have finished (their `summary.json`)."""
    return sum((run_dir(runs, sc, spec, seed) / SUMMARY_FILE).is_file()
               for sc in scenarios for spec in sc.methods for seed in sc.seeds)


def write_results(
    scenarios: Sequence[Scenario], runs: Path, results: Path, command: str,
    preamble: str = "", sections: Sequence[str] = (), log: Callable[[str], None] = print,
) -> Path:
    """Write the `results` markdown from the finished runs under `runs`.

    Each scenario's comparison figures (first seed) go to `<results stem>_figures/<scenario>/`
    beside the results file, so they can be committed without the run folders.
    """
    from clusterfl.report import write_comparison_report

    migrate_run_dirs(scenarios, runs, log)
    figures = results.parent / f"{results.stem}_figures"
    # run folders outside the results' tree (`--runs /elsewhere`) are named, not linked: a
    # link would hold a path of this machine
    inside = runs.resolve().is_relative_to(results.parent.resolve())
    parts = [f"# Benchmark suite results\n\n- command: `{command}`\n"
             f"- written: {time.strftime('%Y-%m-%d %H:%M:%S')}\n{preamble}",
             "## Overview: every method on every federation\n\nMean accuracy (%) over the "
             "finished seeds — test MSE for the regression — with the final ARI against the "
             "true clusters in parentheses for the clustered methods (two values: two "
             "configurations of the method, in the order of the scenario's table); the "
             "scenario tables "
             "below give seeds, spread (mean ± the population standard deviation over the "
             "finished seeds, n in its denominator; `clusterfl compare --seeds` and sweeps give "
             "the sample one, n − 1), macro-F1, fairness, costs and the papers' numbers.\n\n"
             + overview_table(scenarios, runs) + "\n"]
    for scenario in scenarios:
        table, done = scenario_table(scenario, runs)
        total = len(scenario.methods) * len(scenario.seeds)
        parts.append(f"## {scenario.title}\n\n`{scenario.name}` — paper numbers: "
                     f"{scenario.source or '–'}; {done}/{total} runs finished.\n\n{table}\n")
        seed = scenario.seeds[0]
        finished = [(s, d) for s in scenario.methods
                    if ((d := run_dir(runs, scenario, s, seed)) / SUMMARY_FILE).is_file()]
        if len(finished) >= 2:
            report = write_comparison_report([d for _, d in finished], figures / scenario.name,
                                             [scenario.label(s) for s, _ in finished],
                                             runs_root=None if inside else runs)
            link = report.relative_to(results.parent).as_posix()
            parts.append(f"Curves and figures (seed {seed}): [{link}]({link})\n")
    parts.extend(sections)
    results.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_whole(results, "\n".join(parts))
    except OSError as exc:
        raise write_error(exc, results, "the bench's results", f"the runs under {runs} are "
                          "intact: the same command writes the results again") from None
    return results
