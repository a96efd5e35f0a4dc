"""The flower backend end to end on an in-process Grid: same results as in-process runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clusterfl.deploy.server_app import FINAL_STATE, run_on_grid
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.experiment import Experiment, History
from clusterfl.records import RoundMetrics
from tests.flower.conftest import BASE, CFL_GP, IFCA, ErrorReplies, FakeGrid


def _inprocess(algo: dict) -> tuple[Experiment, History]:
    exp = Experiment.from_config({**BASE, "algorithm": algo})
    return exp, exp.run(progress=False)


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


PACFL = {"name": "pacfl", "fraction": 1.0, "n_clusters": 2}  # a SubspaceRequest on the wire
FLHC = {"name": "flhc", "warmup_rounds": 1, "n_clusters": 2}


# several steps per message: a client sampled for some of the K models (FedAvg+), the cluster
# part picked on the device into the offset (IFCA-CAM)
FEDAVG_PLUS = {"name": "fedavg_plus", "n_models": 3, "fraction": 0.5}
IFCA_CAM = {"name": "ifca_cam", "n_clusters": 2, "warmup_rounds": 1}
ONE_MESSAGE = {"ifca", "cfl_gp", "ifca_cam", "flhc"}  # a message per client and round


@pytest.mark.parametrize("algo", [IFCA, CFL_GP, PACFL, FLHC, FEDAVG_PLUS, IFCA_CAM],
                         ids=["ifca", "cfl_gp", "pacfl", "flhc", "fedavg_plus", "ifca_cam"])
def test_flower_run_equals_inprocess_run(algo, tmp_path):
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    history = run_on_grid(grid, {**BASE, "algorithm": algo}, out_dir=tmp_path)
    exp, ref_history = _inprocess(algo)
    summary = ref_history.summary
    assert history.final.ari == summary.final.ari
    if algo in (IFCA, CFL_GP, PACFL, FLHC):  # these find the two groups in 3 rounds
        assert summary.final.ari == 1.0
    assert history.summary.assignment == summary.assignment
    assert [(r.floats_down, r.floats_up) for r in history.records] == [
        (r.floats_down, r.floats_up) for r in ref_history.records]
    ours_final = history.final.metrics or RoundMetrics()
    ref_final = summary.final.metrics or RoundMetrics()
    assert ours_final.accuracy == pytest.approx(ref_final.accuracy, abs=1e-9)
    ours = _tensors(torch.load(tmp_path / FINAL_STATE, weights_only=False))
    ref = _tensors(exp.algorithm.state_dict())
    assert ours.keys() == ref.keys() and ours
    for k in ref:
        torch.testing.assert_close(ours[k], ref[k], rtol=1e-5, atol=1e-6)
    # one message per selected client: the handshake is not counted by the backend
    report = json.loads((tmp_path / "flower.json").read_text())
    assert report["dropouts"] == []
    assert report["messages"] % 6 == 0 or algo is FEDAVG_PLUS  # FedAvg+: samples of 3
    if algo["name"] in ONE_MESSAGE:  # a round is one message per client, + the evaluation
        assert report["messages"] == 6 * BASE["rounds"] + 6
    assert sorted(int(c) for c in report["nodes"]) == list(range(6))


HELD_OUT = {**BASE, "scenario": {**BASE["scenario"], "holdout": 1 / 3}}
PLACING = {"ifca": IFCA, "cfl_gp": CFL_GP, "fesem": {"name": "fesem", "n_clusters": 2},
           "fesem_cam": {"name": "fesem_cam", "n_clusters": 2, "warmup_rounds": 1},
           "pca_km_hc": {"name": "pca_km_hc", "fraction": 1.0, "n_clusters": 2},
           "local": {"name": "local"}}


@pytest.mark.parametrize("name", list(PLACING))
def test_held_out_clients_are_placed_on_flower_as_in_process(name, tmp_path):
    """Training on 4 nodes, then placing the 2 held-out ones (ids 1 and 5 of the whole
    federation: the nodes are addressed by those) gives the in-process placement."""
    raw = {**HELD_OUT, "algorithm": PLACING[name]}
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    ours = run_on_grid(grid, raw, out_dir=tmp_path).summary.holdout
    ref = Experiment.from_config(raw).run(progress=False).summary.holdout
    assert ours is not None and ref is not None and ours["clients"] == ref["clients"]
    assert ours["placed_clusters"] == ref["placed_clusters"]
    assert ours["accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6)
    assert ours["floats_down"] == ref["floats_down"] and ours["floats_up"] == ref["floats_up"]
    placing = [m for m in grid.sent if m.metadata.group_id.isdigit()]
    held_nodes = {100 + c for c in ref["clients"]}
    asked = [int(m.metadata.dst_node_id) for m in placing]
    first = next(i for i, n in enumerate(asked) if n in held_nodes)
    assert set(asked[first:]) == held_nodes  # only at the end, only the held-out nodes


def test_dead_node_is_dropped_and_the_run_finishes(tmp_path):
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    grid.dead_from[105] = 3  # client 5's node dies after the first two rounds' messages
    raw = {**BASE, "rounds": 3, "algorithm": IFCA, "backend": {"timeout": 5.0}}
    history = run_on_grid(grid, raw, out_dir=tmp_path)
    assert [r.round for r in history.records] == [1, 2, 3]
    report = json.loads((tmp_path / "flower.json").read_text())
    dropped = {tuple(d["clients"]) for d in report["dropouts"]}
    assert dropped == {(5,)}
    # IFCA's round is one message per client (losses, then training: a `Steps`); the dead
    # client answers neither step, so it is absent from both step replies
    assert {d["request"] for d in report["dropouts"]} == {"Steps[LossRequest+TrainRequest]",
                                                          "EvaluateRequest"}
    # the evaluation keeps one row per client: NaN for the dead one, real values for the rest
    acc = history.records[-1].client_accuracy
    assert acc is not None and acc[5] is None and all(a is not None for a in acc[:5])
    # messages after the crash still went to every selected client (it may come back)
    late = [m for m in grid.sent if m.metadata.group_id.isdigit()
            and int(m.metadata.group_id) >= 3]
    assert {int(m.metadata.dst_node_id) for m in late} == set(range(100, 106))


def test_no_answer_at_all_is_a_clear_error(tmp_path):
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    grid.dead_from = {n: 1 for n in grid.nodes}
    with pytest.raises(ClusterFLError, match=r"no client answered the "
                       r"Steps\[LossRequest\+TrainRequest\]") as err:
        run_on_grid(grid, {**BASE, "algorithm": IFCA, "backend": {"timeout": 1.0}})
    # the message names the option that decides how long to wait, and its value
    assert "no reply within backend.timeout = 1 s" in str(err.value)
    assert "raise backend.timeout (now 1 s)" in str(err.value)


def test_handshake_rejects_two_nodes_with_one_client():
    grid = FakeGrid([{"partition-id": i} for i in [0, 1, 2, 3, 4, 4]])
    with pytest.raises(ClusterFLError, match="both hold client 4"):
        run_on_grid(grid, {**BASE, "algorithm": IFCA})


def test_handshake_rejects_a_gap_in_client_ids():
    grid = FakeGrid([{"partition-id": i} for i in [0, 1, 2, 3, 4, 6]])
    with pytest.raises(ClusterFLError, match=r"no node holds \[5\]"):
        run_on_grid(grid, {**BASE, "scenario": {**BASE["scenario"], "n_clients": 7},
                           "algorithm": IFCA, "backend": {"wait_nodes": 6}})


@pytest.mark.parametrize("how", ["error", "silent"])
def test_a_node_that_fails_the_handshake_is_named_not_left_out(tmp_path, how):
    """A node whose data file is missing (or that never answers the handshake) was left out
    without a word: 5 of the 6 clients the run waited for, and the run went on with 5.
    Now fewer nodes than the run needs is one line naming each failed node and why."""
    grid = ErrorReplies([{"partition-id": i} for i in range(5)]
                        + [{"data-file": str(tmp_path / "client_0005.npz")}])
    if how == "silent":
        grid.silent = frozenset({105})
    with pytest.raises(ClusterFLError) as err:
        run_on_grid(grid, {**BASE, "algorithm": IFCA, "backend": {"wait_timeout": 2.0}},
                    out_dir=tmp_path / "out")
    why = (f"DataError: node data file not found: {tmp_path / 'client_0005.npz'} (node "
           "config 'data-file')" if how == "error" else "no reply within 600 s")
    assert str(err.value) == ("5 of 6 SuperNodes described their data in the handshake, the "
                              "run needs 6 (backend.wait_nodes or scenario.n_clients): "
                              f"node 105: {why}")
    assert not (tmp_path / "out").exists()


def test_nodes_beyond_wait_nodes_that_fail_the_handshake_are_a_warning(capsys):
    """With enough nodes for `backend.wait_nodes`, the others' failures are said once."""
    grid = ErrorReplies([{"partition-id": i} for i in range(6)])  # scenario: 5 clients
    history = run_on_grid(grid, {**BASE, "rounds": 1, "algorithm": IFCA,
                                 "scenario": {**BASE["scenario"], "n_clients": 5}})
    assert len(history.records[-1].client_accuracy) == 5
    assert capsys.readouterr().out == (
        "clusterfl: warning: 1 SuperNode(s) left out of the run (the handshake failed): "
        "node 105: DataError: partition-id 5 out of range: the scenario has 5 clients "
        "(0..4)\n")


