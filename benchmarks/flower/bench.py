"""Time per round and per client-round: in-process engine vs Flower (Ray simulation, deployment).

    OMP_NUM_THREADS=1 python benchmarks/flower/bench.py [--clients 8] [--rounds 4] [--out DIR]

The same IFCA run (digits, rotation 0/180°, MLP 64-32-10, 2 local epochs, evaluation at the
last round only) on three executors:

- `inprocess`: the default `simulation` backend (vectorized engine, one process);
- `ray`: Flower 1.41's simulation engine (`flwr.simulation.run_simulation`, one virtual
  SuperNode per client, ClientApps in Ray actors), our ServerApp on its Grid;
- `deployment`: real processes on loopback: a SuperLink, one SuperNode per client (each with
  its persistent node worker), our app submitted with `flwr run`.

Per-round time is the mean of the history's round wall times over rounds 2..R (round 1
includes one-off warm-up: worker start, data loading, Ray actor start); the first round is
reported separately. Results are written to `results.json` beside this script (or --out).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from clusterfl.records import FinalMetrics, RoundRecord, read_history, read_summary

ROOT = Path(__file__).resolve().parents[2]


def config(clients: int, rounds: int) -> dict[str, Any]:
    return {
        "seed": 0, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
        "data": {"source": "digits"},
        "scenario": {"name": "rotation", "n_clients": clients, "angles": [0, 180]},
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"lr": 0.1, "batch_size": 16, "epochs": 2},
        "algorithm": {"name": "ifca", "n_clusters": 2},
        "output": {"figures": False},
        "backend": {"timeout": 600.0, "wait_timeout": 600.0},
    }


def round_times(records: list[RoundRecord]) -> list[float]:
    walls = [0.0] + [float(r.wall_time) for r in records]
    return [b - a for a, b in itertools.pairwise(walls)]


def summarize(name: str, times: list[float], clients: int, total: float,
              final: FinalMetrics) -> dict[str, Any]:
    steady = times[1:] if len(times) > 1 else times
    per_round = sum(steady) / len(steady)
    accuracy = None if final.metrics is None else final.metrics.accuracy
    return {"executor": name, "round_times": times, "first_round": times[0],
            "per_round": per_round, "per_client_round": per_round / clients,
            "total_wall": total, "accuracy": accuracy, "ari": final.ari}


def run_inprocess(raw: dict[str, Any], clients: int) -> dict[str, Any]:
    from clusterfl.experiment import Experiment

    t0 = time.perf_counter()  # the default backend; the flower settings are not its own
    h = Experiment.from_config({**raw, "backend": {"name": "simulation"}}).run(progress=False)
    return summarize("inprocess", round_times(h.records), clients, time.perf_counter() - t0,
                     h.final)


def run_ray(raw: dict[str, Any], clients: int) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    from clusterfl.deploy.client_app import app as client_app
    from clusterfl.deploy.server_app import make_main

    result: list[Any] = []
    t0 = time.perf_counter()
    run_simulation(make_main(raw, (), None, result), client_app, num_supernodes=clients,
                   backend_config={"client_resources": {"num_cpus": 1}})
    h = result[0]
    return summarize("ray", round_times(h.records), clients, time.perf_counter() - t0, h.final)


def run_deployment(raw: dict[str, Any], clients: int, work: Path) -> dict[str, Any]:
    from clusterfl.config import dump_toml
    from clusterfl.deploy.launch import local_deployment
    from clusterfl.deploy.server_app import FINAL_STATE

    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "run.toml"
    cfg.write_text(dump_toml(raw))
    out = work / "out"
    t0 = time.perf_counter()
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
    records = read_history(out)
    final = read_summary(out).final
    flower = json.loads((out / "flower.json").read_text())
    res = summarize("deployment", round_times(records), clients, total, final)
    res["messages"], res["message_seconds"] = flower["messages"], flower["message_seconds"]
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=str(Path(__file__).parent))
    p.add_argument("--only", choices=["inprocess", "ray", "deployment"], action="append")
    a = p.parse_args()
    raw = config(a.clients, a.rounds)
    out = Path(a.out)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"clusterfl-flower-bench-{os.getpid()}"
    results = []
    for name in a.only or ["inprocess", "ray", "deployment"]:
        t0 = time.perf_counter()
        if name == "inprocess":
            r = run_inprocess(raw, a.clients)
        elif name == "ray":
            r = run_ray(raw, a.clients)
        else:
            r = run_deployment(raw, a.clients, work)
        print(f"{name}: per round {r['per_round']:.3f} s, per client-round "
              f"{1000 * r['per_client_round']:.1f} ms, first round {r['first_round']:.2f} s, "
              f"total {time.perf_counter() - t0:.1f} s, acc {r['accuracy']}, ari {r['ari']}",
              flush=True)
        results.append(r)
    base = next((r for r in results if r["executor"] == "inprocess"), None)
    if base is not None:
        for r in results:
            r["ratio_per_round"] = r["per_round"] / base["per_round"]
            print(f"{r['executor']}: {r['ratio_per_round']:.1f}x the in-process time per round")
    meta = {"clients": a.clients, "rounds": a.rounds, "python": sys.version.split()[0],
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(), "argv": sys.argv}
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
