"""FLT (Jamali-Rad et al. 2022) and PCA+kM+HC: client signatures, encoders, clustering quality
through the real UMAP path, clients without a signature, the server state and resume. The
server math (A, Ã, Ω, Ward, the automatic C) is tested in tests/clustering/."""

import argparse
import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl import cli_encoder, encoders
from clusterfl.algorithms import ALGORITHMS, flt
from clusterfl.algorithms.base import Context
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.config import load_config
from clusterfl.data.federation import Federation
from clusterfl.engine.signatures import client_signature, kmeans_centroids
from clusterfl.errors import ConfigError, DataError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import EmbedReply, EmbedRequest, LocalTraining, subset
from clusterfl.report.methods import flt as flt_figures

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def prototypes_federation(n_clients: int = 12, n_clusters: int = 3, per_client: int = 40,
                          seed: int = 0, noise: float = 0.15) -> Federation:
    """Cluster c holds classes 2c and 2c+1; each class is a random binary 8x8 prototype plus
    Gaussian noise (pixels clipped to [0, 1]). Clients of a cluster are contiguous."""
    rng = np.random.default_rng(seed)
    protos = (rng.random((2 * n_clusters, 1, 8, 8)) > 0.5).astype(np.float32)
    clusters = np.repeat(np.arange(n_clusters), n_clients // n_clusters)
    parts: dict[str, list[np.ndarray]] = {"xtr": [], "ytr": [], "xte": [], "yte": []}
    for c in clusters:
        for key, n in (("tr", per_client), ("te", 12)):
            y = rng.integers(0, 2, n) + 2 * c
            x = np.clip(protos[y] + noise * rng.standard_normal((n, 1, 8, 8)), 0, 1)
            parts["x" + key].append(x.astype(np.float32))
            parts["y" + key].append(y)
    cat = {k: torch.from_numpy(np.concatenate(v)) for k, v in parts.items()}
    return Federation(cat["xtr"], cat["ytr"], np.arange(n_clients + 1) * per_client,
                      cat["xte"], cat["yte"], np.arange(n_clients + 1) * 12, clusters,
                      2 * n_clusters, name="synthetic/prototypes")


def config(algorithm: dict, rounds: int = 4, **top) -> dict:
    return {"seed": 0, "rounds": rounds, "eval_every": 1, "checkpoint_every": 0,
            "data": {"source": "digits"},
            "scenario": {"name": "cluster_labels", "n_clients": 12, "n_clusters": 3},
            "model": {"name": "mlp", "hidden": [32]},
            "train": {"lr": 0.1, "batch_size": 10, "epochs": 1},
            "algorithm": algorithm, "output": {"figures": False, "progress": "off"}, **top}


FAST_FLT = {"name": "flt", "encoder": "none", "latent": 16, "k": 3, "finetune_epochs": 2,
            "fraction": 0.5}


# ============================================================================ client side


def test_signature_is_label_free_deterministic_and_sized():
    fed = prototypes_federation()
    x, y = fed.client_train(0)
    enc = encoders.resolve("none", fed.input_shape, 16, 1, 0)
    req = EmbedRequest(np.array([0]), "encoder", enc.params, 16, k=3, latent=16,
                       finetune_epochs=1, seed=5)
    a = client_signature(x, y, req, 11)
    b = client_signature(x, torch.zeros_like(y), req, 11)
    assert a.shape == (3, 16)
    np.testing.assert_array_equal(a, b)  # labels are not read
    pca = client_signature(x, None, EmbedRequest(np.array([0]), "pca", None, 64, k=3,
                                                 pca_components=4), 11)
    assert pca.shape == (3, 64)
    # the two prototypes of client 0 (classes 0, 1) are near its PCA centroids in input space
    protos = [x[y == c].mean(0).reshape(-1).numpy() for c in (0, 1)]
    for p in protos:
        assert min(np.linalg.norm(p - row) for row in pca) < 0.5


def test_kmeans_centroids_with_fewer_distinct_points_than_k():
    pts = np.array([[0.0, 1.0], [0.0, 1.0], [2.0, 2.0]])
    out = kmeans_centroids(pts, 4, seed=0)
    assert out.shape == (4, 2)
    assert {tuple(r) for r in out} == {(0.0, 1.0), (2.0, 2.0)}


def test_embed_request_cost_and_backends_agree():
    fed = prototypes_federation(n_clients=6)
    factory = ModelFactory(model_config({"name": "mlp"}), fed.input_shape, fed.n_outputs)
    enc = encoders.resolve("none", fed.input_shape, 8, 1, 0)
    req = EmbedRequest(np.array([0, 2, 5]), "encoder", enc.params, 8, k=2, latent=8,
                       finetune_epochs=1, seed=3)
    assert req.cost() == (3.0 * enc.params.numel(), 3.0 * 2 * 8)
    assert EmbedRequest(np.arange(4), "pca", None, 64, k=5).cost() == (0.0, 4.0 * 5 * 64)
    seq = SequentialBackend(fed, factory).execute(req)
    sim = SimulationBackend(fed, factory).execute(req)
    assert isinstance(seq, EmbedReply) and seq.signatures.shape == (3, 2, 8)
    np.testing.assert_allclose(seq.signatures, sim.signatures)
    assert seq.n_samples.tolist() == [40, 40, 40]


class Unreliable(SequentialBackend):
    """Client 3 sends a non-finite signature (rejected by the guard), client 5 never answers
    the signature request (a dead node)."""

    def embed(self, req: EmbedRequest) -> EmbedReply:
        reply = super().embed(req)
        sig = reply.signatures.copy()
        sig[reply.clients == 3] = np.nan
        keep = np.flatnonzero(reply.clients != 5)
        return subset(EmbedReply(reply.clients, sig, reply.n_samples), keep)


@pytest.mark.parametrize("aggregation", ["clusters", "relatedness"])
def test_clients_without_a_signature_become_their_own_clusters(aggregation):
    fed = prototypes_federation()
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [32]}), fed.input_shape,
                           fed.n_outputs)
    ctx = Context(Unreliable(fed, factory), factory, LocalTraining(lr=0.1, batch_size=10),
                  fed.n_clients, fed.train_sizes, np.random.default_rng(0), seed=0)
    algo = ALGORITHMS["flt"](flt.FLTConfig(**{**FAST_FLT, "umap": False, "threshold": 0.04,
                                              "finetune_epochs": 0, "aggregation": aggregation}))
    algo.setup(ctx)
    extras = algo.run_round(ctx, 1)
    assert isinstance(extras, flt.FLTClusteringExtras)
    assert ctx.guard is not None
    assert [r["client"] for r in ctx.guard.end_round()["rejected"]] == [3]
    labels = algo.assignment()
    others = np.setdiff1d(np.arange(12), [3, 5])
    assert labels[3] != labels[5] and {labels[3], labels[5]}.isdisjoint(labels[others])
    truth = fed.clusters[others]  # the others are still clustered correctly
    assert np.array_equal(labels[others][:, None] == labels[others][None],
                          truth[:, None] == truth[None])
    assert extras.rejected_signatures == 2 and extras.n_clusters_found == 5
    assert algo.relatedness()["signature_clients"].tolist() == others.tolist()
    a = algo.relatedness()["adjacency"]
    assert np.isinf(a[3, others]).all() and a[5, 5] == 0.0
    assert np.all(np.asarray(extras.adjacency)[[3, 5]][:, others] == -1.0)
    d_enc = encoders.resolve("none", (1, 8, 8), 16, 1, 0).params.numel()
    assert extras.clustering_floats_down == 12 * d_enc  # every listed client got it
    assert extras.clustering_floats_up == 10 * 3 * 16  # signatures that arrived
    rows = 12 if aggregation == "relatedness" else 5
    assert algo.state.models.shape[0] == rows
    assert algo.predictor().members.max() < rows


