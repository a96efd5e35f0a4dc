"""Memory-mapped shards (`clusterfl data shard`, `[data] source = "shards"`): a run on them
equals a run that builds the federation, the arrays are mapped (not read) when the run
starts, and bad folders or files are refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.cli import main
from clusterfl.config import load_config
from clusterfl.data.federation import Federation
from clusterfl.data.shards import read_shards, write_shards
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import Experiment, build_federation
from tests.crash import timing_free
from tests.tiny import tiny_config

BUILT = tiny_config(
    rounds=3, n_clients=8, hidden=8, seed=3,
    scenario={"name": "rotation", "n_clients": 8, "angles": [0.0, 180.0]},
    train={"lr": 0.2, "batch_size": 8, "steps": 3},
    algorithm={"name": "ifca", "n_clusters": 2, "fraction": 0.5})


def _on_shards(folder: Path) -> dict:
    raw = {k: v for k, v in BUILT.items() if k not in ("data", "scenario")}
    return {**raw, "data": {"source": "shards", "path": str(folder)}}


def test_a_run_on_the_shards_equals_the_run_that_builds_the_federation(tmp_path: Path) -> None:
    built = build_federation(load_config(BUILT))
    folder = write_shards(built, tmp_path / "shards")
    back = read_shards(folder)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(back, name), getattr(built, name))
        assert getattr(back, name).dtype == getattr(built, name).dtype
    assert np.array_equal(back.train_offsets, built.train_offsets)
    assert np.array_equal(back.clusters, built.clusters)
    assert (back.n_classes, back.task, back.name, back.x_scale) == \
        (built.n_classes, built.task, built.name, built.x_scale)
    a = Experiment.from_config(BUILT, out_dir=tmp_path / "a").run(progress=False)
    b = Experiment.from_config(_on_shards(folder), out_dir=tmp_path / "b").run(progress=False)
    assert [timing_free(r) for r in a.records] == [timing_free(r) for r in b.records]
    assert b.final.ari == a.final.ari and b.final.ari is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="reads /proc/self/maps (Linux) to see the mapped files")
def test_the_arrays_are_mapped_from_the_files_not_read(tmp_path: Path) -> None:
    folder = write_shards(build_federation(load_config(BUILT)), tmp_path / "shards")
    fed = read_shards(folder)
    maps = Path("/proc/self/maps").read_text()
    for name in ("x_train", "x_test"):
        assert str((folder / f"{name}.npy").resolve()) in maps
    fed.x_train[0].zero_()  # copy-on-write: the run never writes the files
    assert not torch.equal(read_shards(folder).x_train[0], fed.x_train[0])


def test_digests_name_the_client_whose_rows_changed(tmp_path: Path) -> None:
    """`Federation.digests` (what a checkpoint keeps for `--resume`): a change of one row
    changes that client's digest only, in the column of its split; mapped shards are read at
    each client's first and last rows (a round reads the rest when it asks)."""
    built = build_federation(load_config(BUILT))
    base = built.digests()
    assert base.shape == (8, 2) and len(np.unique(base)) == 16
    off = built.train_offsets
    middle = int(off[3] + (off[4] - off[3]) // 2)
    built.x_train[middle] = built.x_train[middle] + 1  # uint8 codes: every value changes
    changed = built.digests() != base
    assert changed.tolist() == [[i == 3, False] for i in range(8)]
    built.x_train[middle] = built.x_train[middle] - 1
    built.y_test[int(built.test_offsets[6])] += 1
    assert (built.digests() != base).tolist() == [[False, i == 6] for i in range(8)]
    built.y_test[int(built.test_offsets[6])] -= 1
    assert np.array_equal(built.digests(), base)

    folder = write_shards(built, tmp_path / "shards")
    mapped = read_shards(folder)
    assert mapped.mapped and not built.mapped
    ends = mapped.digests()
    mapped.x_train[int(off[5] - 1)] += 1  # the last row of client 4
    assert (mapped.digests() != ends).tolist() == [[i == 4, False] for i in range(8)]


def test_bad_folders_and_files_are_refused_in_one_line(tmp_path: Path) -> None:
    fed = build_federation(load_config(BUILT))
    folder = write_shards(fed, tmp_path / "shards")
    write_shards(fed, folder)  # its own shards are replaced
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"--out: .*used holds notes\.txt, which `clusterfl "
                                          r"data shard` did not write"):
        write_shards(fed, tmp_path / "used")
    assert (tmp_path / "used" / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match=r"data\.path: .* is not a folder \(a folder written "
                                          r"by `clusterfl data shard`\)$"):
        read_shards(tmp_path / "nowhere")
    relative = (rf"data\.path: shards is not a folder \(a folder written by `clusterfl data "
                rf"shard`, relative to the working folder {tmp_path / 'used'}\)")
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ConfigError, match=relative):
        mp.chdir(tmp_path / "used")  # `path = "shards"`, run from another folder
        read_shards("shards")
    x = folder / "x_train.npy"
    x.write_bytes(x.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"x_train\.npy: not a readable \.npy file .*truncated"):
        read_shards(folder)
    x.unlink()
    with pytest.raises(DataError, match=r"x_train\.npy: missing"):
        read_shards(folder)
    np.save(x, np.zeros((3, 2), np.float32))
    with pytest.raises(DataError, match=r"x_train\.npy: holds <f4 \[3, 2\], but "
                                        r"federation\.json says"):
        read_shards(folder)
    index = folder / "federation.json"
    index.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(DataError, match=r"federation\.json: not a clusterfl shard index"):
        read_shards(folder)


