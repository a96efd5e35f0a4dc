"""`flower-supernode` with a short idle poll: the SuperNode our launcher starts (issue 26).

Flower 1.41's SuperNode (`flwr.supernode.start_client_internal.start_client_internal`) asks
the SuperLink for a message, and when there is none sleeps a fixed `time.sleep(3)` before it
asks again; once it has a message it waits for the reply in `time.sleep(0.5)` steps. No flag
or environment variable changes either, so a message waits 0–3 s on the node before it is
even pulled, and 0–0.5 s more after its reply is ready: on loopback that was most of a
round's latency (benchmarks/flower/RESULTS.md).

This entry point runs Flower's own `flower-supernode` (same arguments, same code) with two
changes inside `start_client_internal`:

1. its `time` is a proxy whose `sleep(3)` sleeps `IDLE_POLL` s and whose `sleep(0.5)` sleeps
   `REPLY_POLL` s (every other use of `time` passes through);
2. its `subprocess` is a proxy whose `Popen(["flower-superexec", ...])` starts
   `python -m clusterfl.deploy.superexec` with the same arguments: the SuperExec that answers
   ClientApp tasks in its own long-lived process instead of a new `flwr-clientapp` process
   per message (see that module). Every other `Popen` passes through.

3. the backoff of its object pulls starts at 0.02 s instead of 1 s (`fast_object_pulls`; our
   SuperExec and ServerApp do the same in their processes).

Before patching it checks that the installed Flower is one this was written for (1.41.x) and
that `start_client_internal`'s source still holds exactly those calls; otherwise it stops with
a one-line error naming what changed, rather than silently running the slow loop. Set
`CLUSTERFL_SUPERNODE_IDLE_POLL` / `CLUSTERFL_SUPERNODE_REPLY_POLL` (seconds) to change the
intervals, `CLUSTERFL_WARM_CLIENTAPP=0` to keep Flower's process per message. Only our
launcher (`clusterfl.deploy.launch`) uses it; a SuperNode started by hand with
`flower-supernode` works unchanged, with Flower's 3 s poll and a process per message.

    python -m clusterfl.deploy.supernode [flower-supernode arguments]
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from clusterfl.errors import require

IDLE_POLL = 0.2
"""Seconds between two pulls of an idle SuperNode (Flower 1.41: 3)."""

REPLY_POLL = 0.02
"""Seconds between two checks for a finished reply (Flower 1.41: 0.5)."""

SUPPORTED = "1.41."
_IDLE_CALL, _REPLY_CALL = "time.sleep(3)", "time.sleep(0.5)"
_SUPEREXEC_CALLS = ('command = ["flower-superexec"]', "subprocess.Popen(command)")


class WarmSuperExec:
    """Stands in for `subprocess` inside `start_client_internal`: the SuperExec it starts is
    `clusterfl.deploy.superexec` (same arguments); everything else is the real module."""

    def Popen(self, args: Any, *rest: Any, **kw: Any) -> Any:  # noqa: N802 - subprocess API
        if isinstance(args, list) and args and args[0] == "flower-superexec":
            args = [sys.executable, "-m", "clusterfl.deploy.superexec", *args[1:]]
        return subprocess.Popen(args, *rest, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


class FastSleep:
    """Stands in for the `time` module inside `start_client_internal`: Flower's two fixed
    poll sleeps become `idle` / `reply` seconds; everything else is the real `time`."""

    def __init__(self, idle: float, reply: float) -> None:
        self.idle, self.reply = idle, reply

    def sleep(self, seconds: float) -> None:
        if seconds == 3:
            seconds = self.idle
        elif seconds == 0.5:
            seconds = self.reply
        time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def patch(module: ModuleType | None = None, version: str | None = None,
          idle: float | None = None, reply: float | None = None,
          warm: bool | None = None) -> FastSleep:
    """Give Flower's SuperNode loop (`module`, default the installed
    `flwr.supernode.start_client_internal`) the short polls and (`warm`, default unless
    `CLUSTERFL_WARM_CLIENTAPP=0`) our SuperExec; RuntimeError when the installed Flower is
    not 1.41.x or its code no longer does what is patched."""
    require("flower", "flwr")
    import flwr

    if module is None:
        module = importlib.import_module("flwr.supernode.start_client_internal")
    assert module is not None
    found = flwr.__version__ if version is None else version
    if not found.startswith(SUPPORTED):
        raise RuntimeError(f"clusterfl's SuperNode patch was written for Flower {SUPPORTED}x, "
                           f"found {found}: start SuperNodes with flower-supernode instead, "
                           "or update clusterfl.deploy.supernode")
    source = inspect.getsource(module)
    for call in (_IDLE_CALL, _REPLY_CALL):
        if call not in source or getattr(module, "time", None) is not time:
            raise RuntimeError(f"Flower's SuperNode loop ({module.__name__}) no longer calls "
                               f"{call} through its `time` module: clusterfl's poll patch "
                               "does not apply (update clusterfl.deploy.supernode)")
    proxy = FastSleep(
        float(os.environ.get("CLUSTERFL_SUPERNODE_IDLE_POLL", IDLE_POLL) if idle is None
              else idle),
        float(os.environ.get("CLUSTERFL_SUPERNODE_REPLY_POLL", REPLY_POLL) if reply is None
              else reply))
    setattr(module, "time", proxy)  # noqa: B010 - a module attribute replaced
    if warm if warm is not None else os.environ.get("CLUSTERFL_WARM_CLIENTAPP", "1") != "0":
        for call in _SUPEREXEC_CALLS:
            if call not in source or getattr(module, "subprocess", None) is not subprocess:
                raise RuntimeError(f"Flower's SuperNode ({module.__name__}) no longer starts "
                                   f"its SuperExec with {call}: clusterfl's SuperExec patch "
                                   "does not apply (update clusterfl.deploy.supernode)")
        setattr(module, "subprocess", WarmSuperExec())  # noqa: B010
    return proxy


PULL_BACKOFF = (0.02, 0.5)
"""(first, largest) seconds between two tries to pull an object that is not there yet."""


def fast_object_pulls(first: float = PULL_BACKOFF[0], cap: float = PULL_BACKOFF[1]) -> None:
    """Flower 1.41 pulls a message's objects with `inflatable_utils.pull_objects`, and when one
    is not there yet (a SuperNode stores a message before its objects arrive; a ServerApp
    pushes its messages one by one) waits 1 s, then 2 s, 4 s, ... up to 10 s before it tries
    again. On loopback that wait was most of what was left of a round once the processes were
    warm. This sets the defaults of that backoff in this process to `first` .. `cap` seconds
    (every caller uses the defaults); RuntimeError if the functions no longer take them."""
    mod = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        fn = getattr(mod, name, None)
        kw = getattr(fn, "__kwdefaults__", None) or {}
        if "initial_backoff" not in kw or "backoff_cap" not in kw:
            raise RuntimeError(f"Flower's {mod.__name__}.{name} no longer has keyword defaults "
                               "initial_backoff / backoff_cap: update "
                               "clusterfl.deploy.supernode.fast_object_pulls")
        kw["initial_backoff"], kw["backoff_cap"] = float(first), float(cap)


def run_patched(patch_fn: Callable[[], Any], module: str, command: str) -> None:
    """Apply `patch_fn` and the fast object pulls, then run Flower's `command` (its function
    of the same name, snake-cased, in `module`, imported only after patching) with this
    process's command line; a patch that no longer fits Flower ends in a one-line error."""
    try:
        patch_fn()
        fast_object_pulls()
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
    entry = getattr(importlib.import_module(module), command.replace("-", "_"))
    sys.argv[0] = command
    entry()


def main() -> None:
    """`flower-supernode` with the short polls (same command line)."""
    run_patched(patch, "flwr.supernode.cli.flower_supernode", "flower-supernode")


if __name__ == "__main__":
    main()
