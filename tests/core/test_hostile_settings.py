"""Issue 35, "Settings that do nothing, silently": `compare --algorithms` merges each spec into
the config's `[algorithm]` table; `epochs` beside `steps`, momentum with Adam and an option
without a value fail in one line; absurd epochs and batch sizes are refused or clamped
before anything big is allocated."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from clusterfl.cli import main
from clusterfl.compare import comparison_configs, parse_algorithm_spec, run_comparison
from clusterfl.config import dump_toml, load_config, read_toml
from clusterfl.engine.schedule import MAX_PADDING, batch_schedule
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from tests.tiny import blobs, tiny_config


def test_compare_applies_the_config_fraction_to_every_method_that_has_one(tmp_path: Path):
    config = load_config(tiny_config(rounds=2, algorithm={"name": "fedavg", "fraction": 0.25}))
    runs = dict(comparison_configs(config, ["fedavg", "ifca:n_clusters=2", "flt",
                                            "fedavg:fraction=0.5", "ifca:per_round=3"]))
    assert runs["fedavg_fraction=0.25"].algorithm.fraction == 0.25
    assert runs["ifca_n_clusters=2_fraction=0.25"].algorithm.fraction == 0.25
    assert runs["flt_fraction=0.25"].algorithm.fraction == 0.25
    assert runs["fedavg_fraction=0.5"].algorithm.fraction == 0.5  # the spec wins
    per_round = runs["ifca_n_clusters=5_per_round=3"].algorithm  # one sampling rule: the spec's
    assert per_round.per_round == 3 and "fraction" not in per_round.model_fields_set
    # a method keeps its own default of an option the config does not write
    plain = dict(comparison_configs(load_config(tiny_config()), ["flt", "pacfl"]))
    assert plain["flt"].algorithm.fraction == 0.2 and plain["pacfl"].algorithm.fraction == 0.1
    # and the runs really sample a quarter of the 4 clients: one per round
    results = run_comparison(config, ["fedavg", "ifca:n_clusters=2"], tmp_path / "cmp",
                             progress=False)
    for _, history in results:
        assert [r.participants for r in history.records] == [1, 1]


def test_compare_help_says_specs_merge_into_the_config_algorithm_table(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "merged into the config's [algorithm] table" in text


@pytest.mark.parametrize(("spec", "message"), [
    # ran FedAvg under the spec of IFCA
    ("ifca:name=fedavg", "'name' in 'ifca:name=fedavg': the method is the part before the "
     "first ':' ('ifca'); write fedavg:... for another one"),
    # the last value won, without a word
    ("ifca:n_clusters=4:n_clusters=3", "'n_clusters' is given twice in "
     "'ifca:n_clusters=4:n_clusters=3'; give each option once"),
    # "algorithm.: unknown field"
    ("ifca:=4", "'=4' in 'ifca:=4' has no option name; write KEY=VALUE after each ':'"),
])
def test_a_method_spec_that_overrides_its_name_repeats_or_misses_an_option_is_refused(
        spec: str, message: str):
    with pytest.raises(ConfigError) as err:
        parse_algorithm_spec(spec)
    assert err.value.field == "--algorithms" and err.value.message == message
    assert parse_algorithm_spec(" ifca : n_clusters = 4 ") == {"name": "ifca", "n_clusters": 4}


def test_an_option_without_a_value_in_algorithms_fails_in_one_line(tmp_path: Path, capsys):
    with pytest.raises(ConfigError) as err:
        parse_algorithm_spec("ifca:n_clusters")
    assert err.value.field == "--algorithms" and "'n_clusters' in 'ifca:n_clusters' has no " \
        "value" in err.value.message
    assert parse_algorithm_spec("ifca:n_clusters=3") == {"name": "ifca", "n_clusters": 3}
    (tmp_path / "c.toml").write_text(dump_toml(tiny_config()))
    rc = main(["compare", str(tmp_path / "c.toml"), "--algorithms", "ifca:n_clusters",
               "--out", str(tmp_path / "out")])
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err_lines) == 1 and "n_clusters=VALUE" in err_lines[0]
    assert "import" not in err_lines[0]


def test_epochs_set_beside_steps_fails_naming_train_epochs():
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(train={"steps": 5, "epochs": 3}))
    assert err.value.field == "train.epochs" and "steps = 5 replaces epochs" in err.value.message
    # epochs left at 1 (as the demo config writes it) or 0 beside steps still loads
    for epochs in (0, 1):
        config = load_config(tiny_config(train={"steps": 5, "epochs": epochs}))
        assert load_config(config.to_dict()).train.steps == 5  # and its dump loads again


def test_momentum_with_adam_fails_naming_train_momentum():
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config(train={"optimizer": "adam", "momentum": 0.9, "steps": 2}))
    assert err.value.field == "train.momentum" and "adam" in err.value.message
    assert load_config(tiny_config(train={"optimizer": "adam", "steps": 2})).train.momentum == 0
    assert load_config(tiny_config(train={"momentum": 0.9, "steps": 2})).train.momentum == 0.9


def test_a_million_epochs_are_refused_before_the_schedule_is_allocated():
    exp = Experiment(load_config(tiny_config(train={"epochs": 1_000_000, "batch_size": 16})))
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            exp.run(progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.field == "train.epochs" and "GiB" in err.value.message
    assert peak < 50 * 2**20  # refused before the (tens of GiB) schedule was built
    most = int(err.value.message.rsplit("at most ", 1)[1])  # the largest schedule of 1 GiB
    sizes = exp.federation.train_sizes
    entries_per_epoch = len(sizes) * -(-int(sizes.max()) // 16) * 16
    assert most * entries_per_epoch * 8 <= 2**30 < (most + 1) * entries_per_epoch * 8


def test_a_batch_of_three_million_is_clamped_to_the_largest_client():
    sizes = np.array([117, 90, 117, 60])
    clients = np.arange(4)
    tracemalloc.start()
    try:
        huge = batch_schedule(sizes, clients, 3_000_000, 2, 0, seed=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20 and huge.shape == (4, 2, 117)
    assert np.array_equal(huge, batch_schedule(sizes, clients, 117, 2, 0, seed=5))
    # a batch a little larger than every client is kept as written (its results unchanged)
    assert batch_schedule(sizes, clients, 200, 2, 0, seed=5).shape == (4, 2, 200)
    assert MAX_PADDING > (200 - 117) * 4


def test_a_run_with_a_batch_of_three_million_equals_one_with_the_largest_client(tmp_path):
    histories = []
    for batch in (3_000_000, None):
        config = load_config(tiny_config(rounds=2, train={"epochs": 1, "batch_size": 16}))
        exp = Experiment(config)
        largest = int(exp.federation.train_sizes.max())
        raw = tiny_config(rounds=2, train={"epochs": 1, "batch_size": batch or largest})
        histories.append(Experiment(load_config(raw)).run(progress=False))
    a, b = histories
    assert [r.metrics.accuracy for r in a.records] == [r.metrics.accuracy for r in b.records]
    assert a.records[-1].extras == b.records[-1].extras


@pytest.mark.parametrize(("algorithm", "words"), [
    # each ran with the option doing nothing, exit 0 and no word said (issue 35)
    ({"name": "cfl", "split_rule": "epsilon", "auto": {"patience": 5}},
     "algorithm.auto.patience = 5 does nothing: split_rule = 'epsilon'"),
    ({"name": "cfl", "eps1": 0.2, "auto": {"significance": 0.01}},  # eps1 selects epsilon
     "algorithm.auto.significance = 0.01 does nothing: split_rule = 'epsilon'"),
    ({"name": "flhc", "n_clusters": 2, "significance": 0.01, "warmup_rounds": 1},
     "algorithm.significance = 0.01 does nothing: algorithm.n_clusters = 2 fixes the cut"),
    ({"name": "flhc", "threshold": 2.0, "min_silhouette": 0.5, "warmup_rounds": 1},
     "algorithm.min_silhouette = 0.5 does nothing: algorithm.threshold = 2.0 fixes the cut"),
    ({"name": "pacfl", "threshold": 10.0, "auto_cut": "gap"},
     "algorithm.auto_cut = 'gap' does nothing: algorithm.threshold = 10.0 fixes the cut"),
    ({"name": "pacfl", "n_clusters": 2, "max_clusters": 5},
     "algorithm.max_clusters = 5 does nothing: algorithm.n_clusters = 2 fixes the cut"),
])
def test_an_option_of_the_rule_not_in_use_is_a_warning_on_the_console_and_in_the_report(
        tmp_path: Path, capsys, algorithm, words):
    """Not an error: run folders written with such a table (FL+HC given K under grid v4, with
    that version's significance = 0.01) must load again to be placed or resumed."""
    from clusterfl.records import read_summary
    from clusterfl.report import write_run_report

    config = load_config(tiny_config(rounds=2, algorithm=algorithm))
    out = tmp_path / "run"
    Experiment(config, out_dir=out).run(progress=False)
    console = [ln for ln in capsys.readouterr().err.splitlines() if "does nothing" in ln]
    assert len(console) == 1 and console[0].startswith(f"clusterfl: warning: {words}")
    summary = read_summary(out)
    assert summary.warnings is not None and summary.warnings[0].startswith(words)
    write_run_report(out)
    assert words in (out / "report.md").read_text()
    again = load_config(read_toml(out / "config.toml"))  # the run's config loads again
    assert again.algorithm.ignored_settings() == config.algorithm.ignored_settings()


@pytest.mark.parametrize("algorithm", [
    {"name": "cfl", "split_rule": "epsilon", "eps1": 0.2},
    {"name": "cfl", "auto": {"patience": 5}},
    {"name": "flhc", "n_clusters": 3},
    {"name": "flhc", "significance": 0.01, "min_silhouette": 0.3},
    {"name": "pacfl", "threshold": 3.5},
    {"name": "pacfl", "n_clusters": 2},
])
def test_the_options_of_the_rule_in_use_give_no_warning(algorithm):
    assert load_config(tiny_config(algorithm=algorithm)).algorithm.ignored_settings() == []


def test_from_config_takes_one_override_as_a_string_and_names_a_wrong_source():
    """`overrides="rounds=3"` was read character by character ("--set: expected key=value,
    got 'r'"); a list as the source ended in os.fspath's TypeError."""
    one = Experiment.from_config(tiny_config(rounds=2), overrides="rounds=3")
    assert one.config.run.rounds == 3
    assert Experiment.from_config(tiny_config(rounds=2), overrides=["rounds=3"]).config.run \
        .rounds == 3
    with pytest.raises(ConfigError, match="source: got list: give a TOML file's path or a "
                                          "dict of tables"):
        Experiment.from_config(["rounds", 2])  # type: ignore[arg-type]


def test_a_seed_beyond_64_bits_is_one_line_naming_seed(tmp_path: Path, capsys):
    """`--set seed=99999999999999999999` ended in torch's "Overflow when unpacking long long"
    traceback; `compare --seeds` and a sweep's seeds ran until the first such run."""
    from clusterfl.config_util import MAX_SEED
    from clusterfl.sweep import load_sweep

    assert load_config(tiny_config(seed=MAX_SEED)).run.seed == MAX_SEED  # the largest is fine
    (tmp_path / "c.toml").write_text(dump_toml(tiny_config()))
    rc = main(["run", str(tmp_path / "c.toml"), "--set", f"seed={MAX_SEED + 1}",
               "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("clusterfl: error: seed: ")
    assert not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(tmp_path / "c.toml"), "--algorithms", "fedavg", "--seeds",
              f"0,{MAX_SEED + 1}", "--out", str(tmp_path / "s")])
    assert stop.value.code == 2 and "0..2**63-1" in capsys.readouterr().err
    (tmp_path / "sweep.toml").write_text(f'[sweep]\nconfig = "c.toml"\nmethods = ["fedavg"]\n'
                                         f'seeds = [0, {MAX_SEED}1]\n')
    with pytest.raises(ConfigError, match=r"0\.\.2\*\*63-1") as err:  # tomllib reads any int
        load_sweep(tmp_path / "sweep.toml")
    assert err.value.field == "sweep.seeds"
    with pytest.raises(ConfigError, match=r"algorithm\.encoder_seed"):
        load_config(tiny_config(algorithm={"name": "flt", "encoder_seed": MAX_SEED + 1}))


def test_compare_checks_every_method_before_the_first_run(tmp_path: Path, monkeypatch):
    """FLT whose pretraining dataset cannot be read, listed after three other methods, failed
    only after their runs (tens of seconds, or hours on a real federation)."""
    from clusterfl import encoders

    monkeypatch.setenv("CLUSTERFL_DATA", str(tmp_path / "nodata"))
    pretrained: list[str] = []
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pretrained.append("yes"))
    config = load_config(tiny_config(rounds=2))
    with pytest.raises(ConfigError, match="'fashion_mnist', the dataset the encoder is "
                                          "pretrained on, cannot be read") as err:
        run_comparison(config, ["fedavg", "ifca:n_clusters=2", "cfl", "flt"], tmp_path / "cmp",
                       progress=False)
    assert err.value.field == "algorithm.encoder" and pretrained == []
    assert not any((tmp_path / "cmp").glob("*/history.jsonl"))  # no method ran
    # an encoder that can be made without data (`none`) passes the check and runs
    results = run_comparison(config, ["fedavg", "flt:encoder=none"], tmp_path / "ok",
                             progress=False)
    assert [len(h.records) for _, h in results] == [2, 2]


