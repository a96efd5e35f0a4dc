"""Text for language modelling: tokenizer and vocabulary on hand values, the AG News readers
on files the tests write in the official formats, and the `topics` scenario."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import load_source, text_source
from clusterfl.data.text import (
    TextCorpus,
    Vocab,
    read_ag_news,
    read_ag_news_csv,
    synthetic_topics,
    token_warnings,
    tokenize,
    windows,
)
from clusterfl.errors import ConfigError, DataError


def test_tokenize_lowercases_and_undoes_ag_news_escapes() -> None:
    text = "Wall St. Bears Claw Back Into the Black (Reuters)\\Reuters - Short-sellers, " \
           "Wall Street#39;s dwindling band &amp; co."
    assert tokenize(text) == ["wall", "st", "bears", "claw", "back", "into", "the", "black",
                              "reuters", "reuters", "short", "sellers", "wall", "street's",
                              "dwindling", "band", "co"]


def test_vocab_keeps_the_most_frequent_words_ties_alphabetical() -> None:
    texts = ["b a c a", "c a d b", "e"]  # a:3, b:2, c:2, d:1, e:1
    v = Vocab.build(texts, 5)
    assert v.words == ("<unk>", "<eos>", "a", "b", "c")
    assert v.ids("a d c") == [2, 0, 4, 1]  # d unknown, <eos> after the article
    with pytest.raises(ConfigError, match="vocab_size"):
        Vocab.build(texts, 2)


def test_vocab_file_round_trip_and_bad_file(tmp_path: Path) -> None:
    v = Vocab.build(["x y y"], 10)
    v.save(tmp_path / "vocab.txt")
    assert Vocab.load(tmp_path / "vocab.txt") == v
    (tmp_path / "bad.txt").write_text("hello\nworld\n")
    with pytest.raises(DataError, match=r"bad\.txt: not a vocabulary file"):
        Vocab.load(tmp_path / "bad.txt")


def test_a_hand_edited_vocab_file_names_the_line_no_text_can_give(tmp_path: Path) -> None:
    """A vocab.txt edited by hand was read as is: "Hello", "world " (a trailing space) or a
    blank line became entries whose id no tokenized text ever has (a silently dead word,
    and "hello" then <unk>). Now the line is named; blank lines at the end are ignored."""
    path = tmp_path / "vocab.txt"
    for text, line, word in (("<unk>\n<eos>\nHello\nx\n", 3, "'Hello'"),
                             ("<unk>\n<eos>\nx\nworld \n", 4, "'world '"),
                             ("<unk>\n<eos>\nx\n\ny\n", 4, "''")):
        path.write_text(text)
        with pytest.raises(DataError) as info:
            Vocab.load(path)
        assert str(info.value).startswith(f"{path}: line {line} ({word}) is not a word the "
                                          "tokenizer gives")
    path.write_text("<unk>\n<eos>\nx\ndon't\n\n\n")
    assert Vocab.load(path).words == ("<unk>", "<eos>", "x", "don't")


def test_windows_are_inputs_and_their_next_tokens() -> None:
    x, y = windows([1, 2, 3, 4, 5, 6, 7, 8], 3)  # two windows of 3 + 1, the rest dropped
    np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(y, [[2, 3, 4], [5, 6, 7]])
    assert windows([1, 2], 3)[0].shape == (0, 3)


def _write_csv(path: Path, rows: list[tuple[str, str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)


ROWS = [("3", "Oil prices rise", "Crude climbed on Monday."),
        ("2", "Team wins", "A late goal, again."),
        ("1", "Talks resume", "Diplomats met in Geneva."),
        ("4", "New chip", "A faster processor #39;s out.")]


def test_ag_news_csv_reader_and_source(tmp_path: Path) -> None:
    folder = tmp_path / "ag_news"
    folder.mkdir()
    _write_csv(folder / "train.csv", ROWS * 3)
    _write_csv(folder / "test.csv", ROWS)
    corpus = read_ag_news(folder)
    assert corpus.train_topics.tolist() == [2, 1, 0, 3] * 3
    assert corpus.test_texts[0] == "Oil prices rise Crude climbed on Monday."
    src = load_source("ag_news", tmp_path)
    assert src.task == "language_model" and src.text is not None and src.n_classes == 4


def test_ag_news_csv_truncated_or_wrong_fails_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "train.csv"
    _write_csv(good, ROWS)
    cut = tmp_path / "cut.csv"
    cut.write_bytes(good.read_bytes()[:-25])  # ends inside the last quoted field
    with pytest.raises(DataError, match=r"cut\.csv") as info:
        read_ag_news_csv(cut)
    assert "\n" not in str(info.value)
    wrong = tmp_path / "wrong.csv"
    _write_csv(wrong, [("label", "text", "more"), ("7", "a", "b")])
    with pytest.raises(DataError, match=r"wrong\.csv: line 1 is not 'class index 1-4"):
        read_ag_news_csv(wrong)
    with pytest.raises(DataError, match="ag_news: not found"):
        load_source("ag_news", tmp_path / "empty")


def test_ag_news_csv_trailing_blank_lines_are_ignored_and_a_blank_between_rows_named(
        tmp_path: Path) -> None:
    """Before: blank lines at the end (an editor's) read "line 5 is not 'class index 1-4,
    title, description' (0 fields, class ''); truncated or not AG News"."""
    good = tmp_path / "train.csv"
    _write_csv(good, ROWS)
    trailing = tmp_path / "trailing.csv"
    trailing.write_bytes(good.read_bytes() + b"\r\n\n  \n")
    (texts, topics), (want_texts, want_topics) = read_ag_news_csv(trailing), read_ag_news_csv(good)
    assert texts == want_texts and topics.tolist() == want_topics.tolist() == [2, 1, 0, 3]
    between = tmp_path / "between.csv"
    lines = good.read_bytes().splitlines(keepends=True)
    between.write_bytes(b"".join([lines[0], b"\n", *lines[1:]]))
    with pytest.raises(DataError) as info:
        read_ag_news_csv(between)
    assert str(info.value) == (f"{between}: line 2 is blank, between rows; AG News has one row "
                               "per line (blank lines only at the end are ignored): remove it")


def test_ag_news_hugging_face_copy_on_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the hf extra is not installed")
    d = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": [f"{t} {d}" for _, t, d in ROWS],
                                             "label": [int(c) - 1 for c, _, _ in ROWS]}),
        "test": datasets.Dataset.from_dict({"text": ["a b"], "label": [3]}),
    })
    d.save_to_disk(str(tmp_path / "ag_news"))
    corpus = read_ag_news(tmp_path / "ag_news")
    assert corpus.train_topics.tolist() == [2, 1, 0, 3]
    assert corpus.test_texts == ("a b",)


