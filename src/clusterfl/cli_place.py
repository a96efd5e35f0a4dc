"""`clusterfl place`: put clients into the clusters of a finished run, for every method.

    clusterfl place RUN_DIR [--clients 3,7,20-23] [--json FILE] [--set KEY=VALUE ...]
                    [--data-dir DIR]

The method's final state is read from `RUN_DIR/checkpoint/state.pt` (a run writes it at its
last round when `checkpoint_every > 0`; a CFL run's `cfl_tree.pt` serves too). The clients
come from the federation of the run's `config.toml` as it builds it (ids of the whole
federation, held-out clients included), optionally changed with `--set` (e.g. `--set seed=7`
for fresh data from the same recipe, or `--set scenario.n_clients=24 --clients 20-23`) or
`[backend]`; `rounds`, `[model]`, `[train]` and `[algorithm]` must stay the run's (they define
the placement rule; a `--set` of them is refused naming the key). A placement runs with the
run's `[validation]` and, for a private run, its `[privacy]` (every newcomer's update
clipped and noised alone; the ε of the newcomers' releases is printed below the table), as
the run's own placement of its held-out clients; it simulates no faults or attackers, so
`--set` of `[faults]` or `[adversary]` changes nothing and says so. Each
client is placed by its method's rule (`Algorithm.placement`, through the protocol only,
without changing the method's state; docs/placement.md) and evaluated on its own test data
with the model it was placed on.

The table shows each client's true cluster (when the scenario has clusters), whether it
trained in the run and its cluster there, the placed cluster, the true clusters of the
trained clients in that cluster, the test accuracy, and what the method reports about the
decision (`details`: IFCA's losses, CFL's tree path and similarities, ...). The placement
uses its own generator seeded by the run's seed, as the run's own placement of its held-out
clients does: placing exactly those clients gives exactly the run's `holdout` results.

`cfl-place` is the same command under its former name.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterfl.errors import ClusterFLError, ConfigError

if TYPE_CHECKING:  # numpy and torch are imported when the command runs (fast --help)
    import numpy as np

    from clusterfl.algorithms.base import Algorithm, Context
    from clusterfl.algorithms.common import Placement

CHECKPOINT = "checkpoint/state.pt"
CFL_TREE = "cfl_tree.pt"  # `CFL.save_artifacts` (kept from `cfl-place`)


def add_parser(subparsers: Any) -> None:
    """Register `place` and its alias `cfl-place` on an argparse subparsers object."""
    for name, help_text in (
            ("place", "place new clients into a finished run's clusters (every method)"),
            ("cfl-place", "the former name of `place` (same command)")):
        p = subparsers.add_parser(name, help=help_text,
                                  description=__doc__.split("\n\n")[0] if __doc__ else None)
        p.add_argument("run_dir", help="directory of a finished run (with a checkpoint)")
        p.add_argument("--clients", help="client ids of the federation, e.g. '0,3,8-11' "
                                         "(default: all clients)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="change the run's config for the federation the clients come "
                       "from: seed, [data], [scenario], [backend] (not rounds, [model], "
                       "[train], [algorithm])")
        p.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
        p.add_argument("--json", metavar="FILE", help="also write the placements as JSON")
        p.set_defaults(func=cmd_place)


def parse_clients(spec: str | None, n_clients: int) -> np.ndarray:
    """'0,3,8-11' → [0, 3, 8, 9, 10, 11]; None → all clients. Ids and ranges are ASCII digits
    (a range goes up), each client once, no empty item. Raises ClusterFLError."""
    import numpy as np

    if spec is None:
        return np.arange(n_clients)
    parts = [p.strip() for p in spec.split(",")]
    out: list[int] = []
    if any(parts):
        for part in parts:
            if not part:
                raise ClusterFLError(f"--clients: an empty item in {spec!r}; give ids and "
                                     "ranges separated by single commas, e.g. 0,3,8-11")
            m = _ITEM.fullmatch(part)
            if m is None:
                raise ClusterFLError(f"--clients: cannot read {part!r}; use ids and ranges "
                                     "of the digits 0-9, e.g. 0,3,8-11")
            a = int(m[1])
            b = a if m[2] is None else int(m[2])
            if b < a:
                raise ClusterFLError(f"--clients: a range must go up: {b}-{a}, not {part!r}")
            out.extend(range(a, b + 1))
    bad = [c for c in out if not 0 <= c < n_clients]
    if bad or not out:
        got = f"{bad[0]} in {spec!r}" if bad else f"no id in {spec!r}"
        raise ClusterFLError(f"--clients: ids must be in 0..{n_clients - 1} (got {got})")
    seen: set[int] = set()
    for c in out:
        if c in seen:
            raise ClusterFLError(f"--clients: client {c} is given twice in {spec!r}; name "
                                 "each client once")
        seen.add(c)
    return np.array(sorted(out), dtype=np.int64)


_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
"""One item of --clients: an id or a range of ASCII digits (`str.isdigit` and `int` also take
other scripts' digits, such as '٣')."""


def load_state(run_dir: Path) -> tuple[dict[str, Any], str]:
    """The run's saved state (`checkpoint/state.pt`, else CFL's `cfl_tree.pt`) and a line
    saying where it came from; a one-line error saying why when there is none. A checkpoint
    of a run that has not reached its last round (stopped, or still running) is used with a
    one-line warning saying so.

    `saved["config"]` is the run's whole config when the file holds it (a checkpoint) and None
    otherwise: `cfl_tree.pt` keeps only the method's settings (`CFL.save_artifacts`), kept as
    `saved["algorithm_config"]`; `place_clients` then takes the run's `config.toml`."""
    from clusterfl.checkpoint import KEYS
    from clusterfl.flower.strategy import DATA_SOURCE
    from clusterfl.state import read_checkpoint

    data = _config_value(run_dir, "data")
    if isinstance(data, dict) and data.get("source") == DATA_SOURCE:
        raise ClusterFLError(f"{run_dir}: a ClusteredStrategy run (its data lived on the Flower "
                             "clients): clusterfl place cannot "
                             "rebuild its clients; the strategy places the nodes that join "
                             "during its run itself (ClusteredResult.placed)")
    ckpt = run_dir / CHECKPOINT
    if ckpt.is_file():
        saved = read_checkpoint(ckpt, KEYS)
        config = saved.get("config")
        rounds = config.get("rounds") if isinstance(config, dict) else None
        _warn_unfinished(run_dir, saved.get("round"), rounds)
        return saved, f"{ckpt} (round {saved.get('round')} of {rounds})"
    tree = run_dir / CFL_TREE
    if tree.is_file():
        held = read_checkpoint(tree, ("round", "algorithm", "config"))
        saved = {"round": held["round"], "algorithm": held["algorithm"], "config": None,
                 "algorithm_config": held["config"]}
        rounds = _config_value(run_dir, "rounds")
        return saved, f"{tree} (round {saved.get('round')} of {rounds})"
    every = _config_value(run_dir, "checkpoint_every")
    why = ("checkpoints were off (checkpoint_every = 0)" if every == 0 else
           "the run did not write one (not finished, or written by an older clusterfl)")
    raise ClusterFLError(f"{run_dir}: no {CHECKPOINT} to place clients with: {why}; run it "
                         "again with checkpoint_every > 0 (the last round is always saved)")


def _warn_unfinished(run_dir: Path, round_: Any, rounds: Any) -> None:
    """One warning line when the checkpoint holds a round before the run's last one."""
    if not (isinstance(round_, int) and isinstance(rounds, int) and round_ < rounds):
        return
    from clusterfl.rundir import running_process

    who = running_process(run_dir)
    state = f"still running ({who})" if who else "not finished"
    print(f"clusterfl: warning: {run_dir} is {state}: clients are placed on its round-{round_} "
          f"models (round {round_} of {rounds})", file=sys.stderr)


def _config_value(run_dir: Path, key: str) -> Any:
    import tomllib

    try:
        return tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8")).get(key)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def cmd_place(args: argparse.Namespace) -> int:
    """Place the requested clients, print the table (and optionally write the JSON)."""
    from rich.console import Console

    from clusterfl.records import json_ready

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ClusterFLError(f"{run_dir}: no such run directory")
    if not (run_dir / "config.toml").is_file():
        raise ClusterFLError(f"{run_dir}: no config.toml; not a run directory")
    if args.json:
        check_json_target(Path(args.json), run_dir)
    saved, origin = load_state(run_dir)
    rows, label, privacy = place_clients(run_dir, saved, args.clients,
                                         list(args.set or []), args.data_dir)
    con = Console(highlight=False)
    con.print(f"{label}: state from {origin}")
    con.print(placement_table(rows, label))
    if privacy is not None:
        con.print(f"privacy: {privacy['note']}", markup=False)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(json_ready(rows), indent=2))
        except OSError as err:
            raise ClusterFLError(f"--json: cannot write {args.json}: "
                                 f"{err.strerror or err}") from None
        con.print(f"placements written to {args.json}")
    return 0


