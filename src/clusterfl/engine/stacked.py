"""Building blocks of the vectorized engine: parameters of many clients stacked on a leading axis.

A *kernel* (`StackedKernel`) computes, for `a` clients at once, the forward pass, the loss and
the gradient of every parameter. It hands each gradient to a *sink* as soon as that parameter
is no longer needed by the backward pass, either as a batched matrix product (`Sink.matmul`:
the gradient is `lhs @ rhs`, which lets the sink fuse the product into the update, e.g.
`W.baddbmm_(lhs, rhs, alpha=-lr)`) or as a tensor (`Sink.grad`). Two sinks exist:

- `StackedOptimizer`: local SGD (momentum, weight decay) or Adam, with the FedProx proximal
  term, with exactly torch.optim's arithmetic up to rounding and per-client step counters.
- `GradientSink`: stores the gradients (the `GradientRequest` protocol).

Parameters are lists of tensors `[n, *shape]` in `ParamLayout` order; a step works on the
first `a` rows (the engine orders clients so that the clients still training form a prefix).

Mixed precision ("bf16-mixed", `engine.device.compute_scope`): under autocast a kernel hands
the sinks products of bfloat16 operands (`matmul`) and float32 tensors (`grad`); the sinks
form such a product in bfloat16 and apply or store it in the parameters' dtype, so
parameters, optimizer state and stored gradients stay float32. With float32 operands (no
autocast) they run exactly as without it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clusterfl.models.params import ParamLayout
from clusterfl.protocol import LocalTraining

Tensor = torch.Tensor


class Workspace:
    """Reusable scratch tensors keyed by name, so that steps do not allocate large tensors.

    `get(key, shape, dtype, device)` returns a view of a buffer that is only re-allocated
    when it is too small (or of another dtype or device). Two tensors that are alive at the
    same time must use different keys.
    """

    def __init__(self) -> None:
        self._store: dict[str, Tensor] = {}

    def get(self, key: str, shape: Sequence[int], dtype: torch.dtype,
            device: torch.device | None = None) -> Tensor:
        """A tensor of `shape` and `dtype` on `device` (default CPU; uninitialised content)."""
        n = math.prod(shape)
        buf = self._store.get(key)
        device = torch.device("cpu") if device is None else device
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(max(n, 1), dtype=dtype, device=device)
            self._store[key] = buf
        return buf[:n].view(*shape)

    def clear(self) -> None:
        """Release every buffer."""
        self._store.clear()


class Sink(ABC):
    """Receives the gradient of each stacked parameter during a backward pass."""

    @abstractmethod
    def matmul(self, i: int, lhs: Tensor, rhs: Tensor) -> None:
        """The gradient of parameter `i` (shape `[a, p, q]`) is `torch.bmm(lhs, rhs)`."""

    @abstractmethod
    def grad(self, i: int, g: Tensor) -> None:
        """The gradient of parameter `i` is `g` (`[a, *shape]`; the sink may overwrite it)."""


@dataclass
class StepBatch:
    """One minibatch of `a` stacked clients for a kernel's `train_step`.

    `x` `[a, B, *input]`, `y` `[a, B]` targets, `w` `[a, B]` per-sample weights (0 masks
    padding), `offset` frozen logits added to the outputs (CAM) or None, `task` the loss
    kind, `generator` the source of dropout noise; `clients` (a kernel with dropout): each
    stacked client's own generator and the rows it has in this batch (0: it takes no step),
    so that its noise is the one the per-client loop draws (`protocol.client_seed`), whatever
    clients share its chunk.
    """

    x: Tensor
    y: Tensor
    w: Tensor
    offset: Tensor | None
    task: str
    generator: torch.Generator
    clients: ClientNoise | None = None


@dataclass
class ClientNoise:
    """Per stacked client: its dropout generator and its valid rows in the step's batch."""

    generators: list[torch.Generator]
    rows: np.ndarray


