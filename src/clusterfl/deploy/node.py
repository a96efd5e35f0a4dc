"""What a Flower node does with a message, without Flower types (testable in-process).

The ClientApp (`client_app.py`) unpacks a Flower message into `(kind, payload, setup)`
and calls `handle`; everything here is plain Python so the same code runs in a SuperNode's
ClientApp process, in a Ray simulation actor, and in unit tests.

`setup` (sent by the server with every message, a few hundred bytes of JSON) holds the
data recipe for simulation-style partitions (`source`, `scenario`, `params`, `seed`,
`data_dir`), the `[model]` table and the client engine. Sending it every time keeps the
node stateless: Flower starts a fresh ClientApp process per message in deployment, and a
node that restarts mid-run simply continues.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from clusterfl.backends.base import Backend
from clusterfl.data.federation import Federation
from clusterfl.deploy.clientdata import describe, read_client_file, simulated_client
from clusterfl.errors import ConfigError
from clusterfl.protocol import RE, Asks


def node_data(node_config: dict[str, Any], setup: dict[str, Any]) -> tuple[Federation, int,
                                                                          int | None]:
    """`(sparse federation, global client id, true cluster)` of this node.

    `data-file` in the node config wins (real deployment); otherwise `partition-id` picks a
    client of the federation described by `setup["recipe"]`. `setup["clients"]`, when the
    server sent it, is the run's number of clients: a data file's `client_id` must be below.
    """
    path = node_config.get("data-file")
    if path:
        bound = setup.get("clients")
        fed, cid, cluster = read_client_file(str(path), None if bound is None else int(bound))
        if "partition-id" in node_config and int(node_config["partition-id"]) != cid:
            raise ConfigError("node-config.partition-id",
                              f"{node_config['partition-id']} disagrees with client_id {cid} "
                              f"stored in {path}")
        return fed, cid, cluster
    if "partition-id" not in node_config:
        raise ConfigError("node-config", "set data-file=\"/path/client.npz\" (real data) or "
                                         "partition-id=N (simulation-style partition)")
    recipe = setup.get("recipe")
    if not recipe:
        raise ConfigError("node-config.data-file",
                          "the server sent no data recipe; this node needs its own data-file")
    cid = int(node_config["partition-id"])
    fed, cluster = simulated_client(recipe, cid)
    return fed, cid, cluster


@functools.lru_cache(maxsize=64)
def _backend(node_key: str, setup_json: str) -> tuple[Backend, int, int | None]:
    from clusterfl.backends.sequential import SequentialBackend
    from clusterfl.backends.simulation import SimulationBackend
    from clusterfl.models import ModelFactory, model_config

    node_config = json.loads(node_key)
    setup = json.loads(setup_json)
    fed, cid, cluster = node_data(node_config, setup)
    factory = ModelFactory(model_config(setup["model"]), fed.input_shape, fed.n_outputs)
    engine = setup.get("engine", "simulation")
    backend: Backend = (SequentialBackend(fed, factory) if engine == "sequential"
                        else SimulationBackend(fed, factory))
    return backend, cid, cluster


def node_backend(node_config: dict[str, Any], setup: dict[str, Any]) -> tuple[Backend, int,
                                                                              int | None]:
    """The backend over this node's data (cached per node and setup within a process)."""
    key = json.dumps({k: node_config[k] for k in ("data-file", "partition-id")
                      if k in node_config}, sort_keys=True, default=str)
    return _backend(key, json.dumps(setup, sort_keys=True))


def handle_describe(node_config: dict[str, Any], setup: dict[str, Any]) -> dict[str, Any]:
    """The handshake: this node's client id, sizes and shapes (never its data)."""
    backend, cid, cluster = node_backend(node_config, setup)
    return describe(backend.federation, cid, cluster)


def handle_request(node_config: dict[str, Any], setup: dict[str, Any],
                   request: Asks[RE]) -> RE:
    """Execute a one-client protocol request on this node's data; returns the reply."""
    backend, cid, _ = node_backend(node_config, setup)
    clients = [int(c) for c in request.clients]
    if clients != [cid]:
        raise ConfigError("partition-id", f"this node holds client {cid}, the request was "
                                          f"addressed to clients {clients}")
    return backend.execute(request)


def handle_raw(kind: str, node_config: dict[str, Any], meta: dict[str, Any],
               arrays: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A message in wire form (`meta` config values, numpy `arrays`) → the reply in wire form.

    `kind` is "describe" (handshake; the reply's meta is the node's info) or "request".
    Used in-process by the ClientApp and, for SuperNodes, by the persistent node worker.
    """
    from clusterfl.backends.flower import codec

    setup = json.loads(str(meta.get("setup", "{}")))
    if kind == "describe":
        return handle_describe(node_config, setup), {}
    request = codec.wire_request(meta, arrays)
    reply = handle_request(node_config, setup, request)
    return codec.wire_reply(reply)
