"""The four robustness tables of a run config: `[validation]`, `[faults]`, `[adversary]`,
`[privacy]`. Every default leaves a run exactly as it was without the table.

    [validation]  reject bad client replies before any algorithm sees them
    [faults]      clients drop out of rounds; stragglers do part of their local work
    [adversary]   a fraction of the clients attacks (label flipping or poisoned updates)
    [privacy]     client-level DP: per-client clipping, Gaussian noise, ε by dp-accounting
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from clusterfl.config_util import Settings, changed_fields
from clusterfl.errors import ConfigError


class _Strict(Settings):
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


def check_adversary(adversary: AdversaryConfig) -> None:
    """An `[adversary]` table of a run config whose settings would do nothing fails in one
    line naming the setting: options beside `kind = "none"`, a kind that attacks nobody, a
    strength for label flipping (which has none)."""
    if adversary.kind == "none":
        for name in changed_fields(adversary, "fraction", "clients", "scale"):
            raise ConfigError(f"adversary.{name}", "set while adversary.kind = 'none' (no "
                              "attack); choose a kind (label_flip, sign_flip, scale, "
                              f"random) or leave {name} out")
    elif adversary.fraction == 0 and not adversary.clients:
        raise ConfigError("adversary.fraction", f"adversary.kind = {adversary.kind!r} attacks "
                          "nobody; set a fraction > 0 or list the attackers in "
                          "adversary.clients")
    if adversary.kind == "label_flip" and adversary.scale is not None:
        raise ConfigError("adversary.scale", "label_flip has no strength (labels y → C−1−y); "
                          "leave scale out, or use sign_flip, scale or random")


FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32, the models' numbers: a clip or noise std beyond it is infinite."""


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
        if self.clip is not None and self.clip * max(1.0, self.noise_multiplier) > FLOAT32_MAX:
            raise ValueError(f"clip {self.clip:g} × noise_multiplier {self.noise_multiplier:g} "
                             f"is beyond float32 ({FLOAT32_MAX:.3g}): the models' numbers; "
                             "allowed: a product below that")
        return self


def check_robust(rounds: int, validation: ValidationConfig, faults: FaultsConfig,
                 adversary: AdversaryConfig, privacy: PrivacyConfig) -> None:
    """The robustness tables of a run config, checked together: a setting that would change
    nothing (its switch is off, or what it applies to is absent) fails in one line naming
    it, instead of running as if it were not there (issue 35). Defaults never fail, so every
    run's written-back `config.toml` loads again."""
    check_adversary(adversary)
    if not validation.enabled:
        for name in changed_fields(validation, "max_norm", "median_multiple",
                             "min_replies_for_median"):
            raise ConfigError(f"validation.{name}", "set while validation.enabled = false "
                              "(replies pass unchecked); enable validation or leave it out")
    if faults.drop_rounds and not faults.drop_clients:
        raise ConfigError("faults.drop_rounds", "set without faults.drop_clients (nobody "
                          "drops out); list the clients, or use faults.dropout")
    late = [r for r in faults.drop_rounds if r > rounds]
    if late:
        raise ConfigError("faults.drop_rounds", f"rounds {late} come after the run's last "
                          f"round (rounds = {rounds}); allowed: 1..{rounds}")
    if faults.stragglers == 0 and changed_fields(faults, "straggler_work"):
        raise ConfigError("faults.straggler_work", "set while faults.stragglers = 0 (no "
                          "client straggles); set stragglers > 0 or leave it out")
    if privacy.clip is None:
        for name in changed_fields(privacy, "noise", "delta"):
            raise ConfigError(f"privacy.{name}", "set while privacy.clip is not set (privacy "
                              "is off); set privacy.clip or leave it out")
    elif privacy.noise_multiplier == 0:
        if privacy.noise == "local":
            raise ConfigError("privacy.noise", "'local' with noise_multiplier = 0 adds no "
                              "noise; set noise_multiplier > 0 or leave noise out")
        if changed_fields(privacy, "delta"):
            raise ConfigError("privacy.delta", "no (ε, δ) is reported without noise "
                              "(noise_multiplier = 0); set noise_multiplier > 0 or leave "
                              "delta out")


def median_rule_warnings(validation: ValidationConfig, n_clients: int,
                         per_round: int | None = None, sampling: str = "") -> list[str]:
    """A line when the median rule a user set (`median_multiple` or `min_replies_for_median`
    away from their defaults) can never, or never in a sampled round, see a reply of
    `min_replies_for_median` clients: with `n_clients` that train, or `per_round` clients
    asked a round (`sampling`: the setting that says so). Defaults never warn."""
    need = validation.min_replies_for_median
    if not validation.enabled or validation.median_multiple is None or not changed_fields(
            validation, "median_multiple", "min_replies_for_median"):
        return []
    rule = (f"validation.median_multiple = {validation.median_multiple:g} applies only to "
            f"replies of at least validation.min_replies_for_median = {need} clients")
    if need > n_clients:
        return [f"{rule}, and only {n_clients} clients train: it never applies; allowed "
                f"min_replies_for_median: 1..{n_clients}"]
    if per_round is not None and need > per_round:
        return [f"{rule}, and a sampled round asks {per_round} ({sampling}): it applies only "
                "in rounds that ask more clients (if the method has any); allowed "
                f"min_replies_for_median: 1..{per_round}"]
    return []


def delta_warnings(privacy: PrivacyConfig, n_clients: int) -> list[str]:
    """A line when the reported (ε, δ) guarantees nothing: a δ of at least 1/n for client-level
    DP over `n_clients` (a mechanism that publishes one random client's update outright is
    (0, 1/n)-DP). Only with noise (else no ε is reported)."""
    if privacy.clip is None or privacy.noise_multiplier == 0 or privacy.delta * n_clients < 1:
        return []
    return [f"privacy.delta = {privacy.delta:g} is not below 1/n = 1/{n_clients} (the clients "
            "that train): with δ ≥ 1/n, (ε, δ)-DP allows publishing one client's update "
            "outright, so the reported ε protects nobody; allowed for a guarantee: delta < "
            f"{1 / n_clients:.3g} (usually far below; default 1e-5)"]


__all__ = ["AdversaryConfig", "AttackKind", "FaultsConfig", "PrivacyConfig",
           "ValidationConfig", "check_adversary", "check_robust", "delta_warnings",
           "median_rule_warnings"]