def test_a_run_with_another_number_of_clients_than_the_scenario_says_so(capsys):
    """Nodes for 5 of the scenario's 6 clients (backend.wait_nodes = 5): the run had 5
    clients while its config.toml says 6, without a word."""
    grid = FakeGrid([{"partition-id": i} for i in range(5)])
    history = run_on_grid(grid, {**BASE, "rounds": 1, "algorithm": IFCA,
                                 "backend": {"wait_nodes": 5}})
    assert len(history.records[-1].client_accuracy) == 5
    assert capsys.readouterr().out == ("clusterfl: warning: the run has 5 clients (one per "
                                       "SuperNode with data), not scenario.n_clients = 6\n")


@pytest.mark.parametrize(("key", "change", "shown"), [
    ("n_classes", lambda z: {**z, "n_classes": np.int64(12)}, "10, client 3 (node 103): 12"),
    ("input_shape", lambda z: {**z, "x_train": z["x_train"].reshape(len(z["x_train"]), -1),
                               "x_test": z["x_test"].reshape(len(z["x_test"]), -1)},
     "[1, 8, 8], client 3 (node 103): [64]"),
    ("task", lambda z: {**z, "task": np.str_("regression"), "n_classes": np.int64(10),
                        "y_train": z["y_train"].astype(np.float32),
                        "y_test": z["y_test"].astype(np.float32)},
     "classification, client 3 (node 103): regression"),
])
def test_nodes_whose_data_disagree_are_refused_at_the_handshake(tmp_path, key, change, shown):
    """A node given a file of another federation (other classes, input shape or task) was
    taken in: the run dropped it every round with a torch shape error, or ended in a torch
    traceback. Now the handshake names the setting and the node."""
    from clusterfl.deploy.clientdata import export_partitions
    from clusterfl.experiment import build_federation

    raw = {**BASE, "algorithm": IFCA, "scenario": {**BASE["scenario"], "n_clients": 4}}
    paths = export_partitions(build_federation(Experiment.from_config(raw).config),
                              tmp_path / "parts")
    with np.load(paths[3]) as z:
        np.savez(tmp_path / "other.npz", **change({k: z[k] for k in z.files}))
    grid = ErrorReplies([{"data-file": str(p)} for p in paths[:3]]
                        + [{"data-file": str(tmp_path / "other.npz")}])
    with pytest.raises(ClusterFLError) as err:
        run_on_grid(grid, raw)
    assert str(err.value) == (f"the nodes' data disagree on {key}: client 0 (node 100) has "
                              f"{shown}; every node's data must be a client of one federation")


