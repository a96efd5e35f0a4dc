"""A development probe (issue 36): which server-side rule lets FLT (or PCA+kM+HC, `--method
pca_km_hc`) choose its number of clusters?
FLT's rule v1 (UMAP of the clients' centroids, the paper's minimum distance, the threshold
γ = 1, Ward on the rows of Ã, the divisive silhouette cut with a bound of 0.25) found the true K
in 3 of 32 validation federations with structure (validation21-24): it over-splits (a
rotation into 2 groups became 4-8 clusters, a cluster n-class federation 10-17).

FLT clusters once, before training, from the clients' signatures (k k-means centroids of the
encoded data), so every rule below is a function of the signatures alone. For each
federation (the grid's settings, `run_grid.config`, one round), the probe runs FLT once,
keeps the signatures, the UMAP points and the true clusters (cached in runs/probe_flt/, not
in git), and then applies each rule:

- `v1`: FLT's rule v1, as it runs (the labels of the run itself);
- `v1+shuffle`: v1's Ward tree and silhouettes, a cut made only where CFL's shuffle test
  (`structure_pvalue`, 999 shuffles, p < 0.002) of the cluster's distances between Ã rows
  says the cluster shows groups (as FL+HC's rule v3 does with its update cosines);
- `emb`: no UMAP and no threshold: the distances between the clients' centroid sets in the
  encoder's space (`min`, the paper's, or `matched`, the authors' code's), Ward on those
  distance rows, the silhouette cut with v1's bound;
- `emb+shuffle`: `emb` with the shuffle test of those distances deciding each cut;
- `v2`: FLT's rule v2, chosen on these federations (`signature_cut` with the defaults):
  `emb-min` where a cut needs both the silhouette bound and the shuffle test (the bound
  alone cut iid_mnist_23; the test alone both iid federations of 200 clients, whose many
  small client differences it calls groups).

    python benchmarks/transfer/probe_flt.py --halves validation21 validation22 \\
        validation23 validation24 > benchmarks/transfer/results/probe_flt.md

`--method pca_km_hc` (PCA+kM+HC's rule v2, docs/transfer.md): the same for the baseline's
signatures (each client's k-means centroids of its own PCA, in input space; every federation
of the halves, the 8x8 digits and the regressions too), cached in runs/probe_pca/, with its
own list of rules: `v1` (as it runs: Ward on the rows of the minimum distances D, the
silhouette bound), `min+test(D)` (FLT's rule v2, `signature_cut`: a cut needs the bound and
the shuffle test of D), `min+test(rows)` (the test of the distances between D's rows, which
the silhouettes read), `matched` and `matched+test(D)` (the authors' matched distance).

    python benchmarks/transfer/probe_flt.py --method pca_km_hc --halves validation21 \
        validation22 validation23 validation24 > benchmarks/transfer/results/probe_pca.md

A cluster of fewer than 5 clients is cut by the silhouette bound, as in FL+HC (the shuffle
test has no power there). Label swaps and permutations are listed but not counted: the
signatures see the inputs only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHES = {"flt": HERE / "runs" / "probe_flt", "pca_km_hc": HERE / "runs" / "probe_pca"}
RULES = {"flt": ("v1", "v1+shuffle", "emb-min", "emb-min+shuffle", "emb-matched",
                 "emb-matched+shuffle", "v2"),
         "pca_km_hc": ("v1", "min+test(D)", "min+test(rows)", "matched", "matched+test(D)")}
SIGNIFICANCE, DRAWS = 0.002, 999  # FL+HC's and CFL's test, as they use it (not tuned here)


def signatures(name: str, method: str = "flt") -> Path | None:
    """The cached npz of federation `name` (`method` run once for one round), None if the
    method refuses it (FLT: the 8x8 digits, the regressions)."""
    import torch

    sys.path.insert(0, str(HERE))
    import run_grid

    from clusterfl.errors import ConfigError
    from clusterfl.experiment import Experiment

    cache = CACHES[method]
    path = cache / f"{name}.npz"
    if path.exists():
        return path
    fed = run_grid.GRID["federation"][name]
    if method == "flt" and fed["source"] not in ("mnist", "fashion_mnist"):
        return None
    torch.set_num_threads(1)
    cfg = run_grid.config(fed, method, [])
    assert cfg is not None
    cfg.update(rounds=1, eval_every=1)
    try:
        exp = Experiment.from_config(cfg, out_dir=cache / "runs" / name, overwrite=True)
        exp.run(progress=False)
    except ConfigError as exc:  # refused (PCA+kM+HC: the regressions' inputs of size 1)
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f"{name}.refused").write_text(f"{exc}\n")
        return None
    state = exp.algorithm.state
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, signatures=state.signatures, points=state.points, labels=state.labels,
             truth=np.asarray(exp.federation.clusters), k=fed["k"])
    return path


def _similarity(d: np.ndarray) -> np.ndarray:
    """Distances as similarities with a unit diagonal (the shuffle test's contrast is
    unchanged by any increasing affine map, so the scale does not matter)."""
    s = 1.0 - d / max(float(d.max()), 1e-12)
    np.fill_diagonal(s, 1.0)
    return s


def pca_labels(rule: str, data: dict[str, np.ndarray]) -> np.ndarray:
    """PCA+kM+HC's candidate rules (module doc) on the cached signatures."""
    from clusterfl.algorithms.flt import (
        both_structured,
        rows_cut,
        signature_cut,
        signature_distances,
    )
    from clusterfl.clustering.cosine import distance_similarity
    from clusterfl.clustering.hierarchical import (
        pairwise_distances,
        silhouette_cut,
        ward_linkage,
    )

    sig = data["signatures"]
    if rule == "v1":  # rule v1 recomputed: the cached labels are those of the code that ran
        feats = signature_distances(sig, "min")
        return rows_cut(feats, ward_linkage(feats), None, None, "silhouette", 0.25, 0.0).labels
    if rule in ("min+test(D)", "matched+test(D)"):
        return signature_cut(sig, "matched" if rule.startswith("matched") else "min",
                             SIGNIFICANCE, 0.25, None)[0].labels
    feats = signature_distances(sig, "matched" if rule == "matched" else "min")
    d = pairwise_distances(feats, feats)
    if rule == "matched":
        return silhouette_cut(ward_linkage(feats), d, None, 0.25).labels
    assert rule == "min+test(rows)", rule  # PCA+kM+HC's rule v2, as `rows_cut` runs it
    structured = both_structured(distance_similarity(d), SIGNIFICANCE, 0.25)
    labels = silhouette_cut(ward_linkage(feats), d, None, 0.25, structured).labels
    assert (labels == rows_cut(feats, ward_linkage(feats), None, None, "silhouette", 0.25,
                               SIGNIFICANCE).labels).all()
    return labels


