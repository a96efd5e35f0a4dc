"""FLT's adjacency in one scenario, over γ: which pairs of clients Ã links, and the clusters
the two automatic rules (largest gap of Ward's merge heights; connected components of Ã)
find — for the paper's minimum distance and the authors' matched distance alike.

One FLT clustering (the UMAP points of every client's centroids, `flt_relatedness.npz` of a
finished run folder, e.g. of `run.py s2_mnist --methods flt --set rounds=1`) gives both
distances and every γ: A is recomputed from the points with the library's own functions
(`clusterfl.clustering.relatedness.adjacency`), so at the run's γ and distance it is the run's
A. Pairs are split into: same true cluster; different clusters that share a class (Scenario 2:
neighbouring clusters share one of their three classes); different clusters sharing none.

    python benchmarks/flt/gamma_sweep.py s2_mnist --run flt       # runs/s2_mnist/flt/
    python benchmarks/flt/gamma_sweep.py s2_mnist --run flt_seed1 --seed 1

Writes `gamma_sweep.json` (rows keyed by scenario and run) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfl.clustering.hierarchical import (
    auto_n_clusters,
    connected_groups,
    cut_tree,
    ward_linkage,
)
from clusterfl.clustering.relatedness import adjacency, threshold
from clusterfl.config import apply_overrides, load_config, read_toml
from clusterfl.experiment import build_federation

HERE = Path(__file__).resolve().parent
GAMMAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)


def sweep(points: np.ndarray, truth: np.ndarray, held: np.ndarray,
          gammas: tuple[float, ...] = GAMMAS) -> list[dict[str, Any]]:
    """One row per distance and γ: shares of linked pairs by kind, clusters of both rules."""
    same = truth[:, None] == truth[None, :]
    share_class = (held.astype(int) @ held.T.astype(int)) > 0
    off = ~np.eye(len(truth), dtype=bool)
    kinds = {"within": same & off, "cross_shared": ~same & share_class,
             "cross_disjoint": ~same & ~share_class}
    rows = []
    for distance in ("min", "matched"):
        a = adjacency(points, distance)  # type: ignore[arg-type]
        np.fill_diagonal(a, 0.0)
        for gamma in gammas:
            related = threshold(a, gamma)
            z = ward_linkage(related)
            c = auto_n_clusters(z)
            gap = cut_tree(z, c, len(truth))
            comp = connected_groups(related)
            rows.append({
                "distance": distance, "gamma": gamma,
                **{f"linked_{k}": float(related[m].mean()) if m.any() else None
                   for k, m in kinds.items()},
                "gap_clusters": int(c), "gap_ari": float(adjusted_rand_score(truth, gap)),
                "components": int(comp.max() + 1),
                "components_ari": float(adjusted_rand_score(truth, comp)),
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="a config name in configs/ (e.g. s2_mnist)")
    ap.add_argument("--run", default="flt", help="run folder runs/<scenario>/<run>/")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (its partition)")
    args = ap.parse_args()
    raw = read_toml(HERE / "configs" / f"{args.scenario}.toml")
    overrides = [] if args.seed is None else [f"seed={args.seed}"]
    fed = build_federation(load_config(apply_overrides(raw, overrides)))
    npz = np.load(HERE / "runs" / args.scenario / args.run / "flt_relatedness.npz")
    clients = np.asarray(npz["signature_clients"], dtype=np.int64)
    if len(clients) != fed.n_clients:
        raise SystemExit(f"{len(clients)} of {fed.n_clients} clients have a signature; the "
                         "sweep needs all of them")
    points = np.asarray(npz["points"]).reshape(len(clients), -1, 2)
    y = fed.y_train.numpy()
    held = np.stack([np.bincount(y[a:b], minlength=fed.n_classes) > 0
                     for a, b in zip(fed.train_offsets[:-1], fed.train_offsets[1:])])
    assert fed.clusters is not None
    rows = sweep(points, np.asarray(fed.clusters), held)
    out = HERE / "gamma_sweep.json"
    data = json.loads(out.read_text()) if out.is_file() else {}
    data.setdefault(args.scenario, {})[args.run] = rows
    out.write_text(json.dumps(data, indent=1) + "\n")
    print("| distance | γ | within pairs linked | cross pairs sharing a class linked | "
          "cross pairs sharing none linked | gap rule: C / ARI | components: C / ARI |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        def f(v: float | None) -> str:
            return "–" if v is None else f"{v:.2f}"
        print(f"| {r['distance']} | {r['gamma']} | {f(r['linked_within'])} | "
              f"{f(r['linked_cross_shared'])} | {f(r['linked_cross_disjoint'])} | "
              f"{r['gap_clusters']} / {r['gap_ari']:.2f} | "
              f"{r['components']} / {r['components_ari']:.2f} |")


if __name__ == "__main__":
    main()