def check_json_target(path: Path, run_dir: Path) -> None:
    """Before any placement is computed: `--json` names a file in an existing folder that
    is no run's (`run_dir`, the run placed from, or any other: `check_outside_runs`)."""
    from clusterfl.rundir import check_outside_runs

    try:
        folder, parent = path.is_dir(), path.parent.is_dir()
    except OSError as err:  # e.g. a name longer than the file system allows
        raise ClusterFLError(f"--json: cannot write {path}: {err.strerror or err}") from None
    if folder:
        raise ClusterFLError(f"--json: {path} is a folder; give the name of a file to write")
    if not parent:
        raise ClusterFLError(f"--json: the folder {path.parent} does not exist; create it or "
                             "give a file in an existing folder")
    check_outside_runs(path, "--json", run_dir)
    if path.exists() and not _is_placements(path):
        raise ClusterFLError(f"--json: {path} exists and is not a placements file (what "
                             "`place --json` writes); it is not overwritten: give a new name")


ROW_KEYS = frozenset({"client", "true_cluster", "trained", "run_cluster", "cluster",
                      "cluster_true_clusters", "accuracy"})
"""The keys of every row `place --json` writes (`_rows`), and `details` when the method
reports them."""


def _is_placements(path: Path) -> bool:
    """The file holds what `place --json` writes (an earlier placement, which may be
    replaced): a non-empty JSON list of objects with exactly the keys of `ROW_KEYS` (and
    `details`), integer `client` and `cluster`. Anything else, `[]` or a list of the user's
    own objects with `client` and `cluster` among other keys included, is not."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r, dict) and set(r) - {"details"} == ROW_KEYS
        and all(type(r[k]) is int for k in ("client", "cluster")) for r in rows)


def _check_model_fits(was: dict[str, Any], exp: Any) -> None:
    """A federation changed by `--set` must give the run's model what it was trained on: the
    same input shape and number of outputs (ClusterFLError naming both otherwise)."""
    from clusterfl.config import load_config
    from clusterfl.experiment import build_federation

    now = exp.full_federation
    then = build_federation(load_config(was))
    if tuple(then.input_shape) != tuple(now.input_shape) or then.n_outputs != now.n_outputs:
        raise ClusterFLError(
            f"--set: the run's model was trained on inputs {tuple(then.input_shape)} with "
            f"{then.n_outputs} outputs; the federation of --set has inputs "
            f"{tuple(now.input_shape)} with {now.n_outputs}: place clients whose data has the "
            "run's shape")


def _warn_other_dataset(was: dict[str, Any], now: dict[str, Any]) -> None:
    """One warning line when `--set data.source` names another dataset than the run's (of the
    same shape, else `_check_model_fits` refused it): the clusters were learnt on other data."""
    then, source = (c.get("data", {}).get("source") for c in (was, now))
    if then != source:
        print(f"clusterfl: warning: --set data.source = {source!r}: the run trained on "
              f"{then!r}: its clusters and models were learnt on another dataset than that "
              "of the clients placed", file=sys.stderr)


def _check_vocabulary(run_dir: Path, words: list[str] | None) -> None:
    """A language model's clients must be tokenized with the run's vocabulary (`vocab.txt`):
    ClusterFLError when the federation rebuilt now has another one (the data changed)."""
    from clusterfl.data.text import VOCAB_FILE, Vocab

    saved = run_dir / VOCAB_FILE
    if words is None or not saved.is_file() or Vocab.load(saved).words == tuple(words):
        return
    raise ClusterFLError(f"{saved}: the run's vocabulary differs from the one the data gives "
                         f"now; place with it: --set 'scenario.vocab_file=\"{saved}\"'")


def place_clients(run_dir: Path, saved: dict[str, Any], clients: str | None,
                  overrides: list[str], data_dir: str | None = None,
                  ) -> tuple[list[dict[str, Any]], str, dict[str, Any] | None]:
    """Place clients of the (possibly changed) run federation: one dict per client, the
    method's label, and what `[privacy]` did (`holdout.placement_privacy`; None without
    it)."""
    import numpy as np

    from clusterfl.backends.subset import SubsetBackend
    from clusterfl.checkpoint import data_changes
    from clusterfl.config import load_config, read_toml
    from clusterfl.experiment import Experiment, build_backend
    from clusterfl.holdout import placement_privacy
    from clusterfl.protocol import EvaluateRequest

    if data_dir:
        overrides = [*overrides, f"data.data_dir={json.dumps(data_dir)}"]
    raw = read_toml(run_dir / "config.toml")
    try:
        base = load_config(raw).to_dict()  # the run's own config, which --set changes
    except ConfigError as exc:  # edited by hand since the run: name the file
        raise ClusterFLError(f"{run_dir / 'config.toml'}: {exc} (the run's config, edited "
                             "since it ran? place reads it as the run wrote it: put the "
                             "value back)") from None
    config = load_config(_override(raw, base, overrides))
    now = config.to_dict()
    _check_overrides(base, now, overrides)
    noted = [k for k in ("faults", "adversary") if now.get(k) != base.get(k)]
    if noted:  # noted as changing nothing: the run's own (its label flippers' data stays)
        config = load_config({**{k: v for k, v in now.items() if k not in noted},
                              **{k: base[k] for k in noted if k in base}})
        now = config.to_dict()
    was = saved.get("config")
    if isinstance(was, dict):  # a checkpoint's whole config: config.toml must match it
        for table in ("model", "algorithm"):
            if was.get(table) != now.get(table):
                raise ClusterFLError(f"{run_dir / 'config.toml'}: its [{table}] table is not "
                                     "the one the run's checkpoint was written with; placement "
                                     "needs the run's own model and method")
    else:  # `cfl_tree.pt` holds only the method's settings: the run's config is config.toml
        was = base
    same_federation = _federation(was) == _federation(now)
    exp = Experiment(config)  # the federation, the held-out split, the method
    if not same_federation:
        _check_model_fits(was, exp)
        _warn_other_dataset(was, now)
    alg = exp.algorithm
    full = exp.full_federation
    if same_federation and saved.get("federation") is not None:
        changed = data_changes(np.asarray(saved["federation"]), full.digests())
        if changed is not None:  # the config names the data, not its contents
            print(f"clusterfl: warning: the data changed since the run's checkpoint "
                  f"({changed}): clients are placed with their data as it is now",
                  file=sys.stderr)
    _check_vocabulary(run_dir, full.meta.get("vocab"))
    ids = parse_clients(clients, full.n_clients)
    backend = build_backend(config, full, exp.factory)
    try:
        train_ctx = exp._context(SubsetBackend(backend, exp.train_ids))
        alg.setup(train_ctx)
        try:
            alg.load_state_dict(saved["algorithm"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterFLError(f"{run_dir}: its saved {alg.label()} state does not fit this "
                                 f"clusterfl ({exc}); it was probably written by an older "
                                 "version: rerun the run") from None
        ctx = exp.placing_context(backend, ids)
        placed = _placement(alg, ctx)
        for line in ctx.log:  # what the method says about the placement
            print(f"clusterfl: warning: {line}", file=sys.stderr)
        reply = ctx.send(EvaluateRequest(placed.clients, placed.predictor))
        acc = np.full(len(ids), np.nan)
        acc[reply.clients] = reply.accuracy
    finally:
        backend.close()
    return (_rows(exp, alg, ids, placed, acc, same_federation, _run_truth(run_dir)),
            alg.label(), placement_privacy(config, ctx, alg.label()))


FEDERATION = ("seed", "data", "scenario")
"""What `--set` may change: the federation the clients come from."""
NO_EFFECT = ("eval_every", "eval_clients", "checkpoint_every", "output", "faults",
             "adversary")
"""Settings that a placement does not read: the run's bookkeeping, faults and attackers (a
placement's guard simulates neither: `Holdout.guard`); `--set` of them is accepted with a
note. `[backend]` (where and how the clients compute) may change too: a placement runs
unchanged on every backend; so may `[validation]` and `[privacy]`, which a placement
applies as the run did (`Holdout.guard`)."""
APPLIED = ("backend", "validation", "privacy")
"""Tables `--set` may change besides the federation: where the clients compute, and the
reply checks and privacy a placement applies."""
WHERE = ("data_dir",)
"""`[data]` keys that only say where the files are (`--data-dir`): they do not make another
federation; a change of the files themselves is caught by the checkpoint's digests."""
SCENARIO_COMMON = ("n_clients", "holdout")
"""The `[scenario]` keys every scenario takes, kept when `--set` changes `scenario.name`."""