def test_topics_scenario_gives_each_client_one_topic() -> None:
    fed = make_federation("synthetic_topics", "topics",
                          {"n_clients": 8, "seq_len": 10, "vocab_size": 30}, seed=1)
    assert fed.task == "language_model" and fed.n_classes == 30 == len(fed.meta["vocab"])
    assert fed.clusters.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert str(fed.x_train.dtype) == str(fed.y_train.dtype) == "torch.int64"
    np.testing.assert_array_equal(fed.x_train[:, 1:], fed.y_train[:, :-1])  # shifted by one
    again = make_federation("synthetic_topics", "topics",
                            {"n_clients": 8, "seq_len": 10, "vocab_size": 30}, seed=1)
    assert again.meta["vocab"] == fed.meta["vocab"]
    assert bool((again.x_train == fed.x_train).all())
    with pytest.raises(ConfigError, match="source"):
        make_federation("digits", "topics", {})
    with pytest.raises(ConfigError, match="topics"):
        make_federation("synthetic_topics", "iid", {})


def test_a_seq_len_too_long_names_seq_len_and_its_range() -> None:
    """Each client: 8 training articles and 2 test articles of 5 words, each + <eos>: 48
    training and 12 test tokens. A sequence takes seq_len + 1 tokens, so 11 is the longest
    that fits; 12 named `scenario.n_test_per_client` (not set) and no range."""
    src = text_source(synthetic_topics(n_words=10, articles=8, length=5, test_articles=2))
    params = {"n_clients": 4, "vocab_size": 14}
    fed = make_federation(src, "topics", {**params, "seq_len": 11}, seed=0)
    assert np.diff(fed.test_offsets).tolist() == [1] * 4
    for seq_len in (12, 60):
        with pytest.raises(ConfigError) as info:
            make_federation(src, "topics", {**params, "seq_len": seq_len}, seed=0)
        assert info.value.field == "scenario.seq_len" and "\n" not in str(info.value)
        assert info.value.message == (
            f"{seq_len} leaves client 0 without a test sequence (it has 12 test tokens, a "
            "sequence takes seq_len + 1); allowed: 1 to 11 with these articles, or give "
            "each client more test articles (scenario.n_test_per_client) or use fewer "
            "clients")
    more_test = text_source(synthetic_topics(n_words=10, articles=2, length=5,
                                             test_articles=8))  # 12 training tokens now
    with pytest.raises(ConfigError, match=r"^scenario\.seq_len: 12 leaves client 0 without a "
                                          r"train sequence .*allowed: 1 to 11 .*"
                                          r"scenario\.n_train_per_client"):
        make_federation(more_test, "topics", {**params, "seq_len": 12}, seed=0)


