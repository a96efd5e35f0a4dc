"""Hand-written stacked forward/backward for fully connected networks (no autograd).

Covers `models.zoo.MLP` (any depth, ReLU, dropout) and `LinearRegression` (with or without
bias), and serves as the fully connected head of the CNN kernel. Each layer is one batched
matrix product over the clients (`torch.baddbmm`), and the weight gradient `dZᵀ·h` is handed
to the sink as a product so the update can be fused into it (no stacked gradient is stored
for plain SGD or momentum SGD).

Under "bf16-mixed" (autocast on, float32 parameters: `engine.device.low_precision`) the
stack takes its mixed path: inputs, weights and biases are cast to bfloat16 (in workspace
buffers), the forward and backward products run in bfloat16 and so do the activations
between layers; dropout masks (drawn in float32, the same draws as without autocast), the
outputs handed to the loss, the loss gradient and the bias gradients are float32, and the
weight gradients reach the sink as bfloat16 products (`Sink.matmul`), which it applies or
stores in float32. Without autocast the float32 code runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from clusterfl.engine.device import low_precision
from clusterfl.engine.stacked import (
    ClientNoise,
    Sink,
    StackedKernel,
    StepBatch,
    Workspace,
    loss_and_grad,
)
from clusterfl.models.params import ParamLayout
from clusterfl.models.zoo import MLP, LinearRegression

Tensor = torch.Tensor


@dataclass(frozen=True)
class DenseLayer:
    """One `nn.Linear` layer: parameter positions in the layout and what follows it."""

    weight: int
    bias: int | None
    relu: bool
    dropout: float = 0.0


@dataclass
class SharedModels:
    """K unstacked models prepared for `MLPKernel.forward_shared`."""

    params: list[list[Tensor]]
    weight_t: Tensor
    bias: Tensor | None
    weight: Tensor | None = None  # [K·out, in] for the fused oneDNN product, when it applies
    low: torch.dtype | None = None  # bf16-mixed: the dtype of params, weight_t and bias


@dataclass
class DenseCache:
    """What the backward pass needs from the forward pass."""

    inputs: list[Tensor]
    masks: list[Tensor | None]
    weights: list[Tensor] = field(default_factory=list)  # bf16-mixed: the cast weights
    low: torch.dtype | None = None  # bf16-mixed: the dtype of the products


class DenseStack:
    """A chain of linear layers (optionally ReLU and dropout after each) on stacked clients."""

    def __init__(self, layers: list[DenseLayer], ws: Workspace, tag: str = "d") -> None:
        self.layers = layers
        self.ws = ws
        self.tag = tag

    def forward(
        self,
        params: list[Tensor],
        h: Tensor,
        train: bool,
        generator: torch.Generator | None,
        clients: ClientNoise | None = None,
    ) -> tuple[Tensor, DenseCache]:
        """`h` `[a, B, in]` → outputs `[a, B, out]`; dropout noise from `generator`, or from
        each client's own (`clients`: drawn on its valid rows only, as its own loop would).

        The outputs live in the workspace: consume them before the next call. Under
        bf16-mixed they are float32 (a copy of the bfloat16 result).
        """
        low = low_precision(params[self.layers[0].weight])
        cache = DenseCache([], [], [], low)
        a, b = h.shape[:2]
        if low is not None:  # bf16-mixed: the products and activations in bfloat16
            h = self._cast(f"{self.tag}in", h, low)
        for k, layer in enumerate(self.layers):
            w, bias = params[layer.weight], None if layer.bias is None else params[layer.bias]
            if low is not None:
                w = self._cast(f"{self.tag}w{k}", w, low)
                bias = None if bias is None else self._cast(f"{self.tag}b{k}", bias, low)
            z = self.ws.get(f"{self.tag}z{k}", (a, b, w.shape[1]), h.dtype, h.device)
            fused = (low is None and _shared(w) and h.is_contiguous()
                     and _fused_linear_relu(layer, h))
            if fused:
                # one model for all: one large oneDNN product with bias and ReLU in its
                # epilogue (measured 17.7 ms against 21.2 ms for addmm + clamp, 8192 x 784 x 200)
                assert bias is not None  # `fused` needs a bias (see `_fused_linear_relu`)
                z = torch.ops.mkldnn._linear_pointwise(
                    h.view(a * b, -1), w[0], bias[0], "relu", [], ""
                ).view(a, b, -1)
            elif _shared(w) and h.is_contiguous():  # one model for all: one large product
                flat = z.view(a * b, -1)
                if bias is not None:
                    torch.addmm(bias[0], h.view(a * b, -1), w[0].t(), out=flat)
                else:
                    torch.mm(h.view(a * b, -1), w[0].t(), out=flat)
            elif bias is not None:
                torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2), out=z)
            else:
                torch.bmm(h, w.transpose(1, 2), out=z)
            if layer.relu and not fused:
                z.clamp_(min=0)
            mask = None
            if train and layer.dropout > 0:  # drawn in the parameters' dtype: the same noise
                keep = 1.0 - layer.dropout
                dtype = params[layer.weight].dtype
                if clients is None:
                    mask = torch.empty(z.shape, dtype=dtype, device=z.device)
                    mask.bernoulli_(keep, generator=generator)
                else:
                    mask = torch.zeros(z.shape, dtype=dtype, device=z.device)
                    for i, (gen, n) in enumerate(zip(clients.generators, clients.rows)):
                        if n:
                            mask[i, : int(n)].bernoulli_(keep, generator=gen)
                mask.div_(keep)
                z.mul_(mask)
            cache.inputs.append(h)
            cache.masks.append(mask)
            cache.weights.append(w)
            h = z
        if low is None:
            return h, cache
        out = self.ws.get(f"{self.tag}out32", h.shape, params[self.layers[-1].weight].dtype,
                          h.device)
        return out.copy_(h), cache

    def _cast(self, key: str, t: Tensor, low: torch.dtype) -> Tensor:
        """`t` in `low`, in the workspace buffer `key` (one copy of a tensor expanded over the
        clients, which stays expanded); `t` itself when it is `low` already."""
        if t.dtype == low:
            return t
        if _shared(t):
            one = self.ws.get(key, t.shape[1:], low, t.device)
            one.copy_(t[0])
            return one.expand(t.shape)
        out = self.ws.get(key, t.shape, low, t.device)
        out.copy_(t)
        return out

    def backward(
        self,
        params: list[Tensor],
        cache: DenseCache,
        dout: Tensor,
        sink: Sink,
        need_input_grad: bool = False,
    ) -> Tensor | None:
        """Back-propagate `dout`; each weight's gradient goes to `sink` right after its last use.

        Under bf16-mixed (a `cache` of `_forward_mixed`) `dout` (float32) is cast to bfloat16
        for the products, the weights are the bfloat16 copies the forward used (taken before
        the updates below), bias gradients are summed in the parameters' dtype, and the input
        gradient is in bfloat16.
        """
        mixed = cache.low is not None
        dz = self._cast(f"{self.tag}dout16", dout, cache.low) if cache.low is not None else dout
        last = len(self.layers) - 1
        for k in range(last, -1, -1):
            layer = self.layers[k]
            h_in = cache.inputs[k]
            w = cache.weights[k] if mixed else params[layer.weight]
            dh = None
            if k > 0 or need_input_grad:
                dh = self.ws.get(f"{self.tag}dh{k}", h_in.shape, dz.dtype, dz.device)
                if _shared(w) and dz.is_contiguous():
                    torch.mm(dz.view(-1, dz.shape[-1]), w[0], out=dh.view(-1, dh.shape[-1]))
                else:
                    torch.bmm(dz, w, out=dh)
                if k > 0:
                    prev = self.layers[k - 1]
                    mask = cache.masks[k - 1]
                    if mask is not None:
                        dh.mul_(mask)
                    if prev.relu:  # ReLU backward: keep dh where the layer's output is > 0
                        torch.ops.aten.threshold_backward.grad_input(dh, h_in, 0.0, grad_input=dh)
            sink.matmul(layer.weight, dz.transpose(1, 2), h_in)
            if layer.bias is not None and not mixed:
                sink.grad(layer.bias, dz.sum(1))
            elif layer.bias is not None:
                dtype = params[layer.bias].dtype
                sink.grad(layer.bias, dout.sum(1) if k == last else dz.sum(1, dtype=dtype))
            dz = dh  # type: ignore[assignment]  # dh is a Tensor here
        return dz if need_input_grad else None


def _fused_linear_relu(layer: DenseLayer, like: Tensor) -> bool:
    """Whether the shared first layer can run as one fused oneDNN linear + bias + ReLU (a
    CPU float32 computation like the tensor `like`)."""
    return (
        layer.relu
        and layer.bias is not None
        and layer.dropout == 0.0
        and like.dtype == torch.float32
        and like.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _shared(w: Tensor) -> bool:
    """True when a stacked tensor is one tensor expanded over the clients (stride 0)."""
    return w.shape[0] > 1 and w.stride(0) == 0


def dense_layers(
    layout: ParamLayout,
    linears: list[tuple[str, nn.Linear]],
    relu: list[bool],
    dropout: list[float],
) -> list[DenseLayer]:
    """`DenseLayer`s for named `nn.Linear` modules (names as in `named_modules`)."""
    names = layout.names
    out = []
    for (name, lin), r, p in zip(linears, relu, dropout):
        prefix = f"{name}." if name else ""
        bias = names.index(f"{prefix}bias") if lin.bias is not None else None
        out.append(DenseLayer(names.index(f"{prefix}weight"), bias, r, p))
    return out


class MLPKernel(StackedKernel):
    """`MLP` and `LinearRegression`: flatten, then the dense stack."""

    name = "mlp"

    def __init__(self, module: nn.Module, layout: ParamLayout) -> None:
        super().__init__(module, layout)
        if isinstance(module, MLP):
            linears = [(f"layers.{i}", lin) for i, lin in enumerate(module.layers)]
            n = len(linears)
            relu = [i < n - 1 for i in range(n)]
            drop = [module.dropout if i < n - 1 else 0.0 for i in range(n)]
        elif isinstance(module, LinearRegression):
            linears, relu, drop = [("linear", module.linear)], [False], [0.0]
        else:
            raise TypeError(f"MLPKernel does not handle {type(module).__name__}")
        layers = dense_layers(layout, linears, relu, drop)  # type: ignore[arg-type]  # nn.Linear list
        self.dense = DenseStack(layers, self.ws)
        self.draws_noise = any(layer.dropout > 0 for layer in layers)

    def gather(self, x_all: Tensor, idx: Tensor) -> Tensor:
        a, b = idx.shape
        flat = x_all.reshape(x_all.shape[0], -1)
        out = self.ws.get("gather", (a * b, flat.shape[1]), x_all.dtype, x_all.device)
        torch.index_select(flat, 0, idx.reshape(-1), out=out)
        return out.view(a, b, -1)

    def train_step(self, params: list[Tensor], batch: StepBatch, sink: Sink) -> Tensor:
        x, y, w, offset, task = batch.x, batch.y, batch.w, batch.offset, batch.task
        out, cache = self.dense.forward(params, x, True, batch.generator, batch.clients)
        if offset is not None:
            out = out + offset
        loss, dout = loss_and_grad(out, y, w, task)
        assert dout is not None
        self.dense.backward(params, cache, dout, sink)
        return loss

    def forward(self, params: list[Tensor], x: Tensor) -> Tensor:
        out, _ = self.dense.forward(params, x.reshape(x.shape[0], x.shape[1], -1), False, None)
        return out

    def prepare_shared(self, params: list[list[Tensor]]) -> SharedModels:
        """Concatenate the first layers of K models (each a list of unstacked parameters).

        Under bf16-mixed every parameter is cast to bfloat16 here, once for all rows.
        """
        first = self.dense.layers[0]
        low = low_precision(params[0][first.weight]) if params else None
        if low is not None:
            params = [[p.to(low) for p in model] for model in params]
            weight_t = torch.cat([p[first.weight] for p in params], 0).t().contiguous()
            bias = None if first.bias is None else torch.cat([p[first.bias] for p in params])
            return SharedModels(params, weight_t, bias, None, low)
        # [in, K·out] contiguous: MKL is faster on a plain right operand than on a transposed one
        weight_t = torch.cat([p[first.weight] for p in params], 0).t().contiguous()
        bias = None if first.bias is None else torch.cat([p[first.bias] for p in params])
        weight = None
        if _fused_linear_relu(first, weight_t):
            weight = torch.cat([p[first.weight] for p in params], 0).contiguous()
        return SharedModels(params, weight_t, bias, weight)

    def shared_width(self, shared: SharedModels) -> int:
        """Output width of each prepared model."""
        last = self.dense.layers[-1]
        return int(shared.params[0][last.weight].shape[0])

    def forward_shared(
        self, shared: SharedModels, x: Tensor, dest: list[Tensor] | None = None
    ) -> list[Tensor]:
        """Outputs `[R, O]` of the K prepared models on the same rows `x` (evaluation mode).

        The first layer of all K models is one matrix product, so the rows are read once.
        With `dest` (K tensors `[R, O]`) the last layer writes there directly. Without it,
        outputs may live in the workspace: consume them before the next call. Under
        bf16-mixed (`shared.low`) the products run in bfloat16 and the outputs are in the
        dtype of `x`.
        """
        low = shared.low
        h = x.reshape(x.shape[0], -1)
        if low is not None:
            h = h.to(low)
        layers, params, weight_t = self.dense.layers, shared.params, shared.weight_t
        if low is None and shared.weight is not None and h.dtype == shared.weight.dtype:
            # one oneDNN call with the bias and ReLU applied in its epilogue (instead of a
            # pass that copies the bias into z, the product, and a pass for the ReLU)
            z = torch.ops.mkldnn._linear_pointwise(
                h.contiguous(), shared.weight, shared.bias, "relu", [], ""
            )
        else:
            z = self.ws.get("shared_z", (h.shape[0], weight_t.shape[1]), h.dtype, h.device)
            if shared.bias is not None:
                torch.addmm(shared.bias, h, weight_t, out=z)
            else:
                torch.mm(h, weight_t, out=z)
            if layers[0].relu:
                z.clamp_(min=0)
        width = weight_t.shape[1] // len(params)
        outs = []
        for k, p in enumerate(params):
            hk = z[:, k * width : (k + 1) * width]
            for i, layer in enumerate(layers[1:], start=1):
                last = i == len(layers) - 1
                out = dest[k] if dest is not None and last and low is None else None
                w = p[layer.weight].t()
                if layer.bias is not None:
                    hk = torch.addmm(p[layer.bias], hk, w, out=out)
                else:
                    hk = torch.mm(hk, w, out=out)
                if layer.relu:
                    hk.clamp_(min=0)
            if low is not None:  # the bfloat16 outputs, in the dtype of `x`
                hk = dest[k].copy_(hk) if dest is not None else hk.to(x.dtype)
            elif dest is not None and len(layers) == 1:
                dest[k].copy_(hk)
                hk = dest[k]
            outs.append(hk)
        return outs
