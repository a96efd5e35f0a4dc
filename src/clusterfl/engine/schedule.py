"""Which samples each client uses at each local step — shared by every engine.

Both the per-client reference loop and the vectorized engine read the same schedule, so
they do exactly the same arithmetic. A schedule is an int64 array `[n_clients, S, b]` of
client-local sample indices; -1 marks padding (short last batch, or a client with fewer
steps than the longest one: its extra steps are masked and change nothing).
"""

from __future__ import annotations

import numpy as np

from clusterfl.errors import ConfigError


def client_rng(seed: int, client: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(client)])


def _epoch_batches(n: int, b: int, epochs: int, rng: np.random.Generator) -> np.ndarray:
    per_epoch = -(-n // b)
    out = np.full(epochs * per_epoch * b, -1, dtype=np.int64)
    for e in range(epochs):  # each epoch's permutation, padded to whole batches
        start = e * per_epoch * b
        out[start : start + n] = rng.permutation(n)
    return out.reshape(epochs * per_epoch, b)


def _step_batches(n: int, b: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    take = min(b, n)
    reps = -(-steps * take // n)
    stream = np.concatenate([rng.permutation(n) for _ in range(reps)])[: steps * take]
    out = np.full((steps, b), -1, dtype=np.int64)
    out[:, :take] = stream.reshape(steps, take)
    return out


def batch_schedule(
    sizes: np.ndarray,
    clients: np.ndarray,
    batch_size: int,
    epochs: int,
    steps: int,
    seed: int,
) -> np.ndarray:
    """`[n, S, b]` local indices for each listed client (sizes are theirs, in order).

    steps > 0: exactly `steps` batches of min(b, n_i) samples, drawn from successive
    permutations. Otherwise `epochs` passes, each a fresh permutation cut into batches of b.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    batch_size = fit_batch(batch_size, sizes, len(sizes))
    check_schedule_size(len(sizes), sizes, batch_size, epochs, steps)
    per_client = []
    for c, n in zip(clients, sizes):
        rng = client_rng(seed, int(c))
        n = int(n)
        if n == 0:
            per_client.append(np.full((0, batch_size), -1, dtype=np.int64))
        elif steps > 0:
            per_client.append(_step_batches(n, batch_size, steps, rng))
        else:
            per_client.append(_epoch_batches(n, batch_size, epochs, rng))
    s_max = max((len(p) for p in per_client), default=0)
    out = np.full((len(per_client), s_max, batch_size), -1, dtype=np.int64)
    for i, p in enumerate(per_client):
        out[i, : len(p)] = p
    return out


#: the most int64 entries a schedule may hold (1 GiB): more is an absurd setting
MAX_SCHEDULE = 2**27
#: the most padding entries a batch larger than every client may add (32 MiB)
MAX_PADDING = 2**22


def fit_batch(batch_size: int, sizes: np.ndarray, rows: int = 1) -> int:
    """`batch_size`, or the largest client's size when the batch is larger and its padding
    in the `rows` schedules of one step would exceed `MAX_PADDING` entries: a batch holds
    at most a client's data, so the same samples are drawn and the models are the same (the
    reported mean loss, summed over less padding, may differ in its last digits). A batch
    larger than the clients but not absurdly so is kept as it is."""
    largest = int(np.max(sizes, initial=0))
    if 0 < largest < batch_size and (batch_size - largest) * rows > MAX_PADDING:
        return largest
    return int(batch_size)


def check_schedule_size(rows: int, sizes: np.ndarray, b: int, epochs: int, steps: int) -> None:
    """ConfigError naming `train.steps` or `train.epochs` when the schedule of `rows` clients
    (or client-model pairs) would exceed `MAX_SCHEDULE` entries, before it is allocated."""
    per = steps if steps > 0 else epochs * -(-int(np.max(sizes, initial=0)) // b)
    if rows * per * b <= MAX_SCHEDULE:
        return
    field, value = ("train.steps", steps) if steps > 0 else ("train.epochs", epochs)
    most = max(1, MAX_SCHEDULE // max(1, rows * b * (per // max(1, value))))
    raise ConfigError(field, f"{value} local {field.split('.')[1]} of batches of {b} for "
                      f"{rows} clients need a schedule of {rows * per * b * 8 / 2**30:.1f} GiB "
                      f"before training starts; allowed here: at most {most}")


def gradient_batches(
    sizes: np.ndarray, clients: np.ndarray, batch_size: int | None, seed: int
) -> np.ndarray:
    """`[n, b]` indices of one random minibatch per client (-1 padded); None = all data."""
    b = int(sizes.max()) if batch_size is None else fit_batch(batch_size, sizes, len(sizes))
    out = np.full((len(clients), max(b, 1)), -1, dtype=np.int64)
    for i, (c, n) in enumerate(zip(clients, sizes)):
        n = int(n)
        if batch_size is None:
            out[i, :n] = np.arange(n)
        else:
            take = min(b, n)
            out[i, :take] = client_rng(seed, int(c)).permutation(n)[:take]
    return out


def mixture_seed(seed: int, component: int) -> int:
    """The schedule seed of component `component` of a `MixtureTrainRequest` with `seed`: each
    of the K trainings of a client reads its own minibatch order."""
    return int(np.random.default_rng([int(seed) & 0xFFFFFFFF, 7, int(component)])
               .integers(0, 2**31 - 1))


def mixture_schedule(sizes: np.ndarray, clients: np.ndarray, batch_size: int, epochs: int,
                     steps: int, seed: int, k: int) -> np.ndarray:
    """`[k·n, S, b]`: the schedules of components 0..k−1 (client order within each), one
    after the other, as a `MixtureTrainRequest` trains them."""
    batch_size = fit_batch(batch_size, sizes, k * len(sizes))
    check_schedule_size(k * len(sizes), sizes, batch_size, epochs, steps)
    parts = [batch_schedule(sizes, clients, batch_size, epochs, steps, mixture_seed(seed, j))
             for j in range(k)]
    s_max = max((p.shape[1] for p in parts), default=0)
    out = np.full((k * len(clients), s_max, batch_size), -1, dtype=np.int64)
    for j, p in enumerate(parts):
        out[j * len(clients):(j + 1) * len(clients), : p.shape[1]] = p
    return out
