"""A run whose models did not learn says so (`Recorder.stalled`): its final mean test loss
still within 1 % of ln C, the loss of a uniform guess, ends in a warning on the console, in
summary.json and in the report, instead of a silent 10 % accuracy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clusterfl.cli import main
from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.recorder import STALLED
from clusterfl.records import RoundMetrics, RoundRecord
from tests.robust.conftest import config


def _record(t: int, loss: float | None) -> RoundRecord:
    return RoundRecord(round=t, wall_time=0.0, n_clusters=1, assignment=[0], ari=None,
                       floats_down=0.0, floats_up=0.0,
                       metrics=None if loss is None else RoundMetrics(accuracy=0.1, loss=loss))


def test_the_bound_is_one_percent_below_ln_c() -> None:
    exp = Experiment.from_config(config(rounds=1))  # the digits: 10 classes
    bound = (1 - STALLED) * math.log(10)  # 0.99 · 2.302585 = 2.279559
    assert bound == pytest.approx(2.279559, abs=1e-6)
    rec = exp.recorder
    assert rec.stalled([_record(2, bound - 1e-4)]) is None  # learned, barely
    said = rec.stalled([_record(2, bound + 1e-4), _record(3, None)])  # the last evaluated one
    assert said is not None and "(round 2)" in said and "ln 10 = 2.3026" in said
    assert "train.lr" in said
    assert rec.stalled([_record(1, float("nan"))]) is None  # diverged: its own warning
    assert rec.stalled([_record(1, None)]) is None  # nothing evaluated


def test_a_run_that_did_not_learn_warns_everywhere_and_one_that_did_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stuck = config(rounds=4, train={"lr": 1e-5, "batch_size": 32, "epochs": 1},
                   output={"figures": True, "progress": "off"})
    path = tmp_path / "stuck.toml"
    path.write_text(dump_toml(stuck))
    assert main(["run", str(path), "--out", str(tmp_path / "stuck"), "--quiet"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "did not learn" in x]
    assert len(lines) == 1 and lines[0].startswith("clusterfl: warning: the models did not")
    summary = (tmp_path / "stuck" / "summary.json").read_text()
    assert "did not learn" in summary
    assert "did not learn" in (tmp_path / "stuck" / "report.md").read_text()
    # the same run at lr 0.1 has begun to learn (loss 2.23 < 2.28 after 4 rounds): no warning
    learned = Experiment.from_config(config(rounds=4), out_dir=tmp_path / "ok").run()
    assert learned.summary is not None and learned.summary.warnings is None
    final = learned.final.metrics
    assert final is not None and final.loss is not None
    assert final.loss < (1 - STALLED) * math.log(10)


def test_a_regression_has_no_uniform_guess_and_is_not_checked() -> None:
    cfg = config(rounds=1, data={"source": "synthetic_regression"},
                 scenario={"name": "linear_regression", "n_clients": 4, "n_clusters": 2},
                 model={"name": "linear"})
    exp = Experiment.from_config(cfg)
    assert exp.federation.task == "regression"
    assert exp.recorder.stalled([_record(1, 1e9)]) is None


def test_a_run_where_no_client_trained_says_so_and_names_the_faults() -> None:
    """`faults.dropout = 0.99`: participation 0, nothing uploaded, and the warning only named
    train.lr, the local work and rounds."""
    for rounds, counted in ((2, 0), (3, 1)):  # this seed's third round has one update
        exp = Experiment.from_config(config(rounds=rounds, faults={"dropout": 0.99}))
        history = exp.run(progress=False)
        assert history.records[-1].client_updates == counted
        said = next(w for w in history.summary.warnings or [] if "did not learn" in w)
        assert ("no client update was counted in any round" in said) == (counted == 0)
        assert said.endswith("and rounds, and faults.dropout = 0.99")