def test_cfl_settings_that_can_never_split_are_refused_before_the_run(tmp_path: Path):
    """A warm-up as long as the run, or a min_split_size above the federation's clients, ran
    to the end as FedAvg under CFL's name, exit 0."""
    with pytest.raises(ConfigError, match=r"5 warm-up rounds leave no round to cluster in a "
                                          r"run of 3 rounds .*allowed: 0..2") as err:
        Experiment(load_config(tiny_config(rounds=3, algorithm={"name": "cfl",
                                                                "warmup_rounds": 5})))
    assert err.value.field == "algorithm.warmup_rounds"
    with pytest.raises(ConfigError, match=r"no cluster of the 4 clients could split; allowed: "
                                          r"2\.\.4") as err:
        Experiment(load_config(tiny_config(algorithm={"name": "cfl", "min_split_size": 5})))
    assert err.value.field == "algorithm.min_split_size"
    Experiment(load_config(tiny_config(rounds=3, algorithm={"name": "cfl", "warmup_rounds": 2,
                                                            "min_split_size": 4})))


@pytest.mark.parametrize("algorithm, answering, need", [
    ({"name": "cfl", "per_round": 3}, 3, 4),  # the auto rule: 2 · min_side
    ({"name": "cfl", "fraction": 0.05}, 1, 4),
    ({"name": "cfl", "fraction": 0.1, "auto": {"min_side": 3}}, 2, 6),
    ({"name": "cfl", "fraction": 0.05, "split_rule": "epsilon"}, 1, 2),
])
def test_cfl_sampling_too_few_clients_to_ever_split_is_a_warning(tmp_path: Path, capsys,
                                                                 algorithm, answering, need):
    from clusterfl.records import read_summary

    config = load_config(tiny_config(rounds=2, n_clients=20, algorithm=algorithm))
    out = tmp_path / "run"
    history = Experiment(config, out_dir=out).run(progress=False)
    words = (f"{answering} of 20 clients answer a round, and a cluster splits only when at "
             f"least {need} of its clients answer in the same round: the run will never split")
    assert words in capsys.readouterr().err
    assert any(words in w for w in read_summary(out).warnings or [])
    assert all(r.participants == answering for r in history.records)


