"""Scaling: time per round and peak memory of FedAvg, IFCA and CFL-GP with 100 to 10,000 clients.

Every client holds the same small amount of data (rotated MNIST, 4 angles, `split` layout:
5 training images and 1 test image per client; MNIST has 10,000 test images), so the work per
round grows with the number of clients and a linear engine shows a constant time per client.
Each (method, clients) point runs in its own process (peak resident memory is per process):
4 rounds, the time per round is the median of rounds 2–4 (round 1 includes one-off setup),
evaluation only at the end.

Usage: python benchmarks/scaling.py [--quick] [--out benchmarks/scaling_results.md]
(`--quick`: 100 and 1,000 clients only). Needs MNIST in $CLUSTERFL_DATA.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

METHODS = {
    "FedAvg": {"name": "fedavg"},
    "IFCA (K=4)": {"name": "ifca", "n_clusters": 4},
    "CFL-GP (K=4)": {"name": "cfl_gp", "n_clusters": 4, "protocol": "model"},
}
ROUNDS = 4

CHILD = r"""
import json, resource, sys, tempfile
from clusterfl.experiment import Experiment
cfg = json.loads(sys.argv[1])
with tempfile.TemporaryDirectory() as out:
    h = Experiment.from_config(cfg, out_dir=out).run(progress=False)
walls = [r.wall_time for r in h.records]
print(json.dumps({"walls": walls, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "ari": h.final.ari}))
"""


def config(method: dict, n_clients: int) -> dict:
    return {
        "seed": 0, "rounds": ROUNDS, "eval_every": ROUNDS, "checkpoint_every": 0,
        "data": {"source": "mnist"},
        "scenario": {"name": "rotation", "n_clients": n_clients, "angles": "ifca",
                     "layout": "split", "n_train_per_client": 5, "n_test_per_client": 1},
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"lr": 0.1, "batch_size": 5, "steps": 1},
        "algorithm": dict(method),
        "output": {"figures": False, "progress": "off"},
    }


def measure(method: dict, n_clients: int) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config(method, n_clients))],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{method} with {n_clients} clients failed:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    walls = out["walls"]
    steps = [b - a for a, b in itertools.pairwise(walls)] or walls
    return {"per_round": statistics.median(steps), "peak_mib": out["peak_kib"] / 1024,
            "ari": out["ari"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("scaling_results.md"))
    args = ap.parse_args(argv)
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    lines = ["| method | clients | s/round | ms per client-round | growth vs previous "
             "(time / clients) | peak memory (MiB) | ARI |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, method in METHODS.items():
        prev = None
        for n in sizes:
            r = measure(method, n)
            per_client = 1000 * r["per_round"] / n
            growth = "–" if prev is None else (
                f"{r['per_round'] / prev[1]:.1f}× / {n / prev[0]:.0f}×")
            ari = "–" if r["ari"] is None else f"{r['ari']:.2f}"
            lines.append(f"| {label} | {n:,} | {r['per_round']:.3f} | {per_client:.2f} | "
                         f"{growth} | {r['peak_mib']:.0f} | {ari} |")
            print(lines[-1], flush=True)
            prev = (n, r["per_round"])
    argv_used = sys.argv[1:] if argv is None else argv
    header = (
        "# Scaling: time per round and peak memory against the number of clients\n\n"
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}\n"
        f"- command: `python benchmarks/scaling.py {' '.join(argv_used)}`\n"
        f"- threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; rotated "
        "MNIST (4 angles), 5 training images per client, MLP 784-32-10, one local step of "
        f"batch 5, {ROUNDS} rounds (median of rounds 2–{ROUNDS}); simulation backend\n"
        "- ARI after 4 rounds is not a clustering result (far too few rounds); it is shown "
        "only to make clear that the clustered methods ran their assignment steps\n\n"
    )
    args.out.write_text(header + "\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
