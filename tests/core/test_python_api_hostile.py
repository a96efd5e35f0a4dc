"""Issue 35, the Python API round (the library user's hostile inputs): each case is named
after what a user wrote; before this round each one either ended in a deep traceback of
numpy, torch or pathlib, or ran on and recorded something else than what trained."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from clusterfl.algorithms import Ask
from clusterfl.algorithms.fedavg import FedAvg
from clusterfl.config import load_config
from clusterfl.data import make_federation
from clusterfl.data.federation import Federation
from clusterfl.errors import ClusterFLError, ConfigError, DataError
from clusterfl.experiment import Experiment, History, build_backend
from clusterfl.plugins import OwnCodeError
from clusterfl.tracking import CallbackError

HERE = "tests.core.test_python_api_hostile"
DIGITS = {"rounds": 2, "data": {"source": "digits"},
          "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
          "model": {"name": "mlp", "hidden": [8]}, "train": {"lr": 0.1},
          "algorithm": {"name": "fedavg"}, "output": {"figures": False, "progress": "off"}}
NO_DATA = {k: v for k, v in DIGITS.items() if k not in ("data", "scenario")}


def _clients(n: int = 6, d: int = 5) -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        x = rng.normal(size=(40, d)).astype(np.float32)
        y = ((x[:, 0] > 0) ^ (i % 2 == 1)).astype(np.int64)
        out.append((x[:30], y[:30], x[30:], y[30:]))
    return out


# ------------------------------------------------------------------ Experiment's arguments
@pytest.mark.parametrize(("make", "field"), [
    (lambda: Experiment(DIGITS), "config"),  # a dict where a Config belongs
    (lambda: Experiment.from_config(NO_DATA, federation=_clients()), "federation"),
    (lambda: Experiment.from_config(DIGITS, out_dir=5), "out_dir"),
    (lambda: Experiment.from_config(DIGITS, overwrite="no"), "overwrite"),  # truthy text
    (lambda: Experiment.from_config(DIGITS, callbacks=object()), "callbacks"),
    (lambda: Experiment.from_config(DIGITS, overrides=5), "overrides"),
    (lambda: Experiment.from_config(DIGITS).run(resume="yes"), "resume"),
    (lambda: Experiment.from_config(3), "source"),  # was a TypeError, unlike the others
    (lambda: History().series("acc"), "key"),  # was a KeyError (its message in quotes)
])
def test_an_argument_of_the_wrong_kind_is_one_line_naming_it(make: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.field == field and "\n" not in str(err.value)


def test_metric_series_of_an_unknown_metric_is_history_series_one_line() -> None:
    """`report.metric_series(history, "acc")` raised a bare KeyError (its message in quotes)
    where `History.series("acc")` gives a ConfigError; now the same line, naming `name`."""
    from clusterfl.report import metric_series

    with pytest.raises(ConfigError) as err:
        metric_series([], "acc")
    with pytest.raises(ConfigError) as series:
        History().series("acc")
    assert err.value.field == "name" and err.value.message == series.value.message
    assert str(err.value) == ("name: 'acc' is not a round metric; allowed: accuracy, "
                              "accuracy_weighted, macro_f1, fairness_var, loss, mse, "
                              "perplexity, accuracy_no_oov_no_eos")


def test_a_config_field_set_in_python_is_checked_as_if_loaded() -> None:
    """pydantic does not check assignments: `config.run.rounds = -1` reached the method's
    check ("allowed: 0..-2"), `n_clusters = "x"` a bare TypeError of `>` deep in ifca."""
    config = load_config({**DIGITS, "algorithm": {"name": "ifca", "n_clusters": 2}})
    config.algorithm.n_clusters = "x"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="valid integer") as err:
        Experiment(config)
    assert err.value.field == "algorithm.n_clusters"
    config = load_config(DIGITS)
    config.run.rounds = -1
    with pytest.raises(ConfigError, match="greater than or equal to 1") as err:
        Experiment(config)
    assert err.value.field == "rounds"


def test_a_config_changed_after_the_experiment_was_built_is_refused_naming_the_field() -> None:
    """`rounds` set on the config after `Experiment(config)` ran the new number of rounds
    with the method and its checks built for the old one (and `model.hidden` kept the old
    model): half of the change applied, without a word."""
    config = load_config(DIGITS)
    exp = Experiment(config)
    first = exp.run(progress=False)
    assert exp.run(progress=False).series("loss") == first.series("loss")  # unchanged: runs
    config.run.rounds = 3
    with pytest.raises(ConfigError, match=r"^config: rounds changed after the Experiment was "
                                          "built.*build a new Experiment") as err:
        exp.run(progress=False)
    assert "\n" not in str(err.value)
    assert len(Experiment(config).run(progress=False).records) == 3  # a new one takes it
    exp = Experiment(load_config(DIGITS))
    exp.config.model.hidden = [4, 4]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"^config: model\.hidden changed after"):
        exp.run(progress=False)


def test_running_one_experiment_twice_records_the_second_run_afresh(capsys) -> None:
    """The second `run()` of one Experiment kept the first one's record: its divergence
    counted 4 rounds of a 2-round run, and its warning was not shown again."""
    exp = Experiment.from_config({**DIGITS, "train": {"lr": 1e6}})
    first, second = exp.run(progress=False), exp.run(progress=False)
    assert first.summary.divergence is not None and first.summary.divergence["rounds"] == 2
    assert second.summary.divergence == first.summary.divergence
    assert second.summary.warnings == first.summary.warnings
    assert capsys.readouterr().err.count("the training loss exploded") == 2


def test_overrides_given_as_a_dict_or_none() -> None:
    exp = Experiment.from_config(DIGITS, overrides={"rounds": 3, "train.lr": 0.05})
    assert (exp.config.run.rounds, exp.config.train.lr) == (3, 0.05)
    assert Experiment.from_config(DIGITS, overrides=None).config.run.rounds == 2


def test_resume_without_an_out_dir_says_there_is_no_folder_not_none() -> None:
    with pytest.raises(ClusterFLError, match="without an output folder") as err:
        Experiment.from_config(DIGITS).run(resume=True)
    assert "None" not in str(err.value)


def test_progress_false_in_python_or_toml_reads_as_off() -> None:
    assert load_config({"output": {"progress": False}}).output.progress == "off"
    assert load_config({"output": {"progress": True}}).output.progress == "on"
    with pytest.raises(ConfigError, match="'auto', 'on' or 'off'"):
        load_config({"output": {"progress": "no"}})


# ------------------------------------------------------------------ the data a run records
def test_federation_subset_and_client_rows_refuse_clients_that_do_not_exist() -> None:
    """`subset([0.5])` was client 0 (numpy's cast), `subset([9])` and `client_train(9)` of
    6 clients numpy's IndexError, and `client_train(-1)` an empty client without a word."""
    fed = Federation.from_clients(_clients())
    x, y = fed.client_train(5)
    assert (x.shape, y.tolist()) == ((30, 5), torch.from_numpy(_clients()[5][1]).tolist())
    assert fed.subset(np.array([5, 0])).n_clients == 2
    tiled = fed.subset([1, 1])  # a client given twice is two of the same data (tiling)
    assert torch.equal(tiled.client_train(0)[0], tiled.client_train(1)[0])
    for bad, words in (([0.5], "[0.5]: give a list of client ids, whole numbers in 0..5"),
                       ([9], "client 9 does not exist; ids are 0..5")):
        with pytest.raises(ConfigError, match=re.escape(words)) as err:
            fed.subset(bad)
        assert err.value.field == "clients"
    for i in (-1, 6, 1.0, True):
        with pytest.raises(ConfigError, match=re.escape(f"{i!r}: give a client id, a whole "
                                                        "number in 0..5")) as err:
            fed.client_test(i)  # type: ignore[arg-type]
        assert err.value.field == "i"


def test_describe_names_the_task_not_one_class_of_a_regression() -> None:
    """A regression federation described itself as having "1 classes"."""
    clients = [(x, x[:, 0] * 2.0, xt, xt[:, 0] * 2.0) for x, _, xt, _ in _clients(2)]
    assert Federation.from_clients(clients, task="regression").describe().endswith(
        "input (5,), regression (one real-valued target)")
    assert Federation.from_clients(_clients(2)).describe().endswith("input (5,), 2 classes")
    tokens = [(np.array([[1, 2, 3]] * 4), np.array([[2, 3, 4]] * 4),
               np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))] * 2
    assert Federation.from_clients(tokens, task="language_model").describe().endswith(
        "input (3,), language model (vocabulary of 5 tokens)")


