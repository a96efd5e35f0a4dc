"""The reference backend: a plain loop over clients, one reused module (DESIGN.md §1).

Train/Gradient requests with `coords` are answered with those coordinates only
(`protocol.narrow`), as a real client would send them.
"""

from __future__ import annotations

from typing import Literal, Self

import numpy as np
import torch

from clusterfl.backends.base import Backend, BackendConfig, as_index
from clusterfl.data.federation import Federation
from clusterfl.engine import reference as ref
from clusterfl.engine.common import client_metrics, combine, per_sample_loss
from clusterfl.engine.schedule import batch_schedule, gradient_batches
from clusterfl.models import ModelFactory
from clusterfl.protocol import (
    EvaluateReply,
    EvaluateRequest,
    GradientReply,
    GradientRequest,
    LossReply,
    LossRequest,
    Predictor,
    TrainReply,
    TrainRequest,
    narrow,
)


class SequentialConfig(BackendConfig):
    """Settings of the reference backend (`[backend] name = "sequential"`): none of its own
    (`chunk_size` is accepted and ignored: it computes one client at a time)."""

    name: Literal["sequential"] = "sequential"


class SequentialBackend(Backend):
    """Executes each request client by client with `clusterfl.engine.reference`."""

    name = "sequential"
    Config = SequentialConfig

    def __init__(self, federation, factory) -> None:
        super().__init__(federation, factory)
        self.module = factory.build()

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        return cls(federation, factory)

    # -------------------------------------------------------------- helpers
    def _outputs(self, pred: Predictor, row: int, x: torch.Tensor) -> torch.Tensor:
        outs = [ref.predict(self.module, pred.models[m], x) for m in pred.members[row]]
        return combine(outs, pred.combine)

    # -------------------------------------------------------------- requests
    def train(self, req: TrainRequest) -> TrainReply:
        fed, clients = self.federation, as_index(req.clients)
        tr = req.training
        sizes = fed.train_sizes[clients]
        sched = torch.from_numpy(
            batch_schedule(sizes, clients, tr.batch_size, tr.epochs, tr.steps, req.seed)
        )
        params, losses = [], []
        for i, c in enumerate(clients):
            x, y = fed.client_train(int(c))
            offset = None if req.offset is None else self._outputs(req.offset, i, x)
            torch.manual_seed(int(req.seed) * 1_000_003 + int(c))  # dropout noise
            start = req.models[int(req.model_of_client[i])]
            p, loss = ref.train_client(self.module, start, x, y, sched[i], tr, fed.task, offset)
            params.append(p)
            losses.append(loss)
        out = narrow(_stack(params, self.factory.size), req.coords)  # the d̂ coords asked for
        return TrainReply(clients.copy(), out, sizes.copy(), np.array(losses))

    def gradient(self, req: GradientRequest) -> GradientReply:
        fed, clients = self.federation, as_index(req.clients)
        sizes = fed.train_sizes[clients]
        batches = torch.from_numpy(gradient_batches(sizes, clients, req.batch_size, req.seed))
        grads, losses = [], []
        for i, c in enumerate(clients):
            x, y = fed.client_train(int(c))
            torch.manual_seed(int(req.seed) * 1_000_003 + int(c))
            params = req.models[int(req.model_of_client[i])]
            g, loss = ref.gradient_client(self.module, params, x, y, batches[i], fed.task)
            grads.append(g)
            losses.append(loss)
        used = np.minimum(sizes, sizes if req.batch_size is None else req.batch_size)
        out = narrow(_stack(grads, self.factory.size), req.coords)  # the d̂ coords asked for
        return GradientReply(clients.copy(), out, used, np.array(losses))

    def losses(self, req: LossRequest) -> LossReply:
        fed, clients = self.federation, as_index(req.clients)
        k = req.models.shape[0]
        loss = np.zeros((len(clients), k))
        acc = np.full((len(clients), k), np.nan)
        x_all, y_all, off = fed.split(req.split)
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            base = None if req.offset is None else self._outputs(req.offset, i, x)
            for j in range(k):
                out = ref.predict(self.module, req.models[j], x)
                if base is not None:
                    out = out + base
                loss[i, j] = float(per_sample_loss(out, y, fed.task).mean())
                if fed.task == "classification":
                    acc[i, j] = float((out.argmax(-1) == y).double().mean())
        return LossReply(clients.copy(), loss, acc)

    def evaluate(self, req: EvaluateRequest) -> EvaluateReply:
        fed, clients = self.federation, as_index(req.clients)
        x_all, y_all, off = fed.split(req.split)
        rows = []
        for i, c in enumerate(clients):
            x, y = x_all[off[c] : off[c + 1]], y_all[off[c] : off[c + 1]]
            out = self._outputs(req.predictor, i, x)
            rows.append(client_metrics(out, y, fed.task, fed.n_classes))
        return metrics_reply(clients, rows, np.diff(off)[clients])


def metrics_reply(clients: np.ndarray, rows: list[dict[str, float]],
                  sizes: np.ndarray) -> EvaluateReply:
    col = {k: np.array([r[k] for r in rows]) for k in ("accuracy", "macro_f1", "loss", "mse")}
    return EvaluateReply(
        np.asarray(clients, dtype=np.int64).copy(), col["accuracy"], col["macro_f1"],
        col["loss"], sizes.copy(), {"mse": col["mse"]}
    )


def _stack(rows: list[torch.Tensor], d: int) -> torch.Tensor:
    return torch.stack(rows) if rows else torch.zeros(0, d)
