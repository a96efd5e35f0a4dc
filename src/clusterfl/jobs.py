"""Run many finished-or-not runs: in this process, in local worker processes, or as Ray tasks.

The suite (`clusterfl bench`) and sweeps (`clusterfl sweep`, `clusterfl compare --seeds`)
hand `execute` a list of `RunTask`s, each a complete run config and its run folder; every
task runs as `clusterfl run` would run it (resumed from its checkpoint when the folder holds
one, started afresh otherwise) and comes back as a `RunOutcome`. A failed task is an outcome
with its error: the others go on.

Where the runs go:

- `jobs=1`, no Ray: one after the other in this process (federations built once per
  data/scenario/seed and reused by the next run on the same one);
- `jobs>1`: that many spawned worker processes, each with `threads` torch threads
  (default `max(1, cores // jobs)`), each caching the last federation it built;
- `ray="ADDRESS"`, `"auto"` or `"local"`: one Ray task per run on the cluster at ADDRESS
  (`ray start --head` prints it), the running cluster (`auto`, as `ray.init("auto")`), or a
  cluster started in this process (`local`). Each task asks Ray for `cpus` CPUs and `gpus`
  GPUs and runs with `cpus` torch threads; Ray runs as many at once as the cluster's
  resources allow. Every Ray node needs clusterfl installed and the run folders on a shared
  file system; `$CLUSTERFL_DATA` of this process is passed to the tasks.

A run's numbers do not depend on where it ran, given the same torch thread count (a
thread count can change the order of float sums): run a sweep with the same `--jobs`/
`--cpus-per-run` to reproduce it exactly. One exception, measured and not explained yet:
runs made one after another in one process (`jobs=1`) can differ in the last bits from the
same runs in fresh worker processes (`clusterfl bench --quick`: 7 of its 36 files, in float64
extras and, for FLT, its train and test losses at 1e-9; accuracy, ARI and assignments equal),
so compare runs made with the same `jobs` mode.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterfl.errors import ClusterFLError, ConfigError

ENV_KEYS = ("CLUSTERFL_DATA",)
"""Environment variables passed from the driver to worker processes and Ray tasks."""


@dataclass(frozen=True)
class RunTask:
    """One run: its complete config (the `[algorithm]` table and `seed` included), its run
    folder and its name in the log (e.g. "lr=0.1 / IFCA (K=4) / seed 2")."""

    what: str
    config: dict[str, Any]
    target: Path

    def federation_key(self) -> str:
        """Runs with equal keys share one federation (the data, the scenario, the seed)."""
        c = self.config
        return json.dumps([c.get("data"), c.get("scenario"), c.get("seed")], sort_keys=True,
                          default=str)


@dataclass
class RunOutcome:
    """How a task ended: `error` set when it raised; `divergence` the reason a finished run
    diverged (None otherwise); `final` the summary's final metrics (JSON dict)."""

    task: RunTask
    seconds: float
    error: str | None = None
    divergence: str | None = None
    resumed: bool = False
    final: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        """One line for the log: the metric, the ARI, the time, or the error."""
        if self.error is not None:
            return f"{self.task.what}: FAILED ({self.error})"
        acc, mse = self.final.get("accuracy"), self.final.get("mse")
        ppl, words = self.final.get("perplexity"), self.final.get("accuracy_no_oov_no_eos")
        shown = (f"perplexity {ppl:.2f}" if ppl is not None
                 else f"accuracy {100 * acc:.1f}%" if acc is not None
                 else f"MSE {mse if mse is not None else float('nan'):.4g}")
        if ppl is not None and words is not None:
            shown += f", accuracy no oov/eos {100 * words:.1f}%"
        ari = self.final.get("ari")
        text = (f"{self.task.what}: {shown}, ARI {'n/a' if ari is None else f'{ari:.2f}'}, "
                f"{self.seconds:.0f} s" + (" (resumed)" if self.resumed else ""))
        return text + (f"; DIVERGED ({self.divergence})" if self.divergence else "")


_FEDERATIONS: dict[str, Any] = {}


