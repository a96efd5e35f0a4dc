"""Are these the catalog's files? Checksums of dataset files, computed once per file version.

`check_known_files` compares each file a reader opens with the catalog's SHA-256 (or MD5 when
the catalog has no SHA-256, as for the CIFAR-10 archive). A file that passed is remembered
by its resolved path, size and modification time, in-process and in a small JSON file in the
user's cache folder (`$XDG_CACHE_HOME/clusterfl/verified-files.json`, else
`~/.cache/clusterfl/...`; `$CLUSTERFL_CACHE` names another file), so a later run reads
nothing but that JSON. A rewritten or touched file is checked again. When the cache cannot be
written (a read-only home), files are simply checked on every run.

A file that fails is named with the dataset expected; when its checksum is that of another
file of the catalog, the message says which one ("the train images of fashion_mnist"), which
catches a valid archive of the wrong dataset put under the wrong folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from clusterfl.data.catalog import DATASETS, RemoteFile
from clusterfl.errors import DataError

CHUNK = 1 << 20
CACHE_NAME = "verified-files.json"
_checked: set[tuple[str, int, int]] = set()


def file_digests(path: Path) -> tuple[int, str, str]:
    """(size, sha256, md5) of a file, read once in chunks."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest(), md5.hexdigest()


def cache_path() -> Path:
    """The JSON file that remembers verified files."""
    explicit = os.environ.get("CLUSTERFL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "clusterfl" / CACHE_NAME


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _read_cache(path: Path) -> dict[str, list[object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, entries: dict[str, list[object]]) -> None:
    """Atomic and best effort: a cache that cannot be written only costs time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entries, fh, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def identify(sha256: str, md5: str) -> tuple[str, RemoteFile] | None:
    """The (dataset, file) of the catalog with these checksums, if any."""
    for name, info in DATASETS.items():
        for f in info.files:
            if (f.sha256 and f.sha256 == sha256) or (not f.sha256 and f.md5 == md5):
                return name, f
    return None


def _mismatch(name: str, f: RemoteFile, path: Path, size: int, sha256: str,
              md5: str) -> DataError | None:
    """None when `path` is the catalog's file `f`, else the error to raise."""
    if (f.sha256 or f.md5) is None:
        return None
    if (f.sha256 is None or f.sha256 == sha256) and (f.md5 is None or f.md5 == md5) and (
            f.size is None or f.size == size):
        return None
    expected = f"the {name} file {f.path}"
    root = path
    for _ in Path(f.path).parts:  # the data folder: `path` is root / f.path
        root = root.parent
    other = identify(sha256, md5)
    if other is not None:
        other_name, other_file = other
        return DataError(
            f"{name}: {path} is not {expected}: it is the {other_name} file {other_file.path} "
            f"(same checksum). It belongs in {root / other_file.path}; put the {name} files "
            f"in {path.parent} (`clusterfl data download {name} --data-dir {root}` fetches "
            "them).")
    want = f"sha256 {f.sha256}" if f.sha256 else f"md5 {f.md5}"
    got = f"sha256 {sha256}" if f.sha256 else f"md5 {md5}"
    sizes = f"{size} bytes, expected {f.size}; " if f.size is not None and f.size != size else ""
    return DataError(
        f"{name}: {path} is not {expected} ({sizes}{got}, expected {want}): a corrupt or "
        f"partial download, or another dataset. Check it with `clusterfl data verify {name}`, "
        f"fetch it again with `clusterfl data download {name}`, or set data.verify = false "
        "to use files of your own.")


def check_known_files(name: str, paths: Iterable[Path]) -> None:
    """Raise DataError unless every path is its catalog file of dataset `name`.

    Files the catalog does not list (or lists without checksums) pass. Each file version is
    hashed once: the result is kept in-process and in the JSON cache (`cache_path()`).
    """
    info = DATASETS.get(name)
    if info is None:
        return
    by_name = {Path(f.path).name: f for f in info.files}
    todo = []
    for path in paths:
        f = by_name.get(path.name)
        if f is None or (f.sha256 or f.md5) is None:
            continue
        key = _key(path)
        if key not in _checked:
            todo.append((path, f, key))
    if not todo:
        return
    cache_file = cache_path()
    cache = _read_cache(cache_file)
    changed = False
    for path, f, key in todo:
        expected = f.sha256 or f.md5
        entry = cache.get(key[0])
        if entry == [key[1], key[2], expected]:
            _checked.add(key)
            continue
        size, sha256, md5 = file_digests(path)
        problem = _mismatch(name, f, path, size, sha256, md5)
        if problem is not None:
            raise problem
        _checked.add(key)
        cache[key[0]] = [key[1], key[2], expected]
        changed = True
    if changed:
        _write_cache(cache_file, cache)


def forget() -> None:
    """Clear the in-process memory of verified files (tests)."""
    _checked.clear()


__all__ = ["CACHE_NAME", "cache_path", "check_known_files", "file_digests", "forget",
           "identify"]