def _federation(config: dict[str, Any]) -> dict[str, Any]:
    """The tables of `FEDERATION` of a config, without the `WHERE` keys."""
    out = {k: config.get(k) for k in FEDERATION}
    if isinstance(out["data"], dict):
        out["data"] = {k: v for k, v in out["data"].items() if k not in WHERE}
    return out


def _override(raw: dict[str, Any], base: dict[str, Any], overrides: list[str],
              ) -> dict[str, Any]:
    """`raw` (the run's config.toml) with the `--set` overrides. When they change
    `scenario.name`, the run's scenario parameters (its config.toml holds every resolved
    one) are dropped but `SCENARIO_COMMON` and those `--set` gives, with a note naming them:
    the new scenario starts from its own defaults."""
    from clusterfl.config import apply_overrides

    out = apply_overrides(raw, overrides)
    scenario = out.get("scenario")
    old = raw.get("scenario")
    if not (isinstance(scenario, dict) and isinstance(old, dict)
            and scenario.get("name", base["scenario"]["name"]) != base["scenario"]["name"]):
        return out
    kept = {k: v for k, v in old.items() if k in SCENARIO_COMMON}
    out = apply_overrides({**raw, "scenario": kept}, overrides)
    given = set(out["scenario"])
    dropped = [k for k in old if k != "name" and k not in kept and k not in given]
    if dropped:
        print(f"clusterfl: note: --set scenario.name={out['scenario']['name']!r}: the run's "
              f"{base['scenario']['name']!r} parameters {', '.join(dropped)} are dropped (the "
              "new scenario's defaults apply; set its own with --set scenario.KEY=VALUE)",
              file=sys.stderr)
    return out


