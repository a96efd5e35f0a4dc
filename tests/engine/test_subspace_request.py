"""PACFL's client-side data subspace (`SubspaceRequest`): the basis against numpy's SVD, per
label, rank deficiency, what travels (cost, Flower codec), both backends and validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.backends.flower import codec
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.engine.subspace import client_subspace, leading_left_singular_vectors
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import SubspaceReply, SubspaceRequest, empty_reply, join, subset
from clusterfl.robust.config import ValidationConfig
from clusterfl.robust.validate import check_reply

SIZES = [30, 7, 2, 45]  # client 2 has fewer samples than p


def federation(seed: int = 0) -> Federation:
    """4 clients of 3×4×4 random inputs (e = 48) with labels 0..4 (client 1: one label)."""
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    x = torch.from_numpy(rng.standard_normal((n, 3, 4, 4)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 5, n))
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    y[offsets[1] : offsets[2]] = 3
    return Federation(x, y, offsets, x.clone(), y.clone(), offsets.copy(),
                      np.array([0, 0, 1, 1]), 5, name="synthetic/subspace")


def projector(u: np.ndarray) -> np.ndarray:
    return u @ u.T


def numpy_top(d: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    u, s, _ = np.linalg.svd(d, full_matrices=False)
    return u[:, :p], s


@pytest.mark.parametrize("shape", [(48, 200), (48, 10), (5, 5)])
def test_basis_spans_numpys_top_p_singular_subspace(shape):
    rng = np.random.default_rng(1)
    # distinct singular values, so the top-p subspace is unique
    d = rng.standard_normal(shape) @ np.diag(np.linspace(3, 1, shape[1]))
    for p in (1, 3, 5):
        u = leading_left_singular_vectors(d, p)
        ref, s = numpy_top(d, p)
        assert u.shape == (shape[0], min(p, *shape))
        np.testing.assert_allclose(u.T @ u, np.eye(u.shape[1]), atol=1e-10)
        np.testing.assert_allclose(projector(u), projector(ref), atol=1e-8)
        # Eckart–Young: the residual energy is the sum of the discarded σ²
        resid = d - u @ (u.T @ d)
        np.testing.assert_allclose((resid**2).sum(), (s[u.shape[1]:] ** 2).sum(), rtol=1e-8,
                                   atol=1e-20)
        assert np.all(u.sum(axis=0) >= 0)  # the sign convention


def test_rank_deficient_data_gives_fewer_columns():
    rng = np.random.default_rng(2)
    low = rng.standard_normal((20, 2)) @ rng.standard_normal((2, 30))  # rank 2
    assert leading_left_singular_vectors(low, 5).shape == (20, 2)
    assert leading_left_singular_vectors(np.zeros((20, 4)), 3).shape == (20, 0)
    one = rng.standard_normal((20, 1))
    u = leading_left_singular_vectors(np.repeat(one, 6, axis=1), 3)  # one sample, repeated
    np.testing.assert_allclose(projector(u), projector(one / np.linalg.norm(one)), atol=1e-12)


def test_client_basis_whole_and_per_label_against_numpy():
    fed = federation()
    x, y = fed.client_train(0)
    flat = x.reshape(len(x), -1).double().numpy()
    whole = SubspaceRequest(np.array([0]), 48, p=3)
    basis, rank = client_subspace(x, y, whole)
    assert basis.shape == (48, 3) and rank == 3
    np.testing.assert_allclose(projector(basis), projector(numpy_top(flat.T, 3)[0]), atol=1e-8)
    same, _ = client_subspace(x, torch.zeros_like(y), whole)  # labels are not read
    np.testing.assert_array_equal(basis, same)

    per = SubspaceRequest(np.array([0]), 48, p=2, per_label=True, n_labels=5)
    basis, rank = client_subspace(x, y, per)
    held = np.unique(y.numpy())
    assert basis.shape == (48, 10) and rank == 2 * len(held)
    for j, c in enumerate(held):  # label by label, in increasing order
        block = basis[:, 2 * j : 2 * j + 2]
        ref = numpy_top(flat[y.numpy() == c].T, 2)[0]
        np.testing.assert_allclose(projector(block), projector(ref), atol=1e-8)
    assert not basis[:, rank:].any()  # zero padding


def test_request_cost_counts_the_fixed_width():
    assert SubspaceRequest(np.arange(4), 784, p=3).cost() == (0.0, 4 * 3 * 784.0)
    per = SubspaceRequest(np.arange(4), 784, p=3, per_label=True, n_labels=10)
    assert per.unit_cost() == (0.0, 30 * 784.0) and per.columns() == 30


def test_backends_agree_and_rank_follows_the_data():
    fed = federation()
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), fed.input_shape, 5)
    for req in (SubspaceRequest(np.array([3, 0, 2]), 48, p=3),
                SubspaceRequest(np.array([1, 2]), 48, p=4, per_label=True, n_labels=5)):
        seq = SequentialBackend(fed, fac).execute(req)
        sim = SimulationBackend(fed, fac).execute(req)
        assert isinstance(seq, SubspaceReply)
        np.testing.assert_array_equal(seq.clients, req.clients)
        np.testing.assert_array_equal(seq.bases, sim.bases)
        np.testing.assert_array_equal(seq.ranks, sim.ranks)
        assert seq.bases.shape == (len(req.clients), 48, req.columns())
        np.testing.assert_array_equal(seq.n_samples, fed.train_sizes[req.clients])
    whole = SequentialBackend(fed, fac).execute(SubspaceRequest(np.arange(4), 48, p=3))
    assert whole.ranks.tolist() == [3, 3, 2, 3]  # client 2 holds 2 samples
    per = SequentialBackend(fed, fac).execute(
        SubspaceRequest(np.array([1]), 48, p=4, per_label=True, n_labels=5))
    assert per.ranks.tolist() == [4]  # one label held (7 samples): 4 columns, 16 zero ones
    assert per.basis(0).shape == (48, 4)


def test_codec_round_trip_subset_join_and_empty_reply():
    fed = federation()
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), fed.input_shape, 5)
    req = SubspaceRequest(np.arange(4), 48, p=2, per_label=True, n_labels=5)
    back = codec.decode(*codec.encode(req))
    assert back == SubspaceRequest(back.clients, 48, p=2, per_label=True, n_labels=5)
    np.testing.assert_array_equal(back.clients, req.clients)
    rec, _ = codec.from_recorddict(codec.to_recorddict(req))
    assert rec.per_label and rec.columns() == 10
    reply = SequentialBackend(fed, fac).execute(req)
    again = codec.decode(*codec.encode(reply))
    for name in ("clients", "bases", "ranks", "n_samples"):
        a, b = getattr(again, name), getattr(reply, name)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    # one message per client (a Flower node each), joined: the whole reply
    parts = [SequentialBackend(fed, fac).execute(subset(req, [i])) for i in (2, 0, 3, 1)]
    joined = join(parts, order=req.clients)
    np.testing.assert_array_equal(joined.bases, reply.bases)
    empty = empty_reply(req)
    assert isinstance(empty, SubspaceReply) and empty.bases.shape == (0, 48, 10)


def test_validation_rejects_non_finite_and_bad_ranks():
    fed = federation()
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), fed.input_shape, 5)
    req = SubspaceRequest(np.arange(4), 48, p=2)
    reply = SequentialBackend(fed, fac).execute(req)
    bases, ranks = reply.bases.copy(), reply.ranks.copy()
    bases[1, 0, 0] = np.nan
    ranks[3] = 7
    keep, rejected = check_reply(req, SubspaceReply(reply.clients, bases, ranks,
                                                    reply.n_samples), ValidationConfig())
    assert keep.tolist() == [True, False, True, False]
    assert [(r.client, r.reason) for r in rejected] == [(1, "non_finite"), (3, "shape")]


def test_per_label_needs_labels():
    x = torch.zeros(4, 1, 2, 2)
    with pytest.raises(ValueError, match="class labels"):
        client_subspace(x, torch.zeros(4), SubspaceRequest(np.array([0]), 4, per_label=True,
                                                           n_labels=2))
    with pytest.raises(ValueError, match="inputs of 5 values"):
        client_subspace(x, None, SubspaceRequest(np.array([0]), 5))
