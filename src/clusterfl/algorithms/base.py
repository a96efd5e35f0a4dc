"""The interface every method implements, and the context it runs in.

An algorithm is server logic only, written as **ask → update** (docs/architecture.md):

- `ask(state, t, phase, ctx)` builds the round's request from the state. It may read the
  context's settings and draw from the run's generator (`ctx.sample_round`, `ctx.next_seed`),
  never sends anything and never writes the state.
- `update(state, t, ask, reply)` takes the state, the request it asked and the typed reply,
  and returns an `Update`: the new state, and either the next phase of the round (`then`) or
  the round's typed extras. It does no I/O.

A method that does not do what its settings ask in some round (a fixed number of clusters
lowered to the clients that answered) says so in one line: `Update.warnings` from `update`,
`ctx.warn` from `ask` or `placement`. The run shows each distinct line once, on the console
and in `summary.json`'s `warnings` (and so in the report).

`Algorithm.run_round` is the one driver of every method: ask, `ctx.send`, update, until a
phase ends the round; the new state is stored only there. `ctx.send` runs the request
through the robustness layer and the backend and books its communication cost (the one place
that does). Each method lives in its own module with its own pydantic `Config` and its own
typed extras (`clusterfl.records.RoundExtras`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np

from clusterfl.algorithms.common import AlgorithmConfig, Placement, SampledConfig
from clusterfl.backends.base import Backend
from clusterfl.config_util import client_ids
from clusterfl.engine.allocator import lazy_zeros
from clusterfl.engine.transfer import device_of, move, to_cpu
from clusterfl.errors import ClusterFLError
from clusterfl.models import ModelFactory
from clusterfl.naming import method_label
from clusterfl.protocol import (
    RE,
    Asks,
    LocalTraining,
    Predictor,
    Steps,
)
from clusterfl.records import RoundExtras
from clusterfl.robust.guard import Guard
from clusterfl.state import restore, snapshot


@dataclass
class Context:
    """What an algorithm may use: clients only through `send`, never their data.

    `rounds` is the run's planned number of rounds T (some methods schedule by it).
    `true_clusters` is given for diagnostics only (e.g. CFL's separation gap); an algorithm
    must never use it to decide anything. A context always has a `guard`
    (`clusterfl.robust`): without one given, the default validation (non-finite, wrong-shape
    and absurd replies are rejected) and no faults, adversaries or privacy.
    """

    backend: Backend
    factory: ModelFactory
    training: LocalTraining
    n_clients: int
    train_sizes: np.ndarray
    rng: np.random.Generator
    seed: int
    true_clusters: np.ndarray | None = None
    rounds: int | None = None
    floats_down: float = 0.0
    floats_up: float = 0.0
    #: the method's warnings not yet shown (`warn`): the run takes them after every round
    #: (`Recorder.record`), a placement after it placed (`holdout`)
    log: list[str] = field(default_factory=list)
    guard: Guard | None = None
    client_updates: int = 0  # trainings and gradients clients computed so far
    #: clients that answered a training, gradient, loss or embedding request since the runner
    #: last cleared it (it does at the start of every round): the round's participants
    participants: set[int] = field(default_factory=set)
    #: leave a reply's tensors on the backend's GPU (see `send`); set by the driver only
    keep_device: bool = False

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = Guard(self.n_clients, self.seed, self.train_sizes)

    def send(self, request: Asks[RE]) -> RE:
        """Execute `request` and book its communication; returns the reply.

        A backend computing on a GPU may leave the reply's large tensors there: they come to
        the CPU here unless `keep_device` is set (by the driver, while it sends for a method
        whose update runs on the device: `Algorithm.device_update`).

        The reply holds the clients that answered, in request order: its `clients` field
        says who they are. A client that dropped out, missed the deadline or sent a rejected
        reply is absent. This is the only place communication is booked: the request's
        per-client downlink for every client it reached, its uplink for every client that
        uploaded a reply (a rejected reply was still uploaded). A `Steps` (several requests
        in one message per client) returns a `StepsReply` and books every step as if it had
        been sent alone (`Guard.send_steps`).
        """
        assert self.guard is not None
        if isinstance(request, Steps):  # one message per client, each step booked as alone
            steps, counts = self.guard.send_steps(self.backend, request)
            for step, part, (reached, uploaded) in zip(request.steps, steps.replies, counts):
                self._book(step, part, reached, uploaded)
            return cast(RE, steps if self.keep_device else to_cpu(steps))
        reply, reached, uploaded = self.guard.send(self.backend, request)
        self._book(request, reply, reached, uploaded)
        return reply if self.keep_device else to_cpu(reply)

    def _book(self, request: Any, reply: Any, reached: int, uploaded: int) -> None:
        down, up = request.unit_cost()
        self.floats_down += down * reached
        self.floats_up += up * uploaded
        if request.counted_update:
            self.client_updates += len(reply.clients) * request.updates_each()
        if request.kind != "evaluate":
            self.participants.update(int(c) for c in reply.clients)

    def warn(self, line: str) -> None:
        """Say that the method does not do what its settings ask (one line, naming the
        setting): the run shows it on the console and in `summary.json`, once."""
        if line not in self.log:
            self.log.append(line)

    def next_seed(self) -> int:
        """A fresh request seed from the run's (checkpointed) generator."""
        return int(self.rng.integers(0, 2**31 - 1))

    def sample(self, fraction: float, among: np.ndarray | None = None) -> np.ndarray:
        """A sorted random subset of clients (at least one) of the given fraction."""
        pool = np.arange(self.n_clients) if among is None else np.asarray(among)
        if fraction >= 1.0:
            return pool.copy()
        k = max(1, round(fraction * len(pool)))
        return np.sort(self.rng.choice(pool, size=k, replace=False))

    def sample_round(self, config: SampledConfig, among: np.ndarray | None = None) -> np.ndarray:
        """This round's clients under the method's sampling rule (`SampledConfig`): a sorted
        random subset drawn from the run's checkpointed generator (so a resumed run draws the
        same clients), all of them (no draw) when the rule covers everyone."""
        if config.per_round is None:
            return self.sample(config.fraction, among)
        pool = np.arange(self.n_clients) if among is None else np.asarray(among)
        if config.per_round >= len(pool):
            return pool.copy()
        return np.sort(self.rng.choice(pool, size=config.per_round, replace=False))


C = TypeVar("C", bound=AlgorithmConfig)
S = TypeVar("S")

#: the phase every round starts with
FIRST = "round"


@dataclass(frozen=True)
class Ask(Generic[RE]):
    """One message of a round: the request, and the phase it belongs to (which tells
    `Algorithm.update` what it is answering; a method with one message a round needs only
    `FIRST`)."""

    request: Asks[RE]
    phase: str = FIRST


@dataclass(frozen=True)
class Update(Generic[S]):
    """What `Algorithm.update` returns: the new state and either `then`, the next phase of the
    same round, or (`then` None) the end of the round with its `extras`; `warnings`: a line
    for each thing the method did not do as its settings ask (`Context.warn`)."""

    state: S
    extras: RoundExtras | None = None
    then: str | None = None
    warnings: tuple[str, ...] = ()


class Algorithm(ABC, Generic[C, S]):
    """One federated method. Subclasses set `name`, `Config`, `State`, and implement the hooks.

    Everything the server must keep to continue a run exactly lives in `self.state`, an
    instance of the method's `State` dataclass; checkpoints are derived from it
    (`clusterfl.state`), so no method writes its own save/load code. Things that follow from
    the config and the model alone (masks, index sets) are rebuilt by `setup`, which runs
    before a checkpoint is loaded.
    """

    name: ClassVar[str]
    Config: ClassVar[type[AlgorithmConfig]]
    State: ClassVar[type[Any]]
    #: True for a method whose schedule depends on the planned number of rounds T
    #: (`Context.rounds`): such a run cannot be continued to more rounds (`--resume --set
    #: rounds=N`) with the result of a run planned for N rounds, so the runner refuses it
    uses_planned_rounds: ClassVar[bool] = False
    #: True for a method whose `update` is written for replies on a GPU (torch only, every
    #: tensor it creates on the reply's device, numpy only for small results): the driver
    #: then runs it where the backend left the reply (state and request moved there, the new
    #: state back to the CPU). Others get their replies on the CPU, as from any backend.
    device_update: ClassVar[bool] = False
    #: what a method needs of the clients' inputs that token sequences (task
    #: "language_model") lack, e.g. "image signatures"; empty: it runs on every task
    needs_real_inputs: ClassVar[str] = ""
    #: the run's data folder, `data.data_dir` (which `--data-dir` sets; None: the data
    #: modules' default, `$CLUSTERFL_DATA`, else ~/.cache/clusterfl), set by `Experiment`
    #: for a method that reads a dataset of its own (FLT pretrains its encoder on one)
    data_dir: str | Path | None = None
    #: whether that dataset's files are checked against the catalog's checksums, the run's
    #: `data.verify` (set by `Experiment` beside `data_dir`)
    data_verify: bool = True
    config: C
    state: S

    def __init__(self, config: C) -> None:
        self.config = config

    def fits(self, n_clients: int, rounds: int | None) -> None:
        """Raise a ConfigError for settings this federation and budget cannot run (K models
        for fewer clients, a warm-up that leaves no round to cluster): called by `Experiment`
        for every method of a comparison before the first one runs, and by `setup`. Nothing
        by default."""

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        """The settings against the run before any round (`Experiment`, so every method of
        a comparison before the first runs): a ConfigError for what cannot run (FLT: an
        encoder that does not fit, a pretraining dataset that cannot be read), one line for
        each setting the run will go on without obeying (CFL: too few clients a round to
        ever split). Nothing by default."""
        return []

    def check_input(self, input_shape: tuple[int, ...]) -> None:
        """Raise a ConfigError for settings one sample's shape cannot run (FLT's encoder,
        PCA components or PACFL's basis vectors above the input size), known before any
        client is: called by `check` or `setup`, and by `ClusteredStrategy` when it is built.
        Nothing by default."""

    @abstractmethod
    def setup(self, ctx: Context) -> None:
        """Create the initial state (models, assignments) in `self.state`."""

    @abstractmethod
    def ask(self, state: S, t: int, phase: str, ctx: Context) -> Ask[Any] | Update[S]:
        """The request of `phase` of round `t` (the first phase is `FIRST`), built from `state`.

        May read `ctx`'s settings and draw from its generator (sampling, request seeds); never
        sends and never writes `state`. An `Update` instead of an `Ask`: the phase needs no
        message (the round goes on with the update as if a reply had been applied).
        """

    @abstractmethod
    def update(self, state: S, t: int, ask: Ask[Any], reply: Any) -> Update[S]:
        """The new state after `reply` (the typed reply of `ask.request`; only the clients
        that answered are in it), and the next phase or the round's extras. No I/O; the
        given `state` is not modified (a new one is returned), except a per-client table
        written in place in the rows that change (`common.ClientModels`, FeSEM's file-backed
        tables): the driver keeps only the returned state."""

    def run_round(self, ctx: Context, t: int) -> RoundExtras:
        """One communication round: ask, send, update, phase after phase (the same driver for
        every method); returns the round's typed extras (`RoundRecord.extras` is their
        `to_dict()`)."""
        state, phase = self.state, FIRST
        while True:
            step = self.ask(state, t, phase, ctx)
            if isinstance(step, Ask):
                step = self._update(state, t, step, self._send(ctx, step.request))
                self._check_step(step, "update", Update)
            else:
                self._check_step(step, "ask", Ask | Update)
            for line in step.warnings:
                ctx.warn(line)
            state = step.state
            if step.then is None:
                break
            phase = step.then
        self.state = state
        return step.extras if step.extras is not None else RoundExtras()

    def _check_step(self, step: Any, hook: str, kind: Any) -> None:
        """One line naming the method's hook when it returns something the driver cannot
        run (a method of one's own: a state where an `Update` belongs, a bare request where
        an `Ask` does)."""
        if not isinstance(step, kind):
            cls = type(self)
            wants = ("clusterfl.algorithms.Ask(request) or Update(state, ...)" if hook == "ask"
                     else "clusterfl.algorithms.Update(state, ...)")
            raise ClusterFLError(f"{cls.__module__}:{cls.__qualname__}.{hook} returned a "
                                 f"{type(step).__name__}; it must return {wants}")

    def _send(self, ctx: Context, request: Any) -> Any:
        """`ctx.send`, the reply left on the backend's GPU for a method with `device_update`."""
        ctx.keep_device = self.device_update
        try:
            return ctx.send(request)
        finally:
            ctx.keep_device = False

    def _update(self, state: S, t: int, ask: Ask[Any], reply: Any) -> Update[S]:
        """`update`, on the device of `reply` when it is on one (`device_update`)."""
        device = device_of(reply)
        if device is None:
            return self.update(state, t, ask, reply)
        done = self.update(move(state, device), t, move(ask, device), reply)
        return to_cpu(done)

    @abstractmethod
    def assignment(self) -> np.ndarray:
        """Cluster (or model) id of every client; -1 where none."""

    @abstractmethod
    def predictor(self) -> Predictor:
        """How each client predicts (the models the method gives every client)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (a plain copy of `self.state`)."""
        out: dict[str, Any] = snapshot(self.state)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a large tensor kept as its nonzero rows comes back in a lazily zero table
        self.state = restore(type(self).State, self.migrate_state(state), zeros=lazy_zeros)

    def migrate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint written by an earlier layout of `State`, in today's layout (a method
        whose state changed shape overrides it; default: as it is)."""
        return state

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Place clients that took no part in training (`clients` index the federation of
        `ctx.backend`) into the method's clusters, through `ctx.send` only, without changing
        the method's state. Each method documents its rule."""
        raise ClusterFLError(f"{self.label()} cannot place new clients")

    def place(self, ctx: Context, clients: np.ndarray | list[int]) -> np.ndarray:
        """The cluster id (as in `assignment()`) of each of `clients` (see `placement`)."""
        ids = client_ids(clients, ctx.n_clients, "clients", "the context's")
        return self.placement(ctx, ids).clusters

    def save_artifacts(self, run_dir: Path, round_: int) -> list[Path]:
        """Write the method's own files into the finished run's folder (CFL's tree for
        `clusterfl place`, FLT's relatedness matrices) after round `round_`; returns the paths
        written (their names must be listed in `rundir`'s files a run writes). Default: none."""
        return []

    def n_clusters(self) -> int:
        a = self.assignment()
        return len(np.unique(a[a >= 0]))

    def label(self) -> str:
        """The method's name in tables and figures (`method_label` of its config)."""
        return method_label(self.config)
