"""Our launcher's changes to Flower 1.41's SuperNode and SuperExec (issue 26): what they
change, and that they refuse clearly when Flower's code is not what they were written for."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

import pytest

from clusterfl.deploy import superexec, supernode


@pytest.fixture
def flower_loop(monkeypatch):
    """Flower's SuperNode module, restored after the test."""
    module = importlib.import_module("flwr.supernode.start_client_internal")
    monkeypatch.setattr(module, "time", module.time)
    monkeypatch.setattr(module, "subprocess", module.subprocess)
    return module


def test_the_supernode_polls_fast_and_starts_our_superexec(flower_loop, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    proxy = supernode.patch(idle=0.2, reply=0.02, warm=True)
    assert flower_loop.time is proxy
    flower_loop.time.sleep(3)  # Flower's idle poll
    flower_loop.time.sleep(0.5)  # Flower's wait for a reply
    flower_loop.time.sleep(7)  # anything else passes through
    assert slept == [0.2, 0.02, 7]
    assert flower_loop.time.monotonic is time.monotonic
    started: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, *a, **k: started.append(args))
    flower_loop.subprocess.Popen(["flower-superexec", "--insecure", "--parent-pid", "1"])
    flower_loop.subprocess.Popen(["something-else"])
    assert started == [[sys.executable, "-m", "clusterfl.deploy.superexec", "--insecure",
                        "--parent-pid", "1"], ["something-else"]]


def test_the_patches_refuse_another_flower(flower_loop, tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match=r"written for Flower 1\.41\.x, found 1\.42\.0"):
        supernode.patch(version="1.42.0")
    fake = tmp_path / "changed_loop.py"
    fake.write_text("import time\n\ndef loop():\n    time.sleep(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("changed_loop")
    with pytest.raises(RuntimeError, match=r"no longer calls time.sleep\(3\)"):
        supernode.patch(module)
    assert module.time is time  # nothing half-patched


def test_object_pulls_retry_fast(monkeypatch):
    utils = importlib.import_module("flwr.supercore.inflatable.inflatable_utils")
    for fn in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))
        assert fn.__kwdefaults__["initial_backoff"] == 1  # Flower's own
    supernode.fast_object_pulls(0.02, 0.5)
    for fn in (utils.pull_objects, utils.pull_and_inflate_object_from_tree):
        assert (fn.__kwdefaults__["initial_backoff"], fn.__kwdefaults__["backoff_cap"]) == (
            0.02, 0.5)


def test_the_superexec_keeps_clientapp_tasks_in_process(monkeypatch):
    executor = importlib.import_module(
        "flwr.supercore.superexec.executor.subprocess_executor").SubprocessExecutor
    types = importlib.import_module("flwr.supercore.superexec.executor.types")
    task_type = importlib.import_module("flwr.supercore.constant").TaskType
    monkeypatch.setattr(executor, "launch", executor.launch)
    spawned: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, *a, **k: spawned.append(args))
    warm = superexec.patch()
    queued: list = []

    class Queue:  # the task is queued for the warm thread, not run here
        def put(self, item) -> None:
            queued.append(item)

    monkeypatch.setattr(warm, "tasks", Queue())

    def spec(kind):
        return types.ExecutionSpec(kind, "127.0.0.1:1", "token", True, None, False, None,
                                   True, 1)

    assert executor().launch(spec(task_type.CLIENT_APP)).status == "accepted"
    assert spawned == [] and len(queued) == 1  # no flwr-clientapp process
    executor().launch(spec(task_type.SERVER_APP))
    assert spawned and spawned[0][0] == "flwr-serverapp"  # other tasks: Flower's way
