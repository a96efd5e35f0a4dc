"""A development probe (issue 36, grid version v11's protocol in docs/transfer.md): which test
lets CFL-GP's Appendix-G estimate, and FL+HC's cut, tell groups from noise?

Both choose K once from one set of inputs: CFL-GP's estimate (the last one of a run is the
one reported) reads the spectral projections F of the clients' profile rows, cut at the
largest gap s of their singular values; FL+HC's cut reads the updates of its clustering round.
For each federation (the grid's settings, `run_grid.config`, the defaults) the probe runs the
method once, keeps those inputs (cached in runs/probe_estimate/, not in git), and applies a
fixed list of rules to them:

- CFL-GP: `e1` rule v1 as it runs (the silhouette argmax of k-means over k = 2..k_max, 1 below
  the bound 0.25); `e2` e1, then 1 unless CFL's shuffle test (`structure_p`, p < 0.002) of
  the centred cosines of the profile rows calls them structured (the option
  `k_significance`); `e3` the same test of the Euclidean distances between the rows of F;
  `e4` of the distances between the rows of that distance matrix; `e5` Ward on F and the
  divisive silhouette cut with the bound and e3's test for every cluster of 5 or more
  (`flt.rows_cut`), at most k_max clusters.
- FL+HC: `f1` rule v3 as it runs (the test of the update cosines for every cluster of 5 or
  more); `f2` the test of the distances between the updates (what its silhouettes read);
  `f3` of the distances between the rows of that distance matrix; `f4` f3 and the bound.
- PACFL (`--method pacfl`, grid version v13's protocol): its one-off cut of the principal
  angles A between the clients' data subspaces: `p1` rule v1 as it runs (the silhouette bound
  alone); `p2` the bound and the test of A itself; `p3` the bound and the test of the
  distances between the rows of A (PCA+kM+HC's rule v2). Label swaps and permutations are
  listed, not counted (the subspaces see the inputs only); the regressions are refused.

    cd benchmarks/transfer
    python probe_estimate.py --method cfl_gp --halves validation21 validation22 \\
        validation23 validation24 --jobs 2 > results/probe_cfl_gp.md
    python probe_estimate.py --method flhc --halves ... --jobs 2 > results/probe_flhc_v4.md

The first rule of each list is checked against the run (the estimate it reported; FL+HC's
labels) on every federation: a difference stops the probe.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / "runs" / "probe_estimate"
RULES = {"cfl_gp": ("e1", "e2", "e3", "e4", "e5"), "flhc": ("f1", "f2", "f3", "f4"),
         "pacfl": ("p1", "p2", "p3")}
SIGNIFICANCE, BOUND = 0.002, 0.25  # the levels every other rule uses (not tuned here)


def capture(job: tuple[str, str]) -> Path:
    """Run `method` on federation `name` once; cache the inputs of its choice of K."""
    name, method = job
    path = CACHE / method / f"{name}.npz"
    if path.exists():
        return path
    sys.path.insert(0, str(HERE))
    import run_grid
    import torch

    from clusterfl.experiment import Experiment

    torch.set_num_threads(1)
    fed = run_grid.GRID["federation"][name]
    cfg = run_grid.config(fed, method, [])
    assert cfg is not None
    seen: dict[str, Any] = {}
    if method == "cfl_gp":
        import clusterfl.algorithms.cfl_gp as mod

        original = mod.CFLGP._estimate

        def spy(self: Any, feats: np.ndarray, sv: np.ndarray, seed: int,
                gram: np.ndarray | None) -> Any:
            out = original(self, feats, sv, seed, gram)
            g = feats @ feats.T if gram is None else gram
            c = self.config
            seen.update(feats=np.array(feats, np.float64), sv=np.array(sv, np.float64),
                        seed=seed, gram=np.array(g, np.float64), k=out[1].k_estimate,
                        k_max=c.k_max, n_init=c.kmeans_n_init)
            return out

        mod.CFLGP._estimate = spy  # type: ignore[method-assign]
    elif method == "pacfl":
        import clusterfl.algorithms.pacfl as mod

        cfg["rounds"] = cfg["eval_every"] = 1  # the one-off clustering is in round 1
        original = mod.pacfl_clusters

        def spy(a: np.ndarray, n: int, good: np.ndarray, c: Any) -> Any:
            out = original(a, n, good, c)
            seen.update(a=np.array(a, np.float64), n=n, good=np.asarray(good),
                        labels=out[0].labels, config=json.dumps(c.model_dump(mode="json")))
            return out

        mod.pacfl_clusters = spy
    else:
        import clusterfl.algorithms.flhc as mod
        from clusterfl.clustering.cosine import pairwise_cosine
        from clusterfl.clustering.hierarchical import feature_linkage, pairwise_distances

        rounds = cfg["algorithm"].get("warmup_rounds", 10) + 1
        cfg["rounds"] = cfg["eval_every"] = min(rounds, cfg["rounds"])
        original = mod.flhc_clusters

        def spy(updates: np.ndarray, n: int, good: np.ndarray, c: Any) -> Any:
            out = original(updates, n, good, c)
            u = np.asarray(updates, dtype=np.float64)
            seen.update(z=feature_linkage(u, c.metric, c.linkage),
                        d=pairwise_distances(u, u, c.metric),
                        cos=np.asarray(pairwise_cosine(torch.from_numpy(u)), np.float64),
                        n=n, good=np.asarray(good), labels=out[0].labels,
                        config=json.dumps(c.model_dump(mode="json")))
            return out

        mod.flhc_clusters = spy
    from clusterfl.errors import ConfigError

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        try:
            Experiment.from_config(cfg, out_dir=folder, overwrite=True).run(progress=False)
        except ConfigError as exc:  # refused (PACFL: the regressions' inputs of size 1)
            path.with_suffix(".refused").write_text(f"{exc}\n")
            return path
    np.savez(path, truth=np.asarray(fed["k"]), **seen)
    return path


def cfl_gp_k(rule: str, data: dict[str, Any]) -> int:
    from clusterfl.algorithms.flt import rows_cut
    from clusterfl.clustering.cosine import distance_similarity
    from clusterfl.clustering.hierarchical import pairwise_distances, ward_linkage
    from clusterfl.clustering.spectral import (
        estimate_n_clusters,
        gram_cosines,
        largest_gap,
        structure_p,
    )

    feats, seed = data["feats"], int(data["seed"])
    s = largest_gap(data["sv"], max_s=feats.shape[1])
    f = feats[:, :s]
    k_hi = min(int(data["k_max"]), len(f) - 1)
    if rule == "e5":
        return len(set(rows_cut(f, ward_linkage(f), None, k_hi, "silhouette", BOUND,
                                    SIGNIFICANCE).labels.tolist()))
    k, _ = estimate_n_clusters(f, k_hi, seed, "silhouette", int(data["n_init"]), BOUND)
    if rule == "e1":
        return int(k)
    if rule == "e2":
        tested = gram_cosines(data["gram"], centred=True)
    else:
        d = pairwise_distances(f, f)
        tested = distance_similarity(d if rule == "e3" else pairwise_distances(d, d))
    p = structure_p(tested, seed)
    return 1 if p is not None and p >= SIGNIFICANCE else int(k)


def flhc_k(rule: str, data: dict[str, Any]) -> int:
    from clusterfl.algorithms.flhc import FLHCConfig
    from clusterfl.algorithms.flt import both_structured
    from clusterfl.algorithms.oneshot import cut_clients
    from clusterfl.clustering.cosine import distance_similarity, shuffle_structured
    from clusterfl.clustering.hierarchical import pairwise_distances

    c = FLHCConfig(**json.loads(str(data["config"])))
    d, good = data["d"], data["good"]
    if rule == "f1":
        tested = data["cos"]
    else:
        tested = distance_similarity(d if rule == "f2" else pairwise_distances(d, d))
    structured = (both_structured(tested, SIGNIFICANCE, BOUND) if rule == "f4" else
                  shuffle_structured(tested, SIGNIFICANCE, c.min_silhouette, c.test_every))
    cut = cut_clients(data["z"], int(data["n"]), good, c.threshold, c.n_clusters,
                      c.max_clusters, c.auto_cut, d, c.min_silhouette, structured)
    if rule == "f1" and not (cut.labels == data["labels"]).all():
        raise SystemExit("f1 recomputed differs from the run's labels")
    return len(set(cut.labels[good].tolist()))


def pacfl_k(rule: str, data: dict[str, Any]) -> int:
    from clusterfl.algorithms.oneshot import cut_clients
    from clusterfl.algorithms.pacfl import PACFLConfig
    from clusterfl.clustering.cosine import both_structured, distance_similarity, profile_similarity
    from clusterfl.clustering.hierarchical import distance_linkage

    c = PACFLConfig(**json.loads(str(data["config"])))
    a, good = data["a"], data["good"]
    structured = None if rule == "p1" else both_structured(
        distance_similarity(a) if rule == "p2" else profile_similarity(a), SIGNIFICANCE, BOUND)
    threshold, k = c.cut()
    cut = cut_clients(distance_linkage(a, c.linkage), int(data["n"]), good, threshold, k,
                      c.max_clusters, c.auto_cut, a, c.min_silhouette, structured)
    if rule == "p1" and not (cut.labels == data["labels"]).all():
        raise SystemExit("p1 recomputed differs from the run's labels")
    return len(set(cut.labels[good].tolist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", nargs="+", required=True)
    parser.add_argument("--method", choices=sorted(RULES), required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import run_grid

    rules = RULES[args.method]
    names = [n for n, f in run_grid.GRID["federation"].items() if f["half"] in args.halves]
    with ProcessPoolExecutor(args.jobs) as pool:
        paths = list(pool.map(capture, [(n, args.method) for n in names]))
    print(f"# {args.method}: candidate rules on {', '.join(args.halves)}\n")
    print(f"Command: `python benchmarks/transfer/probe_estimate.py --method {args.method} "
          f"--halves {' '.join(args.halves)} --jobs {args.jobs}`\n")
    print(f"| federation | K | {' | '.join(rules)} |")
    print("|---|---|" + "---|" * len(rules))
    right = {r: [0, 0, 0, 0, 0] for r in rules}  # structured at K, structured, iid at 1, iid, >2
    for name, path in zip(names, paths):
        if path.with_suffix(".refused").exists():
            print(f"| {name} | – | refused |" + " |" * (len(rules) - 1))
            continue
        data = dict(np.load(path, allow_pickle=False))
        k = int(data["truth"])
        if args.method == "pacfl" and name.startswith(("swap", "perm")):
            found = [pacfl_k(r, data) for r in rules]  # inputs alike: listed, not counted
            print(f"| {name} (not counted) | {k} | {' | '.join(map(str, found))} |")
            continue
        count = {"cfl_gp": cfl_gp_k, "flhc": flhc_k, "pacfl": pacfl_k}[args.method]
        found = [count(r, data) for r in rules]
        if args.method == "cfl_gp" and found[0] != int(data["k"]):
            raise SystemExit(f"{name}: e1 recomputed {found[0]}, the run {int(data['k'])}")
        for rule, kf in zip(rules, found):
            tally = right[rule]
            if k == 1:
                tally[2] += kf == 1
                tally[3] += 1
                tally[4] += kf > 2
            else:
                tally[0] += kf == k
                tally[1] += 1
        print(f"| {name} | {k} | {' | '.join(map(str, found))} |", flush=True)
    print()
    print("| rule | true K, with structure | iid at one cluster | iid above 2 |")
    print("|---|---|---|---|")
    for rule, (a, b, c, d, e) in right.items():
        print(f"| {rule} | {a}/{b} | {c}/{d} | {e} |")


if __name__ == "__main__":
    main()
