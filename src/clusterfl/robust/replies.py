"""Which clients answered: the seam between faulty clients and the algorithms.

A reply that `Context.send` returns holds one row per client that *answered* (and whose
answer passed validation), in the order of the request's `clients`; a client that dropped
out, missed the deadline or was rejected is simply not there. The answering clients travel
with the reply as the attribute `reply.clients` (an int64 array, set by `mark_answered`);
algorithms read it with `answered(reply, requested)` and line their per-client arrays up with
`positions(answered, requested)`.

For backend authors (e.g. Flower): when some nodes do not answer, return the rows of those
that did and call `mark_answered(reply, their_ids)`; `Context.send` records the others as
dropped. A backend that does not mark its reply is taken to have answered for every client.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import torch

from clusterfl.protocol import (
    EvaluateReply,
    EvaluateRequest,
    GradientReply,
    GradientRequest,
    LossReply,
    LossRequest,
    Reply,
    Request,
    TrainReply,
    TrainRequest,
    reply_width,
)

ATTRIBUTE = "clients"


def mark_answered(reply: Reply, clients: np.ndarray) -> Reply:
    """Record on `reply` which clients its rows belong to (in row order); returns it."""
    setattr(reply, ATTRIBUTE, np.asarray(clients, dtype=np.int64).copy())
    return reply


def answered(reply: Reply, requested: np.ndarray | None = None) -> np.ndarray:
    """The clients whose rows `reply` holds (default: all of `requested`)."""
    who = getattr(reply, ATTRIBUTE, None)
    if who is not None:
        return np.asarray(who, dtype=np.int64)
    if requested is None:
        raise ValueError("the reply does not say which clients answered; pass `requested`")
    return np.asarray(requested, dtype=np.int64)


def positions(sub: np.ndarray, full: np.ndarray) -> np.ndarray:
    """Index of every element of `sub` in `full` (both client id arrays; `sub` ⊆ `full`)."""
    where = {int(c): i for i, c in enumerate(np.asarray(full).tolist())}
    try:
        return np.array([where[int(c)] for c in np.asarray(sub).tolist()], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"client {exc.args[0]} answered but was not asked") from None


def mean_finite(values: np.ndarray) -> float | None:
    """Mean of the finite entries (None when there is none, e.g. nobody answered)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else None


def n_rows(reply: Reply) -> int:
    """Number of client rows in a reply."""
    first = getattr(reply, fields(reply)[0].name)
    return len(first)


def _take(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(rows)]
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, dict):
        return {k: _take(v, rows) for k, v in value.items()}
    return value


def take(reply: Reply, rows: np.ndarray) -> Reply:
    """The reply restricted to row positions `rows` (keeps `clients` in step)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = type(reply)(**{f.name: _take(getattr(reply, f.name), rows) for f in fields(reply)})
    who = getattr(reply, ATTRIBUTE, None)
    if who is not None:
        mark_answered(out, np.asarray(who)[rows])
    return out


def _cat(values: list[Any]) -> Any:
    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    if isinstance(values[0], np.ndarray):
        return np.concatenate(values)
    if isinstance(values[0], dict):
        return {k: _cat([v[k] for v in values]) for k in values[0]}
    return values[0]


def concat(replies: list[Reply]) -> Reply:
    """Rows of several replies of one type, one after the other (with their `clients`)."""
    first = replies[0]
    out = type(first)(**{f.name: _cat([getattr(r, f.name) for r in replies])
                         for f in fields(first)})
    return mark_answered(out, np.concatenate([answered(r) for r in replies]))


def empty_reply(request: Request) -> Reply:
    """A reply with no rows, of the type and widths `request` would get."""
    none = np.zeros(0, dtype=np.int64)
    if isinstance(request, TrainRequest):
        d = reply_width(request.models, request.coords)  # d̂ when narrowed to `coords`
        rep: Reply = TrainReply(torch.zeros(0, d, dtype=request.models.dtype), none.copy(),
                                np.zeros(0))
    elif isinstance(request, GradientRequest):
        d = reply_width(request.models, request.coords)
        rep = GradientReply(torch.zeros(0, d, dtype=request.models.dtype), none.copy(),
                            np.zeros(0))
    elif isinstance(request, LossRequest):
        k = request.models.shape[0]
        rep = LossReply(np.zeros((0, k)), np.zeros((0, k)))
    elif isinstance(request, EvaluateRequest):
        rep = EvaluateReply(np.zeros(0), np.zeros(0), np.zeros(0), none.copy())
    elif type(request).__name__ == "EmbedRequest":  # FLT signatures: [0, k, e]
        from clusterfl.protocol import EmbedReply  # type: ignore[attr-defined]

        k, e = int(request.k), int(request.signature_dim)  # type: ignore[union-attr]
        rep = EmbedReply(np.zeros((0, k, e)), none.copy())
    else:
        raise TypeError(f"unknown request type {type(request).__name__}")
    return mark_answered(rep, none)


__all__ = ["answered", "concat", "empty_reply", "mark_answered", "mean_finite", "n_rows",
           "positions", "take"]
