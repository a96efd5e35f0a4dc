"""`clusterfl flower ...` subcommands that need no running Flower processes."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from clusterfl import cli_flower
from clusterfl.config import dump_toml
from clusterfl.deploy.clientdata import read_client_file
from clusterfl.errors import ClusterFLError, ConfigError
from tests.flower.conftest import BASE, IFCA, FakeGrid


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterfl")
    cli_flower.add_parser(parser.add_subparsers(dest="cmd", required=True))
    return parser.parse_args(argv)


def _config(tmp_path, **changes) -> str:
    path = tmp_path / "run.toml"
    path.write_text(dump_toml({**BASE, "algorithm": IFCA, **changes}))
    return str(path)


def test_export_partitions_writes_one_readable_file_per_client(tmp_path, capsys):
    args = _parse(["flower", "export-partitions", _config(tmp_path), str(tmp_path / "parts"),
                   "--set", "scenario.n_clients=4"])
    assert args.func(args) == 0
    files = sorted((tmp_path / "parts").glob("client_*.npz"))
    assert len(files) == 4 and "wrote 4 client files" in capsys.readouterr().out
    fed, cid, cluster = read_client_file(str(files[3]))
    assert cid == 3 and cluster == 1 and fed.train_sizes[3] > 0 and fed.train_sizes[:3].sum() == 0


def test_export_and_certs_take_their_folder_as_out_dir_or_out(tmp_path, capsys):
    """`export-partitions CONFIG --out DIR` (as `data shard` takes it) ended in "unrecognized
    arguments: --out" under the top-level usage; now either form works, and neither or two
    different folders are one line."""
    config = _config(tmp_path)
    args = _parse(["flower", "export-partitions", config, "--out", str(tmp_path / "parts"),
                   "--set", "scenario.n_clients=4"])
    assert args.func(args) == 0
    assert len(list((tmp_path / "parts").glob("client_*.npz"))) == 4
    args = _parse(["flower", "certs", "--out", str(tmp_path / "certs"), "--host", "h"])
    assert args.func(args) == 0 and (tmp_path / "certs" / "server.crt").is_file()
    for command, given in ((["export-partitions", config], []), (["certs"], ["--host", "h"])):
        with pytest.raises(ClusterFLError, match=r"^no output folder: give it as OUT_DIR or "
                                                 r"--out$"):
            args = _parse(["flower", *command, *given])
            args.func(args)
        with pytest.raises(ClusterFLError, match=r"^two output folders: OUT_DIR a and --out b"):
            args = _parse(["flower", *command, "a", *given, "--out", "b"])
            args.func(args)


def test_certs_make_a_ca_signed_server_cert_and_openssh_node_keys(tmp_path):
    args = _parse(["flower", "certs", str(tmp_path), "--host", "127.0.0.1", "--host",
                   "server.example.org", "--nodes", "2"])
    assert args.func(args) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["server.example.org"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    key = serialization.load_ssh_private_key((tmp_path / "node_1").read_bytes(), None)
    pub = serialization.load_ssh_public_key((tmp_path / "node_1.pub").read_bytes())
    assert key.public_key().public_numbers() == pub.public_numbers()
    assert oct((tmp_path / "node_1").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(("host", "hint"), [
    ("server.example.org:9092", "; give 'server.example.org'"),
    ("https://server.example.org/", "; give 'server.example.org'"),
    ("10.0.0.5:9092", "; give '10.0.0.5'"),
    ("[::1]", "; give '::1'"),
    ("two words", ""),
])
def test_certs_refuse_a_host_no_tls_client_can_match(tmp_path, host, hint):
    """`--host server:9092` (the form of Flower's addresses) went into the certificate as the
    DNS name 'server:9092', which no connection matches: the SuperNodes failed later with
    gRPC's TLS error. Now the value is refused in one line, naming the bare host."""
    args = _parse(["flower", "certs", str(tmp_path / "certs"), "--host", "localhost",
                   "--host", host])
    with pytest.raises(ConfigError) as err:
        args.func(args)
    assert str(err.value) == (f"--host: {host!r} is not a host name or IP address (letters, "
                              f"digits, '-' and '.', no port, scheme or path){hint}")
    assert not (tmp_path / "certs").exists()
    args = _parse(["flower", "certs", str(tmp_path / "ok"), "--host", "*.example.org",
                   "--host", "::1", "--host", "node-3.example.org."])
    assert args.func(args) == 0


def test_certs_do_not_replace_the_files_handed_out_unless_told(tmp_path, capsys):
    """A second `certs` into the same folder replaced the CA, the server certificate and the
    node keys without a word: the ca.crt and node keys already copied to the client machines
    no longer matched. Now it is refused, naming the files; --overwrite replaces them."""
    args = _parse(["flower", "certs", str(tmp_path), "--host", "localhost", "--nodes", "1"])
    assert args.func(args) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for more in ([], ["--nodes", "3"]):
        args = _parse(["flower", "certs", str(tmp_path), "--host", "other", *more])
        with pytest.raises(ClusterFLError) as err:
            args.func(args)
        assert str(err.value) == (f"{tmp_path} already holds ca.crt, ca.key, server.crt ...: "
                                  "new ones would not match the copies handed out; "
                                  "--overwrite to replace them, or another folder")
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    args = _parse(["flower", "certs", str(tmp_path), "--host", "other", "--overwrite"])
    assert args.func(args) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes()
                                   ).verify_directly_issued_by(ca)
    assert (tmp_path / "ca.key").read_bytes() != before["ca.key"]
    assert (tmp_path / "node_0").read_bytes() == before["node_0"]  # --nodes 0: not written


