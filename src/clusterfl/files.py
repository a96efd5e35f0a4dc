"""Files written safely: a lock that says who holds it, and a write that is whole or not at all.

`FileLock` takes an `flock` on its file and writes the holder's process id and command line
into it; the kernel lets go of an flock when its process ends, so a lock file left by a killed
process is simply taken over, and a live holder is named ("process 123 (clusterfl run ...)").
Run folders (`rundir.FolderLock`) and the FLT encoder cache (`encoders.pretrain_once`) use it.
`write_whole` writes a file through a temporary name renamed over it, so a full disk or an
interrupted write leaves the old file as it was (a run's files, its report and figures, CFL's
tree).
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path


def command_line(most: int = 120) -> str:
    """This process's command line for the lock file: the program's name and its arguments,
    without the value of an option that holds a secret (Flower's `--token`), at most `most`
    characters."""
    args, hide = [Path(sys.argv[0]).name], False
    for arg in sys.argv[1:]:
        args.append("…" if hide else arg)
        hide = arg in SECRET_OPTIONS
    text = " ".join(args).replace("\n", " ")
    return text if len(text) <= most else text[:most - 1] + "…"


SECRET_OPTIONS = ("--token",)
"""Options whose value the lock file does not repeat (a Flower ServerApp's run token)."""


def holder(path: Path) -> str:
    """Who holds the lock at `path`, as its file says ("process 123 (clusterfl run ...)")."""
    try:
        pid, _, command = path.read_text(encoding="utf-8", errors="replace").strip().partition(" ")
    except OSError:
        pid, command = "", ""
    who = f"process {pid}" if pid.isdigit() else "another process"
    if pid == str(os.getpid()):
        who += ", this one"
    return f"{who} ({command})" if command else who


class FileLock:
    """An `flock` on the file `path`, holding its owner's process id and command line (module
    doc): `try_acquire` takes it or says who holds it; the kernel lets go of it when the
    holder dies, so a file left by a killed process is taken over."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def try_acquire(self) -> str | None:
        """None once held by this object; else who holds it ("process 123 (clusterfl ...)")."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return holder(self.path)
            try:  # the holder may have ended, removing the file, between open and flock
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)  # a stale lock (its process dead) is taken over here
        os.write(fd, f"{os.getpid()} {command_line()}\n".encode(errors="surrogateescape"))
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # still ours: nobody else could lock it
        finally:
            os.close(self._fd)
            self._fd = None


def write_whole(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` whole or not at all: into `path.tmp`, renamed over `path`; a
    write that fails (a full disk) or is interrupted leaves the old file as it was."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8", errors="surrogateescape")
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a write's error names none
            exc.filename = str(path)
        raise
