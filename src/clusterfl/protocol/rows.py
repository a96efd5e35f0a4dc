"""Taking some clients of a message and putting replies together (floor 0).

Clients on the first axis: a request lists its `clients`; a reply lists the clients whose
rows it holds (`clients`, in request order, only those that answered). Fields marked
`PER_CLIENT` have one entry per listed client on their first axis (in a nested `Predictor`,
its `members`); every other field is the same for all clients. A compound message (`Steps`,
`StepsReply`) holds its parts in the field its `nested` names, each part listing some of its
clients. `subset` and `join` are the one way to take some clients of a request or reply and to
put replies together; robustness, backends and the Flower codec all use them.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

import numpy as np
import torch

from clusterfl.protocol.messages import (
    Asks,
    GradientRequest,
    Predictor,
    Reply,
    TrainRequest,
    narrow,
)

M = TypeVar("M")


def parts_of(message: Any) -> list[Any] | None:
    """The parts of a compound message (a `Steps`' steps, a `StepsReply`'s replies), None
    for an ordinary one."""
    name = getattr(message, "nested", None)
    return None if name is None else list(getattr(message, name))


def listed_in(order: np.ndarray | list[int], parts: list[Reply]) -> np.ndarray:
    """The client ids of `order` that at least one of `parts` lists, in that order."""
    got = {int(c) for r in parts for c in np.asarray(r.clients).tolist()}
    return np.array([int(c) for c in np.asarray(order).tolist() if int(c) in got],
                    dtype=np.int64)


def _take(value: Any, rows: np.ndarray) -> Any:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(rows)]
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, dict):
        return {k: _take(v, rows) for k, v in value.items()}
    if isinstance(value, Predictor):
        return subset(value, rows)
    raise TypeError(f"cannot take client rows of a {type(value).__name__}")


def subset(message: M, rows: np.ndarray | list[int]) -> M:
    """`message` (a request, a reply or a `Predictor`) restricted to the clients at positions
    `rows` of its client axis, in that order: every `PER_CLIENT` field follows."""
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    msg: Any = message
    parts = parts_of(msg)
    if parts is not None:  # each part: those of the clients it lists
        ids = np.asarray(msg.clients, dtype=np.int64)[idx]
        keep = {int(c) for c in ids.tolist()}
        compound: Any = replace(msg, clients=ids)
        setattr(compound, msg.nested, [  # a fresh copy: its own list of parts
            subset(p, [i for i, c in enumerate(np.asarray(p.clients).tolist())
                       if int(c) in keep]) for p in parts])
        done: M = compound
        return done
    changes = {f.name: _take(getattr(msg, f.name), idx) for f in fields(msg)
               if f.metadata.get("per_client")}
    out: M = replace(msg, **changes)
    return out


def positions_of(message: Any, clients: np.ndarray | list[int]) -> np.ndarray:
    """Positions of client ids `clients` on `message.clients` (each must be listed)."""
    where = {int(c): i for i, c in enumerate(np.asarray(message.clients).tolist())}
    try:
        return np.array([where[int(c)] for c in np.asarray(clients).tolist()], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"client {exc.args[0]} is not listed in the "
                         f"{type(message).__name__}") from None


def select(message: M, clients: np.ndarray | list[int]) -> M:
    """`message` restricted to the client ids `clients` (in that order)."""
    return subset(message, positions_of(message, clients))


def present(message: M, clients: np.ndarray | list[int]) -> M:
    """`message` restricted to those of the client ids `clients` it lists (in that order);
    `message` itself when that is all of its rows in its own order (no copy of its rows)."""
    msg: Any = message
    order = np.asarray(msg.clients).tolist()
    listed = {int(c) for c in order}
    keep = [int(c) for c in np.asarray(clients).tolist() if int(c) in listed]
    if keep == [int(c) for c in order]:
        return message
    return select(message, keep)


def _cat(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values)
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    if isinstance(first, dict):
        return {k: _cat([v[k] for v in values]) for k in first}
    raise TypeError(f"cannot join client rows of a {type(first).__name__}")


def join(replies: list[M], order: np.ndarray | None = None) -> M:
    """The rows of several replies of one type as one reply; with `order` (client ids, e.g.
    the request's `clients`), the rows are put in that order (clients not in any reply are
    absent)."""
    if not replies:
        raise ValueError("join needs at least one reply")
    first: Any = replies[0]
    rs: list[Any] = list(replies)
    if parts_of(first) is not None:  # part by part, then the clients of any part
        if order is None:
            order = np.concatenate([np.asarray(r.clients, np.int64) for r in rs])
        each = [getattr(r, first.nested) for r in rs]
        joined = [join([parts[j] for parts in each], order) for j in range(len(each[0]))]
        compound: M = replace(first, clients=listed_in(order, joined),
                              **{first.nested: joined})
        return compound
    out: Any = first
    if len(replies) > 1:
        out = replace(first, **{
            f.name: _cat([getattr(r, f.name) for r in replies])
            for f in fields(first) if f.metadata.get("per_client")})
    if order is None:
        done: M = out
        return done
    rank = {int(c): i for i, c in enumerate(np.asarray(order).tolist())}
    have = np.asarray(out.clients).tolist()
    missing = [c for c in have if int(c) not in rank]
    if missing:
        raise ValueError(f"reply rows for clients {missing} that were not asked")
    ranks = np.array([rank[int(c)] for c in have], dtype=np.int64)
    if np.all(ranks[1:] > ranks[:-1]):  # already in order (the usual case): no copy
        done = out
        return done
    ordered: M = subset(out, np.argsort(ranks, kind="stable"))
    return ordered


def start_models(request: TrainRequest | GradientRequest,
                 clients: np.ndarray | None = None) -> torch.Tensor:
    """θ_start of `clients` (default: all listed), the row of `request.models` each was sent,
    at the request's `coords` when it asked for some coordinates only (a reply's shape)."""
    rows = np.asarray(request.model_of_client, dtype=np.int64)
    if clients is not None:
        rows = rows[positions_of(request, clients)]
    return narrow(request.models[torch.from_numpy(rows)], request.coords)


def update_vectors(request: Asks[Any], reply: Reply) -> torch.Tensor:
    """The updates an update reply carries, one row per client in reply order: the uploaded
    rows less what they are relative to (`Asks.update_base`: θ_start, at `coords` when
    narrowed), the rows themselves for gradients."""
    rows = reply.update_rows()
    base = request.update_base(positions_of(request, reply.clients))
    return rows if base is None else rows - base


__all__ = [
    "join",
    "listed_in",
    "parts_of",
    "positions_of",
    "present",
    "select",
    "start_models",
    "subset",
    "update_vectors",
]