def test_cli_data_shard_writes_what_a_run_reads(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "rot.toml"
    config.write_text('seed = 3\n[data]\nsource = "digits"\n[scenario]\nname = "rotation"\n'
                      'n_clients = 6\nangles = [0.0, 180.0]\n')
    out = tmp_path / "shards"
    assert main(["data", "shard", str(config), "--out", str(out),
                 "--set", "scenario.n_clients=4"]) == 0
    said = capsys.readouterr().out
    assert "4 clients" in said and '[data] source = "shards"' in said
    assert read_shards(out).n_clients == 4
    with pytest.raises(ConfigError, match=r"data\.path: required for source 'shards'"):
        load_config({"data": {"source": "shards"}})
    with pytest.raises(ConfigError, match=r"scenario\.name: data\.source 'shards' is split "
                                          r"into clients already"):
        load_config({"data": {"source": "shards", "path": str(out)},
                     "scenario": {"name": "rotation"}})


def _hand_built(task: str = "classification") -> Federation:
    """A federation of two clients small enough to write by hand: uint8 codes with an
    `x_scale` for a classification, float inputs and targets for a regression."""
    gen = torch.Generator().manual_seed(0)
    if task == "regression":
        x_tr, x_te = torch.rand(8, 4, generator=gen), torch.rand(4, 4, generator=gen)
        y_tr, y_te = torch.rand(8, generator=gen), torch.rand(4, generator=gen)
        return Federation(x_tr, y_tr, np.array([0, 4, 8]), x_te, y_te, np.array([0, 2, 4]),
                          np.array([0, 1]), 1, "regression", "hand/regression")
    x_tr = torch.randint(0, 17, (8, 4), dtype=torch.uint8, generator=gen)
    x_te = torch.randint(0, 17, (4, 4), dtype=torch.uint8, generator=gen)
    y_tr, y_te = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), torch.tensor([2, 1, 0, 2])
    return Federation(x_tr, y_tr, np.array([0, 4, 8]), x_te, y_te, np.array([0, 2, 4]),
                      np.array([0, 1]), 3, "classification", "hand/codes", x_scale=16.0)


def test_shard_refuses_a_folder_whose_npy_files_it_did_not_write(tmp_path: Path) -> None:
    """Shard names alone do not make a folder an earlier shard output: without a
    `federation.json` of ours, the user's own `x_train.npy` is refused, not deleted."""
    fed = _hand_built()
    mine = tmp_path / "mydata"
    mine.mkdir()
    np.save(mine / "x_train.npy", np.arange(10))
    np.save(mine / "y_train.npy", np.arange(10))
    before = {f.name: f.read_bytes() for f in mine.iterdir()}
    with pytest.raises(ConfigError, match=r"--out: .*mydata holds x_train\.npy, which "
                                          r"`clusterfl data shard` did not write \(the folder "
                                          r"has no federation\.json of an earlier shard"):
        write_shards(fed, mine)
    assert {f.name: f.read_bytes() for f in mine.iterdir()} == before
    (mine / "federation.json").write_text('{"my": "notes"}')  # not ours either
    with pytest.raises(ConfigError, match=r"mydata holds x_train\.npy, which `clusterfl"):
        write_shards(fed, mine)
    assert (mine / "federation.json").read_text() == '{"my": "notes"}'
    assert {f.name: f.read_bytes() for f in mine.iterdir() if f.suffix == ".npy"} == before


