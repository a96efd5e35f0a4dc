"""Flower Datasets partitioners for scenario `cluster_partitioner` (its planner is in
`scenarios`): clusters of `rotation`, each split among its clients by a partitioner.

Our choices (no paper defines this scenario): the training rows are shuffled and cut into one
near-equal, disjoint share per cluster (clients of a cluster are contiguous, as everywhere);
a `flwr_datasets` partitioner (`iid`, `dirichlet`, `shard`, `pathological`, `linear`,
`square`, `exponential`, with `options` as its keyword arguments; `partition_by` defaults to
the labels and `seed` to one drawn from the run's generator) splits each cluster's share
among the cluster's clients; every client's test rows follow its own training label
proportions (`matched_test`), and all of a cluster's rows, train and test, are rotated by the
cluster's angle. Needs the `flwr-datasets` package (`pip install 'clusterfl[hf]'`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfl.errors import ConfigError

PARTITIONERS = {
    "iid": "IidPartitioner", "dirichlet": "DirichletPartitioner", "shard": "ShardPartitioner",
    "pathological": "PathologicalPartitioner", "linear": "LinearPartitioner",
    "square": "SquarePartitioner", "exponential": "ExponentialPartitioner",
}


def flower_split(labels: np.ndarray, n_parts: int, kind: str, options: dict[str, Any],
                 seed: int) -> list[np.ndarray]:
    """Positions (into `labels`) of each of `n_parts` partitions made by a Flower Datasets
    partitioner over a dataset with one `label` column."""
    try:
        from flwr_datasets import partitioner as fp

        import datasets
    except ModuleNotFoundError:
        raise ConfigError("partitioner", "needs the flwr-datasets package: pip install "
                                         "'clusterfl[hf]'") from None
    import inspect

    cls = getattr(fp, PARTITIONERS[kind])
    params = inspect.signature(cls.__init__).parameters
    kwargs = dict(options)
    if "partition_by" in params:
        kwargs.setdefault("partition_by", "label")
    if "seed" in params:
        kwargs.setdefault("seed", seed)
    try:
        part = cls(num_partitions=n_parts, **kwargs)
        part.dataset = datasets.Dataset.from_dict(
            {"label": labels.astype(np.int64), "pos": np.arange(len(labels))})
        return [np.asarray(part.load_partition(i)["pos"], dtype=np.int64)
                for i in range(n_parts)]
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
        # IndexError, ZeroDivisionError: a shard partitioner with more shards a partition than
        # rows (num_shards_per_partition = 10**6) divided by zero in flwr_datasets
        raise ConfigError("options", f"the {PARTITIONERS[kind]} of flwr_datasets refused "
                                     f"{kwargs}: {exc}") from None
