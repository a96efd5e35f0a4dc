"""The language-modelling task: perplexity against hand computation, the simulation engine's
next-token loss against the sequential reference, every method on the task, and CFL finding
the four topics of the synthetic corpus with a lower perplexity than FedAvg."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend, task_extras
from clusterfl.config import load_config
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import text_source
from clusterfl.data.text import Vocab, synthetic_topics
from clusterfl.engine.common import WORD_ACCURACY, WORD_TARGETS, client_metrics
from clusterfl.engine.generic import GenericKernel
from clusterfl.engine.vectorized import client_metrics_batched
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.metrics import summarize
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import (
    EvaluateReply,
    EvaluateRequest,
    LocalTraining,
    LossRequest,
    Predictor,
    TrainRequest,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_perplexity_and_token_accuracy_by_hand() -> None:
    # two sequences of two tokens over a vocabulary of 3; logits chosen so the
    # probabilities are simple: softmax([ln 2, 0, 0]) = (1/2, 1/4, 1/4)
    half = torch.tensor([math.log(2.0), 0.0, 0.0])
    out = torch.stack([torch.stack([half, half.roll(1)]), torch.stack([half, half])])
    y = torch.tensor([[0, 1], [2, 0]])
    # token probabilities 1/2, 1/2, 1/4, 1/2: mean loss (3 ln 2 + ln 4) / 4 = 5/4 ln 2
    m = client_metrics(out, y, "language_model", 3)
    assert m["loss"] == pytest.approx(1.25 * math.log(2.0))
    assert m["perplexity"] == pytest.approx(2 ** 1.25)
    assert m["accuracy"] == pytest.approx(3 / 4)  # argmax right on 3 of 4 tokens
    assert math.isnan(m["macro_f1"])
    # the federation's perplexity: token-weighted over clients (3 and 1 sequences)
    reply = EvaluateReply(np.arange(2), np.zeros(2), np.zeros(2), np.array([1.0, 3.0]),
                          np.array([3, 1]), {"perplexity": np.exp([1.0, 3.0])})
    assert summarize(reply)["perplexity"] == pytest.approx(math.exp((3 * 1.0 + 1 * 3.0) / 4))


def test_accuracy_without_unk_and_eos_targets_by_hand() -> None:
    """Token accuracy counts <unk> (0) and <eos> (1) targets; `accuracy_no_oov_no_eos` (TFF's
    Stack Overflow metric) leaves them out. Vocabulary of 4: <unk>, <eos>, two words."""
    def logits(*best: int) -> torch.Tensor:  # one-hot logits: the argmax at each position
        return torch.nn.functional.one_hot(torch.tensor(best), 4).double() * 3.0
    # client 0: two sequences of 3; client 1: one sequence of 3
    out = torch.stack([logits(0, 2, 1), logits(0, 3, 3), logits(1, 0, 2)])
    y = torch.tensor([[0, 2, 2], [1, 3, 0], [1, 3, 2]])
    # client 0 targets: <unk> right, w2 right, w2 wrong | <eos> wrong, w3 right, <unk> wrong
    #   all tokens 3/6; words (w2, w2, w3) 2/3
    # client 1 targets: <eos> right, w3 wrong, w2 right: all 2/3; words (w3, w2) 1/2
    m0 = client_metrics(out[:2], y[:2], "language_model", 4, (0, 1))
    assert m0["accuracy"] == pytest.approx(3 / 6)
    assert m0[WORD_ACCURACY] == pytest.approx(2 / 3) and m0[WORD_TARGETS] == 3
    assert WORD_ACCURACY not in client_metrics(out[:2], y[:2], "language_model", 4)
    only_specials = client_metrics(out[:1, :1], y[:1, :1], "language_model", 4, (0, 1))
    assert math.isnan(only_specials[WORD_ACCURACY]) and only_specials[WORD_TARGETS] == 0
    sizes = np.array([2, 0, 1])  # a client without test sequences between them
    got = client_metrics_batched(out, y, sizes, "language_model", 4, (0, 1))
    np.testing.assert_allclose(got["accuracy"], [3 / 6, math.nan, 2 / 3])
    np.testing.assert_allclose(got[WORD_ACCURACY], [2 / 3, math.nan, 1 / 2])
    np.testing.assert_array_equal(got[WORD_TARGETS], [3, 0, 2])
    # the federation's: pooled over the clients' word targets, (2 + 1) / (3 + 2)
    reply = EvaluateReply(np.arange(3), got["accuracy"], got["macro_f1"], got["loss"], sizes,
                          task_extras(got, "language_model"))
    assert summarize(reply)[WORD_ACCURACY] == pytest.approx(3 / 5)
    assert summarize(reply)["accuracy"] == pytest.approx((3 / 6 + 2 / 3) / 2)  # unchanged


def test_a_client_whose_model_diverged_makes_the_federations_perplexity_infinite() -> None:
    """The perplexity is exp of the mean loss over all clients' test tokens: one client's
    non-finite loss (its model diverged: NaN or inf) makes it infinite. It was left out, and
    the rest read exp(1) = 2.72. A client without test sequences (or not asked) has none."""
    for bad in (math.nan, math.inf):
        reply = EvaluateReply(np.arange(3), np.zeros(3), np.zeros(3),
                              np.array([1.0, bad, math.nan]), np.array([3, 1, 0]),
                              {"perplexity": np.exp([1.0, bad, math.nan])})
        assert summarize(reply)["perplexity"] == math.inf
    not_asked = EvaluateReply(np.arange(2), np.zeros(2), np.zeros(2), np.array([1.0, math.nan]),
                              np.array([3, 0]), {"perplexity": np.exp([1.0, math.nan])})
    assert summarize(not_asked)["perplexity"] == pytest.approx(math.e)


def _tiny(n_clients: int = 4, cell: str = "fused") -> tuple:
    src = text_source(synthetic_topics(n_words=10, articles=12, length=12, seed=1))
    fed = make_federation(src, "topics", {"n_clients": n_clients, "seq_len": 6,
                                          "vocab_size": 14}, seed=0)
    fac = ModelFactory(model_config({"name": "lstm", "embed": 5, "hidden": 7, "cell": cell}),
                       fed.input_shape, fed.n_outputs)
    return fed, fac


@pytest.mark.parametrize("cell,vmap", [("fused", False), ("written", True)])
def test_engine_next_token_loss_equals_the_reference_loop(cell: str, vmap: bool) -> None:
    """Both LSTM implementations: nn.LSTM through the generic kernel's loop over clients,
    the written-out cells through vmap; each equal to the sequential reference."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        fed, fac = _tiny(cell=cell)
        sim, seq = SimulationBackend(fed, fac, 3), SequentialBackend(fed, fac)
        kernel = sim.engine.kernel
        assert isinstance(kernel, GenericKernel) and kernel.use_vmap is vmap
        models = fac.init_many(2, 0)
        clients = np.arange(fed.n_clients)
        which = np.array([0, 1, 1, 0])
        cam = Predictor(fac.init_many(2, 5), np.tile([0, 1], (len(clients), 1)), "sum_logits")
        for setting, offset in ((LocalTraining(lr=0.5, batch_size=4), None),
                                (LocalTraining(optimizer="adam", lr=0.01, batch_size=3,
                                               epochs=2), None),
                                (LocalTraining(lr=0.5, batch_size=4), cam)):  # CAM's logits
            req = TrainRequest(clients, models, which, setting, 7, offset=offset)
            a, b = sim.train(req), seq.train(req)
            torch.testing.assert_close(a.params, b.params, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(a.loss, b.loss, rtol=1e-10)
        assert kernel.use_vmap is vmap  # vmap traced the written-out cells: no fallback
        la = sim.losses(LossRequest(clients, models, "test"))
        lb = seq.losses(LossRequest(clients, models, "test"))
        np.testing.assert_allclose(la.loss, lb.loss, rtol=1e-10)
        np.testing.assert_allclose(la.accuracy, lb.accuracy, rtol=1e-12)
        pred = Predictor(models, which[:, None])
        ea, eb = (b.evaluate(EvaluateRequest(clients, pred, "test")) for b in (sim, seq))
        np.testing.assert_allclose(ea.loss, eb.loss, rtol=1e-10)
        np.testing.assert_allclose(ea.extras["perplexity"], np.exp(eb.loss), rtol=1e-10)
        np.testing.assert_allclose(ea.extras["perplexity"], eb.extras["perplexity"],
                                   rtol=1e-10)
        np.testing.assert_allclose(ea.accuracy, eb.accuracy, rtol=1e-12)
        np.testing.assert_allclose(ea.extras[WORD_ACCURACY], eb.extras[WORD_ACCURACY],
                                   rtol=1e-12)
        _, y, off = fed.split("test")  # counted: every target that is not <unk> or <eos>
        words = [int((y[off[i] : off[i + 1]] > 1).sum()) for i in clients]
        np.testing.assert_array_equal(ea.extras[WORD_TARGETS], words)
        np.testing.assert_array_equal(eb.extras[WORD_TARGETS], words)
    finally:
        torch.set_default_dtype(old)


def _config(name: str, rounds: int, **algorithm: object) -> dict:
    return {"seed": 0, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
            "data": {"source": "synthetic_topics"},
            "scenario": {"name": "topics", "n_clients": 8, "seq_len": 6, "vocab_size": 14},
            "model": {"name": "lstm", "embed": 5, "hidden": 7},
            "train": {"optimizer": "adam", "lr": 0.01, "momentum": 0.0, "batch_size": 8},
            "algorithm": {"name": name, **algorithm}, "output": {"progress": "off"}}


@pytest.mark.parametrize("name,options", [
    ("fedavg", {}), ("cfl", {}), ("ifca", {"n_clusters": 4}), ("fesem", {"n_clusters": 4}),
    ("flhc", {"warmup_rounds": 1}), ("cfl_gp", {}), ("local", {}),
    ("fedprox", {}), ("fedem", {}), ("fedsoft", {}),
    ("ifca_cam", {"n_clusters": 4, "warmup_rounds": 1}), ("fesem_cam", {"warmup_rounds": 1}),
])
def test_every_method_runs_two_rounds_on_the_language_model_task(
        name: str, options: dict) -> None:
    fed, _ = _tiny(8)
    c = load_config(_config(name, 2, **options))
    h = Experiment(c, federation=fed).run(progress=False)
    m = h.final.metrics
    assert m is not None and m.perplexity is not None and 1.0 < m.perplexity < 1e3
    assert m.accuracy_no_oov_no_eos is not None and 0.0 <= m.accuracy_no_oov_no_eos <= 1.0
    assert len(h.records) == 2


def test_a_run_reports_both_accuracies(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """End to end (`clusterfl run`): a 10-word vocabulary leaves most of the 40 words out,
    so most targets are <unk>; the console table, summary.json, history.jsonl and report.md
    show the token accuracy and the accuracy on the other targets, which is lower. A
    federation whose vocabulary is unknown (no `meta["vocab"]`) has no such number."""
    from clusterfl.cli import main
    from clusterfl.config import dump_toml

    raw = _config("fedavg", 2)
    raw["scenario"]["vocab_size"] = 10
    (tmp_path / "lm.toml").write_text(dump_toml(raw))
    assert main(["run", str(tmp_path / "lm.toml"), "--out", str(tmp_path / "run")]) == 0
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final"]
    acc, words = final["accuracy"], final[WORD_ACCURACY]
    assert 0.0 <= words < acc - 0.2  # <unk> is most targets and the easiest guess
    last = json.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[-1])
    assert last["metrics"][WORD_ACCURACY] == words
    shown = f"{100 * words:.2f}"
    assert "acc. no oov/eos (%)" in capsys.readouterr().out
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| acc. no oov/eos (%) |" in report and f"| {shown} |" in report
    fed = Experiment(load_config(raw)).full_federation
    unknown = dataclasses.replace(fed, meta={})
    h = Experiment(load_config(raw), federation=unknown).run(progress=False)
    assert h.final.metrics is not None and h.final.metrics.accuracy_no_oov_no_eos is None
    assert h.final.metrics.accuracy == pytest.approx(acc)  # the same run otherwise


def test_a_language_model_of_ones_own_token_ids() -> None:
    """`Federation.from_clients(..., task="language_model")` flattened the [N, T] targets
    and made the token ids float: a ValueError traceback ("offsets end at 400 but x has 80
    rows"). Now ids stay int64 [N, T], the vocabulary size is the largest id + 1, an LSTM
    trains on it, and its word accuracy is null (which ids are <unk>, <eos> is unknown)."""
    from clusterfl.data.federation import Federation
    from clusterfl.errors import DataError

    g = torch.Generator().manual_seed(0)
    clients = []
    for _ in range(4):
        x, y = torch.randint(0, 9, (20, 5), generator=g), torch.randint(0, 9, (20, 5), generator=g)
        clients.append((x[:15], y[:15], x[15:], y[15:]))
    clients[0][1][0, 0] = 11  # the largest id
    fed = Federation.from_clients(clients, task="language_model")
    assert fed.x_train.dtype == fed.y_train.dtype == torch.int64
    assert tuple(fed.y_train.shape) == (60, 5) and fed.n_classes == 12
    assert bool((fed.y_test[:5] == clients[0][3]).all())
    raw = _config("fedavg", 1)
    del raw["data"], raw["scenario"]
    m = Experiment(load_config(raw), federation=fed).run(progress=False).final.metrics
    assert m is not None and m.perplexity is not None and m.accuracy_no_oov_no_eos is None
    with pytest.raises(DataError, match=r"client 1 test has inputs \(5, 5\) torch.float32 .*"
                                        r"integer token ids \[N, T\]"):
        Federation.from_clients([*clients[:1], (*clients[1][:2], clients[1][2].float(),
                                                clients[1][3])], task="language_model")
    with pytest.raises(DataError, match="n_classes = 11 but the token id 11 occurs"):
        Federation.from_clients(clients, n_classes=11, task="language_model")


@pytest.mark.parametrize("name", ["flt", "pacfl", "pca_km_hc"])
def test_methods_needing_real_inputs_refuse_in_one_line(name: str) -> None:
    fed, _ = _tiny(8)
    with pytest.raises(ConfigError, match=f"'{name}' clusters by .*language_model") as info:
        Experiment(load_config(_config(name, 2)), federation=fed)
    assert "\n" not in str(info.value)


def test_cfl_finds_the_four_topics_and_beats_fedavg(tmp_path: Path) -> None:
    """The synthetic four-topic corpus, 20 clients (CFL Fig. 10's setting, tiny): CFL with
    its defaults separates the topics (ARI 1) and ends with a lower perplexity than FedAvg;
    the run keeps its vocabulary."""
    src = text_source(synthetic_topics(articles=100))
    raw = _config("cfl", 20)
    raw["scenario"].update(n_clients=20, seq_len=10, vocab_size=50)
    raw["model"].update(embed=16, hidden=24)
    raw["train"].update(batch_size=16)
    params = {k: v for k, v in raw["scenario"].items() if k != "name"}
    fed = make_federation(src, "topics", params, seed=0)
    cfl = Experiment(load_config(raw), tmp_path / "cfl", federation=fed).run(progress=False)
    raw["algorithm"] = {"name": "fedavg"}
    fedavg = Experiment(load_config(raw), federation=fed).run(progress=False)
    assert cfl.final.ari == 1.0 and cfl.final.n_clusters == 4
    p_cfl = cfl.final.metrics.perplexity
    p_avg = fedavg.final.metrics.perplexity
    assert p_cfl is not None and p_avg is not None and p_cfl < 0.5 * p_avg
    assert Vocab.load(tmp_path / "cfl" / "vocab.txt").words == tuple(fed.meta["vocab"])
    report = (tmp_path / "cfl" / "report.md").read_text()
    assert "perplexity ↓" in report


def test_placement_uses_the_runs_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    """`clusterfl place` rebuilds the federation from the run's config: the same vocabulary
    (deterministic) places; a vocabulary that no longer matches the run's `vocab.txt` is
    refused in one line naming the file and the setting that reuses it."""
    from clusterfl.cli import main

    raw = _config("ifca", 2, n_clusters=4)
    raw["checkpoint_every"] = 2
    run = tmp_path / "run"
    Experiment(load_config(raw), run).run(progress=False)
    assert main(["place", str(run), "--clients", "0-1"]) == 0
    vocab = Vocab.load(run / "vocab.txt")
    Vocab((*vocab.words[:2], *reversed(vocab.words[2:]))).save(run / "vocab.txt")
    capsys.readouterr()
    assert main(["place", str(run), "--clients", "0-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vocab.txt: the run's vocabulary differs" in err
    assert "scenario.vocab_file" in err


def test_sweep_reports_rank_language_models_by_perplexity_lower_first() -> None:
    from clusterfl.sweep_report import primary

    rows = [{"status": "done", "accuracy": 0.8, "perplexity": 3.7},
            {"status": "done", "accuracy": 0.4, "perplexity": 13.1}]
    assert primary(rows) == ("perplexity", "perplexity", 1.0, 2, False)  # lower is better
    assert primary([{"status": "done", "accuracy": 0.8}])[0] == "accuracy"


def test_vocab_size_under_a_vocab_file_warns_that_it_does_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`scenario.vocab_file` gives the vocabulary: a `vocab_size` below its size was ignored
    without a word (the run used every word of the file). It warns once; a `vocab_size` the
    file fits in (as a run's own config.toml has it) says nothing."""
    raw = _config("fedavg", 1)
    built = Experiment(load_config(raw)).full_federation.meta["vocab"]
    Vocab(tuple(built)).save(tmp_path / "vocab.txt")
    raw["scenario"]["vocab_file"] = str(tmp_path / "vocab.txt")
    for size, warned in ((len(built), False), (5, True)):
        raw["scenario"]["vocab_size"] = size
        capsys.readouterr()
        h = Experiment(load_config(raw)).run(progress=False)
        err = capsys.readouterr().err
        assert err.count("scenario.vocab_size = 5 does nothing") == int(warned), err
        assert any("vocab_size" in w for w in h.summary.warnings or []) == warned


def test_a_vocab_size_above_the_corpus_words_warns_that_it_does_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The synthetic corpus has 40 distinct words: a `vocab_size` set above 42 (40 + <unk>
    and <eos>) kept them all without a word (10**9 ran as 42). It warns once with the count;
    42 (the cap binds exactly) and the default (not the user's number) say nothing."""
    raw = _config("fedavg", 1)
    for size, warned in ((42, False), (43, True), (10**9, True), (None, False)):
        if size is None:
            del raw["scenario"]["vocab_size"]  # the default, 10,000
        else:
            raw["scenario"]["vocab_size"] = size
        capsys.readouterr()
        e = Experiment(load_config(raw))
        assert len(e.full_federation.meta["vocab"]) == 42
        h = e.run(progress=False)
        err = capsys.readouterr().err
        line = (f"scenario.vocab_size = {size} does nothing here: the clients' training "
                "articles have only 40 distinct words, all kept (42 entries with <unk> and "
                "<eos>)")
        assert err.count(line) == int(warned), err
        assert any("vocab_size" in w for w in h.summary.warnings or []) == warned


def test_a_resumed_runs_hand_edited_vocab_file_is_said_and_written_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A resumed run rebuilds its vocabulary from config.toml and wrote it over a `vocab.txt`
    edited by hand without a word (the edit seemingly taken, silently lost). Now it warns,
    naming the file, and writes the data's vocabulary again; an unedited file says nothing."""
    raw = _config("fedavg", 1)
    raw["checkpoint_every"] = 1
    run = tmp_path / "run"
    Experiment(load_config(raw), run).run(progress=False)
    words = Vocab.load(run / "vocab.txt").words
    for rounds, edited in ((2, False), (3, True)):
        if edited:
            Vocab(words[:-1]).save(run / "vocab.txt")  # the last word removed by hand
        raw["rounds"] = rounds
        capsys.readouterr()
        h = Experiment(load_config(raw), run).run(resume=True, progress=False)
        err = capsys.readouterr().err
        said = f"{run / 'vocab.txt'} is not the vocabulary the run's data gives (edited by hand?)"
        assert err.count(said) == int(edited), err
        assert any(said in w for w in h.summary.warnings or []) == edited
        assert Vocab.load(run / "vocab.txt").words == words


def test_a_tiny_vocab_size_that_makes_most_tokens_unk_warns(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`vocab_size = 3` keeps one word of the synthetic corpus' 40: 94 % of the tokens are
    <unk> and FedAvg's token accuracy was 94 % after one round, without a word. Now a run
    warns once when <unk> is more than half of the training tokens (counted here by hand),
    naming the setting and the share; 42 (every word kept) and the docs' demo (vocab_size =
    50, 20 clients) say nothing. Above one half <unk> is the commonest target."""
    from clusterfl.data.text import token_warnings

    raw = _config("fedavg", 1)
    raw["scenario"]["vocab_size"] = 3
    e = Experiment(load_config(raw))
    y = e.full_federation.y_train
    unk, total = int((y == 0).sum()), y.numel()
    assert unk / total > 0.9
    capsys.readouterr()
    h = e.run(progress=False)
    line = (f"scenario.vocab_size = 3: {round(100 * unk / total)} % of the training tokens are "
            f"<unk> ({unk:,} of {total:,}; words outside the vocabulary): <unk> is the most "
            "frequent target, so the token accuracy (accuracy) then mostly counts <unk>")
    assert capsys.readouterr().err.count(line) == 1
    assert [w[: len(line)] for w in h.summary.warnings or [] if "<unk>" in w] == [line]
    # 14 (the tests' federation): 67 %; 20: 52.2 %, 21: 49.8 % (either side of one half)
    for scenario, warned in (({"vocab_size": 14}, True), ({"vocab_size": 20}, True),
                             ({"vocab_size": 21}, False), ({"vocab_size": 42}, False),
                             ({"n_clients": 20, "seq_len": 10, "vocab_size": 50}, False)):
        raw["scenario"].update(scenario)
        fed = Experiment(load_config(raw)).full_federation
        share = float((fed.y_train == 0).float().mean())
        assert (share > 0.5) == warned, (scenario, share)
        assert sum("<unk>" in w for w in token_warnings(fed, "v")) == int(warned), scenario
    assert share == 0.0  # the demo: every word in the vocabulary
