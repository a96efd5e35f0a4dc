"""FedEM: federated expectation–maximisation of a mixture of M models (Marfoq, Neglia,
Bellet, Kameni, Vidal, NeurIPS 2021, arXiv 2108.10252).

What the paper says (abstract; the steps as in the authors' code, omarfoq/FedEM):

- Each client's distribution is a mixture of M underlying distributions shared by all
  clients, with client-specific weights π_t. The server keeps M component models θ_1..θ_M;
  π_t never leaves client t.
- A round: the sampled clients receive the M models. Each client runs an E-step on its
  training data, q_t(z_j = m) ∝ π_tm · exp(−ℓ(h_{θ_m}(x_j), y_j)), sets π_t to the mean of q
  over its samples, and trains every component locally from the received θ_m with sample j's
  loss weighted by q(z_j = m) (`MixtureTrainRequest`: both steps happen on the device). The
  server averages each component over the clients, weighted by their sample counts.
- Prediction of client t: Σ_m π_tm softmax(h_{θ_m}(x)) (a weighted "mean_probs" predictor);
  on a regression task (squared error as ℓ, a Gaussian likelihood) the mixture's mean
  Σ_m π_tm h_{θ_m}(x) ("mean_outputs": our extension, the paper's experiments classify).
- Clients unseen in training keep the components frozen and fit their own π by EM on their
  data (`MixtureFitRequest`), then predict with the mixture.

Our choices and the authors' code's departures:

- `aggregate = "sampled"` (default): each θ_m becomes the sample-weighted mean of the answering
  clients' θ_{m,t}. `aggregate = "all"` is the authors' code: the mean runs over all clients,
  weighted n_t / n, a client that did not train contributing the current θ_m
  (θ ← Σ_{t∈S} p_t θ_{m,t} + Σ_{t∉S} p_t θ_m), with the clients' data sizes as fixed
  weights p_t (as the code's client weights; so also under `[privacy]`, which reports
  n_i = 1). With everyone answering the two agree.
- Initialisation: M independent PyTorch default initialisations (seeds seed..seed+M−1, as the
  code's seed+m), π_t = 1/M.
- The E-step uses each model in evaluation mode on all the client's training data, once per
  participation, before the local training (as the code). A batch's loss is
  Σ_j q_jm ℓ_j / |batch| (the code divides by the batch size, not by Σ q).
- The local optimiser and learning rate are the run's [train] settings for every method; the
  code's multi-step scheduler (lr × 0.1 at T/2 and 3T/4) is not reproduced, and a client's
  optimiser state does not persist between participations (as for every method here).
- Each of the M local trainings reads its own minibatch order (the code's M learners each
  iterate the shared data loader).
- `assignment()` is argmax_m π_tm (ties to the lower index); before a client ever trained it
  is -1 (π uniform: no evidence). The cluster sizes in the history count these argmaxes.
- Placement of a new client (`placement`): `place_iterations` EM steps of its π from 1/M with
  the components frozen (the paper: EM on the new client's data; the code runs one step per
  logging interval), cluster = argmax π, predictor = its mixture.
- Communication: M·d down and M·d up per participating client and round; π is never sent
  (the simulated reply carries it for the server, which plays the device's storage).
- Clients absent from a reply (dropped, rejected by the guard) keep their π and are left out
  of that round's averages (with `aggregate = "all"`, they count with the current θ_m).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    Placement,
    SampledConfig,
    check_k_fits,
    one_cluster_ignores,
)
from clusterfl.clustering.aggregate import cluster_sizes
from clusterfl.protocol import (
    Combine,
    MixtureFitRequest,
    MixtureTrainReply,
    MixtureTrainRequest,
    Predictor,
    mean_finite,
)
from clusterfl.records import RoundExtras


class FedEMConfig(SampledConfig):
    """Settings of FedEM (`[algorithm] name = "fedem"`)."""

    name: Literal["fedem"] = "fedem"
    display: ClassVar[str] = "FedEM"
    n_components: int = Field(3, ge=1, description="M, the number of component models")
    aggregate: Literal["sampled", "all"] = Field(
        "sampled", description='"sampled": each component is the weighted mean over the '
        'answering clients (paper); "all": over all clients, the others with the current '
        "component (the authors' code)")
    place_iterations: int = Field(
        20, ge=1, description="EM steps a new client runs to fit its mixture weights")

    def ignored_settings(self) -> list[str]:
        """With M = 1 a placement's π starts at 1/M = [1] and no EM step moves it."""
        return [*super().ignored_settings(), *one_cluster_ignores(
            self, ("place_iterations",), k="n_components",
            what="one component, whose mixture weight is 1 before any EM step")]


@dataclass(kw_only=True)
class FedEMExtras(RoundExtras):
    """FedEM's per-round extras."""

    train_loss: float | None = None  # mean over answering clients of Σ_m their M-step losses
    #: clients whose largest mixture weight is on each component (never trained: none)
    cluster_sizes: list[int] = field(default_factory=list)
    #: mean entropy (nats) of the trained clients' mixture weights: 0 = hard assignments
    weight_entropy: float | None = None


@dataclass
class FedEMState:
    models: torch.Tensor  # [M, d], the component models θ_1..θ_M
    weights: np.ndarray  # [n_clients, M], each client's π (held on the device)
    trained: np.ndarray  # [n_clients] bool, the client ran at least one EM step


def mixture_assignment(weights: np.ndarray, trained: np.ndarray) -> np.ndarray:
    """argmax_m π_tm of every client; -1 for clients that never trained."""
    return np.where(trained, np.argmax(weights, axis=1), -1).astype(np.int64)


