"""8-bit inputs kept as uint8 codes (`Federation.x_scale`, issue 41): the same inputs bit for
bit, so the same training results as float32 storage, at a quarter of the memory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clusterfl.data import codes as codes_mod
from clusterfl.data.federation import Federation
from clusterfl.data.plans import Pool
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import Source, standardize
from clusterfl.experiment import Experiment

pytestmark = pytest.mark.usefixtures("one_thread")


def byte_source(n_train: int = 600, n_test: int = 200, seed: int = 0) -> Source:
    """Images read from bytes, as the MNIST reader makes them: code / 255 in float32."""
    rng = np.random.default_rng(seed)
    def images(n: int) -> torch.Tensor:
        codes = rng.integers(0, 256, size=(n, 1, 6, 6)).astype(np.uint8)
        codes[:, :, :2] = 0  # some exact zeros, as in digit images
        return torch.from_numpy(codes.astype(np.float32) / np.float32(255.0))
    return Source(images(n_train), torch.from_numpy(rng.integers(0, 10, n_train)),
                  images(n_test), torch.from_numpy(rng.integers(0, 10, n_test)), 10,
                  "classification", "bytes")


SCENARIO = {"n_clients": 12, "angles": [0, 90, 180, 270], "layout": "split",
            "n_train_per_client": 40, "n_test_per_client": 10}


def both(monkeypatch: pytest.MonkeyPatch, source: Source,
         scenario: dict | None = None) -> tuple[Federation, Federation]:
    """The federation as built (codes) and the same one built with float32 storage."""
    coded = make_federation(source, "rotation", scenario or SCENARIO, seed=3)
    with monkeypatch.context() as m:
        m.setattr(Pool, "codes", property(lambda self: None))
        plain = make_federation(source, "rotation", scenario or SCENARIO, seed=3)
    return coded, plain


def test_right_angle_rotations_keep_the_bytes_and_decode_bit_for_bit(monkeypatch):
    coded, plain = both(monkeypatch, byte_source())
    assert coded.x_scale == 255.0 and coded.x_train.dtype == torch.uint8
    assert plain.x_scale is None and plain.x_train.dtype == torch.float32
    assert coded.x_train.element_size() * 4 == plain.x_train.element_size()
    for split in ("train", "test"):
        x, y, off = coded.split(split)
        px, py, poff = plain.split(split)
        assert x.dtype == torch.float32 and torch.equal(x, px)  # same bits
        assert torch.equal(y, py) and np.array_equal(off, poff)
    x3, _ = coded.client_train(3)
    assert torch.equal(x3, plain.client_train(3)[0])
    # a subset keeps the codes (the benchmark's tiling of a federation)
    sub = coded.subset([5, 5, 0])
    assert sub.x_scale == 255.0 and sub.x_train.dtype == torch.uint8
    assert torch.equal(sub.client_train(1)[0], plain.client_train(5)[0])


def test_other_angles_and_standardized_inputs_stay_float(monkeypatch):
    source = byte_source()
    tilted = make_federation(source, "rotation", {**SCENARIO, "angles": [0, 45]}, seed=3)
    assert tilted.x_scale is None and tilted.x_train.dtype == torch.float32
    scaled = make_federation(standardize(source), "rotation", SCENARIO, seed=3)
    assert scaled.x_scale is None and scaled.x_train.dtype == torch.float32


def test_codes_without_scale_or_floats_with_scale_are_refused():
    coded = make_federation(byte_source(), "rotation", SCENARIO, seed=3)
    with pytest.raises(ValueError, match="x_scale must be uint8"):
        Federation(coded.x_train.float(), coded.y_train, coded.train_offsets, coded.x_test,
                   coded.y_test, coded.test_offsets, None, 10, x_scale=255.0)


def test_compact_inputs_in_pieces_gives_the_codes_of_the_whole(monkeypatch):
    x = byte_source(50, 1).x_train
    whole = codes_mod.compact_inputs(x, torch.float32)
    monkeypatch.setattr(codes_mod, "PIECE", 7)  # many pieces, the last one short
    assert whole is not None and torch.equal(codes_mod.compact_inputs(x, torch.float32), whole)
    bad = x.clone()
    bad.view(-1)[-1] = 0.5  # not a code / 255: found in the last piece
    assert codes_mod.compact_inputs(bad, torch.float32) is None


def _timing_free(obj):
    if isinstance(obj, dict):
        return {k: _timing_free(v) for k, v in obj.items()
                if k != "wall_time" and not k.endswith("_seconds")}
    if isinstance(obj, list):
        return [_timing_free(v) for v in obj]
    return obj


@pytest.mark.parametrize("algorithm", [
    {"name": "fedavg", "fraction": 0.5},
    {"name": "ifca", "n_clusters": 4},
    {"name": "cfl_gp", "n_clusters": 4, "protocol": "model", "fraction": 0.5},
    {"name": "fesem", "n_clusters": 4},
])
def test_training_on_codes_equals_training_on_floats(monkeypatch, tmp_path, algorithm):
    """Every number of the run (history and summary, wall times aside) is the same."""
    coded, plain = both(monkeypatch, byte_source())
    cfg = {"seed": 1, "rounds": 3, "eval_every": 1, "checkpoint_every": 0,
           "model": {"name": "mlp", "hidden": [16]},
           "train": {"lr": 0.1, "batch_size": 8, "steps": 2}, "algorithm": algorithm,
           "output": {"figures": False, "progress": "off"}}
    runs = []
    for tag, fed in (("codes", coded), ("floats", plain)):
        out = tmp_path / tag
        Experiment.from_config(cfg, out_dir=out, federation=fed).run(progress=False)
        hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
        runs.append(_timing_free([hist, json.loads((out / "summary.json").read_text())]))
    assert runs[0] == runs[1]
    assert runs[0][0][-1]["metrics"]["accuracy"] is not None
