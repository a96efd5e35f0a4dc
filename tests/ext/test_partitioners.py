"""Scenario `cluster_partitioner`: rotation clusters split inside by Flower Datasets."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfl.data.scenarios import make_federation
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from tests.ext.conftest import BASE


def _fed(partitioner: str, **options):
    return make_federation("digits", "cluster_partitioner",
                           {"n_clients": 6, "angles": [0, 180], "partitioner": partitioner,
                            "options": options}, seed=3)


def _class_concentration(fed) -> float:
    """Mean over clusters and classes of the largest share of the class one client holds."""
    counts = np.stack([np.bincount(fed.client_train(i)[1].numpy(), minlength=10)
                       for i in range(fed.n_clients)])
    shares = [counts[fed.clusters == g] / counts[fed.clusters == g].sum(0) for g in (0, 1)]
    return float(np.mean([s.max(0).mean() for s in shares]))


def test_iid_inside_clusters_gives_equal_clients_and_dirichlet_skews_labels():
    iid = _fed("iid")
    assert iid.clusters.tolist() == [0, 0, 0, 1, 1, 1]
    sizes = iid.train_sizes
    assert sizes.max() - sizes.min() <= 2 and sizes.sum() == 1347  # every train row, once
    skewed = _fed("dirichlet", alpha=0.1, min_partition_size=5)
    assert skewed.train_sizes.sum() == 1347
    # Dir(0.1) per class over a cluster's 3 clients: one client holds most of each class;
    # iid: about a third each
    assert _class_concentration(skewed) > 0.7 and _class_concentration(iid) < 0.4
    # the same seed gives the same federation
    again = _fed("dirichlet", alpha=0.1, min_partition_size=5)
    assert (again.train_sizes == skewed.train_sizes).all()


def test_clusters_are_found_on_partitioned_rotations():
    cfg = {**BASE, "rounds": 4, "data": {"source": "digits"},
           "scenario": {"name": "cluster_partitioner", "n_clients": 6, "angles": [0, 180],
                        "partitioner": "iid"},
           "algorithm": {"name": "ifca", "n_clusters": 2}}
    history = Experiment.from_config(cfg).run(progress=False)
    assert history.final.ari == 1.0


def test_a_bad_partitioner_option_names_the_field():
    with pytest.raises(ConfigError) as err:
        _fed("dirichlet", beta=0.3)
    assert err.value.field == "scenario.options" and "DirichletPartitioner" in err.value.message
    with pytest.raises(ConfigError) as err:
        _fed("nosuch")
    assert err.value.field == "scenario.partitioner"
