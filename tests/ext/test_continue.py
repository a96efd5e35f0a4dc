"""`--resume --set rounds=N` continues a finished run to N rounds and ends exactly like a run
planned for N rounds from the start; methods that schedule by the planned T are refused."""

from __future__ import annotations

import json

import pytest
import torch

from clusterfl.algorithms import ALGORITHMS
from clusterfl.cli import main as cli_main
from clusterfl.config import dump_toml
from clusterfl.errors import ClusterFLError
from clusterfl.experiment import Experiment
from tests.crash import timing_free
from tests.robust.conftest import EXPECTED_METHODS, config
from tests.robust.test_faults import METHOD_SETTINGS

# every method but those that schedule by T (refused below) and FLT (pretrains an encoder on
# another dataset: too slow here; it does not use T)
CONTINUED = [m for m in METHOD_SETTINGS if not ALGORITHMS[m].uses_planned_rounds]


def test_the_planned_rounds_users_are_known():
    assert {m for m in EXPECTED_METHODS if ALGORITHMS[m].uses_planned_rounds} == {"cfl_gp"}
    assert {"fedavg", "ifca"} <= set(CONTINUED)


@pytest.mark.parametrize("method", CONTINUED)
def test_continuing_3_to_6_rounds_equals_a_6_round_run(method, tmp_path):
    # eval_every = 2: the 3-round run evaluates round 3 (its last), a 6-round run does not
    cfg = config(rounds=6, eval_every=2, checkpoint_every=2,
                 algorithm={"name": method, **METHOD_SETTINGS[method]})
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    ref_h = ref.run(progress=False)

    short = Experiment.from_config(cfg, ["rounds=3"], out_dir=tmp_path / "run")
    assert short.run(progress=False).records[-1].metrics is not None
    more = Experiment.from_config(cfg, ["rounds=6"], out_dir=tmp_path / "run")
    got = more.run(resume=True, progress=False)

    assert timing_free(got.records) == timing_free(ref_h.records)
    assert timing_free(got.summary) == timing_free(ref_h.summary)
    ref_state, got_state = ref.algorithm.state_dict(), more.algorithm.state_dict()
    for key, value in ref_state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, got_state[key]), key
    lines = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == list(range(1, 7))


def test_cli_continues_a_finished_run(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_toml(config(rounds=2, eval_every=1, checkpoint_every=0,
                                    algorithm={"name": "ifca", "n_clusters": 2})))
    out = tmp_path / "run"
    # checkpoint_every = 0 writes no checkpoint: nothing to continue, said in one line
    assert cli_main(["run", str(cfg), "--out", str(out)]) == 0
    assert cli_main(["run", str(cfg), "--out", str(out), "--resume", "--set", "rounds=4"]) != 0
    assert "no checkpoint" in capsys.readouterr().err
    out2 = tmp_path / "run2"
    args = ["run", str(cfg), "--out", str(out2), "--set", "checkpoint_every=5"]
    assert cli_main(args) == 0
    assert cli_main([*args, "--resume", "--set", "rounds=4"]) == 0
    summary = json.loads((out2 / "summary.json").read_text())
    assert summary["rounds"] == 4
    assert "rounds = 4" in (out2 / "config.toml").read_text()
    # fewer rounds than the checkpoint holds: refused, naming the round
    assert cli_main([*args, "--resume", "--set", "rounds=3"]) != 0
    assert "already holds round 4" in capsys.readouterr().err


def test_a_method_that_schedules_by_t_is_refused(tmp_path):
    cfg = config(rounds=2, eval_every=1, checkpoint_every=1,
                 algorithm={"name": "cfl_gp", **METHOD_SETTINGS["cfl_gp"]})
    Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    with pytest.raises(ClusterFLError, match="schedules by the planned number of rounds"):
        Experiment.from_config(cfg, ["rounds=4"], out_dir=tmp_path).run(resume=True,
                                                                        progress=False)
    # another change than rounds is still "another config"
    with pytest.raises(ClusterFLError, match="another config"):
        Experiment.from_config(cfg, ["train.lr=0.2"], out_dir=tmp_path).run(resume=True,
                                                                            progress=False)


@pytest.mark.parametrize("method", ["fedavg", "ifca"])
def test_continuing_with_eval_clients_evaluates_the_old_last_round_on_the_sample(method,
                                                                                 tmp_path):
    """Round 4, the 4-round run's last and on the eval_every grid, was evaluated on every
    client and kept so: a 6-round run evaluates it on eval_clients' sample (round 4's
    accuracy 0.738 against 0.715 in the probe's runs)."""
    cfg = config(rounds=6, eval_every=2, checkpoint_every=3, eval_clients=4,
                 algorithm={"name": method, **METHOD_SETTINGS[method]})
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)
    short = Experiment.from_config(cfg, ["rounds=4"], out_dir=tmp_path / "run")
    whole = short.run(progress=False).records[-1]
    assert whole.client_accuracy is not None and None not in whole.client_accuracy
    got = Experiment.from_config(cfg, out_dir=tmp_path / "run").run(resume=True,
                                                                     progress=False)
    assert got.records[3].client_accuracy.count(None) == 8 - 4  # the sample again
    assert timing_free(got.records) == timing_free(ref.records)
    assert timing_free(got.summary) == timing_free(ref.summary)
