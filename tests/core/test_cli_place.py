"""`clusterfl place RUN_DIR`: any method's run, its held-out clients, the JSON, and the
one-line errors (bad --clients, no checkpoint, a changed model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterfl.cli import main
from clusterfl.config import load_config
from clusterfl.experiment import Experiment
from tests.tiny import tiny_config


def _run(out: Path, holdout: float | None = 0.34, checkpoint_every: int = 2,
         rounds: int = 4) -> Path:
    cfg = tiny_config(rounds=rounds, n_clients=12, hidden=32, steps=0,
                      checkpoint_every=checkpoint_every,
                      algorithm={"name": "ifca", "n_clusters": 2})
    cfg["train"].update(lr=0.1, epochs=2)
    if holdout is not None:
        cfg["scenario"]["holdout"] = holdout
    Experiment(load_config(cfg), out).run(progress=False)
    return out


@pytest.fixture(scope="module")
def ifca_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("place") / "ifca")


def test_place_repeats_the_runs_own_placement_of_its_held_out_clients(ifca_run, tmp_path,
                                                                      capsys):
    summary = json.loads((ifca_run / "summary.json").read_text())
    held = summary["holdout"]
    dest = tmp_path / "placed.json"
    spec = ",".join(map(str, held["clients"]))
    assert main(["place", str(ifca_run), "--clients", spec, "--json", str(dest)]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # the console wraps long paths where their length says
    assert "IFCA (K=2): state from" in flat and "(round 4 of 4)" in flat
    assert "losses" in out  # the method's details are columns of the table
    rows = json.loads(dest.read_text())
    assert [r["client"] for r in rows] == held["clients"]
    assert [r["true_cluster"] for r in rows] == held["true_clusters"]
    assert [r["cluster"] for r in rows] == held["placed_clusters"]
    assert [r["accuracy"] for r in rows] == pytest.approx(held["accuracy"], abs=1e-9)
    assert [r["details"] for r in rows] == held["details"]
    assert not any(r["trained"] for r in rows) and summary["final"]["placement_ari"] == 1.0
    for r in rows:  # the trained clients of the placed cluster share the client's truth
        assert r["cluster_true_clusters"] == [r["true_cluster"]]


def test_place_a_trained_client_agrees_with_its_cluster_in_the_run(ifca_run, tmp_path):
    summary = json.loads((ifca_run / "summary.json").read_text())
    dest = tmp_path / "trained.json"
    assert main(["place", str(ifca_run), "--json", str(dest)]) == 0  # every client
    rows = json.loads(dest.read_text())
    assert [r["client"] for r in rows] == list(range(12))
    trained = [r for r in rows if r["trained"]]
    assert len(trained) == summary["n_clients"] == 8
    assert [r["run_cluster"] for r in trained] == summary["assignment"]
    assert all(r["cluster"] == r["run_cluster"] for r in trained)


@pytest.mark.parametrize(("spec", "message"), [
    ("3,x", "--clients: cannot read 'x'; use ids and ranges, e.g. 0,3,8-11"),
    ("5-2", "--clients: cannot read '5-2'"),
    ("12", "--clients: ids must be in 0..11 (got 12 in '12')"),
    ("0,3-13", "--clients: ids must be in 0..11 (got 12 in '0,3-13')"),
    (",", "--clients: ids must be in 0..11 (got no id in ',')"),
    ("", "--clients: ids must be in 0..11 (got no id in '')"),
])
def test_bad_clients_is_one_line(ifca_run, capsys, spec, message):
    assert main(["place", str(ifca_run), "--clients", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clusterfl: error: {message}") and err.count("\n") == 1


def test_a_run_without_checkpoint_says_why(tmp_path, capsys):
    run = _run(tmp_path / "nock", holdout=None, checkpoint_every=0, rounds=1)
    assert main(["place", str(run), "--clients", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no checkpoint/state.pt to place clients with: checkpoints were off " \
           "(checkpoint_every = 0)" in err


def test_place_refuses_a_changed_model_and_folders_that_are_not_runs(ifca_run, tmp_path,
                                                                     capsys):
    assert main(["place", str(ifca_run), "--set", "model.hidden=[8]"]) == 2
    assert "--set changed the run's [model] table" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["place", str(tmp_path / "empty")]) == 2
    assert "no config.toml; not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["folder", "missing_parent", "name_too_long"])
def test_a_json_target_that_cannot_be_written_is_one_line_naming_json(ifca_run, tmp_path,
                                                                      capsys, where):
    # before: the placement was computed and printed, then "error: Is a directory: p1"
    target = {"folder": tmp_path, "missing_parent": tmp_path / "no" / "such" / "p.json",
              "name_too_long": tmp_path / ("x" * 300 + ".json")}[where]  # fails as root too
    rc = main(["place", str(ifca_run), "--clients", "0", "--json", str(target)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("clusterfl: error: --json: ")
    assert str(target if where != "missing_parent" else target.parent) in lines[0]
    if where == "name_too_long":  # the OS's reason, in one line
        assert "File name too long" in lines[0]
    assert captured.out.strip() == ""  # refused before any placement was computed or printed


def test_a_federation_of_another_shape_is_one_line_naming_both_shapes(ifca_run, tmp_path,
                                                                       capsys):
    # before: `--set data.source=mnist` on a run of the 8×8 digits ended in torch's
    # "shape '[64, 784]' is invalid for input of size 4810" traceback
    from tests.paper_files import write_idx_set

    write_idx_set(tmp_path, "mnist", train=240, test=60)
    rc = main(["place", str(ifca_run), "--clients", "0-3", "--data-dir", str(tmp_path),
               "--set", "data.source=mnist", "--set", "data.verify=false"])
    captured = capsys.readouterr()
    assert rc == 2 and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("clusterfl: error: --set: the run's model was trained on "
                                   "inputs (1, 8, 8) with 10 outputs; the federation of --set "
                                   "has inputs (1, 28, 28) with 10")
    assert captured.out.strip() == ""


def test_json_never_overwrites_a_file_that_is_not_a_placement(ifca_run, tmp_path, capsys):
    # before: `--json RUN/summary.json` replaced the run's summary with the placements
    summary = ifca_run / "summary.json"
    before = summary.read_bytes()
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(summary)]) == 2
    err = capsys.readouterr().err
    assert err == (f"clusterfl: error: --json: {summary} exists and is not a placements file "
                   "(what `place --json` writes); it is not overwritten: give a new name\n")
    assert summary.read_bytes() == before
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(notes)]) == 2
    assert notes.read_text() == '{"mine": 1}'
    capsys.readouterr()
    placed = tmp_path / "placed.json"  # an earlier placement is replaced
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(placed)]) == 0
    assert main(["place", str(ifca_run), "--clients", "1-2", "--json", str(placed)]) == 0
    assert [r["client"] for r in json.loads(placed.read_text())] == [1, 2]


def test_placing_on_data_that_changed_since_the_run_warns_naming_the_clients(tmp_path, capsys):
    """`place` rebuilds the run's federation from its config, which names the data, not its
    contents: an npz file edited after the run was placed as if the client had trained on it,
    without a word. The checkpoint's per-client digests now name what changed."""
    import numpy as np

    from tests.core.test_experiment import _write_clients

    clients = tmp_path / "clients"
    _write_clients(clients, 6)
    cfg = {"seed": 0, "rounds": 2, "checkpoint_every": 1,
           "data": {"source": "npz", "path": str(clients)},
           "model": {"name": "mlp", "hidden": [8]},
           "algorithm": {"name": "ifca", "n_clusters": 2}, "output": {"figures": False}}
    Experiment.from_config(cfg, out_dir=tmp_path / "run").run(progress=False)
    capsys.readouterr()
    assert main(["place", str(tmp_path / "run"), "--clients", "0,4"]) == 0
    assert "warning" not in capsys.readouterr().err
    d = dict(np.load(clients / "client_0004.npz"))
    np.savez(clients / "client_0004.npz", **{**d, "x_train": d["x_train"] * 2})
    assert main(["place", str(tmp_path / "run"), "--clients", "0,4"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["clusterfl: warning: the data changed since the run's checkpoint (the "
                   "training data of client 4): clients are placed with their data as it is now"]
