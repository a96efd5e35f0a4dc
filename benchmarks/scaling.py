"""Scaling: time per round and peak memory of clustered FL methods with 10,000 to 100,000 clients.

Every client holds the same small amount of data (rotated MNIST, 4 angles, `split` layout:
5 training images and 1 test image per client, MLP 784-32-10, one local step of batch 5). MNIST
has 60,000 training and 10,000 test images, so a federation of more than 10,000 clients reuses
them: it is the 10,000-client federation tiled (client i holds the data of client i mod 10,000,
in the true cluster of that client). Each point runs in its own process (peak resident memory
is per process, `ru_maxrss`): 5 rounds, evaluation of every client only at the end; the time
per round is the median of rounds 2–4 (round 1 includes one-off setup, round 5 the final
evaluation of every client).

The points (`--points`):
- `must`: FedAvg and IFCA (K = 4) at 10,000 and 100,000 clients with 1,000 sampled a round
  (the time per round should not grow with the clients that are not sampled), and CFL-GP
  (K = 4, model averaging) at 10,000 clients, all participating.
- `more`: FeSEM, CFL, CFL-GP, FL+HC and FedSoft (K = 4; its importance estimation asking
  every client, the default, and only the round's sample, `estimate_among = "sampled"`)
  with 1,000 sampled a round, at 10,000 and 100,000 clients; a point that fails (memory, a
  method's limit) is reported with the reason. FL+HC clusters 1,000 clients too
  (`cluster_clients`; the others are placed when first sampled after its clustering round,
  round 4), and its rows note the times of rounds 4 and 5.
- `all`: both.

Usage: python benchmarks/scaling.py [--points must|more|all] [--only LABEL] [--timeout S]
                                   [--out benchmarks/scaling_latest.md]
Needs MNIST in $CLUSTERFL_DATA. `--out` gets a new table (its header, then one row as each
point finishes); a file that is not an output of this script is never overwritten (the
measured tables, with their commands and notes, are kept in `scaling_results.md`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUNDS = 5
MARK = "<!-- written by benchmarks/scaling.py: each run rewrites this file -->"
BASE = 10_000  # clients of the untiled federation (MNIST's 10,000 test images, one each)
SAMPLED = 1_000

MUST = [
    ("FedAvg", {"name": "fedavg"}, 10_000, SAMPLED),
    ("FedAvg", {"name": "fedavg"}, 100_000, SAMPLED),
    ("IFCA (K=4)", {"name": "ifca", "n_clusters": 4}, 10_000, SAMPLED),
    ("IFCA (K=4)", {"name": "ifca", "n_clusters": 4}, 100_000, SAMPLED),
    ("CFL-GP (K=4)", {"name": "cfl_gp", "n_clusters": 4, "protocol": "model"}, 10_000, None),
]
MORE = [
    (label, method, n, SAMPLED)
    for label, method in (
        ("FeSEM (K=4)", {"name": "fesem", "n_clusters": 4}),
        ("CFL", {"name": "cfl"}),
        ("CFL-GP (K=4)", {"name": "cfl_gp", "n_clusters": 4, "protocol": "model"}),
        # clusters in round 4, a sample of 1,000 as in the other rounds
        ("FL+HC (warm-up 3, 1,000 clustered)",
         {"name": "flhc", "warmup_rounds": 3, "cluster_clients": SAMPLED}),
        ("FedSoft (K=4)", {"name": "fedsoft", "n_clusters": 4}),
        ("FedSoft (K=4, estimates sampled)", {"name": "fedsoft", "n_clusters": 4,
                                              "estimate_among": "sampled"}),
    )
    for n in (10_000, 100_000)
]

CHILD = r"""
import json, resource, sys, tempfile
import numpy as np
from clusterfl.data.scenarios import make_federation
from clusterfl.experiment import Experiment
cfg, n, base = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fed = make_federation("mnist", "rotation", {"n_clients": min(n, base), "angles": "ifca",
                      "layout": "split", "n_train_per_client": 5, "n_test_per_client": 1},
                      seed=cfg["seed"])
if n > base:  # MNIST with reuse: client i holds the data of client i mod base
    fed = fed.subset(np.arange(n) % base)
with tempfile.TemporaryDirectory() as out:
    h = Experiment.from_config(cfg, out_dir=out, federation=fed).run(progress=False)
