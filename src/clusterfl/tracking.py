"""Experiment tracking: callbacks that see every round, and the TensorBoard writer.

A callback is any object with some of these methods (each optional):

- `on_run_start(config, run_dir)`: the resolved config (a dict, as `config.toml` holds it)
  and the run directory (None for a run without one), before the first round it runs
  (also when a run resumes);
- `on_round_end(record)`: the `RoundRecord` of each round as it ends (what
  `history.jsonl` gets);
- `on_run_end(summary, run_dir)`: the `RunSummary` once the run's files are written
  (figures included, when on).

Callbacks are given to `Experiment(..., callbacks=[...])`, or named in the config:
`[output] callbacks = ["mypkg.track:MyTracker"]` (import paths of classes or functions, each
called with no arguments to make the callback). `[output] tensorboard = true` adds
`TensorBoardCallback`, writing under `RUN_DIR/tensorboard`. A callback that raises stops
the run (a tracker that fails is not ignored silently) with one line naming the callback, the
hook, the round, the exception and where it was raised (`CallbackError`, chained to it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from clusterfl.errors import ClusterFLError, ConfigError, require, write_error
from clusterfl.plugins import describe, load_object
from clusterfl.records import RoundMetrics, RoundRecord, RunSummary

TENSORBOARD_DIR = "tensorboard"
HOOKS = ("on_run_start", "on_round_end", "on_run_end")


@runtime_checkable
class Callback(Protocol):
    """What a tracker implements (every method is optional at run time)."""

    def on_round_end(self, record: RoundRecord) -> None: ...


def round_scalars(record: RoundRecord) -> dict[str, float]:
    """The numbers of one round under TensorBoard tags: `metrics/<key>` (evaluated rounds:
    accuracy, macro-F1, loss, ...), `clustering/ari`, `clustering/n_clusters`,
    `communication/floats_down|floats_up|client_updates`, `robust/rejected`,
    `participants`, and `extras/<key>` for every numeric extra of the method."""
    out: dict[str, float] = {}
    if record.metrics is not None:
        for key in RoundMetrics.KEYS:
            value = getattr(record.metrics, key)
            if value is not None:
                out[f"metrics/{key}"] = float(value)
    plain = {"clustering/ari": record.ari, "clustering/n_clusters": record.n_clusters,
             "communication/floats_down": record.floats_down,
             "communication/floats_up": record.floats_up,
             "communication/client_updates": record.client_updates,
             "robust/rejected": record.rejected, "participants": record.participants}
    out.update({k: float(v) for k, v in plain.items() if v is not None})
    for key, value in record.extras.items():
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and np.isfinite(value):
            out[f"extras/{key}"] = float(value)
    return out


class TensorBoardCallback:
    """Per-round scalars (`round_scalars`) and, at the end, the run's figures as images, in
    TensorBoard event files under `log_dir` (`tensorboard --logdir RUN_DIR/tensorboard`).

    A resumed run purges the events after its checkpoint's round first, so the curves show
    each round once."""

    def __init__(self, log_dir: str | Path, figures: bool = True) -> None:
        require("tensorboard", "tensorboard", load=False)  # before the run, not at its start
        self.log_dir = Path(log_dir)
        self.figures = figures
        """Log the run's figures as images (`[output] figures`: none drawn this run, so the
        folder's PNGs, if any, are an earlier part's)."""
        self.purge_from: int | None = None
        """A continued run: the old last round, whose evaluation changed (dropped off the
        `eval_every` grid, or redone on `eval_clients`' sample); a finished run resumed with
        no round left: its last round, where its figures are logged again. Its events and
        later are purged and the round logged again (`Experiment.run`)."""
        self._writer: Any = None

    def on_run_start(self, config: dict[str, Any], run_dir: Path | None,
                     start: int = 1) -> None:
        require("tensorboard", "torch.utils.tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        purge = self.purge_from if self.purge_from is not None else (start if start > 1 else None)
        _quiet_writer_threads()
        _after_older_events(self.log_dir)
        with self._writing():
            self._writer = SummaryWriter(str(self.log_dir), purge_step=purge)
            if start == 1:
                from clusterfl.config import dump_toml

                text = "```toml\n" + dump_toml(config) + "\n```"
                self._writer.add_text("config", text, 0)

    def on_round_end(self, record: RoundRecord) -> None:
        with self._writing():
            for tag, value in round_scalars(record).items():
                self._writer.add_scalar(tag, value, record.round)
            self._writer.flush()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError of the writer (a full disk: raised in its thread, then again here at
        its next call) names the events file, which TensorBoard's error does not."""
        try:
            yield
        except OSError as exc:
            if exc.filename is None:
                exc.filename = str(self.events_file())
            raise

    def events_file(self) -> Path:
        """The events file being written (else the newest in `log_dir`, else `log_dir`)."""
        writer = getattr(getattr(self._writer, "file_writer", None), "event_writer", None)
        name = getattr(writer, "_file_name", None)
        if isinstance(name, str):
            return Path(name)
        events = sorted(self.log_dir.glob("events.out.tfevents.*"),
                        key=lambda p: p.stat().st_mtime)
        return events[-1] if events else self.log_dir

    def on_run_end(self, summary: RunSummary, run_dir: Path | None) -> None:
        import matplotlib.image as mpimg

        figures = sorted((run_dir / "figures").glob("*.png")) \
            if run_dir is not None and self.figures else []
        step = summary.rounds or 0
        with self._writing():
            for png in figures:
                image = np.asarray(mpimg.imread(png))
                if image.ndim == 2:
                    image = image[:, :, None]
                self._writer.add_image(f"figures/{png.stem}", image[:, :, :3], step,
                                       dataformats="HWC")
            self._writer.close()


def _after_older_events(log_dir: Path) -> None:
    """TensorBoard reads a folder's events files in the order of their names, and a name
    starts with the second its writer opened, then host, process id and a counter compared
    as text ("10" before "9"). A writer opened in the second of the folder's newest events
    file (a continuation in the same process, or a quick one) waits for the next second, so
    that its events come after the earlier part's and the purge of the old last round takes
    effect."""
    names = [p.name.split(".") for p in log_dir.glob("events.out.tfevents.*")]
    stamps = [int(parts[3]) for parts in names if len(parts) > 3 and parts[3].isdigit()]
    if stamps:
        wait = max(stamps) + 1 - time.time()
        if wait > 0:
            time.sleep(wait)


_WRITER_THREAD = "_AsyncWriterThread"
"""The class of TensorBoard's writer thread (tensorboard.summary.writer.event_file_writer)."""


def _quiet_writer_threads() -> None:
    """Keep TensorBoard's writer thread from printing its traceback when a write fails (a full
    disk): the writer raises the same error again at its next call in the run's thread,
    where the callback turns it into one line (`_callback_error`). Other threads' errors go
    to the hook that was there before."""
    before = threading.excepthook
    if getattr(before, "_quiets", None) == _WRITER_THREAD:
        return

    def hook(args: Any) -> None:
        if type(args.thread).__name__ == _WRITER_THREAD and isinstance(args.exc_value, OSError):
            return
        before(args)

    hook._quiets = _WRITER_THREAD  # type: ignore[attr-defined]
    threading.excepthook = hook


def make_callback(ref: str, field: str = "output.callbacks") -> Any:
    """A callback from an import path: the named class (or function) called without
    arguments; ConfigError when it cannot be made or has none of the hooks."""
    factory = load_object(ref, field)
    if not callable(factory):
        raise ConfigError(field, f"{ref!r} is a {type(factory).__name__}; name a class or "
                                 "function that makes a callback")
    try:
        callback = factory()
    except Exception as exc:
        raise ConfigError(field, f"{describe(factory)}() failed: {type(exc).__name__}: "
                                 f"{exc}") from None
    check_callback(callback, field)
    return callback


def check_callback(callback: Any, field: str = "callbacks") -> None:
    if isinstance(callback, type):
        raise ConfigError(field, f"{describe(callback)} is a class; give an instance of it "
                                 f"({callback.__name__}())")
    if not any(callable(getattr(callback, h, None)) for h in HOOKS):
        raise ConfigError(field, f"{type(callback).__name__} has none of the callback "
                                 f"methods {', '.join(HOOKS)}")


class CallbackError(ClusterFLError):
    """A callback raised: the run stops (`call`)."""


def call(callbacks: list[Any], hook: str, *args: Any, **kwargs: Any) -> None:
    """Call `hook` on every callback that has it; one that raises becomes a `CallbackError`.
    At the run's end every callback is still called after one raises (the results are
    written; the others' logs should be too), and the first error is raised then."""
    failed: CallbackError | None = None
    for cb in callbacks:
        fn = getattr(cb, hook, None)
        if not callable(fn):
            continue
        try:
            if hook == "on_run_start" and "start" in kwargs and not _takes(fn, "start"):
                fn(*args)
            else:
                fn(*args, **kwargs)
        except Exception as exc:
            error = _callback_error(cb, hook, exc, args, kwargs)
            if hook != "on_run_end":
                raise error from exc
            if failed is None:
                error.__cause__ = exc
                failed = error
    if failed is not None:
        raise failed


def _callback_error(cb: Any, hook: str, exc: Exception, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> CallbackError:
    """The one line of a callback that raised: where, and what became of the run."""
    import traceback

    when = (f" in round {args[0].round}" if hook == "on_round_end"
            and isinstance(args[0], RoundRecord) else "")
    if hook == "on_run_end":
        after = "the run had finished: its results are written (the other callbacks were called)"
    elif hook == "on_run_start" and kwargs.get("start", 1) == 1:
        after = "the run stopped before its first round: start it again with --overwrite"
    elif hook == "on_run_start":
        after = "the run stopped before continuing: --resume continues it from its checkpoint"
    else:
        after = "the run stopped (with checkpoints, --resume continues it from the last one)"
    if isinstance(cb, TensorBoardCallback) and isinstance(exc, OSError) and exc.filename:
        kept = f"the run's own files and checkpoints are intact; {after}"
        line = write_error(exc, Path(exc.filename), f"TensorBoard's events{when}, [output] "
                           "tensorboard", kept)
        return CallbackError(str(line))
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return CallbackError(
        f"callback {describe(type(cb))}: {hook}{when} raised {type(exc).__name__}: "
        f"{exc} ({Path(frame.filename).name}:{frame.lineno}); {after}")


def _takes(fn: Any, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
