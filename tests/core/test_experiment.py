"""End-to-end runs: files written, accuracy rises, a killed run resumes to identical results."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.records import RoundRecord, RunSummary, read_summary
from tests.datasets import require

SMALL = {
    "seed": 3, "rounds": 8, "eval_every": 1, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.1, "batch_size": 16, "epochs": 1},
    "algorithm": {"name": "fedavg"},
    "output": {"figures": False},
}


def test_run_writes_files_and_learns(tmp_path):
    history = Experiment.from_config(SMALL, out_dir=tmp_path).run(progress=False)
    acc = history.series("accuracy")
    assert len(history.records) == 8 and len(acc) == 8
    assert acc[-1] > acc[0] + 0.2 and acc[-1] > 0.5
    for name in ("config.toml", "history.jsonl", "summary.json"):
        assert (tmp_path / name).is_file()
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert [_round(x) for x in lines] == list(range(1, 9))
    final = read_summary(tmp_path).final
    assert final.metrics is not None
    assert final.metrics.accuracy == pytest.approx(acc[-1])
    assert final.ari == pytest.approx(0.0)  # one model for two true clusters
    assert final.floats_up == 8 * 8 * Experiment.from_config(SMALL).factory.size


def _round(line: str) -> int:
    return RoundRecord.from_json_dict(json.loads(line)).round


def _strip(obj):
    if isinstance(obj, RoundRecord | RunSummary):  # compared in their JSON form
        return _strip(obj.to_json_dict())
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k != "wall_time"}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def test_killed_run_resumes_to_identical_summary(tmp_path):
    cfg = {**SMALL, "rounds": 40, "checkpoint_every": 3, "eval_every": 5,
           "algorithm": {"name": "fedprox", "fraction": 0.5, "mu": 0.01},
           "train": {"lr": 0.1, "batch_size": 32, "epochs": 1, "momentum": 0.9}}
    path = tmp_path / "run.toml"
    path.write_text(dump_toml(cfg))
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "clusterfl.cli", "run", str(path), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt, hist = out / "checkpoint" / "state.pt", out / "history.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and hist.exists() and len(hist.read_text().splitlines()) >= 7:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done = len(hist.read_text().splitlines())
    assert 7 <= done < 40

    resumed = Experiment.from_config(path, out_dir=out).run(resume=True, progress=False)
    assert _strip(resumed.summary) == _strip(ref.summary)
    assert _strip(resumed.records) == _strip(ref.records)
    lines = hist.read_text().splitlines()
    assert [_round(x) for x in lines] == list(range(1, 41))


def test_resume_refuses_other_config_or_missing_checkpoint(tmp_path):
    from clusterfl.errors import ClusterFLError

    with pytest.raises(ClusterFLError, match="no checkpoint"):
        Experiment.from_config(SMALL, out_dir=tmp_path).run(resume=True, progress=False)
    cfg = {**SMALL, "checkpoint_every": 2, "rounds": 4}
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    with pytest.raises(ClusterFLError, match=r"another config \(seed: 3 then, 9 now\)"):
        Experiment.from_config({**cfg, "seed": 9}, out_dir=tmp_path).run(resume=True)
    with pytest.raises(ClusterFLError, match=r"\(train\.lr: 0\.1 then, 0\.2 now\)"):
        Experiment.from_config({**cfg, "train": {**cfg["train"], "lr": 0.2}},
                               out_dir=tmp_path).run(resume=True)
    # another method: its name, not the first of its options in sorted order (an IFCA run
    # resumed as FedAvg named "algorithm.assign_by: 'loss' then, None now")
    ifca = {**cfg, "algorithm": {"name": "ifca", "n_clusters": 2}}
    ifca_dir = tmp_path.parent / f"{tmp_path.name}_ifca"  # not inside the first run's folder
    Experiment.from_config(ifca, out_dir=ifca_dir).run(progress=False)
    with pytest.raises(ClusterFLError, match=r"\(algorithm\.name: 'ifca' then, 'fedavg' now\)"):
        Experiment.from_config(cfg, out_dir=ifca_dir).run(resume=True)


def _write_clients(folder: Path, n: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(exist_ok=True)
    for i in range(n):
        x = rng.normal(size=(40, 6)).astype(np.float32)
        y = (x[:, i % 2] > 0).astype(np.int64)
        np.savez(folder / f"client_{i:04d}.npz", x_train=x[:30], y_train=y[:30],
                 x_test=x[30:], y_test=y[30:], client_id=i, n_classes=2, cluster=i % 2)


def test_resume_refuses_data_that_changed_since_the_checkpoint(tmp_path):
    """The config names the data (an npz folder) but not its contents: a client file
    edited between a crash and `--resume` used to be read silently, so the run went on as
    neither the old data's run nor the new one's. The checkpoint keeps a digest of each
    client's rows; the same data resumes."""
    import numpy as np

    from clusterfl.errors import ClusterFLError

    clients = tmp_path / "clients"
    _write_clients(clients, 6)
    cfg = {"seed": 0, "rounds": 3, "checkpoint_every": 1,
           "data": {"source": "npz", "path": str(clients)},
           "model": {"name": "mlp", "hidden": [8]}, "train": {"lr": 0.1},
           "algorithm": {"name": "fedavg"}, "output": {"figures": False}}
    run = tmp_path / "run"
    Experiment.from_config(cfg, out_dir=run).run(progress=False)
    more = {**cfg, "rounds": 4}
    original = (clients / "client_0002.npz").read_bytes()
    d = dict(np.load(clients / "client_0002.npz"))
    np.savez(clients / "client_0002.npz", **{**d, "y_train": 1 - d["y_train"]})
    with pytest.raises(ClusterFLError, match=r"the data changed since the checkpoint in "
                       r".*\(the training data of client 2\); resume on the data"):
        Experiment.from_config(more, out_dir=run).run(resume=True, progress=False)
    d = dict(np.load(clients / "client_0005.npz"))
    np.savez(clients / "client_0005.npz", **{**d, "x_test": d["x_test"] + 1})
    with pytest.raises(ClusterFLError, match=r"\(the training data of client 2; the test "
                       r"data of client 5\)"):
        Experiment.from_config(more, out_dir=run).run(resume=True, progress=False)
    np.savez(clients / "client_0005.npz", **d)
    _write_clients(tmp_path / "seven", 7)
    (clients / "client_0006.npz").write_bytes((tmp_path / "seven/client_0006.npz").read_bytes())
    with pytest.raises(ClusterFLError, match=r"\(6 clients then, 7 now\)"):
        Experiment.from_config(more, out_dir=run).run(resume=True, progress=False)
    (clients / "client_0006.npz").unlink()
    (clients / "client_0002.npz").write_bytes(original)
    resumed = Experiment.from_config(more, out_dir=run).run(resume=True, progress=False)
    whole = Experiment.from_config(more, out_dir=tmp_path / "whole").run(progress=False)
    assert _strip(resumed.records) == _strip(whole.records)


