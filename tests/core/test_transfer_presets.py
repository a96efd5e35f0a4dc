"""`benchmarks/transfer/run_grid.py`'s presets: each earlier version's CFL rule written as
settings of today's code, checked against that rule as docs/cfl.md's history tells it (no
run)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from clusterfl.config import load_config

TRANSFER = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer"

# CFL's auto rule of each grid version (docs/cfl.md, "History of the auto rule"): v0 before
# issue 36; rule v1; v2 (progress against ln C, the contrast bound); v3 and v4 (one level
# 0.01, no bound); v5 and v6 (two levels); v7 (rule v6: progress off). Every version before
# v8 judged each sampled round alone and, before v7, had the progress condition at 0.05.
BEFORE_V7 = {"progress": 0.05, "sampled_evidence": "each"}
V1 = {**BEFORE_V7, "progress_from": "first", "contrast_min": 0.0, "significance": 0.05,
      "significance_sampled": 0.05, "cut": "fallback", "nesting": False, "test_every": True}
V3 = {**V1, "progress_from": "uniform", "significance": 0.01, "significance_sampled": 0.01}
V5 = {**V3, "significance": 0.002}
RULES: dict[str, dict[str, Any]] = {
    "v0": {**V1, "cut": "raw", "nesting": True, "test_every": False},
    "v1": V1,
    "v2": {**V1, "progress_from": "uniform", "contrast_min": 0.5},
    "v3": V3, "v4": V3, "v5": V5, "v6": V5,
    "v7": {**V5, "progress": 0.0},
    "v8": {**V5, "progress": 0.0, "sampled_evidence": "combined"},  # today's (rule v7)
}
RULES["v9"] = RULES["v10"] = RULES["v11"] = RULES["v12"] = RULES["v13"] = RULES["v8"]


@pytest.fixture
def run_grid(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(TRANSFER))
    return importlib.import_module("run_grid")


def test_each_preset_runs_its_versions_cfl_rule(run_grid: Any) -> None:
    """Presets v0-v5 ran with the progress condition off (v6's default) and v0-v6 with the
    sampled rounds pooled (v8's): each change of a default had gone into the preset of the
    version before it only."""
    assert set(RULES) == set(run_grid.PRESETS)
    fed = next(iter(run_grid.GRID["federation"].values()))
    for version, rule in RULES.items():
        raw = run_grid.config(fed, "cfl", [], preset=version)
        auto = load_config(raw).algorithm.auto  # type: ignore[attr-defined]
        assert {k: getattr(auto, k) for k in rule} == rule, version
        assert load_config(raw).algorithm.ignored_settings() == [], version


def test_each_preset_runs_flts_rule_v1(run_grid: Any) -> None:
    """Grid versions v1-v8 ran FLT's rule v1 (the rows of Ã after UMAP, the silhouette bound
    alone); v9 (FLT's rule v2) changed its default, so each earlier preset carries rule v1
    (v0: the largest gap, where neither option is read)."""
    fed = next(f for f in run_grid.GRID["federation"].values() if f["source"] == "mnist")
    for version in RULES:
        algo = load_config(run_grid.config(fed, "flt", [], preset=version)).algorithm
        if version not in ("v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"):  # rule v2
            assert (algo.auto_on, algo.significance) == ("signatures", 0.002)  # type: ignore[attr-defined]
            continue
        if version == "v0":
            assert algo.auto_clusters == "gap"  # type: ignore[attr-defined]
            continue
        assert (algo.auto_on, algo.significance) == ("relatedness", 0.0), version  # type: ignore[attr-defined]
        assert algo.ignored_settings() == [], version
    today = load_config(run_grid.config(fed, "flt", [])).algorithm
    assert (today.auto_on, today.significance) == ("signatures", 0.002)  # type: ignore[attr-defined]


def test_each_preset_runs_pca_km_hcs_rule_v1(run_grid: Any) -> None:
    """Grid versions v1-v9 ran PCA+kM+HC's rule v1 (Ward on D's rows, the silhouette bound
    alone); v10 (its rule v2: the bound and the shuffle test of the distances between those
    rows) changed its default, so each earlier preset carries `significance = 0` (v0: the
    largest gap, where it is not read)."""
    fed = next(f for f in run_grid.GRID["federation"].values() if f["source"] == "mnist")
    for version in RULES:
        algo = load_config(run_grid.config(fed, "pca_km_hc", [], preset=version)).algorithm
        if version == "v0":
            assert algo.auto_clusters == "gap"  # type: ignore[attr-defined]
            continue
        if version in ("v10", "v11", "v12", "v13"):  # PCA+kM+HC's rule v2 since v10
            assert algo.significance == 0.002  # type: ignore[attr-defined]
            continue
        assert algo.significance == 0.0, version  # type: ignore[attr-defined]
        assert algo.ignored_settings() == [], version
    today = load_config(run_grid.config(fed, "pca_km_hc", [])).algorithm
    assert today.significance == 0.002  # type: ignore[attr-defined]


def test_each_preset_runs_its_versions_flhc_rule(run_grid: Any) -> None:
    """FL+HC's rule per grid version (docs/transfer.md): v0 the largest gap; v1-v3 the
    silhouette bound alone (rule v1); v4, v5 the test of the update cosines at 0.01 (rule
    v2); v6-v10 at 0.002 (rule v3); v11 the test of the rows of update distances with the
    bound (rule v4); v12 and today's default rule v3 again."""
    fed = next(iter(run_grid.GRID["federation"].values()))
    for version in RULES:
        algo = load_config(run_grid.config(fed, "flhc", [], preset=version)).algorithm
        if version == "v0":
            assert algo.auto_cut == "gap"  # type: ignore[attr-defined]
            continue
        want = (0.0 if version in ("v1", "v2", "v3") else
                0.01 if version in ("v4", "v5") else 0.002)
        assert algo.significance == want, version  # type: ignore[attr-defined]
        if want:
            tested = "distance_rows" if version == "v11" else "cosines"
            assert algo.tested == tested, version  # type: ignore[attr-defined]
        assert algo.ignored_settings() == [], version
    today = load_config(run_grid.config(fed, "flhc", [])).algorithm
    assert (today.significance, today.tested) == (0.002, "cosines")  # type: ignore[attr-defined]


def test_each_preset_runs_pacfls_rule_v1(run_grid: Any) -> None:
    """Grid versions v1-v12 ran PACFL's rule v1 (the silhouette bound alone), v13 its rule v2
    (the bound and the shuffle test of the angles at 0.002), and v14, today's default, rule v1
    again (v0: the authors' β = 3.5°, where it is not read)."""
    fed = next(f for f in run_grid.GRID["federation"].values() if f["source"] == "mnist")
    for version in RULES:
        algo = load_config(run_grid.config(fed, "pacfl", [], preset=version)).algorithm
        if version == "v0":
            assert algo.threshold == 3.5  # type: ignore[attr-defined]
            continue
        want = 0.002 if version == "v13" else 0.0
        assert algo.significance == want, version  # type: ignore[attr-defined]
        assert algo.ignored_settings() == [], version
    today = load_config(run_grid.config(fed, "pacfl", [])).algorithm
    assert today.significance == 0.0  # type: ignore[attr-defined]
