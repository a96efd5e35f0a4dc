"""`clusterfl flower ...`: run any method on Flower 1.41 (see docs/deploy.md).

    clusterfl flower run CONFIG.toml [--set K=V ...] [--out DIR] --mode ray|local|submit
        ray:    Flower's simulation engine (Ray), one virtual SuperNode per client: a
                simulation SuperLink on loopback and `flwr run` on it (a local simulation
                federation, Flower's supported path); --cpus-per-client N: the CPUs and
                torch threads of each client's actor
        local:  a real SuperLink + one SuperNode process per client on this machine
                (loopback, insecure), then `flwr run`; everything is stopped at the end
        submit: `flwr run` against an existing SuperLink (`--superlink NAME`, a connection of
                $FLWR_HOME/config.toml); CONFIG and --out are paths on the SuperLink machine
                (CONFIG is validated here first: the same path on both machines)
        ray and local print a line per finished round (read from the run's history.jsonl)
        and, at the end, the results table of `clusterfl run`; the run directory defaults
        to runs/<config name>-flower
    clusterfl flower export-partitions CONFIG.toml OUT_DIR [--set K=V ...]   (or --out OUT_DIR)
        one `client_XXXX.npz` per client of the config's federation (node data format)
    clusterfl flower certs OUT_DIR --host NAME [--host NAME ...] [--nodes N] [--overwrite]
        a test CA, the SuperLink's TLS certificate, and N SuperNode auth key pairs
    clusterfl flower app-dir
        print the Flower App directory to pass to `flwr run`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterfl.errors import ClusterFLError, ConfigError, require

if TYPE_CHECKING:
    from clusterfl.deploy.launch import Process
    from clusterfl.records import RunSummary


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `clusterfl flower ...` on an argparse subparsers object."""
    p = subparsers.add_parser("flower", help="run methods on Flower (simulation or deployment)",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="flower_cmd", required=True)

    r = sub.add_parser("run", help="run a config on Flower")
    r.add_argument("config", help="clusterfl run config (TOML)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    r.add_argument("--out", help="run directory (default: runs/<config name>-flower; submit: "
                                 "none); it holds one run")
    r.add_argument("--overwrite", action="store_true",
                   help="empty --out first when it holds an earlier run")
    r.add_argument("--mode", choices=["ray", "local", "submit"], default="ray",
                   help="ray: Flower's simulation engine (the ray extra); local: a SuperLink "
                   "and SuperNodes started here; submit: to a running SuperLink (default: ray)")
    r.add_argument("--superlink", help="submit: SuperLink connection name in "
                                       "$FLWR_HOME/config.toml (default: its default)")
    r.add_argument("--timeout", type=float,
                   help="local, ray: give up after this many seconds (default 3600)")
    r.add_argument("--cpus-per-client", type=float,
                   help="ray: CPUs Ray reserves for each client's actor, and its torch threads "
                   "(a whole number, at most this machine's cores; default: 1 CPU, torch "
                   "threads from OMP_NUM_THREADS or 1)")
    r.add_argument("--quiet", action="store_true", help="no line per round")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("export-partitions", help="write each client's data to its own file")
    e.add_argument("config", help="the run config whose federation is written")
    e.add_argument("out_dir", nargs="?", help="the folder of the client files (new, empty, or "
                   "an earlier export, which is replaced); or --out")
    e.add_argument("--out", help="the same as OUT_DIR (as in `clusterfl data shard`)")
    e.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value")
    e.set_defaults(func=cmd_export)

    c = sub.add_parser("certs", help="test TLS certificates and SuperNode auth keys")
    c.add_argument("out_dir", nargs="?", help="the folder to write them to; or --out")
    c.add_argument("--out", help="the same as OUT_DIR")
    c.add_argument("--host", action="append", required=True,
                   help="name or IP the SuperLink is reached at (repeatable)")
    c.add_argument("--nodes", type=int, default=0,
                   help="SuperNode key pairs to create (default: 0)")
    c.add_argument("--overwrite", action="store_true",
                   help="replace the CA, keys and certificates already in the folder")
    c.set_defaults(func=cmd_certs)

    a = sub.add_parser("app-dir", help="print the Flower App directory (for `flwr run`)")
    a.set_defaults(func=lambda args: print(_app_dir()) or 0)
    return p


def _app_dir() -> Path:
    from clusterfl.deploy.launch import APP_DIR

    return APP_DIR


def _raw(path: str, overrides: list[str] | None) -> dict[str, Any]:
    from clusterfl.config import apply_overrides, load_config, read_toml

    raw = apply_overrides(read_toml(path), list(overrides or []))
    raw.setdefault("backend", {})["name"] = "flower"
    load_config(raw)  # fail early, with the field named
    return raw


def cmd_export(args: argparse.Namespace) -> int:
    """Write the partitions of a config's federation (one .npz per client)."""
    from clusterfl.config import apply_overrides, load_config, read_toml
    from clusterfl.deploy.clientdata import export_partitions
    from clusterfl.experiment import build_federation
    from clusterfl.rundir import export_folder

    folder = _out_folder(args)
    config = load_config(apply_overrides(read_toml(args.config), list(args.set or [])))
    federation = build_federation(config)
    with export_folder(folder) as removed:  # locked; an earlier export's files removed
        paths = export_partitions(federation, folder)
    old = f", replacing the {removed} of an earlier export" if removed else ""
    print(f"wrote {len(paths)} client files to {folder} ({paths[0].name} ...){old}")
    return 0


def _out_folder(args: argparse.Namespace) -> str:
    """The output folder, given as OUT_DIR or as --out (one of them)."""
    if args.out_dir and args.out and args.out_dir != args.out:
        raise ClusterFLError(f"two output folders: OUT_DIR {args.out_dir} and --out {args.out}; "
                             "give one")
    folder = args.out_dir or args.out
    if not folder:
        raise ClusterFLError("no output folder: give it as OUT_DIR or --out")
    return str(folder)


def cmd_certs(args: argparse.Namespace) -> int:
    """Generate test certificates and node keys."""
    require("flower", "cryptography", load=False)
    from clusterfl.deploy.certs import files, host_problem, make_node_keys, make_tls

    if args.nodes < 0:
        raise ClusterFLError("--nodes must be >= 0")
    for host in args.host:
        problem = host_problem(host)
        if problem:
            raise ConfigError("--host", problem)
    folder = _out_folder(args)
    there = [name for name in files(args.nodes) if (Path(folder) / name).exists()]
    if there and not args.overwrite:
        raise ClusterFLError(f"{folder} already holds {', '.join(there[:3])}"
                             f"{' ...' if len(there) > 3 else ''}: new ones would not match "
                             "the copies handed out; --overwrite to replace them, or another "
                             "folder")
    paths = make_tls(folder, args.host)
    keys = make_node_keys(folder, args.nodes)
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    if keys:
        print(f"{len(keys)} SuperNode key pairs: {keys[0][0]} / {keys[0][1]} ...")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run on Flower in the chosen mode."""
    _check_mode_options(args)
    if args.mode == "ray":  # the simulation SuperLink (a subprocess) imports it
        require("ray", "ray", load=False)
    require("flower", "flwr", load=False)
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT
    if not args.timeout > 0:  # nan too; inf waits without a limit
        raise ConfigError("--timeout", f"must be a number of seconds > 0, got {args.timeout}")
    cpus = None if args.cpus_per_client is None else cpus_per_client(args.cpus_per_client)
    raw = _raw(args.config, args.set)
    if args.mode == "submit":
        if args.superlink:
            check_superlink(args.superlink)
        return _submit(args.config, list(args.set or []), args.out, args.superlink)
    out = args.out or str(Path("runs") / f"{Path(args.config).stem}-flower")
    echo: Callable[[str], None] = (lambda m: None) if args.quiet else _echo
    from clusterfl.experiment import claim_run_dir  # submit: --out is on the SuperLink machine

    claim_run_dir(out, overwrite=args.overwrite,
                  hint="--overwrite to replace it, or another --out")
    if args.mode == "ray":
        summary = _run_ray(args.config, list(args.set or []), raw, out, args.timeout, echo,
                           cpus)
    else:
        summary = _run_local(args.config, list(args.set or []), raw, out, args.timeout, echo)
    _print_results(summary, out)
    return 0


DEFAULT_TIMEOUT = 3600.0
"""Seconds `flower run --mode local|ray` waits for the run (`--timeout`)."""


def cpus_per_client(cpus: float) -> int:
    """`--cpus-per-client` as a whole number of CPUs from 1 to this machine's cores, or one
    line naming the option (Flower's simulation reserves whole CPUs per ClientApp actor; more
    than the machine has leaves Flower's actor pool empty)."""
    cores = os.cpu_count() or 1
    if not (math.isfinite(cpus) and cpus >= 1 and cpus == int(cpus)):
        raise ConfigError("--cpus-per-client", f"must be a whole number of CPUs from 1 to "
                          f"{cores} (this machine's cores), got {cpus:g}")
    if cpus > cores:
        raise ConfigError("--cpus-per-client", f"{cpus:g} CPUs per client, but this machine "
                          f"has {cores} cores: at most {cores}")
    return int(cpus)


def _check_mode_options(args: argparse.Namespace) -> None:
    """Options of one mode given with another are refused (they would change nothing)."""
    if args.cpus_per_client is not None and args.mode != "ray":
        raise ClusterFLError(f"--cpus-per-client: only with --mode ray (--mode {args.mode} "
                             "does not run the clients as Ray actors)")
    if args.superlink and args.mode != "submit":  # the run would stay on this machine
        raise ClusterFLError(f"--superlink: only with --mode submit (--mode {args.mode} runs "
                             "on a SuperLink it starts on this machine)")
    if args.mode == "submit":
        extra = [name for name, on in (("--timeout", args.timeout is not None),
                                       ("--overwrite", args.overwrite),
                                       ("--quiet", args.quiet)) if on]
        if extra:
            raise ClusterFLError(f"{', '.join(extra)}: only with --mode local or ray (submit "
                                 "streams the run's log from the SuperLink and writes nothing "
                                 "here)")


def check_superlink(name: str) -> None:
    """`--superlink` names a connection of flwr's `config.toml` (`$FLWR_HOME`, default
    `~/.flwr`), when that file exists; one line naming the known ones otherwise (flwr's own
    message is a box about an unexpected error), with the way to add an address."""
    import tomllib

    path = Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr") / "config.toml"
    try:
        known = tomllib.loads(path.read_text(encoding="utf-8"))["superlink"]
    except (OSError, ValueError, KeyError):
        return  # no readable file: flwr makes its default one, or says what is wrong
    names = sorted(k for k, v in known.items() if isinstance(v, dict))
    if name in names:
        return
    port = "" if re.search(r":\d+$", name) else ":PORT"
    hint = (f'; an address goes into that file as [superlink.NAME] address = "{name}{port}", '
            "then --superlink NAME (docs/deploy.md, section 5)"
            ) if "." in name or ":" in name else ""  # an address, not a name
    raise ClusterFLError(f"--superlink: {name!r} is not a SuperLink connection of {path} "
                         f"(it has {', '.join(names) or 'none'}){hint}")


def _echo(message: str) -> None:
    print(f"flower: {message}", flush=True)


def _print_results(summary: RunSummary, out: str) -> None:
    """The results table of `clusterfl run`, and where the run's files are."""
    from rich.console import Console

    from clusterfl.report import summary_table

    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=200)
    con.print(summary_table([summary]))
    con.print(f"results in {out}/")


class RoundWatch:
    """Echoes a line per round of the run in `out_dir` as its history.jsonl grows, and a
    line every `quiet` seconds while no round finishes (nodes starting, a slow round).

    Runs in a thread (`with RoundWatch(...):`); a history.jsonl left by an earlier run in
    the folder is ignored until the new run rewrites it.
    """

    def __init__(self, out_dir: str | Path, rounds: int, echo: Callable[[str], None],
                 quiet: float = 60.0, poll: float = 1.0) -> None:
        self.path = Path(out_dir) / "history.jsonl"
        self.rounds, self.echo, self.quiet, self.poll_every = rounds, echo, quiet, poll
        self.seen = 0
        self._old = self._stat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = self.last = time.monotonic()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def poll(self) -> None:
        """Echo the rounds written since the last poll."""
        stat = self._stat()
        if stat is None or stat == self._old:
            return
        self._old = None  # the run has written the file: everything in it is new
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return
        if len(lines) < self.seen:  # rewritten (a new run in the folder)
            self.seen = 0
        for line in lines[self.seen:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line being written: read it at the next poll
            self.echo(self._line(record))
            self.seen += 1
            self.last = time.monotonic()

    def _line(self, record: dict[str, Any]) -> str:
        metrics = record.get("metrics") or {}
        parts = [f"round {record.get('round')}/{self.rounds}"]
        if metrics.get("accuracy") is not None:
            parts.append(f"accuracy {100 * metrics['accuracy']:.1f}%")
        elif metrics.get("mse") is not None:
            parts.append(f"MSE {metrics['mse']:.4g}")
        parts.append(f"{record.get('n_clusters')} clusters")
        return "  ".join(parts) + f"  ({time.monotonic() - self.t0:.0f} s)"

    def _run(self) -> None:
        while not self._stop.wait(self.poll_every):
            self.poll()
            if time.monotonic() - self.last > self.quiet:
                self.last = time.monotonic()
                self.echo(f"waiting for round {self.seen + 1}/{self.rounds} "
                          f"({time.monotonic() - self.t0:.0f} s so far)")

    def __enter__(self) -> RoundWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()


def n_clients_of(raw: dict[str, Any]) -> int:
    """Number of SuperNodes `--mode local|ray` starts, partitions 0..n-1 (backend.wait_nodes
    or scenario.n_clients): more than the scenario's clients is refused, fewer said."""
    from clusterfl.config import load_config
    from clusterfl.deploy.server_app import nodes_wanted

    n, n_clients = nodes_wanted(load_config(raw))
    if n_clients and n > n_clients:  # the extra nodes' partition-ids are out of range
        raise ConfigError("backend.wait_nodes", f"{n} SuperNodes, but the scenario has "
                          f"{n_clients} clients and each node here holds one: at most "
                          f"{n_clients} (0: all of them)")
    if n < n_clients:
        _warn(f"backend.wait_nodes = {n} of scenario.n_clients = {n_clients}: one SuperNode "
              f"per client is started for clients 0..{n - 1} only, and the run has those")
    return n


def _rounds(raw: dict[str, Any]) -> int:
    from clusterfl.config import load_config

    return load_config(raw).run.rounds


def _run_ray(config: str, overrides: list[str], raw: dict[str, Any], out: str,
             timeout: float, echo: Callable[[str], None],
             cpus: int | None = None) -> RunSummary:
    """Flower's supported simulation path: a simulation SuperLink on loopback and `flwr run`
    on it with `num-supernodes` = n (a local simulation federation; Ray actors of `cpus`
    CPUs and torch threads each, `--cpus-per-client`)."""
    n = n_clients_of(raw)
    each = f", {cpus} CPUs and torch threads per client" if cpus else ""
    echo(f"simulating {n} SuperNodes with Ray (flwr run on a local simulation federation"
         f"{each}); rounds are reported as they finish")
    return _flwr_run(config, overrides, raw, out, timeout, echo, simulate=n, cpus=cpus)


def _run_local(config: str, overrides: list[str], raw: dict[str, Any], out: str,
               timeout: float, echo: Callable[[str], None]) -> RunSummary:
    n = n_clients_of(raw)
    return _flwr_run(config, overrides, raw, out, timeout, echo, supernodes=n)


def _flwr_run(config: str, overrides: list[str], raw: dict[str, Any], out: str,
              timeout: float, echo: Callable[[str], None], supernodes: int = 0,
              simulate: int = 0, cpus: int | None = None) -> RunSummary:
    """A SuperLink on loopback (`simulate` > 0: a simulation SuperLink, `cpus` per client
    actor), `supernodes` SuperNode processes, `flwr run` of our app; everything stopped at
    the end."""
    from clusterfl.deploy.launch import clear_stale_workers, local_deployment, set_aside_logs
    from clusterfl.deploy.server_app import FINAL_STATE
    from clusterfl.records import read_summary

    out_dir = Path(out).resolve()
    work = out_dir.parent / (out_dir.name + ".flower")
    moved = set_aside_logs(work / "logs")
    if moved:
        echo(f"moved the {len(moved)} logs of an earlier run in {work / 'logs'} to "
             f"{work / 'logs' / 'old'} ({', '.join(moved[:4])}{' ...' if len(moved) > 4 else ''})")
    removed, kept = clear_stale_workers(work / "workers")
    if removed:
        echo(f"removed the {len(removed)} node worker files an earlier run left in "
             f"{work / 'workers'} (no worker of it runs)")
    if kept:
        _warn(f"{len(kept)} node worker files in {work / 'workers'} may belong to a worker "
              "that still runs (a process names that folder, or holds a start lock there: an "
              "earlier run not stopped?); they are kept")
    if supernodes:
        echo(f"starting a SuperLink and {supernodes} SuperNodes on this machine (logs in "
             f"{work / 'logs'})")
    with local_deployment(work) as dep, RoundWatch(out_dir, _rounds(raw), echo):
        if simulate:
            dep.start_superlink(simulate=simulate, num_cpus=cpus)
        else:
            dep.start_superlink()
        for i in range(supernodes):
            dep.start_supernode({"partition-id": i})
        proc = dep.flwr_run(Path(config).resolve(), out_dir, overrides)
        deadline = time.monotonic() + timeout
        exited: set[int] = set()
        while not (out_dir / FINAL_STATE).exists():
            _say_exited(dep.supernodes, exited)
            if not proc.alive():
                why = run_error(proc.log)
                raise ClusterFLError(f"the Flower run stopped before it finished"
                                     f"{f': {why}' if why else ''}; logs in {work / 'logs'}")
            if time.monotonic() > deadline:
                raise ClusterFLError(f"the Flower run did not finish within --timeout "
                                     f"{timeout:g} s; logs in {work / 'logs'}")
            time.sleep(0.5)
        _say_exited(dep.supernodes, exited)
    _say_dropouts(out_dir)
    return read_summary(out_dir)


def _warn(message: str) -> None:
    print(f"clusterfl: warning: {message}", file=sys.stderr, flush=True)


def _say_exited(supernodes: list[Process], said: set[int]) -> None:
    """A warning for each SuperNode process (index = partition-id) found dead, once."""
    for i, node in enumerate(supernodes):
        if i not in said and not node.alive():
            said.add(i)
            _warn(f"SuperNode {i} (partition-id {i}) exited with code "
                  f"{node.popen.returncode} (log {node.log}); the run goes on without its "
                  "client, dropped from each request once backend.timeout has passed")


def _say_dropouts(out_dir: Path) -> None:
    """A warning when clients were dropped from requests (from the run's flower.json)."""
    try:
        dropouts = json.loads((out_dir / "flower.json").read_text(encoding="utf-8"))["dropouts"]
    except (OSError, ValueError, KeyError):
        return
    if dropouts:
        clients = sorted({int(c) for d in dropouts for c in d["clients"]})
        _warn(f"{len(dropouts)} request(s) went without some clients ({clients}); each "
              f"dropout and its reason are in {out_dir / 'flower.json'}")


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def run_error(log: Path) -> str | None:
    """The last exception line (`Type: message`) in the log of `flwr run --stream`, which
    streams the ServerApp's traceback; a clusterfl error by its message alone."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = None
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m:
            found = m
    if found is None:
        return None
    kind, message = found.groups()
    return message if kind.startswith("clusterfl.") else f"{kind.rsplit('.', 1)[-1]}: {message}"


def _submit(config: str, overrides: list[str], out: str | None, superlink: str | None) -> int:
    import subprocess

    from clusterfl.deploy.launch import flower_bin, run_config_arg

    cmd = [flower_bin("flwr"), "run", str(_app_dir())]
    if superlink:
        cmd.append(superlink)
    cmd += ["--stream", "--run-config",
            run_config_arg(Path(config).resolve(), Path(out).resolve() if out else None,
                           overrides)]
    return subprocess.call(cmd)
