"""`clusterfl data download` for the papers' other data sets, against a file:// mirror the test
writes (nothing can be downloaded here): the catalog's real entries, so CIFAR-100's size and
MD5 (as the publisher lists them) refuse a wrong file, EMNIST (NIST gives no checksum) is
saved and then read, and FEMNIST says what to make instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterfl.cli import main
from clusterfl.data.catalog import DATASETS
from clusterfl.data.download import download
from clusterfl.data.sources import load_source
from clusterfl.errors import DataError
from tests.paper_files import write_cifar100, write_emnist


def test_cifar100_download_refuses_a_file_with_the_wrong_size_or_md5(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    write_cifar100(mirror, train=100, test=100)  # a valid tarball, but not the publisher's
    dest = tmp_path / "data"
    with pytest.raises(DataError) as err:
        download("cifar100", dest, base_url=mirror.as_uri())
    text = str(err.value)
    assert "\n" not in text and "checksum mismatch for cifar100/cifar-100-python.tar.gz" in text
    assert "expected 169001437" in text and "not saved" in text
    assert not dest.exists()  # no partial file left behind, nor the folders made for it


def test_emnist_download_from_a_mirror_then_read(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import zipfile

    staging, mirror = tmp_path / "staging", tmp_path / "mirror"
    write_emnist(staging, "digits", per_class=3, test_per_class=1)
    (mirror / "emnist").mkdir(parents=True)
    with zipfile.ZipFile(mirror / "emnist" / "gzip.zip", "w") as zf:
        for f in sorted((staging / "emnist").iterdir()):
            zf.write(f, f"gzip/{f.name}")
    dest = tmp_path / "data"
    assert DATASETS["emnist"].files[0].md5 is None  # NIST publishes none: nothing to refuse
    assert main(["data", "download", "emnist", "--data-dir", str(dest),
                 "--base-url", mirror.as_uri()]) == 0
    assert "emnist/gzip.zip: unchecked (present; no official size" in capsys.readouterr().out
    src = load_source("emnist", dest, split="digits")
    assert src.n_classes == 10 and src.x_train.shape == (30, 1, 28, 28)


def test_femnist_has_nothing_to_download(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "download", "femnist", "--data-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no official file to download" in err
    assert f"copy data/train and data/test to {tmp_path / 'femnist'}/" in err
