"""The reference backend: a plain loop over clients, one reused module (docs/engine.md).

Train/Gradient requests with `coords` are answered with those coordinates only
(`protocol.narrow`), as a real client would send them. On a GPU (`device`) the federation's
data moves there once, each request's models when it arrives; the replies' models and
gradients stay there, as the simulation backend's do (`Context.send` brings them to the CPU
for a method without a device update).
"""

from __future__ import annotations

from typing import ClassVar, Literal, Self

import numpy as np
import torch

from clusterfl import protocol as pr
from clusterfl.backends.base import BackendConfig, as_index
from clusterfl.backends.simulation import DeviceBackend, DeviceConfig, task_extras
from clusterfl.data.federation import Federation
from clusterfl.data.text import not_word_ids
from clusterfl.engine import reference as ref
from clusterfl.engine.common import (
    WORD_ACCURACY,
    WORD_TARGETS,
    best_counts,
    client_metrics,
    combine,
    fit_mixture,
    per_sample_loss,
    per_sample_losses,
    responsibilities,
)
from clusterfl.engine.device import on
from clusterfl.engine.schedule import batch_schedule, gradient_batches, mixture_seed
from clusterfl.models import ModelFactory
from clusterfl.protocol import Predictor, client_seed, narrow


class SequentialConfig(DeviceConfig):
    """Settings of the reference backend (`[backend] name = "sequential"`): `device` and
    `precision` (`chunk_size` is accepted and ignored: it computes one client at a time)."""

    name: Literal["sequential"] = "sequential"
    chunk_unused: ClassVar[str] = "it computes one client at a time"


