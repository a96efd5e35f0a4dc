"""What the command-line modules share: the console for tables, the exit code of a
diverged run and the SIGTERM exception (imported by `cli` and `cli_sweep`, so neither
imports the other's module)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn

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


def encodable_streams() -> None:
    """Let stdout and stderr print any text: a character their encoding lacks (`×`, `ε`
    under PYTHONIOENCODING=ascii or a Latin-1 locale) is written as its `\\xd7` escape, a
    file name's undecodable bytes (a non-UTF-8 locale's surrogates) as those bytes, instead
    of a UnicodeEncodeError's traceback."""
    import codecs

    try:
        codecs.lookup_error(ESCAPE)
    except LookupError:
        codecs.register_error(ESCAPE, _escape)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.errors in (
                "strict", "surrogateescape", "backslashreplace"):
            stream.reconfigure(errors=ESCAPE)


ESCAPE = "clusterfl.escape"
"""The codec error handler of `encodable_streams`."""


def _escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    import codecs

    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad):  # bytes decoded with surrogateescape
        return bytes(ord(c) - 0xDC00 for c in bad), exc.end
    return codecs.backslashreplace_errors(exc)


class Parser(argparse.ArgumentParser):
    """clusterfl's argument parser (its subcommands' too): long options only in full (an
    abbreviation that works today, `--over` for `--overwrite`, would change meaning or fail
    once an option is added: `main` names the option meant instead), and a command name
    given wrong gets the nearest one (`compar` → `did you mean 'compare'?`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        import difflib

        wrong = re.match(r"argument .*: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            near = difflib.get_close_matches(wrong.group(1), choices, n=1, cutoff=0.6)
            if near:
                message += f"; did you mean {near[0]!r}?"
        super().error(message)


def given_twice(parsers: list[argparse.ArgumentParser], argv: list[str]) -> list[str]:
    """A warning for each option of `parsers` (a command's, with the ones above it) that
    `argv` gives more than once with different values (`--out a --out b`, `--resume
    --no-resume`): argparse keeps the last without a word; a repeat is allowed (a wrapper
    script's defaults, then the user's), but said; so is a `--set` key given different
    values (`--set rounds=3 --set rounds=4`). Other lists are left alone."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    lines = []
    # one option of two parsers (clusterfl's --data-dir and its command's) counted once
    for action in {tuple(a.option_strings): a for p in parsers for a in p._actions}.values():
        if "--set" in action.option_strings:
            lines += _set_twice(_values(action, words))
        if not action.option_strings or isinstance(action, (
                argparse._AppendAction, argparse._HelpAction, argparse._SubParsersAction)):
            continue
        given = _values(action, words)
        if len(set(given)) > 1:
            lines.append(f"{action.option_strings[0]} given {len(given)} times "
                         f"({', '.join(given)}): the last, {given[-1]}, is used")
    return lines


def _values(action: argparse.Action, words: list[str]) -> list[str]:
    """What `words` give `action`, in order: its values, or a flag's spellings."""
    given = []
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in action.option_strings:
            continue
        if action.nargs == 0:  # a flag: which of its spellings (--x, --no-x)
            given.append(name)
        else:
            given.append(value if eq else words[i + 1] if i + 1 < len(words) else "")
    return given


def _set_twice(items: list[str]) -> list[str]:
    """A line for each key that the `--set` items give different values (the same value
    twice, `3` and `3`, or `0.1` and `.1`, is no change); the command refuses bad items."""
    if len(items) < 2:  # the config module is not imported for nothing
        return []
    from clusterfl.config import parse_override
    from clusterfl.errors import ClusterFLError

    by_key: dict[str, list[tuple[str, Any]]] = {}
    for item in items:
        try:
            key, value = parse_override(item)
        except ClusterFLError:
            continue
        by_key.setdefault(key.strip(), []).append((item.split("=", 1)[1], value))
    return [f"--set {key} given {len(got)} times ({', '.join(t for t, _ in got)}): the "
            f"last, {got[-1][0]}, is used"
            for key, got in by_key.items()
            if len({(type(v).__name__, repr(v)) for _, v in got}) > 1]
