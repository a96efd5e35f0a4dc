"""Reproductions of CFL-GP (Kim et al. 2024) at a scale that fits a shared 2-core CPU.

    .venv/bin/python benchmarks/cfl_gp/run.py [--only GROUP,...] [--out DIR]

Groups: linreg_main, mnist_main, compression, mnist_clients, linreg_sweeps, mixture, mixture_seeds,
spectrum_long,
aggregation (the Appendix-G estimate is read from the spectra the MNIST runs record). Each
run's directory goes to --out (default benchmarks/cfl_gp/runs, not committed); the small
per-run results are merged into benchmarks/cfl_gp/results.json. RESULTS.md is written by
hand from that file.

Everything runs on one torch thread (tiny models; the CPU is shared) with the sequential
(reference) backend. ARI for K = 4 on the 8-angle rotated MNIST is measured as the paper does
(F.1: "optimal clustering as grouping together the closest rotation transformations"): against
the 4 pairs (0,15), (90,105), (180,195), (270,275), i.e. true cluster // 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfl.algorithms.cfl_gp import CFLGPClusteringExtras, CFLGPExtras
from clusterfl.experiment import Experiment, History
from clusterfl.records import RoundMetrics, RoundRecord, read_history

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
SEEDS = (0, 1, 2, 3, 4)


def load(name: str) -> dict[str, Any]:
    return tomllib.loads((HERE / name).read_text())


def merged(base: dict[str, Any], **tables: Any) -> dict[str, Any]:
    """A copy of `base` with top-level values or whole-table updates (dicts are merged)."""
    out = json.loads(json.dumps(base))
    for key, value in tables.items():
        if isinstance(value, dict) and key in out:
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _first_round(records: list[RoundRecord], aris: list[float | None]) -> int | None:
    """First round from which the ARI stays 1 to the end of the run."""
    first = None
    for r, a in zip(records, aris):
        perfect = a is not None and a > 1 - 1e-9
        first = (first or r.round) if perfect else None
    return first


def summarize(name: str, cfg: dict[str, Any], h: History, truth: np.ndarray | None,
              paired: bool) -> dict[str, Any]:
    """The small record kept per run."""
    recs = h.records
    last = recs[-1]
    final = h.final
    m = final.metrics or RoundMetrics()
    ref = truth // 2 if (paired and truth is not None) else truth
    aris = [None if ref is None else float(adjusted_rand_score(ref, r.assignment))
            for r in recs]
    ex = CFLGPExtras.from_dict(last.extras)
    spectra = [(r, CFLGPClusteringExtras.from_dict(r.extras)) for r in recs]
    clusterings = [(r, e) for r, e in spectra if e.singular_values]
    out: dict[str, Any] = {
        "name": name, "algorithm": cfg["algorithm"]["name"], "seed": cfg["seed"],
        "rounds": cfg["rounds"], "n_clients": cfg["scenario"]["n_clients"],
        "accuracy": m.accuracy, "mse": m.mse,
        "ari": aris[-1], "ari_vs_true_clusters": last.ari,
        "ari_measured_against": "angle pairs (true // 2)" if paired else "true clusters",
        "rounds_to_ari_1": _first_round(recs, aris),
        "n_clusters": last.n_clusters, "wall_time_s": round(last.wall_time, 1),
        "floats_down": final.floats_down, "floats_up": final.floats_up,
    }
    if cfg["algorithm"]["name"] == "cfl_gp":
        out.update({
            "clustering_stopped_at": ex.clustering_stopped_at,
            "k_estimate": ex.k_estimate, "spectral_gap_s": ex.spectral_gap_s,
            "Y_models_down_per_client_period": ex.models_down_per_client_period,
            "Y_gradients_per_client_period": ex.gradients_per_client_period,
            "uplink_floats_compressed": ex.uplink_floats_compressed,
            "ari_at": dict(list({str(r.round): a for (r, e), a in zip(spectra, aris)
                                 if e.clustering}.items())[:15]),
            "spectra": {str(r.round): {
                "singular_values": [round(v, 6) for v in e.singular_values[:12]],
                "largest_gaps_after": e.largest_gaps_after,
                "k_estimate": e.k_estimate,
                "spectral_gap_s": e.spectral_gap_s}
                for r, e in clusterings[:1] + clusterings[-1:]},
        })
    return out


def execute(name: str, cfg: dict[str, Any], out_dir: Path, paired: bool = False
            ) -> dict[str, Any]:
    t0 = time.perf_counter()
    exp = Experiment.from_config(cfg, out_dir=out_dir / name)
    h = exp.run(progress=False)
    res = summarize(name, cfg, h, exp.federation.clusters, paired)
    res["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{name}: acc={res['accuracy']} mse={res['mse']} ari={res['ari']} "
          f"t(ARI=1)={res['rounds_to_ari_1']} k_est={res.get('k_estimate')} "
          f"[{res['total_seconds']} s]", flush=True)
    return res


# ------------------------------------------------------------------ groups


def linreg_main(out: Path) -> list[dict[str, Any]]:
    base = load("linreg.toml")
    rows = []
    for r in (0.8, 1.6):
        for s in SEEDS:
            cfg = merged(base, seed=s, algorithm={"init_range": r})
            rows.append(execute(f"linreg_cflgp_init{r}_s{s}", cfg, out))
    baselines = {
        "ifca": {"name": "ifca", "n_clusters": 3, "averaging": "gradient",
                 "gradient_batch_size": 10},
        "cfl": {"name": "cfl", "eps1": 0.02, "eps2": 0.6},
    }
    for label, algo in baselines.items():
        for s in SEEDS:
            cfg = merged(base, seed=s)
            cfg["algorithm"] = algo
            rows.append(execute(f"linreg_{label}_s{s}", cfg, out))
    return rows


def mnist_main(out: Path) -> list[dict[str, Any]]:
    base = load("rotated_mnist.toml")
    rows = [
        execute("mnist_cflgp_K4_C32_s0", base, out, paired=True),
        execute("mnist_cflgp_K8_C32_s0", merged(base, algorithm={"n_clusters": 8}), out),
    ]
    glob = merged(base)
    glob["algorithm"] = {"name": "fedavg"}
    rows.append(execute("mnist_fedavg_C32_s0", glob, out))
    ifca = merged(base)
    ifca["algorithm"] = {"name": "ifca", "n_clusters": 4, "averaging": "gradient",
                         "gradient_batch_size": 64}
    rows.append(execute("mnist_ifca_K4_C32_s0", ifca, out, paired=True))
    return rows


def mnist_clients(out: Path) -> list[dict[str, Any]]:
    base = merged(load("rotated_mnist.toml"), rounds=20, eval_every=20)
    return [execute(f"mnist_cflgp_K4_C{c}_T20_s0",
                    merged(base, scenario={"n_clients": c}), out, paired=True)
            for c in (8, 16, 64, 128)]


def compression(out: Path) -> list[dict[str, Any]]:
    base = load("rotated_mnist_4angles.toml")
    return [execute(f"compression_ratio{int(r)}", merged(base, algorithm={
        "compression_ratio": float(r)}), out) for r in (1, 10, 100, 1e3, 1e4, 1e5)]


def linreg_sweeps(out: Path) -> list[dict[str, Any]]:
    base = merged(load("linreg.toml"), eval_every=200, algorithm={"estimate_k": False})
    rows = []
    plan: list[tuple[str, dict[str, Any]]] = []
    plan += [(f"C{c}", {"scenario": {"n_clients": c}}) for c in (6, 24, 48)]
    plan += [(f"dphi{p}", {"scenario": {"delta_phi": float(p)}}) for p in (5, 10, 40)]
    plan += [(f"b{b}", {"train": {"batch_size": b}}) for b in (2, 5, 20, 50)]
    for label, change in plan:  # one seed per point (time); Δφ = 5° below gets two
        rows.append(execute(f"linreg_sweep_{label}_s0", merged(base, seed=0, **change), out))
    for s in SEEDS[:2]:
        cfg = merged(base, seed=s, scenario={"delta_phi": 5.0}, algorithm={"init_range": 1.6})
        rows.append(execute(f"linreg_sweep_dphi5_init1.6_s{s}", cfg, out))
        for label, algo in (("ifca", {"name": "ifca", "n_clusters": 3, "averaging":
                                      "gradient", "gradient_batch_size": 10}),
                            ("cfl", {"name": "cfl", "eps1": 0.02, "eps2": 0.6})):
            cfg = merged(base, seed=s, scenario={"delta_phi": 5.0})
            cfg["algorithm"] = algo
            rows.append(execute(f"linreg_sweep_dphi5_{label}_s{s}", cfg, out))
    return rows


def mixture(out: Path) -> list[dict[str, Any]]:
    base = load("mixture.toml")
    return [execute(f"mixture_kappa{k}", merged(base, scenario={"kappa": k}), out)
            for k in (0.1, 0.3, 0.5, 0.7, 0.9)]


def mixture_seeds(out: Path) -> list[dict[str, Any]]:
    """The mixture study on four more seeds (T = 40: the early rounds are what Fig. 3 reads)."""
    base = merged(load("mixture.toml"), rounds=40, eval_every=40)
    return [execute(f"mixture_kappa{k}_seed{s}", merged(base, seed=s, scenario={"kappa": k}),
                    out) for s in (1, 2, 3, 4) for k in (0.1, 0.3, 0.5, 0.7, 0.9)]


def spectrum_long(out: Path) -> list[dict[str, Any]]:
    """Appendix G with the profile accumulated to T = 200 (clustering never stops), K = 4:
    the singular values at a few rounds, to see whether the 8-angle structure emerges."""
    cfg = merged(load("rotated_mnist.toml"), eval_every=200, backend={"name": "simulation"},
                 algorithm={"stable_rounds": 0})
    row = execute("mnist_cflgp_K4_T200_always_clustering", cfg, out, paired=True)
    records = read_history(out / "mnist_cflgp_K4_T200_always_clustering")
    spectra = {}
    for r in records:
        e = CFLGPClusteringExtras.from_dict(r.extras)
        sv = e.singular_values
        if sv and r.round in (1, 21, 51, 101, 151, 199):
            top = np.asarray(sv[:12])
            spectra[str(r.round)] = {
                "singular_values": [round(float(v), 4) for v in top],
                "largest_gaps_after": (np.argsort(-(top[:-1] - top[1:])) + 1)[:4].tolist(),
                "ratio_after": [round(float(v), 3) for v in top[:-1] / top[1:]],
                "k_estimate": e.k_estimate}
    row["spectra"] = spectra
    return [row]


def aggregation(out: Path) -> list[dict[str, Any]]:
    """Algorithm 1's sum against the mean at lr 0.1: the sum scales the step by |S_k|."""
    base = merged(load("rotated_mnist.toml"), rounds=30, eval_every=10)
    rows = [execute(f"mnist_cflgp_{agg}_T30", merged(base, algorithm={
        "gradient_aggregation": agg}), out, paired=True) for agg in ("sum", "mean")]
    big = merged(base, rounds=10, eval_every=10, scenario={"n_clients": 128},
                 algorithm={"estimate_k": False})
    rows += [execute(f"mnist_cflgp_{agg}_C128_T10", merged(big, algorithm={
        "gradient_aggregation": agg}), out, paired=True) for agg in ("sum", "mean")]
    lin = merged(load("linreg.toml"), rounds=50, eval_every=50, scenario={"n_clients": 48},
                 algorithm={"estimate_k": False})
    rows += [execute(f"linreg_{agg}_C48_T50", merged(lin, algorithm={
        "gradient_aggregation": agg}), out) for agg in ("sum", "mean")]
    return rows


GROUPS = {
    "linreg_main": linreg_main, "mnist_main": mnist_main, "compression": compression,
    "mnist_clients": mnist_clients, "linreg_sweeps": linreg_sweeps, "mixture": mixture,
    "mixture_seeds": mixture_seeds, "spectrum_long": spectrum_long, "aggregation": aggregation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(GROUPS))
    parser.add_argument("--out", default="benchmarks/cfl_gp/runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    start = time.perf_counter()
    for group in args.only.split(","):
        t0 = time.perf_counter()
        rows = GROUPS[group](Path(args.out))
        results[group] = {"runs": rows, "seconds": round(time.perf_counter() - t0, 1)}
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"total {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
