"""CFL-GP's profile update (`update_profile`): answers in client order, updated in place
through slices of the new profile, against the same answers in another order, which take the
index path (gather, arithmetic, scatter). Both give the same profile bit for bit (checked
here); the ratio is what the slices save. One process, alternating, best of `--repeats`.

    PYTHONPATH=src python benchmarks/cfl_gp/profile_update.py [--clients 200] [--dim 159010]

The defaults are case (g) of `benchmarks/gpu/cases.py`: 200 clients, K = 4 blocks, the MLP's
159,010 coordinates (a [200, 4, 159010] float32 profile, 509 MB), every block probed, every
cell asked before (`filled`), one β.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from clusterfl.algorithms.cfl_gp_profile import Probe, update_profile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--dim", type=int, default=159010)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    c, k, d = args.clients, args.blocks, args.dim
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(c, k, d, generator=gen)
    asked = np.arange(c)
    order = np.random.default_rng(0).permutation(c)
    rows = [torch.randn(c, d, generator=gen) for _ in range(k)]
    betas = [np.full(c, 0.25)] * k
    filled = np.ones((c, k), dtype=bool)
    in_order = [Probe(b, asked, asked, rows[b]) for b in range(k)]
    shuffled = [Probe(b, asked, order, rows[b][torch.from_numpy(order)]) for b in range(k)]
    times: dict[str, list[float]] = {"client order (slices)": [], "shuffled (index path)": []}
    outs = {}
    for _ in range(args.repeats):
        for name, probes in zip(times, (in_order, shuffled), strict=True):
            start = time.perf_counter()
            outs[name] = update_profile(features, probes, betas, filled=filled)
            times[name].append(time.perf_counter() - start)
    a, b = outs.values()
    assert torch.equal(a, b), "the two paths differ"
    best = {name: min(v) for name, v in times.items()}
    mb = features.numel() * features.element_size() / 1e6
    print(f"profile [{c}, {k}, {d}] ({mb:.0f} MB), {args.threads} thread(s), best of "
          f"{args.repeats}:")
    for name, sec in best.items():
        print(f"  {name:24s} {sec:.3f} s")
    slow, fast = best["shuffled (index path)"], best["client order (slices)"]
    print(f"  ratio {slow / fast:.2f}x (same profile bit for bit)")


if __name__ == "__main__":
    main()
