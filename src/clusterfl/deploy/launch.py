"""Start and stop a local Flower deployment as real processes (tests, benchmarks, demos).

Everything listens on loopback by default, every process gets its own log file, and
`Process.stop()` ends the process *and all its descendants* by PID (Flower's SuperLink
starts its SuperExec in a new session, so process groups alone would miss it). Commands
(Flower 1.41, see `--help` of each):

    flower-superlink --insecure | --ssl-ca-certfile CA --ssl-certfile CRT --ssl-keyfile KEY
                     [--enable-supernode-auth] --host H --port P --database :flwr-in-memory:
                     --disable-runtime-dependency-installation --isolation process
    flower-superexec --runtime-api-address H:P --insecure | --root-certificates CA
                     --parent-pid SUPERLINK_PID
    flower-supernode --insecure | --root-certificates CA  --superlink H:P --port CLIENTAPPIO
                     --node-config 'partition-id=3' | 'data-file="DATA_DIR/client.npz"'
                     [--auth-supernode-private-key KEY]
    flwr run APP_DIR CONNECTION --run-config 'config="RUN_CONFIG.toml" out-dir="RUN_DIR"'

`flwr run` reads the SuperLink connection from `$FLWR_HOME/config.toml`
(`write_flwr_home` writes one).

Latency (issue 26): SuperNodes are started as `python -m clusterfl.deploy.supernode` (Flower's
`flower-supernode` with a 0.2 s idle poll instead of its hard-coded 3 s, see that module), and
every process gets `FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1` (the SuperExecs' poll for new
ClientApp / ServerApp tasks; Flower's default 1 s) unless the environment sets it.

The SuperLink's SuperExec (the process that starts each submitted ServerApp) is started and
supervised here rather than left to the SuperLink (`--isolation process`): Flower 1.41's
SuperExec exits on the first error its SuperLink returns, and a loaded SuperLink can return
one (seen here with a file-backed state: `database is locked`, HTTP 500 on `acquire-task`).
The SuperLink then accepts runs that never start. The supervisor thread of
`LocalDeployment` starts a new SuperExec within a second of the old one's exit and counts
the restarts (`LocalDeployment.superexec_restarts`, one line each in `logs/supervisor.log`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from clusterfl.errors import ClusterFLError, require

APP_DIR = Path(__file__).parent / "app"
"""The Flower App project (pyproject.toml naming our ServerApp and ClientApp)."""

SUPEREXEC_POLL = "0.1"
"""Seconds between a SuperExec's polls for tasks (`FLWR_SUPEREXEC_TASK_POLL_INTERVAL`)."""

IN_MEMORY = ":flwr-in-memory:"
"""Flower's name for a SuperLink state kept in memory (`flwr.supercore.constant`); any other
value is a SQLite file path, relative to the SuperLink's working directory."""