def test_a_make_federation_federation_is_what_config_toml_records(tmp_path: Path) -> None:
    """Before: config.toml recorded the config's default rotation of 32 clients while the run
    trained on the label swap of 8 (and `--resume` then named the wrong data)."""
    fed = make_federation("digits", "label_swap", {"n_clients": 8, "n_clusters": 2}, seed=0)
    exp = Experiment.from_config(NO_DATA, federation=fed, out_dir=tmp_path / "r")
    exp.run()
    saved = tomllib.loads((tmp_path / "r" / "config.toml").read_text())
    assert saved["data"]["source"] == "digits"
    assert saved["scenario"] == {"name": "label_swap", "n_clients": 8, "n_clusters": 2}
    assert not any("seed" in w for w in exp.recorder.warnings)
    rebuilt = Experiment(load_config(saved)).full_federation  # the recorded config rebuilds it
    assert torch.equal(rebuilt.x_train, fed.x_train) and torch.equal(rebuilt.y_train,
                                                                   fed.y_train)


def test_a_federation_of_another_seed_is_a_warning_naming_both_seeds() -> None:
    fed = make_federation("digits", "label_swap", {"n_clients": 8, "n_clusters": 2}, seed=5)
    exp = Experiment.from_config(NO_DATA, federation=fed)
    exp.run()
    assert any("made with seed 5 and the run's seed is 0" in w for w in exp.recorder.warnings)


