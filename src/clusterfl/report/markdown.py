"""Summary tables (rich and markdown) and the markdown reports of one run or a comparison."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from rich.table import Table
from rich.text import Text

from clusterfl.config_util import flatten
from clusterfl.errors import write_error
from clusterfl.files import write_whole
from clusterfl.records import (
    FinalMetrics,
    RoundMetrics,
    RunSummary,
    held_out_mse,
    read_history,
    read_summary,
)
from clusterfl.report.figures import human_units, plot_comparison, plot_run
from clusterfl.report.history import load_config_text, run_label
from clusterfl.stats import SECONDS, number

REPORT_FILE = "report.md"
CONFIG_EXCERPT_LINES = 40
MISSING = "—"
NO_TRUTH = "n/a"
"""The ARI cell of a run on data without true clusters: not applicable (never 0)."""

FIGURE_CAPTIONS: dict[str, str] = {
    "accuracy": "Mean client accuracy per evaluated round; the band spans the 10–90% "
    "quantiles of per-client accuracy (MSE for regression; perplexity, lower is better, "
    "for a language model).",
    "ari": "ARI of the cluster assignment against the true clusters, and the number of "
    "clusters, per round.",
    "client_accuracy": "Final accuracy of each client, sorted, coloured by true cluster.",
    "cluster_sizes": "Clients per cluster per round (stacked); one band taking the whole "
    "height means the clustering collapsed.",
    "communication": "Cumulative floats sent between server and clients (log scale).",
    "accuracy_compare": "Mean client accuracy per round, one line per method (MSE when every "
    "run is a regression, perplexity, lower is better, when every run is a language model).",
    "ari_compare": "ARI against the true clusters and number of clusters per round.",
    "communication_compare": "Cumulative floats sent down and up per round (log scale).",
}

# --------------------------------------------------------------------------- cell formats


def _percent(value: Any) -> str:
    """0.8734 -> "87.34"."""
    return MISSING if value is None else f"{100 * float(value):.2f}"


def _fixed(digits: int) -> Callable[[Any], str]:
    """Formatter with a fixed number of decimals."""
    return lambda value: MISSING if value is None else f"{float(value):.{digits}f}"


def _seconds(value: Any) -> str:
    """A duration: one decimal from 0.1 s on, two significant digits below (0.0258 ->
    "0.026", not "0.0"; `stats.SECONDS`, as a sweep's tables write it)."""
    return MISSING if value is None else number(float(value), SECONDS)


def _integer(value: Any) -> str:
    return MISSING if value is None else str(int(value))


def _human(value: Any) -> str:
    return MISSING if value is None else human_units(float(value))


def _general(value: Any) -> str:
    return MISSING if value is None else f"{float(value):.4g}"


def _metrics(final: FinalMetrics) -> RoundMetrics:
    """The final metrics, all None when no round was evaluated."""
    return final.metrics or RoundMetrics()


class Column(NamedTuple):
    header: str
    value: Callable[[RunSummary], Any]
    fmt: Callable[[Any], str]


# The columns of the summary table, read from a run's final metrics; the MSE column only
# appears when some run is a regression, participation when some run sampled (`_columns`).
MSE_COLUMN = Column("MSE", lambda s: _metrics(s.final).mse, _general)
PERPLEXITY_COLUMN = Column("perplexity ↓", lambda s: _metrics(s.final).perplexity, _fixed(2))
"""A language model's perplexity (lower is better); first, when some run has one."""
WORD_ACCURACY_COLUMN = Column("acc. no oov/eos (%)",
                              lambda s: _metrics(s.final).accuracy_no_oov_no_eos, _percent)
"""A language model's accuracy on targets other than <unk> and <eos>; after perplexity."""
PARTICIPATION_COLUMN = Column("participation (%)", lambda s: s.final.participation, _percent)
COLUMNS: list[Column] = [
    Column("accuracy (%)", lambda s: _metrics(s.final).accuracy, _percent),
    Column("weighted acc (%)", lambda s: _metrics(s.final).accuracy_weighted, _percent),
    Column("macro-F1 (%)", lambda s: _metrics(s.final).macro_f1, _percent),
    Column("fairness var (%²)", lambda s: _metrics(s.final).fairness_var, _fixed(2)),
    MSE_COLUMN,
    Column("ARI", lambda s: s.final.ari, _fixed(3)),
    Column("clusters", lambda s: s.final.n_clusters, _integer),
    Column("floats ↓", lambda s: s.final.floats_down, _human),
    Column("floats ↑", lambda s: s.final.floats_up, _human),
    Column("rejected", lambda s: s.final.rejected, _integer),
    PARTICIPATION_COLUMN,
    Column("wall time (s)", lambda s: s.final.wall_time, _seconds),
]
"""`rejected`: client replies the guard's validation rejected over the whole run;
`participation`: the mean share of the clients that took part in a round."""


def _partial(summary: RunSummary) -> bool:
    """Whether fewer than all clients took part in a round on average (sampling, dropouts)."""
    share = summary.final.participation
    return share is not None and share < 1.0 - 1e-9

#: the held-out clients (`[scenario] holdout`), placed after the run: shown when some run has
#: them, after the ARI column
HOLDOUT_COLUMNS: list[Column] = [
    Column("placement ARI", lambda s: s.final.placement_ari, _fixed(3)),
    Column("placed in group's cluster (%)", lambda s: s.final.placement_match, _percent),
    Column("held-out acc (%)", lambda s: s.final.holdout_accuracy, _percent),
]
HOLDOUT_MSE_COLUMN = Column("held-out MSE", lambda s: held_out_mse(s.holdout)[0], _general)
"""A regression's held-out clients' mean MSE (`held_out_mse`), after their accuracy: shown
when some run has one."""


def _regression(summary: RunSummary) -> bool:
    """Whether the run is a regression: it reports an MSE, or it was evaluated and reports no
    accuracy and no perplexity (a diverged regression, whose MSE overflowed: null in
    `summary.json`)."""
    m = _metrics(summary.final)
    return m.mse is not None or (summary.final.metrics is not None and m.accuracy is None
                                 and m.perplexity is None)


def _columns(summaries: Sequence[RunSummary]) -> list[Column]:
    """The table's columns: MSE only when some run is a regression (`_regression`),
    participation only when some run had less than full participation, the held-out clients'
    only when some run had them."""
    regression = any(_regression(s) for s in summaries)
    partial = any(_partial(s) for s in summaries)
    columns = [c for c in COLUMNS if (c is not MSE_COLUMN or regression)
               and (c is not PARTICIPATION_COLUMN or partial)]
    if any(_metrics(s.final).perplexity is not None for s in summaries):
        words = [WORD_ACCURACY_COLUMN] if any(
            _metrics(s.final).accuracy_no_oov_no_eos is not None for s in summaries) else []
        columns = [PERPLEXITY_COLUMN, *words,
                   *(c for c in columns if c.header != "macro-F1 (%)")]
    if any(s.holdout is not None or s.final.placement_ari is not None
           or s.final.holdout_accuracy is not None for s in summaries):
        at = next(i for i, c in enumerate(columns) if c.header == "ARI") + 1
        mse = [HOLDOUT_MSE_COLUMN] if any(held_out_mse(s.holdout)[2] for s in summaries) else []
        columns[at:at] = [*HOLDOUT_COLUMNS, *mse]
    return columns


def summary_rows(summaries: Sequence[RunSummary]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of formatted cells), one row per summary in the given order."""
    columns = _columns(summaries)
    headers = ["method"] + [c.header for c in columns]
    rows = []
    for summary in summaries:
        cells = [c.fmt(c.value(summary)) for c in columns]
        if summary.federation is not None and summary.true_clusters is None:  # FEMNIST
            cells = [NO_TRUTH if c.header in ("ARI", "placement ARI") else cell
                     for c, cell in zip(columns, cells, strict=True)]
        rows.append([run_label(summary), *cells])
    return headers, rows


def summary_table(summaries: Sequence[RunSummary], title: str | None = None) -> Table:
    """A rich Table of the final metrics, one row per run (numbers right-aligned)."""
    headers, rows = summary_rows(summaries)
    table = Table(title=None if title is None else Text(title))
    table.add_column(headers[0], style="bold")
    for header in headers[1:]:
        table.add_column(header, justify="right")
    for row in rows:  # as Text: a label's `[layers]` is not read as markup (and dropped)
        table.add_row(*map(Text, row))
    return table


def summary_markdown(summaries: Sequence[RunSummary]) -> str:
    """The same table as GitHub markdown (numbers right-aligned)."""
    headers, rows = summary_rows(summaries)
    lines = [
        _markdown_row(headers),
        "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|",
    ]
    lines += [_markdown_row(row) for row in rows]
    return "\n".join(lines) + "\n"


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


# --------------------------------------------------------------------------- reports


def write_run_report(run_dir: str | Path) -> Path:
    """Draw the run's figures (`plot_run`) and write `run_dir/report.md`; return its path."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    with _writing(run_dir, f"its history.jsonl and summary.json are intact: `clusterfl report "
                           f"{run_dir}` writes the report again once there is room"):
        return _write_run_report(run_dir, summary)


