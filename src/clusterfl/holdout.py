"""Held-out clients (`[scenario] holdout`, `docs/placement.md`): which clients are kept out of
training, and placing them after the run.

A stratified, seeded share of the federation's clients is kept out
(`data.federation.holdout_split`); the method trains on the others, renumbered
0..n_train−1. After the last round the held-out clients, renumbered 0..n_hold−1 on a context
of their own, are placed (`Algorithm.placement`) and evaluated with the models they were
placed on. The method never learns that the clients exist before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clusterfl import metrics
from clusterfl.algorithms import Algorithm, Context
from clusterfl.backends import Backend
from clusterfl.backends.subset import SubsetBackend
from clusterfl.config import Config
from clusterfl.config_util import client_ids
from clusterfl.data.federation import Federation, holdout_split
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory
from clusterfl.protocol import EvaluateRequest
from clusterfl.records import json_ready
from clusterfl.robust.guard import Guard


@dataclass
class Holdout:
    """The split of `full` (the whole federation) into the clients that train and the
    held-out ones, as ids in `full`."""

    config: Config
    full: Federation
    train_ids: np.ndarray
    ids: np.ndarray

    @classmethod
    def split(cls, config: Config, algorithm: Algorithm, full: Federation) -> Holdout:
        """`[scenario] holdout` of `full` (every client trains without it)."""
        fraction = float(getattr(config.scenario, "holdout", None) or 0.0)
        if not fraction:
            return cls(config, full, np.arange(full.n_clients), np.zeros(0, dtype=np.int64))
        if type(algorithm).placement is Algorithm.placement:
            raise ConfigError("scenario.holdout", f"{algorithm.label()} cannot place new "
                              "clients yet; allowed for it: 0 (no held-out clients)")
        train, hold = holdout_split(full.clusters, full.n_clients, fraction, config.run.seed)
        k = getattr(config.algorithm, "n_clusters", None)
        if isinstance(k, int) and k > len(train):
            raise ConfigError("scenario.holdout", f"{fraction:g} leaves {len(train)} clients "
                              f"to train, fewer than algorithm.n_clusters = {k}; allowed: at "
                              f"most {(full.n_clients - k) / full.n_clients:.3g}")
        return cls(config, full, train, hold)

    def context(self, factory: ModelFactory, backend: Backend,
                ids: np.ndarray | list[int]) -> Context:
        """The context a placement runs in: clients `ids` of the whole federation (held by
        `backend`) as 0..n−1, the run's seed and rounds, a generator of its own (the same for
        every placement: `clusterfl place` of the held-out clients repeats the run's), the
        placement's guard (`guard`), its own communication count."""
        run = self.config.run
        ids = client_ids(ids, self.full.n_clients, "ids")
        sizes = self.full.train_sizes[ids]
        return Context(
            backend=SubsetBackend(backend, ids), factory=factory,
            training=self.config.train.local_training(), n_clients=len(ids),
            train_sizes=sizes, rng=np.random.default_rng([run.seed, 6007]),
            seed=run.seed, rounds=run.rounds, guard=self.guard(len(ids), sizes))

    def guard(self, n: int, train_sizes: np.ndarray) -> Guard:
        """The robustness layer of a placement of `n` clients: the run's `[validation]`, and
        its `[privacy]` when the run's clients were private (`private`), with every
        newcomer's update noised alone — N(0, σ²S²) on each, `noise = "local"` whatever the
        run's `noise` — because a placement decides from each newcomer's update by itself
        (it forms no aggregate to share the noise over); every newcomer is asked in every
        release (sampling rate 1). No faults and no attackers: those are drawn among the
        trained clients and the run's rounds. Its noise comes from round T + 1 (after the
        run's last round), so it never repeats a draw of the run's."""
        privacy = None
        p = self.config.privacy
        if private(self.config):
            privacy = p.model_copy(update={"noise": "local"}) if p.noise_multiplier > 0 else p
        guard = Guard(n, self.config.run.seed, train_sizes, self.config.validation,
                      privacy=privacy, sampling_rate=1.0)
        guard.begin_round(self.config.run.rounds + 1)
        return guard

    def place(self, algorithm: Algorithm, factory: ModelFactory,
              backend: Backend) -> dict[str, Any]:
        """Place the held-out clients with the trained `algorithm` and evaluate them on the
        models they were placed on; `backend` holds the whole federation. The result is
        `summary.json`'s `holdout` table."""
        fed, ids = self.full, self.ids
        ctx = self.context(factory, backend, ids)
        placed = algorithm.placement(ctx, np.arange(len(ids)))
        reply = ctx.send(EvaluateRequest(placed.clients, placed.predictor))
        acc = np.full(len(ids), np.nan)
        acc[reply.clients] = reply.accuracy
        truth = None if fed.clusters is None else fed.clusters[ids]
        # Local: every client keeps its own model, a newcomer joins no cluster (-1): "placed
        # in its group's cluster" has no meaning there (it read 0 %, and the ARI 0)
        shared = self.config.algorithm.shares_updates
        out: dict[str, Any] = {
            "fraction": float(getattr(self.config.scenario, "holdout", 0.0) or 0.0),
            "n_trained": len(self.train_ids), "n_held_out": len(ids),
            "trained_clients": self.train_ids.tolist(), "clients": ids.tolist(),
            "true_clusters": None if truth is None else truth.tolist(),
            "placed_clusters": np.asarray(placed.clusters).tolist(),
            "accuracy": acc.tolist(),
            "placement_ari": metrics.ari(truth, np.asarray(placed.clusters)) if shared
            else None,
            "placement_match": placement_match(
                truth, np.asarray(placed.clusters), fed.clusters[self.train_ids]
                if fed.clusters is not None else None, algorithm.assignment()) if shared
            else None,
            "holdout_accuracy": metrics.summarize(reply)["accuracy"],
            "floats_down": ctx.floats_down, "floats_up": ctx.floats_up,
        }
        if fed.task == "regression" and "mse" in reply.extras:
            mse = np.full(len(ids), np.nan)
            mse[reply.clients] = reply.extras["mse"]
            out["mse"] = mse.tolist()
        if placed.details is not None:
            out["details"] = placed.details
        if self.config.privacy.clip is not None:
            out["privacy"] = placement_privacy(self.config, ctx, algorithm.label())
        if ctx.log:  # what the method says about the placement (FLT: a UMAP fit differs)
            out["warnings"] = list(ctx.log)
        return json_ready(out)