def run_task(task: RunTask, threads: int | None = None, env: dict[str, str] | None = None,
             progress: bool | None = False) -> RunOutcome:
    """Run one task here (resuming from its checkpoint); errors are returned, not raised.

    The last federation built is kept for the next task on the same data (one at a time
    bounds the memory of a long-lived worker).
    """
    started = time.perf_counter()
    resumed = False
    try:
        import torch

        from clusterfl.config import load_config
        from clusterfl.experiment import CHECKPOINT, Experiment, build_federation

        if threads is not None:
            torch.set_num_threads(threads)
        for key, value in (env or {}).items():
            os.environ[key] = value
        cfg = load_config(task.config)
        key = task.federation_key()
        if key not in _FEDERATIONS:
            _FEDERATIONS.clear()
            _FEDERATIONS[key] = build_federation(cfg)
        resumed = (task.target / CHECKPOINT).is_file()
        # no checkpoint: whatever an unfinished attempt left there is replaced
        history = Experiment(cfg, task.target, _FEDERATIONS[key], overwrite=not resumed).run(
            resume=resumed, progress=progress)
    except Exception as exc:  # reported with the run's name; the other runs go on
        return RunOutcome(task, time.perf_counter() - started, resumed=resumed,
                          error=f"{type(exc).__name__}: {exc}")
    summary = history.summary
    final = summary.cleaned().final.to_json_dict()
    return RunOutcome(task, time.perf_counter() - started, resumed=resumed, final=final,
                      divergence=divergence_reason(summary.divergence))


def divergence_reason(divergence: dict[str, Any] | None) -> str | None:
    """The reason of a diverged run's summary `divergence` (None: it did not diverge)."""
    return None if not divergence else str(divergence.get("reason", "diverged"))


def _driver_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ENV_KEYS if k in os.environ}


class Progress:
    """Counts across a whole batch for the log: done, in flight, failed, time left."""

    def __init__(self, total: int, parallel: int, skipped: int = 0) -> None:
        self.total, self.parallel, self.skipped = total, max(1, parallel), skipped
        self.done = self.failed = 0
        self.seconds: list[float] = []
        self.started = time.perf_counter()

    def finished(self, outcome: RunOutcome) -> str:
        self.done += 1
        self.failed += not outcome.ok
        if outcome.ok and not outcome.resumed:
            self.seconds.append(outcome.seconds)
        left = self.total - self.done
        running = min(self.parallel, left)
        status = (f"[{self.done + self.skipped}/{self.total + self.skipped} done, "
                  f"{running} running, {self.failed} failed")
        if left and self.seconds:
            mean = sum(self.seconds) / len(self.seconds)
            status += f", ~{_duration(mean * left / self.parallel)} left"
        return f"{status}] {outcome.line()}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def check_resources(jobs: int = 1, cpus: float | None = None, gpus: float = 0) -> None:
    """ConfigError naming the option when `--jobs`, `--cpus-per-run` or `--gpus-per-run` is
    out of range."""
    if jobs < 1:
        raise ConfigError("--jobs", f"must be at least 1, got {jobs}")
    if cpus is not None and not 0 < cpus < math.inf:
        raise ConfigError("--cpus-per-run", f"must be a finite number above 0, got {cpus}")
    if not 0 <= gpus < math.inf:
        raise ConfigError("--gpus-per-run", f"must be a finite number of 0 or more, got {gpus}")
    if gpus > 1 and gpus != int(gpus):
        raise ConfigError("--gpus-per-run", f"above 1 it must be a whole number, got {gpus}")


