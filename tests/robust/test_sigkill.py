"""A run killed by a real SIGKILL (not an exception) and resumed with `--resume` ends exactly
like an uninterrupted one, for every registered method. The process kills itself at a chosen
point (`sigkill_child.py`), so the test does not depend on the machine's speed: after a round
is computed but before anything of it is written, in the middle of a history line, and in the
middle of writing a checkpoint. The resumed run takes over the dead process's lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterfl.algorithms import ALGORITHMS
from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.records import RoundRecord
from clusterfl.rundir import LOCK_FILE
from tests.crash import timing_free

from .conftest import EXPECTED_METHODS, assert_registry_complete, config
from .test_faults import METHOD_SETTINGS
from .test_resume import ONE_SHOT, ROBUST, _same_models

CHILD = Path(__file__).with_name("sigkill_child.py")
ROUNDS, EVERY = 8, 2
#: the kill points and their rounds: the checkpoint of round 4 is the last whole one each time
POINTS = {"round": 5, "history": 6, "checkpoint": 6}
SETTINGS = {**METHOD_SETTINGS, **ONE_SHOT,
            "flt": {"encoder": "none", "latent": 16, "k": 2, "finetune_epochs": 1,
                    "fraction": 0.5, "umap": False, "threshold": 0.04}}
CASES = [(m, list(POINTS)[i % len(POINTS)]) for i, m in enumerate(sorted(SETTINGS))]


def test_every_expected_method_is_killed_here_and_every_point_is_used():
    assert_registry_complete(ALGORITHMS)
    assert sorted(m for m, _ in CASES) == sorted(EXPECTED_METHODS)
    assert {p for _, p in CASES} == set(POINTS)


@pytest.mark.parametrize(("method", "point"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_a_sigkilled_run_resumes_to_identical_results(method, point, tmp_path):
    robust = method in METHOD_SETTINGS
    cfg = config(rounds=ROUNDS, eval_every=2, checkpoint_every=EVERY,
                 algorithm={"name": method, **SETTINGS[method]}, **(ROBUST if robust else {}))
    path = tmp_path / "run.toml"
    path.write_text(dump_toml(cfg))
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    want = ref.run(progress=False)

    out, at = tmp_path / "killed", POINTS[point]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(CHILD), str(path), str(out), point, str(at)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    hist = out / "history.jsonl"
    lines = hist.read_text().splitlines()
    assert (out / LOCK_FILE).is_file()  # the dead process's lock is left behind
    if point == "round":
        assert len(lines) == at - 1
    else:  # round `at`'s line is there (torn in two at `history`), its checkpoint is not
        assert len(lines) == at
        if point == "history":
            with pytest.raises(json.JSONDecodeError):
                json.loads(lines[-1])
        else:
            assert RoundRecord.from_json_dict(json.loads(lines[-1])).round == at
    tmp = out / "checkpoint" / "state.pt.tmp"
    assert tmp.is_file() == (point == "checkpoint")

    resumed = Experiment.from_config(path, out_dir=out)
    got = resumed.run(resume=True, progress=False)
    assert timing_free(got.summary) == timing_free(want.summary)
    assert timing_free(got.records) == timing_free(want.records)
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert [RoundRecord.from_json_dict(x).round for x in lines] == list(range(1, ROUNDS + 1))
    assert timing_free(lines) == timing_free([r.to_json_dict() for r in want.records])
    _same_models(resumed, ref)
    assert not (out / LOCK_FILE).exists()