def private(config: Config) -> bool:
    """Whether `[privacy]` applies to the run's clients (and so to its newcomers): it is set
    and the method sends updates (Local's training stays on its clients: clipping and
    noising it would protect nothing)."""
    return config.privacy.clip is not None and config.algorithm.shares_updates


def placement_privacy(config: Config, ctx: Context, label: str) -> dict[str, Any] | None:
    """What `[privacy]` did for a placement by `label` (the method) on `ctx` (its guard,
    `Holdout.guard`): the
    guard's report — clip, σ, the noised releases, ε at δ for the newcomers (each newcomer's
    data is in no release of the run: these releases are all its ε counts) — and `note`, one
    line saying what it covers. None without `[privacy]`."""
    if config.privacy.clip is None:
        return None
    if not private(config):
        return {"note": f"[privacy] does not apply to {label}: its newcomers send nothing "
                        "to the server"}
    assert ctx.guard is not None
    report = ctx.guard.privacy_report()
    assert report is not None
    releases = report["releases"]
    clipped = int(ctx.guard.totals["clipped"])
    if ctx.client_updates:  # updates (models, gradients) went through the guard's privacy
        eps = report["epsilon"]
        said = ("no noise (noise_multiplier = 0): no ε" if eps is None else
                f"ε = {eps:.4g} at δ = {report['delta']:g} over {releases} release(s), each "
                f"newcomer's update noised alone (σ = {report['noise_multiplier']:g})")
        note = (f"the newcomers' updates were clipped to S = {report['clip']:g} "
                f"({clipped} above it); {said}")
    elif ctx.floats_up > 0:  # an ε of 0 would read as "nothing revealed": it is unknown
        report["epsilon"] = None
        note = (f"{label}'s placement sends no update (model or gradient) to clip or noise: "
                "what its newcomers send (losses, signatures, bases, counts, mixture "
                "weights) is not covered by [privacy], as in the run (docs/security.md)")
    else:
        note = f"{label}'s placement asks the newcomers for nothing: nothing to protect"
    return {**report, "note": note}


def placement_match(truth: np.ndarray | None, placed: np.ndarray,
                    trained_truth: np.ndarray | None, assignment: np.ndarray) -> float | None:
    """The share of held-out clients placed in their group's cluster: the cluster that holds
    most of the trained clients of their true group (ties: the smaller id). Unlike the
    placement ARI, which compares the held-out clients only with one another (with one per
    group, any placement that keeps them apart scores 1), it asks whether each newcomer joined
    its own group. None without true clusters, or when no trained client of any held-out
    client's group has a cluster."""
    if truth is None or trained_truth is None or not len(truth):
        return None
    assignment = np.asarray(assignment)
    hits, known = 0, 0
    for group, cluster in zip(np.asarray(truth).tolist(), np.asarray(placed).tolist(),
                              strict=True):
        mine = assignment[(np.asarray(trained_truth) == group) & (assignment >= 0)]
        if not len(mine):
            continue
        values, counts = np.unique(mine, return_counts=True)
        known += 1
        hits += int(cluster == int(values[int(np.argmax(counts))]))
    return None if known == 0 else hits / known