class GradientSink(Sink):
    """Stores the gradients of `a` clients into `[a, *shape]` tensors.

    `out` may be given (e.g. views into the rows of a flat `[n, d]` result, so the products
    write their final place directly); otherwise contiguous tensors are allocated.
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, ...]],
        a: int,
        dtype: torch.dtype,
        out: list[Tensor] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.out = out if out is not None else [
            torch.empty(a, *s, dtype=dtype, device=device) for s in shapes]

    def matmul(self, i: int, lhs: Tensor, rhs: Tensor) -> None:
        out = self.out[i]
        if lhs.dtype != out.dtype:  # bf16-mixed: the low-precision product, stored as out's
            out.copy_(torch.bmm(lhs, rhs))
        elif out.is_contiguous():
            torch.bmm(lhs, rhs, out=out)
        else:
            strided_bmm(out, lhs, rhs)

    def grad(self, i: int, g: Tensor) -> None:
        self.out[i].copy_(g.reshape(self.out[i].shape))

    def flat(self) -> Tensor:
        """`[a, d]` gradients in layout order."""
        a = self.out[0].shape[0]
        return torch.cat([g.reshape(a, -1) for g in self.out], dim=1)


def strided_bmm(out: Tensor, lhs: Tensor, rhs: Tensor) -> None:
    """`out[b] = lhs[b] @ rhs[b]` for an `out` whose batch stride is not its matrix size.

    torch's batched path (one parallel loop over the batch) needs a contiguous result; for
    any other it multiplies the matrices one by one, each split over the intra-op threads,
    which is slow for the many small products of the gradient replies (`GradientSink`: 128
    MLP clients, rows of the flat reply). So the products go into a contiguous temporary and
    are copied into place, a few at a time (`_STRIDED_TEMP`). An earlier version ran one
    single-threaded part of the batch per worker thread instead: alone it was as fast, but
    inside a gradient round it ran about 1.7x slower, because the OpenMP workers of the
    preceding products keep spinning on the cores the worker threads need (measured: 64.8
    vs 52.1 ms per round, 2 threads).
    The old content of `out` (uninitialised memory, NaN included) is ignored.
    """
    if out.shape[0] == 0:
        return
    step = max(1, _STRIDED_TEMP // max(1, out[0].numel()))
    tmp = torch.empty((min(step, out.shape[0]), *out.shape[1:]), dtype=out.dtype,
                      device=out.device)
    for s in range(0, out.shape[0], step):
        e = min(out.shape[0], s + step)
        part = tmp[: e - s]
        torch.bmm(lhs[s:e], rhs[s:e], out=part)
        out[s:e].copy_(part)


#: elements of `strided_bmm`'s temporary (2.5 MB of float32): the products are made and
#: copied a few matrices at a time, so the copy reads the temporary from the cache (128 MLP
#: gradient products of 200 x 784: 27.7 ms in one piece, 23.3 ms in pieces of 4 matrices)
_STRIDED_TEMP = 640_000


class StackedOptimizer(Sink):
    """torch.optim.SGD / Adam semantics for `n` stacked clients, one step at a time.

    SGD:  g = grad + wd·w + mu·(w − center) (mu·scale_i·(w − center_i) with a per-client
    `center_scale`);  buf = momentum·buf + g (buf = g at the first
    step, as torch does: buffers start at zero);  w −= lr·buf  (w −= lr·g without momentum).
    Adam: g as above; m.lerp_(g, 1−β1); v = β2·v + (1−β2)·g²; w −= lr/(1−β1^t) ·
    m / (sqrt(v)/sqrt(1−β2^t) + eps), with t the client's own step count.

    Call `begin(a, active)` before each step; it selects the first `a` rows. The rows of
    clients that do not step must be restored by the caller when they lie inside the prefix
    (`state()` lists every tensor to save); `begin` only advances the counters of `active`.
    """

    def __init__(
        self, params: list[Tensor], tr: LocalTraining, center: list[Tensor] | None,
        center_scale: Tensor | None = None,
    ) -> None:
        self.params = params
        self.tr = tr
        self.center = center if tr.mu > 0 else None
        #: `[n]` per-client factor on the proximal pull (mu·scale_i), None: 1 for all
        self.center_scale = center_scale if tr.mu > 0 else None
        self.adam = tr.optimizer == "adam"
        n = params[0].shape[0]
        self.steps = np.zeros(n, dtype=np.int64)
        self.bufs = [torch.zeros_like(p) for p in params] if self._momentum else []
        self.exp_avg = [torch.zeros_like(p) for p in params] if self.adam else []
        self.exp_avg_sq = [torch.zeros_like(p) for p in params] if self.adam else []
        self._grad_buf: list[Tensor | None] = [None] * len(params)
        self._tmp: list[Tensor | None] = [None] * len(params)
        self.a = n
        self._step_size: float | Tensor = 0.0
        self._bc2_sqrt: float | Tensor = 1.0

    @property
    def _momentum(self) -> bool:
        return self.tr.optimizer != "adam" and self.tr.momentum != 0

    # ---------------------------------------------------------------- bookkeeping
    def state(self) -> list[Tensor]:
        """Every per-client tensor the optimizer changes (for masking non-prefix steps)."""
        return [*self.params, *self.bufs, *self.exp_avg, *self.exp_avg_sq]

    def begin(self, a: int, active: np.ndarray) -> None:
        """Start a step on rows `[:a]`; `active` (`[a]` bool) are the clients that step."""
        self.a = a
        self.steps[:a][active] += 1
        if not self.adam:
            return
        b1, b2 = self.tr.betas
        t = np.maximum(self.steps[:a], 1)
        if np.all(t == t[0]):
            step = int(t[0])
            self._step_size = self.tr.lr / (1 - b1**step)
            self._bc2_sqrt = (1 - b2**step) ** 0.5
        else:
            dtype, dev = self.params[0].dtype, self.params[0].device
            sizes = [self.tr.lr / (1 - b1 ** int(s)) for s in t]
            self._step_size = torch.tensor(sizes, dtype=dtype, device=dev)
            self._bc2_sqrt = torch.tensor([(1 - b2 ** int(s)) ** 0.5 for s in t], dtype=dtype,
                                          device=dev)

    def _scratch(self, store: list[Tensor | None], i: int) -> Tensor:
        buf = store[i]
        if buf is None:
            buf = torch.empty_like(self.params[i])
            store[i] = buf
        return buf[: self.a]

    def _prox(self, i: int, p: Tensor) -> Tensor:
        """w − center for the active rows (in a scratch buffer)."""
        assert self.center is not None
        out = torch.sub(p, self.center[i][: self.a], out=self._scratch(self._tmp, i))
        if self.center_scale is not None:
            out.mul_(self.center_scale[: self.a].view((-1,) + (1,) * (p.dim() - 1)))
        return out

    def _regularise(self, i: int, g: Tensor, p: Tensor) -> None:
        """g += wd·w + mu·(w − center), in place."""
        if self.tr.weight_decay != 0:
            g.add_(p, alpha=self.tr.weight_decay)
        if self.center is not None:
            g.add_(self._prox(i, p), alpha=self.tr.mu)

    def _plain_decay(self, i: int, p: Tensor) -> None:
        """w −= lr·(wd·w + mu·(w − center)) (the data gradient is applied by the caller)."""
        lr = self.tr.lr
        prox = self._prox(i, p) if self.center is not None else None
        if self.tr.weight_decay != 0:
            p.mul_(1 - lr * self.tr.weight_decay)
        if prox is not None:
            p.add_(prox, alpha=-lr * self.tr.mu)

    # ---------------------------------------------------------------- sink interface
    def matmul(self, i: int, lhs: Tensor, rhs: Tensor) -> None:
        p = self.params[i][: self.a]
        if lhs.dtype != p.dtype:  # bf16-mixed: the product in bf16, the update in p's dtype
            self.grad(i, torch.bmm(lhs, rhs).to(p.dtype))
            return
        lr = self.tr.lr
        if self.adam:
            g = torch.bmm(lhs, rhs, out=self._scratch(self._grad_buf, i))
            self._adam(i, p, g)
        elif self._momentum:
            buf = self.bufs[i][: self.a]
            buf.baddbmm_(lhs, rhs, beta=self.tr.momentum)
            self._regularise(i, buf, p)
            p.add_(buf, alpha=-lr)
        else:
            self._plain_decay(i, p)
            p.baddbmm_(lhs, rhs, alpha=-lr)

    def grad(self, i: int, g: Tensor) -> None:
        p = self.params[i][: self.a]
        g = g.reshape(p.shape)
        lr = self.tr.lr
        if self.adam:
            self._adam(i, p, g)
        elif self._momentum:
            buf = self.bufs[i][: self.a]
            buf.mul_(self.tr.momentum).add_(g)
            self._regularise(i, buf, p)
            p.add_(buf, alpha=-lr)
        else:
            self._plain_decay(i, p)
            p.add_(g, alpha=-lr)

    def _adam(self, i: int, p: Tensor, g: Tensor) -> None:
        b1, b2 = self.tr.betas
        self._regularise(i, g, p)
        m = self.exp_avg[i][: self.a]
        v = self.exp_avg_sq[i][: self.a]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = torch.sqrt(v, out=self._scratch(self._tmp, i))
        if isinstance(self._step_size, Tensor):
            shape = (-1,) + (1,) * (p.dim() - 1)
            denom.div_(self._bc2_sqrt.view(shape)).add_(self.tr.eps)  # type: ignore[union-attr]  # set with _step_size
            torch.div(m, denom, out=denom)
            p.sub_(denom.mul_(self._step_size.view(shape)))
        else:
            denom.div_(self._bc2_sqrt).add_(self.tr.eps)
            p.addcdiv_(m, denom, value=-self._step_size)


def loss_and_grad(
    out: Tensor, y: Tensor, w: Tensor, task: str, need_grad: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Per-client weighted loss `sum_j w_j l_j` (`[a]`) and its gradient w.r.t. `out`.

    `out` is `[a, B, O]`, `y` `[a, B]` (class ids, or regression targets `[a, B, ...]`),
    `w` `[a, B]` per-sample weights (1/count on valid samples, 0 on padding), so the loss is
    the mean over each client's valid samples, as `common.per_sample_loss(...).mean()`.
    """
    if task == "regression":
        diff = out.reshape(y.shape) - y
        extra = math.prod(y.shape[2:])
        wv = (w / extra if extra != 1 else w).reshape(w.shape + (1,) * (y.dim() - 2))
        sq = diff * diff * wv
        loss = sq.reshape(sq.shape[0], -1).sum(1)
        dout = (diff * (2 * wv)).reshape(out.shape) if need_grad else None
        return loss, dout
    lse = torch.logsumexp(out, dim=-1)
    picked = out.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    loss = ((lse - picked) * w).sum(1)
    if not need_grad:
        return loss, None
    dout = torch.exp(out - lse.unsqueeze(-1))
    dout.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(picked, -1.0).unsqueeze(-1))
    dout.mul_(w.unsqueeze(-1))
    return loss, dout


