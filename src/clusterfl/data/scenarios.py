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
| `topics`            | CFL Fig. 10 (AG News, language model)   | one topic each           |
| `writers`, `structured_femnist`, `dirichlet_rotation`: `clusterfl.data.paper_scenarios` |

Clients of a cluster are contiguous, in K groups of near-equal size, the larger first (10
clients in 4 clusters: 3, 3, 2, 2; `plans.client_groups`; `topics` alone puts client i in
cluster ⌊i·K/C⌋: 3, 2, 3, 2). Test rows are split per class in proportion to the clients'
training rows of that class (`plans.matched_test`): a client's test mix follows its training
mix where its scenario uses every training row of a class (the defaults); with a
`samples_per_client` that leaves rows unused the two can differ (a total-variation distance of
0.249 for `n_class`, 10 clients, n = 2, 31 rows a client, on the digits), unless
`test_rows = "matched"` (0.029; each class's test rows in the share its used training rows
make, `plans.matched_test`). Every client gets at
least one training and one test sample, or a `ConfigError` says which parameter makes that
impossible. The same (source, scenario, params, seed) always gives the same federation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ValidationError
from scipy.optimize import brentq

from clusterfl.data.federation import Federation
from clusterfl.data.params import (
    ClusterDirichletParams,
    ClusterLabelsParams,
    ClusterNClassParams,
    ClusterPartitionerParams,
    DirichletParams,
    IidParams,
    LabelPermutationParams,
    LabelShiftHalfParams,
    LabelSwapParams,
    LinearRegressionParams,
    NClassParams,
    PowerLawParams,
    RotationMixtureParams,
    RotationParams,
    ScenarioParams,
    _LabelSetParams,
    _RotationLayoutParams,
    _SizeParams,
)
from clusterfl.data.plans import (
    Part,
    Plan,
    Pool,
    assemble,
    check_plan,
    class_counts,
    client_groups,
    ensure_min_total,
    equal_split,
    group_sizes,
    matched_test,
    offsets_of,
    per_row,
    proportional_counts,
    rows_from_counts,
    source_pools,
    split_by_proportions,
)
from clusterfl.data.sources import IMAGE_SOURCES, Source, load_source
from clusterfl.data.text import TopicsParams, topic_federation
from clusterfl.data.transforms import (
    distinct_permutations,
    shift_map,
    swap_pairs,
)
from clusterfl.errors import ConfigError

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
    train_pool, test_pool = source_pools(source)
    for i, m in enumerate(cluster_maps):
        info[i]["label_map"] = m.tolist()
    return Plan(train_pool, train, test_pool, test, clusters, info,
                label_maps=cluster_maps[clusters])


def _need_clusters(n_clusters: int, n_clients: int, field: str = "n_clusters") -> None:
    """One client per cluster at least; `field`: the setting that makes the clusters (the
    rotation scenarios' `angles`, one cluster per angle)."""
    if n_clusters > n_clients:
        what = f"{n_clusters} angles make {n_clusters} clusters, which" if field == "angles" \
            else f"{n_clusters} clusters"
        raise ConfigError(field, f"{what} need at least as many clients (n_clients = "
                                 f"{n_clients}): raise n_clients or give fewer {field}")


def plan_iid(source: Source, p: IidParams, rng: np.random.Generator) -> Plan:
    """Equal random split; one distribution, so every client is in cluster 0."""
    train, test = _sized_split(source, p, rng)
    train_pool, test_pool = source_pools(source)
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
        twice = [q for i, q in enumerate(pairs) if set(q) in map(set, pairs[:i])]
        if twice:  # two clusters with one swap: one distribution under two labels
            raise ConfigError("pairs", f"the swap {list(twice[0])} is given twice: give each "
                                       "cluster its own pair")
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
        train_pool, test_pool = source_pools(source)
        return train_pool, train, test_pool, test
    for name in ("n_train_per_client", "n_test_per_client"):
        if getattr(p, name) is not None:
            raise ConfigError(name, "not used by layout 'cflgp' (sizes follow from the blocks)")
    pool, train, test = _cflgp_layout(source, p.n_clients, n_groups, p.train_fraction, rng)
    return pool, train, pool, test


def _rotation_groups(p: RotationParams, n_groups: int) -> np.ndarray:
    """Each client's group: `clients_per_group` contiguous runs, or near-equal groups."""
    if p.clients_per_group is None:
        return client_groups(p.n_clients, n_groups)
    return np.repeat(np.arange(n_groups), p.clients_per_group)


