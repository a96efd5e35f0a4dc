"""Print the markdown tables of RESULTS.md and draw its figures from `results/paper.json`
(the entries that `run.py` writes, one per part, both sessions).

    python benchmarks/cfl/summarize.py [--figures [--runs runs/cfl-bench] [--ref DIR]]

With --figures it also draws, from the JSON:

- `figures/congruence_norms.png` (like Fig. 8) and `figures/gap_vs_points.png` (like Fig. 6)
  of the first session;
- `figures/followup_swap_<variant>.png` (like the paper's Fig. 9): mean test accuracy of the
  clients of each true cluster under CFL next to FedAvg; the separation gap g(α) of every
  cluster (tree node); the mean update norm ‖Δθ_c‖ (eq. 30) and the largest client norm
  max_i ‖Δθ_i‖ (eq. 31) per node with ε1 and ε2; split rounds as vertical lines. The accuracy
  per true cluster and round is not in the JSON: it is read from the run directories
  (`--runs`/followup_swap_<variant> and `--ref`, the FedAvg run, default
  `--runs`/label_swap_fedavg); where they are gone the committed figure is kept, not redrawn;
- `figures/followup_congruence_norms.png` (like Fig. 8): the two norms of the actual CFL runs
  for the incongruent and the congruent pair, with ε1, ε2, the warm-up and the split;
- `figures/followup_gap_vs_points.png` (like Fig. 6): g(α) after 50 FL rounds vs points per
  client, batch 5 (follow-up) next to batch 100 (first session).
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = Path(__file__).resolve().parent / "figures"
PAPER = RESULTS / "paper.json"


@cache
def _table() -> dict[str, Any]:
    return json.loads(PAPER.read_text()) if PAPER.is_file() else {}


def _load(name: str) -> dict[str, Any] | None:
    """The entry of part `name` (e.g. "label_swap", "followup_gap"), None if not run."""
    return _table().get(name)


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
    """Fig. 8 and Fig. 6 analogues of the first session from the JSON results."""
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
        gap_lines(ax, r["rows"])
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training points per client")
        ax.set_ylabel("separation gap g(α) after 50 rounds")
        ax.set_title("Label swap, MNIST")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.savefig(FIGURES / "gap_vs_points.png", dpi=100)


# ---- Follow-up (issue 5) ----------------------------------------------------------------

def _truth_curves(run_dir: Path, truth: list[int]) -> dict[int, tuple[list[int], list[float]]]:
    """Per true cluster: eval rounds and the mean client accuracy, from `history.jsonl`."""
    from clusterfl.records import HISTORY_FILE, read_history

    if not (run_dir / HISTORY_FILE).is_file():
        return {}
    t = np.asarray(truth)
    out: dict[int, tuple[list[int], list[float]]] = {int(k): ([], []) for k in np.unique(t)}
    for r in read_history(run_dir):
        if r.client_accuracy is None:
            continue
        acc = np.asarray(r.client_accuracy, dtype=float)
        for k in out:
            out[k][0].append(r.round)
            out[k][1].append(float(acc[t == k].mean()))
    return out


def _vlines(ax: Any, rounds: list[int]) -> None:
    for x in rounds:
        ax.axvline(x, color="0.4", ls="--", lw=0.8)


def swap_figure(r: dict[str, Any], runs: Path, ref: Path, path: Path) -> Path:
    """Fig. 9 analogue of one label-swap variant, with the FedAvg reference."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 8.5), layout="constrained")
    ax_acc, ax_gap, ax_norm = fig.subplots(3, 1, sharex=True)
    colors = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"]
    cfl = _truth_curves(runs / f"followup_{r['variant']}", r["true_clusters"])
    fed = _truth_curves(ref, r["true_clusters"])
    for k, (xs, ys) in cfl.items():
        ax_acc.plot(xs, np.multiply(ys, 100), color=colors[k], label=f"CFL, true cluster {k}")
    for k, (xs, ys) in fed.items():
        ax_acc.plot(xs, np.multiply(ys, 100), color=colors[k], ls=":", lw=1)
    if fed:
        ax_acc.plot([], [], color="0.3", ls=":", label="FedAvg (dotted, 50 rounds, no lr decay)")
    ax_acc.set_ylabel("mean test accuracy (%)")
    ax_acc.legend(fontsize="x-small", ncol=2, loc="lower right")
    algo = r["config"]["algorithm"]
    ax_acc.set_title(f"Label swap, MNIST, 20 clients: variant {r['variant'][-1].upper()} "
                     f"(ε1 = {algo['eps1']:.3g}, ε2 = {algo['eps2']:.3g}"
                     + (f", lr decay {algo['lr_decay']}" if "lr_decay" in algo else "") + ")",
                     fontsize="medium")
    for j, (node, s) in enumerate(r["nodes"].items()):
        c = colors[j % len(colors)]
        lab = f"node {node} ({s['size'][0]} clients)"
        gaps = [np.nan if g is None else g for g in s["gap"]]
        mk = "o" if len(s["round"]) < 4 else None  # a node that lived 1-3 rounds
        ax_gap.plot(s["round"], gaps, color=c, label=lab, marker=mk, ms=4)
        ax_norm.plot(s["round"], s["mean_norm"], color=c, label=f"{lab}: ‖Δθ_c‖", marker=mk,
                     ms=4)
        ax_norm.plot(s["round"], s["max_norm"], color=c, ls="--", lw=0.9, marker=mk, ms=4)
    ax_gap.axhline(0, color="k", lw=0.8)
    ax_gap.set_ylabel("separation gap g(α)")
    ax_gap.legend(fontsize="x-small", ncol=2)
    ax_norm.axhline(algo["eps1"], color="k", ls="-.", lw=0.8, label="ε1")
    ax_norm.axhline(algo["eps2"], color="k", ls=":", lw=0.8, label="ε2")
    ax_norm.set_ylabel("‖Δθ_c‖ (solid), max ‖Δθ_i‖ (dashed)")
    ax_norm.set_xlabel("communication round")
    ax_norm.legend(fontsize="x-small", ncol=2)
    for ax in (ax_acc, ax_gap, ax_norm):
        _vlines(ax, r["split_rounds"])
        ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=100)
    return path


