"""`clusterfl compare --resume`: an interrupted comparison continues where it stopped (the
finished methods are read back, the interrupted one resumes from its checkpoint) and ends
with the uninterrupted comparison's records; before, the same command refused the used
folder and only --overwrite (rerunning every method) was offered."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from clusterfl.checkpoint import Checkpoints
from clusterfl.cli import main
from clusterfl.compare import run_comparison
from clusterfl.config import dump_toml, load_config
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.experiment import Experiment
from clusterfl.rundir import RunDirInUseError
from tests.crash import timing_free
from tests.tiny import tiny_config

RAW = tiny_config(rounds=3, checkpoint_every=1)
SPECS = ["fedavg", "ifca:n_clusters=2"]


def _stop_ifca_after_round_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C right after IFCA's checkpoint of round 2 (once)."""
    real, stopped = Checkpoints.save, []

    def save(self: Checkpoints, t: int, *args: object, **kwargs: object) -> None:
        real(self, t, *args, **kwargs)  # type: ignore[arg-type]
        if self.path is not None and self.path.parent.parent.name.startswith("ifca") \
                and t == 2 and not stopped:
            stopped.append(t)
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoints, "save", save)


def test_an_interrupted_comparison_resumes_to_the_uninterrupted_results(tmp_path: Path,
                                                                        monkeypatch):
    config = load_config(RAW)
    with pytest.raises(ConfigError, match=r"^--resume: .*nothing holds no comparison to "
                                          r"continue; run without --resume$"):
        run_comparison(config, SPECS, tmp_path / "nothing", progress=False, resume=True)
    whole = run_comparison(config, SPECS, tmp_path / "whole", progress=False)
    _stop_ifca_after_round_2(monkeypatch)
    out = tmp_path / "cmp"
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config, SPECS, out, progress=False)
    fedavg_summary = out / "fedavg" / "summary.json"
    written = fedavg_summary.stat().st_mtime_ns
    with pytest.raises(RunDirInUseError, match="is not empty"):
        run_comparison(config, SPECS, out, progress=False)
    other = load_config({**RAW, "train": {**RAW["train"], "lr": 0.5}})
    with pytest.raises(ConfigError, match=r"^--resume: .*fedavg was run with another config "
                                          r"\(train\.lr: .* then, 0\.5 now\)"):
        run_comparison(other, SPECS, out, progress=False, resume=True)
    resumed = run_comparison(config, SPECS, out, progress=False, resume=True)
    assert fedavg_summary.stat().st_mtime_ns == written  # read back, not run again
    assert [label for label, _ in resumed] == [label for label, _ in whole]
    for (_, a), (_, b) in zip(resumed, whole, strict=True):
        assert timing_free(a.records) == timing_free(b.records)
        assert timing_free(a.summary) == timing_free(b.summary)
    assert (out / "report.md").is_file()


def test_the_cli_says_how_to_resume_and_resumes(tmp_path: Path, monkeypatch, capsys):
    config = tmp_path / "c.toml"
    config.write_text(dump_toml(RAW))
    out = tmp_path / "cmp"
    argv = ["compare", str(config), "--algorithms", ",".join(SPECS), "--out", str(out),
            "--quiet"]
    _stop_ifca_after_round_2(monkeypatch)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"clusterfl: interrupted; the finished runs in {out} are kept, "
                       "interrupted ones continue from their checkpoints with --resume: "
                       f"clusterfl compare {config} --algorithms fedavg,ifca:n_clusters=2 "
                       f"--out {out} --resume")
    assert main(argv) == 2
    assert "pass --resume to continue it, --overwrite to replace it" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert "comparison report:" in capsys.readouterr().out
    assert main([*argv, "--resume", "--overwrite"]) == 2  # one or the other