def test_topic_articles_come_from_their_topic() -> None:
    """Each client's tokens follow its topic's chain: the most frequent successor of a word
    is that topic's σ_k, the same for every client of the topic."""
    corpus = synthetic_topics(n_words=12, articles=60, length=40, stay=1.0, seed=3)
    assert isinstance(corpus, TextCorpus)
    from clusterfl.data.sources import text_source

    fed = make_federation(text_source(corpus), "topics",
                          {"n_clients": 4, "seq_len": 8, "vocab_size": 20}, seed=0)
    succ = []
    for i in range(4):
        x, y = fed.client_train(i)
        pairs = {(int(a), int(b)) for a, b in zip(x.reshape(-1), y.reshape(-1)) if b > 1 and a > 1}
        succ.append(pairs)
    assert all(len({a for a, _ in s}) == len(s) for s in succ)  # deterministic successors
    assert len({frozenset(s) for s in succ}) == 4  # four different chains


def test_ag_news_is_listed_and_download_says_where_to_get_it(tmp_path: Path) -> None:
    from clusterfl.data import DATASETS, download

    assert DATASETS["ag_news"].files == ()  # no direct official URL: made, not downloaded
    with pytest.raises(DataError, match=r"ag_news: no direct official URL: put train\.csv and "
                                        r"test\.csv .* in .*ag_news/"):
        download("ag_news", tmp_path)


# ---------------------------------------------------------------------- hostile AG News files


def _ag_news(tmp_path: Path, train: list[tuple[str, str, str]],
             test: list[tuple[str, str, str]]) -> Path:
    folder = tmp_path / "ag_news"
    folder.mkdir(exist_ok=True)
    _write_csv(folder / "train.csv", train)
    _write_csv(folder / "test.csv", test)
    return folder


TOPICS = {"n_clients": 4, "seq_len": 3, "vocab_size": 50}


def test_articles_without_words_are_refused_not_scored(tmp_path: Path) -> None:
    """Text the tokenizer drops would train on <eos> alone and score 100 %."""
    folder = _ag_news(tmp_path, ROWS * 3, ROWS)
    fed = make_federation(load_source("ag_news", tmp_path), "topics", TOPICS, seed=0)
    assert len(fed.meta["vocab"]) > 20  # the files as written: words
    cyrillic = [(c, "Нефть дорожает", "Цены выросли в понедельник.") for c, _, _ in ROWS]
    _write_csv(folder / "train.csv", cyrillic * 3)
    with pytest.raises(DataError) as info:
        make_federation(load_source("ag_news", tmp_path), "topics", TOPICS, seed=0)
    text = str(info.value)
    assert "\n" not in text and str(folder / "train.csv") in text
    assert "12 of 12 articles yield no word" in text and "a-z and digits" in text
    _write_csv(folder / "train.csv", ROWS * 3)
    _write_csv(folder / "test.csv", [(c, "", "") for c, _, _ in ROWS])  # empty test articles
    with pytest.raises(DataError, match=r"test\.csv: 4 of 4 articles yield no word .*empty "
                                        r"titles and descriptions"):
        make_federation(load_source("ag_news", tmp_path), "topics", TOPICS, seed=0)


