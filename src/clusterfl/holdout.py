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
        default guard, its own communication count."""
        run = self.config.run
        ids = client_ids(ids, self.full.n_clients, "ids")
        return Context(
            backend=SubsetBackend(backend, ids), factory=factory,
            training=self.config.train.local_training(), n_clients=len(ids),
            train_sizes=self.full.train_sizes[ids], rng=np.random.default_rng([run.seed, 6007]),
            seed=run.seed, rounds=run.rounds)

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
        return json_ready(out)


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
