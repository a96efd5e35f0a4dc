"""A client's own data on a Flower node, and the on-disk format it is read from.

A SuperNode holds the data of ONE client. It gets it in one of two ways (node config):

- `data-file = "/path/client_0003.npz"`: real deployment; the node reads its own file. The
  format (written by `clusterfl flower export-partitions`, or by anyone with numpy) is an
  uncompressed or compressed `.npz` with

  | key | content |
  |---|---|
  | `x_train`, `x_test` | float32 inputs `[n, *input_shape]` |
  | `y_train`, `y_test` | int64 class ids (classification) or float32 targets |
  | `client_id` | int, the client's global id (seeds its minibatch order) |
  | `n_classes` | int (1 for regression) |
  | `task` | "classification" or "regression" (optional, default classification) |
  | `cluster` | int, the true cluster id (optional; diagnostics only: ARI) |

- `partition-id = 3` only: a simulation-style partition; the node builds the federation of
  the run's `[data]`/`[scenario]`/`seed` recipe (sent by the server in the handshake) and
  keeps client 3 (as Flower's own examples do with `partition-id`).

Per-client randomness of the engines is derived from (request seed, global client id), so
the node executes requests on a *sparse* federation where every client before its own id
is empty: the same backend code as in-process, indexed by the global id, gives the same
numbers as the in-process run.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from clusterfl.data.federation import Federation, assemble_clients
from clusterfl.data.own import npz_int, npz_numbers
from clusterfl.errors import DataError, write_error
from clusterfl.files import write_whole

REQUIRED = ("x_train", "y_train", "x_test", "y_test", "client_id", "n_classes")


def sparse_federation(one: Federation, client_id: int, cluster: int | None = None) -> Federation:
    """`one` (a one-client federation) placed at global index `client_id`."""
    if one.n_clients != 1:
        raise ValueError(f"expected a one-client federation, got {one.n_clients} clients")
    c = int(client_id)

    def offsets(n: int) -> np.ndarray:
        return np.concatenate([np.zeros(c + 1, np.int64), [n]])

    clusters = None
    if cluster is not None:
        clusters = np.full(c + 1, -1, np.int64)
        clusters[c] = cluster
    return Federation(
        one.x_train, one.y_train, offsets(len(one.x_train)), one.x_test, one.y_test,
        offsets(len(one.x_test)), clusters, one.n_classes, one.task, one.name, dict(one.meta),
        x_scale=one.x_scale,
    )


def write_client_file(path: str | Path, federation: Federation, client: int) -> Path:
    """Write client `client` of `federation` in the node data format."""
    x_tr, y_tr = federation.client_train(client)
    x_te, y_te = federation.client_test(client)
    arrays: dict[str, Any] = {
        "x_train": x_tr.numpy(), "y_train": y_tr.numpy(), "x_test": x_te.numpy(),
        "y_test": y_te.numpy(), "client_id": np.int64(client),
        "n_classes": np.int64(federation.n_classes), "task": np.str_(federation.task),
        "name": np.str_(federation.name),
    }
    if federation.clusters is not None:
        arrays["cluster"] = np.int64(federation.clusters[client])
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = io.BytesIO()  # whole or not at all (`files.write_whole`)
    np.savez(data, **arrays)
    write_whole(p, data.getvalue())
    return p


def export_partitions(federation: Federation, out_dir: str | Path) -> list[Path]:
    """One file per client, `out_dir/client_0000.npz` ...; returns the paths."""
    out, paths = Path(out_dir), []
    for c in range(federation.n_clients):
        path = out / f"client_{c:04d}.npz"
        try:
            paths.append(write_client_file(path, federation, c))
        except OSError as exc:
            raise write_error(exc, path, f"client {c} of {federation.n_clients}",
                              f"{c} client files before it are whole; the same command "
                              "writes the export again") from None
    return paths


@functools.lru_cache(maxsize=4)
def read_client_file(path: str, n_clients: int | None = None
                     ) -> tuple[Federation, int, int | None]:
    """`(sparse federation, client id, true cluster or None)` from a node data file.

    `n_clients`: the run's number of clients (the SuperNodes the server found connected),
    when known; a `client_id` at or above it is refused before the sparse federation, whose
    size grows with the id, is built."""
    p = Path(path)
    if p.is_dir():  # the folder of an export, say: name this node's own file in it
        shown = ", ".join(sorted(f.name for f in p.glob("client_*.npz"))[:2])
        raise DataError(f"node config 'data-file' {p} is a folder; give this node's own file "
                        f"in it{f' ({shown}, ...)' if shown else ''}")
    if not p.is_file():
        raise DataError(f"node data file not found: {p} (node config 'data-file')")
    if not zipfile.is_zipfile(p):  # numpy would try it as a pickle, or read one .npy array
        raise DataError(f"{p}: not an .npz file (a zip of named arrays, as numpy.savez and "
                        "`clusterfl flower export-partitions` write; node config 'data-file')")
    try:
        with np.load(p, allow_pickle=False) as z:
            missing = [k for k in REQUIRED if k not in z.files]
            if missing:
                raise DataError(f"{p}: missing arrays {missing}; required: {', '.join(REQUIRED)}")
            d = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{p}: not a readable .npz file ({exc})") from None
    task = str(d.get("task", "classification"))
    if task not in ("classification", "regression"):
        raise DataError(f"{p}: task must be 'classification' or 'regression', got {task!r}")
    cid = npz_int(d, "client_id", p)
    if cid < 0:  # a negative id indexed the sparse federation from its end
        raise DataError(f"{p}: client_id {cid}; client ids are 0..N-1, one node each")
    if n_clients is not None and cid >= n_clients:  # the sparse federation holds cid + 2 rows
        raise DataError(f"{p}: client_id {cid} out of range; this run's client ids are "
                        f"0..{n_clients - 1} (one per SuperNode, {n_clients} connected)")
    cluster = npz_int(d, "cluster", p) if "cluster" in d else None
    arrays = {k: npz_numbers(d, k, p) for k in ("x_train", "y_train", "x_test", "y_test")}
    try:  # the checks of an npz folder's clients: lengths, labels < n_classes, no empty set
        one = assemble_clients(
            {s: [(arrays[f"x_{s}"], arrays[f"y_{s}"])] for s in ("train", "test")},
            None if cluster is None else [cluster], npz_int(d, "n_classes", p),
            task, str(p), {})  # type: ignore[arg-type]  # task: checked above
    except DataError as exc:  # the file is the client: no "client 0" of a federation
        raise DataError(str(exc).replace(f"{p}: client 0 has", f"{p}: the client has")
                        .replace(f"{p}: client 0 ", f"{p}: ")
                        .replace(f"{p}: clients [0] have", f"{p}: the client has")) from None
    one = dataclasses.replace(one, name=str(d.get("name", p.stem)), meta={})
    return sparse_federation(one, cid, cluster), cid, cluster


@functools.lru_cache(maxsize=4)
def _recipe_federation(recipe_json: str) -> Federation:
    from clusterfl.data.scenarios import make_federation

    r = json.loads(recipe_json)
    if r.get("data"):  # data of one's own: built on the node as in the server's process
        from clusterfl.data.own import build

        return build(r["data"], r["scenario"], r["params"], r["seed"],
                     bool(r["data"].get("standardize", False)))
    return make_federation(r["source"], r["scenario"], r["params"], seed=r["seed"],
                           data_dir=r.get("data_dir"), verify=r.get("verify", True))


def simulated_client(recipe: dict[str, Any], client_id: int) -> tuple[Federation, int | None]:
    """Client `client_id` of the federation built from `recipe` (source, scenario, params,
    seed, data_dir), as a sparse federation, and its true cluster (None if unknown)."""
    fed = _recipe_federation(json.dumps(recipe, sort_keys=True))
    if not 0 <= client_id < fed.n_clients:
        raise DataError(f"partition-id {client_id} out of range: the scenario has "
                        f"{fed.n_clients} clients (0..{fed.n_clients - 1})")
    cluster = None if fed.clusters is None else int(fed.clusters[client_id])
    return sparse_federation(fed.subset([client_id]), client_id, cluster), cluster


def describe(fed: Federation, client_id: int, cluster: int | None) -> dict[str, Any]:
    """What a node tells the server at the handshake (no data, only shapes and sizes)."""
    return {
        "client_id": int(client_id), "train_size": int(fed.train_sizes[client_id]),
        "test_size": int(fed.test_sizes[client_id]),
        "input_shape": json.dumps(list(fed.input_shape)), "n_classes": int(fed.n_classes),
        "task": fed.task, "cluster": -1 if cluster is None else int(cluster),
        "name": fed.name,
    }
