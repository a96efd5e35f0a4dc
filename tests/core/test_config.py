"""Config validation: every kind of bad input names the field and what is allowed."""

import pytest

from clusterfl.config import apply_overrides, load_config, read_toml
from clusterfl.config_util import flatten
from clusterfl.errors import ConfigError


def test_defaults_resolve_and_roundtrip():
    cfg = load_config({})
    again = load_config(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()
    assert cfg.algorithm.name == "fedavg" and cfg.run.rounds >= 1


@pytest.mark.parametrize(("raw", "where"), [
    ({"validation": {"median_multiple": None}}, ("validation", "median_multiple")),
    ({"data": {"source": "digits"}, "scenario": {"name": "dirichlet_rotation",
                                                  "n_samples": None}}, ("scenario", "n_samples")),
    ({"algorithm": {"name": "flt", "aggregation": "clusters", "threshold": None}},
     ("algorithm", "threshold")),
])
def test_a_none_whose_default_is_not_none_is_written_none_and_loads_again(tmp_path, raw, where):
    """TOML has no None, and `to_dict` left every None out: a setting turned off by None
    whose default is on (the median rule, `median_multiple = None`) came back on from a
    run's config.toml (resume, place, compare) and from the Python API's check of a config.
    Now it is written "none", which loads as None (and can be written in a TOML file)."""
    import tomli_w

    table, name = where
    cfg = load_config(raw)
    assert getattr(getattr(cfg, table), name) is None
    written = cfg.to_dict()
    assert written[table][name] == "none"
    (tmp_path / "c.toml").write_text(tomli_w.dumps(written))
    again = load_config(read_toml(tmp_path / "c.toml"))
    assert getattr(getattr(again, table), name) is None
    assert again.to_dict() == written
    default = load_config({k: {f: x for f, x in v.items() if f != name}
                           for k, v in raw.items()})
    assert getattr(getattr(default, table), name) is not None  # the default it lost before


@pytest.mark.parametrize(
    "raw, field, words",
    [
        ({"roundz": 3}, "roundz", "unknown field; allowed top-level fields"),
        ({"rounds": 0}, "rounds", "greater than or equal to 1"),
        ({"rounds": "many"}, "rounds", "valid integer"),
        ({"train": {"lr": -1}}, "train.lr", "greater than 0"),
        ({"train": {"lr": float("inf")}}, "train.lr", "finite number (got inf)"),
        ({"train": {"lr": float("nan")}}, "train.lr", "finite number (got nan)"),
        ({"algorithm": {"name": "fedprox", "mu": float("inf")}}, "algorithm.mu", "finite"),
        ({"validation": {"max_norm": float("inf")}}, "validation.max_norm", "finite"),
        ({"train": {"optimizer": "rmsprop"}}, "train.optimizer", "'sgd' or 'adam'"),
        ({"train": {"epochs": 0, "steps": 0}}, "train", "epochs >= 1 or steps >= 1"),
        ({"train": {"batchsize": 4}}, "train.batchsize", "allowed fields here"),
        ({"algorithm": {"name": "nope"}}, "algorithm.name", "allowed: "),
        ({"algorithm": {"name": "fedprox", "mu": -0.1}}, "algorithm.mu", "greater than or equal"),
        ({"algorithm": {"name": "fedavg", "mu": 0.1}}, "algorithm.mu", "unknown field"),
        ({"algorithm": {"name": "fedavg", "fraction": 1.5}}, "algorithm.fraction", "less than"),
        ({"model": {"name": "mlp", "hidden": "big"}}, "model.hidden", "valid list"),
        ({"data": {"source": "imagenet"}}, "data.source", "allowed: "),
        ({"scenario": {"name": "swirl"}}, "scenario.name", "rotation"),
        ({"scenario": {"name": "dirichlet", "alpha": -1}}, "scenario.alpha", "greater than"),
        ({"backend": {"name": "gpu"}}, "backend.name", "allowed: "),
        ({"backend": {"timeout": 5.0}}, "backend.timeout",
         "unknown field; allowed fields here: chunk_size, device, name, precision"),
        ({"backend": {"name": "sequential", "client_engine": "sequential"}},
         "backend.client_engine",
         "unknown field; allowed fields here: chunk_size, device, name, precision"),
        ({"backend": {"name": "flower", "wait_nodes": -1}}, "backend.wait_nodes",
         "greater than or equal to 0"),
        ({"backend": {"name": "simulation", "chunk_size": 0}}, "backend.chunk_size",
         "allowed: a whole number >= 1 or 'auto'"),
        ({"backend": "flower"}, "backend", "must be a table"),
        ({"train": 5}, "train", "must be a table"),
    ],
)
def test_bad_values_name_the_field(raw, field, words):
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert info.value.field == field
    assert words in str(info.value)


def test_overrides_parse_toml_literals():
    raw = apply_overrides({}, ["rounds=7", "train.lr=0.5", "model.hidden=[8, 4]",
                               "scenario.name=label_swap"])
    cfg = load_config(raw)
    assert cfg.run.rounds == 7 and cfg.train.lr == 0.5
    assert list(cfg.model.hidden) == [8, 4] and cfg.scenario_name == "label_swap"
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["rounds"])
    with pytest.raises(ConfigError, match="is a value, not a table"):
        apply_overrides({"rounds": 3}, ["rounds.x=1"])


