"""The papers' EMNIST scenarios (clusterfl.data.paper_scenarios) on EMNIST files in NIST's
format: FLT's Structured Non-IID FEMNIST (App. C.4, Algorithm 4) and CFL-GP's label skew +
rotation (App. F.8)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.data.paper_scenarios import structured_sets
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import load_source
from clusterfl.errors import ConfigError
from tests.paper_files import write_emnist


def test_structured_femnist_follows_flt_appendix_c4(tmp_path: Path) -> None:
    write_emnist(tmp_path, "balanced", per_class=20, test_per_class=4)
    src = load_source("emnist", tmp_path, split="balanced")
    alpha, delta = 2, 0.5
    fed = make_federation(src, "structured_femnist", {"n_clients": 40, "alpha": alpha,
                                                      "delta": delta}, seed=3)
    sets = [c["classes"] for c in fed.meta["clusters"]]
    # ten disjoint label sets covering the 47 classes: nine of 5 and the last of 2
    assert [len(s) for s in sets] == [5] * 9 + [2]
    assert sorted(c for s in sets for c in s) == list(range(47))
    assert fed.clusters is not None and fed.clusters.tolist() == np.repeat(range(10), 4).tolist()
    for i in range(fed.n_clients):
        allowed = set(sets[fed.clusters[i]])
        assert set(fed.client_train(i)[1].tolist()) <= allowed
        assert set(fed.client_test(i)[1].tolist()) <= allowed
    for g, info in enumerate(fed.meta["clusters"]):
        sizes = fed.train_sizes[fed.clusters == g]
        rows = 20 * len(sets[g])  # every row of the cluster's classes (2400 each in EMNIST)
        beta = info["beta"]
        by_hand = [math.floor(alpha + math.exp(beta * m ** delta)) for m in range(1, 5)]
        assert sizes.tolist()[:3] == by_hand[:3] and sizes[3] <= by_hand[3]
        assert rows - 4 <= sizes.sum() <= rows  # β solved so the cluster's rows are used up
        assert np.all(np.diff(sizes) >= 0)  # quantity skew: m-th client gets more


def test_structured_sets_and_bad_sizes() -> None:
    rng = np.random.default_rng(0)
    assert [len(s) for s in structured_sets(10, 3, 4, rng)] == [4, 4, 2]
    with pytest.raises(ConfigError) as err:
        structured_sets(47, 10, 4, rng)  # 9 x 4 = 36 leaves 11 > 4 for the last cluster
    assert "leave 11 for the last one" in str(err.value)


def test_dirichlet_rotation_follows_cflgp_f8(tmp_path: Path) -> None:
    arrays = write_emnist(tmp_path, "byclass", per_class=10, test_per_class=3)
    src = load_source("emnist", tmp_path, split="byclass")
    fed = make_federation(src, "dirichlet_rotation",
                          {"n_clients": 8, "n_samples": 400, "alpha": 1.0}, seed=1)
    assert fed.n_classes == 62 and fed.meta["n_samples"] == 400
    assert fed.clusters is not None and fed.clusters.tolist() == [0] * 4 + [1] * 4
    assert int(fed.train_sizes.sum()) == 400 and fed.train_sizes.min() >= 1
    # label skew: the clients' class histograms differ (Dir(1) over 8 clients)
    hist = np.stack([np.bincount(fed.client_train(i)[1].numpy(), minlength=62)
                     for i in range(8)]).astype(float)
    shares = hist / hist.sum(axis=1, keepdims=True)
    assert np.abs(shares - shares.mean(axis=0)).sum(axis=1).min() > 0.3
    # rotation: cluster 0 holds source images as they are, cluster 1 the same turned 180°
    pool = {bytes(a.T.tobytes()) for a in arrays["x_train"]}  # the reader transposes back
    for i, turned in ((0, False), (7, True)):
        x = fed.client_train(i)[0][:, 0]
        x = torch.flip(x, dims=(-2, -1)) if turned else x
        for image in x:
            assert bytes(np.round(image.numpy() * 255).astype(np.uint8).tobytes()) in pool
    with pytest.raises(ConfigError) as err:
        make_federation(src, "dirichlet_rotation", {"n_clients": 2, "angles": [0, 90, 180]})
    assert "scenario.angles" in str(err.value)