def plan_rotation(source: Source, p: RotationParams, rng: np.random.Generator) -> Plan:
    """CFL-GP §5.2 / F.5 (IFCA's rotated MNIST): cluster j rotates all its images by angle j."""
    n_groups = len(p.angles)
    _need_clusters(n_groups, p.n_clients, "angles")
    clusters = _rotation_groups(p, n_groups)
    train_pool, train, test_pool, test = _rotation_parts(source, p, n_groups, rng)
    angles = np.asarray(p.angles, dtype=np.float64)[clusters]
    return Plan(train_pool, train, test_pool, test, clusters,
                [{"angle": a} for a in p.angles],
                train_angles=per_row(angles, train), test_angles=per_row(angles, test),
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
    _need_clusters(n_groups, p.n_clients, "angles")
    clusters = _rotation_groups(p, n_groups)
    train_pool, test_pool = source_pools(source)
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
                train_angles=per_row(angles, train), test_angles=per_row(angles, test),
                extra={"partitioner": p.partitioner})


# ====================================================================== planners: label skew


def _counts_plan(source: Source, counts: np.ndarray, clusters: np.ndarray | None,
                 info: list[dict[str, Any]], rng: np.random.Generator,
                 extra: dict[str, Any] | None = None, matched: bool = False) -> Plan:
    """Train rows drawn per the count matrix, test rows matched to each client's classes
    (`matched`: `test_rows = "matched"`, the share its used rows make; `plans.matched_test`)."""
    train_pool, test_pool = source_pools(source)
    train = rows_from_counts(train_pool.labels, counts, rng)
    test = matched_test(test_pool.labels, counts, rng,
                        _class_totals(source) if matched else None)
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
    return _counts_plan(source, counts, None, [], rng, {"client_classes": chosen.tolist()},
                        p.test_rows == "matched")


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
    same = {frozenset(s.tolist()) for s in sets}
    if len(same) < p.n_clusters:  # windows that come round again: one set, two clusters
        raise ConfigError("n_clusters", f"{p.n_clusters} clusters of n1 = {p.n1} of the {k} "
                                         f"classes repeat a class set ({len(same)} distinct): "
                                         "two clusters would be one distribution; use fewer "
                                         "clusters or another n1")
    clusters = client_groups(p.n_clients, p.n_clusters)
    pick = np.argsort(rng.random((p.n_clients, p.n1)), axis=1)[:, : p.n2]
    chosen = np.sort(np.take_along_axis(sets[clusters], pick, axis=1), axis=1)
    counts = _counts_from_choice(_mark(chosen, k), _class_totals(source), p.samples_per_client)
    info = [{"classes": sorted(s.tolist())} for s in sets]
    return _counts_plan(source, counts, clusters, info, rng, {"client_classes": chosen.tolist()},
                        p.test_rows == "matched")


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
        sets = [sorted(s) for s in p.class_sets]
        twice = next((s for i, s in enumerate(sets) if s in sets[:i]), None)
        if twice is not None:  # two clusters of one distribution
            raise ConfigError("class_sets", f"the label set {twice} is given twice: give "
                                            "each cluster its own set")
        return sets
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
    train_pool, test_pool = source_pools(source)
    train = _carve(pools, sizes)
    counts = class_counts(train_pool.labels, train, source.n_classes)
    test = matched_test(test_pool.labels, counts, rng,
                        _class_totals(source) if p.test_rows == "matched" else None)
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
        if len(set(angles)) < len(angles):  # two clusters on one line
            raise ConfigError("angles", f"{angles} lists an angle twice: one per cluster")
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


REGRESSION_ROWS = 10**7
"""The most rows `linear_regression` generates (train and test, all clients: 80 MB as
float32, a few times that while they are drawn)."""


def plan_linear_regression(source: Source, p: LinearRegressionParams,
                           rng: np.random.Generator) -> Plan:
    """CFL-GP §5.1 / F.4: client of cluster k draws x ~ U(0, cos φ_k) and
    y = x tan φ_k + N(0, σ²) (σ = 0.2); the source is ignored (use 'synthetic_regression')."""
    _need_clusters(p.n_clusters, p.n_clients)
    rows = p.n_clients * (p.samples_per_client + p.test_samples_per_client)
    if rows > REGRESSION_ROWS:  # a million clients ran out of memory
        blame = "n_clients" if 2 * p.n_clients > REGRESSION_ROWS else "samples_per_client" \
            if p.samples_per_client >= p.test_samples_per_client else "test_samples_per_client"
        raise ConfigError(blame, f"n_clients × (samples_per_client + test_samples_per_client) "
                          f"= {rows} rows to generate; allowed: at most {REGRESSION_ROWS}")
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


