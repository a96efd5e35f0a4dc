"""The persistent node worker: one long-lived process per SuperNode holding torch and the data.

Flower 1.41 runs a fresh `flwr-clientapp` process for every message a SuperNode receives.
Importing torch and clusterfl and loading the client's data costs about 4 s of CPU per
process here, which would dominate every round. So the ClientApp of our Flower App
(`app/clusterfl_app/client.py`, which imports only Flower and numpy) forwards each message
over a Unix socket to this worker, started on first use, which keeps the engine and data in
memory and answers with `node.handle_raw` — exactly what the in-process ClientApp calls.
(SuperNodes started by our launcher need no worker: their SuperExec answers ClientApp tasks
in its own long-lived process, `clusterfl.deploy.superexec`.)

Lifetime: the worker exits when the process it watches (the SuperNode's SuperExec, the
ClientApp's parent) is gone, after `--idle-timeout` seconds without a message, or on
SIGTERM. It removes its socket on exit.

Wire format of one frame (both directions): 8-byte big-endian length, then an `.npz` archive
whose array `__header__` is UTF-8 JSON (`{"kind", "node_config", "meta"}` in, `{"ok",
"meta", "error", "handle_seconds"}` out: the last is the time `handle_raw` took, decode,
compute and encode) and whose other arrays are the message's arrays.

    python -m clusterfl.deploy.worker --socket PATH --node-config JSON \
        [--watch-pid PID] [--idle-timeout SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HEADER = "__header__"


def pack(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """One frame: length prefix + npz(header JSON, arrays)."""
    buf = io.BytesIO()
    blob = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    payload: dict[str, Any] = {HEADER: blob, **arrays}
    np.savez(buf, **payload)
    data = buf.getvalue()
    return struct.pack(">Q", len(data)) + data


def read_frame(conn: socket.socket) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read one frame from a connected socket."""
    (n,) = struct.unpack(">Q", _recv(conn, 8))
    with np.load(io.BytesIO(_recv(conn, n)), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays.pop(HEADER).tobytes().decode())
    return header, arrays


def _recv(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        c = conn.recv(min(n - got, 1 << 20))
        if not c:
            raise ConnectionError("peer closed the connection mid-frame")
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(path: Path, node_config: dict[str, Any], watch_pid: int | None,
          idle_timeout: float) -> None:
    """Answer frames on the Unix socket `path` until the watched process is gone or idle."""
    from clusterfl.deploy.node import handle_raw

    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    srv.settimeout(0.5)
    last = time.monotonic()
    try:
        while True:
            if watch_pid is not None and not _alive(watch_pid):
                return
            if time.monotonic() - last > idle_timeout:
                return
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                header, arrays = read_frame(conn)
                try:
                    t0 = time.perf_counter()
                    meta, out = handle_raw(header["kind"], header["node_config"],
                                           header["meta"], arrays)
                    reply = pack({"ok": True, "meta": meta,
                                  "handle_seconds": time.perf_counter() - t0}, out)
                except Exception as exc:  # the node answers with an error, never dies
                    msg = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                    reply = pack({"ok": False, "error": msg}, {})
                with contextlib.suppress(OSError):
                    conn.sendall(reply)
            last = time.monotonic()
    finally:
        srv.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (started by the ClientApp, not by hand)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--socket", required=True)
    p.add_argument("--node-config", required=True, help="the SuperNode's node config, JSON")
    p.add_argument("--watch-pid", type=int)
    p.add_argument("--idle-timeout", type=float, default=3600.0)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(Path(a.socket), json.loads(a.node_config), a.watch_pid, a.idle_timeout)


if __name__ == "__main__":
    main()
