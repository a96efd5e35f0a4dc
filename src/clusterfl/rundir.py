"""The folders clusterfl writes into: which files are ours, who may write them, and writing.

A run folder holds what one run writes and nothing else: the files of `RUN_FILES` and, in the
subfolders of `RUN_SUBDIRS`, the files those accept (`checkpoint/state.pt`, the PNGs of
`figures/`, TensorBoard's event files); a comparison folder holds a `report.md`, its figures
and one run folder per method (a folder holding a run's config, history or summary).
`--overwrite` removes exactly these files, by name, and refuses a folder holding anything
else, naming it: clusterfl never deletes what it did not write. No output folder lies inside
a run's folder (`check_outside_runs`), and no run goes into a folder holding other runs
(`runs_below`); a comparison's folder is no run's, so its runs go inside it.

While a process writes into a folder it holds the folder's lock, `LOCK_FILE` with its process
id and command line, locked with `flock`: the kernel lets go of it when the process ends, so a
lock left by a killed run (its process dead) is taken over by the next run, while a second
run, resume or overwrite into a folder a live process holds is refused in one line naming
that process. The lock file is removed when the holder ends normally.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from clusterfl.errors import ClusterFLError, write_error
from clusterfl.files import FileLock, write_whole
from clusterfl.records import HISTORY_FILE, SUMMARY_FILE, RoundRecord, RunSummary

LOCK_FILE = ".clusterfl.lock"
CHECKPOINT_DIR = "checkpoint"
_COMPARED = frozenset(f"{n}_compare.png" for n in ("accuracy", "ari", "communication"))
RUN_FILES = _COMPARED | {
    "config.toml", "config.toml.tmp", HISTORY_FILE, SUMMARY_FILE, SUMMARY_FILE + ".tmp",
    "report.md", LOCK_FILE,
    "cfl_tree.pt", "flt_relatedness.npz",  # the `save_artifacts` of CFL and FLT
    "flower.json", "flower_final_state.pt",  # `deploy.server_app` after a Flower run
    "vocab.txt",  # a language model's vocabulary (`data.text.Vocab`)
}
"""The files a run (or a comparison: its figures) writes at the top of its folder."""
RUN_SUBDIRS: dict[str, Callable[[str], bool]] = {
    CHECKPOINT_DIR: lambda n: n in ("state.pt", "state.pt.tmp", "state.tmp"),
    "figures": lambda n: n.endswith(".png"),  # the report's and the methods' (per round...)
    "tensorboard": lambda n: n.startswith("events.out.tfevents."),
}
"""Subfolders a run writes, and which of their files are its own."""
CLIENT_FILE = re.compile(r"client_\d{4,}\.npz")
"""The files of `clusterfl flower export-partitions`."""
RUN_MARKERS = (HISTORY_FILE, SUMMARY_FILE, CHECKPOINT_DIR)
"""A folder holding one of these is a run folder (for `check_report_out`)."""
DEFAULT_HINT = "resume=True to continue the run there or overwrite=True to replace it"


class RunDirInUseError(ClusterFLError):
    """The output folder is not empty (and neither resume nor overwrite was asked), holds
    files that are not ours, or is being written by another process."""


# ------------------------------------------------------------------ the lock


def running_process(folder: Path) -> str | None:
    """'process N' when `folder`'s lock file names a live process (a run that ended normally
    removed it), else None. Reads the file only: taking the lock, even for a moment, could
    turn away a run starting now."""
    try:
        pid = (folder / LOCK_FILE).read_text(encoding="utf-8").split(" ", 1)[0].strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not pid.isascii() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    try:
        os.kill(int(pid), 0)
    except PermissionError:  # alive, another user's
        return f"process {pid}"
    except (OSError, OverflowError):
        return None
    return f"process {pid}"


class FolderLock(FileLock):
    """The lock of one folder (module doc); `acquire` raises `RunDirInUseError` naming the
    process that holds it."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        super().__init__(self.folder / LOCK_FILE)

    def acquire(self) -> None:
        holder = self.try_acquire()
        if holder is not None:
            raise RunDirInUseError(
                f"{self.folder} is in use by {holder}; wait for it to end (or stop it) and "
                "try again, or choose another output folder")

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


