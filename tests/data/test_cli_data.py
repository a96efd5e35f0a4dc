"""`clusterfl data ...` and `--data-dir` on the command line."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

import clusterfl.data
from clusterfl.cli import main
from clusterfl.data.catalog import DATASETS, DatasetInfo, RemoteFile
from tests.paper_files import (
    write_ag_news,
    write_cifar10,
    write_emnist,
    write_femnist,
    write_idx_set,
)

PAYLOAD = b"clusterfl cli test file"


@pytest.fixture
def only_mnist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A data folder holding a (made-up, catalogued) mnist/ and nothing else."""
    remote = RemoteFile("mnist/a.bin", "https://example.invalid/a.bin", len(PAYLOAD),
                        hashlib.sha256(PAYLOAD).hexdigest(), hashlib.md5(PAYLOAD).hexdigest())
    monkeypatch.setitem(DATASETS, "mnist", DatasetInfo("mnist", "test", (remote,)))
    root = tmp_path / "data"
    write_idx_set(root, "mnist")  # files the reader reads (verify reads what it checked)
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


def test_verify_reads_what_has_no_checksum_and_what_is_extracted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a truncated EMNIST gzip.zip (no official checksum) was "ok"; `verify femnist`
    and `verify ag_news` printed nothing and exited 0, even in an empty folder; CIFAR-10's
    extracted batches, which runs read, were "not present"."""
    root = tmp_path / "data"
    (root / "emnist").mkdir(parents=True)
    (root / "emnist" / "gzip.zip").write_bytes(b"PK\x03\x04" + b"x" * 3000)
    assert main(["data", "verify", "emnist", "--data-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert "gzip.zip: unchecked (present; no official size or checksum" in out
    assert "emnist: not readable: emnist:" in out and "corrupt or truncated" in out
    for name in ("femnist", "ag_news"):
        assert main(["data", "verify", name, "--data-dir", str(tmp_path / "empty")]) == 1
        assert f"{name}: not readable" in capsys.readouterr().out
    write_femnist(root)
    write_ag_news(root)
    assert main(["data", "verify", "femnist", "--data-dir", str(root)]) == 0
    assert "femnist: read: 48 train and 12 test samples, 62 classes" in capsys.readouterr().out
    assert main(["data", "verify", "ag_news", "--data-dir", str(root)]) == 0
    assert "ag_news: read: " in capsys.readouterr().out
    tar = write_cifar10(tmp_path / "tar")
    with tarfile.open(tar) as archive:  # the extracted batches, without the archive
        archive.extractall(root / "cifar10", filter="data")
    assert main(["data", "verify", "--data-dir", str(root)]) == 1  # emnist is still bad
    out = capsys.readouterr().out
    assert "cifar10: read: 100 train and 20 test samples, 10 classes" in out
    assert "cifar10: not present" not in out


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


def test_an_unknown_name_lists_every_dataset_and_list_takes_no_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the list named the five downloadable ones though `verify femnist`/`ag_news` work,
    # and `data list extra` ignored its word
    assert main(["data", "verify", "nosuch", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in sorted(DATASETS)), err
    assert "femnist" in DATASETS and "ag_news" in DATASETS
    assert main(["data", "list", "mnist", "--data-dir", str(tmp_path)]) == 2
    assert "data list: takes no dataset name (got 'mnist'); `clusterfl data verify mnist` " \
        "checks one" in capsys.readouterr().err


def test_a_data_dir_with_a_tilde_is_the_home_folder_for_verify_and_download(
        only_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--data-dir '~/data'` (or `--data-dir=~/data`, which the shell leaves as it is): a run
    read ~/data, but `data verify` called every file missing and `data download` wrote a
    folder named `~` in the current directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["data", "verify", "mnist", "--data-dir", "~/data"]) == 0
    out = capsys.readouterr().out
    assert f"mnist: {only_mnist / 'mnist' / 'a.bin'}: ok" in out and "missing" not in out
    assert main(["data", "download", "mnist", "--data-dir=~/fetched",
                 "--base-url", only_mnist.as_uri()]) == 0
    assert (tmp_path / "fetched" / "mnist" / "a.bin").read_bytes() == PAYLOAD
    assert not (cwd / "~").exists()
    assert [s.status for s in clusterfl.data.verify("mnist", "~/data")] == ["ok"]  # the API


def test_list_does_not_call_extracted_or_wrong_files_missing(
        only_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`data list` said "missing or incomplete" for CIFAR-10's extracted batches and EMNIST's
    loose .gz files, which runs and `data verify` read, and for files of the wrong dataset."""
    root = only_mnist
    write_emnist(root, per_class=1, test_per_class=1)
    with tarfile.open(write_cifar10(tmp_path / "tar")) as archive:
        archive.extractall(root / "cifar10", filter="data")
    (root / "mnist" / "a.bin").write_bytes(PAYLOAD[::-1])  # the size, not the checksum
    assert main(["data", "list", "--data-dir", str(root)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for name in ("cifar10", "emnist"):
        assert "present as other files" in lines[name], lines[name]
        assert main(["data", "verify", name, "--data-dir", str(root)]) == 0  # what it says
    assert "present, not the official files" in lines["mnist"]
    assert "missing or incomplete" in lines["cifar100"]


def test_built_in_sources_are_listed_and_verify_and_download_accept_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`data verify digits` and `data download digits` said "unknown 'digits'" (though
    `data list` named it and a run reads it), and `data list` left synthetic_regression out."""
    fetched: list[str] = []
    monkeypatch.setattr(clusterfl.data, "download", lambda name, *a, **k: fetched.append(name))
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert {"digits", "synthetic_regression", "synthetic_topics"} <= listed
    for action in ("verify", "download"):
        for name in ("digits", "synthetic_regression", "synthetic_topics"):
            assert main(["data", action, name, "--data-dir", str(tmp_path)]) == 0
            assert capsys.readouterr().out.startswith(f"{name}: built in: ")
    assert fetched == [] and not any(tmp_path.iterdir())
    assert main(["data", "verify", "nosuch", "--data-dir", str(tmp_path)]) == 2
    assert "digits, synthetic_regression, synthetic_topics (built in)" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("words", "error"), [
    (["verify", "mnist", "--out", "x"], "--out: only for `clusterfl data shard`, not "
                                        "`data verify`"),
    (["list", "--set", "seed=1"], "--set: only for `clusterfl data shard`, not `data list`"),
    (["shard", "c.toml", "--out", "x", "--base-url", "http://127.0.0.1:9"],
     "--base-url: only for `clusterfl data download`, not `data shard`"),
    (["verify", "--base-url", "http://127.0.0.1:9"],
     "--base-url: only for `clusterfl data download`, not `data verify`"),
    (["list", "--timeout", "5"], "--timeout: only for `clusterfl data download`, not "
                                 "`data list`"),
], ids=["out_with_verify", "set_with_list", "base_url_with_shard", "base_url_with_verify",
        "timeout_with_list"])
def test_an_option_of_another_data_action_is_refused_not_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        words: list[str], error: str) -> None:
    """`data verify --out X`, `data list --set ...` and `data shard --base-url URL` did what
    they do without the option and said nothing of it."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", *words, "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"clusterfl: error: {error}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_list_does_not_call_a_made_dataset_present_from_any_file_in_its_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`data list` said "present" for femnist/ or ag_news/ holding anything (a notes file),
    which a run cannot read; it reads nothing of them, so it says so and names `verify`."""
    for name in ("femnist", "ag_news"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("to do")
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for name in ("femnist", "ag_news"):
        assert lines[name].split(None, 1)[1].startswith(
            f"files present, not read here (`clusterfl data verify {name}` reads them)")
        assert main(["data", "verify", name, "--data-dir", str(tmp_path)]) == 1
        assert f"{name}: not readable: " in capsys.readouterr().out


def test_the_part_file_of_a_killed_download_is_not_a_dataset_present(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `data download` killed mid-file leaves `mnist/.train-images-idx3-ubyte.gz.*.part`:
    `data list` then said mnist was "present as other files (extracted or loose ...)" and
    `data verify` checked it as present; hidden files are no dataset's files. Both now name
    it (it was never mentioned, nor removed)."""
    (tmp_path / "mnist").mkdir()
    part = tmp_path / "mnist" / ".train-images-idx3-ubyte.gz.k1ll3d.part"
    part.write_bytes(PAYLOAD)
    note = (f"; left by an interrupted download: {part} (not counted; the next `clusterfl data "
            "download mnist` removes it)")
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["mnist"].split(None, 1)[1] == "missing or incomplete" + note
    assert lines["cifar10"].split(None, 1)[1] == "missing or incomplete"
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 1
    said = capsys.readouterr()
    assert f"mnist: not present in {tmp_path} (skipped; `clusterfl data download mnist` " \
        f"fetches it){note}\n" in said.out
    assert said.err.startswith(f"clusterfl: error: no dataset files in {tmp_path}; ")
    assert main(["data", "verify", "mnist", "--data-dir", str(tmp_path)]) == 1
    assert f"\nmnist: {note.removeprefix('; ')}\n" in capsys.readouterr().out
