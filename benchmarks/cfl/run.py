"""Reproductions of CFL (Sattler et al. 2020), scaled to a shared 2-core CPU.

    OMP_NUM_THREADS=1 python benchmarks/cfl/run.py label_swap permutation congruence gap \
        [--out runs/cfl-bench]

Parts (each writes `benchmarks/cfl/results/<part>.json`; run directories go under --out):

- `label_swap`  (§V-A/§V-C, MNIST, 20 clients, 4 clusters) and `permutation` (§V-C, Fashion-
  MNIST, 4 label permutations): first plain FL (CFL with splitting disabled, which is FedAvg:
  weighted averaging, eq. (2)), then CFL with ε1 = the median of the FL run's mean update norm
  ‖Δθ‖ over its second half (the plateau FL reaches in this budget) and ε2 = 3 ε1 (inside the
  paper's range [ε1, 10 ε1]). The paper's rule of thumb ε1 ≈ max_t ‖Δθ‖ / 10 (§V-B) assumes FL
  converges to a near-zero mean update; here SGD with momentum and no learning-rate decay
  plateaus well above that (see RESULTS.md), so that rule would never split. Reports split
  rounds, ARI, the separation gap per round and the accuracy per true cluster of CFL vs FedAvg.
- `congruence`  (§V-B, Fig. 8): two clients, congruent (digits 0-4 vs 5-9) and incongruent
  (label swap); FL runs recording the mean update norm and the largest client norm. The split
  rule (eq. 30-31) with one ε pair for both cases (the plateau rule above and the paper's
  max/10 rule, ε2 = 3 ε1) is then evaluated on the two trajectories (CFL before its first split
  is exactly this FL run).
- `gap`  (§V-A, Fig. 6): separation gap after 50 FL rounds as a function of the number of
  training points per client (label swap, MNIST), from weight updates and from full gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.algorithms.cfl import CFLExtras
from clusterfl.clustering.cosine import pairwise_cosine, separation_gap
from clusterfl.config import read_toml
from clusterfl.experiment import Experiment, History, build_backend
from clusterfl.protocol import GradientRequest
from clusterfl.records import RoundMetrics, RoundRecord, read_history, read_summary
from clusterfl.report.methods.cfl import figures

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NO_SPLIT = 1e-12
EPS2_RATIO = 3.0


SMOKE: dict[str, Any] = {}


def _reuse(out: Path, cfg: dict[str, Any]) -> tuple[History, dict[str, Any]] | None:
    """The history and timing of a finished run in `out` made with the same config (else
    None)."""
    from clusterfl.config import load_config

    try:
        same = read_toml(out / "config.toml") == load_config(cfg).to_dict()
        if not same:
            return None
        history = History(read_history(out), read_summary(out))
    except Exception:
        return None
    if len(history.records) != cfg["rounds"]:
        return None
    timing = out / "bench_time.json"
    return history, (json.loads(timing.read_text()) if timing.is_file() else
                     {"bench_wall_s": history.final.wall_time, "bench_cpu_s": None})


def _run(raw: dict[str, Any], out: Path, algorithm: dict[str, Any]
         ) -> tuple[Experiment, History, dict[str, Any]]:
    """Run one config (or reuse the finished run in `out` made with the same config);
    returns the experiment, its history and its timing (`bench_wall_s`, `bench_cpu_s`)."""
    cfg = {**raw, "algorithm": algorithm, **SMOKE}
    exp = Experiment.from_config(cfg, out_dir=out)
    reused = _reuse(out, cfg)
    if reused is None:
        t0, c0 = time.time(), time.process_time()
        history = exp.run(progress=False)
        timing = {"bench_wall_s": time.time() - t0, "bench_cpu_s": time.process_time() - c0}
        (out / "bench_time.json").write_text(json.dumps(timing))
        if algorithm.get("eps1", 1.0) > NO_SPLIT:
            exp.algorithm.save_artifacts(out, cfg["rounds"])  # type: ignore[attr-defined]
    else:
        history, timing = reused
    if algorithm.get("eps1", 1.0) > NO_SPLIT:
        figures(out, history.records, history.summary)
    print(f"{out.name}: {timing['bench_wall_s']:.0f}s wall, "
          f"{timing['bench_cpu_s']}s cpu, final {history.final.to_json_dict()}", flush=True)
    return exp, history, timing


def _accuracy(metrics: RoundMetrics | None) -> float | None:
    return None if metrics is None else metrics.accuracy


def _curve(records: list[RoundRecord]) -> list[tuple[int, float | None]]:
    """(round, mean client accuracy) of the evaluated rounds."""
    return [(r.round, _accuracy(r.metrics)) for r in records if r.metrics is not None]


def _per_cluster(acc: list[float], truth: list[int]) -> dict[str, float]:
    a, t = np.asarray(acc, dtype=float), np.asarray(truth)
    return {str(int(k)): float(a[t == k].mean()) for k in np.unique(t)}


def _cfl(r: RoundRecord) -> CFLExtras:
    """The CFL extras of a round."""
    return CFLExtras.from_dict(r.extras)


def clustering_part(name: str, config: str, out: Path) -> dict[str, Any]:
    raw = read_toml(HERE / config)
    _, fl, fl_time = _run(raw, out / f"{name}_fedavg", {"name": "cfl", "eps1": NO_SPLIT})
    norms = np.array([_cfl(r).mean_norm[0] for r in fl.records])
    peak = float(norms.max())
    eps1 = float(np.median(norms[len(norms) // 2:]))  # the FL plateau (see RESULTS.md)
    eps2 = EPS2_RATIO * eps1
    _, cfl, cfl_time = _run(raw, out / f"{name}_cfl",
                            {"name": "cfl", "eps1": eps1, "eps2": eps2})
    truth = cfl.summary.true_clusters
    cfl_acc, fl_acc = cfl.summary.client_accuracy, fl.summary.client_accuracy
    splits = []
    for r in cfl.records:
        e = _cfl(r)
        gap_of = dict(zip(e.clusters, e.gap))
        splits += [{"round": r.round, "node": ev["node"], "groups": ev["groups"],
                    "alpha_cross_max": ev["alpha_cross_max"], "gap": gap_of.get(ev["node"])}
                   for ev in e.splits if ev["accepted"]]
    return {
        "config": config, "rounds": raw["rounds"], "eps1": eps1, "eps2": eps2,
        "fl_peak_mean_norm": peak, "fl_rule_of_thumb_eps1": peak / 10,
        "fl_rounds_below_rule_of_thumb_after_peak": int(
            (norms[int(norms.argmax()):] < peak / 10).sum()),
        "fl_mean_norm_per_round": norms.tolist(),
        "fl_max_norm_per_round": [_cfl(r).max_norm[0] for r in fl.records],
        "mean_norm_per_round": [_cfl(r).mean_norm for r in cfl.records],
        "max_norm_per_round": [_cfl(r).max_norm for r in cfl.records],
        "split_rounds": sorted({s["round"] for s in splits}), "splits": splits,
        "ari_final": cfl.records[-1].ari, "n_clusters_final": cfl.records[-1].n_clusters,
        "ari_per_round": [r.ari for r in cfl.records],
        "gap_per_round": [_cfl(r).gap for r in cfl.records],
        "clusters_per_round": [_cfl(r).clusters for r in cfl.records],
        "fl_gap_per_round": [_cfl(r).gap[0] for r in fl.records],
        "accuracy": {"cfl": _accuracy(cfl.final.metrics),
                     "fedavg": _accuracy(fl.final.metrics)},
        "accuracy_per_true_cluster": {
            "cfl": _per_cluster(cfl_acc, truth), "fedavg": _per_cluster(fl_acc, truth)},
        "client_accuracy_min": {"cfl": min(cfl_acc), "fedavg": min(fl_acc)},
        "client_accuracy_max_fedavg": max(fl_acc),
        "accuracy_curve": {"cfl": _curve(cfl.records), "fedavg": _curve(fl.records)},
        "wall_s": {"cfl": cfl_time["bench_wall_s"], "fedavg": fl_time["bench_wall_s"]},
        "cpu_s": {"cfl": cfl_time["bench_cpu_s"], "fedavg": fl_time["bench_cpu_s"]},
    }


def _first_split(records: list[RoundRecord], eps1: float, eps2: float) -> int | None:
    """Round at which Alg. 5's rule (eq. 30-31) would first split this FL trajectory."""
    for r in records:
        e = _cfl(r)
        if e.mean_norm[0] < eps1 and e.max_norm[0] > eps2:
            return r.round
    return None