def test_a_callback_that_raises_stops_the_run_in_one_line_and_it_resumes_without_it(
        tmp_path):
    """A tracker raising ended the CLI in a bare traceback; the run could then not resume
    without it (the changed `[output]` table was "another config")."""
    from clusterfl.tracking import CallbackError

    class Boom:
        def on_round_end(self, record):
            if record.round == 3:
                raise RuntimeError("tracker unreachable")

    cfg = {**SMALL, "checkpoint_every": 2, "rounds": 5}
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)
    with pytest.raises(CallbackError) as err:
        Experiment.from_config(cfg, out_dir=tmp_path / "run", callbacks=[Boom()]).run(
            progress=False)
    assert ".Boom: on_round_end in round 3 raised RuntimeError: tracker unreachable " \
           "(test_experiment.py:" in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
    other_output = {**cfg, "checkpoint_every": 1, "output": {"figures": True, "progress": "off"}}
    resumed = Experiment.from_config(other_output, out_dir=tmp_path / "run").run(
        resume=True, progress=False)
    assert _strip(resumed.records) == _strip(ref.records)
    assert (tmp_path / "run" / "figures").is_dir()


def test_cli_errors_are_one_clear_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('rounds = -2\n[data]\nsource = "digits"\n')
    r = subprocess.run([sys.executable, "-m", "clusterfl.cli", "run", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "clusterfl: error: rounds:" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "clusterfl.cli", "run", str(tmp_path / "x.toml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "config file not found" in r.stderr


def test_run_on_real_mnist_if_available(tmp_path):
    require("mnist")  # found through $CLUSTERFL_DATA, as a user's run finds it
    cfg = {**SMALL, "rounds": 3, "data": {"source": "mnist"},
           "scenario": {"name": "label_swap", "n_clients": 4, "n_clusters": 2}}
    h = Experiment.from_config(cfg).run(progress=False)
    assert h.series("accuracy")[-1] > 0.6


def test_standardized_inputs_keep_the_federation_and_learn(tmp_path):
    raw = Experiment.from_config(SMALL).federation
    cfg = {**SMALL, "data": {"source": "digits", "standardize": True}}
    exp = Experiment.from_config(cfg, out_dir=tmp_path)
    fed = exp.federation
    assert fed.meta["standardized"] and not raw.meta["standardized"]
    assert (fed.y_train == raw.y_train).all() and (fed.train_offsets == raw.train_offsets).all()
    assert abs(float(fed.x_train.mean())) < 0.05 and abs(float(fed.x_train.std()) - 1) < 0.05
    acc = exp.run(progress=False).series("accuracy")
    assert acc[-1] > acc[0] + 0.2 and acc[-1] > 0.5


# ------------------------------------------------------------------ one run per run directory

TINY = {**SMALL, "rounds": 2}


def test_a_used_run_directory_needs_resume_or_overwrite(tmp_path):
    from clusterfl.experiment import RunDirInUseError

    Experiment.from_config(TINY, out_dir=tmp_path).run(progress=False)
    (tmp_path / "report.md").write_text("an older run's report")  # left by the earlier run
    with pytest.raises(RunDirInUseError, match=r"not empty .*resume=True.*overwrite=True"):
        Experiment.from_config(TINY, out_dir=tmp_path).run(progress=False)
    assert (tmp_path / "report.md").is_file()  # nothing was touched
    h = Experiment.from_config(TINY, out_dir=tmp_path, overwrite=True).run(progress=False)
    assert not (tmp_path / "report.md").exists()  # emptied first: no stale files
    assert len(h.records) == 2 and (tmp_path / "summary.json").is_file()


def test_overwrite_never_empties_a_folder_of_other_files(tmp_path):
    from clusterfl.experiment import RunDirInUseError

    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(RunDirInUseError, match=r"holds thesis\.tex, which clusterfl did not write"):
        Experiment.from_config(TINY, out_dir=tmp_path, overwrite=True).run(progress=False)
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_cli_run_into_a_used_folder_is_one_line_naming_resume_and_overwrite(tmp_path, capsys):
    from clusterfl.cli import main

    path, out = tmp_path / "tiny.toml", tmp_path / "out"
    path.write_text(dump_toml(TINY))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    (out / "figures").mkdir(exist_ok=True)
    (out / "figures" / "stale.png").write_bytes(b"old")
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--resume" in err and "--overwrite" in err and str(out) in err
    assert main(["run", str(path), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert not (out / "figures" / "stale.png").exists()
    with pytest.raises(SystemExit):  # argparse: the two options exclude each other
        main(["run", str(path), "--out", str(out), "--resume", "--overwrite"])


def test_cli_compare_into_a_used_folder_needs_overwrite(tmp_path, capsys):
    from clusterfl.cli import main

    path, out = tmp_path / "tiny.toml", tmp_path / "cmp"
    path.write_text(dump_toml(TINY))
    argv = ["compare", str(path), "--algorithms", "fedavg", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    (out / "old-method").mkdir()
    (out / "old-method" / "summary.json").write_text("{}")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and err.count("\n") == 1
    assert main([*argv, "--overwrite"]) == 0
    assert not (out / "old-method").exists() and (out / "report.md").is_file()


# ------------------------------------------------------------------ Ctrl-C, and what run lists


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_names_the_checkpoint_round_and_resume(tmp_path, sig, code):
    """Ctrl-C, and SIGTERM (`kill`, `timeout`, a scheduler), which ended the process where it
    stood, without a word, and left running the Flower processes `flower run --mode local`
    had started (40 SuperNodes and their SuperExecs after two `timeout` runs): both now say
    which round the checkpoint holds and how to resume, and free the folder."""
    cfg = {**SMALL, "rounds": 20000, "checkpoint_every": 2}  # cannot finish before the signal
    path, out = tmp_path / "long.toml", tmp_path / "run"
    path.write_text(dump_toml(cfg))
    cmd = [sys.executable, "-m", "clusterfl.cli", "run", str(path), "--out", str(out), "--quiet"]
    # a shell without job control starts background jobs with SIGINT ignored, and a child
    # inherits that (Python then installs no KeyboardInterrupt handler): give it Ctrl-C back
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    hist = out / "history.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (out / "checkpoint" / "state.pt").exists() and len(
                hist.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    held = torch_round(out)
    assert "Traceback" not in err
    assert f"holds round {held} of 20000" in err and "--resume" in err
    assert f"--out {out}" in err and err.strip().endswith("--resume")
    from clusterfl.rundir import FolderLock

    lock = FolderLock(out)  # nobody holds the folder any more
    lock.acquire()
    lock.release()


def torch_round(out: Path) -> int:
    import torch

    return int(torch.load(out / "checkpoint" / "state.pt", weights_only=False)["round"])


def test_interrupt_before_any_checkpoint_says_there_is_nothing_to_resume(
        tmp_path, capsys, monkeypatch):
    from clusterfl.cli import main

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    monkeypatch.setattr(Experiment, "_loop", interrupted)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "checkpoints are off" in err and "nothing to resume" in err and "--overwrite" in err


def test_run_lists_report_md_only_when_written(tmp_path, capsys):
    from clusterfl.cli import main

    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))  # figures = false: no report
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    listed = capsys.readouterr().out.strip().splitlines()[-1]
    assert listed.startswith("results in") and "summary.json" in listed
    assert "report.md" not in listed and not (tmp_path / "a" / "report.md").exists()
