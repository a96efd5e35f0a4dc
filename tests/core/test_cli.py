"""The command line as a user meets it: fast help, one-line errors, names, warnings."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterfl.cli import DEMO_METHODS, build_parser, main
from clusterfl.cli_util import given_twice
from clusterfl.config import dump_toml
from clusterfl.errors import ConfigError
from tests.tiny import tiny_config

#: what building the parser must not import (each costs a second or more of CPU)
HEAVY = ("torch", "numpy", "matplotlib", "flwr", "sklearn", "clusterfl.experiment",
         "clusterfl.algorithms", "clusterfl.config", "clusterfl.bench", "clusterfl.report")
#: generous: about 0.1 s here; 4-5 s of CPU before the imports were made lazy
HELP_SECONDS = 2.5
SAFE_NAME = re.compile(r"[A-Za-z0-9_=.-]+")

TINY = tiny_config()
REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, **changes: object) -> str:
    path.write_text(dump_toml({**TINY, **changes}))
    return str(path)


def _cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.run([sys.executable, "-m", "clusterfl.cli", *argv], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


# --------------------------------------------------------------------------- help


def test_building_the_parser_imports_nothing_heavy() -> None:
    code = ("import sys; from clusterfl.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", [
    [], ["run"], ["compare"], ["report"], ["demo"], ["data"], ["config"], ["place"],
    ["cfl-place"],
    ["encoder"], ["encoder", "train"], ["flower"], ["flower", "run"], ["bench"],
])
def test_help_answers_at_once(command: list[str]) -> None:
    started = time.perf_counter()
    r = _cli(*command, "--help")
    seconds = time.perf_counter() - started
    assert r.returncode == 0 and "usage: clusterfl" in r.stdout
    assert seconds < HELP_SECONDS, f"clusterfl {' '.join(command)} --help took {seconds:.2f} s"


# --------------------------------------------------------------------------- config show


def test_config_show_prints_the_resolved_config(tmp_path: Path, capsys) -> None:
    assert main(["config", "show"]) == 0  # the defaults
    defaults = tomllib.loads(capsys.readouterr().out)
    assert defaults["rounds"] == 50 and defaults["algorithm"]["name"] == "fedavg"
    path = _write(tmp_path / "c.toml", algorithm={"name": "ifca", "n_clusters": 2})
    assert main(["config", "show", path, "--set", "rounds=7"]) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    assert shown["rounds"] == 7 and shown["algorithm"]["averaging"] == "model"  # a default
    assert main(["config", path]) == 0  # `show` may be left out
    assert tomllib.loads(capsys.readouterr().out)["rounds"] == 2


def test_config_show_shows_every_default_the_written_config_leaves_out(capsys) -> None:
    """`config show` ("with every default filled in") left out the backend's device settings,
    the whole [validation] table and the settings at none: a user looking for the default of
    median_multiple or chunk_size found nothing."""
    from clusterfl.config import load_config

    assert main(["config", "show", "--set", "privacy.clip=2.5"]) == 0
    out = capsys.readouterr().out
    shown = tomllib.loads(out)  # the comments leave it a config that loads
    assert load_config(shown).privacy.clip == 2.5
    comments = {line[2:].split(" = ")[0]: line.split(" = ", 1)[1]
                for line in out.splitlines() if line.startswith("# ") and " = " in line}
    for name, default in (("validation.median_multiple", "100.0"),
                          ("validation.enabled", "true"), ("backend.chunk_size", '"auto"'),
                          ("backend.device", '"auto"'), ("eval_clients", "none"),
                          ("adversary.kind", '"none"')):
        assert comments[name] == default, name
    assert "privacy.clip" not in comments and "privacy.delta" not in comments  # written
    assert shown["privacy"]["noise_multiplier"] == 0.0  # a set table is written whole
    written = {f"{t}.{k}" for t, v in shown.items() if isinstance(v, dict) for k in v}
    assert not written & set(comments)  # each setting once: written, or a comment


# --------------------------------------------------------------------------- compare


@pytest.mark.parametrize(("algorithms", "message"), [
    ("", "--algorithms: no method given; list methods separated by commas"),
    (" , ", "--algorithms: no method given"),
    ("fedavg,fedavg", "--algorithms: 'fedavg' and 'fedavg' are the same method with the same "
                      "options (FedAvg); list each once"),
    ("ifca:n_clusters=2:averaging=model,ifca:averaging=model:n_clusters=2",
     "are the same method with the same options (IFCA (K=2))"),
])
def test_compare_refuses_no_method_or_one_twice(tmp_path: Path, algorithms: str,
                                                message: str, capsys) -> None:
    rc = main(["compare", _write(tmp_path / "c.toml"), "--algorithms", algorithms,
               "--out", str(tmp_path / "out")])
    printed = capsys.readouterr()
    assert rc == 2 and printed.out == ""
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterfl: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()  # refused before any run


def test_a_methods_own_option_set_on_the_shared_table_points_to_its_spec(tmp_path: Path,
                                                                           capsys) -> None:
    """`--set algorithm.auto.…` on a comparison whose shared [algorithm] table is FedAvg's:
    one line naming the field, FedAvg's fields, and where a method's own options go."""
    for argv, flag in (
            (["demo", "--methods", "cfl"], "--methods"),
            (["compare", _write(tmp_path / "c.toml"), "--algorithms", "cfl"], "--algorithms")):
        rc = main([*argv, "--out", str(tmp_path / "out"), "--set",
                   "algorithm.auto.separation=0.9"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, lines
        assert lines[0].startswith("clusterfl: error: algorithm.auto: unknown field; allowed "
                                   "fields here: fraction, name, per_round")
        assert f"go in its spec, e.g. {flag} cfl:auto.separation=0.9" in lines[0]
        assert not (tmp_path / "out").exists()


def test_compare_names_runs_by_one_scheme_and_shows_their_options(tmp_path: Path,
                                                                 capsys) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", _write(tmp_path / "c.toml"), "--algorithms",
                 "fedavg:fraction=0.5,ifca:n_clusters=2", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr()
    assert "FedAvg (fraction=0.5)" in printed.out and "IFCA (K=2)" in printed.out
    assert "federations differ" not in printed.err  # one federation
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "fedavg_fraction=0.5", "ifca_n_clusters=2"]
    report = (out / "report.md").read_text()
    assert "| FedAvg (fraction=0.5) |" in report and "| IFCA (K=2) |" in report
    assert "**Warning:**" not in report  # no comparison warning (a run's: "Warning (label)")
    runs = report.split("## Runs", 1)[1]
    assert "| method | options | federation | folder |" in runs
    assert "fraction=1.0, n_clusters=2, averaging=model" in runs  # every option of the run
    assert "| `digits/rotation`, 4 clients, seed 0 | `ifca_n_clusters=2` |" in runs


def test_demo_methods_get_distinct_safe_folder_names() -> None:
    """The demo's folders have no quotes or other unsafe characters (once `"model"`)."""
    from importlib import resources

    from clusterfl.compare import comparison_configs
    from clusterfl.config import load_config, read_toml

    with resources.as_file(resources.files("clusterfl") / "configs" / "demo.toml") as path:
        config = load_config(read_toml(path))
    folders = [f for f, _ in comparison_configs(config, DEMO_METHODS)]
    assert len(set(folders)) == len(DEMO_METHODS)
    assert all(SAFE_NAME.fullmatch(f) for f in folders), folders
    assert "cfl_gp_n_clusters=4_protocol=model" in folders
    quoted = comparison_configs(config, ['cfl_gp:protocol="model"'])  # a TOML string
    assert [f for f, _ in quoted] == ["cfl_gp_n_clusters=4_protocol=model"]


