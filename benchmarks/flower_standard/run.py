"""clusterfl's strategies driving a standard Flower ClientApp through real Flower processes.

The app is `tests/flower/standard_app.py` (a quickstart-style ClientApp: flwr, torch and
numpy only) with the 15-line ServerApp of docs/flower.md (`tests/flower/stdapp_dir.py`): 8
nodes in 4 rotated groups. Each engine runs every method of `--methods` on one Grid:

- `simulation`: Flower's simulation engine (a simulation SuperLink, `flwr run` on a local
  simulation federation of 8 virtual SuperNodes, Ray actors);
- `deployment`: a SuperLink and 8 SuperNode processes on loopback, `flwr run`;
- `clusterfl-app`: the same federation (the app's partitions written as per-client `.npz`
  files) through clusterfl's own ClientApp: `clusterfl flower run --mode local`, the same
  model shape (MLP 16-32-10), lr, batch and epochs; for the time per round beside it.

It prints, and writes to `--out`/results.json, each method's final ARI, accuracy, clusters,
rounds and wall time per round (from its run folder).

Usage: python benchmarks/flower_standard/run.py [--engines simulation,deployment]
       [--methods M1,M2] [--rounds 14] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

METHODS = ("fedavg,cfl,flhc,ifca:n_clusters=4:warmup_rounds=2,fesem:n_clusters=4,"
           "cfl_gp:n_clusters=4:protocol=model")


def run_clusterfl_app(methods: str, rounds: int, out: Path, n: int = 8
                      ) -> dict[str, dict[str, object]]:
    """The same federation through clusterfl's own ClientApp (`flower run --mode local`)."""
    import subprocess

    from tests.flower.standard_app import GROUPS, load_data
    from tests.flower.stdapp_dir import run_result

    from clusterfl.compare import parse_algorithm_spec
    from clusterfl.config import dump_toml
    from clusterfl.data.federation import Federation
    from clusterfl.deploy.clientdata import export_partitions

    parts = [tuple(t.numpy() for t in load_data(p, GROUPS)) for p in range(n)]
    fed = Federation.from_clients(parts, clusters=[p % GROUPS for p in range(n)],
                                  n_classes=10)
    data = out / "clusterfl-app" / "data"
    export_partitions(fed, data)
    results = {}
    for method in methods.split(","):
        name = method.replace(":", "_")
        config = out / "clusterfl-app" / f"{name}.toml"
        config.write_text(dump_toml({
            "seed": 0, "rounds": rounds, "eval_every": 1, "checkpoint_every": 0,
            "data": {"source": "npz", "path": str(data)},
            "model": {"name": "mlp", "hidden": [32]},
            "train": {"lr": 0.3, "batch_size": 20, "epochs": 1},
            "algorithm": parse_algorithm_spec(method),
            "backend": {"name": "flower", "wait_nodes": n},
            "output": {"figures": False}}))
        run = out / "clusterfl-app" / name
        subprocess.run([sys.executable, "-m", "clusterfl.cli", "flower", "run", str(config),
                        "--mode", "local", "--out", str(run), "--timeout", "900"],
                       check=True, capture_output=True, text=True)
        results[method] = run_result(run, "clusterfl-app", method)
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", default="simulation,deployment")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--out", type=Path, default=Path("benchmarks/flower_standard/runs"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from tests.flower.stdapp_dir import run_engine

    results = {e: (run_clusterfl_app(args.methods, args.rounds, args.out.resolve())
                   if e == "clusterfl-app"
                   else run_engine(e, args.methods, args.rounds, args.out.resolve()))
               for e in args.engines.split(",")}
    path = args.out / "results.json"  # engines run before are kept
    before = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**before, **results}, indent=2))


if __name__ == "__main__":
    main()
