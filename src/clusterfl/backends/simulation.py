"""The simulation backend: all clients of a request computed together (docs/engine.md).

Same requests, same replies as `SequentialBackend` (the reference; `coords` narrowing and the
GPU `device` as there), but the work is done by `engine.vectorized.VectorizedEngine`: stacked
parameters, batched local steps, batched gradients, and outputs of K models on all clients'
data in large matrix products. The computation runs in the dtype of the request's models
(data is cast once, on the device, and cached). On a GPU the trained models and gradients of
the replies stay there: a method with a device update aggregates them there, the others
receive them on the CPU (`Context.send`, `engine.transfer`).
"""

from __future__ import annotations

import numbers
from typing import Any, Literal, Self

import numpy as np
import torch
from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from clusterfl import protocol as pr
from clusterfl.backends.base import Backend, BackendConfig, as_index
from clusterfl.data.federation import Federation
from clusterfl.data.text import not_word_ids
from clusterfl.engine.allocator import tune_allocator
from clusterfl.engine.common import (
    WORD_ACCURACY,
    WORD_TARGETS,
    best_counts,
    fit_mixture,
    per_sample_loss,
    per_sample_losses,
    responsibilities,
    segment_mean,
)
from clusterfl.engine.device import (
    DEVICES,
    PRECISIONS,
    Precision,
    check_device_name,
    compute_scope,
    on,
    resolve_device,
    set_precision,
)
from clusterfl.engine.schedule import batch_schedule, gradient_batches, mixture_schedule
from clusterfl.engine.vectorized import (
    Rows,
    SplitData,
    VectorizedEngine,
    client_metrics_batched,
    compact_inputs,
    mean_per_client,
)
from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory
from clusterfl.protocol import Predictor, narrow

CHUNK_SIZES = "allowed: a whole number >= 1 or 'auto'"


def is_chunk_size(value: object) -> bool:
    """`value` is a `chunk_size`: "auto" or a whole number >= 1 (not a bool, not a float)."""
    return value == "auto" or (isinstance(value, numbers.Integral)
                               and not isinstance(value, bool) and int(value) >= 1)


class DeviceConfig(BackendConfig):
    """`device` and `precision` of the in-process backends (`simulation`, `sequential`).

    Each is written into a run's config only when it is not the default ("auto", "fp32"), so
    the configs (and run folders) of runs that do not set them stay as they were (so is the
    simulation backend's `chunk_size`, whose "auto" is the 64 of every earlier CPU run).
    """

    device: str = Field("auto", description=f"where to compute: {DEVICES}; auto = CUDA when "
                        "torch finds a GPU")
    precision: Precision = Field("fp32", description="fp32; tf32 (CUDA tensor-core products); "
                                 "bf16-mixed (bfloat16 autocast of products and convolutions)")
    chunk_size: int | Literal["auto"] = Field(  # type: ignore[assignment]  # widens the base
        "auto", description="simulation: clients computed together at most, a number >= 1, "
        "or auto (64 on the CPU; on a GPU as many as its free memory holds); sequential: "
        "none (it computes one client at a time)")

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _chunk(cls, value: object) -> object:
        if not is_chunk_size(value):
            raise ValueError(CHUNK_SIZES)
        return value

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: object) -> str:
        return check_device_name(value)

    def ignored_settings(self) -> list[str]:
        tf32 = ["backend.precision = 'tf32' does nothing on the CPU (TF32 is a CUDA "
                "tensor-core format): the run computes in float32, as with 'fp32'"] \
            if self.precision == "tf32" and resolve_device(self.device).type == "cpu" else []
        return tf32 + super().ignored_settings()

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out = handler(self)
        for key, default in (("device", "auto"), ("precision", "fp32"), ("chunk_size", "auto")):
            if out.get(key) == default:
                out.pop(key)
        return out


class SimulationConfig(DeviceConfig):
    """Settings of the simulation backend (`[backend] name = "simulation"`, the default)."""

    name: Literal["simulation"] = "simulation"


class DeviceBackend(Backend):
    """An in-process backend that computes on `device` (`resolve_device`) under `precision`
    (`set_precision` once; every request inside `compute_scope`): `simulation`, `sequential`."""

    def __init__(self, federation: Federation, factory: ModelFactory, device: str = "cpu",
                 precision: str = "fp32") -> None:
        super().__init__(federation, factory)
        self.device = resolve_device(device)
        if precision not in PRECISIONS:  # not only at the first request (`compute_scope`)
            raise ConfigError("backend.precision", f"unknown value {precision!r}; allowed: "
                              f"{', '.join(PRECISIONS)}")
        self.precision = precision
        set_precision(self.device, precision)

    def execute(self, request: Any) -> Any:
        """`Backend.execute` inside the precision's scope (bf16 autocast for "bf16-mixed")."""
        with compute_scope(self.device, self.precision):
            return super().execute(request)