def _no_plan(source: Source, params: Any, rng: np.random.Generator) -> Plan:
    """Scenario `topics` builds token sequences (`text.topic_federation`), not a row plan."""
    raise ConfigError("source", f"scenario 'topics' needs a text source, not {source.name!r}")


Needs = Literal["labels", "images", "synthetic", "text"]


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
            if self.needs == "text" and source.text is not None:  # token sequences, no plan
                assert isinstance(params, TopicsParams)
                federation = topic_federation(source.text, params, rng)
                federation.meta.update(scenario=self.name, source=source.name,
                                       reference=self.reference,
                                       params=params.model_dump(mode="json"))
                return federation
            if self.needs != "synthetic":  # linear_regression makes its own rows
                _rows_for_clients(source, params.n_clients)
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
    _spec("topics", TopicsParams, _no_plan, "text", "CFL Fig. 10",
          "each client one topic's articles (language model)"),
    # + writers, structured_femnist, dirichlet_rotation: `clusterfl.data.paper_scenarios`
    # registers them when imported (`clusterfl.data` imports it)
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
    text, got = str(first["msg"]).removeprefix("Value error, "), first.get("input")
    named = text.split(" ", 1)[0]
    if not loc and named in model.model_fields and isinstance(got, dict):
        # a check of several fields (a model validator) whose message starts with the field
        # it blames: name that field, and its value (it said `scenario` and the whole table)
        loc, got = named, got.get(named)
    where = f"{prefix}.{loc}" if loc else prefix
    if first["type"] == "extra_forbidden":
        message = (f"unknown parameter of scenario {scenario!r}; allowed: "
                   f"{', '.join(model.model_fields)}")
    else:
        message = f"{text} (got {got!r})"
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


def _rows_for_clients(source: Source, n_clients: int) -> None:
    """Every client needs a training and a test row: more clients than the source has rows
    are a ConfigError before a plan is made (a billion clients ran out of memory making it)."""
    most = min(len(source.y_train), len(source.y_test))
    if n_clients > most:
        raise ConfigError("n_clients", f"{n_clients} clients need a training and a test row "
                          f"each; {source.name!r} has {len(source.y_train)} training and "
                          f"{len(source.y_test)} test rows; allowed: 1..{most}")


def check_source(spec: ScenarioSpec, source: Source) -> None:
    """ConfigError when the scenario cannot use this data (e.g. regression on images)."""
    if spec.needs == "text" or source.text is not None:
        if spec.needs != "text" or source.text is None:
            raise ConfigError("source", f"scenario {spec.name!r} and source {source.name!r} "
                              "do not fit: text sources (ag_news, synthetic_topics) go with "
                              "scenario 'topics' only")
        return
    if spec.needs == "synthetic":
        if source.name != "synthetic_regression":
            raise ConfigError("source", f"scenario {spec.name!r} generates its own data: use "
                                        f"source 'synthetic_regression', not {source.name!r}")
        return
    if source.task != "classification":
        hint = ("; its scenario is 'linear_regression' (scenario.name)"
                if source.name == "synthetic_regression" else
                "; a label column of floats reads as a regression target: make it integer "
                "class ids" if source.name.startswith("hf:") else "")
        raise ConfigError("source", f"scenario {spec.name!r} needs a classification dataset "
                                    f"({', '.join(IMAGE_SOURCES)}), not {source.name!r}{hint}")
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
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError("seed", f"{seed!r}: give a whole number >= 0")
    if params is not None and not isinstance(params, dict | ScenarioParams):
        raise ConfigError(field_prefix, f"params is a {type(params).__name__}; give the "
                          "scenario's options as a dict ({'n_clients': 20, ...}) or None")
    spec = get_scenario(scenario, field_prefix)
    if not isinstance(params, spec.params):
        params = scenario_params(scenario, params if isinstance(params, dict) or params is None
                                 else params.model_dump(), field_prefix)
    loaded = source if isinstance(source, Source) else load_source(source, data_dir, verify)
    federation = spec.build(loaded, params, np.random.default_rng(seed), field_prefix)
    federation.meta["seed"] = seed
    return federation
