"""The 15-line ServerApp of docs/flower.md (`stdapp_dir.py`) with the standard ClientApp of
`standard_app.py`, through real Flower processes and `flwr run` on Flower's simulation
engine (a simulation SuperLink, a local simulation federation of 8 virtual SuperNodes on Ray
actors). The same app on a loopback SuperLink with TLS and SuperNode authentication runs on
the shared deployment of `test_deployment.py`. The full matrix of methods on both engines,
with the time per round, is `benchmarks/flower_standard/run.py`
(benchmarks/flower_standard/RESULTS.md); these runs keep the suite's time in bounds."""

from __future__ import annotations

from pathlib import Path

from clusterfl.cli import main
from tests.flower.stdapp_dir import run_engine

CLUSTERED = "fesem:n_clusters=4"


def test_on_flowers_simulation_engine_the_strategies_find_the_groups(tmp_path: Path) -> None:
    # 3 rounds: FeSEM has found the groups (ARI 1, 99 % on the in-process grid) and FedAvg's
    # one model for four rotations is far behind (about 60 %)
    results = run_engine("simulation", f"fedavg,{CLUSTERED}", 3, tmp_path, timeout=420,
                         log=lambda m: None)
    fedavg = results.pop("fedavg")
    for method, r in results.items():
        assert r["ari"] is not None and float(r["ari"]) >= 0.9, (method, r)
        assert float(r["accuracy"]) > float(fedavg["accuracy"]) + 0.1, (method, r)
    run = tmp_path / "simulation" / "fesem_n_clusters=4"
    assert main(["report", str(run)]) == 0 and (run / "report.md").is_file()
    both = tmp_path / "comparison"  # the comparison report of two strategy runs
    assert main(["report", str(run), str(tmp_path / "simulation" / "fedavg"),
                 "--out", str(both)]) == 0
    assert "FeSEM" in (both / "report.md").read_text()