def _write_run_report(run_dir: Path, summary: RunSummary) -> Path:
    figures = plot_run(run_dir) + method_figures(run_dir, summary)
    parts = [
        _run_header(summary, run_dir),
        _divergence_note([summary]),
        _config_excerpt(load_config_text(run_dir)),
        "## Results\n\n" + summary_markdown([summary]),
        _holdout_section(summary.holdout),
        _robust_section(summary.robust),
        _extras_section(summary.extras),
        "## Figures\n\n" + _figure_links(figures, run_dir),
    ]
    path = run_dir / REPORT_FILE
    write_whole(path, "\n".join(p for p in parts if p))
    return path


@contextmanager
def _writing(folder: Path, kept: str) -> Iterator[None]:
    """A report's figures and report.md written into `folder`: a write that fails (a full
    disk, a file where the figures folder belongs) is one line naming the file and `kept`."""
    try:
        yield
    except OSError as exc:
        path = Path(exc.filename) if exc.filename else folder / REPORT_FILE
        raise write_error(exc, path, "the report", kept) from None


def method_figures(run_dir: Path, summary: RunSummary) -> list[Path]:
    """Figures a method draws itself (`clusterfl.report.methods.<module>.figures`).

    The module has the name of the method's module in `clusterfl.algorithms`.
    """
    from clusterfl.algorithms import method_module

    module = method_module(summary.algorithm or "")
    if module is None:
        return []
    try:
        mod = importlib.import_module(f"clusterfl.report.methods.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("clusterfl.report.methods"):
            return []
        raise
    return list(mod.figures(run_dir, read_history(run_dir), summary))


def _run_header(summary: RunSummary, run_dir: Path) -> str:
    """Title and one line of facts about the run."""
    true = summary.true_clusters
    truth = f"{len(set(true))} true clusters" if true else "true clusters unknown"
    data = _config(run_dir).get("data")
    facts = [
        f"algorithm `{_known(summary.algorithm)}`",
        f"federation `{_known(summary.federation)}`",
        *([_data_fact(data)] if isinstance(data, dict) and "source" in data else []),
        f"{_known(summary.n_clients)} clients"
        + (f" trained and {summary.holdout.get('n_held_out')} held out"
           if summary.holdout else ""),
        f"{_known(summary.rounds)} rounds",
        truth,
    ]
    return (f"# {run_label(summary, run_dir)}\n\n" + ", ".join(facts)
            + f" (folder `{run_dir.name}`).\n")


def _data_fact(data: dict[str, Any]) -> str:
    """Where the run's data came from (`[data]` of its config.toml), e.g. "data `npz`
    (parts)", "data `mypkg.data:load`"."""
    where = data.get("path") or data.get("name")
    return f"data `{data['source']}`" + (f" ({where})" if where else "")


def _divergence_note(summaries: Sequence[RunSummary]) -> str:
    """A warning per diverged run and each warning a run gave ('' when there is none)."""
    lines = []
    for s in summaries:
        d = s.divergence
        if d:
            rounds = d.get("rounds")
            more = f" ({rounds} diverged rounds in all)" if rounds and rounds > 1 else ""
            lines.append(f"> **Warning: {run_label(s)} diverged.** {d.get('reason', '')}{more}")
        lines += [f"> **Warning ({run_label(s)}):** {w}" for w in s.warnings or []]
    return "\n>\n".join(lines) + "\n" if lines else ""


def _known(value: Any) -> str:
    return "?" if value is None else str(value)


def _config_excerpt(config: str | None) -> str:
    """The first lines of the resolved config as a toml block."""
    if config is None:
        return ""
    lines = config.rstrip().splitlines()
    shown = "\n".join(lines[:CONFIG_EXCERPT_LINES])
    more = len(lines) - CONFIG_EXCERPT_LINES
    tail = f"\n… {more} more lines in `config.toml`.\n" if more > 0 else ""
    return f"## Configuration\n\n```toml\n{shown}\n```\n{tail}"


def _holdout_section(holdout: dict[str, Any] | None) -> str:
    """The held-out clients, placed after the run: one row per client ('' without)."""
    if not holdout:
        return ""
    truth = holdout.get("true_clusters") or [None] * len(holdout.get("clients", []))
    mse = holdout.get("mse")  # a regression's held-out clients: no accuracy
    lines = [
        "## Held-out clients\n",
        f"{holdout.get('n_held_out')} clients ({_fixed(2)(holdout.get('fraction'))} of the "
        "federation, stratified by true cluster) were kept out of training, then placed by "
        "the method's rule and evaluated on their own test data with the model they were "
        f"placed on: placement ARI {_fixed(3)(holdout.get('placement_ari'))}, placed in their "
        f"group's cluster {_percent(holdout.get('placement_match'))} %, "
        f"{_holdout_mean(holdout)}; the placement cost "
        f"{_human(holdout.get('floats_down'))} floats down and "
        f"{_human(holdout.get('floats_up'))} up.{_numbering(holdout)}{_privacy(holdout)}\n",
        f"| client | true cluster | placed cluster | {'MSE' if mse else 'accuracy (%)'} |",
        "|---:|---:|---:|---:|",
    ]
    for c, t, p, a in zip(holdout.get("clients", []), truth,
                          holdout.get("placed_clusters", []),
                          mse or holdout.get("accuracy", []), strict=False):
        lines.append(f"| {c} | {_known(t)} | {p} | {_general(a) if mse else _percent(a)} |")
    return "\n".join(lines) + "\n"


def _holdout_mean(holdout: dict[str, Any]) -> str:
    """The held-out clients' mean accuracy, or a regression's mean MSE over the clients with
    a finite one (null in `summary.json`: none, or an overflow), saying how many when not
    all."""
    mean, finite, clients = held_out_mse(holdout)
    if not clients:
        return f"mean accuracy {_percent(holdout.get('holdout_accuracy'))} %"
    some = (f" (over the {finite} of {clients} clients with a finite one)"
            if 0 < finite < clients else "")
    return f"mean MSE {_general(mean)}{some}"


def _privacy(holdout: dict[str, Any]) -> str:
    """What the run's `[privacy]` did for the placement (`holdout.privacy`, its note), or ''."""
    note = (holdout.get("privacy") or {}).get("note")
    return f" Privacy of the placement: {note}." if note else ""


def _numbering(holdout: dict[str, Any]) -> str:
    """How the section's client ids (the whole federation's) map to the rest of the report,
    whose tables and figures number the trained clients 0..n_train−1."""
    trained = holdout.get("trained_clients")
    if not trained:
        return ""
    if len(trained) > 12:
        shown = f"{', '.join(map(str, trained[:12]))}, …"
    else:
        shown = ", ".join(map(str, trained))
    return (f" Client ids below are the whole federation's; the figures above number the "
            f"{len(trained)} trained clients 0..{len(trained) - 1} (federation clients "
            f"{shown}).")


def _robust_section(robust: dict[str, Any] | None) -> str:
    """What the run's faults, adversaries and `[privacy]` did (`summary.json`'s `robust`):
    the guard's totals and the (ε, δ) of the training replies ('' without `robust`)."""
    if not robust:
        return ""
    lines = ["## Faults, attacks and privacy\n"]
    adversaries = robust.get("adversaries") or []
    if adversaries:
        lines.append(f"- adversarial clients ({robust.get('adversary_kind')}): "
                     f"{len(adversaries)}, ids {', '.join(map(str, adversaries))}")
    lines.append("- over the whole run (a client counted once per round): "
                 f"{_integer(robust.get('dropped'))} dropped out, "
                 f"{_integer(robust.get('straggled'))} straggled, "
                 f"{_integer(robust.get('rejected'))} replies rejected by the guard")
    privacy = robust.get("privacy")
    if privacy:
        eps = privacy.get("epsilon")
        said = (f"(ε, δ) = ({eps:.4g}, {privacy.get('delta'):g}) over "
                f"{_integer(privacy.get('releases'))} noised release(s) at sampling rate "
                f"{_general(privacy.get('sampling_rate'))} ({privacy.get('accountant')})"
                if eps is not None else "no noise (noise_multiplier 0), so no ε")
        lines.append(f"- privacy: every update clipped to S = {_general(privacy.get('clip'))} "
                     f"({_integer(robust.get('clipped'))} above it), noise multiplier σ = "
                     f"{_general(privacy.get('noise_multiplier'))} ({privacy.get('noise')}); "
                     f"{said}")
    return "\n".join(lines) + "\n"


def _extras_section(extras: dict[str, Any]) -> str:
    """Scalar algorithm-specific values of the summary (lists are left to the figures); a
    null one (none this round, or not finite: a diverged run's loss) reads "—", a bool
    "true"/"false"."""
    scalars = {k: v for k, v in extras.items()
               if v is None or isinstance(v, int | float | str | bool)}
    if not scalars:
        return ""
    rows = [f"| {k} | {_extra_value(v)} |" for k, v in scalars.items()]
    return ("## Algorithm specifics (the last round's)\n\n| key | value |\n|:---|---:|\n"
            + "\n".join(rows) + "\n")


def _extra_value(value: Any) -> str:
    """An extras cell: a float in 4 significant digits, null "—", a bool as TOML/JSON writes it
    ("false", as the runs' options read; not Python's "False")."""
    if isinstance(value, bool):
        return json.dumps(value)
    return _general(value) if value is None or isinstance(value, float) else str(value)


def _figure_links(figures: Sequence[Path], base: Path) -> str:
    """One captioned markdown image per figure, linked relative to `base`: the generic
    figures' captions, a method's figures captioned by its report module's docstring."""
    blocks = []
    for figure in figures:
        link = Path(os.path.relpath(figure, base)).as_posix()
        caption = FIGURE_CAPTIONS.get(figure.stem) or _method_caption(figure.name)
        blocks.append(f"![{figure.stem}]({link})\n\n*{caption}*\n" if caption else
                      f"![{figure.stem}]({link})\n")
    return "\n".join(blocks)


_FIGURE_ITEM = re.compile(r"^- `([a-z0-9_<>]+\.png)`(?: \([^)]*\))?:\s*(.*)$")


def _method_caption(name: str) -> str:
    """The caption of a method's figure `name` (`_method_captions`), or "" when no module
    describes it."""
    return next((caption for pattern, caption in _method_captions()
                 if pattern.fullmatch(name)), "")


@functools.cache
def _method_captions() -> tuple[tuple[re.Pattern[str], str], ...]:
    """Every figure item of the docstrings of `clusterfl.report.methods`' modules ("- `
    cfl_norms.png` (...): what it shows", a `<round>` in the name standing for a number), as
    (name pattern, caption): read once."""
    import pkgutil

    from clusterfl.report import methods

    out = []
    for info in pkgutil.iter_modules(methods.__path__):
        lines = (importlib.import_module(f"{methods.__name__}.{info.name}").__doc__ or ""
                 ).splitlines()
        for i, line in enumerate(lines):
            m = _FIGURE_ITEM.match(line.strip())
            if m is None:
                continue
            text = [m[2]]
            for more in lines[i + 1:]:
                if not more.strip() or more.strip().startswith("- "):
                    break
                text.append(more.strip())
            caption = " ".join(text)
            out.append((re.compile(re.sub(r"<[a-z]+>", r"\\d+", re.escape(m[1]))),
                        caption[:1].upper() + caption[1:]))
    return tuple(out)


def distinct_labels(labels: Sequence[str], run_dirs: Sequence[str | Path]) -> list[str] | None:
    """`labels` with each repeated one followed by where its run lies (its folder under the
    runs' common folder), so that rows, legends and warnings tell them apart (the runs of one
    method in a sweep's cells and seeds); None when no label repeats."""
    if len(set(labels)) == len(labels):
        return None
    paths = [Path(d).resolve() for d in run_dirs]
    common = Path(os.path.commonpath(paths)) if len(paths) > 1 else paths[0].parent
    out = []
    for label, path in zip(labels, paths, strict=True):
        where = path.relative_to(common).as_posix() if path != common else path.name
        out.append(f"{label} [{where}]" if labels.count(label) > 1 else label)
    return out


def write_comparison_report(
    run_dirs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str] | None = None,
    runs_root: str | Path | None = None, figures: bool = True, warnings: Sequence[str] = (),
) -> Path:
    """Draw the comparison figures (unless not `figures`: a comparison of runs with
    `[output] figures = false`) and write `out_dir/report.md`; return its path.

    The table keeps the order of `run_dirs`; `labels` (one per run) replace the runs' own
    names in the table and figures. The report opens with a warning when the runs were made
    on different federations or with different training budgets (`comparison_warnings`) and
    one per diverged run, and ends with each run's options, federation and a link to its own
    `report.md` (else its folder); with `runs_root` (run folders that do not travel with the
    report, e.g. outside the repository) each run is named by its path under `runs_root`
    instead, never linked. `warnings`: lines of the comparison's own (its config's options
    some compared method does not use, `compare.unused_options`), after those.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [read_summary(d) for d in run_dirs]
    if labels is None:
        labels = distinct_labels([run_label(s, d) for s, d in zip(summaries, run_dirs,
                                                                  strict=True)], run_dirs)
    if labels is not None:
        summaries = [replace(s, label=lab) for s, lab in zip(summaries, labels, strict=True)]
    with _writing(out_dir, "the compared runs are untouched: `clusterfl report` of them "
                           "writes the comparison again once there is room"):
        return _write_comparison(run_dirs, out_dir, summaries, labels, figures, runs_root,
                                 warnings)


def _write_comparison(run_dirs: Sequence[str | Path], out_dir: Path,
                      summaries: list[RunSummary], labels: Sequence[str] | None, figures: bool,
                      runs_root: str | Path | None, warnings: Sequence[str]) -> Path:
    drawn = plot_comparison(run_dirs, out_dir, labels) if figures else []
    federations = sorted({_known(s.federation) for s in summaries})
    warnings = [*_differences([Path(d) for d in run_dirs], summaries), *warnings]
    runs = f"{len(summaries)} run" + ("s" if len(summaries) != 1 else "")
    parts = [
        f"# Comparison of {runs}\n\nFederation: "
        + ", ".join(f"`{f}`" for f in federations) + ".\n",
        "".join(f"> **Warning:** {w}\n>\n" for w in warnings).removesuffix(">\n"),
        _divergence_note(summaries),
        "## Results\n\n" + summary_markdown(summaries),
        "## Figures\n\n" + _figure_links(drawn, out_dir) if drawn else "",
        "## Runs\n\n" + _run_links(run_dirs, summaries, out_dir, runs_root),
    ]
    path = out_dir / REPORT_FILE
    write_whole(path, "\n".join(p for p in parts if p))
    return path


# --------------------------------------------------------------------------- run setups

#: the config fields that make a run's federation (`data.data_dir` only says where files are)
FEDERATION_TABLES = ("data", "scenario")
#: the config fields of the training budget every method of a comparison should share
BUDGET_TABLES = ("model", "train")


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's `config.toml` as a dict ({} when absent or unreadable)."""
    text = load_config_text(run_dir)
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def run_setup(run_dir: Path, summary: RunSummary) -> tuple[dict[str, Any], dict[str, Any]]:
    """(federation, budget) of a run as flat `field: value` dicts.

    The federation: the summary's federation name and client count, and from `config.toml`
    `seed` and the `[data]` (but `data_dir`) and `[scenario]` tables. The budget: `rounds`
    and the `[model]` and `[train]` tables.
    """
    config = _config(run_dir)
    fed: dict[str, Any] = {"federation": summary.federation, "n_clients": summary.n_clients}
    if "seed" in config:
        fed["seed"] = config["seed"]
    for name in FEDERATION_TABLES:
        if name in config:
            fed.update(flatten({name: config[name]}))
    fed.pop("data.data_dir", None)
    budget: dict[str, Any] = {"rounds": summary.rounds}
    for name in BUDGET_TABLES:
        if name in config:
            budget.update(flatten({name: config[name]}))
    return fed, budget