def congruence_part(out: Path) -> dict[str, Any]:
    raw = read_toml(HERE / "congruence_mnist.toml")
    algo = {"name": "cfl", "eps1": NO_SPLIT}
    _, cong, cong_time = _run(raw, out / "congruent", algo)
    inc_raw = {**raw, "scenario": {"name": "label_swap", "n_clients": 2, "n_clusters": 2,
                                   "n_train_per_client": 500, "n_test_per_client": 500}}
    _, inc, inc_time = _run(inc_raw, out / "incongruent", algo)
    series = {
        name: {"mean_norm": [_cfl(r).mean_norm[0] for r in h.records],
               "max_norm": [_cfl(r).max_norm[0] for r in h.records],
               "accuracy": _curve(h.records)}
        for name, h in (("congruent", cong), ("incongruent", inc))
    }
    peak = max(max(s["mean_norm"]) for s in series.values())
    plateau = np.concatenate([s["mean_norm"][len(s["mean_norm"]) // 2:]
                              for s in series.values()])
    rules = {"plateau": float(np.median(plateau)), "peak/10": peak / 10}
    tail = slice(-10, None)
    return {
        "rounds": raw["rounds"], "series": series,
        "eps": {k: [e1, EPS2_RATIO * e1] for k, e1 in rules.items()},
        "last10_mean": {k: {m: float(np.mean(s[m][tail])) for m in ("mean_norm", "max_norm")}
                        for k, s in series.items()},
        "first_split_round": {
            rule: {"congruent": _first_split(cong.records, e1, EPS2_RATIO * e1),
                   "incongruent": _first_split(inc.records, e1, EPS2_RATIO * e1)}
            for rule, e1 in rules.items()},
        "wall_s": cong_time["bench_wall_s"] + inc_time["bench_wall_s"],
        "cpu_s": cong_time["bench_cpu_s"] + inc_time["bench_cpu_s"],
    }


def gradient_gap(exp: Experiment) -> float:
    """g(α) from full-batch gradients of every client at the final FL model (Fig. 6 'Gradient')."""
    backend = build_backend(exp.config, exp.federation, exp.factory)
    model = exp.algorithm.model_of(0)[None]  # type: ignore[attr-defined]
    n = exp.federation.n_clients
    reply = backend.execute(GradientRequest(np.arange(n), model, np.zeros(n, np.int64), None, 0))
    return separation_gap(pairwise_cosine(reply.grads), exp.federation.clusters)


def gap_part(out: Path, sizes: list[int], seeds: dict[int, list[int]]) -> dict[str, Any]:
    raw = read_toml(HERE / "label_swap_mnist.toml")
    rows = []
    for n in sizes:
        for seed in seeds.get(n, [0]):
            cfg = {**raw, "seed": seed, "rounds": 50, "eval_every": 50,
                   "output": {"figures": False, "progress": "off"},
                   "scenario": {**raw["scenario"], "n_train_per_client": n}}
            exp, h, timing = _run(cfg, out / f"gap_n{n}_s{seed}",
                                  {"name": "cfl", "eps1": NO_SPLIT})
            rows.append({"n": n, "seed": seed, "gap_update": _cfl(h.records[-1]).gap[0],
                         "gap_gradient": gradient_gap(exp),
                         "gap_update_per_round": [_cfl(r).gap[0] for r in h.records],
                         "accuracy": _accuracy(h.final.metrics),
                         "wall_s": timing["bench_wall_s"], "cpu_s": timing["bench_cpu_s"]})
    return {"rounds": 50, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("parts", nargs="+", choices=["label_swap", "permutation", "congruence", "gap"])
    p.add_argument("--out", default="runs/cfl-bench")
    p.add_argument("--sizes", default="10,20,50,100,200")
    p.add_argument("--smoke", action="store_true", help="3 rounds each, to check the plumbing")
    args = p.parse_args(argv)
    if args.smoke:
        SMOKE.update({"rounds": 3, "eval_every": 1})
    torch.set_num_threads(1)
    out = Path(args.out)
    RESULTS.mkdir(exist_ok=True)
    for part in args.parts:
        t0 = time.time()
        if part == "label_swap":
            res = clustering_part("label_swap", "label_swap_mnist.toml", out)
        elif part == "permutation":
            res = clustering_part("permutation", "label_permutation_fmnist.toml", out)
        elif part == "congruence":
            res = congruence_part(out)
        else:
            sizes = [int(s) for s in args.sizes.split(",")]
            res = gap_part(out, sizes, {10: [0, 1, 2], 20: [0, 1, 2]})
        res["command"] = "OMP_NUM_THREADS=1 python benchmarks/cfl/run.py " + part
        res["part_wall_s"] = time.time() - t0
        name = f"{part}_smoke" if args.smoke else part
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=1))
        print(f"== {part} done in {res['part_wall_s']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
