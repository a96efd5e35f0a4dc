"""The report of a sweep: what differs between cells, mean ± std with 95 % intervals per cell,
paired comparisons of the methods on the same seeds, and curves with a band over seeds.

Reads the tidy rows of `clusterfl.sweep.collect` and the runs' `history.jsonl`; writes
`report.md` and `figures/` in the sweep's folder. The statistics are `clusterfl.stats`'s.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.stats import SECONDS, Described, describe, holm, number, paired
from clusterfl.sweep import Run, Sweep, config_changed

# shown metrics: (row key, header, scale, digits)
SHOWN = (("macro_f1", "macro-F1 (%)", 100.0, 1), ("ari", "ARI", 1.0, 2),
         ("n_clusters", "clusters", 1.0, 1), ("rounds_to_ari1", "rounds to ARI 1", 1.0, 1),
         ("wall_time", "wall time (s)", 1.0, SECONDS))
WORD_ACCURACY = ("accuracy_no_oov_no_eos", "acc. no oov/eos (%)", 100.0, 1)
"""A language model's accuracy on targets other than <unk> and <eos>: after the perplexity
(in place of macro-F1, which a language model has not), when some run has it."""
ALPHA = 0.05
RANGES = {"accuracy": (0.0, 1.0), "mse": (0.0, np.inf), "perplexity": (1.0, np.inf)}
"""The values a primary metric can take: an interval reaching outside is said (`range_note`)."""
NO_METRIC = ("", "metric", 1.0, ".4g", False)
"""`primary` when no finished run has an accuracy, MSE or perplexity (every run failed):
the tables say "metric" over empty cells, the titles that no run has one."""


def primary(rows: Sequence[dict[str, Any]]) -> tuple[str, str, float, int | str, bool]:
    """The metric the comparisons use: (key, header, scale, digits, higher is better); a
    language model's perplexity (lower is better) before its token accuracy; `NO_METRIC`
    when no finished run has any."""
    if any(r.get("perplexity") is not None for r in rows):
        return "perplexity", "perplexity", 1.0, 2, False
    if any(r.get("accuracy") is not None for r in rows):
        return "accuracy", "accuracy (%)", 100.0, 1, True
    if any(r.get("mse") is not None for r in rows):
        return "mse", "MSE", 1.0, ".4g", False  # 4 significant digits: 1e-5 is not "0.0000"
    return NO_METRIC


def _value(row: dict[str, Any], key: str) -> float | None:
    if row["status"] not in ("done", "diverged"):
        return None
    v = row.get(key)
    return None if v is None else float(v)


def cells_of(rows: Sequence[dict[str, Any]]) -> list[str | None]:
    out: list[str | None] = []
    for r in rows:
        if r["cell"] not in out:
            out.append(r["cell"])
    return out


def methods_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in rows:
        if r["method"] not in out:
            out.append(r["method"])
    return out


def values(rows: Sequence[dict[str, Any]], cell: str | None, method: str, key: str,
           seeds: Sequence[int]) -> list[float | None]:
    """The metric of each seed (None: not finished), in the order of `seeds`."""
    by_seed = {r["seed"]: _value(r, key) for r in rows
               if r["cell"] == cell and r["method"] == method}
    return [by_seed.get(s) for s in seeds]


def comparisons(rows: Sequence[dict[str, Any]], cell: str | None, seeds: Sequence[int],
                key: str) -> list[dict[str, Any]]:
    """Every pair of methods of one cell on `key`: the paired statistics, with Holm's
    adjustment over the pairs of the cell."""
    methods = methods_of([r for r in rows if r["cell"] == cell])
    out: list[dict[str, Any]] = []
    for a, b in itertools.combinations(methods, 2):
        res = paired(values(rows, cell, a, key, seeds), values(rows, cell, b, key, seeds))
        out.append({"a": a, "b": b, "result": res})
    for entry, p in zip(out, holm([e["result"].p for e in out])):
        entry["p_holm"] = p
    return out


def _p(p: float | None) -> str:
    """3 decimals, or as many more as tell a p below ALPHA from ALPHA (0.04996 is not
    "0.050" beside a verdict of p < 0.05)."""
    if p is None:
        return "–"
    if p < 0.001:
        return "< 0.001"
    for places in range(3, 17):
        text = f"{p:.{places}f}"
        if (float(text) < ALPHA) == (p < ALPHA):
            return text
    return repr(p)


def _verdict(a: str, b: str, entry: dict[str, Any], higher: bool) -> str:
    res = entry["result"]
    if res.n < 2 or res.p is None:
        return "too few paired seeds"
    if res.identical:
        return "identical on every seed"
    p = entry["p_holm"]
    if p is None or p >= ALPHA:
        return "no significant difference"
    better = a if (res.diff.mean > 0) == higher else b
    return f"**{better}** better (Holm p < {ALPHA})"


def comparison_table(rows: Sequence[dict[str, Any]], cell: str | None, seeds: Sequence[int]
                     ) -> str:
    key, _, scale, digits, higher = primary(rows)
    entries = comparisons(rows, cell, seeds, key) if key else []
    if not entries:
        return ""
    unit = "% points" if scale != 1 else key
    head = ["A", "B", "pairs", f"mean A − B ± std [95 % CI] ({unit})",
            "t (df)", "p, paired t", "p, Holm", "p, Wilcoxon", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        res = e["result"]
        t = "–" if res.t is None else (f"{res.t:+.2f} ({res.df})" if np.isfinite(res.t)
                                       else f"{'+' if res.t > 0 else '−'}∞ ({res.df})")
        lines.append("| " + " | ".join([
            e["a"], e["b"], str(res.n), res.diff.text(digits, scale), t, _p(res.p),
            _p(e["p_holm"]), _p(res.p_wilcoxon), _verdict(e["a"], e["b"], e, higher)]) + " |")
    return "\n".join(lines)


def _words(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether some run is a language model with an accuracy without <unk>/<eos>."""
    return any(r.get(WORD_ACCURACY[0]) is not None for r in rows)


