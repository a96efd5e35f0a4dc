"""Folders clusterfl writes into (issue 35): `--overwrite` removes only our files, by name,
and refuses a folder holding anything else; a folder is locked while a process writes into it,
a second run, resume or overwrite (and compare, bench, export-partitions, report) refuses in
one line naming that process, and a lock left by a dead process is taken over."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clusterfl.cli import main
from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.rundir import (
    LOCK_FILE,
    RUN_FILES,
    RUN_SUBDIRS,
    FolderLock,
    RunDirInUseError,
    check_report_out,
    claim_run_dir,
    foreign_entry,
)
from tests.tiny import tiny_config

TINY = tiny_config()


@contextmanager
def held_elsewhere(folder: Path) -> Iterator[int]:
    """`folder`'s lock held by another live process; yields its pid."""
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import sys, time\nfrom clusterfl.rundir import FolderLock\n"
            "FolderLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _run_folder(folder: Path) -> None:
    """Every file a run and a comparison write (none of it real)."""
    for name in ("config.toml", "history.jsonl", "summary.json", "report.md", "cfl_tree.pt",
                 "checkpoint/state.pt", "figures/accuracy.png", "figures/ari_compare.png",
                 "tensorboard/events.out.tfevents.1700000000.host.1.0", "fedavg/config.toml",
                 "fedavg/summary.json", "fedavg/checkpoint/state.pt", "fedavg/" + LOCK_FILE,
                 "ifca/" + LOCK_FILE):  # a run that had just started
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")


# ------------------------------------------------------------------ --overwrite