def test_a_continuation_stopped_midway_is_continued_not_taken_as_finished(tmp_path: Path,
                                                                          monkeypatch):
    """A finished 3-round comparison continued to 5 rounds and stopped at round 4: its old
    summary.json of 3 rounds stayed beside config.toml's 5, and `compare --resume` read the
    run back as finished at 3 rounds (only a warning about differing budgets)."""
    out = tmp_path / "cmp"
    run_comparison(load_config(RAW), ["fedavg"], out, progress=False)
    longer = load_config({**RAW, "rounds": 5})
    real, stopped = Checkpoints.save, []

    def save(self: Checkpoints, t: int, *args: object, **kwargs: object) -> None:
        real(self, t, *args, **kwargs)  # type: ignore[arg-type]
        if t == 4 and not stopped:
            stopped.append(t)
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoints, "save", save)
    with pytest.raises(KeyboardInterrupt):
        run_comparison(longer, ["fedavg"], out, progress=False, resume=True)
    assert not (out / "fedavg" / "summary.json").exists()  # no summary of 3 rounds left
    resumed = run_comparison(longer, ["fedavg"], out, progress=False, resume=True)
    whole = run_comparison(longer, ["fedavg"], tmp_path / "whole", progress=False)
    (_, a), (_, b) = resumed[0], whole[0]
    assert a.summary.rounds == 5 and len(a.records) == 5
    assert timing_free(a.records) == timing_free(b.records)
    assert timing_free(a.summary) == timing_free(b.summary)


def test_resuming_with_fewer_methods_says_which_runs_it_leaves_out(tmp_path: Path, capsys):
    out = tmp_path / "cmp"
    run_comparison(load_config(RAW), SPECS, out, progress=False)
    capsys.readouterr()
    run_comparison(load_config(RAW), ["fedavg"], out, progress=False, resume=True)
    err = capsys.readouterr().err
    assert f"{out} also holds runs of methods this comparison does not list " \
           "(ifca_n_clusters=2): they are kept as they are and left out of its report" in err
    assert (out / "ifca_n_clusters=2" / "summary.json").is_file()


def test_a_comparisons_console_warnings_name_their_method(tmp_path: Path, capsys):
    """"clusterfl: warning: the models did not learn ..." came once per method, without
    saying which (the report named it; the console did not)."""
    stuck = load_config({**RAW, "train": {**RAW["train"], "lr": 1e-7}})
    run_comparison(stuck, ["fedavg", "ifca:n_clusters=2"], tmp_path / "cmp", progress=False)
    lines = [x for x in capsys.readouterr().err.splitlines() if "did not learn" in x]
    assert [x.split(": ")[2] for x in lines] == ["FedAvg", "IFCA (K=2)"], lines
    assert all(x.startswith("clusterfl: warning: ") for x in lines)


def test_a_comparison_of_one_method_says_it_has_nothing_to_compare(tmp_path: Path, capsys):
    """Before: `--algorithms fedavg` (or `fedavg,`: a comma left over) wrote a comparison of
    one row, silently. Now a warning says so, on the console and in its report.md."""
    words = ("one method (fedavg): the comparison has nothing to compare it with; list two or "
             "more, separated by commas (`clusterfl run` runs one method)")
    result = run_comparison(load_config(RAW), ["fedavg", " "], tmp_path / "cmp",
                            progress=False)
    assert result.warnings == [words]
    assert f"clusterfl: warning: {words}" in capsys.readouterr().err.splitlines()
    assert f"> **Warning:** {words}\n" in (tmp_path / "cmp" / "report.md").read_text()


@pytest.mark.parametrize("figures", [False, True])
def test_a_comparison_draws_its_own_figures_only_with_figures_on(tmp_path: Path,
                                                                 figures: bool) -> None:
    # `[output] figures = false` was honoured by each run but not by the comparison's three
    # *_compare.png, which report.md linked
    raw = {**RAW, "rounds": 1, "output": {**RAW.get("output", {}), "figures": figures}}
    out = tmp_path / "cmp"
    run_comparison(load_config(raw), ["fedavg", "local"], out, progress=False)
    assert bool(list(out.glob("*_compare.png"))) == figures
    assert ("## Figures" in (out / "report.md").read_text()) == figures


