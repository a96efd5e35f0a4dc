"""Writes a Flower App project around the standard ClientApp of `standard_app.py`: what a team
with its own Flower app has, plus a ServerApp of 15 lines that runs clusterfl's clustered
strategies (the example of docs/flower.md). Used by the deployment tests and by
`benchmarks/flower_standard/run.py`.

The ServerApp runs each method of its run config's `methods` (comma-separated specs) on the
same Grid, one after another, each into `out-dir/<method>`."""

from __future__ import annotations

from pathlib import Path

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
out-dir = ""
report-cluster = true
"""

SERVER_APP = '''\
"""A ServerApp running clusterfl's clustered strategies on an existing Flower app."""

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
                                     min_nodes=int(rc["min-nodes"]), out_dir=out)
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
