"""Messages per participating client per round, for every registered method (issue 26).

    OMP_NUM_THREADS=1 python benchmarks/flower/messages.py [--json OUT]

A message is what Flower would send: one per client listed in a request the backend executes
(a `protocol.Steps` is one message per client, whatever its number of steps). Each method
runs 3 rounds on a tiny federation (digits, rotation 0°/180°, 8 clients, MLP 16) in process,
through a counting wrapper around the backend; the runner's evaluation requests (at the last
round only here) are counted apart. Per round: messages of each client that got any,
`max` over clients and rounds (the issue's target: 1), `mean` over (client, round) pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from typing import Any

import numpy as np
import torch

N, ROUNDS, K = 8, 3, 2
BASE: dict[str, Any] = {
    "seed": 3, "rounds": ROUNDS, "eval_every": ROUNDS, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": N, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 32, "epochs": 1},
    "output": {"figures": False, "progress": "off"},
}

# one tiny configuration per registered method (the settings of tests/algorithms/test_costs)
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {}, "fedprox": {}, "local": {},
    "fedavg_plus": {"n_models": 3}, "fedprox_plus": {"n_models": 3},
    "ifca": {"n_clusters": K}, "fesem": {"n_clusters": K},
    "ifca_cam": {"n_clusters": K, "warmup_rounds": 1},
    "fesem_cam": {"n_clusters": K, "warmup_rounds": 1},
    "cfl": {}, "cfl_gp": {"n_clusters": K},
    "flt": {"fraction": 0.5, "n_clusters": 2, "k": 3, "encoder": "none", "latent": 8,
            "finetune_epochs": 0, "umap": False},
    "pca_km_hc": {"fraction": 0.5, "n_clusters": 2, "k": 3},
    "fedem": {"n_components": 3}, "fedsoft": {"n_clusters": K, "estimation_interval": 2},
    "pacfl": {"fraction": 0.5, "p": 3, "n_clusters": 2},
    "flhc": {"fraction": 0.5, "warmup_rounds": 1, "n_clusters": 2},
}


class _Counting:
    """Wraps a backend: counts, per round, the messages each client receives."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.round = 0
        self.per_round: dict[int, Counter[int]] = {}
        self.evaluate: Counter[int] = Counter()

    def execute(self, request: Any) -> Any:
        from clusterfl.protocol import EvaluateRequest

        clients = np.asarray(request.clients).tolist()
        if isinstance(request, EvaluateRequest) and self.round == 0:
            self.evaluate.update(int(c) for c in clients)
        else:
            self.per_round.setdefault(self.round, Counter()).update(int(c) for c in clients)
        return self.inner.execute(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _digest(state: Any, h: Any) -> None:
    if isinstance(state, torch.Tensor):
        h.update(state.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(state, np.ndarray):
        h.update(np.ascontiguousarray(state).tobytes())
    elif isinstance(state, dict):
        for k in sorted(state, key=str):
            if str(k).endswith("seconds"):  # wall times (FLT's, PACFL's clustering_seconds)
                continue
            h.update(str(k).encode())
            _digest(state[k], h)
    elif isinstance(state, list | tuple):
        for v in state:
            _digest(v, h)
    else:
        h.update(repr(state).encode())


def count(name: str, options: dict[str, Any] | None = None,
          tables: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run method `name` (tiny federation, 3 rounds); its messages per client and round, and
    a fingerprint of its final state and history (to compare code versions bit for bit)."""
    import clusterfl.experiment as experiment

    torch.set_num_threads(1)
    made: list[_Counting] = []
    build = experiment.build_backend

    def counting(*args: Any) -> Any:
        made.append(_Counting(build(*args)))
        return made[-1]

    experiment.build_backend = counting
    try:
        exp = experiment.Experiment.from_config(
            {**BASE, **(tables or {}),
             "algorithm": {"name": name, **METHODS.get(name, {}), **(options or {})}})
        algo = exp.algorithm
        run_round = algo.run_round

        def counted(ctx: Any, t: int) -> Any:
            made[-1].round = t
            try:
                return run_round(ctx, t)
            finally:
                made[-1].round = 0

        algo.run_round = counted  # type: ignore[method-assign]
        history = exp.run(progress=False)
    finally:
        experiment.build_backend = build
    per_client = [n for c in made[-1].per_round.values() for n in c.values()]
    h = hashlib.sha256()
    _digest(algo.state_dict(), h)
    for r in history.records:
        _digest([r.floats_down, r.floats_up, r.extras], h)
    final = history.final
    return {
        "method": name,
        "max": max(per_client, default=0),
        "mean": float(np.mean(per_client)) if per_client else 0.0,
        "per_round": {t: dict(c) for t, c in sorted(made[-1].per_round.items())},
        "evaluate_messages": sum(made[-1].evaluate.values()),
        "floats": [history.records[-1].floats_down, history.records[-1].floats_up],
        "accuracy": None if final.metrics is None else final.metrics.accuracy,
        "fingerprint": h.hexdigest()[:16],
    }


def main() -> None:
    from clusterfl.algorithms import ALGORITHMS

    p = argparse.ArgumentParser()
    p.add_argument("--json", help="write the results here")
    p.add_argument("--only", action="append", help="a method (repeatable; default: all)")
    a = p.parse_args()
    rows = [count(name) for name in (a.only or list(ALGORITHMS))]
    print("| method | max messages per client per round | mean | fingerprint |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['max']} | {r['mean']:.2f} | {r['fingerprint']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