class FedEM(Algorithm[FedEMConfig, FedEMState]):
    """FedEM (Marfoq et al. 2021): M shared components, per-client mixture weights by EM."""

    name = "fedem"
    Config = FedEMConfig
    State = FedEMState
    device_update = True  # the components' weighted means where the backend left the models

    def fits(self, n_clients: int, rounds: int | None) -> None:
        check_k_fits(self.config.n_components, n_clients, "algorithm.n_components",
                     "M = {k} mixture components")

    def setup(self, ctx: Context) -> None:
        m = self.config.n_components
        self.fits(ctx.n_clients, ctx.rounds)
        # regression: the mixture's mean output (the prediction minimising the squared error)
        self.combine: Combine = ("mean_outputs" if ctx.backend.federation.task == "regression"
                                 else "mean_probs")
        # p_t of aggregate = "all": the context's array itself, read when a round aggregates
        # (a Flower strategy learns the sizes from the clients' first replies: no copy)
        self.sizes = ctx.train_sizes
        self.state = FedEMState(ctx.factory.init_many(m, ctx.seed),
                                np.full((ctx.n_clients, m), 1.0 / m),
                                np.zeros(ctx.n_clients, dtype=bool))

    def ask(self, state: FedEMState, t: int, phase: str,
            ctx: Context) -> Ask[MixtureTrainReply]:
        """The sampled clients get the M models and their own π (E-step and M-step on the
        device)."""
        clients = ctx.sample_round(self.config)
        return Ask(MixtureTrainRequest(clients, state.models, state.weights[clients],
                                       ctx.training, ctx.next_seed()))

    def update(self, state: FedEMState, t: int, ask: Ask[Any],
               reply: MixtureTrainReply) -> Update[FedEMState]:
        """The answering clients' π are kept; each component is averaged (`aggregate`)."""
        got = reply.clients
        if len(got):
            weights, trained = state.weights.copy(), state.trained.copy()
            weights[got] = reply.weights
            trained[got] = True
            sizes = (np.asarray(self.sizes, dtype=np.float64) if self.config.aggregate == "all"
                     else None)
            state = replace(state, weights=weights, trained=trained, models=aggregate_components(
                state.models, reply.params, reply.n_samples, got, sizes))
        return Update(state, FedEMExtras(
            train_loss=mean_finite(reply.loss),
            cluster_sizes=cluster_sizes(mixture_assignment(state.weights, state.trained),
                                        self.config.n_components),
            weight_entropy=_entropy(state.weights[state.trained])))

    # ------------------------------------------------------------------ outputs
    def assignment(self) -> np.ndarray:
        return mixture_assignment(self.state.weights, self.state.trained)

    def predictor(self) -> Predictor:
        st = self.state
        n, m = st.weights.shape
        return Predictor(st.models, np.tile(np.arange(m, dtype=np.int64), (n, 1)), self.combine,
                         st.weights.copy())

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Each client fits its π over the frozen components (`place_iterations` EM steps
        from 1/M); cluster = argmax π (-1 if it did not answer); it predicts with its
        mixture (a client that did not answer: uniform weights)."""
        st, m = self.state, self.config.n_components
        clients = np.asarray(clients, dtype=np.int64)
        uniform = np.full((len(clients), m), 1.0 / m)
        reply = ctx.send(MixtureFitRequest(clients, st.models, uniform,
                                           self.config.place_iterations))
        weights, clusters = uniform.copy(), np.full(len(clients), -1, dtype=np.int64)
        where = {int(c): i for i, c in enumerate(clients.tolist())}
        rows = np.array([where[int(c)] for c in reply.clients], dtype=np.int64)
        weights[rows] = reply.weights
        clusters[rows] = np.argmax(reply.weights, axis=1)
        pred = Predictor(st.models, np.tile(np.arange(m, dtype=np.int64), (len(clients), 1)),
                         self.combine, weights)
        details = [{"weights": [round(float(v), 6) for v in w]} for w in weights]
        return Placement(clients, clusters, pred, details)


def aggregate_components(models: torch.Tensor, params: torch.Tensor, n_samples: np.ndarray,
                         got: np.ndarray, sizes: np.ndarray | None = None) -> torch.Tensor:
    """New `[M, d]` components from the answering clients' `[n, M, d]` models `params`:
    the mean weighted by their `n_samples` (`aggregate = "sampled"`), or with `sizes` (every
    client's data size, `aggregate = "all"`) Σ_{t∈got} p_t θ_{m,t} + (1 − Σ_{t∈got} p_t) θ_m,
    p_t = n_t / n over all clients."""
    if sizes is not None:
        p = torch.as_tensor(sizes[got] / sizes.sum(), dtype=params.dtype)
        rest = 1.0 - float(p.sum())  # on the host: no wait for the device
        return torch.einsum("n,nmd->md", p.to(params.device), params) + rest * models
    w = np.asarray(n_samples, dtype=np.float64)
    p = torch.as_tensor(w / w.sum(), dtype=params.dtype, device=params.device)
    return torch.einsum("n,nmd->md", p, params)


def _entropy(weights: np.ndarray) -> float | None:
    """Mean entropy (nats) of the rows of `weights` (None without rows)."""
    if len(weights) == 0:
        return None
    w = np.clip(np.asarray(weights, dtype=np.float64), 1e-300, None)
    return float(np.mean(-(w * np.log(w)).sum(1)))


__all__ = ["FedEM", "FedEMConfig", "FedEMExtras", "FedEMState", "aggregate_components",
           "mixture_assignment"]