def flower_bin(name: str) -> str:
    """Path of a console script installed beside the running Python (else just the name)."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (read from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_matching(needle: str) -> list[int]:
    """SIGKILL the processes whose command line contains `needle` (e.g. a private temp
    directory only our node workers mention); returns their PIDs."""
    killed = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and int(entry.name) != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


@dataclass
class Process:
    """A started command with its log; `stop()` kills it and its descendants."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    extra_pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the process tree, SIGKILL what is left after `grace` seconds."""
        stop_all([self], grace)

    def kill_now(self) -> None:
        """SIGKILL the process and its descendants at once (a crash, for dropout tests)."""
        for p in [self.pid, *descendants(self.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        self.popen.wait(timeout=5)


def stop_all(procs: Sequence[Process], grace: float = 3.0) -> None:
    """Stop several processes and their trees together: SIGTERM to all, SIGKILL to what is
    left after `grace` seconds (one wait for all of them, not one per process)."""
    trees = [(p, [p.pid, *descendants(p.pid), *p.extra_pids]) for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for _, pids in trees:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_exists(pid) for _, pids in trees
                                                  for pid in pids):
            for p, _ in trees:
                p.popen.poll()  # reap our own children as they exit
            time.sleep(0.05)
    for p, _ in trees:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=1.0)


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start(name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Process:
    """Start `cmd` in its own session with stdout+stderr to `log_dir/name.log` (in `cwd`,
    default: ours)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    fh = open(log, "wb")  # noqa: SIM115 - handed to the child
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                "PATH": path, "FLWR_SUPEREXEC_TASK_POLL_INTERVAL":
                os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", SUPEREXEC_POLL), **(env or {})}
    popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env,
                             start_new_session=True, cwd=cwd)
    fh.close()
    return Process(name, popen, log)


LOG_NAME = re.compile(r"(superlink|superexec\d*|supernode\d+|flwr-run|supervisor)\.log")
"""The names of the logs a `LocalDeployment` writes into its `logs` folder."""


def set_aside_logs(log_dir: Path) -> list[str]:
    """Move the logs an earlier deployment left in `log_dir` (only the names `LOG_NAME`
    matches: no other file is touched) into `log_dir/old`, replacing the ones there, so
    that `log_dir` holds only the next deployment's; returns the names moved, sorted."""
    if not log_dir.is_dir():
        return []
    names = sorted(p.name for p in log_dir.iterdir() if p.is_file() and LOG_NAME.fullmatch(p.name))
    if names:
        old = log_dir / "old"
        if old.is_dir():
            for p in old.iterdir():
                if p.is_file() and LOG_NAME.fullmatch(p.name):
                    p.unlink()
        old.mkdir(exist_ok=True)
        for name in names:
            os.replace(log_dir / name, old / name)
    return names


WORKER_FILE = re.compile(r"[0-9a-f]{16}\.(sock|lock|log)")
"""The names of a node worker's files: its socket, start lock and log (`<16 hex>.sock`, from
the ClientApp's `_socket_path`, with `.lock` and `.log` beside it)."""


def worker_files(folder: Path) -> set[str]:
    """The node worker files (names `WORKER_FILE` matches) in `folder`."""
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if WORKER_FILE.fullmatch(p.name)}


def _lock_held(path: Path) -> bool:
    """Whether a process holds the `flock` of `path` (a ClientApp starting its worker)."""
    import fcntl

    try:
        with open(path, "rb") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def clear_stale_workers(folder: Path) -> tuple[list[str], list[str]]:
    """Remove the node worker files an earlier deployment left in `folder` (killed before
    its `stop()`): `(removed, kept)`, names sorted. They are removed only when provably
    stale: no live process names `folder` on its command line (every worker does, in
    `--socket`) and no start lock is held; otherwise all are kept. Other files are left
    alone."""
    names = sorted(worker_files(folder))
    if not names:
        return [], []
    mine = os.getpid()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmd and int(entry.name) != mine:
            return [], names
    if any(_lock_held(folder / n) for n in names if n.endswith(".lock")):
        return [], names
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    return names, []


def _abs(path: Path | str) -> str:
    """Paths on command lines are absolute: the processes run in the deployment's folder."""
    return str(Path(path).expanduser().resolve())


@dataclass
class Tls:
    """Certificate paths for a TLS SuperLink (test ones: `certs.make_tls`)."""

    ca: Path
    server_cert: Path
    server_key: Path


def superlink_cmd(port: int, host: str = "127.0.0.1", tls: Tls | None = None,
                  node_auth: bool = False, own_superexec: bool = False,
                  simulation: bool = False) -> list[str]:
    """The `flower-superlink` command line (`own_superexec`: we start its SuperExec;
    `simulation`: runs are simulated, Flower's simulation runtime and Ray, no SuperNodes)."""
    cmd = [flower_bin("flower-superlink"), "--host", host, "--port", str(port),
           "--database", IN_MEMORY, "--disable-runtime-dependency-installation"]
    if simulation:
        cmd.append("--simulation")
    if own_superexec:
        cmd += ["--isolation", "process"]
    if tls is None:
        cmd.append("--insecure")
    else:
        cmd += ["--ssl-ca-certfile", _abs(tls.ca), "--ssl-certfile", _abs(tls.server_cert),
                "--ssl-keyfile", _abs(tls.server_key)]
    if node_auth:
        cmd.append("--enable-supernode-auth")
    return cmd


def superexec_cmd(runtime_address: str, ca: Path | None = None,
                  parent_pid: int | None = None) -> list[str]:
    """The `flower-superexec` command line for a SuperLink's Runtime API at `runtime_address`
    (`ca`: the SuperLink's TLS root; `parent_pid`: exit when that process does)."""
    cmd = [flower_bin("flower-superexec"), "--runtime-api-address", runtime_address]
    cmd += ["--insecure"] if ca is None else ["--root-certificates", _abs(ca)]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    return cmd


def supernode_cmd(superlink: str, port: int, node_config: dict[str, object],
                  ca: Path | None = None, auth_key: Path | None = None,
                  fast_poll: bool = True) -> list[str]:
    """The `flower-supernode` command line (`node_config` → `--node-config 'k=v ...'`);
    `fast_poll`: Flower's SuperNode through `clusterfl.deploy.supernode`, whose idle poll
    is 0.2 s instead of Flower 1.41's fixed 3 s (same arguments, same code otherwise)."""
    cfg = " ".join(f'{k}="{v}"' if isinstance(v, str | Path) else f"{k}={v}"
                   for k, v in node_config.items())
    exe = ([sys.executable, "-m", "clusterfl.deploy.supernode"] if fast_poll
           else [flower_bin("flower-supernode")])
    cmd = [*exe, "--superlink", superlink, "--port", str(port), "--node-config", cfg]
    cmd += ["--insecure"] if ca is None else ["--root-certificates", _abs(ca)]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", _abs(auth_key)]
    return cmd


def write_flwr_home(home: Path, address: str, name: str = "clusterfl",
                    ca: Path | None = None) -> Path:
    """A `$FLWR_HOME/config.toml` whose default SuperLink connection is `address`."""
    conn: dict[str, object] = {"address": address}
    if ca is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(ca)
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}))
    return path


