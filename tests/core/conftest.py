"""Small hand-made federations for core tests (independent of the scenario recipes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfl.data.federation import Federation


def blob_federation(
    n_clients: int = 6, per_client: int = 40, n_clusters: int = 2, dim: int = 5, seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Federation:
    """Gaussian blobs, 3 classes; cluster k permutes the labels (a label-swap analogue)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(3, dim))
    clusters = np.arange(n_clients) % n_clusters
    perms = [np.roll(np.arange(3), k) for k in range(n_clusters)]
    xs, ys = {"train": [], "test": []}, {"train": [], "test": []}
    for c in range(n_clients):
        for split, n in (("train", per_client + c), ("test", per_client // 2)):
            y = rng.integers(0, 3, size=n)
            x = centers[y] + rng.normal(0, 1, size=(n, dim))
            xs[split].append(x)
            ys[split].append(perms[clusters[c]][y])
    def cat(split: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        sizes = [len(y) for y in ys[split]]
        return (
            torch.tensor(np.concatenate(xs[split]), dtype=dtype),
            torch.tensor(np.concatenate(ys[split]), dtype=torch.int64),
            np.concatenate([[0], np.cumsum(sizes)]),
        )
    return Federation(*cat("train"), *cat("test"), clusters=clusters, n_classes=3,
                      name="blobs")


@pytest.fixture
def blobs() -> Federation:
    return blob_federation()
