"""Data of one's own: per-client arrays or torch Datasets, a folder of per-client .npz files,
a Hugging Face dataset on disk, a loader function; each run directory names its real data."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from clusterfl.cli import main as cli_main
from clusterfl.config import dump_toml, load_config
from clusterfl.data.federation import Federation
from clusterfl.data.own import build, npz_folder
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import Source
from clusterfl.deploy.clientdata import export_partitions
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import Experiment
from tests.ext.conftest import BASE, blob_federation, two_group_clients

IFCA = {"name": "ifca", "n_clusters": 2}


def _same(a: Federation, b: Federation) -> None:
    for split in ("train", "test"):
        xa, ya, oa = a.split(split)
        xb, yb, ob = b.split(split)
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and (oa == ob).all()
    assert (a.clusters == b.clusters).all() and a.n_classes == b.n_classes


def test_from_clients_takes_arrays_or_torch_datasets_alike():
    clients, groups = two_group_clients()
    arrays = Federation.from_clients(clients, clusters=groups, name="blobs")
    datasets = Federation.from_clients(
        [(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
          TensorDataset(torch.from_numpy(xt), torch.from_numpy(yt)))
         for x, y, xt, yt in clients], clusters=groups, name="blobs")
    _same(arrays, datasets)
    assert arrays.n_clients == 6 and arrays.input_shape == (6,) and arrays.n_classes == 2
    assert arrays.meta["data"] == {"source": "python", "name": "blobs"}


def test_a_run_on_own_clients_finds_their_groups_and_records_the_data(tmp_path):
    exp = Experiment.from_config({**BASE, "algorithm": IFCA,
                                  "output": {"figures": True, "progress": "off"}},
                                 out_dir=tmp_path / "run", federation=blob_federation())
    history = exp.run(progress=False)
    assert history.final.ari == 1.0 and history.series("accuracy")[-1] > 0.85
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["data"] == {"source": "python", "name": "blobs", "standardize": False}
    assert saved["scenario"] == {"name": "given"}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["federation"] == "blobs"
    report = (tmp_path / "run" / "report.md").read_text()
    assert "federation `blobs`, data `python` (blobs)" in report and "digits" not in report
    # resumed in Python with the same federation; on the command line a clear message
    again = Experiment.from_config(saved, out_dir=tmp_path / "run", federation=blob_federation())
    assert again.config.to_dict() == exp.config.to_dict()
    with pytest.raises(ConfigError, match="pass it again"):
        Experiment.from_config(saved)
    # a config naming other data than the federation given is refused
    with pytest.raises(ConfigError, match="not the data of the federation given"):
        Experiment.from_config({**BASE, "data": {"source": "mnist"}},
                               federation=blob_federation())


def test_compare_runs_methods_on_a_federation_given_in_python(tmp_path):
    from clusterfl.compare import run_comparison

    config = load_config({**BASE, "data": {"source": "python", "name": "blobs"}})
    results = run_comparison(config, ["fedavg", "ifca:n_clusters=2"], tmp_path,
                             federation=blob_federation())
    assert [h.summary.federation for _, h in results] == ["blobs", "blobs"]
    assert results[1][1].final.ari == 1.0
    report = (tmp_path / "report.md").read_text()
    assert "Federation: `blobs`" in report and "**Warning:**" not in report  # one federation


def test_an_npz_folder_is_the_federation_it_was_exported_from(tmp_path, capsys):
    fed = make_federation("digits", "rotation", {"n_clients": 6, "angles": [0, 180]}, seed=0)
    export_partitions(fed, tmp_path / "parts")
    cfg = {**BASE, "data": {"source": "npz", "path": str(tmp_path / "parts")},
           "algorithm": IFCA}
    exp = Experiment.from_config(cfg, out_dir=tmp_path / "run")
    _same(exp.federation, fed)
    assert exp.config.scenario_name == "given" and exp.federation.name == "npz:parts"
    history = exp.run(progress=False)
    assert history.final.ari == 1.0
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["data"]["source"] == "npz" and saved["scenario"] == {"name": "given"}
    # the command line continues it from its config.toml alone (the data is found again)
    (tmp_path / "c.toml").write_text(dump_toml({**cfg, "checkpoint_every": 3}))
    assert cli_main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "cli")]) == 0
    assert cli_main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "cli"),
                     "--resume", "--set", "rounds=4"]) == 0
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["federation"] == "npz:parts" and summary["rounds"] == 4


def test_bad_npz_folders_fail_naming_the_file(tmp_path):
    fed = blob_federation(4)
    export_partitions(fed, tmp_path / "p")
    (tmp_path / "p" / "client_0002.npz").unlink()
    with pytest.raises(DataError, match="missing \\[2\\]"):
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(tmp_path / "p")}})
    np.savez(tmp_path / "p" / "client_0002.npz", x_train=np.zeros((2, 6)))
    with pytest.raises(DataError, match=r"client_0002\.npz: missing arrays"):
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(tmp_path / "p")}})
    with pytest.raises(ConfigError, match="not a folder"):
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(tmp_path / "q")}})


@pytest.mark.parametrize(("raw", "field", "message"), [
    ({"data": {"source": "npz"}}, "data.path", "required for source 'npz'"),
    ({"data": {"source": "npz", "path": "p"}, "scenario": {"name": "rotation"}},
     "scenario.name", "split into clients already"),
    ({"scenario": {"name": "given"}}, "scenario.name", "one pool of samples"),
    ({"data": {"source": "digits", "path": "p"}}, "data.path", "only for source"),
    ({"data": {"source": "digits", "label": "y"}}, "data.label", "only for source huggingface"),
    ({"data": {"source": "digits", "colour": 3}}, "data.colour", "unknown field"),
    ({"data": {"source": "nosuch"}}, "data.source", "or an import path"),
    ({"data": {"source": "huggingface", "path": "p", "test_fraction": 2}},
     "data.test_fraction", "less than 1"),
])
def test_misplaced_data_settings_fail_naming_the_field(raw, field, message):
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert err.value.field == field and message in err.value.message


def test_a_loader_function_gives_per_client_or_pooled_data(own_module, tmp_path):
    per_client = Experiment.from_config(
        {**BASE, "data": {"source": f"{own_module}:blobs", "n_clients": 4},
         "algorithm": IFCA}, out_dir=tmp_path / "a")
    assert per_client.federation.n_clients == 4 and per_client.config.scenario_name == "given"
    assert per_client.run(progress=False).final.ari == 1.0
    saved = tomllib.loads((tmp_path / "a" / "config.toml").read_text())
    assert saved["data"] == {"source": "ownstuff:blobs", "n_clients": 4, "standardize": False}
    pooled = Experiment.from_config(
        {**BASE, "data": {"source": f"{own_module}:blobs", "pooled": True},
         "scenario": {"name": "iid", "n_clients": 5}})
    assert pooled.federation.n_clients == 5 and pooled.federation.name == "blobs/iid"
    with pytest.raises(ConfigError, match="choose a scenario"):
        Experiment.from_config({**BASE, "data": {"source": f"{own_module}:blobs",
                                                 "pooled": True}})
    with pytest.raises(ConfigError, match="unexpected keyword argument 'clients'"):
        Experiment.from_config({**BASE, "data": {"source": f"{own_module}:blobs",
                                                 "clients": 3}})


def _digits_dataset_dict():
    import datasets
    from clusterfl.data.sources import load_source

    src = load_source("digits")

    def part(x, y):
        images = (x[:, 0].numpy() * 255).round().astype(np.uint8)
        features = datasets.Features({"image": datasets.Image(),
                                      "label": datasets.ClassLabel(num_classes=10)})
        return datasets.Dataset.from_dict({"image": list(images), "label": y.numpy()},
                                          features=features)

    return datasets.DatasetDict({"train": part(src.x_train, src.y_train),
                                 "test": part(src.x_test, src.y_test)}), src


def test_a_hugging_face_dataset_on_disk_is_split_by_our_scenarios(tmp_path):
    ds, src = _digits_dataset_dict()
    ds.save_to_disk(str(tmp_path / "digits_hf"))
    for split, d in ds.items():
        (tmp_path / "pq").mkdir(exist_ok=True)
        d.to_parquet(str(tmp_path / "pq" / f"{split}-00000.parquet"))
    from clusterfl.data.own import huggingface_source

    (tmp_path / "arrow").mkdir()  # arrow files, named by split (as a hub snapshot has them)
    for split in ("train", "test"):
        (arrow,) = (tmp_path / "digits_hf" / split).glob("*.arrow")
        (tmp_path / "arrow" / f"{split}-00000.arrow").write_bytes(arrow.read_bytes())
    saved, parquet, arrows = (huggingface_source(tmp_path / p)
                              for p in ("digits_hf", "pq", "arrow"))
    for hf in (saved, parquet, arrows):  # 8-bit pixels of the same images, as [N, 1, 8, 8]
        assert hf.x_train.shape == src.x_train.shape and hf.n_classes == 10
        assert torch.equal(hf.y_train, src.y_train)
        assert (hf.x_train - src.x_train).abs().max() < 1 / 255
    assert torch.equal(saved.x_test, parquet.x_test) and torch.equal(saved.x_test, arrows.x_test)
    cfg = {**BASE, "rounds": 4, "data": {"source": "huggingface",
                                         "path": str(tmp_path / "digits_hf")},
           "scenario": {"name": "rotation", "n_clients": 6, "angles": [0, 180]},
           "algorithm": IFCA}
    exp = Experiment.from_config(cfg, out_dir=tmp_path / "run")
    history = exp.run(progress=False)
    assert history.final.ari == 1.0 and history.series("accuracy")[-1] > 0.5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["federation"] == "hf:digits_hf/rotation"
    saved_cfg = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved_cfg["data"]["source"] == "huggingface"


def test_a_hugging_face_dataset_without_a_test_split_holds_out_a_share(tmp_path):
    ds, _ = _digits_dataset_dict()
    ds["train"].save_to_disk(str(tmp_path / "one"))
    from clusterfl.data.own import huggingface_source

    src = huggingface_source(tmp_path / "one", test_fraction=0.25)
    assert len(src.y_test) == pytest.approx(0.25 * len(ds["train"]), abs=10)
    assert len(src.y_train) + len(src.y_test) == len(ds["train"])
    with pytest.raises(ConfigError, match="no column 'img'"):
        huggingface_source(tmp_path / "one", input="img")


def _hf(tmp_path, name, train, test, features=None):
    import datasets

    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v, features=features)
                               for k, v in (("train", train), ("test", test))})
    dd.save_to_disk(str(tmp_path / name))
    return tmp_path / name


def test_hugging_face_uint8_arrays_are_scaled_images_like_the_image_feature(tmp_path):
    """Before: an `Array2D(uint8)` column came back as int64 0..255 without a channel axis
    (a run diverged, its warning blaming the learning rate)."""
    import datasets
    from clusterfl.data.own import huggingface_source

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 8, 8)).astype(np.uint8)
    y = np.arange(12) % 3
    features = datasets.Features({"image": datasets.Array2D((8, 8), "uint8"),
                                  "label": datasets.Value("int64")})
    path = _hf(tmp_path, "arr", {"image": list(x), "label": y}, {"image": list(x[:4]),
                                                                "label": y[:4]}, features)
    src = huggingface_source(path)
    assert src.x_train.shape == (12, 1, 8, 8) and float(src.x_train.max()) <= 1.0
    torch.testing.assert_close(src.x_train[:, 0], torch.from_numpy(x / 255.0).float())


@pytest.mark.parametrize(("case", "says"), [
    ("negative_label", "holds the label -1; class ids are 0..2"),
    ("beyond_classlabel", "split 'test' holds the label 4; class ids are 0..2"),
    ("test_shape", "inputs of shape (8,) in split 'train' and (10,) in 'test'"),
    ("truncated", "cannot be read as a Hugging Face dataset"),
])
def test_hugging_face_data_that_would_fail_far_away_is_one_line(tmp_path, case, says):
    """Before: a ValueError of the stratified split, an IndexError of the loss, a torch
    shape error and pyarrow's ArrowInvalid."""
    import datasets
    from clusterfl.data.own import huggingface_source

    x = np.ones((6, 8), np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    label = datasets.ClassLabel(num_classes=3)
    features = datasets.Features({"image": datasets.Sequence(datasets.Value("float32")),
                                  "label": label})
    train, test = {"image": list(x), "label": y}, {"image": list(x), "label": y}
    if case == "negative_label":
        features = None
        train = {"image": list(x), "label": np.array([0, 1, 2, 0, 1, -1])}
    if case == "beyond_classlabel":
        test = {"image": list(x), "label": np.array([0, 1, 4, 0, 1, 2])}
        features = datasets.Features({"image": datasets.Sequence(datasets.Value("float32")),
                                      "label": datasets.Value("int64")})
        path = _hf(tmp_path, case, train, test, features)
        meta = path / "train" / "dataset_info.json"  # the train split's labels a ClassLabel
        info = json.loads(meta.read_text())
        info["features"]["label"] = {"names": ["a", "b", "c"], "_type": "ClassLabel"}
        meta.write_text(json.dumps(info))
    elif case == "test_shape":
        test = {"image": list(np.ones((6, 10), np.float32)), "label": y}
        path = _hf(tmp_path, case, train, test, None)
    else:
        path = _hf(tmp_path, case, train, test, features)
    if case == "truncated":
        (arrow,) = (path / "train").glob("*.arrow")
        arrow.write_bytes(arrow.read_bytes()[:200])
    with pytest.raises(DataError) as err:
        huggingface_source(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_npz_client_file_is_named(tmp_path):
    """Before: `zipfile.BadZipFile: File is not a zip file`, a bare traceback."""
    fed = blob_federation(4)
    export_partitions(fed, tmp_path / "p")
    f = tmp_path / "p" / "client_0001.npz"
    f.write_bytes(f.read_bytes()[:300])
    with pytest.raises(DataError, match=r"client_0001\.npz: not a readable \.npz file"):
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(tmp_path / "p")}})


