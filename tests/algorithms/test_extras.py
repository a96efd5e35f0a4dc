"""Every method with typed extras writes exactly the keys its `RoundExtras` class declares.

Each case runs a tiny experiment (8 clients, an MLP) for 2-3 rounds and names the extras
class of every round (a method whose rounds differ declares one class per kind of round). A key
written but not declared, or declared but not written, fails; so does a value that does not
survive `from_dict` / `to_dict`. The last test makes sure every class the methods declare is
written by some case here, so a new kind of round cannot go untested.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import clusterfl.algorithms
from clusterfl.algorithms.cam import (
    CAMExtras,
    FeSEMCAMExtras,
    FeSEMCAMKMeansExtras,
    IFCACAMExtras,
)
from clusterfl.algorithms.cfl import CFLExtras, CFLSplitEvent
from clusterfl.algorithms.cfl_gp import CFLGPClusteringExtras, CFLGPEstimateExtras, CFLGPExtras
from clusterfl.algorithms.common import KClusterExtras, LossExtras
from clusterfl.algorithms.ensemble import EnsembleExtras
from clusterfl.algorithms.fedem import FedEMExtras
from clusterfl.algorithms.fedsoft import FedSoftExtras
from clusterfl.algorithms.fesem import FeSEMExtras, FeSEMKMeansExtras, KMeansExtras
from clusterfl.algorithms.flhc import (
    FLHCClusteringExtras,
    FLHCExtras,
    FLHCPlacedExtras,
    FLHCSampledClusteringExtras,
)
from clusterfl.algorithms.flt import FLTClusteringExtras, FLTExtras
from clusterfl.algorithms.ifca import IFCAExtras
from clusterfl.algorithms.pacfl import PACFLClusteringExtras, PACFLExtras
from clusterfl.experiment import Experiment
from clusterfl.records import RoundExtras, RoundRecord

N = 8
BASE: dict[str, Any] = {
    "seed": 3, "rounds": 3, "eval_every": 3, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": N, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 32, "epochs": 1},
    "output": {"figures": False, "progress": "off"},
}
LABELS: dict[str, Any] = {"scenario": {"name": "cluster_labels", "n_clients": 12,
                                       "n_clusters": 3}}

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def nobody_answers_in(round_: int) -> dict[str, Any]:
    """Every client is unreachable in `round_` (a round in which no k-means can run)."""
    return {"faults": {"drop_clients": list(range(N)), "drop_rounds": [round_]}}


# id -> (algorithm table, other tables, the extras class of each round)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], list[type[RoundExtras]]]] = {
    "ifca": ({"name": "ifca", "n_clusters": 2, "warmup_rounds": 1}, {},
             [IFCAExtras] * 3),
    # warm-up ending with k-means, a round nobody answers, a round with k-means
    "fesem": ({"name": "fesem", "n_clusters": 2, "warmup_rounds": 1}, nobody_answers_in(2),
              [FeSEMKMeansExtras, FeSEMExtras, FeSEMKMeansExtras]),
    "fesem_warm": ({"name": "fesem", "n_clusters": 2, "warmup_rounds": 2}, {"rounds": 2},
                   [FeSEMExtras, FeSEMKMeansExtras]),
    "ifca_cam": ({"name": "ifca_cam", "n_clusters": 2, "warmup_rounds": 1}, {"rounds": 2},
                 [IFCACAMExtras] * 2),
    # FeSEM-CAM's warm-up rounds are FeSEM's
    "fesem_cam": ({"name": "fesem_cam", "n_clusters": 2, "warmup_rounds": 1},
                  nobody_answers_in(2),
                  [FeSEMKMeansExtras, FeSEMCAMExtras, FeSEMCAMKMeansExtras]),
    "fedavg": ({"name": "fedavg"}, {"rounds": 2}, [LossExtras] * 2),
    "local": ({"name": "local"}, {"rounds": 2}, [LossExtras] * 2),
    "fedavg_plus": ({"name": "fedavg_plus", "n_models": 2}, {"rounds": 2},
                    [EnsembleExtras] * 2),
    "cfl": ({"name": "cfl", "eps1": 100.0, "eps2": 0.001}, {"rounds": 2}, [CFLExtras] * 2),
    "cfl_gp": ({"name": "cfl_gp", "n_clusters": 2, "period": 2, "k_max": 4,
                "stable_rounds": 0}, {},
               [CFLGPEstimateExtras, CFLGPExtras, CFLGPEstimateExtras]),
    "cfl_gp_no_estimate": ({"name": "cfl_gp", "n_clusters": 2, "estimate_k": False,
                            "period": 1}, {"rounds": 2}, [CFLGPClusteringExtras] * 2),
    "flt": ({"name": "flt", "encoder": "none", "latent": 16, "k": 3, "finetune_epochs": 0,
             "umap": False, "fraction": 0.5}, {**LABELS, "rounds": 2},
            [FLTClusteringExtras, FLTExtras]),
    "pca_km_hc": ({"name": "pca_km_hc", "k": 3, "pca_components": 4, "fraction": 0.5},
                  {**LABELS, "rounds": 2}, [FLTClusteringExtras, FLTExtras]),
    "fedem": ({"name": "fedem", "n_components": 2, "fraction": 0.5}, nobody_answers_in(2),
              [FedEMExtras] * 3),
    "fedsoft": ({"name": "fedsoft", "n_clusters": 2, "per_cluster": 2,
                 "estimation_interval": 2}, nobody_answers_in(2), [FedSoftExtras] * 3),
    "pacfl": ({"name": "pacfl", "fraction": 0.5, "threshold": 10.0}, {**LABELS, "rounds": 2},
              [PACFLClusteringExtras, PACFLExtras]),
    # a warm-up round, the clustering round, a per-cluster round
    "flhc": ({"name": "flhc", "warmup_rounds": 1, "fraction": 0.5}, {},
             [FLHCExtras, FLHCClusteringExtras, FLHCExtras]),
    # the same with a clustering of 4 clients, the others placed when next sampled
    "flhc_sampled": ({"name": "flhc", "warmup_rounds": 1, "fraction": 0.5,
                      "cluster_clients": 4}, {},
                     [FLHCExtras, FLHCSampledClusteringExtras, FLHCPlacedExtras]),
}

# Classes that are parts of the above, never a round's whole extras.
PARTS: set[type[RoundExtras]] = {KClusterExtras, KMeansExtras, CAMExtras}


def run(case: str) -> list[RoundRecord]:
    algorithm, tables, _ = CASES[case]
    cfg = copy.deepcopy({**BASE, **tables, "algorithm": algorithm})
    return Experiment.from_config(cfg).run(progress=False).records


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_round_writes_exactly_the_declared_keys(case):
    kinds = CASES[case][2]
    records = run(case)
    assert len(records) == len(kinds)
    for rec, cls in zip(records, kinds):
        written, declared = set(rec.extras), set(cls.field_names())
        assert written == declared, (
            f"round {rec.round} of {case} ({cls.__name__}): written but not declared "
            f"{sorted(written - declared)}, declared but not written "
            f"{sorted(declared - written)}")
        assert cls.matches(rec.extras)
        typed = cls.from_dict(rec.extras)
        assert typed.to_dict() == rec.extras  # every value read back as written
        assert list(typed.to_dict()) == list(cls.field_names())
        assert cls.from_dict(typed.to_dict()) == typed


def test_cfl_split_events_are_typed():
    events = [ev for rec in run("cfl") for ev in CFLExtras.from_dict(rec.extras).splits]
    assert any(ev["accepted"] for ev in events)
    required, optional = CFLSplitEvent.__required_keys__, CFLSplitEvent.__optional_keys__
    auto = {"stationarity", "within", "cross", "contrast", "streak", "p_value"}  # auto only
    assert auto <= optional
    for ev in events:  # this case runs the epsilon rule
        assert required <= set(ev) <= required | optional
        assert set(ev) == (required | (optional - auto) if ev["accepted"] else required)


def test_every_declared_extras_class_is_written_by_a_case():
    declared = set()
    for info in pkgutil.iter_modules(clusterfl.algorithms.__path__):
        module = importlib.import_module(f"clusterfl.algorithms.{info.name}")
        declared |= {cls for _, cls in inspect.getmembers(module, inspect.isclass)
                     if issubclass(cls, RoundExtras) and cls is not RoundExtras
                     and cls.__module__.startswith("clusterfl.algorithms.")}
    written = {cls for _, _, kinds in CASES.values() for cls in kinds}
    assert declared == written | PARTS
    assert not written & PARTS