class FewAnswer(SequentialBackend):
    """Only the clients of `answering` send a signature (the others dropped out)."""

    answering: tuple[int, ...] = (0, 1, 4)

    def embed(self, req: EmbedRequest) -> EmbedReply:
        reply = super().embed(req)
        return subset(reply, np.flatnonzero(np.isin(reply.clients, self.answering)))


@pytest.mark.parametrize("answering", [(0, 1, 4), (7,), ()])
@pytest.mark.parametrize("name", ["flt", "pca_km_hc"])
def test_n_clusters_above_the_signatures_that_arrived_is_lowered_to_their_number(
        name, answering):
    """Before: `ConfigError: algorithm.n_clusters: 4 clusters asked, only 3 clients have a
    signature` in round 1; now lowered to the signatures that arrived, as PACFL and FL+HC
    do: each client with a signature its own cluster, every other client one of its own."""
    fed = prototypes_federation()
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [32]}), fed.input_shape,
                           fed.n_outputs)
    backend = FewAnswer(fed, factory)
    backend.answering = answering
    ctx = Context(backend, factory, LocalTraining(lr=0.1, batch_size=10), fed.n_clients,
                  fed.train_sizes, np.random.default_rng(0), seed=0)
    settings = {**FAST_FLT, "umap": False, "finetune_epochs": 0} if name == "flt" else \
        {"name": name, "k": 3}
    algo = ALGORITHMS[name](ALGORITHMS[name].Config(**{**settings, "n_clusters": 4}))
    algo.setup(ctx)
    extras = algo.run_round(ctx, 1)
    assert isinstance(extras, flt.FLTClusteringExtras)
    labels = algo.assignment()
    assert sorted(labels.tolist()) == list(range(12))  # 12 clusters of one client each
    assert set(labels[list(answering)].tolist()) == set(range(len(answering)))
    assert extras.n_clusters_found == 12 and extras.rejected_signatures == 12 - len(answering)
    assert algo.relatedness()["signature_clients"].tolist() == list(answering)


