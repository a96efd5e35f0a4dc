"""Has the run diverged? A diagnosis of one round's client updates.

The guard counts, per round, the training and gradient replies that were uploaded and those
that survived validation, with the clients' training losses (`RoundUpdates`). A round is
diverged when

1. updates were uploaded and validation rejected every one of them ("rejected"): the method
   learnt nothing this round;
2. the training loss is not finite for at least half of the clients ("non_finite_loss");
3. the median training loss exceeds `EXPLODE_FACTOR` × the loss scale of the task
   ("exploding_loss"): ln(C) for C classes — the cross-entropy of a uniform guess, about what
   a fresh model scores — or, for a regression, the mean squared target (the error of
   predicting 0). A healthy run stays far below; `lr = 1e6` ends there in its first round.

A round without uploaded updates (evaluation, clustering, everyone dropped out) is never
diverged. `diagnose` returns a `Divergence` whose `reason` names the round and the likely
cause, e.g. "round 3: every update was rejected (non_finite) — learning rate too high?".
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

EXPLODE_FACTOR = 100.0

_CAUSES = {  # a rejection's cause ("non_finite": the run's, as a loss that is not finite)
    "norm": "learning rate too high, or the [validation] norm bounds too tight?",
    "n_samples": "clients without training samples?",
    "shape": "replies of the wrong width: a backend or model mismatch?",
}
_LR = "learning rate too high? (train.lr)"


@dataclass
class RoundUpdates:
    """The training / gradient replies of one round, as the guard saw them."""

    uploaded: int = 0
    """Replies uploaded (before validation)."""
    kept: int = 0
    """Replies that passed validation."""
    losses: list[float] = field(default_factory=list)
    """The clients' training losses, one per uploaded reply."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Rejected update replies by reason (`Rejection.reason`)."""


@dataclass(frozen=True)
class Divergence:
    round: int
    kind: str
    """"rejected", "non_finite_loss" or "exploding_loss"."""
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"round": self.round, "kind": self.kind, "reason": self.reason}


def loss_scale(task: str, n_classes: int, mean_sq_target: float | None = None) -> float | None:
    """What a fresh model's training loss is about: ln(C) (a language model: ln of the
    vocabulary size), or the mean squared target of a regression (None when unknown: no
    "exploding" check)."""
    if task in ("classification", "language_model"):
        return math.log(n_classes) if n_classes >= 2 else None
    if mean_sq_target is None or not math.isfinite(mean_sq_target) or mean_sq_target <= 0:
        return None
    return float(mean_sq_target)


def noise_cause(noise_multiplier: float, clip: float | None,
                suspects: list[str] | None = None) -> str:
    """The likely cause of a run that diverges: under privacy noise (`[privacy]`) the noise
    first, then the learning rate, then `suspects` (the run's other settings that can make
    training blow up, set away from their defaults: `train.weight_decay = 1e+06`)."""
    others = f", or {', '.join(suspects)}?" if suspects else ""
    if noise_multiplier <= 0 or clip is None:
        return _LR + others
    return (f"privacy noise too large? (privacy.noise_multiplier {noise_multiplier:g} × clip "
            f"{clip:g}: noise of std {noise_multiplier * clip:.3g} on each coordinate of an "
            f"aggregate's sum), or {_LR}{others}")


def diagnose(t: int, updates: RoundUpdates, scale: float | None,
             cause: str = _LR) -> Divergence | None:
    """The divergence of round `t`, or None when the round looks healthy; `cause`: what a
    loss that is not finite or exploded likely comes from (`noise_cause`)."""
    n = updates.uploaded
    if n == 0:
        return None
    if updates.kept == 0:
        reasons = [r for r, _ in updates.rejected.most_common()] or ["rejected"]
        cause = cause if reasons[0] == "non_finite" else _CAUSES.get(
            reasons[0], "check the [validation] settings")
        return Divergence(t, "rejected", f"round {t}: every update was rejected "
                                         f"({', '.join(reasons)}) — {cause}")
    losses = np.asarray(updates.losses, dtype=np.float64)
    if len(losses) == 0:
        return None
    bad = int((~np.isfinite(losses)).sum())
    if 2 * bad >= len(losses):
        return Divergence(t, "non_finite_loss", f"round {t}: the training loss is not finite "
                                                f"for {bad} of {len(losses)} clients — {cause}")
    median = float(np.median(losses[np.isfinite(losses)]))
    if scale is not None and median > EXPLODE_FACTOR * scale:
        return Divergence(t, "exploding_loss", f"round {t}: the training loss exploded (median "
                          f"{median:.3g}, over {EXPLODE_FACTOR:g}× a fresh model's "
                          f"{scale:.3g}) — {cause}")
    return None


__all__ = ["EXPLODE_FACTOR", "Divergence", "RoundUpdates", "diagnose", "loss_scale",
           "noise_cause"]
