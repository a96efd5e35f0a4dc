"""Client-level DP: clipping, the noise on each aggregate, ε from dp-accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clusterfl.algorithms.ifca import IFCA, IFCAConfig
from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.protocol import TrainReply, TrainRequest
from clusterfl.robust.config import PrivacyConfig
from clusterfl.robust.guard import Guard
from clusterfl.robust.privacy import clip_rows, epsilon, noise_rows

from .conftest import TRAIN, Tamper, config, factory_for, make_context
from .test_faults import _fedavg_round


def test_clip_rows():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out, norms = clip_rows(x, 1.0)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
    np.testing.assert_allclose(norms, [5.0, 0.5, 0.0])


def test_aggregate_noise_puts_sigma_s_on_every_group_sum():
    groups = np.array([0, 0, 0, 0, 1, 2, 2])
    g = torch.Generator().manual_seed(1)
    z = noise_rows((7, 40000), groups, sigma=2.0, clip=0.5, mode="aggregate", generator=g,
                   dtype=torch.float64)
    for k in (0, 1, 2):
        s = z[torch.from_numpy(groups == k)].sum(0)
        assert s.std().item() == pytest.approx(1.0, rel=0.02)  # σ·S
    local = noise_rows((7, 40000), groups, 2.0, 0.5, "local", g, torch.float64)
    assert local.std(dim=1).numpy() == pytest.approx(np.ones(7), rel=0.02)


def test_epsilon_against_closed_forms():
    """Unsampled Gaussian, T releases: RDP(α) = Tα/(2σ²). dp-accounting's conversion is
    tighter than the classical ε = min_α RDP(α) + log(1/δ)/(α−1); the PLD accountant, tighter
    still, is a lower bound."""
    import dp_accounting
    from dp_accounting import pld

    sigma, t, delta = 1.5, 20, 1e-5
    eps = epsilon(sigma, 1.0, t, delta)
    classical = min(t * a / (2 * sigma**2) + math.log(1 / delta) / (a - 1)
                    for a in np.linspace(1.01, 200, 20000))
    acc = pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma), t)
    assert acc.get_epsilon(delta) <= eps <= classical
    assert eps > 0.9 * classical  # same order: not a different mechanism
    assert epsilon(sigma, 0.1, t, delta) < eps < epsilon(sigma, 1.0, 2 * t, delta)
    assert epsilon(2 * sigma, 1.0, t, delta) < eps
    assert epsilon(0.0, 1.0, t, delta) == math.inf and epsilon(sigma, 1.0, 0, delta) == 0.0


def test_fedavg_under_clipping_is_the_mean_of_clipped_updates(digits):
    guard = Guard(8, 0, digits.train_sizes, privacy=PrivacyConfig(clip=0.05))
    _ctx, algo, start, seed, clean = _fedavg_round(digits, guard)
    ref = clean.execute(TrainRequest(np.arange(8), start, np.zeros(8, np.int64), TRAIN, seed))
    clipped, norms = clip_rows(ref.params - start[0], 0.05)
    assert (norms > 0.05).all()  # the bound binds here
    torch.testing.assert_close(algo.state.model[0], start[0] + clipped.mean(0))  # unweighted
    assert guard.end_round()["clipped"] == 8


def test_noise_is_calibrated_per_cluster_aggregate(digits):
    """IFCA: clients choosing model j form one aggregate; its sum carries N(0, σ²S²)."""
    f = factory_for(digits)
    from clusterfl.backends.simulation import SimulationBackend

    frozen = {}

    def no_training(request, reply):  # clients return their start model: update 0
        if isinstance(reply, TrainReply):
            frozen["groups"] = np.asarray(request.model_of_client)
            start = request.models[torch.as_tensor(request.model_of_client)]
            return TrainReply(reply.clients, start.clone(), reply.n_samples, reply.loss)
        return reply

    sigma, clip = 3.0, 0.01
    guard = Guard(8, 0, digits.train_sizes,
                  privacy=PrivacyConfig(clip=clip, noise_multiplier=sigma))
    ctx = make_context(digits, Tamper(SimulationBackend(digits, f), no_training), guard)
    algo = IFCA(IFCAConfig(n_clusters=2))
    algo.setup(ctx)
    before = algo.state.models.clone()
    guard.begin_round(1)
    algo.run_round(ctx, 1)
    sizes = np.bincount(frozen["groups"], minlength=2)
    for j in range(2):
        if sizes[j]:
            drift = (algo.state.models[j] - before[j]) * sizes[j]  # the sum's noise
            assert drift.std().item() == pytest.approx(sigma * clip, rel=0.05)
        else:
            assert torch.equal(algo.state.models[j], before[j])


def test_run_reports_epsilon_from_its_releases():
    cfg = config(rounds=4, eval_every=4, privacy={"clip": 1.0, "noise_multiplier": 1.2},
                 algorithm={"name": "fedavg", "fraction": 0.5})
    h = Experiment.from_config(cfg).run(progress=False)
    assert h.summary.robust is not None
    p = h.summary.robust["privacy"]
    assert p["releases"] == 4 and p["sampling_rate"] == pytest.approx(0.5)
    assert p["epsilon"] == pytest.approx(epsilon(1.2, 0.5, 4, 1e-5))


def test_a_release_that_asks_every_client_is_not_amplified_by_sampling():
    """FL+HC samples a quarter of the clients, but its clustering round asks every client:
    that release has no subsampling to amplify it. ε was composed as if every release were
    Poisson-sampled at 0.25 (4.88 where it is 6.43 for these 4 releases)."""
    import dp_accounting
    from dp_accounting import rdp

    from clusterfl.robust.privacy import DEFAULT_ORDERS

    cfg = config(rounds=4, eval_every=4, privacy={"clip": 1.0, "noise_multiplier": 1.0},
                 algorithm={"name": "flhc", "warmup_rounds": 2, "fraction": 0.25})
    h = Experiment.from_config(cfg).run(progress=False)
    assert [r.participants for r in h.records] == [2, 2, 8, 2]  # round 3 clusters everyone
    assert h.summary.robust is not None
    p = h.summary.robust["privacy"]
    assert p["releases"] == 4 and p["unsampled_releases"] == 1
    assert p["sampling_rate"] == pytest.approx(0.25)
    gaussian = dp_accounting.GaussianDpEvent(1.0)
    accountant = rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.25, gaussian), 3)
    accountant.compose(gaussian, 1)
    assert p["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5))
    assert p["epsilon"] > epsilon(1.0, 0.25, 4, 1e-5)


def test_privacy_config_needs_a_clip():
    with pytest.raises(ConfigError) as err:
        load_config({"privacy": {"noise_multiplier": 1.0}})
    assert err.value.field == "privacy" and "clip" in str(err.value)