def test_the_python_source_on_the_command_line_says_what_to_do(tmp_path, capsys):
    (tmp_path / "c.toml").write_text(dump_toml({"data": {"source": "python"}}))
    assert cli_main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err
    assert "Federation.from_clients" in err and "Traceback" not in err


def test_an_npz_client_id_below_zero_or_a_scalar_array_is_named(tmp_path):
    """A client_id of -1 (ids -1, 0, 1) said "client ids must be 0..N-1; missing []"; a
    y_train saved as one number (shape ()) was a bare `TypeError: len() of a 0-d tensor`."""
    fed = blob_federation(3)
    export_partitions(fed, tmp_path / "p")
    folder = tmp_path / "p"
    path = folder / "client_0002.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(path, **{**arrays, "client_id": np.array(-1)})
    with pytest.raises(DataError, match=r"client_0002\.npz: client_id -1; client ids must be "
                                        r"0\.\.N-1") as err:
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(folder)}})
    assert "missing []" not in str(err.value)
    np.savez(path, **{**arrays, "y_train": np.array(1)})
    with pytest.raises(DataError, match=r"client_0002\.npz: y_train is a single number"):
        Experiment.from_config({**BASE, "data": {"source": "npz", "path": str(folder)}})


@pytest.mark.parametrize(("change", "says"), [
    ({"y_train": np.array([0.0, 1e20])}, r"client 0 train: the label 1e\+20 is not a class id"),
    ({"y_train": np.array([0, 2**64 - 1], dtype=np.uint64)},
     r"y_train holds the value 18446744073709551615, beyond int64"),
    ({"x_train": np.ones((2, 3)) * (1 + 2j)},
     r"x_train holds complex128 values; it must hold real numbers \(complex numbers: store the "
     r"real and imaginary parts as two features"),
])
def test_npz_labels_beyond_int64_and_complex_inputs_are_named_as_they_are(tmp_path, change,
                                                                            says):
    """Before: labels of 1e20 (and a uint64 2**64 − 1) read "class labels must be 0, 1, ...;
    found -9223372036854775808" (and "found -1"), int64's wrap-around, not the value in the
    file; complex inputs were told to "map strings to numbers"."""
    arrays = {"x_train": np.ones((2, 3)), "y_train": np.array([0, 1]), "x_test": np.ones((2, 3)),
              "y_test": np.array([0, 1]), "client_id": 0, "n_classes": 2}
    np.savez(tmp_path / "c.npz", **{**arrays, **change})
    with pytest.raises(DataError, match=says) as err:
        npz_folder(tmp_path)
    assert "-9223372036854775808" not in str(err.value) and "strings" not in str(err.value)


