"""Memory-mapped shards against a federation held in memory: peak memory and time per round.

The federation of `benchmarks/scaling.py` (rotated MNIST, 4 angles, 5 training images and 1
test image per client, MLP 784-32-10, one local step of batch 5; more than 10,000 clients:
the 10,000-client federation tiled) with N clients, FedAvg with 1,000 clients sampled a round,
5 rounds. Three processes per N:

1. builds the federation and writes it with `clusterfl.data.shards.write_shards` (what
   `clusterfl data shard` does), in a temporary folder;
2. builds the same federation in memory and runs it;
3. runs on the shards (`[data] source = "shards"`).

Each run reports its peak resident memory (`ru_maxrss`: for the shards it includes the pages
of the mapped files the run read, which the system may drop again) and the median time of
rounds 2-4; the two runs' final accuracy must be equal (the same bits are read).

Usage: python benchmarks/shards.py [--clients 100000 300000] [--out benchmarks/shards_results.md]
Needs MNIST in $CLUSTERFL_DATA.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS, BASE, SAMPLED = 5, 10_000, 1_000

BUILD = r"""
import numpy as np
from clusterfl.data.scenarios import make_federation
def build(n, base, seed=0):
    fed = make_federation("mnist", "rotation", {"n_clients": min(n, base), "angles": "ifca",
                          "layout": "split", "n_train_per_client": 5, "n_test_per_client": 1},
                          seed=seed)
    return fed.subset(np.arange(n) % base) if n > base else fed
"""

WRITE = BUILD + r"""
import json, sys
from clusterfl.data.shards import write_shards
n, base, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
write_shards(build(n, base), folder)
"""

RUN = BUILD + r"""
import json, resource, sys, tempfile
from clusterfl.experiment import Experiment
cfg, n, base, shards = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with tempfile.TemporaryDirectory() as out:
    if shards:
        cfg["data"] = {"source": "shards", "path": shards}
        h = Experiment.from_config(cfg, out_dir=out).run(progress=False)
    else:
        h = Experiment.from_config(cfg, out_dir=out, federation=build(n, base)).run(progress=False)
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print(json.dumps({"walls": [r.wall_time for r in h.records],
                  "accuracy": h.final.metrics.accuracy if h.final.metrics else None,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "anon_kib": int(status["RssAnon"].split()[0]),
                  "file_kib": int(status["RssFile"].split()[0])}))
"""


def config() -> dict:
    return {
        "seed": 0, "rounds": ROUNDS, "eval_every": ROUNDS, "checkpoint_every": 0,
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"lr": 0.1, "batch_size": 5, "steps": 1},
        "algorithm": {"name": "fedavg", "per_round": SAMPLED},
        "output": {"figures": False, "progress": "off"},
    }


def run(n: int, shards: str) -> dict:
    args = [sys.executable, "-c", RUN, json.dumps(config()), str(n), str(BASE), shards]
    res = subprocess.run(args, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    walls = out["walls"]
    return {"per_round": statistics.median(walls[i] - walls[i - 1] for i in range(1, ROUNDS - 1)),
            "peak_mib": out["peak_kib"] / 1024, "anon_mib": out["anon_kib"] / 1024,
            "file_mib": out["file_kib"] / 1024, "accuracy": out["accuracy"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100_000])
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("shards_results.md"))
    args = ap.parse_args(argv)
    lines = [
        "# Memory-mapped shards against a federation in memory",
        "",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
        f"- command: `python benchmarks/shards.py --clients "
        f"{' '.join(map(str, args.clients))}`",
        "- FedAvg, 1,000 clients sampled a round, 5 rounds, 1 thread; the federation of "
        "benchmarks/scaling.py (5 training and 1 test image per client; tiled past 10,000)",
        "- peak: the process's peak resident memory, which for the shards counts the pages of "
        "the mapped files the system read in (the file pages the run touched and the "
        "system's read-ahead around them: clean page cache, dropped again under memory "
        "pressure); anon: the process's own memory (RssAnon) at the end of the run, which "
        "the system cannot drop; s/round: median of rounds 2-4",
        "",
        "| clients | shards on disk (MiB) | in memory: peak / anon (MiB) | s/round "
        "| shards: peak / anon / file pages (MiB) | s/round | same accuracy |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in args.clients:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "shards"
            subprocess.run([sys.executable, "-c", WRITE, str(n), str(BASE), str(folder)],
                           check=True)
            disk = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
            mem, mapped = run(n, ""), run(n, str(folder))
        same = mem["accuracy"] == mapped["accuracy"]
        lines.append(f"| {n:,} | {disk:,.0f} | {mem['peak_mib']:,.0f} / {mem['anon_mib']:,.0f} "
                     f"| {mem['per_round']:.3f} | {mapped['peak_mib']:,.0f} / "
                     f"{mapped['anon_mib']:,.0f} / {mapped['file_mib']:,.0f} "
                     f"| {mapped['per_round']:.3f} | "
                     f"{'yes' if same else 'NO'} ({mapped['accuracy']:.4f}) |")
        print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
