"""Compound requests: a client's whole round in one message (`Steps`, issue 26).

A `Steps` lists ordinary requests a client executes in order; a `Pick` binds a later step's
models to the client's own result of an earlier `LossRequest` step. `run_steps` is what every
backend and node does with one; `resolve_step` is a step as the client executes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np

from clusterfl.errors import ClusterFLError
from clusterfl.protocol.messages import (
    PER_CLIENT,
    REQUEST_TYPES,
    Asks,
    Kind,
    LossReply,
    LossRequest,
    Reply,
)
from clusterfl.protocol.rows import listed_in, positions_of, present


@dataclass(frozen=True)
class Pick:
    """Step `step` of a `Steps` takes each client's model from that client's own result of
    step `source` (a `LossRequest`): the row of the source's models with the least loss
    (`by = "loss"`, IFCA's cluster identity estimate ĵ = argmin_j F_i(θ_j)) or the highest
    accuracy, ties to the lower loss (`"accuracy"`); `pick_rows` is the rule, the same on the
    device and on the server. `into = "model"`: the row becomes the step's `model_of_client`
    (train / take the gradient of θ_ĵ); `"offset"`: the one member of the step's `offset`
    predictor (IFCA-CAM trains Θ_g with the picked cluster part frozen). A client that did
    not answer the source step is not asked for step `step`."""

    step: int
    source: int
    by: Literal["loss", "accuracy"] = "loss"
    into: Literal["model", "offset"] = "model"


def pick_rows(loss: np.ndarray, accuracy: np.ndarray | None = None,
              by: Literal["loss", "accuracy"] = "loss") -> np.ndarray:
    """Row per client from its `[n, K]` losses: argmin loss, or argmax accuracy with ties to
    the lower loss. Non-finite losses count as +inf (a diverged model is never chosen)."""
    finite = np.where(np.isfinite(loss), loss, np.inf)
    if by == "loss":
        return np.argmin(finite, axis=1).astype(np.int64)
    if accuracy is None:
        raise ValueError("choosing by accuracy needs the accuracies")
    acc = np.nan_to_num(accuracy, nan=-1.0)
    best = acc.max(axis=1, keepdims=True)
    return np.argmin(np.where(acc == best, finite, np.inf), axis=1).astype(np.int64)


@dataclass
class Steps(Asks["StepsReply"]):
    """Several ordinary requests a client executes in order, sent as ONE message per client.

    `steps[j]` is any request but `Steps` and `EvaluateRequest`; its `clients` are some of
    `clients` (a step may go to a part of them, CFL-GP's profile probes). `picks` bind a later
    step's models to an earlier step's local result (`Pick`: IFCA's "train the least-loss of
    the K models" as its paper describes the client's step); a picked step's
    `model_of_client` is a placeholder. Every step is computed as if it had been sent alone
    (same seeds, same engine), so the replies are those of the separate requests.

    Costs: each step is booked by `Context.send` as if it had been sent alone (its
    `unit_cost` for the clients it reached / that uploaded it), so a method's communication is
    unchanged; `unit_cost` here is the sum, what one client in every step receives and sends.
    The reply (`StepsReply`) holds one reply per step.
    """

    clients: np.ndarray = field(metadata=PER_CLIENT)
    steps: list[Asks[Any]] = field(metadata=PER_CLIENT)
    picks: list[Pick] = field(default_factory=list)
    kind: ClassVar[Kind] = "steps"
    nested: ClassVar[str | None] = "steps"

    def __post_init__(self) -> None:
        for s in self.steps:
            if not isinstance(s, REQUEST_TYPES) or s.kind == "evaluate":
                raise ClusterFLError(f"a Steps step must be an ordinary request other than "
                                     f"EvaluateRequest, got {type(s).__name__}")
        for p in self.picks:
            ok = 0 <= p.source < p.step < len(self.steps)
            target = self.steps[p.step] if ok else None
            fits = (getattr(target, "offset", None) is not None if p.into == "offset"
                    else hasattr(target, "model_of_client"))
            if not ok or not isinstance(self.steps[p.source], LossRequest) or not fits:
                raise ClusterFLError(f"Pick(step={p.step}, source={p.source}) must take a "
                                     "later step's models from an earlier LossRequest step")

    @staticmethod
    def of(*steps: Asks[Any], picks: list[Pick] | None = None) -> Steps:
        """The steps, for the union of their clients (in first-seen order)."""
        seen: dict[int, None] = {}
        for s in steps:
            seen.update((int(c), None) for c in np.asarray(s.clients).tolist())
        return Steps(np.array(list(seen), dtype=np.int64), list(steps), list(picks or []))

    def empty_reply(self) -> StepsReply:
        return StepsReply(np.zeros(0, dtype=np.int64), [s.empty_reply() for s in self.steps])

    def unit_cost(self) -> tuple[float, float]:
        down = up = 0.0
        for s in self.steps:
            d, u = s.unit_cost()
            down, up = down + d, up + u
        return down, up

    def picks_of(self, j: int) -> list[Pick]:
        return [p for p in self.picks if p.step == j]


@dataclass
class StepsReply(Reply):
    """`replies[j]` is the reply of step j (its rows: the clients of that step that answered,
    in that step's order — after `join`, in the order it was given); `clients` are the
    clients that answered at least one step, in request order. `subset` keeps each step's
    own order."""

    clients: np.ndarray = field(metadata=PER_CLIENT)
    replies: list[Any] = field(metadata=PER_CLIENT)  # Reply (Any: read as the step's type)
    nested: ClassVar[str | None] = "replies"


def resolve_step(request: Steps, j: int, replies: list[Reply]) -> Asks[Any]:
    """Step j as the client executes it, given the replies of steps 0..j−1: with a `Pick`,
    for the clients that answered the source step only, each on its picked model."""
    step = request.steps[j]
    for pick in request.picks_of(j):
        step = _apply(step, pick, replies)
    return step


def _apply(step: Any, pick: Pick, replies: list[Reply]) -> Any:
    src = replies[pick.source]
    assert isinstance(src, LossReply)  # a Pick's source is a LossRequest step
    step = present(step, src.clients)
    rows = pick_rows(np.asarray(src.loss), np.asarray(src.accuracy), pick.by)
    picked = rows[positions_of(src, step.clients)]
    if pick.into == "offset":
        return replace(step, offset=replace(step.offset, members=picked[:, None]))
    return replace(step, model_of_client=picked)


def run_steps(execute: Callable[[Asks[Any]], Reply], request: Steps) -> StepsReply:
    """Execute the steps in order with `execute` (a backend's), each step as the separate
    request it stands for (`resolve_step`): what every backend and node does with a `Steps`."""
    replies: list[Reply] = []
    for j in range(len(request.steps)):
        step = resolve_step(request, j, replies)
        replies.append(execute(step) if len(step.clients) else step.empty_reply())
    return steps_reply(request.clients, replies)


def request_name(request: Asks[Any]) -> str:
    """A request's name in logs and errors: its type, a `Steps` with its steps'
    (`Steps[LossRequest+TrainRequest]`)."""
    if isinstance(request, Steps):
        return "Steps[" + "+".join(type(s).__name__ for s in request.steps) + "]"
    return type(request).__name__


def steps_reply(order: np.ndarray, replies: list[Reply]) -> StepsReply:
    """A `StepsReply` of the step replies; its clients: those in any step, in `order`."""
    return StepsReply(listed_in(order, replies), list(replies))


__all__ = [
    "Pick",
    "Steps",
    "StepsReply",
    "pick_rows",
    "request_name",
    "resolve_step",
    "run_steps",
    "steps_reply",
]
