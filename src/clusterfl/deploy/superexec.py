"""A SuperNode's SuperExec that answers ClientApp tasks in its own long-lived process.

Flower 1.41's SuperExec starts a new `flwr-clientapp` process for every message a SuperNode
receives (the `subprocess` executor): the interpreter, Flower's imports and the FAB
installation cost 1.5–2 s of CPU per message on an idle machine here, 3–7 s under load
(benchmarks/flower/RESULTS.md) — after the SuperNode's poll, the largest part of a round.

This module is Flower's own `flower-superexec` (same arguments, same task loop, same Runtime
API) with one change: a ClientApp task is not handed to a new process but to a thread of
this process, which does what `flwr.supernode.runtime.run_clientapp.run_clientapp` does —
pull the task's message and context from the SuperNode, call the ClientApp, push the reply
and the task's status, with the task's heartbeat running — using Flower's own functions for
each of those steps, without the per-process parts (FAB installation, exit handlers,
`sys.exit`). The ClientApp is clusterfl's (`clusterfl.deploy.client_app.app`, the file the
FAB ships); in this long-lived process it answers in-process (`node.handle_raw`, torch and
the node's data stay loaded), so no separate node worker is needed. A task of any other
Flower App (a standard ClientApp driven by `clusterfl.flower.ClusteredStrategy`) is answered
in-process too: its FAB is installed once (Flower's `install_from_fab`) and its ClientApp
loaded once (Flower's `get_load_client_app_fn`), as Flower's own `run_clientapp` does for
every message. ServerApp and simulation tasks go to Flower's executor unchanged.

It is started only by `clusterfl.deploy.supernode` (our launcher's SuperNodes); before
patching it checks the Flower version (1.41.x) and every internal it uses, and stops with a
one-line error naming what changed otherwise.

    python -m clusterfl.deploy.superexec [flower-superexec arguments]
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from clusterfl.errors import require

SUPPORTED = "1.41."
_NEEDED: dict[str, tuple[str, ...]] = {  # Flower 1.41's module → the names used here
    "flwr.app": ("Message",),
    "flwr.app.error": ("Error",),
    "flwr.common.constant": ("ErrorCode", "SubStatus"),
    "flwr.supercore.constant": ("TaskType",),
    "flwr.supercore.heartbeat": ("HeartbeatSender", "make_task_heartbeat_fn_http"),
    "flwr.supercore.interceptors": ("RuntimeTokenHttpInterceptor",
                                    "RuntimeVersionHttpInterceptor"),
    "flwr.supercore.retry": ("make_simple_http_retry_invoker",),
    "flwr.supercore.runtime": ("RuntimeHttpClient",),
    "flwr.supercore.superexec.executor.subprocess_executor": ("SubprocessExecutor",),
    "flwr.supercore.superexec.executor.types": ("LaunchResult",),
    "flwr.supernode.runtime.run_clientapp": ("pull_task_input", "push_message",
                                             "push_task_output"),
    "flwr.cli.install": ("install_from_fab",),
    "flwr.clientapp.utils": ("get_load_client_app_fn",),
}
APP_FAB = "clusterfl-app"
"""The Flower App id (`publisher/name`) contains this: our app's tasks run here."""


def _internals() -> dict[str, Any]:
    """Flower internals this module uses (RuntimeError naming what is missing)."""
    require("flower", "flwr")
    import flwr

    if not flwr.__version__.startswith(SUPPORTED):
        raise RuntimeError(f"clusterfl's SuperExec was written for Flower {SUPPORTED}x, found "
                           f"{flwr.__version__}: update clusterfl.deploy.superexec")
    found: dict[str, Any] = {}
    for module, names in _NEEDED.items():
        try:
            mod = importlib.import_module(module)
            found.update({name: getattr(mod, name) for name in names})
        except (ImportError, AttributeError) as exc:
            raise RuntimeError(f"Flower's internals changed ({module}: {exc}): clusterfl's "
                               "SuperExec does not apply (update clusterfl.deploy.superexec)"
                               ) from None
    if not callable(getattr(found["SubprocessExecutor"], "launch", None)):
        raise RuntimeError("Flower's SubprocessExecutor has no launch(): update "
                           "clusterfl.deploy.superexec")
    return found


