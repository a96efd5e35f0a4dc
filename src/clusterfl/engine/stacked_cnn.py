"""Stacked small CNNs (`LeNet`, `LeafCNN`, with or without GroupNorm) as one convolution.

The `a` clients become the groups of one convolution: the minibatches are laid side by side
along the channel axis (`[B, a·C, H, W]`) and the stacked kernels form the weight
`[a·C_out, C_in, k, k]` with `groups=a`; GroupNorm with G groups per client is GroupNorm with
a·G groups on the stacked channels. The convolutional part uses autograd (its parameters are
tiny); the fully connected head, which holds almost all parameters, is the hand-written
`DenseStack` with the update fused into the backward products.

Two ways to compute the stacked convolution (`CNNKernel.conv`): "grouped", the one `conv2d`
with `groups=a` above (every CPU result was computed so), and "im2col": the patches of all
clients' inputs unfolded once (`F.unfold`, `[B, a·C·k·k, L]`) and multiplied by each
client's kernel matrix `[O, C·k·k]` in one batched matrix product, whose result `[B, a, O, L]`
is already the stacked channel layout. On a GPU, grouped convolutions with a few channels
per group under deterministic algorithms (`engine.device.set_precision`) run far below the
card's speed; the unfolded product is plain cuBLAS work and its backward (`col2im`) is
deterministic too, at the price of the unfolded patches in memory (`workspace_floats`).
"auto" (default): "im2col" on CUDA, "grouped" on the CPU and under "bf16-mixed". Measured on
an H200, one round of 100 LeNet clients × 500 CIFAR-shaped samples (`benchmarks/gpu/`):
float32 0.099 s unfolded against 0.136 s grouped; bf16-mixed 0.090 s unfolded against
0.056 s grouped (cuDNN's bfloat16 grouped kernels are fast); on the CPU (2 threads) the
unfolded path is about 2× slower.

Under "bf16-mixed" the convolutions (forward and, through autograd, backward) run in
bfloat16 by autocast itself; the features enter the dense head's mixed path, whose bfloat16
input gradient autograd takes as it is (it casts it to the features' dtype, float32 where
autocast computes GroupNorm in float32, as on CUDA). The parameters are float32 leaves, so
their gradients come back float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from clusterfl.engine.device import low_precision
from clusterfl.engine.stacked import Sink, StackedKernel, StepBatch, loss_and_grad
from clusterfl.engine.stacked_mlp import DenseStack, dense_layers
from clusterfl.models.params import ParamLayout
from clusterfl.models.zoo import LeafCNN, LeNet

Tensor = torch.Tensor


@dataclass(frozen=True)
class ConvOp:
    """One layer of the feature extractor, with its parameter positions in the layout."""

    kind: str  # "conv", "gn", "relu", "maxpool"
    weight: int | None = None
    bias: int | None = None
    stride: tuple[int, ...] = (1, 1)
    padding: tuple[int, ...] = (0, 0)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    eps: float = 1e-5
    kernel: tuple[int, ...] = (2, 2)
    ceil_mode: bool = False


def _pair(v: int | tuple[int, ...]) -> tuple[int, ...]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _feature_ops(features: nn.Sequential, layout: ParamLayout, prefix: str) -> list[ConvOp]:
    names = layout.names
    ops: list[ConvOp] = []
    for j, m in enumerate(features):
        p = f"{prefix}.{j}."
        bias = names.index(p + "bias") if f"{p}bias" in names else None
        if isinstance(m, nn.Conv2d):
            if m.groups != 1 or m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise TypeError("only plain zero-padded Conv2d layers are stacked")
            ops.append(ConvOp("conv", names.index(p + "weight"), bias, _pair(m.stride),
                              _pair(m.padding), _pair(m.dilation)))
        elif isinstance(m, nn.GroupNorm):
            if not m.affine:
                raise TypeError("GroupNorm without affine parameters is not stacked")
            weight = names.index(p + "weight")
            ops.append(ConvOp("gn", weight, bias, groups=m.num_groups, eps=m.eps))
        elif isinstance(m, nn.ReLU):
            ops.append(ConvOp("relu"))
        elif isinstance(m, nn.MaxPool2d):
            ops.append(ConvOp("maxpool", stride=_pair(m.stride), padding=_pair(m.padding),
                              dilation=_pair(m.dilation), kernel=_pair(m.kernel_size),
                              ceil_mode=m.ceil_mode))
        elif not isinstance(m, nn.Identity):
            raise TypeError(f"layer {type(m).__name__} is not stacked")
    return _pool_before_relu(ops)


def _max_pool(h: Tensor, op: ConvOp) -> Tensor:
    """`F.max_pool2d`, with a fast exact path for 2×2 windows of stride 2 without gradients.

    Evaluation (IFCA's K-model losses, CAM's offsets, test metrics) spent more than half its
    time in `max_pool2d` on CPU; the maximum of the four strided quarter-views is the same
    value (NaN propagates alike) and 2–4× faster, in channels-last layout as a reshape.
    Training keeps `max_pool2d`, whose gradient picks one element on ties (after ReLU, zeros
    tie often), where `torch.maximum` would split it.
    """
    two = (2, 2)
    fast = (
        not torch.is_grad_enabled() and op.kernel == two and op.stride == two
        and op.padding == (0, 0) and op.dilation == (1, 1) and not op.ceil_mode
        and h.dim() == 4 and h.shape[-1] % 2 == 0 and h.shape[-2] % 2 == 0
    )
    if not fast:
        return F.max_pool2d(h, op.kernel, op.stride, op.padding, op.dilation, op.ceil_mode)
    b, c, rows, cols = h.shape
    if h.is_contiguous(memory_format=torch.channels_last):
        v = h.permute(0, 2, 3, 1).reshape(b, rows // 2, 2, cols // 2, 2, c)
        m = torch.maximum(v[:, :, 0], v[:, :, 1])
        return torch.maximum(m[:, :, :, 0], m[:, :, :, 1]).permute(0, 3, 1, 2)
    if h.is_contiguous():
        v = h.view(b, c, rows // 2, 2, cols // 2, 2)
        m = torch.maximum(v[:, :, :, 0], v[:, :, :, 1])
        return torch.maximum(m[..., 0], m[..., 1])
    return torch.maximum(torch.maximum(h[..., ::2, ::2], h[..., 1::2, ::2]),
                         torch.maximum(h[..., ::2, 1::2], h[..., 1::2, 1::2]))


def _pool_before_relu(ops: list[ConvOp]) -> list[ConvOp]:
    """ReLU then max-pool equals max-pool then ReLU (max commutes with a monotone map), with
    the same gradient; pooling first makes the ReLU four times cheaper."""
    out = list(ops)
    for j in range(len(out) - 1):
        if out[j].kind == "relu" and out[j + 1].kind == "maxpool":
            out[j], out[j + 1] = out[j + 1], out[j]
    return out


def _head(classifier: nn.Sequential, layout: ParamLayout, prefix: str) -> list:
    linears, relu, drop = [], [], []
    for j, m in enumerate(classifier):
        if isinstance(m, nn.Linear):
            linears.append((f"{prefix}.{j}", m))
            relu.append(False)
            drop.append(0.0)
        elif isinstance(m, nn.ReLU) and linears and not relu[-1]:
            relu[-1] = True
        elif isinstance(m, nn.Dropout) and linears and relu[-1] and drop[-1] == 0.0:
            drop[-1] = float(m.p)
        else:
            raise TypeError(f"classifier layer {type(m).__name__} is not stacked")
    return dense_layers(layout, linears, relu, drop)


#: the ways of computing the stacked convolutions (see the module docstring)
CONVS = ("auto", "grouped", "im2col")


def _conv_im2col(h: Tensor, weight: Tensor, bias: Tensor | None, op: ConvOp, a: int) -> Tensor:
    """The stacked convolution of `h` (`[B, a·C, H, W]`) with the `a` clients' kernels
    (`weight` `[a, O, C, kh, kw]`, `bias` `[a, O]`) as one batched product over the unfolded
    patches; returns `[B, a·O, H', W']` like the grouped `conv2d`."""
    b, _, rows, cols = h.shape
    o, c, kh, kw = weight.shape[1:]
    k = c * kh * kw
    low = low_precision(h)
    if low is not None:  # unfold the low-precision values: autocast would copy the patches
        h = h.to(low)
    patches = F.unfold(h, (kh, kw), op.dilation, op.padding, op.stride)  # [B, a·k, L]
    out = torch.matmul(weight.reshape(a, o, k), patches.view(b, a, k, -1))  # [B, a, O, L]
    if bias is not None:  # in the products' dtype, as the grouped conv2d adds it
        out = out + bias.reshape(a, o, 1).to(out.dtype)
    (sr, sc), (pr, pc), (dr, dc) = op.stride, op.padding, op.dilation
    rows = (rows + 2 * pr - dr * (kh - 1) - 1) // sr + 1
    cols = (cols + 2 * pc - dc * (kw - 1) - 1) // sc + 1
    return out.view(b, a * o, rows, cols)


class CNNKernel(StackedKernel):
    """Stacked-convolution features plus a fused dense head, for `LeNet` and `LeafCNN`.

    `conv`: "grouped", "im2col" or "auto" (im2col on CUDA outside bfloat16 autocast; see the
    module docstring).
    """

    name = "cnn"
    max_samples = 4096
    channels_last = True

    def __init__(self, module: nn.Module, layout: ParamLayout, conv: str = "auto") -> None:
        super().__init__(module, layout)
        if not isinstance(module, LeNet | LeafCNN):
            raise TypeError(f"CNNKernel does not handle {type(module).__name__}")
        if conv not in CONVS:
            raise ValueError(f"unknown conv {conv!r}; allowed: {', '.join(CONVS)}")
        self.conv = conv
        self.ops = _feature_ops(module.features, layout, "features")
        self.dense = DenseStack(_head(module.classifier, layout, "classifier"), self.ws)
        self.conv_params = sorted(
            {i for op in self.ops for i in (op.weight, op.bias) if i is not None}
        )

    def im2col(self, device: torch.device) -> bool:
        """Whether the convolutions on `device` are unfolded products (else grouped): "auto"
        unfolds on CUDA in float32 and TF32, not under bfloat16 autocast, where cuDNN's
        grouped convolution is the faster (measured, module docstring)."""
        if self.conv != "auto":
            return self.conv == "im2col"
        return device.type == "cuda" and not torch.is_autocast_enabled(device.type)

    def workspace_floats(self, module: nn.Module, inputs: Tensor, output: Tensor) -> int:
        """Floats per sample beyond the layers' outputs: under im2col, a convolution's
        unfolded patches and their gradient (`C·kh·kw` per output position, twice)."""
        if not isinstance(module, nn.Conv2d) or not self.im2col(inputs.device):
            return 0
        kh, kw = module.kernel_size
        return 2 * inputs.shape[1] * kh * kw * output.shape[-2] * output.shape[-1]

    def gather(self, x_all: Tensor, idx: Tensor) -> Tensor:
        """Samples laid out for stacked convolution: `[B, a·C, H, W]` (sample-major)."""
        a, b = idx.shape
        c, h, w = x_all.shape[1:]
        out = self.ws.get("gather", (b * a, c, h, w), x_all.dtype, x_all.device)
        torch.index_select(x_all, 0, idx.t().reshape(-1), out=out)
        x = out.view(b, a * c, h, w)
        if self.channels_last and not self.im2col(x.device):
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _features(self, params: list[Tensor], x: Tensor, a: int) -> Tensor:
        """Stacked feature extractor: `[B, a·C, H, W]` → `[a, B, F]`."""
        h = x
        unfold = self.im2col(x.device)
        for op in self.ops:
            if op.kind == "conv":
                assert op.weight is not None
                wt = params[op.weight]
                bias = None if op.bias is None else params[op.bias]
                if unfold:
                    h = _conv_im2col(h, wt, bias, op, a)
                    continue
                wt = wt.reshape(a * wt.shape[1], *wt.shape[2:])
                bias = None if bias is None else bias.reshape(-1)
                h = F.conv2d(h, wt, bias, op.stride, op.padding, op.dilation, groups=a)
            elif op.kind == "gn":
                assert op.weight is not None and op.bias is not None
                h = F.group_norm(h, a * op.groups, params[op.weight].reshape(-1),
                                 params[op.bias].reshape(-1), op.eps)
            elif op.kind == "relu":
                h = torch.relu(h)
            else:
                h = _max_pool(h, op)
        b = h.shape[0]
        return h.reshape(b, a, -1).transpose(0, 1).contiguous()

    def train_step(self, params: list[Tensor], batch: StepBatch, sink: Sink) -> Tensor:
        x, y, w, offset, task = batch.x, batch.y, batch.w, batch.offset, batch.task
        a = y.shape[0]
        leaves = {i: params[i].detach().requires_grad_() for i in self.conv_params}
        local = [leaves.get(i, p) for i, p in enumerate(params)]
        with torch.enable_grad():
            feats = self._features(local, x, a)
        out, cache = self.dense.forward(params, feats.detach(), True, batch.generator)
        if offset is not None:
            out = out + offset
        loss, dout = loss_and_grad(out, y, w, task)
        assert dout is not None
        dfeats = self.dense.backward(params, cache, dout, sink, need_input_grad=True)
        grads = torch.autograd.grad(feats, [leaves[i] for i in self.conv_params], dfeats)
        for i, g in zip(self.conv_params, grads):
            sink.grad(i, g)
        return loss

    def forward_one(self, params: list[Tensor], x: Tensor) -> Tensor:
        """Outputs `[B, O]` of one model (unstacked parameters) on plain rows `[B, C, H, W]`."""
        stacked = [p.unsqueeze(0) for p in params]
        if self.channels_last and not self.im2col(x.device):
            x = x.contiguous(memory_format=torch.channels_last)
        return self.forward(stacked, x)[0]

    def forward(self, params: list[Tensor], x: Tensor) -> Tensor:
        a = params[0].shape[0]
        out, _ = self.dense.forward(params, self._features(params, x, a), False, None)
        return out