def test_server_holds_no_client_data(tmp_path):
    grid = FakeGrid([{"partition-id": i} for i in range(6)])
    from clusterfl.deploy import server_app

    seen = {}
    original = server_app.server_federation

    def spy(infos):
        fed = original(infos)
        seen["fed"] = fed
        return fed

    server_app.server_federation = spy
    try:
        run_on_grid(grid, {**BASE, "rounds": 1, "algorithm": IFCA})
    finally:
        server_app.server_federation = original
    fed = seen["fed"]
    assert fed.x_train.stride()[0] == 0 and float(fed.x_train.abs().sum()) == 0.0
    assert fed.train_sizes.sum() > 0 and fed.n_clients == 6
    np.testing.assert_array_equal(fed.clusters, [0, 0, 0, 1, 1, 1])


def test_flower_backend_outside_a_serverapp_is_a_config_error():
    with pytest.raises(ConfigError, match=r"backend\.name"):
        Experiment.from_config({**BASE, "algorithm": IFCA, "backend": {"name": "flower"}}).run(
            progress=False)


def test_backend_config_fields_are_validated():
    with pytest.raises(ConfigError, match=r"backend\.timeout"):
        Experiment.from_config({**BASE, "backend": {"name": "flower", "timeout": -1}})
    with pytest.raises(ConfigError, match=r"backend\.client_engine"):
        Experiment.from_config({**BASE, "backend": {"name": "flower", "client_engine": "gpu"}})


