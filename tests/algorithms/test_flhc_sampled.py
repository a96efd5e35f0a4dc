"""FL+HC with a clustering round of a sample (`cluster_clients`, issue 41): the sample drawn
from the run's generator, the clusters of the sampled updates and the placement of the others
when they are first sampled afterwards, checked by hand with scripted updates; the true
clusters recovered on digits; a client that misses its placement; the same numbers as "all"
when the sample is everyone; config errors; the early refusal of "all" where it cannot fit;
resume. The default ("all") path: tests/algorithms/test_flhc.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score
from tests.algorithms.test_flhc import BASE, STEP, context
from tests.crash import crash_then_resume, timing_free

from clusterfl.algorithms import flhc
from clusterfl.algorithms.base import Ask
from clusterfl.algorithms.flhc import (
    FLHC,
    FLHCConfig,
    FLHCPlacedExtras,
    FLHCSampledClusteringExtras,
    clustering_round_bytes,
)
from clusterfl.config import load_config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _low(c: int) -> bool:
    return STEP[c] < 3.0  # STEP: 1.0, 1.2, 0.8 (clients 0, 1, 5) against 5.0, 5.3, 4.9


def test_clustering_a_sample_then_placing_the_others_by_hand():
    ctx = context(n_clients=6)
    n = ctx.train_sizes.astype(np.float64)
    algo = FLHC(FLHCConfig(warmup_rounds=0, fraction=1.0, cluster_clients=4, n_clusters=2))
    algo.setup(ctx)
    theta0 = algo.state.models[0].double()
    ones, d = torch.ones_like(theta0), theta0.numel()
    # the clustering round's first draw from the run's generator (seed 0): 4 of the 6
    sample = np.sort(np.random.default_rng(0).choice(6, size=4, replace=False))
    rest = np.setdiff1d(np.arange(6), sample)

    ex1 = algo.run_round(ctx, 1)
    assert isinstance(ex1, FLHCSampledClusteringExtras)
    assert sorted(ctx.participants) == sample.tolist()
    assert ctx.floats_down == 4 * d and ctx.floats_up == 4 * d
    # every 4 of the 6 hold both groups; numbered by first appearance in the sample
    first_low = _low(int(sample[0]))
    want = {int(c): 0 if _low(int(c)) == first_low else 1 for c in sample}
    labels = algo.assignment()
    assert [int(labels[c]) for c in sample] == [want[int(c)] for c in sample]
    assert labels[rest].tolist() == [-1, -1]
    assert (ex1.asked, ex1.unplaced, ex1.missing_updates, ex1.n_clusters_found) == (4, 2, 0, 2)
    steps = {k: [STEP[int(c)] for c in sample if want[int(c)] == k] for k in (0, 1)}
    for k in (0, 1):
        members = [int(c) for c in sample if want[int(c)] == k]
        w = n[members] / n[members].sum()
        torch.testing.assert_close(algo.state.models[k].double(), theta0 + float(
            (w * np.array(steps[k])).sum()) * ones, rtol=0, atol=1e-5)
        torch.testing.assert_close(algo.state.centroids[k], float(np.mean(steps[k])) * ones,
                                   rtol=0, atol=1e-5)
    pred = algo.predictor()  # the two not placed predict with θ⁰, an extra last row
    assert pred.models.shape[0] == 3
    assert pred.members[rest, 0].tolist() == [2, 2]
    torch.testing.assert_close(pred.models[2].double(), theta0, rtol=0, atol=0)

    before = algo.state.models.clone()
    ctx.participants.clear()
    ex2 = algo.run_round(ctx, 2)  # everyone sampled: the 2 placed first, then all 6 train
    assert isinstance(ex2, FLHCPlacedExtras) and (ex2.placed, ex2.unplaced) == (2, 0)
    means = {k: float(np.mean(steps[k])) for k in (0, 1)}
    for c in rest:  # an update STEP[c]·1 from θ⁰ joins the nearest mean update
        assert algo.assignment()[c] == min(means, key=lambda k: abs(STEP[int(c)] - means[k]))
    truth = np.array([0 if _low(c) else 1 for c in range(6)])
    assert adjusted_rand_score(truth, algo.assignment()) == 1.0
    assert ctx.floats_down == (4 + 2 + 6) * d and ctx.client_updates == 4 + 2 + 6
    labels = algo.assignment()
    for k in (0, 1):
        members = np.flatnonzero(labels == k)
        w = n[members] / n[members].sum()
        s = np.array([STEP[int(c)] for c in members])
        torch.testing.assert_close(algo.state.models[k].double(), before[k].double() + float(
            (w * s).sum()) * ones, rtol=0, atol=1e-5)
    assert algo.predictor().models.shape[0] == 2 and algo.state.round is None


def test_a_client_missing_its_placement_waits_and_does_not_train():
    ctx = context(n_clients=6)
    algo = FLHC(FLHCConfig(warmup_rounds=0, fraction=1.0, cluster_clients=4, n_clusters=2))
    algo.setup(ctx)
    algo.run_round(ctx, 1)
    rest = np.flatnonzero(algo.assignment() < 0)
    silent = int(rest[0])
    ctx.backend.silent = frozenset({silent})  # type: ignore[attr-defined]
    ctx.participants.clear()
    ex = algo.run_round(ctx, 2)
    assert isinstance(ex, FLHCPlacedExtras) and (ex.placed, ex.unplaced) == (1, 1)
    assert algo.assignment()[silent] == -1 and algo.assignment()[rest[1]] >= 0
    assert sorted(ctx.participants) == sorted(set(range(6)) - {silent})
    ctx.backend.silent = frozenset()  # type: ignore[attr-defined]
    ex = algo.run_round(ctx, 3)
    assert isinstance(ex, FLHCPlacedExtras) and (ex.placed, ex.unplaced) == (1, 0)
    mates = [c for c in range(6) if c != silent and _low(c) == _low(silent)]
    assert {int(algo.assignment()[c]) for c in mates} == {int(algo.assignment()[silent])}


def test_a_round_whose_only_client_misses_its_placement_trains_nobody():
    ctx = context(n_clients=6)
    algo = FLHC(FLHCConfig(warmup_rounds=0, per_round=1, cluster_clients=2, n_clusters=2))
    algo.setup(ctx)
    algo.run_round(ctx, 1)
    ctx.backend.silent = frozenset(range(6))  # type: ignore[attr-defined]
    asked: list[tuple[str, int]] = []
    real = algo.ask

    def spy(state, t, phase, ctx):
        step = real(state, t, phase, ctx)
        if isinstance(step, Ask):
            asked.append((step.phase, len(step.request.clients)))
        return step

    algo.ask = spy  # type: ignore[method-assign]
    for t in range(2, 8):
        models = algo.state.models.clone()
        ctx.participants.clear()
        ex = algo.run_round(ctx, t)
        assert isinstance(ex, FLHCPlacedExtras) and ex.placed == 0 and ex.unplaced == 4
        assert not ctx.participants and torch.equal(algo.state.models, models)
        assert algo.state.rounds_done == t and algo.state.round is None
    assert ("place", 1) in asked and ("train", 0) in asked  # an empty training message
    assert ctx.client_updates == 2


def test_a_sample_recovers_the_true_clusters_on_digits():
    """24 digits clients in 3 rotation groups, 12 sampled a round; the clustering round asks
    12 of them (a fresh draw), the others join a cluster when first sampled after it."""
    cfg = {**BASE, "rounds": 8,
           "scenario": {"name": "rotation", "n_clients": 24, "angles": [0, 90, 180]},
           "algorithm": {"name": "flhc", "warmup_rounds": 2, "per_round": 12,
                         "cluster_clients": 12, "metric": "cosine", "linkage": "average",
                         "n_clusters": 3}}  # as test_flhc.py's digits rotation case
    exp = Experiment.from_config(cfg)
    hist = exp.run(progress=False)
    clustering = FLHCSampledClusteringExtras.from_dict(hist.records[2].extras)
    assert hist.records[2].participants == 12
    assert (clustering.asked, clustering.unplaced, clustering.n_clusters_found) == (12, 12, 3)
    after = [FLHCPlacedExtras.from_dict(r.extras) for r in hist.records[3:]]
    assert after[0].placed > 0
    left = 12
    for ex in after:  # each round places some of those still waiting
        left -= ex.placed
        assert ex.unplaced == left
    truth = np.asarray(exp.federation.clusters)
    found = np.asarray(hist.records[-1].assignment)
    placed = found >= 0
    assert placed.sum() == 24 - left >= 20
    assert adjusted_rand_score(truth[placed], found[placed]) == 1.0
    acc = hist.series("accuracy")
    assert acc[-1] > acc[1] + 0.1


def test_a_sample_of_everyone_gives_the_numbers_of_all():
    """`cluster_clients = 1.0` asks every client without a draw: with every client answering,
    the same clusters, models and accuracies as "all" (only the extras' kind differs)."""
    cfg = {**BASE, "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
           "algorithm": {"name": "flhc", "warmup_rounds": 2, "fraction": 0.5}}
    ref = Experiment.from_config(cfg)
    a = ref.run(progress=False)
    sampled = Experiment.from_config({**cfg, "algorithm": {**cfg["algorithm"],
                                                           "cluster_clients": 1.0}})
    b = sampled.run(progress=False)
    for ra, rb in zip(a.records, b.records, strict=True):
        assert ra.assignment == rb.assignment and ra.client_accuracy == rb.client_accuracy
    assert torch.equal(ref.algorithm.state.models, sampled.algorithm.state.models)
    assert b.records[2].extras["unplaced"] == 0


@pytest.mark.parametrize("value", [1, 0, -3, 1.5, 0.0, 1000.0, "half", True, [2]])
def test_bad_cluster_clients_is_a_one_line_config_error(value):
    base = {**BASE, "scenario": {"name": "rotation", "n_clients": 4, "angles": [0, 180]}}
    with pytest.raises(ConfigError) as err:
        load_config({**base, "algorithm": {"name": "flhc", "cluster_clients": value}})
    assert err.value.field == "algorithm.cluster_clients"
    assert ("not true/false" if value is True else  # every number field says so
            '"all", a number of clients >= 2, or a fraction in (0, 1]') in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("value", "read"), [("all", "all"), ("ALL", "all"), (2, 2),
                                             (1000, 1000), (0.25, 0.25), (1.0, 1.0)])
