"""Rotations and label maps (clusterfl.data.transforms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.data.transforms import (
    _resample_rotated,
    apply_label_map,
    apply_label_maps,
    distinct_permutations,
    is_permutation,
    rotate,
    rotate_each,
    shift_map,
    swap_pairs,
)


def _dot(h: int = 3, w: int = 3, r: int = 0, c: int = 1) -> torch.Tensor:
    img = torch.zeros(1, 1, h, w)
    img[0, 0, r, c] = 1.0
    return img


def test_rotate_90_is_counter_clockwise_and_exact() -> None:
    out = rotate(_dot(), 90)  # top-middle pixel goes to middle-left
    expected = _dot(r=1, c=0)
    assert torch.equal(out, expected)
    assert torch.equal(rotate(_dot(), -90), _dot(r=1, c=2))
    assert torch.equal(rotate(_dot(), 180), _dot(r=2, c=1))
    assert torch.equal(rotate(_dot(), 360), _dot())


def test_bilinear_path_agrees_with_rot90() -> None:
    x = torch.rand(5, 2, 9, 9)
    for angle, k in ((90, 1), (180, 2), (270, 3)):
        approx = _resample_rotated(x, np.full(5, float(angle)))
        torch.testing.assert_close(approx, torch.rot90(x, k, dims=(-2, -1)), atol=1e-5, rtol=0)


def test_bilinear_rotation_zero_fill_and_centre() -> None:
    x = torch.ones(1, 1, 9, 9)
    out = rotate(x, 45)
    assert out[0, 0, 0, 0] == 0  # corners come from outside the image
    assert out[0, 0, 4, 4] == pytest.approx(1.0)  # the centre stays
    assert out.shape == x.shape and out.dtype == x.dtype


def test_rotate_each_matches_per_angle_rotation() -> None:
    x = torch.rand(6, 1, 7, 7)
    angles = [0, 15, 90, 105, 180, 275]
    out = rotate_each(x, angles)
    for i, a in enumerate(angles):
        torch.testing.assert_close(out[i:i + 1], rotate(x[i:i + 1], a))
    assert torch.equal(out[0], x[0])
    assert torch.equal(out[2], torch.rot90(x[2], 1, dims=(-2, -1)))
    with pytest.raises(ValueError):
        rotate_each(x, [0, 90])


def test_label_maps() -> None:
    m = swap_pairs([(1, 7), (3, 5)], 10)
    assert m.tolist() == [0, 7, 2, 5, 4, 3, 6, 1, 8, 9]
    assert is_permutation(m)
    assert shift_map(10, 5).tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    y = torch.tensor([1, 7, 2])
    assert apply_label_map(y, m).tolist() == [7, 1, 2]
    maps = np.stack([np.arange(10), shift_map(10, 5)])
    assert apply_label_maps(y, maps, np.array([0, 1, 1])).tolist() == [1, 2, 7]
    with pytest.raises(ValueError):
        swap_pairs([(1, 1)], 10)
    with pytest.raises(ValueError):
        swap_pairs([(1, 2), (2, 3)], 10)


def test_distinct_permutations() -> None:
    perms = distinct_permutations(6, 3, np.random.default_rng(0))  # all 3! of them
    assert len({p.tobytes() for p in perms}) == 6
    assert all(is_permutation(p) for p in perms)
    with pytest.raises(ValueError):
        distinct_permutations(7, 3, np.random.default_rng(0))
