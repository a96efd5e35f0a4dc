"""The benchmark suite: runs, skips finished runs, resumes, and tabulates beside the paper."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from clusterfl.bench import (
    BenchError,
    legacy_run_dir,
    load_suite,
    rounds_to_perfect,
    run_dir,
    run_metrics,
    run_suite,
    write_results,
)
from clusterfl.cli import main
from clusterfl.errors import ConfigError
from clusterfl.records import RoundRecord, read_summary

SUITE = """
[suite]
title = "Rotated digits"
source = "made up for the test"
seeds = [0, 1]
methods = ["fedavg", "ifca:n_clusters=2"]

[suite.quick]
set = ["rounds=2"]
seeds = [0]
methods = ["fedavg"]

[paper.fedavg]
accuracy = {paper}
note = "a note for the reader"

[config]
rounds = 4
eval_every = 2
checkpoint_every = 2

[config.data]
source = "digits"

[config.scenario]
name = "rotation"
n_clients = 6
angles = [0.0, 180.0]

[config.model]
name = "mlp"
hidden = [16]

[config.train]
lr = 0.1
batch_size = 16
steps = 5

[config.algorithm]
name = "fedavg"

[config.output]
figures = false
progress = "off"
"""


def _suite(tmp_path: Path, paper: float = 50.0) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir(parents=True)
    (folder / "digits.toml").write_text(SUITE.format(paper=paper))
    return folder


def _record(t: int, ari: float | None) -> RoundRecord:
    return RoundRecord(round=t, wall_time=0.0, n_clusters=2, assignment=[0, 1], ari=ari,
                       floats_down=0.0, floats_up=0.0)


def test_rounds_to_perfect_is_the_start_of_the_final_run_of_ones() -> None:
    hist = [_record(r, a) for r, a in enumerate([0.2, 1.0, 0.5, 1.0, 1.0], start=1)]
    assert rounds_to_perfect(hist) == 4
    assert rounds_to_perfect(hist[:3]) is None
    assert rounds_to_perfect([_record(1, None)]) is None


def test_suite_runs_skips_finished_runs_and_writes_the_table(tmp_path: Path) -> None:
    scenarios = load_suite(_suite(tmp_path))
    runs, logs = tmp_path / "runs", []
    run_suite(scenarios, runs, log=logs.append)
    assert len(logs) == 4 and not any("skipped" in m for m in logs)
    # one run is lost: only it runs again
    lost = run_dir(runs, scenarios[0], "fedavg", 1)
    (lost / "summary.json").unlink()
    logs.clear()
    run_suite(scenarios, runs, log=logs.append)
    assert sum("skipped" in m for m in logs) == 3
    assert any("fedavg / seed 1" in m and "skipped" not in m for m in logs)

    results = write_results(scenarios, runs, tmp_path / "RESULTS.md", "clusterfl bench")
    text = results.read_text()
    accs = [run_metrics(run_dir(runs, scenarios[0], "fedavg", s))["accuracy"] for s in (0, 1)]
    mean = sum(accs) / 2
    scenario_part = text.split("## Rotated digits", 1)[1]
    row = next(line for line in scenario_part.splitlines() if line.startswith("| FedAvg |"))
    assert "| 2/2 |" in row
    spread = abs(accs[0] - accs[1]) / 2  # the population std of two values
    assert f"{mean:.1f} ± {spread:.1f}" in row
    assert "the population standard deviation over the finished seeds, n in its " \
           "denominator" in text  # which std it is (sweeps give the sample one)
    assert f"50.0 ({mean - 50.0:+.1f})" in row  # paper number and our difference
    assert "| IFCA (K=2) | 2/2 |" in text  # one naming scheme: display name and options
    overview = text.split("## Overview", 1)[1].split("\n## ", 1)[0]
    assert f"| FedAvg | {mean:.1f} |" in overview
    ifca = [run_metrics(run_dir(runs, scenarios[0], "ifca:n_clusters=2", s)) for s in (0, 1)]
    ifca_acc = sum(r["accuracy"] for r in ifca) / 2
    ifca_ari = sum(r["ari"] for r in ifca) / 2
    assert f"| IFCA | {ifca_acc:.1f} ({ifca_ari:.2f}) |" in overview
    assert "a note for the reader" in text
    quick = load_suite(_suite(tmp_path / "q"), quick=True)
    quick[0].methods = ["ifca:n_clusters=2"]  # notes only of the methods in the table
    assert "a note for the reader" not in write_results(
        quick, runs, tmp_path / "Q.md", "clusterfl bench").read_text()
    link = re.search(r"\[(RESULTS_figures/digits/report\.md)\]", text)
    assert link and (tmp_path / link.group(1)).is_file()
    assert "| IFCA (K=2) |" in (tmp_path / link.group(1)).read_text()
    assert "](<../../runs/digits/fedavg/seed0" in (tmp_path / link.group(1)).read_text()

    # run folders outside the results' tree are named, never linked (no path of this machine)
    elsewhere = write_results(scenarios, runs, tmp_path / "docs" / "R.md", "clusterfl bench")
    report = (elsewhere.parent / "R_figures" / "digits" / "report.md").read_text()
    assert "| IFCA (K=2) |" in report and "`digits/ifca_n_clusters=2/seed0`" in report
    assert "../" not in report.split("## Runs", 1)[1]


def test_resumes_an_interrupted_run_from_its_checkpoint(tmp_path: Path) -> None:
    scenarios = load_suite(_suite(tmp_path), quick=True)
    assert scenarios[0].seeds == [0] and scenarios[0].methods == ["fedavg"]
    full = load_suite(_suite(tmp_path / "b"))
    runs = tmp_path / "runs"
    run_suite(full, runs, log=lambda m: None)
    target = run_dir(runs, full[0], "fedavg", 0)
    reference = _final_accuracy(target)
    (target / "summary.json").unlink()  # as if killed after the round-2 checkpoint
    lines = (target / "history.jsonl").read_text().splitlines()
    (target / "history.jsonl").write_text("\n".join(lines[:2]) + "\n")
    logs: list[str] = []
    run_suite(full, runs, log=logs.append)
    assert any("(resumed)" in m for m in logs)
    again = _final_accuracy(target)
    assert again == reference


def _final_accuracy(run: Path) -> float | None:
    metrics = read_summary(run).final.metrics
    assert metrics is not None
    return metrics.accuracy


def test_bad_suite_files_name_the_problem(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    # bench outside the repository: the relative default is no folder there
    with pytest.raises(ConfigError, match=r"s is not a folder \(the default is relative to the "
                                          r"folder the command runs in"):
        load_suite(folder)
    folder.mkdir()
    with pytest.raises(ConfigError, match="no suite files"):
        load_suite(folder)
    (folder / "x.toml").write_text("[suite]\nmethods = []\nseeds = [0]\n[config]\n")
    with pytest.raises(ConfigError, match=r"suite\.methods"):
        load_suite(folder)
    with pytest.raises(ConfigError, match="unknown scenario"):
        load_suite(_suite(tmp_path), only=["nope"])


def test_cli_bench_report_only_without_finished_runs_keeps_the_results_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `--runs` folder without the suite's runs replaced the results file (by default the
    committed benchmarks/RESULTS.md) with a table of dashes, exit 0."""
    suite = _suite(tmp_path)
    out = tmp_path / "R.md"
    out.write_text("earlier results\n")
    rc = main(["bench", "--suite", str(suite), "--runs", str(tmp_path / "runs"),
               "--results", str(out), "--report-only"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--report-only: " in err[0] and \
        "holds no finished run of these scenarios" in err[0]
    assert out.read_text() == "earlier results\n"


def test_a_results_path_that_cannot_be_written_is_refused_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--results` a folder stopped with Python's bare 'Is a directory: ...', and one
    under a file with 'File exists: ...', only after every run had finished. Now one line
    names --results before anything runs; a folder that does not exist yet is made."""
    suite, runs = _suite(tmp_path), tmp_path / "runs"
    (tmp_path / "afile").write_text("")
    for results, words in (
            (tmp_path, f"--results: {tmp_path} is a folder; give the results file's path, "
                       f"e.g. {tmp_path / 'RESULTS.md'}"),
            (tmp_path / "afile" / "R.md", f"--results: {tmp_path / 'afile'} is a file, not a "
                                          "folder; choose another one"),
            (tmp_path / "afile" / "x" / "R.md", f"--results: cannot create the output folder "
                                                f"{tmp_path / 'afile' / 'x'} (Not a directory); "
                                                "choose another one")):
        rc = main(["bench", "--suite", str(suite), "--runs", str(runs), "--results",
                   str(results)])
        assert rc == 2 and capsys.readouterr().err.strip().splitlines() == [
            f"clusterfl: error: {words}"]
        assert not runs.exists()


def test_runs_that_failed_are_still_said_when_the_results_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A suite whose runs failed and whose results file then could not be written (a full
    disk) reported only the write's error: the runs' failure was lost."""
    import errno

    import clusterfl.bench as bench
    from clusterfl.errors import write_error

    def failing_suite(*args: object, **kwargs: object) -> None:
        raise BenchError(["digits / fedavg / seed 0: boom"])

    def full(scenarios: object, runs: object, results: Path, *a: object, **k: object) -> Path:
        raise write_error(OSError(errno.ENOSPC, "No space left on device"), results,
                          "the bench's results", "the runs are intact")

    monkeypatch.setattr(bench, "run_suite", failing_suite)
    monkeypatch.setattr(bench, "write_results", full)
    rc = main(["bench", "--suite", str(_suite(tmp_path)), "--runs", str(tmp_path / "runs"),
               "--results", str(tmp_path / "R.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[:2] == ["clusterfl: error: 1 suite run(s) failed:",
                                   "  digits / fedavg / seed 0: boom"]
    assert len(err) == 3 and "cannot write" in err[2] and err[2].endswith("the runs are intact")


def test_a_changed_config_is_run_again(tmp_path: Path) -> None:
    runs, logs = tmp_path / "runs", []
    quick = load_suite(_suite(tmp_path), quick=True)
    run_suite(quick, runs, log=logs.append)
    full = load_suite(_suite(tmp_path / "b"))  # same fedavg spec and seed, 4 rounds not 2
    full[0].seeds, full[0].methods = [0], ["fedavg"]
    logs.clear()
    run_suite(full, runs, log=logs.append)
    assert any("config changed" in m for m in logs)
    assert read_summary(run_dir(runs, full[0], "fedavg", 0)).rounds == 4


def test_a_config_toml_of_an_older_clusterfl_is_the_same_run_but_other_rounds_are_not(
        tmp_path: Path) -> None:
    """Before: `config.toml` was compared as text, so a run finished by a clusterfl whose
    config lacked a field (here train.momentum, at its default 0.0 now) was "config changed,
    run again". Now the stored config read by this version (the field at its default) is the
    same run: skipped, with a note. Other rounds, or a field this version does not know, are
    still another run."""
    runs, logs = tmp_path / "runs", []
    quick = load_suite(_suite(tmp_path), quick=True)
    run_suite(quick, runs, log=logs.append)
    target = run_dir(runs, quick[0], "fedavg", 0)
    stored, summary = target / "config.toml", (target / "summary.json").read_text()
    full = stored.read_text()
    assert "momentum = 0.0\n" in full and "rounds = 2\n" in full
    stored.write_text(full.replace("momentum = 0.0\n", ""))  # as an older clusterfl wrote it
    logs.clear()
    run_suite(quick, runs, log=logs.append)
    assert logs == [
        "digits / fedavg / seed 0: its config.toml was written by an older clusterfl, without "
        "train.momentum: taken as unchanged, at the default this config has (0.0)",
        "digits / fedavg / seed 0: done before, skipped"]
    assert (target / "summary.json").read_text() == summary  # not run again

    for edit in (full.replace("rounds = 2\n", "rounds = 3\n"),  # `--resume` ignores rounds
                 "retired = 1\n" + full):  # a field this version does not know
        stored.write_text(edit)
        logs.clear()
        run_suite(quick, runs, log=logs.append)
        assert logs[0] == "digits / fedavg / seed 0: config changed, run again", logs
        assert not any("skipped" in m for m in logs)
        assert stored.read_text() == full and read_summary(target).rounds == 2


def test_parallel_jobs_give_the_same_results_as_one_job(tmp_path: Path) -> None:
    scenarios = load_suite(_suite(tmp_path))
    one, two = tmp_path / "one", tmp_path / "two"
    run_suite(scenarios, one, log=lambda m: None)
    logs: list[str] = []
    run_suite(scenarios, two, log=logs.append, jobs=2)
    assert len(logs) == 4 and all("accuracy" in m for m in logs)
    for spec in scenarios[0].methods:
        for seed in scenarios[0].seeds:
            a = run_metrics(run_dir(one, scenarios[0], spec, seed))
            b = run_metrics(run_dir(two, scenarios[0], spec, seed))
            assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
            assert a["ari"] == b["ari"]


def test_a_failing_run_is_reported_and_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import clusterfl.experiment as experiment

    class Breaks(experiment.Experiment):  # type: ignore[misc, valid-type]
        def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if self.config.algorithm.name == "ifca":
                raise RuntimeError("diverged")
            return super().run(*args, **kwargs)

    monkeypatch.setattr(experiment, "Experiment", Breaks)  # what clusterfl.jobs runs
    scenarios = load_suite(_suite(tmp_path))
    runs = tmp_path / "runs"
    logs: list[str] = []
    expected = "ifca:n_clusters=2 / seed 0: RuntimeError: diverged"
    with pytest.raises(BenchError, match=expected) as info:
        run_suite(scenarios, runs, log=logs.append)
    assert len(info.value.failures) == 2  # both seeds of the bad method
    for seed in (0, 1):
        assert (run_dir(runs, scenarios[0], "fedavg", seed) / "summary.json").is_file()
    with pytest.raises(ConfigError, match="--jobs"):
        run_suite(scenarios, runs, jobs=0)


def test_run_folders_follow_the_naming_scheme_and_old_ones_are_renamed(tmp_path: Path) -> None:
    """Run folders are `run_folder_name`s; a folder of the older naming (`ifca_n_clusters-2`)
    is found and renamed, by `--report-only` and by a run, so finished runs are not rerun."""
    scenarios = load_suite(_suite(tmp_path))
    runs = tmp_path / "runs"
    run_suite(scenarios, runs, log=lambda m: None)
    new = run_dir(runs, scenarios[0], "ifca:n_clusters=2", 0)
    assert new.parent.name == "ifca_n_clusters=2"
    assert all(re.fullmatch(r"[A-Za-z0-9_=.-]+", p.name) for p in runs.rglob("*") if p.is_dir())
    for seed in scenarios[0].seeds:  # as the previous clusterfl named them
        old = legacy_run_dir(runs, scenarios[0], "ifca:n_clusters=2", seed)
        assert old.parent.name == "ifca_n_clusters-2"
        old.parent.mkdir(parents=True, exist_ok=True)
        run_dir(runs, scenarios[0], "ifca:n_clusters=2", seed).rename(old)
    new.parent.rmdir()
    out = tmp_path / "R.md"
    assert main(["bench", "--suite", str(tmp_path / "suite"), "--runs", str(runs),
                 "--results", str(out), "--report-only"]) == 0
    assert "4/4 runs finished" in out.read_text() and new.is_dir()
    assert not legacy_run_dir(runs, scenarios[0], "ifca:n_clusters=2", 0).parent.exists()
    logs: list[str] = []
    run_suite(scenarios, runs, log=logs.append)
    assert sum("skipped" in m for m in logs) == 4


def test_suite_labels_and_twice_the_same_method_are_refused(tmp_path: Path) -> None:
    folder = _suite(tmp_path)
    path = folder / "digits.toml"
    text = path.read_text()
    path.write_text(text.replace('methods = ["fedavg", "ifca:n_clusters=2"]',
                                 'methods = ["fedavg", "ifca:n_clusters=2"]\n'
                                 'labels = { fedavg = "Fed" }', 1))
    with pytest.raises(ConfigError, match=r"suite\.labels: no longer read"):
        load_suite(folder)
    # the same method and options twice (`fraction = 1.0` is FedAvg's default)
    path.write_text(text.replace('methods = ["fedavg", "ifca:n_clusters=2"]',
                                 'methods = ["fedavg", "fedavg:fraction=1.0"]', 1))
    with pytest.raises(ConfigError, match=r"suite\.methods: 'fedavg' and 'fedavg:fraction=1.0' "
                                          r"are the same method"):
        load_suite(folder)


@pytest.mark.parametrize(("option", "names"), [("--only", "digits,digits"),
                                                ("--methods", "ifca,fedavg,ifca")])
def test_a_scenario_or_algorithm_listed_twice_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, names: str) -> None:
    """`bench --only digits,digits` quietly ran the scenario once (the second name dropped);
    a sweep refuses a method listed twice, and bench now refuses a name given twice, before
    anything runs or is written."""
    runs = tmp_path / "runs"
    assert main(["bench", "--suite", str(_suite(tmp_path)), "--runs", str(runs),
                 "--results", str(tmp_path / "R.md"), option, names]) == 2
    twice = names.split(",")[0]
    assert capsys.readouterr().err.strip() == (
        f"clusterfl: error: {option}: {twice!r} is listed twice; list each once")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite"]


def test_an_unfinished_run_without_checkpoint_is_run_again(tmp_path: Path) -> None:
    """The suite manages its own run folders: a run killed before its first checkpoint left
    config.toml and part of history.jsonl; the next suite run replaces it (no error)."""
    quick = load_suite(_suite(tmp_path), quick=True)
    runs, logs = tmp_path / "runs", []
    run_suite(quick, runs, log=logs.append)
    target = run_dir(runs, quick[0], "fedavg", 0)
    (target / "summary.json").unlink()
    shutil.rmtree(target / "checkpoint")  # killed before its first checkpoint
    (target / "report.md").write_text("stale")
    run_suite(quick, runs, log=logs.append)
    assert (target / "summary.json").is_file() and not (target / "report.md").exists()
    assert not any("(resumed)" in m for m in logs)


def test_methods_filter_keeps_the_specs_of_the_named_algorithms(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    (kept,) = load_suite(suite, methods=["ifca"])
    assert kept.methods == ["ifca:n_clusters=2"] and kept.seeds == [0, 1]
    assert load_suite(suite, methods=["ifca", "fedavg"])[0].methods == \
        ["fedavg", "ifca:n_clusters=2"]
    with pytest.raises(ConfigError, match=r"--methods.*\['fedem'\].*\['fedavg', 'ifca'\]"):
        load_suite(suite, methods=["fedem"])
    out, runs = tmp_path / "R.md", tmp_path / "runs"
    (one,) = load_suite(suite, methods=["ifca"])
    one.seeds = [0]
    run_suite([one], runs, log=lambda m: None)  # one of its two runs
    assert main(["bench", "--suite", str(suite), "--runs", str(runs),
                 "--results", str(out), "--methods", "ifca", "--report-only"]) == 0
    table = out.read_text().split("\n## Performance")[0]  # the scenario's part
    assert "1/2 runs finished" in table and "IFCA (K=2)" in table
    assert "| fedavg |" not in table.lower()


@pytest.mark.parametrize(("flags", "said"), [
    (["--jobs", "0"], "--jobs: must be at least 1, got 0"),
    (["--jobs", "2"], "--jobs: says how to run, and --report-only runs nothing; give one of "
     "the two"),
    (["--ray", "auto"], "--ray: says how to run, and --report-only runs nothing; give one of "
     "the two"),
    (["--cpus-per-run", "2"], "--cpus-per-run: says how to run, and --report-only runs "
     "nothing; give one of the two"),
    (["--fail-on-divergence"], "--fail-on-divergence: sets the exit status when a run "
     "diverged, and --report-only runs nothing; give one of the two"),
    (["--no-fail-on-divergence"], "--no-fail-on-divergence: sets the exit status when a run "
     "diverged, and --report-only runs nothing; give one of the two"),
])
def test_run_options_with_report_only_are_refused_as_sweep_refuses_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str) -> None:
    """`bench --report-only --jobs 0` was accepted (bench checked --jobs only when it ran),
    and --jobs 2, --ray, --cpus-per-run, --[no-]fail-on-divergence (only a run reads it) did
    nothing without a word. Now the checks and the
    refusal of `sweep --report-only`, before anything is read or written."""
    runs, results = tmp_path / "runs", tmp_path / "R.md"
    assert main(["bench", "--suite", str(_suite(tmp_path)), "--runs", str(runs),
                 "--results", str(results), "--report-only", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"clusterfl: error: {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite"]


def test_a_config_option_only_some_suite_methods_have_names_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `mu = 0.5` in a suite file's [config.algorithm] with methods fedprox, fedavg,
    ifca ran FedProx with it and the others without it, silently (compare and sweep warn).
    Now bench gives compare's warning, naming the scenario, in every mode."""
    folder = _suite(tmp_path)
    path = folder / "digits.toml"
    path.write_text(path.read_text().replace(
        'methods = ["fedavg", "ifca:n_clusters=2"]',
        'methods = ["fedprox", "fedavg", "ifca:n_clusters=2"]', 1).replace(
        '[config.algorithm]\nname = "fedavg"', '[config.algorithm]\nname = "fedprox"\nmu = 0.5'))
    assert main(["bench", "--suite", str(folder), "--runs", str(tmp_path / "runs"),
                 "--results", str(tmp_path / "R.md"), "--report-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("clusterfl: warning: digits: algorithm.mu in the config applies to "
                      "fedprox only: fedavg, ifca have no option 'mu' and run without it")
    assert len(err) == 2 and "holds no finished run" in err[1]


def test_the_suite_configs_algorithm_table_is_merged_into_each_method(tmp_path: Path) -> None:
    """A `[config.algorithm]` option every method has (`fraction`) applies to each method
    spec, as in `compare`; a spec's own value wins; the runs are made with it."""
    folder = _suite(tmp_path)
    path = folder / "digits.toml"
    path.write_text(path.read_text().replace('[config.algorithm]\nname = "fedavg"',
                                             '[config.algorithm]\nname = "fedavg"\n'
                                             'fraction = 0.5', 1)
                    .replace('methods = ["fedavg", "ifca:n_clusters=2"]',
                             'methods = ["fedavg", "ifca:n_clusters=2", '
                             '"fedprox:fraction=1.0"]', 1))
    (scenario,) = load_suite(folder)
    assert scenario.algorithm("fedavg").fraction == 0.5
    assert scenario.algorithm("ifca:n_clusters=2").fraction == 0.5
    assert scenario.algorithm("fedprox:fraction=1.0").fraction == 1.0
    quick = load_suite(folder, quick=True)
    run_suite(quick, tmp_path / "runs", log=lambda _: None)
    written = (run_dir(tmp_path / "runs", quick[0], "fedavg", 0) / "config.toml").read_text()
    assert re.search(r"^fraction = 0\.5$", written, re.M)


def test_missing_data_is_one_error_before_any_run_and_keeps_the_results_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without the data folder every MNIST run of the suite failed in turn with the same
    "file not found" (one line each), and the results file was then rewritten with their
    dashes; now the data is read once first and nothing runs or is written."""
    suite = _suite(tmp_path)
    (suite / "mnist.toml").write_text(SUITE.format(paper=50.0).replace(
        'source = "digits"', 'source = "mnist"').replace("Rotated digits", "Rotated MNIST"))
    monkeypatch.setenv("CLUSTERFL_DATA", str(tmp_path / "empty"))
    out, runs = tmp_path / "R.md", tmp_path / "runs"
    out.write_text("earlier results\n")
    rc = main(["bench", "--suite", str(suite), "--runs", str(runs), "--results", str(out),
               "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("clusterfl: error: mnist: nothing was run: mnist: file not found: ")
    assert "set it (or pass --data-dir) to the folder that contains mnist/" in err[0]
    assert out.read_text() == "earlier results\n"
    assert not any(p.is_dir() for p in runs.rglob("*"))  # no run folder was made


def test_a_spread_of_floats_is_written_in_the_units_of_its_mean() -> None:
    # FeSEM's floats read "352.6M ± 2782692.5" in the rerun of flt_scenario1
    from clusterfl.bench import _cell

    assert _cell([349_800_000.0, 355_400_000.0], human=True) == "352.6M ± 2.8M"
    assert _cell([258_700_000.0, 258_700_000.0], human=True) == "258.7M ± 0"
    assert _cell([50.0, 60.0]) == "55.0 ± 5.0"
    # a value that rounds up to the next unit takes it ("1000.0k" before)
    assert _cell([999_960.0], human=True) == "1.0M"
    assert _cell([999.6], human=True) == "1.0k"
