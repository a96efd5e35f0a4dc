"""`clusterfl flower run --mode ray`: Flower's supported simulation path (a simulation
SuperLink and `flwr run` on a local simulation federation, Ray actors) gives the in-process
results, and prints no deprecation warning (issue 26). One real run, bounded by --timeout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from clusterfl.config import dump_toml
from clusterfl.deploy.server_app import FINAL_STATE
from clusterfl.experiment import Experiment
from clusterfl.records import read_summary
from tests.flower.conftest import BASE, IFCA


def test_ray_mode_equals_inprocess_and_prints_no_deprecation(tmp_path):
    raw = {**BASE, "algorithm": IFCA}
    config = tmp_path / "run.toml"
    config.write_text(dump_toml(raw))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "clusterfl.cli", "flower", "run", str(config), "--mode", "ray",
         "--out", str(out), "--timeout", "420"],
        capture_output=True, text=True, timeout=480)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    logs = "".join(p.read_text(errors="replace")
                   for p in (tmp_path / "out.flower" / "logs").glob("*.log"))
    assert "deprecat" not in (text + logs).lower()
    assert "flower: round 3/3" in text
    exp = Experiment.from_config(raw)
    ref = exp.run(progress=False)
    ours = read_summary(out)
    assert ours.assignment == ref.summary.assignment and ours.final.ari == 1.0
    assert ours.final.metrics is not None and ref.final.metrics is not None
    assert ours.final.metrics.accuracy == pytest.approx(ref.final.metrics.accuracy, abs=1e-9)
    state = torch.load(out / FINAL_STATE, weights_only=False)
    torch.testing.assert_close(state["models"], exp.algorithm.state_dict()["models"],
                               rtol=1e-5, atol=1e-6)
    report = json.loads((out / "flower.json").read_text())
    assert report["messages"] == 6 * 3 + 6  # one message per client and round, + evaluation
