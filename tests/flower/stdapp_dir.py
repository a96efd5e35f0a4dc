"""Writes a Flower App project around the standard ClientApp of `standard_app.py`: what a team
with its own Flower app has, plus a ServerApp of 15 lines that runs clusterfl's clustered
strategies (the example of docs/flower.md). Used by the deployment tests and by
`benchmarks/flower_standard/run.py`.

The ServerApp runs each method of its run config's `methods` (comma-separated specs) on the
same Grid, one after another, each into `out-dir/<method>`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterfl.deploy.launch import LocalDeployment

HERE = Path(__file__).resolve().parent

PYPROJECT = """\
[project]
name = "stdapp"
version = "1.0.0"
dependencies = ["flwr==1.41.0", "torch", "numpy", "clusterfl"]

[tool.flwr.app]
publisher = "clusterfl-tests"

[tool.flwr.app.components]
serverapp = "stdapp.server_app:app"
clientapp = "stdapp.client_app:app"

[tool.flwr.app.config]
methods = "cfl"
num-server-rounds = 14
lr = 0.3
min-nodes = 8
eval-every = 1
out-dir = ""
report-cluster = true
groups = 4
"""

SERVER_APP = '''\
"""A ServerApp running clusterfl's clustered strategies on an existing Flower app."""

import time
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from clusterfl.flower import ClusteredStrategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    for method in str(rc["methods"]).split(","):
        out = Path(str(rc["out-dir"])) / method.replace(":", "_") if rc["out-dir"] else None
        strategy = ClusteredStrategy(method, model="stdapp.client_app:Net", input_shape=(16,),
                                     n_classes=10, train={"lr": float(rc["lr"])},
                                     min_nodes=int(rc["min-nodes"]), out_dir=out,
                                     eval_every=int(rc["eval-every"]))
        result = strategy.start(grid, num_rounds=int(rc["num-server-rounds"]))
        print(f"{method}: clusters of the nodes {result.cluster_of_node}", flush=True)
'''


def write_app(folder: Path) -> Path:
    """The app project in `folder` (created); returns it."""
    pkg = folder / "stdapp"
    pkg.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text("")
    (pkg / "client_app.py").write_text((HERE / "standard_app.py").read_text())
    (pkg / "server_app.py").write_text(SERVER_APP)
    return folder


def run_engine(engine: str, methods: str, rounds: int, out: Path, n: int = 8,
               timeout: float = 900.0, eval_every: int = 1, groups: int = 4,
               log: Callable[[str], None] = print) -> dict[str, dict[str, object]]:
    """Run the app's ServerApp with `methods` on `engine` ("simulation": Flower's simulation
    engine; "deployment": a SuperLink and n SuperNodes on loopback) through `flwr run`; each
    method's final ARI, accuracy, clusters, rounds and seconds per round."""
    from clusterfl.deploy.launch import local_deployment

    with local_deployment(out / f"{engine}.flower") as dep:
        if engine == "simulation":
            dep.start_superlink(simulate=n)
        else:
            dep.start_superlink()
            for i in range(n):
                dep.start_supernode({"partition-id": i, "num-partitions": n})
        return run_on(dep, methods, rounds, out / engine, n, timeout, eval_every, groups, log)


def run_on(dep: LocalDeployment, methods: str, rounds: int, runs: Path, n: int,
           timeout: float = 900.0, eval_every: int = 1, groups: int = 4,
           log: Callable[[str], None] = print) -> dict[str, dict[str, object]]:
    """`run_engine` on a deployment that runs already (its SuperNodes hold partitions
    0..n-1, in `groups` groups); the run folders go to `runs`."""
    app = write_app(runs.parent / "app")
    names = [m.replace(":", "_") for m in methods.split(",")]
    config = (f'methods="{methods}" num-server-rounds={rounds} min-nodes={n} '
              f'eval-every={eval_every} out-dir="{runs}" groups={groups}')
    started = time.monotonic()
    proc = dep.flwr_run(None, None, app_dir=app, run_config=config)
    last = runs / names[-1] / "flower.json"  # the strategy's last file
    while not last.exists():
        if not proc.alive():
            raise RuntimeError(f"the Flower run stopped; logs in {dep.work / 'logs'}")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no result within {timeout:g} s; logs in {dep.work / 'logs'}")
        time.sleep(0.2)
    end = time.monotonic() + 10.0  # `flwr run --stream` returns when the run has finished
    while proc.alive() and time.monotonic() < end:
        time.sleep(0.1)
    proc.stop()
    engine = "simulation" if dep.federation_config else "deployment"
    return {method: run_result(runs / name, engine, method, log)
            for method, name in zip(methods.split(","), names)}


def run_result(run: Path, engine: str, method: str, log: Callable[[str], None] = print
               ) -> dict[str, object]:
    """A finished run's ARI, accuracy, clusters, rounds and seconds per round (the mean over
    rounds 2..R), and a line for the log."""
    from clusterfl.records import read_history, read_summary

    summary, history = read_summary(run), read_history(run)
    walls = [r.wall_time for r in history]
    per_round = (walls[-1] - walls[0]) / max(1, len(walls) - 1)
    final = summary.final
    accuracy = final.metrics.accuracy if final.metrics else None
    log(f"{engine:13s} {method:38s} ARI {final.ari}  accuracy {100 * (accuracy or 0):.1f}%  "
        f"clusters {final.n_clusters}  {per_round:.2f} s/round")
    return {"ari": final.ari, "accuracy": accuracy, "clusters": final.n_clusters,
            "rounds": len(history), "seconds_per_round": per_round}
