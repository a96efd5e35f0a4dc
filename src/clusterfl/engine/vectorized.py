"""The vectorized engine: local training, gradients and outputs for many clients at once.

docs/engine.md. The parameters of the clients of a request are stacked (`[n, ...]`) and their
local steps run together, each client on its own minibatch read from the shared schedule
(`engine.schedule`), so the arithmetic is the reference's (`engine.reference`) up to rounding.

- Clients are ordered by their number of local steps (most first) and processed in chunks of
  at most `chunk_size` clients (fewer when their optimizer state or their batches would exceed
  the memory budget). Inside a chunk, the clients that still have a batch at step s form a
  prefix of the chunk, so a step works on the views `[:a]`: the others are left exactly as they
  are, optimizer state and step counters included. A schedule whose active clients are not a
  prefix (never produced by `batch_schedule`) is still handled: the inactive rows inside the
  prefix are saved before the step and restored after it.
- Per-sample weights 1/count make each client's loss the mean over the valid samples of its
  batch (a short last batch averages over fewer samples); padded samples weigh 0.
- Kernels: `MLPKernel` (MLP, LinearRegression), `CNNKernel` (LeNet, LeafCNN), and
  `GenericKernel` (any module, `torch.func`; a loop when vmap fails).
- Outputs of K models on many clients (evaluation, IFCA losses, CAM offsets): when few distinct
  models serve many clients, each model runs once over the concatenated rows of its clients
  (plain `functional_call`, large matrix products); otherwise the stacked kernel runs all the
  clients' own models together.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from clusterfl.data.codes import compact_inputs, decode_codes
from clusterfl.engine.allocator import aligned_rows
from clusterfl.engine.common import (
    WORD_ACCURACY,
    WORD_TARGETS,
    combine,
    per_sample_loss,
    segment_sum,
    word_hits,
)
from clusterfl.engine.device import fork_rng, generator
from clusterfl.engine.generic import GenericKernel
from clusterfl.engine.stacked import (
    ClientNoise,
    GradientSink,
    StackedKernel,
    StackedOptimizer,
    StepBatch,
)
from clusterfl.engine.stacked_cnn import CNNKernel
from clusterfl.engine.stacked_mlp import MLPKernel
from clusterfl.models.params import ParamLayout
from clusterfl.models.zoo import MLP, LeafCNN, LeNet, LinearRegression
from clusterfl.protocol import LocalTraining, Predictor, client_seed

Tensor = torch.Tensor

#: rows per piece when one model runs over many rows
ROW_PIECE = 8192
#: clients per chunk on the CPU when `chunk_size` is not set (every CPU result used it)
CPU_CHUNK = 64
#: shares of a GPU's free memory for the stacked parameter copies and for the activations
GPU_STATE_SHARE = 0.35
GPU_SAMPLE_SHARE = 0.3
#: copies of each activation a training step holds (forward value, its gradient, a temporary)
ACTIVATION_COPIES = 3
# rows per product in `all_model_outputs`, divided by K: keeps the K hidden layers in cache
SHARED_ROWS = 4 * ROW_PIECE


def select_kernel(module: nn.Module, layout: ParamLayout, kind: str = "auto") -> StackedKernel:
    """The fastest kernel for `module`: "auto" picks a fast path for the built-in models.

    `kind` may force "mlp", "cnn" or "generic" (tests, benchmarks), and the CNN kernel's
    convolutions with "cnn-grouped" or "cnn-im2col" ("cnn": `CNNKernel`'s own choice by
    device and precision; `stacked_cnn`).
    """
    if kind == "generic":
        return GenericKernel(module, layout)
    if kind in ("auto", "mlp") and type(module) in (MLP, LinearRegression):
        return MLPKernel(module, layout)
    if kind in ("auto", "cnn", "cnn-grouped", "cnn-im2col") and type(module) in (LeNet, LeafCNN):
        return CNNKernel(module, layout, kind[4:] if kind.startswith("cnn-") else "auto")
    if kind != "auto":
        raise ValueError(f"kernel {kind!r} does not handle {type(module).__name__}")
    return GenericKernel(module, layout)


@dataclass
class SplitData:
    """One split of the federation: inputs and targets (in the compute dtype) and offsets.

    With `scale` set, `x` holds uint8 codes of inputs that are exactly `code / scale` in the
    compute dtype `dtype` (8-bit images: a quarter of the memory); `decode` turns the rows a
    step reads into the inputs, bit for bit (`compact_inputs`).
    """

    x: Tensor
    y: Tensor
    offsets: np.ndarray
    scale: float | None = None
    dtype: torch.dtype = torch.float32

    def decode(self, x: Tensor) -> Tensor:
        """Rows of `x` (gathered, sliced) as inputs in the compute dtype."""
        return x if self.scale is None else decode_codes(x, self.dtype, self.scale)


@dataclass
class Rows:
    """Where the data of the listed clients lives: global start row and size of each client,
    and its start in the concatenation of all listed clients' rows (the "local" order)."""

    start: np.ndarray
    size: np.ndarray
    local: np.ndarray

    @staticmethod
    def of(offsets: np.ndarray, clients: np.ndarray) -> Rows:
        """Rows of `clients` (indices into `offsets`, repeats allowed)."""
        start = offsets[clients].astype(np.int64)
        size = (offsets[clients + 1] - offsets[clients]).astype(np.int64)
        local = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64) if len(size) else size
        return Rows(start, size, local)

    @property
    def total(self) -> int:
        """Number of local rows."""
        return int(self.size.sum())


