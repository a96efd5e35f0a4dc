"""Latency per round on Flower vs in process, for IFCA, CFL-GP and FedAvg (issues 8, 26).

    OMP_NUM_THREADS=1 python benchmarks/flower/bench.py [--clients 8] [--rounds 5]
        [--method ifca --method cfl_gp --method fedavg] [--only inprocess --only deployment
        --only ray] [--out DIR]

Each method runs the same small task (digits, rotation 0°/180°, MLP 64-32-10, 2 local epochs
of SGD, K = 2 where the method has clusters, evaluation at the last round only) on

- `inprocess`: the default `simulation` backend (vectorized engine, one process);
- `deployment`: real processes on loopback (`clusterfl.deploy.launch`): a SuperLink with its
  SuperExec, one SuperNode per client (each with its persistent node worker), our app
  submitted with `flwr run`;
- `ray`: Flower's simulation engine through `flwr run` on a local simulation federation
  (`clusterfl flower run --mode ray`'s path; Ray actors, one virtual SuperNode per client).

Per-round latency is the mean of the history's round wall times over rounds 2..R−1: round 1
includes one-off start-up (workers starting, data loading, Ray actors) and round R the
evaluation message (both reported apart). Messages per client per round are counted on the
server (`flower.json`: messages sent, less the evaluation's one per client, over clients ×
rounds). For the deployment every message appends its timing (`CLUSTERFL_TIMING`, see
`clientapp_timing`). `CLUSTERFL_WARM_CLIENTAPP=0` and `CLUSTERFL_SUPERNODE_IDLE_POLL=3`
measure Flower's own SuperNode loop and process per message (the "before" of issue 26).
Prints one line per (method, executor) and writes `results.json` to --out (default: beside
this script), with the load average before and after each run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from clusterfl.records import FinalMetrics, RoundRecord, read_history, read_summary

ROOT = Path(__file__).resolve().parents[2]
METHODS: dict[str, dict[str, Any]] = {
    "ifca": {"name": "ifca", "n_clusters": 2},
    "cfl_gp": {"name": "cfl_gp", "n_clusters": 2},
    "fedavg": {"name": "fedavg"},
}


def config(method: str, clients: int, rounds: int) -> dict[str, Any]:
    return {
        "seed": 0, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
        "data": {"source": "digits"},
        "scenario": {"name": "rotation", "n_clients": clients, "angles": [0, 180]},
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"lr": 0.1, "batch_size": 16, "epochs": 2},
        "algorithm": dict(METHODS[method]),
        "output": {"figures": False},
        "backend": {"timeout": 600.0, "wait_timeout": 600.0},
    }


def round_times(records: list[RoundRecord]) -> list[float]:
    walls = [0.0] + [float(r.wall_time) for r in records]
    return [b - a for a, b in itertools.pairwise(walls)]


def summarize(method: str, name: str, times: list[float], clients: int, total: float,
              final: FinalMetrics) -> dict[str, Any]:
    steady = times[1:-1] if len(times) > 2 else times
    per_round = sum(steady) / len(steady)
    accuracy = None if final.metrics is None else final.metrics.accuracy
    return {"method": method, "executor": name, "round_times": times,
            "first_round": times[0], "last_round": times[-1], "per_round": per_round,
            "per_client_round": per_round / clients, "total_wall": total,
            "accuracy": accuracy, "ari": final.ari}


def run_inprocess(method: str, raw: dict[str, Any], clients: int) -> dict[str, Any]:
    from clusterfl.experiment import Experiment

    t0 = time.perf_counter()  # the default backend; the flower settings are not its own
    h = Experiment.from_config({**raw, "backend": {"name": "simulation"}}).run(progress=False)
    return summarize(method, "inprocess", round_times(h.records), clients,
                     time.perf_counter() - t0, h.final)


def _flower_counts(res: dict[str, Any], out: Path, clients: int, rounds: int) -> None:
    flower = json.loads((out / "flower.json").read_text())
    res["messages"], res["message_seconds"] = flower["messages"], flower["message_seconds"]
    res["messages_per_client_round"] = (flower["messages"] - clients) / (clients * rounds)


def run_ray(method: str, raw: dict[str, Any], clients: int, work: Path) -> dict[str, Any]:
    """Through `clusterfl flower run --mode ray` (flwr run on a local simulation federation)."""
    import subprocess

    from clusterfl.config import dump_toml

    work.mkdir(parents=True, exist_ok=True)
    cfg, out = work / f"{method}-ray.toml", work / f"{method}-ray-out"
    cfg.write_text(dump_toml(raw))
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "clusterfl.cli", "flower", "run", str(cfg), "--mode", "ray",
           "--out", str(out)]
    log = work / f"{method}-ray.log"
    with open(log, "wb") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"ray run failed ({code}); see {log}")
    res = summarize(method, "ray", round_times(read_history(out)), clients,
                    time.perf_counter() - t0, read_summary(out).final)
    _flower_counts(res, out, clients, int(raw["rounds"]))
    return res


def run_deployment(method: str, raw: dict[str, Any], clients: int,
                   work: Path) -> dict[str, Any]:
    from clusterfl.config import dump_toml
    from clusterfl.deploy.launch import local_deployment
    from clusterfl.deploy.server_app import FINAL_STATE

    work = work / f"{method}-deployment"
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "run.toml"
    cfg.write_text(dump_toml(raw))
    out = work / "out"
    timing = work / "timing.jsonl"
    os.environ["CLUSTERFL_TIMING"] = str(timing)  # the ClientApps inherit it
    t0 = time.perf_counter()
    try:
        with local_deployment(work) as dep:
            dep.start_superlink()
            for i in range(clients):
                dep.start_supernode({"partition-id": i})
            proc = dep.flwr_run(cfg, out)
            while not (out / FINAL_STATE).exists():
                if not proc.alive():
                    raise RuntimeError(f"flwr run ended early; see {proc.log}")
                time.sleep(0.5)
            total = time.perf_counter() - t0
    finally:
        os.environ.pop("CLUSTERFL_TIMING", None)
    res = summarize(method, "deployment", round_times(read_history(out)), clients, total,
                    read_summary(out).final)
    _flower_counts(res, out, clients, int(raw["rounds"]))
    res["clientapp"] = clientapp_timing(timing)
    return res


def clientapp_timing(path: Path) -> dict[str, Any] | None:
    """Medians (seconds) over the request messages of the timing lines (None without).

    Flower's process per message (`flwr-clientapp`, `CLUSTERFL_WARM_CLIENTAPP=0`): process
    start → end of the imports of our ClientApp module, the handler, the node worker's share.
    Our SuperExec (`clusterfl.deploy.superexec`, the default): task queued → message pulled
    from the SuperNode, → answered (handler), → reply and status pushed."""
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    warm = [r for r in rows if r.get("kind") == "warm_task" and "answered" in r]
    cold = [r for r in rows if r.get("kind") == "request"]

    def med(rs: list[dict[str, Any]], key: Any) -> float | None:
        vals = [v for v in (key(r) for r in rs) if v is not None]
        return round(statistics.median(vals), 4) if vals else None

    out: dict[str, Any] = {"messages": len(cold)}
    if warm:
        out.update(
            process="warm (one per SuperNode)",
            queued_to_pulled=med(warm, lambda r: r["pulled"] - r["queued"]),
            handler=med(warm, lambda r: r["answered"] - r["pulled"]),
            answered_to_pushed=med(warm, lambda r: r["pushed"] - r["answered"]))
    elif cold:
        out.update(
            process="flwr-clientapp per message",
            process_start_to_imported=med(cold, lambda r: r["imported"] - r["process_start"]
                                          if r.get("process_start") else None),
            handler=med(cold, lambda r: r["handler_end"] - r["handler_start"]))
    out["worker_handle"] = med(cold, lambda r: r.get("worker_handle"))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--method", choices=list(METHODS), action="append")
    p.add_argument("--out", default=str(Path(__file__).parent))
    p.add_argument("--only", choices=["inprocess", "deployment", "ray"], action="append")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"clusterfl-flower-bench-{os.getpid()}"
    results = []
    for method in a.method or list(METHODS):
        raw = config(method, a.clients, a.rounds)
        base: dict[str, Any] | None = None
        for name in a.only or ["inprocess", "deployment"]:
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            if name == "inprocess":
                r = run_inprocess(method, raw, a.clients)
            elif name == "ray":
                r = run_ray(method, raw, a.clients, work)
            else:
                r = run_deployment(method, raw, a.clients, work)
            r["load_before"], r["load_after"] = load_before, os.getloadavg()
            if name == "inprocess":
                base = r
            if base is not None:
                r["ratio_per_round"] = r["per_round"] / base["per_round"]
            msgs = r.get("messages_per_client_round")
            print(f"{method} {name}: per round {r['per_round']:.3f} s"
                  + (f" ({r['ratio_per_round']:.0f}x in-process)" if base is not r
                     and base is not None else "")
                  + (f", {msgs:.2f} messages per client per round" if msgs is not None
                     else "")
                  + f", first round {r['first_round']:.2f} s, last {r['last_round']:.2f} s, "
                  f"total {time.perf_counter() - t0:.1f} s, acc {r['accuracy']}, "
                  f"ari {r['ari']}, load {load_before[0]:.1f} -> {r['load_after'][0]:.1f}"
                  + (f", clientapp {r['clientapp']}" if r.get("clientapp") else ""),
                  flush=True)
            results.append(r)
    meta = {"clients": a.clients, "rounds": a.rounds, "python": sys.version.split()[0],
            "machine": platform.machine(), "cpus": os.cpu_count(), "argv": sys.argv}
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results},
                                                 indent=2))


if __name__ == "__main__":
    main()
