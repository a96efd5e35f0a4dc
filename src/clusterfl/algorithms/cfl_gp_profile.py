"""CFL-GP's gradient profile (Kim, Kim & de Veciana, ICML 2024, Alg. 1 lines 5–9), as plain
functions of their inputs: who the clustering reads, how often each client was asked for
each block, and the running mean of the blocks asked (`clusterfl.algorithms.cfl_gp` uses
them; tests/algorithms/test_cfl_gp_steps.py checks them with hand values).

The profile is a `[C, K, d̂]` tensor: block k of client c is g_{c,k}, the running mean of
the vectors (gradients or model gaps, d̂ coordinates) client c sent at model θ_k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clusterfl.protocol import GradientRequest, TrainRequest


@dataclass
class Probe:
    """One block's update in a clustering round (`CFLGP._probe`): the block, the clients
    asked for it (sorted), those that answered, and their features (one row each, in `who`
    order)."""

    block: int
    asked: np.ndarray
    who: np.ndarray
    rows: torch.Tensor


@dataclass(frozen=True)
class ProbeAsk:
    """One block asked for in a clustering round (`CFLGP._probe_plan`): who is asked, and
    the request to those of them not in the block's cluster (None when there are none)."""

    block: int
    asked: np.ndarray
    request: GradientRequest | TrainRequest | None


def profiled_clients(asked: np.ndarray) -> np.ndarray:
    """`[C]` bool: the clients the clustering reads — those asked for every block that any
    client was asked for (`asked[c, k]`: how often client c was asked for block k)."""
    ever = asked > 0
    return np.asarray((ever | ~ever.any(axis=0)).all(axis=1))


def update_profile(features: torch.Tensor, probes: list[Probe],
                   betas: list[np.ndarray]) -> torch.Tensor:
    """Alg. 1 lines 8–9 on the `[C, K, d̂]` profile: for each probe, block k of every client c
    that answered becomes g_{c,k} := (1 − β_c) g_{c,k} + β_c v_c (v_c its row of the probe,
    β_c its entry of `betas`, one per client *asked*, in `probe.asked` order); a client asked
    but silent keeps its block. Returns a new profile."""
    out = features.clone()
    for probe, beta in zip(probes, betas, strict=True):
        block = out[:, probe.block]
        rows = torch.from_numpy(probe.who)
        new = probe.rows.to(block.dtype)
        if len(np.unique(beta)) == 1:  # one β (always with every client sampled)
            one = float(beta[0])
            block[rows] = (1.0 - one) * block[rows] + one * new
        else:
            w = torch.from_numpy(beta[np.searchsorted(probe.asked, probe.who)])[:, None]
            block[rows] = ((1.0 - w).to(block.dtype) * block[rows]
                           + w.to(block.dtype) * new)
    return out


def count_asks(asked: np.ndarray, blocks: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """`asked` (`[C, K]` counts) after asking the clients `who` for `block`, for each
    `(block, who)` of `blocks` (a client is asked at most once per block and round)."""
    out = asked.copy()
    for block, who in blocks:
        out[who, block] += 1
    return out


__all__ = ["Probe", "ProbeAsk", "count_asks", "profiled_clients", "update_profile"]
