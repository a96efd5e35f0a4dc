"""`ClusteredStrategy`: clusterfl's methods as a strategy for Flower's Message API that drives
*standard* ClientApps (`docs/flower.md`).

Flower's own strategies (`flwr.serverapp.strategy`) keep one global model; a clustered method
sends different models to different clients and keeps per-cluster models, so the strategy runs
the method's own server steps (the same `Algorithm` classes as `clusterfl run`) over the Grid
with `StandardBackend`, which turns each request into the `"train"` / `"evaluate"` messages a
quickstart-style ClientApp answers. What `start` does:

1. waits until `min_nodes` SuperNodes are connected, numbers them 0..n−1 by node id (and
   shortens Flower 1.41's 1 s first backoff when it pulls a reply's objects, in this
   ServerApp process: `clusterfl.deploy.supernode.fast_object_pulls`);
2. sends every node one `"evaluate"` of the initial model (round 0): its `num-examples`, and,
   when the client reports it, a `cluster` metric with its true group (diagnostics only, for
   the ARI; a standard client does not report it and the ARI is then not computed);
3. runs the method for `num_rounds` rounds through the ordinary run loop (`Experiment`), so
   the run folder (`out_dir`) is the one `clusterfl run` writes — `config.toml`,
   `history.jsonl`, `summary.json`, figures, `report.md` — and `clusterfl report` reads
   it (and compares several: `clusterfl report RUN1 RUN2 --out DIR`); a line per round goes
   to the console;
4. returns a `ClusteredResult`: one `ArrayRecord` per model of the method's final predictor
   (per cluster), the model and cluster of every node, the history.

A node that does not answer in time is dropped from that request and recorded (the method
averages over the clients that answered, as in every backend); the run goes on. The node set
of the rounds is fixed at the start; nodes that connect during the run are placed after the
last round by the method's own placement rule (`Algorithm.placement`, what `clusterfl place`
and `[scenario] holdout` use: CFL's Algorithm 4 from one train, IFCA's least loss, ...),
through the same standard messages, and appear in `ClusteredResult.placed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from clusterfl.errors import ClusterFLError, ConfigError, require

DRIVABLE = ("fedavg", "fedprox", "local", "cfl", "flhc", "ifca", "fesem", "cfl_gp")
"""Methods a standard ClientApp can drive with train/evaluate messages alone (CFL-GP with
`protocol = "model"`; IFCA with model averaging). The others need the client extensions of
`clusterfl.flower.client` or clusterfl's own ClientApp."""

DATA_SOURCE = "clusterfl.flower.strategy:data_on_the_clients"

GRADIENT_OPTIONS = {("cfl_gp", "protocol", "gradient"): ("query.gradient", "add_gradient_query"),
                    ("ifca", "averaging", "gradient"): ("query.gradient", "add_gradient_query")}
"""Settings of drivable methods (CFL-GP's default protocol among them) whose requests a
standard ClientApp cannot answer: the handler they need and its helper; refused when the
strategy is built unless `extensions` has it (both have `"model"` instead)."""


def data_on_the_clients(**_: Any) -> Any:
    """The `[data] source` a strategy run records: the data lives on the Flower clients, so
    there is nothing to load here (a run folder of a strategy cannot be rerun in-process)."""
    raise ConfigError("data.source", "this run's data lived on Flower clients driven by "
                      "clusterfl.flower.ClusteredStrategy; it cannot be loaded in-process")


@dataclass
class ClusteredResult:
    """What a strategy run gives: the final models and who uses which.

    `arrays[m]`: model m of the method's final predictor as an `ArrayRecord` (the cluster
    models; Local: one per client; FedAvg: one); `model_of_node[node] = m`, the node's model
    when it predicts with one (`combine == "single"`; otherwise -1: see `members_of_node`);
    `cluster_of_node[node]`: the method's cluster of the node (-1: none yet); `history`: the
    run's `History` (`history.summary`, `history.records`)."""

    arrays: dict[int, Any]
    model_of_node: dict[int, int]
    cluster_of_node: dict[int, int]
    history: Any
    nodes: list[int] = field(default_factory=list)
    placed: dict[int, int] = field(default_factory=dict)
    """Nodes that connected during the run: the cluster the method's placement rule gave each
    (also in `cluster_of_node`; -1: it did not answer)."""
    placed_arrays: dict[int, Any] = field(default_factory=dict)
    """The model each placed node was placed on, as an `ArrayRecord` (a list of them, its
    members, where the predictor combines several)."""
    combine: str = "single"
    """How a node's predictor combines its members: "single" (one model), "sum_logits"
    (IFCA-CAM, FeSEM-CAM: the members' logits added), "mean_probs" (FedEM: the members'
    softmax outputs averaged with `weights_of_node`), "mean_outputs"."""
    members_of_node: dict[int, list[int]] = field(default_factory=dict)
    """The models (keys of `arrays`) each node's predictor combines (`[model_of_node[n]]`
    for a single model; CAM: `[global, cluster part]`)."""
    weights_of_node: dict[int, list[float]] = field(default_factory=dict)
    """Each node's weights of its members (FedEM's π; trained and placed nodes), where the
    predictor has weights."""


