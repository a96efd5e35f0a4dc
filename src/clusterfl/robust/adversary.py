"""Adversarial clients, a scenario option for measuring robustness (docs/security.md).

Isolating adversaries is a claim of CFL (Sattler et al. 2020, Section I: clients with
adversarial or corrupted data end up in clusters of their own). The attacks:

- `label_flip` (data poisoning): the attacker's training labels become y → C − 1 − y (its
  test labels are untouched, so its reported accuracy shows what the attack did to its model).
  Applied once to the federation after the scenario built it.
- `sign_flip`, `scale`, `random` (model poisoning): the attacker trains honestly, then
  replaces its update Δ = θ_i − θ_start (gradient replies: g_i) before sending it:
  sign_flip → −s·Δ, scale → s·Δ, random → a Gaussian direction with norm s·‖Δ‖ (so a plain
  norm bound does not catch it). s is `[adversary] scale` (default 1, 10 for `scale`).
  Losses reported to the server (IFCA's cluster choice) are left honest.

Who attacks: `clients`, or round(fraction × C) clients drawn from (seed, "adversary"). The ids
are a diagnostic, like the true clusters: the summary records them, algorithms never see them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from clusterfl.data.federation import Federation
from clusterfl.errors import ConfigError
from clusterfl.robust.config import AdversaryConfig

_ADVERSARY_STREAM = 4242


def training_ids(held_out: int) -> str:
    """What client ids of the robustness tables count when `scenario.holdout` holds clients
    out ('' when it holds none)."""
    return (f" that train ({held_out} more are held out by scenario.holdout; these ids "
            "count the clients that train)") if held_out else ""


def choose_adversaries(config: AdversaryConfig, n_clients: int, seed: int,
                       held_out: int = 0) -> np.ndarray:
    """Sorted ids of the attacking clients (empty when `kind` is "none"); `held_out`: the
    clients `scenario.holdout` keeps from training (the ids count the others)."""
    if config.kind == "none":
        return np.zeros(0, dtype=np.int64)
    if config.clients:
        bad = [c for c in config.clients if c >= n_clients]
        if bad:
            raise ConfigError("adversary.clients", f"ids {bad} do not exist; the federation "
                              f"has clients 0..{n_clients - 1}{training_ids(held_out)}")
        ids = np.unique(np.asarray(config.clients, dtype=np.int64))
        _some_honest(len(ids), n_clients, "adversary.clients")
        return ids
    k = round(config.fraction * n_clients)
    if k == 0:
        raise ConfigError("adversary.fraction", f"{config.fraction} of {n_clients} clients is no "
                          f"attacker (it rounds to 0); use a fraction above "
                          f"{0.5 / n_clients:.3g}, or list the attackers in adversary.clients")
    _some_honest(k, n_clients, "adversary.fraction")
    rng = np.random.default_rng([seed, _ADVERSARY_STREAM])
    return np.sort(rng.choice(n_clients, size=k, replace=False)).astype(np.int64)


def _some_honest(attackers: int, n_clients: int, field: str) -> None:
    """The honest clients are what a robust run is measured on: at least one must be left."""
    if attackers >= n_clients:
        raise ConfigError(field, f"all {n_clients} clients would attack, leaving no honest "
                          "client to learn from or to measure; allowed: fewer attackers than "
                          "clients")


def flip_labels(federation: Federation, clients: np.ndarray) -> Federation:
    """A copy of the federation where `clients` train on labels y → C − 1 − y."""
    if federation.task != "classification":
        raise ConfigError("adversary.kind", "label_flip needs a classification scenario; "
                          "allowed for regression: none, sign_flip, scale, random")
    y = federation.y_train.clone()
    off = federation.train_offsets
    for c in np.asarray(clients, dtype=np.int64):
        lo, hi = int(off[c]), int(off[c + 1])
        y[lo:hi] = federation.n_classes - 1 - y[lo:hi]
    meta = {**federation.meta, "adversaries": [int(c) for c in clients],
            "adversary_kind": "label_flip"}
    return replace(federation, y_train=y, meta=meta)


def poison(kind: str, updates: torch.Tensor, strength: float,
           generator: torch.Generator) -> torch.Tensor:
    """The updates `[m, d]` the attackers send instead of their honest `updates`."""
    if kind == "sign_flip":
        return -strength * updates
    if kind == "scale":
        return strength * updates
    if kind == "random":
        noise = torch.randn(updates.shape, generator=generator, dtype=torch.float64)
        norm = torch.linalg.vector_norm(noise, dim=1, keepdim=True).clamp_min(1e-30)
        honest = torch.linalg.vector_norm(updates.double(), dim=1, keepdim=True)
        return (noise / norm * honest * strength).to(updates.dtype)
    return updates


def benign_vs_adversarial(assignment: np.ndarray, adversaries: np.ndarray) -> dict[str, float]:
    """How well a clustering puts the attackers apart from the benign clients.

    - `ari_adversarial`: ARI between the assignment and the benign/attacker labelling;
    - `isolated`: share of attackers whose cluster holds no benign client;
    - `benign_exposed`: share of benign clients whose cluster holds an attacker.
    Clients without a cluster (−1) count as a cluster of their own each.
    """
    from clusterfl.metrics import ari, lone_clusters

    a = lone_clusters(assignment)
    n = len(a)
    bad = np.zeros(n, dtype=bool)
    bad[np.asarray(adversaries, dtype=np.int64)] = True
    if not bad.any():
        return {}
    dirty = {int(k) for k in np.unique(a[bad])}
    mixed = {k for k in dirty if (~bad & (a == k)).any()}
    return {
        "ari_adversarial": float(ari(bad.astype(np.int64), a) or 0.0),
        "isolated": float(np.mean([int(a[i]) not in mixed for i in np.flatnonzero(bad)])),
        "benign_exposed": float(np.mean([int(a[i]) in dirty for i in np.flatnonzero(~bad)]))
        if (~bad).any() else 0.0,
    }


__all__ = ["benign_vs_adversarial", "choose_adversaries", "flip_labels", "poison"]