class StackedKernel(ABC):
    """Forward/backward of one architecture for `a` clients with stacked parameters.

    Parameters are passed as a list `[a, *shape]` tensors in layout order (views: the kernel
    must not keep them). `x` is what `gather` returns for an index matrix `[a, B]`.
    """

    name = "kernel"
    #: how many samples (all clients together) one call may process at a time
    max_samples = 1 << 16
    #: whether training draws noise (dropout): each client then gets its own generator
    draws_noise = False

    def __init__(self, module: nn.Module, layout: ParamLayout) -> None:
        self.module = module
        self.layout = layout
        self.shapes = [e.shape for e in layout.entries]
        self.ws = Workspace()

    def workspace_floats(self, module: nn.Module, inputs: Tensor, output: Tensor) -> int:
        """Floats per sample that the kernel holds for leaf `module` (called on `inputs`,
        giving `output`) beyond its output: none here (GPU chunk sizes, `sample_bytes`)."""
        return 0

    def gather(self, x_all: Tensor, idx: Tensor) -> Tensor:
        """Inputs `[a, B, *input_shape]` of the samples `idx` (`[a, B]` rows of `x_all`)."""
        a, b = idx.shape
        out = self.ws.get("gather", (a * b, *x_all.shape[1:]), x_all.dtype, x_all.device)
        torch.index_select(x_all, 0, idx.reshape(-1), out=out)
        return out.view(a, b, *x_all.shape[1:])

    @abstractmethod
    def train_step(self, params: list[Tensor], batch: StepBatch, sink: Sink) -> Tensor:
        """Forward (training mode), loss, backward; gradients go to `sink`. Returns `[a]` losses."""

    @abstractmethod
    def forward(self, params: list[Tensor], x: Tensor) -> Tensor:
        """Outputs `[a, B, O]` in evaluation mode, without gradients."""
