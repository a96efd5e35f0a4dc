"""A client whose every reply is rejected is reported, on the console, in summary.json and in
the report (issue 35: "a client rejected every round, no warning")."""

from __future__ import annotations

import pytest

from clusterfl.algorithms.oneshot import lowered_cut
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


def test_a_method_warning_mid_run_is_said_once_on_the_console_in_the_summary_and_report(
        tmp_path, capsys, monkeypatch):
    # a method says what it did not do as asked through `Update.warnings` (from `update`) and
    # `ctx.warn` (from `ask`): before, it had no way to (ctx.log was read after placement only)
    from clusterfl.algorithms.base import Update
    from clusterfl.algorithms.fedavg import FedAvg

    ask, update = FedAvg.ask, FedAvg.update

    def asking(self, state, t, phase, ctx):
        ctx.warn("asked: every round the same line")
        return ask(self, state, t, phase, ctx)

    def updating(self, state, t, asked, reply):
        done = update(self, state, t, asked, reply)
        said = ("updated: every round the same line", *([f"round {t} only"] if t == 2 else []))
        return Update(done.state, done.extras, done.then, warnings=said)

    monkeypatch.setattr(FedAvg, "ask", asking)
    monkeypatch.setattr(FedAvg, "update", updating)
    cfg = tiny_config(rounds=3, algorithm={"name": "fedavg"}, train={"lr": 0.1, "batch_size": 16,
                                                                     "steps": 2})
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    said = ["asked: every round the same line", "updated: every round the same line",
            "round 2 only"]
    printed = [line for line in capsys.readouterr().err.splitlines() if "line" in line
               or "only" in line]
    assert printed == [f"clusterfl: warning: {line}" for line in said]  # each once, in order
    summary = read_summary(tmp_path)
    assert summary.warnings is not None and summary.warnings[:3] == said
    write_run_report(tmp_path)
    assert "round 2 only" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("algorithm, what", [
    ({"name": "pacfl", "p": 1}, "a basis"),
    ({"name": "flhc", "warmup_rounds": 0}, "an update"),
    ({"name": "flt", "encoder": "none", "latent": 16, "k": 3, "umap": False,
      "finetune_epochs": 0}, "a signature")])
def test_a_fixed_n_clusters_lowered_to_the_clients_that_answered_is_said(
        tmp_path, capsys, algorithm, what):
    # C = 4 asked, clients 0-2 of 6 drop out of the clustering round (round 1): the 3 that
    # answered are cut into 3 clusters, the others are clusters of their own; before, only
    # the round's n_clusters_found (6) and missing counts said so
    cfg = tiny_config(rounds=2, n_clients=6, algorithm={**algorithm, "n_clusters": 4},
                      faults={"drop_clients": [0, 1, 2], "drop_rounds": [1]})
    history = Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    assert history.records[0].extras["n_clusters_found"] == 6
    line = (f"algorithm.n_clusters = 4: only 3 of the 6 clients asked in round 1 sent {what} "
            "(the others did not answer or were rejected), so C was lowered to 3: each of them "
            "is a cluster of its own, as is each of the 3 others (6 clusters of one client)")
    err = capsys.readouterr().err.splitlines()
    assert err.count(f"clusterfl: warning: {line}") == 1
    assert line in (read_summary(tmp_path).warnings or [])


def test_lowered_cut_says_nothing_when_c_is_kept_and_what_became_of_the_others():
    assert lowered_cut(None, 1, 6, 2, "a basis") == ()  # no fixed C
    assert lowered_cut(3, 1, 6, 3, "a basis") == ()  # C kept (3 clusters of the 3)
    sampled, = lowered_cut(4, 5, 8, 2, "an update", absent_own=False)
    assert sampled.startswith("algorithm.n_clusters = 4: only 2 of the 8 clients asked in "
                              "round 5 sent an update")
    assert sampled.endswith("C was lowered to 2: each of them is a cluster of its own; the 6 "
                            "others are placed in a cluster later, as the clients not asked")
    nobody, = lowered_cut(4, 1, 5, 0, "a signature")
    assert nobody.startswith("algorithm.n_clusters = 4: none of the 5 clients asked in round 1 "
                             "sent a signature")
    assert nobody.endswith("(they did not answer or were rejected), so each of them is a "
                           "cluster of its own (5 clusters of one client)")
