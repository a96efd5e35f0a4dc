"""Dataset files: fetching them safely, and checking them.

Which files each dataset has (path under the data directory, official URL, size and checksums)
is the catalog of `clusterfl.data.catalog`; its names are re-exported here (`DATASETS`,
`RemoteFile`, ...) so callers keep importing them from this module.
`download` streams each missing or invalid file to a temporary file in the destination folder,
checks size and checksums, and only then renames it into place (`os.replace`, atomic), so an
interrupted or corrupted download never leaves a file that looks valid. The temporary file
(`.NAME.*.part`) is locked (`flock`) while it is written: one that nobody holds was left by a
killed download, and the next download of that file removes it and says so
(`partial_downloads` lists them for `data list` and `data verify`). When nothing has come from
the server for `WAIT_NOTICE` seconds, a line on stderr says which host it waits for; after
`timeout` seconds without data the download stops with one line naming the host.

A mirror given as `base_url` must mirror the data-directory layout: the file
`mnist/train-images-idx3-ubyte.gz` is fetched from `BASE_URL/mnist/train-images-idx3-ubyte.gz`
(so `python -m http.server` run inside a data directory is a valid mirror).
`digits` ships with scikit-learn and `synthetic_regression` is generated: they are not in
`DATASETS` (which lists downloadable datasets only), and `verify`/`download` accept them as no-ops.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from clusterfl.data.catalog import (
    BUILTIN,
    CIFAR10_URL,
    DATASETS,
    FASHION_URL,
    MNIST_URL,
    DatasetInfo,
    RemoteFile,
    dataset_info,
    default_data_dir,
    resolve_data_dir,
)
from clusterfl.data.integrity import file_digests
from clusterfl.errors import ConfigError, DataError

__all__ = [
    "BUILTIN",
    "CIFAR10_URL",
    "DATASETS",
    "FASHION_URL",
    "MNIST_URL",
    "DatasetInfo",
    "FileStatus",
    "RemoteFile",
    "check_file",
    "dataset_info",
    "default_data_dir",
    "download",
    "fetch_file",
    "file_url",
    "partial_downloads",
    "verify",
]

CHUNK = 1 << 20
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 86400.0
"""The longest `timeout` (a day): a socket takes no more than about 1e9 s."""
WAIT_NOTICE = 5.0
"""Seconds without data from the server before a line on stderr says what is awaited."""


@dataclass(frozen=True)
class FileStatus:
    """Result of checking one file: "ok", "unchecked" (present; the registry knows no size
    or checksum of it), "missing", "wrong_size" or "bad_checksum"."""

    path: Path
    status: Literal["ok", "unchecked", "missing", "wrong_size", "bad_checksum"]
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "unchecked")

    def __str__(self) -> str:
        return f"{self.path}: {self.status}" + (f" ({self.detail})" if self.detail else "")


# ---------------------------------------------------------------------- checking


def _mismatch(f: RemoteFile, size: int, sha256: str, md5: str) -> tuple[str, str] | None:
    """None when size and every known checksum match, else (status, explanation)."""
    if f.size is not None and size != f.size:
        return "wrong_size", f"size {size} bytes, expected {f.size}"
    if f.sha256 is not None and sha256 != f.sha256:
        return "bad_checksum", f"sha256 expected {f.sha256}, got {sha256}"
    if f.md5 is not None and md5 != f.md5:
        return "bad_checksum", f"md5 expected {f.md5}, got {md5}"
    return None


def check_file(f: RemoteFile, data_dir: Path) -> FileStatus:
    """Check one file of the registry under `data_dir`."""
    path = data_dir / f.path
    if not path.is_file():
        return FileStatus(path, "missing", "not found")
    if f.size is None and f.sha256 is None and f.md5 is None:
        return FileStatus(path, "unchecked", "present; no official size or checksum to "
                          "compare, the reader checks it")
    problem = _mismatch(f, *file_digests(path))
    if problem is None:
        return FileStatus(path, "ok")
    status, detail = problem
    return FileStatus(path, status, detail)  # type: ignore[arg-type]  # a Status literal


def verify(name: str, data_dir: str | Path | None = None) -> list[FileStatus]:
    """Status of every file of dataset `name` (an empty list when it needs no files)."""
    root = resolve_data_dir(data_dir)[0]  # `~` expanded, as a run reads it
    return [check_file(f, root) for f in dataset_info(name).files]


# ---------------------------------------------------------------------- fetching


def file_url(f: RemoteFile, base_url: str | None) -> str:
    """The official URL, or `base_url/<path under the data dir>` for a mirror."""
    return f.url if base_url is None else f"{base_url.rstrip('/')}/{f.path}"


def _say(line: str) -> None:
    print(f"clusterfl: {line}", file=sys.stderr, flush=True)


class _Waiting:
    """While a download runs, says once per stall on stderr which host it waits for, when
    nothing has come for `WAIT_NOTICE` seconds (`alive()` marks data arriving)."""

    def __init__(self, host: str, timeout: float) -> None:
        self.host, self.timeout = host, timeout
        self.last, self.said = time.monotonic(), False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _Waiting:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def alive(self) -> None:
        self.last, self.said = time.monotonic(), False

    def _watch(self) -> None:
        while not self._stop.wait(min(WAIT_NOTICE, 0.25)):
            if not self.said and time.monotonic() - self.last >= WAIT_NOTICE:
                self.said = True
                _say(f"waiting for {self.host}: nothing received for {WAIT_NOTICE:g} s (gives up "
                     f"after {self.timeout:g} s without data, --timeout)")


class _WriteError(Exception):
    """Writing the downloaded bytes failed (a full disk): the file's fault, not the server's."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _stream(url: str, out: BinaryIO, timeout: float,
            progress: Callable[[str, int, int | None], None] | None) -> None:
    """Copy `url` into `out`; every network failure becomes a DataError naming the URL, its
    host and, for a silent server, the timeout. A failed write raises `_WriteError`."""
    if not url.startswith(("http://", "https://", "file:")):
        raise DataError(f"refusing to download {url}: only http(s) and file URLs are allowed")
    host = urllib.parse.urlsplit(url).netloc or url
    silent = (f"download of {url} failed: {host} sent nothing for {timeout:g} s (--timeout "
              f"{timeout:g}); try again later, a longer --timeout, or a mirror (--base-url)")
    request = urllib.request.Request(url, headers={"User-Agent": "clusterfl"})
    try:
        with _Waiting(host, timeout) as waiting, \
                urllib.request.urlopen(request, timeout=timeout) as response:
            total = response.headers.get("Content-Length")
            done = 0
            while chunk := response.read1(CHUNK):  # what has come: no wait for a full CHUNK
                waiting.alive()
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise _WriteError(exc) from None
                done += len(chunk)
                if progress is not None:
                    progress(url, done, int(total) if total else None)
    except urllib.error.HTTPError as exc:
        raise DataError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):  # no connection within `timeout`
            raise DataError(silent) from None
        raise DataError(f"download of {url} failed: cannot connect ({exc.reason})") from None
    except TimeoutError:
        raise DataError(silent) from None
    except OSError as exc:
        raise DataError(f"download of {url} failed: {exc}") from None


