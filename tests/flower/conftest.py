"""An in-process Flower Grid for fast tests of the flower backend (no processes, no Ray).

`FakeGrid` implements the `flwr.serverapp.Grid` methods our ServerApp uses and answers
every message by calling the real ClientApp (`clusterfl.deploy.client_app.app`)
with a real Flower `Context` whose node config names the node's partition. Nodes listed in
`dead_from[node] = g` stop answering from message group g on (a crashed SuperNode).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clusterfl.deploy.client_app import app as client_app

BASE = {
    "seed": 0, "rounds": 3, "eval_every": 3, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": 6, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"lr": 0.1, "batch_size": 16, "epochs": 2},
    "output": {"figures": False},
}
IFCA = {"name": "ifca", "n_clusters": 2}
CFL_GP = {"name": "cfl_gp", "n_clusters": 2, "period": 1, "estimate_k": False,
          "protocol": "model"}


class FakeGrid:
    """Nodes 100, 101, ... holding partitions 0, 1, ... (or the given node configs)."""

    def __init__(self, node_configs: list[dict[str, Any]], app: Any = None) -> None:
        self.nodes = {100 + i: dict(cfg, worker="none") for i, cfg in enumerate(node_configs)}
        self.app = app if app is not None else client_app  # another ClientApp: a standard one
        self.dead_from: dict[int, int] = {}
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def _answer(self, msg: Message) -> Message | None:
        node = int(msg.metadata.dst_node_id)
        group = msg.metadata.group_id
        if node in self.dead_from and group.isdigit() and int(group) >= self.dead_from[node]:
            return None
        ctx = Context(1, node, self.nodes[node], RecordDict(), {})
        return self.app(msg, ctx)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id
            self.sent.append(m)
            reply = self._answer(m)
            if reply is not None:
                self._replies[m.object_id] = reply
            ids.append(m.object_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(list(self.push_messages(messages)))


class ErrorReplies(FakeGrid):
    """A node's exception comes back as an error reply, as Flower's ClientApp runtime sends
    it; nodes in `silent` never answer the handshake."""

    silent: frozenset[int] = frozenset()

    def _answer(self, msg: Message) -> Message | None:
        from flwr.app import Error

        if msg.metadata.group_id == "handshake" and int(msg.metadata.dst_node_id) in self.silent:
            return None
        try:
            return super()._answer(msg)
        except Exception as exc:  # what the runtime does with any exception
            return Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    """Flower's Message constructor needs a run/node/task identity (the ServerApp's)."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
