"""CFL's auto rule, nesting condition (issue 22, sixth session): would it refuse true cuts?

    export CLUSTERFL_DATA=...   # MNIST / Fashion-MNIST folder (digits is built in)
    OMP_NUM_THREADS=1 python benchmarks/cfl/nesting_check.py [--only NAME ...] [--table]

Runs a set of federations with CFL's defaults but `nesting = false`, so that every cut the
other conditions let through is seen, and reads their histories: for each round in which a
cluster formed by an earlier split passed every other condition (`refused` is None or
"patience k/3"; not the root, not a pair), it classifies the candidate bipartition against
the true clusters — "pure" (the cluster holds one true cluster: any cut is wrong), "true cut"
(the two sides share no true cluster) or "mixed cut" — and tells whether the nesting
condition, `separation > formed_separation` (max within − cross now against the same of the
split that formed the cluster), would have let it through. Prints per run the final ARI and
number of clusters without the condition, the counts and the cuts that matter, then the
totals; `--table` only reads runs already made. Run folders go to
`benchmarks/runs/cfl-nesting/` (git-ignored); finished runs are not run again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.bench import load_scenario
from clusterfl.config import apply_overrides
from clusterfl.experiment import Experiment
from clusterfl.records import read_history, read_summary

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_auto  # noqa: E402  (the development / validation federations)
from run_auto_tiny import config as tiny  # noqa: E402  (the unit tests' federation)

SUITE = HERE.parent / "suite"
OFF = ["algorithm.nesting=false"]


def suite(name: str, seed: int) -> dict[str, Any]:
    raw = apply_overrides(load_scenario(SUITE / f"{name}.toml").config,
                          [f"seed={seed}", "algorithm.name=cfl", "checkpoint_every=0"])
    raw["algorithm"] = {"name": "cfl"}
    return raw


def runs() -> dict[str, dict[str, Any]]:
    """name → config (nesting not yet switched off)."""
    out: dict[str, dict[str, Any]] = {}
    for name, seeds in (("digits_rotation4", [10, 11]), ("digits_label_swap", [10, 11])):
        base, rounds = run_auto.DEV[name]
        out.update({f"{name}_s{s}": run_auto.config(base, rounds, s, []) for s in seeds})
    for name, seeds in (("demo", [0, 1, 2]), ("mnist_label_swap", [0, 3, 4, 5]),
                        ("fmnist_label_permutation", [3, 4, 5])):
        base, rounds = run_auto.VAL[name]
        out.update({f"{name}_s{s}": run_auto.config(base, rounds, s, []) for s in seeds})
    out.update({f"tiny2_s{s}": tiny([0, 180], s) for s in (0, 11)})
    out.update({f"tiny4_s{s}": tiny([0, 90, 180, 270], s) for s in (0, 1, 2, 3)})
    out.update({f"rotated_mnist_4_s{s}": suite("rotated_mnist_4", s) for s in (0, 2)})
    out.update({f"cam_n_class_s{s}": suite("cam_n_class", s) for s in (0,)})
    return out


def run(name: str, cfg: dict[str, Any], out: Path) -> Path:
    target = out / name
    if (target / "summary.json").is_file():
        return target
    t0 = time.time()
    Experiment.from_config(apply_overrides(cfg, OFF), out_dir=target,
                           overwrite=True).run(progress=False)
    print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    return target


def classify(truth: np.ndarray, members: list[int], first: list[int]) -> str:
    if len(set(truth[members])) == 1:
        return "pure"
    second = sorted(set(members) - set(first))
    return "true cut" if not set(truth[first]) & set(truth[second]) else "mixed cut"


def check(target: Path) -> tuple[Counter[tuple[str, bool]], list[str]]:
    truth = np.asarray(read_summary(target).true_clusters)
    counts: Counter[tuple[str, bool]] = Counter()
    notes = []
    for r in read_history(target):
        e = r.extras
        for k, node in enumerate(e["clusters"]):
            reason, cand, formed = e["refused"][k], e["candidate"][k], e["formed_separation"][k]
            if reason is not None and not str(reason).startswith("patience"):
                continue
            if cand is None or formed is None or str(reason).endswith("/6"):
                continue
            members = _members(r, e, k)
            if min(len(cand), len(members) - len(cand)) < 2:
                continue
            kind = classify(truth, members, cand)
            passes = e["separation"][k] > formed
            counts[(kind, passes)] += 1
            if (kind != "pure") != passes or reason is None:
                notes.append(f"round {r.round} node {node} {kind} {len(cand)}|"
                             f"{len(members) - len(cand)}: {e['separation'][k]:.2f} vs formed "
                             f"{formed:.2f} -> {'passes' if passes else 'refused'}"
                             f"{' (split here)' if reason is None else ''}")
    return counts, notes


def _members(r: Any, e: dict[str, Any], k: int) -> list[int]:
    """The answering clients of cluster `k` of this round: with every client answering,
    the clients the round's assignment puts in the node (before a split in this round, the
    node's own clients)."""
    node = e["clusters"][k]
    before = [c for c, v in enumerate(r.assignment or []) if v == node]
    if before:
        return before
    ev = next(x for x in e["splits"] if x["node"] == node and x["accepted"])
    return sorted(c for g in ev["groups"] for c in g)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--out", default=str(HERE.parent / "runs" / "cfl-nesting"))
    p.add_argument("--table", action="store_true", help="only read finished runs")
    a = p.parse_args()
    out = Path(a.out)
    total: Counter[tuple[str, bool]] = Counter()
    for name, cfg in runs().items():
        if a.only and name not in a.only:
            continue
        target = out / name
        if not a.table:
            run(name, cfg, out)
        if not (target / "summary.json").is_file():
            print(f"{name}: not run")
            continue
        counts, notes = check(target)
        total.update(counts)
        final = read_summary(target).final
        print(json.dumps({"run": name, "ari_without_nesting": final.ari,
                          "clusters": final.n_clusters,
                          **{f"{k}, {'passes' if v else 'refused'}": n
                             for (k, v), n in sorted(counts.items())}}))
        for line in notes:
            print("   ", line)
    print("total:", {f"{k}, {'passes' if v else 'refused'}": n
                     for (k, v), n in sorted(total.items())})


if __name__ == "__main__":
    main()
