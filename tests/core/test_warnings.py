"""A client whose every reply is rejected is reported, on the console, in summary.json and in
the report (issue 35: "a client rejected every round, no warning")."""

from __future__ import annotations

from clusterfl.experiment import Experiment
from clusterfl.recorder import ALWAYS_REJECTED, id_ranges
from clusterfl.records import read_summary
from clusterfl.report import write_run_report
from tests.core.test_experiment import SMALL
from tests.tiny import tiny_config


def test_client_rejected_every_round_is_reported(tmp_path, capsys):
    # client 2's update is scaled a million times: the median rule rejects it every round
    cfg = {**SMALL, "rounds": 5, "adversary": {"kind": "scale", "clients": [2], "scale": 1e6}}
    history = Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    assert [r.rejected for r in history.records] == [1] * 5
    printed = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(printed) == 1 and printed[0].startswith(  # once, on the console
        f"clusterfl: warning: client 2's reply was rejected in each of the {ALWAYS_REJECTED} "
        "rounds")
    summary = read_summary(tmp_path)
    assert summary.warnings is not None and len(summary.warnings) == 1
    assert summary.warnings[0].startswith(f"client 2's reply was rejected in each of the "
                                          f"{ALWAYS_REJECTED} rounds")
    write_run_report(tmp_path)
    assert "client 2's reply was rejected" in (tmp_path / "report.md").read_text()


def test_no_warning_for_a_client_rejected_once(tmp_path):
    # the scaled client is rejected in rounds where it attacks, but nobody is rejected
    # ALWAYS_REJECTED times without ever being accepted on a run shorter than that
    cfg = {**SMALL, "rounds": ALWAYS_REJECTED - 1,
           "adversary": {"kind": "scale", "clients": [2], "scale": 1e6}}
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    assert read_summary(tmp_path).warnings is None


def test_many_clients_rejected_every_round_are_one_line(tmp_path, capsys):
    # clients 1, 2 and 6 are scaled a million times: rejected every round, reported once,
    # in one line naming them as runs of ids (not one line per client)
    cfg = {**SMALL, "rounds": ALWAYS_REJECTED,
           "adversary": {"kind": "scale", "clients": [1, 2, 6], "scale": 1e6}}
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    printed = [line for line in capsys.readouterr().err.splitlines() if "rejected in" in line]
    assert printed == [
        f"clusterfl: warning: the replies of 3 clients (1-2, 6) were rejected in each of the "
        f"{ALWAYS_REJECTED} rounds they were asked so far (norm); they take no part in "
        "training: check their data"]
    assert read_summary(tmp_path).warnings == [printed[0].removeprefix("clusterfl: warning: ")]


def test_id_ranges():
    assert id_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert id_ranges([4]) == "4"
    assert id_ranges(list(range(0, 40, 2)), most=3) == "0, 2, 4, …"


def test_a_round_warning_under_the_progress_bar_goes_to_stderr_on_one_line(tmp_path, capsys):
    # the bar is shown when stderr is a terminal (`want_progress`), but rich drew it, and the
    # divergence warning above it, on stdout, wrapped at 80 columns: `2>log` lost the warning
    # and `>results.txt` got it cut in two
    cfg = tiny_config(rounds=2, n_clients=4, steps=5, train={"lr": 1e6, "batch_size": 16,
                                                             "steps": 5})
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and len(warned[0]) > 80
    assert warned[0].startswith("clusterfl: warning: round 1: the training loss exploded")
    assert warned[0].endswith("learning rate too high? (train.lr)")
    assert "round 2/2" in err  # the bar, on the same stream
