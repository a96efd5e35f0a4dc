"""`clusterfl place RUN_DIR`: any method's run, its held-out clients, the JSON, and the
one-line errors (bad --clients, no checkpoint, a changed model)."""

from __future__ import annotations

import json
import shutil
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


def test_data_dir_keeps_the_runs_own_federation(ifca_run, tmp_path):
    """`--data-dir` says where the files are, not which federation: a trained client is
    still shown as trained, in its cluster of the run (it was '?': not the run's federation)."""
    plain, moved = tmp_path / "plain.json", tmp_path / "moved.json"
    assert main(["place", str(ifca_run), "--clients", "0,3", "--json", str(plain)]) == 0
    assert main(["place", str(ifca_run), "--clients", "0,3", "--json", str(moved),
                 "--data-dir", str(tmp_path)]) == 0
    rows = json.loads(moved.read_text())
    assert [r["trained"] for r in rows] == [True, False]
    assert rows == json.loads(plain.read_text())


@pytest.mark.parametrize(("spec", "message"), [
    ("3,x", "--clients: cannot read 'x'; use ids and ranges of the digits 0-9, e.g. 0,3,8-11"),
    ("5-2", "--clients: a range must go up: 2-5, not '5-2'"),
    ("12", "--clients: ids must be in 0..11 (got 12 in '12')"),
    ("0,3-13", "--clients: ids must be in 0..11 (got 12 in '0,3-13')"),
    (",", "--clients: ids must be in 0..11 (got no id in ',')"),
    ("", "--clients: ids must be in 0..11 (got no id in '')"),
])
def test_bad_clients_is_one_line(ifca_run, capsys, spec, message):
    assert main(["place", str(ifca_run), "--clients", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clusterfl: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(("spec", "message"), [
    # before: "7-3" said "cannot read", the others were taken (deduplicated, empty items
    # skipped, '+1' and the Arabic-Indic digit '٣' read as 1 and 3 by `int`)
    ("7-3", "--clients: a range must go up: 3-7, not '7-3'"),
    ("3,3", "--clients: client 3 is given twice in '3,3'; name each client once"),
    ("1-3,2-4", "--clients: client 2 is given twice in '1-3,2-4'; name each client once"),
    ("1,,2", "--clients: an empty item in '1,,2'; give ids and ranges separated by single "
             "commas, e.g. 0,3,8-11"),
    ("1,", "--clients: an empty item in '1,'"),
    ("+1", "--clients: cannot read '+1'; use ids and ranges of the digits 0-9"),
    ("\u0663", "--clients: cannot read '\u0663'; use ids and ranges of the digits 0-9"),
])
def test_clients_refuses_descending_ranges_repeats_empty_items_and_non_ascii_digits(
        ifca_run, capsys, spec, message):
    assert main(["place", str(ifca_run), "--clients", spec]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"clusterfl: error: {message}"), captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


@pytest.mark.parametrize(("setting", "key"), [
    ("rounds=40", "rounds"), ("train.lr=50.0", "train.lr"),
    ("train.batch_size=8", "train.batch_size"),
])
def test_set_of_rounds_or_train_is_refused_naming_the_key(ifca_run, capsys, setting, key):
    # before: accepted, exit 0, and the placement changed (Local trained 40 rounds, ...)
    assert main(["place", str(ifca_run), "--clients", "0", "--set", setting]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"clusterfl: error: --set {key}: placement needs the run's own "
                            "rounds, [model], [train] and [algorithm]; --set may change "
                            "seed, [data], [scenario], [backend], [validation] and "
                            "[privacy]\n")
    assert captured.out == ""


@pytest.mark.parametrize("settings", [
    ("output.figures=true", "eval_every=3"),
    # before: refused as "defining the placement rule", though a placement's guard
    # simulates no faults or attackers
    ("faults.dropout=0.5", "checkpoint_every=5"),
])
def test_set_of_what_a_placement_does_not_read_is_accepted_with_a_note(
        ifca_run, tmp_path, capsys, settings):
    plain, noted = tmp_path / "plain.json", tmp_path / "noted.json"
    assert main(["place", str(ifca_run), "--clients", "0,5", "--json", str(plain)]) == 0
    capsys.readouterr()
    sets = [w for setting in settings for w in ("--set", setting)]
    assert main(["place", str(ifca_run), "--clients", "0,5", "--json", str(noted),
                 *sets]) == 0
    keys = sorted(setting.split("=")[0] for setting in settings)
    assert capsys.readouterr().err.splitlines() == [
        f"clusterfl: note: --set {key} does not change a placement" for key in keys]
    assert json.loads(noted.read_text()) == json.loads(plain.read_text())


def test_place_of_a_private_runs_held_out_clients_repeats_its_noised_placement(tmp_path,
                                                                             capsys):
    """Before: `place` noised nothing whatever the run's `[privacy]` (and `--set privacy.*`
    was "accepted with a note"); now it clips and noises as the run's own placement of its
    held-out clients did, and prints the ε of the newcomers' releases."""
    cfg = tiny_config(rounds=4, n_clients=12, hidden=32, steps=0, checkpoint_every=4,
                      algorithm={"name": "flhc", "warmup_rounds": 2},
                      privacy={"clip": 0.05, "noise_multiplier": 1.0})
    cfg["train"].update(lr=0.1, epochs=2)
    cfg["scenario"]["holdout"] = 0.34
    run = tmp_path / "run"
    Experiment(load_config(cfg), run).run(progress=False)
    held = json.loads((run / "summary.json").read_text())["holdout"]
    dest = tmp_path / "placed.json"
    capsys.readouterr()
    assert main(["place", str(run), "--clients", ",".join(map(str, held["clients"])),
                 "--json", str(dest)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"privacy: {held['privacy']['note']}" in out and "ε = " in out
    rows = json.loads(dest.read_text())
    assert [r["cluster"] for r in rows] == held["placed_clusters"]
    assert [r["details"] for r in rows] == held["details"]  # the same noised distances
    assert [r["accuracy"] for r in rows] == pytest.approx(held["accuracy"], abs=1e-9)
    # another noise multiplier is applied, not noted as doing nothing
    assert main(["place", str(run), "--clients", ",".join(map(str, held["clients"])),
                 "--set", "privacy.noise_multiplier=4"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "(σ = 4)" in " ".join(captured.out.split())


def test_set_privacy_on_a_method_whose_placement_sends_no_update_says_so(ifca_run, capsys):
    assert main(["place", str(ifca_run), "--clients", "0", "--set", "privacy.clip=1"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert ("privacy: IFCA (K=2)'s placement sends no update (model or gradient) to clip or "
            "noise: what its newcomers send (losses, signatures, bases, counts, mixture "
            "weights) is not covered by [privacy], as in the run (docs/security.md)"
            ) in " ".join(captured.out.split())


def test_set_adversary_label_flip_leaves_the_placement_as_its_note_says(ifca_run, tmp_path,
                                                                       capsys):
    """Before: the note said `--set adversary.kind` changes nothing, but the federation was
    rebuilt with client 0's labels flipped: it was placed in the other cluster (a warning
    named its changed data) and scored on flipped labels. Now the run's own [adversary]
    (and [faults]) build the federation."""
    plain, flipped = tmp_path / "plain.json", tmp_path / "flipped.json"
    assert main(["place", str(ifca_run), "--clients", "0,1", "--json", str(plain)]) == 0
    capsys.readouterr()
    assert main(["place", str(ifca_run), "--clients", "0,1", "--json", str(flipped),
                 "--set", "adversary.kind='label_flip'", "--set", "adversary.clients=[0]",
                 "--set", "faults.drop_clients=[0]"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "clusterfl: note: --set faults.drop_clients does not change a placement",
        "clusterfl: note: --set adversary.kind does not change a placement"]
    assert json.loads(flipped.read_text()) == json.loads(plain.read_text())


def test_set_scenario_name_drops_the_old_scenarios_parameters_with_a_note(ifca_run, capsys):
    # before: "scenario.layout: unknown parameter of scenario 'label_swap' ... [and 2 more
    # problem(s)]": config.toml holds every resolved parameter of the run's rotation
    rc = main(["place", str(ifca_run), "--clients", "0-1",
               "--set", "scenario.name='label_swap'", "--set", "scenario.n_clusters=2"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.err.splitlines() == [
        "clusterfl: note: --set scenario.name='label_swap': the run's 'rotation' parameters "
        "layout, train_fraction, angles are dropped (the new scenario's defaults apply; set "
        "its own with --set scenario.KEY=VALUE)"]
    assert "placement of clients" in captured.out


def test_a_cfl_run_without_its_checkpoint_folder_places_from_cfl_tree(tmp_path, capsys):
    # before: "--set changed the run's [model] table" with no --set: the tree file keeps
    # only CFL's own settings under "config", which was read as the run's whole config
    import shutil

    cfg = tiny_config(rounds=2, n_clients=4, checkpoint_every=2,
                      algorithm={"name": "cfl", "eps1": 0.4, "eps2": 1.6})
    run = tmp_path / "cfl"
    Experiment(load_config(cfg), run).run(progress=False)
    with_ckpt, from_tree = tmp_path / "ckpt.json", tmp_path / "tree.json"
    assert main(["place", str(run), "--json", str(with_ckpt)]) == 0
    shutil.rmtree(run / "checkpoint")
    capsys.readouterr()
    assert main(["place", str(run), "--json", str(from_tree)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    flat = "".join(captured.out.split())  # the console wraps long paths anywhere
    assert f"statefrom{run / 'cfl_tree.pt'}(round2of2)" in flat
    assert json.loads(from_tree.read_text()) == json.loads(with_ckpt.read_text())
    assert main(["place", str(run), "--clients", "0", "--set", "model.hidden=[4]"]) == 2
    assert "--set model.hidden: placement needs" in capsys.readouterr().err


def test_a_run_that_is_not_finished_warns_naming_its_round(ifca_run, tmp_path, capsys):
    # before: the round-4 checkpoint of a run of 6 rounds was used without a word
    import shutil
    import subprocess

    import torch

    run = tmp_path / "stopped"
    shutil.copytree(ifca_run, run)
    state = torch.load(run / "checkpoint" / "state.pt", weights_only=False)
    state["config"]["rounds"] = 6  # as a run of 6 rounds stopped after round 4 holds it
    torch.save(state, run / "checkpoint" / "state.pt")
    toml = run / "config.toml"
    toml.write_text(toml.read_text().replace("rounds = 4", "rounds = 6"))
    assert main(["place", str(run), "--clients", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"clusterfl: warning: {run} is not finished: clients are placed "
                            "on its round-4 models (round 4 of 6)\n")
    assert "(round 4 of 6)" in " ".join(captured.out.split())
    live = subprocess.Popen(["sleep", "60"])  # the process that holds the run's lock
    try:
        (run / ".clusterfl.lock").write_text(f"{live.pid} clusterfl run x.toml\n")
        assert main(["place", str(run), "--clients", "0"]) == 0
        assert capsys.readouterr().err.startswith(
            f"clusterfl: warning: {run} is still running (process {live.pid}): clients are "
            "placed on its round-4 models")
    finally:
        live.kill()
        live.wait()


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
    assert "--set model.hidden: placement needs the run's own" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["place", str(tmp_path / "empty")]) == 2
    assert "no config.toml; not a run directory" in capsys.readouterr().err


def test_a_config_toml_edited_with_a_wrong_value_is_one_line_naming_it(ifca_run, tmp_path,
                                                                      capsys):
    """rounds = "two" in the run's config.toml read "rounds: Input should be a valid
    integer ..." with no word of which file (place takes no config argument)."""
    run = tmp_path / "run"
    shutil.copytree(ifca_run, run)
    config = run / "config.toml"
    config.write_text(config.read_text().replace("rounds = 4", 'rounds = "two"', 1))
    assert main(["place", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {config}: rounds: ")
    assert "(got 'two')" in err[0] and "put the value back" in err[0]


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
    assert "lies inside the folder of the run" in capsys.readouterr().err  # the run's folder
    assert summary.read_bytes() == before
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(notes)]) == 2
    assert capsys.readouterr().err == (
        f"clusterfl: error: --json: {notes} exists and is not a placements file (what "
        "`place --json` writes); it is not overwritten: give a new name\n")
    assert notes.read_text() == '{"mine": 1}'
    capsys.readouterr()
    placed = tmp_path / "placed.json"  # an earlier placement is replaced
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(placed)]) == 0
    assert main(["place", str(ifca_run), "--clients", "1-2", "--json", str(placed)]) == 0
    assert [r["client"] for r in json.loads(placed.read_text())] == [1, 2]


@pytest.mark.parametrize("where", ["the_run_placed", "the_run_placed_without_history",
                                   "another_run"])
def test_json_into_a_run_folder_is_refused_naming_that_run(ifca_run, tmp_path, capsys, where):
    # before: `--json RUN/placed.json` wrote the placements into the run's folder (exit 0),
    # whose `run --out RUN --overwrite` then refused 'RUN holds placed.json, which clusterfl
    # did not write'; likewise into any other run's folder
    run, record = ifca_run, "history.jsonl"
    if where == "the_run_placed_without_history":  # config.toml and checkpoint/ alone
        run, record = tmp_path / "run", "config.toml"
        shutil.copytree(ifca_run, run)
        (run / "history.jsonl").unlink()
        (run / "summary.json").unlink()
    holder = run if where != "another_run" else tmp_path / "other"
    if where == "another_run":  # a run's folder: it holds that run's history
        (holder / "sub").mkdir(parents=True)
        (holder / "history.jsonl").write_text("")
    target = holder / ("sub" if where == "another_run" else "") / "placed.json"
    rc = main(["place", str(run), "--clients", "0", "--json", str(target)])
    captured = capsys.readouterr()
    assert rc == 2 and captured.err == (
        f"clusterfl: error: --json: {target} lies inside the folder of the run {holder} (it "
        f"holds that run's {record}); a run's folder holds that run's files only: choose a "
        "folder outside it\n")
    assert captured.out.strip() == "" and not target.exists()  # refused before placing
    if where == "the_run_placed_without_history":  # the check does not stop a placement
        out = tmp_path / "placed.json"
        assert main(["place", str(run), "--clients", "0", "--json", str(out)]) == 0
        assert [r["client"] for r in json.loads(out.read_text())] == [0]


@pytest.mark.parametrize("text", [
    "[]", '[{"client": "alice", "cluster": "vip", "note": "keep me"}]',
    '[{"client": 1, "cluster": 0}]',  # not the keys place writes
    '[{"client": 1, "true_cluster": 0, "trained": true, "run_cluster": 0, "cluster": 0, '
    '"cluster_true_clusters": [0], "accuracy": 0.9, "mine": 1}]',  # one key more
])
def test_json_never_overwrites_an_empty_list_or_a_users_own_client_list(ifca_run, tmp_path,
                                                                        capsys, text):
    # before: any JSON list of objects with "client" and "cluster" (and `[]`) was replaced
    mine = tmp_path / "mine.json"
    mine.write_text(text)
    assert main(["place", str(ifca_run), "--clients", "0", "--json", str(mine)]) == 2
    assert "exists and is not a placements file" in capsys.readouterr().err
    assert mine.read_text() == text


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


def test_clients_of_another_dataset_of_the_same_shape_warn_naming_both(tmp_path, capsys):
    # before: `--set data.source=fashion_mnist` on a run of MNIST (the same 28×28 inputs and
    # 10 classes) placed the clients into clusters learnt on other data without a word
    from tests.paper_files import write_idx_set

    for name in ("mnist", "fashion_mnist"):
        write_idx_set(tmp_path / "data", name, train=240, test=60, seed=len(name))
    cfg = tiny_config(rounds=1, n_clients=4, hidden=8, steps=1, checkpoint_every=1,
                      algorithm={"name": "ifca", "n_clusters": 2})
    cfg["data"] = {"source": "mnist", "verify": False, "data_dir": str(tmp_path / "data")}
    Experiment(load_config(cfg), tmp_path / "run").run(progress=False)
    capsys.readouterr()
    place = ["place", str(tmp_path / "run"), "--clients", "0-1"]
    assert main([*place, "--set", "data.source=fashion_mnist"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == ["clusterfl: warning: --set data.source = 'fashion_mnist': the run trained "
                      "on 'mnist': its clusters and models were learnt on another dataset than "
                      "that of the clients placed"]
    assert main([*place, "--set", "seed=5"]) == 0  # the run's own dataset: no word
    assert "warning" not in capsys.readouterr().err
