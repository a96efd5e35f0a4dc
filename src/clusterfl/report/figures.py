"""PNG figures of one run (`plot_run`), of several runs (`plot_comparison`) and generic helpers.

Everything draws on `matplotlib.figure.Figure` objects (Agg canvas, no pyplot global state), so
figures can be made from worker threads and in headless CI.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from clusterfl.files import write_whole
from clusterfl.records import RoundRecord, read_history, read_summary
from clusterfl.report.history import (
    accuracy_series,
    ari_series,
    client_accuracy_quantiles,
    cluster_sizes_series,
    comm_series,
    final_client_accuracy,
    is_language_model,
    is_regression,
    metric_series,
    n_clusters_series,
    run_label,
    split_rounds,
)

DPI = 110
FIGURES_DIR = "figures"
MAX_LEGEND = 10  # legend entries before the rest are merged into "other"
MAX_MARKERS = 40  # lines with at most this many points get point markers
MAX_TICK_LABELS = 40  # per-client tick labels only up to this many clients

RUN_FIGURES = ("accuracy", "ari", "client_accuracy", "cluster_sizes", "communication")
COMPARISON_FIGURES = ("accuracy_compare", "ari_compare", "communication_compare")

# --------------------------------------------------------------------------- small helpers


def human_units(value: float, digits: int = 1) -> str:
    """Format a count with k/M/G/T suffixes: 1234 -> "1.2k", 3.4e9 -> "3.4G", 950 -> "950"."""
    if not np.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if round(magnitude) < 1000:
        return f"{value:.0f}" if float(value).is_integer() or magnitude >= 10 else f"{value:.2g}"
    for factor, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")):
        scaled = value / factor
        text = f"{scaled:.{digits if abs(round(scaled, digits)) < 100 else 0}f}"
        if abs(float(text)) < 1000 or suffix == "T":  # 999,950: "1.0M", not "1000k"
            return text + suffix
    raise AssertionError("unreachable: the last unit returns")


def integer_ticks(ax: Axes) -> None:
    """Whole-number ticks on the x axis (rounds, indices): never "1.5" between two rounds."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _new_figure(
    width: float = 7.0, height: float = 4.2, ncols: int = 1, sharey: bool = False
) -> tuple[Figure, Any]:
    """A constrained-layout figure with `ncols` axes (an Axes, or an array of them)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=True, sharey=sharey)
    for ax in np.atleast_1d(axes):
        ax.grid(True, alpha=0.3)
        integer_ticks(ax)
    return fig, axes


def save_png(fig: Figure, path: str | Path, dpi: int = DPI) -> Path:
    """Save `fig` as a PNG at `path` (parent folders are created), whole or not at all
    (`files.write_whole`: a full disk leaves no cut-off image), and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = io.BytesIO()
    fig.savefig(data, dpi=dpi, format="png")
    write_whole(path, data.getvalue())
    return path


_save = save_png
"""The name this module's figures are saved through (tests replace it)."""