#: what a run directory without a config.toml still tells (its summary)
SUMMARY_FIELDS = ("federation", "n_clients", "rounds")


def _differing(setups: Sequence[dict[str, Any]], names: Sequence[str],
               known: Sequence[bool]) -> list[str]:
    """`field = value for run, run; value for run` for every field whose values differ.

    A run without a readable config.toml (`known` False) takes part only in the fields its
    summary gives.
    """
    out = []
    for key in dict.fromkeys(k for s in setups for k in s):
        runs = [(s, n) for s, n, k in zip(setups, names, known)
                if k or key in SUMMARY_FIELDS]
        values = [json.dumps(s.get(key), ensure_ascii=False) for s, _ in runs]
        if len(set(values)) < 2:
            continue
        groups: dict[str, list[str]] = {}
        for value, (_, name) in zip(values, runs):
            groups.setdefault("unset" if value == "null" else value, []).append(name)
        out.append(f"{key} = " + "; ".join(f"{v} for {', '.join(n)}" for v, n in groups.items()))
    return out


def _differences(run_dirs: Sequence[Path], summaries: Sequence[RunSummary]) -> list[str]:
    names = [run_label(s, d) for s, d in zip(summaries, run_dirs)]
    setups = [run_setup(d, s) for d, s in zip(run_dirs, summaries)]
    known = [bool(_config(d)) for d in run_dirs]
    out = []
    fed = _differing([f for f, _ in setups], names, known)
    if fed:
        out.append("the runs' federations differ, so their numbers are not comparable: "
                   + " | ".join(fed))
    budget = _differing([b for _, b in setups], names, known)
    if budget:
        out.append("the runs' training budgets differ: " + " | ".join(budget))
    return out


