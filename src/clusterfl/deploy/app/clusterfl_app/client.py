"""The ClientApp of clusterfl: answers each message with the engine on the node's own data.

This module imports only Flower, numpy and the standard library, because Flower 1.41 starts
a new `flwr-clientapp` process for every message (unless the SuperNode was started by our
launcher, whose SuperExec runs the ClientApp in its own long-lived process:
`clusterfl.deploy.superexec`). Two ways to answer:

- **persistent worker** (default in a `flwr-clientapp` process, Flower's own process per
  message, i.e. SuperNodes started with `flower-supernode`):
  forward the message over a Unix socket to the node's long-lived worker
  (`clusterfl.deploy.worker`, started on first use; it keeps torch, the engine and
  the client's data in memory and exits with the SuperNode);
- **in-process** (any long-lived process: our launcher's SuperExec, Flower's Ray simulation
  actors; or node config `worker="none"`): call `clusterfl.deploy.node.handle_raw` directly.

Both run the same `handle_raw`. Message types: `query.describe` (handshake, reply
`ConfigRecord "info"`), and `train.request` / `evaluate.request` / `query.request` (one
protocol request in the generic wire format of `clusterfl.backends.flower.codec`).

Node config keys: `partition-id` and/or `data-file` (the client's data, see
`clusterfl.deploy.clientdata`), `worker` ("auto" | "persistent" | "none"),
`worker-dir` (socket directory; default `$CLUSTERFL_WORKER_DIR` or the temp dir).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()
_IMPORTED = time.time()
_LAST: dict[str, Any] = {}  # the last worker call's own timing (see `_timing`)

HEADER = "__header__"  # same frame format as clusterfl.deploy.worker
WORKER_START_TIMEOUT = 180.0


# ----------------------------------------------------------------------------- frames
def _pack(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    payload: dict[str, Any] = {
        HEADER: np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays}
    np.savez(buf, **payload)
    data = buf.getvalue()
    return struct.pack(">Q", len(data)) + data


def _recv(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        c = conn.recv(min(n - got, 1 << 20))
        if not c:
            raise ConnectionError("the node worker closed the connection")
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)


def _read(conn: socket.socket) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    (n,) = struct.unpack(">Q", _recv(conn, 8))
    with np.load(io.BytesIO(_recv(conn, n)), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(arrays.pop(HEADER).tobytes().decode()), arrays


# ----------------------------------------------------------------------------- worker
def _persistent(node_config: dict[str, Any]) -> bool:
    mode = str(node_config.get("worker", "auto"))
    if mode == "auto":
        return Path(sys.argv[0]).name == "flwr-clientapp"
    return mode == "persistent"


def _socket_path(node_config: dict[str, Any], watch: int) -> Path:
    base = node_config.get("worker-dir") or os.environ.get("CLUSTERFL_WORKER_DIR") or (
        Path(tempfile.gettempdir()) / f"clusterfl-flower-{os.getuid()}")
    d = Path(str(base))
    d.mkdir(parents=True, exist_ok=True)
    key = json.dumps(node_config, sort_keys=True, default=str) + f"|{watch}"
    return d / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".sock")


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        return None
    return s


def _worker_connection(node_config: dict[str, Any]) -> socket.socket:
    watch = os.getppid()  # the SuperNode's SuperExec: the worker ends when it does
    path = _socket_path(node_config, watch)
    conn = _connect(path)
    if conn is not None:
        return conn
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)
        if conn is not None:
            return conn
        log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the child
        subprocess.Popen(
            [sys.executable, "-m", "clusterfl.deploy.worker", "--socket", str(path),
             "--node-config", json.dumps(node_config, default=str), "--watch-pid", str(watch)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while time.monotonic() < deadline:
            conn = _connect(path)
            if conn is not None:
                return conn
            time.sleep(0.1)
    raise RuntimeError(f"the node worker did not start within {WORKER_START_TIMEOUT:g} s; "
                       f"see {path.with_suffix('.log')}")


def _call_worker(kind: str, node_config: dict[str, Any], meta: dict[str, Any],
                 arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with contextlib.closing(_worker_connection(node_config)) as conn:
        conn.sendall(_pack({"kind": kind, "node_config": node_config, "meta": meta}, arrays))
        header, out = _read(conn)
    if not header.get("ok"):
        raise RuntimeError(f"node worker: {header.get('error')}")
    _LAST["worker_handle"] = header.get("handle_seconds")
    return header["meta"], out


# ----------------------------------------------------------------------------- timing
def _process_start() -> float | None:
    """Wall time this process started (Linux /proc), None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + int(stat[19]) / ticks


def _timing(record: dict[str, Any]) -> None:
    """With `CLUSTERFL_TIMING=FILE` set (benchmarks/flower/bench.py sets it), append one JSON
    line per message: process start, the end of this module's imports, the handler's start
    and end, all wall times in seconds."""
    path = os.environ.get("CLUSTERFL_TIMING")
    if not path:
        return
    record.update(process_start=_process_start(), imported=_IMPORTED,
                  pid=os.getpid())
    with contextlib.suppress(OSError), open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------- handlers
def _answer(kind: str, message: Message, context: Context) -> Message:
    start = time.time()
    reply = _reply(kind, message, context)
    _timing({"kind": kind, "handler_start": start, "handler_end": time.time(), **_LAST})
    return reply


def _reply(kind: str, message: Message, context: Context) -> Message:
    node_config = {k: v for k, v in dict(context.node_config).items()}
    content = message.content
    meta = dict(content.config_records["meta"]) if "meta" in content.config_records else {}
    rec = content.array_records.get("arrays")
    arrays = {} if rec is None else {k: a.numpy() for k, a in rec.items()}
    if _persistent(node_config):
        out_meta, out_arrays = _call_worker(kind, node_config, meta, arrays)
    else:
        from clusterfl.deploy.node import handle_raw

        out_meta, out_arrays = handle_raw(kind, node_config, meta, arrays)
    if kind == "describe":
        return Message(RecordDict({"info": ConfigRecord(out_meta)}), reply_to=message)
    records = ArrayRecord()
    for k, a in out_arrays.items():
        records[k] = Array(np.ascontiguousarray(a))
    reply = RecordDict({"arrays": records, "meta": ConfigRecord(out_meta)})
    return Message(reply, reply_to=message)


@app.query("describe")
def describe(message: Message, context: Context) -> Message:
    """Handshake: the node's client id, sizes and shapes (never its data)."""
    return _answer("describe", message, context)


@app.train("request")
@app.evaluate("request")
@app.query("request")
def request(message: Message, context: Context) -> Message:
    """A protocol request, whatever its message type: local training (`train.request`,
    TrainRequest), evaluation (`evaluate.request`) or any other (`query.request`: gradients,
    losses of K models, embeddings, ...); Flower's decorators return the function as is."""
    return _answer("request", message, context)