@pytest.mark.parametrize("aggregation", ["clusters", "relatedness"])
def test_a_newcomer_after_a_clustering_without_signatures_keeps_the_initial_model(
        aggregation):
    """No signature arrived in the clustering round (every client its own cluster): a
    newcomer joins no cluster. Before, Case I served it an all-zero model (the mean over no
    related client) and named client 0 as its nearest clustered client; now the initial
    model, as a client that did not answer, and no nearest client (-1)."""
    fed = prototypes_federation()
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [32]}), fed.input_shape,
                           fed.n_outputs)
    backend = FewAnswer(fed, factory)
    backend.answering = ()
    ctx = Context(backend, factory, LocalTraining(lr=0.1, batch_size=10), fed.n_clients,
                  fed.train_sizes, np.random.default_rng(0), seed=0)
    algo = ALGORITHMS["flt"](flt.FLTConfig(**{**FAST_FLT, "umap": False, "finetune_epochs": 0,
                                              "aggregation": aggregation}))
    algo.setup(ctx)
    algo.run_round(ctx, 1)
    placing = Context(SequentialBackend(fed, factory), factory, ctx.training, 3,
                      fed.train_sizes[:3], np.random.default_rng(0), seed=0)
    placed = algo.placement(placing, np.arange(3))
    assert placed.clusters.tolist() == [-1, -1, -1]
    for row in placed.predictor.members[:, 0].tolist():
        assert torch.equal(placed.predictor.models[row], algo.state.models[0])
    assert placed.details == [{"ward_cost": [], "nearest_client": -1}] * 3


# ============================================================================ encoders


def test_pretrain_save_load_and_checksum(tmp_path):
    enc = encoders.pretrain("digits", epochs=3, latent=8, seed=1, max_samples=300)
    assert enc.losses[-1] < enc.losses[0]  # it learns to reconstruct
    path = encoders.save(enc, tmp_path / "e.pt")
    back = encoders.load(path)
    assert torch.equal(back.params, enc.params) and back.sha256 == enc.sha256
    assert (back.source, back.epochs, back.latent, back.input_shape) == ("digits", 3, 8,
                                                                           (1, 8, 8))
    raw = torch.load(path, weights_only=True)
    raw["params"][0] += 1.0
    torch.save(raw, tmp_path / "bad.pt")
    with pytest.raises(DataError, match="checksum"):
        encoders.load(tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="latent"):
        encoders.resolve(str(path), (1, 8, 8), 16, 1, 0)
    # a dataset name is pretrained once, then read from the cache
    first = encoders.resolve("digits", (1, 8, 8), 8, 1, 0, encoder_dir=tmp_path / "cache")
    assert encoders.cached_path("digits", 8, 1, 0, tmp_path / "cache").is_file()
    again = encoders.resolve("digits", (1, 8, 8), 8, 1, 0, encoder_dir=tmp_path / "cache")
    assert torch.equal(first.params, again.params)


# ============================================================================ the methods


def test_flt_recovers_clusters_through_umap_without_knowing_c():
    """Rule v1's automatic C (what HC reads for a given C: the rows of Ã after UMAP, the
    silhouette bound); rule v2's, the default, is tests/algorithms/test_flt_auto_c.py's."""
    fed = prototypes_federation()
    v1 = {"auto_on": "relatedness", "significance": 0.0}
    exp = Experiment.from_config(config({**FAST_FLT, "aggregation": "clusters", **v1},
                                        rounds=4), federation=fed)
    hist = exp.run(progress=False)
    first = hist.records[0]
    assert first.ari == 1.0 and first.n_clusters == 3  # C found, not given
    extras = first.extras
    d_enc = encoders.resolve("none", (1, 8, 8), 16, 1, 0).params.numel()
    assert extras["clustering_floats_down"] == 12 * d_enc  # the encoder once per client
    assert extras["clustering_floats_up"] == 12 * 3 * 16  # k·e per client
    assert np.asarray(extras["umap_points"]).shape == (36, 2)
    acc = hist.series("accuracy")
    assert acc[-1] > acc[0] and acc[-1] > 0.9  # 2 classes per cluster model
    assert exp.algorithm.state.models.shape[0] == 3