def _congruence_panel(ax: Any, c: dict[str, Any], algo: dict[str, Any], title: str) -> None:
    for j, (node, s) in enumerate(c["nodes"].items()):
        tag = "" if node == "0" else f" (node {node}: {s['size'][0]} client)"
        ax.plot(s["round"], s["mean_norm"], color=f"C{2 * j}", lw=1,
                label=f"‖mean Δθ‖ (eq. 30){tag}")
        if node == "0":
            ax.plot(s["round"], s["max_norm"], color=f"C{2 * j + 1}", lw=1,
                    label="max ‖Δθ_i‖ (eq. 31)")
    ax.axhline(algo["eps1"], color="k", ls="-.", lw=0.8, label=f"ε1 = {algo['eps1']:g}")
    ax.axhline(algo["eps2"], color="k", ls=":", lw=0.8, label=f"ε2 = {algo['eps2']:g}")
    ax.axvspan(0, algo["warmup_rounds"], color="0.85", label="no split (warm-up)")
    _vlines(ax, c["split_rounds"])
    ax.set_title(title, fontsize="medium")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def congruence_figure(r: dict[str, Any], fl: dict[str, Any] | None,
                      heldout: dict[str, Any] | None, path: Path) -> Path:
    """Fig. 8 analogue: the pre-declared CFL runs (top), FL with splitting disabled (middle,
    if run) and the held-out CFL runs on seed 1 (bottom, if run)."""
    panels = [(r, "CFL, seed 0")]
    if fl is not None:
        panels.append((fl, "FL (no split), seed 0"))
    if heldout is not None:
        panels.append((heldout, "CFL, seed 1 (held out)"))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8 * len(panels)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(panels), 2, sharey=True, sharex=True))
    for row, (res, what) in enumerate(panels):
        algo = res["algorithm"] if row != 1 else r["algorithm"]
        for k, case in enumerate(("incongruent", "congruent")):
            c = res["cases"][case]
            split = ", ".join(map(str, c["split_rounds"])) or "never"
            title = f"{case} pair, {what}" + ("" if what.startswith("FL") else f": split {split}")
            _congruence_panel(axes[row, k], c, algo, title)
    for ax in axes[-1]:
        ax.set_xlabel("communication round")
    for ax in axes[:, 0]:
        ax.set_ylabel("update norm (log)")
    fig.savefig(path, dpi=100)
    return path


def gap_lines(ax: Any, rows: list[dict[str, Any]], tag: str | None = None,
              ls: str = "-") -> None:
    """Fig. 6's points on `ax`: the separation gap per training-set size (each run grey, the
    mean over seeds a line), from weight updates and from gradients."""
    for key, label, color in (("gap_update", "weight updates", "C0"),
                              ("gap_gradient", "gradients", "C1")):
        ns = sorted({row["n"] for row in rows})
        mean = [np.mean([row[key] for row in rows if row["n"] == n]) for n in ns]
        ax.plot(ns, mean, marker="o", ls=ls, color=color,
                label=label if tag is None else f"{label}, {tag}")
        ax.scatter([row["n"] for row in rows], [row[key] for row in rows], s=8, color="0.5")