def _part_pattern(dest: Path) -> str:
    return f".{dest.name}.*.part"


def _is_held(part: Path) -> bool | None:
    """Whether a download holds `part` (its lock); None when it is gone or unreadable."""
    try:
        fd = os.open(part, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the lock taken here
    return False


def partial_downloads(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """The `.FILE.*.part` files of dataset `name` that no download holds: left by a killed
    `data download` (the next download of that file removes them)."""
    root = resolve_data_dir(data_dir)[0]
    found = []
    for f in dataset_info(name).files:
        dest = root / f.path
        if dest.parent.is_dir():
            found += [p for p in sorted(dest.parent.glob(_part_pattern(dest)))
                      if _is_held(p) is False]
    return found


def _remove_stale(dest: Path) -> None:
    """Remove the partial files a killed download of `dest` left, saying so in one line."""
    stale = [p for p in sorted(dest.parent.glob(_part_pattern(dest))) if _is_held(p) is False]
    for part in stale:
        part.unlink(missing_ok=True)
    if stale:
        _say(f"removed {len(stale)} partial file(s) of an interrupted download of {dest.name} "
             f"in {dest.parent}: {', '.join(p.name for p in stale)}")


def fetch_file(f: RemoteFile, data_dir: Path, base_url: str | None = None,
               timeout: float = DEFAULT_TIMEOUT,
               progress: Callable[[str, int, int | None], None] | None = None) -> Path:
    """Download one file into `data_dir / f.path` atomically, after checking it."""
    dest = data_dir / f.path
    created = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    url = file_url(f, base_url)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(dest)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.",
                                        suffix=".part")
    except OSError as exc:
        blocking = next((p for p in (dest.parent, *dest.parent.parents)
                         if p.exists() and not p.is_dir()), None)
        why, fix = (f"{blocking} is a file, not a folder", "move it away or ") \
            if blocking is not None else (exc.strerror or str(exc), "")
        _remove_empty(created)
        raise DataError(f"cannot save {f.path} in {dest.parent} ({why}); {fix}choose another "
                        "--data-dir") from None
    tmp = Path(tmp_name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: not a leftover (module doc)
        try:
            with os.fdopen(fd, "wb") as out:
                _stream(url, out, timeout, progress)
        except (_WriteError, OSError) as exc:  # a write, or the flush on close
            error = exc.error if isinstance(exc, _WriteError) else exc
            raise DataError(f"cannot write {f.path} in {dest.parent} ({error.strerror or error}); "
                            "nothing of it was kept (free some space, or choose another "
                            "--data-dir)") from None
        problem = _mismatch(f, *file_digests(tmp))
        if problem is not None:
            raise DataError(
                f"checksum mismatch for {f.path} downloaded from {url}: {problem[1]}; "
                "the file was not saved (try again, or another mirror with --base-url)"
            )
        os.replace(tmp, dest)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM mid-file: say which file stopped
        raise type(stop)(f"download of {f.path} stopped; nothing of it was kept (the files "
                         "fetched before it are)") from None
    finally:
        tmp.unlink(missing_ok=True)
        _remove_empty(created)
    return dest


def _remove_empty(created: list[Path]) -> None:
    """The folders a failed download made (deepest first), where it left them empty: a failed
    download leaves no empty dataset folder behind."""
    for folder in created:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def download(name: str, data_dir: str | Path | None = None, base_url: str | None = None,
             timeout: float = DEFAULT_TIMEOUT,
             progress: Callable[[str, int, int | None], None] | None = None) -> list[Path]:
    """Fetch every missing or invalid file of dataset `name`; valid files are left alone.

    Args:
        name: a key of `DATASETS`.
        data_dir: destination root (default: `default_data_dir()`).
        base_url: mirror root replacing the official hosts (layout as the data directory).
        timeout: seconds to wait for the server to connect or send data (0 < timeout ≤
            `MAX_TIMEOUT`, else ConfigError naming `--timeout`).
        progress: optional callback `(url, bytes_done, bytes_total_or_None)`.

    Returns:
        The paths that were downloaded (empty when everything was already valid).

    Raises:
        DataError: network failure (URL and reason) or checksum mismatch (file, expected, got).
    """
    if not 0 < timeout <= MAX_TIMEOUT:  # nan too
        raise ConfigError("--timeout", f"must be a number of seconds > 0 and at most "
                          f"{MAX_TIMEOUT:g} (a day), got {timeout}")
    root = resolve_data_dir(data_dir)[0]  # `~` expanded, as a run reads it
    info = dataset_info(name)
    if info.how_to_get and not info.files:
        raise DataError(f"{name}: {info.how_to_get.replace('DATA_DIR', str(root))}")
    fetched = []
    for f in info.files:
        status = check_file(f, root)
        if status.ok:
            continue
        if not f.url:
            raise DataError(f"{name}: {root / f.path} has no download URL; {info.description}")
        if status.status != "missing":  # a file of the catalog's name, but not its file
            _say(f"{status}; fetching the official file to replace it (kept if that fails)")
        fetched.append(fetch_file(f, root, base_url, timeout, progress))
    return fetched
