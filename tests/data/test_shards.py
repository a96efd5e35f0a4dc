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
    with pytest.raises(ConfigError, match=r"data\.path: .* is not a folder"):
        read_shards(tmp_path / "nowhere")
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
