"""Transforms that define clusters: image rotations and label maps.

Rotations are counter-clockwise for positive angles (as an image is displayed, row 0 at the
top), about the image centre. Multiples of 90° use `torch.rot90` and are exact; other angles use
`affine_grid` + `grid_sample` (bilinear, zero fill outside the original image).

A label map is an int64 array `m` of length `n_classes` that is a permutation: label `y`
becomes `m[y]`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

GRID_CHUNK = 8192  # images per grid_sample call (bounds the memory of the sampling grid)


def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate a batch `[N, C, H, W]` by one angle (degrees, counter-clockwise)."""
    return rotate_each(images, np.full(len(images), float(degrees)))


def rotate_each(images: torch.Tensor, degrees: Sequence[float] | np.ndarray) -> torch.Tensor:
    """Rotate image i of `[N, C, H, W]` by `degrees[i]`; returns a new tensor.

    Exact `rot90` for multiples of 90°, one batched bilinear resampling for the others.
    """
    angles = np.asarray(degrees, dtype=np.float64).reshape(-1)
    if len(angles) != len(images):
        raise ValueError(f"{len(angles)} angles for {len(images)} images")
    out = torch.empty_like(images)
    right = np.mod(angles, 90.0) == 0.0
    quarter_turns = np.mod(np.round(angles / 90.0), 4).astype(np.int64)
    for k in range(4):
        rows = torch.from_numpy(np.flatnonzero(right & (quarter_turns == k)))
        if len(rows):
            out.index_copy_(0, rows, torch.rot90(images[rows], k, dims=(-2, -1)).contiguous())
    other = np.flatnonzero(~right)
    for start in range(0, len(other), GRID_CHUNK):
        rows_np = other[start:start + GRID_CHUNK]
        rows = torch.from_numpy(rows_np)
        out.index_copy_(0, rows, _resample_rotated(images[rows], angles[rows_np]).contiguous())
    return out


def _rotation_thetas(degrees: np.ndarray, height: int, width: int) -> torch.Tensor:
    """`affine_grid` matrices `[N, 2, 3]`: output pixel → input position for each angle.

    In pixel units with y pointing down, a counter-clockwise turn by θ maps an output point p to
    the input point [[cos θ, -sin θ], [sin θ, cos θ]] p. `affine_grid` works in coordinates
    normalised to [-1, 1] per axis, hence the rescaling for non-square images.
    """
    rad = np.deg2rad(degrees)
    cos, sin = np.cos(rad), np.sin(rad)
    theta = np.zeros((len(degrees), 2, 3))
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * height / width
    theta[:, 1, 0] = sin * width / height
    theta[:, 1, 1] = cos
    return torch.from_numpy(theta)


def _resample_rotated(images: torch.Tensor, degrees: np.ndarray) -> torch.Tensor:
    n, _, h, w = images.shape
    theta = _rotation_thetas(degrees, h, w).to(images.dtype)
    grid = F.affine_grid(theta, [n, images.shape[1], h, w], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False)


# ---------------------------------------------------------------------- label maps


def identity_map(n_classes: int) -> np.ndarray:
    """The label map that changes nothing."""
    return np.arange(n_classes, dtype=np.int64)


def swap_pairs(pairs: Sequence[Sequence[int]], n_classes: int) -> np.ndarray:
    """Label map exchanging each pair `(a, b)`: a → b and b → a (CFL's label swap, §V-A)."""
    mapping = identity_map(n_classes)
    used: set[int] = set()
    for pair in pairs:
        a, b = (int(v) for v in pair)
        if not (0 <= a < n_classes and 0 <= b < n_classes) or a == b:
            raise ValueError(f"invalid swap pair ({a}, {b}) for {n_classes} classes")
        if a in used or b in used:
            raise ValueError(f"label swap pairs overlap at ({a}, {b})")
        used.update((a, b))
        mapping[a], mapping[b] = b, a
    return mapping


def shift_map(n_classes: int, shift: int) -> np.ndarray:
    """Label map y → (y + shift) mod n_classes (CFL-GP F.7 uses shift 5 of 10)."""
    return (np.arange(n_classes, dtype=np.int64) + shift) % n_classes


def random_permutation(n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random label map."""
    return rng.permutation(n_classes).astype(np.int64)


def distinct_permutations(
    count: int, n_classes: int, rng: np.random.Generator
) -> np.ndarray:
    """`count` pairwise different random label maps `[count, n_classes]`."""
    if count > math.factorial(min(n_classes, 20)):
        raise ValueError(f"only {math.factorial(n_classes)} permutations of {n_classes} labels")
    maps: list[np.ndarray] = []
    seen: set[bytes] = set()
    while len(maps) < count:
        perm = random_permutation(n_classes, rng)
        if perm.tobytes() not in seen:
            seen.add(perm.tobytes())
            maps.append(perm)
    return np.stack(maps) if maps else np.zeros((0, n_classes), dtype=np.int64)


def is_permutation(mapping: np.ndarray) -> bool:
    """True when `mapping` is a permutation of `0..len-1`."""
    m = np.asarray(mapping)
    return m.ndim == 1 and np.array_equal(np.sort(m), np.arange(len(m)))


def apply_label_map(labels: torch.Tensor, mapping: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Labels `y` → `mapping[y]`."""
    table = torch.as_tensor(np.asarray(mapping), dtype=torch.int64)
    return table[labels]


def apply_label_maps(labels: torch.Tensor, maps: np.ndarray, which: np.ndarray) -> torch.Tensor:
    """Labels `y[i]` → `maps[which[i], y[i]]` for a table of maps `[n_maps, n_classes]`."""
    table = torch.as_tensor(np.asarray(maps), dtype=torch.int64)
    return table[torch.as_tensor(np.asarray(which), dtype=torch.int64), labels]