@pytest.mark.parametrize("algorithm", [
    {"name": "cfl", "per_round": 8}, {"name": "cfl", "fraction": 0.1, "split_rule": "epsilon"},
    {"name": "cfl"},
])
def test_cfl_sampling_enough_clients_gives_no_warning(algorithm):
    # per_round = 8, not 4: 4 clients a round are enough sides for min_side 2 but never pass
    # the shuffle test (exact p ≥ 0.2), which is a warning of its own
    # rounds = 3: the auto rule's earliest split (patience 3)
    exp = Experiment(load_config(tiny_config(n_clients=20, rounds=3, algorithm=algorithm)))
    assert exp.method_warnings == []


@pytest.mark.parametrize(("algorithm", "rounds", "first"), [
    ({"name": "cfl"}, 2, 3), ({"name": "cfl", "warmup_rounds": 2}, 4, 5),
    ({"name": "cfl", "auto": {"patience": 5}}, 4, 5)])
def test_a_cfl_run_too_short_for_the_auto_rule_to_split_is_a_warning(algorithm, rounds, first):
    """Before: a run of fewer rounds than the warm-up and the patience ran as FedAvg, without
    a word (the auto rule splits after `patience` consecutive rounds)."""
    exp = Experiment(load_config(tiny_config(n_clients=8, rounds=rounds, algorithm=algorithm)))
    [line] = exp.method_warnings
    assert line.startswith(f"rounds = {rounds}: the auto rule splits a cluster after "
                           "algorithm.auto.patience = ")
    assert line.endswith(f"the run will never split (it is FedAvg); allowed: rounds >= {first}")
    longer = tiny_config(n_clients=8, rounds=first, algorithm=algorithm)
    assert Experiment(load_config(longer)).method_warnings == []
    epsilon = tiny_config(n_clients=8, rounds=rounds, algorithm={**algorithm, "auto": {},
                                                                    "split_rule": "epsilon"})
    assert Experiment(load_config(epsilon)).method_warnings == []  # its test needs no streak