def test_flt_case_one_and_matched_distance_without_umap():
    fed = prototypes_federation()
    # frozen random encoder, k = 2: matched distances are ~2e-4 within, ≥ 1.3e-2 across
    algo = {**FAST_FLT, "umap": False, "distance": "matched", "threshold": 0.003, "k": 2,
            "finetune_epochs": 0, "fraction": 1.0}
    exp = Experiment.from_config(config(algo, rounds=3), federation=fed)
    hist = exp.run(progress=False)
    assert hist.records[0].ari == 1.0
    models = exp.algorithm.state.models
    assert models.shape[0] == 12  # Case I: one model per client
    related = exp.algorithm.relatedness()["relatedness"]
    assert np.array_equal(related, fed.clusters[:, None] == fed.clusters[None, :])
    for c in range(3):  # related clients hold the same model after the Ω average
        members = np.flatnonzero(fed.clusters == c)
        torch.testing.assert_close(models[members], models[members[:1]].expand(4, -1))
    assert hist.series("accuracy")[-1] > 0.9


def test_flt_components_rule_finds_the_groups_of_a_partly_filled_adjacency():
    fed = prototypes_federation()
    # the matched-distance setting above, with γ between the within-cluster distances so that
    # each cluster's block of Ã is only partly filled (but connected) and no link crosses
    algo = {**FAST_FLT, "umap": False, "distance": "matched", "k": 2, "finetune_epochs": 0,
            "fraction": 1.0, "auto_clusters": "components"}
    probe = Experiment.from_config(config({**algo, "threshold": 0.003}, rounds=1),
                                   federation=fed)
    probe.run(progress=False)
    a = probe.algorithm.relatedness()["adjacency"]
    same = fed.clusters[:, None] == fed.clusters[None, :]
    off = ~np.eye(len(a), dtype=bool)
    gamma = float(np.quantile(a[same & off], 0.7))  # about 70 % of the within pairs linked
    assert gamma < a[~same].min()
    exp = Experiment.from_config(config({**algo, "threshold": gamma}, rounds=1),
                                 federation=fed)
    hist = exp.run(progress=False)
    related = exp.algorithm.relatedness()["relatedness"]
    assert 0.5 < related[same & off].mean() < 0.9 and not related[~same].any()
    assert hist.records[0].ari == 1.0 and hist.records[0].n_clusters == 3
    with pytest.raises(ConfigError, match="auto_clusters"):
        load_config(config({"name": "flt", "auto_clusters": "components", "threshold": None,
                            "aggregation": "clusters"}))


def test_pca_km_hc_runs_and_clusters():
    fed = prototypes_federation()
    exp = Experiment.from_config(config({"name": "pca_km_hc", "k": 3, "pca_components": 4,
                                         "fraction": 0.5}, rounds=3), federation=fed)
    hist = exp.run(progress=False)
    assert hist.records[0].ari == 1.0
    assert hist.records[0].extras["clustering_floats_down"] == 0
    assert hist.records[0].extras["clustering_floats_up"] == 12 * 3 * 64
    assert hist.series("accuracy")[-1] > 0.8


def test_state_dict_round_trip_and_resume(tmp_path):
    fed = prototypes_federation()
    cfg = config({**FAST_FLT, "umap": False, "threshold": 0.04, "finetune_epochs": 0},
                 rounds=6, checkpoint_every=2)
    ref = Experiment.from_config(cfg, out_dir=tmp_path / "ref", federation=fed)
    ref_hist = ref.run(progress=False)
    # the checkpoint of round 4 resumes to the same end
    resumed = Experiment.from_config(cfg, out_dir=tmp_path / "ref", federation=fed)
    hist = resumed.run(resume=True, progress=False)
    assert hist.records[-1].client_accuracy == ref_hist.records[-1].client_accuracy
    assert torch.equal(resumed.algorithm.state.models, ref.algorithm.state.models)
    state = ref.algorithm.state_dict()
    other = ALGORITHMS["flt"](ref.algorithm.config)
    other.load_state_dict(state)  # no setup: the state alone predicts
    assert isinstance(other.state, flt.FLTState)
    assert np.array_equal(other.assignment(), ref.algorithm.assignment())
    assert other.state.labels.dtype == np.int64 and other.state.clustered
    for name in ("map_seed", "encoder", "clustering_floats_down", "clustering_floats_up",
                 "n_clusters_found", "rejected_signatures", "clustering_round"):
        assert getattr(other.state, name) == getattr(ref.algorithm.state, name), name
    for key, value in ref.algorithm.relatedness().items():
        assert other.relatedness()[key].dtype == value.dtype
        np.testing.assert_array_equal(other.relatedness()[key], value)
    assert torch.equal(other.predictor().models, ref.algorithm.predictor().models)
    assert (tmp_path / "ref" / flt.ARTIFACT).is_file()
    drawn = flt_figures.figures(tmp_path / "ref", ref_hist.records, ref_hist.summary)
    assert {p.name for p in drawn} >= {"flt_adjacency.png", "flt_dendrogram.png"}
    assert all(p.stat().st_size > 0 for p in drawn)


