"""The checkpoint file (issue 35): written whole or not at all, with one line for a full disk
or a file-size limit (the previous checkpoint stays intact), and one line for an empty,
truncated or foreign `state.pt` on resume."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clusterfl.checkpoint import CHECKPOINT, where_changes
from clusterfl.cli import main
from clusterfl.cli_util import Terminated
from clusterfl.config import dump_toml, load_config, read_toml
from clusterfl.errors import ClusterFLError
from clusterfl.experiment import Experiment
from clusterfl.state import CheckpointError, read_checkpoint, write_checkpoint
from tests.crash import StopError, timing_free
from tests.tiny import tiny_config

CFG = tiny_config(rounds=4, checkpoint_every=2)


def _round(out: Path) -> int:
    return int(torch.load(out / CHECKPOINT, weights_only=False)["round"])


def test_full_disk_checkpoint_one_line_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up while round 4's checkpoint is written: one line naming the folder
    and both rounds; round 2's checkpoint is intact and resumable, no temporary file left."""
    real, calls = os.fsync, []

    def full(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError) as err:
        Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    folder = tmp_path / "checkpoint"
    assert str(err.value) == (f"no space left on {folder} while writing the checkpoint of "
                              "round 4; the checkpoint of round 2 is intact")
    assert _round(tmp_path) == 2 and sorted(p.name for p in folder.iterdir()) == ["state.pt"]
    monkeypatch.setattr(os, "fsync", real)
    ref = Experiment.from_config(CFG).run(progress=False)
    resumed = Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    assert resumed.summary.final.metrics == ref.summary.final.metrics


def test_file_size_limit_checkpoint_one_line_error(tmp_path: Path) -> None:
    """`ulimit -f` below the checkpoint's size (a real limit, in a subprocess): exit 2 and one
    line, not torch's `unexpected pos`."""
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml(CFG))
    limit = 4096  # config.toml and the history fit; the checkpoint (the MLP's weights) not

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "clusterfl.cli", "run", str(path), "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300,
                       preexec_fn=small_files)
    err = r.stderr.strip()
    assert r.returncode == 2 and err.count("\n") == 0, err
    assert err == (f"clusterfl: error: the file-size limit (ulimit -f) was reached on "
                   f"{out / 'checkpoint'} while writing the checkpoint of round 2; no earlier "
                   "checkpoint was written")
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == []


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real checkpoint (round 4 of `CFG`)."""
    out = tmp_path_factory.mktemp("saved")
    Experiment.from_config(CFG, out_dir=out).run(progress=False)
    return (out / CHECKPOINT).read_bytes()


def _resume_with(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> str:
    """`clusterfl run --resume` on a run folder whose state.pt holds `data`: its one line."""
    tmp_path.mkdir(exist_ok=True)
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml({**CFG, "rounds": 6}))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    (out / CHECKPOINT).write_bytes(data)
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.endswith("the run can restart with --overwrite")
    return err


def test_truncated_checkpoint_one_line_error(tmp_path: Path, saved: bytes,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    err = _resume_with(tmp_path, saved[: len(saved) // 2], capsys)
    assert f"{tmp_path / 'out' / CHECKPOINT} is truncated or damaged" in err


def test_a_changed_byte_inside_a_tensor_is_refused_not_loaded(
        tmp_path: Path, saved: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """200 bytes flipped inside the model tensor's data: torch loaded the changed weights and
    the run went on from them (only a "training loss exploded" warning, accuracy 54 % for
    87 %); the zip's CRC-32 of that part no longer matches."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(saved)) as archive:
        part = max(archive.infolist(), key=lambda i: i.file_size)  # the largest tensor
    start = part.header_offset + 30 + len(part.filename.encode()) + len(part.extra) + 8
    assert part.file_size > 300
    damaged = bytearray(saved)
    for i in range(start, start + 200):
        damaged[i] ^= 0xFF
    err = _resume_with(tmp_path, bytes(damaged), capsys)
    assert f"{tmp_path / 'out' / CHECKPOINT} is damaged: its part {part.filename} fails its " \
           "checksum" in err


def test_empty_checkpoint_one_line_error(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    err = _resume_with(tmp_path, b"", capsys)
    assert "state.pt is empty: it is not a clusterfl checkpoint" in err


def test_foreign_checkpoint_one_line_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Random bytes, and a torch file that is not a run's state."""
    err = _resume_with(tmp_path, os.urandom(3000), capsys)
    assert "state.pt is not a clusterfl checkpoint" in err
    other = tmp_path / "other.pt"
    torch.save({"model": torch.zeros(3)}, other)
    err = _resume_with(tmp_path / "b", other.read_bytes(), capsys)
    assert "state.pt is not a clusterfl checkpoint (it does not hold a run's state)" in err


def test_write_checkpoint_keeps_the_old_file_when_the_write_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.pt"
    write_checkpoint(path, {"round": 1}, 1, None)
    assert read_checkpoint(path, ("round",)) == {"round": 1}
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(
        OSError(errno.EDQUOT, "Disk quota exceeded")))
    with pytest.raises(CheckpointError, match=r"disk quota is full .* round 2; the checkpoint "
                                              r"of round 1 is intact"):
        write_checkpoint(path, {"round": 2}, 2, 1)
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(
        OSError(errno.EACCES, "Permission denied")))
    with pytest.raises(PermissionError):  # not about space: raised as it is
        write_checkpoint(path, {"round": 2}, 2, 1)
    assert read_checkpoint(path, ("round",)) == {"round": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]



