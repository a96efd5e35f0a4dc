"""Downloads against a local HTTP server, checksums and atomic writes (clusterfl.data.download)."""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import importlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import clusterfl.data
from clusterfl.cli import main
from clusterfl.data.download import (
    DATASETS,
    DatasetInfo,
    RemoteFile,
    download,
    partial_downloads,
    verify,
)
from clusterfl.errors import ConfigError, DataError
from tests.datasets import require, skip_unless

PAYLOAD = b"clusterfl test payload " * 1000
download_module = importlib.import_module("clusterfl.data.download")  # `download` is the function


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server on 127.0.0.1 serving `tmp_path / "mirror"`."""
    root = tmp_path / "mirror"
    (root / "fake").mkdir(parents=True)
    (root / "fake" / "a.bin").write_bytes(PAYLOAD)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _register(monkeypatch: pytest.MonkeyPatch, **overrides: object) -> RemoteFile:
    fields: dict = {"path": "fake/a.bin", "url": "https://example.invalid/a.bin",
                    "size": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
                    "md5": hashlib.md5(PAYLOAD).hexdigest()}
    fields.update(overrides)
    remote = RemoteFile(**fields)
    monkeypatch.setitem(DATASETS, "fake", DatasetInfo("fake", "test data", (remote,)))
    return remote


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_download_verifies_and_is_atomic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         mirror: tuple[str, Path]) -> None:
    _register(monkeypatch)
    data_dir = tmp_path / "data"
    got = download("fake", data_dir, base_url=mirror[0], timeout=5)
    assert got == [data_dir / "fake" / "a.bin"]
    assert (data_dir / "fake" / "a.bin").read_bytes() == PAYLOAD
    assert _leftovers(data_dir / "fake") == ["a.bin"]  # no temporary file left
    assert [s.status for s in verify("fake", data_dir)] == ["ok"]
    assert download("fake", data_dir, base_url=mirror[0]) == []  # valid files are skipped


def test_checksum_mismatch_keeps_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         mirror: tuple[str, Path]) -> None:
    _register(monkeypatch, sha256="0" * 64)
    data_dir = tmp_path / "data"
    with pytest.raises(DataError, match=r"checksum mismatch for fake/a\.bin") as err:
        download("fake", data_dir, base_url=mirror[0], timeout=5)
    assert "0" * 64 in str(err.value)
    assert hashlib.sha256(PAYLOAD).hexdigest() in str(err.value)
    assert _leftovers(data_dir / "fake") == [] and not data_dir.exists()


def test_server_down_gives_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _register(monkeypatch)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(DataError, match="cannot connect") as err:
        download("fake", tmp_path / "data", base_url=url, timeout=5)
    assert f"{url}/fake/a.bin" in str(err.value)
    assert _leftovers(tmp_path / "data" / "fake") == []
    # nor the empty folders it made (`data download cifar10` offline left data/cifar10/)
    assert not (tmp_path / "data").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataError, match="cannot connect"):
        download("fake", tmp_path / "kept", base_url=url, timeout=5)
    assert list((tmp_path / "kept").iterdir()) == []  # a folder that was there stays


def test_a_file_where_the_dataset_folder_goes_is_named(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """A file `data/fake` (or `data`) where the dataset's folder must go stopped `data
    download` with Python's bare "File exists: ..." / "Not a directory: ..."."""
    _register(monkeypatch)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fake").write_text("mine")
    with pytest.raises(DataError, match=r"^cannot save fake/a\.bin in .*data/fake \(.*data/"
                                        r"fake is a file, not a folder\); move it away or "
                                        r"choose another --data-dir$"):
        download("fake", tmp_path / "data", base_url="http://127.0.0.1:9", timeout=5)
    with pytest.raises(DataError, match=r"\(.*data/fake is a file, not a folder\)"):
        download("fake", tmp_path / "data" / "fake" / "deeper", base_url="http://127.0.0.1:9",
                 timeout=5)
    assert (tmp_path / "data" / "fake").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["fake"]


def test_http_error_and_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                mirror: tuple[str, Path]) -> None:
    _register(monkeypatch, path="fake/absent.bin")
    with pytest.raises(DataError, match="HTTP 404"):
        download("fake", tmp_path / "data", base_url=mirror[0], timeout=5)
    _register(monkeypatch)
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(DataError, match=r"sent nothing for 0.3 s \(--timeout 0.3\)"):
            download("fake", tmp_path / "data", base_url=url, timeout=0.3)
    assert _leftovers(tmp_path / "data" / "fake") == []


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server on 127.0.0.1 that accepts every connection and never answers (its URL)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_silent_server_is_named_with_the_timeout_and_the_wait_is_said(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, silent_server: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A server that accepts and never answers kept `data download` silent for 60 s (there
    was no --timeout); now a line names the host it waits for after `WAIT_NOTICE` seconds, and
    it gives up after --timeout seconds in one line naming the host and the timeout."""
    _register(monkeypatch)
    monkeypatch.setattr(download_module, "WAIT_NOTICE", 0.3)
    host = silent_server.removeprefix("http://")
    start = time.monotonic()
    assert main(["data", "download", "fake", "--data-dir", str(tmp_path / "data"),
                 "--base-url", silent_server, "--timeout", "1.5"]) == 2
    took = time.monotonic() - start
    assert 1.5 <= took < 3.5
    err = capsys.readouterr().err
    assert err == (f"clusterfl: waiting for {host}: nothing received for 0.3 s (gives up after "
                   "1.5 s without data, --timeout)\n"
                   f"clusterfl: error: download of {silent_server}/fake/a.bin failed: {host} "
                   "sent nothing for 1.5 s (--timeout 1.5); try again later, a longer "
                   "--timeout, or a mirror (--base-url)\n")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "86401"])
def test_a_timeout_out_of_range_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        value: str) -> None:
    _register(monkeypatch)
    assert main(["data", "download", "fake", "--data-dir", str(tmp_path),
                 "--base-url", "http://127.0.0.1:9", f"--timeout={value}"]) == 2
    assert capsys.readouterr().err == (
        "clusterfl: error: --timeout: must be a number of seconds > 0 and at most 86400 "
        f"(a day), got {value!r}\n")
    with pytest.raises(ConfigError, match=r"^--timeout: must be a number of seconds > 0 and "
                                          r"at most 86400 \(a day\), got 0$"):
        download("fake", tmp_path, base_url="http://127.0.0.1:9", timeout=0)
    assert list(tmp_path.iterdir()) == []


def test_the_partial_file_of_a_killed_download_is_removed_by_the_next_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mirror: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A killed download leaves `.a.bin.*.part`; it stayed for good beside the file the next
    download saved. Now the next download removes it and says so once; a partial file that a
    running download holds (its lock) is left alone."""
    _register(monkeypatch)
    folder = tmp_path / "data" / "fake"
    folder.mkdir(parents=True)
    (folder / ".a.bin.k1ll3d.part").write_bytes(PAYLOAD[:100])
    (folder / ".other.bin.x.part").write_bytes(b"not this file's")
    busy = folder / ".a.bin.busy.part"
    with busy.open("wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert partial_downloads("fake", tmp_path / "data") == [folder / ".a.bin.k1ll3d.part"]
        assert download("fake", tmp_path / "data", base_url=mirror[0], timeout=5) == \
            [folder / "a.bin"]
        assert partial_downloads("fake", tmp_path / "data") == []
    assert capsys.readouterr().err == (
        f"clusterfl: removed 1 partial file(s) of an interrupted download of a.bin in {folder}: "
        ".a.bin.k1ll3d.part\n")
    assert _leftovers(folder) == [".a.bin.busy.part", ".other.bin.x.part", "a.bin"]
    (folder / "a.bin").unlink()  # the lock is let go of: now a leftover too
    download("fake", tmp_path / "data", base_url=mirror[0], timeout=5)
    assert capsys.readouterr().err.endswith(f"in {folder}: .a.bin.busy.part\n")
    assert _leftovers(folder) == [".other.bin.x.part", "a.bin"]


def test_a_full_disk_names_the_file_and_keeps_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mirror: tuple[str, Path]) -> None:
    """A write failing with ENOSPC read "download of URL failed: [Errno 28] No space left on
    device", blaming the server and naming no file."""
    _register(monkeypatch)
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd: int, mode: str) -> None:
            self.fh = real_fdopen(fd, mode)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(download_module.os, "fdopen", Full)
    data = tmp_path / "data"
    with pytest.raises(DataError) as err:
        download("fake", data, base_url=mirror[0], timeout=5)
    assert str(err.value) == (f"cannot write fake/a.bin in {data / 'fake'} (No space left on "
                              "device); nothing of it was kept (free some space, or choose "
                              "another --data-dir)")
    assert not data.exists()


def test_an_interrupted_download_names_the_file_and_keeps_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mirror: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C mid-file said only "clusterfl: interrupted"."""
    _register(monkeypatch)

    def ctrl_c(url: str, done: int, total: int | None) -> None:
        raise KeyboardInterrupt

    real = clusterfl.data.download
    monkeypatch.setattr(clusterfl.data, "download",
                        lambda *a, **k: real(*a, **{**k, "progress": ctrl_c}))
    data = tmp_path / "data"
    assert main(["data", "download", "fake", "--data-dir", str(data),
                 "--base-url", mirror[0]]) == 130
    assert capsys.readouterr().err == (
        "clusterfl: interrupted; download of fake/a.bin stopped; nothing of it was kept (the "
        "files fetched before it are)\n")
    assert not data.exists()


def test_an_unwritable_folder_and_a_wrong_file_are_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mirror: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A folder without write permission said "move it away" (there is nothing to move); a file
    of the catalog's name but not its content was replaced without a word."""
    _register(monkeypatch)
    data = tmp_path / "data"
    (data / "fake").mkdir(parents=True)
    (data / "fake" / "a.bin").write_bytes(b"mine")

    def denied(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    with monkeypatch.context() as m:  # as root, chmod would not stop the write
        m.setattr(download_module.tempfile, "mkstemp", denied)
        with pytest.raises(DataError) as err:
            download("fake", data, base_url=mirror[0], timeout=5)
    assert str(err.value) == (f"cannot save fake/a.bin in {data / 'fake'} (Permission denied); "
                              "choose another --data-dir")
    assert (data / "fake" / "a.bin").read_bytes() == b"mine"
    capsys.readouterr()
    assert download("fake", data, base_url=mirror[0], timeout=5) == [data / "fake" / "a.bin"]
    assert capsys.readouterr().err == (
        f"clusterfl: {data / 'fake' / 'a.bin'}: wrong_size (size 4 bytes, expected "
        f"{len(PAYLOAD)}); fetching the official file to replace it (kept if that fails)\n")
    assert (data / "fake" / "a.bin").read_bytes() == PAYLOAD


def test_verify_statuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _register(monkeypatch)
    target = tmp_path / "fake" / "a.bin"
    assert verify("fake", tmp_path)[0].status == "missing"
    target.parent.mkdir()
    target.write_bytes(PAYLOAD[:-1])
    assert verify("fake", tmp_path)[0].status == "wrong_size"
    target.write_bytes(PAYLOAD[:-1] + b"!")
    status = verify("fake", tmp_path)[0]
    assert status.status == "bad_checksum" and not status.ok
    assert str(status).startswith(f"{target}: bad_checksum (sha256 expected")
    target.write_bytes(PAYLOAD)
    assert verify("fake", tmp_path)[0].ok


def test_registry() -> None:
    assert verify("digits") == [] and download("digits") == []
    assert "digits" not in DATASETS
    assert set(DATASETS) == {"mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "femnist",
                             "ag_news"}
    assert DATASETS["femnist"].files == () and "preprocess.sh" in DATASETS["femnist"].how_to_get
    with pytest.raises(ConfigError, match="allowed"):
        verify("imagenet")
    cifar = DATASETS["cifar10"].files[0]
    assert cifar.md5 == "c58f30108f718f92721af3b95e74349a" and cifar.size == 170498071
    assert cifar.url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert DATASETS["mnist"].files[0].url.startswith("https://ossci-datasets.s3.amazonaws.com/")


@skip_unless("mnist", "fashion_mnist")
def test_registry_matches_shared_checksums_and_files() -> None:
    """The catalog agrees with the data folder's SHA256SUMS (`sha256sum -c` format), when the
    folder has one, and its files verify."""
    shared = require("mnist", "fashion_mnist")
    if not (shared / "SHA256SUMS").is_file():
        pytest.skip(f"no SHA256SUMS in $CLUSTERFL_DATA = {shared}")
    listed = dict(line.split()[::-1] for line in (shared / "SHA256SUMS").read_text().splitlines()
                  if line.strip())
    for name in ("mnist", "fashion_mnist"):
        for f in DATASETS[name].files:
            assert listed[f.path] == f.sha256
            assert (shared / f.path).stat().st_size == f.size
        assert all(s.ok for s in verify(name, shared))
