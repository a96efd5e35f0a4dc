"""The scenarios of the papers' EMNIST / FEMNIST experiments, registered in
`clusterfl.data.scenarios.SCENARIOS` when this module is imported (`clusterfl.data` does):

| scenario             | paper                                  | true clusters          |
|----------------------|----------------------------------------|------------------------|
| `writers`            | FLT §4.2 scenario 3 (LEAF's FEMNIST)   | none (ARI: n/a)        |
| `structured_femnist` | FLT §4.2 scenario 4, App. C.4, Alg. 4  | label set per cluster  |
| `dirichlet_rotation` | CFL-GP App. F.8 (after Sattler 2020)   | one angle each         |
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from clusterfl.config_util import changed_fields
from clusterfl.data.leaf import WriterSource
from clusterfl.data.params import PowerLawParams, ScenarioParams, distinct_rotations
from clusterfl.data.plans import (
    Part,
    Plan,
    client_groups,
    ensure_min_total,
    matched_test,
    offsets_of,
    per_row,
    rows_from_counts,
    source_pools,
    split_by_proportions,
)
from clusterfl.data.scenarios import SCENARIOS, ScenarioSpec, plan_power_law
from clusterfl.data.sources import Source
from clusterfl.errors import ConfigError

# ====================================================================== FEMNIST's writers


class WritersParams(ScenarioParams):
    """FLT scenario 3: LEAF's FEMNIST, each writer one client (its own train and test rows)."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1, description="writers taken as clients (FLT: 200; the "
                           "error for too many says how many there are)")
    pick: Literal["random", "largest"] = Field(
        "random", description="which writers: at random (seeded) or those with most samples")
    min_train: int = Field(1, ge=1, description="writers with fewer training rows are left out")


def plan_writers(source: Source, p: WritersParams, rng: np.random.Generator) -> Plan:
    """Each chosen writer is one client with its own rows, train and test as LEAF cut them
    (`-t sample`: every writer in both). Writers without a test row, or with fewer than
    `min_train` training rows, are never chosen. No true clusters."""
    if not isinstance(source, WriterSource):
        raise ConfigError("name", f"scenario 'writers' needs data with writer ids (source "
                                  f"'femnist'), not {source.name!r}")
    n_writers = len(source.writer_names)
    n_train = np.bincount(source.train_writers, minlength=n_writers)
    n_test = np.bincount(source.test_writers, minlength=n_writers)
    eligible = np.flatnonzero((n_train >= p.min_train) & (n_test >= 1))
    want = p.n_clients
    if want > len(eligible):
        raise ConfigError("n_clients", f"{want} writers asked for, {len(eligible)} have at "
                                       f"least {p.min_train} training and 1 test sample")
    if p.pick == "largest":
        chosen = eligible[np.argsort(-n_train[eligible], kind="stable")[:want]]
    else:
        chosen = np.sort(rng.choice(eligible, want, replace=False))
    train = _writer_rows(source.train_writers, chosen)
    test = _writer_rows(source.test_writers, chosen)
    train_pool, test_pool = source_pools(source)
    names = [source.writer_names[w] for w in chosen]
    return Plan(train_pool, train, test_pool, test, None, [], extra={"writers": names})


def _writer_rows(writers: np.ndarray, chosen: np.ndarray) -> Part:
    """The rows of each chosen writer, in file order, writer after writer."""
    order = np.argsort(writers, kind="stable")
    starts = np.searchsorted(writers[order], chosen, side="left")
    stops = np.searchsorted(writers[order], chosen, side="right")
    rows = [order[a:b] for a, b in zip(starts, stops, strict=True)]
    index = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return Part(index.astype(np.int64), offsets_of(stops - starts))


# ====================================================================== Structured Non-IID FEMNIST


class StructuredFemnistParams(ScenarioParams):
    """FLT scenario 4 (App. C.4): EMNIST balanced (47 classes), C = 10 clusters of 5 classes
    (the last one 2), power-law quantity skew α + e^(β m^δ) within each cluster."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(2400, ge=1, description="M: 2400 (MLP) or 600 (CNN) in the paper")
    n_clusters: int = Field(10, ge=1)
    classes_per_cluster: int = Field(5, ge=1, description="the last cluster takes the rest")
    alpha: int = Field(10, ge=0, description="minimum samples per client (α; our choice: the "
                       "paper gives no value)")
    delta: float = Field(0.5, gt=0.0, le=4.0, description="power exponent δ (our choice)")


def structured_sets(n_classes: int, n_clusters: int, width: int,
                    rng: np.random.Generator) -> list[list[int]]:
    """Disjoint label sets: `width` classes of a random permutation per cluster, the last
    cluster the remaining ones (47 classes, 10 clusters, width 5: nine of 5 and one of 2)."""
    rest = n_classes - (n_clusters - 1) * width
    if rest < 1 or (n_clusters > 1 and rest > width):
        raise ConfigError("classes_per_cluster", f"{n_clusters} clusters of {width} classes "
                                                 f"leave {rest} for the last one; on "
                                                 f"{n_classes} classes it must get 1..{width}")
    perm = rng.permutation(n_classes)
    return [sorted(perm[g * width: (g + 1) * width].tolist()) for g in range(n_clusters - 1)] \
        + [sorted(perm[(n_clusters - 1) * width:].tolist())]


def plan_structured_femnist(source: Source, p: StructuredFemnistParams,
                            rng: np.random.Generator) -> Plan:
    """FLT Algorithm 4 with App. C.4's label sets (`power_law` with those sets)."""
    sets = structured_sets(source.n_classes, p.n_clusters, p.classes_per_cluster, rng)
    params = PowerLawParams(n_clients=p.n_clients, n_clusters=p.n_clusters, class_sets=sets,
                            alpha=p.alpha, delta=p.delta)
    return plan_power_law(source, params, rng)


