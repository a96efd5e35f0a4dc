"""Reproduce CAM (Ma et al. 2023) Table 1/2 rows on Fashion-MNIST with clusterfl.

Every run combines `base.toml` (the paper's settings) with one setting and one method of
`suite.toml`, at a scale of `suite.toml` ("paper"; "medium", "reduced" and "small" for this
shared 2-core machine; "smoke" to check the pipeline), and writes:
- the run directory `OUT/<scale>/<setting>/<method>/seed<k>/` (history, summary, figures),
- `results/<scale>/<setting>/<method>_seed<k>.json` (final metrics, ARI, cluster balance,
  wall and CPU time),
- with `--table`, `results/<scale>/table.md` and `results/<scale>/table.json` (mean ± std
  over the seeds found, beside the paper's numbers).

Examples:
    python benchmarks/cam/run.py --scale small --settings cluster_n_class_k5 --seeds 0
    python benchmarks/cam/run.py --scale small --table
    python benchmarks/cam/run.py --scale reduced --set train.lr=0.01 \
        --settings cluster_dirichlet_k5 dirichlet_k5 --seeds 0      # see RESULTS.md
    python benchmarks/cam/run.py --scale reduced --normalize --tag _norm --seeds 0
        # the paper's lr 0.001 on standardized inputs (training mean and std)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.algorithms.common import KClusterExtras
from clusterfl.config import apply_overrides
from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import Source, load_source, standardize
from clusterfl.experiment import Experiment, History
from clusterfl.records import RoundMetrics
from clusterfl.report.figures import plot_comparison
from clusterfl.report.methods.cam import balance_series
from clusterfl.report.methods.cam import figures as cam_figures

HERE = Path(__file__).resolve().parent
CLUSTERED = ("ifca", "ifca_warm", "ifca_cam", "ifca_cam_mean", "fesem", "fesem_cam",
             "fesem_lam0001", "fesem_lam01", "fesem_cam_lam0001", "fesem_cam_lam01")


def load_suite() -> tuple[dict[str, Any], dict[str, Any]]:
    base = tomllib.loads((HERE / "base.toml").read_text())
    suite = tomllib.loads((HERE / "suite.toml").read_text())
    return base, suite


def subsample(source: Source, train_rows: int | None, test_rows: int | None,
              seed: int) -> Source:
    """The same number of random rows of every class (train and test), seeded."""
    rng = np.random.default_rng([seed, 20230])

    def pick(y: torch.Tensor, total: int | None) -> torch.Tensor:
        if total is None or total >= len(y):
            return torch.arange(len(y))
        labels = y.numpy()
        per = total // source.n_classes
        rows = [rng.permutation(np.flatnonzero(labels == k))[:per]
                for k in range(source.n_classes)]
        return torch.from_numpy(np.sort(np.concatenate(rows)))

    tr, te = pick(source.y_train, train_rows), pick(source.y_test, test_rows)
    return replace(source, x_train=source.x_train[tr], y_train=source.y_train[tr],
                   x_test=source.x_test[te], y_test=source.y_test[te])


def run_config(base: dict[str, Any], suite: dict[str, Any], setting: str, method: str,
               scale: str, seed: int, overrides: list[str] = ()) -> dict[str, Any]:
    """The full config dict of one run."""
    s, sc = suite["settings"][setting], suite["scales"][scale]
    raw = json.loads(json.dumps(base))
    raw["seed"], raw["rounds"] = seed, int(sc.get("rounds", base["rounds"]))
    raw = apply_overrides(raw, list(overrides))
    raw["scenario"] = {**s["scenario"],
                       "n_clients": int(sc.get("n_clients", base["scenario"]["n_clients"]))}
    algo = dict(suite["methods"][method])
    for key, value in list(algo.items()):
        if value == "K":
            algo[key] = int(s["K"])
        elif value == "auto":
            algo[key] = round(0.3 * raw["rounds"])
    raw["algorithm"] = algo
    return raw


def build_federation(raw: dict[str, Any], scale: dict[str, Any], seed: int,
                     normalize: bool = False) -> Federation:
    source = load_source(raw["data"]["source"], raw["data"].get("data_dir"))  # $CLUSTERFL_DATA
    source = subsample(source, scale.get("train_rows"), scale.get("test_rows"), seed)
    # --normalize alone decides (base.toml's data.standardize is for runs of base.toml on its
    # own), so the commands of RESULTS.md keep giving what they gave
    if normalize:
        source = standardize(source)
    scen = dict(raw["scenario"])
    name = scen.pop("name")
    fed = make_federation(source, name, scen, seed=seed)
    fed.meta["standardized"] = normalize
    return fed


def final_record(history: History) -> dict[str, Any]:
    recs = history.records
    _, largest, _ = balance_series(recs)
    final = history.final
    m = final.metrics or RoundMetrics()
    return {
        "accuracy": m.accuracy, "macro_f1": m.macro_f1,
        "accuracy_weighted": m.accuracy_weighted, "ari": final.ari,
        "n_clusters": final.n_clusters, "floats_down": final.floats_down,
        "floats_up": final.floats_up,
        "largest_cluster_share_final": float(largest[-1]) if len(largest) else None,
        "largest_cluster_share_max": float(np.nanmax(largest)) if len(largest) else None,
        "cluster_sizes_final": KClusterExtras.from_dict(recs[-1].extras).cluster_sizes
        if recs and KClusterExtras.matches(recs[-1].extras) else None,  # None: no K clusters
        "accuracy_curve": [[r.round, r.metrics.accuracy, r.metrics.macro_f1]
                           for r in recs if r.metrics is not None],
    }


def run_one(base: dict[str, Any], suite: dict[str, Any], setting: str, method: str,
            scale: str, seed: int, out: Path, fed: Federation, overrides: list[str] = (),
            tag: str = "") -> dict[str, Any]:
    raw = run_config(base, suite, setting, method, scale, seed, overrides)
    label = scale + tag
    run_dir = out / label / setting / method / f"seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    wall, cpu = time.perf_counter(), time.process_time()
    raw["data"]["standardize"] = bool(fed.meta.get("standardized", False))  # in config.toml
    history = Experiment.from_config(raw, out_dir=run_dir, federation=fed).run(progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    figs = cam_figures(run_dir, history.records, history.summary) if method in CLUSTERED else []
    result = {"setting": setting, "method": method, "seed": seed, "scale": scale,
              "overrides": list(overrides), "lr": raw["train"]["lr"],
              "normalize": fed.meta.get("standardized", False),
              "n_clients": fed.n_clients, "rounds": raw["rounds"],
              "warmup_rounds": raw["algorithm"].get("warmup_rounds", 0),
              "wall_time_s": round(wall, 1), "cpu_time_s": round(cpu, 1),
              "run_dir": str(run_dir), **final_record(history)}
    res_dir = HERE / "results" / label / setting
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / f"{method}_seed{seed}.json").write_text(json.dumps(result, indent=1))
    fig_dir = HERE / "figures"
    fig_dir.mkdir(exist_ok=True)
    for f in [run_dir / "figures" / "cluster_sizes.png", *figs]:
        if f.is_file() and method in CLUSTERED and seed == 0:
            shutil.copy(f, fig_dir / f"{label}_{setting}_{method}_{f.name}")
    return result


def _fmt(values: list[float]) -> str:
    v = [100 * x for x in values if x is not None]
    if not v:
        return "–"
    return f"{np.mean(v):.1f}" if len(v) == 1 else f"{np.mean(v):.1f} ± {np.std(v):.1f}"


def write_table(suite: dict[str, Any], scale: str) -> None:
    """Aggregate results/<scale+tag>/**.json into table.md and table.json (mean ± std)."""
    root = HERE / "results" / scale
    rows, lines = [], []
    for setting, s in suite["settings"].items():
        found = sorted((root / setting).glob("*_seed*.json")) if (root / setting).is_dir() else []
        if not found:
            continue
        lines += [f"\n**{setting}** (K = {s['K']})\n",
                  "| method | seeds | accuracy | macro-F1 | paper acc. | paper F1 | ARI | "
                  "largest cluster (final / max) | CPU s / run |",
                  "|---|---|---|---|---|---|---|---|---|"]
        extra = [m for m in suite["methods"] if m not in s["methods"]]  # e.g. the λ search
        for method in [*s["methods"], *extra]:
            res = [json.loads(p.read_text()) for p in found
                   if p.name.rsplit("_seed", 1)[0] == method]
            if not res:
                continue
            paper = s.get("paper", {}).get(method, [None, None])
            ari = [r["ari"] for r in res if r["ari"] is not None]
            row = {"setting": setting, "method": method, "seeds": [r["seed"] for r in res],
                   "accuracy": [r["accuracy"] for r in res],
                   "macro_f1": [r["macro_f1"] for r in res], "ari": ari,
                   "paper": paper,
                   "largest_final": [r["largest_cluster_share_final"] for r in res],
                   "largest_max": [r["largest_cluster_share_max"] for r in res],
                   "cpu_s": [r["cpu_time_s"] for r in res]}
            rows.append(row)
            largest = (f"{np.mean(row['largest_final']):.2f} / {np.mean(row['largest_max']):.2f}"
                       if method in CLUSTERED else "–")
            p_acc, p_f1 = ("–" if v is None else v for v in paper)
            ari_cell = f"{np.mean(ari):.2f}" if ari and method in CLUSTERED else "–"
            lines.append(
                f"| {method} | {len(res)} | {_fmt(row['accuracy'])} | {_fmt(row['macro_f1'])} | "
                f"{p_acc} | {p_f1} | {ari_cell} | {largest} | "
                f"{np.mean(row['cpu_s']):.0f} |")
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text("\n".join(lines).lstrip() + "\n")
    (root / "table.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


def write_comparisons(suite: dict[str, Any], label: str, out: Path, seed: int = 0) -> None:
    """Accuracy and ARI per round of every method of a setting (one seed) in one figure:
    `figures/<label>_<setting>_accuracy_compare.png` and `..._ari_compare.png`."""
    fig_dir = HERE / "figures"
    for setting, s in suite["settings"].items():
        methods = [*s["methods"], *(m for m in suite["methods"] if m not in s["methods"])]
        runs = [(m, out / label / setting / m / f"seed{seed}") for m in methods]
        runs = [(m, d) for m, d in runs if (d / "summary.json").is_file()]  # finished runs
        results = HERE / "results" / label / setting
        recorded = [m for m in methods if (results / f"{m}_seed{seed}.json").is_file()]
        target = fig_dir / f"{label}_{setting}_seed{seed}_accuracy_compare.png"
        if len(runs) < len(recorded) and target.is_file():
            # run folders are not committed: a fresh checkout has only the newest runs, and a
            # figure of those alone must not replace the committed one of the whole setting
            print(f"{setting}: kept {target.name} ({len(runs)} of {len(recorded)} seed-{seed} "
                  "runs have their folders here)")
            continue
        if len(runs) < 2:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for path in plot_comparison([d for _, d in runs], tmp, [m for m, _ in runs])[:2]:
                shutil.copy(path, fig_dir / f"{label}_{setting}_seed{seed}_{path.name}")


def main(argv: list[str] | None = None) -> int:
    base, suite = load_suite()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="small", choices=sorted(suite["scales"]))
    p.add_argument("--settings", nargs="*", default=["cluster_n_class_k5"])
    p.add_argument("--methods", nargs="*", default=None, help="default: the setting's list")
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--out", default="runs/cam")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="config override key=value (e.g. train.lr=0.01), applied to every run")
    p.add_argument("--tag", default="", help="suffix of the result directory (scale + tag)")
    p.add_argument("--normalize", action="store_true",
                   help="standardize the inputs (training mean and std per channel)")
    p.add_argument("--table", action="store_true", help="only aggregate existing results")
    p.add_argument("--resume", action="store_true",
                   help="skip runs whose result JSON (results/<scale+tag>/<setting>/"
                        "<method>_seed<k>.json, written when a run has finished) exists")
    args = p.parse_args(argv)
    if args.table:
        write_table(suite, args.scale + args.tag)
        write_comparisons(suite, args.scale + args.tag, Path(args.out))
        return 0
    torch.set_num_threads(args.threads)
    scale = suite["scales"][args.scale]
    for seed in args.seeds:
        for setting in args.settings:
            methods = args.methods or suite["settings"][setting]["methods"]
            if args.resume:
                done = HERE / "results" / (args.scale + args.tag) / setting
                skipped = [m for m in methods if (done / f"{m}_seed{seed}.json").is_file()]
                if skipped:
                    print(f"{setting} seed{seed}: finished, skipped: {' '.join(skipped)}",
                          flush=True)
                methods = [m for m in methods if m not in skipped]
                if not methods:
                    continue
            raw = run_config(base, suite, setting, methods[0], args.scale, seed, args.overrides)
            fed = build_federation(raw, scale, seed, args.normalize)
            for method in methods:
                r = run_one(base, suite, setting, method, args.scale, seed, Path(args.out), fed,
                            args.overrides, args.tag)
                print(f"{setting} seed{seed} {method}: acc {r['accuracy']:.4f} "
                      f"f1 {r['macro_f1']:.4f} ari {r['ari']} largest "
                      f"{r['largest_cluster_share_final']} cpu {r['cpu_time_s']}s "
                      f"wall {r['wall_time_s']}s", flush=True)
    write_table(suite, args.scale + args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