def test_run_validates_the_config_first(tmp_path):
    args = _parse(["flower", "run", _config(tmp_path), "--set", "backend.timeout=0"])
    with pytest.raises(ConfigError, match=r"backend\.timeout"):
        args.func(args)


@pytest.mark.parametrize("timeout", ["0", "-5", "nan"])
def test_a_timeout_that_is_not_a_positive_number_fails_before_flower_starts(tmp_path,
                                                                            timeout):
    # before: a SuperLink and 20 SuperNodes started, then "did not finish within -5 s"
    out = tmp_path / "out"
    args = _parse(["flower", "run", _config(tmp_path), "--mode", "local", "--out", str(out),
                   "--timeout", timeout])
    with pytest.raises(ConfigError, match="--timeout") as err:
        args.func(args)
    assert err.value.message == f"must be a number of seconds > 0, got {float(timeout)}"
    assert not out.exists()


@pytest.mark.parametrize(("argv", "said"), [
    (["--superlink", "cluster"], "--superlink: only with --mode submit (--mode ray runs on a "
     "SuperLink it starts on this machine)"),
    (["--mode", "local", "--superlink", "cluster"], "--superlink: only with --mode submit "
     "(--mode local runs on a SuperLink it starts on this machine)"),
    (["--mode", "submit", "--timeout", "60", "--quiet"], "--timeout, --quiet: only with "
     "--mode local or ray (submit streams the run's log from the SuperLink and writes nothing "
     "here)"),
    (["--mode", "submit", "--overwrite"], "--overwrite: only with --mode local or ray (submit "
     "streams the run's log from the SuperLink and writes nothing here)"),
    (["--mode", "local", "--cpus-per-client", "2"], "--cpus-per-client: only with --mode ray "
     "(--mode local does not run the clients as Ray actors)"),
    (["--mode", "submit", "--cpus-per-client", "1"], "--cpus-per-client: only with --mode ray "
     "(--mode submit does not run the clients as Ray actors)"),
])
def test_options_of_another_mode_are_refused(tmp_path, monkeypatch, argv, said):
    """`flower run CONFIG --superlink cluster` (no --mode) ran a Ray simulation on this
    machine instead of submitting to the cluster, and submit ignored --timeout, --overwrite
    and --quiet; now each is one line before anything starts."""
    started: list[str] = []
    for name in ("_run_ray", "_run_local", "_submit"):
        monkeypatch.setattr(cli_flower, name, lambda *a, name=name: started.append(name))
    args = _parse(["flower", "run", _config(tmp_path), *argv])
    with pytest.raises(ClusterFLError) as err:
        args.func(args)
    assert str(err.value) == said and started == []


@pytest.mark.parametrize(("value", "said"), [
    ("0", "must be a whole number of CPUs from 1 to {cores} (this machine's cores), got 0"),
    ("-2", "must be a whole number of CPUs from 1 to {cores} (this machine's cores), got -2"),
    ("1.5", "must be a whole number of CPUs from 1 to {cores} (this machine's cores), got 1.5"),
    ("inf", "must be a whole number of CPUs from 1 to {cores} (this machine's cores), got inf"),
    ("nan", "must be a whole number of CPUs from 1 to {cores} (this machine's cores), got nan"),
    ("{more}", "{more} CPUs per client, but this machine has {cores} cores: at most {cores}"),
])
def test_cpus_per_client_out_of_range_fails_before_flower_starts(tmp_path, monkeypatch,
                                                                 value, said):
    """Ray's CPUs per client were fixed at 1 with no option; `--cpus-per-client` takes a
    whole number of this machine's cores (Flower reserves whole CPUs; more than the machine
    has leaves Flower's actor pool empty), and anything else is one line."""
    import os

    cores = os.cpu_count() or 1
    started: list[str] = []
    monkeypatch.setattr(cli_flower, "_run_ray", lambda *a: started.append("ray"))
    out = tmp_path / "out"
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(out), "--cpus-per-client",
                   value.format(more=cores + 1)])
    with pytest.raises(ConfigError) as err:
        args.func(args)
    assert err.value.field == "--cpus-per-client"
    assert err.value.message == said.format(cores=cores, more=cores + 1)
    assert started == [] and not out.exists()


