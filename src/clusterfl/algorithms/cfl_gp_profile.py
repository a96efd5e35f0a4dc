"""CFL-GP's gradient profile (Kim, Kim & de Veciana, ICML 2024, Alg. 1 lines 5–9), as plain
functions of their inputs: who the clustering reads, how often each client was asked for
each block, and the running mean of the blocks asked (`clusterfl.algorithms.cfl_gp` uses
them; tests/algorithms/test_cfl_gp_steps.py checks them with hand values).

The profile is a `[C, K, d̂]` tensor: block k of client c is g_{c,k}, the running mean of
the vectors (gradients or model gaps, d̂ coordinates) client c sent at model θ_k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clusterfl.engine.allocator import lazy_zeros
from clusterfl.protocol import GradientRequest, TrainReply, TrainRequest, narrow, positions_of

#: profile rows updated (or copied) at a time: bounds the temporaries of an update
ROW_CHUNK = 128


def feature_columns(width: int, d: int, feature_index: torch.Tensor) -> torch.Tensor | None:
    """The columns of `width`-wide client vectors that are the features: whole vectors
    (`width` = d) are subsampled at the feature index (None when it is every coordinate);
    replies already narrowed on the wire (d̂ wide) are the features as they are (None)."""
    if width == d:
        every = len(feature_index) == d and torch.equal(
            feature_index, torch.arange(d, device=feature_index.device))
        return None if every else feature_index
    if width != len(feature_index):
        raise ValueError(f"client vectors of width {width}: expected {d} or "
                         f"{len(feature_index)}")
    return None


@dataclass(frozen=True)
class Rows:
    """Rows `index` of `table` at `columns` (None: every column), read a slice at a time: the
    features of some clients' vectors without a copy of all of them (`rows[a:b]` copies those
    rows only; the values are those of `table[index][:, columns]`)."""

    table: torch.Tensor
    index: np.ndarray
    columns: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, part: slice) -> torch.Tensor:
        rows = self.table.index_select(0, torch.from_numpy(self.index[part]).to(
            self.table.device))
        return rows if self.columns is None else rows[:, self.columns]


@dataclass
class Probe:
    """One block's update in a clustering round (`CFLGP._probe`): the block, the clients
    asked for it (sorted), those that answered, and their features (one row each, in `who`
    order: one tensor, or consecutive pieces of it, so that they need not be copied into
    one; a piece may be `Rows` of a larger table, read `ROW_CHUNK` rows at a time)."""

    block: int
    asked: np.ndarray
    who: np.ndarray
    rows: torch.Tensor | Rows | tuple[torch.Tensor | Rows, ...]

    def pieces(self) -> list[tuple[int, torch.Tensor | Rows]]:
        """`(start in who, rows)` of each piece of `rows`."""
        parts = self.rows if isinstance(self.rows, tuple) else (self.rows,)
        out: list[tuple[int, torch.Tensor | Rows]] = []
        start = 0
        for part in parts:
            out.append((start, part))
            start += len(part)
        return out


@dataclass(frozen=True)
class ProbeAsk:
    """One block asked for in a clustering round (`CFLGP._probe_plan`): who is asked, and
    the request to those of them not in the block's cluster (None when there are none)."""

    block: int
    asked: np.ndarray
    request: GradientRequest | TrainRequest | None


def profiled_clients(asked: np.ndarray) -> np.ndarray:
    """`[C]` bool: the clients the clustering reads — those asked for every block that any
    client was asked for (`asked[c, k]`: how often client c was asked for block k)."""
    ever = asked > 0
    return np.asarray((ever | ~ever.any(axis=0)).all(axis=1))


