"""FEMNIST (clusterfl.data.leaf) on tiny files in LEAF's JSON format and as a Hugging Face
dataset on disk, the `writers` scenario (each writer one client, no true clusters), and the
`femnist` catalog entry (nothing to download: the message says what to make and where)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clusterfl.cli import main
from clusterfl.config import load_config
from clusterfl.data.download import download
from clusterfl.data.leaf import WriterSource
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import load_source
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import build_federation

# writer → (n train, n test); LEAF's `-t sample` puts every writer in both files
WRITERS = {"f0000_14": (5, 2), "f0001_41": (3, 1), "f0002_07": (7, 1), "f0003_11": (2, 1)}


def _one_line(err: pytest.ExceptionInfo[Exception], *parts: str) -> None:
    text = str(err.value)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, (part, text)


def _images(writer: int, n: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """n images whose pixel (r, c) encodes (writer, sample, r, c), labels 0..61."""
    rng = np.random.default_rng(100 * writer + offset)
    x = rng.integers(0, 256, (n, 28, 28)).astype(np.float32) / 255.0
    y = rng.integers(0, 62, n)
    return x, y


def leaf_blob(split: int, names: list[str]) -> dict[str, object]:
    users, counts, data = [], [], {}
    for name in names:
        w = list(WRITERS).index(name)
        n = WRITERS[name][split]
        x, y = _images(w, n, split)
        users.append(name)
        counts.append(n)
        data[name] = {"x": x.reshape(n, -1).tolist(), "y": y.tolist()}
    return {"users": users, "num_samples": counts, "user_data": data}


def write_leaf(root: Path) -> Path:
    """LEAF's layout: two files per split (writers spread over files, as LEAF writes them)."""
    folder = root / "femnist"
    names = list(WRITERS)
    for split, part in enumerate(("train", "test")):
        (folder / part).mkdir(parents=True, exist_ok=True)
        for i, chunk in enumerate((names[:2], names[2:])):
            path = folder / part / f"all_data_{i}_niid_0_keep_0_{part}_9.json"
            path.write_text(json.dumps(leaf_blob(split, chunk)))
    return folder


def test_leaf_json_folders_load_with_writers(tmp_path: Path) -> None:
    write_leaf(tmp_path)
    src = load_source("femnist", tmp_path)
    assert isinstance(src, WriterSource) and src.n_classes == 62 and src.name == "femnist"
    assert src.x_train.shape == (17, 1, 28, 28) and src.x_test.shape == (5, 1, 28, 28)
    assert list(src.writer_names) == list(WRITERS)
    assert np.bincount(src.train_writers).tolist() == [n for n, _ in WRITERS.values()]
    assert np.bincount(src.test_writers).tolist() == [n for _, n in WRITERS.values()]
    # row-major pixels kept as LEAF stores them (no transposition), labels as written
    x, y = _images(2, 7, 0)
    rows = np.flatnonzero(src.train_writers == 2)
    assert np.allclose(src.x_train[rows, 0].numpy(), x) and src.y_train[rows].tolist() == y.tolist()


def test_writers_scenario_makes_each_writer_a_client(tmp_path: Path) -> None:
    write_leaf(tmp_path)
    src = load_source("femnist", tmp_path)
    fed = make_federation(src, "writers", {"n_clients": 3, "pick": "largest"}, seed=0)
    assert fed.clusters is None and fed.n_true_clusters is None
    assert fed.meta["writers"] == ["f0002_07", "f0000_14", "f0001_41"]  # most samples first
    assert fed.train_sizes.tolist() == [7, 5, 3] and fed.test_sizes.tolist() == [1, 2, 1]
    x, _ = _images(2, 7, 0)
    assert np.allclose(fed.client_train(0)[0][:, 0].numpy(), x)  # writer f0002_07's own rows
    again = make_federation(src, "writers", {"n_clients": 2}, seed=5)
    assert again.n_clients == 2 and set(again.meta["writers"]) <= set(WRITERS)
    with pytest.raises(ConfigError) as err:
        make_federation(src, "writers", {"n_clients": 5})
    _one_line(err, "scenario.n_clients", "5 writers asked for, 4 have")
    with pytest.raises(ConfigError) as err:
        make_federation(src, "writers", {"n_clients": 2, "min_train": 6})
    _one_line(err, "scenario.n_clients", "1 have at least 6 training")


