"""The progress bar of a run: round, accuracy and clusters; warnings printed above it.

The bar and the warnings go to stderr, the stream `want_progress` asks about (stdout keeps
the results table), as the warnings of a run without a bar do."""

from __future__ import annotations

import os
import sys
from typing import Any

from clusterfl.records import RoundMetrics, RoundRecord

MISSING = "—"
"""A value that is not there, as the results table writes it (`report.markdown.MISSING`;
not imported: the report pulls in matplotlib)."""


def want_progress(progress: bool | None, mode: str) -> bool:
    """Whether to show the bar: `progress` when given, else `[output] progress` (`auto`: on
    a terminal, outside CI)."""
    if progress is not None:
        return progress
    if mode != "auto":
        return mode == "on"
    return sys.stderr.isatty() and not os.environ.get("CI")


class Progress:
    """A rich progress bar with round, accuracy and clusters; silent when disabled. A round
    that is not evaluated (`eval_every` > 1) shows the last evaluated round's metric with its
    round ("acc 91.2% (r10)"); `evaluated`: that round of a resumed run, before its first."""

    def __init__(self, show: bool, total: int, done: int, label: str,
                 evaluated: RoundRecord | None = None) -> None:
        self.show, self.total, self.done, self.label = show, total, done, label
        self._bar: Any = None
        self._last: tuple[int, str] | None = None
        if evaluated is not None:
            self._remember(evaluated)

    def __enter__(self) -> Progress:
        if self.show:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("round {task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False,
                console=Console(stderr=True),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done,
                                            info="")
        return self

    def _remember(self, record: RoundRecord) -> None:
        if record.metrics is not None:  # evaluated: its metric, or none to show
            info = metric_info(record)
            self._last = (record.round, info) if info else None

    def update(self, record: RoundRecord) -> None:
        if self._bar is None:
            return
        self._remember(record)
        self._bar.update(self._task, advance=1, info=round_info(record, self._last))

    def warn(self, text: str) -> None:
        """A line for the user on stderr: above the bar when one is shown (one line, as
        without a bar: the terminal wraps it, not rich at 80 columns)."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, style="yellow",
                                    soft_wrap=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def round_info(record: RoundRecord, last: tuple[int, str] | None = None) -> str:
    """The bar's text for a round: an evaluated round's main metric (`metric_info`), or for a
    round not evaluated the `last` evaluated one's, (round, text), labelled with its round
    ("acc 91.2% (r10)"), then the clusters."""
    info = metric_info(record)
    if record.metrics is None and last is not None:
        info = f"{last[1]} (r{last[0]})"
    return "  ".join(part for part in (info, f"clusters {record.n_clusters}") if part)


def metric_info(record: RoundRecord) -> str:
    """An evaluated round's main metric ('' for a round not evaluated): accuracy; a
    regression's MSE, "mse —" when no client's was finite, as the results table shows it; a
    language model's perplexity and accuracy without <unk>/<eos>."""
    m = record.metrics or RoundMetrics()
    info = f"acc {100 * m.accuracy:.1f}%" if m.accuracy is not None else ""
    if m.mse is not None:
        info = f"mse {m.mse:.4f}"
    elif record.metrics is not None and record.client_mse is not None:  # a regression's
        info = f"mse {MISSING}"
    if m.perplexity is not None:
        info = f"perplexity {m.perplexity:.2f}"
        if m.accuracy_no_oov_no_eos is not None:
            info += f"  acc no oov/eos {100 * m.accuracy_no_oov_no_eos:.1f}%"
    return info