def comparison_warnings(run_dirs: Sequence[str | Path]) -> list[str]:
    """One line per kind of difference between the runs' setups: different federations
    (federation, clients, seed, `[data]`, `[scenario]`), different training budgets
    (rounds, `[model]`, `[train]`); [] when the runs are comparable."""
    dirs = [Path(d) for d in run_dirs]
    summaries = [read_summary(d) for d in dirs]
    labels = distinct_labels([run_label(s, d) for s, d in zip(summaries, dirs, strict=True)],
                             dirs)  # the names the report gives them
    if labels is not None:
        summaries = [replace(s, label=lab) for s, lab in zip(summaries, labels, strict=True)]
    return _differences(dirs, summaries)


def _options(run_dir: Path) -> str:
    """The run's `[algorithm]` options (all of them, from `config.toml`) as `key=value`."""
    table = _config(run_dir).get("algorithm")
    if not isinstance(table, dict):
        return MISSING
    items = [f"{k}={_option_text(v)}" for k, v in table.items() if k != "name"]
    return ", ".join(items) if items else "(none)"


def _option_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _run_links(run_dirs: Sequence[str | Path], summaries: Sequence[RunSummary],
               base: Path, runs_root: str | Path | None = None) -> str:
    """A table of the runs: name linked to its report (or folder; named by its path under
    `runs_root` instead, never linked, when given), options, federation."""
    lines = ["| method | options | federation | folder |", "|:---|:---|:---|:---|"]
    for run_dir, summary in zip(run_dirs, summaries):
        run_dir = Path(run_dir)
        fed, _ = run_setup(run_dir, summary)
        where = f"`{_known(summary.federation)}`, {_known(summary.n_clients)} clients" + (
            f", seed {fed['seed']}" if "seed" in fed else "")
        name = run_label(summary, run_dir).replace("[", "\\[").replace("]", "\\]")
        if runs_root is not None:  # named by its path, never linked
            folder = Path(os.path.relpath(run_dir, runs_root)).as_posix()
            lines.append(_markdown_row([name, _options(run_dir), where, f"`{folder}`"]))
            continue
        target = run_dir / REPORT_FILE if (run_dir / REPORT_FILE).is_file() else run_dir
        link = Path(os.path.relpath(target, base)).as_posix()
        lines.append(_markdown_row([f"[{name}](<{link}>)", _options(run_dir), where,
                                    f"`{run_dir.name}`"]))
    return "\n".join(lines) + "\n"
