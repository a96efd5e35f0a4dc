"""Issue 36's transfer grid: every method that chooses its number of clusters, and the methods
that are given it, on the federations of `grid.toml`; one runner, one results table.

    export CLUSTERFL_DATA=...   # MNIST, Fashion-MNIST (digits, the regressions: built in)
    python benchmarks/transfer/run_grid.py dev --version V [--fed NAME ...] [--method M ...]
                                               [--set METHOD:KEY=VALUE ...] [--jobs 2]
    python benchmarks/transfer/run_grid.py val --version V [--jobs 2]
    python benchmarks/transfer/run_grid.py val2 --version V [--method M ...] [--jobs 2]
                                               (val3, val4, ...: the later halves, alike)
    python benchmarks/transfer/run_grid.py --table [--version V ...]  # markdown, for RESULTS.md
    python benchmarks/transfer/run_grid.py --grid                     # the grid, markdown

`dev` runs the development half (any federation, method and setting, as often as wanted);
`val` (`val2`: the second validation half, drawn later by `draw_validation.py`) runs the whole
validation half with every method's defaults, once per version: it refuses
`--set`, a subset of federations, and a method that has validation rows of the version
already; `--preset v0` runs the defaults from before issue 36 (written as settings of today's
code, `PRESETS`), for the comparison. A version names the rules
as the code stands (the commit is recorded with every row; a validation run also refuses a
working tree with changes under src/).

Each run appends one JSON line to `results/runs.jsonl`: version, half, federation, method,
settings, the true K, the K found, ARI, final mean client accuracy, whether a cluster collapsed
(a method given K that ends with fewer non-empty clusters), the error when a method refuses the
federation, wall and CPU seconds, the commit, and its run folder under `runs/` (not in git:
every run folder holds the run's config.toml, history.jsonl and summary.json). A run whose
line is in the table already is skipped (resumable).

"K found" is the number of distinct clusters in the final assignment, except for CFL-GP, which
keeps K models and reports its Appendix-G estimate of K (`k_estimate`, the last one made).
Every federation fixes its participation: each method samples that share of the clients per
round (`algorithm.fraction`), the budget being the federation's; every clustering setting is
the method's default unless `--set` changes it (development only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GRID = tomllib.loads((HERE / "grid.toml").read_text())
TABLE = HERE / "results" / "runs.jsonl"
RUNS = HERE / "runs"

# label → (algorithm table, role). Roles: "auto" chooses K; "ref" is the same kind of method
# given the true K (the accuracy it is compared with); "given" is a method that always needs K.
METHODS: dict[str, tuple[dict[str, Any], str]] = {
    "fedavg": ({"name": "fedavg"}, "base"),
    "cfl": ({"name": "cfl"}, "auto"),
    "flhc": ({"name": "flhc"}, "auto"),
    "pacfl": ({"name": "pacfl"}, "auto"),
    "pca_km_hc": ({"name": "pca_km_hc"}, "auto"),
    "flt": ({"name": "flt"}, "auto"),
    "cfl_gp": ({"name": "cfl_gp"}, "auto"),
    "flhc_k": ({"name": "flhc"}, "ref"),
    "pacfl_k": ({"name": "pacfl"}, "ref"),
    "pca_km_hc_k": ({"name": "pca_km_hc"}, "ref"),
    "ifca_k": ({"name": "ifca"}, "given"),
    "fesem_k": ({"name": "fesem"}, "given"),
    "fedsoft_k": ({"name": "fedsoft"}, "given"),
    "cam_k": ({"name": "ifca_cam"}, "given"),
}
# Earlier defaults, written as settings of today's code (each is still an option): `--preset
# v0` runs the defaults from before issue 36 as the version "v0", `--preset v1` those of v1,
# `--preset v2` those of v2, and so on to `--preset v7` (CFL's rule changed in v2, v3, v5, v7
# and v8, FL+HC's in v4 and v6, no other method's after v1). A default that changes later
# goes back into every earlier preset (BEFORE_V7, BEFORE_V8: the presets before v7 ran with
# the progress condition off and sampled rounds pooled, today's defaults, not their own).
BEFORE_V8 = ["algorithm.auto.sampled_evidence=each"]  # v8 (CFL rule v7) pooled sampled rounds
BEFORE_V7 = ["algorithm.auto.progress=0.05", *BEFORE_V8]  # v7 (CFL rule v6): progress off
V1_CFL = ["algorithm.auto.progress_from=first", "algorithm.auto.contrast_min=0",
          "algorithm.auto.significance=0.05", "algorithm.auto.significance_sampled=0.05",
          *BEFORE_V7]
V2_CFL = ["algorithm.auto.contrast_min=0.5", "algorithm.auto.significance=0.05",
          "algorithm.auto.significance_sampled=0.05", *BEFORE_V7]
V3_CFL = ["algorithm.auto.significance=0.01", *BEFORE_V7]  # v3, v4: one level, sampled or not
V1_FLHC = ["algorithm.significance=0"]  # FL+HC's rule v1: the silhouette bound everywhere
# FL+HC's rule v3: the test of the update cosines, alone, at 0.002 (v11: its rule v4, the
# test of the rows of update distances and the bound; v12: rule v3 again, the default)
V3_FLHC = ["algorithm.tested=cosines"]
V2_FLHC = ["algorithm.significance=0.01", *V3_FLHC]  # FL+HC's rule v2: the test at 0.01
V1_FLT = ["algorithm.auto_on=relatedness", "algorithm.significance=0"]  # FLT's rule v1
V1_PCA = ["algorithm.significance=0"]  # PCA+kM+HC's rule v1: the silhouette bound alone
V1_PACFL = ["algorithm.significance=0"]  # PACFL's rule v1 (v13: its rule v2, the shuffle test)
PRESETS: dict[str, dict[str, list[str]]] = {
    "v0": {
        "cfl": ["algorithm.auto.cut=raw", "algorithm.auto.nesting=true",
                "algorithm.auto.test_every=false", *V1_CFL],
        "flhc": ["algorithm.auto_cut=gap"],
        "flhc_k": [], "pacfl_k": [], "pca_km_hc_k": [],
        "pacfl": ["algorithm.threshold=3.5"],
        "pca_km_hc": ["algorithm.auto_clusters=gap"],
        "flt": ["algorithm.auto_clusters=gap"],
        "cfl_gp": ["algorithm.k_min_silhouette=-1"],
    },
    # v1's CFL rule where v2 and v3 changed it (progress against the first round's loss, no
    # contrast bound, the test at 0.05); FL+HC's bound, which v4 replaced by a test; the
    # other methods' rules are the same in v1-v4
    "v1": {"cfl": V1_CFL, "flhc": V1_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v2's CFL rule where v3 changed it (the contrast bound 0.5, the test at 0.05)
    "v2": {"cfl": V2_CFL, "flhc": V1_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v3: CFL's one level 0.01, FL+HC's rule v1
    "v3": {"cfl": V3_CFL, "flhc": V1_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v4: CFL's one level 0.01 (v5: 0.002 where every client of the cluster answered),
    # FL+HC's rule v2
    "v4": {"cfl": V3_CFL, "flhc": V2_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v5: CFL's rule v5 (two levels), FL+HC's rule v2 (v6: its test at 0.002)
    "v5": {"cfl": BEFORE_V7, "flhc": V2_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA,
           "pacfl": V1_PACFL},
    # v6: CFL's rule v5, with the progress condition (v7: off, CFL's rule v6)
    "v6": {"cfl": BEFORE_V7, "flhc": V3_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA,
           "pacfl": V1_PACFL},
    # v7: CFL's rule v6, each sampled round at its own level (v8: combined, CFL's rule v7)
    "v7": {"cfl": BEFORE_V8, "flhc": V3_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA,
           "pacfl": V1_PACFL},
    # v8: FLT's rule v1 (v9: the signatures' distances with the shuffle test, FLT's rule v2)
    "v8": {"flhc": V3_FLHC, "flt": V1_FLT, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v9: PCA+kM+HC's rule v1 (v10: the shuffle test of its distance rows, its rule v2)
    "v9": {"flhc": V3_FLHC, "pca_km_hc": V1_PCA, "pacfl": V1_PACFL},
    # v10: FL+HC's rule v3 (v11: the test of the rows of update distances and the bound, its
    # rule v4; CFL-GP's estimate unchanged, its candidates were not kept)
    "v10": {"flhc": V3_FLHC, "pacfl": V1_PACFL},
    # v11: FL+HC's rule v4 (v12: back to rule v3 after v11's validation run, the v10 rules)
    "v11": {"flhc": ["algorithm.tested=distance_rows"], "pacfl": V1_PACFL},
    # v12: PACFL's rule v1 (v13: the bound and the shuffle test of its angles, its rule v2)
    "v12": {"pacfl": V1_PACFL},
    # v13: PACFL's rule v2 (v14: rule v1 again after v13's validation run, the v12 rules)
    "v13": {"pacfl": ["algorithm.significance=0.002"]},
}
VAL_HALVES = sorted({"val" + f["half"][len("validation"):] for f in GRID["federation"].values()
                     if f["half"].startswith("validation")})
"""`val`, `val2`, ...: the validation halves of grid.toml, by the run command's name."""
K_FIELD = {"fedsoft": "n_clusters", "ifca": "n_clusters", "fesem": "n_clusters",
           "ifca_cam": "n_clusters", "flhc": "n_clusters", "pacfl": "n_clusters",
           "pca_km_hc": "n_clusters"}