def test_local_and_ray_start_one_node_per_client_up_to_the_scenario(tmp_path, monkeypatch,
                                                                     capsys):
    """`--set backend.wait_nodes=5` on a 4-client scenario started a 5th SuperNode whose
    partition-id 4 does not exist; 2 started 2 nodes and the run had 2 of the 4 clients
    without a word. Now more nodes than clients is refused and fewer is said."""
    started: list[int] = []
    monkeypatch.setattr(cli_flower, "_flwr_run",
                        lambda *a, supernodes=0, simulate=0: started.append(supernodes))
    monkeypatch.setattr(cli_flower, "_print_results", lambda *a: None)
    config = _config(tmp_path, scenario={**BASE["scenario"], "n_clients": 4})
    args = _parse(["flower", "run", config, "--mode", "local", "--out", str(tmp_path / "a"),
                   "--set", "backend.wait_nodes=5"])
    with pytest.raises(ConfigError) as err:
        args.func(args)
    assert str(err.value) == ("backend.wait_nodes: 5 SuperNodes, but the scenario has 4 "
                              "clients and each node here holds one: at most 4 (0: all of "
                              "them)") and started == []
    args = _parse(["flower", "run", config, "--mode", "local", "--out", str(tmp_path / "b"),
                   "--set", "backend.wait_nodes=2", "--quiet"])
    assert args.func(args) == 0 and started == [2]
    assert capsys.readouterr().err == (
        "clusterfl: warning: backend.wait_nodes = 2 of scenario.n_clients = 4: one SuperNode "
        "per client is started for clients 0..1 only, and the run has those\n")
    for wait in ("0", "4"):
        args = _parse(["flower", "run", config, "--mode", "local", "--quiet", "--out",
                       str(tmp_path / f"c{wait}"), "--set", f"backend.wait_nodes={wait}"])
        assert args.func(args) == 0 and started[-1] == 4
    assert capsys.readouterr().err == ""


