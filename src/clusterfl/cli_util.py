"""What the command-line modules share: the console for tables and the exit code of a
diverged run (imported by `cli` and `cli_sweep`, so neither imports the other's module)."""

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