def test_shard_leaves_a_folder_named_like_its_temporary_one_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are written through a temporary folder of the call's own making, inside the
    output folder: a user's `X.writing` beside it is never removed, nothing is left behind,
    and a write that fails keeps the earlier shards whole."""
    fed = _hand_built()
    theirs = tmp_path / "shards.writing"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    out = write_shards(fed, tmp_path / "shards")
    assert (theirs / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards", "shards.writing"]
    assert sorted(p.name for p in out.iterdir()) == [
        "federation.json", "x_test.npy", "x_train.npy", "y_test.npy", "y_train.npy"]

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", full_disk)
    with pytest.raises(ConfigError, match=r"--out: cannot write the shards to .*shards "
                                          r"\(No space left on device\)"):
        write_shards(_hand_built("regression"), out)
    assert sorted(p.name for p in out.iterdir()) == [
        "federation.json", "x_test.npy", "x_train.npy", "y_test.npy", "y_train.npy"]
    assert read_shards(out).task == "classification"  # the earlier shards, whole
    with pytest.raises(ConfigError, match=r"cannot write the shards"):
        write_shards(fed, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards", "shards.writing"]


def test_shard_into_the_working_folder_given_as_dot(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--out .` is the working folder itself: written in place (the folder kept, so a shell
    standing in it sees the files), not a `ValueError` about an empty name."""
    config = tmp_path / "iid.toml"
    config.write_text('seed = 0\n[data]\nsource = "digits"\n[scenario]\nname = "iid"\n'
                      'n_clients = 4\n')
    here = tmp_path / "empty"
    here.mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert main(["data", "shard", str(config), "--out", "."]) == 0
    assert f'"{here.resolve()}"' in capsys.readouterr().out.replace("\n", "")
    assert here.stat().st_ino == inode
    assert read_shards(".").n_clients == 4
    assert main(["data", "shard", str(config), "--out", "."]) == 0  # its own, replaced
    assert read_shards(here).n_clients == 4


def _edit(folder: Path, **fields: object) -> None:
    index = json.loads((folder / "federation.json").read_text())
    for key, value in fields.items():
        if value is _DROP:
            del index[key]
        else:
            index[key] = value
    (folder / "federation.json").write_text(json.dumps(index))


_DROP = object()


@pytest.mark.parametrize(("task", "edit", "error"), [
    ("classification", {"n_classes": 2},
     r"federation\.json: n_classes = 2, but y_train\.npy holds the class id 2; allowed ids "
     r"are 0 to 1"),
    ("classification", {"arrays": _DROP}, r"federation\.json: the field 'arrays' is missing"),
    ("classification", {"arrays": {"x_train": {"dtype": "|u1"}}},
     r"x_train\.npy: holds \|u1 \[8, 4\], but federation\.json says"),
    ("classification", {"x_scale": None},
     r"federation\.json: x_scale = None, but x_train\.npy holds uint8 codes"),
    ("classification", {"x_scale": "16"}, r"federation\.json: x_scale = '16'"),
    ("classification", {"task": "regression"},
     r"federation\.json: task 'regression', but y_train\.npy holds torch\.int64 class ids"),
    ("regression", {"task": "classification"},
     r"federation\.json: task 'classification', but y_train\.npy holds torch\.float32 "
     r"targets, not class ids"),
    ("regression", {"x_scale": 16.0},
     r"federation\.json: x_scale = 16\.0, but x_train\.npy holds torch\.float32 inputs"),
    ("classification", {"n_classes": "3"}, r"federation\.json: n_classes = '3'; expected a "
                                           r"whole number"),
    ("classification", {"train_offsets": [0, 4.7, 8]},
     r"federation\.json: train_offsets holds 4\.7; expected a list of whole numbers"),
    ("regression", {"clusters": [0, 1.5]},
     r"federation\.json: clusters holds 1\.5; expected a list of whole numbers"),
], ids=["n_classes_below_the_labels", "arrays_removed", "an_array_spec_without_shape",
        "x_scale_null_on_codes", "x_scale_text", "regression_on_class_labels",
        "classification_on_float_targets", "x_scale_on_float_inputs", "n_classes_text",
        "offsets_truncated_silently", "clusters_truncated_silently"])
def test_a_hand_edited_federation_json_is_refused_naming_the_field(
        tmp_path: Path, task: str, edit: dict[str, object], error: str) -> None:
    """Reading checks the index's fields against the arrays: a hand-edited `federation.json`
    is one line naming it and the field, not an index error, `KeyError` or dtype clash inside
    a round, nor a classification trained silently as a regression."""
    folder = write_shards(_hand_built(task), tmp_path / "shards")
    read_shards(folder)  # as written: fine
    _edit(folder, **edit)
    with pytest.raises(DataError, match=error):
        read_shards(folder)