def test_encoder_cli_trains_and_shows(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli_encoder.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "enc.pt"
    args = parser.parse_args(["encoder", "train", "--source", "digits", "--epochs", "1",
                              "--latent", "8", "--max-samples", "200", "--out", str(out),
                              "--quiet"])
    assert args.func(args) == 0 and out.is_file()
    args = parser.parse_args(["encoder", "show", str(out)])
    assert args.func(args) == 0
    shown = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert shown["source"] == "digits" and shown["n_params"] == encoders.load(out).params.numel()
    bad = parser.parse_args(["encoder", "train", "--source", "digits", "--epochs", "0"])
    with pytest.raises(ConfigError, match="--epochs"):
        bad.func(bad)
    for lr in ("nan", "inf", "-1", "0"):  # nan ended in torch's "Invalid learning rate"
        bad = parser.parse_args(["encoder", "train", "--source", "digits", "--lr", lr])
        with pytest.raises(ConfigError, match="--lr") as err:
            bad.func(bad)
        assert err.value.message == f"must be a finite number > 0, got {float(lr)}"


def test_encoder_train_never_overwrites_what_is_not_an_encoder_and_checks_out_first(
        tmp_path, monkeypatch):
    """`--out notes.txt` replaced the file with an encoder; `--out FILE/e.pt` trained, then
    ended in "File exists"."""
    parser = argparse.ArgumentParser()
    cli_encoder.add_parser(parser.add_subparsers(dest="command"))
    trained = []
    real = encoders.pretrain
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: trained.append(1) or real(*a, **k))

    def train(out: Path) -> None:
        args = parser.parse_args(["encoder", "train", "--source", "digits", "--epochs", "1",
                                  "--latent", "8", "--max-samples", "100", "--out", str(out),
                                  "--quiet"])
        args.func(args)

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    cases = [(notes, "exists and is not an encoder file; it is not overwritten"),
             (tmp_path, "is a folder; give the encoder file's path"),
             (notes / "e.pt", "notes.txt is a file, not a folder")]
    for out, words in cases:
        with pytest.raises(ConfigError) as err:
            train(out)
        assert err.value.field == "--out" and words in err.value.message
    assert notes.read_text() == "mine" and trained == []  # refused before any training
    train(tmp_path / "new" / "e.pt")  # a new folder is made
    train(tmp_path / "new" / "e.pt")  # and an encoder file is replaced
    assert encoders.load(tmp_path / "new" / "e.pt").source == "digits" and trained == [1, 1]


def test_a_pretraining_dataset_of_another_shape_or_missing_fails_before_pretraining(
        tmp_path, monkeypatch):
    """FLT's default encoder (Fashion-MNIST) on the 8×8 digits pretrained for 30 epochs and
    only then refused the shape; without the data the error did not say why FLT read it."""
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pytest.fail("pretrained"))
    with pytest.raises(ConfigError) as err:
        encoders.resolve("digits", (1, 28, 28), 8, 1, 0, tmp_path / "enc")
    assert err.value.field == "algorithm.encoder"
    assert err.value.message.startswith("'digits' has inputs (1, 8, 8), this federation "
                                        "(1, 28, 28): pretrain on a dataset of that shape")
    with pytest.raises(ConfigError) as err:
        encoders.resolve("mnist", (1, 28, 28), 8, 1, 0, tmp_path / "enc",
                         data_dir=tmp_path / "no_data")
    assert err.value.field == "algorithm.encoder"
    assert err.value.message.startswith("'mnist', the dataset the encoder is pretrained on, "
                                        "cannot be read: ")


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="threshold"):
        load_config(config({"name": "flt", "threshold": None}))
    with pytest.raises(ConfigError, match=r"algorithm\.distance"):
        load_config(config({"name": "flt", "distance": "mean"}))
    with pytest.raises(ConfigError, match=r"algorithm\.k"):
        load_config(config({"name": "pca_km_hc", "k": 0}))
    with pytest.raises(ConfigError, match=r"algorithm\.encoder.*allowed"):  # before a run
        Experiment.from_config(config({**FAST_FLT, "encoder": "imagenet"}),
                               federation=prototypes_federation())


