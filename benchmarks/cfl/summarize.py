"""Print the markdown tables of RESULTS.md from `benchmarks/cfl/results/*.json`.

    python benchmarks/cfl/summarize.py [--figures]

With --figures it also draws `figures/congruence_norms.png` (like Fig. 8) and
`figures/gap_vs_points.png` (like Fig. 6) from the JSON results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = Path(__file__).resolve().parent / "figures"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _secs(x: float | None) -> str:
    return "–" if x is None else f"{x / 60:.1f} min"


def clustering(name: str, title: str) -> str:
    r = _load(name)
    if r is None:
        return f"### {title}\n\n(not run)\n"
    acc = r["accuracy_per_true_cluster"]
    rows = [f"| true cluster {k} | {_pct(acc['fedavg'][k])} | {_pct(acc['cfl'][k])} |"
            for k in sorted(acc["cfl"])]
    splits = ", ".join(f"round {s['round']}: {s['groups'][0]} | {s['groups'][1]} "
                       f"(g = {s['gap']:.2f})" for s in r["splits"]) or "none"
    return "\n".join([
        f"### {title}",
        "",
        f"ε1 = {r['eps1']:.3f}, ε2 = {r['eps2']:.3f} (FL peak ‖Δθ‖ = {r['fl_peak_mean_norm']:.3f}; "
        f"the paper's rule ε1 = peak/10 = {r['fl_rule_of_thumb_eps1']:.3f} is undercut in "
        f"{r['fl_rounds_below_rule_of_thumb_after_peak']} FL rounds after the peak).",
        "",
        f"Splits: {splits}. Final ARI {r['ari_final']:.3f}, {r['n_clusters_final']} clusters.",
        "",
        "| mean test accuracy (%) | FedAvg | CFL |",
        "|---|---:|---:|",
        f"| all clients | {_pct(r['accuracy']['fedavg'])} | {_pct(r['accuracy']['cfl'])} |",
        *rows,
        f"| worst client | {_pct(r['client_accuracy_min']['fedavg'])} | "
        f"{_pct(r['client_accuracy_min']['cfl'])} |",
        f"| best client | {_pct(r['client_accuracy_max_fedavg'])} | |",
        "",
        f"Wall time: FedAvg {_secs(r['wall_s']['fedavg'])}, CFL {_secs(r['wall_s']['cfl'])} "
        f"(CPU {_secs(r['cpu_s']['fedavg'])} / {_secs(r['cpu_s']['cfl'])}).",
        "",
    ])


def congruence() -> str:
    r = _load("congruence")
    if r is None:
        return "### Congruent vs incongruent\n\n(not run)\n"
    last = r["last10_mean"]
    lines = ["### Congruent vs incongruent (two clients)", "",
             "| | mean ‖Δθ‖ (last 10 rounds) | max client ‖Δθ_i‖ (last 10) |"
             + " | ".join(f" first split, ε rule '{k}' (ε1, ε2 = {v[0]:.3f}, {v[1]:.3f})"
                          for k, v in r["eps"].items()) + " |",
             "|---|---:|---:|" + "---:|" * len(r["eps"])]
    for case in ("congruent", "incongruent"):
        firsts = " | ".join(str(r["first_split_round"][k][case] or "never") for k in r["eps"])
        lines.append(f"| {case} | {last[case]['mean_norm']:.3f} | {last[case]['max_norm']:.3f} "
                     f"| {firsts} |")
    lines += ["", f"Wall time {_secs(r['wall_s'])} (CPU {_secs(r['cpu_s'])}).", ""]
    return "\n".join(lines)


def gap() -> str:
    r = _load("gap")
    if r is None:
        return "### Separation gap vs data per client\n\n(not run)\n"
    lines = ["### Separation gap after 50 FL rounds vs training points per client", "",
             "| points per client | seed | g(α), weight updates | g(α), full gradients | "
             "FL accuracy (%) |", "|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['n']} | {row['seed']} | {row['gap_update']:.3f} | "
                     f"{row['gap_gradient']:.3f} | {_pct(row['accuracy'])} |")
    wall = sum(row["wall_s"] or 0 for row in r["rows"])
    cpu = sum(row["cpu_s"] or 0 for row in r["rows"])
    lines += ["", f"Wall time {_secs(wall)} (CPU {_secs(cpu)}).", ""]
    return "\n".join(lines)


def draw_figures() -> None:
    """Fig. 8 and Fig. 6 analogues from the JSON results."""
    import numpy as np
    from matplotlib.figure import Figure

    FIGURES.mkdir(exist_ok=True)
    r = _load("congruence")
    if r is not None:
        fig = Figure(figsize=(9, 3.6), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        eps1, eps2 = r["eps"]["plateau"]
        for ax, case in zip(axes, ("incongruent", "congruent")):
            s = r["series"][case]
            x = np.arange(1, len(s["mean_norm"]) + 1)
            ax.plot(x, s["mean_norm"], label="‖mean Δθ‖ (eq. 30)")
            ax.plot(x, s["max_norm"], label="max ‖Δθ_i‖ (eq. 31)")
            ax.axhline(eps1, color="k", ls="-.", lw=0.8, label=f"ε1 = {eps1:.2f}")
            ax.axhline(eps2, color="k", ls=":", lw=0.8, label=f"ε2 = {eps2:.2f}")
            ax.set_title(f"{case} (2 clients)")
            ax.set_xlabel("round")
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("update norm")
        axes[0].legend(fontsize="small")
        fig.savefig(FIGURES / "congruence_norms.png", dpi=100)
    r = _load("gap")
    if r is not None:
        fig = Figure(figsize=(5.5, 3.6), layout="constrained")
        ax = fig.subplots()
        for key, label in (("gap_update", "weight updates"), ("gap_gradient", "gradients")):
            ns = sorted({row["n"] for row in r["rows"]})
            mean = [np.mean([row[key] for row in r["rows"] if row["n"] == n]) for n in ns]
            ax.plot(ns, mean, marker="o", label=label)
            ax.scatter([row["n"] for row in r["rows"]], [row[key] for row in r["rows"]],
                       s=8, color="0.5")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training points per client")
        ax.set_ylabel("separation gap g(α) after 50 rounds")
        ax.set_title("Label swap, MNIST")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.savefig(FIGURES / "gap_vs_points.png", dpi=100)


if __name__ == "__main__":
    if "--figures" in sys.argv:
        draw_figures()
    print(clustering("label_swap", "Label swap, MNIST (20 clients, 4 clusters)"))
    print(clustering("permutation", "Label permutation, Fashion-MNIST (20 clients, 4 clusters)"))
    print(congruence())
    print(gap())