def test_flower_settings_belong_to_the_flower_backend_only():
    with pytest.raises(ConfigError, match=r"^backend\.timeout: unknown field; allowed fields "
                                          r"here: chunk_size, device, name, precision$"):
        Experiment.from_config({**BASE, "backend": {"timeout": 5.0}})  # simulation (default)
    with pytest.raises(ConfigError, match=r"^backend\.wait_nodes: unknown field"):
        Experiment.from_config({**BASE, "backend": {"name": "sequential", "wait_nodes": 6}})


def test_a_request_for_no_client_sends_nothing_and_returns_an_empty_reply():
    from clusterfl.backends.flower.backend import FlowerBackend, FlowerSession
    from clusterfl.deploy.server_app import server_federation
    from clusterfl.models import ModelFactory, model_config
    from clusterfl.protocol import LocalTraining, TrainRequest

    info = {"client_id": 0, "train_size": 5, "test_size": 2, "input_shape": "[1, 8, 8]",
            "n_classes": 10, "task": "classification", "cluster": 0}
    fed = server_federation({0: info})
    factory = ModelFactory(model_config({"name": "mlp", "hidden": [8]}), fed.input_shape, 10)
    grid = FakeGrid([{"partition-id": 0}])
    backend = FlowerBackend(fed, factory, FlowerSession(grid, {0: 100}, {}))
    reply = backend.execute(TrainRequest(np.zeros(0, np.int64), factory.init_many(2, 0),
                                         np.zeros(0, np.int64), LocalTraining(), seed=1))
    assert reply.params.shape == (0, factory.size) and grid.sent == []


def test_a_client_id_beyond_the_run_is_refused_at_the_handshake(tmp_path):
    """A node file with client_id 10**12 made the node build a sparse federation of 10**12
    rows (MemoryError), and a server given such an id would range over 0..10**12 in its gap
    check. Now the node refuses it in one line naming the file, the id and the allowed range
    (the server sends the number of SuperNodes it found), and the server's gap check looks
    at 0..N-1 only."""
    from clusterfl.deploy.clientdata import export_partitions
    from clusterfl.experiment import build_federation

    raw = {**BASE, "algorithm": IFCA}
    paths = export_partitions(build_federation(Experiment.from_config(raw).config),
                              tmp_path / "parts")
    with np.load(paths[5]) as z:
        np.savez(tmp_path / "far.npz", **{**{k: z[k] for k in z.files},
                                          "client_id": np.int64(10**12)})
    grid = ErrorReplies([{"partition-id": i} for i in range(5)]
                        + [{"data-file": str(tmp_path / "far.npz")}])
    with pytest.raises(ClusterFLError) as err:
        run_on_grid(grid, raw)
    assert str(err.value).endswith(
        f"node 105: DataError: {tmp_path / 'far.npz'}: client_id 1000000000000 out of range; "
        "this run's client ids are 0..5 (one per SuperNode, 6 connected)")

    class FarReply(FakeGrid):  # a node that skips the check (another ClientApp, say)
        def _answer(self, msg):
            reply = super()._answer(msg)
            if msg.metadata.group_id == "handshake" and int(msg.metadata.dst_node_id) == 105:
                reply.content.config_records["info"]["client_id"] = 10**12
            return reply

    with pytest.raises(ClusterFLError) as err:
        run_on_grid(FarReply([{"partition-id": i} for i in range(6)]), raw)
    assert str(err.value) == ("client ids must be 0..N-1 with one node each; no node holds "
                              "[5] (answers: [0, 1, 2, 3, 4, 1000000000000]; errors: [])")


