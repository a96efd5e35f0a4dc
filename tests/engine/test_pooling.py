"""The engine's fast evaluation pooling equals `max_pool2d` exactly, and evaluation with it
matches the reference module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clusterfl.engine.stacked_cnn import ConvOp, _max_pool


@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
def test_fast_pool_equals_max_pool2d_with_ties_and_nan(layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.relu(torch.randn(5, 7, 12, 10, generator=g))  # many tied zeros
    h[0, 0, 0, 0] = float("nan")
    h[1, 2, 3, 3] = float("inf")
    if layout == "channels_last":
        h = h.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        h = h[:, ::2]
    op = ConvOp("maxpool", kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1))
    with torch.no_grad():
        fast = _max_pool(h, op)
    ref = F.max_pool2d(h, 2, 2)
    assert fast.shape == ref.shape
    assert torch.equal(torch.nan_to_num(fast, nan=-7.0), torch.nan_to_num(ref, nan=-7.0))
    assert torch.isnan(fast).sum() == torch.isnan(ref).sum()


def test_pooling_with_gradients_keeps_max_pool2d() -> None:
    # with gradients the tie-break of max_pool2d (one element gets it) must be kept
    h = torch.zeros(1, 1, 2, 2, requires_grad=True)
    op = ConvOp("maxpool", kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1))
    _max_pool(h, op).sum().backward()
    assert h.grad is not None and sorted(h.grad.flatten().tolist()) == [0.0, 0.0, 0.0, 1.0]


def test_odd_sizes_and_other_windows_fall_back() -> None:
    h = torch.randn(2, 3, 7, 9)
    op = ConvOp("maxpool", kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1))
    with torch.no_grad():
        assert torch.equal(_max_pool(h, op), F.max_pool2d(h, 2, 2))
        op3 = ConvOp("maxpool", kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1))
        assert torch.equal(_max_pool(h, op3), F.max_pool2d(h, 3, 2, 1))