def _note(ax: Axes, text: str) -> None:
    """Write a centred grey note on an axis that has nothing to show."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")
    ax.set_yticks([])


def _title(label: str, what: str) -> str:
    """Title "label: what", or "What" when the run has no label."""
    return f"{label}: {what}" if label else what[:1].upper() + what[1:]


def _marker(n_points: int) -> str | None:
    return "o" if n_points <= MAX_MARKERS else None


_PALETTE = [colormaps["tab10"](i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)] + [
    colormaps["tab20"](i) for i in (1, 3, 5, 7, 9, 11, 13, 17, 19)
]  # tab10 then tab20's light shades, without the greys (kept for "other" and "no cluster")


def _color(i: int) -> Any:
    """The i-th colour of the qualitative palette (cycles after 18)."""
    return _PALETTE[i % len(_PALETTE)]


def _line_style(i: int) -> str:
    """Solid for the first nine series, then dashed, dotted... so many runs stay distinct."""
    return ("-", "--", ":", "-.")[(i // 9) % 4]


def _mark_rounds(ax: Axes, marks: Sequence[int], label: str) -> None:
    """Vertical dotted lines at `marks`, with a single legend entry."""
    for i, t in enumerate(marks):
        ax.axvline(t, color="0.35", ls=":", lw=1.2, label=label if i == 0 else None)


def _human_axis(ax: Axes) -> None:
    """Log y axis with tick labels in human units (10k, 1M, ...); call after plotting."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if high / low <= 1e3 else (1.0,)  # 1-2-5 ticks on short ranges
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_units(v, digits=0)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _positive(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop non-positive points (they cannot be drawn on a log axis)."""
    keep = y > 0
    return x[keep], y[keep]


# --------------------------------------------------------------------------- one run


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw every figure of one run into `run_dir/figures/`; return the written paths.

    `client_accuracy.png` is skipped when the run has no per-client accuracy (regression).
    """
    run_dir = Path(run_dir)
    history, summary = read_history(run_dir), read_summary(run_dir)
    label, out = run_label(summary, run_dir), run_dir / FIGURES_DIR
    paths = [
        plot_accuracy(history, out / "accuracy.png", label),
        plot_ari(history, out / "ari.png", label),
        plot_cluster_sizes(history, out / "cluster_sizes.png", label),
        plot_communication(history, out / "communication.png", label),
    ]
    accuracy = final_client_accuracy(summary, history)
    if accuracy is not None:
        true = summary.true_clusters
        paths.insert(2, plot_client_accuracy(accuracy, out / "client_accuracy.png", label, true))
    return paths


def plot_accuracy(history: Sequence[RoundRecord], path: str | Path, label: str = "") -> Path:
    """Mean client accuracy per evaluated round, with the 10–90% client quantile band.

    Regression runs (MSE and no accuracy) show the mean MSE instead.
    """
    fig, ax = _new_figure()
    regression, lm = is_regression(history), is_language_model(history)
    if lm:
        _draw_perplexity(ax, history)
    else:
        (_draw_mse if regression else _draw_accuracy)(ax, history)
    ax.set_xlabel("round")
    ax.set_title(_title(label, "perplexity (lower is better)" if lm else
                        "mean client MSE" if regression else "client accuracy"))
    if len(ax.get_legend_handles_labels()[0]) > 1:
        ax.legend(loc="best")
    return _save(fig, path)


def _draw_accuracy(ax: Axes, history: Sequence[RoundRecord]) -> None:
    """Mean (solid), sample-weighted mean (dashed) and 10–90% band of client accuracy."""
    rounds, acc = accuracy_series(history)
    ax.set_ylabel("accuracy (%)")
    if rounds.size == 0:
        _note(ax, "no evaluated round")
        return
    q_rounds, low, high = client_accuracy_quantiles(history)
    if q_rounds.size:
        ax.fill_between(q_rounds, 100 * low, 100 * high, color="C0", alpha=0.2, lw=0,
                        label="10–90% of clients")
    ax.plot(rounds, 100 * acc, color="C0", marker=_marker(rounds.size), ms=3.5,
            label="mean over clients")
    w_rounds, weighted = metric_series(history, "accuracy_weighted")
    if w_rounds.size:
        ax.plot(w_rounds, 100 * weighted, color="C1", ls="--", lw=1.2,
                label="sample-weighted mean")


def _draw_mse(ax: Axes, history: Sequence[RoundRecord]) -> None:
    """Mean client MSE per evaluated round."""
    rounds, mse = metric_series(history, "mse")
    ax.plot(rounds, mse, color="C0", marker=_marker(rounds.size), ms=3.5, label="mean MSE")
    ax.set_ylabel("MSE")


def _draw_perplexity(ax: Axes, history: Sequence[RoundRecord]) -> None:
    """A language model's perplexity over all clients' test tokens per evaluated round."""
    rounds, ppl = metric_series(history, "perplexity")
    ax.plot(rounds, ppl, color="C0", marker=_marker(rounds.size), ms=3.5, label="perplexity")
    ax.set_ylabel("perplexity")


def plot_ari(history: Sequence[RoundRecord], path: str | Path, label: str = "") -> Path:
    """ARI against the true clusters (left axis) and number of clusters (right axis) per round.

    ARI is left out when it is null in every round; cluster splits (CFL's `split`) are marked.
    """
    fig, ax = _new_figure()
    rounds, ari = ari_series(history)
    c_rounds, n_clusters = n_clusters_series(history)
    count_ax = ax
    if rounds.size:
        ax.plot(rounds, ari, color="C0", marker=_marker(rounds.size), ms=3.5, label="ARI")
        ax.set_ylim(min(-0.05, float(ari.min()) - 0.05), 1.05)
        ax.set_ylabel("ARI vs true clusters", color="C0")
        count_ax = ax.twinx()
    count_ax.step(c_rounds, n_clusters, where="post", color="C3", lw=1.8, label="clusters",
                  marker="o" if c_rounds.size == 1 else None)
    count_ax.set_ylim(0, int(n_clusters.max()) + 1)
    count_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    count_ax.set_ylabel("number of clusters", color="C3")
    _mark_rounds(ax, split_rounds(history), "split")
    ax.set_xlabel("round")
    ax.set_title(_title(label, "clustering" + ("" if rounds.size else " (true clusters unknown)")))
    fig.legend(loc="outside lower center", ncols=3, frameon=False)
    return _save(fig, path)


def plot_client_accuracy(
    accuracy: Sequence[float] | np.ndarray,
    path: str | Path,
    label: str = "",
    true_clusters: Sequence[int] | None = None,
) -> Path:
    """Final accuracy of each client as bars sorted by accuracy, coloured by true cluster."""
    acc = 100 * np.asarray(accuracy, dtype=float)
    clients = np.flatnonzero(np.isfinite(acc))
    order = clients[np.argsort(acc[clients], kind="stable")]
    fig, ax = _new_figure(width=max(7.0, min(12.0, 0.18 * order.size + 3)))
    ax.grid(False, axis="x")
    colors, handles = _cluster_colors(order, acc.size, true_clusters)
    ax.bar(np.arange(order.size), acc[order], color=colors, width=0.85)
    mean = float(np.mean(acc[order])) if order.size else float("nan")
    handles.append(ax.axhline(mean, color="k", ls="--", lw=1.1, label=f"mean {mean:.1f}%"))
    _client_ticks(ax, order)
    ax.set_ylim(0, 100)
    ax.set_ylabel("final accuracy (%)")
    ax.set_title(_title(label, "final accuracy per client"))
    fig.legend(handles=handles, loc="outside lower center", fontsize="small", frameon=False,
               ncols=min(6, len(handles)))
    return _save(fig, path)


def _cluster_colors(
    order: np.ndarray, n_clients: int, true_clusters: Sequence[int] | None
) -> tuple[list[Any], list[Any]]:
    """Bar colours by true cluster (capped legend), or one colour when clusters are unknown."""
    if true_clusters is None or len(true_clusters) != n_clients:
        return ["C0"] * order.size, []
    truth = np.asarray(true_clusters)
    names = list(dict.fromkeys(np.sort(truth).tolist()))
    index = {name: i for i, name in enumerate(names)}
    colors = [_color(index[c]) for c in truth[order]]
    handles: list[Any] = [
        Patch(color=_color(i), label=f"true cluster {name}")
        for i, name in enumerate(names[:MAX_LEGEND])
    ]
    if len(names) > MAX_LEGEND:
        handles.append(Patch(color="w", label=f"+{len(names) - MAX_LEGEND} more clusters"))
    return colors, handles


def _client_ticks(ax: Axes, order: np.ndarray) -> None:
    """Client ids under the bars when few enough to read, otherwise a bare rank axis."""
    ax.set_xlim(-0.6, order.size - 0.4)
    if order.size <= MAX_TICK_LABELS:
        ax.set_xticks(np.arange(order.size), [str(c) for c in order], fontsize="small")
        ax.set_xlabel("client id (sorted by final accuracy)")
    else:
        ax.set_xlabel("clients, sorted by final accuracy")


def plot_cluster_sizes(history: Sequence[RoundRecord], path: str | Path, label: str = "") -> Path:
    """Number of clients in each cluster per round, as stacked areas.

    One band colour per cluster id; the `MAX_LEGEND` clusters with the largest peak size keep
    their own band, the others are merged into one grey "other" band, and clients with no
    cluster (-1) form a light band on top. A collapse shows as one band taking the whole height.
    """
    rounds, ids, counts = cluster_sizes_series(history)
    layers, names, colors = _cluster_layers(ids, counts)
    fig, ax = _new_figure(width=8.0)
    # Assignments are per round: draw steps, round t spanning [t - 0.5, t + 0.5).
    edges = np.concatenate([[rounds[0] - 0.5], (rounds[:-1] + rounds[1:]) / 2, [rounds[-1] + 0.5]])
    ax.stackplot(edges, np.concatenate([layers, layers[:, -1:]], axis=1), labels=names,
                 colors=colors, step="post", lw=0)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, int(counts.sum(axis=1).max()))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("clients")
    ax.set_title(_title(label, "clients per cluster"))
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize="small",
               title="cluster id", title_fontsize="small")
    return _save(fig, path)