def code_root() -> Path:
    """The checkout whose clusterfl runs (PYTHONPATH may point at another one, e.g. a
    worktree of an earlier commit to run an earlier version of the rules)."""
    import clusterfl

    return Path(clusterfl.__file__).resolve().parents[2]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code_root(), text=True,
                         capture_output=True, check=False)
    return out.stdout.strip() or "unknown"


def src_dirty() -> bool:
    out = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=code_root(),
                         text=True, capture_output=True, check=False)
    return bool(out.stdout.strip())


def config(fed: dict[str, Any], method: str, sets: list[str],
           preset: str | None = None) -> dict[str, Any] | None:
    """The run's configuration, or None when the method does not apply (a method given K on a
    federation without structure: K = 1 is FedAvg)."""
    from clusterfl.config import apply_overrides

    algo, role = METHODS[method]
    algo = dict(algo)
    if role in ("ref", "given"):
        if fed["k"] < 2:
            return None
        algo[K_FIELD[algo["name"]]] = fed["k"]
    algo["fraction"] = fed["participation"]
    if algo["name"] == "flt":
        algo["encoder_dir"] = str(RUNS / "encoders")
    raw = {"seed": fed["seed"], "rounds": fed["rounds"], "eval_every": fed["rounds"],
           "checkpoint_every": 0, "data": {"source": fed["source"]},
           "scenario": dict(fed["scenario"]), **GRID["train"][fed["train"]],
           "algorithm": algo, "backend": {"name": "simulation"},
           "output": {"figures": False, "progress": "off"}}
    mine = [s.split(":", 1)[1] for s in sets if s.split(":", 1)[0] == method]
    return apply_overrides(raw, PRESETS.get(preset or "", {}).get(method, []) + mine)


