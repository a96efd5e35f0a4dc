"""The generic stacked kernel: any `nn.Module` through `torch.func`.

`functional_call` runs the module with each client's parameters; `vmap(grad(...))` gives all
clients' gradients in one call. When vmap cannot trace the module (data-dependent control flow,
in-place buffer updates such as BatchNorm's running statistics, ...), or when the module says
so (`stack_with_vmap = False`: `models.lstm`'s fused LSTM), the kernel falls back to a loop
over clients with plain autograd, on each client's real samples only (padding rows, of
weight 0, would skew batch statistics), and remembers that choice. A module whose own code
fails in that loop (BatchNorm on a batch of one sample) would fail as well in the sequential
backend, which runs it the same way: its error goes on unchanged, and a run names the
model's line (`plugins.own_code_error`); any other failure there is a one-line
`ClusterFLError` pointing at the sequential backend. Buffers (BatchNorm's
running statistics) are the module's own, shared by all clients and never federated, as in
the sequential backend. The optimizer update is the shared stacked one.

Under "bf16-mixed" autocast runs the module's products in bfloat16 (through `torch.func`
as through autograd); the loss (cross-entropy is computed in float32 by autocast) and the
gradients with respect to the float32 parameters are float32, and `forward` returns its
outputs in the parameters' dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from clusterfl.engine.common import per_sample_loss
from clusterfl.engine.device import low_precision
from clusterfl.engine.stacked import Sink, StackedKernel, StepBatch
from clusterfl.errors import ClusterFLError
from clusterfl.models.params import ParamLayout
from clusterfl.plugins import own_code_error

Tensor = torch.Tensor
log = logging.getLogger(__name__)


class GenericKernel(StackedKernel):
    """Per-client gradients of any module by `vmap(grad(loss))`, or a loop when vmap fails."""

    name = "generic"
    max_samples = 8192

    def __init__(self, module: nn.Module, layout: ParamLayout) -> None:
        super().__init__(module, layout)
        self.names = layout.names
        # a module may ask for the loop from the start (`stack_with_vmap = False`: vmap would
        # run it through PyTorch's slow per-sample fallback, e.g. nn.LSTM)
        self.use_vmap = bool(getattr(module, "stack_with_vmap", True))

    # ------------------------------------------------------------------ functional pieces
    def _apply(self, params: tuple[Tensor, ...], x: Tensor) -> Tensor:
        return functional_call(self.module, dict(zip(self.names, params)), (x,))

    def _loss_fn(self, task: str) -> Callable[..., tuple[Tensor, Tensor]]:
        def client_loss(
            params: tuple[Tensor, ...], x: Tensor, y: Tensor, w: Tensor, off: Tensor | None
        ) -> tuple[Tensor, Tensor]:
            out = self._apply(params, x)
            if off is not None:
                out = out + off
            per = per_sample_loss(out, y, task)
            if per.dim() > 1:
                per = per.reshape(per.shape[0], -1).mean(1)
            loss = (per * w).sum()
            return loss, loss.detach()

        return client_loss

    def _loop_grads(
        self, fn: Callable[..., tuple[Tensor, Tensor]], params: list[Tensor], x: Tensor,
        y: Tensor, w: Tensor, offset: Tensor | None,
    ) -> tuple[tuple[Tensor, ...], Tensor]:
        grads, losses = [], []
        try:
            for i in range(y.shape[0]):
                own = tuple(p[i].detach().requires_grad_() for p in params)
                rows = w[i] != 0  # the client's real samples: padding would skew BatchNorm
                if not bool(rows.any()):  # a step past the client's last one
                    grads.append(tuple(torch.zeros_like(p) for p in own))
                    losses.append(w.new_zeros(()))
                    continue
                off = None if offset is None else offset[i][rows]
                with torch.enable_grad():
                    loss, value = fn(own, x[i][rows], y[i][rows], w[i][rows], off)
                    g = torch.autograd.grad(loss, own, allow_unused=True)
                grads.append(tuple(torch.zeros_like(p) if d is None else d
                                   for p, d in zip(own, g)))
                losses.append(value)
        except Exception as exc:
            if own_code_error(exc, {"model": type(self.module)}, "") is not None:
                raise  # the model's own code: it fails as in the sequential backend
            raise self._unsupported(exc) from None
        stacked = tuple(torch.stack([g[j] for g in grads]) for j in range(len(params)))
        return stacked, torch.stack(losses)

    def _unsupported(self, exc: Exception) -> ClusterFLError:
        first = (str(exc).strip().splitlines() or [""])[0]
        return ClusterFLError(
            f"model {type(self.module).__name__} cannot be trained by the simulation backend "
            f"({type(exc).__name__}: {first}); use [backend] name = \"sequential\"")

    # ------------------------------------------------------------------ kernel interface
    def train_step(self, params: list[Tensor], batch: StepBatch, sink: Sink) -> Tensor:
        x, y, w, offset, task = batch.x, batch.y, batch.w, batch.offset, batch.task
        self.module.train()
        fn = self._loss_fn(task)
        grads: tuple[Tensor, ...] | None = None
        if self.use_vmap:
            dims = (0, 0, 0, 0, None if offset is None else 0)
            try:
                g_fn = vmap(grad(fn, has_aux=True), in_dims=dims, randomness="different")
                grads, loss = g_fn(tuple(params), x, y, w, offset)
            except Exception as exc:
                log.info("vmap failed for %s (%s); looping over clients",
                         type(self.module).__name__, exc)
                self.use_vmap = False
        if grads is None:
            grads, loss = self._loop_grads(fn, params, x, y, w, offset)
        for i, g in enumerate(grads):
            sink.grad(i, g)
        return loss

    def forward(self, params: list[Tensor], x: Tensor) -> Tensor:
        out = self._forward(params, x)
        if out.dtype != params[0].dtype and low_precision(params[0]) is not None:
            out = out.to(params[0].dtype)  # bf16-mixed: outputs in the parameters' dtype
        return out

    def _forward(self, params: list[Tensor], x: Tensor) -> Tensor:
        self.module.eval()
        if self.use_vmap:
            try:
                return vmap(self._apply)(tuple(params), x)
            except Exception as exc:
                log.info("vmap failed for %s (%s); looping", type(self.module).__name__, exc)
                self.use_vmap = False
        try:
            return torch.stack(
                [self._apply(tuple(p[i] for p in params), x[i]) for i in range(x.shape[0])])
        except Exception as exc:
            if own_code_error(exc, {"model": type(self.module)}, "") is not None:
                raise  # the model's own code: it fails as in the sequential backend
            raise self._unsupported(exc) from None