def _cluster_layers(
    ids: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, list[str], list[Any]]:
    """Stack layers, labels and colours: top clusters by peak size, "other", "no cluster"."""
    real = np.flatnonzero(ids >= 0)
    peak = counts[:, real].max(axis=0) if counts.shape[0] else np.zeros(real.size)
    kept = np.sort(real[np.argsort(-peak, kind="stable")[:MAX_LEGEND]])
    layers = [counts[:, k] for k in kept]
    names = [f"cluster {ids[k]}" for k in kept]
    colors = [_color(i) for i in range(kept.size)]
    rest = np.setdiff1d(real, kept)
    if rest.size:
        layers.append(counts[:, rest].sum(axis=1))
        names.append(f"other ({rest.size} clusters)")
        colors.append("0.55")
    if (ids < 0).any():
        layers.append(counts[:, ids < 0].sum(axis=1))
        names.append("no cluster")
        colors.append("0.85")
    return np.array(layers, dtype=float).reshape(len(layers), -1), names, colors


def plot_communication(history: Sequence[RoundRecord], path: str | Path, label: str = "") -> Path:
    """Cumulative floats sent server→clients and clients→server per round (log scale)."""
    rounds, down, up = comm_series(history)
    fig, ax = _new_figure()
    for values, name, color in ((down, "server → clients", "C0"), (up, "clients → server", "C2")):
        x, y = _positive(rounds, values)
        if x.size:
            ax.plot(x, y, color=color, lw=1.8, label=f"{name} (total {human_units(y[-1])})")
    if ax.get_lines():
        _human_axis(ax)
        ax.legend(loc="lower right")
    else:
        _note(ax, "no communication recorded")
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative floats sent")
    ax.set_title(_title(label, "communication"))
    return _save(fig, path)


