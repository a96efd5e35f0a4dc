"""Robustness for every method at once, hooked into `Context.send` (docs/security.md).

- `faults`: clients drop out of rounds, stragglers finish part of their local work;
- `validate`: replies with NaN/Inf, a wrong shape or an absurd update norm are rejected;
- `adversary`: label flipping, sign-flipped / scaled / random updates of chosen clients;
- `privacy`: per-client clipping, Gaussian noise per aggregate, ε by dp-accounting;
- `guard`: the layer that applies all of it to each request;
- `config`: the `[validation]`, `[faults]`, `[adversary]` and `[privacy]` tables.
"""

from __future__ import annotations

from clusterfl.robust.config import (
    AdversaryConfig,
    FaultsConfig,
    PrivacyConfig,
    ValidationConfig,
)

__all__ = [
    "AdversaryConfig",
    "FaultsConfig",
    "PrivacyConfig",
    "ValidationConfig",
]
