"""Scenario registry: recipes that cut a `Source` into a `Federation` with true cluster ids.

Each scenario is a pydantic parameter class plus a *planner* that decides, with numpy only, which
source rows every client gets (train and test), the rotation of every row and the label map of
every client. `assemble` then gathers the tensors once and applies the transforms, identically
to train and test rows, so each client's test data follows its own training distribution.

| scenario            | paper                                   | true clusters            |
|---------------------|-----------------------------------------|--------------------------|
| `iid`               | sanity baseline                         | one (all zero)           |
| `label_swap`        | CFL (Sattler et al.) §V-A               | one swapped pair each    |
| `label_permutation` | CFL §V-C, eq. (48)-(49)                 | one permutation each     |
| `rotation`          | CFL-GP (Kim et al.) §5.2, F.5; IFCA     | one angle each           |
| `rotation_mixture`  | CFL-GP §5.2, F.5.2                      | 0°, 180°, κ-mixture      |
| `dirichlet`         | CAM (Ma et al.) §5, Hsu et al. 2019     | none                     |
| `cluster_dirichlet` | CAM §5                                  | Dir(α1) over clusters    |
| `n_class`           | CAM §5, McMahan et al.                  | none                     |
| `cluster_n_class`   | CAM §5                                  | n1 classes per cluster   |
| `cluster_labels`    | FLT (Jamali-Rad et al.) §4.2 sc. 1-2    | label set per cluster    |
| `power_law`         | FLT Appendix C.4, Algorithm 4           | label set per cluster    |
| `linear_regression` | CFL-GP §5.1, F.4                        | one slope angle each     |
| `label_shift_half`  | CFL-GP F.7                              | shifted / not shifted    |
| `cluster_partitioner` | Flower Datasets partitioners          | one angle each           |

Clients of a cluster are contiguous (client i of C belongs to cluster ⌊i·K/C⌋ for K clusters
of near-equal size). Every client gets at least one training and one test sample, or a
`ConfigError` says which parameter makes that impossible. The same (source, scenario, params,
seed) always gives the same federation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from scipy.optimize import brentq

from clusterfl.data.federation import Federation
from clusterfl.data.sources import IMAGE_SOURCES, Source, load_source
from clusterfl.data.transforms import (
    apply_label_maps,
    distinct_permutations,
    rotate_each,
    shift_map,
    swap_pairs,
)
from clusterfl.errors import ConfigError

IFCA_ANGLES: tuple[float, ...] = (0.0, 90.0, 180.0, 270.0)
"""The four rotations of IFCA (Ghosh et al. 2020), also CFL-GP Appendix F.5.1 (Fig. 13)."""

CFLGP_ANGLES: tuple[float, ...] = (0.0, 15.0, 90.0, 105.0, 180.0, 195.0, 270.0, 275.0)
"""The eight rotations of CFL-GP's rotated MNIST as the authors' released code sets them.

The paper is inconsistent: §5.2 lists 0, 15, 90, 105, 180, 195, 270, 275 while Appendix F.5
lists 0, 15, 90, 105, 180, 185, 270, 285. We follow the code (identical to §5.2).
"""

ROTATION_PRESETS: dict[str, tuple[float, ...]] = {"ifca": IFCA_ANGLES, "cflgp": CFLGP_ANGLES}


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
                 rng: np.random.Generator) -> Part:
    """Disjoint test shares with each client's class proportions (its own held-out share)."""
    available = np.bincount(test_labels, minlength=train_counts.shape[1])
    counts = proportional_counts(train_counts, available[: train_counts.shape[1]])
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


def assemble(plan: Plan, source: Source, name: str, meta: dict[str, Any]) -> Federation:
    """Gather the planned rows, rotate and relabel them, and wrap them in a Federation."""
    x_tr, y_tr = _materialize(plan.train_pool, plan.train, plan.train_angles, plan.label_maps)
    x_te, y_te = _materialize(plan.test_pool, plan.test, plan.test_angles, plan.label_maps)
    return Federation(
        x_train=x_tr, y_train=y_tr, train_offsets=plan.train.offsets,
        x_test=x_te, y_test=y_te, test_offsets=plan.test.offsets,
        clusters=plan.clusters, n_classes=source.n_classes, task=source.task, name=name,
        meta={**meta, "clusters": plan.cluster_info, **plan.extra},
    )


def _pools(source: Source) -> tuple[Pool, Pool]:
    return Pool((source.x_train,), (source.y_train,)), Pool((source.x_test,), (source.y_test,))


def _per_row(per_client: np.ndarray, part: Part) -> np.ndarray:
    return per_client[part.owner()]


# ====================================================================== parameters


class ScenarioParams(BaseModel):
    """Fields shared by every scenario."""

    model_config = ConfigDict(extra="forbid")

    n_clients: int = Field(20, ge=1, description="number of clients")
    holdout: float | None = Field(
        None, ge=0.0, lt=1.0, description="share of the clients kept out of training, "
        "stratified by true cluster and seeded, placed and evaluated after the run "
        "(default: none)")


class _SizeParams(ScenarioParams):
    n_train_per_client: int | None = Field(
        None, ge=1, description="training rows per client (default: an equal share of all)")
    n_test_per_client: int | None = Field(
        None, ge=1, description="test rows per client (default: an equal share of all)")


