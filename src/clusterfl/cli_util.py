"""What the command-line modules share: the console for tables, the exit code of a
diverged run and the SIGTERM exception (imported by `cli` and `cli_sweep`, so neither
imports the other's module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

DIVERGED_EXIT = 3


def console() -> Console:
    """Console for tables; a pipe or file gets a width that fits the comparison table."""
    from rich.console import Console

    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=200)
    return con


def stop_status(stop: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by `stop`: 143 for SIGTERM, 130 for Ctrl-C."""
    return 143 if isinstance(stop, Terminated) else 130


class Terminated(KeyboardInterrupt):
    """SIGTERM (a `kill`, a job scheduler's stop, `timeout`), raised where the command is, so
    that it stops as after Ctrl-C: the run keeps its checkpoint and frees its folder, and
    the processes it started (Flower's SuperLink and SuperNodes, sweep workers) are stopped
    instead of left running."""