class ClusteredStrategy:
    """A clustered method for a Flower ServerApp whose clients are standard ClientApps.

    Args:
        method: the method's name (`DRIVABLE`), or a spec as `clusterfl compare` takes it
            (`"ifca:n_clusters=4"`), or its `[algorithm]` table as a dict.
        model: the clients' architecture: an import path (`"myapp.task:Net"`), the
            `nn.Module` class itself (importable by the same path on the server), or a
            `[model]` table (`{"name": "mlp", "hidden": [32]}`); it is built with
            `input_shape` / `n_outputs` when its constructor takes them.
        input_shape: one sample's shape (e.g. `(1, 28, 28)`); `n_classes`: the outputs.
        train: what the train messages' config asks (`lr`, `epochs`, `steps`,
            `batch_size`, `momentum`, ...: the `[train]` table); a standard client reads
            `lr` (and `local-epochs` from its own run config).
        options: more `[algorithm]` options (merged under `method`'s own).
        seed: the initial models' seed and the method's randomness.
        out_dir: the run folder (None: none is written); a folder with files is refused
            (checked before the nodes are waited for) unless `overwrite`, which removes the
            files of a run there first (and refuses a folder holding anything else), or
            `start(..., resume=True)` continues the run there.
        checkpoint_every: write the run's checkpoint into `out_dir` every this many rounds
            and after the last (0: none); `start(grid, rounds, resume=True)` continues from
            it, with the nodes the run started with.
        eval_every: evaluate every this many rounds (and at the last).
        min_nodes: wait for this many SuperNodes (default: those connected after
            `wait_timeout`'s first poll, at least 1).
        timeout: seconds to wait for one request's replies; a silent node is dropped from it.
        extensions: handlers the clients offer beyond train/evaluate (`{"query.losses"}`:
            IFCA's losses in one message; see `clusterfl.flower.client`).
        true_clusters: node id → true group, for the ARI (diagnostics; optional: a client
            may report a `cluster` metric instead).
        train_sizes: node id → its training-set size, for the methods that weight clients
            by it before they have trained (FeSEM's first k-means, FedEM's
            `aggregate = "all"`, FedSoft's `per_cluster`, FLT's relatedness); a node not
            given is learned from the `num-examples` of its first reply on its training data
            (a train message), and counts as 1 until then (a warning says so).
        log: where the line per round goes (default: print).
    """

    def __init__(
        self, method: str | Mapping[str, Any] = "cfl", *,
        model: str | Mapping[str, Any] | Callable[..., Any],
        input_shape: tuple[int, ...], n_classes: int, train: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None, seed: int = 0,
        out_dir: str | Path | None = None, overwrite: bool = False, eval_every: int = 1,
        checkpoint_every: int = 0, min_nodes: int = 0,
        wait_timeout: float = 300.0, timeout: float = 600.0,
        extensions: set[str] | frozenset[str] | tuple[str, ...] = (),
        true_clusters: Mapping[int, int] | None = None,
        train_sizes: Mapping[int, int] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        from clusterfl.compare import parse_algorithm_spec
        from clusterfl.config import load_config
        from clusterfl.experiment import build_method
        from clusterfl.models import ModelFactory

        if not isinstance(method, str | Mapping):
            raise ConfigError("method", f"{method!r}: give a method's name ({', '.join(DRIVABLE)}"
                              ", ...), a spec such as \"ifca:n_clusters=4\" or its [algorithm] "
                              "table as a dict")
        table = (dict(method) if isinstance(method, Mapping)
                 else parse_algorithm_spec(method))
        self.algorithm = {**_table("options", options, "more [algorithm] options"), **table}
        self.model: dict[str, Any] = (
            {"name": model} if isinstance(model, str) else dict(model)
            if isinstance(model, Mapping) else {"name": _import_path(model)})
        self.input_shape = _shape(input_shape)
        self.n_classes = _whole("n_classes", n_classes, 2, "a classification needs at least "
                                "2 classes")
        self.train = _table("train", train, "the [train] table, e.g. {'lr': 0.05}")
        self.seed = _whole("seed", seed, 0, "the run's seed")
        from clusterfl.config_util import check_flag

        check_flag("overwrite", overwrite)  # a string "no" is truthy
        self.out_dir, self.overwrite = _folder(out_dir), bool(overwrite)
        self.eval_every = _whole("eval_every", eval_every, 1, "evaluate every this many rounds")
        self.checkpoint_every = _whole("checkpoint_every", checkpoint_every, 0,
                                       "write a checkpoint every this many rounds; 0: none")
        if self.checkpoint_every and self.out_dir is None:
            raise ConfigError("checkpoint_every", f"{checkpoint_every}: the checkpoint is "
                              "written into out_dir; give out_dir, or checkpoint_every=0")
        self.min_nodes = _whole("min_nodes", min_nodes, 0, "0 waits for the nodes connected "
                                "at the first poll")
        self.wait_timeout = _seconds("wait_timeout", wait_timeout, forever=True)
        self.timeout = _seconds("timeout", timeout)
        self.extensions = _handlers(extensions)
        self.true_clusters = _truth(true_clusters)
        self.train_sizes = _node_numbers("train_sizes", train_sizes, "its training-set size",
                                         least=1)
        self.log = log or (lambda line: print(line, flush=True))
        name = str(self.algorithm.get("name", ""))
        if name not in DRIVABLE and not self.extensions:
            from clusterfl.algorithms import ALGORITHMS

            if name not in ALGORITHMS:
                raise ConfigError("method", f"unknown method {name!r}; a standard ClientApp "
                                  f"drives {', '.join(DRIVABLE)}")
            self.log(f"clusterfl: warning: {name} asks more of a client than train/evaluate; "
                     "the first request it cannot send names the handler to add "
                     "(clusterfl.flower.client)")
        checked = load_config(self.config(1))  # a wrong option: one line now, not at start
        ModelFactory(checked.model, self.input_shape, self.n_classes)  # the model fits them
        algo = checked.algorithm
        # the method's checks of one sample's shape (FLT's encoder, PCA's components)
        build_method(checked).check_input(self.input_shape)
        for (method, option, value), (handler, helper) in GRADIENT_OPTIONS.items():
            if name == method and getattr(algo, option, None) == value \
                    and handler not in self.extensions:
                raise ConfigError("method", f"{name} with {option} = {value!r} needs the "
                                  f"clients' {handler!r} handler: add it with clusterfl.flower."
                                  f"client.{helper}(app, ...) and pass extensions="
                                  f"{{{handler!r}}}, or use {option}='model'")

    # ------------------------------------------------------------------ config
    def config(self, num_rounds: int) -> dict[str, Any]:
        """The run config of a strategy run (what `config.toml` records)."""
        return {
            "seed": self.seed, "rounds": int(num_rounds), "eval_every": self.eval_every,
            "checkpoint_every": self.checkpoint_every,
            "data": {"source": DATA_SOURCE}, "scenario": {"name": "given"},
            "model": self.model,
            "train": self.train, "algorithm": self.algorithm,
            "backend": {"name": "flower_standard", "timeout": self.timeout},
            "output": {"figures": self.out_dir is not None, "progress": "off"},
        }

    # ------------------------------------------------------------------ the run
    def start(self, grid: Any, num_rounds: int, resume: bool = False) -> ClusteredResult:
        """Run `num_rounds` rounds of the method on the Grid's nodes (module docstring);
        `resume`: continue the run of `out_dir` from its checkpoint (`checkpoint_every`),
        on the nodes it started with, to the same result as a run never stopped."""
        from clusterfl.config_util import check_flag

        num_rounds = _whole("num_rounds", num_rounds, 1, "the rounds to run")  # not 2.5 -> 2
        check_flag("resume", resume)
        if resume and (self.out_dir is None or self.overwrite):
            raise ConfigError("resume", "True continues the run in out_dir from its "
                              "checkpoint: " + ("give out_dir" if self.out_dir is None else
                                                "overwrite=True would replace it; give one"))
        require("flower", "flwr.app")
        from clusterfl.backends.flower.backend import active_session
        from clusterfl.backends.flower.standard import to_arrays
        from clusterfl.config import load_config
        from clusterfl.experiment import Experiment
        from clusterfl.models import ModelFactory
        from clusterfl.rundir import claim_run_dir

        config = load_config(self.config(num_rounds))
        if self.out_dir is not None:  # a used folder is refused before the nodes are waited for
            claim_run_dir(self.out_dir, resume=resume, overwrite=self.overwrite,
                          hint="overwrite=True (its run files are removed), "
                          "start(..., resume=True) or another out_dir")
        saved = self._saved() if resume else None
        try:  # replies' objects pulled without Flower 1.41's 1 s first backoff (issue 26)
            from clusterfl.deploy.supernode import fast_object_pulls

            fast_object_pulls()
        except RuntimeError as exc:
            self.log(f"clusterfl: warning: {exc}; replies are pulled with Flower's own backoff")
        factory = ModelFactory(config.model, self.input_shape, self.n_classes)
        template = {k: v.detach().clone() for k, v in factory.build().state_dict().items()}
        nodes = self._wait(grid, None if saved is None else saved["nodes"])
        session = self._session(grid, nodes, template)
        unused = sorted(set(self.train_sizes or {}) - set(grid.get_node_ids()))
        if unused:
            self.log(f"flower: warning: train_sizes gives node(s) {unused}, which are not "
                     "connected; their sizes are not used")
        probe = self._probe(session, factory, config)
        federation = self._federation(nodes, probe, session)
        line = _RoundLine(session, num_rounds, self.log)
        exp = Experiment(config, self.out_dir, federation=federation, overwrite=self.overwrite,
                         callbacks=[line])
        line.sizes_use = size_use(exp.algorithm)
        first = len(nodes) + (0 if saved is None else int(saved["first_evaluate"]))
        exp.checkpoints.extras["flower"] = (lambda: _session_state(session, first),
                                            lambda state: _put_session(session, state))
        with active_session(session):
            history = exp.run(resume=resume, progress=False)
        pred = exp.algorithm.predictor()
        arrays = {m: to_arrays(factory, template, pred.models[m])
                  for m in range(int(pred.models.shape[0]))}
        members = np.asarray(pred.members)
        single = pred.combine == "single"
        assign = np.asarray(exp.algorithm.assignment())
        result = ClusteredResult(
            arrays, {n: int(members[i, 0]) if single else -1 for i, n in enumerate(nodes)},
            {n: int(assign[i]) for i, n in enumerate(nodes)}, history, nodes,
            combine=str(pred.combine),
            members_of_node={n: [int(m) for m in members[i]] for i, n in enumerate(nodes)},
            weights_of_node=_weights(pred, nodes))
        joined = sorted(set(int(x) for x in grid.get_node_ids()) - set(nodes))
        placing: list[dict[str, Any]] = []
        placement_messages = 0
        if joined:
            placing, placement_messages = self._place(exp, factory, config, session, joined,
                                                      result)
        if self.out_dir is not None and session.backends:
            from clusterfl.backends.flower import write_flower_json  # not at import: its deps

            be = session.backends[0]
            write_flower_json(Path(self.out_dir), {
                "nodes": {str(c): n for c, n in session.node_of_client.items()},
                "dropouts": be.dropouts, "messages": be.n_messages,
                "messages_outside_rounds": {"first_evaluate": first,
                                            "placement": placement_messages},
                "message_seconds": be.seconds, "clients": "standard ClientApps",
                "placed": {str(n): c for n, c in result.placed.items()},
                "placement_dropouts": placing})
        return result

    def _place(self, exp: Any, factory: Any, config: Any, session: Any, joined: list[int],
               result: ClusteredResult) -> tuple[list[dict[str, Any]], int]:
        """Place the nodes that connected during the run by the method's own rule; the
        placement's dropouts (node ids as `clients`; a node silent throughout: -1, the run's
        result is kept) and the messages it sent (its first evaluate included)."""
        from clusterfl.algorithms.base import Context
        from clusterfl.backends.flower.standard import StandardBackend, to_arrays

        placing = self._session(session.grid, joined, session.template)
        placing.round, placing.warned = config.run.rounds + 1, session.warned
        probe = self._probe(placing, factory, config, required=False)
        if not probe:  # none answered: the rounds' result stands, the nodes are not placed
            for node in joined:
                result.placed[node] = result.cluster_of_node[node] = -1
            self.log(f"flower: warning: none of the {len(joined)} node(s) that joined during "
                     f"the run answered within {self.timeout:g} s (timeout); not placed: "
                     + ", ".join(map(str, joined)))
            return [{"request": "placement", "clients": joined,
                     "reasons": {str(n): "no reply to the first evaluate message"
                                 for n in joined}}], len(joined)
        fed = self._federation(joined, probe, placing, truth=False)
        backend = StandardBackend(fed, factory, placing)
        ctx = Context(backend=backend, factory=factory,
                      training=config.train.local_training(), n_clients=len(joined),
                      train_sizes=fed.train_sizes,
                      rng=np.random.default_rng([config.run.seed, 6007]),
                      seed=config.run.seed, rounds=config.run.rounds)
        placed = exp.algorithm.placement(ctx, np.arange(len(joined)))
        pred = placed.predictor
        members = np.asarray(pred.members)
        for i, c in enumerate(np.asarray(placed.clients).tolist()):
            node = joined[int(c)]
            result.placed[node] = result.cluster_of_node[node] = int(placed.clusters[i])
            arrays = [to_arrays(factory, session.template, pred.models[int(m)])
                      for m in members[i]]
            result.placed_arrays[node] = arrays[0] if pred.combine == "single" else arrays
        result.weights_of_node.update(_weights(pred, [joined[int(c)] for c in placed.clients]))
        self.log(f"flower: placed {len(result.placed)} node(s) that joined during the run: "
                 + ", ".join(f"{n} → cluster {c}" for n, c in result.placed.items()))
        silent = [joined[c] for c in range(len(joined)) if c not in probe]
        out = ([{"request": "placement", "clients": silent, "reasons": {
            str(n): "no reply to the first evaluate message" for n in silent}}]
            if silent else [])
        for d in backend.dropouts:  # client numbers of the placement -> node ids
            nodes = {int(c): joined[int(c)] for c in d["clients"]}
            out.append({**d, "clients": sorted(nodes.values()),
                        "reasons": {str(nodes[int(c)]): r for c, r in d["reasons"].items()}})
        return out, len(joined) + backend.n_messages

    def _wait(self, grid: Any, saved: list[int] | None = None) -> list[int]:
        """The nodes of the rounds: those connected once `min_nodes` are, or, resuming, the
        `saved` nodes of the checkpoint's run (once all are connected)."""
        t0 = time.monotonic()
        while True:
            nodes = sorted({int(x) for x in grid.get_node_ids()})  # a node listed twice: once
            want = self.min_nodes or 1
            missing = [n for n in saved if n not in nodes] if saved is not None else []
            if saved is not None and not missing:
                return list(saved)
            if saved is None and len(nodes) >= want:
                return nodes
            if time.monotonic() - t0 > self.wait_timeout:
                if saved is not None:
                    raise ClusterFLError(
                        f"resume: node(s) {missing} of the checkpoint's run are not connected "
                        f"after {self.wait_timeout:g} s (wait_timeout); a resumed run needs the "
                        "SuperNodes it started with (the same node ids)")
                raise ClusterFLError(f"only {len(nodes)} of {want} SuperNodes connected after "
                                     f"{self.wait_timeout:g} s (min_nodes / wait_timeout)")
            time.sleep(0.5)

    def _saved(self) -> dict[str, Any]:
        """The strategy's part of the checkpoint in `out_dir` (`_session_state`)."""
        from clusterfl.checkpoint import CHECKPOINT, KEYS
        from clusterfl.state import read_checkpoint

        path = Path(cast(Path, self.out_dir)) / CHECKPOINT
        if not path.is_file():
            raise ClusterFLError(f"resume: no checkpoint at {path}; a strategy run keeps one "
                                 "with checkpoint_every > 0: start it again with "
                                 "overwrite=True")
        state = dict(read_checkpoint(path, KEYS).get("extras") or {}).get("flower")
        if state is None:
            raise ClusterFLError(f"resume: the checkpoint at {path} holds no strategy state "
                                 "(it was not written by ClusteredStrategy); start the run "
                                 "again with overwrite=True")
        return dict(state)

    def _probe(self, session: Any, factory: Any, config: Any, required: bool = True
               ) -> dict[int, dict[str, float]]:
        """Round 0: one evaluate of the initial model per node; its metrics per client (an
        error when none answered and the answers are `required`)."""
        from flwr.app import ConfigRecord, Message, RecordDict

        from clusterfl.backends.flower.standard import to_arrays

        init = factory.init(config.run.seed)
        content = RecordDict({"arrays": to_arrays(factory, session.template, init),
                              "config": ConfigRecord({"server-round": 0})})
        nodes = session.node_of_client
        msgs = [Message(content, n, "evaluate", group_id="probe") for n in nodes.values()]
        client_of = {n: c for c, n in nodes.items()}
        out: dict[int, dict[str, float]] = {}
        errors: list[str] = []
        for msg in session.grid.send_and_receive(msgs, timeout=self.timeout):
            c = client_of.get(int(msg.metadata.src_node_id))
            if c is None:
                continue
            if msg.has_error():
                reason = " ".join(str(msg.error.reason).split())
                errors.append(f"node {msg.metadata.src_node_id}: {reason[:300]}")
                continue
            records = list(msg.content.metric_records.values())
            if records:
                out[c] = {k: float(v) for k, v in records[0].items()
                          if isinstance(v, int | float)}
        if not out and required:
            if errors:  # they answered, with errors: say which, not "are they running?"
                raise ClusterFLError(
                    f"every reply to the first evaluate message was an error ({len(errors)} "
                    f"of {len(msgs)} nodes; e.g. {errors[0]}); the strategy's model is "
                    f"{self.model.get('name')!r}")
            raise ClusterFLError("no node answered the first evaluate message within "
                                 f"{self.timeout:g} s: are the nodes running a ClientApp with "
                                 "@app.evaluate()?")
        return out

    def _session(self, grid: Any, nodes: list[int], template: dict[str, torch.Tensor]) -> Any:
        """The session of `nodes` (as clients 0..n−1): their training-set sizes those of
        `train_sizes`, 1 for the others until learned."""
        from clusterfl.backends.flower.standard import StandardSession

        given = self.train_sizes or {}
        return StandardSession(
            grid, dict(enumerate(nodes)), {}, self.timeout, template=template,
            extensions=self.extensions, log=self.log,
            train_sizes=np.array([given.get(n, 1) for n in nodes], dtype=np.int64),
            sized=np.array([n in given for n in nodes], dtype=bool))

    def _federation(self, nodes: list[int], probe: dict[int, dict[str, float]],
                    session: Any, truth: bool = True) -> Any:
        """The server's view: n clients, shapes, test sizes from the probe, the session's
        training-set sizes (`ServerFederation`), no data."""
        from clusterfl.backends.flower.standard import ServerFederation

        n = len(nodes)
        clusters: np.ndarray | None = None
        if not truth:
            pass
        elif self.true_clusters is not None:
            missing = [x for x in nodes if x not in self.true_clusters]
            if missing:
                raise ConfigError("true_clusters", f"no true cluster for nodes {missing}")
            clusters = np.array([self.true_clusters[x] for x in nodes])
        elif probe and all("cluster" in probe.get(c, {}) for c in range(n)):
            clusters = np.array([int(probe[c]["cluster"]) for c in range(n)])
        elif any("cluster" in probe.get(c, {}) for c in range(n)):
            silent = [nodes[c] for c in range(n) if "cluster" not in probe.get(c, {})]
            self.log(f"flower: warning: node(s) {silent} report no 'cluster' metric in their "
                     "first evaluate reply, the others do: the ARI is not computed (give "
                     "true_clusters to have it)")
        test = [max(1, int(probe.get(c, {}).get("num-examples", 1))) for c in range(n)]
        tr = np.arange(n + 1, dtype=np.int64)  # the rows of blank data: 1 each
        te = np.concatenate([[0], np.cumsum(test)]).astype(np.int64)
        shape = self.input_shape

        def blank(m: int) -> tuple[torch.Tensor, torch.Tensor]:  # zero-stride: no memory
            return (torch.zeros(1, *shape).expand(m, *shape),
                    torch.zeros(1, dtype=torch.int64).expand(m))

        fed = ServerFederation(*blank(n), tr, *blank(int(te[-1])), te, clusters,
                               self.n_classes, "classification", "flower:standard ClientApps")
        fed.sizes = session.train_sizes  # the method reads each size as it is learned
        fed.sized = session.sized  # before they are, no size is judged (`_data_warnings`)
        return fed


def _session_state(session: Any, first_evaluate: int) -> dict[str, Any]:
    """What a checkpoint keeps of a strategy run beyond the method's: its nodes, the
    training-set sizes known so far, the next round, the warnings given and the message
    counts of `flower.json`."""
    be = session.backends[0] if session.backends else None
    return {"nodes": [session.node_of_client[c] for c in range(len(session.node_of_client))],
            "train_sizes": session.train_sizes.tolist(), "sized": session.sized.tolist(),
            "round": session.round, "warned": sorted(session.warned),
            "first_evaluate": first_evaluate,
            "messages": 0 if be is None else be.n_messages,
            "seconds": 0.0 if be is None else be.seconds,
            "dropouts": [] if be is None else be.dropouts}


def _put_session(session: Any, state: dict[str, Any] | None) -> None:
    """Put a checkpoint's `_session_state` back into `session` (and its backend)."""
    if state is None:
        raise ClusterFLError("resume: the checkpoint holds no strategy state (it was not "
                             "written by ClusteredStrategy)")
    session.train_sizes[:] = state["train_sizes"]
    session.sized[:] = state["sized"]
    session.round = int(state["round"])
    session.warned.update(state["warned"])
    for be in session.backends[:1]:
        be.n_messages, be.seconds = int(state["messages"]), float(state["seconds"])
        be.dropouts[:0] = list(state["dropouts"])


class _RoundLine:
    """Tracking callback: advances the session's round and prints a line per round."""

    def __init__(self, session: Any, rounds: int, log: Callable[[str], None]) -> None:
        self.session, self.rounds, self.log = session, rounds, log
        self.sizes_use: str | None = None
        """What of the method reads the clients' training-set sizes (`size_use`)."""

    def on_round_end(self, record: Any) -> None:
        self.session.round = record.round + 1
        unknown = [self.session.node(c) for c in np.flatnonzero(~self.session.sized)]
        if self.sizes_use and unknown:
            self.session.warn_once("sizes", (
                f"the training-set sizes of node(s) {unknown} are not known yet (no reply on "
                f"their training data by round {record.round}): {self.sizes_use}, which counts "
                "each of them as 1 until it is; give them with ClusteredStrategy(train_sizes="
                "{node: size})"))
        m = record.metrics
        acc = "" if m is None or m.accuracy is None else f", accuracy {100 * m.accuracy:.1f}%"
        ari = "" if record.ari is None else f", ARI {record.ari:.2f}"
        self.log(f"flower: round {record.round}/{self.rounds}: {record.n_clusters} "
                 f"cluster(s){acc}{ari}")


def size_use(algorithm: Any) -> str | None:
    """What of `algorithm` weights clients by their training-set sizes (`Context.train_sizes`),
    which the strategy learns from the clients' replies (None: nothing)."""
    from clusterfl.algorithms.fedem import FedEM
    from clusterfl.algorithms.fedsoft import FedSoft
    from clusterfl.algorithms.fesem import FeSEM
    from clusterfl.algorithms.flt import FLT

    cfg = algorithm.config
    if isinstance(algorithm, FeSEM):
        return "FeSEM's first k-means weights each client's model by its size"
    if isinstance(algorithm, FedEM) and cfg.aggregate == "all":
        return "FedEM's aggregate = 'all' weights every client by its size"
    if isinstance(algorithm, FedSoft) and cfg.per_cluster is not None:
        return "FedSoft's per_cluster selection draws clients with weights ∝ their sizes"
    if isinstance(algorithm, FLT) and cfg.aggregation == "relatedness":
        return "FLT's relatedness aggregation weights clients by their sizes"
    return None


def _import_path(obj: Callable[..., Any]) -> str:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or "<" in name or module == "__main__":
        raise ConfigError("model", f"{obj!r} has no import path; pass the model as "
                          "\"package.module:Class\" (the server must import it)")
    return f"{module}:{name}"


def _whole(name: str, value: Any, least: int, what: str) -> int:
    """`value` as an int of at least `least`, or one line naming the argument."""
    from clusterfl.config_util import is_whole  # not at import: the client helpers' deps

    if not is_whole(value) or value < least:
        raise ConfigError(name, f"{value!r}: give a whole number >= {least} ({what})")
    return int(value)


def _seconds(name: str, value: Any, forever: bool = False) -> float:
    """`value` as a positive number of seconds (infinite only if `forever`), or one line
    naming the argument."""
    from clusterfl.config_util import is_number  # not at import: the client helpers' deps

    if not is_number(value) or not value > 0 or \
            (value == float("inf") and not forever) or value != value:
        raise ConfigError(name, f"{value!r}: give a number of seconds > 0"
                          + (" (float('inf'): wait for ever)" if forever else ""))
    return float(value)


def _shape(value: Any) -> tuple[int, ...]:
    """One sample's shape: a non-empty sequence of positive whole numbers."""
    from clusterfl.config_util import is_whole  # not at import: the client helpers' deps

    ok = isinstance(value, tuple | list) and len(value) > 0 and all(
        is_whole(s) and s > 0 for s in value)
    if not ok:
        raise ConfigError("input_shape", f"{value!r}: give one sample's shape as a tuple of "
                          "positive whole numbers, e.g. (1, 28, 28) or (16,)")
    return tuple(int(s) for s in value)


def _handlers(value: Any) -> set[str]:
    """The client handlers named in `extensions`, each one the helpers can add."""
    from clusterfl.backends.flower.standard import EXTENSIONS

    known = sorted({handler for handler, _ in EXTENSIONS.values()} |
                   {"query.losses", "train.pick"})
    if value is None:
        return set()
    if not isinstance(value, str | set | frozenset | tuple | list):
        raise ConfigError("extensions", f"{value!r}: give the handlers' names as a set "
                          "of strings, e.g. {'query.losses'}")
    names = {value} if isinstance(value, str) else set(value)
    unknown = sorted(str(n) for n in names if n not in known)
    if unknown:
        raise ConfigError("extensions", f"unknown handler(s) {', '.join(map(repr, unknown))}; "
                          f"allowed: {', '.join(known)} (clusterfl.flower.client)")
    return names


def _truth(value: Any) -> dict[int, int] | None:
    """`true_clusters`: node id -> true group, both whole numbers."""
    return _node_numbers("true_clusters", value, "true group")


def _node_numbers(name: str, value: Any, what: str, least: int | None = None
                  ) -> dict[int, int] | None:
    """A dict node id -> `what`, both whole numbers (`what` at least `least`)."""
    from clusterfl.config_util import is_whole  # not at import: the client helpers' deps

    floor = "" if least is None else f" >= {least}"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(name, f"{value!r}: give a dict node id -> {what}, both whole "
                          f"numbers{floor}")
    bad = [k for k, v in dict(value).items() if not all(is_whole(x) for x in (k, v))
           or (least is not None and v < least)]
    if bad:
        raise ConfigError(name, f"node {bad[0]!r} -> {dict(value)[bad[0]]!r}: give node id "
                          f"-> {what}, both whole numbers{floor}")
    return {int(k): int(v) for k, v in dict(value).items()}


def _table(name: str, value: Any, what: str) -> dict[str, Any]:
    """A config table given as a dict (None: empty), or one line naming the argument."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(name, f"{value!r}: give a dict ({what}) or None")
    return dict(value)


def _folder(value: Any) -> Path | None:
    """`out_dir`: None (no run folder) or a non-empty path."""
    import os

    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise ConfigError("out_dir", f"{value!r}: give the run folder as a non-empty path "
                          "(str or pathlib.Path), or None for no run folder")
    return Path(value)


def _weights(pred: Any, nodes: list[int]) -> dict[int, list[float]]:
    """Each node's weights of its predictor's members (row i: `nodes[i]`); {} without."""
    if pred.weights is None:
        return {}
    rows = np.asarray(pred.weights, dtype=np.float64)
    return {n: [float(w) for w in rows[i]] for i, n in enumerate(nodes)}
