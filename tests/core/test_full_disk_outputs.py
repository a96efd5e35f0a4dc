"""A run's other files on a full disk or under a file-size limit: history.jsonl, summary.json,
the figures, report.md, a language model's vocab.txt, flower.json and the bench's
results file each fail in one line naming the file and what is intact, never
with a bare OS message or a cut-off file; the checkpoint then resumes the run exactly. A
figures folder replaced by a file is one line too (`clusterfl report`, a resumed run)."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterfl.cli import main
from clusterfl.config import dump_toml
from clusterfl.errors import ClusterFLError
from clusterfl.experiment import Experiment
from clusterfl.records import read_history
from tests.tiny import tiny_config

CFG = tiny_config(rounds=4, checkpoint_every=2)


def _limited_run(tmp_path: Path, config: dict, limit: int) -> tuple[int, str, Path]:
    """`clusterfl run` under `ulimit -f` of `limit` bytes (a real limit, in a subprocess):
    its exit status, its stderr and the run folder."""
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml(config))

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "clusterfl.cli", "run", str(path), "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300,
                       preexec_fn=small_files)
    return r.returncode, r.stderr.strip(), out


def test_file_size_limit_in_history_keeps_whole_lines(tmp_path: Path) -> None:
    """Round 2's line crosses the limit: it read "File too large: " (no file named) and left
    half a line at the end of history.jsonl; now one line naming it, the file cut back to
    round 1."""
    config = tiny_config(rounds=2)  # no checkpoint: config.toml and round 1 fit in 1 KiB
    code, err, out = _limited_run(tmp_path, config, 1024)
    history = out / "history.jsonl"
    assert code == 2 and err == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {out}: cannot "
        f"write {history} (round 2; it keeps the rounds before, whole); no checkpoint was "
        "written: the run can restart with --overwrite")
    lines = history.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["round"] == 1


def test_file_size_limit_in_a_figure_leaves_no_cut_off_image(tmp_path: Path) -> None:
    """The first figure crosses the limit: it read "File too large: " and left accuracy.png
    cut at the limit; now one line naming the figure, and no image at all."""
    config = tiny_config(rounds=2, checkpoint_every=1, output={"figures": True,
                                                              "progress": "off"})
    code, err, out = _limited_run(tmp_path, config, 20 * 1024)  # the checkpoint fits
    err = err.splitlines()[-1]  # after the warning that the tiny models did not learn
    assert code == 2 and err == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {out / 'figures'}: "
        f"cannot write {out / 'figures' / 'accuracy.png'} (the report); its history.jsonl and "
        f"summary.json are intact: `clusterfl report {out}` writes the report again once "
        "there is room")
    assert list((out / "figures").iterdir()) == []
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2


def test_full_disk_in_history_resumes_from_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up in the middle of round 3's line: history.jsonl keeps rounds 1-2 whole,
    the message names the checkpoint of round 2, and --resume ends as an unbroken run."""
    state = {"lines": 0}
    real = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/history.jsonl"):
            state["lines"] += 1
            if state["lines"] == 3:  # half of round 3's line goes in, then the disk is full
                real(fd, bytes(data)[:len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    history = tmp_path / "history.jsonl"
    assert str(err.value) == (
        f"no space left on {tmp_path}: cannot write {history} (round 3; it keeps the rounds "
        "before, whole); the checkpoint of round 2 is intact: --resume continues from it (it "
        "rewrites this file) once there is room")
    assert [r.round for r in read_history(tmp_path)] == [1, 2]
    monkeypatch.setattr(os, "write", real)
    ref = Experiment.from_config(CFG).run(progress=False)
    resumed = Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    assert resumed.summary.final.metrics == ref.summary.final.metrics
    assert [r.metrics for r in read_history(tmp_path)] == [r.metrics for r in ref.records]


def _disk_full_in(monkeypatch: pytest.MonkeyPatch, name: str, part: str) -> Any:
    """Writing the file `name` writes `part` of it, then finds the disk full; returns the
    real `Path.write_text`, to put back."""
    real = Path.write_text

    def write_text(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == name:
            real(self, part)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", write_text)
    return real


def test_full_disk_in_summary_is_one_line_and_resume_writes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.json's write fails: it was a bare OSError; now one line naming the file and
    the last round's checkpoint, no temporary file left, and --resume writes the summary."""
    real = _disk_full_in(monkeypatch, "summary.json.tmp", "{")
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    assert str(err.value) == (
        f"no space left on {tmp_path}: cannot write {tmp_path / 'summary.json'} (the run's "
        "summary; history.jsonl holds every round); the checkpoint of round 4 is intact: "
        "--resume continues from it (it rewrites this file) once there is room")
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "summary.json.tmp").exists()
    monkeypatch.setattr(Path, "write_text", real)
    ref = Experiment.from_config(CFG).run(progress=False)
    resumed = Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    assert resumed.summary.final.metrics == ref.summary.final.metrics
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 4


def test_a_figures_folder_replaced_by_a_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`figures` is a file: report and a resumed run said "File exists: DIR/figures"."""
    config = tiny_config(rounds=2, checkpoint_every=1, output={"figures": True,
                                                              "progress": "off"})
    path, out = tmp_path / "run.toml", tmp_path / "out"
    path.write_text(dump_toml(config))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    shutil.rmtree(out / "figures")
    (out / "figures").write_text("not a folder")
    capsys.readouterr()
    line = (f"clusterfl: error: {out / 'figures'} is a file where a folder belongs: cannot "
            f"write {out / 'figures'} (the report); its history.jsonl and summary.json are "
            f"intact: `clusterfl report {out}` writes the report again once there is room")
    for argv in (["report", str(out)], ["run", str(path), "--out", str(out), "--resume"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == line, (argv, err)
        assert not any(e.startswith("Traceback") for e in err)
    assert (out / "figures").read_text() == "not a folder"


def test_file_size_limit_in_cfls_tree_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """CFL's cfl_tree.pt, written after the last round, crosses the limit: torch's writer
    raised "RuntimeError: ... unexpected pos" with a traceback; now one line naming it."""
    config = tiny_config(rounds=2, algorithm={"name": "cfl"})  # the tree: ~10 KB
    code, err, out = _limited_run(tmp_path, config, 4096)  # config and history fit
    assert code == 2 and err.splitlines()[-1] == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {out}: cannot "
        f"write {out / 'cfl_tree.pt'} (the method's own file, after the last round); no "
        "checkpoint was written: the run can restart with --overwrite")
    assert "Traceback" not in err and not (out / "cfl_tree.pt.tmp").exists()


def _limited(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    """`python ARGS` under `ulimit -f` of `limit` bytes."""
    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, preexec_fn=small_files)


def test_an_os_error_naming_no_file_ends_with_its_words(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's last resort for an OSError printed "clusterfl: error: Input/output error: "
    with an empty name after the colon when the error named no file (a write's)."""
    import clusterfl.config

    def fail(*args: object, **kwargs: object) -> str:
        raise errors.pop(0)

    errors = [OSError(errno.EIO, "Input/output error"),
              OSError(errno.EACCES, "Permission denied", "cfg/a.toml"),
              OSError(errno.EXDEV, "Invalid cross-device link", "/a/x.tmp", None, "/b/x")]
    monkeypatch.setattr(clusterfl.config, "dump_toml", fail)
    lines = []
    for _ in range(3):
        assert main(["config", "show"]) == 2
        lines.append(capsys.readouterr().err)
    assert lines == ["clusterfl: error: Input/output error\n",
                     "clusterfl: error: Permission denied: cfg/a.toml\n",
                     "clusterfl: error: Invalid cross-device link: /a/x.tmp -> /b/x\n"]


def test_file_size_limit_in_flts_archive_names_it_and_leaves_none(tmp_path: Path) -> None:
    """FLT's flt_relatedness.npz (~4.7 KB) crosses the limit after the last round: the line
    named the run folder, not the file, and a cut-off archive was left."""
    config = tiny_config(rounds=2, algorithm={"name": "flt", "encoder": "none", "latent": 16,
                                              "k": 3, "finetune_epochs": 0, "umap": False})
    code, err, out = _limited_run(tmp_path, config, 3000)  # config and history (~2.2 KB) fit
    npz = out / "flt_relatedness.npz"
    assert code == 2 and err.splitlines()[-1] == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {out}: cannot "
        f"write {npz} (the method's own file, after the last round); no checkpoint was "
        "written: the run can restart with --overwrite")
    assert not npz.exists() and not (out / "flt_relatedness.npz.tmp").exists()


def test_file_size_limit_in_a_sweeps_table_names_it(tmp_path: Path) -> None:
    """results.csv crosses the limit: a bare "OSError: [Errno 27] File too large" traceback
    (the CLI's line named no file) and a cut-off table; now one line naming it."""
    code = ("import sys\nfrom clusterfl.errors import ClusterFLError\n"
            "from clusterfl.sweep import write_table\n"
            "rows = [{'path': f'run{i}', 'status': 'done', 'accuracy': i / 7} for i in "
            "range(100)]\ntry:\n    write_table(rows, sys.argv[1])\n"
            "except ClusterFLError as exc:\n    print(exc)\n")
    r = _limited(["-c", code, str(tmp_path)], 1024)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"the file-size limit (ulimit -f) was reached on {tmp_path}: cannot write "
        f"{tmp_path / 'results.csv'} (the sweep's table); every run's folder is intact: the "
        "same command with --report-only writes the table and report again")
    assert list(tmp_path.iterdir()) == []