def test_writers_needs_writer_ids_and_config_default(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        make_federation("digits", "writers", {"n_clients": 2})
    _one_line(err, "scenario.name", "writer ids", "femnist")
    write_leaf(tmp_path)
    config = load_config({"data": {"source": "femnist", "data_dir": str(tmp_path)},
                          "scenario": {"n_clients": 4}})
    assert config.scenario_name == "writers"  # the default for femnist
    fed = build_federation(config)
    assert fed.n_clients == 4 and fed.clusters is None and fed.n_classes == 62


def test_truncated_and_wrong_leaf_files_are_one_line(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_1_niid_0_keep_0_train_9.json"
    text = bad.read_text()
    bad.write_text(text[: len(text) // 2])  # an interrupted copy
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "truncated or not JSON")
    bad.write_text(json.dumps({"data": [1, 2, 3]}))  # some other JSON
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "no users, num_samples, user_data")
    blob = leaf_blob(0, ["f0002_07"])
    blob["user_data"]["f0002_07"]["x"] = [[v * 255 for v in row]  # type: ignore[index]
                                          for row in blob["user_data"]["f0002_07"]["x"]]
    bad.write_text(json.dumps(blob))  # pixels 0..255: not LEAF's
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "'f0002_07'", "outside [0, 1]")
    blob = leaf_blob(0, ["f0002_07"])
    blob["num_samples"] = [6]
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "7 images, 7 labels, num_samples 6")
    blob = leaf_blob(0, ["f0002_07"])
    blob["user_data"]["f0002_07"]["x"][0] = [0.5] * 100  # type: ignore[index]
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "something other than numbers")


def test_missing_femnist_says_what_to_make_and_where(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(tmp_path / "femnist"), "preprocess.sh", "flwrlabs/femnist",
              "data.data_dir")
    (tmp_path / "femnist" / "train").mkdir(parents=True)
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, f"no LEAF .json files in {tmp_path / 'femnist' / 'train'}")
    with pytest.raises(DataError) as err:
        download("femnist", tmp_path)
    _one_line(err, "no official file to download", str(tmp_path / "femnist" / "hf"))


def test_data_list_shows_femnist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def femnist_line() -> str:
        out = capsys.readouterr().out
        return " ".join(out[out.index("\n  femnist "):].split()[:5])

    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    assert femnist_line() == "femnist missing (not downloadable: no"
    write_leaf(tmp_path)
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    assert femnist_line() == "femnist files present, not read"  # here; `data verify` reads


# ---------------------------------------------------------------------- Hugging Face


def write_hf(root: Path, columns: tuple[str, ...] = ("image", "writer_id", "character"),
             test_split: bool = False) -> Path:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    def table(split: int) -> dict[str, list[object]]:
        rows: dict[str, list[object]] = {"image": [], "writer_id": [], "character": []}
        for w, name in enumerate(WRITERS):
            n = sum(WRITERS[name]) if not test_split else WRITERS[name][split]
            x, y = _images(w, n, 9 + split)
            rows["image"] += [Image.fromarray((img * 255).astype(np.uint8)) for img in x]
            rows["writer_id"] += [name] * n
            rows["character"] += y.tolist()
        return {k: v for k, v in rows.items() if k in columns}

    features = {"image": datasets.Image(), "writer_id": datasets.Value("string"),
                "character": datasets.ClassLabel(num_classes=62)}
    feats = datasets.Features({k: v for k, v in features.items() if k in columns})
    path = root / "femnist" / "hf"
    if test_split:
        dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(table(i), features=feats)
                                   for i, s in enumerate(("train", "test"))})
        dd.save_to_disk(str(path))
    else:
        datasets.Dataset.from_dict(table(0), features=feats).save_to_disk(str(path))
    return path


def test_hugging_face_femnist_splits_each_writer(tmp_path: Path) -> None:
    write_hf(tmp_path)
    src = load_source("femnist", tmp_path)
    assert isinstance(src, WriterSource) and src.n_classes == 62
    total = np.array([sum(v) for v in WRITERS.values()])
    n_test = np.bincount(src.test_writers, minlength=4)
    assert (np.bincount(src.train_writers, minlength=4) + n_test).tolist() == total.tolist()
    assert n_test.tolist() == [1, 1, 1, 1]  # round(0.1 n), at least one, never all
    assert src.x_train.shape[1:] == (1, 28, 28) and float(src.x_train.max()) <= 1.0
    fed = make_federation(src, "writers", {"n_clients": 4}, seed=0)
    assert fed.n_clients == 4 and fed.clusters is None