def _chunks(order: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(order), size):
        yield order[i : i + size]


def _pad_rows(rows: Rows, pick: np.ndarray, idx: np.ndarray,
              device: torch.device) -> tuple[Tensor, Tensor, np.ndarray]:
    """Global and local row indices (on `device`) of local sample indices `idx`
    (`[m, ..., B]`, -1 padded), and where `idx` is valid.

    Padded slots point at a valid row (the client's first, or row 0) and must weigh 0.
    """
    shape = (-1,) + (1,) * (idx.ndim - 1)
    valid = idx >= 0
    start = rows.start[pick].reshape(shape)
    local = rows.local[pick].reshape(shape)
    has = (rows.size[pick] > 0).reshape(shape)
    g = np.where(valid, start + idx, np.where(has, start, 0))
    loc = np.where(valid, local + idx, np.where(has, local, 0))
    return torch.from_numpy(g).to(device), torch.from_numpy(loc).to(device), valid


def _sample_weights(valid: np.ndarray, dtype: torch.dtype, device: torch.device) -> Tensor:
    """1/count on the valid samples of each batch (last axis), 0 on padding."""
    count = valid.sum(-1, keepdims=True)
    w = np.where(valid, 1.0 / np.maximum(count, 1), 0.0)
    return torch.from_numpy(w).to(device, dtype)


def _stack_models(
    layout: ParamLayout, models: Tensor, which: np.ndarray
) -> list[Tensor]:
    """Per-parameter `[m, *shape]` views of the models `which` (no copy when all the same)."""
    m = len(which)
    if len(which) and np.all(which == which[0]):
        return [v.expand(m, *v.shape) for v in layout.views(models[int(which[0])]).values()]
    rows = models.index_select(0, _index(which, models.device))
    return list(layout.views(rows).values())


def _index(ids: np.ndarray, device: torch.device) -> Tensor:
    """`ids` as an int64 index tensor on `device`."""
    return torch.from_numpy(np.asarray(ids, np.int64)).to(device)


