"""Nothing in the repository depends on one machine: no shipped config pins a data folder, and
no file names the folders of the machine it was written on."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the workspace layout the repository was first written in, and home/server folders of one
# machine in examples; built so this file does not match
MACHINE = re.compile("/" + "work/|/" + "tmp/(quickruns|cfl|cfl-runs|cfl_gp_bench)\\b|/" + "home/"
                     "|/" + "srv/|" + "[\"' ]/" + "data/")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / p for p in out.decode().split("\0") if p]


def _configs() -> list[Path]:
    return sorted([*(ROOT / "src" / "clusterfl" / "configs").glob("*.toml"),
                   *(ROOT / "benchmarks").rglob("*.toml")])


@pytest.mark.parametrize("path", _configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_leave_the_data_folder_to_the_user(path: Path) -> None:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    for table in (raw, raw.get("config", {})):  # a run config, or a suite file's [config]
        assert "data_dir" not in table.get("data", {}), (
            f"{path.name}: data.data_dir pins one machine's folder; use --data-dir or "
            "$CLUSTERFL_DATA")


def test_no_file_names_a_folder_of_one_machine() -> None:
    found = []
    for path in _tracked():
        if path.suffix in {".png", ".pt", ".npz", ".gz", ".pdf"} or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{n}" for n, line in
                  enumerate(text.splitlines(), 1) if MACHINE.search(line)]
    assert not found, "machine paths in: " + ", ".join(found[:20])