F = TypeVar("F", bound=Callable[..., Any])


def check_folder(path: Path, flag: str = "--out", *, file: bool = False) -> None:
    """Without writing anything: `path` (with `file`: the folder of the file `path`) is a
    folder or can be made one, or the line `make_folder` would stop with: a file in the way
    (the folder itself, or one above it)."""
    folder = path.parent if file else path
    for above in (folder, *folder.parents):
        if above.exists():
            if above == folder and not above.is_dir():
                raise ClusterFLError(f"{flag}: {folder} is a file, not a folder; choose "
                                     "another one")
            if not above.is_dir():
                raise ClusterFLError(f"{flag}: cannot create the output folder {folder} (Not "
                                     "a directory); choose another one")
            return


def run_record(folder: Path) -> str | None:
    """The file that makes `folder` a run's folder: the history or summary a run writes when
    it starts or ends (None: neither). A `config.toml` alone is not one: a project's own
    folder may hold one."""
    for name in (HISTORY_FILE, SUMMARY_FILE):
        try:
            if (folder / name).is_file():
                return name
        except OSError:
            continue
    return None


def _resolved(path: Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(path).absolute()


def check_outside_runs(path: Path, flag: str = "--out", run: Path | None = None) -> None:
    """Refuse an output folder (or file) that lies inside another run's folder (at any depth;
    links followed): a run's folder holds that run's files only, and its `--overwrite` and
    `report` would meet the foreign folder. A comparison's, sweep's or suite's folder is no
    run's, so the run folders they make inside their own are not refused. `run`: a folder
    known to be a run's though it may hold neither history nor summary (the run `place`
    reads, by its config.toml)."""
    full, known = _resolved(path), None if run is None else _resolved(run)
    for above in full.parents:
        record = run_record(above) or ("config.toml" if above == known else None)
        if record is not None:
            raise RunDirInUseError(
                f"{flag}: {path} lies inside the folder of the run {above} (it holds that "
                f"run's {record}); a run's folder holds that run's files only: choose a "
                "folder outside it")


def make_folder(path: Path, flag: str = "--out") -> None:
    """`path` created with its parents (or already a folder); a path that cannot be one (a
    file in the way, no permission, a read-only or full disk) or that lies inside another
    run's folder (`check_outside_runs`) is one line naming the output folder."""
    check_folder(path, flag)
    check_outside_runs(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterFLError(f"{flag}: cannot create the output folder {path} "
                             f"({exc.strerror or exc}); choose another one") from None


def locking(argument: str) -> Callable[[F], F]:
    """Decorate a function that writes into the folder passed as `argument`: it runs holding
    that folder's lock (the folder is created first)."""
    def wrap(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def locked(*args: Any, **kwargs: Any) -> Any:
            folder = Path(signature.bind(*args, **kwargs).arguments[argument])
            make_folder(folder)
            with FolderLock(folder):
                return func(*args, **kwargs)
        return locked  # type: ignore[return-value]  # same signature as func
    return wrap


# ------------------------------------------------------------------ what is ours


def _ours_in(sub: Path) -> Callable[[str], bool] | None:
    """Which files of subfolder `sub` are ours (None: a subfolder we never write)."""
    return RUN_SUBDIRS.get(sub.name)


def holds_run(folder: Path) -> bool:
    """`folder` holds a run's own files (its config, history or summary) at its top."""
    return folder.is_dir() and any(
        (folder / n).is_file() for n in ("config.toml", HISTORY_FILE, SUMMARY_FILE))


def _is_run(folder: Path) -> bool:
    """A run's folder: it holds its config, history or summary (or nothing yet)."""
    return holds_run(folder) or all(e.name == LOCK_FILE for e in folder.iterdir())


def foreign_entry(folder: Path, runs_inside: bool = True) -> Path | None:
    """The first entry of `folder` that clusterfl did not write (None: every one is ours).
    `folder` must be a run's folder or, with `runs_inside`, a comparison's (a folder of runs'
    folders, its report and figures). Links are never ours."""
    entries = [e for e in sorted(folder.iterdir()) if e.name != LOCK_FILE]
    runs = [e for e in entries if runs_inside and e.is_dir() and not e.is_symlink()
            and _ours_in(e) is None and _is_run(e)]
    if not _is_run(folder) and not runs:  # neither a run nor a comparison: name a file
        inside = (f for e in entries for f in (e.rglob("*") if e.is_dir() else [e])
                  if not f.is_dir())
        return next(inside, entries[0] if entries else None)
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            bad = entry if entry.is_symlink() or entry.name not in RUN_FILES else None
        elif (own := _ours_in(entry)) is not None:
            bad = next((e for e in sorted(entry.iterdir())
                        if e.is_symlink() or not e.is_file() or not own(e.name)), None)
        else:
            bad = foreign_entry(entry, runs_inside=False) if entry in runs else entry
        if bad is not None:
            return bad
    return None


def _remove_ours(folder: Path, runs_inside: bool = True) -> None:
    """Remove the files of `foreign_entry`'s rules by name, then the folders they emptied."""
    for entry in folder.iterdir():
        if entry.is_symlink() or entry.name == LOCK_FILE:
            continue
        if entry.is_file() and entry.name in RUN_FILES:
            entry.unlink()
        elif entry.is_dir():
            own = _ours_in(entry)
            if own is not None:
                for f in entry.iterdir():
                    if f.is_file() and not f.is_symlink() and own(f.name):
                        f.unlink()
            elif runs_inside and _is_run(entry):
                _remove_ours(entry, runs_inside=False)
            else:
                continue
            if not any(entry.iterdir()):
                entry.rmdir()


def runs_in(folder: Path) -> list[str]:
    """The names of `folder`'s subfolders that hold a run (a comparison's methods), sorted."""
    return [e.name for e in sorted(folder.iterdir()) if e.is_dir() and not e.is_symlink()
            and _ours_in(e) is None and any(e.iterdir()) and _is_run(e)]


WALK_MOST = 10_000
"""The most folders `runs_below` looks into."""


def runs_below(folder: Path) -> list[str]:
    """The run folders below `folder` at any depth, as paths relative to it, sorted: its
    subfolders `runs_in` names and any deeper folder (or run subfolder such as `figures/`)
    holding a run's history or summary; the search stops at each one found, follows no link,
    and looks into `WALK_MOST` folders at most (a huge unrelated folder is refused anyway)."""
    found = runs_in(folder)
    for seen, (here, dirs, _) in enumerate(os.walk(folder)):
        if seen >= WALK_MOST:
            break
        at = Path(here)
        name = at.relative_to(folder).as_posix()
        if at != folder and (name in found or run_record(at) is not None):
            found.append(name)
            dirs.clear()
    return sorted(set(found))


def shown_names(names: list[str], most: int = 4) -> str:
    """`names` as a message lists them: the first `most`, then "...". """
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _claim(path: Path, resume: bool, overwrite: bool, hint: str,
           runs_inside: bool = False) -> None:
    """The checks of `claim_run_dir`, for a folder whose lock the caller holds."""
    entries = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
    if resume or not entries:
        return
    runs = [] if runs_inside else runs_below(path)
    if runs:  # a run never goes above others; its overwrite never takes them
        named = shown_names(runs)
        raise RunDirInUseError(
            f"{path} holds other runs ({named}); a run's folder holds that run's files only "
            "and overwrite never removes other runs: choose another output folder")
    if not overwrite:
        raise RunDirInUseError(f"{path} is not empty (it holds {shown_names(entries)}); "
                               f"pass {hint}")
    bad = foreign_entry(path, runs_inside)
    if bad is not None:
        raise RunDirInUseError(
            f"{path} holds {bad.relative_to(path)}, which clusterfl did not write; refusing to "
            "overwrite the folder: move that file away or choose another output folder")
    with ExitStack() as held:  # a run of a comparison may be going on in its own folder
        for sub in path.iterdir():
            if sub.is_dir() and not sub.is_symlink() and (sub / LOCK_FILE).exists():
                held.enter_context(FolderLock(sub))
        _remove_ours(path, runs_inside)
    for sub in path.iterdir():  # run folders whose lock file was left till now
        if sub.is_dir() and not sub.is_symlink() and not any(sub.iterdir()):
            sub.rmdir()


def check_resume_or_overwrite(resume: bool, overwrite: bool) -> None:
    """One line when both are asked: one continues what a folder holds, the other deletes it."""
    if resume and overwrite:
        raise ClusterFLError("resume and overwrite exclude each other: resume continues the "
                             "run in the folder, overwrite deletes it")


def _check_folder(path: Path, resume: bool, overwrite: bool) -> None:
    check_resume_or_overwrite(resume, overwrite)
    if path.exists() and not path.is_dir():
        raise RunDirInUseError(f"{path} is a file, not a run directory; choose another "
                               "output folder")


def claim_run_dir(path: str | Path, resume: bool = False, overwrite: bool = False,
                  hint: str = DEFAULT_HINT, runs_inside: bool = False) -> None:
    """Make `path` ready for one new run, or check it for a resumed one.

    An absent or empty folder is fine. A folder with files needs `resume` (they are that run's
    files) or `overwrite`, which removes our files first and refuses a folder holding anything
    else (module doc), other runs included unless `runs_inside` (a comparison's folder, whose
    overwrite replaces its methods' runs). A folder another live process writes into is
    refused. `hint` names the two options in the caller's words (`--resume or --overwrite`
    on the command line).
    """
    path = Path(path)
    _check_folder(path, resume, overwrite)
    if not resume:  # a run resumed where it is adds no folder anywhere
        check_outside_runs(path)
    if path.is_dir():
        with FolderLock(path):
            _claim(path, resume, overwrite, hint, runs_inside)


# ------------------------------------------------------------------ one run's files


class RunDir:
    """The folder of one run (`path` None: a run that writes no files): claimed and locked for
    the run (`claimed`), its config, history lines and summary written."""

    def __init__(self, path: str | Path | None,
                 saved: Callable[[], int | None] = lambda: None) -> None:
        self.path = None if path is None else Path(path)
        self.saved = saved
        """The round of the run's last checkpoint (None: none), for a write that fails."""

    def kept(self) -> str:
        """How the run goes on after a write into its folder failed."""
        saved = self.saved()
        if saved is None:
            return "no checkpoint was written: the run can restart with --overwrite"
        return (f"the checkpoint of round {saved} is intact: --resume continues from it "
                "(it rewrites this file) once there is room")

    @contextmanager
    def claimed(self, resume: bool = False, overwrite: bool = False,
                hint: str = DEFAULT_HINT, runs_inside: bool = False) -> Iterator[RunDir]:
        """Hold the folder's lock while the run writes into it (`claim_run_dir`'s checks
        first; `runs_inside`: a comparison's folder)."""
        if self.path is None:
            yield self
            return
        _check_folder(self.path, resume, overwrite)
        created = not self.path.exists()
        if not (resume and self.path.is_dir()):  # a run resumed where it is adds no folder
            make_folder(self.path)
        try:
            with FolderLock(self.path):
                _claim(self.path, resume, overwrite, hint, runs_inside)
                yield self
        except BaseException:  # a run that failed before writing leaves no empty folder
            if created and self.path.is_dir() and not any(self.path.iterdir()):
                self.path.rmdir()
            raise

    def start(self, config_toml: str, records: list[RoundRecord]) -> None:
        """Write `config.toml` and the history so far (a resumed run's, else none). A summary
        already there is an earlier end of this run (continued to more rounds, or resumed
        when finished): removed, so that a continuation stopped before its own end never
        leaves a summary of fewer rounds beside the config and history it does not describe
        (`compare --resume` would take the run as finished)."""
        if self.path is None:
            return
        (self.path / SUMMARY_FILE).unlink(missing_ok=True)
        config = self.path / "config.toml"
        try:
            write_whole(config, config_toml)
        except OSError as exc:
            raise write_error(exc, config, "the run's config", self.kept()) from None
        history = self.path / HISTORY_FILE
        try:
            with open(history, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r.to_json_dict()) + "\n" for r in records)
        except OSError as exc:
            raise write_error(exc, history, f"rounds 1 to {len(records)}", self.kept()) \
                from None

    def append(self, record: RoundRecord) -> None:
        """Add round `record.round`'s line to the history, whole or not at all: a write that
        fails (a full disk, a file-size limit) cuts the file back to its earlier rounds and is
        one line naming it."""
        if self.path is None:
            return
        path = self.path / HISTORY_FILE
        line = memoryview((json.dumps(record.to_json_dict()) + "\n").encode())
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                while line:  # a write may take part of the line
                    line = line[os.write(fd, line):]
            except OSError as exc:
                os.ftruncate(fd, size)
                raise write_error(exc, path, f"round {record.round}; it keeps the rounds "
                                  "before, whole", self.kept()) from None
        finally:
            os.close(fd)

    def write_summary(self, summary: RunSummary) -> None:
        if self.path is None:
            return
        path = self.path / SUMMARY_FILE
        try:
            write_whole(path, json.dumps(summary.to_json_dict(), indent=2))
        except OSError as exc:
            raise write_error(exc, path, "the run's summary; history.jsonl holds every round",
                              self.kept()) from None


# ------------------------------------------------------------------ other writers


def check_report_out(out: str | Path, runs: list[Path]) -> None:
    """Refuse a comparison report's folder that is (or lies in) a run folder: one of the
    compared runs, or any other (`runs/report` may be the run of a `report.toml`)."""
    out, inputs = Path(out).resolve(), {r.resolve() for r in runs}
    for folder in (out, out.parent):
        if folder in inputs or any((folder / m).exists() for m in RUN_MARKERS):
            raise RunDirInUseError(
                f"report --out {out}: {folder} is a run folder; a comparison report would "
                "overwrite its report.md and figures: give --out a folder of its own")


@contextmanager
def export_folder(path: str | Path) -> Iterator[int]:
    """Hold `path`'s lock while client files are exported into it, after removing the
    client files (`CLIENT_FILE`) of an earlier export; yields how many were removed. A
    folder holding anything else is refused, naming that file."""
    path = Path(path)
    _check_folder(path, False, False)
    make_folder(path, "out_dir")
    with FolderLock(path):
        old = sorted(p for p in path.iterdir() if p.name != LOCK_FILE)
        bad = next((p for p in old if p.is_symlink() or not p.is_file()
                    or not CLIENT_FILE.fullmatch(p.name)), None)
        if bad is not None:
            raise RunDirInUseError(
                f"{path} holds {bad.name}, which is not a client file of an export; export "
                "the partitions into an empty folder (or one holding only an earlier export)")
        for p in old:
            p.unlink()
        yield len(old)


__all__ = [
    "LOCK_FILE",
    "RUN_FILES",
    "RUN_SUBDIRS",
    "FolderLock",
    "RunDir",
    "RunDirInUseError",
    "check_outside_runs",
    "check_report_out",
    "check_resume_or_overwrite",
    "claim_run_dir",
    "export_folder",
    "foreign_entry",
    "holds_run",
    "locking",
    "run_record",
    "running_process",
    "runs_below",
    "runs_in",
    "shown_names",
    "write_whole",
]
