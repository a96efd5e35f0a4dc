"""Generic wire format, per-client slicing and reply assembly; node data files."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from clusterfl.backends.flower import codec
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.scenarios import make_federation
from clusterfl.deploy.clientdata import (
    export_partitions,
    read_client_file,
    simulated_client,
)
from clusterfl.deploy.node import handle_raw
from clusterfl.errors import DataError
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LocalTraining,
    LossRequest,
    Pick,
    Predictor,
    Steps,
    StepsReply,
    TrainRequest,
    join,
    subset,
)
from tests.flower.conftest import BASE

PARAMS = {k: v for k, v in BASE["scenario"].items() if k != "name"}
RECIPE = {"source": "digits", "scenario": "rotation", "params": PARAMS, "seed": 0,
          "data_dir": None}
MODEL = {"name": "mlp", "hidden": [16]}


@pytest.fixture(scope="module")
def fed():
    return make_federation("digits", "rotation", PARAMS, seed=0)


@pytest.fixture(scope="module")
def factory(fed):
    return ModelFactory(model_config(MODEL), fed.input_shape, fed.n_outputs)


def _requests(factory, n_clients: int) -> list:
    models = factory.init_many(3, seed=1)
    clients = np.arange(n_clients)
    which = np.array([0, 2, 1, 1, 0, 2][:n_clients])
    tr = LocalTraining(lr=0.1, batch_size=8, epochs=1, momentum=0.5, betas=(0.8, 0.9))
    offset = Predictor(models[:2].clone(), np.stack([which % 2, 1 - which % 2], 1), "sum_logits")
    # replies narrowed to d̂ coordinates (CFL-GP compression); as many as clients on purpose:
    # the index set is shared, never sliced per client like `model_of_client`
    coords = np.arange(n_clients, dtype=np.int64) * 7 + 3
    return [
        TrainRequest(clients, models, which, tr, seed=5),
        TrainRequest(clients, models, which, tr, seed=6, offset=offset),
        GradientRequest(clients, models, which, batch_size=8, seed=7),
        GradientRequest(clients, models, which, batch_size=None, seed=7),
        LossRequest(clients, models),
        LossRequest(clients, models, split="test", offset=offset),
        EvaluateRequest(clients, Predictor.single(models, which)),
        EvaluateRequest(clients, Predictor(models, np.stack([which, (which + 1) % 3], 1),
                                           "mean_probs"), split="train"),
        GradientRequest(clients, models, which, batch_size=8, seed=7, coords=coords),
        TrainRequest(clients, models, which, tr, seed=5, coords=coords),
        # a round in one message: K losses, then training of the least-loss model
        Steps.of(LossRequest(clients, models),
                 TrainRequest(clients, models, which * 0, tr, seed=5, models_held=True),
                 picks=[Pick(1, 0)]),
    ]


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list):  # a Steps' steps
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def test_every_request_round_trips_exactly(factory):
    for req in _requests(factory, 6):
        skeleton, arrays = codec.encode(req)
        _same(codec.decode(skeleton, arrays), req)


def test_packing_is_exact_and_keeps_dtypes():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros((0, 4)),
              "c": np.array([1, -2], dtype=np.int64), "d": np.array(True)}
    layout, packed = codec.pack(arrays)
    assert list(packed) == [codec.PACKED] and packed[codec.PACKED].dtype == np.uint8
    back = codec.unpack(layout, packed)
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape
        np.testing.assert_array_equal(back[k], a)


def test_round_trip_through_flower_records(factory):
    for req in _requests(factory, 6):
        back, meta = codec.from_recorddict(codec.to_recorddict(req, {"setup": "x"}))
        _same(back, req)
        assert meta == {"setup": "x"}


def test_registry_is_every_protocol_dataclass_and_embed_requests_travel():
    classes = codec.protocol_classes()
    assert {"LocalTraining", "Predictor", "TrainRequest", "TrainReply", "GradientRequest",
            "GradientReply", "LossRequest", "LossReply", "EvaluateRequest", "EvaluateReply",
            "EmbedRequest", "EmbedReply"} <= set(classes)
    # EmbedRequest was added by FLT: it travels without special code in the codec.
    req = classes["EmbedRequest"](clients=np.arange(3), method="encoder",
                                  encoder=torch.randn(50), signature_dim=4, k=2)
    _same(codec.decode(*codec.encode(req)), req)
    view = subset(req, [1])
    np.testing.assert_array_equal(view.clients, [1])
    torch.testing.assert_close(view.encoder, req.encoder)


def test_coords_round_trip_and_stay_whole_in_client_views(factory):
    for req in _requests(factory, 6)[-3:-1]:  # the two with coords
        assert req.coords is not None and len(req.coords) == len(req.clients)
        back = codec.decode(*codec.encode(req))
        _same(back, req)
        assert back.coords.dtype == np.int64
        back, _ = codec.from_recorddict(codec.to_recorddict(req))
        _same(back, req)
        for i in (0, 4):
            view = subset(req, [i])
            np.testing.assert_array_equal(view.model_of_client, req.model_of_client[i : i + 1])
            np.testing.assert_array_equal(view.coords, req.coords)  # not cut to one entry
            assert view.cost() == (req.models.shape[1], len(req.coords))


def test_non_protocol_values_are_refused():
    @dataclasses.dataclass
    class Alien:
        x: int

    with pytest.raises(TypeError, match=r"not a dataclass of clusterfl\.protocol"):
        codec.encode(Alien(1))
    with pytest.raises(TypeError, match="cannot send"):
        codec.encode({"a": object()})
    with pytest.raises(TypeError, match="unknown protocol type"):
        codec.decode('{"__dc__": "Nope", "f": {}}', {})


def test_nan_and_inf_scalars_survive():
    out = codec.decode(*codec.encode({"a": float("nan"), "b": float("-inf"), "c": 1.5}))
    assert np.isnan(out["a"]) and out["b"] == float("-inf") and out["c"] == 1.5


@pytest.mark.parametrize("idx", range(11))
def test_nodes_answer_like_the_whole_federation(fed, factory, idx):
    """One wire message per client to its own node, assembled: equals the in-process reply."""
    full = SimulationBackend(fed, factory)
    req = _requests(factory, fed.n_clients)[idx]
    expected = full.execute(req)
    setup = {"recipe": RECIPE, "model": MODEL}
    parts = []
    for i in range(fed.n_clients):
        skeleton, arrays = codec.encode(subset(req, [i]))
        meta = {codec.SKELETON_KEY: skeleton, "setup": json.dumps(setup)}
        out_meta, out_arrays = handle_raw("request", {"partition-id": i}, meta, arrays)
        parts.append(codec.wire_request(out_meta, out_arrays))  # one packed array
        assert list(out_arrays) == [codec.PACKED]
    got = join(parts)
    if isinstance(expected, StepsReply):  # compare step by step
        assert got.clients.tolist() == expected.clients.tolist()
        for g, e in zip(got.replies, expected.replies, strict=True):
            _close(g, e)
        return
    _close(got, expected)


def _close(got, expected) -> None:
    for f in dataclasses.fields(expected):
        a, b = getattr(got, f.name), getattr(expected, f.name)
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
        elif isinstance(b, dict):
            for k in b:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-9)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_join_keeps_only_the_answering_clients_in_request_order(fed, factory):
    req = _requests(factory, fed.n_clients)[0]
    full = SimulationBackend(fed, factory).execute(req)
    parts = [subset(full, [i]) for i in (4, 0, 2)]  # arrival order differs from the request
    got = join(parts, order=req.clients)
    np.testing.assert_array_equal(got.clients, req.clients[[0, 2, 4]])
    torch.testing.assert_close(got.params, full.params[[0, 2, 4]])
    np.testing.assert_array_equal(got.n_samples, full.n_samples[[0, 2, 4]])
    with pytest.raises(ValueError, match="not asked"):
        join(parts, order=req.clients[:2])


def test_partition_files_round_trip_and_match_simulated_partitions(fed, tmp_path):
    paths = export_partitions(fed, tmp_path)
    assert [p.name for p in paths] == [f"client_{i:04d}.npz" for i in range(fed.n_clients)]
    for c in (0, 4):
        from_file, cid, cluster = read_client_file(str(paths[c]))
        simulated, cl2 = simulated_client(RECIPE, c)
        assert cid == c and cluster == cl2 == int(fed.clusters[c])
        for split in ("train", "test"):
            x1, y1, o1 = from_file.split(split)
            x2, y2, o2 = simulated.split(split)
            torch.testing.assert_close(x1, x2, rtol=0, atol=0)
            torch.testing.assert_close(y1, y2, rtol=0, atol=0)
            np.testing.assert_array_equal(o1, o2)
        x, _ = fed.client_train(c)
        torch.testing.assert_close(from_file.client_train(c)[0], x, rtol=0, atol=0)


def test_bad_node_data_fails_clearly(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_client_file(str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((2, 3)))
    with pytest.raises(DataError, match="missing arrays"):
        read_client_file(str(bad))
    with pytest.raises(DataError, match="partition-id 9 out of range"):
        simulated_client(RECIPE, 9)


@pytest.mark.parametrize("per_label", [False, True])
def test_subspace_requests_travel_to_nodes_like_any_request(fed, factory, per_label):
    """PACFL's data-subspace request (added after the codec): one wire message per client
    to its own node, the replies joined, equal the in-process reply."""
    from clusterfl.protocol import SubspaceRequest

    e = int(np.prod(fed.input_shape))
    req = SubspaceRequest(np.arange(fed.n_clients), e, p=2, per_label=per_label,
                          n_labels=fed.n_outputs if per_label else 0)
    assert "SubspaceRequest" in codec.protocol_classes()
    expected = SimulationBackend(fed, factory).execute(req)
    setup = {"recipe": RECIPE, "model": MODEL}
    parts = []
    for i in range(fed.n_clients):
        skeleton, arrays = codec.encode(subset(req, [i]))
        meta = {codec.SKELETON_KEY: skeleton, "setup": json.dumps(setup)}
        out_meta, out_arrays = handle_raw("request", {"partition-id": i}, meta, arrays)
        parts.append(codec.wire_request(out_meta, out_arrays))
    got = join(parts)
    _same(got, expected)
    _same(codec.decode(*codec.encode(req)), req)


def _node_file(path, **changes):
    arrays = {"x_train": np.zeros((3, 4), np.float32), "y_train": np.array([0, 1, 2]),
              "x_test": np.zeros((2, 4), np.float32), "y_test": np.array([1, 0]),
              "client_id": np.array(5), "cluster": np.array(1), "n_classes": np.array(3)}
    np.savez(path, **{**arrays, **changes})
    return str(path)


def test_node_file_with_float_labels_is_refused_not_truncated(tmp_path):
    ok, cid, cluster = read_client_file(_node_file(tmp_path / "ok.npz",
                                                   y_train=np.array([0.0, 1.0, 2.0])))
    assert (cid, cluster) == (5, 1) and ok.client_train(5)[1].tolist() == [0, 1, 2]
    with pytest.raises(DataError, match=r"labels like 1\.5 are not class ids"):
        read_client_file(_node_file(tmp_path / "f.npz", y_train=np.array([0.0, 1.5, 2.0])))


def test_node_file_with_string_client_id_or_labels_fails_in_one_line(tmp_path):
    with pytest.raises(DataError, match="client_id must be one integer"):
        read_client_file(_node_file(tmp_path / "id.npz", client_id=np.array("five")))
    with pytest.raises(DataError, match="y_test holds <U1 values"):
        read_client_file(_node_file(tmp_path / "y.npz", y_test=np.array(["a", "b"])))
    with pytest.raises(DataError, match="NaN or infinite inputs"):
        read_client_file(_node_file(tmp_path / "nan.npz",
                                    x_train=np.full((3, 4), np.nan, np.float32)))


@pytest.mark.parametrize(("changes", "said"), [
    ({"client_id": np.array(-1)}, "client_id -1; client ids are 0..N-1, one node each"),
    ({"y_test": np.array([1, 7])}, "n_classes = 3 but a label 7 occurs"),
    ({"y_train": np.array([0, 1])}, "train has 3 inputs but 2 targets"),
    ({"x_train": np.zeros((0, 4), np.float32), "y_train": np.zeros(0, np.int64)},
     "the client has no training samples"),
    ({"cluster": np.array(-2)}, "the client has the true cluster id -2; ids are 0, 1, ... "
     "(leave every cluster id out when they are not known)"),
])
def test_node_file_that_an_npz_folder_refuses_is_refused_on_the_node(tmp_path, changes, said):
    """A node file skipped the checks of an npz folder's client: a label beyond n_classes
    or an empty training set was read, the first failing in the node's loss (dropped every
    round), the second training nothing; client_id -1 ended in an IndexError and mismatched
    lengths in a ValueError naming no file. Now each is one line naming the file."""
    path = _node_file(tmp_path / "c.npz", **changes)
    with pytest.raises(DataError) as err:
        read_client_file(path)
    assert str(err.value) == f"{path}: {said}"


@pytest.mark.parametrize("write", [lambda p: p.write_text("x_train,y_train\n1,2\n"),
                                   lambda p: np.save(p, np.zeros(3))])
def test_a_node_file_that_is_no_npz_says_so(tmp_path, write):
    """A CSV or .npy file given as data-file: numpy's message spoke of pickled data, or the
    reader failed on a bare array. Now one line says what the file must be."""
    path = tmp_path / "client.npz"
    write(path)
    if not path.exists():  # np.save added .npy
        path = tmp_path / "client.npz.npy"
    with pytest.raises(DataError) as err:
        read_client_file(str(path))
    assert str(err.value) == (f"{path}: not an .npz file (a zip of named arrays, as numpy.savez "
                              "and `clusterfl flower export-partitions` write; node config "
                              "'data-file')")


def test_a_folder_given_as_node_file_is_named_as_a_folder(tmp_path):
    """`data-file="DATA_DIR"` (the export's folder, not the node's file in it) read "node data
    file not found" for a folder that exists; now the line says it is a folder and shows the
    client files in it."""
    with pytest.raises(DataError) as err:
        read_client_file(str(tmp_path))
    assert str(err.value) == (f"node config 'data-file' {tmp_path} is a folder; give this "
                              "node's own file in it")
    for c in (0, 1, 2):
        _node_file(tmp_path / f"client_000{c}.npz", client_id=np.array(c))
    with pytest.raises(DataError) as err:
        read_client_file(str(tmp_path))
    assert str(err.value) == (f"node config 'data-file' {tmp_path} is a folder; give this "
                              "node's own file in it (client_0000.npz, client_0001.npz, ...)")