def test_run_into_a_used_folder_needs_overwrite(tmp_path, monkeypatch):
    """The run folder is checked before Flower starts; --overwrite empties it first."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # an earlier run, whose final state would fool
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(out), "--mode", "local"])
    with pytest.raises(ClusterFLError, match="--overwrite"):
        args.func(args)
    started: list[str] = []
    monkeypatch.setattr(cli_flower, "_run_local", lambda *a: started.append("local"))
    monkeypatch.setattr(cli_flower, "_print_results", lambda *a: None)
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(out), "--mode", "local",
                   "--overwrite"])
    assert args.func(args) == 0 and started == ["local"] and not any(out.iterdir())


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_an_out_inside_another_runs_folder_is_refused_before_flower_starts(tmp_path,
                                                                           monkeypatch,
                                                                           capsys, mode):
    """`flower run --out A/sub` with A a run's folder: one line naming A (the check of
    `clusterfl run`, `rundir.check_outside_runs`), before a SuperLink, SuperNode or Ray
    starts and before A/sub or its A/sub.flower work folder exist; A keeps its files."""
    from clusterfl.cli import main

    config = _config(tmp_path, rounds=1)
    a = tmp_path / "a"
    assert main(["run", config, "--out", str(a), "--quiet"]) == 0
    before = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    started: list[str] = []
    for name in ("_run_ray", "_run_local", "_submit"):
        monkeypatch.setattr(cli_flower, name, lambda *a, name=name: started.append(name))
    monkeypatch.setattr(cli_flower, "_print_results", lambda *a: None)
    capsys.readouterr()
    for out in (a / "sub", a / "x" / "y"):
        assert main(["flower", "run", config, "--mode", mode, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"clusterfl: error: --out: {out} lies inside the folder of the run {a.resolve()} "
            "(it holds that run's history.jsonl); a run's folder holds that run's files only: "
            "choose a folder outside it\n")
        assert started == [] and not out.exists()
        assert not out.with_name(out.name + ".flower").exists()
    assert {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()} == before
    beside = tmp_path / "beside"  # a folder outside it: Flower is started (here, its stub)
    assert main(["flower", "run", config, "--mode", mode, "--out", str(beside)]) == 0
    assert started == [f"_run_{mode}"]


def test_app_dir_holds_a_valid_flower_app(tmp_path):
    from flwr.cli.config_utils import load_and_validate

    from clusterfl.deploy.launch import APP_DIR

    config, _ = load_and_validate(APP_DIR / "pyproject.toml")
    comps = config["tool"]["flwr"]["app"]["components"]
    assert comps["serverapp"].startswith("clusterfl.deploy.server_app")
    # the ClientApp a SuperNode imports per message must not pull in torch, and answers the
    # four message types the server sends (one handler under the three `request` ones)
    code = (f"import sys; sys.path.insert(0, {str(APP_DIR)!r}); import clusterfl_app.client; "
            "print('torch' in sys.modules); "
            "print(' '.join(sorted(clusterfl_app.client.app._registered_funcs)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split("\n")[:2] == [
        "False", "evaluate.request query.describe query.request train.request"]


def test_local_superlink_state_is_in_memory_and_its_superexec_is_ours(tmp_path):
    """Flower treats any `--database` other than its in-memory name as a SQLite file: a
    misspelt name once left one state file shared by every local deployment."""
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME

    from clusterfl.deploy.launch import (
        IN_MEMORY,
        Tls,
        superexec_cmd,
        superlink_cmd,
    )

    assert IN_MEMORY == FLWR_IN_MEMORY_DB_NAME
    cmd = superlink_cmd(9092, own_superexec=True)
    assert cmd[cmd.index("--database") + 1] == FLWR_IN_MEMORY_DB_NAME
    assert cmd[cmd.index("--isolation") + 1] == "process"
    assert "--isolation" not in superlink_cmd(9092)
    tls = Tls(tmp_path / "ca.crt", tmp_path / "s.crt", tmp_path / "s.key")
    exe = superexec_cmd("127.0.0.1:9092", tls.ca, parent_pid=42)
    assert exe[exe.index("--runtime-api-address") + 1] == "127.0.0.1:9092"
    assert exe[exe.index("--root-certificates") + 1] == str(tls.ca)
    assert exe[exe.index("--parent-pid") + 1] == "42" and "--insecure" not in exe
    assert "--insecure" in superexec_cmd("127.0.0.1:9092")


def test_flower_help_points_to_the_deploy_docs():
    out = subprocess.run([sys.executable, "-m", "clusterfl.cli", "flower", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "docs/deploy.md" in out and "DESIGN.md" not in out


def test_run_ray_prints_rounds_and_the_results_table(tmp_path, monkeypatch, capsys):
    """`flower run` (ray: `flwr run` on a simulation SuperLink) reports each round as it ends
    and the table of `clusterfl run`, not JSON (the SuperLink and Ray replaced by the
    in-process grid); it asks for a simulation SuperLink with one virtual node per client."""
    import contextlib

    import clusterfl.deploy.launch as launch
    from clusterfl.config import read_toml
    from clusterfl.deploy.server_app import run_on_grid

    asked: list[int] = []
    cpus: list[int | None] = []

    class Done:
        def alive(self) -> bool:
            return False

    class Simulation:
        supernodes = ()

        def start_superlink(self, simulate: int = 0, num_cpus: int | None = None) -> None:
            asked.append(simulate)
            cpus.append(num_cpus)

        def start_supernode(self, config) -> None:  # pragma: no cover - must not happen
            raise AssertionError("a simulation starts no SuperNode")

        def flwr_run(self, config, out_dir, overrides) -> Done:
            grid = FakeGrid([{"partition-id": i} for i in range(asked[-1])])
            run_on_grid(grid, read_toml(config), overrides, out_dir)
            return Done()

    monkeypatch.setattr(launch, "local_deployment",
                        lambda work: contextlib.nullcontext(Simulation()))
    out = tmp_path / "out"
    stale = tmp_path / "out.flower" / "workers"  # an earlier run's node worker, killed
    stale.mkdir(parents=True)
    (stale / "0123456789abcdef.log").write_text("")
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(out)])
    assert args.func(args) == 0
    assert asked == [6] and cpus == [None]  # Ray's 1 CPU per client, torch threads unset
    text = capsys.readouterr().out
    assert (f"flower: removed the 1 node worker files an earlier run left in {stale} (no "
            "worker of it runs)") in text
    assert list(stale.iterdir()) == []
    assert "flower: simulating 6 SuperNodes with Ray (flwr run on a local simulation " \
           "federation); rounds" in text
    assert [line.split("  ")[0] for line in text.splitlines() if "round " in line
            and line.startswith("flower: round")] == [f"flower: round {t}/3" for t in (1, 2, 3)]
    assert "accuracy (%)" in text and "IFCA (K=2)" in text and f"results in {out}/" in text
    assert '"accuracy":' not in text  # no raw JSON
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(tmp_path / "q"), "--quiet"])
    assert args.func(args) == 0
    assert "flower: round" not in capsys.readouterr().out
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(tmp_path / "c"),
                   "--cpus-per-client", "2"])
    assert args.func(args) == 0 and asked[-1] == 6 and cpus[-1] == 2
    assert "flower: simulating 6 SuperNodes with Ray (flwr run on a local simulation " \
           "federation, 2 CPUs and torch threads per client)" in capsys.readouterr().out


def test_local_run_says_when_a_supernode_died_and_clients_were_dropped(tmp_path, monkeypatch,
                                                                       capsys):
    """A SuperNode that died during `--mode local` went unmentioned: its client was dropped
    from every request after backend.timeout, and only flower.json said so. Now the process's
    exit is a warning naming its log, and the run's dropouts are summed up at the end."""
    import contextlib

    import clusterfl.deploy.launch as launch
    from clusterfl.config import read_toml
    from clusterfl.deploy.server_app import run_on_grid

    class Dead:
        log = tmp_path / "supernode5.log"
        popen = argparse.Namespace(returncode=-9)

        def alive(self) -> bool:
            return False

    class Up(Dead):
        def alive(self) -> bool:
            return True

    class Done:
        def alive(self) -> bool:
            return False

    class Deployment:
        supernodes = (Up(), Up(), Up(), Up(), Up(), Dead())

        def start_superlink(self) -> None: ...
        def start_supernode(self, config) -> None: ...
        def flwr_run(self, config, out_dir, overrides) -> Done:
            grid = FakeGrid([{"partition-id": i} for i in range(6)])
            grid.dead_from = {105: 2}  # answers the handshake and round 1, then nothing:
            # rounds 2 and 3 and the evaluation go without it
            run_on_grid(grid, read_toml(config), overrides, out_dir)
            return Done()

    monkeypatch.setattr(launch, "local_deployment",
                        lambda work: contextlib.nullcontext(Deployment()))
    out = tmp_path / "out"
    args = _parse(["flower", "run", _config(tmp_path, backend={"timeout": 1.0}), "--mode",
                   "local", "--out", str(out), "--quiet"])
    assert args.func(args) == 0
    assert capsys.readouterr().err == (
        f"clusterfl: warning: SuperNode 5 (partition-id 5) exited with code -9 (log "
        f"{tmp_path / 'supernode5.log'}); the run goes on without its client, dropped from "
        "each request once backend.timeout has passed\n"
        f"clusterfl: warning: 3 request(s) went without some clients ([5]); each dropout and "
        f"its reason are in {out / 'flower.json'}\n")