def _wordless_topic_4(tmp_path: Path, train: int, test: int, split: str) -> Federation:
    """The topics federation of AG News files holding ROWS `train` and `test` times, topic
    4's articles of `split` ("train", "test" or "" for none) in Cyrillic, which the tokenizer
    drops: client 3's tokens of that split are then all <eos> (checked)."""
    wordless = [r if r[0] != "4" else ("4", "Новый чип", "") for r in ROWS]
    _ag_news(tmp_path, (wordless if split == "train" else ROWS) * train,
             (wordless if split == "test" else ROWS) * test)
    fed = make_federation(load_source("ag_news", tmp_path), "topics", TOPICS, seed=0)
    if split:
        x, y = fed.client_train(3) if split == "train" else fed.client_test(3)
        assert x.tolist() == y.tolist() == [[1, 1, 1]]
    return fed


def test_a_client_whose_articles_have_no_word_trains_on_eos_only_and_is_named(
        tmp_path: Path) -> None:
    """Topic 4's six training articles in Cyrillic: a quarter of the articles, under the
    refusal's half, so client 3 trained on <eos> alone without a word. Now the run warns,
    naming the client and its training targets; a seq_len that leaves it no sequence is
    refused, saying its articles give no word. The files as written say nothing."""
    assert token_warnings(_wordless_topic_4(tmp_path, 6, 2, ""), "v") == []
    fed = _wordless_topic_4(tmp_path, 6, 2, "train")  # six <eos>: one window of 3 + 1 tokens
    assert token_warnings(fed, "v") == [
        "1 client(s) train on <eos> only: client 3 (3 training targets); their articles yield "
        "no word (the tokenizer keeps words of Latin letters a-z and digits: empty titles and "
        "descriptions, or text in another script?), so their models learn <eos> after <eos>"]
    with pytest.raises(ConfigError) as info:
        make_federation(load_source("ag_news", tmp_path), "topics", {**TOPICS, "seq_len": 6},
                        seed=0)
    assert info.value.message.startswith(
        "6 leaves client 3 without a train sequence (it has 6 train tokens, a sequence takes "
        "seq_len + 1; its articles yield no word, only <eos> (the tokenizer keeps words of "
        "Latin letters a-z and digits)); allowed: 1 to 5")


def test_a_client_whose_test_articles_have_no_word_is_scored_on_eos_only_and_is_named(
        tmp_path: Path) -> None:
    """The same with topic 4's four test articles in Cyrillic (its training articles have
    words): client 3 was scored on <eos> after <eos> alone, its accuracy meaning nothing,
    without a word. Now the run warns, naming the client and its test targets."""
    fed = _wordless_topic_4(tmp_path, 6, 4, "test")  # four <eos>: one window of 3 + 1 tokens
    assert token_warnings(fed, "v") == [
        "1 client(s) are scored on <eos> only: client 3 (3 test targets); their test articles "
        "yield no word (the tokenizer keeps words of Latin letters a-z and digits: empty "
        "titles and descriptions, or text in another script?), so their accuracy counts <eos> "
        "after <eos> only"]


