"""Real processes on loopback: a SuperLink, 6 SuperNodes, our app submitted with `flwr run`.

The deployment uses TLS (test CA, server certificate for 127.0.0.1) and SuperNode
authentication (6 registered keys); a 7th SuperNode with an unregistered key must stay out.
Besides clusterfl's own app, it runs a standard ClientApp driven by `ClusteredStrategy`
(SuperNodes run whatever app a run submits).
The SuperLink's SuperExec is ours (supervised): killing it must not stop the next run.

One deployment serves all tests of this module (its node workers stay warm between runs).
Every process is started in its own session and stopped by PID with all its descendants,
plus any node worker mentioning the deployment's private directory, even when a test fails.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from clusterfl.config import dump_toml
from clusterfl.deploy.certs import make_node_keys, make_tls
from clusterfl.deploy.launch import LocalDeployment, Process, Tls, local_deployment
from clusterfl.deploy.server_app import FINAL_STATE
from clusterfl.experiment import Experiment
from clusterfl.records import RoundRecord, read_summary
from tests.flower.conftest import BASE, IFCA

RUN_TIMEOUT = 900.0  # seconds for one run of two rounds (generous: ~250 s at load 15 on 2 cores)
SHORT = {**BASE, "rounds": 2, "eval_every": 2}  # IFCA reaches ARI 1 at round 2 (seed 0),
# also on the 4 clients left by a holdout of 1/3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    work = tmp_path_factory.mktemp("flower")

    def on_term(*_: object) -> None:  # a SIGTERM to pytest still runs the teardown below
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    certs = make_tls(work / "certs", ["127.0.0.1", "localhost"])
    keys = make_node_keys(work / "certs", 7)
    try:
        with local_deployment(work) as dep:
            dep.start_superlink(Tls(certs["ca"], certs["server_cert"], certs["server_key"]),
                                node_auth=True)
            dep.register_supernodes([pub for _, pub in keys[:6]])
            for i in range(6):
                dep.start_supernode({"partition-id": i}, ca=certs["ca"], auth_key=keys[i][0])
            # an intruder with a valid TLS root but an unregistered key, claiming client 5:
            # if the SuperLink let it in, the handshake would fail ("both hold client 5")
            dep.start_supernode({"partition-id": 5}, ca=certs["ca"], auth_key=keys[6][0])
            yield dep
    finally:
        signal.signal(signal.SIGTERM, previous)


def _submit(dep: LocalDeployment, raw: dict, name: str) -> tuple[Path, Process]:
    cfg = dep.work / f"{name}.toml"
    cfg.write_text(dump_toml(raw))
    out = dep.work / name
    return out, dep.flwr_run(cfg, out)


def _wait(path: Path, proc: Process, dep: LocalDeployment, timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or not proc.alive():  # `flwr run` ends with the run
            logs = "\n".join(p.log.read_text()[-1500:] for p in [proc, dep.superlink])
            proc.stop()
            if path.exists():
                break
            pytest.fail(f"{path.name} not written (waited up to {timeout:g} s); logs:\n{logs}")
        time.sleep(0.5)
    time.sleep(0.5)  # the file is written in one go, but give the writer a moment
    proc.stop()


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def test_deployment_equals_inprocess_simulation(deployment):
    """IFCA (train, losses and evaluate requests) through every real process, with
    `[scenario] holdout`: 4 nodes train two rounds, then the 2 held-out nodes are placed (a
    loss request, then their evaluation: the generic path of every method, requests through
    `Context.send`, ids translated to the whole federation's nodes). The same run in process
    gives the same assignment, accuracy, models, placements and placed accuracy. CFL-GP and
    the other request types are compared on the in-process grid (test_fakegrid.py), which
    runs the same ServerApp and ClientApp code without the processes."""
    algo = IFCA
    # a request times out only far beyond a healthy reply, even on a slow, loaded machine:
    # a dropout here would change the models, and the report says so first
    raw = {**SHORT, "algorithm": algo, "scenario": {**SHORT["scenario"], "holdout": 1 / 3},
           "backend": {"name": "flower", "timeout": 400.0}}
    out, proc = _submit(deployment, raw, f"run_{algo['name']}")
    _wait(out / FINAL_STATE, proc, deployment)
    report = json.loads((out / "flower.json").read_text())
    assert report["dropouts"] == [] and len(report["nodes"]) == 6, report
    summary = read_summary(out)
    exp = Experiment.from_config({**raw, "backend": {"name": "simulation"}})
    ref = exp.run(progress=False).summary
    assert summary.final.ari == 1.0 == ref.final.ari and summary.n_clients == 4
    assert summary.assignment == ref.assignment
    assert summary.final.metrics is not None and ref.final.metrics is not None
    assert summary.final.metrics.accuracy == pytest.approx(ref.final.metrics.accuracy,
                                                           abs=1e-9)
    ours = _tensors(torch.load(out / FINAL_STATE, weights_only=False))
    theirs = _tensors(exp.algorithm.state_dict())
    assert ours.keys() == theirs.keys() and ours
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    # the held-out nodes: placed and scored as in process (placement ARI 1)
    assert summary.holdout is not None and ref.holdout is not None
    assert summary.holdout["clients"] == ref.holdout["clients"]
    assert summary.holdout["placed_clusters"] == ref.holdout["placed_clusters"]
    assert summary.holdout["accuracy"] == pytest.approx(ref.holdout["accuracy"], abs=1e-6)
    assert summary.final.placement_ari == ref.final.placement_ari == 1.0
    # the SuperLink state is in memory: no SQLite file where the processes run
    assert not [p.name for p in deployment.work.iterdir() if "flwr" in p.name]
    intruder = deployment.supernodes[6]  # refused by the SuperLink: it gives up and exits
    assert not intruder.alive() and "Failed to activate SuperNode" in intruder.log.read_text()


def test_a_standard_app_with_the_clustered_strategy_runs_over_tls(deployment, tmp_path):
    """The ServerApp of docs/flower.md (`ClusteredStrategy`) with the standard ClientApp of
    `standard_app.py` (no clusterfl on the clients) on this module's SuperLink: TLS, SuperNode
    authentication, 6 SuperNodes whose partitions fall into 3 rotation groups. CFL-GP finds
    the groups; `clusterfl report` reads the run folder. (The same app on Flower's simulation
    engine: test_standard_deployment.py; all methods on both engines, 8 nodes in 4 groups:
    benchmarks/flower_standard.)"""
    from clusterfl.cli import main
    from tests.flower.stdapp_dir import run_on

    method = "cfl_gp:n_clusters=3:protocol=model"
    results = run_on(deployment, method, 2, tmp_path / "runs", n=6, timeout=RUN_TIMEOUT,
                     eval_every=2, groups=3, log=lambda m: None)
    r = results[method]
    assert r["ari"] == 1.0 and float(r["accuracy"]) > 0.9 and r["rounds"] == 2, r
    run = tmp_path / "runs" / method.replace(":", "_")
    report = json.loads((run / "flower.json").read_text())
    assert report["dropouts"] == [] and len(report["nodes"]) == 6  # the intruder is no node
    assert main(["report", str(run)]) == 0 and (run / "report.md").is_file()


def test_killed_supernode_is_dropped_and_the_run_finishes(deployment):
    """Runs last: it kills SuperNode 5 after round 1 is recorded. It first kills the
    SuperLink's SuperExec: the run can start only if the deployment starts a new one."""
    old = deployment.superexec
    assert old is not None and old.alive()
    restarts = deployment.superexec_restarts
    old.kill_now()
    deadline = time.monotonic() + 30.0
    while deployment.superexec is old or not deployment.superexec.alive():
        assert time.monotonic() < deadline, "no new SuperExec within 30 s"
        time.sleep(0.1)
    assert deployment.superexec_restarts == restarts + 1
    assert "starting a new one" in (deployment.work / "logs" / "supervisor.log").read_text()
    # the timeout must exceed a healthy request's time on a loaded machine (a healthy
    # 2-round IFCA run on these 6 nodes spent 9.3 s in all its requests together at load
    # 4-6, flower.json's message_seconds): the crash is detected by it (once:
    # later requests do not wait for a node that missed a deadline), before the SuperLink's
    # own detection (the node's heartbeat: 30 s, patience 2)
    raw = {**SHORT, "algorithm": IFCA, "backend": {"name": "flower", "timeout": 30.0}}
    out, proc = _submit(deployment, raw, "run_kill")
    history = out / "history.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (history.exists() and history.read_text().strip()):
        assert time.monotonic() < deadline and proc.alive(), proc.log.read_text()[-3000:]
        time.sleep(0.2)
    victim = deployment.supernodes[5]
    victim.kill_now()
    assert not victim.alive()
    _wait(out / FINAL_STATE, proc, deployment)
    lines = history.read_text().splitlines()
    records = [RoundRecord.from_json_dict(json.loads(x)) for x in lines]
    assert [r.round for r in records] == [1, 2]
    report = json.loads((out / "flower.json").read_text())
    assert report["dropouts"] and all(d["clients"] == [5] for d in report["dropouts"])
    acc = records[-1].client_accuracy
    assert acc is not None and acc[5] is None
    assert all(a is not None for a in acc[:5])
