"""Per-client server state that grows with the clients sampled (issue 41): the shared table
of per-client models (`ClientModels`, Local's and FedSoft's), FedSoft's estimation among the
round's sample, and FeSEM's file-backed tables (`disk_rows`), against brute-force dense
references."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.tiny import blobs

from clusterfl.algorithms.base import Ask
from clusterfl.algorithms.common import ClientModels
from clusterfl.algorithms.fedsoft import ESTIMATE, FedSoft, FedSoftConfig
from clusterfl.algorithms.fesem import KMEANS, WARMUP, FeSEM, FeSEMConfig, FeSEMState
from clusterfl.engine import allocator
from clusterfl.engine.allocator import disk_room, disk_rows, disk_write, drop_resident
from clusterfl.experiment import Experiment
from clusterfl.protocol import LocalTraining, TrainReply, TrainRequest
from clusterfl.state import restore, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- ClientModels
def test_client_models_keep_the_start_and_a_row_per_client_trained_in_place():
    """Rounds of 7 of 50 clients: the table holds the start and one row per client trained
    so far (not 50), every client reads what a dense [50, d] table written round by round
    holds, and every round writes into the same buffer (no copy of the table)."""
    n, d = 50, 3
    start = torch.tensor([0.5, -1.0, 2.0])
    table = ClientModels.start(start, n)
    dense = start[None].repeat(n, 1)
    trained: set[int] = set()
    rng = np.random.default_rng(0)
    buffers = set()
    for _ in range(6):
        clients = np.sort(rng.choice(n, size=7, replace=False))
        params = torch.from_numpy(rng.normal(size=(7, d)).astype(np.float32))
        dense[torch.from_numpy(clients)] = params
        trained |= set(clients.tolist())
        table = table.put(clients, params)
        assert table.models.shape == (1 + len(trained), d)
        assert np.count_nonzero(table.rows()) == len(trained)  # the others: row 0
        torch.testing.assert_close(table.of(np.arange(n)), dense, rtol=0, atol=0)
        buffers.add(table.models.data_ptr())
    assert len(buffers) == 1
    models, model_of = table.members()
    torch.testing.assert_close(models[torch.from_numpy(model_of)], dense, rtol=0, atol=0)
    # a checkpoint holds the rows in use; the table read back goes on (copied once)
    saved = snapshot(table)
    assert saved["models"].shape == (1 + len(trained), d)
    back = restore(ClientModels, saved)
    more = back.put(np.array([1, 2]), torch.ones(2, d))
    dense[1:3] = 1.0
    torch.testing.assert_close(more.of(np.arange(n)), dense, rtol=0, atol=0)
    assert back.models.data_ptr() != more.models.data_ptr()


def test_a_table_of_every_clients_model_is_written_by_client():
    """`row_of` None (Local's checkpoints of before): row i is client i's, nothing added."""
    dense = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    out = ClientModels(dense.clone(), None).put(np.array([0, 3]), torch.zeros(2, 3))
    expect = dense.clone()
    expect[[0, 3]] = 0.0
    assert out.models.shape == (4, 3)
    torch.testing.assert_close(out.of(np.arange(4)), expect, rtol=0, atol=0)


# ----------------------------------------------------------------------------- federations
def experiment(tmp_path: Path, tag: str, algorithm: dict[str, Any],
               rounds: int = 4) -> Experiment:
    cfg = {"seed": 2, "rounds": rounds, "eval_every": 1, "checkpoint_every": 0,
           "model": {"name": "mlp", "hidden": [8]},
           "train": {"lr": 0.2, "batch_size": 10, "steps": 2}, "algorithm": algorithm,
           "output": {"figures": False, "progress": "off"}}
    return Experiment.from_config(cfg, out_dir=tmp_path / tag, federation=blobs())


def recording(alg: Any) -> list[tuple[Ask[Any], Any]]:
    """Every (ask, reply) the method's `update` gets from now on."""
    seen: list[tuple[Ask[Any], Any]] = []
    update = alg.update

    def spy(state: Any, t: int, ask: Ask[Any], reply: Any) -> Any:
        seen.append((ask, reply))
        return update(state, t, ask, reply)

    alg.update = spy
    return seen


def records(exp: Experiment) -> list[str]:
    """The run's round records as text, wall times left out."""
    out = []
    for r in exp.history.records:  # type: ignore[attr-defined]
        d = r.to_json_dict()
        d.pop("wall_time")
        out.append(json.dumps(d, sort_keys=True))
    return out


@pytest.mark.parametrize("sampling", [{"per_round": 3}, {"fraction": 0.5}])
def test_fedsoft_personal_models_are_the_last_trained_ones_and_as_a_dense_table(
        tmp_path, sampling):
    """FedSoft, 3 (or half) of 20 clients a round: the table holds the shared start and a
    row per client that trained; each client's model is its last trained reply (the start
    until it trains). The same run with the table of every client's (`row_of` None, the
    layout of before) writes the same records."""
    algorithm = {"name": "fedsoft", "n_clusters": 2, **sampling}
    exp = experiment(tmp_path, "compact", algorithm)
    seen = recording(exp.algorithm)
    exp.history = exp.run(progress=False)  # type: ignore[attr-defined]
    alg = exp.algorithm
    assert isinstance(alg, FedSoft)
    last: dict[int, torch.Tensor] = {}
    for ask, reply in seen:
        if ask.phase != ESTIMATE:
            for i, c in enumerate(reply.clients.tolist()):
                last[c] = reply.params[i]
    personal = alg.state.personal
    assert personal.models.shape[0] == 1 + len(last)
    assert (personal.rows() > 0).sum() == len(last)
    start = exp.factory.init(2 + 2)  # seed + S: the shared start
    for c in range(20):
        torch.testing.assert_close(personal.of(np.array([c]))[0], last.get(c, start),
                                   rtol=0, atol=0)
    # the dense layout of before gives the same records
    dense = experiment(tmp_path, "dense", algorithm)
    setup = dense.algorithm.setup

    def dense_setup(ctx: Any) -> None:
        setup(ctx)
        st = dense.algorithm.state
        st.personal = ClientModels(st.personal.of(np.arange(ctx.n_clients)), None)

    dense.algorithm.setup = dense_setup  # type: ignore[method-assign]
    dense.history = dense.run(progress=False)  # type: ignore[attr-defined]
    assert dense.algorithm.state.personal.models.shape[0] == 20
    assert records(dense) == records(exp)


def test_fedsoft_estimation_among_the_sample_trains_the_same(tmp_path):
    """`estimate_among = "sampled"`: an estimation round asks only the round's sample, which
    then trains; with τ = 1 the cluster and personal models are those of asking everyone,
    only the u of the clients not sampled (and what is booked) differ."""
    runs = {}
    for among in ("all", "sampled"):
        exp = experiment(tmp_path, among, {"name": "fedsoft", "n_clusters": 2,
                                           "per_round": 4, "estimate_among": among})
        seen = recording(exp.algorithm)
        exp.history = exp.run(progress=False)  # type: ignore[attr-defined]
        runs[among] = (exp, seen)
    (a, asked_a), (b, asked_b) = runs["all"], runs["sampled"]
    est_a = [ask.request.clients for ask, _ in asked_a if ask.phase == ESTIMATE]
    est_b = [ask.request.clients for ask, _ in asked_b if ask.phase == ESTIMATE]
    trained_b = [ask.request.clients for ask, _ in asked_b if ask.phase != ESTIMATE]
    assert all(len(c) == 20 for c in est_a) and len(est_b) == 4
    for asked, trained in zip(est_b, trained_b, strict=True):
        np.testing.assert_array_equal(asked, trained)  # the sample: estimated, then trained
        assert len(asked) == 4
    sa, sb = a.algorithm.state, b.algorithm.state
    torch.testing.assert_close(sa.models, sb.models, rtol=0, atol=0)
    torch.testing.assert_close(sa.personal.of(np.arange(20)), sb.personal.of(np.arange(20)),
                               rtol=0, atol=0)
    asked_ever = np.unique(np.concatenate(est_b))
    assert sb.estimated.tolist() == np.isin(np.arange(20), asked_ever).tolist()
    np.testing.assert_array_equal(sa.importance[est_b[-1]], sb.importance[est_b[-1]])
    assert sb.pool is None  # nothing of the round kept between rounds
    down = [exp.history.records[-1].floats_down for exp in (a, b)]  # type: ignore[attr-defined]
    assert down[1] < down[0]  # 4 clients a round receive the cluster models, not 20


def test_fedsoft_reads_a_checkpoint_of_before_with_every_clients_model():
    """A checkpoint of before holds a [n_clients, d] tensor of personal models: read as a
    table of every client's (row i client i's), predicted client by client (`own`)."""
    dense = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    alg = FedSoft(FedSoftConfig(name="fedsoft", n_clusters=2))
    alg.load_state_dict({"models": torch.zeros(2, 3), "personal": dense.clone(),
                         "importance": np.full((5, 2), 0.5), "estimated": np.zeros(5, bool)})
    assert alg.state.personal.row_of is None and alg.state.pool is None
    torch.testing.assert_close(alg.state.personal.of(np.arange(5)), dense, rtol=0, atol=0)
    pred = alg.predictor()
    assert pred.own and pred.members[:, 0].tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(pred.models, dense, rtol=0, atol=0)


# ----------------------------------------------------------------------------- FeSEM
START = torch.tensor([0.25, -0.5])


def warm(alg: FeSEM, state: FeSEMState, t: int, clients: list[int],
         params: list[list[float]]) -> Any:
    ids = np.array(clients)
    ask = Ask(TrainRequest(np.arange(4), START[None], np.zeros(4, np.int64), LocalTraining(),
                           0), WARMUP)
    reply = TrainReply(ids, torch.tensor(params), np.full(len(ids), 7),
                       np.full(len(ids), 0.5))
    return alg.update(state, t, ask, reply)


def test_fesem_warmup_models_live_in_a_file_table_written_in_place():
    """Two warm-up rounds of 4 clients, some absent: the table (a file-backed map) holds
    each client's last model, Θ_0 for a client that never answered; the last warm-up round
    hands it, whole and in id order, to the first k-means."""
    alg = FeSEM(FeSEMConfig(n_clusters=2, warmup_rounds=2))
    alg.train_sizes, alg.index = np.array([1, 2, 3, 4]), None
    state = FeSEMState(START, np.full(4, -1, np.int64), None, None)
    first = warm(alg, state, 1, [0, 2], [[1.0, 1.0], [2.0, 2.0]])
    table = first.state.local
    assert first.then is None and disk_room(table) is not None
    torch.testing.assert_close(table, torch.tensor([[1.0, 1.0], START.tolist(), [2.0, 2.0],
                                                    START.tolist()]), rtol=0, atol=0)
    last = warm(alg, first.state, 2, [1, 2], [[3.0, 3.0], [4.0, 4.0]])
    assert last.then == KMEANS and last.state.local is None
    got = last.state.pending
    np.testing.assert_array_equal(got.clients, np.arange(4))
    torch.testing.assert_close(got.params, torch.tensor([[1.0, 1.0], [3.0, 3.0], [4.0, 4.0],
                                                         START.tolist()]), rtol=0, atol=0)
    assert got.params.data_ptr() == table.data_ptr()  # the same table, written in place


def test_the_first_round_of_a_warmup_asks_from_the_one_start():
    """Before any warm-up reply, the request holds Θ_0 once (every client at row 0), not a
    table of n copies of it."""
    alg = FeSEM(FeSEMConfig(n_clusters=2, warmup_rounds=2))
    state = FeSEMState(START, np.full(4, -1, np.int64), None, None)
    models, rows = alg._local(state)
    assert models.shape == (1, 2) and rows.tolist() == [0, 0, 0, 0]


# ----------------------------------------------------------------------------- disk_rows
def test_disk_rows_keep_exact_values_out_of_memory_and_go_with_the_table():
    """Values written are read back bit for bit after their pages were given back; the
    map's record goes when the table is freed; `disk_room` knows only a table's prefix."""
    x = torch.randn(300, 257, generator=torch.Generator().manual_seed(0))
    table = disk_rows(1000, 257)
    table[:300] = x
    drop_resident(table)
    assert torch.equal(table[:300], x) and not table[300:].any()  # unwritten: zeros
    room = disk_room(table[:300])
    assert room is not None and room.shape == (1000, 257)
    assert room.data_ptr() == table.data_ptr()
    assert disk_room(table[1:300]) is None and disk_room(x) is None
    drop_resident(x)  # any other tensor: nothing happens
    assert torch.equal(x, table[:300])
    start = table.data_ptr()
    assert start in allocator._DISK_MAPS
    del table, room
    gc.collect()
    assert start not in allocator._DISK_MAPS


def test_disk_write_puts_the_same_bytes_as_an_indexed_write():
    """Rows written through the file (scattered, repeated over rounds, half precision too)
    read back as `table[rows] = values` would have put them; on any other tensor it is
    that indexed write."""
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        table, dense = disk_rows(50, 33, dtype), torch.zeros(50, 33, dtype=dtype)
        plain = torch.zeros(50, 33, dtype=dtype)
        for rows in ([3, 40, 7], [40, 0], list(range(10, 30))):
            values = torch.randn(len(rows), 33, generator=gen).to(dtype)
            idx = np.array(rows)
            disk_write(table, idx, values)
            disk_write(plain, idx, values)
            dense[torch.from_numpy(idx)] = values
        drop_resident(table)
        assert torch.equal(table, dense) and torch.equal(plain, dense)
    with pytest.raises(IndexError):
        disk_write(disk_rows(4, 2), np.array([4]), torch.ones(1, 2))


def test_lazy_rows_take_no_memory_for_rows_not_written():
    """Room for 100,000 rows of 25,450 floats (10 GB) is mapped without being taken."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        pytest.skip("no /proc here to read the resident memory")

    def resident() -> int:
        return int(statm.read_text().split()[1]) * 4096

    before = resident()
    room = allocator.lazy_rows(100_000, 25_450)
    if room is None:
        pytest.skip("no lazy map on this system")
    room[5] = 1.0
    assert room.shape == (100_000, 25_450) and float(room[5].sum()) == 25_450.0
    assert float(room[99_999].abs().sum()) == 0.0
    assert resident() - before < 64 << 20  # a row written, not 10 GB