@pytest.mark.parametrize("name", ["fedavg", "ifca", "flhc"])
def test_per_round_above_the_federation_is_a_warning(name):
    """`per_round = 50` with 20 clients ran with every client, without a word."""
    algorithm = {"name": name, "per_round": 50, **({"n_clusters": 2} if name == "ifca" else {}),
                 **({"warmup_rounds": 1} if name == "flhc" else {})}  # a run of 2 rounds
    exp = Experiment(load_config(tiny_config(n_clients=20, algorithm=algorithm)))
    assert exp.method_warnings == ["algorithm.per_round = 50 is more than the 20 clients that "
                                   "train: every client is asked every round (as with 20)"]
    algorithm["per_round"] = 20
    assert Experiment(load_config(tiny_config(n_clients=20, algorithm=algorithm))
                      ).method_warnings == []


@pytest.mark.parametrize("key, value, field", [
    ("rounds", True, "rounds"),  # ran one round
    ("train", {"lr": True}, "train.lr"),  # trained at lr 1.0
    ("model", {"name": "mlp", "hidden": [True]}, "model.hidden"),  # a layer of width 1
    ("algorithm", {"name": "ifca", "n_clusters": True}, "algorithm.n_clusters"),
    ("algorithm", {"name": "cfl", "auto": {"patience": True}}, "algorithm.auto.patience"),
    ("scenario", {"name": "rotation", "n_clients": 4, "angles": [0, True]}, "scenario.angles"),
    ("faults", {"dropout": False}, "faults.dropout"),
    ("backend", {"name": "sequential", "device": "cpu", "precision": "fp32"}, None),
])
def test_true_or_false_where_a_number_is_expected_is_refused(key, value, field):
    """pydantic reads true as 1 and false as 0: `rounds = true` ran one round, exit 0."""
    config = tiny_config(**{key: value})
    if field is None:  # no number given a boolean: loads
        load_config(config)
        return
    with pytest.raises(ConfigError,
                       match=r"expected a (number|list of numbers), not true/false") as err:
        load_config(config)
    assert err.value.field == field


def test_true_and_false_still_set_the_switches():
    config = load_config(tiny_config(output={"figures": True, "progress": "off"},
                                     algorithm={"name": "cfl", "privacy": True}))
    assert config.output.figures is True and config.algorithm.privacy is True