class SimulationBackend(DeviceBackend):
    """Executes requests for many clients at once with the vectorized engine.

    Args:
        federation: the clients' data.
        factory: the architecture.
        chunk_size: at most this many clients are stacked at a time (fewer when their
            optimizer state or batches would exceed the engine's budget); None or "auto": 64
            on the CPU, on a GPU as many as its free memory holds (`VectorizedEngine`).
        kernel: "auto" (fast paths for the built-in models, `torch.func` otherwise), or
            "mlp" / "cnn" / "generic" to force one; "cnn-grouped" / "cnn-im2col" also force
            how the CNN kernel convolves (`engine.stacked_cnn`).
        device: "cpu" (default), "cuda", "cuda:N" or "auto" (`engine.device`).
        precision: "fp32" or "tf32" (CUDA products).
        compact: keep inputs that are 8-bit values (images read from bytes) as uint8 on the
            device, decoded per batch, bit for bit; None: on a GPU only.
    """

    name = "simulation"
    Config = SimulationConfig

    def __init__(
        self,
        federation: Federation,
        factory: ModelFactory,
        chunk_size: int | str | None = None,
        *,
        kernel: str = "auto",
        device: str = "cpu",
        precision: str = "fp32",
        compact: bool | None = None,
    ) -> None:
        if chunk_size is not None and not is_chunk_size(chunk_size):  # 2.5 ran as 2, True as 1
            raise ConfigError("backend.chunk_size", f"{CHUNK_SIZES} or None (got {chunk_size!r})")
        super().__init__(federation, factory, device, precision)
        #: 8-bit inputs kept as uint8 codes on the device (`compact_inputs`); default: on a GPU
        self.compact = self.device.type == "cuda" if compact is None else bool(compact)
        tune_allocator()  # large reply tensors reuse heap memory (see engine.allocator)
        self.module = factory.build().to(self.device)
        chunk = None if chunk_size in (None, "auto") else int(chunk_size)
        self.engine = VectorizedEngine(self.module, factory.layout, kernel, chunk,
                                       input_shape=tuple(factory.input_shape))
        self._splits: dict[tuple[str, torch.dtype], SplitData] = {}

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        return cls(federation, factory, chunk_size=config.chunk_size,
                   device=getattr(config, "device", "auto"),
                   precision=getattr(config, "precision", "fp32"))

    # -------------------------------------------------------------- helpers
    def _split(self, name: str, dtype: torch.dtype) -> SplitData:
        """The split's data in `dtype` on the device (cast and moved once, cached). Inputs
        the federation stores as uint8 codes (`Federation.x_scale`) stay codes, decoded per
        batch, when they decode to `dtype` (float32); so do 8-bit inputs with `compact`."""
        key = (name, dtype)
        if key not in self._splits:
            fed = self.federation
            x, y, off = fed.stored(name)
            y = y.to(self.device, dtype if fed.task == "regression" else None).contiguous()
            if fed.x_scale is not None and dtype == torch.float32:
                self._splits[key] = SplitData(x.to(self.device).contiguous(), y, off,
                                              fed.x_scale, dtype)
                return self._splits[key]
            x = fed.decode(x)
            # token ids (a language model) stay integers: float16/bfloat16 would round them
            x = x.to(self.device, dtype if x.is_floating_point() else None).contiguous()
            codes = compact_inputs(x, dtype) if self.compact else None
            self._splits[key] = (SplitData(x, y, off) if codes is None else
                                 SplitData(codes, y, off, 255.0, dtype))
        return self._splits[key]

    def _rows(self, name: str, dtype: torch.dtype, clients: np.ndarray) -> tuple[SplitData, Rows]:
        data = self._split(name, dtype)
        return data, Rows.of(data.offsets, clients)

    def _offsets(
        self, pred: Predictor | None, split: str, clients: np.ndarray, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """Outputs of a frozen predictor on each client's rows (local order), in `dtype`."""
        if pred is None:
            return None
        data, rows = self._rows(split, pred.models.dtype, clients)
        return self.engine.predictor_outputs(data, rows, on(pred, self.device)).to(dtype)

    @staticmethod
    def _local_targets(data: SplitData, rows: Rows) -> torch.Tensor:
        pieces = [np.arange(s, s + n) for s, n in zip(rows.start, rows.size)]
        idx = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        return data.y.index_select(0, torch.from_numpy(idx.astype(np.int64)).to(data.y.device))

    # -------------------------------------------------------------- requests
    def train(self, req: pr.TrainRequest) -> pr.TrainReply:
        fed, clients = self.federation, as_index(req.clients)
        tr = req.training
        sizes = fed.train_sizes[clients]
        sched = batch_schedule(sizes, clients, tr.batch_size, tr.epochs, tr.steps, req.seed)
        dtype = req.models.dtype
        data, rows = self._rows("train", dtype, clients)
        offsets = self._offsets(req.offset, "train", clients, dtype)
        center, scale = prox_centers(req)
        params, loss = self.engine.train(
            data, rows, on(req.models, self.device), as_index(req.model_of_client), sched, tr,
            fed.task, offsets, req.seed, prox_center=on(center, self.device), prox_scale=scale,
            clients=clients,
        )
        return pr.TrainReply(clients.copy(), narrow(params, req.coords), sizes.copy(), loss)

    # -------------------------------------------------------------- mixtures
    def _sample_losses(self, split: str, models: torch.Tensor,
                       clients: np.ndarray) -> tuple[SplitData, Rows, torch.Tensor]:
        """Per-sample losses `[total, K]` of every model on the clients' rows (eval mode)."""
        data, rows = self._rows(split, models.dtype, clients)
        k = int(models.shape[0])
        if rows.total == 0:
            return data, rows, torch.zeros(0, k, dtype=torch.float64, device=self.device)
        out = self.engine.all_model_outputs(data, rows, on(models, self.device))  # [total, K, O]
        y = self._local_targets(data, rows)
        return data, rows, per_sample_losses(out, y, self.federation.task)

    def mixture_train(self, req: pr.MixtureTrainRequest) -> pr.MixtureTrainReply:
        fed, clients = self.federation, as_index(req.clients)
        tr, k, n = req.training, int(req.models.shape[0]), len(clients)
        sizes = fed.train_sizes[clients]
        data, rows, losses = self._sample_losses("train", req.models, clients)
        prior = torch.as_tensor(np.asarray(req.weights, np.float64), device=self.device)
        q = responsibilities(losses, prior[torch.from_numpy(
            np.repeat(np.arange(n), rows.size).astype(np.int64)).to(self.device)])
        mean_q = segment_mean(q, rows.size)
        pi = torch.where(torch.isnan(mean_q), prior, mean_q).cpu().numpy()
        # the K weighted trainings of every client as one request of k·n (client, component)
        rep = np.tile(clients, k)
        rows_k = Rows.of(data.offsets, rep)
        weight = q.t().reshape(-1)  # component 0's rows of all clients, then component 1, ...
        sched = mixture_schedule(sizes, clients, tr.batch_size, tr.epochs, tr.steps,
                                 req.seed, k)
        which = np.repeat(np.arange(k, dtype=np.int64), n)
        params, loss = self.engine.train(data, rows_k, on(req.models, self.device), which, sched,
                                         tr, fed.task, None, req.seed, sample_weight=weight,
                                         clients=rep)
        params = params.view(k, n, -1).transpose(0, 1).contiguous()
        return pr.MixtureTrainReply(clients.copy(), params, sizes.copy(),
                                    loss.reshape(k, n).sum(0), pi)

    def mixture_fit(self, req: pr.MixtureFitRequest) -> pr.MixtureFitReply:
        clients = as_index(req.clients)
        _, rows, losses = self._sample_losses(req.split, req.models, clients)
        pi, nll = fit_mixture(losses, rows.size, req.weights, req.iterations)
        return pr.MixtureFitReply(clients.copy(), pi, nll, rows.size.copy())

    def best_counts(self, req: pr.BestCountRequest) -> pr.BestCountReply:
        clients = as_index(req.clients)
        _, rows, losses = self._sample_losses(req.split, req.models, clients)
        return pr.BestCountReply(clients.copy(), best_counts(losses, rows.size), rows.size.copy())

    def gradient(self, req: pr.GradientRequest) -> pr.GradientReply:
        fed, clients = self.federation, as_index(req.clients)
        sizes = fed.train_sizes[clients]
        used = np.minimum(sizes, sizes if req.batch_size is None else req.batch_size)
        if len(clients) == 0:
            empty = req.models.new_zeros(0, self.factory.size)
            return pr.GradientReply(clients.copy(), narrow(empty, req.coords), used, np.zeros(0))
        batches = gradient_batches(sizes, clients, req.batch_size, req.seed)
        data, rows = self._rows("train", req.models.dtype, clients)
        grads, loss = self.engine.gradients(data, rows, on(req.models, self.device),
                                            as_index(req.model_of_client), batches, fed.task,
                                            req.seed, clients=clients)
        return pr.GradientReply(clients.copy(), narrow(grads, req.coords), used, loss)

    def losses(self, req: pr.LossRequest) -> pr.LossReply:
        fed, clients = self.federation, as_index(req.clients)
        k = req.models.shape[0]
        data, rows = self._rows(req.split, req.models.dtype, clients)
        loss = np.zeros((len(clients), k))
        acc = np.full((len(clients), k), np.nan)
        if len(clients) == 0:
            return pr.LossReply(clients.copy(), loss, acc)
        base = self._offsets(req.offset, req.split, clients, req.models.dtype)
        y = self._local_targets(data, rows)
        out = self.engine.all_model_outputs(data, rows, on(req.models, self.device))
        if base is not None:
            out = out + base.unsqueeze(1)
        if fed.task == "classification":  # cross-entropy of all K at once, no [total·K] copy
            picked = out.gather(-1, y.view(-1, 1, 1).expand(-1, k, 1)).squeeze(-1)
            per = torch.logsumexp(out, -1) - picked
        elif fed.task == "language_model":  # each sequence's mean token loss
            per = per_sample_losses(out, y, fed.task)
        else:
            flat = out.reshape(-1, out.shape[-1])
            per = per_sample_loss(flat, y.repeat_interleave(k, 0), fed.task)
            per = per.reshape(rows.total, k, -1).mean(-1)  # mean over outputs
        for j in range(k):
            loss[:, j] = mean_per_client(per[:, j], rows.size)
        if fed.task != "regression":  # a language model: the share of tokens right
            hit = (out.argmax(-1) == y.unsqueeze(1)).double()
            hit = hit.reshape(*hit.shape[:2], -1).mean(-1)
            for j in range(k):
                acc[:, j] = mean_per_client(hit[:, j], rows.size)
        return pr.LossReply(clients.copy(), loss, acc)

    def evaluate(self, req: pr.EvaluateRequest) -> pr.EvaluateReply:
        fed, clients = self.federation, as_index(req.clients)
        data, rows = self._rows(req.split, req.predictor.models.dtype, clients)
        out = self.engine.predictor_outputs(data, rows, on(req.predictor, self.device))
        y = self._local_targets(data, rows)
        m = client_metrics_batched(out, y, rows.size, fed.task, fed.n_classes,
                                   not_word_ids(fed))
        return pr.EvaluateReply(
            clients.copy(), m["accuracy"], m["macro_f1"], m["loss"], rows.size.copy(),
            task_extras(m, fed.task)
        )


def task_extras(m: dict[str, np.ndarray], task: str) -> dict[str, np.ndarray]:
    """An evaluation reply's extras: the clients' MSE, and for a language model their
    perplexities and, when its vocabulary is known, their word accuracies and word targets."""
    if task == "language_model":
        words = [k for k in (WORD_ACCURACY, WORD_TARGETS) if k in m]
        return {"mse": m["mse"], "perplexity": m["perplexity"], **{k: m[k] for k in words}}
    return {"mse": m["mse"]}


def prox_centers(req: pr.TrainRequest) -> tuple[torch.Tensor | None, np.ndarray | None]:
    """A request's per-client proximal centers `[n, d]` and strengths `[n]`: with
    `prox_models` `C` and `prox_weights` `A`, center_i = Σ_s A_is C_s / Σ_s A_is and
    scale_i = Σ_s A_is (the same gradient as mu/2 Σ_s A_is ||w − C_s||²); (None, None)
    without."""
    if req.prox_models is None or req.prox_weights is None:
        return None, None
    a = torch.as_tensor(np.asarray(req.prox_weights, np.float64))
    scale = a.sum(1)
    norm = torch.where(scale[:, None] > 0, a / scale.clamp_min(1e-300)[:, None], 0.0)
    with torch.autocast(req.prox_models.device.type, enabled=False):  # float32 centres
        centers = norm.to(req.prox_models.dtype) @ req.prox_models
    return centers, scale.numpy()
