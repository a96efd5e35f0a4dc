"""Hostile input: fuzzed configs, overrides, files and command lines never end in a bare
traceback — every failure is a ClusterFLError naming the field or the file."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterfl.cli import main
from clusterfl.config import TOP_LEVEL, apply_overrides, dump_toml, load_config, read_toml
from clusterfl.data.scenarios import SCENARIOS
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import Experiment
from tests.datasets import require, skip_unless

FIELDS = [*TOP_LEVEL, "name", "n_clients", "angles", "alpha", "lr", "batch_size", "epochs",
          "steps", "fraction", "n_clusters", "dropout", "clip", "noise_multiplier", "kind",
          "hidden", "source", "drop_clients", "median_multiple", "warmup_rounds", "eps1"]
NAMES = [*SCENARIOS, "fedavg", "ifca", "cfl", "cfl_gp", "mlp", "digits", "mnist", "sign_flip"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text(max_size=8),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NAMES),
    st.integers(-3, 40),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
raw_configs = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), values,
                              max_size=6)
TMP = HealthCheck.function_scoped_fixture  # tmp_path is reused across examples: fine here
FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _clean_tomlable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _clean_tomlable(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_clean_tomlable(x) for x in v if x is not None]
    return v


@FAST
@given(raw_configs)
def test_load_config_raises_only_config_errors(raw):
    try:
        load_config(raw)
    except ConfigError as exc:
        assert exc.field or "config" in exc.message or exc.message


@FAST
@given(st.lists(st.text(max_size=30), max_size=4))
def test_overrides_raise_only_config_errors(items):
    try:
        load_config(apply_overrides({}, items))
    except ConfigError as exc:
        assert str(exc)


small = st.one_of(st.integers(0, 9), st.integers(-2, 12), st.floats(0, 1), st.floats(-2, 400),
                  st.booleans(), st.sampled_from(NAMES), st.lists(st.integers(-1, 9), max_size=4))


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid small config with a few fields of its real tables set to odd values."""
    from clusterfl.algorithms import ALGORITHMS
    from clusterfl.robust.config import (
        AdversaryConfig,
        FaultsConfig,
        PrivacyConfig,
        ValidationConfig,
    )

    scen = draw(st.sampled_from(sorted(n for n in SCENARIOS if n != "linear_regression")))
    algo = draw(st.sampled_from(sorted(set(ALGORITHMS) - {"flt"})))
    raw: dict[str, Any] = {
        "rounds": 1, "data": {"source": "digits"}, "scenario": {"name": scen},
        "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": algo},
        "output": {"figures": False, "progress": "off"},
    }
    tables = {"scenario": SCENARIOS[scen].params, "algorithm": ALGORITHMS[algo].Config,
              "faults": FaultsConfig, "adversary": AdversaryConfig, "privacy": PrivacyConfig,
              "validation": ValidationConfig}
    for _ in range(draw(st.integers(1, 2))):
        table = draw(st.sampled_from(sorted(tables)))
        names = sorted(set(tables[table].model_fields) - {"name"})
        if names:
            raw.setdefault(table, {})[draw(st.sampled_from(names))] = draw(small)
    return raw


@settings(max_examples=50, deadline=None)
@given(near_valid())
def test_building_an_experiment_fails_only_with_clear_errors(raw):
    """Near-valid configs build their federation, model, method and first round, or fail
    with a ConfigError / DataError."""
    try:
        exp = Experiment.from_config(raw)
        exp.run(progress=False)
    except (ConfigError, DataError) as exc:
        assert str(exc)


@settings(max_examples=50, deadline=None, suppress_health_check=[TMP])
@given(st.binary(max_size=200))
def test_garbage_config_files_name_the_file(tmp_path, blob):
    path = tmp_path / "c.toml"
    path.write_bytes(blob)
    try:
        load_config(read_toml(path))
    except ConfigError as exc:
        if not exc.field:  # a file-level problem names the file
            assert str(path) in exc.message


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors (exit 2, message printed)
            code = int(exc.code or 0)
    return code, err.getvalue()


@settings(max_examples=50, deadline=None, suppress_health_check=[TMP])
@given(content=st.one_of(st.binary(max_size=120), raw_configs.map(
    lambda r: dump_toml(_clean_tomlable(r)).encode()).filter(bool)),
    sets=st.lists(st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
                  max_size=2))
def test_cli_config_command_never_tracebacks(tmp_path, content, sets):
    path = tmp_path / "fuzz.toml"
    path.write_bytes(content)
    argv = ["config", str(path)]
    for s in sets:
        argv += ["--set", s]
    code, err = _cli(argv)
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2 and "usage:" not in err:
        assert err.startswith("clusterfl: error:")


@pytest.mark.parametrize("argv", [
    ["run", "/nonexistent/x.toml"], ["report", "/nonexistent/run"], ["data", "verify", "nope"],
    ["data", "download", "nope"], ["compare", "/nonexistent.toml", "--algorithms", "x"],
    ["config", "/"],
])
def test_cli_bad_paths_and_names_are_one_line(argv):
    code, err = _cli(argv)
    assert code == 2 and "Traceback" not in err and err.count("\n") <= 2, err


def test_run_with_a_bad_robust_field_names_it(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[faults]\ndropout = 1.5\n')
    code, err = _cli(["run", str(path), "--out", str(tmp_path / "o")])
    assert code == 2 and "faults.dropout" in err
    path.write_text('[adversary]\nkind = "backdoor"\n')
    code, err = _cli(["run", str(path), "--out", str(tmp_path / "o")])
    assert code == 2 and "adversary.kind" in err and "label_flip" in err


# ------------------------------------------------------------------ corrupted dataset files

@skip_unless("mnist")
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_dataset_names_file_and_checksum(tmp_path, damage):
    from clusterfl.data.download import DATASETS
    from clusterfl.data.sources import load_source

    folder = tmp_path / "mnist"
    folder.mkdir()
    for f in (require("mnist") / "mnist").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    victim = folder / "t10k-labels-idx1-ubyte.gz"
    blob = bytearray(victim.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with pytest.raises(DataError) as err:
        load_source("mnist", tmp_path)
    sha = next(f.sha256 for f in DATASETS["mnist"].files if f.path.endswith(victim.name))
    assert str(victim) in str(err.value) and sha in str(err.value)
    code, _out = _cli(["data", "verify", "mnist", "--data-dir", str(tmp_path)])
    assert code == 1

