"""CFL's default split rule (`split_rule = "auto"`): the one runner of its development and
validation runs, and their table.

    export CLUSTERFL_DATA=...   # MNIST / Fashion-MNIST folder (digits is built in)
    OMP_NUM_THREADS=1 python benchmarks/cfl/run_auto.py dev [NAME ...] [--set KEY=VALUE ...]
    OMP_NUM_THREADS=1 python benchmarks/cfl/run_auto.py val [NAME ...]
    python benchmarks/cfl/run_auto.py --table [BATCH ...]     # markdown table of finished runs

`dev` runs the development federations on the development seeds of `seeds.toml` (or
`--seeds`, any development seed); `val` runs the validation federations on the validation
seeds of `seeds.toml` with the defaults only (nothing is set per federation) and refuses a
development seed. Every run appends one line of JSON to `results/auto_rule.jsonl` (the one
results table of this question): `batch` (`auto_<set><tag>`; the earlier sessions' batches
keep the names of the files they were once written to, which RESULTS.md cites), the
federation, seed, settings, final ARI and number of clusters, the accepted splits, accuracy,
CPU and wall time. Resumable: a run whose line is in the table already is skipped.
The `tiny_*` federations are the unit tests' kind (8 clients of the built-in digits, 40
rounds).
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.config import apply_overrides
from clusterfl.experiment import Experiment
from clusterfl.records import RoundRecord

HERE = Path(__file__).resolve().parent
TABLE = HERE / "results" / "auto_rule.jsonl"
SEEDS = tomllib.loads((HERE / "seeds.toml").read_text())

DIGITS_MLP = {"model": {"name": "mlp", "hidden": [64]},
              "train": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.5, "batch_size": 16,
                        "epochs": 1}}
"""The demo's model and local training (src/clusterfl/configs/demo.toml)."""

LENET = {"model": {"name": "lenet"},
         "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 100,
                   "epochs": 3}}
"""The CFL benchmarks' model and local training (label_swap_mnist.toml, RESULTS.md)."""

SIZES = {"n_train_per_client": 300, "n_test_per_client": 300}

# name → (base config, rounds, truth the rule should find: "clusters" or "none")
DEV: dict[str, tuple[dict[str, Any], int]] = {
    # the demo's federation on other seeds than the demo's (seed 0)
    "digits_rotation4": ({"data": {"source": "digits"}, **DIGITS_MLP,
                          "scenario": {"name": "rotation", "n_clients": 20,
                                       "angles": [0, 90, 180, 270]}}, 60),
    # the same without rotations: one cluster
    "digits_rotation1": ({"data": {"source": "digits"}, **DIGITS_MLP,
                          "scenario": {"name": "rotation", "n_clients": 20, "angles": [0]}}, 60),
    "digits_label_swap": ({"data": {"source": "digits"}, **DIGITS_MLP,
                           "scenario": {"name": "label_swap", "n_clients": 20,
                                        "n_clusters": 4}}, 60),
    # added after the first validation run (seed 0) failed on it: seen, so development data
    "mnist_label_swap": None,  # type: ignore[dict-item]  # filled in below (VAL's config)
}
TINY_MLP = {"model": {"name": "mlp", "hidden": [32]},
            "train": {"lr": 0.1, "momentum": 0.5, "batch_size": 16, "epochs": 1}}
for _name, _angles in (("tiny_rotation2", [0, 180]), ("tiny_rotation1", [0]),
                       ("tiny_rotation4", [0, 90, 180, 270])):
    DEV[_name] = ({"data": {"source": "digits"}, **TINY_MLP,
                   "scenario": {"name": "rotation", "n_clients": 8, "angles": _angles}}, 40)
DEV_SEEDS: list[int] = SEEDS["development"]["seeds"]

VAL: dict[str, tuple[dict[str, Any], int]] = {
    "demo": ({"data": {"source": "digits"}, **DIGITS_MLP,
              "scenario": {"name": "rotation", "n_clients": 20,
                           "angles": [0, 90, 180, 270]}}, 60),
    "mnist_label_swap": ({"data": {"source": "mnist"}, **LENET,
                          "scenario": {"name": "label_swap", "n_clients": 20, "n_clusters": 4,
                                       **SIZES}}, 50),
    "fmnist_label_permutation": ({"data": {"source": "fashion_mnist"}, **LENET,
                                  "scenario": {"name": "label_permutation", "n_clients": 20,
                                               "n_clusters": 4, **SIZES}}, 50),
    "mnist_iid": ({"data": {"source": "mnist"}, **LENET,
                   "scenario": {"name": "iid", "n_clients": 20, **SIZES}}, 100),
    "fmnist_iid": ({"data": {"source": "fashion_mnist"}, **LENET,
                    "scenario": {"name": "iid", "n_clients": 20, **SIZES}}, 100),
    # §V-B / Fig. 8: congruent (0-4 vs 5-9) and incongruent (each client swaps a label pair)
    "fig8_congruent": ({"data": {"source": "mnist"}, **LENET,
                        "scenario": {"name": "cluster_labels", "n_clients": 2, "n_clusters": 2,
                                     "class_sets": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
                                     "samples_per_client": 500}}, 100),
    "fig8_incongruent": ({"data": {"source": "mnist"}, **LENET,
                          "scenario": {"name": "label_swap", "n_clients": 2, "n_clusters": 2,
                                       "n_train_per_client": 500,
                                       "n_test_per_client": 500}}, 100),
}
VAL_SEEDS: list[int] = SEEDS["validation"]["seeds"]
DEV["mnist_label_swap"] = VAL["mnist_label_swap"]  # dev on seed 0 only (--seeds 0)
# issue 22, fourth session: the pair rule was built on the Fig. 8 pairs' seed 10 (dev seeds)
DEV["fig8_congruent"] = VAL["fig8_congruent"]
DEV["fig8_incongruent"] = VAL["fig8_incongruent"]


