"""Two runs that need the same cached FLT encoder at once pretrain it once.

The bug: each run saw no cached file and pretrained the encoder itself (minutes each), both
writing the same file. Now the first holds `<entry>.lock` (an flock, with its process id)
while it pretrains; the other says on the console that it waits and for which process, then
loads the file. A lock file left by a dead process is taken over. Tiny made-up
Fashion-MNIST (test_flt_data_dir).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.algorithms.test_flt_data_dir import CACHED, env, write_idx  # noqa: F401

from clusterfl import encoders

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def resolve(root: Path) -> encoders.EncoderFile:
    return encoders.resolve("fashion_mnist", (1, 28, 28), 8, 1, 0,
                            encoder_dir=root / "enc", data_dir=root / "data", verify=False)


def test_two_runs_at_once_pretrain_once_and_share_the_file(
        env: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    write_idx(env / "data", "fashion_mnist")
    monkeypatch.setattr(encoders, "LOCK_POLL_S", 0.02)
    real_pretrain = encoders.pretrain
    calls: list[int] = []
    waiting = threading.Event()
    real_wait = encoders._wait

    def wait() -> None:  # only a run waiting for the lock calls it
        waiting.set()
        real_wait()

    def pretrain(*a: object, **k: object) -> encoders.EncoderFile:
        calls.append(1)
        assert waiting.wait(20), "the second run never waited for the lock"
        return real_pretrain(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(encoders, "_wait", wait)
    monkeypatch.setattr(encoders, "pretrain", pretrain)
    got: list[encoders.EncoderFile] = []
    runs = [threading.Thread(target=lambda: got.append(resolve(env))) for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    assert len(got) == 2 and len(calls) == 1
    assert got[0].sha256 == got[1].sha256 == encoders.load(env / "enc" / CACHED).sha256
    assert not encoders.lock_path(env / "enc" / CACHED).exists()
    assert sorted(p.name for p in (env / "enc").iterdir()) == [CACHED]  # no temp file left
    err = capsys.readouterr().err
    assert err.count("encoder cache: waiting for process") == 1, err
    assert f"waiting for process {os.getpid()}, this one (" in err
    assert f"which is pretraining {CACHED}" in err


def test_a_stale_lock_of_a_dead_process_is_taken_over(
        env: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    write_idx(env / "data", "fashion_mnist")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock = encoders.lock_path(env / "enc" / CACHED)
    lock.parent.mkdir()
    lock.write_text(str(gone.pid))
    calls: list[int] = []
    real_pretrain = encoders.pretrain

    def pretrain(*a: object, **k: object) -> encoders.EncoderFile:
        calls.append(1)
        return real_pretrain(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(encoders, "pretrain", pretrain)
    enc = resolve(env)
    assert calls == [1] and not lock.exists()
    assert enc.sha256 == encoders.load(env / "enc" / CACHED).sha256
    assert "waiting for" not in capsys.readouterr().err  # nobody holds a dead process's lock


def test_encoder_train_into_the_cache_waits_for_a_run_pretraining_it(
        env: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """`clusterfl encoder train` without --out writes the cache a run reads: while another
    process (here a Python that holds the flock) holds the lock, it waits, then uses that
    process's file."""
    from clusterfl.cli import main

    write_idx(env / "data", "fashion_mnist")
    monkeypatch.setattr(encoders, "LOCK_POLL_S", 0.02)
    theirs = resolve(env)  # what the other process writes when it is done
    cached = env / "data" / "encoders" / CACHED
    lock = encoders.lock_path(cached)
    lock.parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, str(os.getpid()).encode())\n"
         "print('held', flush=True)\n"
         "time.sleep(30)\n", str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"

    def finish() -> None:
        encoders.save(theirs, cached)
        lock.unlink()
        holder.kill()

    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pytest.fail("pretrained"))
    timer = threading.Timer(0.3, finish)
    timer.start()
    try:
        assert main(["--data-dir", str(env / "data"), "encoder", "train", "--source",
                     "fashion_mnist", "--epochs", "1", "--latent", "8", "--quiet"]) == 0
    finally:
        timer.join()
        holder.wait()
    captured = capsys.readouterr()
    assert f"waiting for process {holder.pid}, which is pretraining {CACHED}" in captured.err
    assert "was pretrained meanwhile by another process" in captured.out
    assert theirs.sha256 in captured.out
