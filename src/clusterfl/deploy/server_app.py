"""The Flower ServerApp: runs our `Experiment` against the Grid (docs/deploy.md).

`@app.main()` is written against the Grid, not Flower's FedAvg-shaped strategy loop: a
clustered method sends different models to different clients, so every protocol request
becomes one message per selected client (`FlowerBackend`). Steps of `run_on_grid`:

1. Wait until `backend.wait_nodes` SuperNodes are connected (default: `scenario.n_clients`).
2. Handshake (`query.describe`): each node answers its global client id, train/test sizes,
   input shape, classes, task and — when its data knows it — its true cluster (diagnostics
   only: ARI). Client ids must be exactly 0..N-1, each on one node.
3. Build the server's view of the federation from the answers: sizes and shapes only, data
   tensors are zero-stride views of a single zero sample (`server_federation`), so the
   server holds no client data.
4. Run the Experiment with `backend.name = "flower"`; write `flower.json` (node map,
   dropouts, message count and time) and `flower_final_state.pt` (the algorithm's final
   state: models and assignment) beside the run's other files.

Run config keys (`flwr run ... --run-config '...'`, defaults in the app's pyproject.toml):
`config` (path of the clusterfl TOML on the server machine), `overrides` (";"-separated
`key=value`, like `clusterfl run --set`), `out-dir` (run directory on the server machine;
"" = none), `resume` (continue from the checkpoint in `out-dir`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from clusterfl.backends.flower import FLOWER_VERSION, write_flower_json
from clusterfl.backends.flower.backend import FlowerConfig, FlowerSession, active_session
from clusterfl.config import Config, apply_overrides, load_config, read_toml
from clusterfl.data.federation import Federation
from clusterfl.data.sources import SOURCE_NAMES
from clusterfl.errors import ClusterFLError

app = ServerApp()

FINAL_STATE = "flower_final_state.pt"
"""The algorithm's final `state_dict()` (models, assignment), written beside summary.json."""


def flower_settings(config: Config) -> FlowerConfig:
    """The `[backend]` table of a Flower run (the ServerApp sets `backend.name = "flower"`)."""
    if not isinstance(config.backend, FlowerConfig):
        raise ClusterFLError(f"backend.name is {config.backend.name!r}; a Flower ServerApp "
                             "runs backend 'flower'")
    return config.backend


def setup_of(config: Config) -> dict[str, Any]:
    """What every message tells a node besides the request (see `node.py`)."""
    return {
        "recipe": {
            "source": config.data.source, "scenario": config.scenario_name,
            "params": config.scenario.model_dump(), "seed": config.run.seed,
            "data_dir": config.data.data_dir,
            **({"verify": False} if config.data.verify is False else {}),
            # data of one's own (npz, huggingface, a loader function): its whole [data] table
            **({"data": config.to_dict()["data"]} if config.data.source not in SOURCE_NAMES
               else {}),
        },
        "model": config.model.model_dump(),
        "engine": flower_settings(config).client_engine,
    }


def nodes_wanted(config: Config) -> tuple[int, int]:
    """`(SuperNodes to wait for, scenario.n_clients or 0)`: `backend.wait_nodes`, by default
    the scenario's number of clients."""
    n_clients = int(config.scenario.model_dump().get("n_clients") or 0)
    want = flower_settings(config).wait_nodes or n_clients
    if want < 1:
        raise ClusterFLError("set backend.wait_nodes: the scenario does not say how many "
                             "clients to wait for")
    return want, n_clients


