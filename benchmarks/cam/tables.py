"""Regenerate the generated tables of benchmarks/cam/RESULTS.md from the result JSONs.

RESULTS.md holds blocks between `<!-- tables.py:NAME -->` and `<!-- /tables.py -->`; this
script rewrites each block from `results/<label>/<setting>/<method>_seed<k>.json` (written by
run.py) and leaves the prose around them alone. Blocks:

- `settings:<label>`: one table per setting of the results folder `<label>` (e.g.
  `paper_mlp`): accuracy as the mean over clients of each client's own test accuracy (the
  metric of our other tables) and pooled over all test images (`accuracy_weighted`: every
  test image counts once, the paper's "micro accuracy" most likely), macro-F1, ARI beside the
  setting's ARI ceiling, the largest cluster's share, CPU seconds; rows the plan of
  `run_issue25.sh` still has to run are marked "pending".
- `lift`: CAM minus its baseline per regime and setting, paired by seed (mean ± std over
  seeds): IFCA-CAM (Eq. 6 and IFCA's cluster mean) against IFCA with independent
  initialisation and against IFCA warm-started like IFCA-CAM, FeSEM-CAM against FeSEM.
- `ceiling`: the ARI ceiling of each setting (clusterfl.metrics.ari_ceiling: clients holding
  the same set of classes have the same data distribution and must share a cluster).

The ceilings need the federations (`CLUSTERFL_DATA`); they are computed once with
`--ceiling` and kept in `results/ari_ceiling.json`, so the tables regenerate without data.

    python benchmarks/cam/tables.py --ceiling   # once (loads Fashion-MNIST)
    python benchmarks/cam/tables.py             # rewrite the blocks of RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CEILING = RESULTS / "ari_ceiling.json"
SETTINGS = ("cluster_n_class_k5", "cluster_dirichlet_k5", "dirichlet_k5", "cluster_n_class_k10")
NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "local": "Local", "ifca": "IFCA",
         "ifca_warm": "IFCA, warm-started", "ifca_cam": "IFCA-CAM (Eq. 6)",
         "ifca_cam_mean": "IFCA-CAM (cluster mean)", "fesem": "FeSEM", "fesem_cam": "FeSEM-CAM",
         "fedavg_plus": "FedAvg+", "fedprox_plus": "FedProx+"}
REGIMES = {"paper_mlp": "MLP, lr 0.001 (the paper's)", "paper_mlp_lr0.01": "MLP, lr 0.01",
           "paper_cnn": "small CNN, lr 0.001"}
ALL2 = ["fedavg", "ifca", "ifca_warm", "ifca_cam", "ifca_cam_mean", "fesem", "fesem_cam", "local"]
# what run_issue25.sh runs: {label: {setting: (methods, seeds)}}; marks the rows still pending
PLAN: dict[str, dict[str, tuple[list[str], list[int]]]] = {
    "paper_mlp": {"cluster_n_class_k5": (["ifca_warm"], [0, 1, 2]),
                  **{s: (["ifca_warm"], [0]) for s in SETTINGS[1:]}},
    "paper_mlp_lr0.01": {
        "cluster_n_class_k5": (ALL2, [0, 1, 2]),
        "cluster_dirichlet_k5": (ALL2[1:7], [0]),
        "dirichlet_k5": (ALL2, [0]),
        "cluster_n_class_k10": (["fedavg_plus", *ALL2[1:7], "local"], [0]),
    },
}
LIFTS = [("ifca_cam", "ifca"), ("ifca_cam", "ifca_warm"), ("ifca_cam_mean", "ifca"),
         ("ifca_cam_mean", "ifca_warm"), ("fesem_cam", "fesem")]


def load(label: str, setting: str) -> dict[str, dict[int, dict[str, Any]]]:
    """{method: {seed: result}} of one results folder and setting."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    folder = RESULTS / label / setting
    for path in sorted(folder.glob("*_seed*.json")) if folder.is_dir() else []:
        r = json.loads(path.read_text())
        out.setdefault(path.name.rsplit("_seed", 1)[0], {})[int(r["seed"])] = r
    return out