def test_a_run_on_shards_with_too_few_classes_stops_before_training(tmp_path: Path) -> None:
    """The reported way in: `[data] source = "shards"` on an index whose `n_classes` was
    lowered below the labels present stops in one line, not with an index error."""
    folder = write_shards(build_federation(load_config(BUILT)), tmp_path / "shards")
    _edit(folder, n_classes=5)
    with pytest.raises(DataError, match=r"federation\.json: n_classes = 5, but y_\w+\.npy "
                                        r"holds the class id 9"):
        Experiment.from_config(_on_shards(folder), out_dir=tmp_path / "run").run(
            progress=False)


def test_a_file_of_the_same_shape_from_other_shards_is_refused_naming_it(
        tmp_path: Path) -> None:
    """A `y_test.npy` of another seed's shards (same shapes, other rows), copied in or left
    by a `data shard` rewriting the folder while a run started, was read silently beside the
    other files: a federation of two. Now the index keeps a digest of each client's first and
    last rows per array, and reading names the file whose rows differ."""
    ours = write_shards(build_federation(load_config(BUILT)), tmp_path / "a")
    other = write_shards(build_federation(load_config({**BUILT, "seed": 4})), tmp_path / "b")
    for name in ("x_train", "y_test"):
        assert not np.array_equal(np.load(ours / f"{name}.npy"),
                                  np.load(other / f"{name}.npy"))
        kept = (ours / f"{name}.npy").read_bytes()
        (ours / f"{name}.npy").write_bytes((other / f"{name}.npy").read_bytes())
        with pytest.raises(DataError, match=rf"a/{name}\.npy: its rows are not the ones "
                                            r"federation\.json was written with"):
            read_shards(ours)
        (ours / f"{name}.npy").write_bytes(kept)
        read_shards(ours)  # its own files again: read
    _edit(ours, ends=_DROP)  # shards written before the digests were kept: still read
    (ours / "y_test.npy").write_bytes((other / "y_test.npy").read_bytes())
    assert torch.equal(read_shards(ours).y_test, read_shards(other).y_test)


def test_shards_being_rewritten_or_left_by_a_killed_shard_are_named_so(tmp_path: Path) -> None:
    """While `data shard` replaces the arrays, the folder has no `federation.json` but its
    `.shards-writing-*` folder: a run starting then was told the folder "is not a folder
    written by `clusterfl data shard`", and resharding over one a killed `data shard` left
    said that folder was not written by `data shard`. Both now say what it is."""
    folder = write_shards(_hand_built(), tmp_path / "shards")
    (folder / "federation.json").unlink()
    (folder / ".shards-writing-k1ll3d").mkdir()
    with pytest.raises(DataError, match=r"federation\.json: missing: a `clusterfl data shard` "
                                        r"is rewriting .*shards \(its temporary folder "
                                        r"\.shards-writing-k1ll3d\) or was killed"):
        read_shards(folder)
    with pytest.raises(ConfigError, match=r"--out: .*shards holds \.shards-writing-k1ll3d, the "
                                          r"temporary folder of a `clusterfl data shard` "
                                          r"writing there now or of one that was killed: wait"):
        write_shards(_hand_built(), folder)
    (folder / ".shards-writing-k1ll3d").rmdir()
    with pytest.raises(DataError, match=r"federation\.json: missing; .*shards is not a folder "
                                        r"written by `clusterfl data shard`"):
        read_shards(folder)


def test_shard_of_a_config_with_holdout_warns_that_the_shards_hold_every_client(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`[scenario] holdout` is applied by a run, not kept in the federation, and a run on
    shards takes no `[scenario]`: `data shard` of such a config wrote all clients and said
    nothing, and the run on the shards trained on every client (other results, no placement)."""
    config = tmp_path / "held.toml"
    config.write_text('seed = 3\n[data]\nsource = "digits"\n[scenario]\nname = "rotation"\n'
                      'n_clients = 6\nangles = [0.0, 180.0]\nholdout = 0.5\n')
    assert main(["data", "shard", str(config), "--out", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().err == (
        "clusterfl: warning: scenario.holdout = 0.5 is not kept in the shards: they hold all "
        "6 clients, and a run on them trains on every one and places none (its results are "
        "not this config's)\n")
    assert read_shards(tmp_path / "a").n_clients == 6
    assert main(["data", "shard", str(config), "--out", str(tmp_path / "b"),
                 "--set", "scenario.holdout=0"]) == 0
    assert capsys.readouterr().err == ""
