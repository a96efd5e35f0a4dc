"""Text for language modelling: a word-level tokenizer and vocabulary, AG News readers, a
synthetic four-topic corpus, and the federation of scenario `topics`.

- `tokenize`: lowercase words (letters and digits, with an inner apostrophe: "don't"); AG
  News' escapes ("#39;" for an apostrophe, "\\" for a line break, HTML entities) undone.
- `Vocab`: `<unk>` (0), `<eos>` (1), then the most frequent words of the training split
  (ties in alphabetical order), `size` entries at most; `save`/`load` one word per line
  (`vocab.txt` in a run folder).
- AG News (Zhang, Zhao & LeCun 2015, "Character-level convolutional networks for text
  classification"): 120,000 training and 7,600 test articles of four topics (1 World, 2
  Sports, 3 Business, 4 Sci/Tech). `DATA_DIR/ag_news/` holds either the usual CSV files
  `train.csv` and `test.csv` (no header; class index 1–4, title, description) or the
  Hugging Face dataset saved with `save_to_disk` (splits train/test, columns text, label
  0–3), read with the `datasets` package.
- `synthetic_topics`: four topics, each a first-order Markov chain over one shared
  vocabulary of words "w000", "w001", ...: from word a the next word is σ_k(a) with
  probability `stay`, else uniform (σ_k a random permutation per topic, drawn from `seed`).
  No file needed: the tests' and demos' corpus.
- `topic_federation` (scenario `topics`; CFL Fig. 10): client i holds articles of topic
  ⌊i·K/C⌋ (the true cluster), an equal share of that topic's train and test articles. The
  vocabulary is built from the clients' training articles only. Each client's articles,
  each followed by `<eos>`, form one token stream cut into windows of `seq_len` + 1 tokens:
  inputs the first `seq_len` tokens, targets the next ones (`[N, T]` both, int64).
"""

from __future__ import annotations

import csv
import html
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from clusterfl.data.federation import Federation
from clusterfl.data.params import ScenarioParams
from clusterfl.errors import ConfigError, DataError
from clusterfl.files import write_whole

UNK, EOS = "<unk>", "<eos>"
VOCAB_FILE = "vocab.txt"
"""The vocabulary a run of a language model keeps in its folder (one word per line)."""
AG_NEWS_TOPICS = ("World", "Sports", "Business", "Sci/Tech")
AG_NEWS_FILES = ("train.csv", "test.csv")
AG_NEWS_SIZES = {"train": 120_000, "test": 7_600}
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
KEPT = "words of Latin letters a-z and digits"
"""What `tokenize` keeps, for the messages about text it drops (another script, empty text)."""
KAGGLE_HEADER = ("class index", "title", "description")
"""The header line of Kaggle's copy of AG News (the authors' ag_news_csv has none)."""


# ====================================================================== tokens
def tokenize(text: str) -> list[str]:
    """Lowercase words of `text` (AG News' `#39;` and `\\` escapes and HTML entities undone)."""
    text = html.unescape(text.replace("#39;", "'").replace("\\", " ")).lower()
    return _WORD.findall(text)