def execute(
    tasks: Sequence[RunTask], *, jobs: int = 1, threads: int | None = None,
    ray: str | None = None, cpus: float | None = None, gpus: float = 0,
    log: Callable[[str], None] = print, progress: bool | None = False, skipped: int = 0,
) -> list[RunOutcome]:
    """Run every task (see the module docstring for where); outcomes in the order they end.

    `cpus`: the CPUs of one run: what Ray reserves for it (default 1) and its torch threads,
    `ceil(cpus)`, here and on Ray. Without it a local run has `max(1, cores // jobs)` threads
    with `jobs > 1` and torch's default with `jobs == 1`. `threads` sets the torch threads
    alone. `skipped`: runs done before, shown in the progress counts.
    """
    check_resources(jobs, cpus, gpus)
    if threads is None and cpus is not None:
        threads = max(1, math.ceil(cpus))
    tasks = list(tasks)
    if not tasks:
        return []
    if ray is not None:
        return _execute_ray(tasks, ray, cpus or 1, gpus, threads, log, skipped)
    for line in local_warnings(len(tasks), jobs, threads, gpus):
        print(f"clusterfl: warning: {line}", file=sys.stderr, flush=True)
    bar = Progress(len(tasks), jobs, skipped)
    outcomes: list[RunOutcome] = []
    if jobs == 1:
        for task in tasks:
            outcome = run_task(task, threads, progress=progress)
            outcomes.append(outcome)
            log(bar.finished(outcome))
        return outcomes
    import multiprocessing as mp

    per_run = threads or max(1, (os.cpu_count() or 1) // jobs)
    env = _driver_env()
    context = mp.get_context("spawn")
    while tasks:  # again, in a new pool, for the runs a dead worker's pool never started
        started, before = context.SimpleQueue(), len(outcomes)
        broken = _local_pool(tasks, jobs, per_run, env, context, started, outcomes, bar, log)
        ran = set()
        while not started.empty():
            ran.add(started.get())
        if len(outcomes) == before and not ran & {t.target for t, _ in broken}:
            ran = {t.target for t, _ in broken}  # a pool that did nothing: not again
        tasks = [t for t, _ in broken if t.target not in ran]
        for task, error in broken:
            if task.target in ran:
                outcomes.append(RunOutcome(task, 0.0, error=error))
                log(bar.finished(outcomes[-1]))
    return outcomes


def local_warnings(n_tasks: int, jobs: int, threads: int | None, gpus: float,
                   cores: int | None = None) -> list[str]:
    """What the options of runs made on this machine (no Ray) do not do: `--gpus-per-run`
    reserves nothing, and runs at once × torch threads above the machine's cores compete."""
    lines = []
    if gpus:
        lines.append(f"--gpus-per-run {gpus:g}: only Ray reserves GPUs (--ray); runs on "
                     "this machine compute where backend.device says (--device), so it has "
                     "no effect here")
    cores = cores or os.cpu_count() or 1
    at_once = min(jobs, n_tasks)
    per_run = threads or (max(1, cores // jobs) if jobs > 1 else None)
    if per_run is not None and at_once * per_run > cores:
        lines.append(f"{at_once} run(s) at once (--jobs {jobs}) × {per_run} torch thread(s) "
                     f"each (--cpus-per-run) = {at_once * per_run} threads on this machine's "
                     f"{cores} cores: they compete for them (slower, same numbers)")
    return lines


def _local_pool(tasks: list[RunTask], jobs: int, per_run: int, env: dict[str, str],
                context: Any, started: Any, outcomes: list[RunOutcome], bar: Progress,
                log: Callable[[str], None]) -> list[tuple[RunTask, str]]:
    """Run `tasks` in `jobs` worker processes, adding their outcomes to `outcomes`; each run
    puts its target into `started` as it starts. Returns the tasks of a pool broken by a
    dead worker (SIGKILL, out of memory), with the error: the pool gives every task it had
    not finished that error, the runs it never started too (they were failed with it)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    broken: list[tuple[RunTask, str]] = []
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_start,
                             initargs=(os.getpid(), started)) as pool:
        futures = {pool.submit(_run_started, t, per_run, env): t for t in tasks}
        try:
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as exc:  # the worker process itself died
                    error = f"worker process ended: {type(exc).__name__}: {exc}"
                    if isinstance(exc, BrokenProcessPool):
                        broken.append((futures[future], POOL_BROKEN))
                        continue
                    outcome = RunOutcome(futures[future], 0.0, error=error)
                outcomes.append(outcome)
                log(bar.finished(outcome))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM of this process: the workers ignore Ctrl-C
            _stop_workers(pool)
            raise
    return broken


POOL_BROKEN = ("stopped: a --jobs worker process died (killed by a signal: the out-of-memory "
               "killer, kill -9), which stops every run of its pool; --retry-failed resumes "
               "the run from its last checkpoint (or starts it again without one)")
"""The error of the runs a dead worker stopped (Python's BrokenProcessPool named neither the
cause nor that this run, perhaps in another worker, keeps its checkpoint)."""

_STARTED: Any = None
"""In a local worker: the queue its runs' targets go into as they start (`_local_pool`)."""


def _worker_start(parent: int, started: Any) -> None:
    """A local worker's initializer: the queue of started runs, the end with its parent, and
    Ctrl-C ignored: the sweep's process stops its workers (`_stop_workers`). A worker that took
    Ctrl-C's KeyboardInterrupt as its run's result went on to the next run queued to it."""
    import signal

    global _STARTED
    _STARTED = started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent(parent)


def _run_started(task: RunTask, threads: int | None, env: dict[str, str]) -> RunOutcome:
    """`run_task` in a local worker, after saying that the run starts."""
    _STARTED.put(task.target)
    return run_task(task, threads, env)


def _end_with_parent(parent: int, every: float = 0.5) -> None:
    """A local worker's initializer: the worker ends when the sweep's process is gone
    (SIGKILL, the out-of-memory killer: nothing stops the workers then). It went on with the
    runs queued to it, writing into the sweep folder that a sweep started again holds (that
    sweep failed the run "in use by process ..."), and then waited for work forever. A run it
    ends keeps its last checkpoint, as after Ctrl-C."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="clusterfl-parent-watch", daemon=True).start()


def _stop_workers(pool: Any) -> None:
    """Cancel the runs not started and stop the running ones (their folders keep their last
    checkpoint: the sweep resumes them), so that leaving the pool does not wait for them.
    The workers are taken before `shutdown`, which forgets them (`_processes = None`)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _execute_ray(tasks: list[RunTask], address: str, cpus: float, gpus: float,
                 threads: int | None, log: Callable[[str], None],
                 skipped: int) -> list[RunOutcome]:
    import logging

    from clusterfl.errors import require

    require("ray", "ray")
    import ray

    _reachable(address)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address == "local":
                ray.init(include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=False)
            else:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterFLError(
                f"--ray: cannot connect to a Ray cluster at {address!r} ({exc}); start one "
                "with `ray start --head` and pass the address it prints, or use --ray local"
            ) from None
    try:
        total = ray.cluster_resources()
        if total.get("CPU", 0) < cpus or total.get("GPU", 0) < gpus:
            raise ClusterFLError(
                f"--cpus-per-run/--gpus-per-run: a run asks for {cpus} CPU and {gpus} GPU, "
                f"the Ray cluster has {total.get('CPU', 0):g} CPU and "
                f"{total.get('GPU', 0):g} GPU")
        parallel = int(total.get("CPU", 1) // cpus)
        if gpus:
            parallel = min(parallel, int(total.get("GPU", 0) // gpus))
        remote = ray.remote(run_task).options(num_cpus=cpus, num_gpus=gpus, max_retries=0)
        per_run = threads or max(1, math.ceil(cpus))
        env = _driver_env()
        bar = Progress(len(tasks), parallel, skipped)
        pending = {remote.remote(t, per_run, env): t  # type: ignore[call-arg]
                   for t in tasks}
        outcomes: list[RunOutcome] = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # the task's worker died (out of memory, killed)
                    outcome = RunOutcome(task, 0.0, error=f"Ray task ended: "
                                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                if outcome.ok and not (task.target / "summary.json").is_file():
                    outcome.error = (f"the run finished on a Ray node but {task.target} is not "
                                     "visible here: the output folder must be on a file system "
                                     "every Ray node shares")
                outcomes.append(outcome)
                log(bar.finished(outcome))
        return outcomes
    finally:
        if started_here:
            ray.shutdown()


def _reachable(address: str) -> None:
    """A HOST:PORT address must answer before Ray is asked (`ray.init` would wait minutes)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # auto, local, ray://...: Ray answers those itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ClusterFLError(
            f"--ray: nothing answers at {address} ({exc.strerror or exc}); start a cluster "
            "with `ray start --head` and pass the address it prints, or use --ray local"
        ) from None