def test_a_config_naming_another_scenario_than_the_federation_is_refused() -> None:
    fed = make_federation("digits", "label_swap", {"n_clients": 8, "n_clusters": 2}, seed=0)
    with pytest.raises(ConfigError, match="not how the federation given was made") as err:
        Experiment.from_config(DIGITS, federation=fed)
    assert err.value.field == "scenario"


def test_per_client_data_with_a_holdout_in_the_config_is_refused_not_dropped() -> None:
    """Before: `[scenario] holdout = 0.25` was dropped without a word (no client held out)."""
    fed = Federation.from_clients(_clients(), clusters=[i % 2 for i in range(6)])
    with pytest.raises(ConfigError, match="without holdout"):
        Experiment.from_config({**NO_DATA, "scenario": {"holdout": 0.25}}, federation=fed)
    exp = Experiment.from_config(NO_DATA, federation=fed)
    assert exp.config.to_dict()["scenario"] == {"name": "given"}


# ------------------------------------------------------------------ Federation.from_clients
@pytest.mark.parametrize(("kwargs", "says"), [
    ({"clusters": [0, 0.5, 1, 1, 0, 1]}, "cluster id 0.5 is not a whole number"),
    ({"clusters": ["a", "b", "a", "b", "a", "b"]}, "'a' is not a whole number"),
    ({"n_classes": 2.7}, "n_classes = 2.7"),
    ({"n_classes": "2"}, "n_classes = '2'"),
    ({"task": "classify"}, "allowed: 'classification'"),
    ({"name": 123}, "name = 123"),
])
def test_from_clients_refuses_what_it_used_to_truncate_or_trip_on(kwargs: dict[str, Any],
                                                                  says: str) -> None:
    with pytest.raises(DataError, match=says):
        Federation.from_clients(_clients(), **kwargs)
    fed = Federation.from_clients(_clients(), clusters=[0, 0.0, 1, 1.0, 0, 1], n_classes=2)
    assert fed.clusters.tolist() == [0, 0, 1, 1, 0, 1]  # whole floats still read


def test_float64_inputs_beyond_float32_are_refused_not_made_infinite() -> None:
    big = [(x.astype(np.float64) * 1e40, y, xt, yt) for x, y, xt, yt in _clients()]
    with pytest.raises(DataError, match="beyond the range of float32"):
        Federation.from_clients(big)


def test_clients_given_as_a_generator_or_a_dict_are_refused_naming_a_list() -> None:
    with pytest.raises(DataError, match=r"list\(\.\.\.\) of a generator"):
        Federation.from_clients(c for c in _clients())
    with pytest.raises(DataError, match="clients is a dict"):
        Federation.from_clients(dict(enumerate(_clients())))


class _Ragged(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, items: int = 3) -> None:
        self.items = items

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        x = torch.zeros(5 if i < 2 else 6)
        return (x, 0, 1) if self.items == 3 else (x, i % 2)


def test_a_dataset_of_mixed_shapes_or_triples_names_the_sample() -> None:
    with pytest.raises(DataError, match=r"train\[2\] has an input of shape \(6,\)"):
        Federation.from_clients([(_Ragged(2), _Ragged(2))])
    with pytest.raises(DataError, match="is a tuple of 3 items"):
        Federation.from_clients([(_Ragged(3), _Ragged(3))])