@dataclass(frozen=True)
class Vocab:
    """Words by id: `<unk>`, `<eos>`, then the training split's most frequent words."""

    words: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.words[:2] != (UNK, EOS):
            raise DataError(f"a vocabulary starts with {UNK} and {EOS}, not {self.words[:2]}")
        object.__setattr__(self, "_ids", {w: i for i, w in enumerate(self.words)})

    def __len__(self) -> int:
        return len(self.words)

    @classmethod
    def build(cls, texts: Iterable[str], size: int) -> Vocab:
        """The `size` − 2 most frequent words of `texts` after `<unk>` and `<eos>` (ties:
        alphabetical)."""
        if size < 3:
            raise ConfigError("vocab_size", f"must be at least 3 (<unk>, <eos> and a word), "
                                            f"got {size}")
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(tokenize(text))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls((UNK, EOS, *(w for w, _ in ranked[: size - 2])))

    def ids(self, text: str) -> list[int]:
        """Token ids of `text` followed by `<eos>` (unknown words: `<unk>`)."""
        get = self._ids.get  # type: ignore[attr-defined]
        return [get(w, 0) for w in tokenize(text)] + [1]

    def save(self, path: str | Path) -> None:
        """Write one word a line, whole or not at all (`files.write_whole`: an OSError
        names the file)."""
        write_whole(Path(path), "\n".join(self.words) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        p = Path(path)
        try:
            words = tuple(p.read_text(encoding="utf-8").splitlines())
        except OSError as exc:
            raise DataError(f"{p}: cannot read the vocabulary ({exc.strerror})") from None
        while words and not words[-1].strip():  # an editor's blank lines at the end
            words = words[:-1]
        if len(words) < 3 or words[:2] != (UNK, EOS) or len(set(words)) != len(words):
            raise DataError(f"{p}: not a vocabulary file (one word per line, {UNK} and {EOS} "
                            "first, no repeats)")
        for n, word in enumerate(words[2:], 3):  # one no text yields: its id never occurs
            if tokenize(word) != [word]:
                raise DataError(f"{p}: line {n} ({word!r}) is not a word the tokenizer gives "
                                f"({KEPT}, lowercase, one word a line): a hand edit? fix or "
                                "remove it")
        return cls(words)


def not_word_ids(fed: Federation) -> tuple[int, ...]:
    """The ids of `<unk>` and `<eos>` (0, 1) in a language model's federation whose
    vocabulary is known (`meta["vocab"]`, scenario `topics`): the targets its word accuracy
    leaves out. () otherwise (a federation of one's own: which ids are no words is unknown)."""
    vocab = list(fed.meta.get("vocab") or [])
    return (0, 1) if fed.task == "language_model" and vocab[:2] == [UNK, EOS] else ()


def token_warnings(fed: Federation, vocabulary: str) -> list[str]:
    """What a language model's training tokens hide, when its vocabulary is known
    (`not_word_ids`): `<unk>` as most of them (`vocabulary` names the setting that made the
    vocabulary, e.g. "scenario.vocab_size = 5"), and clients whose tokens are all `<eos>`
    (articles without a word: they learn `<eos>` after `<eos>`). The run goes on."""
    if not not_word_ids(fed):
        return []
    out = []
    unk, total = int((fed.y_train == 0).sum()), fed.y_train.numel()
    if total and 2 * unk > total:  # <unk> the commonest target: always guessing it wins
        out.append(f"{vocabulary}: {100 * unk / total:.0f} % of the training tokens are {UNK} "
                   f"({unk:,} of {total:,}; words outside the vocabulary): {UNK} is the most "
                   f"frequent target, so the token accuracy (accuracy) then mostly counts "
                   f"{UNK} (a model predicting only {UNK} beats every real word); "
                   f"accuracy_no_oov_no_eos leaves it out; a larger vocabulary lowers the share")
    for split, x, y, offsets, doing, what, then in (
            ("training", fed.x_train, fed.y_train, fed.train_offsets, "train on",
             "articles", f"their models learn {EOS} after {EOS}"),
            ("test", fed.x_test, fed.y_test, fed.test_offsets, "are scored on",
             "test articles", f"their accuracy counts {EOS} after {EOS} only")):
        eos_only = [(i, int(y[a:b].numel())) for i, (a, b) in enumerate(pairwise(offsets))
                    if b > a and bool((x[a:b] == 1).all()) and bool((y[a:b] == 1).all())]
        if eos_only:
            shown = ", ".join(f"client {i} ({n:,} {split} targets)" for i, n in eos_only[:5])
            more = f" and {len(eos_only) - 5} more" if len(eos_only) > 5 else ""
            out.append(f"{len(eos_only)} client(s) {doing} {EOS} only: {shown}{more}; "
                       f"their {what} yield no word (the tokenizer keeps {KEPT}: empty "
                       f"titles and descriptions, or text in another script?), so {then}")
    return out


def windows(ids: Sequence[int], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """A token stream cut into consecutive windows of `seq_len` + 1 tokens (the rest
    dropped): inputs `[N, seq_len]` and their next tokens `[N, seq_len]`."""
    a = np.asarray(ids, dtype=np.int64)
    n = (len(a) - 1) // seq_len if len(a) > 1 else 0
    x = a[: n * seq_len].reshape(n, seq_len)
    y = a[1 : n * seq_len + 1].reshape(n, seq_len)
    return x, y


# ====================================================================== corpora
@dataclass(frozen=True)
class TextCorpus:
    """Articles and their topics (0-based), train and test, and the topics' names."""

    train_texts: tuple[str, ...]
    train_topics: np.ndarray
    test_texts: tuple[str, ...]
    test_topics: np.ndarray
    topic_names: tuple[str, ...]
    name: str
    files: tuple[str, ...] = ()
    """The train and test files read, named in messages about their articles (none for a
    corpus made in memory)."""

    def where(self, split: str) -> str:
        """The file of `split` ("train" or "test"), or the corpus' name and the split."""
        if len(self.files) == 2:
            return self.files[0 if split == "train" else 1]
        return f"{self.name} ({split} articles)"


def read_ag_news(folder: Path) -> TextCorpus:
    """AG News from `folder` (`DATA_DIR/ag_news`): the CSV files, else a `save_to_disk`
    dataset. DataError naming the file for a missing, truncated or malformed one."""
    there = [f for f in AG_NEWS_FILES if (folder / f).is_file()]
    if len(there) == len(AG_NEWS_FILES):
        train = read_ag_news_csv(folder / "train.csv")
        test = read_ag_news_csv(folder / "test.csv")
        files = (str(folder / "train.csv"), str(folder / "test.csv"))
    elif (folder / "dataset_dict.json").is_file():
        train, test = read_ag_news_hf(folder)
        files = (str(folder / "train"), str(folder / "test"))
    elif there:  # one of the two: name the other, not both
        lost = next(f for f in AG_NEWS_FILES if f not in there)
        raise DataError(f"AG News: {folder / lost} not found ({there[0]} is there); put "
                        f"{lost} of ag_news_csv (Zhang et al. 2015) next to it")
    else:
        raise DataError(f"AG News not found in {folder}: put train.csv and test.csv there "
                        "(ag_news_csv of Zhang et al. 2015: class index, title, description) "
                        "or a Hugging Face `save_to_disk` copy of ag_news (dataset_dict.json)")
    sizes = (len(train[0]), len(test[0]))
    if sizes == (AG_NEWS_SIZES["test"], AG_NEWS_SIZES["train"]):  # no checksum would tell
        raise DataError(f"AG News: {files[0]} holds {sizes[0]:,} articles and {files[1]} "
                        f"{sizes[1]:,}: the official test and train sets, swapped; rename "
                        "them (train.csv has 120,000 articles, test.csv 7,600)")
    return TextCorpus(train[0], train[1], test[0], test[1], AG_NEWS_TOPICS, "ag_news", files)


def read_ag_news_csv(path: Path) -> tuple[tuple[str, ...], np.ndarray]:
    """(title + " " + description of every row, topic 0–3) of one AG News CSV file.

    A UTF-8 byte-order mark is read as nothing (`utf-8-sig`: a file saved by a spreadsheet
    program) and Kaggle's header line "Class Index","Title","Description" is skipped; any
    other first line that is not a row is named as a header to remove. Blank lines at the end
    (an editor's or a download's) are ignored; one before a row is named."""
    texts, topics = [], []
    blank = 0  # the first blank line not yet followed by a row
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            for n, row in enumerate(csv.reader(f, strict=True), 1):
                if n == 1 and tuple(c.strip().lower() for c in row) == KAGGLE_HEADER:
                    continue
                if not any(c.strip() for c in row):
                    blank = blank or n
                    continue
                if blank:
                    raise DataError(f"{path}: line {blank} is blank, between rows; AG News has "
                                    "one row per line (blank lines only at the end are "
                                    "ignored): remove it")
                if len(row) != 3 or row[0].strip() not in ("1", "2", "3", "4"):
                    shown = row[0][:20] if row else ""
                    header = n == 1 and len(row) == 3 and not shown.strip().isdigit()
                    hint = ("line 1 looks like a header line: remove it (ag_news_csv has "
                            "none)" if header else "truncated or not AG News")
                    raise DataError(f"{path}: line {n} is not 'class index 1-4, title, "
                                    f"description' ({len(row)} fields, class {shown!r}); "
                                    f"{hint}")
                topics.append(int(row[0]) - 1)
                texts.append(f"{row[1]} {row[2]}")
    except UnicodeDecodeError as exc:  # its position counts from a read chunk, not the file
        where = _bad_utf8(path) or f"a byte that is not UTF-8 ({exc.reason})"
        raise DataError(f"{path}: {where}; AG News is UTF-8: a file saved in another "
                        "encoding? save it as UTF-8") from None
    except csv.Error as exc:
        raise DataError(f"{path}: not a readable AG News CSV file ({exc}); truncated or "
                        "not AG News") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    if not texts:
        raise DataError(f"{path}: no rows; AG News has 'class index, title, description' rows")
    return tuple(texts), np.asarray(topics, dtype=np.int64)


def _bad_utf8(path: Path) -> str | None:
    """Where `path` first stops being UTF-8: "line L holds a byte that is not UTF-8 (0xXX,
    byte B of the file)", L and B 1-based (a byte-order mark at the start is allowed); None
    if it all decodes (or cannot be read)."""
    start = 0
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):  # b"\n" is never part of a multi-byte character
                try:
                    line.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    bom = 3 if n == 1 and line.startswith(b"\xef\xbb\xbf") else 0
                    at = exc.start + bom
                    return (f"line {n} holds a byte that is not UTF-8 (0x{line[at]:02x}, byte "
                            f"{start + at + 1:,} of the file)")
                start += len(line)
    except OSError:
        return None
    return None


def read_ag_news_hf(folder: Path) -> tuple[tuple[tuple[str, ...], np.ndarray], ...]:
    """(train, test) of a Hugging Face `save_to_disk` copy of ag_news (text, label 0–3)."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("data.source", f"{folder} is a Hugging Face dataset: reading it "
                          "needs the `datasets` package (pip install 'clusterfl[hf]'), or "
                          "put AG News' train.csv and test.csv there instead") from None
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DataError(f"{folder}: not a readable save_to_disk dataset ({type(exc).__name__}"
                        f": {first})") from None
    out = []
    for split in ("train", "test"):
        if split not in loaded:
            raise DataError(f"{folder}: the dataset has no {split!r} split (has "
                            f"{', '.join(loaded)})")
        part = loaded[split]
        missing = [c for c in ("text", "label") if c not in part.column_names]
        if missing:
            raise DataError(f"{folder}/{split}: no column {missing[0]!r} (columns "
                            f"{', '.join(part.column_names)}); AG News has text and label")
        labels = np.asarray(part["label"], dtype=np.int64)
        if len(labels) == 0 or labels.min() < 0 or labels.max() > 3:
            raise DataError(f"{folder}/{split}: labels must be the topics 0-3")
        out.append((tuple(str(t) for t in part["text"]), labels))
    return out[0], out[1]


def synthetic_topics(n_topics: int = 4, n_words: int = 40, articles: int = 400,
                     length: int = 30, stay: float = 0.9, seed: int = 0,
                     test_articles: int | None = None) -> TextCorpus:
    """Four (or `n_topics`) topics as Markov chains over one vocabulary (module docstring):
    `articles` training articles per topic (a quarter of that for testing unless
    `test_articles`), each `length` words."""
    rng = np.random.default_rng([seed, 39])
    words = np.array([f"w{i:03d}" for i in range(n_words)])
    perms = [rng.permutation(n_words) for _ in range(n_topics)]
    n_test = max(1, articles // 4) if test_articles is None else test_articles

    def article(k: int) -> str:
        ids = np.empty(length, dtype=np.int64)
        ids[0] = rng.integers(n_words)
        jump = rng.random(length) >= stay
        noise = rng.integers(n_words, size=length)
        for t in range(1, length):
            ids[t] = noise[t] if jump[t] else perms[k][ids[t - 1]]
        return " ".join(words[ids])

    parts = []
    for count in (articles, n_test):
        topics = np.repeat(np.arange(n_topics, dtype=np.int64), count)
        parts.append((tuple(article(int(k)) for k in topics), topics))
    names = tuple(f"topic {k}" for k in range(n_topics))
    return TextCorpus(parts[0][0], parts[0][1], parts[1][0], parts[1][1], names,
                      "synthetic_topics")


# ====================================================================== the federation
class TopicsParams(ScenarioParams):
    """Scenario `topics` (CFL Fig. 10, AG News): each client holds one topic's articles."""

    n_clients: int = Field(20, ge=1, description="number of clients (CFL: 20)")
    seq_len: int = Field(35, ge=1, description="tokens per training sequence (T)")
    vocab_size: int = Field(10_000, ge=3, description="words kept, <unk> and <eos> included")
    vocab_file: str | None = Field(
        None, description="a vocab.txt (a run folder's) to use instead of building one")
    topics: list[int] | None = Field(
        None, description="which topics (0-based) take part (default: all)")
    n_train_per_client: int | None = Field(
        None, ge=1, description="training articles per client (default: an equal share)")
    n_test_per_client: int | None = Field(
        None, ge=1, description="test articles per client (default: an equal share)")


def _shares(pool: np.ndarray, parts: int, each: int | None, field: str,
            rng: np.random.Generator, where: str = "the topic") -> list[np.ndarray]:
    """`parts` disjoint random shares of the article ids `pool` (`each` per part, or all);
    `where` names the topic and its file in the message."""
    pool = rng.permutation(pool)
    size = len(pool) // parts if each is None else each
    if size < 1 or size * parts > len(pool):
        raise ConfigError(field, f"{parts} clients of one topic need {parts} x "
                                 f"{max(size, 1)} articles; {where} has {len(pool)}")
    return [pool[i * size : (i + 1) * size] for i in range(parts)]


def topic_federation(corpus: TextCorpus, p: TopicsParams,
                     rng: np.random.Generator) -> Federation:
    """The federation of scenario `topics` (module docstring)."""
    topics = list(range(len(corpus.topic_names))) if p.topics is None else list(p.topics)
    bad = [k for k in topics if not 0 <= k < len(corpus.topic_names)]
    if bad or not topics or len(set(topics)) != len(topics):
        raise ConfigError("topics", f"{p.topics} must list distinct topics among 0.."
                                    f"{len(corpus.topic_names) - 1} ({corpus.name})")
    if p.n_clients < len(topics):
        raise ConfigError("n_clients", f"{p.n_clients} clients cannot cover {len(topics)} "
                                       "topics; give at least one client per topic")
    clusters = np.arange(p.n_clients) * len(topics) // p.n_clients
    shares: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for split, each in (("train", p.n_train_per_client), ("test", p.n_test_per_client)):
        labels = corpus.train_topics if split == "train" else corpus.test_topics
        for c, k in enumerate(topics):
            parts = int((clusters == c).sum())
            field = f"n_{split}_per_client"
            pool = np.flatnonzero(labels == k)
            topic = f"topic {k} ({corpus.topic_names[k]})"
            if len(pool) == 0:  # a file cut short or filtered: no client of it can be made
                raise DataError(f"{corpus.where(split)}: no {split} article of {topic}; "
                                "a truncated or filtered file? (or leave the topic out with "
                                "scenario.topics)")
            shares[split] += _shares(pool, parts, each, field, rng,
                                     f"{topic} in {corpus.where(split)}")
    train_ids = np.concatenate(shares["train"])
    if p.vocab_file is not None:
        vocab = Vocab.load(p.vocab_file)
    else:
        vocab = Vocab.build((corpus.train_texts[i] for i in train_ids), p.vocab_size)
    streams: dict[str, list[list[int]]] = {}
    for split, texts in (("train", corpus.train_texts), ("test", corpus.test_texts)):
        streams[split], wordless = [], 0  # wordless: articles of nothing but <eos>
        for share in shares[split]:
            articles = [vocab.ids(texts[a]) for a in share]
            wordless += sum(len(ids) == 1 for ids in articles)
            streams[split].append([t for ids in articles for t in ids])
        _check_words(corpus.where(split), wordless, sum(len(share) for share in shares[split]))
    _check_seq_len(streams, p.seq_len)  # after the words: text without words is the cause
    cat: dict[str, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
    for split, client_streams in streams.items():
        xs, ys = zip(*(windows(stream, p.seq_len) for stream in client_streams), strict=True)
        sizes = np.array([len(x) for x in xs], dtype=np.int64)
        cat[split] = (torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)),
                      np.concatenate([[0], np.cumsum(sizes)]))
    meta = {"vocab": list(vocab.words), "topics": [corpus.topic_names[k] for k in topics],
            "clusters": [{"topic": corpus.topic_names[k]} for k in topics]}
    return Federation(*cat["train"], *cat["test"], clusters=clusters, n_classes=len(vocab),
                      task="language_model", name=f"{corpus.name}/topics", meta=meta)


