"""A custom model and a custom method on the Flower backend, on nodes holding their own
`.npz` files: the same results as in-process, also when each node answers from its own
worker process (which must import the user's module itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clusterfl.data.scenarios import make_federation
from clusterfl.deploy.clientdata import export_partitions
from clusterfl.deploy.launch import kill_matching
from clusterfl.deploy.server_app import FINAL_STATE, run_on_grid
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from tests.ext.conftest import BASE
from tests.flower.conftest import FakeGrid, task_identity  # noqa: F401  (autouse fixture)


def _config(parts: Path, own: str, n: int) -> dict:
    return {**BASE, "rounds": 2, "eval_every": 2,
            "data": {"source": "npz", "path": str(parts)},
            "model": {"name": f"{own}:TinyNet", "width": 12},
            "algorithm": {"name": f"{own}:Damped", "step": 0.8},
            "backend": {"wait_nodes": n}}


def _parts(tmp_path: Path, n: int) -> Path:
    fed = make_federation("digits", "rotation", {"n_clients": n, "angles": [0, 180]}, seed=0)
    return export_partitions(fed, tmp_path / "parts")[0].parent


def _check_same_as_inprocess(raw: dict, out: Path) -> None:
    ref = Experiment.from_config({k: v for k, v in raw.items() if k != "backend"})
    ref_h = ref.run(progress=False)
    ours = torch.load(out / FINAL_STATE, weights_only=False)
    torch.testing.assert_close(ours["model"], ref.algorithm.state.model, rtol=1e-5, atol=1e-6)
    assert (out / "summary.json").is_file() and ref_h.final.metrics is not None


@pytest.mark.parametrize("nodes", ["data-file", "partition-id"])
def test_custom_model_and_method_on_flower_nodes_with_npz_files(own_module, tmp_path, nodes):
    parts = _parts(tmp_path, 4)
    # data-file: each node reads its own file; partition-id: each node builds the run's
    # [data] (the npz folder, sent in the recipe) and keeps its client
    grid = FakeGrid([{"data-file": str(p)} if nodes == "data-file" else {"partition-id": i}
                     for i, p in enumerate(sorted(parts.glob("*.npz")))])
    raw = _config(parts, own_module, 4)
    history = run_on_grid(grid, raw, out_dir=tmp_path / "run")
    assert history.summary.label == "Damped (step=0.8)"
    # the true clusters travelled from the nodes' files (handshake), not the data
    assert history.summary.true_clusters == [0, 0, 1, 1]
    _check_same_as_inprocess(raw, tmp_path / "run")


def test_node_worker_processes_import_the_users_module(own_module, tmp_path):
    parts = _parts(tmp_path, 2)
    workers = tmp_path / "w"
    grid = FakeGrid([{"data-file": str(p)} for p in sorted(parts.glob("*.npz"))])
    for node in grid.nodes.values():  # each node answers from its own worker process
        node.update({"worker": "persistent", "worker-dir": str(workers)})
    raw = _config(parts, own_module, 2)
    try:
        run_on_grid(grid, raw, out_dir=tmp_path / "run")
        assert len(list(workers.glob("*.log"))) == 2
        _check_same_as_inprocess(raw, tmp_path / "run")
    finally:
        kill_matching(str(workers))


def test_a_bad_import_path_fails_before_any_message_is_sent(own_module, tmp_path):
    parts = _parts(tmp_path, 2)
    grid = FakeGrid([{"data-file": str(p)} for p in sorted(parts.glob("*.npz"))])
    raw = {**_config(parts, own_module, 2), "model": {"name": "ownstuff:Nope"}}
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        run_on_grid(grid, raw, out_dir=tmp_path / "run")
    assert grid.sent == []