def _check_overrides(base: dict[str, Any], now: dict[str, Any], overrides: list[str],
                     ) -> None:
    """`--set` may change the federation (`FEDERATION`), `[backend]`, `[validation]` and
    `[privacy]`; a change of anything
    else the placement reads (`rounds`, `[model]`, `[train]`, `[algorithm]`: they define
    the method's placement rule, e.g. Local trains `rounds` × `[train]`)
    is a one-line ClusterFLError naming the key as `--set` gave it; one of `NO_EFFECT` gets a
    note."""
    from clusterfl.checkpoint import first_difference

    for key in dict.fromkeys([*base, *now]):
        if key in FEDERATION or key in APPLIED or base.get(key) == now.get(key):
            continue
        given = [k for k in (o.split("=", 1)[0].strip() for o in overrides)
                 if k.split(".", 1)[0] == key]
        dotted = given[0] if given else first_difference({key: base.get(key)},
                                                         {key: now.get(key)})[0]
        if dotted == "the tables":
            dotted = key
        if key in NO_EFFECT:
            print(f"clusterfl: note: --set {dotted} does not change a placement",
                  file=sys.stderr)
            continue
        raise ClusterFLError(f"--set {dotted}: placement needs the run's own rounds, [model], "
                             "[train] and [algorithm]; --set may change seed, [data], "
                             "[scenario], [backend], [validation] and [privacy]")


