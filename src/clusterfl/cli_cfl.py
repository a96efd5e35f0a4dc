"""`clusterfl cfl-place`: put new clients into the clusters of a finished CFL run (Algorithm 4).

    clusterfl cfl-place RUN_DIR [--clients 20-23,30] [--set KEY=VALUE ...] [--json out.json]

The run's parameter tree is read from `RUN_DIR/cfl_tree.pt` (written by `CFL.save_artifacts`)
or, failing that, from the algorithm state of `RUN_DIR/checkpoint/state.pt` (the tree as of the
last checkpoint). The clients to place come from the federation of the run's `config.toml`,
optionally changed with `--set` (e.g. `--set seed=7` for fresh data from the same recipe when
the scenario's cluster definitions do not depend on the seed, or `--set
scenario.n_clients=24 --clients 20-23`). Each client walks down the tree: at every inner node
it trains from that node's model and follows the child whose cached pre-split updates are most
similar to its own update. The table shows the leaf, the path, the similarities, and the test
accuracy of the leaf model and of the root (FL) model on the client's own test data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterfl.errors import ClusterFLError

if TYPE_CHECKING:  # numpy and torch are imported when the command runs (fast --help)
    import numpy as np


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `cfl-place` subcommand on an argparse subparsers object."""
    p = subparsers.add_parser(
        "cfl-place", help="place new clients into a CFL run's clusters (CFL Algorithm 4)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("run_dir", help="directory of a finished CFL run")
    p.add_argument("--clients", help="client ids of the federation, e.g. '0,3,8-11' "
                                     "(default: all clients)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override the run's config for the federation the clients come from")
    p.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
    p.add_argument("--json", metavar="FILE", help="also write the placements as JSON")
    p.set_defaults(func=cmd_place)
    return p


def parse_clients(spec: str | None, n_clients: int) -> np.ndarray:
    """'0,3,8-11' → [0, 3, 8, 9, 10, 11]; None → all clients. Raises ClusterFLError."""
    import numpy as np

    if spec is None:
        return np.arange(n_clients)
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ClusterFLError(f"--clients: cannot read {part!r}; use e.g. 0,3,8-11") from None
    bad = [c for c in out if not 0 <= c < n_clients]
    if bad or not out:
        raise ClusterFLError(f"--clients: ids must be in 0..{n_clients - 1} (got {spec!r})")
    return np.array(sorted(set(out)), dtype=np.int64)


def run_method(run_dir: Path) -> str | None:
    """The method of a run (`[algorithm] name` of its config.toml, else its summary.json)."""
    import tomllib

    config = run_dir / "config.toml"
    if config.is_file():
        try:
            table = tomllib.loads(config.read_text(encoding="utf-8")).get("algorithm")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            table = None
        if isinstance(table, dict) and isinstance(table.get("name"), str):
            return str(table["name"])
    from clusterfl.records import RunDirError, read_summary

    try:
        return read_summary(run_dir).algorithm
    except RunDirError:
        return None


def check_cfl_run(run_dir: Path) -> None:
    """A one-line error unless `run_dir` is a run directory of a CFL run."""
    if not run_dir.is_dir():
        raise ClusterFLError(f"{run_dir}: no such run directory")
    method = run_method(run_dir)
    if method is not None and method != "cfl":
        from clusterfl.algorithms import ALGORITHMS

        cls = ALGORITHMS.get(method)
        shown = f"{cls.Config.display} (`{method}`)" if cls else f"`{method}`"
        raise ClusterFLError(
            f"{run_dir} is a run of {shown}; cfl-place places new clients with the parameter "
            "tree that only CFL builds, so placement is for CFL runs only (for now)")


def load_cfl_state(run_dir: Path) -> tuple[dict[str, Any], str]:
    """The CFL algorithm state of a run and where it came from."""
    import torch

    from clusterfl.algorithms.cfl import TREE_FILE

    tree = run_dir / TREE_FILE
    if tree.is_file():
        saved = torch.load(tree, weights_only=False)
        return saved["algorithm"], f"{tree} (round {saved.get('round')})"
    ckpt = run_dir / "checkpoint" / "state.pt"
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        if "tree" not in saved.get("algorithm", {}):
            raise ClusterFLError(f"{ckpt} is not the checkpoint of a CFL run")
        return saved["algorithm"], f"{ckpt} (round {saved.get('round')}, last checkpoint)"
    raise ClusterFLError(f"{run_dir}: no {TREE_FILE} and no checkpoint/state.pt; "
                         "save the tree with CFL.save_artifacts or run with checkpoint_every")


def cmd_place(args: argparse.Namespace) -> int:
    """Run Algorithm 4 for the requested clients and print (and optionally save) the result."""
    from rich.console import Console

    run_dir = Path(args.run_dir)
    check_cfl_run(run_dir)
    state, origin = load_cfl_state(run_dir)
    rows = place_clients(run_dir, state, args.clients, list(args.set or []), args.data_dir)
    con = Console(highlight=False)
    con.print(f"parameter tree from {origin}")
    con.print(placement_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
        con.print(f"placements written to {args.json}")
    return 0


def place_clients(run_dir: Path, state: dict[str, Any], clients: str | None,
                  overrides: list[str], data_dir: str | None = None) -> list[dict[str, Any]]:
    """Place clients of the (possibly overridden) run federation; one dict per client."""
    import numpy as np
    import torch

    from clusterfl.algorithms.base import Context
    from clusterfl.algorithms.cfl import CFL, CFLConfig
    from clusterfl.config import apply_overrides, load_config, read_toml
    from clusterfl.experiment import build_backend, build_federation
    from clusterfl.models import ModelFactory
    from clusterfl.protocol import EvaluateRequest, Predictor

    if data_dir:
        overrides = [*overrides, f"data.data_dir={json.dumps(data_dir)}"]
    config = load_config(apply_overrides(read_toml(run_dir / "config.toml"), overrides))
    if config.algorithm.name != "cfl":
        raise ClusterFLError(f"{run_dir} is a run of {config.algorithm.name!r}, not cfl")
    fed = build_federation(config)
    factory = ModelFactory(config.model, fed.input_shape, fed.n_outputs)
    assert isinstance(config.algorithm, CFLConfig)  # checked by name above
    alg = CFL(config.algorithm)
    try:
        alg.load_state_dict(state)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterFLError(f"{run_dir}: its CFL state does not fit this clusterfl ({exc}); "
                             "it was probably written by an older version: rerun the CFL "
                             "run") from None
    if alg.clients.base.numel() != factory.size:
        raise ClusterFLError("the model of the overridden config does not match the run's")
    backend = build_backend(config, fed, factory)
    ctx = Context(backend, factory, config.train.local_training(), fed.n_clients,
                  fed.train_sizes, np.random.default_rng([config.run.seed, 4099]),
                  config.run.seed, true_clusters=fed.clusters)
    ids = parse_clients(clients, fed.n_clients)
    try:
        placed = alg.walk(ctx, ids)
        leaf = np.array([p.leaf for p in placed])
        nodes = np.unique(np.concatenate([[0], leaf]))
        models = torch.stack([alg.model_of(int(v)) for v in nodes])
        row = {int(v): k for k, v in enumerate(nodes)}
        acc_leaf = backend.execute(EvaluateRequest(
            ids, Predictor.single(models, np.array([row[int(v)] for v in leaf])))).accuracy
        acc_root = backend.execute(EvaluateRequest(
            ids, Predictor.single(models, np.zeros(len(ids), np.int64)))).accuracy
    finally:
        backend.close()
    members = _leaf_truth(run_dir, alg)
    return [{
        "client": p.client, "leaf": p.leaf, "path": p.path,
        "similarities": [list(s) for s in p.similarities],
        "true_cluster": None if fed.clusters is None else int(fed.clusters[p.client]),
        "leaf_true_clusters": members.get(p.leaf),
        "accuracy_leaf": _num(acc_leaf[k]), "accuracy_root": _num(acc_root[k]),
    } for k, p in enumerate(placed)]


def _num(x: float) -> float | None:
    return None if x != x else float(x)  # NaN


def _leaf_truth(run_dir: Path, alg: Any) -> dict[int, list[int]]:
    """True clusters of each leaf's training clients, from the run's summary (if known)."""
    import numpy as np

    from clusterfl.records import RunDirError, read_summary

    try:
        truth = read_summary(run_dir).true_clusters
    except RunDirError:
        return {}
    if truth is None:
        return {}
    t = np.asarray(truth)
    return {v.id: sorted({int(x) for x in t[v.clients]}) for v in alg.tree.leaves()}


def placement_table(rows: list[dict[str, Any]]) -> Any:
    """A rich table of placements."""
    from rich.table import Table

    table = Table(title="CFL placement of new clients (Algorithm 4)")
    for col in ("client", "leaf", "path", "α per level (left, right)", "true", "leaf's true",
                "acc leaf", "acc root"):
        table.add_column(col)
    for r in rows:
        sims = " ".join(f"({a:.2f},{b:.2f})" for a, b in r["similarities"])
        table.add_row(
            str(r["client"]), str(r["leaf"]), "→".join(map(str, r["path"])), sims,
            "" if r["true_cluster"] is None else str(r["true_cluster"]),
            "" if r["leaf_true_clusters"] is None else ",".join(map(str, r["leaf_true_clusters"])),
            _pct(r["accuracy_leaf"]), _pct(r["accuracy_root"]),
        )
    return table


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"
