"""Why the matched distance leaves Scenario 2's blocks of Ã only partly filled.

Each client's k = 5 centroids fall on its 3 classes in some pattern (2 + 2 + 1, 3 + 1 + 1,
...). The matched distance pairs the two clients' centroids one to one, so two clients of the
same cluster whose centroids are spread differently over the classes get a large distance.
This script groups the 5 · M UMAP points of one FLT clustering into `--groups` regions
(k-means in the 2-d embedding; with MNIST a region is a digit or part of one), gives every
client the count of its centroids per region, and reports, for pairs of clients of the same
true cluster, the share linked by Ã (matched distance, γ = 1) when their counts are equal
and when they differ, plus each cluster's patterns.

    python benchmarks/flt/centroid_patterns.py s2_mnist --run flt_clustering_seed1 --seed 1
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans

from clusterfl.clustering.relatedness import adjacency, threshold
from clusterfl.config import apply_overrides, load_config, read_toml
from clusterfl.experiment import build_federation

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--run", default="flt_clustering")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--groups", type=int, default=10, help="regions of the UMAP plane")
    ap.add_argument("--gamma", type=float, default=1.0)
    args = ap.parse_args()
    raw = read_toml(HERE / "configs" / f"{args.scenario}.toml")
    overrides = [] if args.seed is None else [f"seed={args.seed}"]
    fed = build_federation(load_config(apply_overrides(raw, overrides)))
    assert fed.clusters is not None
    truth = np.asarray(fed.clusters)
    npz = np.load(HERE / "runs" / args.scenario / args.run / "flt_relatedness.npz")
    m = len(npz["signature_clients"])
    points = np.asarray(npz["points"]).reshape(m, -1, 2)
    k = points.shape[1]
    region = KMeans(args.groups, n_init=10, random_state=0).fit_predict(
        points.reshape(-1, 2)).reshape(m, k)
    counts = np.stack([np.bincount(r, minlength=args.groups) for r in region])
    related = threshold(adjacency(points, "matched"), args.gamma)
    within = (truth[:, None] == truth[None, :]) & ~np.eye(m, dtype=bool)
    equal = (counts[:, None, :] == counts[None, :, :]).all(-1)
    print(f"{args.run}: pairs of clients of the same cluster: {within.sum() // 2}; linked "
          f"{related[within].mean():.2f}; same pattern {equal[within].mean():.2f}; linked "
          f"when the pattern is the same {related[within & equal].mean():.2f}, when it "
          f"differs {related[within & ~equal].mean():.2f}")
    for c in range(int(truth.max()) + 1):
        pats = Counter(" ".join(f"r{g}×{n}" for g, n in enumerate(counts[i]) if n)
                       for i in np.flatnonzero(truth == c))
        print(f"  cluster {c}: " + "; ".join(f"{n} clients [{p}]" for p, n in pats.most_common()))


if __name__ == "__main__":
    main()