def test_set_numbers_toml_does_not_write_are_numbers_and_empty_key_parts_are_refused():
    # ".5", "5." and "05" are no TOML literals: they were kept as text, which the settings
    # refuse for a number field; "train..lr" set train.lr with the empty part dropped
    raw = apply_overrides({}, ["train.lr=.5", "train.momentum=0.", "rounds=05",
                               "data.data_dir=.5x"])
    cfg = load_config(raw)
    assert cfg.train.lr == 0.5 and cfg.train.momentum == 0.0 and cfg.run.rounds == 5
    assert raw["data"]["data_dir"] == ".5x"  # text stays text
    for key in ("train..lr", ".train.lr", "train.lr."):
        with pytest.raises(ConfigError, match="no empty part between dots") as info:
            apply_overrides({}, [f"{key}=0.1"])
        assert info.value.field == "--set" and repr(key) in str(info.value)
    with pytest.raises(ConfigError, match="no empty part"):
        apply_overrides({}, {"train..lr": 0.1})


def test_read_toml_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(bad)
    # a folder: said so (before: "config file not found: ."), and a run folder's own file named
    with pytest.raises(ConfigError, match=r"is a folder; give the config file, a \.toml file$"):
        read_toml(tmp_path)
    (tmp_path / "config.toml").write_text("rounds = 3")
    with pytest.raises(ConfigError, match=r"is a folder; .*\(a run's: .*config\.toml\)$"):
        read_toml(tmp_path)


def test_a_sweep_or_suite_file_given_as_a_run_config_names_its_command(tmp_path, capsys):
    """`clusterfl run SWEEP.toml` said "config: unknown field; allowed top-level fields: ..."
    (its [config] table read as a field)."""
    from clusterfl.cli import main

    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\nmethods = ["fedavg"]\nseeds = [0]\n[config]\nrounds = 2\n')
    with pytest.raises(ConfigError, match=r"^this is a sweep file \(a \[sweep\] table\), not a "
                                          r"run config: run it with `clusterfl sweep FILE`$"):
        load_config(read_toml(sweep))
    with pytest.raises(ConfigError, match=r"^this is a benchmark suite file \(a \[suite\] "
                                          r"table\), .*`clusterfl bench --suite ITS_FOLDER`$"):
        load_config({"suite": {"title": "t"}, "config": {"rounds": 2}})
    assert main(["run", str(sweep), "--out", str(tmp_path / "run")]) == 2
    assert "this is a sweep file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_config_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Windows editors save UTF-8 with a BOM: tomllib read it as "Invalid statement (at
    line 1, column 1)", for run configs and sweep files alike."""
    from clusterfl.sweep import load_sweep

    text = 'rounds = 2\n[algorithm]\nname = "ifca"\n'
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_toml(tmp_path / "bom.toml") == {"rounds": 2, "algorithm": {"name": "ifca"}}
    sweep = '[sweep]\nmethods = ["fedavg"]\nseeds = [0]\n[sweep.grid]\n"train.lr" = [0.1]\n'
    (tmp_path / "sweep.toml").write_bytes(b"\xef\xbb\xbf" + sweep.encode())
    assert load_sweep(tmp_path / "sweep.toml").seeds == [0]
    (tmp_path / "latin.toml").write_bytes('name = "é"'.encode("latin-1"))
    with pytest.raises(ConfigError, match="is not a UTF-8 text file"):
        read_toml(tmp_path / "latin.toml")


def test_each_backend_validates_its_own_table_and_builds_from_it():
    from clusterfl.backends import SequentialBackend, SimulationBackend
    from clusterfl.backends.flower.backend import FlowerConfig
    from clusterfl.backends.sequential import SequentialConfig
    from clusterfl.backends.simulation import SimulationConfig
    from clusterfl.experiment import build_backend
    from clusterfl.models import ModelFactory, model_config
    from tests.core.conftest import blob_federation

    assert type(load_config({}).backend) is SimulationConfig
    flower_keys = {"timeout": 5.0, "wait_nodes": 3, "wait_timeout": 9.0,
                   "client_engine": "sequential"}
    cfg = load_config({"backend": {"name": "flower", "chunk_size": 8, **flower_keys}})
    assert type(cfg.backend) is FlowerConfig and cfg.backend.client_engine == "sequential"
    assert cfg.to_dict()["backend"] == {"name": "flower", "chunk_size": 8, **flower_keys}
    assert load_config(cfg.to_dict()).to_dict() == cfg.to_dict()

    fed = blob_federation()
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), fed.input_shape,
                           fed.n_outputs)
    sim = build_backend(load_config({"backend": {"chunk_size": 3}}), fed, factory)
    assert type(sim) is SimulationBackend and sim.engine.chunk_size == 3
    seq_cfg = load_config({"backend": {"name": "sequential", "chunk_size": 3}})
    assert type(seq_cfg.backend) is SequentialConfig
    assert type(build_backend(seq_cfg, fed, factory)) is SequentialBackend


