"""The plain per-client reference computations (one module, one client at a time).

This is the arithmetic every faster engine must reproduce. It uses torch.optim's SGD and Adam
so the reference semantics are PyTorch's own. No deep copies: one module is reused and flat
parameters are loaded into it.

Under "bf16-mixed" (`engine.device.compute_scope`: autocast) the module's products run in
bfloat16 and everything else stays float32: the parameters and torch.optim's state, the
losses (autocast computes cross-entropy in float32), the gradients, and the outputs of
`predict` (cast back to the parameters' dtype). Each function runs its forward passes
without autocast's weight cache (`_fresh_casts`): it loads or updates the parameters in
place, and a cached bfloat16 copy would not see that.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from clusterfl.engine.common import per_sample_loss
from clusterfl.models.params import get_flat, get_flat_grad, set_flat
from clusterfl.protocol import LocalTraining


def make_optimizer(params: list[torch.nn.Parameter], tr: LocalTraining) -> torch.optim.Optimizer:
    if tr.optimizer == "adam":
        return torch.optim.Adam(
            params, lr=tr.lr, betas=tr.betas, eps=tr.eps, weight_decay=tr.weight_decay
        )
    return torch.optim.SGD(params, lr=tr.lr, momentum=tr.momentum, weight_decay=tr.weight_decay)


def train_client(
    module: nn.Module,
    start: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    schedule: torch.Tensor,
    tr: LocalTraining,
    task: str,
    offset: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
    prox: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, float]:
    """Local training of one client; returns (final flat params, mean batch loss).

    `schedule` is `[S, b]` local indices with -1 padding; fully padded steps are skipped.
    `offset` (optional) `[n_i, out]` logits added to the model's output per sample.
    `sample_weight` (optional, `[n_i]`): sample j's loss is multiplied by it, a batch's loss
    is Σ_j w_j ℓ_j / |batch| (FedEM's M-step). `prox` (optional, `(models [S, d], weights
    [S])`): the proximal term is mu/2 Σ_s weights_s ||w − models_s||² instead of
    mu/2 ||w − start||² (FedSoft).
    """
    set_flat(module, start)
    module.train()
    opt = make_optimizer(list(module.parameters()), tr)
    center = start.clone() if tr.mu > 0 else None
    losses = []
    with _fresh_casts(start.device):
        for step in schedule:
            idx = step[step >= 0]
            if len(idx) == 0:
                continue
            opt.zero_grad(set_to_none=False)
            out = module(x[idx])
            if offset is not None:
                out = out + offset[idx]
            per = per_sample_loss(out, y[idx], task)
            if sample_weight is None:
                loss = per.mean()
            else:
                per = per.reshape(len(idx), -1).mean(1)
                loss = (per * sample_weight[idx].to(per.dtype)).sum() / len(idx)
            losses.append(float(loss.detach()))
            if center is not None and prox is not None:
                models, weights = prox
                loss = loss + 0.5 * tr.mu * sum(
                    float(w) * _sq_dist(module, c) for c, w in zip(models, weights))
            elif center is not None:
                loss = loss + 0.5 * tr.mu * _sq_dist(module, center)
            loss.backward()
            opt.step()
    return get_flat(module), (sum(losses) / len(losses) if losses else float("nan"))


def _fresh_casts(device: torch.device) -> Any:
    """Under autocast with its weight cache on (a plain `torch.autocast`), a nested autocast
    of the same dtype without it: the cache keys a parameter's bfloat16 copy by the tensor,
    and the in-place updates of the optimizer and of `set_flat` would leave it stale.
    Nothing otherwise (`compute_scope` turns the cache off itself)."""
    kind = device.type
    if torch.is_autocast_enabled(kind) and torch.is_autocast_cache_enabled():
        return torch.autocast(kind, dtype=torch.get_autocast_dtype(kind), cache_enabled=False)
    return contextlib.nullcontext()


def _sq_dist(module: nn.Module, center: torch.Tensor) -> torch.Tensor:
    flat = torch.cat([p.reshape(-1) for p in module.parameters()])
    return ((flat - center) ** 2).sum()


def gradient_client(
    module: nn.Module,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    idx: torch.Tensor,
    task: str,
) -> tuple[torch.Tensor, float]:
    """Gradient of the mean loss over samples `idx` (-1 padded) at `params`."""
    set_flat(module, params)
    module.train()
    module.zero_grad(set_to_none=False)
    sel = idx[idx >= 0]
    with _fresh_casts(params.device):
        loss = per_sample_loss(module(x[sel]), y[sel], task).mean()
    loss.backward()
    return get_flat_grad(module).clone(), float(loss.detach())


@torch.no_grad()
def predict(
    module: nn.Module, params: torch.Tensor, x: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Model outputs (eval mode) on x, in chunks (in the dtype of `params`)."""
    set_flat(module, params)
    if torch.is_autocast_enabled(params.device.type):  # bf16-mixed: cast the outputs back
        with _fresh_casts(params.device):
            return _outputs(module, x, chunk).to(params.dtype)
    return _outputs(module, x, chunk)


def _outputs(module: nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    module.eval()
    if len(x) == 0:
        return module(x[:0]) if len(x.shape) > 1 else torch.zeros(0)
    return torch.cat([module(x[i : i + chunk]) for i in range(0, len(x), chunk)])


__all__ = ["get_flat", "gradient_client", "make_optimizer", "predict", "train_client"]