@pytest.mark.parametrize(("methods", "message"), [
    ("", "--methods: no method given"),
    ("nope", "--methods: unknown value 'nope'"),
    ("ifca:n_clusters", "--methods: 'n_clusters' in 'ifca:n_clusters' has no value"),
    # a name in another case, an option after a comma: said what was meant
    ("IFCA:n_clusters=4", "--methods: unknown value 'IFCA' (names are lower case: 'ifca'); "),
    ("ifca:n_clusters=4,averaging=model", "--methods: unknown value 'averaging=model' (an "
     "option? a method's options follow it after ':', e.g. ifca:n_clusters=4:averaging=model; "
     "',' separates methods); allowed: cfl, "),
])
def test_a_bad_demo_method_names_the_demos_own_flag(tmp_path: Path, capsys, methods: str,
                                                     message: str) -> None:
    # before: the error named `--algorithms`, compare's flag, which the demo does not have
    out = tmp_path / "demo"
    assert main(["demo", "--methods", methods, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {message}")
    assert "--algorithms" not in err[0] and not out.exists()


# --------------------------------------------------------------------------- report


def _run(out: Path, **changes: object) -> Path:
    from clusterfl.config import load_config
    from clusterfl.experiment import Experiment

    Experiment(load_config({**TINY, **changes}), out).run(progress=False)
    return out


def test_report_warns_when_the_runs_federations_differ(tmp_path: Path, capsys) -> None:
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", seed=1,
             scenario={"name": "rotation", "n_clients": 6, "angles": [0, 180]})
    c = _run(tmp_path / "c", algorithm={"name": "ifca", "n_clusters": 2})
    capsys.readouterr()  # the runs' own warnings (2 rounds: the models did not learn yet)
    assert main(["report", str(a), str(c), "--out", str(tmp_path / "same")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("clusterfl: warning: the runs' federations differ")
    # two runs named alike are told apart by their folders, on the console and in the report
    assert "n_clients = 4 for FedAvg [a]; 6 for FedAvg [b]" in err
    assert "seed = 0 for FedAvg [a]; 1 for FedAvg [b]" in err
    text = (tmp_path / "rep" / "report.md").read_text()
    head = text.split("## Results", 1)[0]
    assert "> **Warning:** the runs' federations differ" in head
    assert "scenario.n_clients = 4 for FedAvg [a]; 6 for FedAvg [b]" in head
    assert "4 clients, seed 0" in text and "6 clients, seed 1" in text


def test_a_report_of_a_run_and_a_folder_that_is_none_leaves_no_empty_out(tmp_path: Path,
                                                                        capsys) -> None:
    """Before: one line naming the folder that is not a run, and an empty --out left
    behind."""
    a = _run(tmp_path / "a")
    capsys.readouterr()
    assert main(["report", str(a), str(tmp_path / "notarun"), "--out",
                 str(tmp_path / "rep")]) == 2
    assert "notarun: not a directory" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


# --------------------------------------------------------------------------- place


def test_place_and_its_alias_cfl_place_work_on_any_method(tmp_path: Path, capsys) -> None:
    """`cfl-place` is now `place` under its former name: it places clients of any method
    (tests/core/test_cli_place.py tests the command itself)."""
    run = _run(tmp_path / "ifca", checkpoint_every=1,
               algorithm={"name": "ifca", "n_clusters": 2})
    for command in ("place", "cfl-place"):
        assert main([command, str(run), "--clients", "1,2", "--json",
                     str(tmp_path / f"{command}.json")]) == 0
        assert "IFCA (K=2): placement of clients" in capsys.readouterr().out
    assert ((tmp_path / "place.json").read_text()
            == (tmp_path / "cfl-place.json").read_text())
    assert main(["cfl-place", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


# --------------------------------------------------------------------------- README


def test_readme_python_snippet_runs_from_any_folder(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "runs" / "python-ifca" / "summary.json").is_file()


@pytest.mark.parametrize(("argv", "status"), [(["config", "show"], 1), (["run", "--help"], 0)])
def test_a_reader_that_went_away_ends_the_command_without_an_error_line(tmp_path, argv,
                                                                        status):
    """`clusterfl config show | head -1`: the pipe's reader is gone before the command
    writes. It printed `clusterfl: error: Broken pipe:` and exited 2; now nothing is said
    and the status is 1, as for the commands that print through rich (which handles it
    so), and --help's 0 is kept."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
           "CLUSTERFL_DATA": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "clusterfl.cli", *argv], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the only read end: the command's first write meets no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == status
    assert err == ""


def test_sigterm_handler_is_installed_over_the_default_only_and_fires_once(monkeypatch):
    """The first SIGTERM unwinds the command (`Terminated`, a KeyboardInterrupt); the handler
    then gives SIGTERM back to the default, so a second one ends the process at once while
    it cleans up; a program that has its own handler keeps it."""
    import signal

    from clusterfl.cli import Terminated, _raise_terminated, _stop_on_sigterm

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert _stop_on_sigterm() is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is _raise_terminated
        with pytest.raises(Terminated):
            _raise_terminated(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert issubclass(Terminated, KeyboardInterrupt)

        def own(signum, frame):  # pragma: no cover - never called
            pass

        signal.signal(signal.SIGTERM, own)
        assert _stop_on_sigterm() is None and signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(("argv", "named"), [
    (["run", "CONFIG", "--out", ""], "--out"),           # `--out "$UNSET"`
    (["run", ""], "config"),
    (["--data-dir", "", "run", "CONFIG"], "--data-dir"),
    (["run", "CONFIG", "--data-dir", " "], "--data-dir"),
    (["bench", "--quick", "--runs", ""], "--runs"),                 # was the current folder
    (["bench", "--quick", "--results", "", "--report-only"], "--results"),
    (["report", "RUN", ""], "dirs"),
    (["flower", "run", "CONFIG", "--out", ""], "--out"),
    (["encoder", "train", "--source", "mnist", "--out", ""], "--out"),
])
def test_an_empty_option_value_is_refused_not_replaced_by_the_default(tmp_path: Path, capsys,
                                                                       monkeypatch, argv, named):
    """An empty value (an unset shell variable) used to mean "not given": `--out ""` wrote
    to runs/<config name>, `--data-dir ""` read $CLUSTERFL_DATA, `report ""` read the
    current folder. Now one line names the option, before anything runs or is written."""
    config = tmp_path / "c.toml"
    config.write_text(dump_toml(tiny_config()))
    monkeypatch.chdir(tmp_path)
    argv = [str(config) if a == "CONFIG" else str(tmp_path) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"clusterfl: error: {named}: an empty value; give one or leave the option out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


@pytest.mark.parametrize("option", ["--only", "--methods"])
def test_bench_with_an_empty_name_list_is_refused_not_the_whole_suite(tmp_path: Path, capsys,
                                                                      monkeypatch, option):
    """`bench --only "$UNSET"` read as no filter: the whole suite (hours) would run."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--quick", option, " , ", "--runs", str(tmp_path / "runs")])
    assert exit_.value.code == 2
    assert f"argument {option}: no name given; list names separated by commas" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "said"), [
    (["run", "CONFIG", "--outt", "x"],
     "unrecognized arguments for `clusterfl run`: --outt x; did you mean --out? "
     "(`clusterfl run --help` lists its options)"),
    (["flower", "export-partitions", "CONFIG", "a", "b"],
     "unrecognized arguments for `clusterfl flower export-partitions`: b "
     "(`clusterfl flower export-partitions --help` lists its options)"),
    (["sweep", "CONFIG", "--jbos=2"],
     "unrecognized arguments for `clusterfl sweep`: --jbos=2; did you mean --jobs?"),
    (["run", "CONFIG", "--out", "OUT", "--over"],  # a prefix was taken for the option
     "unrecognized arguments for `clusterfl run`: --over; did you mean --overwrite?"),
    (["compare", "CONFIG", "--algorithms", "fedavg", "--out", "OUT", "--seed", "0"],
     "unrecognized arguments for `clusterfl compare`: --seed 0; did you mean --seeds?"),
])
def test_an_unknown_option_names_the_command_and_its_nearest_option(tmp_path: Path, capsys,
                                                                    argv, said):
    """argparse printed the top-level usage (the list of commands) above "unrecognized
    arguments", whichever command was given."""
    config = tmp_path / "c.toml"
    config.write_text(dump_toml(tiny_config()))
    given = {"CONFIG": str(config), "OUT": str(tmp_path / "out")}
    assert main([given.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"clusterfl: error: {said}")
    assert list(tmp_path.iterdir()) == [config]


@pytest.mark.parametrize(("argv", "near"), [
    (["compar"], "argument command: invalid choice: 'compar' (choose from 'run', 'compare', "),
    (["flower", "rn"], "invalid choice: 'rn' (choose from 'run', "),
])
def test_a_command_name_given_wrong_gets_the_nearest_one(capsys, argv, near) -> None:
    """argparse listed the commands without a word on the one meant."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert near in last
    assert last.endswith(f"; did you mean {'compare' if argv == ['compar'] else 'run'!r}?")


def test_an_option_given_twice_with_different_values_is_said(tmp_path: Path, capsys) -> None:
    """argparse kept the last of `--out A --out B` without a word (a script that adds its own
    --out ran into the other folder); now a warning names both and the one used, and the
    same for a --set key given different values. The same value twice is not a repeat."""
    config = _write(tmp_path / "c.toml")
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", config, "--out", str(a), f"--out={b}", "--quiet", "--quiet",
                 "--no-fail-on-divergence", "--fail-on-divergence", "--set", "rounds=1",
                 "--set", "rounds=2"]) == 0
    err = capsys.readouterr().err.splitlines()  # (and the tiny run's "did not learn")
    assert [line for line in err if " given " in line] == [
        f"clusterfl: warning: --out given 2 times ({a}, {b}): the last, {b}, is used",
        "clusterfl: warning: --set rounds given 2 times (1, 2): the last, 2, is used",
        "clusterfl: warning: --fail-on-divergence given 2 times (--no-fail-on-divergence, "
        "--fail-on-divergence): the last, --fail-on-divergence, is used"]
    assert (b / "summary.json").is_file() and not a.exists()
    assert main(["--data-dir", "x", "config", "show", "--data-dir", "x"]) == 0  # one value
    assert capsys.readouterr().err == ""


def test_a_set_key_given_twice_with_different_values_is_said(capsys) -> None:
    """`--set rounds=3 --set rounds=4` used 4 without a word; now it is said as an option
    given twice is, in every command that takes --set; the same value twice (`train.lr=0.1`
    and `train.lr=.1` are one number), or other keys, are no repeat."""
    assert main(["config", "show", "--set", "rounds=3", "--set", "train.lr=0.1",
                 "--set=rounds=4", "--set", "train.lr=.1", "--set", "seed=2"]) == 0
    out, err = capsys.readouterr()
    assert "rounds = 4" in out.splitlines()
    assert err == ("clusterfl: warning: --set rounds given 2 times (3, 4): the last, 4, "
                   "is used\n")
    assert main(["config", "show", "--set", "rounds=3", "--set", "rounds=3"]) == 0
    assert capsys.readouterr().err == ""

    def with_set(parser: argparse.ArgumentParser, name: str
                 ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        for action in parser._actions:
            if "--set" in action.option_strings:
                yield name, parser
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from with_set(p, f"{name} {sub}".strip())

    commands = dict(with_set(build_parser(), ""))
    assert sorted(commands) == ["cfl-place", "compare", "config", "data", "demo",
                               "flower export-partitions", "flower run", "place", "run"]
    for name, parser in commands.items():
        assert given_twice([parser], ["--set", "a.b=1", "--set", "a.b=2"]) == [
            "--set a.b given 2 times (1, 2): the last, 2, is used"], name


def test_an_ascii_only_output_gets_escapes_not_a_traceback(tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii (or a Latin-1 terminal): `--help` (its ×, ±) and `config show`
    of a config holding ε× ended in a UnicodeEncodeError's traceback, status 1; now the
    characters the stream cannot hold are written as escapes."""
    config = tmp_path / "c.toml"
    config.write_text(dump_toml({**TINY, "data": {"source": "digits", "data_dir": "/d/ε×"}}),
                      encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONIOENCODING": "ascii"}
    for argv, shown in ((["--help"], "\\xd7"), (["compare", "--help"], "\\xb1"),
                        (["config", "show", str(config)], 'data_dir = "/d/\\u03b5\\xd7"')):
        r = subprocess.run([sys.executable, "-m", "clusterfl.cli", *argv], capture_output=True,
                           text=True, env=env, timeout=120)
        assert (r.returncode, r.stderr) == (0, ""), argv
        assert shown in r.stdout


def test_a_non_utf8_locale_runs_with_non_ascii_paths_and_values(tmp_path: Path) -> None:
    """Under an ASCII locale (no UTF-8 mode), a run into `é/` with a --set value holding ε×,
    and its `report`, crashed with UnicodeEncodeError tracebacks: the lock file's command
    line, config.toml (written in the locale's encoding) and report.md (encoded strictly)
    could not hold the arguments' undecodable bytes. Now every file is UTF-8 and the bytes
    given are kept."""
    config = _write(tmp_path / "c.toml", output=dict(figures=False, progress="off"))
    out = tmp_path / "é"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "LC_ALL": "C", "LANG": "C",
           "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    for argv in (["run", config, "--out", str(out), "--set", 'data.data_dir="/d/ε×"'],
                 ["report", str(out)]):
        r = subprocess.run([sys.executable, "-m", "clusterfl.cli", *argv], capture_output=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-800:]
        assert b"Traceback" not in r.stderr
        assert str(out).encode() in r.stdout  # the folder's name as given, not as escapes
    assert tomllib.loads((out / "config.toml").read_text(encoding="utf-8"))["data"][
        "data_dir"] == "/d/ε×"
    assert "/d/ε×" in (out / "report.md").read_text(encoding="utf-8")



# --------------------------------------------------------------------------- docs drift
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _doc_commands() -> list[tuple[str, list[str]]]:
    """Every `clusterfl ...` command line the README and docs/ show, in backticks or in a
    code block, as (page, its words up to a comment, a pipe or the end of the span)."""
    found = []
    for page in DOC_PAGES:
        text = page.read_text(encoding="utf-8")
        spans = [line for _, body in FENCE.findall(text) for line in body.splitlines()]
        spans += re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
        for span in spans:
            for m in re.finditer(r"(?:^|[\s(\"$])clusterfl((?: +[^\s#|;)\"`]+)+)", span):
                found.append((page.name, m.group(1).split()))
    return found


def _parsers(parser) -> dict[str, object]:
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_and_option_the_docs_show_exists():
    """A subcommand or an option renamed in the code and not in the README or docs/ (or
    written wrongly there) fails here: each `clusterfl SUB [ACTION] --flag` shown must parse
    to an existing subcommand and option."""
    from clusterfl.cli import build_parser

    top = build_parser()
    commands = _doc_commands()
    seen, bad = set(), []
    for page, words in commands:
        while words and words[0].startswith("-"):  # `clusterfl --data-dir DIR run ...`
            words = words[2:] if words[0] == "--data-dir" else words[1:]
        if not words or not re.fullmatch(r"[a-z][a-z-]*", words[0]):
            continue  # `clusterfl <command>`, `clusterfl: error: ...`
        sub = _parsers(top).get(words[0])
        if sub is None:
            bad.append(f"{page}: no subcommand {words[0]!r} ({' '.join(words)})")
            continue
        action = _parsers(sub).get(words[1]) if len(words) > 1 else None
        name = " ".join(words[:2] if action else words[:1])
        seen.add(name)
        options = {o for p in (top, action or sub) for a in p._actions for o in a.option_strings}
        for word in words[1:]:
            flag = re.match(r"\[?(--[a-z][a-z0-9-]*)", word)
            if flag and flag.group(1) not in options:
                bad.append(f"{page}: `clusterfl {name}` has no option {flag.group(1)}")
    assert not bad, "\n".join(bad)
    assert len(commands) >= 100
    # every subcommand of the command line is shown somewhere (cfl-place: a former name)
    assert set(_parsers(top)) - {"cfl-place"} <= {s.split()[0] for s in seen}


def _anchors(page: Path) -> set[str]:
    heads = re.findall(r"^#+ +(.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_links_of_the_readme_docs_and_results_point_at_what_exists():
    """Markdown links between the README, docs/ and the benchmarks' result pages name files
    (and headings) that exist; `benchmarks/RESULTS_quick.md` linked its figures under
    `bq3_figures/`, the folder of the results file it was first written as."""
    pages = [*DOC_PAGES, *sorted((REPO / "benchmarks").glob("*.md"))]
    links, bad = 0, []
    for page in pages:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(<?([^)\s>]+)>?\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            links += 1
            path, _, anchor = target.partition("#")
            file = (page.parent / path) if path else page
            if not file.exists():
                bad.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                bad.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
        for named in re.findall(r"`(docs/\w+\.md)`", text):  # `docs/placement.md` in prose
            links += 1
            if not (REPO / named).is_file():
                bad.append(f"{page.relative_to(REPO)}: {named} (no such file)")
    assert not bad, "\n".join(bad)
    assert links >= 60


def test_every_config_the_readme_and_docs_show_loads():
    """Each TOML block of the README and docs/ (docs/extending.md's run in their own test)
    loads as what it is: a run config, every field validated, or a sweep file; the only
    other kind is Flower's own `~/.flwr/config.toml` (a `[superlink]` table)."""
    from clusterfl.config import load_config
    from clusterfl.sweep import load_sweep

    loaded = {"run": 0, "sweep": 0}
    for page in DOC_PAGES:
        if page.name == "extending.md":
            continue
        for lang, body in FENCE.findall(page.read_text(encoding="utf-8")):
            if lang != "toml":
                continue
            raw = tomllib.loads(body)
            if "superlink" in raw:
                continue
            try:
                if "sweep" in raw:
                    file = Path(tempfile.mkdtemp()) / "sweep.toml"
                    file.write_text(body, encoding="utf-8")
                    load_sweep(file)
                    loaded["sweep"] += 1
                else:
                    load_config(raw)
                    loaded["run"] += 1
            except ConfigError as exc:
                raise AssertionError(f"{page.name}: {exc}\n{body[:300]}") from None
    assert loaded["run"] >= 12 and loaded["sweep"] >= 1
