"""Models, methods and trackers from outside the package: import paths, entry points, clear
errors, and a custom method under run, compare, bench, --resume and the Flower backend."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from clusterfl.compare import parse_algorithm_spec, run_comparison
from clusterfl.config import load_config
from clusterfl.engine.generic import GenericKernel
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from tests.ext.conftest import BASE

DIGITS = {**BASE, "data": {"source": "digits"},
          "scenario": {"name": "rotation", "n_clients": 6, "angles": [0, 180]}}


def _cfg(**tables) -> dict:
    return {**DIGITS, **tables}


def test_a_custom_model_runs_on_the_generic_engine_and_learns(own_module, tmp_path):
    cfg = _cfg(model={"name": f"{own_module}:TinyNet", "width": 24},
               algorithm={"name": "ifca", "n_clusters": 2}, rounds=4)
    exp = Experiment.from_config(cfg, out_dir=tmp_path / "run")
    history = exp.run(progress=False)
    built = exp.factory.build()
    assert type(built).__name__ == "TinyNet" and built.net[1].out_features == 24
    accuracy = history.series("accuracy")
    assert accuracy[-1] > accuracy[0] + 0.2 and history.final.ari == 1.0
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["model"] == {"name": "ownstuff:TinyNet", "width": 24}
    from clusterfl.backends.simulation import SimulationBackend
    backend = SimulationBackend(exp.federation, exp.factory)
    assert isinstance(backend.engine.kernel, GenericKernel)


def test_a_custom_method_by_import_path_equals_its_builtin_twin(own_module, tmp_path):
    # Damped with step 1 is FedAvg: the same models round after round
    ours = Experiment.from_config(_cfg(algorithm={"name": f"{own_module}:Damped",
                                                  "step": 1.0}), out_dir=tmp_path / "a")
    ref = Experiment.from_config(_cfg(algorithm={"name": "fedavg"}))
    h_ours, h_ref = ours.run(progress=False), ref.run(progress=False)
    torch.testing.assert_close(ours.algorithm.state.model, ref.algorithm.state.model,
                               rtol=1e-5, atol=1e-6)
    assert h_ours.series("accuracy") == pytest.approx(h_ref.series("accuracy"), abs=1e-6)
    assert h_ours.summary.label == "Damped (step=1)"
    assert h_ours.summary.algorithm == "ownstuff:Damped"
    assert h_ours.records[-1].extras["step"] == 1.0
    saved = tomllib.loads((tmp_path / "a" / "config.toml").read_text())
    assert saved["algorithm"] == {"name": "ownstuff:Damped", "step": 1.0}
    # the recorded config loads again (another process, --resume, compare)
    assert load_config(saved).algorithm.name == "ownstuff:Damped"


def test_a_custom_method_resumes_to_identical_results(own_module, tmp_path):
    cfg = _cfg(algorithm={"name": f"{own_module}:Damped"}, rounds=4, checkpoint_every=2)
    ref = Experiment.from_config(cfg).run(progress=False)
    Experiment.from_config(cfg, ["rounds=2"], out_dir=tmp_path / "run").run(progress=False)
    got = Experiment.from_config(cfg, out_dir=tmp_path / "run").run(resume=True,
                                                                    progress=False)
    assert got.series("accuracy") == ref.series("accuracy")
    assert [r.assignment for r in got.records] == [r.assignment for r in ref.records]


def test_compare_puts_a_custom_method_beside_builtin_ones(own_module, tmp_path):
    assert parse_algorithm_spec("ownstuff:Damped:step=0.25") == {
        "name": "ownstuff:Damped", "step": 0.25}
    config = load_config(_cfg())
    results = run_comparison(config, ["fedavg", f"{own_module}:Damped:step=0.25",
                                      "ifca:n_clusters=2"], tmp_path / "cmp")
    assert [label for label, _ in results] == ["FedAvg", "Damped (step=0.25)", "IFCA (K=2)"]
    report = (tmp_path / "cmp" / "report.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("| ")]
    assert any("Damped (step=0.25)" in row for row in table)
    assert any("IFCA (K=2)" in row for row in table) and any("FedAvg" in row for row in table)
    assert (tmp_path / "cmp" / "ownstuff-Damped_step=0.25" / "summary.json").is_file()


def test_bench_runs_a_custom_method_from_a_suite_file(own_module, tmp_path):
    from clusterfl.bench import load_suite, run_suite, write_results
    from clusterfl.config import dump_toml

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "blobs.toml").write_text(dump_toml({
        "suite": {"title": "digits", "seeds": [0],
                  "methods": ["fedavg", f"{own_module}:Damped:step=0.25"]},
        "config": _cfg(rounds=2)}))
    scenarios = load_suite(suite)
    run_suite(scenarios, tmp_path / "runs", log=lambda m: None)
    text = write_results(scenarios, tmp_path / "runs", tmp_path / "R.md", "clusterfl bench",
                         log=lambda m: None).read_text()
    assert "Damped (step=0.25)" in text and "FedAvg" in text


@pytest.mark.parametrize(("table", "field", "message"), [
    ({"algorithm": {"name": "nosuchpkg.methods:Mine"}}, "algorithm.name",
     "cannot import module 'nosuchpkg.methods'"),
    ({"algorithm": {"name": "ownstuff:Nope"}}, "algorithm.name", "has no attribute 'Nope'"),
    ({"algorithm": {"name": "ownstuff:TinyNet"}}, "algorithm.name",
     "not a subclass of clusterfl.algorithms.Algorithm"),
    ({"algorithm": {"name": "ownstuff:Damped", "step": 3}}, "algorithm.step",
     "less than or equal to 1"),
    ({"algorithm": {"name": "ownstuff:Damped", "stpe": 0.1}}, "algorithm.stpe",
     "unknown field"),
    ({"algorithm": {"name": "nosuch"}}, "algorithm.name", "or an import path"),
    ({"algorithm": {"name": "a:b:c"}}, "algorithm.name", "is not an import path"),
    ({"model": {"name": "ownstuff:not_a_module"}}, "model.name", "not a torch nn.Module"),
    ({"model": {"name": "ownstuff:TinyNet", "depth": 3}}, "model",
     "unexpected keyword argument 'depth'"),
    ({"model": {"name": "ownstuff:blobs_nope"}}, "model.name", "has no attribute"),
    ({"output": {"callbacks": ["ownstuff:TinyNet"]}}, "output.callbacks[0]", "failed"),
])
def test_bad_extensions_fail_in_one_line_naming_the_field(own_module, table, field, message):
    with pytest.raises(ConfigError) as err:
        Experiment.from_config(_cfg(**table))
    assert err.value.field == field and message in err.value.message
    assert "\n" not in str(err.value)


def _dist(tmp_path: Path, groups: dict[str, dict[str, str]],
          package: str = "ownstuff-plugins") -> Path:
    """A package's installed metadata with entry points (what `pip install` writes)."""
    site = tmp_path / "site"
    info = site / f"{package.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\n"
                                   "Version: 1.0\n")
    lines = []
    for group, entries in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


