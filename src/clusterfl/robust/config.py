"""The four robustness tables of a run config: `[validation]`, `[faults]`, `[adversary]`,
`[privacy]`. Every default leaves a run exactly as it was without the table.

    [validation]  reject bad client replies before any algorithm sees them
    [faults]      clients drop out of rounds; stragglers do part of their local work
    [adversary]   a fraction of the clients attacks (label flipping or poisoned updates)
    [privacy]     client-level DP: per-client clipping, Gaussian noise, ε by dp-accounting
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # no bound is None, not inf


class ValidationConfig(_Strict):
    """Checks of every training / gradient reply (see `clusterfl.robust.validate`).

    Always on: the reply has one row per answering client and the model's width d, its
    parameters (or gradient) and sample count are finite, the sample count is positive.
    An update is "absurd" when its norm ‖θ_i − θ_start‖ (gradient replies: ‖g_i‖) exceeds
    `max_norm`, or exceeds `median_multiple` × the median norm of the same reply.
    """

    enabled: bool = Field(True, description="false: pass replies through unchecked")
    max_norm: float | None = Field(
        None, gt=0.0, description="reject an update whose norm exceeds this (None: no "
        "absolute bound)")
    median_multiple: float | None = Field(
        100.0, gt=1.0, description="reject an update whose norm exceeds this multiple of the "
        "reply's median update norm (None: off). Default 100: only absurd outliers")
    min_replies_for_median: int = Field(
        3, ge=1, description="the median rule applies only to replies of at least this many "
        "clients")


class FaultsConfig(_Strict):
    """Client failures (see `clusterfl.robust.faults`). Evaluation is never affected."""

    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="probability that a client is unreachable for a "
        "whole round (independently per client and round)")
    drop_clients: list[int] = Field(
        default_factory=list, description="clients that are unreachable in `drop_rounds`")
    drop_rounds: list[int] = Field(
        default_factory=list, description="rounds in which `drop_clients` are unreachable "
        "(empty: every round)")
    stragglers: float = Field(
        0.0, ge=0.0, lt=1.0, description="probability that a reachable client is a straggler "
        "in a round")
    straggler_work: float = Field(
        0.5, ge=0.0, le=1.0, description="share of its local steps a straggler finishes by "
        "the deadline; 0: it misses the deadline and its training reply is lost")

    @model_validator(mode="after")
    def _ids(self) -> FaultsConfig:
        if any(c < 0 for c in self.drop_clients):
            raise ValueError("drop_clients: client ids are >= 0")
        if any(r < 1 for r in self.drop_rounds):
            raise ValueError("drop_rounds: rounds are numbered from 1")
        return self


AttackKind = Literal["none", "label_flip", "sign_flip", "scale", "random"]


class AdversaryConfig(_Strict):
    """Malicious clients (see `clusterfl.robust.adversary`)."""

    kind: AttackKind = Field(
        "none", description="'label_flip' (their training labels y → C−1−y), 'sign_flip' "
        "(update × −scale), 'scale' (update × scale), 'random' (Gaussian update of scale × "
        "the honest norm)")
    fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of clients that attack")
    clients: list[int] = Field(
        default_factory=list, description="attacking client ids (instead of `fraction`)")
    scale: float | None = Field(
        None, gt=0.0, description="attack strength (default: 1 for sign_flip and random, "
        "10 for scale)")

    @model_validator(mode="after")
    def _either(self) -> AdversaryConfig:
        if self.clients and self.fraction > 0:
            raise ValueError("give either `fraction` or `clients`, not both")
        if any(c < 0 for c in self.clients):
            raise ValueError("clients: client ids are >= 0")
        return self

    def strength(self) -> float:
        """The attack's scale, with the per-kind default."""
        if self.scale is not None:
            return float(self.scale)
        return 10.0 if self.kind == "scale" else 1.0


class PrivacyConfig(_Strict):
    """Client-level differential privacy (see `clusterfl.robust.privacy`)."""

    clip: float | None = Field(
        None, gt=0.0, description="S: every client's update (or gradient) is clipped to norm "
        "S (None: privacy off)")
    noise_multiplier: float = Field(
        0.0, ge=0.0, description="σ: Gaussian noise of std σ·S on every aggregate's sum "
        "(0: clipping only, no ε)")
    noise: Literal["aggregate", "local"] = Field(
        "aggregate", description="'aggregate': each cluster aggregate gets N(0, σ²S²) on its "
        "sum (shares of it added per client); 'local': every client adds N(0, σ²S²) itself")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="δ of the reported (ε, δ)")

    @model_validator(mode="after")
    def _needs_clip(self) -> PrivacyConfig:
        if self.noise_multiplier > 0 and self.clip is None:
            raise ValueError("noise_multiplier > 0 needs clip (the noise is σ·clip)")
        return self


__all__ = ["AdversaryConfig", "AttackKind", "FaultsConfig", "PrivacyConfig",
           "ValidationConfig"]