print(json.dumps({"walls": [r.wall_time for r in h.records], "ari": h.final.ari,
                  "accuracy": h.final.metrics.accuracy if h.final.metrics else None,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def config(method: dict, per_round: int | None) -> dict:
    algorithm = dict(method)
    if per_round is not None:
        algorithm["per_round"] = per_round
    return {
        "seed": 0, "rounds": ROUNDS, "eval_every": ROUNDS, "checkpoint_every": 0,
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"lr": 0.1, "batch_size": 5, "steps": 1},
        "algorithm": algorithm,
        "output": {"figures": False, "progress": "off"},
    }


def measure(method: dict, n_clients: int, per_round: int | None, timeout: float) -> dict:
    """One point in its own process; {"error": ...} when it fails or runs out of time."""
    args = [sys.executable, "-c", CHILD, json.dumps(config(method, per_round)),
            str(n_clients), str(BASE)]
    try:
        res = subprocess.run(args, capture_output=True, text=True, check=False,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1:] or [f"exit status {res.returncode}"]
        why = "killed (out of memory?)" if res.returncode < 0 else tail[0][:160]
        return {"error": why}
    out = json.loads(res.stdout.strip().splitlines()[-1])
    walls = out["walls"]
    steps = [walls[i] - walls[i - 1] for i in range(1, min(len(walls), ROUNDS - 1))]
    rounds = [walls[0]] + [walls[i] - walls[i - 1] for i in range(1, len(walls))]
    return {"per_round": statistics.median(steps), "first": walls[0], "rounds": rounds,
            "peak_mib": out["peak_kib"] / 1024, "ari": out["ari"], "accuracy": out["accuracy"]}


#: rounds whose own time a row's note gives (label prefix -> {round: what happens in it})
ROUND_NOTES = {"FL+HC": {4: "clustering", 5: "placements, final evaluation"}}


def row(label: str, n: int, per_round: int | None, r: dict) -> str:
    sampled = "all" if per_round is None else f"{per_round:,}"
    if "error" in r:
        return f"| {label} | {n:,} | {sampled} | – | – | – | – | – | failed: {r['error']} |"
    ari = "–" if r["ari"] is None else f"{r['ari']:.4f}"
    acc = "–" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
    notes = next((v for k, v in ROUND_NOTES.items() if label.startswith(k)), {})
    note = "; ".join(f"round {t} ({what}): {r['rounds'][t - 1]:.1f} s"
                     for t, what in notes.items() if t <= len(r.get("rounds", [])))
    return (f"| {label} | {n:,} | {sampled} | {r['per_round']:.3f} | {r['first']:.1f} | "
            f"{r['peak_mib']:,.0f} | {ari} | {acc} | {note + ' ' if note else ''}|")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", choices=("must", "more", "all"), default="must")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("scaling_latest.md"))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per point")
    ap.add_argument("--only", default="", help="the points whose method label starts so")
    args = ap.parse_args(argv)
    points = {"must": MUST, "more": MORE, "all": MUST + MORE}[args.points]
    points = [p for p in points if p[0].startswith(args.only)]
    argv_used = sys.argv[1:] if argv is None else argv
    if args.out.exists() and args.out.stat().st_size and \
            not args.out.read_text().startswith(MARK):
        sys.exit(f"scaling.py: error: --out {args.out} is not an output of this script (it "
                 "would be overwritten); give --out a new file")
    header = (
        MARK + "\n# Scaling: time per round and peak memory with 10,000 to 100,000 clients\n\n"
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}\n"
        f"- command: `python benchmarks/scaling.py {' '.join(argv_used)}`\n"
        f"- threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; rotated "
        "MNIST (4 angles), 5 training images and 1 test image per client (more than 10,000 "
        "clients: the 10,000-client federation tiled), MLP 784-32-10, one local step of "
        f"batch 5, {ROUNDS} rounds; s/round = median of rounds 2–{ROUNDS - 1}; round 1 = its "
        "wall time (one-off setup included); peak = the process's peak resident memory; "
        "simulation backend, CPU\n"
        "- ARI and accuracy after 5 rounds are not results of the methods (far too few "
        "rounds); they show what ran, and let two versions of the code be compared\n\n"
        "| method | clients | sampled a round | s/round | round 1 (s) | peak memory (MiB) "
        "| ARI | accuracy | note |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    args.out.write_text(header)
    for label, method, n, per_round in points:
        line = row(label, n, per_round, measure(method, n, per_round, args.timeout))
        print(line, flush=True)
        with args.out.open("a") as f:
            f.write(line + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
