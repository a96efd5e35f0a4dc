"""Installing clusterfl prints no deprecation banner (the license as an SPDX string); the core
install holds only what `clusterfl run` needs, every optional package is an extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from clusterfl.errors import EXTRAS

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_string_for_a_setuptools_that_reads_it() -> None:
    """`project.license` as a TOML table makes setuptools ≥ 77 print a deprecation banner on
    every install; the SPDX string form needs setuptools ≥ 77 to build."""
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert data["project"]["license"] == "MIT"
    assert "setuptools>=77" in data["build-system"]["requires"]


# ------------------------------------------------------------------ a light core (issue 35)

OPTIONAL = ("flwr", "ray", "umap", "numba", "llvmlite", "pynndescent", "dp_accounting",
            "tensorboard", "torch.utils.tensorboard", "cryptography")
"""Modules that only the extras bring (and what they pull: numba and llvmlite with umap-learn,
cryptography with flwr)."""

DEMO = Path(__file__).resolve().parents[2] / "src" / "clusterfl" / "configs" / "demo.toml"


def _name(requirement: str) -> str:
    """The distribution name of a requirement string ("flwr[simulation]==1.41.0" → "flwr")."""
    return re.split(r"[ <>=!;\[~]", requirement, maxsplit=1)[0].lower()


def _closure(extras: dict[str, list[str]], extra: str) -> set[str]:
    """Every requirement an extra brings, following `clusterfl[a,b]` references."""
    out: set[str] = set()
    for req in extras[extra]:
        if _name(req) == "clusterfl":
            inner = req[req.index("[") + 1: req.index("]")]
            for sub in inner.split(","):
                out |= _closure(extras, sub.strip())
        else:
            out.add(req)
    return out


def test_the_core_dependencies_hold_none_of_the_extras() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert "torch" in core and "scikit-learn" in core
    assert not core & {"flwr", "ray", "umap-learn", "dp-accounting", "tensorboard", "numba"}


def test_every_extra_that_an_error_names_exists_and_dev_pulls_them_all() -> None:
    """`MissingExtraError` names `pip install 'clusterfl[X]'`: X must be an extra holding the
    package the message names; `all` holds every extra and `dev` (what `make test` installs)
    holds `all`, so the tests run with every extra."""
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    assert set(EXTRAS) == {"flower", "ray", "flt", "privacy", "tensorboard"}
    everything = set()
    for extra, (package, _) in EXTRAS.items():
        assert package in extras[extra] or any(
            r.startswith(package + "==") or r.startswith(package + ">=") for r in extras[extra]
        ), (extra, package, extras[extra])
        everything |= _closure(extras, extra)
    everything |= _closure(extras, "hf") | _closure(extras, "sweep")  # no error names them
    assert _closure(extras, "all") == everything
    assert _closure(extras, "dev") >= everything
    assert "flwr[simulation]==1.41.0" in _closure(extras, "ray")


def test_import_help_and_a_demo_run_load_no_optional_package(tmp_path: Path) -> None:
    """`import clusterfl`, `clusterfl --help`, every method's module and `clusterfl run` of
    the demo config (two rounds) load none of the extras' packages, although they are
    installed here (so an import would show in sys.modules)."""
    code = textwrap.dedent(f"""
        import contextlib, io, sys
        import clusterfl, clusterfl.cli
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            clusterfl.cli.main(["--help"])
        import clusterfl.algorithms
        rc = clusterfl.cli.main(["run", {str(DEMO)!r}, "--out", {str(tmp_path / "run")!r},
                                 "--set", "rounds=2", "--quiet"])
        print(rc, sorted(m for m in {OPTIONAL!r} if m in sys.modules))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "0 []"
    assert (tmp_path / "run" / "summary.json").exists()