class IidParams(_SizeParams):
    """Equal random split, no cluster structure (sanity baseline)."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(10, ge=1)


class LabelSwapParams(_SizeParams):
    """CFL §V-A: M=20 clients, K=4 clusters, each cluster swaps one pair of labels."""

    model_config = ConfigDict(extra="forbid")
    n_clusters: int = Field(4, ge=1)
    pairs: list[tuple[int, int]] | None = Field(
        None, description="one label pair per cluster (default: random disjoint pairs)")


class LabelPermutationParams(_SizeParams):
    """CFL §V-C: each cluster applies its own random permutation P_c to all labels."""

    model_config = ConfigDict(extra="forbid")
    n_clusters: int = Field(4, ge=1)


class LabelShiftHalfParams(_SizeParams):
    """CFL-GP F.7: a fraction of the clients maps y → (y + shift) mod n_classes."""

    model_config = ConfigDict(extra="forbid")
    shift: int | None = Field(None, description="default n_classes // 2 (5 for 10 classes)")
    shifted_fraction: float = Field(0.5, gt=0.0, lt=1.0)


class _RotationLayoutParams(_SizeParams):
    layout: Literal["split", "cflgp"] = Field(
        "split", description="'split': disjoint parts of train and of test; 'cflgp': the "
        "CFL-GP authors' merged, contiguous blocks with a per-client train/test cut")
    train_fraction: float = Field(0.7, gt=0.0, lt=1.0, description="layout 'cflgp' only")


class RotationParams(_RotationLayoutParams):
    """CFL-GP §5.2 / F.5 and IFCA: each group of clients rotates its images by one angle."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(32, ge=1)
    angles: list[float] = Field(
        default_factory=lambda: list(IFCA_ANGLES),
        description="degrees, one per cluster, or a preset name: 'ifca' or 'cflgp'")

    @field_validator("angles", mode="before")
    @classmethod
    def _preset(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in ROTATION_PRESETS:
                raise ValueError(f"unknown preset {value!r}; use {', '.join(ROTATION_PRESETS)} "
                                 "or a list of angles")
            return list(ROTATION_PRESETS[value])
        return value

    @field_validator("angles")
    @classmethod
    def _nonempty(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("needs at least one angle")
        return value


class RotationMixtureParams(_RotationLayoutParams):
    """CFL-GP F.5.2: groups at angle a, at angle b, and a group mixing a (prob. κ) and b."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(12, ge=3)
    kappa: float = Field(0.5, ge=0.0, le=1.0, description="probability of the first angle")
    angles: tuple[float, float] = (0.0, 180.0)


class ClusterPartitionerParams(RotationParams):
    """Clusters as in `rotation` (one angle each); a Flower Datasets partitioner splits each
    cluster's share of the samples among its clients (`clusterfl.data.partitioners`)."""

    angles: list[float] = Field(
        default_factory=lambda: [0.0, 180.0],
        description="degrees, one per cluster, or a preset name: 'ifca' or 'cflgp'")
    partitioner: Literal["iid", "dirichlet", "shard", "pathological", "linear", "square",
                         "exponential"] = Field(
        "iid", description="the flwr_datasets partitioner used inside each cluster")
    options: dict[str, Any] = Field(
        default_factory=dict, description="its keyword arguments, e.g. {alpha = 0.5} "
        "(partition_by defaults to the labels, seed to the run's)")


class DirichletParams(ScenarioParams):
    """CAM §5 (Hsu et al.): per class, Dir(α) proportions over the clients."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    alpha: float = Field(0.1, gt=0.0)
    min_samples: int = Field(1, ge=1, description="minimum training rows per client")


class ClusterDirichletParams(ScenarioParams):
    """CAM §5: per class Dir(α1) over clusters, then Dir(α2) over each cluster's clients."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    n_clusters: int = Field(5, ge=1)
    alpha1: float = Field(0.1, gt=0.0)
    alpha2: float = Field(10.0, gt=0.0)
    min_samples: int = Field(1, ge=1, description="minimum training rows per client")


class NClassParams(ScenarioParams):
    """CAM §5 (McMahan et al.): each client draws n random classes."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    n: int = Field(2, ge=1)
    samples_per_client: int | None = Field(
        None, ge=1, description="split evenly over the client's classes (default: each class's "
        "rows shared equally among the clients holding it)")


class ClusterNClassParams(ScenarioParams):
    """CAM §5: each cluster gets n1 classes, each client n2 of its cluster's classes."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    n_clusters: int = Field(5, ge=1)
    n1: int = Field(3, ge=1)
    n2: int = Field(2, ge=1)
    samples_per_client: int | None = Field(None, ge=1)


class _LabelSetParams(ScenarioParams):
    n_clients: int = Field(100, ge=1)
    n_clusters: int = Field(5, ge=1)
    label_sets: Literal["disjoint", "overlapping"] = Field(
        "disjoint", description="FLT scenario 1 (disjoint) or 2 (neighbours share a label)")
    classes_per_cluster: int | None = Field(
        None, ge=1, description="default 2 (disjoint) or 3 (overlapping)")
    class_sets: list[list[int]] | None = Field(
        None, description="explicit label set of every cluster (overrides the two above)")


class ClusterLabelsParams(_LabelSetParams):
    """FLT §4.2 scenarios 1-2: fixed label sets per cluster, equal samples per client."""

    model_config = ConfigDict(extra="forbid")
    samples_per_client: int | None = Field(
        None, ge=1, description="default: the most every client can get (600 on MNIST)")


class PowerLawParams(_LabelSetParams):
    """FLT Appendix C.4, Algorithm 4: label sets per cluster + α + e^(β m^δ) samples."""

    model_config = ConfigDict(extra="forbid")
    alpha: int = Field(10, ge=0, description="minimum samples per client (the paper's α)")
    delta: float = Field(0.5, gt=0.0, le=4.0, description="power exponent δ")


class LinearRegressionParams(ScenarioParams):
    """CFL-GP §5.1 / F.4: y = x tan φ_k + N(0, σ²), x ~ U(0, cos φ_k)."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(12, ge=1)
    n_clusters: int = Field(3, ge=1)
    delta_phi: float = Field(20.0, gt=0.0, lt=90.0, description="Δφ in degrees")
    angles: list[float] | None = Field(
        None, description="φ_k in degrees (default: evenly spaced from +Δφ to −Δφ)")
    samples_per_client: int = Field(10, ge=1, description="the paper's b")
    test_samples_per_client: int = Field(100, ge=1)
    noise_std: float = Field(0.2, ge=0.0)


# ====================================================================== planners: label maps


def _sized_split(source: Source, p: _SizeParams, rng: np.random.Generator) -> tuple[Part, Part]:
    train = equal_split(len(source.y_train), p.n_clients, rng, p.n_train_per_client)
    test = equal_split(len(source.y_test), p.n_clients, rng, p.n_test_per_client,
                       "n_test_per_client")
    return train, test


def _label_map_plan(source: Source, p: _SizeParams, clusters: np.ndarray,
                    cluster_maps: np.ndarray, rng: np.random.Generator,
                    info: list[dict[str, Any]]) -> Plan:
    train, test = _sized_split(source, p, rng)
    train_pool, test_pool = _pools(source)
    for i, m in enumerate(cluster_maps):
        info[i]["label_map"] = m.tolist()
    return Plan(train_pool, train, test_pool, test, clusters, info,
                label_maps=cluster_maps[clusters])


def _need_clusters(n_clusters: int, n_clients: int) -> None:
    if n_clusters > n_clients:
        raise ConfigError("n_clusters", f"{n_clusters} clusters need at least as many clients "
                                        f"(n_clients = {n_clients})")


def plan_iid(source: Source, p: IidParams, rng: np.random.Generator) -> Plan:
    """Equal random split; one distribution, so every client is in cluster 0."""
    train, test = _sized_split(source, p, rng)
    train_pool, test_pool = _pools(source)
    return Plan(train_pool, train, test_pool, test, np.zeros(p.n_clients, np.int64), [{}])


def plan_label_swap(source: Source, p: LabelSwapParams, rng: np.random.Generator) -> Plan:
    """CFL §V-A "label-swap augmentation": cluster c exchanges labels a_c ↔ b_c everywhere."""
    _need_clusters(p.n_clusters, p.n_clients)
    k = source.n_classes
    if p.pairs is not None:
        if len(p.pairs) != p.n_clusters:
            raise ConfigError("pairs", f"give one pair per cluster ({p.n_clusters}), "
                                       f"got {len(p.pairs)}")
        pairs = [tuple(pair) for pair in p.pairs]
    else:
        if 2 * p.n_clusters > k:
            raise ConfigError("n_clusters", f"{p.n_clusters} disjoint label pairs need "
                                            f"{2 * p.n_clusters} classes, the data has {k}")
        perm = rng.permutation(k)[: 2 * p.n_clusters].reshape(-1, 2)
        pairs = [(int(a), int(b)) for a, b in perm]
    try:
        maps = np.stack([swap_pairs([pair], k) for pair in pairs])
    except ValueError as exc:
        raise ConfigError("pairs", str(exc)) from None
    info = [{"swap": list(pair)} for pair in pairs]
    return _label_map_plan(source, p, client_groups(p.n_clients, p.n_clusters), maps, rng, info)


def plan_label_permutation(source: Source, p: LabelPermutationParams,
                           rng: np.random.Generator) -> Plan:
    """CFL §V-C, eq. (48)-(49): cluster c relabels y → P_c(y) in train and test."""
    _need_clusters(p.n_clusters, p.n_clients)
    if p.n_clusters > math.factorial(min(source.n_classes, 20)):
        raise ConfigError("n_clusters", f"only {math.factorial(source.n_classes)} distinct "
                                        f"permutations of {source.n_classes} labels")
    maps = distinct_permutations(p.n_clusters, source.n_classes, rng)
    info: list[dict[str, Any]] = [{} for _ in range(p.n_clusters)]
    return _label_map_plan(source, p, client_groups(p.n_clients, p.n_clusters), maps, rng, info)


def plan_label_shift_half(source: Source, p: LabelShiftHalfParams,
                          rng: np.random.Generator) -> Plan:
    """CFL-GP F.7: the last `shifted_fraction` of the clients use y → (y + 5) mod 10."""
    shift = source.n_classes // 2 if p.shift is None else p.shift
    if shift % source.n_classes == 0:
        raise ConfigError("shift", f"shift {shift} leaves {source.n_classes} labels unchanged")
    n_shifted = round(p.shifted_fraction * p.n_clients)
    if not 0 < n_shifted < p.n_clients:
        raise ConfigError("shifted_fraction", f"gives {n_shifted} of {p.n_clients} shifted "
                                              "clients; both groups must be non-empty")
    clusters = (np.arange(p.n_clients) >= p.n_clients - n_shifted).astype(np.int64)
    maps = np.stack([np.arange(source.n_classes), shift_map(source.n_classes, shift)])
    info: list[dict[str, Any]] = [{"shift": 0}, {"shift": shift}]
    return _label_map_plan(source, p, clusters, maps, rng, info)


# ====================================================================== planners: rotations


def _cflgp_layout(source: Source, n_clients: int, n_blocks: int, train_fraction: float,
                  rng: np.random.Generator) -> tuple[Pool, Part, Part]:
    """The CFL-GP authors' construction (DESIGN §5): train+test merged in order, cut into
    `n_blocks` contiguous blocks, each cut into contiguous client slices, each slice split
    at random into `train_fraction` train / rest test."""
    if n_clients % n_blocks:
        raise ConfigError("n_clients", f"layout 'cflgp' needs n_clients divisible by the number "
                                       f"of groups ({n_blocks}), got {n_clients}")
    pool = Pool((source.x_train, source.x_test), (source.y_train, source.y_test))
    per_block = n_clients // n_blocks
    sizes = np.concatenate([group_sizes(int(b), per_block)
                            for b in group_sizes(len(pool), n_blocks)])
    if sizes.min() < 2:
        raise ConfigError("n_clients", f"{n_clients} clients leave fewer than 2 rows to some "
                                       "client; use fewer clients")
    n_train = np.clip(np.floor(train_fraction * sizes + 0.5).astype(np.int64), 1, sizes - 1)
    owner = np.repeat(np.arange(n_clients), sizes)
    order = np.lexsort((rng.random(len(owner)), owner))  # by client, random inside
    position = np.arange(len(owner)) - offsets_of(sizes)[owner]
    is_train = position < n_train[owner]
    train = Part(order[is_train], offsets_of(n_train))
    test = Part(order[~is_train], offsets_of(sizes - n_train))
    return pool, train, test


def _rotation_parts(source: Source, p: _RotationLayoutParams, n_groups: int,
                    rng: np.random.Generator) -> tuple[Pool, Part, Pool, Part]:
    if p.layout == "split":
        train, test = _sized_split(source, p, rng)
        train_pool, test_pool = _pools(source)
        return train_pool, train, test_pool, test
    for name in ("n_train_per_client", "n_test_per_client"):
        if getattr(p, name) is not None:
            raise ConfigError(name, "not used by layout 'cflgp' (sizes follow from the blocks)")
    pool, train, test = _cflgp_layout(source, p.n_clients, n_groups, p.train_fraction, rng)
    return pool, train, pool, test


def plan_rotation(source: Source, p: RotationParams, rng: np.random.Generator) -> Plan:
    """CFL-GP §5.2 / F.5 (IFCA's rotated MNIST): cluster j rotates all its images by angle j."""
    n_groups = len(p.angles)
    _need_clusters(n_groups, p.n_clients)
    clusters = client_groups(p.n_clients, n_groups)
    train_pool, train, test_pool, test = _rotation_parts(source, p, n_groups, rng)
    angles = np.asarray(p.angles, dtype=np.float64)[clusters]
    return Plan(train_pool, train, test_pool, test, clusters,
                [{"angle": a} for a in p.angles],
                train_angles=_per_row(angles, train), test_angles=_per_row(angles, test),
                extra={"layout": p.layout})


def plan_rotation_mixture(source: Source, p: RotationMixtureParams,
                          rng: np.random.Generator) -> Plan:
    """CFL-GP F.5.2: clusters at angles[0], at angles[1], and a mixture cluster whose every
    sample (train and test) is rotated by angles[0] with probability κ, else angles[1]."""
    clusters = client_groups(p.n_clients, 3)
    train_pool, train, test_pool, test = _rotation_parts(source, p, 3, rng)
    a, b = p.angles

    def row_angles(part: Part) -> np.ndarray:
        group = clusters[part.owner()]
        first = rng.random(len(group)) < p.kappa
        mixed = np.where(first, a, b)
        return np.select([group == 0, group == 1], [a, b], mixed).astype(np.float64)

    info: list[dict[str, Any]] = [
        {"angle": a}, {"angle": b},
        {"angles": [a, b], "probabilities": [p.kappa, 1.0 - p.kappa]}]
    return Plan(train_pool, train, test_pool, test, clusters, info,
                train_angles=row_angles(train), test_angles=row_angles(test),
                extra={"layout": p.layout})


def plan_cluster_partitioner(source: Source, p: ClusterPartitionerParams,
                             rng: np.random.Generator) -> Plan:
    """Rotation clusters, each split among its clients by a Flower Datasets partitioner
    (`clusterfl.data.partitioners`, which imports `flwr_datasets` only when used): each
    cluster gets a disjoint near-equal random share of the training rows; test rows follow
    each client's training label proportions."""
    from clusterfl.data.partitioners import flower_split

    n_groups = len(p.angles)
    _need_clusters(n_groups, p.n_clients)
    clusters = client_groups(p.n_clients, n_groups)
    train_pool, test_pool = _pools(source)
    shares = np.array_split(rng.permutation(len(train_pool)), n_groups)
    rows: list[np.ndarray] = []
    for g, share in enumerate(shares):
        members = int(np.sum(clusters == g))
        seed = int(rng.integers(0, 2**31 - 1))
        parts = flower_split(train_pool.labels[share], members, p.partitioner, p.options, seed)
        rows += [share[pos] for pos in parts]
    train = Part(np.concatenate(rows), offsets_of(np.array([len(r) for r in rows])))
    test = matched_test(test_pool.labels, class_counts(train_pool.labels, train,
                                                       source.n_classes), rng)
    angles = np.asarray(p.angles, dtype=np.float64)[clusters]
    return Plan(train_pool, train, test_pool, test, clusters, [{"angle": a} for a in p.angles],
                train_angles=_per_row(angles, train), test_angles=_per_row(angles, test),
                extra={"partitioner": p.partitioner})


# ====================================================================== planners: label skew


def _counts_plan(source: Source, counts: np.ndarray, clusters: np.ndarray | None,
                 info: list[dict[str, Any]], rng: np.random.Generator,
                 extra: dict[str, Any] | None = None) -> Plan:
    """Train rows drawn per the count matrix, test rows matched to each client's classes."""
    train_pool, test_pool = _pools(source)
    train = rows_from_counts(train_pool.labels, counts, rng)
    test = matched_test(test_pool.labels, counts, rng)
    return Plan(train_pool, train, test_pool, test, clusters, info, extra=extra or {})


def _class_totals(source: Source) -> np.ndarray:
    return np.bincount(source.y_train.numpy(), minlength=source.n_classes)[: source.n_classes]


def plan_dirichlet(source: Source, p: DirichletParams, rng: np.random.Generator) -> Plan:
    """CAM §5 client-wise non-IID (Hsu et al. 2019): for every class, proportions over the
    clients ~ Dir(α·1). Clients left below `min_samples` are topped up from the largest ones."""
    totals = _class_totals(source)
    proportions = rng.dirichlet(np.full(p.n_clients, p.alpha), size=source.n_classes)
    counts = split_by_proportions(proportions, totals)
    counts = ensure_min_total(counts, p.min_samples, "min_samples")
    return _counts_plan(source, counts, None, [], rng)


def plan_cluster_dirichlet(source: Source, p: ClusterDirichletParams,
                           rng: np.random.Generator) -> Plan:
    """CAM §5 cluster-wise non-IID: per class Dir(α1) over clusters, then per class and
    cluster Dir(α2) over that cluster's clients (m/K clients each)."""
    _need_clusters(p.n_clusters, p.n_clients)
    members = group_sizes(p.n_clients, p.n_clusters)
    cluster_props = rng.dirichlet(np.full(p.n_clusters, p.alpha1), size=source.n_classes)
    per_cluster = split_by_proportions(cluster_props, _class_totals(source))
    per_cluster = ensure_min_total(per_cluster, members * p.min_samples, "min_samples")
    blocks = []
    for g, m in enumerate(members):
        props = rng.dirichlet(np.full(int(m), p.alpha2), size=source.n_classes)
        counts = split_by_proportions(props, per_cluster[g])
        blocks.append(ensure_min_total(counts, p.min_samples, "min_samples"))
    info = [{"train_class_counts": row.tolist()} for row in per_cluster]
    return _counts_plan(source, np.concatenate(blocks), client_groups(p.n_clients, p.n_clusters),
                        info, rng)


def _counts_from_choice(chosen: np.ndarray, totals: np.ndarray,
                        samples_per_client: int | None) -> np.ndarray:
    """Counts `[C, K]` for clients holding the classes marked in `chosen` (0/1 `[C, K]`)."""
    if samples_per_client is None:
        return proportional_counts(chosen, totals)
    n_held = chosen.sum(axis=1, keepdims=True)
    rank = np.cumsum(chosen, axis=1) - 1  # position of each held class within the client
    counts = chosen * (samples_per_client // n_held + (rank < samples_per_client % n_held))
    short = np.flatnonzero(counts.sum(axis=0) > totals)
    if len(short):
        k = int(short[0])
        raise ConfigError("samples_per_client", f"class {k} would need {counts[:, k].sum()} "
                                                f"rows but has {totals[k]}; ask for fewer")
    return counts


def _mark(rows: np.ndarray, n_classes: int) -> np.ndarray:
    """0/1 matrix with a 1 at (i, rows[i, j])."""
    marks = np.zeros((len(rows), n_classes), dtype=np.int64)
    np.put_along_axis(marks, rows, 1, axis=1)
    return marks


def plan_n_class(source: Source, p: NClassParams, rng: np.random.Generator) -> Plan:
    """CAM §5 n-class (McMahan et al.): each client holds n classes drawn at random."""
    k = source.n_classes
    if p.n > k:
        raise ConfigError("n", f"{p.n} classes per client, the data has {k}")
    chosen = np.sort(np.argsort(rng.random((p.n_clients, k)), axis=1)[:, : p.n], axis=1)
    counts = _counts_from_choice(_mark(chosen, k), _class_totals(source), p.samples_per_client)
    return _counts_plan(source, counts, None, [], rng, {"client_classes": chosen.tolist()})


def plan_cluster_n_class(source: Source, p: ClusterNClassParams,
                         rng: np.random.Generator) -> Plan:
    """CAM §5 cluster-wise n-class (3, 2): each cluster gets n1 classes, taken cyclically from
    a random permutation so every class serves about the same number of clusters (the paper's
    "relatively balanced number of instances per class"); each client n2 of them at random."""
    k = source.n_classes
    _need_clusters(p.n_clusters, p.n_clients)
    if not p.n2 <= p.n1 <= k:
        raise ConfigError("n1", f"need n2 ≤ n1 ≤ number of classes, got n1={p.n1}, n2={p.n2}, "
                                f"{k} classes")
    perm = rng.permutation(k)
    sets = perm[(np.arange(p.n_clusters)[:, None] * p.n1 + np.arange(p.n1)) % k]
    clusters = client_groups(p.n_clients, p.n_clusters)
    pick = np.argsort(rng.random((p.n_clients, p.n1)), axis=1)[:, : p.n2]
    chosen = np.sort(np.take_along_axis(sets[clusters], pick, axis=1), axis=1)
    counts = _counts_from_choice(_mark(chosen, k), _class_totals(source), p.samples_per_client)
    info = [{"classes": sorted(s.tolist())} for s in sets]
    return _counts_plan(source, counts, clusters, info, rng, {"client_classes": chosen.tolist()})


# ====================================================================== planners: FLT


def _label_sets(p: _LabelSetParams, n_classes: int, rng: np.random.Generator) -> list[list[int]]:
    """Each cluster's label set: explicit, or windows of a random permutation (FLT §4.2)."""
    if p.class_sets is not None:
        if len(p.class_sets) != p.n_clusters:
            raise ConfigError("class_sets", f"give one set per cluster ({p.n_clusters})")
        for s in p.class_sets:
            if not s or len(set(s)) != len(s) or min(s) < 0 or max(s) >= n_classes:
                raise ConfigError("class_sets", f"{s} is not a set of distinct labels in "
                                                f"0..{n_classes - 1}")
        return [sorted(s) for s in p.class_sets]
    disjoint = p.label_sets == "disjoint"
    width = p.classes_per_cluster or (2 if disjoint else 3)
    step = width if disjoint else width - 1
    if width > n_classes or step < 1:
        raise ConfigError("classes_per_cluster", f"{width} does not fit {n_classes} classes "
                                                 f"with label_sets={p.label_sets!r}")
    if disjoint and width * p.n_clusters > n_classes:
        raise ConfigError("n_clusters", f"{p.n_clusters} disjoint sets of {width} labels need "
                                        f"{width * p.n_clusters} classes, the data has "
                                        f"{n_classes}")
    perm = rng.permutation(n_classes)
    starts = np.arange(p.n_clusters) * step
    sets = [sorted(perm[(s + np.arange(width)) % n_classes].tolist()) for s in starts]
    if len({tuple(s) for s in sets}) < len(sets):
        raise ConfigError("n_clusters", f"{p.n_clusters} overlapping sets of {width} labels "
                                        f"repeat on {n_classes} classes; use fewer clusters")
    return sets


def _cluster_pools(source: Source, sets: list[list[int]], rng: np.random.Generator) -> Part:
    """Each cluster's shuffled rows: the rows of its classes, a class's rows split equally
    among the clusters that share it (FLT scenario 2)."""
    held = np.zeros((len(sets), source.n_classes), dtype=np.int64)
    for g, s in enumerate(sets):
        held[g, s] = 1
    counts = proportional_counts(held, _class_totals(source))
    return rows_from_counts(source.y_train.numpy().astype(np.int64), counts, rng)


def _carve(pools: Part, sizes_per_cluster: Sequence[np.ndarray]) -> Part:
    """Client rows = consecutive slices of their cluster's shuffled rows (FLT Algorithm 4)."""
    pieces = [pools.index[pools.offsets[g]: pools.offsets[g] + int(s.sum())]
              for g, s in enumerate(sizes_per_cluster)]
    return Part(np.concatenate(pieces), offsets_of(np.concatenate(sizes_per_cluster)))


def _flt_plan(source: Source, p: _LabelSetParams, sizes: Sequence[np.ndarray], pools: Part,
              rng: np.random.Generator,
              info: list[dict[str, Any]]) -> Plan:
    train_pool, test_pool = _pools(source)
    train = _carve(pools, sizes)
    counts = class_counts(train_pool.labels, train, source.n_classes)
    test = matched_test(test_pool.labels, counts, rng)
    return Plan(train_pool, train, test_pool, test, client_groups(p.n_clients, p.n_clusters),
                info)


def plan_cluster_labels(source: Source, p: ClusterLabelsParams, rng: np.random.Generator) -> Plan:
    """FLT §4.2 scenarios 1 and 2: M clients in C clusters, every client of cluster c holds the
    same number of samples drawn at random from the labels L_c (disjoint or overlapping)."""
    _need_clusters(p.n_clusters, p.n_clients)
    sets = _label_sets(p, source.n_classes, rng)
    pools = _cluster_pools(source, sets, rng)
    members = group_sizes(p.n_clients, p.n_clusters)
    most = int(np.min(pools.sizes // members))
    per_client = most if p.samples_per_client is None else p.samples_per_client
    if per_client > most or per_client < 1:
        raise ConfigError("samples_per_client", f"at most {most} samples per client fit these "
                                                "clusters; ask for fewer or use fewer clients")
    sizes = [np.full(int(m), per_client, dtype=np.int64) for m in members]
    info = [{"classes": s} for s in sets]
    return _flt_plan(source, p, sizes, pools, rng, info)


def power_law_sizes(n_rows: int, n_clients: int, alpha: int, delta: float) -> tuple[np.ndarray,
                                                                                    float]:
    """FLT Algorithm 4: sizes ⌊α + e^(β m^δ)⌋ for m = 1..M with β solving Σ = n_rows (brentq)."""
    m = np.arange(1, n_clients + 1, dtype=np.float64) ** delta
    if n_rows < n_clients * (alpha + 1):
        raise ConfigError("alpha", f"{n_clients} clients with at least α+1 = {alpha + 1} "
                                   f"samples need {n_clients * (alpha + 1)}, the cluster has "
                                   f"{n_rows}")

    def excess(beta: float) -> float:
        return float(np.sum(alpha + np.exp(beta * m)) - n_rows)

    beta = 0.0
    if excess(0.0) < 0:
        beta = brentq(excess, 0.0, math.log(n_rows) / m[-1], xtol=1e-12)
    sizes = np.floor(alpha + np.exp(beta * m)).astype(np.int64)
    sizes[-1] -= max(0, int(sizes.sum()) - n_rows)  # guard against the root's rounding
    return sizes, float(beta)


def plan_power_law(source: Source, p: PowerLawParams, rng: np.random.Generator) -> Plan:
    """FLT Appendix C.4, Algorithm 4: label sets per cluster as in `cluster_labels`; within
    cluster c, client m = 1..M_c takes the next ⌊α + e^(β_c m^δ)⌋ of the cluster's shuffled
    rows, with β_c solved numerically so the cluster's rows are used up."""
    _need_clusters(p.n_clusters, p.n_clients)
    sets = _label_sets(p, source.n_classes, rng)
    pools = _cluster_pools(source, sets, rng)
    members = group_sizes(p.n_clients, p.n_clusters)
    solved = [power_law_sizes(int(n), int(m), p.alpha, p.delta)
              for n, m in zip(pools.sizes, members)]
    info = [{"classes": s, "beta": beta} for s, (_, beta) in zip(sets, solved)]
    return _flt_plan(source, p, [s for s, _ in solved], pools, rng, info)


# ====================================================================== planner: regression


def regression_angles(p: LinearRegressionParams) -> list[float]:
    """φ_k in degrees: given, or ((K-1)/2 - k)·Δφ, i.e. (Δφ, 0, -Δφ) for K = 3."""
    if p.angles is not None:
        if len(p.angles) != p.n_clusters:
            raise ConfigError("angles", f"give one angle per cluster ({p.n_clusters})")
        angles = [float(a) for a in p.angles]
    else:
        angles = [((p.n_clusters - 1) / 2 - k) * p.delta_phi for k in range(p.n_clusters)]
    if any(abs(a) >= 90 for a in angles):
        raise ConfigError("angles" if p.angles else "delta_phi",
                          f"angles {angles} must lie strictly between -90 and 90 degrees")
    return angles


def _regression_pool(phi_rows: np.ndarray, noise_std: float, rng: np.random.Generator) -> Pool:
    x = rng.uniform(0.0, 1.0, len(phi_rows)) * np.cos(phi_rows)
    y = x * np.tan(phi_rows) + rng.normal(0.0, noise_std, len(phi_rows))
    return Pool((torch.from_numpy(x.astype(np.float32)[:, None]),),
                (torch.from_numpy(y.astype(np.float32)),))


def plan_linear_regression(source: Source, p: LinearRegressionParams,
                           rng: np.random.Generator) -> Plan:
    """CFL-GP §5.1 / F.4: client of cluster k draws x ~ U(0, cos φ_k) and
    y = x tan φ_k + N(0, σ²) (σ = 0.2); the source is ignored (use 'synthetic_regression')."""
    _need_clusters(p.n_clusters, p.n_clients)
    phis = np.deg2rad(regression_angles(p))
    clusters = client_groups(p.n_clients, p.n_clusters)
    parts = []
    for n in (p.samples_per_client, p.test_samples_per_client):
        part = Part(np.arange(n * p.n_clients), np.arange(p.n_clients + 1) * n)
        parts.append((_regression_pool(phis[clusters][part.owner()], p.noise_std, rng), part))
    info = [{"angle": float(np.rad2deg(f)), "slope": float(np.tan(f)),
             "x_max": float(np.cos(f))} for f in phis]
    return Plan(parts[0][0], parts[0][1], parts[1][0], parts[1][1], clusters, info)


# ====================================================================== registry


PlanFn = Callable[[Source, Any, np.random.Generator], Plan]
Needs = Literal["labels", "images", "synthetic"]


@dataclass(frozen=True)
class ScenarioSpec:
    """A scenario: its parameters, its planner, what data it needs, and its reference."""

    name: str
    params: type[ScenarioParams]
    plan: PlanFn
    needs: Needs
    reference: str
    summary: str

    def build(self, source: Source, params: ScenarioParams, rng: np.random.Generator,
              field_prefix: str = "scenario") -> Federation:
        """The federation of `source` under this scenario (ConfigError fields prefixed)."""
        check_source(self, source)
        try:
            plan = self.plan(source, params, rng)
            check_plan(plan)
        except ConfigError as exc:  # planners name bare fields; say where they live
            raise ConfigError(f"{field_prefix}.{exc.field}", exc.message) from None
        meta = {"scenario": self.name, "source": source.name, "reference": self.reference,
                "params": params.model_dump(mode="json")}
        return assemble(plan, source, f"{source.name}/{self.name}", meta)


def _spec(name: str, params: type[ScenarioParams], plan: PlanFn, needs: Needs,
          reference: str, summary: str) -> tuple[str, ScenarioSpec]:
    return name, ScenarioSpec(name, params, plan, needs, reference, summary)


SCENARIOS: dict[str, ScenarioSpec] = dict([
    _spec("iid", IidParams, plan_iid, "labels", "sanity baseline",
          "equal random split, one cluster"),
    _spec("label_swap", LabelSwapParams, plan_label_swap, "labels", "CFL §V-A",
          "each cluster swaps one pair of labels"),
    _spec("label_permutation", LabelPermutationParams, plan_label_permutation, "labels",
          "CFL §V-C", "each cluster permutes the labels"),
    _spec("rotation", RotationParams, plan_rotation, "images", "CFL-GP §5.2, F.5; IFCA",
          "each cluster rotates its images by one angle"),
    _spec("rotation_mixture", RotationMixtureParams, plan_rotation_mixture, "images",
          "CFL-GP F.5.2", "0°, 180° and a κ-mixture of both"),
    _spec("cluster_partitioner", ClusterPartitionerParams, plan_cluster_partitioner, "images",
          "Flower Datasets", "rotation clusters, a flwr_datasets partitioner inside each"),
    _spec("dirichlet", DirichletParams, plan_dirichlet, "labels", "CAM §5; Hsu et al. 2019",
          "client-wise label skew Dir(α)"),
    _spec("cluster_dirichlet", ClusterDirichletParams, plan_cluster_dirichlet, "labels",
          "CAM §5", "Dir(α1) over clusters, Dir(α2) within"),
    _spec("n_class", NClassParams, plan_n_class, "labels", "CAM §5; McMahan et al. 2017",
          "each client holds n random classes"),
    _spec("cluster_n_class", ClusterNClassParams, plan_cluster_n_class, "labels", "CAM §5",
          "n1 classes per cluster, n2 per client"),
    _spec("cluster_labels", ClusterLabelsParams, plan_cluster_labels, "labels",
          "FLT §4.2 scenarios 1-2", "label set per cluster, equal samples per client"),
    _spec("power_law", PowerLawParams, plan_power_law, "labels", "FLT App. C.4, Algorithm 4",
          "label set per cluster, α + e^(β m^δ) samples"),
    _spec("linear_regression", LinearRegressionParams, plan_linear_regression, "synthetic",
          "CFL-GP §5.1, F.4", "y = x tan φ_k + noise"),
    _spec("label_shift_half", LabelShiftHalfParams, plan_label_shift_half, "labels",
          "CFL-GP F.7", "half the clients use y → (y+5) mod 10"),
])


def get_scenario(name: str, field_prefix: str = "scenario") -> ScenarioSpec:
    """The registered scenario `name`; ConfigError listing the known ones otherwise."""
    if name not in SCENARIOS:
        raise ConfigError(field_prefix, f"unknown scenario {name!r}; allowed: "
                                        f"{', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def _validation_message(exc: ValidationError, model: type[BaseModel], prefix: str,
                        scenario: str) -> ConfigError:
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"])
    where = f"{prefix}.{loc}" if loc else prefix
    if first["type"] == "extra_forbidden":
        message = (f"unknown parameter of scenario {scenario!r}; allowed: "
                   f"{', '.join(model.model_fields)}")
    else:
        message = f"{first['msg']} (got {first.get('input')!r})"
    if len(errors) > 1:
        message += f" [and {len(errors) - 1} more problem(s)]"
    return ConfigError(where, message)


def scenario_params(name: str, raw: dict[str, Any] | None = None,
                    field_prefix: str = "scenario") -> ScenarioParams:
    """Validate the raw parameters of scenario `name` (unknown names/fields, types, ranges).

    Raises:
        ConfigError: with the dotted field (e.g. `scenario.alpha`) and what is allowed.
    """
    spec = get_scenario(name, field_prefix)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(field_prefix, f"parameters must be a table, got {type(raw).__name__}")
    try:
        return spec.params.model_validate(raw)
    except ValidationError as exc:
        raise _validation_message(exc, spec.params, field_prefix, name) from None


def check_source(spec: ScenarioSpec, source: Source) -> None:
    """ConfigError when the scenario cannot use this data (e.g. regression on images)."""
    if spec.needs == "synthetic":
        if source.name != "synthetic_regression":
            raise ConfigError("source", f"scenario {spec.name!r} generates its own data: use "
                                        f"source 'synthetic_regression', not {source.name!r}")
        return
    if source.task != "classification":
        raise ConfigError("source", f"scenario {spec.name!r} needs a classification dataset "
                                    f"({', '.join(IMAGE_SOURCES)}), not {source.name!r}")
    if spec.needs == "images" and source.x_train.ndim != 4:
        raise ConfigError("source", f"scenario {spec.name!r} rotates images [N, C, H, W]; "
                                    f"{source.name!r} has inputs {source.input_shape}")


def make_federation(source: str | Source, scenario: str,
                    params: dict[str, Any] | ScenarioParams | None = None, seed: int = 0,
                    data_dir: str | Path | None = None,
                    field_prefix: str = "scenario", verify: bool = True) -> Federation:
    """Build the federation of `source` (a name or a loaded Source) under `scenario`.

    A named source is read from `data_dir` (`load_source`; `verify`: check its files'
    checksums).

    Deterministic: the same (source, scenario, params, seed) gives an identical federation.
    `meta` records the scenario, the validated params, the seed and per-cluster facts
    (`meta["clusters"][c]`: angle, label map, class set, ...).
    """
    spec = get_scenario(scenario, field_prefix)
    if not isinstance(params, spec.params):
        params = scenario_params(scenario, params if isinstance(params, dict) or params is None
                                 else params.model_dump(), field_prefix)
    loaded = source if isinstance(source, Source) else load_source(source, data_dir, verify)
    federation = spec.build(loaded, params, np.random.default_rng(seed), field_prefix)
    federation.meta["seed"] = seed
    return federation