def config(base: dict[str, Any], rounds: int, seed: int, sets: list[str]) -> dict[str, Any]:
    raw = {**base, "seed": seed, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
           "backend": {"name": "simulation"}, "algorithm": {"name": "cfl"},
           "output": {"figures": False, "progress": "off"}}
    return apply_overrides(raw, sets)


def splits(records: list[RoundRecord]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        for ev in r.extras.get("splits", []):
            if ev["accepted"]:
                out.append({"round": r.round, "node": ev["node"],
                            "sizes": [len(g) for g in ev["groups"]],
                            "ari_after": r.ari})
    return out


def run_one(name: str, base: dict[str, Any], rounds: int, seed: int, sets: list[str],
            out: Path) -> dict[str, Any]:
    cfg = config(base, rounds, seed, sets)
    t0, c0 = time.time(), time.process_time()
    # a folder left by an interrupted run (its row was never written) is started again
    exp = Experiment.from_config(cfg, out_dir=out / f"{name}_s{seed}", overwrite=True)
    history = exp.run(progress=False)
    recs = history.records
    last = recs[-1]
    acc = history.summary.client_accuracy
    row = {
        "name": name, "seed": seed, "rounds": rounds, "sets": sets,
        "ari": last.ari, "n_clusters": last.n_clusters,
        "true_clusters": len(set(history.summary.true_clusters or [])),
        "splits": splits(recs),
        "accuracy": None if acc is None else float(np.nanmean(np.array(acc, dtype=float))),
        "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def table(batches: list[str]) -> None:
    """One markdown row per (batch, federation, settings), seeds side by side; when a run is
    in a batch twice, the last line counts."""
    groups: dict[tuple[str, str, tuple[str, ...]], dict[int, dict[str, Any]]] = {}
    for r in map(json.loads, TABLE.read_text().splitlines()):
        if not batches or r["batch"] in batches:
            groups.setdefault((r["batch"], r["name"], tuple(r["sets"])), {})[r["seed"]] = r
    print("| batch | federation | settings | seeds | ARI per seed | clusters | splits (round: "
          "sizes) | mean accuracy | CPU / wall s per run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (batch, name, sets), by_seed in groups.items():
        rs = [by_seed[s] for s in sorted(by_seed)]
        splits = "; ".join(
            f"s{r['seed']}: " + (", ".join(f"{x['round']} ({'/'.join(map(str, x['sizes']))})"
                                           for x in r["splits"]) or "none") for r in rs)
        acc = ", ".join("–" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}"
                        for r in rs)
        seeds = ", ".join(str(r["seed"]) for r in rs)
        aris = ", ".join(f"{r['ari']:.2f}" for r in rs)
        clusters = ", ".join(str(r["n_clusters"]) for r in rs)
        cost = ", ".join(f"{r['cpu_s']:.0f} / {r['wall_s']:.0f}" for r in rs)
        print(f"| {batch} | {name} | {' '.join(sets) or 'defaults'} | {seeds} | {aris} | "
              f"{clusters} | {splits} | {acc} % | {cost} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("set_name", nargs="?", choices=["dev", "val"])
    p.add_argument("names", nargs="*", help="federations of the set (default: all)")
    p.add_argument("--seeds", type=int, nargs="*", help="dev only: some development seeds")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   metavar="KEY=VALUE", help="override (dev only: the constants under test)")
    p.add_argument("--out", default="benchmarks/runs/cfl-auto",
                   help="run folders (git-ignored; default benchmarks/runs/cfl-auto)")
    p.add_argument("--tag", default="", help="appended to the batch name")
    p.add_argument("--table", nargs="*", metavar="BATCH",
                   help="print the table of the given batches (all when none) and stop")
    a = p.parse_args()
    if a.table is not None:
        table(a.table)
        return
    if a.set_name is None:
        p.error("give a set (dev or val) or --table")
    tables, seeds = (DEV, DEV_SEEDS) if a.set_name == "dev" else (VAL, VAL_SEEDS)
    if a.set_name == "val" and (a.sets or a.seeds is not None):
        p.error("the validation set runs with the defaults only, on the validation seeds of "
                "seeds.toml (a change of the rule gets new validation seeds there)")
    if a.seeds is not None:
        foreign = sorted(set(a.seeds) - set(DEV_SEEDS))
        if foreign:
            p.error(f"--seeds {foreign} are not development seeds (seeds.toml)")
        seeds = a.seeds
    if a.set_name == "val" and set(seeds) & set(DEV_SEEDS):
        p.error("seeds.toml lists a validation seed among the development seeds")
    batch = f"auto_{a.set_name}{a.tag}"
    done = {(r["batch"], r["name"], r["seed"], tuple(r["sets"]))
            for r in map(json.loads, TABLE.read_text().splitlines())} if TABLE.exists() else set()
    for name in a.names or list(tables):
        base, rounds = tables[name]
        for seed in seeds:
            if (batch, name, seed, tuple(a.sets)) in done:
                continue
            row = run_one(name, base, rounds, seed, a.sets, Path(a.out) / batch)
            with TABLE.open("a") as f:
                f.write(json.dumps({"batch": batch, **row}) + "\n")


if __name__ == "__main__":
    main()
