"""`clusterfl data ...` and `--data-dir` on the command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import clusterfl.data
from clusterfl.cli import main
from clusterfl.data.catalog import DATASETS, DatasetInfo, RemoteFile

PAYLOAD = b"clusterfl cli test file"


@pytest.fixture
def only_mnist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A data folder holding a (made-up, catalogued) mnist/ and nothing else."""
    remote = RemoteFile("mnist/a.bin", "https://example.invalid/a.bin", len(PAYLOAD),
                        hashlib.sha256(PAYLOAD).hexdigest(), hashlib.md5(PAYLOAD).hexdigest())
    monkeypatch.setitem(DATASETS, "mnist", DatasetInfo("mnist", "test", (remote,)))
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    (root / "mnist" / "a.bin").write_bytes(PAYLOAD)
    return root


def test_download_without_a_name_lists_the_names_and_fetches_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fetched: list[str] = []
    monkeypatch.setattr(clusterfl.data, "download", lambda name, *a, **k: fetched.append(name))
    assert main(["data", "download"]) == 2
    err = capsys.readouterr().err
    assert fetched == [] and err.count("\n") == 1
    assert err.startswith("clusterfl: error: data download: name the dataset")
    assert "cifar10, cifar100, emnist, fashion_mnist, mnist" in err


def test_verify_checks_the_datasets_present_only(only_mnist: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "verify", "--data-dir", str(only_mnist)]) == 0  # no CIFAR-10: fine
    out = capsys.readouterr().out
    assert f"mnist: {only_mnist / 'mnist' / 'a.bin'}: ok" in out
    assert "cifar10: not present" in out and "fashion_mnist: not present" in out
    assert main(["data", "verify", "cifar10", "--data-dir", str(only_mnist)]) == 1  # named
    (only_mnist / "mnist" / "a.bin").write_bytes(PAYLOAD[:-1])
    assert main(["data", "verify", "--data-dir", str(only_mnist)]) == 1  # present and bad


def test_verify_in_an_empty_folder_says_so(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 1
    assert f"no dataset files in {tmp_path}" in capsys.readouterr().err


def test_data_dir_before_the_subcommand(only_mnist: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data-dir", str(only_mnist), "data", "verify", "mnist"]) == 0
    assert str(only_mnist / "mnist" / "a.bin") in capsys.readouterr().out
    config = only_mnist.parent / "c.toml"
    config.write_text('[data]\nsource = "fashion_mnist"\n')
    assert main(["--data-dir", str(only_mnist), "run", str(config), "--quiet",
                 "--out", str(only_mnist.parent / "o")]) == 2
    assert f"the data folder {only_mnist} is data.data_dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--data-dir", str(only_mnist), "data", "verify", "--data-dir", "elsewhere"])


def test_a_data_folder_that_is_a_file_is_one_line_naming_where_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`data list` listed every dataset as missing; `data download` ended in "Not a
    directory: .../mnist"."""
    fetched: list[str] = []
    monkeypatch.setattr(clusterfl.data, "download", lambda name, *a, **k: fetched.append(name))
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for argv, source in [(["data", "list", "--data-dir", str(afile)], "--data-dir"),
                         (["data", "download", "mnist", "--data-dir", str(afile)], "--data-dir"),
                         (["--data-dir", str(afile), "data", "verify"], "--data-dir")]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"clusterfl: error: {source}: {afile} is a file, not a data folder"]
    monkeypatch.setenv("CLUSTERFL_DATA", str(afile))
    assert main(["data", "list"]) == 2
    assert capsys.readouterr().err.startswith("clusterfl: error: $CLUSTERFL_DATA: ")
    assert fetched == [] and afile.read_text() == "mine"