def federation_config(n: int, num_cpus: int = 1) -> str:
    """`flwr run --federation-config` of a local simulation federation: n virtual
    SuperNodes, `num_cpus` per ClientApp actor (Flower 1.41 takes whole CPUs)."""
    if num_cpus != int(num_cpus) or num_cpus < 1:
        raise ValueError(f"num_cpus: a whole number of 1 or more, got {num_cpus}")
    return f"num-supernodes={int(n)} client-resources-num-cpus={int(num_cpus)}"


def run_config_arg(config: Path, out_dir: Path | None, overrides: Sequence[str] = ()) -> str:
    """The `--run-config` value for our ServerApp."""
    parts = [f'config="{config}"', f'out-dir="{out_dir or ""}"']
    if overrides:
        parts.append('overrides="' + ";".join(overrides).replace('"', '\\"') + '"')
    return " ".join(parts)


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on this machine (loopback); use as a context manager."""

    work: Path
    superlink: Process | None = None
    supernodes: list[Process] = field(default_factory=list)
    address: str = ""
    flwr_home: Path | None = None
    superexec: Process | None = None
    superexec_restarts: int = 0
    supervise_every: float = 0.5  # seconds between the supervisor's checks
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ca: Path | None = field(default=None, repr=False)  # the SuperLink's TLS root, if any
    federation_config: str | None = None  # `flwr run --federation-config` (simulation)
    env: dict[str, str] = field(default_factory=dict)  # for the SuperLink and its SuperExec
    _earlier_workers: set[str] = field(default_factory=set, repr=False)  # not ours: kept

    def __post_init__(self) -> None:
        self._earlier_workers = worker_files(self.worker_dir)

    def start_superlink(self, tls: Tls | None = None, node_auth: bool = False,
                        simulate: int = 0, num_cpus: int | None = None) -> None:
        """The SuperLink, its SuperExec, and the supervisor that restarts the SuperExec.

        `simulate` = n > 0: a simulation SuperLink instead (Flower's supported path for a
        simulated federation: `flwr run --federation-config 'num-supernodes=n ...'`, each
        virtual SuperNode's ClientApp in a Ray actor); no SuperNodes are started then.
        `num_cpus`: the CPUs Ray reserves for each actor (default 1), and the torch threads
        of the simulation (`OMP_NUM_THREADS` of the SuperLink and its SuperExec; without it,
        the environment's or 1)."""
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self._ca = None if tls is None else tls.ca
        if num_cpus is not None:
            self.env["OMP_NUM_THREADS"] = str(int(num_cpus))
        if simulate > 0 and not os.environ.get("RAY_ADDRESS"):
            self.env["RAY_ADDRESS"] = "local"  # not a cluster `ray start` left running here
        self.superlink = start("superlink", superlink_cmd(port, tls=tls, node_auth=node_auth,
                                                          own_superexec=True,
                                                          simulation=simulate > 0),
                               self.work / "logs",
                               env={**self.env, "FLWR_HOME": str(self.work / "home")},
                               cwd=self.work)
        self.flwr_home = self.work / "cli-home"
        self.federation_config = (federation_config(simulate, num_cpus or 1) if simulate > 0
                                  else None)
        write_flwr_home(self.flwr_home, self.address, ca=None if tls is None else tls.ca)
        _wait_port(port, 30.0, self.superlink)
        self._start_superexec()
        self._supervisor = threading.Thread(target=self._supervise, name="superexec-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def _start_superexec(self) -> None:
        assert self.superlink is not None
        name = "superexec" if self.superexec is None else f"superexec{self.superexec_restarts}"
        self.superexec = start(name, superexec_cmd(self.address, self._ca, self.superlink.pid),
                               self.work / "logs",
                               env={**self.env, "FLWR_HOME": str(self.work / "home")},
                               cwd=self.work)

    def _supervise(self) -> None:
        while not self._stopping.wait(self.supervise_every):
            self.check_superexec()

    def check_superexec(self) -> bool:
        """Start a new SuperExec if the last one exited while the SuperLink runs (True then).
        The supervisor thread calls this every `supervise_every` seconds."""
        with self._lock:
            if (self._stopping.is_set() or self.superlink is None or self.superexec is None
                    or self.superexec.alive() or not self.superlink.alive()):
                return False
            old = self.superexec
            self.superexec_restarts += 1
            with open(self.work / "logs" / "supervisor.log", "a") as fh:  # ours alone
                fh.write(f"[clusterfl] SuperExec (pid {old.pid}) exited with code "
                         f"{old.popen.returncode} (log {old.log.name}); starting a new one "
                         f"(restart {self.superexec_restarts})\n")
            self._start_superexec()
            return True

    def register_supernodes(self, public_keys: list[Path]) -> None:
        """`flwr supernode register KEY.pub` for each key (SuperLink with node auth)."""
        env = {**os.environ, "FLWR_HOME": str(self.flwr_home)}
        procs = [subprocess.Popen([flower_bin("flwr"), "supernode", "register", str(k),
                                   "clusterfl"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT) for k in public_keys]
        for k, proc in zip(public_keys, procs, strict=True):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"registering {k} failed: {out.decode()[-1000:]}")

    def start_supernode(self, node_config: dict[str, object], ca: Path | None = None,
                        auth_key: Path | None = None) -> Process:
        i = len(self.supernodes)
        home = self.work / f"node{i}-home"
        proc = start(f"supernode{i}",
                     supernode_cmd(self.address, free_port(), node_config, ca, auth_key),
                     self.work / "logs", env={"FLWR_HOME": str(home),
                                              "CLUSTERFL_WORKER_DIR": str(self.worker_dir)},
                     cwd=self.work)
        self.supernodes.append(proc)
        return proc

    def flwr_run(self, config: Path | None, out_dir: Path | None,
                 overrides: Sequence[str] = (), app_dir: Path = APP_DIR,
                 run_config: str | None = None) -> Process:
        """Submit an app with `flwr run` (returns the `flwr` process; it streams logs): ours
        with its run config made of `config`, `out_dir` and `overrides`, or the app in
        `app_dir` with the `--run-config` string `run_config`."""
        if run_config is None:
            if config is None:
                raise ValueError("flwr_run: give our app's config, or a run_config")
            run_config = run_config_arg(config, out_dir, list(overrides))
        cmd = [flower_bin("flwr"), "run", str(app_dir), "clusterfl", "--stream",
               "--run-config", run_config]
        if self.federation_config:  # a simulation SuperLink: the simulated federation
            cmd += ["--federation-config", self.federation_config]
        return start("flwr-run", cmd, self.work / "logs",
                     env={"FLWR_HOME": str(self.flwr_home)})

    @property
    def worker_dir(self) -> Path:
        """Where the node workers of this deployment put their sockets and logs."""
        return self.work / "workers"

    def stop(self) -> None:
        """Stop every process this deployment started, and its node workers, and remove
        the workers' files."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10.0)
        with self._lock:
            procs = [*self.supernodes, *([self.superexec] if self.superexec else []),
                     *([self.superlink] if self.superlink else [])]
        stop_all(procs)
        kill_matching(str(self.worker_dir))
        self.remove_worker_files()

    def remove_worker_files(self) -> list[str]:
        """Remove the node worker files this deployment's nodes wrote (those not there when
        it was made; no other file) and the workers folder if that leaves it empty; returns
        the names removed, sorted. `stop()` calls it once the workers are killed."""
        ours = sorted(worker_files(self.worker_dir) - self._earlier_workers)
        for name in ours:
            with contextlib.suppress(FileNotFoundError):
                (self.worker_dir / name).unlink()
        with contextlib.suppress(OSError):  # not empty, or not there: left as it is
            self.worker_dir.rmdir()
        return ours

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def last_line(log: Path) -> str:
    """The last non-empty line of a process's log (its error, as a rule), colour codes out."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [x.strip() for x in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _wait_port(port: int, timeout: float, proc: Process) -> None:
    """Until `proc` listens on `port`; one line (ClusterFLError) when it exits first (a port
    in use, a certificate file it cannot read) or is not listening after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            why = last_line(proc.log)
            raise ClusterFLError(f"the {proc.name} exited (code {proc.popen.returncode}) before "
                                 f"it opened port {port}{f': {why}' if why else ''}; log "
                                 f"{proc.log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise ClusterFLError(f"the {proc.name} did not open port {port} within {timeout:g} s; log "
                         f"{proc.log}")


@contextlib.contextmanager
def local_deployment(work: Path) -> Iterator[LocalDeployment]:
    """`LocalDeployment` that is always stopped (every PID) on exit."""
    require("flower", "flwr", load=False)
    dep = LocalDeployment(work)
    try:
        yield dep
    finally:
        dep.stop()
