"""Tracking: TensorBoard events under the run directory (read back here) and callbacks."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.records import RunSummary
from tests.ext.conftest import BASE

CFG = {**BASE, "rounds": 4, "checkpoint_every": 2, "data": {"source": "digits"},
       "scenario": {"name": "rotation", "n_clients": 6, "angles": [0, 180]},
       "algorithm": {"name": "ifca", "n_clusters": 2},
       "output": {"figures": True, "progress": "off", "tensorboard": True}}


def _events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0,
                                                                        "scalars": 0})
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_holds_every_rounds_numbers_and_the_figures(tmp_path):
    history = Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    acc = _events(tmp_path)
    tags = set(acc.Tags()["scalars"])
    assert {"metrics/accuracy", "metrics/macro_f1", "metrics/loss", "clustering/ari",
            "clustering/n_clusters", "communication/floats_down", "communication/floats_up",
            "extras/train_loss"} <= tags
    recs = history.records
    for tag, want in [("metrics/accuracy", [r.metrics.accuracy for r in recs]),
                      ("clustering/ari", [r.ari for r in recs]),
                      ("communication/floats_up", [r.floats_up for r in recs])]:
        steps, values = zip(*_series(acc, tag))
        assert list(steps) == [r.round for r in recs]
        assert list(values) == pytest.approx(want, rel=1e-6)  # float32 in the events
    images = acc.Tags()["images"]
    assert "figures/accuracy" in images and len(images) >= 3
    assert acc.Images("figures/accuracy")[0].width > 100


def test_a_continued_run_adds_its_rounds_once(tmp_path):
    Experiment.from_config(CFG, ["rounds=2"], out_dir=tmp_path).run(progress=False)
    Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    steps = [s for s, _ in _series(_events(tmp_path), "clustering/ari")]
    assert steps == [1, 2, 3, 4]


def test_a_finished_run_resumed_logs_its_figures_and_last_round_once(tmp_path):
    """`--resume` on a finished run (nothing left to run: the end is done again) logged every
    figure a second time at the last round's step: two images per tag at step 4."""
    history = Experiment.from_config(CFG, out_dir=tmp_path).run(progress=False)
    Experiment.from_config(CFG, out_dir=tmp_path).run(resume=True, progress=False)
    acc = _events(tmp_path)
    assert [e.step for e in acc.Images("figures/accuracy")] == [4]
    steps, values = zip(*_series(acc, "metrics/accuracy"))  # each round once, as it reads
    assert list(steps) == [r.round for r in history.records]
    assert list(values) == pytest.approx([r.metrics.accuracy for r in history.records],
                                         rel=1e-6)


def test_clusterfl_run_names_the_tensorboard_folder(tmp_path, capsys):
    """Before: the line after the results table listed summary.json, history.jsonl, report.md
    and figures/, never tensorboard/: where the events went was said nowhere."""
    from clusterfl.cli import main
    from clusterfl.config import dump_toml

    config = tmp_path / "board.toml"
    config.write_text(dump_toml({**CFG, "rounds": 2, "output": {"figures": False,
                                                                "tensorboard": True}}))
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    listed = capsys.readouterr().out.strip().splitlines()[-1]
    assert listed == f"results in {tmp_path / 'run'}/ (summary.json, history.jsonl, tensorboard/)"


def test_a_continuation_with_figures_off_logs_no_stale_figures_and_says_so(tmp_path, capsys):
    """Resumed with `figures = false`: TensorBoard logged the earlier part's PNGs as the last
    round's figures, and report.md (4 rounds) stayed beside a 6-round summary unsaid."""
    Experiment.from_config(CFG, ["rounds=2"], out_dir=tmp_path).run(progress=False)
    assert {e.step for e in _events(tmp_path).Images("figures/accuracy")} == {2}
    capsys.readouterr()
    Experiment.from_config(CFG, ["output.figures=false"], out_dir=tmp_path).run(
        resume=True, progress=False)
    # as a 4-round run without figures: no images (the 2-round ones went with round 2's
    # events, rewritten; none logged at round 4)
    assert _events(tmp_path).Images("figures/accuracy") == []
    err = capsys.readouterr().err
    assert "report.md and figures/ are those of this run's earlier part, not updated " \
           "(output.figures = false now)" in err


class Tracker:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_run_start(self, config, run_dir):
        self.calls.append(("start", config["rounds"], run_dir))

    def on_round_end(self, record):
        self.calls.append(("round", record.round, record.ari))

    def on_run_end(self, summary, run_dir):
        self.calls.append(("end", summary))