@pytest.mark.parametrize(("settings", "lines"), [
    ({"n_clusters": 3, "auto_clusters": "gap", "max_clusters": 5},
     ["algorithm.auto_clusters = 'gap' does nothing: algorithm.n_clusters = 3 fixes C",
      "algorithm.max_clusters = 5 does nothing: algorithm.n_clusters = 3 fixes C"]),
    ({"auto_clusters": "components", "max_clusters": 4, "min_silhouette": 0.5},
     ["algorithm.max_clusters = 4 does nothing: auto_clusters = 'components' takes the "
      "connected components of Ã",
      "algorithm.min_silhouette = 0.5 does nothing: auto_clusters = 'components' takes the "
      "connected components of Ã"]),
    ({"auto_clusters": "gap", "min_silhouette": 0.5, "max_clusters": 4},
     ["algorithm.min_silhouette = 0.5 does nothing: auto_clusters = 'gap' cuts at the "
      "largest gap of merge heights"]),
    ({"max_clusters": 4, "min_silhouette": 0.5}, []),  # the silhouette cut reads both
])
@pytest.mark.parametrize("name", ["flt", "pca_km_hc"])
def test_an_option_the_cut_in_force_never_reads_is_named(name, settings, lines):
    """Before: FLT and PCA+kM+HC had no `ignored_settings`, so e.g. `max_clusters` beside
    `n_clusters`, or under the components rule (which docs/flt.md says it does not apply
    to), ran without a word; PACFL and FL+HC warn."""
    base = FAST_FLT if name == "flt" else {"name": name, "threshold": 1.0}
    assert ALGORITHMS[name].Config(**{**base, **settings}).ignored_settings() == lines


def test_umap_and_finetuning_options_without_them_are_named():
    settings = {"umap": False, "umap_neighbors": 5, "finetune_epochs": 0, "finetune_lr": 0.01}
    assert flt.FLTConfig(**{**FAST_FLT, **settings}).ignored_settings() == [
        "algorithm.umap_neighbors = 5 does nothing: umap = false (no UMAP)",
        "algorithm.finetune_lr = 0.01 does nothing: finetune_epochs = 0 (the encoder is not "
        "fine-tuned)"]
    assert flt.FLTConfig(**{**FAST_FLT, "umap_neighbors": 5, "finetune_lr": 0.01}
                         ).ignored_settings() == []


def test_more_clusters_than_clients_is_refused_before_the_run():
    """n_clusters = 13 for 12 clients: refused when the experiment is built (as PACFL and
    FL+HC), not in round 1 after every client's signature (and FLT's encoder) was made."""
    for name in ("pca_km_hc", "flt"):
        algorithm = {**FAST_FLT, "n_clusters": 13} if name == "flt" else \
            {"name": name, "n_clusters": 13}
        with pytest.raises(ConfigError, match=r"algorithm\.n_clusters.*allowed: 1\.\.12"):
            Experiment.from_config(config(algorithm), federation=prototypes_federation())


def test_large_federations_keep_matrices_out_of_the_history(tmp_path, monkeypatch):
    monkeypatch.setattr(flt, "HISTORY_MAX_CLIENTS", 5)
    fed = prototypes_federation()
    cfg = config({**FAST_FLT, "umap": False, "threshold": 0.04, "finetune_epochs": 0},
                 rounds=2)
    hist = Experiment.from_config(cfg, out_dir=tmp_path / "run", federation=fed).run(
        progress=False)
    assert hist.records[0].extras["adjacency"] is None
    assert hist.records[0].extras["clustering_floats_up"] == 12 * 3 * 16
    drawn = flt_figures.figures(tmp_path / "run", hist.records, hist.summary)  # from the npz
    assert "flt_adjacency.png" in {p.name for p in drawn}


def test_config_without_threshold_loads_again_without_one():
    """Issue 35 (`threshold = none` cannot be written in TOML): FLT without γ saved a
    config.toml without the key, which loaded again with the default γ = 1.0 (another
    clustering); it is written `threshold = "none"` now, and that loads."""
    from clusterfl.config import dump_toml

    cfg = load_config(config({"name": "flt", "threshold": "none", "aggregation": "clusters"}))
    assert cfg.algorithm.threshold is None  # type: ignore[attr-defined]
    text = dump_toml(cfg.to_dict())
    assert 'threshold = "none"' in text
    again = load_config(tomllib.loads(text))
    assert again.algorithm.threshold is None  # type: ignore[attr-defined]
    assert again.algorithm.model_dump() == cfg.algorithm.model_dump()