def test_resume_refuses_a_single_runs_folder_as_a_comparison_and_the_other_way(
        tmp_path: Path) -> None:
    """`compare --resume --out RUN_DIR` of one run wrote the method's folder and a comparison
    report.md into that run's folder; `run --resume --out CMP_DIR` told to start over with
    --overwrite, which then refused the folder's other runs."""
    run_dir = tmp_path / "run"
    Experiment.from_config(RAW, out_dir=run_dir).run(progress=False)
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(ConfigError) as err:
        run_comparison(load_config(RAW), ["fedavg"], run_dir, progress=False, resume=True)
    assert str(err.value) == (f"--resume: {run_dir} holds one run (its config.toml, history "
                              "or summary), not a comparison: `clusterfl run CONFIG --out "
                              f"{run_dir} --resume` continues it; give compare another --out")
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written there
    cmp_dir = tmp_path / "cmp"
    run_comparison(load_config(RAW), SPECS, cmp_dir, progress=False)
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(RAW, out_dir=cmp_dir).run(resume=True, progress=False)
    assert str(err.value) == (f"--resume: {cmp_dir} holds the runs of a comparison (fedavg, "
                              "ifca_n_clusters=2), not one run: `clusterfl compare CONFIG "
                              "--algorithms ... --resume` continues a comparison; give run "
                              "another --out")


