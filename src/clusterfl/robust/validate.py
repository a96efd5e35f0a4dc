"""Reply checks: a bad client reply is rejected before any aggregation (docs/security.md).

What is checked, per reply type (`ValidationConfig` sets the bounds):

- Train / Gradient replies: one row per answering client, width d of the model — or d̂ =
  len(coords) when the request asked for `coords` only (else every row is rejected:
  "shape"); every coordinate finite ("non_finite"); sample count finite and
  > 0 ("n_samples"); the update norm — ‖θ_i − θ_start(i)‖ for a training reply, where
  θ_start(i) is the model the client was sent, ‖g_i‖ for a gradient reply — at most
  `max_norm` and at most `median_multiple` × the median norm of the reply's finite rows
  ("norm"; the median rule needs `min_replies_for_median` rows, and a median of 0 disables
  it for that reply). For a narrowed reply the norms are those of what was sent: the update
  at the requested coordinates (θ_start restricted to them).
- Loss replies: shape `[n, K]` ("shape"). A non-finite loss is kept: it is what a diverged
  model honestly scores, and the methods treat it as +∞.
- Embed replies (FLT signatures): every value finite ("non_finite").
- Subspace replies (PACFL bases): every value finite ("non_finite"); a rank outside
  0..columns ("shape").
- Mixture training replies (FedEM): shape `[n, K, d]` and `[n, K]` weights ("shape"), every
  coordinate and weight finite ("non_finite"), sample counts > 0, and the norm rules on the
  K·d-float update θ_{1..K,i} − θ_{1..K} ("norm"). Mixture-fit replies: finite weights;
  least-loss counts: shape `[n, K]`.
- Evaluate replies: not checked (measurement, never aggregated).

Default: finite + shape + sample-count checks, and the median rule at 100× (an update two
orders of magnitude larger than the typical one of its round); no absolute bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clusterfl import protocol as pr
from clusterfl.engine.transfer import move
from clusterfl.protocol import RE, Asks, Reply, positions_of, reply_width
from clusterfl.robust.config import ValidationConfig


@dataclass(frozen=True)
class Rejection:
    """One rejected client reply: who, what kind of request, why, and the offending value."""

    client: int
    request: str
    reason: str
    value: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {"client": self.client, "request": self.request, "reason": self.reason,
                "value": self.value}


_NORM_ROWS = 256  # rows per block in `update_norms` (bounds the temporary memory)


def update_norms(request: Asks[Any], reply: Reply) -> np.ndarray:
    """‖update‖₂ of each row of an update reply (its `update_rows` less their base, the start
    model each client was sent), accumulated in float64, block by block.

    Never builds an `[n, d]` temporary (a round of 1,000 MLP clients is 0.6 GB per copy).
    A row holding NaN or ±Inf gets a non-finite norm; a finite float32 row always gets a
    finite one (its squares fit in float64).
    """
    vec = reply.update_rows()
    request = move(request, vec.device)  # the start models where the updates are (a GPU)
    rows = positions_of(request, reply.clients)
    norms = torch.empty(len(vec), dtype=torch.float64, device=vec.device)
    for lo in range(0, len(vec), _NORM_ROWS):  # on the reply's device, one copy back at the end
        block = vec[lo : lo + _NORM_ROWS]
        base = request.update_base(rows[lo : lo + _NORM_ROWS])
        if base is not None:
            block = block - base
        norms[lo : lo + len(block)] = torch.linalg.vector_norm(block, dim=1, dtype=torch.float64)
    return norms.cpu().numpy()


Checked = tuple[np.ndarray, list[Rejection]]


def check_reply(request: Asks[RE], reply: RE, config: ValidationConfig) -> Checked:
    """Boolean keep-mask over the reply's rows and the rejections (one per rejected row)."""
    clients = np.asarray(reply.clients, dtype=np.int64)
    keep = np.ones(len(clients), dtype=bool)
    check = next((_CHECKS[t] for t in type(request).__mro__ if t in _CHECKS), None)
    if not config.enabled or check is None:  # evaluations are not checked
        return keep, []
    kind = type(request).__name__.removesuffix("Request").lower()
    return check(request, reply, clients, kind, config)


def _shape(ok: bool, clients: np.ndarray, kind: str) -> Checked:
    """All rows kept, or all rejected ("shape")."""
    return (np.ones(len(clients), dtype=bool), []) if ok else _all(clients, kind, "shape")


def _finite_rows(values: np.ndarray, clients: np.ndarray, kind: str) -> Checked:
    """Rows with a non-finite value are rejected ("non_finite")."""
    flat = np.asarray(values, dtype=np.float64).reshape(len(clients), -1)
    finite = np.asarray(np.isfinite(flat).all(axis=1), dtype=bool)
    return finite, [Rejection(int(c), kind, "non_finite") for c in clients[~finite]]