def test_hugging_face_femnist_with_test_split_and_wrong_columns(tmp_path: Path) -> None:
    write_hf(tmp_path, test_split=True)
    src = load_source("femnist", tmp_path)
    x, y = _images(0, WRITERS["f0000_14"][1], 10)
    rows = np.flatnonzero(src.test_writers == 0)
    assert np.allclose(src.x_test[rows, 0].numpy(), np.round(x * 255) / 255, atol=1e-6)
    assert src.y_test[rows].tolist() == y.tolist()
    other = tmp_path / "other"
    write_hf(other, columns=("image", "character"))
    with pytest.raises(DataError) as err:
        load_source("femnist", other)
    _one_line(err, str(other / "femnist" / "hf"), "no column writer_id")
    (other / "femnist" / "hf" / "state.json").write_text("{")  # a broken save_to_disk
    with pytest.raises(DataError) as err:
        load_source("femnist", other)
    _one_line(err, str(other / "femnist" / "hf"), "not a readable Hugging Face dataset")


# ---------------------------------------------------------------------- hostile LEAF files


def test_writer_in_two_train_files_is_refused(tmp_path: Path) -> None:
    """A second copy of a train file would read its writers twice; LEAF writes each writer
    into one file of a split."""
    folder = write_leaf(tmp_path)
    first = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    copy = folder / "train" / "all_data_0 (copy).json"
    copy.write_bytes(first.read_bytes())
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, "writer 'f0000_14' appears in", str(copy.resolve()), str(first.resolve()),
              "one train file")


def test_test_file_copied_into_train_is_refused(tmp_path: Path) -> None:
    # `-t sample`: the test file's writers are already in a train file
    folder = write_leaf(tmp_path)
    test_file = folder / "test" / "all_data_1_niid_0_keep_0_test_9.json"
    (folder / "train" / test_file.name).write_bytes(test_file.read_bytes())
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, "writer 'f0002_07' appears in", test_file.name, "one train file")
    # `-t user`: train and test writers differ, so the copy's rows are its test rows
    other = tmp_path / "by_user" / "femnist"
    names = list(WRITERS)
    for split, part, chunk in ((0, "train", names[:2]), (1, "test", names[2:])):
        (other / part).mkdir(parents=True)
        (other / part / f"all_data_0_{part}.json").write_text(json.dumps(leaf_blob(split, chunk)))
    src = load_source("femnist", other.parent)  # the layout itself is fine
    assert list(src.writer_names) == names and len(src.x_test) == 2
    (other / "train" / "all_data_0_test.json").write_bytes(
        (other / "test" / "all_data_0_test.json").read_bytes())
    with pytest.raises(DataError) as err:
        load_source("femnist", other.parent)
    _one_line(err, "writer 'f0002_07' has the same images in", "copied into train/")


def test_user_listed_twice_in_one_file_is_refused(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    blob["users"] = ["f0000_14", "f0000_14", "f0001_41"]
    blob["num_samples"] = [5, 5, 3]
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "user 'f0000_14' listed twice in users")


def test_user_data_of_unlisted_users_is_refused_unless_empty(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    # LEAF's split_data.py -t sample keeps {"x": [], "y": []} of writers it dropped
    blob["user_data"]["f0009_99"] = {"x": [], "y": []}  # type: ignore[index]
    bad.write_text(json.dumps(blob))
    src = load_source("femnist", tmp_path)
    assert "f0009_99" not in src.writer_names and len(src.x_train) == 17
    blob["user_data"]["extra"] = blob["user_data"]["f0000_14"]  # type: ignore[index]
    blob["users"], blob["num_samples"] = ["f0000_14"], [5]  # f0001_41's rows: unlisted too
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), "2 user(s) with samples that users does not list",
              "'f0001_41'", "'extra'")


def test_user_ids_must_be_strings_or_integers(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    blob["users"] = [["f0000_14"], "f0001_41"]
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), 'users holds ["f0000_14"]', "user ids must be strings")
    # integer ids: user_data's keys are their strings (JSON has no other keys)
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    data = blob["user_data"]
    blob["users"] = [0, 1]
    blob["user_data"] = {"0": data["f0000_14"], "1": data["f0001_41"]}  # type: ignore[index]
    bad.write_text(json.dumps(blob))
    src = load_source("femnist", tmp_path)
    assert src.writer_names[:2] == ("0", "1") and np.bincount(src.train_writers)[:2].tolist() \
        == [5, 3]


