"""The suite's CFL rows only (issue 22): every suite scenario's CFL method, as listed there.

    export CLUSTERFL_DATA=...   # MNIST / Fashion-MNIST folder
    OMP_NUM_THREADS=1 python benchmarks/cfl/run_suite_cfl.py [SCENARIO ...] [--seeds 0 1]
    python benchmarks/cfl/run_suite_cfl.py --table    # the table of finished runs
    python benchmarks/cfl/run_suite_cfl.py --ceiling  # the ARI ceiling of each federation

Runs into the suite's own run folders (`benchmarks/runs/full/<scenario>/<method>/seed<N>`,
git-ignored), with `clusterfl.bench.run_suite`, so the runs are exactly the ones `clusterfl
bench` makes and tabulates, and the runner is resumable the same way (finished runs are
skipped, interrupted ones resume from their checkpoint). `--seeds` defaults to each
scenario's suite seeds. The table lists accuracy, ARI, clusters and wall time per run.
`--ceiling` prints, per scenario and seed, the best ARI a method can reach when clients that
hold the same set of classes (the same distribution) must share a cluster
(`clusterfl.metrics.ari_ceiling`; below 1 in CAM's n-class scenario, where clients of two
clusters can hold the same class pair), and the ARI of one cluster per class set (what a
method that separates every distinct distribution scores).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.bench import load_scenario, run_dir, run_metrics, run_suite
from clusterfl.config import apply_overrides, load_config
from clusterfl.experiment import build_federation
from clusterfl.metrics import ari, ari_ceiling
from clusterfl.records import read_summary

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent / "suite"
RUNS = HERE.parent / "runs" / "full"
SCENARIOS = ["rotated_mnist_4", "rotated_mnist_8", "flt_scenario1", "label_swap_mnist",
             "cam_n_class"]


def ceiling(fed: Any) -> dict[str, Any]:
    """Clients grouped by the set of classes they hold; the ARI ceiling of that grouping."""
    y = fed.y_train.numpy()
    held = np.stack([np.bincount(y[a:b], minlength=fed.n_classes) > 0
                     for a, b in zip(fed.train_offsets[:-1], fed.train_offsets[1:])])
    _, groups = np.unique(held, axis=0, return_inverse=True)
    groups = groups.ravel()
    mixed = {g for g in set(groups.tolist()) if len(set(fed.clusters[groups == g])) > 1}
    return {"clients": fed.n_clients, "class_sets": len(set(groups.tolist())),
            "clients_sharing_a_class_set_across_clusters": int(np.isin(groups, list(mixed)).sum()),
            "ari_ceiling": round(ari_ceiling(fed.clusters, groups), 3),
            "ari_one_cluster_per_class_set": round(ari(fed.clusters, groups), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="*", default=SCENARIOS)
    p.add_argument("--seeds", type=int, nargs="*")
    p.add_argument("--runs", default=str(RUNS), help="run folders (default benchmarks/runs/full)")
    p.add_argument("--table", action="store_true", help="print the table only")
    p.add_argument("--ceiling", action="store_true", help="print the ARI ceilings only")
    a = p.parse_args()
    if a.ceiling:
        for name in a.scenarios:
            s = load_scenario(SUITE / f"{name}.toml")
            for seed in a.seeds or s.seeds:
                fed = build_federation(load_config(apply_overrides(s.config, [f"seed={seed}"])))
                print(json.dumps({"scenario": name, "seed": seed, **ceiling(fed)}))
        return
    scenarios = []
    for name in a.scenarios:
        s = load_scenario(SUITE / f"{name}.toml")
        cfl = [m for m in s.methods if m == "cfl" or m.startswith("cfl:")]
        scenarios.append(replace(s, methods=cfl, seeds=a.seeds or s.seeds))
    out = Path(a.runs)
    if not a.table:
        run_suite(scenarios, out, log=lambda m: print(m, flush=True))
    for s in scenarios:
        for spec in s.methods:
            for seed in s.seeds:
                target = run_dir(out, s, spec, seed)
                m = run_metrics(target)
                if m is None:
                    print(json.dumps({"scenario": s.name, "method": spec, "seed": seed,
                                      "finished": False}))
                    continue
                summary = read_summary(target)
                print(json.dumps({
                    "scenario": s.name, "method": spec, "seed": seed,
                    "accuracy": m["accuracy"], "ari": m["ari"],
                    "n_clusters": summary.final.n_clusters,
                    "rounds_to_ari1": m["rounds_to_ari1"], "wall_s": m["wall_time"]}))


if __name__ == "__main__":
    main()