def run_one(version: str, half: str, name: str, method: str, sets: list[str],
            rev: str, preset: str | None = None) -> dict[str, Any] | None:
    import torch

    from clusterfl.errors import ConfigError
    from clusterfl.experiment import Experiment

    torch.set_num_threads(1)
    fed = GRID["federation"][name]
    cfg = config(fed, method, sets, preset)
    if cfg is None:
        return None
    folder = RUNS / version / name / method
    row: dict[str, Any] = {"version": version, "half": half, "federation": name,
                           "method": method, "role": METHODS[method][1],
                           "sets": [s for s in sets if s.startswith(method + ":")],
                           "k_true": fed["k"], "seed": fed["seed"], "commit": rev,
                           "preset": preset,
                           "folder": str(folder.relative_to(ROOT))}
    t0, c0 = time.time(), time.process_time()
    try:
        exp = Experiment.from_config(cfg, out_dir=folder, overwrite=True)
        history = exp.run(progress=False)
    except ConfigError as exc:  # the method refuses this federation: recorded, not hidden
        row.update(error=str(exc), k_found=None, ari=None, accuracy=None, collapsed=None)
        return row
    last = history.records[-1]
    labels = [a for a in last.assignment if a >= 0]
    k_found = len(set(labels))
    if METHODS[method][0]["name"] == "cfl_gp":
        estimates = [r.extras.get("k_estimate") for r in history.records]
        estimates = [e for e in estimates if e is not None]
        row["k_models"] = k_found
        k_found = estimates[-1] if estimates else None
    row.update(
        error=None, k_found=k_found, ari=last.ari,
        accuracy=finite_mean(history.summary.client_accuracy),
        mse=finite_mean(last.client_mse),  # the regressions' measure (accuracy: None)
        collapsed=(k_found < fed["k"]) if METHODS[method][1] == "given" else None,
        wall_s=round(time.time() - t0, 1), cpu_s=round(time.process_time() - c0, 1))
    return row


def keep(version: str) -> int:
    """Copy each run folder's config.toml and summary.json of `version` into
    `results/runs/<version>` (kept in git; the folders are not), paths under the checkout
    written relative to it (no path of one machine in the repository). Returns the files."""
    n = 0
    for folder in sorted((RUNS / version).glob("*/*")):
        for name in ("config.toml", "summary.json"):
            src = folder / name
            if not src.exists():
                continue
            dest = HERE / "results" / "runs" / folder.relative_to(RUNS) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(src.read_text().replace(f"{ROOT}/", ""))
            n += 1
    return n


def finite_mean(values: list[float | None] | None) -> float | None:
    """The mean of the finite values, None when there is none (a regression has no accuracy)."""
    xs = [float(v) for v in values or [] if v is not None and math.isfinite(float(v))]
    return sum(xs) / len(xs) if xs else None