@pytest.mark.parametrize("key, value, field", [
    ("algorithm", {"name": "cfl", "auto": {"nesting": "yes"}}, "algorithm.auto.nesting"),
    ("algorithm", {"name": "cfl", "nesting": "yes"}, "algorithm.auto.nesting"),  # flat (older)
    ("algorithm", {"name": "cfl", "privacy": "no"}, "algorithm.privacy"),  # ran with privacy
    ("algorithm", {"name": "cfl", "auto": {"test_every": "off"}}, "algorithm.auto.test_every"),
    ("output", {"figures": "false", "progress": "off"}, "output.figures"),
    ("data", {"source": "digits", "verify": "no"}, "data.verify"),  # a `bool | None` field
])
def test_text_where_true_or_false_is_expected_is_refused(key, value, field):
    """pydantic reads "yes", "on", "1" as true and "no", "off", "0" as false: `nesting =
    "yes"` (or `--set algorithm.auto.nesting=yes`, which TOML leaves as text) ran with
    nesting on, without a word."""
    with pytest.raises(ConfigError, match=r"expected true or false, not text \(got '") as err:
        load_config(tiny_config(**{key: value}))
    assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.parametrize("config, words", [
    (tiny_config(model={"name": "lstm", "hidden": 8}),  # ValueError traceback
     "'lstm' is a language model (next-token logits of token ids [N, T]); this federation's "
     "task is 'classification'"),
    (tiny_config(model={"name": "cfl_cnn"}), "'cfl_cnn': images of 8x8 are too small"),
    (tiny_config(model={"name": "conv_ae"}), "'conv_ae' is FLT's autoencoder"),  # traceback
    ({**tiny_config(model={"name": "mlp", "hidden": [8]}), "data": {"source":  # dtype
      "synthetic_topics"}, "scenario": {"name": "topics", "n_clients": 8, "seq_len": 6,
                                        "vocab_size": 20}},
     "'mlp' reads real-valued inputs; task 'language_model' has token ids: use 'lstm'"),
])
def test_a_model_that_cannot_take_the_federation_is_one_line_naming_model_name(config, words):
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(config))
    assert err.value.field == "model.name" and words in err.value.message
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model, words", [
    ("lenet", "a convolutional model reads images (channels, height, width); the data has "
              "inputs (4,): use 'mlp' or 'linear'"),
    ("cfl_cnn", "a convolutional model reads images"),  # "not enough values to unpack"
    ("leaf_cnn", "a convolutional model reads images"),
    ("resnet18", "a convolutional model reads images"),  # "cannot be trained by the
    # simulation backend (...); use [backend] name = "sequential"" after setup
    ("lstm", "'lstm' is a language model (next-token logits of token ids [N, T]); this "
             "federation's task is 'classification'"),  # the same misleading backend line
])
def test_an_image_or_language_model_on_flat_features_is_one_line_naming_model_name(
        model, words):
    """Clients of 4 features each (`Federation.from_clients`) under `lenet`, `cfl_cnn`,
    `leaf_cnn` ended in "not enough values to unpack (expected 3, got 1)"; under `resnet18`
    and `lstm` the run started and stopped saying the simulation backend could not train
    the model and to use the sequential backend, which fails the same way."""
    config = {k: v for k, v in tiny_config(model={"name": model}).items()
              if k not in ("data", "scenario")}
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(config), federation=blobs(4))
    assert err.value.field == "model.name" and words in err.value.message
    assert "\n" not in str(err.value)