def test_every_committed_run_config_loads_again():
    """Issue 35, "configs round-trip": the config.toml of every run folder kept in git, many
    written by earlier versions with the defaults of their time (FL+HC given K with
    `significance = 0.01` beside `n_clusters`, for one), loads with today's checks. A check
    that refuses a setting doing nothing must not refuse what an earlier version wrote back."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "*config.toml"], cwd=root, check=True,
                            capture_output=True, text=True).stdout.split()
    assert len(listed) > 1000  # the transfer grid's kept runs, the benchmarks' configs
    failed = []
    for name in listed:
        try:
            load_config(read_toml(root / name))
        except ConfigError as exc:
            failed.append(f"{name}: {exc}")
    assert not failed, f"{len(failed)} of {len(listed)}: {failed[:3]}"


def test_an_unknown_option_in_a_nested_table_lists_that_tables_fields():
    """`algorithm.auto.nope` listed `[algorithm]`'s fields (aggregation, auto, ...) as the
    ones allowed "here"."""
    from clusterfl.clustering.split_rule import AutoRuleConfig
    from tests.tiny import tiny_config

    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(algorithm={"name": "cfl", "auto": {"nope": 1}}))
    assert err.value.field == "algorithm.auto.nope"
    assert err.value.message == ("unknown field; allowed fields here: "
                                 + ", ".join(sorted(AutoRuleConfig.model_fields)))
    with pytest.raises(ConfigError) as err:  # one level up: [algorithm]'s own fields
        load_config(tiny_config(algorithm={"name": "cfl", "nope": 1}))
    assert "allowed fields here: aggregation, auto, bipartition" in err.value.message


@pytest.mark.parametrize(("raw", "field", "kind"), [
    ({"scenario": {"n_clients": "4"}}, "scenario.n_clients", "a number"),
    ({"rounds": " 3"}, "rounds", "a number"),
    ({"train": {"lr": "0.1"}}, "train.lr", "a number"),
    ({"model": {"name": "mlp", "hidden": [8, "4"]}}, "model.hidden", "a list of numbers"),
    ({"algorithm": {"name": "ifca", "n_clusters": "2"}}, "algorithm.n_clusters", "a number"),
    ({"algorithm": {"name": "cfl", "auto": {"patience": "3"}}}, "algorithm.auto.patience",
     "a number"),
    ({"faults": {"dropout": "0.5"}}, "faults.dropout", "a number"),
])
def test_numbers_written_as_text_in_python_are_refused(raw, field, kind):
    """pydantic's lax mode read "4" as 4: `load_config({"scenario": {"n_clients": "4"}})`
    loaded 4 clients (TOML and --set give numbers as numbers; Python code may not)."""
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert err.value.field == field
    assert err.value.message.startswith(f"expected {kind}, not text: write the number without "
                                        "quotes (got ")
    with pytest.raises(ConfigError) as again:  # the Python API's overrides alike
        load_config(apply_overrides({}, flatten(raw)))
    assert (again.value.field, again.value.message) == (field, err.value.message)


def test_whole_numbers_still_set_float_fields_and_words_their_fields():
    config = load_config({"train": {"lr": 1}, "scenario": {"name": "rotation", "angles": [0, 90]},
                          "backend": {"chunk_size": "auto"}, "data": {"data_dir": "123"}})
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float)
    assert config.scenario.angles == [0.0, 90.0] and config.backend.chunk_size == "auto"
    assert config.data.data_dir == "123"  # a folder named 123 is text, not a number
    with pytest.raises(ConfigError, match="valid list"):  # pydantic's own words, as before
        load_config({"model": {"name": "mlp", "hidden": "big"}})


def test_eval_clients_takes_numpy_numbers_as_every_other_number_field():
    """`eval_clients = np.int64(3)` was refused ("allowed: a whole number >= 1 ... (got
    np.int64(3))") while `rounds = np.int64(3)` loaded."""
    import numpy as np

    config = load_config({"eval_clients": np.int64(3), "rounds": np.int64(3)})
    assert config.run.eval_clients == 3 and type(config.run.eval_clients) is int
    config = load_config({"eval_clients": np.float64(0.25)})
    assert config.run.eval_clients == 0.25 and type(config.run.eval_clients) is float
    for bad in (np.int64(0), np.float64(1.5), np.float64("nan")):
        with pytest.raises(ConfigError, match="allowed: a whole number >= 1 or a fraction"):
            load_config({"eval_clients": bad})