class SequentialBackend(DeviceBackend):
    """Executes each request client by client with `clusterfl.engine.reference` (on
    `device`: "cpu" by default, "cuda", "cuda:N" or "auto", see `engine.device`)."""

    name = "sequential"
    Config = SequentialConfig

    def __init__(self, federation: Federation, factory: ModelFactory, *, device: str = "cpu",
                 precision: str = "fp32") -> None:
        super().__init__(federation, factory, device, precision)
        self.module = factory.build().to(self.device)
        self.data = federation.to(self.device)  # the clients' data, on the device once

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        return cls(federation, factory, device=getattr(config, "device", "auto"),
                   precision=getattr(config, "precision", "fp32"))

    # -------------------------------------------------------------- helpers
    def _outputs(self, pred: Predictor, row: int, x: torch.Tensor) -> torch.Tensor:
        outs = [ref.predict(self.module, pred.models[m], x) for m in pred.members[row]]
        weights = None
        if pred.weights is not None:  # this client's member weights (FedEM's π)
            weights = torch.as_tensor(np.asarray(pred.weights[row], np.float64),
                                      device=self.device)
        return combine(outs, pred.combine, weights)

    # -------------------------------------------------------------- requests
    def train(self, req: pr.TrainRequest) -> pr.TrainReply:
        fed, clients = self.federation, as_index(req.clients)
        tr = req.training
        sizes = fed.train_sizes[clients]
        sched = torch.from_numpy(
            batch_schedule(sizes, clients, tr.batch_size, tr.epochs, tr.steps, req.seed)
        ).to(self.device)
        models, pred = on(req.models, self.device), on(req.offset, self.device)
        prox_models = on(req.prox_models, self.device)
        params, losses = [], []
        for i, c in enumerate(clients):
            x, y = self.data.client_train(int(c))
            offset = None if pred is None else self._outputs(pred, i, x)
            torch.manual_seed(client_seed(req.seed, int(c)))  # dropout noise
            start = models[int(req.model_of_client[i])]
            prox = None
            if prox_models is not None and req.prox_weights is not None:
                prox = (prox_models, torch.as_tensor(np.asarray(req.prox_weights[i])))
            p, loss = ref.train_client(self.module, start, x, y, sched[i], tr, fed.task, offset,
                                       prox=prox)
            params.append(p)
            losses.append(loss)
        out = narrow(_stack(params, self.factory.size), req.coords)  # the d̂ coords asked for
        return pr.TrainReply(clients.copy(), out, sizes.copy(), np.array(losses))

    def gradient(self, req: pr.GradientRequest) -> pr.GradientReply:
        fed, clients = self.federation, as_index(req.clients)
        sizes = fed.train_sizes[clients]
        batches = torch.from_numpy(
            gradient_batches(sizes, clients, req.batch_size, req.seed)).to(self.device)
        models = on(req.models, self.device)
        grads, losses = [], []
        for i, c in enumerate(clients):
            x, y = self.data.client_train(int(c))
            torch.manual_seed(client_seed(req.seed, int(c)))
            params = models[int(req.model_of_client[i])]
            g, loss = ref.gradient_client(self.module, params, x, y, batches[i], fed.task)
            grads.append(g)
            losses.append(loss)
        used = np.minimum(sizes, sizes if req.batch_size is None else req.batch_size)
        out = narrow(_stack(grads, self.factory.size), req.coords)  # the d̂ coords asked for
        return pr.GradientReply(clients.copy(), out, used, np.array(losses))

    def losses(self, req: pr.LossRequest) -> pr.LossReply:
        fed, clients = self.federation, as_index(req.clients)
        k = req.models.shape[0]
        loss = np.zeros((len(clients), k))
        acc = np.full((len(clients), k), np.nan)
        x_all, y_all, off = self.data.split(req.split)
        models, pred = on(req.models, self.device), on(req.offset, self.device)
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            base = None if pred is None else self._outputs(pred, i, x)
            for j in range(k):
                out = ref.predict(self.module, models[j], x)
                if base is not None:
                    out = out + base
                loss[i, j] = float(per_sample_loss(out, y, fed.task).mean())
                if fed.task != "regression":  # a language model: the share of tokens
                    acc[i, j] = float((out.argmax(-1) == y).double().mean())
        return pr.LossReply(clients.copy(), loss, acc)

    # -------------------------------------------------------------- mixtures
    def _client_losses(self, models: torch.Tensor, x: torch.Tensor,
                       y: torch.Tensor) -> torch.Tensor:
        """`[n_i, K]` per-sample losses of each model on one client's data (eval mode)."""
        if len(x) == 0:
            return torch.zeros(0, int(models.shape[0]), dtype=torch.float64, device=x.device)
        out = torch.stack([ref.predict(self.module, m, x) for m in models], 1)
        return per_sample_losses(out, y, self.federation.task)

    def mixture_train(self, req: pr.MixtureTrainRequest) -> pr.MixtureTrainReply:
        fed, clients = self.federation, as_index(req.clients)
        tr, k = req.training, int(req.models.shape[0])
        sizes = fed.train_sizes[clients]
        scheds = [torch.from_numpy(batch_schedule(sizes, clients, tr.batch_size, tr.epochs,
                                                  tr.steps, mixture_seed(req.seed, j)))
                  .to(self.device) for j in range(k)]
        params, losses, weights = [], [], []
        models = on(req.models, self.device)
        for i, c in enumerate(clients):
            x, y = self.data.client_train(int(c))
            prior = torch.as_tensor(np.asarray(req.weights[i], np.float64), device=self.device)
            q = responsibilities(self._client_losses(models, x, y), prior.expand(len(x), -1))
            weights.append((q.mean(0) if len(x) else prior).cpu().numpy())
            rows, total = [], 0.0
            for j in range(k):
                torch.manual_seed(client_seed(req.seed, int(c)))  # dropout noise
                p, loss = ref.train_client(self.module, models[j], x, y, scheds[j][i], tr,
                                           fed.task, sample_weight=q[:, j])
                rows.append(p)
                total += loss
            params.append(torch.stack(rows))
            losses.append(total)
        d = self.factory.size
        out = torch.stack(params) if params else torch.zeros(0, k, d, device=self.device)
        return pr.MixtureTrainReply(clients.copy(), out, sizes.copy(), np.array(losses),
                                    np.array(weights).reshape(len(clients), k))

    def mixture_fit(self, req: pr.MixtureFitRequest) -> pr.MixtureFitReply:
        clients = as_index(req.clients)
        x_all, y_all, off = self.data.split(req.split)
        k, models = int(req.models.shape[0]), on(req.models, self.device)
        weights, nll = np.zeros((len(clients), k)), np.zeros(len(clients))
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            pi, loss = fit_mixture(self._client_losses(models, x, y), np.array([len(x)]),
                                   np.asarray(req.weights[i : i + 1]), req.iterations)
            weights[i], nll[i] = pi[0], loss[0]
        return pr.MixtureFitReply(clients.copy(), weights, nll, np.diff(off)[clients])

    def best_counts(self, req: pr.BestCountRequest) -> pr.BestCountReply:
        clients = as_index(req.clients)
        x_all, y_all, off = self.data.split(req.split)
        models = on(req.models, self.device)
        counts = np.zeros((len(clients), int(req.models.shape[0])), dtype=np.int64)
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            counts[i] = best_counts(self._client_losses(models, x, y), np.array([len(x)]))[0]
        return pr.BestCountReply(clients.copy(), counts, np.diff(off)[clients])

    def evaluate(self, req: pr.EvaluateRequest) -> pr.EvaluateReply:
        fed, clients = self.federation, as_index(req.clients)
        x_all, y_all, off = self.data.split(req.split)
        pred = on(req.predictor, self.device)
        rows = []
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            out = self._outputs(pred, i, x)
            rows.append(client_metrics(out, y, fed.task, fed.n_classes, not_word_ids(fed)))
        return metrics_reply(clients, rows, np.diff(off)[clients], fed.task)


def metrics_reply(clients: np.ndarray, rows: list[dict[str, float]],
                  sizes: np.ndarray, task: str = "classification") -> pr.EvaluateReply:
    keys = ("accuracy", "macro_f1", "loss", "mse", "perplexity",
            *(k for k in (WORD_ACCURACY, WORD_TARGETS) if rows and k in rows[0]))
    col = {k: np.array([r.get(k, np.nan) for r in rows], dtype=np.float64) for k in keys}
    return pr.EvaluateReply(
        np.asarray(clients, dtype=np.int64).copy(), col["accuracy"], col["macro_f1"],
        col["loss"], sizes.copy(), task_extras(col, task)
    )


def _stack(rows: list[torch.Tensor], d: int) -> torch.Tensor:
    return torch.stack(rows) if rows else torch.zeros(0, d)