def test_a_config_option_none_of_the_compared_methods_has_is_a_warning(tmp_path: Path,
                                                                      capsys):
    """`n_clusters = 2` in the config's [algorithm] table, compared as fedavg and cfl: left
    out of every run without a word."""
    from clusterfl.compare import unused_options

    raw = tiny_config(rounds=1, algorithm={"name": "ifca", "n_clusters": 2, "fraction": 0.5})
    config = load_config(raw)
    words = ("algorithm.n_clusters in the config is an option of none of the compared methods "
             "(fedavg, cfl): no run uses it")
    assert unused_options(config, ["fedavg", "cfl"]) == [words]
    assert unused_options(config, ["ifca", "ifca_cam"]) == []  # both have it
    (tmp_path / "c.toml").write_text(dump_toml(raw))
    assert main(["compare", str(tmp_path / "c.toml"), "--algorithms", "fedavg,cfl", "--out",
                 str(tmp_path / "o"), "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines().count(f"clusterfl: warning: {words}") == 1
    assert f"> **Warning:** {words}\n" in (tmp_path / "o" / "report.md").read_text()
    assert main(["compare", str(tmp_path / "c.toml"), "--algorithms", "fedavg,cfl", "--seeds",
                 "0", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines().count(f"clusterfl: warning: {words}") == 1
    assert f"> **Warning:** {words}\n" in (tmp_path / "s" / "report.md").read_text()


def test_a_config_option_none_of_the_compared_methods_has_reaches_the_python_api(
        tmp_path: Path, capsys):
    """Before: only the CLI printed it; `run_comparison` said nothing (console, report.md,
    its result) of the `n_clusters` it left out of every run."""
    raw = tiny_config(rounds=1, algorithm={"name": "ifca", "n_clusters": 2})
    words = ("algorithm.n_clusters in the config is an option of none of the compared methods "
             "(fedavg, fedprox): no run uses it")
    result = run_comparison(load_config(raw), ["fedavg", "fedprox"], tmp_path / "o",
                            progress=False)
    assert result.warnings == [words] and [label for label, _ in result] == [
        "FedAvg", "FedProx"]
    assert capsys.readouterr().err.splitlines().count(f"clusterfl: warning: {words}") == 1
    report = (tmp_path / "o" / "report.md").read_text()
    assert report.count(words) == 1 and f"> **Warning:** {words}\n" in report
    result = run_comparison(load_config(raw), ["ifca", "ifca_cam:warmup_rounds=0"],
                            tmp_path / "b", progress=False)
    assert result.warnings == [] and "n_clusters in the config" not in (
        tmp_path / "b" / "report.md").read_text()


def test_a_config_option_only_some_compared_methods_have_names_the_others(tmp_path: Path,
                                                                         capsys):
    """Before: `mu = 0.5` in the config's [algorithm] table, compared as fedprox, fedavg,
    fedsoft, local, ran FedProx and FedSoft with mu 0.5 and FedAvg and Local without it, without
    a word (and a spec's own value replacing it in every method that has it left it unused,
    silently). Now one warning per option names the methods that run without it."""
    from clusterfl.compare import unused_options

    config = load_config(tiny_config(rounds=1, algorithm={"name": "fedprox", "mu": 0.5,
                                                          "fraction": 0.5}))
    assert unused_options(config, ["fedprox", "fedavg", "fedsoft", "local"]) == [
        "algorithm.mu in the config applies to fedprox, fedsoft only: fedavg, local have no "
        "option 'mu' and run without it"]
    assert unused_options(config, ["fedprox", "ifca:n_clusters=2"]) == [
        "algorithm.mu in the config applies to fedprox only: ifca has no option 'mu' and "
        "runs without it"]
    assert unused_options(config, ["fedprox:per_round=2", "fedavg:fraction=1.0"]) == [
        "algorithm.fraction in the config is replaced in every compared method that has it "
        "(by its spec: fedprox:per_round=2, fedavg:fraction=1.0): no run uses it",
        "algorithm.mu in the config applies to fedprox only: fedavg has no option 'mu' and "
        "runs without it"]
    assert unused_options(config, ["fedprox:mu=0.1", "fedsoft:mu=1", "fedavg"]) == [
        "algorithm.mu in the config is replaced in every compared method that has it (by its "
        "spec: fedprox:mu=0.1, fedsoft:mu=1): no run uses it"]
    assert unused_options(config, ["fedprox", "fedsoft"], swept=["mu"]) == [
        "algorithm.mu in the config is replaced in every compared method that has it (by its "
        "spec or the sweep's grid: fedprox, fedsoft): no run uses it"]
    raw = tiny_config(rounds=1, algorithm={"name": "fedprox", "mu": 0.5})
    (tmp_path / "c.toml").write_text(dump_toml(raw))
    assert main(["compare", str(tmp_path / "c.toml"), "--algorithms", "fedprox,fedavg",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 0
    words = ("algorithm.mu in the config applies to fedprox only: fedavg has no option 'mu' "
             "and runs without it")
    assert capsys.readouterr().err.splitlines().count(f"clusterfl: warning: {words}") == 1
    assert f"> **Warning:** {words}\n" in (tmp_path / "o" / "report.md").read_text()


def test_eval_clients_above_the_federation_is_a_warning_in_the_summary(tmp_path, capsys):
    """`eval_clients = 1000` with 4 clients evaluated every client, without a word."""
    from clusterfl.records import read_summary

    cfg = tiny_config(rounds=2, n_clients=4, eval_clients=1000)
    Experiment(load_config(cfg), tmp_path).run(progress=False)
    line = ("eval_clients = 1000 is more than the 4 clients that train: every client is "
            "evaluated (as without eval_clients)")
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err.splitlines()
    assert line in read_summary(tmp_path).warnings
    other = tmp_path.parent / f"{tmp_path.name}_b"  # beside the run's folder, not inside it
    Experiment(load_config({**cfg, "eval_clients": 3}), other).run(progress=False)
    assert not any("eval_clients" in w for w in read_summary(other).warnings or [])


@pytest.mark.parametrize(("eval_clients", "how"), [
    (4, "is all of the 4 clients that train"),
    (1.0, "of the 4 clients that train is 4, all of them"),
    (0.9, "of the 4 clients that train is 4, all of them"),  # round(3.6)
])
def test_eval_clients_asking_for_every_client_is_a_warning(eval_clients, how):
    """`eval_clients = 4` of 4 clients (or a fraction rounding to all of them) evaluated every
    client, as without it, without a word; only a number above 4 was said."""
    config = load_config(tiny_config(rounds=4, n_clients=4, eval_clients=eval_clients))
    assert Experiment(config)._data_warnings() == [
        f"eval_clients = {eval_clients} {how}: every client is evaluated (as without "
        "eval_clients)"]
    assert config.run.eval_count(4) is None and config.run.eval_count(5) == (
        None if eval_clients == 1.0 else 4)  # of 5 clients: 4, round(4.5) = 4, or all


@pytest.mark.parametrize(("rounds", "eval_every", "warned"), [(1, 1, True), (4, 10, True),
                                                              (4, 4, True), (4, 2, False)])
def test_eval_clients_with_only_the_last_round_evaluated_is_a_warning(rounds, eval_every,
                                                                      warned):
    """The last round is always evaluated on every client: with no other round on the
    eval_every grid, eval_clients changed nothing, without a word."""
    cfg = tiny_config(rounds=rounds, n_clients=4, eval_clients=2, eval_every=eval_every)
    lines = Experiment(load_config(cfg))._data_warnings()
    assert any(x.startswith("eval_clients = 2 does nothing here: the only round evaluated is "
                            f"the last (eval_every = {eval_every}, rounds = {rounds})")
               for x in lines) == warned


@pytest.mark.parametrize("work", [{"steps": 2}, {"epochs": 2, "steps": 0}])
def test_a_batch_larger_than_every_client_is_a_warning_and_trains_as_the_largest(
        tmp_path: Path, capsys, work):
    """`batch_size = 10000` with clients of at most a few hundred samples ran full-batch
    steps without a word: the number held for no client."""
    import torch

    from clusterfl.records import read_summary

    def run(batch: int, out: Path) -> Experiment:
        cfg = tiny_config(train={"lr": 0.1, "batch_size": batch, **work})
        exp = Experiment(load_config(cfg), out)
        exp.run(progress=False)
        return exp

    big = run(10_000, tmp_path / "big")
    largest = int(big.federation.train_sizes.max())
    assert 100 < largest < 10_000
    line = (f"train.batch_size = 10000 is more than any client's training samples (at most "
            f"{largest}): every local step takes all of a client's samples (full-batch steps, "
            f"as batch_size = {largest})")
    assert f"clusterfl: warning: {line}" in capsys.readouterr().err.splitlines()
    assert line in read_summary(tmp_path / "big").warnings
    same = run(largest, tmp_path / "same")  # what the warning says it trains as
    assert not any("batch_size" in w for w in read_summary(tmp_path / "same").warnings or [])
    assert torch.allclose(big.algorithm.state.model, same.algorithm.state.model, atol=1e-6)
    assert not torch.equal(big.algorithm.state.model,
                           run(largest - 1, tmp_path / "less").algorithm.state.model)


def test_tf32_on_the_cpu_is_a_warning():
    """`backend.precision = "tf32"` on the CPU computed in float32 without a word."""
    def warnings(precision):
        backend = {"name": "simulation", "device": "cpu", "precision": precision}
        return Experiment(load_config(tiny_config(backend=backend))).method_warnings

    assert warnings("tf32") == ["backend.precision = 'tf32' does nothing on the CPU (TF32 is a "
                                "CUDA tensor-core format): the run computes in float32, as "
                                "with 'fp32'"]
    assert warnings("fp32") == [] and warnings("bf16-mixed") == []


def _backend_warnings(backend):
    return Experiment(load_config(tiny_config(backend=backend))).method_warnings


@pytest.mark.parametrize(("name", "why"), [
    # accepted (a config may switch backends) and did nothing, without a word
    ("sequential", "it computes one client at a time"),
    # the same, and "auto", the in-process backends' default, was refused as not an integer
    ("flower", "each node computes its own client with its own engine"),
])
def test_chunk_size_with_a_backend_that_does_not_read_it_is_a_warning(name, why):
    assert _backend_warnings({"name": name, "chunk_size": 8}) == [
        f"backend.chunk_size = 8 does nothing with the {name} backend ({why}); it sets the "
        "simulation backend's batch of clients"]
    assert _backend_warnings({"name": name}) == []
    assert _backend_warnings({"name": name, "chunk_size": "auto"}) == []
    assert _backend_warnings({"name": "simulation", "chunk_size": 8}) == []


def test_the_chunk_size_a_run_writes_back_gives_no_warning(tmp_path):
    """The value every run writes back gives no warning: none for the sequential backend,
    the flower backend's 64."""
    from clusterfl.config import dump_toml, read_toml

    written = load_config(tiny_config(backend={"name": "sequential"})).to_dict()
    (tmp_path / "c.toml").write_text(dump_toml(written))
    assert Experiment(load_config(read_toml(tmp_path / "c.toml"))).method_warnings == []
    # the default is "auto" for both in-process backends: the one `config show` prints loads
    # on both (sequential refused it as not an integer), and no run writes a chunk_size of 64
    # it was never given
    assert "chunk_size" not in written["backend"]
    assert _backend_warnings({"name": "sequential", "chunk_size": 64})[0].startswith(
        "backend.chunk_size = 64 does nothing with the sequential backend")
    flower = load_config(tiny_config(backend={"name": "flower", "chunk_size": "auto"}))
    assert flower.to_dict()["backend"]["chunk_size"] == 64


def test_a_model_larger_than_the_machine_is_refused_before_it_is_allocated(monkeypatch):
    """`model.hidden = [100000, 100000]` asked torch's allocator for 40 GB and ended in its
    traceback. The model is counted on the meta device first and refused when one float32
    copy exceeds the machine's memory (here made small)."""
    import clusterfl.models as models

    cfg = tiny_config(model={"name": "mlp", "hidden": [300, 200]})
    d = Experiment.from_config(cfg).factory.size
    monkeypatch.setattr(models, "physical_memory_bytes", lambda: 4 * d - 1)
    with pytest.raises(ConfigError, match=rf"^model: 'mlp' with these settings has {d:,} "
                                          r"parameters, .* GiB as float32, more than this "
                                          r"machine's .* GiB of memory"):
        Experiment.from_config(cfg)
    monkeypatch.setattr(models, "physical_memory_bytes", lambda: 4 * d)
    assert Experiment.from_config(cfg).factory.size == d
    monkeypatch.setattr(models, "physical_memory_bytes", lambda: None)  # the system won't say
    assert Experiment.from_config(cfg).factory.size == d


@pytest.mark.parametrize(("error", "said"), [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                  "allocate memory: you tried to allocate 32121600800 bytes. Error code 12"),
     "out of memory: 29.9 GiB could not be allocated in memory; "),
    (type("OutOfMemoryError", (RuntimeError,), {})(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"),
     "out of memory: 2.00 GiB could not be allocated on the GPU; "),
    (MemoryError(), "out of memory: an array could not be allocated in memory; "),
])
def test_running_out_of_memory_is_one_line_naming_what_needs_less(tmp_path, monkeypatch, capsys,
                                                                  error, said):
    """The engine's `[clients, d]` buffer of a 400M-parameter model (hidden [20000, 20000]) on
    20 clients ended in torch's allocator traceback; any allocation that fails is now one
    line with the size and the settings that need less memory."""
    config = tmp_path / "c.toml"
    config.write_text(dump_toml(tiny_config()))

    def fail(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(Experiment, "run", fail)
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {said}a run needs less")
    assert "backend.chunk_size" in err[0]
    monkeypatch.setattr(Experiment, "run", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("an engine bug")))
    with pytest.raises(RuntimeError, match="an engine bug"):  # other errors stay as they are
        main(["run", str(config), "--out", str(tmp_path / "run2")])


@pytest.mark.parametrize("auto", [{"significance_sampled": 0.05},
                                  {"sampled_evidence": "each"}])
def test_cfl_sampled_round_options_in_a_run_that_never_samples_are_a_warning(auto):
    """`algorithm.auto.significance_sampled` and `sampled_evidence` act only in a round in
    which some of a cluster's clients did not answer; set in a run of full participation
    without [faults] they did nothing, without a word (CFL's config cannot see [faults])."""
    (option, value), = auto.items()
    config = tiny_config(n_clients=8, rounds=3, algorithm={"name": "cfl", "auto": auto})
    assert Experiment(load_config(config)).method_warnings == [
        f"algorithm.auto.{option} = {value!r} does nothing here: it applies in a round in "
        "which some of the clients asked do not answer, and this run asks all 8 clients every "
        "round (algorithm.fraction = 1) with no [faults] dropout, drop_clients or stragglers "
        "that miss the deadline (straggler_work = 0); only a reply that [validation] rejects "
        "would make such a round"]
    late = {"stragglers": 0.2}  # stragglers that finish half their steps still answer
    assert len(Experiment(load_config({**config, "faults": late})).method_warnings) == 1
    for faults in ({"dropout": 0.1}, {"drop_clients": [3], "drop_rounds": [2]},
                   {"stragglers": 0.2, "straggler_work": 0.0}):
        assert Experiment(load_config({**config, "faults": faults})).method_warnings == []
    sampled = {**config, "algorithm": {"name": "cfl", "auto": auto, "per_round": 7}}
    assert Experiment(load_config(sampled)).method_warnings == []
    off = {**config, "algorithm": {"name": "cfl", "auto": {**auto, "significance": 0}}}
    assert Experiment(load_config(off)).method_warnings == []  # ignored_settings says it


def test_fedsoft_per_cluster_not_below_the_clients_of_a_round_is_a_warning():
    """With `per_cluster` at least the round's sample nobody is left out, so FedSoft ran
    without its selection (the v-weighted means) every round, without a word."""
    def said(**algorithm):
        config = tiny_config(n_clients=8, algorithm={"name": "fedsoft", **algorithm})
        return Experiment(load_config(config)).method_warnings

    assert said(per_cluster=8) == [
        "algorithm.per_cluster = 8 does nothing: it is not below the 8 clients a round asks "
        "(algorithm.fraction = 1), so no client would be left out and every round aggregates "
        "without selection (c_s = the v-weighted mean of the answering clients' models), as "
        "with per_cluster unset; allowed: per_cluster below 8, or a smaller fraction / "
        "per_round"]
    [line] = said(per_cluster=4, fraction=0.5)
    assert line.startswith("algorithm.per_cluster = 4 does nothing: it is not below the 4 "
                           "clients a round asks (algorithm.fraction = 0.5)")
    assert said(per_cluster=7) == [] and said(per_cluster=3, per_round=4) == [] and said() == []


def test_cfl_gp_k_max_of_the_clients_or_more_is_a_warning():
    """The Appendix-G estimate tries at most one fewer clusters than the clients it profiled:
    a `k_max` of 8 with 8 clients tried 7, without a word."""
    def said(**algorithm):
        config = tiny_config(n_clients=8, algorithm={"name": "cfl_gp", "n_clusters": 2,
                                                     **algorithm})
        return Experiment(load_config(config)).method_warnings

    assert said(k_max=8) == ["algorithm.k_max = 8: the estimate of the number of clusters "
                             "tries at most 7 (one fewer than the 8 clients), not 8"]
    assert said(k_max=7) == [] and said(k_max=8, estimate_k=False) == []
    assert said() == []  # the default (10) is not the user's choice: not named
