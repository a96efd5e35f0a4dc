"""PACFL (Vahidian et al. 2023): the one-off clustering of client subspaces and the rounds,
checked by hand on a toy whose angles are known, against the true clusters on digits,
placement of newcomers, clients without a basis, resume and config errors. The client SVD is
tested in tests/engine/test_subspace_request.py, the server maths in
tests/clustering/test_principal_angles.py, the cut alone (proximity → clusters at β) in
tests/algorithms/test_oneshot_steps.py."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score
from tests.crash import crash_then_resume

from clusterfl.algorithms import ALGORITHMS
from clusterfl.algorithms.base import Context
from clusterfl.algorithms.pacfl import PACFL, PACFLClusteringExtras, PACFLConfig, PACFLState
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.cli_place import load_state, place_clients
from clusterfl.config import dump_toml, load_config, read_toml
from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import make_federation
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import LocalTraining, SubspaceReply, SubspaceRequest, TrainRequest, subset

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def lines_federation() -> Federation:
    """4 clients in R^4 (inputs 1×2×2), each holding positive multiples of one direction:
    client 0 e1, client 1 e1 tilted 10° towards e2, client 2 e3, client 3 e3 tilted 20°
    towards e4. Their data subspaces are lines at known angles."""
    rng = np.random.default_rng(0)
    e = np.eye(4)
    tilt = lambda a, b, deg: np.cos(np.radians(deg)) * a + np.sin(np.radians(deg)) * b  # noqa: E731
    dirs = [e[0], tilt(e[0], e[1], 10), e[2], tilt(e[2], e[3], 20)]
    sizes = [6, 10, 8, 4]
    xs, ys = [], []
    for v, n in zip(dirs, sizes):
        xs.append(rng.uniform(1, 2, (n, 1)) * v)
        ys.append(rng.integers(0, 2, n))
    x = torch.from_numpy(np.concatenate(xs).reshape(-1, 1, 2, 2).astype(np.float32))
    y = torch.from_numpy(np.concatenate(ys))
    off = np.concatenate([[0], np.cumsum(sizes)])
    return Federation(x, y, off, x.clone(), y.clone(), off.copy(), np.array([0, 0, 1, 1]), 2,
                      name="synthetic/lines")


def context(fed: Federation, backend_cls=SequentialBackend, seed: int = 0) -> Context:
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [3]}), fed.input_shape,
                           fed.n_outputs)
    return Context(backend_cls(fed, factory), factory, LocalTraining(lr=0.1, batch_size=4),
                   fed.n_clients, fed.train_sizes, np.random.default_rng(seed), seed=seed)


def test_one_round_by_hand():
    fed = lines_federation()
    ctx = context(fed)
    algo = PACFL(PACFLConfig(p=1, threshold=15.0, fraction=1.0))
    algo.setup(ctx)
    start = algo.state.models.clone()
    algo.run_round(ctx, 1)
    st = algo.state
    # angles between the lines: 10° and 20° within the pairs, 90° across
    want = np.array([[0, 10, 90, 90], [10, 0, 90, 90], [90, 90, 0, 20], [90, 90, 20, 0.0]])
    np.testing.assert_allclose(st.proximity, want, atol=1e-4)
    assert st.labels.tolist() == [0, 0, 1, 2]  # β = 15°: 20° stays apart
    # the round: everybody trains from the one initial model of its cluster, then the
    # sample-weighted mean per cluster (seed: the context's first draw)
    seed = int(np.random.default_rng(0).integers(0, 2**31 - 1))
    ref = SequentialBackend(fed, ctx.factory).execute(
        TrainRequest(np.arange(4), start.repeat(3, 1), np.array([0, 0, 1, 2]), ctx.training,
                     seed))
    n = fed.train_sizes.astype(np.float64)
    theta = ref.params.double()
    first = (n[0] * theta[0] + n[1] * theta[1]) / (n[0] + n[1])
    torch.testing.assert_close(st.models[0].double(), first, rtol=0, atol=1e-6)
    torch.testing.assert_close(st.models[1], ref.params[2])
    torch.testing.assert_close(st.models[2], ref.params[3])
    # β = 25°: two clusters; the largest gap (no β) also finds them
    for cfg in (PACFLConfig(p=1, threshold=25.0, fraction=1.0),
                PACFLConfig(p=1, threshold=None, fraction=1.0),
                PACFLConfig(p=1, n_clusters=2, fraction=1.0)):
        other = PACFL(cfg)
        other.setup(context(fed))
        other.run_round(context(fed), 1)
        assert other.assignment().tolist() == [0, 0, 1, 1]


CONFIG = {"seed": 0, "rounds": 5, "eval_every": 1, "checkpoint_every": 0,
          "data": {"source": "digits"},
          "scenario": {"name": "cluster_labels", "n_clients": 12, "n_clusters": 3},
          "model": {"name": "mlp", "hidden": [32]},
          "train": {"lr": 0.1, "batch_size": 10, "epochs": 1},
          "output": {"figures": False, "progress": "off"}}


@pytest.mark.parametrize("algorithm", [
    {"threshold": 10.0},  # the paper's way: one SVD, the smallest principal angle
    {"per_label": True, "proximity": "min_pair", "linkage": "weighted", "threshold": 12.0},
    {"proximity": "angle_sum", "threshold": None},
])
def test_finds_the_true_clusters_on_digits(algorithm):
    cfg = {**CONFIG, "algorithm": {"name": "pacfl", "fraction": 0.5, **algorithm}}
    hist = Experiment.from_config(cfg).run(progress=False)
    first = hist.records[0]
    assert first.ari == 1.0 and first.n_clusters == 3  # K follows from β, not given
    assert all(r.ari == 1.0 for r in hist.records)  # one-shot: never changes
    acc = hist.series("accuracy")
    assert acc[-1] > acc[0] + 0.1 and acc[-1] > 0.9
    assert np.asarray(first.extras["proximity"]).shape == (12, 12)


def test_placement_of_newcomers_and_of_known_clients():
    params = {"n_clients": 12, "n_clusters": 3, "class_sets": [[0, 1], [2, 3], [4, 5]]}
    train_fed = make_federation("digits", "cluster_labels", params, seed=0)
    cfg = {**CONFIG, "algorithm": {"name": "pacfl", "fraction": 0.5, "threshold": 10.0}}
    exp = Experiment.from_config(cfg, federation=train_fed)
    exp.run(progress=False)
    algo = exp.algorithm
    assert isinstance(algo, PACFL)
    before = algo.state_dict()
    # the clients it trained on go back to their own clusters
    ctx = context(train_fed)
    np.testing.assert_array_equal(algo.place(ctx, np.arange(12)), algo.assignment())
    # newcomers: another draw of the same scenario (cluster c holds the same classes, other
    # samples); each joins the cluster of the training clients of its true cluster
    new_fed = make_federation("digits", "cluster_labels", params, seed=5)
    assert new_fed.meta["clusters"] == train_fed.meta["clusters"]
    placed = algo.placement(context(new_fed), np.arange(12))
    trained = algo.assignment()
    for i in range(12):
        mates = np.flatnonzero(train_fed.clusters == new_fed.clusters[i])
        assert placed.clusters[i] == trained[mates[0]]
    assert adjusted_rand_score(new_fed.clusters, placed.clusters) == 1.0
    assert placed.details is not None and all(d["within_threshold"] for d in placed.details)
    assert placed.predictor.members[:, 0].tolist() == placed.clusters.tolist()
    after = algo.state_dict()  # placement does not change the state
    assert all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)


class NoBasis(SequentialBackend):
    """Client 1 never answers the subspace request; client 2 sends a non-finite basis."""

    def subspace(self, req: SubspaceRequest) -> SubspaceReply:
        reply = super().subspace(req)
        bases = reply.bases.copy()
        bases[reply.clients == 2] = np.nan
        keep = np.flatnonzero(reply.clients != 1)
        return subset(SubspaceReply(reply.clients, bases, reply.ranks, reply.n_samples), keep)


def test_clients_without_a_basis_become_their_own_clusters():
    fed = lines_federation()
    ctx = context(fed, NoBasis)
    algo = PACFL(PACFLConfig(p=1, threshold=25.0, fraction=1.0))
    algo.setup(ctx)
    extras = algo.run_round(ctx, 1)
    assert isinstance(extras, PACFLClusteringExtras)
    labels = algo.assignment()
    assert labels[0] != labels[1] != labels[2] and labels[2] != labels[0]
    assert labels[3] not in labels[[1, 2]]
    assert extras.missing_signatures == 2 and extras.n_clusters_found == 4
    assert extras.signature_floats_up == 2 * 4  # two bases of 1 × e = 4 arrived
    assert np.asarray(extras.proximity)[1, 0] == -1.0
    assert algo.state.models.shape[0] == 4


def test_state_round_trip_and_resume(tmp_path):
    cfg = {**CONFIG, "rounds": 6, "checkpoint_every": 2,
           "algorithm": {"name": "pacfl", "fraction": 0.5, "threshold": 10.0}}
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref")
    ref_hist = ref.run(progress=False)
    resumed, hist = crash_then_resume(cfg, tmp_path / "cut", 4)
    assert [r.client_accuracy for r in hist.records] == [r.client_accuracy
                                                         for r in ref_hist.records]
    assert torch.equal(resumed.algorithm.state.models, ref.algorithm.state.models)
    other = ALGORITHMS["pacfl"](ref.algorithm.config)
    other.load_state_dict(ref.algorithm.state_dict())  # no setup: the state alone predicts
    assert isinstance(other.state, PACFLState)
    assert other.state.bases.dtype == np.float32 and other.state.labels.dtype == np.int64
    np.testing.assert_array_equal(other.state.proximity, ref.algorithm.state.proximity)
    assert torch.equal(other.predictor().models, ref.algorithm.predictor().models)
    old = ref.algorithm.state_dict()  # the layout before issue 34: a bag `info`, no round
    del old["clustering_round"]
    with pytest.raises(ValueError, match="clustering_round"):  # refused, not half-restored
        other.load_state_dict({**old, "info": {"n_clusters_found": 3}})


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"algorithm\.proximity"):
        load_config({**CONFIG, "algorithm": {"name": "pacfl", "proximity": "cosine"}})
    with pytest.raises(ConfigError, match=r"algorithm\.linkage"):
        load_config({**CONFIG, "algorithm": {"name": "pacfl", "linkage": "ward"}})
    with pytest.raises(ConfigError, match="not both"):
        load_config({**CONFIG, "algorithm": {"name": "pacfl", "threshold": 3.0,
                                             "n_clusters": 2}})
    with pytest.raises(ConfigError, match=r"algorithm\.p"):
        load_config({**CONFIG, "algorithm": {"name": "pacfl", "p": 0}})
    with pytest.raises(ConfigError, match=r"algorithm\.n_clusters.*allowed"):
        Experiment.from_config({**CONFIG, "algorithm": {"name": "pacfl", "n_clusters": 20}}
                               ).run(progress=False)
    algo = PACFL(PACFLConfig())
    algo.setup(context(lines_federation()))
    assert algo.place(context(lines_federation()), [0, 2]).tolist() == [-1, -1]  # not yet


def test_p_above_the_input_size_is_refused_instead_of_booking_padding():
    """Issue 35: p = 1152 on 8×8 digits (e = 64) booked 18× the real basis traffic (at most
    e columns carry a basis; the rest was zero padding). Refused in one line naming p."""
    with pytest.raises(ConfigError) as err:
        Experiment.from_config({**CONFIG, "algorithm": {"name": "pacfl", "p": 18 * 64}}
                               ).run(progress=False)
    assert err.value.field == "algorithm.p" and "allowed: 1..64" in str(err.value)
    algo = PACFL(PACFLConfig(p=4, fraction=1.0, threshold=25.0))  # p = e: the whole space
    ctx = context(lines_federation())
    algo.setup(ctx)
    extras = algo.run_round(ctx, 1)
    assert isinstance(extras, PACFLClusteringExtras)
    assert extras.signature_floats_up == 4 * (4 * 4)  # 4 clients, e · p = 4 · 4 each


def test_saved_config_toml_with_n_clusters_loads_again_and_places(tmp_path):
    """Issue 35: with `n_clusters` set, the run's config.toml held the default β too and
    could not be read back ("not both"), so `clusterfl place` failed."""
    cfg = {**CONFIG, "rounds": 1, "checkpoint_every": 1,
           "algorithm": {"name": "pacfl", "fraction": 0.5, "n_clusters": 3}}
    exp = Experiment.from_config(cfg, out_dir=tmp_path / "run")
    exp.run(progress=False)
    back = load_config(read_toml(tmp_path / "run" / "config.toml"))
    assert back.algorithm.model_dump() == exp.config.algorithm.model_dump()
    assert back.algorithm.cut() == (None, 3)  # type: ignore[attr-defined]
    saved, _ = load_state(tmp_path / "run")
    rows, _, _ = place_clients(tmp_path / "run", saved, "0-11", [])
    assert [r["cluster"] for r in rows] == [r["run_cluster"] for r in rows]  # its own again
    assert [r["run_cluster"] for r in rows] == exp.algorithm.assignment().tolist()


def test_threshold_none_can_be_written_in_toml():
    """Issue 35: no β (the largest gap) could not be written in TOML, and a run without one
    saved a config.toml that loaded with the default β = 3.5. `threshold = "none"` now."""
    raw = tomllib.loads('[algorithm]\nname = "pacfl"\nthreshold = "none"\n')["algorithm"]
    cfg = load_config({**CONFIG, "algorithm": raw})
    assert cfg.algorithm.threshold is None  # type: ignore[attr-defined]
    text = dump_toml(cfg.to_dict())
    assert 'threshold = "none"' in text
    again = load_config(tomllib.loads(text))
    assert again.algorithm.model_dump() == cfg.algorithm.model_dump()
    assert again.algorithm.cut() == (None, None)  # type: ignore[attr-defined]
