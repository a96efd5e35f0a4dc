"""The building blocks of the scenarios (`clusterfl.data.scenarios`): which source rows each
client gets (`Part`, `Pool`), how counts are drawn and split, and the `Plan` a scenario's
planner returns, which `assemble` turns into a `Federation` (rows gathered once, rotated and
relabelled identically in train and test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import torch

from clusterfl.data.codes import BYTE_SCALE, compact_inputs
from clusterfl.data.federation import Federation
from clusterfl.data.sources import Source
from clusterfl.data.transforms import apply_label_maps, rotate_each
from clusterfl.errors import ConfigError

# ====================================================================== partition primitives


class Part(NamedTuple):
    """Rows of a pool owned by each client: `index[offsets[i]:offsets[i+1]]` is client i's."""

    index: np.ndarray  # type: ignore[assignment]  # shadows tuple.index, never called on a Part
    offsets: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def owner(self) -> np.ndarray:
        """Client id of every entry of `index`."""
        return np.repeat(np.arange(len(self.offsets) - 1), self.sizes)


@dataclass(frozen=True)
class Pool:
    """One or more (x, y) tensor pairs seen as one table with rows numbered consecutively."""

    xs: tuple[torch.Tensor, ...]
    ys: tuple[torch.Tensor, ...]

    def __len__(self) -> int:
        return sum(len(y) for y in self.ys)

    @cached_property
    def labels(self) -> np.ndarray:
        return np.concatenate([y.numpy() for y in self.ys]).astype(np.int64)

    @cached_property
    def codes(self) -> Pool | None:
        """This pool with its inputs as uint8 codes (`clusterfl.data.codes`), when every
        input is exactly `code / 255` in float32 (8-bit images); None otherwise."""
        xs = [compact_inputs(x, torch.float32, BYTE_SCALE) for x in self.xs]
        if any(x is None for x in xs):
            return None
        return Pool(tuple(x for x in xs if x is not None), self.ys)

    def take(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the given rows (a new tensor, whatever the number of parts)."""
        if len(self.xs) == 1:
            idx = torch.from_numpy(rows)
            return self.xs[0][idx], self.ys[0][idx]
        x = self.xs[0].new_empty((len(rows), *self.xs[0].shape[1:]))
        y = self.ys[0].new_empty(len(rows))
        start = 0
        for xp, yp in zip(self.xs, self.ys):
            sel = np.flatnonzero((rows >= start) & (rows < start + len(yp)))
            local = torch.from_numpy(rows[sel] - start)
            x[torch.from_numpy(sel)] = xp[local]
            y[torch.from_numpy(sel)] = yp[local]
            start += len(yp)
        return x, y


def offsets_of(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def group_sizes(n: int, k: int) -> np.ndarray:
    """Sizes of k near-equal contiguous groups of n items (the first ones one larger)."""
    return np.array([n // k + (i < n % k) for i in range(k)], dtype=np.int64)


def client_groups(n_clients: int, n_groups: int) -> np.ndarray:
    """Cluster id of every client: contiguous, near-equal groups."""
    return np.repeat(np.arange(n_groups), group_sizes(n_clients, n_groups))


def equal_split(n_rows: int, n_clients: int, rng: np.random.Generator,
                per_client: int | None = None, what: str = "n_train_per_client") -> Part:
    """A random disjoint split of `n_rows` rows: equal shares, or `per_client` rows each."""
    perm = rng.permutation(n_rows)
    if per_client is None:
        return Part(perm, offsets_of(group_sizes(n_rows, n_clients)))
    if per_client * n_clients > n_rows:
        raise ConfigError(what, f"{per_client} x {n_clients} clients exceeds the {n_rows} rows "
                                "available")
    return Part(perm[: per_client * n_clients], np.arange(n_clients + 1) * per_client)


def class_counts(labels: np.ndarray, part: Part, n_classes: int) -> np.ndarray:
    """`[n_clients, n_classes]` number of rows of each class owned by each client."""
    n_clients = len(part.offsets) - 1
    flat = part.owner() * n_classes + labels[part.index]
    return np.bincount(flat, minlength=n_clients * n_classes).reshape(n_clients, n_classes)


def rows_from_counts(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> Part:
    """Give client i `counts[i, k]` distinct random rows of class k (rows shuffled per client)."""
    n_clients, n_classes = counts.shape
    by_class = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[by_class], np.arange(n_classes + 1))
    picks, owners = [], []
    for k in range(n_classes):
        need = int(counts[:, k].sum())
        if need == 0:
            continue
        pool = by_class[starts[k]:starts[k + 1]]
        if need > len(pool):
            raise ValueError(f"class {k}: {need} rows requested, {len(pool)} available")
        picks.append(rng.permutation(pool)[:need])
        owners.append(np.repeat(np.arange(n_clients), counts[:, k]))
    index = np.concatenate(picks) if picks else np.zeros(0, np.int64)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    order = np.lexsort((rng.random(len(index)), owner))
    return Part(index[order].astype(np.int64), offsets_of(counts.sum(axis=1)))


def proportional_counts(weights: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Split `totals[k]` over clients proportionally to integer `weights[:, k]` (exact).

    Largest-remainder rounding in integer arithmetic; a class nobody weights stays unused.
    """
    w = weights.astype(np.int64)
    col = w.sum(axis=0)
    safe = np.maximum(col, 1)
    scaled = w * totals[None, :]
    base = scaled // safe
    frac = scaled % safe  # remainders share the denominator within a column
    rem = np.where(col > 0, totals - base.sum(axis=0), 0)
    order = np.argsort(-frac, axis=0, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(len(w))[:, None], w.shape), axis=0)
    return base + (rank < rem[None, :])