def test_good_cluster_clients(value, read):
    base = {**BASE, "scenario": {"name": "rotation", "n_clients": 4, "angles": [0, 180]}}
    cfg = load_config({**base, "algorithm": {"name": "flhc", "cluster_clients": value}})
    assert cfg.algorithm.cluster_clients == read  # type: ignore[union-attr]
    assert type(cfg.algorithm.cluster_clients) is type(read)  # type: ignore[union-attr]


def test_all_is_refused_early_where_its_clustering_round_cannot_fit(monkeypatch):
    # the MLP 784-32-10 at 100,000 clients: 30.5 GB of updates alone, 240 GB of distances
    need = clustering_round_bytes(100_000, 25_450, "silhouette", True)
    assert need == 12 * 100_000 * 25_450 + 4 * 100_000 * 99_999 + 24 * 100_000**2
    assert clustering_round_bytes(100_000, 25_450, "gap", False) == need - 24 * 100_000**2
    cfg = {**BASE, "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
           "algorithm": {"name": "flhc", "warmup_rounds": 1}}
    monkeypatch.setattr(flhc, "physical_memory_bytes", lambda: 1)
    with pytest.raises(ConfigError) as err:  # before round 1
        Experiment.from_config(cfg).run(progress=False)
    assert err.value.field == "algorithm.cluster_clients"
    assert "allowed:" in str(err.value) and "\n" not in str(err.value)
    sampled = {**cfg, "algorithm": {**cfg["algorithm"], "cluster_clients": 4}}
    assert len(Experiment.from_config(sampled).run(progress=False).records) == 6
    # the bound itself: the memory it names runs, a byte less does not
    ctx = context(n_clients=4)
    d = ctx.factory.init(0).numel()
    need = clustering_round_bytes(4, d, "silhouette", True)
    monkeypatch.setattr(flhc, "physical_memory_bytes", lambda: need)
    FLHC(FLHCConfig(warmup_rounds=1)).setup(ctx)
    FLHC(FLHCConfig(warmup_rounds=1, auto_cut="gap")).setup(ctx)
    monkeypatch.setattr(flhc, "physical_memory_bytes", lambda: need - 1)
    with pytest.raises(ConfigError):
        FLHC(FLHCConfig(warmup_rounds=1)).setup(ctx)
    FLHC(FLHCConfig(warmup_rounds=1, auto_cut="gap")).setup(ctx)  # no [N, N] distances
    FLHC(FLHCConfig(warmup_rounds=1, cluster_clients=2)).setup(ctx)
    monkeypatch.setattr(flhc, "physical_memory_bytes", lambda: None)  # the system won't say
    FLHC(FLHCConfig(warmup_rounds=1)).setup(ctx)


def test_a_sampled_clustering_resumes_exactly(tmp_path):
    """Stopped after the checkpoint of round 4 (clients still waiting for a placement) and
    resumed: the same records and state as a run that never stopped."""
    cfg = {**BASE, "checkpoint_every": 2,
           "scenario": {"name": "rotation", "n_clients": 8, "angles": [0, 180]},
           "algorithm": {"name": "flhc", "warmup_rounds": 2, "per_round": 3,
                         "cluster_clients": 4}}
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    ref_hist = ref.run(progress=False)
    assert ref_hist.records[3].extras["unplaced"] > 0  # the checkpoint holds waiting clients
    resumed, hist = crash_then_resume(cfg, tmp_path / "cut", 5)
    assert timing_free(hist.records) == timing_free(ref_hist.records)
    a, b = resumed.algorithm.state, ref.algorithm.state
    assert torch.equal(a.models, b.models) and np.array_equal(a.labels, b.labels)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.anchor, b.anchor)
    assert a.round is None and b.round is None
