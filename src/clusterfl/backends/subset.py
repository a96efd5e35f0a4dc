"""`SubsetBackend`: some clients of a backend's federation, numbered 0..n−1.

A run with held-out clients (`[scenario] holdout`) trains on some clients of the federation
and places the others at the end. The algorithms number the clients of their context
0..n−1; the backend that holds the data (in simulation) or reaches the nodes (on Flower, one
node per client id of the whole federation) numbers them as the whole federation does. This
wrapper translates: a request for local clients `i` goes to the inner backend for clients
`ids[i]`, and the reply's `clients` are translated back. Only the `clients` field of requests
and replies (and of the steps of a `Steps` and its reply) names clients (every other
per-client field is a row in that order), so this works for every request type and every
backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from clusterfl.backends.base import Backend, Relay
from clusterfl.protocol import RE, Asks, parts_of

M = TypeVar("M")


class SubsetBackend(Relay):
    """Clients `ids` (of `inner`'s federation) as clients 0..len(ids)−1.

    `federation` is the inner backend's (whole) federation, which `ids` index. Closing the
    wrapper does not close `inner` (it may serve other subsets).
    """

    name = "subset"

    def __init__(self, inner: Backend, ids: np.ndarray | list[int]) -> None:
        super().__init__(inner.federation, inner.factory)
        self.inner = inner
        self.ids = np.asarray(ids, dtype=np.int64)
        self.local = {int(c): i for i, c in enumerate(self.ids.tolist())}
        if len(self.local) != len(self.ids):
            raise ValueError("SubsetBackend: client ids must be distinct")

    def execute(self, request: Asks[RE]) -> RE:
        reply = self.inner.execute(_renumber(request, lambda c: int(self.ids[c])))
        return _renumber(reply, lambda c: self.local[c])


def _renumber(message: M, to: Callable[[int], int]) -> M:
    """`message` with every client id c in its `clients` replaced by `to(c)`; in a compound
    message (`Steps`, `StepsReply`) also those of each part (the only other fields that name
    clients)."""
    msg: Any = message
    ids = np.array([to(int(c)) for c in np.asarray(msg.clients).tolist()], dtype=np.int64)
    parts = parts_of(msg)
    if parts is None:
        out: M = replace(msg, clients=ids)
    else:
        out = replace(msg, clients=ids, **{msg.nested: [_renumber(p, to) for p in parts]})
    return out


__all__ = ["SubsetBackend"]