def test_file_size_limit_in_exported_partitions_names_the_client_file(tmp_path: Path) -> None:
    """`flower export-partitions`: a client file crossing the limit read "clusterfl: error:
    File too large: " (no file named) and was left cut off; now one line naming it."""
    path, out = tmp_path / "run.toml", tmp_path / "parts"
    path.write_text(dump_toml(tiny_config()))
    r = _limited(["-m", "clusterfl.cli", "flower", "export-partitions", str(path), str(out)],
                 32 * 1024)  # a client's digits: ~100 KB
    assert r.returncode == 2 and r.stderr.strip() == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {out}: cannot "
        f"write {out / 'client_0000.npz'} (client 0 of 4); 0 client files before it are "
        "whole; the same command writes the export again")
    assert list(out.iterdir()) == []


TOPICS = tiny_config(rounds=2, data={"source": "synthetic_topics"},
                     scenario={"name": "topics", "n_clients": 4, "seq_len": 5,
                               "vocab_size": 50},
                     model={"name": "lstm", "hidden": 8})


def test_full_disk_in_a_language_models_vocab_is_one_line_and_leaves_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vocab.txt (Vocab.save, at the run's start) fails part way: one line naming the file
    and what is intact, no vocab.txt nor its temporary file left; --overwrite then runs."""
    real = _disk_full_in(monkeypatch, "vocab.txt.tmp", "<unk>\n")
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(TOPICS, out_dir=tmp_path).run(progress=False)
    vocab = tmp_path / "vocab.txt"
    assert str(err.value) == (
        f"no space left on {tmp_path}: cannot write {vocab} (the language model's "
        "vocabulary); no checkpoint was written: the run can restart with --overwrite")
    assert not vocab.exists() and not (tmp_path / "vocab.txt.tmp").exists()
    monkeypatch.setattr(Path, "write_text", real)
    Experiment.from_config(TOPICS, out_dir=tmp_path, overwrite=True).run(progress=False)
    assert vocab.read_text().splitlines()[:2] == ["<unk>", "<eos>"]


def test_file_size_limit_in_flower_json_names_it_and_keeps_the_old_one(tmp_path: Path
                                                                        ) -> None:
    """flower.json (write_flower_json, after a Flower run) crosses the limit: one line naming
    it and the run's own files, and the flower.json already there is left as it was."""
    (tmp_path / "flower.json").write_text('{"messages": 1}')
    code = ("import sys\nfrom pathlib import Path\nfrom clusterfl.errors import ClusterFLError\n"
            "from clusterfl.backends.flower import write_flower_json\n"
            "try:\n    write_flower_json(Path(sys.argv[1]), {'nodes': {str(c): 10 ** 12 + c "
            "for c in range(200)}})\nexcept ClusterFLError as exc:\n    print(exc)\n")
    r = _limited(["-c", code, str(tmp_path)], 1024)  # the node map: ~5.7 KB
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"the file-size limit (ulimit -f) was reached on {tmp_path}: cannot write "
        f"{tmp_path / 'flower.json'} (the Flower run's node map and message counts); the "
        "run's own files (summary.json, history.jsonl) are intact")
    assert (tmp_path / "flower.json").read_text() == '{"messages": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flower.json"]


