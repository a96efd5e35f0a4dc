"""A tiny run config on the built-in digits (two rotation groups, a small MLP, no figures),
shared by tests that only need some run to happen; `blobs`, a tiny federation of two
labelling rules."""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfl.data.federation import Federation


def tiny_config(*, rounds: int = 2, n_clients: int = 4, hidden: int = 8, steps: int = 2,
                **tables: Any) -> dict[str, Any]:
    """The config as a dict; keyword `tables` replace whole tables or top-level values."""
    out: dict[str, Any] = dict(seed=0, rounds=rounds, eval_every=1, checkpoint_every=0)
    out["data"] = {"source": "digits"}
    out["scenario"] = dict(name="rotation", n_clients=n_clients, angles=[0, 180])
    out["model"] = dict(name="mlp", hidden=[hidden])
    out["train"] = dict(lr=0.1, batch_size=16, steps=steps)
    out["output"] = dict(figures=False, progress="off")
    out.update(tables)
    return out


def blobs(n_clients: int = 20, seed: int = 0) -> Federation:
    """Two groups of clients with opposite labelling rules (a clustering to find): client i
    has 20 training and 10 test points of 4 features, label x0 > 0, flipped for odd i."""
    rng = np.random.default_rng(seed)
    clients, truth = [], []
    for i in range(n_clients):
        x = rng.normal(size=(30, 4)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        if i % 2:
            y = 1 - y
        clients.append((x[:20], y[:20], x[20:], y[20:]))
        truth.append(i % 2)
    return Federation.from_clients(clients, clusters=truth, n_classes=2)