def _check_subspace(request: pr.SubspaceRequest, reply: pr.SubspaceReply, clients: np.ndarray,
                    kind: str, config: ValidationConfig) -> Checked:
    n = len(clients)
    bases = np.asarray(reply.bases, dtype=np.float64)
    if bases.ndim != 3 or len(bases) != n or len(reply.ranks) != n:
        return _all(clients, kind, "shape")
    ranks = np.asarray(reply.ranks)
    sized = (ranks >= 0) & (ranks <= bases.shape[2])
    finite = np.asarray(np.isfinite(bases.reshape(n, -1)).all(axis=1), dtype=bool)
    out = [Rejection(int(c), kind, "shape") for c in clients[~sized]]
    out += [Rejection(int(c), kind, "non_finite") for c in clients[sized & ~finite]]
    return sized & finite, sorted(out, key=lambda r: r.client)


def _check_update(request: pr.TrainRequest | pr.GradientRequest,
                  reply: pr.TrainReply | pr.GradientReply, clients: np.ndarray, kind: str,
                  config: ValidationConfig) -> Checked:
    """A Train / Gradient reply: `[n, d]` rows (d̂ when narrowed), then the norm rules."""
    n, vec = len(clients), reply.update_rows()
    d = reply_width(request.models, request.coords)  # d, or d̂ for a narrowed reply
    if vec.ndim != 2 or tuple(vec.shape) != (n, d) or len(reply.n_samples) != n:
        return _all(clients, kind, "shape")
    return _check_norms(clients, kind, update_norms(request, reply), reply.n_samples, config)


def _check_mixture(request: pr.MixtureTrainRequest, reply: pr.MixtureTrainReply,
                   clients: np.ndarray, kind: str, config: ValidationConfig) -> Checked:
    """A FedEM reply: the K models as one K·d update, and finite mixture weights."""
    n = len(clients)
    k, d = (int(x) for x in request.models.shape)
    w = np.asarray(reply.weights, dtype=np.float64)
    if (tuple(reply.params.shape) != (n, k, d) or w.shape != (n, k)
            or len(reply.n_samples) != n):
        return _all(clients, kind, "shape")
    norms = update_norms(request, reply)
    norms = np.where(np.isfinite(w).all(axis=1), norms, np.nan)  # a NaN weight: non-finite
    return _check_norms(clients, kind, norms, reply.n_samples, config)


_CHECKS: dict[type[Any], Callable[..., Checked]] = {
    pr.TrainRequest: _check_update, pr.GradientRequest: _check_update,
    pr.MixtureTrainRequest: _check_mixture, pr.SubspaceRequest: _check_subspace,
    pr.LossRequest: lambda req, reply, clients, kind, _: _shape(
        reply.loss.shape == (len(clients), req.models.shape[0]) == reply.accuracy.shape,
        clients, kind),
    pr.BestCountRequest: lambda req, reply, clients, kind, _: _shape(
        np.asarray(reply.counts).shape == (len(clients), int(req.models.shape[0])),
        clients, kind),
    pr.EmbedRequest: lambda req, reply, clients, kind, _: _finite_rows(reply.signatures, clients,
                                                                    kind),
    pr.MixtureFitRequest: lambda req, reply, clients, kind, _: _finite_rows(reply.weights,
                                                                         clients, kind),
}
"""The checks of each request type's replies (see the module docstring)."""


def _check_norms(clients: np.ndarray, kind: str, norms: np.ndarray, n_samples: np.ndarray,
                 config: ValidationConfig) -> tuple[np.ndarray, list[Rejection]]:
    """Non-finite, sample-count and norm rules on the update norms of an update reply."""
    n = len(clients)
    out: list[Rejection] = []
    finite = np.isfinite(norms)
    sizes = np.asarray(n_samples, dtype=np.float64)
    good_n = np.isfinite(sizes) & (sizes > 0)
    for i in np.flatnonzero(~finite):
        out.append(Rejection(int(clients[i]), kind, "non_finite"))
    for i in np.flatnonzero(finite & ~good_n):
        out.append(Rejection(int(clients[i]), kind, "n_samples", float(sizes[i])))
    keep = finite & good_n
    too_big = np.zeros(n, dtype=bool)
    if config.max_norm is not None:
        too_big |= norms > config.max_norm
    ok_norms = norms[keep]
    if config.median_multiple is not None and len(ok_norms) >= config.min_replies_for_median:
        med = float(np.median(ok_norms))
        if med > 0:
            too_big |= norms > config.median_multiple * med
    for i in np.flatnonzero(keep & too_big):
        out.append(Rejection(int(clients[i]), kind, "norm", float(norms[i])))
    keep &= ~too_big
    return keep, sorted(out, key=lambda r: r.client)


def _all(clients: np.ndarray, kind: str, reason: str) -> tuple[np.ndarray, list[Rejection]]:
    return (np.zeros(len(clients), dtype=bool),
            [Rejection(int(c), kind, reason) for c in clients])


__all__ = ["Rejection", "check_reply", "update_norms"]