def _run_truth(run_dir: Path) -> list[int] | None:
    """The true clusters of the run's trained clients (its summary), if known."""
    from clusterfl.records import RunDirError, read_summary

    try:
        return read_summary(run_dir).true_clusters
    except RunDirError:
        return None


def _placement(alg: Algorithm, ctx: Context) -> Placement:
    """`alg.placement` of every client of the placing context."""
    import numpy as np

    return alg.placement(ctx, np.arange(ctx.n_clients))


def _rows(exp: Any, alg: Algorithm, ids: np.ndarray, placed: Placement, acc: np.ndarray,
          same_federation: bool, run_truth: list[int] | None) -> list[dict[str, Any]]:
    """One JSON-ready dict per placed client (see the module doc). `trained` and
    `run_cluster` only when the federation is the run's (no --set changed it); the trained
    clients' true clusters come from the run's summary."""
    import numpy as np

    truth = exp.full_federation.clusters
    trained = ({int(c): i for i, c in enumerate(exp.train_ids.tolist())} if same_federation
               else {})
    assign = np.asarray(alg.assignment())
    train_truth = (np.asarray(run_truth) if run_truth is not None
                   and len(run_truth) == len(assign) else None)
    rows = []
    for k, c in enumerate(ids.tolist()):
        cluster = int(placed.clusters[k])
        members = np.flatnonzero(assign == cluster) if cluster >= 0 else np.zeros(0, int)
        row: dict[str, Any] = {
            "client": c,
            "true_cluster": None if truth is None else int(truth[c]),
            "trained": (c in trained) if same_federation else None,
            "run_cluster": int(assign[trained[c]]) if c in trained else None,
            "cluster": cluster,
            "cluster_true_clusters": None if train_truth is None or cluster < 0 else
            sorted({int(x) for x in train_truth[members]}),
            "accuracy": None if acc[k] != acc[k] else float(acc[k]),
        }
        if placed.details is not None:
            row["details"] = placed.details[k]
        rows.append(row)
    return rows


def placement_table(rows: list[dict[str, Any]], label: str) -> Any:
    """A rich table of placements (the method's details in the last columns)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"{label}: placement of clients"))  # Text: no markup
    keys: list[str] = []
    for r in rows:
        for key in r.get("details") or {}:
            if key not in keys:
                keys.append(key)
    for col in ("client", "true", "trained (cluster)", "placed", "trained clients' true",
                "accuracy", *keys):
        table.add_column(col)
    for r in rows:
        details = r.get("details") or {}
        table.add_row(*map(Text, [
            str(r["client"]), _text(r["true_cluster"]),
            {None: "?", False: "no"}.get(r["trained"], f"yes ({r['run_cluster']})"),
            str(r["cluster"]),
            _text(r["cluster_true_clusters"]),
            "" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%",
            *(_text(details.get(key)) for key in keys)]))
    return table


def _text(value: Any) -> str:
    """A compact cell: numbers with 3 decimals, lists joined, None empty; a path with →."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else f"{value:.3f}"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) if not isinstance(v, list | tuple) else f"({_text(v)})"
                        for v in value)
    return str(value)
