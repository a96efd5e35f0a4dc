"""Client-level differential privacy: clipping, Gaussian noise, and ε from dp-accounting.

The mechanism is DP-FedAvg's (McMahan et al., "Learning differentially private recurrent
language models", ICLR 2018, Alg. 1): each client's update Δ_i (θ_i − θ_start, or its
gradient) is clipped to norm S, Δ_i · min(1, S/‖Δ_i‖); the aggregate of a group of m clients
is their *unweighted* mean, and Gaussian noise of std σ·S is added to their sum, i.e. σ·S/m
on the mean. Adding or removing one client changes the sum by at most S, so each aggregate is
a Gaussian mechanism with noise multiplier σ.

Where the noise goes (the aggregation lives in the algorithms, the mechanism in
`Context.send`, so every method gets it without code of its own):

- `noise = "aggregate"` (default): the clients that start from the same model row of a request
  (the same cluster's model: FedAvg's one model, IFCA's chosen θ_j, CFL's leaf, CFL-GP's θ_k)
  form one aggregate; each of its m members adds N(0, σ²S²/m), so the *sum* of the group
  carries exactly N(0, σ²S²) — the central mechanism, per cluster, realised as distributed
  noise. The guarantee holds for methods that average exactly these groups (FedAvg/FedProx,
  FedAvg+, IFCA, IFCA-CAM, CFL, CFL-GP); FeSEM(-CAM) regroups clients by k-means after
  training, so its aggregates are not the noise groups — use "local" there. A single client's
  noisy update is *not* private on its own (std σS/√m): the server must be trusted, or the
  sums formed by secure aggregation.
- `noise = "local"`: every client adds N(0, σ²S²) to its own clipped update (local DP of
  every update the server sees; much more noise on the aggregates).

Sample counts are themselves private: under DP, replies report n_i = 1, so every weighted
average of the methods becomes the unweighted mean the sensitivity argument needs.

Accounting (`epsilon`): every noised training/gradient request is one release. Per release a
client takes part with probability at most q, the method's random client sampling
(`SampledConfig.expected_fraction`: the clients a round asks over all clients, from
`[algorithm] fraction` rounded as the sampler rounds it, or `per_round`;
1 for methods without one), treated as Poisson sampling — for
fixed-size sampling without replacement this is the usual approximation. Dropouts and
deterministic selections (e.g. CFL-GP's probe of the clients not on θ_k̄) do not lower q:
they are not secret randomness of the mechanism. A release that asks every client (FL+HC's
clustering round, FeSEM's warm-up, with a sample in the other rounds) has no sampling to
amplify it: it is composed as Gaussian(σ) (`unsampled_releases` in the report). ε is that of
the RDP accountant of dp-accounting for PoissonSampled(q, Gaussian(σ)) composed over the
other releases, at the configured δ. Not covered:
what clients reveal outside training replies — the losses IFCA/CAM use to choose clusters,
and anything derived from individual updates under "aggregate" noise (CFL's similarities,
FeSEM's k-means) is seen by the server before noise is summed; only "local" noise makes those
private (by post-processing).
"""

from __future__ import annotations

import numpy as np
import torch

from clusterfl.errors import require

DEFAULT_ORDERS = (*range(2, 65), 80, 96, 128, 192, 256, 512)


def clip_rows(updates: torch.Tensor, clip: float) -> tuple[torch.Tensor, np.ndarray]:
    """Each row scaled to norm at most `clip`; returns the clipped rows and the raw norms."""
    norms = torch.linalg.vector_norm(updates.double(), dim=1)
    factor = torch.clamp(clip / norms.clamp_min(1e-300), max=1.0).to(updates.dtype)
    return updates * factor[:, None], norms.numpy()


def noise_rows(shape: tuple[int, int], groups: np.ndarray, sigma: float, clip: float,
               mode: str, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Per-client Gaussian noise `[m, d]`: std σS/√(group size) ("aggregate") or σS ("local")."""
    z = torch.randn(shape, generator=generator, dtype=torch.float64)
    if mode == "local":
        return (sigma * clip * z).to(dtype)
    g = np.asarray(groups)
    _, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
    std = sigma * clip / np.sqrt(counts[inverse].astype(np.float64))
    return (torch.from_numpy(std)[:, None] * z).to(dtype)


def epsilon(noise_multiplier: float, sampling_rate: float, releases: int,
            delta: float, unsampled: int = 0) -> float:
    """ε of `releases` compositions of the Gaussian mechanism (RDP): Poisson-subsampled at
    `sampling_rate`, but for `unsampled` of them (releases that asked every client)."""
    require("privacy", "dp_accounting.rdp")
    import dp_accounting
    from dp_accounting import rdp

    if releases <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    q = float(min(max(sampling_rate, 0.0), 1.0))
    accountant = rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    full = min(int(unsampled), int(releases)) if q < 1.0 else int(releases)
    if full:
        accountant.compose(gaussian, full)
    if int(releases) > full:
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, gaussian), int(releases) - full)
    return float(accountant.get_epsilon(delta))


__all__ = ["clip_rows", "epsilon", "noise_rows"]