def test_simulation_superlink_and_its_federation_config(tmp_path):
    """The supported simulation path: `flower-superlink --simulation`, and `flwr run
    --federation-config` naming the virtual SuperNodes (a local simulation federation)."""
    from clusterfl.deploy.launch import LocalDeployment, federation_config, superlink_cmd

    assert "--simulation" in superlink_cmd(9000, simulation=True)
    assert "--simulation" not in superlink_cmd(9000)
    assert federation_config(8) == "num-supernodes=8 client-resources-num-cpus=1"
    dep = LocalDeployment(tmp_path)
    dep.federation_config = federation_config(4)
    proc = dep.flwr_run(tmp_path / "run.toml", tmp_path / "out", app_dir=tmp_path / "none")
    proc.stop()
    cmd = proc.popen.args
    assert cmd[cmd.index("--federation-config") + 1] == federation_config(4)


def _record_starts(monkeypatch) -> dict[str, dict[str, str]]:
    """`launch.start` replaced: the environment each process would get, by name."""
    import clusterfl.deploy.launch as launch

    started: dict[str, dict[str, str]] = {}

    class Up:
        pid = 0

        def alive(self) -> bool:
            return True

    def start(name, cmd, log_dir, env=None, cwd=None):
        started[name] = dict(env or {})
        return Up()

    monkeypatch.setattr(launch, "start", start)
    monkeypatch.setattr(launch, "_wait_port", lambda *a: None)
    return started


def _superlink(tmp_path, **kwargs) -> Any:
    from clusterfl.deploy.launch import LocalDeployment

    dep = LocalDeployment(tmp_path)
    dep.start_superlink(**kwargs)
    dep._stopping.set()  # ends the supervisor thread; nothing to stop (no real process)
    return dep


