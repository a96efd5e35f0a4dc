"""Issue 35, "Per-client data": NaN features, non-integer or string labels, a string cluster id,
clients disagreeing on `n_classes` and ragged Hugging Face inputs are refused when the data is
loaded, in one line naming the client (file) or the column; clean data still loads as it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.cli import main
from clusterfl.config import dump_toml
from clusterfl.data.federation import Federation
from clusterfl.deploy.clientdata import export_partitions
from clusterfl.errors import DataError
from clusterfl.experiment import Experiment
from tests.core.conftest import blob_federation

BASE = {"seed": 0, "rounds": 1, "eval_every": 1, "checkpoint_every": 0,
        "model": {"name": "mlp", "hidden": [8]}, "train": {"lr": 0.1, "batch_size": 8},
        "output": {"figures": False, "progress": "off"}}


def _folder(tmp_path: Path) -> Path:
    export_partitions(blob_federation(n_clients=4, per_client=12), tmp_path / "p")
    return tmp_path / "p"


def _change(path: Path, **arrays: object) -> None:
    with np.load(path) as z:
        d = {k: z[k] for k in z.files}
    d.update({k: np.asarray(v) for k, v in arrays.items()})
    np.savez(path, **d)


def _load(folder: Path) -> Experiment:
    return Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(folder)}})


def _clients() -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(10, 3)).astype(np.float32), rng.integers(0, 2, 10),
             rng.normal(size=(4, 3)).astype(np.float32), rng.integers(0, 2, 4))
            for _ in range(3)]


def test_a_nan_in_one_clients_features_is_refused_naming_the_client(tmp_path, capsys):
    folder = _folder(tmp_path)
    with np.load(folder / "client_0002.npz") as z:
        x = z["x_train"].copy()
    x[5, 1] = np.nan
    _change(folder / "client_0002.npz", x_train=x)
    with pytest.raises(DataError, match=r"client 2 train: sample 5 holds NaN"):
        _load(folder)
    (tmp_path / "c.toml").write_text(dump_toml({**BASE, "data": {"source": "npz",
                                                                 "path": str(folder)}}))
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "client 2 train: sample 5 holds NaN" in err[0]
    clients = _clients()  # the same from arrays given in Python (infinity counts too)
    clients[1][2][3, 0] = np.inf
    with pytest.raises(DataError, match=r"client 1 test: sample 3 holds NaN or infinite"):
        Federation.from_clients(clients)


def test_float_labels_are_refused_not_truncated(tmp_path):
    folder = _folder(tmp_path)
    with np.load(folder / "client_0001.npz") as z:
        y = z["y_train"].astype(np.float64)
    y[0] = 1.5
    _change(folder / "client_0001.npz", y_train=y)
    with pytest.raises(DataError, match=r"client 1 train: labels like 1\.5 are not class ids"):
        _load(folder)
    clients = _clients()
    whole = [(x, y.astype(np.float32), xt, yt) for x, y, xt, yt in clients]
    assert torch.equal(Federation.from_clients(whole).y_train,  # 0.0, 1.0: the same classes
                       Federation.from_clients(clients).y_train)
    whole[0] = (whole[0][0], whole[0][1] + 0.25, whole[0][2], whole[0][3])
    with pytest.raises(DataError, match="client 0 train: labels like"):
        Federation.from_clients(whole)


def test_a_classification_of_one_class_is_refused_not_a_perfect_score(tmp_path):
    """Every label 0 (a loader's bug, a wrong column) gave a model of one output whose every
    prediction is right: accuracy 100 %, exit 0. Now refused when the data loads, from
    Python arrays and from an npz folder; a regression keeps its single output."""
    one = [(x, np.zeros_like(y), xt, np.zeros_like(yt)) for x, y, xt, yt in _clients()]
    with pytest.raises(DataError, match=r"^own data: n_classes = 1, but a classification "
                                        r"needs at least 2 classes"):
        Federation.from_clients(one)
    assert Federation.from_clients(one, n_classes=2).n_classes == 2
    reg = [(x, y.astype(np.float32), xt, yt.astype(np.float32)) for x, y, xt, yt in one]
    assert Federation.from_clients(reg, task="regression").n_outputs == 1
    folder = _folder(tmp_path)
    for f in sorted(folder.glob("client_*.npz")):
        with np.load(f) as z:
            _change(f, y_train=np.zeros_like(z["y_train"]), y_test=np.zeros_like(z["y_test"]),
                    n_classes=1)
    with pytest.raises(DataError, match=r"npz:p: n_classes = 1, but a classification"):
        _load(folder)


def test_one_hot_labels_are_refused_naming_the_client(tmp_path):
    """Labels given one-hot, `[N, C]`, were flattened into N·C targets and ended in
    "ValueError: train: offsets end at 15 but x has 5 rows, y 15"; a column `[N, 1]` still
    reads as one label per sample."""
    eye = np.eye(3, dtype=np.int64)
    clients = _clients()
    hot = [(x, eye[y], xt, eye[yt]) for x, y, xt, yt in clients]
    with pytest.raises(DataError, match=r"^own data: client 0 train has targets of shape "
                                        r"\(10, 3\); give one class id \(one-hot labels: "
                                        r"y\.argmax\(1\)\) per sample$"):
        Federation.from_clients(hot)
    with pytest.raises(DataError, match=r"targets of shape \(10, 3\); give one value per "):
        Federation.from_clients([(x, y.astype(np.float32), xt, yt.astype(np.float32))
                                 for x, y, xt, yt in hot], task="regression")
    column = [(x, y[:, None], xt, yt[:, None]) for x, y, xt, yt in clients]
    assert torch.equal(Federation.from_clients(column).y_train,
                       Federation.from_clients(clients).y_train)
    folder = _folder(tmp_path)
    with np.load(folder / "client_0002.npz") as z:
        y = z["y_test"]
    _change(folder / "client_0002.npz", y_test=np.eye(3, dtype=np.int64)[y])
    with pytest.raises(DataError, match=r"npz:p: client 2 test has targets of shape"):
        _load(folder)


def test_clients_disagreeing_on_n_classes_are_refused(tmp_path):
    folder = _folder(tmp_path)
    _change(folder / "client_0003.npz", n_classes=7)
    with pytest.raises(DataError, match=r"disagree on n_classes \(client_0000\.npz 3, "
                                        r"client_0001\.npz 3, client_0002\.npz 3, "
                                        r"client_0003\.npz 7"):
        _load(folder)


def test_a_misnamed_or_mixed_task_is_named(tmp_path):
    """`task = "segmentation"` in one file read "the files disagree on or misname the task"."""
    folder = _folder(tmp_path)
    _change(folder / "client_0002.npz", task="segmentation")
    with pytest.raises(DataError, match="task 'segmentation' in a file is not a task; "
                                        "allowed: classification, regression"):
        _load(folder)
    _change(folder / "client_0002.npz", task="regression")
    with pytest.raises(DataError, match=r"disagree on the task \['classification', "
                                        r"'regression'\]"):
        _load(folder)


def test_string_labels_are_refused_naming_the_file(tmp_path):
    folder = _folder(tmp_path)
    with np.load(folder / "client_0000.npz") as z:
        y = z["y_test"]
    _change(folder / "client_0000.npz", y_test=np.array(["cat", "dog", "emu"])[y])
    with pytest.raises(DataError, match=r"client_0000\.npz: y_test holds <U3 values; it must "
                                        r"hold class ids"):
        _load(folder)


def test_a_string_cluster_id_is_refused_naming_the_file(tmp_path):
    folder = _folder(tmp_path)
    _change(folder / "client_0001.npz", cluster="north")
    with pytest.raises(DataError, match=r"client_0001\.npz: cluster must be one integer"):
        _load(folder)


def test_a_negative_cluster_id_is_refused_naming_the_client(tmp_path):
    """Accepted before: ARI then counted the -1 clients a group of their own."""
    folder = _folder(tmp_path)
    _change(folder / "client_0002.npz", cluster=-1)
    with pytest.raises(DataError, match=r"client 2 has the true cluster id -1; ids are 0, 1"):
        _load(folder)


def test_a_client_without_test_samples_is_a_warning_on_the_console_and_in_the_summary(
        tmp_path, capsys):
    """It trained and was left out of every test metric without a word."""
    folder = _folder(tmp_path)
    _change(folder / "client_0001.npz", x_test=np.zeros((0, 2), np.float32),
            y_test=np.zeros(0, np.int64))
    exp = Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(folder)}},
                                 out_dir=tmp_path / "run")
    history = exp.run(progress=False)
    words = "1 client(s) have no test samples ([1]): the test metrics leave them out"
    assert f"clusterfl: warning: {words}" in capsys.readouterr().err
    assert history.summary is not None and history.summary.warnings is not None
    assert history.summary.warnings[0].startswith(words)
    assert history.records[-1].client_accuracy[1] is None


def test_a_clean_npz_folder_still_loads_as_exported(tmp_path):
    fed = blob_federation(n_clients=4, per_client=12)
    export_partitions(fed, tmp_path / "p")
    got = _load(tmp_path / "p").federation
    assert torch.equal(got.x_train, fed.x_train) and torch.equal(got.y_train, fed.y_train)
    assert got.n_classes == 3 and got.clusters.tolist() == fed.clusters.tolist()


def test_ragged_hugging_face_inputs_are_refused_naming_the_column(tmp_path):
    import datasets  # the [hf] extra, which the test suite installs
    rows = [[1.0, 2.0], [1.0, 2.0, 3.0], [4.0, 5.0]] * 4
    datasets.Dataset.from_dict({"x": rows, "label": [0, 1, 0] * 4}).save_to_disk(
        str(tmp_path / "ragged"))
    from clusterfl.data.own import huggingface_source

    with pytest.raises(DataError, match=r"data\.input: column 'x' holds inputs of different "
                                        r"shapes \(\(2,\), \(3,\)\)"):
        huggingface_source(tmp_path / "ragged", input="x")
    datasets.Dataset.from_dict({"x": [[1.0, 2.0]] * 6, "label": ["a", "b"] * 3}).save_to_disk(
        str(tmp_path / "words"))
    with pytest.raises(DataError, match=r"data\.label: column 'label' holds <U1 values"):
        huggingface_source(tmp_path / "words", input="x")


def nan_federation(seed: int = 0) -> Federation:
    """A loader giving a Federation built directly (not by from_clients): NaN in client 1."""
    fed = blob_federation(n_clients=3, per_client=6)
    fed.x_train[fed.train_offsets[1] + 2, 0] = float("nan")
    return fed


def nan_source(seed: int = 0) -> object:
    """A loader giving one pool of samples, one of which holds infinity."""
    from clusterfl.data.sources import Source

    x = torch.zeros(20, 3)
    x[7, 2] = float("inf")
    y = torch.arange(20) % 2
    return Source(x, y, torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), 2,
                  "classification", "pool")


@pytest.mark.parametrize(("loader", "message"), [
    ("nan_federation", r"\(train\): client 1: sample 2 \(and 0 more\) holds NaN"),
    ("nan_source", r"\(train\): sample 7 \(and 0 more\) holds NaN or infinite"),
])
def test_a_loader_functions_nan_features_are_refused_naming_the_sample(loader, message):
    source = f"tests.core.test_hostile_data:{loader}"
    raw = {**BASE, "data": {"source": source}}
    if loader == "nan_source":
        raw["scenario"] = {"name": "iid", "n_clients": 2}
    with pytest.raises(DataError, match=f"data.source '{source}' " + message):
        Experiment.from_config(raw)


def short_targets_source(seed: int = 0) -> object:
    """A loader giving one pool of 20 training inputs but 19 targets."""
    from clusterfl.data.sources import Source

    y = torch.arange(20) % 2
    return Source(torch.zeros(20, 3), y[:19], torch.zeros(4, 3), y[:4], 2, "classification",
                  "pool")


def test_a_loaders_source_with_fewer_targets_than_inputs_is_refused():
    """Before: the scenario split the pool by the inputs' count and the run trained without a
    word on clients whose last sample had no target of its own."""
    source = "tests.core.test_hostile_data:short_targets_source"
    raw = {**BASE, "data": {"source": source}, "scenario": {"name": "iid", "n_clients": 2}}
    with pytest.raises(DataError) as err:
        Experiment.from_config(raw)
    assert str(err.value).startswith(f"data.source {source!r} (train): 20 inputs but 19 "
                                     "targets")


def mismatched_clients(seed: int = 0) -> Federation:
    """A loader whose second client has 6 training inputs but 5 targets."""
    x, y = np.zeros((6, 3), np.float32), np.arange(6) % 2
    return Federation.from_clients([(x, y, x[:2], y[:2]), (x, y[:5], x[:2], y[:2])])


def test_a_loaders_mismatched_arrays_name_the_loader():
    """Before: `own data: client 1 train has 6 inputs but 5 targets`, without the loader
    (`data.source`) whose arrays they were."""
    source = "tests.core.test_hostile_data:mismatched_clients"
    with pytest.raises(DataError) as err:
        Experiment.from_config({**BASE, "data": {"source": source}})
    assert str(err.value) == (f"data.source {source!r}: own data: client 1 train has 6 "
                              "inputs but 5 targets")