def test_a_file_that_is_not_an_encoder_is_one_line(tmp_path, capsys):
    """`encoder show config.toml` printed torch's weights-only message of a dozen lines."""
    from clusterfl.cli import main

    text, empty, ckpt, other = (tmp_path / n for n in ("c.toml", "e.pt", "state.pt", "o.pt"))
    text.write_text("rounds = 3\n")
    empty.write_bytes(b"")
    torch.save({"round": 3, "rng": np.random.default_rng(0)}, ckpt)  # objects beyond tensors
    torch.save({"a": torch.zeros(2)}, other)
    for path, why in ((text, "not a file torch.save wrote"), (empty, "not a file torch.save "
                      "wrote"), (ckpt, "a torch file holding objects an encoder file has not"),
                      (other, "no 'params' entry")):
        with pytest.raises(DataError, match=f"is not a clusterfl encoder file \\({why}"):
            encoders.load(path)
        assert main(["encoder", "show", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err


def test_a_latent_too_large_for_memory_is_refused_before_anything_is_allocated(tmp_path, capsys,
                                                                              monkeypatch):
    """`encoder train --latent 100000000` allocated until the system killed it; FLT's
    `latent` the same in its run. A ConvAE for 8×8 images has 33·latent + 1093 parameters
    (conv 160 + 580, linear 17·latent and 16·latent + 16, transposed conv 272 + 65); its
    training holds 4 float32 copies, 16 bytes a parameter."""
    from clusterfl.cli import main

    monkeypatch.setattr(encoders, "physical_memory_bytes", lambda: 16 * 2**30, raising=False)
    out = tmp_path / "e.pt"
    assert main(["encoder", "train", "--source", "digits", "--epochs", "1", "--latent",
                 "100000000", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("clusterfl: error: --latent: 100,000,000 gives "
                                               "a ConvAE of 3,300,001,093 parameters"), err
    assert "49.2 GiB, more than this machine's 16.0 GiB" in err[0] and not out.exists()
    # the bound is 16 bytes a parameter: one byte less refuses, exactly that trains
    monkeypatch.setattr(encoders, "physical_memory_bytes", lambda: 16 * 1357 - 1)
    assert main(["encoder", "train", "--source", "digits", "--epochs", "1", "--latent", "8",
                 "--max-samples", "20", "--out", str(out), "--quiet"]) == 2
    assert "1,357 parameters" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(encoders, "physical_memory_bytes", lambda: 16 * 1357)
    assert main(["encoder", "train", "--source", "digits", "--epochs", "1", "--latent", "8",
                 "--max-samples", "20", "--out", str(out), "--quiet"]) == 0
    # FLT: before the run, untrained ("none") or pretrained (nothing pretrained, no cache)
    monkeypatch.setattr(encoders, "physical_memory_bytes", lambda: 16 * (33 * 16 + 1093) - 1)
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pytest.fail("pretrained"))
    for spec in ("none", "digits"):
        with pytest.raises(ConfigError, match="1,621 parameters") as exc:
            Experiment.from_config(config({**FAST_FLT, "encoder": spec, "encoder_dir":
                                           str(tmp_path / "cache")}))
        assert exc.value.field == "algorithm.latent"
    assert not (tmp_path / "cache").exists()
    assert encoders.conv_ae_size((1, 8, 8), 8) == 33 * 8 + 1093 == 1357


def _doctored(path: Path, out: Path, **entries) -> Path:
    """The encoder file at `path` with `entries` replaced and its checksum made to agree."""
    raw = torch.load(path, weights_only=True)
    raw.update(entries)
    if isinstance(raw["params"], torch.Tensor):
        raw["sha256"] = encoders.params_sha256(raw["params"])
    torch.save(raw, out)
    return out


def test_encoder_files_that_load_but_cannot_work_are_one_line_before_the_run(tmp_path, capsys):
    """A file whose parameters are not a tensor was Python's AttributeError; one with the
    wrong number of parameters (or NaN ones) under an agreeing checksum was accepted by
    `encoder show` and by FLT's check, then stopped round 1 with a traceback (ConvAE's
    ValueError, BCE's 'all elements of input should be between 0 and 1')."""
    from clusterfl.cli import main

    good = encoders.save(encoders.pretrain("digits", 1, 16, 0, max_samples=50), tmp_path / "e.pt")
    params = encoders.load(good).params
    nan = params.clone()
    nan[[0, 5]] = float("nan")
    cases = [(_doctored(good, tmp_path / "list.pt", params=params.tolist()),
              "is not a clusterfl encoder file (its 'params' entry is not a tensor of floats)"),
             (_doctored(good, tmp_path / "short.pt", params=params[:-5].clone()),
              "1,616 parameters, but a ConvAE with latent 16 for inputs (1, 8, 8) has 1,621"),
             (_doctored(good, tmp_path / "nan.pt", params=nan),
              "2 of its 1,621 parameters are NaN or infinite"),
             (tmp_path, "is a folder; give an encoder file (.pt)")]
    for path, why in cases:
        assert main(["encoder", "show", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
        with pytest.raises(ConfigError, match=re.escape(why)) as exc:  # before round 1
            Experiment.from_config(config({**FAST_FLT, "encoder": str(path)}),
                                   federation=prototypes_federation())
        assert exc.value.field == "algorithm.encoder"
    with pytest.raises(ConfigError, match=r"latent 16; this federation needs inputs \(1, 8, "
                       r"8\) and latent 8 \(or set algorithm.latent = 16\)"):
        encoders.resolve(str(good), (1, 8, 8), 8, 1, 0)


def test_a_broken_or_mismatched_cached_encoder_names_algorithm_encoder(tmp_path, monkeypatch):
    """A corrupted cache file was a DataError naming no setting and not saying that deleting
    it retrains it; a file at the cache's name pretrained on another dataset (or for other
    epochs or seed) was used as if it were the one named."""
    cache = tmp_path / "cache"
    path = encoders.cached_path("digits", 8, 1, 0, cache)
    encoders.save(encoders.pretrain("digits", 1, 8, 0, max_samples=50), path)
    good = path.read_bytes()
    path.write_bytes(good[:200])  # truncated
    monkeypatch.setattr(encoders, "pretrain", lambda *a, **k: pytest.fail("pretrained"))
    with pytest.raises(ConfigError) as exc:
        encoders.check("digits", (1, 8, 8), 8, 1, 0, cache)
    assert exc.value.field == "algorithm.encoder" and exc.value.message == (
        f"{path} is not a clusterfl encoder file (not a file torch.save wrote) (the cached "
        "encoder of 'digits': delete it and the run pretrains it again)")
    path.write_bytes(good)
    for entries, what in (({"source": "mnist"}, "'mnist' for 1 epochs with seed 0"),
                          ({"epochs": 7}, "'digits' for 7 epochs with seed 0"),
                          ({"seed": 3}, "'digits' for 1 epochs with seed 3")):
        path.write_bytes(good)
        _doctored(path, path, **entries)
        with pytest.raises(ConfigError, match=re.escape(
                f"the cached encoder {path} was pretrained on {what}, not on 'digits' for 1 "
                "with seed 0 as its name says: delete it")) as exc:
            encoders.resolve("digits", (1, 8, 8), 8, 1, 0, cache)
        assert exc.value.field == "algorithm.encoder"
    path.write_bytes(good)
    assert encoders.resolve("digits", (1, 8, 8), 8, 1, 0, cache).sha256 == \
        encoders.load(path).sha256


def test_a_cached_encoder_gives_the_same_run_as_pretraining_it_in_the_run(tmp_path):
    """The first run pretrains the encoder (and caches it), the second reads the cache: the
    same encoder, the same clusters and the same numbers in every round."""
    def run() -> tuple[list, dict]:
        hist = Experiment.from_config(config({
            "name": "flt", "encoder": "digits", "pretrain_epochs": 1, "latent": 8, "k": 2,
            "finetune_epochs": 1, "umap": False, "encoder_dir": str(tmp_path)}, rounds=2)
        ).run(progress=False)
        return ([(r.metrics, r.assignment) for r in hist.records],
                hist.records[0].extras["encoder"])

    pretrained, cached = run(), run()
    assert len(list(tmp_path.glob("*.pt"))) == 1
    assert cached == pretrained and cached[1]["source"] == "digits"


def test_a_dendrogram_whose_merges_are_all_at_height_zero_draws_without_a_library_warning(
        tmp_path):
    """Every client related to every other (all rows of Ã equal): Ward merges everything at
    height 0, and scipy's dendrogram set the axis limits [0, 0], printing matplotlib's
    "Attempting to set identical low and high ylims" UserWarning into the user's console
    after the run. The figure is drawn with a unit axis and a note instead, silently."""
    import warnings

    from clusterfl.clustering.hierarchical import ward_linkage
    from clusterfl.report.methods.flt import plot_dendrogram

    z = ward_linkage(np.ones((6, 6)))
    assert not z[:, 2].any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_dendrogram(z, np.zeros(6, dtype=np.int64), tmp_path / "d.png")
    assert path.stat().st_size > 1000
