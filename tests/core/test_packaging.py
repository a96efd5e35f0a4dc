"""Installing clusterfl prints no deprecation banner (the license as an SPDX string)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_string_for_a_setuptools_that_reads_it() -> None:
    """`project.license` as a TOML table makes setuptools ≥ 77 print a deprecation banner on
    every install; the SPDX string form needs setuptools ≥ 77 to build."""
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert data["project"]["license"] == "MIT"
    assert "setuptools>=77" in data["build-system"]["requires"]