# --------------------------------------------------------------------------- generic helpers


def plot_matrix(
    matrix: np.ndarray | Sequence[Sequence[float]],
    order: Sequence[int] | np.ndarray,
    path: str | Path,
    title: str,
    labels: Sequence[int] | np.ndarray | None = None,
) -> Path:
    """Heatmap of a client×client matrix with rows and columns reordered by `order`.

    `labels[i]` is the cluster of client i (original indexing); when given, lines are drawn
    between consecutive clusters of the reordered axis and the ticks name the clusters.
    Matrices with negative entries (cosine similarities) get a diverging map centred on 0.
    """
    order = np.asarray(order, dtype=int)
    m = np.asarray(matrix, dtype=float)[np.ix_(order, order)]
    fig, ax = _new_figure(width=6.2, height=5.4)
    ax.grid(False)
    if np.nanmin(m, initial=0.0) < 0:
        bound = float(np.nanmax(np.abs(m), initial=1.0)) or 1.0
        image = ax.imshow(m, cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
        line_color = "k"
    else:
        image = ax.imshow(m, cmap="viridis", interpolation="nearest")
        line_color = "w"
    fig.colorbar(image, ax=ax, shrink=0.85)
    if labels is not None:
        _cluster_blocks(ax, np.asarray(labels)[order], line_color)
    else:
        _matrix_ticks(ax, order)
    ax.set_title(title)
    return _save(fig, path)


def _cluster_blocks(ax: Axes, ordered_labels: np.ndarray, color: str) -> None:
    """Lines between consecutive clusters and one tick per cluster block."""
    n = ordered_labels.size
    starts = np.concatenate([[0], np.flatnonzero(ordered_labels[1:] != ordered_labels[:-1]) + 1])
    for b in starts[1:]:
        ax.axhline(b - 0.5, color=color, lw=1.5)
        ax.axvline(b - 0.5, color=color, lw=1.5)
    centres = (starts + np.append(starts[1:], n)) / 2 - 0.5
    names = [str(ordered_labels[s]) for s in starts]
    show = len(starts) <= 2 * MAX_LEGEND
    ax.set_xticks(centres if show else [], names if show else [], fontsize="small")
    ax.set_yticks(centres if show else [], names if show else [], fontsize="small")
    ax.set_xlabel("clients, grouped by cluster")
    ax.set_ylabel("clients, grouped by cluster")


def _matrix_ticks(ax: Axes, order: np.ndarray) -> None:
    """Client ids along both axes when few enough to read."""
    if order.size <= MAX_TICK_LABELS:
        ticks = np.arange(order.size)
        names = [str(c) for c in order]
        ax.set_xticks(ticks, names, fontsize="x-small", rotation=90)
        ax.set_yticks(ticks, names, fontsize="x-small")
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel("client")
    ax.set_ylabel("client")


def plot_series(
    xs: Mapping[str, tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]],
    path: str | Path,
    title: str,
    ylabel: str,
    marks: Sequence[int] = (),
    *,
    xlabel: str = "round",
    mark_label: str = "split",
    logy: bool = False,
) -> Path:
    """Lines `name -> (x, y)` on one axis, with dotted vertical lines at `marks` (e.g. splits)."""
    fig, ax = _new_figure()
    for i, (name, (x, y)) in enumerate(xs.items()):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        ax.plot(x, y, color=_color(i), ls=_line_style(i), marker=_marker(x.size), ms=3,
                label=name)
    _mark_rounds(ax, marks, mark_label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(xs) > 1 or len(marks):
        ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


# --------------------------------------------------------------------------- comparison


def plot_comparison(
    run_dirs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str] | None = None
) -> list[Path]:
    """Draw accuracy, clustering and communication of several runs into `out_dir`.

    Writes `accuracy_compare.png`, `ari_compare.png` and `communication_compare.png`; each
    run is one line, named by `labels` (else its summary label) and coloured the same in
    every figure.
    """
    runs = _load_runs(run_dirs, labels)
    out = Path(out_dir)
    return [
        _compare_accuracy(runs, out / "accuracy_compare.png"),
        _compare_clustering(runs, out / "ari_compare.png"),
        _compare_communication(runs, out / "communication_compare.png"),
    ]