def test_writer_without_samples_is_read_as_no_rows(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    path = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    blob["user_data"]["f0001_41"] = {"x": [], "y": []}  # type: ignore[index]
    blob["num_samples"] = [5, 0]
    path.write_text(json.dumps(blob))
    src = load_source("femnist", tmp_path)
    assert np.bincount(src.train_writers, minlength=4).tolist() == [5, 0, 7, 2]
    fed = make_federation(src, "writers", {"n_clients": 3, "pick": "largest"}, seed=0)
    assert "f0001_41" not in fed.meta["writers"]
    with pytest.raises(ConfigError) as err:
        make_federation(src, "writers", {"n_clients": 4})
    _one_line(err, "4 writers asked for, 3 have")


def test_folder_named_json_is_one_line(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path)
    (folder / "train" / "broken.json").mkdir()
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, "cannot read", "broken.json")


def test_labels_written_as_text_or_booleans_are_refused_not_converted(tmp_path: Path) -> None:
    """Before: `"y": ["3", ...]` read as 3 and `true` as 1, without a word."""
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    for odd, shown in (("3", '"3"'), (True, "true")):
        blob = leaf_blob(0, ["f0000_14", "f0001_41"])
        entry = blob["user_data"]["f0000_14"]  # type: ignore[index]
        entry["y"] = [odd, *entry["y"][1:]]
        bad.write_text(json.dumps(blob))
        with pytest.raises(DataError) as err:
            load_source("femnist", tmp_path)
        _one_line(err, str(bad), f"user 'f0000_14': y holds {shown}; LEAF's labels are integers")


def test_hugging_face_femnist_rewritten_inside_hf_is_read_again(tmp_path: Path) -> None:
    """The decoded copy was keyed on the time of `hf/` alone, which a parquet file copied over
    inside it (or a new save_to_disk's train/ files) leaves as it is: the old rows came back
    in the same process, and `forget_decoded` did not drop femnist's decoded data either."""
    datasets = pytest.importorskip("datasets")
    from clusterfl.data import leaf
    from clusterfl.data.sources import forget_decoded

    path = tmp_path / "femnist" / "hf" / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    feats = datasets.Features({"image": datasets.Image(), "character": datasets.Value("int64"),
                               "writer_id": datasets.Value("string")})

    def write(n: int, ink: int) -> None:
        rows = {"image": [np.full((28, 28), ink, np.uint8)] * n, "character": [3] * n,
                "writer_id": [f"w{i % 2}" for i in range(n)]}
        datasets.Dataset.from_dict(rows, features=feats).to_parquet(str(path))

    write(10, 255)
    first = load_source("femnist", tmp_path)
    assert len(first.y_train) + len(first.y_test) == 10 and float(first.x_train.max()) == 1.0
    write(20, 0)
    again = load_source("femnist", tmp_path)
    assert len(again.y_train) + len(again.y_test) == 20 and float(again.x_train.max()) == 0.0
    assert leaf._decode_hf.cache_info().currsize > 0
    forget_decoded()
    assert leaf._decode_hf.cache_info().currsize == 0
    assert leaf._decode_leaf.cache_info().currsize == 0


@pytest.mark.parametrize(("count", "shown"), [("5", '"5"'), (True, "true"), (None, "null"),
                                              (5.5, "5.5")])
def test_num_samples_that_are_no_counts_are_named(tmp_path: Path, count: object,
                                                  shown: str) -> None:
    """Before: `"num_samples": ["5", ...]` read "user 'f0000_14': 5 images, 5 labels,
    num_samples 5", a mismatch of equal-looking numbers."""
    folder = write_leaf(tmp_path)
    bad = folder / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    blob = leaf_blob(0, ["f0000_14", "f0001_41"])
    blob["num_samples"] = [count, 3]
    bad.write_text(json.dumps(blob))
    with pytest.raises(DataError) as err:
        load_source("femnist", tmp_path)
    _one_line(err, str(bad), f"num_samples holds {shown}; counts must be whole numbers >= 0")
    assert "images" not in str(err.value)