class WarmClientApps:
    """Runs ClientApp tasks one at a time in a thread of this process."""

    def __init__(self, flower: dict[str, Any]) -> None:
        self.f = flower
        self.tasks: queue.Queue[Any] = queue.Queue()
        self._app: Any = None
        self._apps: dict[str, Any] = {}  # other Flower Apps' ClientApps, by FAB hash
        self.thread = threading.Thread(target=self._serve, name="clusterfl-clientapps",
                                       daemon=True)
        self.thread.start()

    def launch(self, spec: Any) -> Any:
        """`SubprocessExecutor.launch` for a ClientApp task: queue it (accepted at once)."""
        self.tasks.put((spec, time.time()))
        return self.f["LaunchResult"].accepted()

    def _serve(self) -> None:
        while True:
            spec, queued = self.tasks.get()
            try:
                self.run_task(spec, queued)
            except Exception:  # a task that cannot even report: logged, the host goes on
                traceback.print_exc()

    def app(self) -> Any:
        if self._app is None:
            from clusterfl.deploy.client_app import app

            self._app = app
        return self._app

    def other_app(self, run: Any, fab: Any) -> Any:
        """The ClientApp of another Flower App: its FAB installed and its app loaded once."""
        key = str(fab.hash_str)
        if key not in self._apps:
            self.f["install_from_fab"](fab.content, skip_prompt=True)
            load = self.f["get_load_client_app_fn"](default_app_ref="", app_path=None,
                                                    multi_app=True)
            self._apps[key] = load(run.fab_id, run.fab_version, key)
        return self._apps[key]

    def run_task(self, spec: Any, queued: float) -> None:
        """One ClientApp task, as `run_clientapp` runs it (pull, call, push, status)."""
        f = self.f
        certs = (None if spec.root_certificates_path is None
                 else Path(spec.root_certificates_path).read_bytes())
        client = f["RuntimeHttpClient"].from_server_address(
            server_address=spec.runtime_api_address, insecure=spec.insecure,
            root_certificates=certs,
            interceptors=[f["RuntimeVersionHttpInterceptor"](component_name="flwr-clientapp"),
                          f["RuntimeTokenHttpInterceptor"](spec.token)],
            retry_invoker=f["make_simple_http_retry_invoker"]())
        times: dict[str, float] = {"queued": queued, "client": time.time()}
        if os.environ.get("CLUSTERFL_TIMING"):
            _time_calls(client, times)
        heartbeat = f["HeartbeatSender"](f["make_task_heartbeat_fn_http"](client))
        heartbeat.start()
        message = reply = context = None
        status, details = f["SubStatus"].FAILED, "ClientApp task failed"
        try:
            message, context, run, fab = f["pull_task_input"](client)
            times["pulled"] = time.time()
            app = self.app() if APP_FAB in str(run.fab_id) else self.other_app(run, fab)
            reply = app(message=message, context=context)
            times["answered"] = time.time()
            status, details = f["SubStatus"].COMPLETED, ""
        except Exception as exc:
            traceback.print_exc()
            details = f"{type(exc).__name__}: {exc}"
            if message is not None:
                reply = f["Message"](f["Error"](
                    code=f["ErrorCode"].CLIENT_APP_RAISED_EXCEPTION, reason=details),
                    reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    f["push_message"](client, reply, context)
                f["push_task_output"](client, context, status, details)
            finally:
                times["pushed"] = time.time()
                if heartbeat.is_running:
                    heartbeat.stop()
                client.close()
                _timing(times)


def _time_calls(client: Any, times: dict[str, float]) -> None:
    """Time each Runtime API call of `client` (seconds and count, summed per method)."""
    for meth in ("PullTaskInput", "PullMessages", "PullObject", "ConfirmMessageReceived",
                 "PushMessages", "PushObject", "PushTaskOutput"):
        orig = getattr(client, meth)

        def timed(*a: Any, _o: Any = orig, _m: str = meth, **k: Any) -> Any:
            t = time.time()
            try:
                return _o(*a, **k)
            finally:
                times[_m] = times.get(_m, 0.0) + time.time() - t
                times[_m + "_n"] = times.get(_m + "_n", 0) + 1

        setattr(client, meth, timed)


def _timing(times: dict[str, float]) -> None:
    """One JSON line per task to `$CLUSTERFL_TIMING` when set (benchmarks/flower/bench.py)."""
    path = os.environ.get("CLUSTERFL_TIMING")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"kind": "warm_task", "pid": os.getpid(), **times}) + "\n")


def patch() -> WarmClientApps:
    """Route ClientApp tasks of Flower's subprocess executor to a `WarmClientApps`."""
    f = _internals()
    warm = WarmClientApps(f)
    executor = f["SubprocessExecutor"]
    flower_launch = executor.launch
    client_app = f["TaskType"].CLIENT_APP

    def launch(self: Any, spec: Any) -> Any:
        if spec.task_type == client_app:
            return warm.launch(spec)
        return flower_launch(self, spec)

    executor.launch = launch
    return warm


def main() -> None:
    """`flower-superexec` whose ClientApp tasks run in this process (same command line)."""
    from clusterfl.deploy.supernode import run_patched

    run_patched(patch, "flwr.supercore.cli.flower_superexec", "flower-superexec")


if __name__ == "__main__":
    main()