def wait_for_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    """Node ids once at least `n` SuperNodes are connected (ClusterFLError after timeout)."""
    t0 = time.monotonic()
    while True:
        nodes = sorted(int(x) for x in grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() - t0 > timeout:
            raise ClusterFLError(f"only {len(nodes)} of {n} SuperNodes connected after "
                                 f"{timeout:g} s (backend.wait_nodes / backend.wait_timeout)")
        time.sleep(0.5)


def handshake(grid: Grid, nodes: list[int], setup: dict[str, Any], timeout: float,
              want: int = 1) -> dict[int, tuple[int, dict[str, Any]]]:
    """Ask every node who it is; returns client id → (node id, info).

    Fewer than `want` nodes with an answer (the others answered with an error or not at all:
    a missing or unreadable data file, a partition-id out of range) is an error naming each
    failure; with enough answers the failures are a warning. Nodes whose data disagree on
    the input shape, the number of classes or the task are refused (named)."""
    content = RecordDict({"meta": ConfigRecord({"setup": json.dumps(setup, sort_keys=True)})})
    msgs = [Message(content, n, "query.describe", group_id="handshake") for n in nodes]
    out: dict[int, tuple[int, dict[str, Any]]] = {}
    errors, replied = [], set()
    for msg in grid.send_and_receive(msgs, timeout=timeout):
        node = int(msg.metadata.src_node_id)
        replied.add(node)
        if msg.has_error():
            errors.append(f"node {node}: {msg.error.reason}")
            continue
        info = dict(msg.content.config_records["info"])
        cid = _client_id(info.get("client_id"))
        if cid is None:
            errors.append(f"node {node}: client_id {info.get('client_id')!r} is not a whole "
                          "number")
            continue
        if cid in out:
            raise ClusterFLError(f"nodes {out[cid][0]} and {node} both hold client {cid}; "
                                 "give every SuperNode its own partition-id / data-file")
        out[cid] = (node, info)
    errors += [f"node {n}: no reply within {timeout:g} s" for n in nodes if n not in replied]
    if len(out) < max(want, 1):
        raise ClusterFLError(f"{len(out)} of {len(nodes)} SuperNodes described their data in "
                             f"the handshake, the run needs {max(want, 1)} (backend.wait_nodes or "
                             f"scenario.n_clients): " + "; ".join(errors))
    missing = sorted(set(range(len(out))) - set(out))  # not range(max + 1): max may be 10**12
    if missing:
        raise ClusterFLError(f"client ids must be 0..N-1 with one node each; no node holds "
                             f"{missing} (answers: {sorted(out)}; errors: {errors})")
    _check_alike(out)
    if errors:
        print(f"clusterfl: warning: {len(errors)} SuperNode(s) left out of the run (the "
              f"handshake failed): " + "; ".join(errors), flush=True)
    return out


def _client_id(value: Any) -> int | None:
    """A handshake's `client_id` as an int (None: not a whole number)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def _check_alike(found: dict[int, tuple[int, dict[str, Any]]]) -> None:
    """Every node's data has client 0's task, input shape and number of classes."""
    node0, first = found[0]
    for key in ("task", "input_shape", "n_classes"):
        odd = {c: info[key] for c, (_, info) in sorted(found.items())
               if str(info[key]) != str(first[key])}
        if odd:
            shown = ", ".join(f"client {c} (node {found[c][0]}): {v}" for c, v in odd.items())
            raise ClusterFLError(f"the nodes' data disagree on {key}: client 0 (node {node0}) "
                                 f"has {first[key]}, {shown}; every node's data must be a "
                                 "client of one federation")


def server_federation(infos: dict[int, dict[str, Any]]) -> Federation:
    """Sizes, shapes and (when all nodes know them) true clusters — no client data."""
    n = len(infos)
    rows = [infos[c] for c in range(n)]
    shape = tuple(json.loads(str(rows[0]["input_shape"])))
    task = str(rows[0]["task"])
    tr = np.concatenate([[0], np.cumsum([int(r["train_size"]) for r in rows])])
    te = np.concatenate([[0], np.cumsum([int(r["test_size"]) for r in rows])])
    clusters = np.array([int(r["cluster"]) for r in rows])
    ydt = torch.int64 if task == "classification" else torch.float32

    def blank(m: int) -> tuple[torch.Tensor, torch.Tensor]:  # zero-stride: no memory
        return torch.zeros(1, *shape).expand(m, *shape), torch.zeros(1, dtype=ydt).expand(m)

    return Federation(
        *blank(int(tr[-1])), tr, *blank(int(te[-1])), te,
        clusters if (clusters >= 0).all() else None, int(rows[0]["n_classes"]),
        task, f"flower:{rows[0].get('name', '')}",  # type: ignore[arg-type]  # task: a str from the handshake, checked by the node
    )


def run_on_grid(grid: Grid, raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
                out_dir: str | Path | None = None, resume: bool = False) -> Any:
    """Run the experiment of config `raw` (+ overrides) on the Grid; returns its History.

    `resume` continues from the checkpoint in `out_dir` (as `clusterfl run --resume`).
    """
    from clusterfl.experiment import Experiment

    raw = apply_overrides(raw, list(overrides))
    raw.setdefault("backend", {})["name"] = "flower"
    config = load_config(raw)
    b = flower_settings(config)
    want, n_clients = nodes_wanted(config)
    setup = setup_of(config)
    nodes = wait_for_nodes(grid, want, b.wait_timeout)
    setup["clients"] = len(nodes)  # a node's client_id is below it (node_data)
    found = handshake(grid, nodes, setup, max(b.timeout, b.wait_timeout),  # workers start
                      want)
    if n_clients and len(found) != n_clients:
        print(f"clusterfl: warning: the run has {len(found)} clients (one per SuperNode with "
              f"data), not scenario.n_clients = {n_clients}", flush=True)
    infos = {c: info for c, (_, info) in found.items()}
    session = FlowerSession(grid, {c: n for c, (n, _) in found.items()}, setup, b.timeout,
                            infos)
    exp = Experiment(config, out_dir, federation=server_federation(infos))
    with active_session(session):
        history = exp.run(resume=resume, progress=False)
    if out_dir is not None and session.backends:
        be = session.backends[-1]
        report = {"flower": FLOWER_VERSION,
                  "nodes": {str(c): n for c, n in session.node_of_client.items()},
                  "dropouts": be.dropouts, "messages": be.n_messages,
                  "message_seconds": be.seconds}
        write_flower_json(Path(out_dir), report)
        torch.save(exp.algorithm.state_dict(), Path(out_dir) / FINAL_STATE)
    return history


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under `flwr run`: read the run config, run the experiment."""
    rc = context.run_config
    path = str(rc.get("config", ""))
    if not path:
        raise ClusterFLError("run config 'config' (path of a clusterfl TOML) is empty")
    overrides = [s for s in str(rc.get("overrides", "")).split(";") if s.strip()]
    out = str(rc.get("out-dir", "")) or None
    try:  # replies' objects are pulled without Flower's 1 s first backoff (issue 26)
        from clusterfl.deploy.supernode import fast_object_pulls

        fast_object_pulls()
    except RuntimeError as exc:
        print(f"clusterfl: warning: {exc}; replies are pulled with Flower's own backoff",
              flush=True)
    run_on_grid(grid, read_toml(path), overrides, out, resume=bool(rc.get("resume", False)))