def gap_figure(new: dict[str, Any], old: dict[str, Any] | None, path: Path) -> Path:
    """Fig. 6 analogue: both local-training setups."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    sets = [(new, "batch 5, lr 0.01", "-")]
    if old is not None:
        sets.append((old, "batch 100, lr 0.05 (last session)", ":"))
    for res, tag, ls in sets:
        gap_lines(ax, res["rows"], tag, ls)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training points per client")
    ax.set_ylabel("separation gap g(α) after 50 FL rounds")
    ax.set_title("Label swap, MNIST, 20 clients (Fig. 6 analogue)", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.savefig(path, dpi=100)
    return path


def swap_table(r: dict[str, Any]) -> str:
    acc = r["accuracy_per_true_cluster"]
    n = r["ref_rounds"]
    lines = [f"Variant {r['variant']}: splits at rounds {r['split_rounds']}; ARI at round {n} "
             f"{r['ari_at_ref_rounds']:.3f}, at round {r['rounds']} {r['ari_final']:.3f} "
             f"({r['n_clusters_final']} clusters). Wall {r['timing']['wall_s'] / 60:.1f} min, "
             f"CPU {r['timing']['cpu_s'] / 60:.1f} min.", "",
             "| split round | node | groups | g(α) | α_cross_max | ‖Δθ_c‖ | max ‖Δθ_i‖ |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for s in r["splits"]:
        lines.append(f"| {s['round']} | {s['node']} | {s['groups'][0]} / {s['groups'][1]} | "
                     f"{s['gap']:.2f} | {s['alpha_cross_max']:.2f} | {s['mean_norm']:.2f} | "
                     f"{s['max_norm']:.2f} |")
    lines += ["", f"| mean test accuracy (%) | FedAvg, round {n} | CFL, round {n} | "
              f"CFL, round {r['rounds']} |", "|---|---:|---:|---:|",
              f"| all clients | {_pct(r['accuracy']['fedavg_ref'])} | "
              f"{_pct(r['accuracy']['cfl_at_ref_rounds'])} | {_pct(r['accuracy']['cfl_final'])} |"]
    for k in sorted(acc["cfl_final"]):
        lines.append(f"| true cluster {k} | {_pct(acc['fedavg_ref'][k])} | "
                     f"{_pct(acc['cfl_at_ref_rounds'][k])} | {_pct(acc['cfl_final'][k])} |")
    ca = r["client_accuracy"]
    lines.append(f"| worst client | {_pct(min(ca['fedavg_ref']))} | "
                 f"{_pct(min(ca['cfl_at_ref_rounds']))} | {_pct(min(ca['cfl_final']))} |")
    lines.append(f"| best client | {_pct(max(ca['fedavg_ref']))} | "
                 f"{_pct(max(ca['cfl_at_ref_rounds']))} | {_pct(max(ca['cfl_final']))} |")
    return "\n".join(lines) + "\n"


def congruence_table(r: dict[str, Any]) -> str:
    lines = ["| pair | split rounds | ‖Δθ‖ at split (or last 10 rounds) | max ‖Δθ_i‖ | "
             "final accuracy (%) | wall / CPU (min) |", "|---|---|---:|---:|---:|---:|"]
    for case, c in r["cases"].items():
        root = c["nodes"]["0"]
        if c["splits"]:
            s = c["splits"][0]
            mean, mx = f"{s['mean_norm']:.3f}", f"{s['max_norm']:.3f}"
        else:
            mean = f"{np.mean(root['mean_norm'][-10:]):.4f}"
            mx = f"{np.mean(root['max_norm'][-10:]):.4f}"
        lines.append(f"| {case} | {c['split_rounds'] or 'never'} | {mean} | {mx} | "
                     f"{_pct(c['accuracy_curve'][-1][1])} | {c['timing']['wall_s'] / 60:.1f} / "
                     f"{c['timing']['cpu_s'] / 60:.1f} |")
    return "\n".join(lines) + "\n"


def rule_grid(fl: dict[str, Any], warmup: int = 20) -> str:
    """Post hoc: the first round in which eq. (30)-(31) would fire on each FL trajectory, for
    a grid of (ε1, ε2 = k ε1). CFL before its first split is this FL run, so this is the round
    CFL with that pair would split. It is an analysis of two finished runs, not a tuned
    result."""
    eps1s = (0.49, 0.1, 0.05, 0.01, 0.005, 0.002)
    ks = (1, 2, 3, 5, 8, 10)
    lines = ["| ε1 \\ ε2/ε1 | " + " | ".join(str(k) for k in ks) + " |",
             "|---|" + "---|" * len(ks)]
    for e1 in eps1s:
        cells = []
        for k in ks:
            first = {}
            for case, c in fl["cases"].items():
                s = c["nodes"]["0"]
                first[case] = next((t for t, m, x in zip(s["round"], s["mean_norm"],
                                                         s["max_norm"])
                                    if t > warmup and m < e1 and x > k * e1), None)
            cells.append(f"{first['incongruent'] or '–'} / {first['congruent'] or '–'}")
        lines.append(f"| {e1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def gap_table(r: dict[str, Any]) -> str:
    lines = ["| points per client | seed | local steps per round | g(α), weight updates | "
             "g(α), full gradients | FL accuracy (%) |", "|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        steps = 3 * -(-row["n"] // r["train"]["batch_size"])
        lines.append(f"| {row['n']} | {row['seed']} | {steps} | {row['gap_update']:.3f} | "
                     f"{row['gap_gradient']:.3f} | {_pct(row['accuracy'])} |")
    wall = sum(row["wall_s"] for row in r["rows"]) / 60
    cpu = sum(row["cpu_s"] for row in r["rows"]) / 60
    return "\n".join(lines) + f"\n\nWall {wall:.1f} min, CPU {cpu:.1f} min.\n"


def _followup_gap() -> dict[str, Any] | None:
    """`followup_gap` with the rows of `followup_gap_more` (two more seeds) merged in."""
    r, more = _load("followup_gap"), _load("followup_gap_more")
    if r is not None and more is not None:
        r = {**r, "rows": sorted(r["rows"] + more["rows"], key=lambda x: (x["n"], x["seed"]))}
    return r


def followup_figures(runs: Path, ref: Path) -> None:
    """Draw every follow-up figure whose JSON exists (and print its path)."""
    from clusterfl.records import HISTORY_FILE

    for v in ("swap_a", "swap_b"):
        r, path = _load(f"followup_{v}"), FIGURES / f"followup_{v}.png"
        if r is None:
            continue
        if all((d / HISTORY_FILE).is_file() for d in (runs / f"followup_{v}", ref)):
            print(swap_figure(r, runs, ref, path))
        else:
            print(f"{path}: kept; its accuracy panel needs the run directories "
                  f"{runs / f'followup_{v}'} and {ref}, which are not here")
    r = _load("followup_congruence")
    if r is not None:
        print(congruence_figure(r, _load("followup_congruence_fl"),
                                _load("followup_congruence_heldout"),
                                FIGURES / "followup_congruence_norms.png"))
    r = _followup_gap()
    if r is not None:
        print(gap_figure(r, _load("gap"), FIGURES / "followup_gap_vs_points.png"))


def followup_tables() -> None:
    """Print the tables of the follow-up whose JSON exists."""
    for v in ("swap_a", "swap_b"):
        r = _load(f"followup_{v}")
        if r is not None:
            print(swap_table(r))
    r = _load("followup_congruence")
    if r is not None:
        fl = _load("followup_congruence_fl")
        held = _load("followup_congruence_heldout")
        if held is not None:
            print(congruence_table(held))
        print(congruence_table(r))
        if fl is not None:
            print(congruence_table(fl))
            print(rule_grid(fl))
    r = _followup_gap()
    if r is not None:
        print(gap_table(r))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--figures", action="store_true", help="also draw figures/*.png")
    p.add_argument("--runs", default="runs/cfl-bench",
                   help="run directories (run.py --out), for the swap figures' accuracy panel")
    p.add_argument("--ref", default=None,
                   help="the FedAvg label-swap run directory (default RUNS/label_swap_fedavg)")
    args = p.parse_args(argv)
    if args.figures:
        FIGURES.mkdir(exist_ok=True)
        draw_figures()
        runs = Path(args.runs)
        followup_figures(runs, Path(args.ref) if args.ref else runs / "label_swap_fedavg")
    print(clustering("label_swap", "Label swap, MNIST (20 clients, 4 clusters)"))
    print(clustering("permutation", "Label permutation, Fashion-MNIST (20 clients, 4 clusters)"))
    print(congruence())
    print(gap())
    followup_tables()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