@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_stop_while_the_checkpoint_is_written_leaves_no_half_written_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: type[BaseException]) -> None:
    """Ctrl-C or SIGTERM in the middle of writing round 4's checkpoint left the half-written
    `state.pt.tmp` (as large as the checkpoint) in the run folder until the next write."""
    real, calls = os.fsync, []

    def stopped(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise stop
        real(fd)

    monkeypatch.setattr(os, "fsync", stopped)
    with pytest.raises(stop):
        Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    assert _round(tmp_path) == 2
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["state.pt"]


def test_resume_before_the_first_checkpoint_says_overwrite_not_run_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed before its first checkpoint: `--resume` said "run without --resume",
    which then said the folder is not empty: pass --resume or --overwrite (a circle)."""
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml(CFG))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    (out / CHECKPOINT).unlink()  # what a kill before the first checkpoint leaves
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("the run stopped before its first checkpoint: start it again with "
                        "--overwrite (instead of --resume)"), err
    assert main(["run", str(path), "--out", str(out), "--quiet", "--overwrite"]) == 0
    (out / CHECKPOINT).unlink()
    (out / CHECKPOINT).mkdir()
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 2
    assert "state.pt is not a file (a checkpoint is one file)" in capsys.readouterr().err


def test_resume_of_a_run_without_checkpoints_names_checkpoint_every(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a finished run with checkpoint_every = 0 was told it "stopped before its first checkpoint"
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml({**CFG, "checkpoint_every": 0}))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "the run keeps none (checkpoint_every = 0): run it again with --overwrite, with "
        "checkpoint_every > 0 to continue it later")


def _stopped_at_round_3(out: Path) -> None:
    """`CFG` run into `out` until it dies at the start of round 3 (round 2 checkpointed)."""
    broken = Experiment.from_config(CFG, out_dir=out)
    real = broken.algorithm.run_round

    def dies(ctx: object, t: int) -> object:
        if t == 3:
            raise StopError
        return real(ctx, t)  # type: ignore[arg-type]

    broken.algorithm.run_round = dies  # type: ignore[method-assign]
    with pytest.raises(StopError):
        broken.run(progress=False)


@pytest.mark.parametrize(("backend", "changed", "how"), [
    ({"precision": "bf16-mixed"}, "backend.precision: 'fp32' then, 'bf16-mixed' now",
     "more than in the last digits: another precision rounds every product anew"),
    ({"chunk_size": 1}, "backend.chunk_size: 'auto' then, 1 now",
     "in the last digits, by rounding"),
])
def test_a_resume_on_another_precision_or_chunk_size_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: dict[str, object],
        changed: str, how: str) -> None:
    """`--resume --set backend.precision=bf16-mixed` was accepted without a word (the
    backend's where-settings may change on resume), and its rounds after the checkpoint
    differed from an uninterrupted run's while the run claimed to equal one."""
    _stopped_at_round_3(tmp_path)
    capsys.readouterr()
    moved = {**CFG, "backend": {"name": "simulation", **backend}}
    history = Experiment.from_config(moved, out_dir=tmp_path).run(resume=True, progress=False)
    line = (f"resumed with {changed}: rounds 3 to 4 compute so, and the results may differ "
            f"from an uninterrupted run's ({how})")
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err.splitlines()
    assert history.summary.warnings is not None and line in history.summary.warnings
    again = tmp_path.parent / f"{tmp_path.name}_same"
    _stopped_at_round_3(again)
    capsys.readouterr()
    history = Experiment.from_config(CFG, out_dir=again).run(resume=True, progress=False)
    assert "resumed with" not in capsys.readouterr().err
    assert not any("resumed with" in w for w in history.summary.warnings or [])


def test_where_changes_leaves_out_values_that_compute_the_same_on_the_cpu() -> None:
    """Written before "auto", a CPU run's config held chunk_size = 64, which auto is on the
    CPU; tf32 does nothing on the CPU: neither is a change to warn about."""
    def table(**backend: object) -> dict[str, object]:
        config = load_config(tiny_config(backend={"name": "simulation", "device": "cpu",
                                                  **backend}))
        return config.to_dict()

    cpu = load_config(tiny_config(backend={"name": "simulation", "device": "cpu"}))
    assert where_changes(table(chunk_size=64, precision="tf32"), table(), cpu) == []
    assert where_changes(table(chunk_size=8), table(), cpu) == [
        "backend.chunk_size: 8 then, 'auto' now"]


def test_a_resume_with_checkpoints_off_says_which_round_the_checkpoint_keeps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--resume --set checkpoint_every=0` finished the run without a word, leaving a
    checkpoint of round 2 beside the summary of round 4 (what `place` and a later resume
    use)."""
    _stopped_at_round_3(tmp_path)
    capsys.readouterr()
    history = Experiment.from_config({**CFG, "checkpoint_every": 0}, out_dir=tmp_path).run(
        resume=True, progress=False)
    line = (f"resumed with checkpoint_every = 0: rounds 3 to 4 write no checkpoint, so "
            f"{tmp_path / CHECKPOINT} keeps round 2 (a later --resume starts there again, and "
            "`clusterfl place` places with round 2's models)")
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err.splitlines()
    assert history.summary.warnings is not None and line in history.summary.warnings
    assert _round(tmp_path) == 2 and history.records[-1].round == 4


def _as_written_before(out: Path, *fields: str, unknown: dict[str, object] | None = None
                       ) -> None:
    """The run folder `out` as an older clusterfl wrote it: the dotted `fields` (added to
    clusterfl since) absent from its checkpoint's config and its config.toml, and the
    dotted `unknown` ones (a field removed or renamed since) in them."""
    state = torch.load(out / CHECKPOINT, weights_only=False)
    saved = read_toml(out / "config.toml")
    for config in (state["config"], saved):
        for dotted in fields:
            table, name = dotted.split(".")
            del config[table][name]
        for dotted, value in (unknown or {}).items():
            table, name = dotted.split(".")
            config[table][name] = value
    torch.save(state, out / CHECKPOINT)
    (out / "config.toml").write_text(dump_toml(saved))


def test_a_checkpoint_written_before_a_field_existed_resumes_with_its_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint of a clusterfl without data.standardize and model.dropout was refused
    as of another config (`data.standardize: None then, False now`), for every field added
    since; now such a field at its default counts as unchanged (a note says so) and the run
    ends as an uninterrupted one, while a field that differs is still refused."""
    _stopped_at_round_3(tmp_path)
    _as_written_before(tmp_path, "data.standardize", "model.dropout")
    for table, changed, why in [
            ("model", {"dropout": 0.5}, "model.dropout: absent then (its default 0.0), 0.5 now"),
            ("train", {"lr": 0.5}, "train.lr: 0.1 then, 0.5 now")]:
        other = {**CFG, table: {**CFG[table], **changed}}
        with pytest.raises(ClusterFLError) as err:
            Experiment.from_config(other, out_dir=tmp_path).run(resume=True, progress=False)
        assert str(err.value) == (f"--resume: the checkpoint in {tmp_path / 'checkpoint'} was "
                                  f"made with another config ({why}); use the same config "
                                  "(see its config.toml) or a new --out")
    capsys.readouterr()
    resumed = Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    assert (f"clusterfl: note: the checkpoint in {tmp_path / 'checkpoint'} was written by an "
            "older clusterfl, without data.standardize and model.dropout: taken as unchanged, "
            "at the defaults this config has (False, 0.0)"
            ) in capsys.readouterr().err.splitlines()
    whole = Experiment.from_config(CFG).run(progress=False)
    assert timing_free(resumed.records) == timing_free(whole.records)
    assert timing_free(resumed.summary) == timing_free(whole.summary)


def test_a_checkpoint_holding_a_field_this_version_does_not_know_is_refused_naming_it(
        tmp_path: Path) -> None:
    """A field removed or renamed since (no config field is mapped to a new name) read
    `model.width: 16 then, None now`, as if the config had set it to None."""
    _stopped_at_round_3(tmp_path)
    _as_written_before(tmp_path, "data.standardize", unknown={"model.width": 16})
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    assert str(err.value) == (
        f"--resume: the checkpoint in {tmp_path / 'checkpoint'} was made by a clusterfl whose "
        "config had model.width (16), a field this version does not know (removed or renamed "
        "since): this version cannot continue that run; rerun it into a new --out, or resume "
        "it with the clusterfl that made it")
    assert _round(tmp_path) == 2


def test_resuming_a_finished_run_says_that_no_round_ran_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--resume` on a finished run wrote its files again without a word (the same bytes);
    now a note says so, and a resume that continues it to more rounds says nothing of it."""
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml({**CFG, "rounds": 2}))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    summary = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (f"clusterfl: note: {out} had run all 2 rounds (its checkpoint holds round 2): no "
            "round is run again, and its config.toml, history.jsonl and summary.json are "
            "written again from the checkpoint; --set rounds=N (N > 2) continues it"
            ) in capsys.readouterr().err.splitlines()
    assert (out / "summary.json").read_bytes() == summary
    assert main(["run", str(path), "--out", str(out), "--quiet", "--resume", "--set",
                 "rounds=3"]) == 0
    assert "had run all" not in capsys.readouterr().err
    assert _round(out) == 3