def labels(rule: str, data: dict[str, np.ndarray], method: str = "flt") -> np.ndarray:
    if method == "pca_km_hc":
        return pca_labels(rule, data)
    from clusterfl.clustering.cosine import SHUFFLE_MIN, structure_pvalue
    from clusterfl.clustering.hierarchical import (
        pairwise_distances,
        silhouette_cut,
        ward_linkage,
    )
    from clusterfl.clustering.relatedness import adjacency, threshold

    if rule == "v1":
        return data["labels"]
    if rule == "v2":
        from clusterfl.algorithms.flt import signature_cut

        return signature_cut(data["signatures"], "min", SIGNIFICANCE, 0.25, None)[0].labels
    sig = data["signatures"]
    if rule.startswith("v1"):
        a = adjacency(data["points"].reshape(len(sig), -1, 2), "min")
        np.fill_diagonal(a, 0.0)
        feats = threshold(a, 1.0)
        d = pairwise_distances(feats, feats)
    else:
        feats = adjacency(sig, "min" if "-min" in rule else "matched")
        np.fill_diagonal(feats, 0.0)
        d = pairwise_distances(feats, feats)
    tested = _similarity(d if rule.startswith("v1") else feats)

    def structured(leaves: np.ndarray, score: float) -> bool:
        if len(leaves) < SHUFFLE_MIN:
            return score >= 0.25
        rng = np.random.default_rng(np.sort(leaves))
        return structure_pvalue(tested[np.ix_(leaves, leaves)], DRAWS, rng) < SIGNIFICANCE

    return silhouette_cut(ward_linkage(feats), d, None, 0.25,
                          structured if rule.endswith("+shuffle") else None).labels


def main() -> None:
    from sklearn.metrics import adjusted_rand_score

    sys.path.insert(0, str(HERE))
    import run_grid

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", nargs="+", required=True)
    parser.add_argument("--method", choices=sorted(CACHES), default="flt")
    parser.add_argument("--cached", action="store_true",
                        help="only the federations whose signatures are cached (no runs)")
    args = parser.parse_args()
    rules, cache = RULES[args.method], CACHES[args.method]
    names = [n for n, f in run_grid.GRID["federation"].items() if f["half"] in args.halves]
    print(f"| federation | K | {' | '.join(rules)} |")
    print("|---|---|" + "---|" * len(rules))
    right = {r: [0, 0, 0, 0] for r in rules}  # K right, structured visible, iid at 1, iid
    for name in names:
        fed = run_grid.GRID["federation"][name]
        refused = cache / f"{name}.refused"
        if refused.exists():
            print(f"| {name} | {fed['k']} | refused: {refused.read_text().strip()} |"
                  + " |" * (len(rules) - 1))
            continue
        if args.cached and not (cache / f"{name}.npz").exists():
            if args.method != "flt" or fed["source"] in ("mnist", "fashion_mnist"):
                print(f"| {name} | {fed['k']} | not extracted |" + " |" * (len(rules) - 1))
            continue
        path = signatures(name, args.method)
        if path is None:
            if refused.exists():
                print(f"| {name} | {fed['k']} | refused: {refused.read_text().strip()} |"
                      + " |" * (len(rules) - 1))
            continue
        data = dict(np.load(path))
        k, truth = int(data["k"]), data["truth"]
        visible = not name.startswith(("swap", "perm"))
        cells = []
        if args.method == "pca_km_hc" and not (
                labels("v1", data, args.method) == data["labels"]).all():
            sys.exit(f"{name}: rule v1 recomputed differs from the labels cached from a run "
                     "of rule v1; the cache was made by another rule (delete runs/probe_pca/)")
        for rule in rules:
            found = labels(rule, data, args.method)
            kf = len(set(found.tolist()))
            cells.append(f"{kf} ({adjusted_rand_score(truth, found):.2f})")
            if k == 1:
                right[rule][2] += kf == 1
                right[rule][3] += 1
            elif visible:
                right[rule][0] += kf == k
                right[rule][1] += 1
        print(f"| {name} | {k} | {' | '.join(cells)} |", flush=True)
    print()
    print("| rule | true K, structure the inputs show | iid kept at one cluster |")
    print("|---|---|---|")
    for rule, (a, b, c, d) in right.items():
        print(f"| {rule} | {a}/{b} | {c}/{d} |")


if __name__ == "__main__":
    main()