def test_from_clients_refuses_complex_inputs_instead_of_dropping_their_imaginary_part():
    """Before: complex inputs became their real part (a torch UserWarning, no error)."""
    x, y = np.ones((2, 3)) * (1 + 2j), np.array([0, 1])
    for inputs in (x, torch.from_numpy(x)):
        with pytest.raises(DataError, match=r"client 0 train inputs holds (torch\.)?complex128 "
                                            r"values; it must hold real numbers"):
            Federation.from_clients([(inputs, y, np.ones((2, 3)), y)])


def nan_target_source(**_: object) -> Source:
    """A pooled regression Source whose training target 7 is NaN (a loader's result)."""
    x, y = torch.ones(20, 3), torch.linspace(0.0, 1.0, 20)
    y[7] = float("nan")
    return Source(x, y, x[:5], y[:5].nan_to_num(), 1, "regression", "nan_targets")


def test_nan_or_infinite_targets_are_refused_naming_the_sample():
    """Before: regression targets NaN or inf loaded as they were (every loss NaN, every
    update of the client rejected); a NaN class label was told to use task = 'regression'."""
    x = np.ones((4, 3))
    for task, y in (("regression", [0.1, 0.2, np.inf, 0.3]),
                    ("classification", [0.0, 1.0, np.nan, 1.0])):
        with pytest.raises(DataError) as err:
            Federation.from_clients([(x, np.array(y), x, np.array([0.0, 1.0, 0.0, 1.0]))],
                                    task=task)
        assert str(err.value) == ("own data: client 0 train: sample 2 has a NaN or infinite "
                                  "target; clean or drop such samples first (its loss would "
                                  "be NaN)")
    source = f"{__name__}:nan_target_source"
    with pytest.raises(DataError) as err:
        build({"source": source}, "iid", {"n_clients": 2}, seed=0)
    assert str(err.value) == (f"data.source {source!r} (train): sample 7 (and 0 more) holds NaN "
                              "or infinite targets; clean or drop them first (no model trains "
                              "on them)")