def done_keys() -> set[tuple[str, str, str, tuple[str, ...]]]:
    if not TABLE.exists():
        return set()
    return {(r["version"], r["federation"], r["method"], tuple(r["sets"]))
            for r in map(json.loads, TABLE.read_text().splitlines())}


def run(args: argparse.Namespace) -> None:
    half = "development" if args.half == "dev" else "validation" + args.half[3:]
    if half.startswith("validation"):
        if args.set or args.fed or args.seen:
            sys.exit("run_grid.py: error: a validation run takes no --set, --fed or --seen (a "
                     "preset of earlier defaults, --preset, and a subset of methods are "
                     "allowed)")
        if src_dirty():
            sys.exit("run_grid.py: error: src/ has uncommitted changes; a validation run "
                     "needs a committed rule version")
        wanted = set(args.method or METHODS)
        seen = {r["method"] for r in map(json.loads, TABLE.read_text().splitlines())
                if r["version"] == args.version and r["half"] == half} \
            if TABLE.exists() else set()
        if wanted & seen:
            sys.exit(f"run_grid.py: error: version {args.version!r} has validation rows of "
                     f"{', '.join(sorted(wanted & seen))} already; a change makes a new "
                     "version")
    halves = [half] if half != "development" else [half, *(args.seen or [])]
    names = [n for n, f in GRID["federation"].items() if f["half"] in halves]
    for n in args.fed or []:
        if n not in names:
            sys.exit(f"run_grid.py: error: --fed {n!r} is not in the {' / '.join(halves)} "
                     "half; allowed: "
                     + ", ".join(names))
    names = args.fed or names
    methods = args.method or list(METHODS)
    for m in methods:
        if m not in METHODS:
            sys.exit(f"run_grid.py: error: --method {m!r}; allowed: {', '.join(METHODS)}")
    done = done_keys()
    rev = commit() + ("+dirty" if src_dirty() else "")
    todo = [(n, m) for n in names for m in methods
            if (args.version, n, m, tuple(s for s in args.set if s.startswith(m + ":")))
            not in done]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, args.version, half, n, m, args.set, rev,
                               args.preset): (n, m) for n, m in todo}
        for fut in as_completed(futures):
            n, m = futures[fut]
            try:
                row = fut.result()
            except Exception as exc:  # recorded: a crash is a result too
                row = {"version": args.version, "half": half, "federation": n, "method": m,
                       "role": METHODS[m][1], "sets": [], "k_true": GRID["federation"][n]["k"],
                       "commit": rev, "error": f"{type(exc).__name__}: {exc}",
                       "k_found": None, "ari": None, "accuracy": None, "collapsed": None}
            if row is None:
                continue
            with TABLE.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            ari, acc = row["ari"], row["accuracy"]
            print(f"{n:22s} {m:12s} K {row['k_true']} → {row['k_found']}  ARI "
                  f"{ari if ari is None else round(ari, 2)}  acc "
                  f"{acc if acc is None else round(100 * acc, 1)}"
                  f"{'  ' + row['error'][:90] if row.get('error') else ''}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("half", nargs="?", choices=["dev", *VAL_HALVES],
                   help="valN: the validation half validationN (val2 on: drawn later by "
                   "draw_validation.py)")
    p.add_argument("--version", help="the rule version these runs belong to")
    p.add_argument("--fed", nargs="*", help="dev only: some federations of the half")
    p.add_argument("--method", nargs="*", help=f"dev only: some of {', '.join(METHODS)}")
    p.add_argument("--set", nargs="*", default=[], help="dev only: METHOD:KEY=VALUE")
    p.add_argument("--seen", nargs="*",
                   choices=["validation" + h[3:] for h in VAL_HALVES],
                   help="dev only: also these validation halves, whose runs of an earlier "
                   "version have been seen (development material for a later version)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="earlier defaults, as settings")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--table", action="store_true", help="print the markdown tables")
    p.add_argument("--grid", action="store_true", help="print the grid as a markdown table")
    p.add_argument("--keep", action="store_true", help="with --version: copy its runs' "
                   "config.toml and summary.json into results/runs (for git)")
    args = p.parse_args()
    if args.grid:
        from tables import print_grid

        print_grid(GRID)
        return
    if args.keep:
        if not args.version:
            p.error("--keep needs --version")
        print(f"{keep(args.version)} files kept in results/runs/{args.version}")
        return
    if args.table:
        from tables import print_tables  # benchmarks/transfer/tables.py

        print_tables(TABLE, [args.version] if args.version else None)
        return
    if not args.half or not args.version:
        p.error("give dev or val and --version (or --table)")
    run(args)


if __name__ == "__main__":
    main()