def test_callbacks_see_every_round_and_the_summary(tmp_path, own_module):
    from ownstuff import Recorder

    Recorder.rounds.clear()
    tracker = Tracker()
    cfg = {**CFG, "output": {"figures": False, "callbacks": [f"{own_module}:Recorder"]}}
    history = Experiment.from_config(cfg, out_dir=tmp_path, callbacks=[tracker]).run(
        progress=False)
    assert tracker.calls[0] == ("start", 4, tmp_path)
    assert [c[1:] for c in tracker.calls[1:-1]] == [(r.round, r.ari) for r in history.records]
    assert isinstance(tracker.calls[-1][1], RunSummary)
    assert Recorder.rounds == [1, 2, 3, 4]  # the one named in the config


def test_an_object_without_hooks_is_refused():
    with pytest.raises(ConfigError, match="none of the callback methods"):
        Experiment.from_config({**CFG, "output": {"figures": False}}, callbacks=[object()])
    with pytest.raises(ConfigError, match=r"output\.tensorboard"):
        Experiment.from_config(CFG)  # no run directory to write to


def test_a_continuation_rewrites_the_old_last_rounds_events(tmp_path):
    """Continued from 4 to 6 rounds with eval_every = 3: history.jsonl drops round 4's
    evaluation (a 6-round run makes none there) but TensorBoard kept its accuracy and its
    4-round figures at step 4."""
    cfg = {**CFG, "rounds": 6, "eval_every": 3}
    whole = tmp_path / "whole"
    Experiment.from_config(cfg, out_dir=whole).run(progress=False)
    run = tmp_path / "run"
    Experiment.from_config(cfg, ["rounds=4"], out_dir=run).run(progress=False)
    Experiment.from_config(cfg, out_dir=run).run(resume=True, progress=False)
    got, want = _events(run), _events(whole)
    assert [s for s, _ in _series(got, "metrics/accuracy")] == [3, 6]
    assert _series(got, "metrics/accuracy") == _series(want, "metrics/accuracy")
    assert [s for s, _ in _series(got, "clustering/ari")] == [1, 2, 3, 4, 5, 6]
    assert {e.step for e in got.Images("figures/accuracy")} == {6}


def test_file_size_limit_in_the_events_file_is_one_line_naming_it(tmp_path):
    """TensorBoard's events file crosses `ulimit -f` in round 1: its writer thread printed
    "Exception in thread Thread-1: Traceback ... OSError: [Errno 27] File too large" and the
    error line named "gfile.py:171", not the file; now one line naming it, nothing else."""
    from tests.core.test_full_disk_outputs import _limited_run
    from tests.tiny import tiny_config

    config = tiny_config(rounds=2, output={"figures": False, "progress": "off",
                                           "tensorboard": True})
    code, err, out = _limited_run(tmp_path, config, 1000)  # config.toml, round 1's line fit
    events, = (out / "tensorboard").glob("events.out.tfevents.*")
    assert code == 2 and err == (
        f"clusterfl: error: the file-size limit (ulimit -f) was reached on {events.parent}: "
        f"cannot write {events} (TensorBoard's events in round 1, [output] tensorboard); the "
        "run's own files and checkpoints are intact; the run stopped (with checkpoints, "
        "--resume continues it from the last one)")
    assert [json.loads(line)["round"] for line in
            (out / "history.jsonl").read_text().splitlines()] == [1]


def test_a_writer_opened_in_the_second_of_older_events_sorts_after_them(tmp_path):
    """TensorBoard reads events files in name order: second, host, process id, counter (as
    text). An older file stamped with the next second (the same second, as a continuation in
    one process makes it, with the counter's "10" before "9") made the new events sort first,
    so the old last round's events were read after the purge (a flaky
    test_a_continuation_rewrites_the_old_last_rounds_events). The new writer waits past it."""
    import time

    from clusterfl.tracking import TensorBoardCallback

    log = tmp_path / "tensorboard"
    log.mkdir()
    old = log / f"events.out.tfevents.{int(time.time()) + 1}.~host.1.0"
    old.write_bytes(b"")
    callback = TensorBoardCallback(log, figures=False)
    callback.on_run_start({}, None)
    callback._writer.close()
    new, = [p.name for p in log.glob("events.out.tfevents.*") if p != old]
    assert sorted([old.name, new]) == [old.name, new]