def update_profile(features: torch.Tensor, probes: list[Probe], betas: list[np.ndarray],
                   filled: np.ndarray | None = None) -> torch.Tensor:
    """Alg. 1 lines 8–9 on the `[C, K, d̂]` profile: for each probe, block k of every client c
    that answered becomes g_{c,k} := (1 − β_c) g_{c,k} + β_c v_c (v_c its row of the probe,
    β_c its entry of `betas`, one per client *asked*, in `probe.asked` order); a client asked
    but silent keeps its block. Returns a new profile, on the device of `features` (the host,
    where the rows of a GPU's replies come `ROW_CHUNK` at a time).

    `filled` (`[C, K]` bool, optional): the cells that may hold anything but zeros (those
    asked before). The new profile is then a `lazy_zeros` table into which only those cells
    are copied: cells nobody was asked for cost no memory in either profile. Without it, a
    plain copy. The values are the same either way; rows are updated `ROW_CHUNK` at a time
    (the same arithmetic, element by element)."""
    if filled is None:
        out = features.clone()
    else:
        out = lazy_zeros(tuple(features.shape), features.dtype)
        for k in range(features.shape[1]):
            cells = np.flatnonzero(filled[:, k])
            for a in range(0, len(cells), ROW_CHUNK):
                part = cells[a : a + ROW_CHUNK]
                span = _span(part)
                if span is not None:  # consecutive rows: a slice, no index copies
                    out[span, k] = features[span, k]
                else:
                    idx = torch.from_numpy(part)
                    out[idx, k] = features[idx, k]
    for probe, beta in zip(probes, betas, strict=True):
        block = out[:, probe.block]
        uniform = len(np.unique(beta)) == 1  # one β (always with every client sampled)
        where = np.searchsorted(probe.asked, probe.who)
        for start, piece in probe.pieces():
            for a in range(0, len(piece), ROW_CHUNK):
                b = min(len(piece), a + ROW_CHUNK)
                who = probe.who[start + a : start + b]
                new = piece[a:b].to(block.device, block.dtype)  # a GPU's rows: to the host
                keep: float | torch.Tensor
                take: float | torch.Tensor
                if uniform:
                    keep, take = 1.0 - float(beta[0]), float(beta[0])
                else:
                    w = torch.from_numpy(beta[where[start + a : start + b]])[:, None]
                    keep, take = (1.0 - w).to(block.dtype), w.to(block.dtype)
                span = _span(who)
                if span is not None:  # in place on the new table's rows (the same values)
                    block[span].mul_(keep).add_(take * new)
                else:
                    rows = torch.from_numpy(who)
                    block[rows] = keep * block[rows] + take * new
    return out


def _span(rows: np.ndarray) -> slice | None:
    """`rows` as a slice when they are consecutive and increasing (one answer in client
    order: every client of a round that asks everyone), else None."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 \
            and (len(rows) == 1 or bool((np.diff(rows) == 1).all())):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return None


def model_gaps(request: TrainRequest, reply: TrainReply) -> torch.Tensor:
    """The model gaps θ' − θ_start of the clients that answered (Alg. 4; narrowed to the
    request's `coords` like the reply), computed in the reply's own rows, `ROW_CHUNK` at a
    time: a reply is read once, and a second `[n, d]` table (of gaps, or of the start
    models) would double the largest thing a round holds (1 GB at 10,000 MLP clients)."""
    params = reply.params
    which = np.asarray(request.model_of_client, dtype=np.int64)
    which = which[positions_of(request, reply.clients)]
    for a in range(0, len(which), ROW_CHUNK):
        start = request.models[torch.from_numpy(which[a : a + ROW_CHUNK])]
        params[a : a + ROW_CHUNK].sub_(narrow(start, request.coords))
    return params


def count_asks(asked: np.ndarray, blocks: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """`asked` (`[C, K]` counts) after asking the clients `who` for `block`, for each
    `(block, who)` of `blocks` (a client is asked at most once per block and round)."""
    out = asked.copy()
    for block, who in blocks:
        out[who, block] += 1
    return out


__all__ = ["Probe", "ProbeAsk", "Rows", "count_asks", "feature_columns", "model_gaps",
           "profiled_clients", "update_profile"]