def _load_runs(
    run_dirs: Sequence[str | Path], names: Sequence[str] | None = None
) -> list[tuple[str, list[RoundRecord]]]:
    """(unique label, history) per run; duplicate labels get the folder name appended."""
    loaded = [(Path(d), read_history(d), read_summary(d)) for d in run_dirs]
    if names is not None and len(names) != len(loaded):
        raise ValueError(f"{len(names)} labels for {len(loaded)} runs")
    labels = list(names) if names is not None else [run_label(s, d) for d, _, s in loaded]
    unique = [
        f"{lab} [{d.name}]" if labels.count(lab) > 1 else lab
        for lab, (d, _, _) in zip(labels, loaded)
    ]
    return [(lab, h) for lab, (_, h, _) in zip(unique, loaded)]


def _run_style(i: int, n_runs: int, label: str, marked: bool = False) -> dict[str, Any]:
    """Line style of run i of n: earlier runs are drawn wider, so identical curves stay visible;
    `marked` adds point markers (a line of one point, say a run of one round or one evaluated
    only in its last round, draws nothing without them)."""
    width = 1.3 + 2.2 * (n_runs - 1 - i) / max(n_runs - 1, 1)
    style = {"color": _color(i), "ls": _line_style(i), "lw": width, "label": label}
    return {**style, "marker": "o", "ms": width + 2.5} if marked else style