def test_make_federation_refuses_a_seed_or_params_of_the_wrong_kind() -> None:
    for seed in ("1", 1.5, -1):
        with pytest.raises(ConfigError, match="seed"):
            make_federation("digits", "iid", {"n_clients": 4}, seed=seed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give the scenario's options as a dict"):
        make_federation("digits", "iid", [("n_clients", 4)])  # type: ignore[arg-type]


# ------------------------------------------------------------------ placement from Python
def test_placement_ids_are_checked_in_the_callers_terms() -> None:
    exp = Experiment.from_config(DIGITS)
    exp.run()
    backend = build_backend(exp.config, exp.full_federation, exp.factory)
    for ids, says in (([-1, 3], "client -1 does not exist; ids are 0..7"),
                      ([3, 70], "client 70 does not exist"),
                      ([3.0, 7.5], "whole numbers in 0..7"),
                      ([3, 3], "client 3 is named twice")):
        with pytest.raises(ConfigError, match=says) as err:
            exp.placing_context(backend, ids)
        assert err.value.field == "ids"
    ctx = exp.placing_context(backend, [3, 7])
    with pytest.raises(ConfigError, match=r"client 5 does not exist; ids are 0\.\.1 \(the "
                       "context's 2 clients"):
        exp.algorithm.place(ctx, [0, 5])
    assert exp.algorithm.place(ctx, [0, 1]).tolist() == [0, 0]  # FedAvg: one cluster


# ------------------------------------------------------------------ code of one's own
class HardBatch(nn.Module):
    """Passes the setup check on a batch of 2, fails on the run's batches."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        self.lin = nn.Linear(int(np.prod(input_shape)), n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 2:
            x = x.reshape(x.shape[0] * 2, -1)  # a user's shape bug
        return self.lin(x.flatten(1))


class NaNOut(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        self.lin = nn.Linear(int(np.prod(input_shape)), n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1)) * float("nan")


class ReturnsState(FedAvg):
    """A method of one's own whose `update` returns the state, not an `Update`."""

    def update(self, state: Any, t: int, ask: Ask[Any], reply: Any) -> Any:
        return super().update(state, t, ask, reply).state


class AsksBare(FedAvg):
    """... whose `ask` returns the bare request, not an `Ask`."""

    def ask(self, state: Any, t: int, phase: str, ctx: Any) -> Any:
        step = super().ask(state, t, phase, ctx)
        return step.request if isinstance(step, Ask) else step


def test_a_model_of_ones_own_failing_mid_run_is_one_line_naming_its_line() -> None:
    """Before: torch's `mat1 and mat2 shapes cannot be multiplied` 30 frames deep."""
    for changes in ({"backend": {"name": "sequential"}},  # the reference loop's training
                    {"algorithm": {"name": "ifca", "n_clusters": 2}}):  # IFCA's losses
        config = {**DIGITS, "model": {"name": f"{HERE}:HardBatch"}, **changes}
        with pytest.raises(OwnCodeError) as err:
            Experiment.from_config(config).run()
        text = str(err.value)
        assert text.startswith(f"model.name {HERE}:HardBatch raised RuntimeError in round 1")
        assert "test_python_api_hostile.py:" in text and "in forward" in text
        assert "\n" not in text


def test_a_model_giving_nan_for_every_input_is_refused_at_setup() -> None:
    """Before: the run went on to exit 0 at 10 % accuracy, its one warning blaming the
    learning rate."""
    with pytest.raises(ConfigError, match="gives NaN or infinite outputs"):
        Experiment.from_config({**DIGITS, "model": {"name": f"{HERE}:NaNOut"}})


@pytest.mark.parametrize(("method", "hook", "wants"), [
    ("ReturnsState", "update", "Update(state, ...)"),
    ("AsksBare", "ask", "Ask(request) or Update"),
])
def test_a_method_of_ones_own_returning_the_wrong_kind_names_its_hook(
        method: str, hook: str, wants: str) -> None:
    """Before: `AttributeError: 'FedAvgState' object has no attribute 'state'`."""
    config = {**DIGITS, "algorithm": {"name": f"{HERE}:{method}"}}
    with pytest.raises(ClusterFLError) as err:
        Experiment.from_config(config).run()
    assert f"{HERE}:{method}.{hook} returned a" in str(err.value) and wants in str(err.value)


class Tracker:
    def __init__(self, fail_at_end: bool = False) -> None:
        self.fail_at_end = fail_at_end

    def on_run_end(self, summary: Any, out_dir: Any) -> None:
        if self.fail_at_end:
            raise RuntimeError("upload failed")


def test_a_callback_class_instead_of_an_instance_and_a_failing_end_hook() -> None:
    with pytest.raises(ConfigError, match=r"Tracker is a class; give an instance of it "
                       r"\(Tracker\(\)\)"):
        Experiment.from_config(DIGITS, callbacks=[Tracker])
    with pytest.raises(CallbackError, match="the run had finished: its results are written"):
        Experiment.from_config(DIGITS, callbacks=[Tracker(fail_at_end=True)]).run()


class Counting:
    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.ended = 0

    def on_round_end(self, record: Any) -> None:
        self.rounds.append(record.round)

    def on_run_end(self, summary: Any, out_dir: Any) -> None:
        self.ended += 1


class FailsAtStart:
    def on_run_start(self, config: Any, out_dir: Any) -> None:
        raise RuntimeError("no tracker server")


def test_a_callback_failing_at_the_end_does_not_keep_the_others_from_being_told() -> None:
    """Before: the callbacks after the failing one were never called at the run's end (a
    TensorBoard callback after it lost its figures)."""
    after = Counting()
    with pytest.raises(CallbackError, match="the other callbacks were called"):
        Experiment.from_config(DIGITS, callbacks=[Tracker(fail_at_end=True), after]).run()
    assert after.ended == 1 and after.rounds == [1, 2]


def test_a_callback_failing_at_the_start_of_a_new_run_says_overwrite_not_resume(
        tmp_path: Path) -> None:
    """Before: "the run stopped (with checkpoints, --resume continues it …)", though no
    round had run and --resume then refused (nothing to continue)."""
    with pytest.raises(CallbackError) as err:
        Experiment.from_config(DIGITS, out_dir=tmp_path / "run",
                               callbacks=[FailsAtStart()]).run()
    assert "no tracker server" in str(err.value)
    assert str(err.value).endswith("the run stopped before its first round: start it again "
                                   "with --overwrite")
    again = Experiment.from_config(DIGITS, out_dir=tmp_path / "run", overwrite=True).run()
    assert [r.round for r in again.records] == [1, 2]


def test_the_same_callback_listed_twice_is_refused_not_called_twice(tmp_path: Path) -> None:
    """Before: the same object (or import path) listed twice saw every round twice: [1, 1,
    2, 2]; a TensorBoardCallback given with tensorboard = true wrote every event twice."""
    from clusterfl.tracking import TensorBoardCallback

    once = Counting()
    with pytest.raises(ConfigError, match=r"^callbacks\[1\]: the same Counting object is "
                                          r"listed twice"):
        Experiment.from_config(DIGITS, callbacks=[once, once])
    ref = f"{HERE}:Counting"
    with pytest.raises(ConfigError, match=r"^output\.callbacks\[1\]: .* is listed twice"):
        Experiment.from_config({**DIGITS, "output": {"callbacks": [ref, ref]}})
    board = TensorBoardCallback(tmp_path / "tb")
    with pytest.raises(ConfigError, match=r"^output\.tensorboard: a TensorBoardCallback is "
                                          r"given as well"):
        Experiment.from_config({**DIGITS, "output": {"tensorboard": True}},
                               out_dir=tmp_path / "run", callbacks=[board])
    Experiment.from_config(DIGITS, callbacks=[once, Counting()]).run()
    assert once.rounds == [1, 2]


def test_an_option_of_a_scenario_without_options_says_it_takes_none() -> None:
    """Before: `scenario.holdout: unknown field; allowed fields here: ` (an empty list)."""
    with pytest.raises(ConfigError) as err:
        load_config({"data": {"source": "npz", "path": "p"},
                     "scenario": {"name": "given", "holdout": 0.25}})
    assert str(err.value) == "scenario.holdout: unknown field; this choice takes no options"


# ------------------------------------------------------------------ comparisons from Python
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"overwrite": "no"}, "overwrite"),  # was truthy: the earlier comparison deleted
    ({"resume": "yes"}, "resume"),
    ({"config": DIGITS}, "config"),  # a dict where a Config belongs
    ({"specs": "fedavg,ifca:n_clusters=2"}, "specs"),  # was read letter by letter
    ({"specs": [None]}, "specs"),
    ({"out_dir": 5}, "out_dir"),
])
def test_run_comparison_arguments_of_the_wrong_kind_are_one_line(
        tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    from clusterfl.compare import run_comparison

    args: dict[str, Any] = {"config": load_config(DIGITS), "specs": ["fedavg"],
                            "out_dir": tmp_path / "c", "progress": False, **kwargs}
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError) as err:
        run_comparison(**args)
    assert err.value.field == field
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["keep.txt"]


