"""Config validation: every kind of bad input names the field and what is allowed."""

import pytest

from clusterfl.config import apply_overrides, load_config, read_toml
from clusterfl.errors import ConfigError


def test_defaults_resolve_and_roundtrip():
    cfg = load_config({})
    again = load_config(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()
    assert cfg.algorithm.name == "fedavg" and cfg.run.rounds >= 1


@pytest.mark.parametrize(
    "raw, field, words",
    [
        ({"roundz": 3}, "roundz", "unknown field; allowed top-level fields"),
        ({"rounds": 0}, "rounds", "greater than or equal to 1"),
        ({"rounds": "many"}, "rounds", "valid integer"),
        ({"train": {"lr": -1}}, "train.lr", "greater than 0"),
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


def test_read_toml_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(bad)
