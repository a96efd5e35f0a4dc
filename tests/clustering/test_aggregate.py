"""CFL-GP's model step (`step_clusters`) with hand-computed values, and bit for bit against
the plain per-cluster gather it replaced."""

import numpy as np
import pytest
import torch

from clusterfl.clustering.aggregate import step_clusters
from clusterfl.engine.allocator import lazy_zeros

#: 5 clients, d = 3; client 3 did not answer; cluster 2 has no members
ROWS = torch.tensor([[1.0, 0.0, 2.0], [3.0, 3.0, 3.0], [5.0, 0.0, 4.0], [0.0, 6.0, 0.0],
                     [2.0, 2.0, 2.0]])
GROUPS = np.array([0, 1, 0, 1, 0])
PRESENT = np.array([True, True, True, False, True])
MODELS = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [9.0, 9.0, 9.0]])


@pytest.mark.parametrize(("how", "expected"), [
    # cluster 0: clients 0, 2, 4, mean [8/3, 2/3, 8/3]; cluster 1: client 1 only (3 absent)
    ("mean", [[1 - 0.5 * 8 / 3, 1 - 0.5 * 2 / 3, 1 - 0.5 * 8 / 3], [0.5, 0.5, 0.5],
              [9.0, 9.0, 9.0]]),
    ("sum", [[1 - 0.5 * 8, 1 - 0.5 * 2, 1 - 0.5 * 8], [0.5, 0.5, 0.5], [9.0, 9.0, 9.0]]),
])
def test_each_cluster_steps_by_its_members_that_answered(how, expected):
    kept = MODELS.clone()
    shapes = []

    def table(shape, dtype):
        shapes.append((shape, dtype))
        return lazy_zeros(shape, dtype)

    out = step_clusters(MODELS, ROWS, GROUPS, PRESENT, -0.5, how, table=table)
    torch.testing.assert_close(out, torch.tensor(expected))
    assert torch.equal(MODELS, kept)  # new models; the given ones are not modified
    assert shapes == [((3, 3), torch.float32)]  # one table, for the largest cluster (3 rows)


def test_shared_coordinates_step_by_every_client_that_answered():
    # coordinate 2 of clients 0, 1, 2, 4: 2, 3, 4, 2 (mean 11/4), from θ_1's value 1
    out = step_clusters(MODELS, ROWS, GROUPS, PRESENT, -0.5, "mean",
                        shared=torch.tensor([2]))
    torch.testing.assert_close(out[:, 2], torch.full((3,), 1 - 0.5 * 11 / 4))
    torch.testing.assert_close(out[:2, :2], torch.tensor([[1 - 0.5 * 8 / 3, 1 - 0.5 * 2 / 3],
                                                          [0.5, 0.5]]))
    torch.testing.assert_close(out[2, :2], torch.tensor([9.0, 9.0]))  # no members: kept


@pytest.mark.parametrize("how", ["mean", "sum"])
def test_the_same_bits_as_gathering_each_cluster_on_its_own(how):
    """The rows of every cluster go through one table; the values are those of the plain
    gather `rows[members]` (the step before), bit for bit, whatever table holds them."""
    rng = np.random.default_rng(3)
    rows = torch.from_numpy(rng.normal(size=(300, 37)).astype(np.float32))
    models = torch.from_numpy(rng.normal(size=(4, 37)).astype(np.float32))
    groups = rng.integers(0, 4, 300)
    present = rng.random(300) < 0.8
    shared = torch.tensor([0, 5, 36])
    expected = models.clone()
    base = expected[0, shared].clone()
    for k in range(4):
        sel = rows[torch.from_numpy(np.flatnonzero((groups == k) & present))]
        expected[k] += 0.1 * (sel.sum(0) if how == "sum" else sel.mean(0))
    sel = rows[torch.from_numpy(np.flatnonzero(present))][:, shared]
    expected[:, shared] = base + 0.1 * (sel.sum(0) if how == "sum" else sel.mean(0))
    for table in (None, lazy_zeros):
        out = step_clusters(models, rows, groups, present, 0.1, how, shared, table=table)
        assert torch.equal(out, expected)
