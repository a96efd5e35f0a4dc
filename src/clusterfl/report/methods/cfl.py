"""Figures of a CFL run (Sattler et al. 2020), drawn from the per-round `extras` of CFL.

- `cfl_norms.png` (like the paper's Fig. 8): per cluster (tree node) the norm of the mean
  update ‖Δθ_c‖ (solid) and the largest client update norm max_i ‖Δθ_i‖ (dashed), with the
  split rounds and, under the paper's ε rule, its thresholds ε1 and ε2.
- `cfl_accuracy_gap.png` (like Fig. 9): top, the mean test accuracy of the clients of each
  true cluster (or of each final cluster when the truth is unknown); bottom, the separation
  gap g(α) of every cluster per round; split rounds marked.
- `cfl_split_test.png`: per cluster and round the quantities of the split test: the
  stationarity ratio ‖Δθ_c‖ / mean ‖Δθ_i‖, the smaller within-side and the cross mean cosine of
  the candidate bipartition (Algorithm 1), the separation gap with the auto rule's nesting
  quantities (max within − cross of the candidate, and the same of the split that formed the
  cluster), and why the cluster did not split (one row per reason); the auto rule's
  constants drawn when it is the run's rule.
- `cfl_similarity_<round>_<node>.png`: for every accepted split, the cosine similarity of the
  split cluster's updates, ordered by the two groups (and by true cluster inside them).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from clusterfl.algorithms.cfl import CFLExtras
from clusterfl.clustering.split_rule import AutoRuleConfig, Refusal
from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report.figures import integer_ticks, save_png


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """Draw the CFL figures of a run into `run_dir / "figures"`; returns the files written."""
    out = Path(run_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    records = [r for r in records if CFLExtras.from_dict(r.extras).mean_norm]  # CFL rounds
    if not records:
        return []
    eps = _thresholds(Path(run_dir))
    truth = summary.true_clusters
    paths = [
        plot_norms(records, out / "cfl_norms.png", eps),
        plot_accuracy_gap(records, out / "cfl_accuracy_gap.png", truth),
    ]
    if any("stationarity" in r.extras for r in records):
        paths.append(plot_split_test(records, out / "cfl_split_test.png", eps))
    paths += plot_split_similarities(records, out, truth)
    return paths


# --------------------------------------------------------------------------- series


def split_rounds(records: list[RoundRecord]) -> list[int]:
    """Rounds in which a cluster split."""
    return [r.round for r in records if CFLExtras.from_dict(r.extras).split]


def node_series(records: list[RoundRecord], values: Callable[[CFLExtras], Sequence[float | None]]
                ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """`node id -> (rounds, values)` of a per-cluster extra, e.g. `lambda e: e.mean_norm`
    (`mean_norm`, `max_norm`, `gap`)."""
    acc: dict[int, tuple[list[int], list[float]]] = {}
    for r in records:
        e = CFLExtras.from_dict(r.extras)
        for node, value in zip(e.clusters, values(e)):
            xs, ys = acc.setdefault(int(node), ([], []))
            xs.append(r.round)
            ys.append(np.nan if value is None else float(value))
    return {k: (np.array(x), np.array(y)) for k, (x, y) in sorted(acc.items())}


def group_accuracy(records: list[RoundRecord], groups: np.ndarray, key: str = "client_accuracy"
                   ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """`group -> (rounds, mean client accuracy of the group)` over evaluated rounds (of
    another per-client metric with `key`, e.g. "client_mse")."""
    rows = [(r.round, getattr(r, key)) for r in records if getattr(r, key)]
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if not rows or all(a is None for _, row in rows for a in row):
        return out
    rounds = np.array([t for t, _ in rows])
    acc = np.array([[np.nan if a is None else a for a in row] for _, row in rows], dtype=float)
    for g in np.unique(groups):
        out[int(g)] = (rounds, np.nanmean(acc[:, groups == g], axis=1))
    return out


def _thresholds(run_dir: Path) -> dict[str, float]:
    """ε1, ε2, or the auto rule's constants, from the run's config.toml (empty if
    unreadable); the auto rule's options are read from `[algorithm.auto]`, or flat in
    `[algorithm]` as runs wrote them before it."""
    try:
        text = (run_dir / "config.toml").read_text(encoding="utf-8")
        algo = tomllib.loads(text).get("algorithm", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    if algo.get("split_rule", "epsilon" if {"eps1", "eps2"} & set(algo) else "auto") != "epsilon":
        auto = {**algo, **algo.get("auto", {})}
        return {k: float(auto.get(k, d)) for k, d in AUTO_DEFAULTS.items()}
    return {k: float(algo[k]) for k in ("eps1", "eps2") if k in algo}


AUTO_DEFAULTS = {k: float(AutoRuleConfig.model_fields[k].default)
                 for k in ("stationarity_max", "separation", "significance")}
"""Constants of the auto split rule drawn in `cfl_split_test.png` (its options' defaults)."""


# --------------------------------------------------------------------------- figures


def _marks(ax: Any, rounds: list[int]) -> None:
    for i, t in enumerate(rounds):
        ax.axvline(t, color="0.35", ls=":", lw=1.2, label="split" if i == 0 else None)


def _save(fig: Figure, path: Path) -> Path:
    return save_png(fig, path, 110)


def plot_norms(records: list[RoundRecord], path: Path, eps: dict[str, float]) -> Path:
    """Fig. 8: mean update norm (solid) and max client norm (dashed) per cluster."""
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.subplots()
    mean = node_series(records, lambda e: e.mean_norm)
    peak = node_series(records, lambda e: e.max_norm)
    for i, node in enumerate(mean):
        color = f"C{i % 10}"
        ax.plot(*mean[node], color=color, lw=1.5, label=f"‖mean Δθ‖ node {node}")
        ax.plot(*peak[node], color=color, lw=1.2, ls="--", label=f"max ‖Δθ_i‖ node {node}")
    for key, style in (("eps1", "-."), ("eps2", (0, (5, 2, 1, 2)))):
        if key in eps:
            ax.axhline(eps[key], color="k", lw=0.9, ls=style, label=f"ε{key[-1]} = {eps[key]:.3g}")
    _marks(ax, split_rounds(records))
    ax.set_xlabel("round")
    integer_ticks(ax)
    ax.set_ylabel("update norm")
    ax.set_title("CFL update norms (solid: cluster mean, dashed: largest client)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2, loc="best")
    return _save(fig, path)


def plot_accuracy_gap(records: list[RoundRecord], path: Path, truth: Any) -> Path:
    """Fig. 9: accuracy per client group (top) and separation gap per cluster (bottom)."""
    fig = Figure(figsize=(7.5, 6.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    if truth is not None:
        groups, name = np.asarray(truth, dtype=int), "true cluster"
    else:
        groups, name = np.asarray(records[-1].assignment, dtype=int), "final cluster"
    what = "accuracy"
    series = group_accuracy(records, groups)
    if not series:  # a regression: its clients have an MSE, no accuracy
        what, series = "MSE", group_accuracy(records, groups, "client_mse")
    for g, (x, y) in series.items():
        top.plot(x, y, marker="o" if len(x) <= 40 else None, ms=3, label=f"{name} {g}")
    if not series:
        top.text(0.5, 0.5, "no evaluated round", transform=top.transAxes, ha="center",
                 va="center", color="0.4")
    top.set_ylabel(f"mean test {what}")
    top.set_title(f"CFL: {what} per client group (top), separation gap g(α) per cluster")
    gaps = node_series(records, lambda e: e.gap)
    for node, (x, y) in gaps.items():
        if np.isfinite(y).any():
            bottom.plot(x, y, lw=1.3, label=f"node {node}")
    bottom.axhline(0.0, color="k", lw=0.8)
    if not any(np.isfinite(y).any() for _, y in gaps.values()):
        bottom.text(0.5, 0.5, "true clusters unknown: no gap", transform=bottom.transAxes,
                    ha="center", va="center", color="0.4")
    bottom.set_ylabel("separation gap g(α)")
    bottom.set_xlabel("round")
    splits = split_rounds(records)
    for ax in (top, bottom):
        _marks(ax, splits)
        ax.grid(True, alpha=0.3)
        integer_ticks(ax)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", ncol=2, loc="best")
    return _save(fig, path)


def plot_split_similarities(records: list[RoundRecord], out: Path, truth: Any) -> list[Path]:
    """One heatmap per accepted split: similarity ordered by group, then by true cluster."""
    from clusterfl.report.figures import plot_matrix

    paths = []
    for r in records:
        for event in CFLExtras.from_dict(r.extras).splits:
            if not event["accepted"] or "similarity" not in event:
                continue
            members = np.asarray(event["members"], dtype=int)
            group = np.isin(members, event["groups"][1]).astype(int)
            true = None if truth is None else np.asarray(truth, dtype=int)[members]
            key = (group, members) if true is None else (group, true, members)
            order = np.lexsort(key[::-1])
            labels = group if true is None else true
            name = f"cfl_similarity_{r.round}_{int(event['node'])}.png"
            title = (f"round {r.round}: split of node {event['node']} "
                     f"(α_cross_max = {event['alpha_cross_max']:.3f})")
            paths.append(plot_matrix(np.asarray(event["similarity"]), order, out / name, title,
                                     labels=labels))
    return paths


def within_min_series(records: list[RoundRecord]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """`node -> (rounds, smaller within-side mean)`; a side of one client has none (skipped);
    NaN when neither side has two clients."""
    acc: dict[int, tuple[list[int], list[float]]] = {}
    for r in records:
        e = CFLExtras.from_dict(r.extras)
        for node, pair in zip(e.clusters, e.within_mean):
            xs, ys = acc.setdefault(int(node), ([], []))
            vals = [v for v in (pair or []) if v is not None]
            xs.append(r.round)
            ys.append(min(vals) if vals else np.nan)
    return {k: (np.array(x), np.array(y)) for k, (x, y) in sorted(acc.items())}


def refusal_series(records: list[RoundRecord]) -> dict[int, tuple[list[int], list[str]]]:
    """`node -> (rounds, reason)`: why the cluster did not split ("split" when it did)."""
    out: dict[int, tuple[list[int], list[str]]] = {}
    for r in records:
        e = CFLExtras.from_dict(r.extras)
        for node, reason in zip(e.clusters, e.refused):
            xs, ys = out.setdefault(int(node), ([], []))
            xs.append(r.round)
            ys.append("split" if reason is None else _short(str(reason)))
    return out


SHORT = {Refusal.NOT_NESTED: "less apart than when formed",
         Refusal.NOT_SIGNIFICANT: "not beyond shuffles",
         Refusal.TOO_FEW_TO_SHUFFLE: "not beyond shuffles ({n}: too few)",
         Refusal.TOO_FEW_TOGETHER: "not beyond shuffles together (too few)",
         Refusal.FEW_FOR_SIDES: "< 2 × min_side answered",
         Refusal.SMALL_CLUSTER: "< min_split_size",
         Refusal.FEW_ANSWERED: "< 2 answered",
         Refusal.PATIENCE: "patience",
         Refusal.NO_PROGRESS: "no progress",
         Refusal.PAIR_NORMS: "pair: norms below {share} × peak"}
"""Row labels of the decisions in `cfl_split_test.png` (the others: the refusal's text)."""


def _short(reason: str) -> str:
    """A refusal reason (`CFLExtras.refused`) as a row label of the figure: "patience 2/3" →
    "patience", "no progress: loss ≥ …" → "no progress", long reasons abbreviated; a text
    that is no `Refusal` as it is."""
    try:
        refusal, values = Refusal.read(reason)
    except ValueError:
        return reason
    return SHORT[refusal].format(**values) if refusal in SHORT else reason


def plot_split_test(records: list[RoundRecord], path: Path, consts: dict[str, float]) -> Path:
    """The split test per cluster: stationarity ratio, within/cross cosine means, separation
    gap and the reason a split was refused."""
    fig = Figure(figsize=(7.5, 9.0), layout="constrained")
    ax_r, ax_c, ax_g, ax_w = fig.subplots(4, 1, sharex=True,
                                         gridspec_kw={"height_ratios": [1, 1.2, 1, 1]})
    ratio = node_series(records, lambda e: e.stationarity)
    cross = node_series(records, lambda e: e.cross_mean)
    within, gaps = within_min_series(records), node_series(records, lambda e: e.gap)
    colors = {node: f"C{i % 10}" for i, node in enumerate(ratio)}
    for node, (x, y) in ratio.items():
        ax_r.plot(x, y, color=colors[node], lw=1.3, label=f"node {node}")
    if "stationarity_max" in consts:
        ax_r.axhline(consts["stationarity_max"], color="k", lw=0.9, ls="-.",
                     label=f"stationarity_max = {consts['stationarity_max']:.3g}")
    pvals = node_series(records, lambda e: e.p_value)
    for node, (x, y) in pvals.items():
        if np.isfinite(y).any():
            ax_r.scatter(x, y, marker="x", s=14, lw=0.9, color=colors.get(node, "k"),
                         label=f"shuffle p-value node {node}")
    if consts.get("significance", 0) > 0 and pvals and \
            any(np.isfinite(y).any() for _, y in pvals.values()):
        ax_r.axhline(consts["significance"], color="k", lw=0.9, ls=":",
                     label=f"significance = {consts['significance']:.3g}")
    ax_r.set_ylabel("‖Δθ_c‖ / mean ‖Δθ_i‖\n(x: shuffle p-value)")
    ax_r.set_title("CFL split test per cluster (dotted lines: splits)")
    for node, (x, y) in within.items():
        ax_c.plot(x, y, color=colors.get(node, "k"), lw=1.3, label=f"within (min) node {node}")
        if "separation" in consts:
            ax_c.plot(x, consts["separation"] * y, color=colors.get(node, "k"), lw=0.7,
                      ls=":")
    for node, (x, y) in cross.items():
        ax_c.plot(x, y, color=colors.get(node, "k"), lw=1.1, ls="--", label=f"cross node {node}")
    ax_c.axhline(0.0, color="k", lw=0.6)
    ax_c.set_ylabel("mean cosine of the\ncandidate bipartition")
    if "separation" in consts:
        ax_c.text(0.01, 0.02, f"thin dotted: separation ({consts['separation']:.3g}) × within",
                  transform=ax_c.transAxes, fontsize="x-small", color="0.3")
    for node, (x, y) in gaps.items():
        if np.isfinite(y).any():
            ax_g.plot(x, y, color=colors.get(node, "k"), lw=1.3)
    apart = node_series(records, lambda e: e.separation)
    formed = node_series(records, lambda e: e.formed_separation)
    for series, style in ((apart, "--"), (formed, "-.")):
        for node, (x, y) in series.items():
            if np.isfinite(y).any():
                ax_g.plot(x, y, color=colors.get(node, "k"), lw=0.9, ls=style)
    ax_g.axhline(0.0, color="k", lw=0.8)
    ax_g.set_ylabel("how far apart")
    ax_g.text(0.01, 0.02, "solid: g(α); dashed: max within − cross; dash-dot: the same "
              "when the cluster formed",
              transform=ax_g.transAxes, fontsize="x-small", color="0.3")
    reasons = refusal_series(records)
    names = sorted({y for _, ys in reasons.values() for y in ys}, key=lambda v: (v == "split", v))
    row = {name: i for i, name in enumerate(names)}
    for k, (node, (xs, ys)) in enumerate(reasons.items()):
        ax_w.scatter(xs, [row[y] + 0.08 * (k % 4) for y in ys], s=9,
                     color=colors.get(node, "k"))
    ax_w.set_yticks(range(len(names)), names, fontsize="x-small")
    ax_w.set_ylabel("decision")
    ax_w.set_xlabel("round")
    splits = split_rounds(records)
    for ax in (ax_r, ax_c, ax_g, ax_w):
        _marks(ax, splits)
        ax.grid(True, alpha=0.3)
        integer_ticks(ax)
    for ax in (ax_r, ax_c):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="xx-small", ncol=3, loc="best")
    return _save(fig, path)
