"""Issue 35: every feature of an extra that is not installed fails in one line naming the
`pip install 'clusterfl[...]'` that brings it, before the run starts where it can.

Nothing is uninstalled: each case runs in a subprocess that puts `None` into
`sys.modules[...]` for the missing package first, which makes every import of it fail as it
would without the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusterfl.errors import EXTRAS, MissingExtraError, require

DEMO = str(Path(__file__).resolve().parents[2] / "src" / "clusterfl" / "configs" / "demo.toml")
ONE_ROUND = ["--set", "rounds=1", "--quiet"]
FLT = ["--set", 'algorithm.name="flt"', "--set", 'algorithm.encoder="none"',
       "--set", "algorithm.finetune_epochs=0", "--set", "algorithm.latent=8"]
PRIVACY = ["--set", "privacy.clip=1.0", "--set", "privacy.noise_multiplier=1.0"]


def _python(code: str, missing: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` run with the packages `missing` made unimportable."""
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in missing)
    script = "import sys\n" + block + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _cli(argv: list[str], missing: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _python(f"from clusterfl.cli import main\nsys.exit(main({argv!r}))", missing, cwd)


# (case, extra, packages made missing, command line): every extra, each entry point
CASES = [
    ("flower run --mode local", "flower", ("flwr",),
     ["flower", "run", DEMO, "--mode", "local", "--out", "flower-run"]),
    ("flower run --mode submit", "flower", ("flwr",),
     ["flower", "run", DEMO, "--mode", "submit"]),
    ("flower certs", "flower", ("cryptography",),
     ["flower", "certs", "certs", "--host", "localhost"]),
    ("flower run --mode ray without ray", "ray", ("ray",),
     ["flower", "run", DEMO, "--mode", "ray", "--out", "flower-run"]),
    ("flower run --mode ray without Flower", "ray", ("flwr", "ray"),
     ["flower", "run", DEMO, "--mode", "ray", "--out", "flower-run"]),
    ("FLT's UMAP", "flt", ("umap",), ["run", DEMO, "--out", "run", *ONE_ROUND, *FLT]),
    ("FLT's UMAP without numba", "flt", ("numba",),
     ["run", DEMO, "--out", "run", *ONE_ROUND, *FLT]),
    ("privacy accountant", "privacy", ("dp_accounting",),
     ["run", DEMO, "--out", "run", *ONE_ROUND, *PRIVACY]),
    ("tensorboard", "tensorboard", ("tensorboard",),
     ["run", DEMO, "--out", "run", *ONE_ROUND, "--set", "output.tensorboard=true"]),
]


def test_every_extra_has_a_case() -> None:
    assert {extra for _, extra, _, _ in CASES} == set(EXTRAS)


@pytest.mark.parametrize(("case", "extra", "missing", "argv"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_missing_extra_fails_in_one_line_naming_its_pip_install(
        tmp_path: Path, case: str, extra: str, missing: tuple[str, ...], argv: list[str]) -> None:
    r = _cli(argv, missing, tmp_path)
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, (case, r.stderr)
    package = EXTRAS[extra][0]
    assert lines[0].startswith("clusterfl: error: ")
    assert lines[0].endswith(f"needs {package} (no module named {missing[-1]!r}): "
                             f"pip install 'clusterfl[{extra}]'"), lines[0]
    # nothing ran: no Flower process, no certificate, no round (FLT clusters in round 1)
    assert not (tmp_path / "certs").exists() and not (tmp_path / "flower-run.flower").exists()
    history = tmp_path / "run" / "history.jsonl"
    assert not history.exists() or history.read_text() == "", case


@pytest.mark.parametrize("call", [
    "from clusterfl.backends.flower import codec\ncodec.to_recorddict({'a': 1})",
    "from clusterfl.deploy import supernode\nsupernode.patch()",
    "from clusterfl.deploy import superexec\nsuperexec._internals()",
    "from clusterfl.deploy.launch import local_deployment\n"
    "with local_deployment(__import__('pathlib').Path('w')): pass",
])
def test_flower_code_used_without_the_cli_names_the_flower_extra(tmp_path: Path,
                                                                  call: str) -> None:
    code = f"""
        from clusterfl.errors import MissingExtraError
        try:
{textwrap.indent(call, " " * 12)}
        except MissingExtraError as exc:
            print(exc.extra, exc.missing)
    """
    r = _python(code, ("flwr",), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "flower flwr"
    assert not (tmp_path / "w").exists()  # no deployment folder was started


def test_require_finds_without_importing_and_names_the_missing_dependency(
        tmp_path: Path) -> None:
    """`load=False` only looks for the package (umap stays unimported); a package that is
    there but lacks a dependency of its own is reported with that dependency's name."""
    r = _python("""
        from clusterfl.errors import MissingExtraError, require
        require("flt", "umap", load=False)
        print("umap" in sys.modules)
        try:
            require("flt", "umap")
        except MissingExtraError as exc:
            print(exc.extra, exc.missing)
    """, ("numba",), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["False", "flt numba"]


def test_require_raises_for_an_absent_module_and_returns_for_a_present_one() -> None:
    require("tensorboard", "json")  # any importable module passes
    with pytest.raises(MissingExtraError, match=r"pip install 'clusterfl\[privacy\]'$"):
        require("privacy", "clusterfl_no_such_module.sub", load=False)
    with pytest.raises(MissingExtraError) as info:
        require("privacy", "clusterfl_no_such_module.sub")
    assert info.value.missing == "clusterfl_no_such_module"