def split_by_proportions(proportions: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Counts `[n_clients, K]` from per-class proportions `[K, n_clients]` (floored cumsum)."""
    bounds = np.floor(np.cumsum(proportions, axis=1) * totals[:, None]).astype(np.int64)
    bounds = np.minimum(bounds, totals[:, None])
    bounds[:, -1] = totals
    return np.diff(bounds, axis=1, prepend=0).T


def ensure_min_total(counts: np.ndarray, minimum: int | np.ndarray, what: str) -> np.ndarray:
    """Top up rows whose total is below `minimum` with samples of the largest rows.

    The donor is the row with most spare samples, the class moved its most frequent one. Loops
    over deficient rows only (a handful), never over samples.
    """
    counts = counts.copy()
    need_min = np.broadcast_to(np.asarray(minimum, dtype=np.int64), (len(counts),))
    totals = counts.sum(axis=1)
    for i in np.flatnonzero(totals < need_min):
        while totals[i] < need_min[i]:
            spare = totals - need_min
            spare[i] = -1
            j = int(np.argmax(spare))
            if spare[j] <= 0:
                raise ConfigError(what, f"not enough samples to give every client at least "
                                        f"{need_min[i]}; use fewer clients or a smaller minimum")
            k = int(np.argmax(counts[j]))
            move = int(min(need_min[i] - totals[i], counts[j, k], spare[j]))
            counts[j, k] -= move
            counts[i, k] += move
            totals[j] -= move
            totals[i] += move
    return counts


def ensure_one_test(test_counts: np.ndarray, train_counts: np.ndarray) -> np.ndarray:
    """Give every client without test rows one, of a class it trains on, from a richer client."""
    counts = test_counts.copy()
    totals = counts.sum(axis=1)
    for i in np.flatnonzero(totals == 0):
        for k in np.argsort(-train_counts[i], kind="stable"):
            if train_counts[i, k] == 0:
                break
            donors = np.where(totals >= 2, counts[:, k], 0)
            j = int(np.argmax(donors))
            if donors[j] > 0:
                counts[j, k] -= 1
                counts[i, k] += 1
                totals[j] -= 1
                totals[i] += 1
                break
    if np.any(totals == 0):
        raise ConfigError("n_clients", f"client {int(np.argmin(totals))} would get no test "
                                       f"sample of its classes (the test split has "
                                       f"{int(totals.sum())} rows for {len(totals)} clients); "
                                       "use fewer clients")
    return counts


def matched_test(test_labels: np.ndarray, train_counts: np.ndarray,
                 rng: np.random.Generator, train_totals: np.ndarray | None = None) -> Part:
    """Disjoint test shares with each client's class proportions (its own held-out share).

    Every test row of a class is shared among the clients holding the class, in proportion to
    their training rows of it. With `train_totals` (the source's training rows per class, for
    a scenario that leaves rows unused), only the share of the class's test rows that its
    used training rows make (rounded) is: then a client's test mix follows its training mix
    also when the classes are used unevenly (otherwise a class few clients use hands them all
    of its test rows)."""
    k = train_counts.shape[1]
    available = np.bincount(test_labels, minlength=k)[:k]
    if train_totals is not None:
        used, total = train_counts.sum(axis=0), np.maximum(train_totals[:k], 1)
        available = np.minimum(available, (available * used + total // 2) // total)
    counts = proportional_counts(train_counts, available)
    return rows_from_counts(test_labels, ensure_one_test(counts, train_counts), rng)


# ====================================================================== plan and assembly


@dataclass
class Plan:
    """What each client gets: pool rows per split, per-row angles, per-client label maps."""

    train_pool: Pool
    train: Part
    test_pool: Pool
    test: Part
    clusters: np.ndarray | None
    cluster_info: list[dict[str, Any]] = field(default_factory=list)
    train_angles: np.ndarray | None = None
    test_angles: np.ndarray | None = None
    label_maps: np.ndarray | None = None  # [n_clients, n_classes]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.train.offsets) - 1


def _materialize(pool: Pool, part: Part, angles: np.ndarray | None,
                 maps: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = pool.take(part.index)
    if angles is not None and np.any(angles != 0):
        x = rotate_each(x, angles)
    if maps is not None:
        y = apply_label_maps(y, maps, part.owner())
    return x, y


def check_plan(plan: Plan) -> None:
    """Every client has ≥1 train and ≥1 test row, else a ConfigError naming the cause."""
    for split, part in (("train", plan.train), ("test", plan.test)):
        empty = np.flatnonzero(part.sizes == 0)
        if len(empty):
            raise ConfigError("n_clients", f"{len(empty)} of {plan.n_clients} clients (e.g. "
                                           f"client {empty[0]}) would get no {split} sample; "
                                           "use fewer clients or more samples per client")


def _byte_pools(plan: Plan) -> tuple[Pool, Pool] | None:
    """The plan's pools as uint8 codes, when the federation can keep its inputs so exactly:
    8-bit inputs, and every rotation a multiple of 90° (`rot90` moves codes; any other angle
    resamples into values that are no longer codes)."""
    for angles in (plan.train_angles, plan.test_angles):
        if angles is not None and not bool(np.all(np.mod(angles, 90.0) == 0.0)):
            return None
    train, test = plan.train_pool.codes, plan.test_pool.codes
    return None if train is None or test is None else (train, test)


def assemble(plan: Plan, source: Source, name: str, meta: dict[str, Any]) -> Federation:
    """Gather the planned rows, rotate and relabel them, and wrap them in a Federation. 8-bit
    inputs stay uint8 codes where that is exact (`_byte_pools`, `Federation.x_scale`): the
    same inputs bit for bit, a quarter of the memory."""
    coded = _byte_pools(plan)
    train_pool, test_pool = coded if coded is not None else (plan.train_pool, plan.test_pool)
    x_tr, y_tr = _materialize(train_pool, plan.train, plan.train_angles, plan.label_maps)
    x_te, y_te = _materialize(test_pool, plan.test, plan.test_angles, plan.label_maps)
    return Federation(
        x_train=x_tr, y_train=y_tr, train_offsets=plan.train.offsets,
        x_test=x_te, y_test=y_te, test_offsets=plan.test.offsets,
        clusters=plan.clusters, n_classes=source.n_classes, task=source.task, name=name,
        meta={**meta, "clusters": plan.cluster_info, **plan.extra},
        x_scale=None if coded is None else BYTE_SCALE,
    )


def source_pools(source: Source) -> tuple[Pool, Pool]:
    return Pool((source.x_train,), (source.y_train,)), Pool((source.x_test,), (source.y_test,))


def per_row(per_client: np.ndarray, part: Part) -> np.ndarray:
    return per_client[part.owner()]
