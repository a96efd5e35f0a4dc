"""The parameters of every scenario (`clusterfl.data.scenarios`), one pydantic class each, and
the rotation presets they name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from clusterfl.config_util import Settings, changed_fields
from clusterfl.errors import ConfigError

IFCA_ANGLES: tuple[float, ...] = (0.0, 90.0, 180.0, 270.0)
"""The four rotations of IFCA (Ghosh et al. 2020), also CFL-GP Appendix F.5.1 (Fig. 13)."""

CFLGP_ANGLES: tuple[float, ...] = (0.0, 15.0, 90.0, 105.0, 180.0, 195.0, 270.0, 275.0)
"""The eight rotations of CFL-GP's rotated MNIST as the authors' released code sets them.

The paper is inconsistent: §5.2 lists 0, 15, 90, 105, 180, 195, 270, 275 while Appendix F.5
lists 0, 15, 90, 105, 180, 185, 270, 285. We follow the code (identical to §5.2).
"""

ROTATION_PRESETS: dict[str, tuple[float, ...]] = {"ifca": IFCA_ANGLES, "cflgp": CFLGP_ANGLES}


# ====================================================================== parameters


def _within_a_turn(angles: Sequence[float]) -> None:
    """Angles in degrees within -360..360 (1e308 was taken, a rotation whose float remainder
    modulo 360 has no digits left: a typo, unsaid)."""
    wild = next((a for a in angles if abs(a) > 360), None)
    if wild is not None:
        raise ValueError(f"{wild:g} is no angle in degrees; allowed: -360..360")


def distinct_rotations(value: list[float]) -> list[float]:
    """The angles of a scenario's rotation clusters, each a rotation of its own (0 and 360 are
    one: two groups at one rotation would be one distribution under two labels)."""
    if not value:
        raise ValueError("needs at least one angle")
    _within_a_turn(value)
    seen: dict[float, float] = {}
    for a in value:
        if a % 360 in seen:
            raise ValueError(f"{seen[a % 360]:g} and {a:g} are the same rotation: list "
                             "each angle once (one angle per cluster)")
        seen[a % 360] = a
    return value


class ScenarioParams(Settings):
    """Fields shared by every scenario; nan and inf are no setting of any (a nan angle made
    every image of its clients nan)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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

    clients_per_group: list[int] | None = Field(
        None, description="clients of each angle's group, one positive count per angle, "
        "summing to n_clients (default: near-equal groups); layout 'split' only")

    @field_validator("angles")
    @classmethod
    def _distinct_angles(cls, value: list[float]) -> list[float]:
        return distinct_rotations(value)

    @model_validator(mode="after")
    def _group_counts(self) -> RotationParams:
        counts = self.clients_per_group
        if counts is None:
            return self
        if len(counts) != len(self.angles) or min(counts) < 1 or sum(counts) != self.n_clients:
            raise ValueError(f"clients_per_group needs {len(self.angles)} positive counts (one "
                             f"per angle) summing to n_clients = {self.n_clients}")
        if self.layout != "split":
            raise ValueError("clients_per_group works with layout 'split' only")
        return self


class RotationMixtureParams(_RotationLayoutParams):
    """CFL-GP F.5.2: groups at angle a, at angle b, and a group mixing a (prob. κ) and b."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(12, ge=3)
    kappa: float = Field(0.5, ge=0.0, le=1.0, description="probability of the first angle")
    angles: tuple[float, float] = (0.0, 180.0)

    @field_validator("kappa")
    @classmethod
    def _mixed(cls, value: float) -> float:
        if value in (0.0, 1.0):
            which = "second" if value == 0.0 else "first"
            raise ValueError(f"{value:g} makes the mixture group the {which} angle's group "
                             "again (two true clusters with one distribution); give 0 < "
                             "kappa < 1")
        return value

    @field_validator("angles")
    @classmethod
    def _two(cls, value: tuple[float, float]) -> tuple[float, float]:
        _within_a_turn(value)
        if value[0] % 360 == value[1] % 360:
            raise ValueError(f"{value[0]:g} and {value[1]:g} are the same rotation: the three "
                             "groups would share one distribution")
        return value


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

    @model_validator(mode="after")
    def _partitioner_sizes(self) -> ClusterPartitionerParams:
        """The partitioner decides the clients' sizes and split: the options of `rotation`
        about sizes and layout would be accepted and ignored."""
        unused = changed_fields(self, "n_train_per_client", "n_test_per_client", "layout",
                                "train_fraction")  # a written-back config holds defaults
        if unused:
            raise ValueError(f"{unused[0]} is not used by cluster_partitioner: the partitioner "
                             "(and its options) sets each client's share of its cluster's rows")
        return self


class DirichletParams(ScenarioParams):
    """CAM §5 (Hsu et al.): per class, Dir(α) proportions over the clients."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    alpha: float = Field(0.1, gt=0.0)
    min_samples: int = Field(1, ge=1, description="minimum training rows per client")


