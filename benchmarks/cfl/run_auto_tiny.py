"""CFL's auto split rule on tiny digits federations (the unit tests' kind), 12 seeds each.

    OMP_NUM_THREADS=1 python benchmarks/cfl/run_auto_tiny.py N_CLIENTS ROUNDS [KEY=VALUE ...]

Rotation groups of the built-in digits with 2 angles, 1 angle (no clusters) and 4 angles,
an MLP with 32 hidden units; CFL with its defaults (or the algorithm settings given).
Prints, per federation, how many seeds end with ARI 1 and (ARI, clusters) of every seed.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from clusterfl.experiment import Experiment


def config(angles: list[int], seed: int, n: int = 8, rounds: int = 40,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tiny digits federation of rotation groups, CFL with its defaults (or `extra`)."""
    return {"seed": seed, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
            "data": {"source": "digits"},
            "scenario": {"name": "rotation", "n_clients": n, "angles": angles},
            "model": {"name": "mlp", "hidden": [32]},
            "train": {"lr": 0.1, "momentum": 0.5, "batch_size": 16, "epochs": 1},
            "algorithm": {"name": "cfl", **(extra or {})},
            "output": {"figures": False, "progress": "off"}}


def main() -> None:
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    extra: dict[str, float | int] = {}
    for arg in sys.argv[3:]:
        key, value = arg.split("=")
        extra[key] = float(value) if "." in value else int(value)
    for angles in ([0, 180], [0], [0, 90, 180, 270]):
        out = []
        for seed in range(12):
            cfg = config(angles, seed, n, rounds, extra)
            with tempfile.TemporaryDirectory() as tmp:
                last = Experiment.from_config(cfg, out_dir=tmp).run(progress=False).records[-1]
            out.append((round(last.ari or 0.0, 2), last.n_clusters))
        print(n, rounds, extra, angles, sum(a == 1.0 for a, _ in out), out, flush=True)


if __name__ == "__main__":
    main()
