"""A run stopped after a checkpoint and resumed ends exactly like an uninterrupted one, for
every registered method and with every robustness option on (dropouts, stragglers, an
attacker, clipping and noise): the cluster assignments, CFL's tree, CFL-GP's profile, CAM's
two parts and the fault/privacy ledgers all live in the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from clusterfl.algorithms import ALGORITHMS
from clusterfl.config import dump_toml
from clusterfl.experiment import Experiment
from clusterfl.records import RoundRecord
from tests.crash import crash_then_resume, timing_free

from .conftest import EXPECTED_METHODS, assert_registry_complete, config
from .test_faults import METHOD_SETTINGS

ROBUST = {
    "faults": {"dropout": 0.2, "stragglers": 0.25},
    "adversary": {"kind": "sign_flip", "clients": [7]},
    "privacy": {"clip": 5.0, "noise_multiplier": 0.05},
}
ONE_SHOT = {"pca_km_hc": {"fraction": 1.0, "n_clusters": 2}}
NOT_RESUMED_HERE = {"flt": "pretrains its encoder on another dataset"}
# per-client tables kept compact (issue 41), checkpointed while they fill: FeSEM mid-gathering
# and mid-warm-up, FedSoft's and Local's personal models with a sample
COMPACT = {
    "fesem-gathering": ("fesem", {"n_clusters": 2, "per_round": 2, "first_clustering": 1.0}),
    "fesem-warmup": ("fesem", {"n_clusters": 2, "warmup_rounds": 5, "fraction": 0.5}),
    "fedsoft-sampled": ("fedsoft", {"n_clusters": 2, "per_round": 2}),
    "fedsoft-estimates-sampled": ("fedsoft", {"n_clusters": 2, "per_round": 2,
                                              "estimate_among": "sampled"}),
    "local-sampled": ("local", {"per_round": 2}),
}
CASES = [(m, s, True) for m, s in METHOD_SETTINGS.items()]
CASES += [(m, s, False) for m, s in ONE_SHOT.items()]
# FL+HC clustering a sample: the checkpoint of round 2 holds clients waiting for a placement
CASES += [("flhc", {"warmup_rounds": 1, "per_round": 3, "cluster_clients": 4}, True)]
IDS = [c[0] if "cluster_clients" not in c[1] else f"{c[0]}-sampled" for c in CASES]
CASES += [(m, s, False) for m, s in COMPACT.values()]
IDS += list(COMPACT)


def test_every_expected_method_is_registered_and_resumed_here():
    assert_registry_complete(ALGORITHMS)
    assert sorted({c[0] for c in CASES}) == sorted(set(EXPECTED_METHODS) - set(NOT_RESUMED_HERE))


def _same_models(a: Experiment, b: Experiment) -> None:
    pa, pb = a.algorithm.predictor(), b.algorithm.predictor()
    assert torch.equal(pa.models, pb.models)
    assert (pa.members == pb.members).all()


@pytest.mark.parametrize(("method", "settings", "robust"), CASES, ids=IDS)
def test_stopped_run_resumes_to_identical_results(method, settings, robust, tmp_path):
    cfg = config(rounds=5, eval_every=2, checkpoint_every=2,
                 algorithm={"name": method, **settings}, **(ROBUST if robust else {}))
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    ref_h = ref.run(progress=False)

    resumed, h = crash_then_resume(cfg, tmp_path / "cut", 4)
    assert timing_free(h.summary) == timing_free(ref_h.summary)
    assert timing_free(h.records) == timing_free(ref_h.records)
    _same_models(resumed, ref)
    if robust:
        assert ref_h.summary.robust is not None
        if method == "local":  # sends nothing: [privacy] does not apply (it warns)
            assert ref_h.summary.robust["privacy"] is None
        else:
            assert ref_h.summary.robust["privacy"]["epsilon"] > 0
        assert any(r.robust is not None and r.robust["dropped"] for r in ref_h.records)


def test_sigkilled_cfl_run_with_dropouts_resumes_identically(tmp_path):
    """A real SIGKILL mid-run (CFL: tree, pending clients, noise ledger)."""
    cfg = config(rounds=16, eval_every=4, checkpoint_every=2,
                 algorithm={"name": "cfl", "eps1": 0.12, "eps2": 0.15, "warmup_rounds": 2},
                 faults={"dropout": 0.25}, privacy={"clip": 5.0, "noise_multiplier": 0.01})
    path = tmp_path / "run.toml"
    path.write_text(dump_toml(cfg))
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref").run(progress=False)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "clusterfl.cli", "run", str(path), "--out", str(out), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ckpt, hist = out / "checkpoint" / "state.pt", out / "history.jsonl"
    deadline = time.time() + 600  # a loaded machine may take long to reach round 5
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and hist.exists() and len(hist.read_text().splitlines()) >= 5:
            break
        time.sleep(0.002)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed (machine too fast)")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert 5 <= len(hist.read_text().splitlines()) < 16
    resumed = Experiment.from_config(path, out_dir=out).run(resume=True, progress=False)
    assert timing_free(resumed.summary) == timing_free(ref.summary)
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert [RoundRecord.from_json_dict(x).round for x in lines] == list(range(1, 17))
    want = json.loads(json.dumps([r.to_json_dict() for r in ref.records]))
    assert timing_free(lines) == timing_free(want)