# ====================================================================== CFL-GP F.8


class DirichletRotationParams(ScenarioParams):
    """CFL-GP App. F.8: EMNIST (62 classes), 200,000 samples, label skew Dir(1.0), half the
    clients at 0°, half at 180°."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(10, ge=1, description="C: 10, 80 or 160 in the paper")
    angles: list[float] = Field(default_factory=lambda: [0.0, 180.0],
                                description="one rotation per cluster (degrees)")
    alpha: float = Field(1.0, gt=0.0, description="Dirichlet concentration of the label skew")
    n_samples: int | None = Field(200_000, ge=1, description="training rows used in all "
                                  "(the paper samples 200,000); none = the whole split")
    min_samples: int = Field(1, ge=1, description="minimum training rows per client")

    @field_validator("angles")
    @classmethod
    def _distinct_angles(cls, value: list[float]) -> list[float]:
        return distinct_rotations(value)


def plan_dirichlet_rotation(source: Source, p: DirichletRotationParams,
                            rng: np.random.Generator) -> Plan:
    """Label skew and rotation clusters. The paper says the clients' label distributions
    "vary according to a Dirichlet distribution with a concentration parameter of 1.0" and
    that half the clients rotate by 0°, half by 180°; how the Dirichlet is drawn is our
    choice: per class, proportions over the clients ~ Dir(α) (Hsu et al. 2019, the
    `dirichlet` scenario), over a random `n_samples` of the training rows. Test rows follow
    each client's class proportions and angle."""
    n_groups = len(p.angles)
    if n_groups < 1 or n_groups > p.n_clients:
        raise ConfigError("angles", f"{n_groups} angles need 1..n_clients ({p.n_clients})")
    labels = source.y_train.numpy().astype(np.int64)
    if p.n_samples is not None and p.n_samples > len(labels) and \
            changed_fields(p, "n_samples"):  # the default 200,000: the whole split if less
        raise ConfigError("n_samples", f"{p.n_samples} training rows asked, the split has "
                                       f"{len(labels)}; allowed: 1..{len(labels)} or none")
    n = len(labels) if p.n_samples is None else min(p.n_samples, len(labels))
    totals = np.bincount(labels[rng.choice(len(labels), n, replace=False)],
                         minlength=source.n_classes)[: source.n_classes]
    proportions = rng.dirichlet(np.full(p.n_clients, p.alpha), size=source.n_classes)
    counts = ensure_min_total(split_by_proportions(proportions, totals), p.min_samples,
                              "min_samples")
    train_pool, test_pool = source_pools(source)
    train = rows_from_counts(labels, counts, rng)
    test = matched_test(test_pool.labels, counts, rng)
    clusters = client_groups(p.n_clients, n_groups)
    angles = np.asarray(p.angles, dtype=np.float64)[clusters]
    info: list[dict[str, Any]] = [{"angle": a} for a in p.angles]
    return Plan(train_pool, train, test_pool, test, clusters, info,
                train_angles=per_row(angles, train), test_angles=per_row(angles, test),
                extra={"n_samples": n})


# ====================================================================== registration

for _spec in (
    ScenarioSpec("writers", WritersParams, plan_writers, "labels", "FLT §4.2 scenario 3; LEAF",
                 "each FEMNIST writer one client, no true clusters"),
    ScenarioSpec("structured_femnist", StructuredFemnistParams, plan_structured_femnist,
                 "labels", "FLT §4.2 scenario 4, App. C.4",
                 "EMNIST balanced: 10 label sets, power-law sizes"),
    ScenarioSpec("dirichlet_rotation", DirichletRotationParams, plan_dirichlet_rotation,
                 "images", "CFL-GP F.8", "label skew Dir(α) and one rotation per cluster"),
):
    SCENARIOS[_spec.name] = _spec