class OddReplies(FakeGrid):
    """Node 105 answers every request with a reply that does not fit it (`how`)."""

    how = ""

    def _answer(self, msg):
        from flwr.app import ConfigRecord, Message, RecordDict

        from clusterfl.backends.flower import codec

        reply = super()._answer(msg)
        if msg.metadata.group_id == "handshake" or int(msg.metadata.dst_node_id) != 105:
            return reply
        if self.how == "garbage":
            return Message(RecordDict({"x": ConfigRecord({"a": 1})}), reply_to=msg)
        obj, _ = codec.from_recorddict(reply.content)
        if self.how == "nan" and hasattr(obj, "params"):
            obj.params[:, 3] = float("nan")
        elif self.how == "narrow" and hasattr(obj, "params"):
            obj.params = obj.params[:, :5]
        elif self.how == "other client":
            obj.clients = np.array([3])
        elif self.how == "other type":
            from clusterfl.protocol import LossReply

            obj = LossReply(np.array([5]), np.zeros((1, 2)), np.zeros((1, 2)))
        return Message(codec.to_recorddict(obj), reply_to=msg)


@pytest.mark.parametrize(("how", "why"), [
    ("narrow", "client 5's reply does not fit the TrainRequest: params has shape [1, 5], not "
               "[1, 2410]"),
    ("other client", "client 5's reply does not fit the TrainRequest: rows for clients [3]"),
    ("other type", "client 5's reply does not fit the TrainRequest: a LossReply, not a "
                   "TrainReply"),
    ("garbage", "client 5's reply could not be read: KeyError: 'meta'"),
])
def test_a_reply_that_does_not_fit_its_request_drops_its_client(tmp_path, how, why):
    """A node's reply of another width, for another client or of another type stopped the
    ServerApp with a traceback (torch.cat's 'Sizes of tensors must match', join's 'reply rows
    for clients [5] that were not asked'), and one without our records with KeyError: 'meta'.
    Now the client is dropped from that request with the reason, as a silent one is, and
    flower.json lists it."""
    grid = OddReplies([{"partition-id": i} for i in range(6)])
    grid.how = how
    run_on_grid(grid, {**BASE, "rounds": 1, "algorithm": {"name": "fedavg"}},
                out_dir=tmp_path / "out")
    dropouts = json.loads((tmp_path / "out" / "flower.json").read_text())["dropouts"]
    assert dropouts[0]["clients"] == [5] and dropouts[0]["reasons"] == {"5": why}


def test_a_node_that_sends_nan_weights_is_said_once(tmp_path, capsys):
    """A node whose trained model held a NaN: the guard rejected its reply every round, seen
    only in the history's 'rejected' count. Now one warning names the client and its node."""
    grid = OddReplies([{"partition-id": i} for i in range(6)])
    grid.how = "nan"
    history = run_on_grid(grid, {**BASE, "rounds": 2, "algorithm": {"name": "fedavg"}})
    assert [r.rejected for r in history.records] == [1, 1]
    assert capsys.readouterr().out == (
        "clusterfl: warning: client 5 (node 105) sent non-finite values in its TrainReply; "
        "the guard rejects such a reply (rounds' 'rejected' in history.jsonl), as a diverged "
        "client's in-process; said once per client\n")