def test_a_non_utf8_ag_news_csv_names_the_line_and_byte(tmp_path: Path) -> None:
    """A Latin-1 "é" on line 3001 read "'utf-8' codec can't decode byte 0xe9 in position
    7744": no line, and a position inside the chunk read, not the file. Now the file, the
    1-based line and the byte of the file (the byte-order mark counted) are named."""
    row = b'"3","Oil prices rise","Crude climbed on Monday."\n'
    bad = tmp_path / "train.csv"
    bad.write_bytes(row * 3000 + b'"3","Caf\xe9 prices","Latin-1."\n' + row)
    with pytest.raises(DataError) as info:
        read_ag_news_csv(bad)
    at = 3000 * len(row) + len(b'"3","Caf') + 1
    assert str(info.value) == (f"{bad}: line 3001 holds a byte that is not UTF-8 (0xe9, byte "
                               f"{at:,} of the file); AG News is UTF-8: a file saved in another "
                               "encoding? save it as UTF-8")
    bad.write_bytes(b"\xef\xbb\xbf" + b'"3","Caf\xe9","x"\n' + row)  # after a BOM, line 1
    with pytest.raises(DataError, match=r"line 1 holds a byte that is not UTF-8 \(0xe9, byte "
                                        r"12 of the file\)"):
        read_ag_news_csv(bad)


def test_missing_test_csv_is_named(tmp_path: Path) -> None:
    folder = _ag_news(tmp_path, ROWS, ROWS)
    (folder / "test.csv").unlink()
    with pytest.raises(DataError) as info:
        read_ag_news(folder)
    assert str(info.value).startswith(f"AG News: {folder / 'test.csv'} not found (train.csv "
                                      "is there)")


def test_bom_and_kaggle_header_are_read_other_header_named(tmp_path: Path) -> None:
    folder = _ag_news(tmp_path, ROWS, ROWS)
    body = (folder / "train.csv").read_bytes()
    (folder / "train.csv").write_bytes(b"\xef\xbb\xbf" + body)  # saved by a spreadsheet
    kaggle = b'"Class Index","Title","Description"\r\n'
    (folder / "test.csv").write_bytes(kaggle + body)
    corpus = read_ag_news(folder)
    assert corpus.train_topics.tolist() == corpus.test_topics.tolist() == [2, 1, 0, 3]
    assert corpus.train_texts == corpus.test_texts
    (folder / "test.csv").write_bytes(b"\xef\xbb\xbf" + kaggle + body)  # both at once
    assert read_ag_news(folder).test_texts == corpus.train_texts
    (folder / "test.csv").write_bytes(b'"label","title","text"\n' + body)
    with pytest.raises(DataError, match=r"test\.csv: line 1 .*class 'label'.*looks like a "
                                        r"header line: remove it"):
        read_ag_news(folder)


def test_test_csv_without_a_topic_names_file_and_topic(tmp_path: Path) -> None:
    folder = _ag_news(tmp_path, ROWS * 3, [r for r in ROWS if r[0] != "2"])
    src = load_source("ag_news", tmp_path)
    with pytest.raises(DataError) as info:
        make_federation(src, "topics", TOPICS, seed=0)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{folder / 'test.csv'}: no test article of topic 1 (Sports)")
    fed = make_federation(src, "topics", {**TOPICS, "n_clients": 3, "topics": [0, 2, 3]}, seed=0)
    assert fed.meta["topics"] == ["World", "Business", "Sci/Tech"]
    with pytest.raises(ConfigError, match=r"n_test_per_client: .* topic 0 \(World\) in "
                                          r".*test\.csv has 1"):
        make_federation(src, "topics", {**TOPICS, "n_test_per_client": 2}, seed=0)


def test_ag_news_train_and_test_files_swapped_are_refused(tmp_path: Path) -> None:
    """train.csv and test.csv swapped (no checksum exists for them) were read as they were:
    7,600 training articles and 120,000 test ones, without a word."""
    folder = tmp_path / "ag_news"
    folder.mkdir()
    row = '"{}","title","words of the description"\n'
    small = "".join(row.format(i % 4 + 1) for i in range(7_600))
    (folder / "train.csv").write_text(small, encoding="utf-8")
    (folder / "test.csv").write_text(row.format(2) * 120_000, encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.csv holds 7,600 articles and .*test\.csv "
                                        r"120,000: the official test and train sets, swapped"):
        read_ag_news(folder)
    (folder / "test.csv").write_text(row.format(2) * 119_999, encoding="utf-8")  # not them
    assert len(read_ag_news(folder).test_texts) == 119_999