def test_every_method_of_a_comparison_is_checked_before_the_first_runs(tmp_path: Path) -> None:
    """Before: FedAvg ran to the end and wrote its folder, then IFCA's K = 9 (or FL+HC's
    warm-up) failed: a half-written comparison."""
    from clusterfl.compare import run_comparison

    config = load_config(DIGITS)
    for spec, says in (("ifca:n_clusters=9", "K = 9 cluster models need at least 9"),
                       ("flhc", "warm-up rounds leave no round"),
                       ("fedsoft:n_clusters=9", "K = 9"), ("fesem:n_clusters=9", "K = 9"),
                       ("fedem:n_components=20", "algorithm.n_components")):
        out = tmp_path / spec.replace(":", "_")
        with pytest.raises(ConfigError, match=says):
            run_comparison(config, ["fedavg", spec], out, progress=False)
        assert not (out / "fedavg" / "summary.json").exists(), spec


def test_ifca_whose_warm_up_leaves_no_round_to_cluster_is_refused_as_fl_hc_is() -> None:
    """Before: `IFCA (K=2, warmup_rounds=5)` ran 2 rounds of FedAvg, 0 clusters, no word."""
    config = {**DIGITS, "algorithm": {"name": "ifca", "n_clusters": 2, "warmup_rounds": 5}}
    with pytest.raises(ConfigError, match=r"algorithm\.warmup_rounds: 5 warm-up rounds leave "
                       r"no round to cluster in a run of 2 rounds \(it would be FedAvg\); "
                       r"allowed: 0\.\.1"):
        Experiment.from_config(config)