def test_overwrite_refuses_folder_with_foreign_file(tmp_path: Path) -> None:
    """The issue's two cases: `checkpoint/model.pt` + `train.py`, and `notes/report.md`."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "checkpoint").mkdir(parents=True)
    (a / "checkpoint" / "model.pt").write_text("weights")
    (a / "train.py").write_text("code")
    (b / "notes").mkdir(parents=True)
    (b / "notes" / "report.md").write_text("notes")
    for folder, named in ((a, "checkpoint/model.pt"), (b, "notes/report.md")):
        before = _files(folder)
        with pytest.raises(RunDirInUseError) as err:
            claim_run_dir(folder, overwrite=True)
        assert named in str(err.value) and "did not write" in str(err.value)
        assert "\n" not in str(err.value)
        assert _files(folder) == before  # nothing removed
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    assert main(["run", str(path), "--out", str(a), "--quiet", "--overwrite"]) == 2
    assert (a / "train.py").read_text() == "code"
    assert (a / "checkpoint" / "model.pt").read_text() == "weights"


def test_overwrite_removes_only_run_files_by_name(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _run_folder(tmp_path)  # a comparison's folder (its methods' runs inside)
    assert foreign_entry(tmp_path) is None
    claim_run_dir(tmp_path, overwrite=True, runs_inside=True)
    assert _files(tmp_path) == []
    _run_folder(tmp_path)
    (tmp_path / "figures" / "mine.pdf").write_text("drawn by hand")  # the report draws PNGs
    with pytest.raises(RunDirInUseError, match=r"figures/mine\.pdf"):
        claim_run_dir(tmp_path, overwrite=True, runs_inside=True)
    assert (tmp_path / "summary.json").exists()
    (tmp_path / "figures" / "mine.pdf").unlink()
    notes = tmp_path / "notes"  # a run's file name, but neither a run nor a comparison
    alone = tmp_path_factory.mktemp("notes")  # the same outside any run's folder
    for folder in (notes, alone):
        folder.mkdir(exist_ok=True)
        (folder / "report.md").write_text("mine")
    with pytest.raises(RunDirInUseError, match=r"holds report\.md"):
        claim_run_dir(alone, overwrite=True)
    assert foreign_entry(tmp_path) == notes


def test_run_file_names_are_the_writers_names() -> None:
    """The names `--overwrite` may remove are the ones the writers use."""
    from clusterfl.algorithms.cfl import TREE_FILE
    from clusterfl.algorithms.flt import ARTIFACT
    from clusterfl.checkpoint import CHECKPOINT
    from clusterfl.deploy.server_app import FINAL_STATE
    from clusterfl.records import HISTORY_FILE, SUMMARY_FILE
    from clusterfl.report.figures import COMPARISON_FIGURES, FIGURES_DIR, RUN_FIGURES
    from clusterfl.report.markdown import REPORT_FILE
    from clusterfl.tracking import TENSORBOARD_DIR

    assert {TREE_FILE, ARTIFACT, FINAL_STATE, HISTORY_FILE, SUMMARY_FILE, REPORT_FILE,
            "config.toml", "flower.json"} <= RUN_FILES
    folder, name = CHECKPOINT.split("/")
    assert RUN_SUBDIRS[folder](name) and RUN_SUBDIRS[folder](name + ".tmp")
    assert all(RUN_SUBDIRS[FIGURES_DIR](f"{n}.png") for n in RUN_FIGURES + COMPARISON_FIGURES)
    assert {f"{n}.png" for n in COMPARISON_FIGURES} <= RUN_FILES  # beside a comparison's report
    assert TENSORBOARD_DIR in RUN_SUBDIRS


def test_one_runs_overwrite_never_takes_the_runs_in_its_subfolders(tmp_path: Path) -> None:
    """Issue 35, Python API round: `overwrite=True` (or `run --overwrite`) into a folder that
    holds other runs (a comparison's, or runs kept side by side in a parent) removed every
    one of them without a word; it is refused naming them, and a comparison's own
    `--overwrite` still replaces its methods' runs."""
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    parent = tmp_path / "parent"
    for name in ("exp_a", "exp_b"):
        Experiment.from_config(TINY, out_dir=parent / name).run(progress=False)
    before = _files(parent)
    with pytest.raises(RunDirInUseError) as err:
        Experiment.from_config(TINY, out_dir=parent, overwrite=True).run(progress=False)
    assert "holds other runs (exp_a, exp_b)" in str(err.value) and "\n" not in str(err.value)
    assert main(["run", str(path), "--out", str(parent), "--quiet", "--overwrite"]) == 2
    assert _files(parent) == before  # both runs whole
    comparison = tmp_path / "cmp"
    args = ["compare", str(path), "--algorithms", "fedavg,local", "--out", str(comparison),
            "--quiet"]
    assert main(args) == 0
    assert main(["run", str(path), "--out", str(comparison), "--quiet", "--overwrite"]) == 2
    assert main([*args, "--overwrite"]) == 0  # the comparison replaces its own runs
    assert (comparison / "fedavg" / "summary.json").is_file()


# ------------------------------------------------------------------ the lock


def test_second_run_refuses_locked_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          ) -> None:
    """A second run, a resume and an overwrite into a folder a live run holds: one line
    naming the process; its files are untouched."""
    path, out = tmp_path / "tiny.toml", tmp_path / "out"
    path.write_text(dump_toml(TINY))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with held_elsewhere(out) as pid:
        for extra in ([], ["--resume"], ["--overwrite"]):
            capsys.readouterr()
            assert main(["run", str(path), "--out", str(out), "--quiet", *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"in use by process {pid}" in err, err
        from clusterfl.experiment import Experiment

        with pytest.raises(RunDirInUseError, match=f"process {pid}"):
            Experiment.from_config(TINY, out_dir=out, overwrite=True).run(progress=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()
            and p.name != LOCK_FILE} == before


def test_stale_lock_of_dead_process_is_taken_over(tmp_path: Path) -> None:
    from clusterfl.experiment import Experiment

    tmp_path.joinpath(LOCK_FILE).write_text(f"{dead_pid()} clusterfl run old.toml\n")
    history = Experiment.from_config(TINY, out_dir=tmp_path).run(progress=False)
    assert len(history.records) == 2 and not (tmp_path / LOCK_FILE).exists()


def test_lock_is_held_while_the_run_writes(tmp_path: Path) -> None:
    """During a run the lock file names this process; it is gone afterwards."""
    import os

    from clusterfl.experiment import Experiment

    seen: list[str] = []

    class Spy:
        def on_round_end(self, record: object) -> None:
            seen.append((tmp_path / LOCK_FILE).read_text())

    Experiment.from_config(TINY, out_dir=tmp_path, callbacks=[Spy()]).run(progress=False)
    assert len(seen) == 2 and all(s.startswith(f"{os.getpid()} ") for s in seen)
    assert not (tmp_path / LOCK_FILE).exists()
    with FolderLock(tmp_path), pytest.raises(RunDirInUseError, match="this one"):
        FolderLock(tmp_path).acquire()  # the same process twice, too


def test_compare_refuses_locked_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       ) -> None:
    path, out = tmp_path / "tiny.toml", tmp_path / "cmp"
    path.write_text(dump_toml(TINY))
    with held_elsewhere(out) as pid:
        argv = ["compare", str(path), "--algorithms", "fedavg", "--out", str(out), "--quiet"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"process {pid}" in err
    assert [p.name for p in out.iterdir()] == [LOCK_FILE]  # the killed holder's, stale now


def test_bench_refuses_locked_folder(tmp_path: Path) -> None:
    from clusterfl.bench import Scenario, run_suite

    scenario = Scenario("tiny", "tiny", "test", tiny_config(), ["fedavg"], [0])
    with held_elsewhere(tmp_path) as pid, pytest.raises(RunDirInUseError,
                                                        match=f"process {pid}"):
        run_suite([scenario], tmp_path, log=lambda m: None)
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_FILE]


def test_cli_bench_and_sweep_refuse_a_folder_another_process_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`clusterfl bench` and `clusterfl sweep` from the command line, into a folder a live
    process holds: exit 2, one line naming that process, nothing written there."""
    from tests.core.test_bench import _suite
    from tests.core.test_sweep import _write

    runs, out = tmp_path / "runs", tmp_path / "sw"
    sweep = _write(tmp_path, {"methods": ["fedavg"], "seeds": [0], "grid": {"train.lr": [0.1]}})
    commands = {runs: ["bench", "--quick", "--suite", str(_suite(tmp_path)), "--runs",
                       str(runs), "--results", str(tmp_path / "R.md")],
                out: ["sweep", str(sweep), "--out", str(out), "--quiet"]}
    for folder, argv in commands.items():
        with held_elsewhere(folder) as pid:
            capsys.readouterr()
            assert main(argv) == 2, argv[0]
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"process {pid}" in err, err
        assert [p.name for p in folder.iterdir()] == [LOCK_FILE], argv[0]
    assert not (tmp_path / "R.md").exists()


# ------------------------------------------------------------------ export-partitions


def _export(config: Path, out: Path) -> int:
    return main(["flower", "export-partitions", str(config), str(out)])


def test_export_partitions_replaces_only_its_own_files(tmp_path: Path) -> None:
    """A second export into the folder of an earlier one (more clients) leaves exactly the
    new export's files, not a federation mixed from both."""
    big, small, out = tmp_path / "big.toml", tmp_path / "small.toml", tmp_path / "parts"
    big.write_text(dump_toml(tiny_config(n_clients=6)))
    small.write_text(dump_toml(tiny_config(n_clients=4)))
    assert _export(big, out) == 0 and len(list(out.glob("*.npz"))) == 6
    assert _export(small, out) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"client_{c:04d}.npz" for c in range(4)]


