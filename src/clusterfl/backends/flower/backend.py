"""`FlowerBackend`: protocol requests as Flower messages over a `Grid` (docs/flower.md).

The backend lives inside a ServerApp's `main(grid, context)` (see `clusterfl.deploy.server_app`),
which opens a `FlowerSession` (grid + which node holds which client) before building the
Experiment. `execute(request)` then

1. sends one message per client listed in `request.clients`, to that client's node, holding
   the request as that client alone needs it (`protocol.subset`: its own
   `model_of_client` / predictor rows; the model stack is shared);
2. waits for the replies (`grid.push_messages` / `grid.pull_messages`, i.e. the loop of
   `grid.send_and_receive` with a shorter poll interval) until `backend.timeout`;
3. joins the one-client replies in the request's client order (`protocol.join`).

A client whose node does not answer in time, answers with an error, or has no node is
*dropped* from that reply: the reply holds the rows of the answering clients only, and its
`clients` field says which ones they are (what `Context.send` reads to record the dropout,
and what lets the algorithms average over the answering clients only). Every dropout is also
kept in
`FlowerBackend.dropouts` (request type, clients, reason), which the ServerApp writes to
`flower.json` in the run directory. A client that missed a deadline is not waited for
again (later requests end once the others answered) until it answers again; a request for
no client at all sends nothing and returns the empty reply.

Flower is imported lazily (at the first message), so `clusterfl.backends` stays fast to import.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Self, cast

import numpy as np
import torch
from pydantic import Field, field_validator

from clusterfl.backends.base import BackendConfig, Relay
from clusterfl.backends.flower import codec
from clusterfl.data.federation import Federation
from clusterfl.errors import ClusterFLError, ConfigError, require
from clusterfl.models import ModelFactory
from clusterfl.protocol import (
    RE,
    Asks,
    join,
    parts_of,
    request_name,
    subset,
)

SUSPECT_GRACE = 1.0
"""Seconds a request still waits for clients that were silent before, once all others answered."""

POLL_INTERVAL = 0.1
"""Seconds between two pulls of replies from the SuperLink."""


class FlowerConfig(BackendConfig):
    """Settings of the flower backend (`[backend] name = "flower"`; the ServerApp sets the
    name). `chunk_size` is accepted and ignored (each node computes its own client)."""

    name: Literal["flower"] = "flower"
    timeout: float = Field(600.0, gt=0.0, description="seconds to wait for the replies to one "
                           "request; a node silent that long is dropped")
    wait_nodes: int = Field(0, ge=0, description="SuperNodes to wait for before the run starts "
                            "(0: scenario.n_clients)")
    wait_timeout: float = Field(300.0, gt=0.0, description="give up waiting for the SuperNodes "
                                "after this many seconds")
    chunk_unused: ClassVar[str] = "each node computes its own client with its own engine"
    client_engine: Literal["simulation", "sequential"] = Field(
        "simulation", description="the engine each node computes with")

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _auto(cls, value: object) -> object:
        """"auto", the in-process backends' default, is this one's (a config may switch)."""
        return cls.model_fields["chunk_size"].default if value == "auto" else value


@dataclass
class FlowerSession:
    """The Grid of a running ServerApp and the node of each client (from the handshake)."""

    grid: Any
    node_of_client: dict[int, int]
    setup: dict[str, Any]
    timeout: float = 600.0
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    backends: list[FlowerBackend] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    """The warnings given (each once; a strategy's checkpoint keeps them)."""

    def warn_once(self, key: str, line: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            print(f"clusterfl: warning: {line}", flush=True)


_ACTIVE: list[FlowerSession] = []


@contextlib.contextmanager
def active_session(session: FlowerSession) -> Iterator[FlowerSession]:
    """Make `session` the one `FlowerBackend.from_config` (or, for a `StandardSession`,
    `StandardBackend.from_config`) uses while the block runs."""
    _ACTIVE.append(session)
    try:
        yield session
    finally:
        _ACTIVE.remove(session)


def message_type(request: Asks[Any]) -> str:
    """Flower message type of a protocol request ("<category>.request"): "train" when clients
    train on it (a round's steps: when one of them does), "evaluate" for an evaluation."""
    if any(part.trains for part in parts_of(request) or [request]):
        return "train.request"
    return "evaluate.request" if request.kind == "evaluate" else "query.request"


@contextmanager
def unusable(reasons: dict[int, str], client: int) -> Iterator[None]:
    """Reading one client's reply: a reply that cannot be read (a metric it lacks, a
    parameter of another shape, an array record missing) drops that client from the request
    with the reason, as a silent client is (`FlowerBackend._assemble`), instead of stopping
    the run."""
    try:
        yield
    except ClusterFLError as exc:
        reasons[client] = str(exc)
    except (KeyError, StopIteration, ValueError, TypeError) as exc:
        reasons[client] = (f"client {client}'s reply could not be read: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}")


def misfit(reply: Any, template: Any, client: int) -> str | None:
    """Why `reply`, one client's decoded reply, is not one of `template`'s type (a request's
    `empty_reply()`) with rows of `client` only, and `template`'s widths where it gives
    them (a width of 0 there: not known in advance); None when it fits. A reply that does
    not fit would stop the request's `join` (or be taken as another client's)."""
    if type(reply) is not type(template):
        return f"a {type(reply).__name__}, not a {type(template).__name__}"
    parts, want = parts_of(reply), parts_of(template)
    if want is not None:
        if parts is None or len(parts) != len(want):
            return f"{len(parts or [])} parts, not {len(want)}"
        return next((why for p, w in zip(parts, want, strict=True)
                     if (why := misfit(p, w, client))), None)
    rows = np.asarray(reply.clients).reshape(-1).tolist()
    if any(int(r) != client for r in rows):
        return f"rows for clients {rows}"
    for f in fields(reply):
        if not f.metadata.get("per_client") or f.name == "clients":
            continue
        got, empty = getattr(reply, f.name), getattr(template, f.name)
        if not hasattr(got, "shape") or not hasattr(empty, "shape"):
            continue
        shape, like = tuple(got.shape), tuple(empty.shape)
        if len(shape) != len(like) or shape[0] != len(rows) or any(
                w and s != w for s, w in zip(shape[1:], like[1:], strict=True)):
            wanted = ", ".join(str(w or "*") for w in (len(rows), *like[1:]))
            return f"{f.name} has shape {list(shape)}, not [{wanted}]"
    return None


class FlowerBackend(Relay):
    """Executes protocol requests on Flower SuperNodes through the ServerApp's Grid.

    Args:
        federation: the server's view of the federation: sizes and shapes only (see
            `clusterfl.deploy.server_app.server_federation`); the data lives on the nodes.
        factory: the architecture.
        session: the Grid and the client → node map of the running ServerApp.
    """

    name = "flower"
    Config = FlowerConfig

    def __init__(self, federation: Federation, factory: ModelFactory,
                 session: FlowerSession) -> None:
        super().__init__(federation, factory)
        self.session = session
        self.dropouts: list[dict[str, Any]] = []
        self.n_messages = 0
        self.seconds = 0.0
        self._setup_json = json.dumps(session.setup, sort_keys=True)
        self._group = 0
        self.suspects: set[int] = set()
        self.last_ids: list[str] = []
        """The message ids of the last `_exchange`, in the order of its messages."""

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        """The backend of the ServerApp's active session (error outside a ServerApp); the
        session already holds what the ServerApp read from `config` (timeout, nodes)."""
        if not _ACTIVE:
            raise ConfigError(
                "backend.name", "'flower' runs inside a Flower ServerApp: start it with "
                "`clusterfl flower run` or `flwr run` (see docs/deploy.md); for an "
                "in-process run use 'simulation' or 'sequential'")
        backend = cls(federation, factory, _ACTIVE[-1])
        _ACTIVE[-1].backends.append(backend)
        return backend

    # ------------------------------------------------------------------ dispatch
    def execute(self, request: Asks[RE]) -> RE:
        clients = np.asarray(request.clients, dtype=np.int64)
        if len(clients) == 0:  # nothing to send
            return request.empty_reply()
        kind = message_type(request)
        items = [(c, kind, codec.to_recorddict(subset(request, [i]), {"setup": self._setup_json}))
                 for i, c in enumerate(clients.tolist())
                 if int(c) in self.session.node_of_client]  # the others: "no node holds ..."
        replies, reasons = self._send(items, clients)
        got: dict[int, Any] = {}
        template = request.empty_reply()
        for (c, _, _), msg in zip(items, replies):
            if msg is None:
                continue
            with unusable(reasons, int(c)):  # a reply that cannot be read: dropped, said why
                reply, _ = codec.from_recorddict(msg.content)
                why = misfit(reply, template, int(c))
                if why:
                    raise ClusterFLError(f"client {c}'s reply does not fit the "
                                         f"{request_name(request)}: {why}")
                got[int(c)] = reply
        return self._assemble(request, clients, got, reasons)

    def _say_non_finite(self, client: int, reply: Any) -> None:
        """One warning per client whose uploaded vector (model, gradient, K models) holds a
        NaN or an infinity: the guard rejects such a reply, which only the history's
        `rejected` count would show. Said through the session (`warn_once`: a standard
        strategy's goes to its `log`), for our ClientApps and standard ones alike."""
        key = f"non-finite {client}"
        if key in self.session.warned:
            return
        for part in parts_of(reply) or [reply]:
            try:
                rows = part.update_rows()
            except TypeError:  # a reply that uploads no vector (losses, metrics)
                continue
            if not bool(torch.isfinite(rows).all()):
                self.session.warn_once(key, (
                    f"client {client} (node {self.session.node_of_client.get(client)}) sent "
                    f"non-finite values in its {type(part).__name__}; the guard rejects such "
                    "a reply (rounds' 'rejected' in history.jsonl), as a diverged client's "
                    "in-process; said once per client"))
                return

    def _send(self, items: list[tuple[int, str, Any]], asked: Any = None
              ) -> tuple[list[Any | None], dict[int, str]]:
        """One message per (client, message type, content) item, in one exchange; each item's
        reply message (None: none), and why the clients of `asked` (default: the items')
        that got none did not: no node holds it, an error from its node, or silence (past
        `backend.timeout`, or since an earlier request). Updates `suspects`, the clients that
        missed a deadline and are not waited for again."""
        require("flower", "flwr.app")
        from flwr.app import Message

        self._group += 1
        messages, where, reasons = [], [], {}
        for c in (np.asarray(asked).tolist() if asked is not None else []):
            if int(c) not in self.session.node_of_client:
                reasons[int(c)] = "no node holds this client"
        for i, (c, kind, content) in enumerate(items):
            node = self.session.node_of_client.get(int(c))
            if node is None:
                reasons[int(c)] = "no node holds this client"
                continue
            messages.append(Message(content, node, kind, group_id=str(self._group)))
            where.append(i)
        t0 = time.perf_counter()
        replies = self._exchange(messages)
        self.seconds += time.perf_counter() - t0
        self.n_messages += len(messages)
        index = {mid: where[j] for j, mid in enumerate(self.last_ids)}
        out: list[Any | None] = [None] * len(items)
        for msg in replies:
            at = index.get(msg.metadata.reply_to_message_id)
            if at is None:
                continue
            if msg.has_error():
                reasons[int(items[at][0])] = f"error from node: {msg.error.reason}"
                continue
            out[at] = msg
        for i, (c, _, _) in enumerate(items):
            if out[i] is None and int(c) not in reasons:
                reasons[int(c)] = (f"no reply within backend.timeout = {self.session.timeout:g} s"
                                   if int(c) not in self.suspects
                                   else "no reply (silent since an earlier request)")
        answered = {int(items[i][0]) for i in range(len(items)) if out[i] is not None}
        self.suspects = (self.suspects | set(reasons)) - answered
        return out, reasons

    def _exchange(self, messages: list[Any]) -> list[Any]:
        """Push the messages, then pull replies until all are in (or the timeout).

        This is `Grid.send_and_receive` with two changes: replies are pulled every
        `POLL_INTERVAL` s (Flower 1.41's `send_and_receive` sleeps 3 s between pulls, which
        adds up to 3 s to every request), and a client that missed an earlier deadline is
        not waited for again: once all others answered, the request ends after
        `SUSPECT_GRACE` seconds; a reply from it arriving by then counts and clears the
        suspicion.
        """
        grid = self.session.grid
        ids = list(grid.push_messages(messages))
        self.last_ids = ids
        node_of_id = {i: int(m.metadata.dst_node_id) for i, m in zip(ids, messages)}
        suspect_nodes = {self.session.node_of_client[c] for c in self.suspects
                         if c in self.session.node_of_client}
        pending, out = set(ids), []
        start = time.monotonic()
        done_at: float | None = None
        while pending and time.monotonic() - start < self.session.timeout:
            for msg in grid.pull_messages(list(pending)):
                out.append(msg)
                pending.discard(msg.metadata.reply_to_message_id)
            if done_at is None and all(node_of_id[i] in suspect_nodes for i in pending):
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > SUSPECT_GRACE:
                break
            if pending:  # every reply in: no last wait
                time.sleep(POLL_INTERVAL)
        return out

    def _assemble(self, request: Asks[RE], clients: np.ndarray, got: dict[int, Any],
                  reasons: dict[int, str]) -> RE:
        for c, reply in got.items():  # every reply that is used, whichever client sent it
            self._say_non_finite(int(c), reply)
        if reasons:
            self.dropouts.append({
                "request": request_name(request), "message_group": self._group,
                "clients": sorted(reasons), "reasons": {str(c): r for c, r in reasons.items()},
            })
        if not got:
            late = any("backend.timeout" in r for r in reasons.values())
            raise ClusterFLError(
                f"no client answered the {request_name(request)} (asked: "
                f"{clients.tolist()}; e.g. {next(iter(reasons.values()), '')})"
                + (f"; if the nodes are only slow, raise backend.timeout (now "
                   f"{self.session.timeout:g} s)" if late else ""))
        return cast(RE, join([got[int(c)] for c in clients if int(c) in got]))