def _check_seq_len(streams: dict[str, list[list[int]]], seq_len: int) -> None:
    """Refuse a `seq_len` that leaves a client without a training or test sequence (one takes
    seq_len + 1 tokens), naming the longest that gives every client one."""
    lengths = [(len(s), split, i) for split, ss in streams.items() for i, s in enumerate(ss)]
    tokens, split, client = min(lengths)
    if tokens < seq_len + 1:
        allowed = (f"allowed: 1 to {tokens - 1} with these articles" if tokens > 1
                   else "no seq_len fits")
        wordless = (f"; its articles yield no word, only {EOS} (the tokenizer keeps {KEPT})"
                    if set(streams[split][client]) == {1} else "")
        raise ConfigError("seq_len", f"{seq_len} leaves client {client} without a {split} "
                          f"sequence (it has {tokens} {split} tokens, a sequence takes seq_len "
                          f"+ 1{wordless}); {allowed}, or give each client more {split} articles "
                          f"(scenario.n_{split}_per_client) or use fewer clients")


def _check_words(where: str, wordless: int, articles: int) -> None:
    """Refuse a split whose articles mostly yield no word: the model would learn to predict
    `<eos>` after `<eos>` and score 100 % (empty titles and descriptions, or text in a script
    the tokenizer drops, e.g. Cyrillic)."""
    if 2 * wordless > articles:
        raise DataError(f"{where}: {wordless} of {articles} articles yield no word (the "
                        f"tokenizer keeps {KEPT}): empty titles and descriptions, or text in "
                        "another script?")


__all__ = [
    "AG_NEWS_TOPICS", "EOS", "UNK", "VOCAB_FILE", "TextCorpus", "TopicsParams", "Vocab",
    "not_word_ids", "read_ag_news",
    "read_ag_news_csv", "read_ag_news_hf", "synthetic_topics", "token_warnings", "tokenize",
    "topic_federation", "windows",
]