def test_simulation_gets_the_cpus_and_torch_threads_per_client(tmp_path, monkeypatch):
    """`num_cpus` (`--cpus-per-client`) is Ray's reservation per ClientApp actor and the torch
    threads of the simulation (OMP_NUM_THREADS, which Ray leaves alone once set); without it
    1 CPU and the environment's threads, as before."""
    from clusterfl.deploy.launch import federation_config

    started = _record_starts(monkeypatch)
    for num_cpus, threads in ((None, None), (3, "3")):
        dep = _superlink(tmp_path, simulate=4, num_cpus=num_cpus)
        assert dep.federation_config == ("num-supernodes=4 client-resources-num-cpus="
                                         f"{num_cpus or 1}")
        for name in ("superlink", "superexec"):
            assert started[name].get("OMP_NUM_THREADS") == threads
    with pytest.raises(ValueError, match="num_cpus"):
        federation_config(4, 1.5)  # type: ignore[arg-type] - a float is refused


def test_simulation_starts_a_ray_instance_of_its_own(tmp_path, monkeypatch):
    """Ray's `ray.init()` joined a cluster that `ray start --head` had left running on the
    machine (seen: another sweep's cluster; the run died when it was stopped). The simulation
    now starts its own (RAY_ADDRESS=local), unless RAY_ADDRESS says where to run."""
    started = _record_starts(monkeypatch)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _superlink(tmp_path, simulate=4)
    assert started["superlink"]["RAY_ADDRESS"] == started["superexec"]["RAY_ADDRESS"] == "local"
    _superlink(tmp_path)  # a real SuperLink (SuperNodes): no Ray
    assert "RAY_ADDRESS" not in started["superlink"]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # the user's: inherited as it is
    _superlink(tmp_path, simulate=4)
    assert "RAY_ADDRESS" not in started["superlink"]