def cell_table(rows: Sequence[dict[str, Any]], cell: str | None, seeds: Sequence[int]) -> str:
    key, header, scale, digits, _ = primary(rows)
    shown = [(key, header + " mean ± std [95 % CI]", scale, digits), *SHOWN]
    if key == "perplexity":  # a language model: no macro-F1; its word accuracy, if known
        shown = [shown[0], *([WORD_ACCURACY] if _words(rows) else []), *SHOWN[1:]]
    head = ["method", "seeds", *[h for _, h, _, _ in shown]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods_of([r for r in rows if r["cell"] == cell]):
        mine = [r for r in rows if r["cell"] == cell and r["method"] == method]
        finished = sum(r["status"] in ("done", "diverged") for r in mine)
        seeds_cell = seeds_text(rows, cell, method, seeds)
        cells = []
        for k, _, sc, dg in shown:
            d = describe(values(rows, cell, method, k, seeds))
            if k == "rounds_to_ari1":  # how many seeds reached ARI 1 at all
                known = any(r.get("ari") is not None for r in mine)
                cells.append("–" if not known or not finished else "never" if not d.n else
                             f"{_short(d, dg, sc)} ({d.n}/{finished})")
            else:
                cells.append(d.text(dg, sc) if k == key else _short(d, dg, sc))
        lines.append("| " + " | ".join([method, seeds_cell, *cells]) + " |")
    return "\n".join(lines)


def seeds_text(rows: Sequence[dict[str, Any]], cell: str | None, method: str,
               seeds: Sequence[int]) -> str:
    """The seeds column of a method in a cell, in the report and on the console: finished of
    all, and how many of them have the metric when some finished without it ("2/2 (0 with
    perplexity)": diverged, its metric not finite)."""
    key, header, _, _, _ = primary(rows)
    mine = [r for r in rows if r["cell"] == cell and r["method"] == method]
    finished = sum(r["status"] in ("done", "diverged") for r in mine)
    known = describe(values(rows, cell, method, key, seeds)).n
    return f"{finished}/{len(mine)}" + (f" ({known} with {_name(header)})" if known < finished
                                        else "")


def _name(header: str) -> str:
    """"accuracy (%)" → "accuracy": the metric's name without its unit."""
    return header.split(" (")[0]


def _short(d: Described, digits: int | str, scale: float) -> str:
    if d.mean is None:
        return "–"
    return number(d.mean * scale, digits) + ("" if d.std is None else
                                             f" ± {number(d.std * scale, digits)}")


def overview_table(rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> str:
    key, header, scale, digits, _ = primary(rows)
    cells = cells_of(rows)
    head = ["method", *[f"`{c}`" if c else header for c in cells]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods_of(rows):
        lines.append("| " + " | ".join(
            [method, *[_overview_cell(rows, c, method, key, seeds, digits, scale)
                       for c in cells]]) + " |")
    return "\n".join(lines)


def _overview_cell(rows: Sequence[dict[str, Any]], cell: str | None, method: str, key: str,
                   seeds: Sequence[int], digits: int | str, scale: float) -> str:
    """Mean ± std, and over how many of the finished seeds when the metric is missing from
    some (a diverged run whose MSE overflowed)."""
    d = describe(values(rows, cell, method, key, seeds))
    finished = sum(r["status"] in ("done", "diverged") for r in rows
                   if r["cell"] == cell and r["method"] == method)
    return _short(d, digits, scale) + (f" ({d.n}/{finished} seeds)" if 0 < d.n < finished
                                       else "")


def differs_table(sweep: Sweep) -> str:
    keys = list(sweep.grid)
    if not keys:
        return "One cell: every run uses the base config; only the method and the seed differ."
    lines = ["| cell | " + " | ".join(f"`{k}`" for k in keys) + " |",
             "|" + "---|" * (len(keys) + 1)]
    for cell in sweep.cells():
        lines.append(f"| `{cell.name}` | " + " | ".join(
            f"{v!r}" if isinstance(v, str) else str(v) for _, v in cell.values) + " |")
    base = {k: _lookup(sweep.base, k) for k in keys}
    written = [f"`{k}` = {v!r}" for k, v in base.items() if v is not None]
    note = ("the base config has " + ", ".join(written)) if written else (
        "the base config leaves them at their defaults")
    return "\n".join(lines) + (f"\n\nEverything else is the base config ({sweep.source}); "
                               f"for the swept keys {note}.")


def _lookup(raw: dict[str, Any], dotted: str) -> Any:
    node: Any = raw
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def plot_bands(runs: Sequence[Run], key: str, path: Path, title: str) -> Path:
    """Per method: `key` (and the ARI when known) per round, mean over seeds with a band of
    ± one standard deviation."""
    from matplotlib.figure import Figure

    from clusterfl.records import read_history
    from clusterfl.report.figures import integer_ticks

    curves: dict[str, dict[str, dict[int, list[float]]]] = {}
    for run in runs:
        if not (run.target / "history.jsonl").is_file() or config_changed(run):
            continue  # none yet, or of another config (stale)
        mine = curves.setdefault(run.label, {"metric": {}, "ari": {}})
        for rec in read_history(run.target):
            v = getattr(rec.metrics, key, None) if rec.metrics is not None else None
            if v is not None:
                mine["metric"].setdefault(rec.round, []).append(float(v))
            if rec.ari is not None:
                mine["ari"].setdefault(rec.round, []).append(float(rec.ari))
    with_ari = any(c["ari"] for c in curves.values())
    fig = Figure(figsize=(11 if with_ari else 7, 4.2), layout="constrained")
    axes: Any = np.atleast_1d(fig.subplots(1, 2 if with_ari else 1))  # type: ignore[arg-type]
    scale = 100.0 if key == "accuracy" else 1.0
    for i, (label, c) in enumerate(curves.items()):
        for ax, which, sc in zip(axes, ("metric", "ari"), (scale, 1.0)):
            points = c[which]
            if not points:
                continue
            rounds = np.array(sorted(points))
            mean = np.array([np.mean(points[r]) for r in rounds]) * sc
            std = np.array([np.std(points[r], ddof=1) if len(points[r]) > 1 else 0.0
                            for r in rounds]) * sc
            ax.plot(rounds, mean, color=f"C{i % 10}", label=label)
            top = 1.0 if which == "ari" else 100.0 if key == "accuracy" else None
            low = 0.0 if which == "metric" and key == "accuracy" else None
            ax.fill_between(rounds, np.clip(mean - std, low, top), np.clip(mean + std, low, top),
                            color=f"C{i % 10}", alpha=0.2, lw=0)  # ± std, inside the range
    axes[0].set_ylabel("accuracy (%)" if key == "accuracy" else key or "metric")
    axes[0].set_title(f"{title}: mean ± std over seeds")
    if with_ari:
        axes[1].set_ylabel("ARI against the true clusters")
        axes[1].set_title("ARI: mean ± std over seeds")
    for ax in axes:
        integer_ticks(ax)
        ax.set_xlabel("round")
        ax.grid(True, alpha=0.3)
    if curves:
        axes[0].legend(loc="best", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    return path


def range_note(rows: Sequence[dict[str, Any]], seeds: Sequence[int],
               plain: bool = False) -> str:
    """A footnote naming each 95 % interval of the primary metric (a cell's, or of a paired
    difference) that reaches outside the values the metric can take (accuracy: 0–100 %;
    with 2 seeds Student's t gives [-21.2, 48.7] for 11 % and 16.5 %); '' when none does.
    Markdown (a bullet of the report), or with `plain` one line of text (the console's)."""
    key, header, scale, digits, _ = primary(rows)
    if key not in RANGES:
        return ""
    low, high = RANGES[key]
    width = high - low  # a difference of two values lies within ± the range's width
    found = []
    for cell in cells_of(rows):
        where = (f" in {cell}" if plain else f" in `{cell}`") if cell else ""
        for method in methods_of([r for r in rows if r["cell"] == cell]):
            d = describe(values(rows, cell, method, key, seeds))
            if d.low is not None and d.high is not None and (d.low < low or d.high > high):
                found.append(f"{method}{where} {_interval(d.low, d.high, digits, scale)}")
        for e in comparisons(rows, cell, seeds, key):
            d = e["result"].diff
            if d.low is not None and d.high is not None and max(-d.low, d.high) > width:
                found.append(f"{e['a']} − {e['b']}{where} "
                             f"{_interval(d.low, d.high, digits, scale)}")
    if not found:
        return ""
    unit = " %" if scale == 100 else ""
    bounds = (f"{number(low * scale, 0)}–{number(high * scale, 0)}{unit}; a difference of two: "
              f"±{number(width * scale, 0)}{unit} points" if np.isfinite(high)
              else f"at least {number(low * scale, 0)}")
    lead = "intervals outside the range:" if plain else "- **intervals outside the range**:"
    return (f"{lead} the 95 % interval reaches outside the values "
            f"{_name(header)} can take ({bounds}) for {', '.join(found)}. Student's t interval "
            "is symmetric around the mean and not cut to the range: with few seeds it is "
            "wide. It is kept as computed; more seeds narrow it." + "\n" * (not plain))


def _interval(low: float, high: float, digits: int | str, scale: float) -> str:
    return f"[{number(low * scale, digits)}, {number(high * scale, digits)}]"


def _slug(cell: str | None) -> str:
    if not cell:
        return "curves"
    return "".join(ch if ch.isalnum() or ch in "._=-" else "_" for ch in cell)


def write_report(sweep: Sweep, runs: Sequence[Run], rows: Sequence[dict[str, Any]], out: Path,
                 command: str, failures: Sequence[str] = (), notes: Sequence[str] = (),
                 warnings: Sequence[str] = ()) -> Path:
    """`out/report.md` with its figures under `out/figures/`; `warnings` (the base config's
    options and grid keys some method of the sweep does not use, `cli_sweep._warn_unused`)
    open it."""
    key, header, _, _, higher = primary(rows)
    seeds = sweep.seeds
    counts = {s: sum(r["status"] == s for r in rows)
              for s in ("done", "diverged", "failed", "missing", "stale")}
    parts = [
        f"# Sweep: {sweep.title}\n",
        f"- command: `{command}`\n- written: {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        f"- base config: {sweep.source}\n- methods: {', '.join(methods_of(rows))}\n"
        f"- seeds: {', '.join(map(str, seeds))}\n- cells: {len(sweep.cells())}; runs: "
        f"{len(rows)} ({', '.join(f'{v} {k}' for k, v in counts.items() if v)})\n"
        f"- the table of every run: `results.csv`"
        + (", `results.parquet`" if (out / "results.parquet").is_file() else "") + "\n",
        "".join(f"> **Warning:** {w}\n>\n" for w in warnings).removesuffix(">\n"),
        "## What differs between cells\n\n" + differs_table(sweep) + "\n",
        f"## Overview: {header}, mean ± std over seeds\n\n"
        + ("" if key else "No run has a metric (accuracy, MSE or perplexity): see the runs "
           "that did not finish normally below.\n\n") + overview_table(rows, seeds) + "\n",
    ]
    for cell in cells_of(rows):
        title = next(r for r in runs if (r.cell.name or None) == cell).cell.title
        section = [f"## {'Cell: ' + title if cell else 'Results'}\n",
                   cell_table(rows, cell, seeds) + "\n"]
        table = comparison_table(rows, cell, seeds)
        if table:
            section.append(f"Paired comparisons on {header} ({'higher' if higher else 'lower'}"
                           " is better), A − B on the seeds both finished:\n\n" + table + "\n")
        figure = plot_bands([r for r in runs if (r.cell.name or None) == cell], key,
                            out / "figures" / f"{_slug(cell)}.png", title)
        link = figure.relative_to(out).as_posix()
        section.append(f"![{title}]({link})\n")
        parts.append("\n".join(section))
    bad = [r for r in rows if r["status"] in ("failed", "diverged", "missing", "stale")]
    if bad:
        parts.append("## Runs that did not finish normally\n\n" + "\n".join(
            f"- `{r['path']}`: {r['status']}" + (f" — {r['error']}" if r["error"] else "")
            for r in bad) + "\n")
    parts.append(_run_warnings(rows, out))
    parts.append(
        "## How to read the statistics\n\n"
        "- mean ± sample standard deviation over the seeds that finished; [95 % CI]: the "
        "interval of the mean from Student's t with n − 1 degrees of freedom. A finished run "
        "without a finite value (a diverged run whose MSE overflowed) is left out of the mean; "
        "\"3/3 (2 with MSE)\" and \"(2/3 seeds)\" say so.\n"
        "- paired comparisons: the per-seed differences A − B (each seed is one federation, "
        "so the two runs of a seed are paired); p, paired t: the two-sided paired t-test "
        "(`scipy.stats.ttest_rel`); p, Holm: adjusted over the pairs of the cell; p, Wilcoxon: "
        "the exact signed-rank test, which does not assume normal differences (with 3 seeds "
        "its smallest possible p is 0.25). The verdict uses the Holm-adjusted paired t p at "
        f"{ALPHA}.\n" + range_note(rows, seeds))
    parts.extend(notes)
    path = out / "report.md"
    path.write_text("\n".join(p for p in parts if p), encoding="utf-8")
    return path


def _run_warnings(rows: Sequence[dict[str, Any]], out: Path) -> str:
    """The warnings each finished run gave (its `summary.json`'s `warnings`), one item per run
    and warning ('' when none warned)."""
    from clusterfl.records import read_summary

    items = [f"- `{r['path']}`: {w}" for r in rows if r["status"] in ("done", "diverged")
             for w in read_summary(out / r["path"]).warnings or []]
    return ("## Warnings the runs gave\n\n" + "\n".join(items) + "\n") if items else ""


def console_table(rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> Any:
    """A rich table: per cell and method, the primary metric (and a language model's accuracy
    without <unk>/<eos>, `WORD_ACCURACY`) and the ARI, mean ± std."""
    from rich.table import Table
    from rich.text import Text

    key, header, scale, digits, _ = primary(rows)
    words = key == "perplexity" and _words(rows)
    also = f", {_name(WORD_ACCURACY[1])}" if words else ""
    table = Table(title=f"{header}{also} and ARI, mean ± std over seeds {list(seeds)}"
                  if key else "No run has a metric (accuracy, MSE or perplexity); ARI, mean ± "
                  f"std over seeds {list(seeds)}")
    cells = cells_of(rows)
    if any(cells):
        table.add_column("cell")
    for name in ("method", "seeds", f"{header} [95 % CI]",
                 *([WORD_ACCURACY[1]] if words else []), "ARI"):
        table.add_column(name)
    for cell in cells:
        for method in methods_of([r for r in rows if r["cell"] == cell]):
            acc = describe(values(rows, cell, method, key, seeds))
            ari = describe(values(rows, cell, method, "ari", seeds))
            word = describe(values(rows, cell, method, WORD_ACCURACY[0], seeds))
            row = [method, seeds_text(rows, cell, method, seeds), acc.text(digits, scale),
                   *([_short(word, 1, 100.0)] if words else []), _short(ari, 2, 1.0)]
            table.add_row(*map(Text, [*([cell or ""] if any(cells) else []), *row]))
    return table