def test_an_installed_package_registers_itself_by_entry_points(own_module, tmp_path,
                                                               monkeypatch):
    site = _dist(tmp_path, {
        "clusterfl.models": {"tinynet": "ownstuff:TinyNet"},
        "clusterfl.algorithms": {"damped": "ownstuff:Damped"},
        "clusterfl.datasets": {"blobs": "ownstuff:blobs"},
    })
    monkeypatch.syspath_prepend(str(site))
    cfg = {**BASE, "data": {"source": "blobs", "n_clients": 4},
           "model": {"name": "tinynet"}, "algorithm": {"name": "damped", "step": 1.0}}
    exp = Experiment.from_config(cfg, out_dir=tmp_path / "run")
    history = exp.run(progress=False)
    assert type(exp.factory.build()).__name__ == "TinyNet"
    assert history.summary.label == "Damped (step=1)" and history.summary.federation == "blobs"
    assert exp.federation.n_clients == 4
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["data"]["source"] == "blobs" and saved["model"]["name"] == "tinynet"
    assert saved["scenario"] == {"name": "given"}
    # an unknown name lists the registered ones beside the built-ins
    with pytest.raises(ConfigError, match="damped, fedavg"):
        load_config({**cfg, "algorithm": {"name": "dampd"}})


def test_a_broken_entry_point_names_itself(own_module, tmp_path, monkeypatch):
    site = _dist(tmp_path, {"clusterfl.algorithms": {"broken": "ownstuff:Missing"}})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ConfigError, match=r"entry point 'broken'.*failed to load"):
        load_config({"algorithm": {"name": "broken"}})


def test_summary_and_report_name_the_custom_method(own_module, tmp_path):
    cfg = _cfg(algorithm={"name": f"{own_module}:Damped"}, output={"figures": True})
    Experiment.from_config(cfg, out_dir=tmp_path / "run").run(progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["label"] == "Damped" and summary["algorithm"] == "ownstuff:Damped"
    assert "# Damped" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.parametrize(("group", "name", "target", "config", "field"), [
    # before: the built-in IFCA ran and the package's `ifca` entry point was ignored without a
    # word; the built-in still wins (a config means the same everywhere), said once
    ("clusterfl.algorithms", "ifca", "ownstuff:Damped", {"algorithm": {"name": "ifca"}},
     "algorithm.name"),
    # before: a `clusterfl.datasets` entry point `digits` was ignored without a word (models
    # and methods said so; docs/extending.md says all three do)
    ("clusterfl.datasets", "digits", "ownstuff:blobs", DIGITS, "data.source"),
])
def test_an_entry_point_named_like_a_built_in_is_said_to_be_shadowed(
        own_module, tmp_path, monkeypatch, capsys, group, name, target, config, field):
    from clusterfl import plugins

    site = _dist(tmp_path, {group: {name: target}})
    monkeypatch.syspath_prepend(str(site))
    plugins._shadowing.cache_clear()
    monkeypatch.setattr(plugins, "_WARNED", set())
    try:
        for _ in range(2):
            loaded = load_config(config)
            assert (loaded.algorithm.name if group.endswith("algorithms")
                    else loaded.data.source) == name
        err = capsys.readouterr().err
        assert err.count(f"clusterfl: warning: {field}: {name!r} is the built-in; the entry "
                         f"point {name!r} of an installed package ({target}, group "
                         f"{group}) is not used") == 1
    finally:
        plugins._shadowing.cache_clear()


def test_one_name_registered_by_two_packages_is_refused_naming_both(own_module, tmp_path,
                                                                    monkeypatch):
    """Before: two installed packages registering `damped` ran whichever came last on the
    Python path, without a word."""
    _dist(tmp_path, {"clusterfl.algorithms": {"damped": "ownstuff:Damped"}})
    site = _dist(tmp_path, {"clusterfl.algorithms": {"damped": "ownstuff:Other"}},
                 package="otherstuff")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ConfigError) as err:
        load_config({"algorithm": {"name": "damped"}})
    assert err.value.field == "algorithm.name" and "\n" not in str(err.value)
    assert "'damped' (group clusterfl.algorithms) is registered by several installed " \
        "packages: " in err.value.message
    assert "ownstuff:Damped (package ownstuff-plugins)" in err.value.message
    assert "ownstuff:Other (package otherstuff)" in err.value.message