def test_file_size_limit_in_the_bench_results_names_it_and_keeps_the_old_one(
        tmp_path: Path) -> None:
    """The bench's results file (bench.write_results) crosses the limit: one line naming it
    and the runs, and the results file already there is left as it was."""
    from tests.core.test_bench import SUITE

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "digits.toml").write_text(SUITE.format(paper=50.0))
    results, runs = tmp_path / "RESULTS.md", tmp_path / "runs"
    results.write_text("the last results")
    code = ("import sys\nfrom pathlib import Path\nfrom clusterfl.errors import ClusterFLError\n"
            "from clusterfl.bench import load_suite, write_results\n"
            "t = Path(sys.argv[1])\ntry:\n    write_results(load_suite(t / 'suite'), "
            "t / 'runs', t / 'RESULTS.md', 'clusterfl bench')\n"
            "except ClusterFLError as exc:\n    print(exc)\n")
    r = _limited(["-c", code, str(tmp_path)], 1024)  # the table without runs: ~2.4 KB
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"the file-size limit (ulimit -f) was reached on {tmp_path}: cannot write {results} "
        f"(the bench's results); the runs under {runs} are intact: the same command writes "
        "the results again")
    assert results.read_text() == "the last results"
    assert not (tmp_path / "RESULTS.md.tmp").exists()