def _run_legend(fig: Figure, ax: Axes, n_runs: int) -> None:
    """Legend inside the axis for a few runs, outside on the right for many."""
    if not ax.get_legend_handles_labels()[0]:
        _note(ax, "no evaluated round")
    elif n_runs <= 6:
        ax.legend(loc="best", fontsize="small")
    else:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize="small")


def _compare_accuracy(runs: list[tuple[str, list[RoundRecord]]], path: Path) -> Path:
    """Mean client accuracy (or MSE when every run is a regression, perplexity when every
    run is a language model) per run."""
    regression = all(is_regression(h) for _, h in runs)
    lm = all(is_language_model(h) for _, h in runs)
    name, scale = ("perplexity", 1.0) if lm else ("mse", 1.0) if regression else (
        "accuracy", 100.0)
    fig, ax = _new_figure(width=8.0)
    missing = []
    for i, (label, history) in enumerate(runs):
        rounds, values = metric_series(history, name)
        if rounds.size:
            marked = rounds.size <= MAX_MARKERS  # the evaluated rounds, as eval_every left them
            ax.plot(rounds, scale * values, **_run_style(i, len(runs), label, marked))
        else:
            missing.append(label)
    left_out = ""  # under the axis, where it hides no curve: the runs the figure leaves out
    if missing and len(missing) < len(runs):
        left_out = f"\nnot drawn (no {name}): {', '.join(missing)}"
    ax.set_xlabel("round" + left_out)
    ax.set_ylabel("perplexity (lower is better)" if lm else "MSE" if regression
                  else "mean client accuracy (%)")
    ax.set_title("Perplexity" if lm else "Mean client MSE" if regression
                 else "Mean client accuracy")
    _run_legend(fig, ax, len(runs))
    return _save(fig, path)


def _compare_clustering(runs: list[tuple[str, list[RoundRecord]]], path: Path) -> Path:
    """ARI (left panel) and number of clusters (right panel) per run."""
    fig, (ari_ax, count_ax) = _new_figure(width=11.0, ncols=2)
    for i, (label, history) in enumerate(runs):
        rounds, ari = ari_series(history)
        if rounds.size:
            ari_ax.plot(rounds, ari, **_run_style(i, len(runs), label, rounds.size == 1))
        c_rounds, counts = n_clusters_series(history)
        count_ax.step(c_rounds, counts, where="post",
                      **_run_style(i, len(runs), label, c_rounds.size == 1))
    if not ari_ax.get_lines():
        _note(ari_ax, "ARI unavailable (true clusters unknown)")
    ari_ax.set_ylim(min(-0.05, ari_ax.get_ylim()[0]), 1.05)
    ari_ax.set(xlabel="round", ylabel="ARI vs true clusters", title="Clustering quality (ARI)")
    count_ax.set_ylim(bottom=0)
    count_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    count_ax.set(xlabel="round", ylabel="number of clusters", title="Number of clusters")
    fig.legend(*count_ax.get_legend_handles_labels(), loc="outside right upper",
               fontsize="small")
    return _save(fig, path)


def _compare_communication(runs: list[tuple[str, list[RoundRecord]]], path: Path) -> Path:
    """Cumulative floats down (left panel) and up (right panel) per run, log scale."""
    fig, (down_ax, up_ax) = _new_figure(width=11.0, ncols=2, sharey=True)
    for i, (label, history) in enumerate(runs):
        rounds, down, up = comm_series(history)
        for ax, values in ((down_ax, down), (up_ax, up)):
            x, y = _positive(rounds, values)
            ax.plot(x, y, **_run_style(i, len(runs), label, x.size == 1))
    if any(line.get_xdata().size for line in down_ax.get_lines() + up_ax.get_lines()):
        _human_axis(down_ax)  # the y axis is shared: one call sets both panels
    down_ax.set(xlabel="round", ylabel="cumulative floats sent", title="server → clients")
    up_ax.set(xlabel="round", title="clients → server")
    fig.legend(*down_ax.get_legend_handles_labels(), loc="outside right upper",
               fontsize="small")
    return _save(fig, path)