def test_logs_of_an_earlier_run_are_moved_to_old(tmp_path, monkeypatch, capsys):
    """A reused `<out>.flower/logs` kept an earlier run's logs beside the new ones (e.g.
    `supernode5.log` of a run with more nodes, `supervisor.log` appended to): they are moved
    to `logs/old` (replacing what it held under those names), the run says so, and files
    whose names clusterfl does not write stay where they are."""
    import contextlib

    import clusterfl.deploy.launch as launch

    logs = tmp_path / "out.flower" / "logs"
    (logs / "old").mkdir(parents=True)
    for name in ("superlink.log", "superexec.log", "superexec1.log", "supernode0.log",
                 "supernode5.log", "flwr-run.log", "supervisor.log", "notes.txt",
                 "supernode5.log.bak", "mysupernode1.log"):
        (logs / name).write_text(f"earlier {name}")
    (logs / "old" / "supernode9.log").write_text("two runs ago")
    (logs / "old" / "mine.txt").write_text("kept")
    seen: list[list[str]] = []

    class Done:
        log = tmp_path / "none.log"

        def alive(self) -> bool:
            return False

    class Deployment:
        supernodes = ()

        def start_superlink(self, simulate: int = 0, num_cpus: int | None = None) -> None:
            seen.append(sorted(p.name for p in logs.iterdir()))

        def flwr_run(self, *args) -> Done:
            return Done()

    monkeypatch.setattr(launch, "local_deployment",
                        lambda work: contextlib.nullcontext(Deployment()))
    args = _parse(["flower", "run", _config(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(ClusterFLError, match="stopped before it finished"):
        args.func(args)
    assert seen == [["mysupernode1.log", "notes.txt", "old", "supernode5.log.bak"]]
    assert sorted(p.name for p in (logs / "old").iterdir()) == [
        "flwr-run.log", "mine.txt", "superexec.log", "superexec1.log", "superlink.log",
        "supernode0.log", "supernode5.log", "supervisor.log"]
    assert (logs / "old" / "supernode5.log").read_text() == "earlier supernode5.log"
    assert (f"flower: moved the 7 logs of an earlier run in {logs} to {logs / 'old'} "
            "(flwr-run.log, superexec.log, superexec1.log, superlink.log ...)"
            ) in capsys.readouterr().out


def test_local_mode_timeout_names_the_option(tmp_path, monkeypatch):
    """`--mode local` giving up names `--timeout` and its value."""
    import contextlib

    import clusterfl.deploy.launch as launch

    class Forever:
        def alive(self) -> bool:
            return True

    class Deployment:
        supernodes = ()

        def start_superlink(self) -> None: ...
        def start_supernode(self, config) -> None: ...
        def flwr_run(self, *args) -> Forever:
            return Forever()

    monkeypatch.setattr(launch, "local_deployment",
                        lambda work: contextlib.nullcontext(Deployment()))
    args = _parse(["flower", "run", _config(tmp_path), "--mode", "local", "--out",
                   str(tmp_path / "out"), "--timeout", "0.2", "--quiet"])
    with pytest.raises(ClusterFLError, match=r"did not finish within --timeout 0\.2 s"):
        args.func(args)


# the log of `flwr run --stream` when the ServerApp raised (as in a real run)
SERVERAPP_TRACEBACK = """Successfully started run 455
\x1b[91mERROR \x1b[0m:     ServerApp raised an exception
Traceback (most recent call last):
  File "server_app.py", line 113, in handshake
    raise ClusterFLError(f"{len(out)} of {len(nodes)} SuperNodes described their data in "
clusterfl.errors.ClusterFLError: 2 of 3 SuperNodes described their data in the handshake, the \
run needs 3 (backend.wait_nodes or scenario.n_clients): node 151: DataError: partition-id 2 out \
of range: the scenario has 2 clients (0..1)
\x1b[91mERROR \x1b[0m:     Exit Code: 201

An unhandled exception occurred in the ServerApp.
"""


@pytest.mark.parametrize(("log", "said"), [
    (SERVERAPP_TRACEBACK, ": 2 of 3 SuperNodes described their data in the handshake, the run "
     "needs 3 (backend.wait_nodes or scenario.n_clients): node 151: DataError: partition-id 2 "
     "out of range: the scenario has 2 clients (0..1); logs in "),
    ("Traceback (most recent call last):\n  File ...\nRuntimeError: CUDA is not here\n",
     ": RuntimeError: CUDA is not here; logs in "),
    ("Using SuperLink: clusterfl\n", "; logs in "),  # nothing to quote
])
def test_a_failed_flower_run_says_why(tmp_path, monkeypatch, log, said):
    """`flower run --mode local|ray` whose ServerApp raised said only "the Flower run stopped
    before it finished; logs in DIR": the reason sat in a traceback in flwr-run.log. Now the
    line quotes the ServerApp's last error (a clusterfl error by its message alone)."""
    import contextlib

    import clusterfl.deploy.launch as launch

    class Ended:
        log = tmp_path / "flwr-run.log"

        def alive(self) -> bool:
            return False

    class Deployment:
        supernodes = ()

        def start_superlink(self) -> None: ...
        def start_supernode(self, config) -> None: ...
        def flwr_run(self, *args) -> Ended:
            Ended.log.write_text(log)
            return Ended()

    monkeypatch.setattr(launch, "local_deployment",
                        lambda work: contextlib.nullcontext(Deployment()))
    out = tmp_path / "out"
    args = _parse(["flower", "run", _config(tmp_path), "--mode", "local", "--out", str(out),
                   "--quiet"])
    with pytest.raises(ClusterFLError) as err:
        args.func(args)
    assert str(err.value) == (f"the Flower run stopped before it finished{said}"
                              f"{out.parent / 'out.flower' / 'logs'}")


def test_sigterm_stops_the_local_deployment_it_started(tmp_path, monkeypatch, capsys):
    """`timeout 200 clusterfl flower run --mode local` left the SuperLink, 20 SuperNodes, their
    SuperExecs and the ServerApp running after the CLI died (the ServerApp kept the run
    folder locked). SIGTERM now unwinds the command as Ctrl-C does: the deployment's exit
    stops its processes, and the command ends with status 143."""
    import contextlib
    import os
    import signal

    import clusterfl.deploy.launch as launch
    from clusterfl.cli import main

    events: list[str] = []

    class Running:
        def alive(self) -> bool:  # the first poll: someone sends SIGTERM to the CLI
            os.kill(os.getpid(), signal.SIGTERM)
            return True

    class Deployment:
        supernodes = ()

        def start_superlink(self) -> None:
            events.append("superlink")

        def start_supernode(self, config) -> None:
            events.append("supernode")

        def flwr_run(self, *args) -> Running:
            return Running()

    @contextlib.contextmanager
    def deployment(work):
        try:
            yield Deployment()
        finally:
            events.append("stopped")

    monkeypatch.setattr(launch, "local_deployment", deployment)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a fresh process
    try:
        rc = main(["flower", "run", _config(tmp_path), "--mode", "local", "--out",
                   str(tmp_path / "out"), "--quiet"])
    finally:
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # main restored it
        signal.signal(signal.SIGTERM, previous)
    assert rc == 143 and events[0] == "superlink" and events[-1] == "stopped"
    assert capsys.readouterr().err == "clusterfl: stopped (SIGTERM)\n"


def test_a_deployment_removes_the_node_worker_files_it_wrote(tmp_path):
    """The node workers' hash-named files (`<16 hex>.sock/.lock/.log`) piled up in
    `<out>.flower/workers/` run after run. Now a deployment's `stop()` (also on an error or
    Ctrl-C: `local_deployment` stops it in `finally`) removes the files its nodes wrote and
    nothing else, and the files of an earlier killed run are removed before the next run
    only when no process names the folder and no start lock is held."""
    import fcntl

    from clusterfl.deploy.launch import LocalDeployment, clear_stale_workers

    work = tmp_path / "x.flower"
    folder = work / "workers"
    folder.mkdir(parents=True)
    earlier = {f"0123456789abcdef.{ext}" for ext in ("sock", "lock", "log")}
    for name in [*earlier, "notes.txt"]:
        (folder / name).write_text("")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              str(folder / "0123456789abcdef.sock")])
    cmdline = Path(f"/proc/{alive.pid}/cmdline")
    for _ in range(500):  # the premise: its command line names the folder (a loaded machine
        if str(folder).encode() in cmdline.read_bytes():  # may show it a moment later)
            break
        time.sleep(0.01)
    try:  # a process names the folder: maybe a worker of a run still going
        assert clear_stale_workers(folder) == ([], sorted(earlier))
    finally:
        alive.kill()
        alive.wait()
    with open(folder / "0123456789abcdef.lock", "rb") as fh:  # a ClientApp starting a worker
        fcntl.flock(fh, fcntl.LOCK_EX)
        assert clear_stale_workers(folder) == ([], sorted(earlier))
    dep = LocalDeployment(work)  # notes what is there before its nodes write anything
    ours = {f"fedcba9876543210.{ext}" for ext in ("sock", "lock", "log")}
    for name in ours:
        (folder / name).write_text("")
    dep.stop()
    assert {p.name for p in folder.iterdir()} == earlier | {"notes.txt"}
    assert clear_stale_workers(folder) == (sorted(earlier), [])
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    (folder / "notes.txt").unlink()
    dep = LocalDeployment(work)
    (folder / "fedcba9876543210.log").write_text("")
    assert dep.remove_worker_files() == ["fedcba9876543210.log"]
    assert not folder.exists()  # the folder, empty, went with them


def test_a_superlink_that_exits_before_listening_is_one_line(tmp_path):
    """A SuperLink that exits at start (its port taken, a certificate file it cannot read)
    was a RuntimeError carrying the last 2000 characters of its log, which `clusterfl`
    printed as a traceback. Now it is one line: the process, its exit code, the port, the
    log's last line and the log's path; a SuperLink that never listens is one line too."""
    from clusterfl.deploy.launch import _wait_port, free_port, start

    port = free_port()
    said = "OSError: [Errno 98] Address already in use"
    code = f"import sys; print('Traceback ...\\n  File x'); sys.exit({said!r})"
    proc = start("superlink", [sys.executable, "-c", code], tmp_path)
    with pytest.raises(ClusterFLError) as err:
        _wait_port(port, 10.0, proc)
    assert str(err.value) == (f"the superlink exited (code 1) before it opened port {port}: "
                              f"{said}; log {tmp_path / 'superlink.log'}")
    quiet = start("superlink", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path)
    try:
        with pytest.raises(ClusterFLError, match=f"the superlink did not open port {port} "
                           r"within 0\.5 s; log "):
            _wait_port(port, 0.5, quiet)
    finally:
        quiet.stop()


@pytest.mark.parametrize(("superlink", "hint"), [
    ("server.example.org:9092", '; an address goes into that file as [superlink.NAME] address '
                                '= "server.example.org:9092", then --superlink NAME '
                                "(docs/deploy.md, section 5)"),
    ("10.0.0.5", '; an address goes into that file as [superlink.NAME] address = '
                 '"10.0.0.5:PORT", then --superlink NAME (docs/deploy.md, section 5)'),
    ("clustr", ""),
])
def test_submit_to_a_superlink_flwr_does_not_know_is_one_line(tmp_path, monkeypatch,
                                                              superlink, hint):
    """`--mode submit --superlink 10.0.0.5` (an address, with or without its port, or a
    misspelt name) ran `flwr run`, whose answer was a boxed 'unexpected error occurred while
    reading the Flower configuration file'. Now one line names the connections flwr's file
    has and, for an address, how to add it; a known name is submitted as before."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "cluster"\n\n'
                                      '[superlink.cluster]\naddress = "server:9092"\n')
    monkeypatch.setenv("FLWR_HOME", str(home))
    started: list[Any] = []
    monkeypatch.setattr(cli_flower, "_submit", lambda *a: started.append(a[3]) or 0)
    args = _parse(["flower", "run", _config(tmp_path), "--mode", "submit", "--superlink",
                   superlink])
    with pytest.raises(ClusterFLError) as err:
        args.func(args)
    assert str(err.value) == (f"--superlink: {superlink!r} is not a SuperLink connection of "
                              f"{home / 'config.toml'} (it has cluster){hint}")
    assert started == []
    args = _parse(["flower", "run", _config(tmp_path), "--mode", "submit", "--superlink",
                   "cluster"])
    assert args.func(args) == 0 and started == ["cluster"]
