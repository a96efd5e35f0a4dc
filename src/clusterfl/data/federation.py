"""The `Federation`: every client's private train and test data, plus the hidden truth.

Data of all clients is stored as one tensor per split with per-client index ranges
(`train_offsets[i]:train_offsets[i+1]` are client i's rows), so that an engine can gather
the minibatches of many clients with one indexing operation.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from clusterfl.config_util import client_ids, is_whole
from clusterfl.data.codes import decode_codes
from clusterfl.errors import ConfigError, DataError

Task = Literal["classification", "regression", "language_model"]
TASKS: tuple[str, ...] = ("classification", "regression", "language_model")


@dataclass
class Federation:
    """Per-client train/test data of a simulated federation.

    Attributes:
        x_train: all clients' training inputs, `[N_train, *input_shape]`, float32; or,
            with `x_scale` set, their uint8 codes (`inputs` and `client_train` decode them).
        y_train: training targets, `[N_train]`; int64 class ids (classification) or float32.
            A language model ("language_model", `clusterfl.data.text`) has int64 token ids
            `[N, T]` as inputs and the next tokens `[N, T]` as targets.
        train_offsets: `[n_clients + 1]` int64; client i owns rows `train_offsets[i]:[i+1]`.
        x_test, y_test, test_offsets: the same for each client's own test data.
        clusters: `[n_clients]` true cluster id of each client, or None when the scenario
            defines no groups.
        n_classes: number of classes (1 for regression: one output; the vocabulary size for
            a language model).
        task: "classification", "regression" or "language_model".
        name: a readable description, e.g. "digits/rotation".
        meta: scenario details (angles per cluster, label maps, class sets, ...), JSON-able.
        x_scale: None (inputs stored as float32), or the scale of inputs stored as the uint8
            codes they were read from: input = code / x_scale in float32, bit for bit
            (`clusterfl.data.codes`; a quarter of the memory). The scenarios store 8-bit
            images so whenever that is exact (not after a non-right-angle rotation or
            standardization).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    train_offsets: np.ndarray
    x_test: torch.Tensor
    y_test: torch.Tensor
    test_offsets: np.ndarray
    clusters: np.ndarray | None
    n_classes: int
    task: Task = "classification"
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    x_scale: float | None = None
    mapped: bool = False
    """The arrays are memory-mapped from files (`[data] source = "shards"`): `digests` then
    reads each client's first and last rows only, so that nothing else is read before a
    round asks for it."""

    def __post_init__(self) -> None:
        self.train_offsets = np.asarray(self.train_offsets, dtype=np.int64)
        self.test_offsets = np.asarray(self.test_offsets, dtype=np.int64)
        if self.clusters is not None:
            self.clusters = np.asarray(self.clusters, dtype=np.int64)
        self.validate()

    @classmethod
    def from_clients(cls, clients: Any, clusters: Any = None, n_classes: int | None = None,
                     task: Task = "classification", name: str = "own data") -> Federation:
        """A federation of one's own clients.

        `clients`: one entry per client, each `(x_train, y_train, x_test, y_test)` (numpy
        arrays or tensors), `(train, test)` or `{"train": ..., "test": ...}` where each part
        is an `(x, y)` pair or a torch `Dataset` of `(input, target)` items. `clusters`:
        the true cluster id of each client (optional; for ARI). `n_classes`: default the
        largest label + 1. The federation records `{"source": "python", "name": name}` as its
        `[data]` table, which a run given it writes to its `config.toml`.
        """
        return _from_clients(clients, clusters, n_classes, task, name)

    # ------------------------------------------------------------------ shape facts
    @property
    def n_clients(self) -> int:
        return len(self.train_offsets) - 1

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def n_outputs(self) -> int:
        """Width of a model's output layer for this federation."""
        return 1 if self.task == "regression" else self.n_classes

    @property
    def train_sizes(self) -> np.ndarray:
        return np.diff(self.train_offsets)

    @property
    def known_train_sizes(self) -> np.ndarray:
        """The training-set sizes known before round 1: all of them (a Flower strategy's
        server learns its clients' from their replies: `ServerFederation`)."""
        return self.train_sizes

    @property
    def test_sizes(self) -> np.ndarray:
        return np.diff(self.test_offsets)

    @property
    def n_true_clusters(self) -> int | None:
        return None if self.clusters is None else len(np.unique(self.clusters))

    # ------------------------------------------------------------------ access
    def client_train(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self._rows(self.train_offsets, i)
        return self.decode(self.x_train[a:b]), self.y_train[a:b]

    def client_test(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self._rows(self.test_offsets, i)
        return self.decode(self.x_test[a:b]), self.y_test[a:b]

    def _rows(self, offsets: np.ndarray, i: Any) -> tuple[int, int]:
        """Client `i`'s rows; a client that does not exist is one line naming `i` (-1 gave
        an empty client, an id past the last numpy's IndexError)."""
        n = self.n_clients
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n:
            raise ConfigError("i", f"{i!r}: give a client id, a whole number in 0..{n - 1}")
        return int(offsets[i]), int(offsets[i + 1])

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Stored inputs (rows of `x_train` / `x_test`) as float32 inputs (a no-op without
        `x_scale`)."""
        return x if self.x_scale is None else decode_codes(x, torch.float32, self.x_scale)

    def stored(self, name: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """`(x, y, offsets)` of split "train" or "test" as stored (uint8 codes with
        `x_scale`); an engine that decodes per batch reads these."""
        if name == "train":
            return self.x_train, self.y_train, self.train_offsets
        if name == "test":
            return self.x_test, self.y_test, self.test_offsets
        raise ValueError(f"split must be 'train' or 'test', got {name!r}")

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """`(x, y, offsets)` of split "train" or "test", inputs as float32 (decoded whole
        when stored as codes: `stored` reads them without the copy)."""
        x, y, off = self.stored(name)
        return self.decode(x), y, off

    def to(self, device: torch.device | str) -> Federation:
        """This federation with its inputs and targets on `device` (offsets, truth and meta
        shared); itself when they are there already. The inputs keep their dtype."""
        device = torch.device(device)
        if self.x_train.device == device and self.x_test.device == device:
            return self
        return dataclasses.replace(self, x_train=self.x_train.to(device),
                                   y_train=self.y_train.to(device),
                                   x_test=self.x_test.to(device), y_test=self.y_test.to(device))

    def subset(self, clients: np.ndarray | list[int]) -> Federation:
        """A federation made of the given clients only (in that order; a client given twice
        is two clients of the same data, as a benchmark tiles a federation). Inputs that hold
        no data (a zero-stride view, as the Flower server's sizes-only federation) stay so."""
        # 0.5 was read as client 0
        idx = client_ids(clients, self.n_clients, "clients", repeats=True)
        parts = {}
        for split in ("train", "test"):
            x, y, off = self.stored(split)
            rows = [np.arange(off[i], off[i + 1]) for i in idx]
            sizes = np.array([len(r) for r in rows], dtype=np.int64)
            cat = torch.from_numpy(np.concatenate(rows) if rows else np.zeros(0, np.int64))
            n = int(sizes.sum())
            xs = (x[:1].expand(n, *x.shape[1:]) if len(x) and x.stride(0) == 0
                  else x[cat])
            ys = y[:1].expand(n) if len(y) and y.stride(0) == 0 else y[cat]
            parts[split] = (xs, ys, np.concatenate([[0], np.cumsum(sizes)]))
        return Federation(
            *parts["train"], *parts["test"],
            clusters=None if self.clusters is None else self.clusters[idx],
            n_classes=self.n_classes, task=self.task, name=self.name, meta=dict(self.meta),
            x_scale=self.x_scale,
        )

    def digests(self) -> np.ndarray:
        """`[n_clients, 2]` uint64: a 64-bit BLAKE2 digest of each client's training rows
        (inputs as stored, targets, its true cluster) and of its test rows, over the arrays'
        dtypes, row shapes and `x_scale`. A checkpoint keeps them, and `--resume` names the
        clients whose data changed since (`checkpoint.Checkpoints`). Mapped arrays: the first
        and last rows of each client and its row count."""
        out = np.zeros((self.n_clients, 2), dtype=np.uint64)
        for col, split in enumerate(("train", "test")):
            x, y, off = self.stored(split)
            head = repr((str(x.dtype), tuple(x.shape[1:]), str(y.dtype), tuple(y.shape[1:]),
                         self.x_scale, self.task)).encode()
            xs, ys = (t.detach().cpu().numpy() for t in (x, y))
            for i in range(self.n_clients):
                a, b = int(off[i]), int(off[i + 1])
                h = hashlib.blake2b(head, digest_size=8)
                h.update(np.int64(b - a).tobytes())
                if self.clusters is not None:
                    h.update(np.int64(self.clusters[i]).tobytes())
                for arr in (xs, ys):
                    if b == a:
                        continue
                    if self.mapped or arr.strides[0] == 0:  # ends only; a blank, one row
                        rows = [a] if arr.strides[0] == 0 else [a, b - 1]
                        for r in rows:
                            h.update(np.ascontiguousarray(arr[r]).tobytes())
                    else:
                        h.update(np.ascontiguousarray(arr[a:b]).data)
                out[i, col] = int.from_bytes(h.digest(), "little")
        return out

    def validate(self) -> None:
        """Check internal consistency; raises ValueError naming what is wrong (DataError for
        a classification of one class, which data can give)."""
        for split in ("train", "test"):
            x, y, off = self.stored(split)
            if off.ndim != 1 or len(off) < 2 or off[0] != 0:
                raise ValueError(f"{split}_offsets must start at 0 and list n_clients+1 bounds")
            if np.any(np.diff(off) < 0):
                raise ValueError(f"{split}_offsets must be non-decreasing")
            if off[-1] != len(x) or len(x) != len(y):
                raise ValueError(
                    f"{split}: offsets end at {off[-1]} but x has {len(x)} rows, y {len(y)}"
                )
        if len(self.test_offsets) != len(self.train_offsets):
            raise ValueError("train and test offsets must describe the same number of clients")
        if self.clusters is not None and len(self.clusters) != self.n_clients:
            raise ValueError(f"clusters has {len(self.clusters)} ids for {self.n_clients} clients")
        if self.x_scale is not None and (self.x_train.dtype != torch.uint8
                                         or self.x_test.dtype != torch.uint8):
            raise ValueError("inputs with x_scale must be uint8 codes")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.task == "classification" and self.n_classes < 2:
            raise DataError(f"{self.name or 'data'}: n_classes = {self.n_classes}, but a "
                            "classification needs at least 2 classes (with one, every "
                            "prediction is right and nothing is learned); check the labels, "
                            "or give n_classes")

    def describe(self) -> str:
        sizes = self.train_sizes
        k = self.n_true_clusters
        return (
            f"{self.name}: {self.n_clients} clients, train samples per client "
            f"{sizes.min()}–{sizes.max()} (total {sizes.sum()}), "
            f"test total {self.test_sizes.sum()}, "
            f"{'?' if k is None else k} true clusters, input {self.input_shape}, "
            + {"regression": "regression (one real-valued target)",
               "language_model": f"language model (vocabulary of {self.n_classes} tokens)"}
            .get(self.task, f"{self.n_classes} classes")
        )


def holdout_split(clusters: np.ndarray | None, n_clients: int, fraction: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(trained ids, held-out ids), both sorted: round(fraction · n) clients held out,
    stratified by true cluster (no clusters: one group) and drawn from `seed`.

    Each cluster gives its proportional share (largest remainders, ties broken at random),
    at least one client when as many clients are held out as there are clusters and it has
    two or more, and never its last one. Raises ConfigError (`scenario.holdout`) when the
    fraction holds out no client, or so many that some cluster would keep none.
    """
    from clusterfl.errors import ConfigError

    labels = np.zeros(n_clients, np.int64) if clusters is None else np.asarray(clusters)
    n_hold = round(fraction * n_clients)
    if n_hold < 1:
        raise ConfigError("scenario.holdout", f"{fraction:g} of {n_clients} clients holds out "
                          f"none; allowed: 0 (off) or at least {1 / n_clients:.3g} (one client)")
    groups, sizes = np.unique(labels, return_counts=True)
    if n_hold > n_clients - len(groups):
        raise ConfigError("scenario.holdout", f"{fraction:g} holds out {n_hold} of "
                          f"{n_clients} clients, leaving a true cluster with no trained "
                          f"client ({len(groups)} clusters); allowed: at most "
                          f"{(n_clients - len(groups)) / n_clients:.3g}")
    rng = np.random.default_rng([seed, 5171])
    want = n_hold * sizes / n_clients
    lo = ((sizes >= 2) & (n_hold >= len(groups))).astype(np.int64)
    take = np.minimum(np.maximum(np.floor(want).astype(np.int64), lo), sizes - 1)
    tiebreak = rng.random(len(groups))
    while take.sum() > n_hold:  # the floors plus the minimum of one overshoot
        room = np.where(take > lo, take - want, -np.inf)
        take[int(np.lexsort((tiebreak, -room))[0])] -= 1
    while take.sum() < n_hold:
        room = np.where(take < sizes - 1, want - take, -np.inf)
        take[int(np.lexsort((tiebreak, -room))[0])] += 1
    held = [rng.permutation(np.flatnonzero(labels == g))[:t] for g, t in
            zip(groups, take, strict=True)]
    hold = np.sort(np.concatenate(held)).astype(np.int64)
    return np.setdiff1d(np.arange(n_clients), hold).astype(np.int64), hold

# ---------------------------------------------------------------------- own clients
_NOT_REAL = {
    "c": "complex numbers: store the real and imaginary parts as two features, e.g. "
         "np.stack([x.real, x.imag], axis=-1), or the magnitude np.abs(x)",
    "U": "text: map it to numbers first", "S": "text: map it to numbers first",
    "O": "objects: map them to numbers first",
    "M": "dates: convert them to numbers (e.g. seconds) first",
    "m": "durations: convert them to numbers (e.g. seconds) first",
}
"""What to do with an array of a dtype kind that is not real numbers (numpy's `dtype.kind`)."""


def check_numbers(a: np.ndarray, what: str, want: str = "real numbers") -> None:
    """DataError naming `what` when `a` holds no real numbers a model computes on: complex
    numbers (float32 would drop the imaginary part), text, dates, or unsigned integers beyond
    int64 (which would wrap to negative numbers)."""
    if a.dtype.kind not in "biuf":
        hint = _NOT_REAL.get(a.dtype.kind, "convert them to numbers first")
        raise DataError(f"{what} holds {a.dtype} values; it must hold {want} ({hint})")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise DataError(f"{what} holds the value {int(a.max())}, beyond int64; it must hold "
                        f"{want}")


def _tensor(a: Any, what: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        if a.is_complex():
            raise DataError(f"{what} holds {a.dtype} values; it must hold real numbers "
                            f"({_NOT_REAL['c']})")
        return a.detach().cpu()
    try:
        array = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: not an array ({exc})") from None
    check_numbers(array, what)
    return torch.from_numpy(array)


def _from_dataset(ds: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All `(x, y)` items of a torch `Dataset` (anything with `__len__` and `__getitem__`)."""
    if len(ds) == 0:
        return torch.zeros(0), torch.zeros(0, dtype=torch.int64)
    xs, ys = [], []
    for i in range(len(ds)):
        item = ds[i]
        if not isinstance(item, tuple | list) or len(item) != 2:
            items = f" of {len(item)} items" if isinstance(item, tuple | list) else ""
            raise DataError(f"{what}[{i}] is a {type(item).__name__}{items}; a Dataset must "
                            "give (input, target) pairs")
        xs.append(_tensor(item[0], what))
        if xs[-1].shape != xs[0].shape:
            raise DataError(f"{what}[{i}] has an input of shape {tuple(xs[-1].shape)}, "
                            f"{what}[0] one of {tuple(xs[0].shape)}; every sample must have "
                            "one shape (resize or pad them in the Dataset)")
        target = _tensor(item[1], what)
        if target.numel() != 1:
            raise DataError(f"{what}[{i}] has a target of shape {tuple(target.shape)}; give "
                            "one class id or value per sample")
        ys.append(target.reshape(()))
    return torch.stack(xs), torch.stack(ys)


def _pair(part: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`(x, y)` from a pair of arrays or from a torch Dataset."""
    if isinstance(part, tuple | list) and len(part) == 2:
        return _tensor(part[0], f"{what} inputs"), _tensor(part[1], f"{what} targets")
    if hasattr(part, "__getitem__") and hasattr(part, "__len__"):
        return _from_dataset(part, what)
    raise DataError(f"{what}: give (inputs, targets) arrays or a torch Dataset, got "
                    f"{type(part).__name__}")


def _client_parts(client: Any, i: int) -> tuple[Any, Any]:
    if isinstance(client, Mapping):
        missing = [k for k in ("train", "test") if k not in client]
        if missing:
            raise DataError(f"client {i}: missing {missing}; give {{'train': ..., 'test': ...}}")
        return client["train"], client["test"]
    if isinstance(client, tuple | list) and len(client) == 4:
        return (client[0], client[1]), (client[2], client[3])
    if isinstance(client, tuple | list) and len(client) == 2:
        return client[0], client[1]
    raise DataError(f"client {i}: give (x_train, y_train, x_test, y_test), (train, test) or "
                    f"{{'train': ..., 'test': ...}}, got {type(client).__name__}")


def _from_clients(clients: Sequence[Any], clusters: Sequence[int] | np.ndarray | None = None,
                  n_classes: int | None = None, task: Task = "classification",
                  name: str = "own data") -> Federation:
    """A federation of the given clients (see `Federation.from_clients`)."""
    if not isinstance(clients, Sequence) or isinstance(clients, str | bytes):
        raise DataError(f"from_clients: clients is a {type(clients).__name__}; give a list "
                        "with one entry per client (list(...) of a generator, "
                        "list(d.values()) of a dict)")
    if len(clients) == 0:
        raise DataError("from_clients: no clients given")
    if task not in ("classification", "regression", "language_model"):
        raise DataError(f"from_clients: task = {task!r}; allowed: 'classification', "
                        "'regression', 'language_model'")
    if not isinstance(name, str) or not name:
        raise DataError(f"from_clients: name = {name!r}; give the federation's name as text")
    if n_classes is not None and not is_whole(n_classes):
        raise DataError(f"from_clients: n_classes = {n_classes!r}; give a whole number (or "
                        "leave it out: the largest label + 1)")
    splits: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"train": [], "test": []}
    for i, client in enumerate(clients):
        train, test = _client_parts(client, i)
        splits["train"].append(_pair(train, f"client {i} train"))
        splits["test"].append(_pair(test, f"client {i} test"))
    return assemble_clients(splits, clusters, n_classes, task, name,
                            {"source": "python", "name": name})


def _first_not_finite(t: torch.Tensor) -> int | None:
    """The first sample (row) of `t` holding NaN or infinity, or None."""
    if not t.is_floating_point() or not len(t) or bool(torch.isfinite(t).all()):
        return None
    return int((~torch.isfinite(t.reshape(len(t), -1))).any(1).nonzero()[0])


def check_client(x: torch.Tensor, y: torch.Tensor, task: Task, what: str) -> None:
    """DataError naming the client: inputs or targets with NaN or infinity (every update of
    the client would be rejected), or class labels that are not whole numbers (never
    truncated)."""
    first = _first_not_finite(x)
    if first is not None:
        raise DataError(f"{what}: sample {first} holds NaN or infinite inputs; clean or drop "
                        "such samples first (no model trains on them)")
    first = _first_not_finite(y)
    if first is not None:
        raise DataError(f"{what}: sample {first} has a NaN or infinite target; clean or drop "
                        "such samples first (its loss would be NaN)")
    if task == "classification" and y.is_floating_point() and not bool((y == y.round()).all()):
        raise DataError(f"{what}: labels like {float(y[y != y.round()][0])!r} are not class "
                        "ids 0, 1, ...; for real-valued targets use task = 'regression'")
    if task == "classification" and y.is_floating_point() and len(y) and \
            float(y.abs().max()) >= 2.0**62:  # int64 would wrap it to a nonsense id
        big = float(y.reshape(-1)[int(y.abs().reshape(-1).argmax())])
        raise DataError(f"{what}: the label {big:g} is not a class id 0, 1, ... (far beyond "
                        "any number of classes); relabel it first")


def _cluster_ids(clusters: Any, name: str) -> np.ndarray:
    """The true cluster ids as integers; ids that are not whole numbers are refused (never
    truncated: the ARI would compare against other groups)."""
    ids = np.asarray(clusters)
    if ids.dtype.kind in "iub":
        return ids.astype(np.int64)
    bad = None
    if ids.dtype.kind == "f":
        wrong = ~np.isfinite(ids) | (ids != np.round(ids))
        bad = ids[wrong][0] if wrong.any() else None
    else:
        bad = ids.reshape(-1)[0] if ids.size else None
    if bad is not None:
        shown = bad.item() if isinstance(bad, np.generic) else bad
        raise DataError(f"{name}: the true cluster id {shown!r} is not a whole number; ids are "
                        "0, 1, ... (leave clusters out when they are not known)")
    return ids.astype(np.int64)


def _token_split(parts: list[tuple[torch.Tensor, torch.Tensor]], name: str,
                 split: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """A language model's split: each client's integer token ids `[N, T]` as inputs and the
    next tokens `[N, T]` as targets (int64 both); DataError naming the client otherwise."""
    for i, (x, y) in enumerate(parts):
        bad = next((t for t in (x, y) if t.is_floating_point() or t.dim() != 2), None)
        if bad is not None or x.shape != y.shape:
            raise DataError(f"{name}: client {i} {split} has inputs {tuple(x.shape)} "
                            f"{x.dtype} and targets {tuple(y.shape)} {y.dtype}; a language "
                            "model takes integer token ids [N, T] as inputs and the next "
                            "tokens [N, T] as targets")
        if (x.numel() and int(x.min()) < 0) or (y.numel() and int(y.min()) < 0):
            raise DataError(f"{name}: client {i} {split} has a negative token id; ids are "
                            "0, 1, ... (the vocabulary's)")
    sizes = np.array([len(x) for x, _ in parts], dtype=np.int64)
    return (torch.cat([x.long() for x, _ in parts]), torch.cat([y.long() for _, y in parts]),
            np.concatenate([[0], np.cumsum(sizes)]))


def assemble_clients(splits: dict[str, list[tuple[torch.Tensor, torch.Tensor]]],
              clusters: Sequence[int] | np.ndarray | None, n_classes: int | None, task: Task,
              name: str, data: dict[str, Any]) -> Federation:
    """The federation of per-client `(x, y)` tensors of both splits (`from_clients`, npz
    folders); `data` is the `[data]` table it records (`meta["data"]`)."""
    shapes = {tuple(x.shape[1:]) for part in splits.values() for x, _ in part if len(x)}
    if len(shapes) != 1:
        raise DataError(f"{name}: the clients' inputs have different shapes {sorted(shapes)}; "
                        "every sample must have one shape")
    shape = shapes.pop()
    cat: dict[str, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
    for split, parts in splits.items():
        for i, (x, y) in enumerate(parts):
            if len(x) != len(y):
                raise DataError(f"{name}: client {i} {split} has {len(x)} inputs but "
                                f"{len(y)} targets")
            if task != "language_model" and y.dim() > 1 and y[0].numel() > 1:  # not [N, 1]
                one = ("class id (one-hot labels: y.argmax(1))" if task == "classification"
                       else "value")
                raise DataError(f"{name}: client {i} {split} has targets of shape "
                                f"{tuple(y.shape)}; give one {one} per sample")
            check_client(x, y, task, f"{name}: client {i} {split}")
        if task == "language_model":  # token ids [N, T] in and out, kept integer
            cat[split] = _token_split(parts, name, split)
            continue
        xs = [x.reshape(len(x), *shape).float() for x, _ in parts]
        for i, x in enumerate(xs):
            if len(x) and not bool(torch.isfinite(x).all()):  # finite before, not in float32
                raise DataError(f"{name}: client {i} {split} has inputs beyond the range of "
                                "float32 (about ±3.4e38), in which the models compute; scale "
                                "them first")
        ys = [y.reshape(-1) for _, y in parts]
        y_all = torch.cat(ys) if ys else torch.zeros(0)
        y_all = y_all.long() if task == "classification" else y_all.float()
        sizes = np.array([len(y) for y in ys], dtype=np.int64)
        cat[split] = (torch.cat(xs), y_all, np.concatenate([[0], np.cumsum(sizes)]))
    if task == "language_model":
        seen = max(int(t.max()) + 1 if t.numel() else 1 for part in cat.values()
                   for t in part[:2])
        if n_classes is not None and n_classes < seen:
            raise DataError(f"{name}: n_classes = {n_classes} but the token id {seen - 1} "
                            "occurs; n_classes is the vocabulary size")
        n_classes = n_classes or seen
    elif task == "classification":
        labels = torch.cat([cat["train"][1], cat["test"][1]])
        if len(labels) and int(labels.min()) < 0:
            raise DataError(f"{name}: class labels must be 0, 1, ...; found {int(labels.min())}")
        seen = int(labels.max()) + 1 if len(labels) else 1
        if n_classes is not None and n_classes < seen:
            raise DataError(f"{name}: n_classes = {n_classes} but a label {seen - 1} occurs")
        n_classes = n_classes or seen
    else:
        n_classes = 1
    empty = [i for i, n in enumerate(np.diff(cat["train"][2])) if n == 0]
    if empty:
        raise DataError(f"{name}: clients {empty} have no training samples")
    truth = None if clusters is None else _cluster_ids(clusters, name)
    n = len(splits["train"])
    if truth is not None and truth.shape != (n,):
        raise DataError(f"{name}: clusters has {truth.size} ids for {n} clients")
    if truth is not None and truth.size and truth.min() < 0:  # ARI would count it a group
        i = int(np.argmin(truth))
        raise DataError(f"{name}: client {i} has the true cluster id {int(truth[i])}; ids "
                        "are 0, 1, ... (leave every cluster id out when they are not known)")
    return Federation(*cat["train"], *cat["test"], clusters=truth, n_classes=int(n_classes),
                      task=task, name=name, meta={"data": data})