def test_export_partitions_refuses_folder_with_foreign_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, out = tmp_path / "tiny.toml", tmp_path / "parts"
    config.write_text(dump_toml(TINY))
    out.mkdir()
    (out / "mine.npz").write_text("x")
    assert _export(config, out) == 2
    err = capsys.readouterr().err.strip()
    assert "mine.npz" in err and err.count("\n") == 0
    assert [p.name for p in out.iterdir()] == ["mine.npz"]
    (out / "mine.npz").unlink()
    with held_elsewhere(out) as pid:
        assert _export(config, out) == 2
        assert f"process {pid}" in capsys.readouterr().err


# ------------------------------------------------------------------ report --out


def test_report_out_refuses_a_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`report --out` onto one of its input runs, or the default ./runs/report when that is
    a run's folder (`clusterfl run report.toml`): refused, that run's report.md kept."""
    path = tmp_path / "report.toml"
    path.write_text(dump_toml(TINY))
    monkeypatch.chdir(tmp_path)
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "report"
    for out in (a, b):
        assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
        (out / "report.md").write_text("the run's own report")
    capsys.readouterr()
    for argv in (["report", str(a), str(b), "--out", str(a)], ["report", str(a), str(b)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "is a run folder" in err
    assert (a / "report.md").read_text() == (b / "report.md").read_text() == \
        "the run's own report"
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "report.md").is_file()
    with pytest.raises(RunDirInUseError, match="is a run folder"):
        check_report_out(a / "inside", [b])  # a folder inside a run is the run's too


def test_report_of_one_run_honours_out_and_otherwise_rewrites_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report RUN --out DIR` wrote RUN/report.md and ignored --out, silently (exit 0)."""
    path = tmp_path / "one.toml"
    path.write_text(dump_toml(TINY))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--quiet"]) == 0
    (run / "report.md").write_text("the run's own report")
    assert main(["report", str(run), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (run / "report.md").read_text() == "the run's own report"  # untouched
    text = (tmp_path / "elsewhere" / "report.md").read_text()
    assert text.startswith("# Comparison of 1 run\n") and "run/report.md" in text
    assert main(["report", str(run), "--out", str(run)]) == 2  # never into the run itself
    assert "is a run folder" in capsys.readouterr().err
    assert main(["report", str(run)]) == 0  # without --out: the run's own report, rewritten
    assert (run / "report.md").read_text().startswith("# ")
    assert (run / "report.md").read_text() != "the run's own report"


def test_a_run_failing_before_it_writes_leaves_no_empty_folder(tmp_path, capsys):
    # the backend is built after the folder is claimed: an error there (here a device that
    # is not there) must not leave the new folder behind, nor touch a folder that existed
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml({**tiny_config(), "backend": {"name": "simulation",
                                                           "device": "cuda:99"}}))
    out = tmp_path / "new" / "run"
    assert main(["run", str(cfg), "--out", str(out)]) == 2
    assert "backend.device" in capsys.readouterr().err
    assert not out.exists() and (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["run", str(cfg), "--out", str(kept)]) == 2
    assert kept.is_dir()


def test_an_output_folder_that_cannot_be_made_is_one_line_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output path below a file ended in "Not a directory: x/run" or "File exists: x"
    (`sweep --out FILE`), a bare OS message naming no option."""
    path = tmp_path / "one.toml"
    path.write_text(dump_toml(TINY))
    sweep = tmp_path / "s.toml"
    sweep.write_text(dump_toml({"sweep": {"methods": ["fedavg"], "seeds": [0]},
                                "config": TINY}))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    below = str(blocker / "x")
    for argv, words in [
            (["run", str(path), "--out", below, "--quiet"],
             f"--out: cannot create the output folder {below} (Not a directory)"),
            (["compare", str(path), "--algorithms", "fedavg", "--out", below, "--quiet"],
             f"--out: cannot create the output folder {below} (Not a directory)"),
            (["sweep", str(sweep), "--out", str(blocker), "--quiet"],
             f"--out: {blocker} is a file, not a folder"),
            (["sweep", str(sweep), "--out", below, "--quiet"],
             f"--out: cannot create the output folder {below} (Not a directory)"),
            (["report", str(run), "--out", below],
             f"--out: cannot create the output folder {below} (Not a directory)"),
            (["report", str(run), "--out", str(blocker)],
             f"--out: {blocker} is a file, not a folder"),
            (["flower", "export-partitions", str(path), below],
             f"out_dir: cannot create the output folder {below} (Not a directory)"),
            (["data", "shard", str(path), "--out", below],
             f"--out: cannot create the output folder {below} (Not a directory)")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {words}"), (argv, err)
    assert blocker.read_text() == "mine"


def test_a_run_listed_twice_in_report_is_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`report RUN RUN` wrote a comparison of the run with itself, exit 0."""
    path = tmp_path / "one.toml"
    path.write_text(dump_toml(TINY))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    for again in (str(run), f"{run}/", str(tmp_path / "." / "run")):
        assert main(["report", str(run), again, "--out", str(tmp_path / "cmp")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"clusterfl: error: report: {Path(again)} is listed twice; list each "
                       "run once"]
    assert not (tmp_path / "cmp").exists()


def test_report_on_a_comparison_folder_names_the_runs_it_holds(tmp_path, capsys):
    """`report OUT` on the folder of a comparison or a sweep said only "missing summary.json";
    it now names the run folders below it to give instead."""
    from clusterfl.cli import main

    for run in ("fedavg/seed0", "fedavg/seed1", "ifca/seed0", "ifca/seed1"):
        (tmp_path / "cmp" / run).mkdir(parents=True)
        (tmp_path / "cmp" / run / "summary.json").write_text("{}")
    assert main(["report", str(tmp_path / "cmp")]) == 2
    cmp = tmp_path / "cmp"
    assert capsys.readouterr().err == (
        f"clusterfl: error: {cmp} is not a run directory: missing summary.json "
        f"({cmp / 'summary.json'}); it holds the runs {cmp / 'fedavg/seed0'}, "
        f"{cmp / 'fedavg/seed1'}, {cmp / 'ifca/seed0'} and 1 more: give those\n")
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.endswith("(" + str(tmp_path / "empty" / "summary.json")
                                            + ")\n")


def test_the_lock_file_names_the_command_without_its_secrets(monkeypatch):
    """A Flower ServerApp holding a run folder was named with its whole command line,
    `--token` value included, in the "is in use by" error."""
    from clusterfl.files import command_line

    monkeypatch.setattr(sys, "argv", ["/venv/bin/flwr-serverapp", "--runtime-api-address",
                                      "127.0.0.1:36583", "--token", "730f5d2a679de175"])
    assert command_line() == "flwr-serverapp --runtime-api-address 127.0.0.1:36583 --token …"
    monkeypatch.setattr(sys, "argv", ["clusterfl", "run", "x" * 200])
    line = command_line()
    assert len(line) == 120 and line.startswith("clusterfl run xxx") and line.endswith("…")


# ------------------------------------------------------------------ run folders nested


def test_an_out_inside_another_runs_folder_is_refused_naming_that_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run --out A/sub` with A a run's folder wrote the new run inside the old one, exit 0
    (as did compare, sweep, bench, export-partitions and `report --out A/x/rep` deeper than
    A's own subfolder): refused in one line naming A; A keeps exactly its files."""
    from tests.core.test_bench import _suite
    from tests.core.test_sweep import _write

    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    a = tmp_path / "a"
    assert main(["run", str(path), "--out", str(a), "--quiet"]) == 0
    (tmp_path / "link").symlink_to(a)
    before = _files(a)
    sweep = _write(tmp_path, {"methods": ["fedavg"], "seeds": [0], "grid": {"train.lr": [0.1]}})
    for argv, flag in [
            (["run", str(path), "--out", str(a / "sub"), "--quiet"], "--out"),
            (["run", str(path), "--out", str(a / "x" / "y"), "--quiet", "--overwrite"], "--out"),
            (["run", str(path), "--out", str(tmp_path / "link" / "sub"), "--quiet"], "--out"),
            (["compare", str(path), "--algorithms", "fedavg,local", "--out", str(a / "cmp"),
              "--quiet"], "--out"),
            (["sweep", str(sweep), "--out", str(a / "sw"), "--quiet"], "--out"),
            (["bench", "--quick", "--suite", str(_suite(tmp_path)), "--runs", str(a / "r"),
              "--results", str(tmp_path / "R.md")], "--out"),
            (["report", str(a), "--out", str(a / "x" / "rep")], "--out"),
            (["flower", "export-partitions", str(path), str(a / "parts")], "out_dir")]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {flag}: "), (argv, err)
        assert (f"lies inside the folder of the run {a.resolve()} (it holds that run's "
                "history.jsonl)") in err[0] and "choose a folder outside it" in err[0], err
        assert _files(a) == before, argv
    assert not (tmp_path / "R.md").exists()
    with pytest.raises(RunDirInUseError, match="lies inside the folder of the run"):
        Experiment.from_config(TINY, out_dir=a / "sub").run(progress=False)
    # a project folder holding its own config.toml is no run's; a comparison's folder is
    # neither, so its methods' run folders (and runs kept side by side) still go inside
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.toml").write_text(dump_toml(TINY))
    assert main(["compare", str(path), "--algorithms", "fedavg,local", "--out",
                 str(project / "cmp"), "--quiet"]) == 0
    assert main(["run", str(path), "--out", str(project / "cmp" / "extra"), "--quiet"]) == 0
    assert (project / "cmp" / "local" / "summary.json").is_file()


def test_a_run_nested_before_is_resumed_where_it_is_but_not_overwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run folder an older clusterfl let a run make inside another's: `--resume` continues
    it where it is (it adds no folder); `--overwrite` is refused, as a new run there is."""
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    a, sub = tmp_path / "a", tmp_path / "sub"
    for out in (a, sub):
        assert main(["run", str(path), "--out", str(out), "--quiet", "--set",
                     "checkpoint_every=1"]) == 0
    sub.rename(a / "sub")
    argv = ["run", str(path), "--out", str(a / "sub"), "--quiet", "--set", "checkpoint_every=1"]
    assert main([*argv, "--resume", "--set", "rounds=3"]) == 0
    assert len((a / "sub" / "history.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 2
    assert f"lies inside the folder of the run {a.resolve()}" in capsys.readouterr().err
    assert (a / "sub" / "summary.json").is_file()


def test_an_out_above_a_run_nested_deeper_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run --out B` (with or without --overwrite) when a run's folder lies deeper in B
    (B/x/y) said "B holds x/y/summary.json, which clusterfl did not write" (clusterfl did) or
    "B is not empty ...; pass --resume ... or --overwrite" (refused too); a run moved into
    A/figures made A's overwrite name figures/config.toml as foreign. Each is now one line
    naming the runs inside; nothing removed."""
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    b, a, moved = tmp_path / "b", tmp_path / "a", tmp_path / "moved"
    for out in (b / "x" / "y", a, moved):
        assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    moved.rename(a / "figures")
    for folder, named in ((b, "x/y"), (a, "figures")):
        before = _files(folder)
        for extra in ([], ["--overwrite"]):
            capsys.readouterr()
            assert main(["run", str(path), "--out", str(folder), "--quiet", *extra]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == [f"clusterfl: error: {folder} holds other runs ({named}); a run's "
                           "folder holds that run's files only and overwrite never removes "
                           "other runs: choose another output folder"], err
        with pytest.raises(RunDirInUseError, match=rf"holds other runs \({named}\)"):
            claim_run_dir(folder, overwrite=True)
        assert _files(folder) == before


def test_the_search_for_runs_below_a_folder_stops_after_walk_most_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runs_below` walks a folder to find runs at any depth; in a huge unrelated folder (a
    home folder given as --out) the walk stops after `WALK_MOST` folders instead of reading
    the whole tree: a run beyond them is not named, the folder is still refused (not empty,
    or foreign files under --overwrite), and nothing is removed."""
    import clusterfl.rundir as rundir

    deep = tmp_path / "big" / "d1" / "d2" / "d3"
    deep.mkdir(parents=True)
    (deep / "summary.json").write_text("{}")
    assert rundir.runs_below(tmp_path / "big") == ["d1/d2/d3"]
    monkeypatch.setattr(rundir, "WALK_MOST", 2)  # big, d1: d2 and d3 are not looked into
    assert rundir.runs_below(tmp_path / "big") == []
    for overwrite in (False, True):
        with pytest.raises(RunDirInUseError, match="not empty" if not overwrite
                           else "which clusterfl did not write"):
            claim_run_dir(tmp_path / "big", overwrite=overwrite)
    assert (deep / "summary.json").read_text() == "{}"
