import numpy as np
import torch
from sklearn.metrics import f1_score

from clusterfl.engine.common import macro_f1
from clusterfl.engine.schedule import batch_schedule, gradient_batches


def test_epoch_schedule_visits_every_sample_once_per_epoch():
    sizes, clients = np.array([10, 3, 7]), np.array([4, 9, 2])
    s = batch_schedule(sizes, clients, batch_size=4, epochs=2, steps=0, seed=1)
    assert s.shape == (3, 2 * 3, 4)  # the largest client needs ceil(10/4)=3 batches per epoch
    for i, n in enumerate(sizes):
        per_epoch = -(-n // 4)
        for e in range(2):
            chunk = s[i, e * per_epoch : (e + 1) * per_epoch].ravel()
            assert sorted(chunk[chunk >= 0].tolist()) == list(range(n))
        assert (s[i, 2 * per_epoch :] == -1).all()  # masked extra steps


def test_step_schedule_and_determinism():
    sizes, clients = np.array([5, 50]), np.array([0, 1])
    s = batch_schedule(sizes, clients, batch_size=8, epochs=1, steps=3, seed=7)
    assert s.shape == (2, 3, 8)
    assert (s[0, :, :5] >= 0).all() and (s[0, :, 5:] == -1).all()  # small client: min(b, n)
    assert sorted(s[0, 0, :5].tolist()) == list(range(5))
    assert (s[1] >= 0).all() and len(set(s[1].ravel().tolist())) == 24  # no repeats in 1st pass
    assert np.array_equal(s, batch_schedule(sizes, clients, 8, 1, 3, seed=7))
    assert not np.array_equal(s, batch_schedule(sizes, clients, 8, 1, 3, seed=8))


def test_gradient_batches():
    g = gradient_batches(np.array([3, 100]), np.array([0, 1]), 64, seed=0)
    assert g.shape == (2, 64)
    assert sorted(g[0, :3].tolist()) == [0, 1, 2] and (g[0, 3:] == -1).all()
    assert len(set(g[1].tolist())) == 64
    full = gradient_batches(np.array([3, 5]), np.array([0, 1]), None, seed=0)
    assert full[1].tolist() == [0, 1, 2, 3, 4] and full[0].tolist() == [0, 1, 2, -1, -1]


def test_macro_f1_matches_sklearn():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 6, size=50)
        p = np.where(rng.random(50) < 0.6, y, rng.integers(0, 10, size=50))
        ours = macro_f1(torch.tensor(p), torch.tensor(y), 10)
        assert abs(ours - f1_score(y, p, average="macro")) < 1e-12
