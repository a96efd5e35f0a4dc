"""A diverged run says so: a warning naming the round and the likely cause, `divergence` in
summary.json, rejected updates in the tables, and a non-zero exit with --fail-on-divergence."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from clusterfl.bench import BenchError, load_suite, run_suite
from clusterfl.cli import DIVERGED_EXIT, main
from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.metrics import summarize
from clusterfl.protocol import EvaluateReply
from clusterfl.records import read_summary
from clusterfl.report import summary_markdown, write_run_report
from clusterfl.robust.divergence import RoundUpdates, diagnose, loss_scale, noise_cause
from tests.tiny import tiny_config

TINY = tiny_config(rounds=3, n_clients=6, hidden=16, steps=5, algorithm={"name": "fedavg"})
EXPLODING = {**TINY, "train": {**TINY["train"], "lr": 1e6}}


# ------------------------------------------------------------------ the diagnosis


def test_every_update_rejected_names_the_round_reason_and_cause():
    found = diagnose(3, RoundUpdates(uploaded=8, kept=0, losses=[math.nan] * 8,
                                     rejected=Counter({"non_finite": 8})), math.log(10))
    assert found is not None and found.kind == "rejected" and found.round == 3
    assert found.reason.startswith("round 3: every update was rejected (non_finite)")
    assert "learning rate too high?" in found.reason


def test_non_finite_and_exploding_losses_and_healthy_rounds():
    scale = loss_scale("classification", 10)
    assert scale == pytest.approx(math.log(10))
    nan_half = RoundUpdates(uploaded=4, kept=4, losses=[math.nan, math.inf, 1.0, 2.0])
    assert diagnose(2, nan_half, scale).kind == "non_finite_loss"  # type: ignore[union-attr]
    huge = RoundUpdates(uploaded=3, kept=3, losses=[1e5, 2e5, 3.0])
    found = diagnose(1, huge, scale)
    assert found is not None and found.kind == "exploding_loss" and "round 1" in found.reason
    assert diagnose(1, RoundUpdates(uploaded=3, kept=3, losses=[2.3, 1.0, 5.0]), scale) is None
    assert diagnose(1, RoundUpdates(), scale) is None  # no update this round: nothing to say
    assert diagnose(1, RoundUpdates(uploaded=2, kept=1, losses=[1.0, 2.0],
                                    rejected=Counter({"norm": 1})), scale) is None
    assert loss_scale("regression", 1, 0.0) is None  # unknown scale: no "exploding" check
    # a language model: a fresh model's token loss is about ln(vocabulary size)
    assert loss_scale("language_model", 50, 300.0) == pytest.approx(math.log(50))


# ------------------------------------------------------------------ a run


def test_lr_1e6_is_reported_in_the_summary_and_on_stderr(tmp_path, capsys):
    history = Experiment.from_config(EXPLODING, out_dir=tmp_path).run(progress=False)
    err = capsys.readouterr().err
    assert "warning: round 1: the training loss exploded" in err
    assert "learning rate too high?" in err and err.count("warning") == 1  # once per run
    div = history.summary.divergence
    assert div is not None and div["round"] == 1 and div["kind"] == "exploding_loss"
    assert div["rounds"] == 3
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["divergence"]["round"] == 1 and "reason" in on_disk["divergence"]
    assert on_disk["final"]["rejected"] == 0


def test_a_run_diverging_under_privacy_noise_names_the_noise_first(tmp_path, capsys):
    """`noise_multiplier = 1e9` with `clip = 1` exploded the loss in round 2 and the warning
    blamed the learning rate only ("learning rate too high? (train.lr)")."""
    noisy = {**TINY, "privacy": {"clip": 1.0, "noise_multiplier": 1e9}}
    history = Experiment.from_config(noisy, out_dir=tmp_path).run(progress=False)
    div = history.summary.divergence
    assert div is not None and div["kind"] in ("exploding_loss", "non_finite_loss")
    assert div["reason"].endswith(
        "privacy noise too large? (privacy.noise_multiplier 1e+09 × clip 1: noise of std "
        "1e+09 on each coordinate of an aggregate's sum), or learning rate too high? "
        "(train.lr)")
    assert "privacy noise too large?" in capsys.readouterr().err
    assert noise_cause(0.0, 1.0) == noise_cause(2.0, None) == \
        "learning rate too high? (train.lr)"
    # a moderate noise level trains without a warning
    calm = {**TINY, "privacy": {"clip": 10.0, "noise_multiplier": 0.01}}
    assert Experiment.from_config(calm).run(progress=False).summary.divergence is None


@pytest.mark.parametrize(("settings", "named"), [
    ({"train": {**TINY["train"], "weight_decay": 1e6}}, "train.weight_decay = 1e+06"),
    ({"algorithm": {"name": "fedprox", "mu": 1e7}}, "algorithm.mu = 1e+07"),
    ({"adversary": {"kind": "scale", "fraction": 0.5, "scale": 1e30},
      "validation": {"enabled": False}}, "attacking clients (adversary.kind = 'scale')"),
], ids=["weight_decay", "fedprox_mu", "adversary"])
def test_a_divergence_names_the_settings_that_can_cause_it_not_only_the_lr(settings, named):
    """weight_decay = 1e6, a proximal μ of 1e6 or attackers of scale 1e300 diverged with
    "learning rate too high? (train.lr)" alone, though the learning rate was sound."""
    div = Experiment.from_config({**TINY, **settings}).run(progress=False).summary.divergence
    assert div is not None
    assert div["reason"].endswith(f"— learning rate too high? (train.lr), or {named}?")


def test_every_update_rejected_as_not_finite_names_the_runs_cause():
    cause = noise_cause(1e30, 1.0, ["train.weight_decay = 10"])
    found = diagnose(2, RoundUpdates(uploaded=4, kept=0, losses=[math.nan] * 4,
                                     rejected=Counter({"non_finite": 4})), 2.3, cause)
    assert found is not None and found.reason == (
        "round 2: every update was rejected (non_finite) — privacy noise too large? "
        "(privacy.noise_multiplier 1e+30 × clip 1: noise of std 1e+30 on each coordinate of "
        "an aggregate's sum), or learning rate too high? (train.lr), or train.weight_decay = "
        "10?")
    norm = diagnose(2, RoundUpdates(uploaded=4, kept=0, losses=[1.0] * 4,
                                    rejected=Counter({"norm": 4})), 2.3, cause)
    assert norm is not None and norm.reason.endswith("[validation] norm bounds too tight?")


def test_a_healthy_run_has_no_divergence_and_counts_rejections(tmp_path):
    history = Experiment.from_config(TINY, out_dir=tmp_path).run(progress=False)
    assert history.summary.divergence is None
    assert "divergence" not in json.loads((tmp_path / "summary.json").read_text())
    assert history.summary.final.rejected == 0


def test_every_update_rejected_when_the_lr_is_infinite(tmp_path, capsys):
    # `lr = inf` is refused by the config (and so is setting it on a built Experiment's
    # config); the largest float32 makes every update infinite the same way
    exp = Experiment.from_config({**TINY, "train": {**TINY["train"], "lr": 3.4e38}},
                                 out_dir=tmp_path)
    history = exp.run(progress=False)
    div = history.summary.divergence
    assert div is not None and div["kind"] == "rejected" and div["round"] == 1
    assert div["reason"] == ("round 1: every update was rejected (non_finite) — learning rate "
                             "too high? (train.lr)")
    assert history.summary.final.rejected == 3 * 6  # every client, every round
    assert "round 1: every update was rejected (non_finite)" in capsys.readouterr().err
    table = summary_markdown([history.summary])
    assert "| rejected |" in table and "| 18 |" in table
    report = write_run_report(tmp_path).read_text()
    assert "Warning: " in report and "every update was rejected" in report


def test_divergence_survives_a_resume(tmp_path):
    cfg = {**EXPLODING, "rounds": 4, "checkpoint_every": 2}
    full = Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    again = Experiment.from_config(cfg, out_dir=tmp_path).run(resume=True, progress=False)
    assert again.summary.divergence == full.summary.divergence
    assert again.summary.final.rejected == full.summary.final.rejected


# ------------------------------------------------------------------ the command line


def test_cli_fail_on_divergence_exits_non_zero(tmp_path, capsys):
    path = tmp_path / "lr.toml"
    path.write_text(dump_toml(EXPLODING))
    assert main(["run", str(path), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "rejected" in out  # the results table has the column
    assert "diverged: round 1:" in err
    code = main(["run", str(path), "--out", str(tmp_path / "b"), "--quiet",
                 "--fail-on-divergence"])
    assert code == DIVERGED_EXIT != 0
    assert "1 of 1 run(s) diverged" in capsys.readouterr().err
    assert read_summary(tmp_path / "b").divergence is not None  # results are kept
    path.write_text(dump_toml(TINY))
    assert main(["run", str(path), "--out", str(tmp_path / "c"), "--quiet",
                 "--fail-on-divergence"]) == 0


def test_lr_inf_is_refused_at_validation(tmp_path, capsys):
    path = tmp_path / "inf.toml"
    path.write_text(dump_toml(TINY).replace("lr = 0.1", "lr = inf"))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clusterfl: error: train.lr:") and "finite number" in err
    assert not (tmp_path / "o").exists()


def test_bench_fails_on_a_diverged_run_and_keeps_it(tmp_path: Path):
    folder = tmp_path / "suite"
    folder.mkdir()
    suite = {"title": "exploding", "seeds": [0], "methods": ["fedavg"]}
    (folder / "lr.toml").write_text(dump_toml({"suite": suite, "config": EXPLODING}))
    scenarios, runs, logs = load_suite(folder), tmp_path / "runs", []
    with pytest.raises(BenchError, match="diverged: round 1"):
        run_suite(scenarios, runs, log=logs.append)
    assert any("DIVERGED" in m for m in logs)
    with pytest.raises(BenchError, match="diverged"):  # finished before: still a failure
        run_suite(scenarios, runs, log=logs.append)
    run_suite(scenarios, runs, log=logs.append, fail_on_divergence=False)


def test_bench_exits_3_when_its_only_failures_are_divergences(tmp_path, monkeypatch, capsys):
    """As run/compare/sweep with --fail-on-divergence: status 3 when every failed run of the
    suite diverged (the table written), 2 when some other run failed, 0 without the option."""
    import clusterfl.experiment as experiment

    folder = tmp_path / "suite"
    folder.mkdir()
    suite = {"title": "exploding", "seeds": [0], "methods": ["fedavg"]}
    (folder / "lr.toml").write_text(dump_toml({"suite": suite, "config": EXPLODING}))
    line = ["bench", "--suite", str(folder), "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "R.md")]
    assert main(line) == DIVERGED_EXIT == 3
    err = capsys.readouterr().err
    assert "clusterfl: error: 1 suite run(s) diverged:" in err and "round 1" in err
    assert (tmp_path / "R.md").is_file()
    assert main([*line, "--no-fail-on-divergence"]) == 0

    class Breaks(experiment.Experiment):  # type: ignore[misc, valid-type]
        def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("broken")

    monkeypatch.setattr(experiment, "Experiment", Breaks)
    suite["methods"] = ["fedavg", "local"]  # fedavg diverged before, local fails now
    (folder / "lr.toml").write_text(dump_toml({"suite": suite, "config": EXPLODING}))
    assert main(line) == 2
    err = capsys.readouterr().err
    assert "clusterfl: error: 2 suite run(s) failed:" in err
    assert "RuntimeError: broken" in err and "diverged: round 1" in err


def test_a_client_whose_regression_diverged_makes_the_mse_infinite():
    """MSE 1, 3 and NaN (a diverged client's model): the mean was 2, over the other two,
    while an inf (a client less far gone) made it infinite. Now both do; a client without
    test samples (or not asked) is left out, and a classifier (NaN for all) has none."""
    def mse(values, n):
        k = len(values)
        return summarize(EvaluateReply(np.arange(k), np.full(k, 0.5), np.full(k, 0.5),
                                       np.ones(k), np.array(n), {"mse": np.array(values)}))["mse"]

    assert mse([1.0, 3.0, math.nan], [5, 5, 5]) == math.inf
    assert mse([1.0, 3.0, math.inf], [5, 5, 5]) == math.inf
    assert mse([1.0, 3.0, math.nan], [5, 5, 0]) == pytest.approx(2.0)
    assert mse([math.nan, math.nan], [5, 5]) is None