def pct(values: list[float | None], digits: int = 1) -> str:
    v = [100 * x for x in values if x is not None]
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{np.mean(v):.{digits}f} ± {np.std(v):.{digits}f}"


def ceilings() -> dict[str, Any]:
    return json.loads(CEILING.read_text()) if CEILING.is_file() else {}


def ceiling_cell(setting: str) -> str:
    c = ceilings().get(setting)
    if not c:
        return "not computed (`--ceiling`)"
    vals = [v["ceiling"] for v in c.values()]
    if vals[0] is None:
        return "none (no true clusters)"
    spread = f" (seeds {min(vals):.2f}–{max(vals):.2f})" if max(vals) - min(vals) >= 0.005 else ""
    return f"{np.mean(vals):.2f}{spread}"


def settings_block(label: str) -> str:
    suite = _suite()
    lines: list[str] = []
    plan = PLAN.get(label, {})
    for setting in SETTINGS:
        found = load(label, setting)
        planned, seeds = plan.get(setting, ([], []))
        order = [*suite["settings"][setting]["methods"],
                 *(m for m in [*planned, *found] if m not in suite["settings"][setting]["methods"])]
        order = [m for m in dict.fromkeys(order) if m in found or m in planned]
        if not order:
            continue
        k = suite["settings"][setting]["K"]
        lines += [f"\n**{setting}** (K = {k}; ARI ceiling {ceiling_cell(setting)})\n",
                  "| method | seeds | accuracy (client mean) | accuracy (pooled) | macro-F1 | "
                  "paper acc. / F1 | ARI | largest cluster (final / max) | CPU s / run |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m in order:
            res = found.get(m, {})
            missing = [s for s in seeds if m in planned and s not in res]
            paper = suite["settings"][setting].get("paper", {}).get(m)
            p = f"{paper[0]} / {paper[1]}" if paper else "–"
            if not res:
                lines.append(f"| {NAMES.get(m, m)} | pending (seeds {_seeds(missing)}) | "
                             f"| | | {p} | | | |")
                continue
            rs = [res[s] for s in sorted(res)]
            clustered = m.startswith(("ifca", "fesem"))  # λ variants too; others have no ARI
            ari = [r["ari"] for r in rs if r["ari"] is not None and clustered]
            big = (f"{np.mean([r['largest_cluster_share_final'] for r in rs]):.2f} / "
                   f"{np.mean([r['largest_cluster_share_max'] for r in rs]):.2f}"
                   if clustered else "–")
            note = f" (+ pending {_seeds(missing)})" if missing else ""
            lines.append(
                f"| {NAMES.get(m, m)} | {_seeds(sorted(res))}{note} | "
                f"{pct([r['accuracy'] for r in rs])} | "
                f"{pct([r.get('accuracy_weighted') for r in rs])} | "
                f"{pct([r['macro_f1'] for r in rs])} | {p} | "
                f"{f'{np.mean(ari):.2f}' if ari else '–'} | {big} | "
                f"{np.mean([r['cpu_time_s'] for r in rs]):.0f} |")
    return "\n".join(lines).lstrip("\n")


def _seeds(seeds: list[int]) -> str:
    return ", ".join(str(s) for s in seeds)


def lift_block() -> str:
    lines = ["| regime | setting | CAM variant | baseline | seeds | Δ accuracy (client mean) | "
             "Δ accuracy (pooled) | Δ macro-F1 | per seed (Δ accuracy) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, regime in REGIMES.items():
        for setting in SETTINGS:
            found = load(label, setting)
            for cam, base in LIFTS:
                seeds = sorted(set(found.get(cam, {})) & set(found.get(base, {})))
                if not seeds:
                    continue
                a, b = found[cam], found[base]

                def diff(key: str, a=a, b=b, seeds=seeds) -> list[float]:
                    return [a[s][key] - b[s][key] for s in seeds
                            if a[s].get(key) is not None and b[s].get(key) is not None]

                signed = [f"{100 * d:+.1f}" for d in diff("accuracy")]
                lines.append(
                    f"| {regime} | {setting} | {NAMES[cam]} | {NAMES[base]} | {len(seeds)} | "
                    f"{_signed(diff('accuracy'))} | {_signed(diff('accuracy_weighted'))} | "
                    f"{_signed(diff('macro_f1'))} | {', '.join(signed)} |")
    return "\n".join(lines)


def _signed(values: list[float]) -> str:
    if not values:
        return "–"
    v = 100 * np.asarray(values)
    return f"{v[0]:+.1f}" if len(v) == 1 else f"{v.mean():+.1f} ± {v.std():.1f}"


def ceiling_block() -> str:
    c = ceilings()
    lines = ["| setting | seed | clients | clients whose class set also occurs in another "
             "true cluster | ARI ceiling |", "|---|---|---|---|---|"]
    for setting in SETTINGS:
        for seed, v in sorted(c.get(setting, {}).items()):
            ceil = "–" if v["ceiling"] is None else f"{v['ceiling']:.3f}"
            lines.append(f"| {setting} | {seed} | {v['n_clients']} | {v['shared']} | {ceil} |")
    return "\n".join(lines)


def compute_ceilings(seeds: list[int]) -> None:
    """ARI ceiling of each setting and seed, from the federation run.py builds."""
    sys.path.insert(0, str(HERE))
    import run  # benchmarks/cam/run.py

    from clusterfl.metrics import ari_ceiling

    base, suite = run.load_suite()
    out = ceilings()
    for setting in SETTINGS:
        for seed in seeds:
            raw = run.run_config(base, suite, setting, "fedavg", "paper", seed)
            fed = run.build_federation(raw, suite["scales"]["paper"], seed)
            y = fed.y_train.numpy()
            held = np.stack([np.bincount(y[a:b], minlength=fed.n_classes) > 0
                             for a, b in zip(fed.train_offsets[:-1], fed.train_offsets[1:])])
            _, groups = np.unique(held, axis=0, return_inverse=True)
            groups = groups.ravel()
            true = fed.clusters
            if true is None:
                entry = {"n_clients": fed.n_clients, "shared": "–", "ceiling": None}
            else:
                mixed = {g for g in set(groups.tolist()) if len(set(true[groups == g])) > 1}
                entry = {"n_clients": fed.n_clients,
                         "shared": int(np.isin(groups, list(mixed)).sum()),
                         "ceiling": ari_ceiling(true, groups)}
            out.setdefault(setting, {})[f"seed{seed}"] = entry
            print(setting, seed, entry, flush=True)
    CEILING.write_text(json.dumps(out, indent=1) + "\n")


def _suite() -> dict[str, Any]:
    import tomllib
    return tomllib.loads((HERE / "suite.toml").read_text())


def rewrite(path: Path) -> None:
    text = path.read_text()

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("settings:"):
            body = settings_block(name.split(":", 1)[1])
        elif name == "lift":
            body = lift_block()
        elif name == "ceiling":
            body = ceiling_block()
        else:
            raise SystemExit(f"RESULTS.md: unknown block {name!r} (settings:<label>, lift, "
                             "ceiling)")
        return f"<!-- tables.py:{name} -->\n{body}\n<!-- /tables.py -->"

    new = re.sub(r"<!-- tables\.py:(\S+) -->\n.*?<!-- /tables\.py -->", block, text,
                 flags=re.S)
    path.write_text(new)
    print(f"rewrote {len(re.findall(r'<!-- tables.py:', new))} blocks of {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ceiling", action="store_true",
                   help="compute the ARI ceilings first (needs CLUSTERFL_DATA)")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    args = p.parse_args(argv)
    if args.ceiling:
        compute_ceilings(args.seeds)
    rewrite(HERE / "RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
