"""Client-side data signatures of FLT (Jamali-Rad et al. 2022, Algorithm 2, lines 2-10).

A client turns its own training images into k vectors the server can compare, without labels:

- encoder mode (FLT): load the server's ConvAE (App. C.3), optionally fine-tune a private copy
  for F epochs on the client's images (Alg. 2 lines 3-5, the "Enc2" setting), embed every image
  with the encoder, E_m = G(D_m) (line 7), and return the k k-means centroids
  M_m = {μ_1..μ_k} (line 8);
- PCA mode (the paper's PCA+kM+HC baseline, §4.3): PCA of the client's images, k-means in the
  PCA space, centroids mapped back to input space.

Choices the paper leaves open, and what we do:
- Fine-tuning objective and optimizer: binary cross-entropy between the sigmoid reconstruction
  and the image (pixels in [0, 1]), Adam with lr 1e-3 (the authors' code uses the same loss and
  optimizer); minibatch size and lr are request fields. The paper says only "F epochs of SGD".
- k-means: scikit-learn `KMeans` (k-means++, `n_init` restarts) seeded per client. A client
  with fewer than k distinct embeddings returns its distinct ones repeated to k rows (duplicate
  points change neither the minimum-distance adjacency nor a matched distance much).
- PCA: each client fits PCA to its own data, so PCA coordinates of two clients live in different
  bases; mapping the centroids back to input space (`inverse_transform`) puts every client's
  signature in one common space. The uplink is then k·d floats (d = input size). The paper
  does not say how PCA signatures are made comparable.

Everything is a pure function of (data, request, seed): the same inputs give the same output.
In particular a signature is computed in float32 whatever the backend's precision: under
"bf16-mixed" (autocast) `client_signature` turns autocast off for its own computation, a
one-off step on the CPU whose codes feed k-means.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from clusterfl.models.params import set_flat
from clusterfl.models.zoo import ConvAE
from clusterfl.protocol import EmbedRequest


def build_conv_ae(input_shape: tuple[int, ...], latent: int,
                  params: torch.Tensor | None = None) -> ConvAE:
    """A ConvAE for images of `input_shape`, loaded with flat `params` when given."""
    model = ConvAE(tuple(input_shape), latent)
    if params is not None:
        expected = sum(p.numel() for p in model.parameters())
        if params.numel() != expected:
            raise ValueError(f"encoder has {params.numel()} parameters, a ConvAE with latent "
                             f"{latent} for inputs {tuple(input_shape)} has {expected}")
        set_flat(model, params.detach().to(torch.float32))
    return model


def reconstruction_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of the reconstruction (pixels clamped into [0, 1])."""
    target = x.clamp(0.0, 1.0)
    return nn.functional.binary_cross_entropy(model(x), target)


def train_autoencoder(model: nn.Module, x: torch.Tensor, epochs: int, lr: float,
                      batch_size: int, seed: int) -> list[float]:
    """`epochs` passes of Adam on the reconstruction loss; returns the mean loss per epoch.

    The minibatch order comes from a generator seeded with `seed` (reproducible).
    """
    if epochs <= 0 or len(x) == 0:
        return []
    gen = torch.Generator().manual_seed(int(seed))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    history = []
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        total, count = 0.0, 0
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = reconstruction_loss(model, x[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        history.append(total / max(count, 1))
    return history


@torch.no_grad()
def embed(model: ConvAE, x: torch.Tensor, batch_size: int = 256) -> np.ndarray:
    """Latent codes `[n, e]` of the images (encoder only, eval mode), float64."""
    model.eval()
    parts = [model.encode(x[s : s + batch_size]) for s in range(0, len(x), batch_size)]
    if not parts:
        return np.zeros((0, model.to_latent.out_features))
    return torch.cat(parts).double().numpy()


def kmeans_centroids(points: np.ndarray, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """`[k, e]` k-means centroids of `points` (fewer distinct points: repeated to k rows)."""
    from sklearn.cluster import KMeans

    points = np.asarray(points, dtype=np.float64)
    distinct = np.unique(points, axis=0)
    if len(distinct) == 0:
        raise ValueError("a client without data has no signature")
    if len(distinct) <= k:
        return distinct[np.arange(k) % len(distinct)]
    km = KMeans(n_clusters=k, n_init=n_init, random_state=int(seed) % (2**31 - 1))
    km.fit(points)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def pca_centroids(x: torch.Tensor, k: int, components: int, seed: int,
                  n_init: int = 10) -> np.ndarray:
    """PCA of the client's flattened images, k-means in PCA space, centroids in input space."""
    from sklearn.decomposition import PCA

    flat = x.reshape(len(x), -1).double().numpy()
    n_comp = max(1, min(components, flat.shape[0], flat.shape[1]))
    if flat.shape[0] < 2:
        return kmeans_centroids(flat, k, seed, n_init)
    pca = PCA(n_components=n_comp, random_state=int(seed) % (2**31 - 1))
    z = pca.fit_transform(flat)
    return np.asarray(pca.inverse_transform(kmeans_centroids(z, k, seed, n_init)))


def client_signature(x: torch.Tensor, y_unused: torch.Tensor | None, request: EmbedRequest,
                     seed: int) -> np.ndarray:
    """One client's `[k, e]` signature for `request` (its labels `y_unused` are ignored).

    Args:
        x: the client's training inputs `[n, C, H, W]`.
        y_unused: the client's labels; accepted so every client-side step has the same
            signature, never read (FLT's clustering is unsupervised).
        request: what to compute (see `EmbedRequest`).
        seed: the client's seed (fine-tuning batch order, k-means and PCA initialisation).
    """
    del y_unused
    x = x.to(torch.float32)
    if torch.is_autocast_enabled(x.device.type):  # bf16-mixed: signatures stay float32
        with torch.autocast(x.device.type, enabled=False):
            return _signature(x, request, seed)
    return _signature(x, request, seed)


def _signature(x: torch.Tensor, request: EmbedRequest, seed: int) -> np.ndarray:
    """`client_signature` of float32 images `x`."""
    if request.method == "pca":
        return pca_centroids(x, request.k, request.pca_components, seed, request.kmeans_n_init)
    if request.method != "encoder":
        raise ValueError(f"unknown signature method {request.method!r}; allowed: encoder, pca")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = build_conv_ae(tuple(x.shape[1:]), request.latent, request.encoder)
        train_autoencoder(model, x, request.finetune_epochs, request.finetune_lr,
                          request.finetune_batch_size, seed)
        codes = embed(model, x)
    return kmeans_centroids(codes, request.k, seed, request.kmeans_n_init)


__all__ = [
    "build_conv_ae", "client_signature", "embed", "kmeans_centroids", "pca_centroids",
    "reconstruction_loss", "train_autoencoder",
]
