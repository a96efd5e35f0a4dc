"""A tiny run config on the built-in digits (two rotation groups, a small MLP, no figures),
shared by tests that only need some run to happen."""

from __future__ import annotations

from typing import Any


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