class VectorizedEngine:
    """Runs requests for many clients on one architecture (see the module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        layout: ParamLayout,
        kernel: str = "auto",
        chunk_size: int | None = CPU_CHUNK,
        state_budget: int = 3 << 30,
        input_shape: tuple[int, ...] = (),
    ) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.module = module
        self.layout = layout
        self.kernel = select_kernel(module, layout, kernel)
        self.chunk_size = chunk_size
        self.state_budget = state_budget
        self.input_shape = tuple(input_shape)  # one sample's (GPU chunks: `sample_bytes`)
        self._sample_bytes: int | None = None
        for p in module.parameters():
            p.requires_grad_(False)

    # ------------------------------------------------------------------ helpers
    def _chunk_len(self, copies: int, batch: int, dtype: torch.dtype,
                   device: torch.device | None = None) -> int:
        """Clients per chunk for `copies` stacked parameter copies and `batch` samples each.

        On the CPU: at most `chunk_size` (64 when not set), fewer when the parameter copies
        exceed `state_budget` or the samples the kernel's cache-sized `max_samples`. On a GPU
        without a `chunk_size`: as many as the device's free memory holds (`gpu_budgets`).
        """
        per_client = max(1, copies * self.layout.size * torch.finfo(dtype).bits // 8)
        cap, state, samples = self.chunk_size, self.state_budget, self.kernel.max_samples
        if device is not None and device.type == "cuda":
            state, samples = self.gpu_budgets(device, dtype)
        elif cap is None:
            cap = CPU_CHUNK
        by_state = state // per_client
        by_samples = samples // max(batch, 1)
        size = min(by_state, by_samples) if cap is None else min(cap, by_state, by_samples)
        return int(max(1, size))

    def gpu_budgets(self, device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
        """(bytes of stacked parameter copies, samples per step) on a GPU: `GPU_STATE_SHARE`
        of its free memory for the copies, `GPU_SAMPLE_SHARE` for the activations of the
        samples (`sample_bytes` each, measured once on the module)."""
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        per_sample = self.sample_bytes(dtype)
        return int(free * GPU_STATE_SHARE), max(1, int(free * GPU_SAMPLE_SHARE) // per_sample)

    def sample_bytes(self, dtype: torch.dtype) -> int:
        """Bytes one training sample needs on the device: its input and every layer's output,
        each kept for the backward pass and matched by a gradient (×`ACTIVATION_COPIES`),
        and what the kernel holds beyond them (`StackedKernel.workspace_floats`)."""
        if self._sample_bytes is None:
            floats, extra = [0], [0]

            def count(m: nn.Module, inputs: tuple, out: object) -> None:
                if isinstance(out, torch.Tensor):
                    floats[0] += out[0].numel()
                    if inputs and isinstance(inputs[0], torch.Tensor):
                        extra[0] += self.kernel.workspace_floats(m, inputs[0], out)

            leaves = [m for m in self.module.modules() if not list(m.children())]
            hooks = [m.register_forward_hook(count) for m in leaves]
            shape = self.input_shape
            param = next(self.module.parameters())
            try:
                with torch.no_grad():
                    self.module(torch.zeros(1, *shape, dtype=param.dtype, device=param.device))
            finally:
                for h in hooks:
                    h.remove()
            self._sample_bytes = (ACTIVATION_COPIES * (floats[0] + int(np.prod(shape)))
                                  + extra[0])
        return max(1, self._sample_bytes * torch.finfo(dtype).bits // 8)

    def _targets(self, data: SplitData, idx: Tensor) -> Tensor:
        y = data.y.index_select(0, idx.reshape(-1))
        return y.view(*idx.shape, *data.y.shape[1:])

    # ------------------------------------------------------------------ training
    def _noise(self, clients: np.ndarray | None, pick: np.ndarray, seed: int,
               dev: torch.device) -> list[torch.Generator] | None:
        """Each picked client's own dropout generator, seeded as the per-client loop seeds
        it (`protocol.client_seed`): its noise then does not depend on the clients sharing
        its chunk, on `chunk_size` or on the sample. None when the kernel draws no noise or
        no client ids are given."""
        if clients is None or not self.kernel.draws_noise:
            return None
        return [generator(dev, client_seed(seed, int(c))) for c in np.asarray(clients)[pick]]

    def train(
        self,
        data: SplitData,
        rows: Rows,
        models: Tensor,
        model_of_client: np.ndarray,
        schedule: np.ndarray,
        tr: LocalTraining,
        task: str,
        offsets: Tensor | None,
        seed: int,
        sample_weight: Tensor | None = None,
        prox_center: Tensor | None = None,
        prox_scale: np.ndarray | None = None,
        clients: np.ndarray | None = None,
    ) -> tuple[Tensor, np.ndarray]:
        """Local training of every listed client (schedule `[n, S, B]`, local indices).

        Returns the final flat parameters `[n, d]` and each client's mean batch loss (NaN
        for a client without any step). `offsets` are `[rows.total, O]` logits added to the
        outputs, in local row order. `sample_weight` (`[rows.total]`, local row order)
        multiplies each sample's loss (a batch's loss is Σ_j w_j ℓ_j / |batch|).
        `prox_center` (`[n, d]`) and `prox_scale` (`[n]`) replace the proximal term's pull
        to the start model by mu·scale_i/2 ||w − center_i||² (the gradient of
        mu/2 Σ_s a_is ||w − c_s||² with scale_i = Σ_s a_is, center_i = Σ_s a_is c_s / scale_i).
        """
        n, d, dev = len(rows.size), self.layout.size, models.device
        out = torch.empty(n, d, dtype=models.dtype, device=dev)
        losses = np.full(n, np.nan)
        if n == 0:
            return out, losses
        n_steps = (schedule >= 0).any(-1).sum(-1)
        order = np.argsort(-n_steps, kind="stable")
        copies = 2 + (tr.momentum != 0) + 4 * (tr.optimizer == "adam") + 2 * (tr.mu > 0)
        size = self._chunk_len(copies, schedule.shape[-1], models.dtype, dev)
        with fork_rng(dev):
            torch.manual_seed(int(seed) & 0xFFFFFFFF)
            gen = generator(dev, int(seed) & 0xFFFFFFFF)
            for pick in _chunks(order, size):
                prox = None
                if prox_center is not None and tr.mu > 0:
                    scale = np.ones(len(pick)) if prox_scale is None else prox_scale[pick]
                    prox = (prox_center[_index(pick, dev)],
                            torch.as_tensor(scale, dtype=models.dtype, device=dev))
                params, loss = self._train_chunk(
                    data, rows, pick, models, np.asarray(model_of_client)[pick],
                    schedule[pick], tr, task, offsets, gen, sample_weight, prox,
                    self._noise(clients, pick, seed, dev),
                )
                flat = [p.reshape(len(pick), -1) for p in params]
                if np.all(np.diff(pick) == 1):  # consecutive rows: write them in place
                    torch.cat(flat, dim=1, out=out[int(pick[0]) : int(pick[0]) + len(pick)])
                else:
                    out.index_copy_(0, _index(pick, dev), torch.cat(flat, dim=1))
                losses[pick] = loss
        return out, losses

    def _train_chunk(
        self,
        data: SplitData,
        rows: Rows,
        pick: np.ndarray,
        models: Tensor,
        which: np.ndarray,
        schedule: np.ndarray,
        tr: LocalTraining,
        task: str,
        offsets: Tensor | None,
        gen: torch.Generator,
        sample_weight: Tensor | None = None,
        prox: tuple[Tensor, Tensor] | None = None,
        noise: list[torch.Generator] | None = None,
    ) -> tuple[list[Tensor], np.ndarray]:
        """Train the clients `pick` together; returns their stacked parameters and losses."""
        m, dtype, dev = len(pick), models.dtype, models.device
        active = np.asarray((schedule >= 0).any(-1), dtype=bool)  # [m, S]
        n_steps = int(np.nonzero(active.any(0))[0].max()) + 1 if active.any() else 0
        schedule = schedule[:, :n_steps]
        gidx, lidx, valid = _pad_rows(rows, pick, schedule, dev)
        weights = _sample_weights(valid, dtype, dev)
        active_t = torch.from_numpy(active[:, :n_steps]).to(dev)
        if sample_weight is not None:
            weights = weights * sample_weight.to(dtype)[lidx]
        start = _stack_models(self.layout, models, which)
        params = [v.clone(memory_format=torch.contiguous_format) for v in start]
        center = start if tr.mu > 0 else None
        scale = None
        if prox is not None:
            center = list(self.layout.views(prox[0]).values())
            scale = prox[1]
        opt = StackedOptimizer(params, tr, center, scale)
        # summed on the device (one copy back per chunk), in float64 as numpy would
        loss_sum = torch.zeros(m, dtype=torch.float64, device=dev)
        loss_n = np.zeros(m, dtype=np.int64)
        for s in range(n_steps):
            act = active[:, s]
            a = int(act.sum())
            if a == 0:
                continue
            width = a if act[:a].all() else int(np.nonzero(act)[0].max()) + 1
            act_w = act[:width]
            hole = np.nonzero(~act_w)[0]
            saved = []
            if len(hole):
                hole_t = _index(hole, dev)
                saved = [t[:width].index_select(0, hole_t) for t in opt.state()]
            opt.begin(width, act_w)
            idx = gidx[:width, s]
            x = data.decode(self.kernel.gather(data.x, idx))
            y = self._targets(data, idx)
            off = None
            if offsets is not None:
                off = offsets.index_select(0, lidx[:width, s].reshape(-1))
                off = off.view(width, -1, *offsets.shape[1:])  # [N, O] or [N, T, V]
            views = [p[:width] for p in params]
            own = None if noise is None else ClientNoise(noise[:width],
                                                         valid[:width, s].sum(-1))
            batch = StepBatch(x, y, weights[:width, s], off, task, gen, own)
            loss = self.kernel.train_step(views, batch, opt)
            for t, v in zip(opt.state(), saved):
                t[:width].index_copy_(0, hole_t, v)
            loss_sum[:width] += torch.where(active_t[:width, s], loss.detach().double(), 0.0)
            loss_n[:width][act_w] += 1
        total = loss_sum.cpu().numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            return params, np.where(loss_n > 0, total / np.maximum(loss_n, 1), np.nan)

    # ------------------------------------------------------------------ gradients
    def gradients(
        self,
        data: SplitData,
        rows: Rows,
        models: Tensor,
        model_of_client: np.ndarray,
        batches: np.ndarray,
        task: str,
        seed: int,
        clients: np.ndarray | None = None,
    ) -> tuple[Tensor, np.ndarray]:
        """Gradient of each client's mean loss on its batch (`[n, b]` local indices, -1 padded)
        at `models[model_of_client[i]]`, in training mode. Returns `[n, d]` and the losses.
        `clients` (ids): dropout noise of each client's own (`_noise`)."""
        n, d, dtype, dev = len(rows.size), self.layout.size, models.dtype, models.device
        grads = aligned_rows(n, d, dtype, dev)  # whole cache lines per row: see aligned_rows
        losses = np.full(n, np.nan)
        if n == 0:
            return grads, losses
        which = np.asarray(model_of_client, np.int64)
        order = np.argsort(which, kind="stable")
        size = self._chunk_len(1, batches.shape[-1], dtype, dev)
        with fork_rng(dev):
            torch.manual_seed(int(seed) & 0xFFFFFFFF)
            gen = generator(dev, int(seed) & 0xFFFFFFFF)
            for pick in _chunks(order, size):
                m = len(pick)
                gidx, _, valid = _pad_rows(rows, pick, batches[pick], dev)
                w = _sample_weights(valid, dtype, dev)
                x = data.decode(self.kernel.gather(data.x, gidx))
                y = self._targets(data, gidx)
                params = _stack_models(self.layout, models, which[pick])
                direct = bool(np.all(np.diff(pick) == 1))  # rows pick[0]..pick[-1]
                lo = int(pick[0])
                out = list(self.layout.views(grads[lo : lo + m]).values()) if direct else None
                sink = GradientSink(self.kernel.shapes, m, dtype, out, dev)
                noise = self._noise(clients, pick, seed, dev)
                own = None if noise is None else ClientNoise(noise, valid.sum(-1))
                loss = self.kernel.train_step(params, StepBatch(x, y, w, None, task, gen, own),
                                              sink)
                if not direct:
                    grads.index_copy_(0, _index(pick, dev), sink.flat())
                has = valid.any(-1)
                losses[pick] = np.where(has, loss.double().cpu().numpy(), np.nan)
        return grads, losses

    # ------------------------------------------------------------------ outputs
    @torch.no_grad()
    def model_outputs(
        self, data: SplitData, rows: Rows, models: Tensor, which: np.ndarray,
        own: bool = False,
    ) -> Tensor:
        """Outputs (evaluation mode) of model `which[i]` on all rows of client i: `[total, O]`.
        A model shared by many clients runs over all their rows at once, unless `own`
        (`Predictor.own`): every client then runs its own stacked copy."""
        which = np.asarray(which, np.int64)
        out: Tensor | None = None
        uniq = np.unique(which)
        if not own and len(uniq) * 4 <= len(which):
            for k in uniq:
                members = np.nonzero(which == k)[0]
                out = self._shared_outputs(data, rows, models[int(k)], members, out)
        else:
            out = self._stacked_outputs(data, rows, models, which)
        if out is None:  # no rows at all
            probe = functional_call(
                self.module, self.layout.views(models[0]), (data.decode(data.x[:1]),)
            ) if len(data.x) else torch.zeros(1, 1, dtype=models.dtype)
            out = torch.zeros(0, *probe.shape[1:], dtype=models.dtype, device=models.device)
        return out

    def _new_out(self, rows: Rows, like: Tensor) -> Tensor:
        """`[total, O]` outputs, of the dtype and device of one piece `like` `[r, O]` (a
        language model's `[r, T, V]`: `[total, T, V]`)."""
        return torch.empty(rows.total, *like.shape[1:], dtype=like.dtype, device=like.device)

    def _shared_outputs(
        self, data: SplitData, rows: Rows, params: Tensor, members: np.ndarray, out: Tensor | None
    ) -> Tensor | None:
        """One model over the rows of `members` (contiguous runs of rows go together)."""
        self.module.eval()
        named = self.layout.views(params)
        one = self.kernel.forward_one if isinstance(self.kernel, CNNKernel) else None
        for g0, l0, length in _runs(rows, members):
            for p in range(0, length, ROW_PIECE):
                q = min(length, p + ROW_PIECE)
                x = data.decode(data.x[g0 + p : g0 + q])
                if one is not None:  # the kernel's faster evaluation (pooling, channels-last)
                    res = one(list(named.values()), x)
                else:
                    res = functional_call(self.module, named, (x,)).to(params.dtype)  # bf16
                if out is None:
                    out = self._new_out(rows, res)
                out[l0 + p : l0 + q] = res
        return out

    def _stacked_outputs(
        self, data: SplitData, rows: Rows, models: Tensor, which: np.ndarray
    ) -> Tensor | None:
        """Each client's own model on its own rows, clients stacked, in row pieces."""
        out = None
        biggest = int(rows.size.max()) if len(rows.size) else 0
        size = self._chunk_len(1, min(biggest, ROW_PIECE), models.dtype, models.device)
        for pick in _chunks(np.arange(len(which)), size):
            sizes = rows.size[pick]
            most = self.kernel.max_samples
            if models.device.type == "cuda":
                most = self.gpu_budgets(models.device, models.dtype)[1]
            piece = max(1, most // len(pick))
            params = _stack_models(self.layout, models, which[pick])
            for p in range(0, int(sizes.max()), piece):
                q = min(int(sizes.max()), p + piece)
                local = np.arange(p, q)[None, :].repeat(len(pick), 0)
                local = np.where(local < sizes[:, None], local, -1)
                gidx, lidx, valid = _pad_rows(rows, pick, local, models.device)
                res = self.kernel.forward(params, data.decode(self.kernel.gather(data.x, gidx)))
                if out is None:
                    out = self._new_out(rows, res[0])
                mask = torch.from_numpy(valid.reshape(-1)).to(models.device)
                out[lidx.reshape(-1)[mask]] = res.reshape(-1, *res.shape[2:])[mask]
        return out

    @torch.no_grad()
    def all_model_outputs(self, data: SplitData, rows: Rows, models: Tensor) -> Tensor:
        """Outputs `[total, K, O]` of every row of `models` on all rows of every listed client
        (IFCA's losses). Uses the kernel's shared-input forward when it has one (one product
        for the first layers of all K models, the last layers writing in place)."""
        k, n = models.shape[0], len(rows.size)
        if not isinstance(self.kernel, MLPKernel) or k == 1 or rows.total == 0:
            outs = [self.model_outputs(data, rows, models, np.full(n, j)) for j in range(k)]
            return torch.stack(outs, 1)
        prepared = self.kernel.prepare_shared(
            [list(self.layout.views(models[j]).values()) for j in range(k)]
        )
        width = self.kernel.shared_width(prepared)
        out = torch.empty(rows.total, k, width, dtype=models.dtype, device=models.device)
        piece = max(256, SHARED_ROWS // k)
        for g0, l0, length in _runs(rows, np.arange(n)):
            for p in range(0, length, piece):
                q = min(length, p + piece)
                dest = [out[l0 + p : l0 + q, j] for j in range(k)]
                self.kernel.forward_shared(prepared, data.decode(data.x[g0 + p : g0 + q]), dest)
        return out

    @torch.no_grad()
    def predictor_outputs(self, data: SplitData, rows: Rows, pred: Predictor) -> Tensor:
        """Combined outputs of `pred` (row i of `members` for client i) on its rows."""
        members = np.asarray(pred.members, np.int64)
        outs = [
            self.model_outputs(data, rows, pred.models, members[:, j], pred.own)
            for j in range(members.shape[1])
        ]
        weights = None
        if pred.weights is not None:  # client i's member weights on each of its rows
            weights = torch.from_numpy(np.repeat(np.asarray(pred.weights, np.float64),
                                                 rows.size, axis=0)).to(pred.models.device)
        return combine(outs, pred.combine, weights)


def _runs(rows: Rows, members: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(global start, local start, length) of maximal runs of consecutive rows of `members`."""
    g0 = l0 = length = -1
    for i in members:
        s, loc, n = int(rows.start[i]), int(rows.local[i]), int(rows.size[i])
        if n == 0:
            continue
        if length >= 0 and s == g0 + length and loc == l0 + length:
            length += n
            continue
        if length > 0:
            yield g0, l0, length
        g0, l0, length = s, loc, n
    if length > 0:
        yield g0, l0, length


def client_metrics_batched(
    out: Tensor, y: Tensor, sizes: np.ndarray, task: str, n_classes: int,
    not_words: tuple[int, ...] = (),
) -> dict[str, np.ndarray]:
    """`common.client_metrics` for every client at once; `out`, `y` in local row order."""
    n, dev = len(sizes), out.device
    seg = _index(np.repeat(np.arange(n), sizes), dev)
    nan = np.full(n, np.nan)
    words = task == "language_model" and bool(not_words)
    with np.errstate(invalid="ignore", divide="ignore"):
        if len(y) == 0:
            empty = {WORD_ACCURACY: nan.copy(), WORD_TARGETS: np.zeros(n)} if words else {}
            return {"accuracy": nan, "macro_f1": nan.copy(), "loss": nan.copy(), "mse": nan.copy(),
                    "perplexity": nan.copy(), **empty}
        per = per_sample_loss(out, y, task)
        if per.dim() > 1:
            per = per.reshape(per.shape[0], -1).mean(1)
        total = segment_sum(per, sizes).cpu().numpy()
        loss = np.where(sizes > 0, total / np.maximum(sizes, 1), np.nan)
        if task == "regression":
            return {"accuracy": nan, "macro_f1": nan.copy(), "loss": loss, "mse": loss.copy(),
                    "perplexity": nan.copy()}
        pred = out.argmax(-1)
        right = pred == y
        if right.dim() > 1:  # a language model: the share of each sequence's tokens
            right = right.double().mean(-1)
        hit = segment_sum(right, sizes).cpu().numpy()
        acc = np.where(sizes > 0, hit / np.maximum(sizes, 1), np.nan)
        if task == "language_model":  # no macro-F1 over a vocabulary
            extra = {}
            if words:  # per client (right, counted) on the device, one [n, 2] copy
                hits, counted = segment_sum(torch.stack(word_hits(pred, y, not_words), 1),
                                            sizes).cpu().numpy().T
                extra = {WORD_ACCURACY: np.where(counted > 0, hits / np.maximum(counted, 1),
                                                 np.nan), WORD_TARGETS: counted}
            return {"accuracy": acc, "macro_f1": nan, "loss": loss, "mse": nan.copy(),
                    "perplexity": _exp(loss), **extra}
        c = n_classes
        conf = torch.bincount(seg * c * c + y * c + pred, minlength=n * c * c).view(n, c, c)
        tp = torch.diagonal(conf, dim1=1, dim2=2).double()
        support, predicted = conf.sum(2).double(), conf.sum(1).double()
        denom = support + predicted
        present = denom > 0
        f1 = torch.where(present, 2 * tp / denom.clamp_min(1), torch.zeros_like(tp))
        f1_mean = ((f1 * present).sum(1) / present.sum(1).clamp_min(1)).cpu().numpy()
        f1_mean = np.where(sizes > 0, f1_mean, np.nan)
    return {"accuracy": acc, "macro_f1": f1_mean, "loss": loss, "mse": nan,
            "perplexity": nan.copy()}


def _exp(loss: np.ndarray) -> np.ndarray:
    """exp of mean token losses: the perplexities (+inf past float range, NaN stays)."""
    with np.errstate(over="ignore"):
        return np.exp(loss)


def mean_per_client(values: Tensor, sizes: np.ndarray) -> np.ndarray:
    """Mean of `values` (`[total]`, local row order) over each client's rows (NaN if none)."""
    total = segment_sum(values, sizes).cpu().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sizes > 0, total / np.maximum(sizes, 1), np.nan)


__all__ = [
    "ROW_PIECE", "Rows", "SplitData", "VectorizedEngine", "client_metrics_batched",
    "compact_inputs", "decode_codes",
    "mean_per_client", "select_kernel",
]