class _CamClustersParams(ScenarioParams):
    n_clients: int = Field(200, ge=1)
    n_clusters: int = Field(5, ge=1)


class ClusterDirichletParams(_CamClustersParams):
    """CAM §5: per class Dir(α1) over clusters, then Dir(α2) over each cluster's clients."""

    model_config = ConfigDict(extra="forbid")
    alpha1: float = Field(0.1, gt=0.0)
    alpha2: float = Field(10.0, gt=0.0)
    min_samples: int = Field(1, ge=1, description="minimum training rows per client")


TEST_ROWS = ("all (the default): every test row of a class goes to the clients holding it, "
             "in proportion to their training rows of it (where rows are left unused, a class "
             "few clients "
             "use gives them all of its test rows, so a client's test mix can differ from its "
             "training mix); matched: only the share of a class's test rows that its used "
             "training rows make, so each client's test mix follows its training mix")
"""What `test_rows` does (the scenarios that can leave training rows unused)."""


def _test_rows_used(params: ScenarioParams, unused: bool,
                    why: str = "without samples_per_client every training row of a held "
                    "class is used", fix: str = "; or set samples_per_client") -> None:
    """`test_rows = "matched"` where every training row of a held class is used changes
    nothing: a ConfigError naming it (`why`, and what to do: `fix`)."""
    if getattr(params, "test_rows", "all") == "matched" and not unused:
        raise ConfigError("scenario.test_rows", f"'matched' changes nothing here: {why}, so "
                          "each client's test mix follows its training mix already; allowed: "
                          f"'all' (or leave test_rows out){fix}")


class NClassParams(ScenarioParams):
    """CAM §5 (McMahan et al.): each client draws n random classes."""

    model_config = ConfigDict(extra="forbid")
    n_clients: int = Field(200, ge=1)
    n: int = Field(2, ge=1)
    samples_per_client: int | None = Field(
        None, ge=1, description="split evenly over the client's classes (default: each class's "
        "rows shared equally among the clients holding it)")
    test_rows: Literal["all", "matched"] | None = Field(None, description=TEST_ROWS)

    @model_validator(mode="after")
    def _a_row_per_class(self) -> NClassParams:
        if self.samples_per_client is not None and self.samples_per_client < self.n:
            raise ValueError(f"samples_per_client = {self.samples_per_client} cannot hold n = "
                             f"{self.n} classes (a row each at least); allowed: >= {self.n}")
        _test_rows_used(self, self.samples_per_client is not None)
        return self


class ClusterNClassParams(_CamClustersParams):
    """CAM §5: each cluster gets n1 classes, each client n2 of its cluster's classes."""

    model_config = ConfigDict(extra="forbid")
    n1: int = Field(3, ge=1)
    n2: int = Field(2, ge=1)
    samples_per_client: int | None = Field(None, ge=1)
    test_rows: Literal["all", "matched"] | None = Field(None, description=TEST_ROWS)

    @model_validator(mode="after")
    def _matched_changes_something(self) -> ClusterNClassParams:
        _test_rows_used(self, self.samples_per_client is not None)
        return self


class _LabelSetParams(ScenarioParams):
    n_clients: int = Field(100, ge=1)
    n_clusters: int = Field(5, ge=1)
    label_sets: Literal["disjoint", "overlapping"] = Field(
        "disjoint", description="FLT scenario 1 (disjoint) or 2 (neighbours share a label)")
    classes_per_cluster: int | None = Field(
        None, ge=1, description="default 2 (disjoint) or 3 (overlapping)")
    class_sets: list[list[int]] | None = Field(
        None, description="explicit label set of every cluster (overrides the two above)")
    test_rows: Literal["all", "matched"] | None = Field(None, description=TEST_ROWS)


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

    @model_validator(mode="after")
    def _matched_changes_nothing(self) -> PowerLawParams:
        """Each cluster's clients share out all its rows (all but the sizes' rounding, under
        one row a client: 'matched' moved 1-3 of 179-360 digits test rows)."""
        _test_rows_used(self, False, "power_law hands out every training row of a cluster's "
                        "classes (but the rounding of its sizes)", "")
        return self


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
    noise_std: float = Field(
        0.2, ge=0.0, le=1e6, description="σ; at most 1e6 (the targets x tan φ are at most 1 "
        "in size; 1e39 overflowed float32 to inf, unsaid)")