def test_a_misspelt_option_of_one_method_of_a_comparison_names_its_spec() -> None:
    from clusterfl.compare import comparison_configs

    with pytest.raises(ConfigError) as err:
        comparison_configs(load_config(DIGITS), ["fedavg", "fedem:n_clusters=2"])
    assert str(err.value).endswith("(spec 'fedem:n_clusters=2')")
    assert err.value.field == "algorithm.n_clusters"


def test_synthetic_regression_under_the_default_scenario_names_its_scenario() -> None:
    with pytest.raises(ConfigError, match="its scenario is 'linear_regression'"):
        Experiment.from_config({"rounds": 2, "data": {"source": "synthetic_regression"}})


class OutOfMemoryModel(HardBatch):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 2:
            raise MemoryError("pretend the batch does not fit")
        return self.lin(x.flatten(1))


def test_running_out_of_memory_in_a_model_of_ones_own_stays_an_out_of_memory_error() -> None:
    """The command's out-of-memory line (what to make smaller) is kept, not replaced by the
    own-code line."""
    config = {**DIGITS, "model": {"name": f"{HERE}:OutOfMemoryModel"},
              "backend": {"name": "sequential"}}
    with pytest.raises(MemoryError):
        Experiment.from_config(config).run()


@pytest.mark.parametrize(("kwargs", "field", "named"), [
    ({"chunk_size": 2.5}, "backend.chunk_size", "2.5"),  # ran with chunks of 2
    ({"chunk_size": True}, "backend.chunk_size", "True"),  # ran with chunks of 1
    ({"chunk_size": "Auto"}, "backend.chunk_size", "'auto'"),  # "invalid literal for int()"
    ({"chunk_size": 0}, "backend.chunk_size", ">= 1"),
    ({"precision": "fp16"}, "backend.precision", "bf16-mixed"),  # refused at the 1st request
])
def test_a_simulation_backend_built_in_python_refuses_what_its_config_refuses(
        kwargs: dict[str, Any], field: str, named: str) -> None:
    from clusterfl.backends.simulation import SimulationBackend
    from clusterfl.models import ModelFactory, model_config

    fed = Federation.from_clients(_clients(), n_classes=2)
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), fed.input_shape, 2)
    with pytest.raises(ConfigError) as err:
        SimulationBackend(fed, factory, **kwargs)
    assert err.value.field == field and named in err.value.message
    assert "\n" not in str(err.value)
    assert SimulationBackend(fed, factory, np.int64(3)).engine.chunk_size == 3
