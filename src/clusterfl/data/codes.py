"""8-bit inputs kept as the uint8 codes they were read from, decoded bit for bit.

Images read from bytes (MNIST, Fashion-MNIST, CIFAR) are `code / 255` in float32, each value
correctly rounded. Keeping the codes (one byte a value instead of four) and dividing again
when a batch is read gives back the same bits: the division is correctly rounded on every
device (the divisor is a tensor, not a Python number: CUDA turns a division by a Python number
into a product with its reciprocal, which differs in the last bit for some codes). A federation
stores its inputs this way whenever that is exact (`Federation.x_scale`); the vectorized engine
decodes each gathered batch (`engine.vectorized.SplitData`).
"""

from __future__ import annotations

import torch

#: the scale of 8-bit images: value = code / 255
BYTE_SCALE = 255.0
#: values checked at a time by `compact_inputs`
PIECE = 1 << 22


def decode_codes(codes: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """`codes / scale` in `dtype`, correctly rounded on every device (see the module doc)."""
    return codes.to(dtype) / torch.full((), scale, dtype=dtype, device=codes.device)


def compact_inputs(x: torch.Tensor, dtype: torch.dtype,
                   scale: float = BYTE_SCALE) -> torch.Tensor | None:
    """`x` as uint8 codes when every value is exactly `code / scale` in `dtype` (so decoding
    gives back the same bits); None otherwise (the inputs are kept as they are). Checked in
    pieces of `PIECE` values, so the check never holds more than a few float copies of one
    piece besides `x` and the codes."""
    if not x.is_floating_point() or x.numel() == 0:
        return None
    flat = x.reshape(-1)
    packed = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    for start in range(0, len(flat), PIECE):
        part = flat[start : start + PIECE].to(dtype)
        codes = torch.round(part * scale)
        if bool(((codes < 0) | (codes > 255)).any()):
            return None
        out = packed[start : start + PIECE]
        out.copy_(codes)
        if not torch.equal(decode_codes(out, dtype, scale), part):
            return None
    return packed.view(x.shape)


__all__ = ["BYTE_SCALE", "compact_inputs", "decode_codes"]
