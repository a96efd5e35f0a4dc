"""Cross-device scale (issue 41): evaluation on a sample of clients (`eval_clients`), memory
that is not spent on what is never written (CFL-GP's lazily zero profile), replies that are
not copied, and per-client records made JSON-ready in one pass."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.tiny import blobs

from clusterfl.algorithms import cfl_gp_profile
from clusterfl.algorithms.cfl_gp_profile import Probe, Rows, update_profile
from clusterfl.config import load_config
from clusterfl.data.federation import Federation
from clusterfl.engine.allocator import lazy_zeros
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.metrics import summarize
from clusterfl.protocol import EvaluateReply, Predictor, present
from clusterfl.records import json_ready

pytestmark = pytest.mark.usefixtures("one_thread")


def run(tmp_path: Path, tag: str, **top: object) -> Experiment:
    cfg = {"seed": 2, "rounds": 4, "eval_every": 1, "checkpoint_every": 0,
           "model": {"name": "mlp", "hidden": [8]}, "train": {"lr": 0.2, "batch_size": 10,
                                                             "steps": 2},
           "algorithm": {"name": "ifca", "n_clusters": 2, "fraction": 0.5},
           "output": {"figures": False, "progress": "off"}, **top}
    exp = Experiment.from_config(cfg, out_dir=tmp_path / tag, federation=blobs())
    exp.history = exp.run(progress=False)  # type: ignore[attr-defined]
    return exp


@pytest.mark.parametrize("bad", [0, -3, 1.5, 0.0, True, "half"])
def test_eval_clients_bad_values_name_the_field(bad):
    with pytest.raises(ConfigError) as err:
        load_config({"eval_clients": bad})
    text = str(err.value)
    assert "eval_clients" in text and "a whole number >= 1 or a fraction in (0, 1]" in text
    assert "\n" not in text


def test_eval_clients_defaults_to_all_and_stays_out_of_the_config():
    assert load_config({}).run.eval_clients is None
    assert "eval_clients" not in load_config({}).to_dict()
    assert load_config({"eval_clients": 7}).to_dict()["eval_clients"] == 7
    assert load_config({"eval_clients": 0.25}).run.eval_clients == 0.25


@pytest.mark.parametrize("eval_clients", [5, 0.25])
def test_a_sample_is_measured_as_in_a_full_evaluation(tmp_path, eval_clients):
    """The sampled clients' metrics are those of a full evaluation of the same run; the
    others are missing (None); the last round evaluates everyone; training is unchanged."""
    full = run(tmp_path, "full").history.records  # type: ignore[attr-defined]
    part = run(tmp_path, "part", eval_clients=eval_clients).history.records  # type: ignore[attr-defined]
    assert [r.assignment for r in part] == [r.assignment for r in full]
    assert [r.extras for r in part] == [r.extras for r in full]
    seen = set()
    for a, b in zip(part[:-1], full[:-1], strict=True):
        asked = [i for i, v in enumerate(a.client_accuracy) if v is not None]
        assert len(asked) == 5  # 5 clients, or a quarter of 20
        seen.add(tuple(asked))
        for i, v in enumerate(a.client_accuracy):
            assert v == (b.client_accuracy[i] if i in asked else None)
        # the round's summary metrics are those of the sampled clients in the full run
        acc = np.array([b.client_accuracy[i] for i in asked], dtype=float)
        f1 = np.array([b.client_macro_f1[i] for i in asked], dtype=float)
        reply = EvaluateReply(np.array(asked), acc, f1, np.zeros(len(asked)),
                              np.full(len(asked), 10))
        assert a.metrics.accuracy == pytest.approx(summarize(reply)["accuracy"], abs=1e-12)
    assert len(seen) > 1  # a new sample each round
    assert part[-1].client_accuracy == full[-1].client_accuracy  # the last round: everyone
    assert part[-1].metrics == full[-1].metrics


def _resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(),
                    reason="reads resident memory from /proc (Linux)")
def test_lazy_zeros_cost_only_what_is_written():
    before = _resident_mib()
    table = lazy_zeros((64, 4, 1 << 18))  # 256 MiB of float32 zeros
    table[:, 0, :1000] = 1.0  # 64 rows of 4 KB: 64 pages
    assert float(table.sum()) == 64_000.0  # reading every value maps no memory
    grown = _resident_mib() - before
    assert grown < 32, f"{grown:.0f} MiB resident for 0.25 MiB written"
    assert table.dtype == torch.float32 and table.is_contiguous()


def test_profile_update_copying_only_the_asked_cells_equals_a_full_copy():
    rng = np.random.default_rng(0)
    c, k, d = 40, 3, 50
    old = torch.zeros(c, k, d)
    filled = np.zeros((c, k), dtype=bool)
    filled[rng.choice(c, 25, replace=False), 0] = True
    filled[rng.choice(c, 10, replace=False), 2] = True
    old[torch.from_numpy(filled)] = torch.randn(int(filled.sum()), d)
    asked = np.sort(rng.choice(c, 30, replace=False))
    who = asked[rng.permutation(30)[:26]]  # 4 silent, answers in another order
    rows = torch.randn(26, d)
    beta = rng.choice([1.0, 0.5, 1 / 3], size=30)
    probes = [Probe(0, asked, who, (rows[:9], rows[9:]))]  # the rows in two pieces
    kept = old.clone()
    plain = update_profile(old, [Probe(0, asked, who, rows)], [beta])
    lean = update_profile(old, probes, [beta], filled=filled)
    assert torch.equal(lean, plain)  # the same values, bit for bit
    # the second piece read from a wider table (every other column, rows in another order)
    # a few rows at a time, not copied first
    wide = torch.randn(30, 2 * d)
    order = rng.permutation(30)[:17]
    wide[torch.from_numpy(order), ::2] = rows[9:]
    piece = Rows(wide, order, torch.arange(0, 2 * d, 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cfl_gp_profile, "ROW_CHUNK", 4)
        read = update_profile(old, [Probe(0, asked, who, (rows[:9], piece))], [beta],
                              filled=filled)
    assert torch.equal(read, plain)
    assert torch.equal(old, kept)  # a new profile: the given one is not modified
    assert not torch.equal(lean[:, 0], old[:, 0])  # block 0 was updated
    assert torch.equal(lean[:, 2], old[:, 2])  # block 2, asked before, copied as it was


@pytest.mark.parametrize("answers", ["everyone", "a run", "shuffled", "gaps"])
@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("fill", ["none", "some", "all"])
def test_profile_update_equals_the_per_client_rule_bit_for_bit(answers: str, uniform: bool,
                                                                fill: str) -> None:
    """g_{c,k} := (1 − β_c) g_{c,k} + β_c v_c for each client that answered, the others
    unchanged, against a loop over the clients in float32, bit for bit: consecutive answers
    are updated in place through slices, the others by index, 4 rows at a time."""
    rng = np.random.default_rng(["everyone", "a run", "shuffled", "gaps"].index(answers))
    c, k, d = 23, 3, 17
    old = torch.randn(c, k, d)
    filled = {"none": None, "all": np.ones((c, k), dtype=bool),
              "some": rng.random((c, k)) < 0.6}[fill]
    if filled is not None:
        old[torch.from_numpy(~filled)] = 0.0  # cells never asked hold zeros
    asked = {"everyone": np.arange(c), "a run": np.arange(5, 19)}.get(
        answers, np.sort(rng.choice(c, 15, replace=False)))
    who = {"everyone": asked, "a run": asked, "shuffled": rng.permutation(asked),
           "gaps": asked[::2]}[answers]
    rows = torch.randn(len(who), d)
    beta = np.full(len(asked), 0.3) if uniform else rng.choice([1.0, 0.5, 1 / 3, 0.25],
                                                                len(asked))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cfl_gp_profile, "ROW_CHUNK", 4)
        got = update_profile(old, [Probe(1, asked, who, (rows[:6], rows[6:]))], [beta],
                             filled=filled)
    want = old.clone()
    for j, client in enumerate(who):
        b = float(beta[np.searchsorted(asked, client)])
        keep, take = (torch.tensor(x, dtype=torch.float32) for x in (1.0 - b, b))
        want[client, 1] = keep * old[client, 1] + take * rows[j]
    assert torch.equal(got, want)


def test_present_returns_the_reply_itself_when_everyone_answered_in_order():
    reply = EvaluateReply(np.array([3, 5, 9]), np.ones(3), np.ones(3), np.ones(3),
                          np.ones(3, np.int64))
    assert present(reply, [3, 5, 9]) is reply
    fewer = present(reply, [9, 3])
    assert fewer is not reply and fewer.clients.tolist() == [9, 3]


def test_json_ready_of_long_number_lists_matches_the_element_rule():
    ints = [0, 1, 2, 3, 4, 7]
    floats = [0.5, math.nan, 2.0, math.inf]
    assert json_ready(ints) == ints and json_ready(np.arange(4)) == [0, 1, 2, 3]
    assert json_ready(floats) == [0.5, None, 2.0, None]
    assert json_ready(np.array(floats)) == [0.5, None, 2.0, None]
    mixed = [1, 2.5, np.int64(3), True, None]
    assert json_ready(mixed) == [1, 2.5, 3, True, None]


@pytest.mark.parametrize("kind", ["train", "losses", "evaluate"])
def test_a_request_reads_only_the_rows_of_the_clients_it_lists(kind):
    """The work of a request is that of its clients: every other client's data (here NaN,
    which would poison any product it entered) is never read, so a sampled round's cost does
    not grow with the clients that are not sampled."""
    from clusterfl.backends.simulation import SimulationBackend
    from clusterfl.models import ModelFactory, model_config
    from clusterfl.protocol import EvaluateRequest, LocalTraining, LossRequest, TrainRequest

    g = torch.Generator().manual_seed(0)
    sizes = np.full(400, 3)
    off = np.concatenate([[0], np.cumsum(sizes)])
    x = torch.rand(int(off[-1]), 5, generator=g)
    y = torch.randint(0, 3, (int(off[-1]),), generator=g)
    sampled = np.array([7, 100, 101, 399])
    poisoned = x.clone()
    keep = np.zeros(len(x), dtype=bool)
    for c in sampled:
        keep[off[c]:off[c + 1]] = True
    poisoned[torch.from_numpy(~keep)] = float("nan")
    clean = Federation(x, y, off, x.clone(), y.clone(), off, None, 3)
    dirty = Federation(poisoned, y, off, poisoned.clone(), y.clone(), off, None, 3)
    fac = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), (5,), 3)
    models = fac.init_many(2, 1)
    which = np.array([0, 1, 0, 1])
    requests = {
        "train": TrainRequest(sampled, models, which, LocalTraining(lr=0.1, batch_size=2,
                                                                    steps=3), seed=4),
        "losses": LossRequest(sampled, models, split="train"),
        "evaluate": EvaluateRequest(sampled, Predictor.single(models[:1], np.zeros(4, int))),
    }
    got = [SimulationBackend(fed, fac).execute(requests[kind]) for fed in (clean, dirty)]
    fields = {"train": ["params", "loss"], "losses": ["loss"], "evaluate": ["accuracy", "loss"]}
    for name in fields[kind]:
        a, b = (torch.as_tensor(getattr(r, name)) for r in got)
        assert bool(torch.isfinite(b).all()) and torch.equal(a, b)


def test_local_keeps_a_model_for_the_clients_trained_only(tmp_path):
    """Local with 2 of 20 clients a round for 3 rounds: its table holds the start and one row
    per client that trained (not 20), and every client predicts with its own: the start
    until it trains, then its last trained model (the round's replies, checked here)."""
    exp = run(tmp_path, "local", rounds=3,
              algorithm={"name": "local", "per_round": 2})
    alg = exp.algorithm
    state = alg.state
    trained = np.flatnonzero(state.row_of > 0)
    assert 2 <= len(trained) <= 6 and state.models.shape[0] == 1 + len(trained)
    start = exp.factory.init(2)
    pred = alg.predictor()
    model = pred.models[torch.from_numpy(pred.members[:, 0])]  # each client's model
    untrained = np.setdiff1d(np.arange(20), trained)
    torch.testing.assert_close(model[torch.from_numpy(untrained)],
                               start[None].expand(len(untrained), -1), rtol=0, atol=0)
    assert not torch.equal(model[int(trained[0])], start)
    assert len(np.unique(pred.members[trained, 0])) == len(trained)  # one model each