def test_a_method_whose_checkpoint_cannot_be_read_starts_again_and_says_so(tmp_path: Path,
                                                                           monkeypatch,
                                                                           capsys) -> None:
    """IFCA stopped after round 2, its state.pt then cut short: `compare --resume` threw
    the checkpoint away and ran IFCA again from round 1 without a word (`run --resume`
    refuses such a file in one line)."""
    config = load_config(RAW)
    _stop_ifca_after_round_2(monkeypatch)
    out = tmp_path / "cmp"
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config, SPECS, out, progress=False)
    state = out / "ifca_n_clusters=2" / "checkpoint" / "state.pt"
    size = len(state.read_bytes())
    state.write_bytes(state.read_bytes()[: size // 2])
    capsys.readouterr()
    resumed = run_comparison(config, SPECS, out, progress=False, resume=True)
    warned = [x for x in capsys.readouterr().err.splitlines() if "starts again" in x]
    assert warned == [f"clusterfl: warning: IFCA (K=2): {state} is truncated or damaged "
                      f"({size // 2} bytes that torch cannot read): this run starts again "
                      "from round 1"]
    whole = run_comparison(config, SPECS, tmp_path / "whole", progress=False)
    for (_, a), (_, b) in zip(resumed, whole, strict=True):
        assert timing_free(a.records) == timing_free(b.records)


def test_a_full_disk_or_a_torn_config_toml_does_not_block_compare_resume(tmp_path: Path,
                                                                         monkeypatch,
                                                                         capsys) -> None:
    """Before: a run wrote config.toml in place, so a full disk as a resume began left it
    empty, and `compare --resume` then refused the run as one of another config
    (`algorithm.name: None then, 'ifca' now`); a config.toml cut short stopped it with
    'is not valid TOML'. Now config.toml is replaced whole or not at all, and one that cannot
    be read is said and the run checked against its checkpoint's config."""
    config = load_config(RAW)
    _stop_ifca_after_round_2(monkeypatch)
    out = tmp_path / "cmp"
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config, SPECS, out, progress=False)
    saved = out / "ifca_n_clusters=2" / "config.toml"
    text = saved.read_text()
    real, full = Path.write_text, []

    def write_text(self: Path, data: str, *args: object, **kwargs: object) -> int:
        if self.name.startswith("config.toml") and not full:
            full.append(self)
            open(self, "w").close()  # opened for writing (truncated), then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(ClusterFLError) as err:
        run_comparison(config, SPECS, out, progress=False, resume=True)
    assert str(err.value) == (f"no space left on {saved.parent}: cannot write {saved} (the "
                              "run's config); the checkpoint of round 2 is intact: --resume "
                              "continues from it (it rewrites this file) once there is room")
    assert saved.read_text() == text  # the old one, whole
    assert sorted(p.name for p in saved.parent.iterdir()) == [
        "checkpoint", "config.toml", "history.jsonl"]
    monkeypatch.setattr(Path, "write_text", real)
    saved.write_text(text[: len(text) // 2].rstrip() + "\n[model\n")  # torn
    capsys.readouterr()
    resumed = run_comparison(config, SPECS, out, progress=False, resume=True)
    warned = [x for x in capsys.readouterr().err.splitlines() if "instead" in x]
    assert len(warned) == 1 and warned[0].startswith(
        f"clusterfl: warning: IFCA (K=2): {saved} is not valid TOML: ")
    assert warned[0].endswith(": the run is checked against its checkpoint's config instead")
    assert saved.read_text() == text  # rewritten by the resumed run
    whole = run_comparison(config, SPECS, tmp_path / "whole", progress=False)
    for (_, a), (_, b) in zip(resumed, whole, strict=True):
        assert timing_free(a.records) == timing_free(b.records)
        assert timing_free(a.summary) == timing_free(b.summary)


def test_a_finished_methods_damaged_files_are_written_again_from_its_checkpoint(
        tmp_path: Path, capsys) -> None:
    """A finished comparison, then FedAvg's summary.json emptied, IFCA's history.jsonl given a
    garbage line and FedAvg's config.toml edited to rounds = "two": `compare --resume`
    stopped at "summary.json: not valid JSON" (the checkpoint could write it again) and took
    the edited config.toml without a word. Now each is a warning naming the file, and the
    run's files are written again from its checkpoint, as the uninterrupted run's."""
    config = load_config(RAW)
    out = tmp_path / "cmp"
    whole = run_comparison(config, SPECS, out, progress=False)
    fedavg, ifca = out / "fedavg", out / "ifca_n_clusters=2"
    summary, history = (fedavg / "summary.json").read_text(), (ifca / "history.jsonl").read_text()
    (fedavg / "summary.json").write_text("")
    (ifca / "history.jsonl").write_text(history + "garbage\n")
    capsys.readouterr()
    resumed = run_comparison(config, SPECS, out, progress=False, resume=True)
    err = [x for x in capsys.readouterr().err.splitlines() if "warning" in x and "again" in x]
    assert err == [
        f"clusterfl: warning: FedAvg: {fedavg / 'summary.json'}: not valid JSON (Expecting "
        "value, line 1): the run's files are written again from its checkpoint",
        f"clusterfl: warning: IFCA (K=2): {ifca / 'history.jsonl'}:4: not valid JSON "
        "(Expecting value): the run's files are written again from its checkpoint"]
    assert (ifca / "history.jsonl").read_text() == history
    assert json.loads((fedavg / "summary.json").read_text())["final"] == \
        json.loads(summary)["final"]
    for (_, a), (_, b) in zip(resumed, whole, strict=True):
        assert timing_free(a.summary) == timing_free(b.summary)
    saved = fedavg / "config.toml"
    text = saved.read_text()
    saved.write_text(text.replace("rounds = 3", 'rounds = "two"', 1))
    capsys.readouterr()
    run_comparison(config, SPECS, out, progress=False, resume=True)
    warned = [x for x in capsys.readouterr().err.splitlines() if "instead" in x]
    assert len(warned) == 1 and warned[0].startswith(
        f"clusterfl: warning: FedAvg: {saved}: rounds: Input should be a valid integer")
    assert warned[0].endswith(": the run is checked against its checkpoint's config instead")
    assert saved.read_text() == text  # rewritten from the checkpoint


def test_a_comparison_continued_to_more_rounds_refuses_before_any_method_runs(
        tmp_path: Path) -> None:
    """`compare --resume --set rounds=5` of a finished 3-round comparison of FedAvg and CFL-GP
    (which schedules by the planned rounds and cannot be continued): FedAvg was continued to
    5 rounds first, then CFL-GP refused, leaving a comparison of 5 and 3 rounds."""
    out = tmp_path / "cmp"
    specs = ["fedavg", "cfl_gp:n_clusters=2"]
    run_comparison(load_config(RAW), specs, out, progress=False)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*.json*"))}
    with pytest.raises(ClusterFLError) as err:
        run_comparison(load_config({**RAW, "rounds": 5}), specs, out, progress=False,
                       resume=True)
    assert str(err.value).startswith("--resume: CFL-GP (K=2) schedules by the planned number "
                                     "of rounds (T = 3 in this run), so continuing it to 5 "
                                     "rounds would not equal a 5-round run")
    assert {p: p.read_bytes() for p in sorted(out.rglob("*.json*"))} == before
    assert "rounds = 3\n" in (out / "fedavg" / "config.toml").read_text()


def test_a_resumed_comparison_refuses_another_config_before_a_new_method_runs(
        tmp_path: Path) -> None:
    """Resumed with another lr and a new method listed first: the new method ran whole with
    the new lr, then the old method's run refused the config, leaving a mixed comparison."""
    out = tmp_path / "cmp"
    run_comparison(load_config(RAW), ["ifca:n_clusters=2"], out, progress=False)
    other = load_config({**RAW, "train": {**RAW["train"], "lr": 0.5}})
    with pytest.raises(ConfigError, match=r"^--resume: .*ifca_n_clusters=2 was run with another "
                                          r"config \(train\.lr: 0\.1 then, 0\.5 now\)"):
        run_comparison(other, SPECS, out, progress=False, resume=True)
    assert sorted(p.name for p in out.iterdir()) == ["ifca_n_clusters=2", "report.md"]


def test_compare_seeds_refuses_resume_with_overwrite_instead_of_overwriting(
        tmp_path: Path, capsys) -> None:
    """`compare --seeds 0 --resume --overwrite`: without --seeds the pair is refused; with
    it --resume was dropped and --overwrite ran every seed again, deleting the runs that
    --resume asked to keep."""
    config = tmp_path / "c.toml"
    config.write_text(dump_toml({**RAW, "rounds": 1}))
    out = tmp_path / "seeds"
    argv = ["compare", str(config), "--algorithms", "fedavg", "--seeds", "0", "--out",
            str(out), "--quiet"]
    assert main(argv) == 0
    summary = out / "fedavg" / "seed0" / "summary.json"
    written = summary.stat().st_mtime_ns
    capsys.readouterr()
    assert main([*argv, "--resume", "--overwrite"]) == 2
    assert capsys.readouterr().err.strip() == (
        "clusterfl: error: resume and overwrite exclude each other: resume continues the run "
        "in the folder, overwrite deletes it")
    assert summary.stat().st_mtime_ns == written


def test_a_method_without_config_toml_resumes_from_its_checkpoint_and_says_so(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """IFCA stopped after round 2, its config.toml then gone: `compare --resume` threw its
    checkpoint away and ran IFCA again from round 1 without a word. Now it is checked
    against its checkpoint's config (a warning says so) and continues from round 3."""
    config = load_config(RAW)
    _stop_ifca_after_round_2(monkeypatch)
    out = tmp_path / "cmp"
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config, SPECS, out, progress=False)
    (out / "ifca_n_clusters=2" / "config.toml").unlink()
    monkeypatch.undo()
    real, saved = Checkpoints.save, []

    def save(self: Checkpoints, t: int, *args: object, **kwargs: object) -> None:
        saved.append((self.path.parent.parent.name, t))  # type: ignore[union-attr]
        real(self, t, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Checkpoints, "save", save)
    capsys.readouterr()
    resumed = run_comparison(config, SPECS, out, progress=False, resume=True)
    assert saved == [("ifca_n_clusters=2", 3)]  # FedAvg read back, IFCA continued
    assert (f"clusterfl: warning: IFCA (K=2): {out / 'ifca_n_clusters=2' / 'config.toml'} is "
            "missing: the run is checked against its checkpoint's config instead"
            ) in capsys.readouterr().err.splitlines()
    whole = run_comparison(config, SPECS, tmp_path / "whole", progress=False)
    for (_, a), (_, b) in zip(resumed, whole, strict=True):
        assert timing_free(a.records) == timing_free(b.records)
        assert timing_free(a.summary) == timing_free(b.summary)


def test_a_run_whose_config_toml_predates_a_field_is_read_back_not_refused(tmp_path: Path
                                                                          ) -> None:
    """A finished FedAvg whose config.toml comes from a clusterfl before data.standardize
    existed: `compare --resume` refused it as of another config (`data.standardize: None
    then, False now`); now the field at its default counts as unchanged and the run is read
    back, while the same field set otherwise is refused naming it."""
    out = tmp_path / "cmp"
    run_comparison(load_config(RAW), ["fedavg"], out, progress=False)
    older = out / "fedavg" / "config.toml"
    older.write_text(older.read_text().replace("standardize = false\n", ""))
    assert "standardize" not in older.read_text()
    summary = out / "fedavg" / "summary.json"
    written = summary.stat().st_mtime_ns
    other = load_config({**RAW, "data": {**RAW["data"], "standardize": True}})
    with pytest.raises(ConfigError, match=r"^--resume: .*fedavg was run with another config "
                                          r"\(data\.standardize: absent then \(its default "
                                          r"False\), True now\)"):
        run_comparison(other, ["fedavg"], out, progress=False, resume=True)
    run_comparison(load_config(RAW), ["fedavg"], out, progress=False, resume=True)
    assert summary.stat().st_mtime_ns == written  # read back, not run again


def _compare(config: Path, out: Path, *extra: str) -> int:
    return main(["compare", str(config), "--algorithms", "fedavg", "--out", str(out),
                 "--quiet", *extra])


def _files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != ".clusterfl.lock"}


def test_resuming_a_comparison_without_seeds_with_two_seeds_is_refused(tmp_path: Path,
                                                                       capsys):
    # the seed list changed against the comparison resumed: none (the config's seed) → 0,1;
    # refused before, saying only 'give another --out'
    config = tmp_path / "c.toml"
    config.write_text(dump_toml({**RAW, "rounds": 1}))
    out = tmp_path / "cmp"
    assert _compare(config, out) == 0
    before = _files(out)
    capsys.readouterr()
    assert _compare(config, out, "--seeds", "0,1", "--resume") == 2
    err = capsys.readouterr().err
    assert err == (f"clusterfl: error: {out} holds fedavg, which is the folder of a run, not "
                   "of a sweep's runs (`compare` without --seeds or `run` wrote it); a sweep "
                   "writes each run into METHOD/seedN: give another --out (a comparison "
                   "without --seeds continues with `compare --resume` without --seeds)\n")
    assert _files(out) == before  # no seed folder, no table, the report as it was
    assert _compare(config, out, "--resume") == 0  # as the line says


def test_resuming_a_comparison_with_seeds_without_them_is_refused_naming_its_seeds(
        tmp_path: Path, capsys):
    # before: '.../fedavg holds other runs (seed0, seed1); a run's folder holds that run's
    # files only and overwrite never removes other runs' (a --resume, not an overwrite)
    config = tmp_path / "c.toml"
    config.write_text(dump_toml({**RAW, "rounds": 1}))
    out = tmp_path / "cmp"
    assert _compare(config, out, "--seeds", "0,1") == 0
    before = _files(out)
    capsys.readouterr()
    assert _compare(config, out, "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"clusterfl: error: --resume: {out} holds the runs of a comparison "
                       "with --seeds (fedavg/seed0, fedavg/seed1); continue it with --seeds "
                       "(the seeds it ran with, or more), or give a comparison without "
                       "--seeds another --out")
    assert all(line.startswith("clusterfl: warning: one method") for line in err[:-1])
    assert _files(out) == before
    assert _compare(config, out, "--seeds", "0-2", "--resume") == 0  # one seed more runs
    assert sorted(p.name for p in (out / "fedavg").iterdir()) == ["seed0", "seed1", "seed2"]
    assert {k: v for k, v in _files(out).items() if "/seed2/" not in k and
            k.startswith("fedavg/seed")} == {k: v for k, v in before.items()
                                            if k.startswith("fedavg/seed")}
