"""`StandardBackend`: protocol requests as the messages a *standard* Flower ClientApp answers.

A standard ClientApp (Flower's quickstart convention) offers two functions and keeps no state
between messages:

- `"train"`: `RecordDict({"arrays": ArrayRecord, "config": ConfigRecord})` answered with
  `{"arrays": ArrayRecord, "metrics": MetricRecord}`, the metrics holding `num-examples` and
  usually `train_loss`;
- `"evaluate"`: the same content, answered with metrics only (`eval_loss`, `eval_acc`,
  `num-examples`).

This backend turns our requests into those messages (the methods' own server steps run
unchanged above it, `clusterfl.flower.ClusteredStrategy`):

- `TrainRequest`: one `"train"` per client, from the client's model
  (`models[model_of_client[i]]`), config `server-round`, `lr`, `local-epochs`, `local-steps`,
  `batch-size`, `seed`, `optimizer`, `momentum`, `weight-decay`, and `proximal-mu` when the
  training has a proximal term (Flower's FedProx convention); the returned model comes back
  (narrowed to `coords` by the server when the method asks for some coordinates), and
  `update = returned − sent` is the method's own step.
- `LossRequest` (K models): K `"evaluate"` messages per client, one per model, config
  `split = "train"`; `eval_loss` / `eval_acc` per model are the losses of whatever split the
  client evaluates: a standard client ignores `split` and uses its *evaluation* split, not its
  training data as in the papers.
- `EvaluateRequest` (one model per client): one `"evaluate"`; `eval_acc`, `eval_loss`,
  `num-examples`.
- `Steps`: its steps one after another (`protocol.run_steps`), a round trip each; a `Pick`
  (IFCA's least-loss model) is chosen on the server from the returned losses.

Models a method keeps "on the device" (`models_held`, Local's and FeSEM's warm-up models) are
sent with every message, from the server's copy: a standard client keeps nothing. Anything
else (gradients, signatures, data subspaces, mixtures, a predictor of several models, a
training offset, a proximal mix) needs a handler the standard client does not have unless it
adds it with a helper of `clusterfl.flower.client` and the strategy is told
(`StandardSession.extensions`): CAM's `train.offset` / `query.offset_losses` /
`evaluate.predictor` (`add_cam_handlers`), FedEM's and FedSoft's `train.mixture` /
`query.mixture` / `query.best_counts` / `train.prox` (`add_mixture_handlers`), ... Those
messages carry the models as ArrayRecords `model-j`, `offset-j`, `prox-j`, the weights as
config keys `weight-j` / `prox-weight-s`, and the client's number `client` (the seed of its
batch order, as in-process). Otherwise the request fails on the spot with one line naming
the handler the client must add and the helper that adds it. A client that offers
`query.losses` (the helper `add_losses_query`) gets a `LossRequest` as one message with the
K models instead of K evaluate messages (`StandardSession.extensions`).

The parameters travel as the architecture's `state_dict` (`ArrayRecord`): parameter entries
from the flat vector (`ParamLayout` order), buffers (BatchNorm statistics) from the model the
strategy was built with — buffers are not aggregated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self, cast

import numpy as np
import torch
from pydantic import Field

from clusterfl.backends.base import BackendConfig
from clusterfl.backends.flower.backend import FlowerBackend, FlowerSession, unusable
from clusterfl.data.federation import Federation
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.models import ModelFactory
from clusterfl.protocol import RE, Asks, Steps, client_seed, narrow, request_name, run_steps
from clusterfl.protocol import messages as pr

EXTENSIONS = {
    "GradientRequest": ("query.gradient", "add_gradient_query"),
    "EmbedRequest": ("query.signature", "add_signature_query"),
    "SubspaceRequest": ("query.subspace", "add_subspace_query"),
    "MixtureTrainRequest": ("train.mixture", "add_mixture_handlers"),
    "MixtureFitRequest": ("query.mixture", "add_mixture_handlers"),
    "BestCountRequest": ("query.best_counts", "add_mixture_handlers"),
    "offset training": ("train.offset", "add_cam_handlers"),
    "offset losses": ("query.offset_losses", "add_cam_handlers"),
    "proximal mix": ("train.prox", "add_mixture_handlers"),
    "combined predictor": ("evaluate.predictor", "add_cam_handlers or add_mixture_handlers"),
}
"""Requests a standard client cannot answer: the handler it would need, and the helper of
`clusterfl.flower.client` that adds it (None: no helper yet, the method needs our ClientApp)."""


class StandardConfig(BackendConfig):
    """`[backend] name = "flower_standard"` (set by `ClusteredStrategy`)."""

    name: Literal["flower_standard"] = "flower_standard"
    timeout: float = Field(600.0, gt=0.0, description="seconds to wait for the replies to one "
                           "request; a node silent that long is dropped from it")


@dataclass
class StandardSession(FlowerSession):
    """The Grid, the client → node map, the architecture's template `state_dict` and what the
    clients offer beyond train/evaluate (`extensions`, e.g. {"query.losses"})."""

    template: dict[str, torch.Tensor] = field(default_factory=dict)
    extensions: set[str] = field(default_factory=set)
    round: int = 1
    train_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Each client's training-set size: 1 until given (`ClusteredStrategy(train_sizes=)`) or
    learned from the `num-examples` of its first reply to a request on its training data
    (`on_training_data`). The method's `Context.train_sizes` is this array
    (`ServerFederation`), so it reads each size as soon as it is known."""
    sized: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Which clients' `train_sizes` are known (given or learned)."""
    log: Callable[[str], None] = print
    """Where the warnings about the clients' replies go (the strategy's `log`)."""

    def warn_once(self, key: str, line: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.log(f"flower: warning: {line}")

    def node(self, client: int) -> int | str:
        return self.node_of_client.get(int(client), f"of client {client}")


class ServerFederation(Federation):
    """The server's view of the standard clients' federation (shapes and sizes, no data),
    whose `train_sizes` is the session's live array (`StandardSession.train_sizes`) once
    `sizes` is set."""

    sizes: np.ndarray | None = None
    sized: np.ndarray | None = None  # which are known (`StandardSession.sized`)

    @property
    def train_sizes(self) -> np.ndarray:
        return super().train_sizes if self.sizes is None else self.sizes

    @property
    def known_train_sizes(self) -> np.ndarray:
        return self.train_sizes if self.sized is None else self.train_sizes[self.sized]


def on_training_data(request: Any) -> bool:
    """Whether a reply to `request` counts the client's training data in its `num-examples`
    (a train message by Flower's convention, FedEM's and FedSoft's steps on the training
    split, the helpers' signature and subspace queries), not its evaluation split."""
    if isinstance(request, pr.TrainRequest | pr.MixtureTrainRequest | pr.EmbedRequest
                  | pr.SubspaceRequest):
        return True
    return (isinstance(request, pr.BestCountRequest | pr.MixtureFitRequest)
            and request.split == "train")


def to_arrays(factory: ModelFactory, template: dict[str, torch.Tensor], flat: torch.Tensor
              ) -> Any:
    """A flat parameter vector as the architecture's `state_dict` in an `ArrayRecord`."""
    from flwr.app import ArrayRecord

    views = factory.layout.views(flat.detach().to(torch.float32).cpu())
    state = {k: (views[k].clone() if k in views else v) for k, v in template.items()}
    return ArrayRecord(state)


def from_arrays(factory: ModelFactory, arrays: Any, where: str) -> torch.Tensor:
    """The flat parameter vector of a returned `ArrayRecord` (every parameter must be there,
    with its shape)."""
    state = arrays.to_torch_state_dict()
    rows = []
    for e in factory.layout.entries:
        if e.name not in state:
            raise ClusterFLError(f"{where}: the returned arrays lack parameter {e.name!r} "
                                 f"(they hold {sorted(state)[:6]}...): the client's model is "
                                 "not the strategy's")
        t = torch.as_tensor(state[e.name], dtype=torch.float32)
        if tuple(t.shape) != e.shape:
            raise ClusterFLError(f"{where}: parameter {e.name!r} has shape {tuple(t.shape)}, "
                                 f"the strategy's model has {e.shape}")
        rows.append(t.reshape(-1))
    return torch.cat(rows)


def _metric(metrics: Any, keys: tuple[str, ...], default: float | None, where: str) -> float:
    for k in keys:
        if k in metrics:
            return float(metrics[k])
    if default is None:
        raise ClusterFLError(f"{where}: the reply's metrics have no {keys[0]!r} (they hold "
                             f"{sorted(metrics)}); a standard client reports it")
    return default


class StandardBackend(FlowerBackend):
    """Executes protocol requests on standard ClientApps (module docstring)."""

    name = "flower_standard"
    Config = StandardConfig  # type: ignore[assignment]  # its own table, not flower's

    def __init__(self, federation: Federation, factory: ModelFactory,
                 session: StandardSession) -> None:
        super().__init__(federation, factory, session)
        self.std = session

    @classmethod
    def from_config(cls, config: BackendConfig, federation: Federation,
                    factory: ModelFactory) -> Self:
        from clusterfl.backends.flower.backend import _ACTIVE  # `active_session`'s sessions

        session = _ACTIVE[-1] if _ACTIVE else None
        if not isinstance(session, StandardSession):
            raise ConfigError(
                "backend.name", "'flower_standard' runs inside a Flower ServerApp through "
                "clusterfl.flower.ClusteredStrategy (docs/flower.md)")
        backend = cls(federation, factory, session)
        session.backends.append(backend)
        return backend

    # ------------------------------------------------------------------ dispatch
    def execute(self, request: Asks[RE]) -> RE:
        if len(np.asarray(request.clients)) == 0:
            return request.empty_reply()
        route = _of_type(_ROUTES, request)
        if route is None:
            self._refuse(request, type(request).__name__)
        reply = cast(RE, getattr(self, cast(str, route))(request))
        self._learn_sizes(request, reply)
        return reply

    def _learn_sizes(self, request: Any, reply: Any) -> None:
        """Each answering client's training-set size from the `num-examples` of a reply on its
        training data (`on_training_data`), into `StandardSession.train_sizes`; a size that
        changes (another than given or learned before) is taken and said once per client."""
        if isinstance(request, Steps):
            for step, part in zip(request.steps, reply.replies):
                self._learn_sizes(step, part)
            return
        if not on_training_data(request) or len(self.std.train_sizes) == 0:
            return
        sizes, sized = self.std.train_sizes, self.std.sized
        for c, n in zip(np.asarray(reply.clients).tolist(),
                        np.asarray(reply.n_samples).tolist()):
            if sized[c] and int(sizes[c]) != int(n):
                self.std.warn_once(f"size {c}", (
                    f"node {self.std.node(c)} reports num-examples = {int(n)} in its "
                    f"{request_name(request)} reply, its training-set size was {int(sizes[c])} "
                    "(given in train_sizes or reported before); the method uses "
                    f"{int(n)} from now on"))
            sizes[c], sized[c] = int(n), True

    # each route: the standard message(s) one request type becomes (`_ROUTES`)
    def _route_steps(self, req: Steps) -> Any:
        if "train.pick" in self.std.extensions and _is_pick_train(req):
            return self._pick_train(req)
        return run_steps(self.execute, req)

    def _route_train(self, req: pr.TrainRequest) -> Any:
        if req.offset is None and req.prox_models is None:
            return self._train(req)
        self._need(req, "offset training" if req.offset is not None else "proximal mix")
        return self._offset_train(req)

    def _route_losses(self, req: pr.LossRequest) -> Any:
        if req.offset is None:
            return self._losses(req)
        self._need(req, "offset losses")
        return self._offset_losses(req)

    def _route_evaluate(self, req: pr.EvaluateRequest) -> Any:
        if req.predictor.combine == "single":
            return self._evaluate(req)
        self._need(req, "combined predictor")
        return self._combined(req)

    def _route_query(self, req: Any) -> Any:
        """A query only an extension answers (`_QUERIES`: its handler and our method)."""
        handler, method = cast(tuple[str, str], _of_type(_QUERIES, req))
        if handler not in self.std.extensions:
            self._refuse(req, type(req).__name__)
        return getattr(self, method)(req)

    def _route_mixture(self, req: Any) -> Any:
        self._need(req, type(req).__name__)
        return self._mixture(req)

    def _need(self, request: Asks[Any], what: str) -> None:
        """Raise the one-line error naming the handler `what` needs unless the clients offer
        it (`EXTENSIONS`)."""
        if EXTENSIONS.get(what, ("",))[0] not in self.std.extensions:
            self._refuse(request, what)

    def _refuse(self, request: Asks[Any], what: str) -> None:
        handler, helper = EXTENSIONS.get(what, ("a handler of our own", None))
        fix = (f"add it with clusterfl.flower.client.{helper}(app, ...) and tell the strategy "
               f"(extensions={{{handler!r}}})" if helper else
               "no helper exists for it yet: run this method with clusterfl's own ClientApp "
               "(clusterfl flower run)")
        raise ClusterFLError(f"a standard ClientApp cannot answer the {request_name(request)}: "
                             f"the method needs the client's {handler!r} handler; {fix}")

    # ------------------------------------------------------------------ CAM and mixtures
    def _records(self, prefix: str, models: torch.Tensor) -> dict[str, Any]:
        """`prefix-j` ArrayRecords of the rows of `models`."""
        return {f"{prefix}-{j}": to_arrays(self.factory, self.std.template, m)
                for j, m in enumerate(models)}

    def _ask_rich(self, clients: np.ndarray, kind: str,
                  content_of: Callable[[int, int], tuple[dict[str, torch.Tensor],
                                                         dict[str, Any]]]
                  ) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """One `kind` message per client: `content_of(i, c)` gives the model stacks by prefix
        (`model`, `offset`, `prox`: ArrayRecords `prefix-j`, `n-prefix` in the config) and
        the config; the client number `client` goes with it (its batch schedule's)."""
        from flwr.app import ConfigRecord, RecordDict

        items = []
        for i, c in enumerate(clients.tolist()):
            stacks, config = content_of(i, int(c))
            records: dict[str, Any] = {}
            for prefix, models in stacks.items():
                records.update(self._records(prefix, models))
                config[f"n-{prefix}"] = int(models.shape[0])
            records["config"] = ConfigRecord({**config, "client": int(c)})
            items.append((int(c), kind, RecordDict(records)))
        return self._answered(items)

    def _extended_config(self, req: pr.TrainRequest | pr.MixtureTrainRequest) -> dict[str, Any]:
        tr = req.training
        return {**self._train_config(cast(pr.TrainRequest, req)), "adam-beta1": tr.betas[0],
                "adam-beta2": tr.betas[1], "adam-eps": tr.eps}

    def _offset_train(self, req: pr.TrainRequest) -> pr.TrainReply:
        """CAM's training against a frozen offset (`"train.offset"`) or FedSoft's proximal
        mix (`"train.prox"`), one message per client (`add_cam_handlers`,
        `add_mixture_handlers`)."""
        clients = np.asarray(req.clients, dtype=np.int64)
        kind = "train.offset" if req.offset is not None else "train.prox"
        if req.offset is not None and (req.prox_models is not None or req.offset.combine
                                       not in ("single", "sum_logits")):
            raise ClusterFLError(f"the standard ClientApp's {kind!r} handler adds the offset's "
                                 "logits and has no proximal mix; this "
                                 f"{request_name(req)} needs clusterfl's own ClientApp")
        base = self._extended_config(req)

        def content(i: int, c: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            stacks = {"model": req.models[int(req.model_of_client[i])][None]}
            config = dict(base)
            if req.offset is not None:
                stacks["offset"] = req.offset.models[torch.from_numpy(
                    np.asarray(req.offset.members[i], dtype=np.int64))]
            if req.prox_models is not None and req.prox_weights is not None:
                stacks["prox"] = req.prox_models
                config.update({f"prox-weight-{s}": float(w)
                               for s, w in enumerate(np.asarray(req.prox_weights[i]))})
            return stacks, config

        answers, reasons = self._ask_rich(clients, kind, content)
        got = self._read_vectors(answers, reasons, kind, req.coords, pr.TrainReply,
                                 ("train_loss",))
        return self._assemble(req, clients, got, reasons)

    def _offset_losses(self, req: pr.LossRequest) -> pr.LossReply:
        """The K losses of model + frozen offset (`"query.offset_losses"`)."""
        clients = np.asarray(req.clients, dtype=np.int64)
        offset = cast(pr.Predictor, req.offset)
        answers, reasons = self._ask_rich(clients, "query.offset_losses", lambda i, c: (
            {"model": req.models, "offset": offset.models[torch.from_numpy(
                np.asarray(offset.members[i], dtype=np.int64))]},
            {"server-round": int(self.std.round), "split": req.split}))
        return self._loss_reply(req, clients, answers, reasons, "query.offset_losses")

    def _loss_reply(self, req: pr.LossRequest, clients: np.ndarray,
                    answers: list[tuple[int, Any]], reasons: dict[int, str], kind: str
                    ) -> pr.LossReply:
        """The K losses of each `kind` answer (`_k_losses`) as `req`'s reply."""
        got: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                got[c] = _k_losses(c, _first_metrics(msg), int(req.models.shape[0]),
                                   f"client {c}'s {kind} reply")
        return self._assemble(req, clients, got, reasons)

    def _combined(self, req: pr.EvaluateRequest) -> pr.EvaluateReply:
        """A predictor of several models (CAM's sum of logits, FedEM's mixture) evaluated by
        `"evaluate.predictor"`."""
        pred, clients = req.predictor, np.asarray(req.clients, dtype=np.int64)

        def content(i: int, c: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            config: dict[str, Any] = {"server-round": int(self.std.round),
                                      "split": req.split, "combine": pred.combine}
            if pred.weights is not None:
                config.update({f"weight-{j}": float(w)
                               for j, w in enumerate(np.asarray(pred.weights[i]))})
            return {"model": pred.models[torch.from_numpy(
                np.asarray(pred.members[i], dtype=np.int64))]}, config

        answers, reasons = self._ask_rich(clients, "evaluate.predictor", content)
        return self._evaluated(req, clients, answers, reasons)

    def _mixture(self, req: pr.MixtureTrainRequest | pr.MixtureFitRequest
                 | pr.BestCountRequest) -> Any:
        """FedEM's and FedSoft's client steps (`add_mixture_handlers`): `"train.mixture"`,
        `"query.mixture"`, `"query.best_counts"`, one message per client with the K models."""
        clients = np.asarray(req.clients, dtype=np.int64)
        k = int(req.models.shape[0])
        kind = cast(str, _of_type(_MIXTURE_KINDS, req))
        if kind == "train.mixture":
            base = self._extended_config(cast(pr.MixtureTrainRequest, req))
        elif kind == "query.mixture":
            fit = cast(pr.MixtureFitRequest, req)
            base = {"iterations": int(fit.iterations), "split": fit.split}
        else:
            base = {"split": cast(pr.BestCountRequest, req).split}
        base["server-round"] = int(self.std.round)
        weights = getattr(req, "weights", None)

        def content(i: int, c: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
            config = dict(base)
            if weights is not None:
                config.update({f"weight-{j}": float(w)
                               for j, w in enumerate(np.asarray(weights[i]))})
            return {"model": req.models}, config

        answers, reasons = self._ask_rich(clients, kind, content)
        got: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                m, where = _first_metrics(msg), f"client {c}'s {kind} reply"
                n = np.array([_metric(m, ("num-examples",), None, where)])
                if kind == "query.best_counts":
                    got[c] = pr.BestCountReply(np.array([c]), np.array(
                        [[int(_metric(m, (f"count-{j}",), None, where)) for j in range(k)]],
                        dtype=np.int64), n.astype(np.int64))
                    continue
                pi = np.array([[_metric(m, (f"weight-{j}",), None, where) for j in range(k)]])
                if kind == "query.mixture":
                    got[c] = pr.MixtureFitReply(np.array([c]), pi,
                                                np.array([_metric(m, ("loss",), math.nan, where)]),
                                                n)
                    continue
                records = msg.content.array_records
                missing = [f"model-{j}" for j in range(k) if f"model-{j}" not in records]
                if missing:
                    reasons[c] = f"{where} lacks the ArrayRecords {missing}"
                    continue
                params = torch.stack([from_arrays(self.factory, records[f"model-{j}"], where)
                                      for j in range(k)])
                got[c] = pr.MixtureTrainReply(np.array([c]), params[None], n,
                                              np.array([_metric(m, ("train_loss",), math.nan,
                                                                where)]), pi)
        return self._assemble(cast(Any, req), clients, got, reasons)

    def _send(self, items: list[tuple[int, str, Any]], asked: Any = None
              ) -> tuple[list[Any | None], dict[int, str]]:
        """`FlowerBackend._send`, then one warning per node for what its replies hold that
        the strategy never reads (`unread_parts`), each part said once."""
        replies, reasons = super()._send(items, asked)
        for (c, kind, _), msg in zip(items, replies):
            if msg is None:
                continue
            node = self.std.node(int(c))
            new = [p for p in unread_parts(msg) if f"unread {node} {p}" not in self.std.warned]
            if new:
                self.std.warned.update(f"unread {node} {p}" for p in new)
                self.std.log(f"flower: warning: node {node}'s {kind} reply holds {', '.join(new)}, "
                             "which the strategy never reads (it reads the first MetricRecord's "
                             "num-examples, train_loss, eval_loss, eval_acc, ... and the "
                             "ArrayRecord: docs/flower.md)")
        return replies, reasons

    def _ask_each(self, clients: np.ndarray, kind: str,
                  model_of: Callable[[int], torch.Tensor], config: dict[str, Any]
                  ) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """One `kind` message per client (client i gets `model_of(i)` and `config`); the
        (client, reply) of those that answered, and why the others did not."""
        return self._answered([(int(c), kind, self._content(model_of(i), config))
                               for i, c in enumerate(clients.tolist())])

    def _answered(self, items: list[tuple[int, str, Any]]
                  ) -> tuple[list[tuple[int, Any]], dict[int, str]]:
        """`_send(items)`: the (client, reply) of those that answered, and why the others
        did not."""
        replies, reasons = self._send(items)
        return [(c, msg) for (c, _, _), msg in zip(items, replies) if msg is not None], reasons

    def _content(self, model: torch.Tensor, config: dict[str, Any]) -> Any:
        from flwr.app import ConfigRecord, RecordDict

        return RecordDict({"arrays": to_arrays(self.factory, self.std.template, model),
                           "config": ConfigRecord(config)})

    def _train_config(self, req: pr.TrainRequest) -> dict[str, Any]:
        tr = req.training
        config: dict[str, Any] = {
            "server-round": int(self.std.round), "lr": float(tr.lr),
            "local-epochs": int(tr.epochs), "local-steps": int(tr.steps),
            "batch-size": int(tr.batch_size), "seed": int(req.seed),
            "optimizer": tr.optimizer, "momentum": float(tr.momentum),
            "weight-decay": float(tr.weight_decay)}
        if tr.mu:
            config["proximal-mu"] = float(tr.mu)
        return config

    def _pick_train(self, req: Steps) -> Any:
        """IFCA's round in one `"train.pick"` message per client (`add_pick_train`): the K
        models, the client's losses and its least-loss model's training come back together."""
        from flwr.app import ConfigRecord, RecordDict

        from clusterfl.protocol import steps_reply

        loss_req, train_req = cast(pr.LossRequest, req.steps[0]), cast(pr.TrainRequest,
                                                                       req.steps[1])
        k = int(train_req.models.shape[0])
        clients = np.asarray(train_req.clients, dtype=np.int64)
        config = {**self._train_config(train_req), "n-models": k, "pick-by": req.picks[0].by}
        items = []
        for c in clients.tolist():
            content = RecordDict({**{f"model-{j}": to_arrays(
                self.factory, self.std.template, train_req.models[j]) for j in range(k)},
                "config": ConfigRecord(config)})
            items.append((int(c), "train.pick", content))
        answers, reasons = self._answered(items)
        losses: dict[int, Any] = {}
        trained: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                where = f"client {c}'s train.pick reply"
                m = _first_metrics(msg)
                params = _returned(self.factory, msg, where, train_req.coords)
                if isinstance(params, str):
                    reasons[c] = params
                    continue
                loss = _k_losses(c, m, k, where)
                trained[c] = pr.TrainReply(
                    np.array([c]), params,
                    np.array([_metric(m, ("num-examples",), None, where)]),
                    np.array([_metric(m, ("train_loss",), math.nan, where)]))
                losses[c] = loss  # both read, or neither kept
        return steps_reply(clients, [self._assemble(loss_req, clients, losses, reasons),
                                     self._assemble(train_req, clients, trained, {})])

    def _gradient(self, req: pr.GradientRequest) -> pr.GradientReply:
        """Gradients at each client's model, one `"query.gradient"` per client
        (`add_gradient_query`); config `batch-size` (0: all its training data) and `seed`."""
        config = {"server-round": int(self.std.round), "seed": int(req.seed),
                  "batch-size": int(req.batch_size or 0)}
        return self._vectors(req, "query.gradient", config, pr.GradientReply,
                             ("loss", "train_loss"))

    def _vectors(self, req: pr.TrainRequest | pr.GradientRequest, kind: str,
                 config: dict[str, Any], reply: Callable[..., RE],
                 loss_keys: tuple[str, ...]) -> RE:
        """One `kind` message per client with its model and `config`; each answer's vector
        (its one ArrayRecord: a trained model or a gradient), `num-examples` and loss (the
        first of `loss_keys` it reports) as a `reply` (TrainReply or GradientReply)."""
        clients = np.asarray(req.clients, dtype=np.int64)
        answers, reasons = self._ask_each(clients, kind, lambda i: req.models[
            int(req.model_of_client[i])], config)
        got = self._read_vectors(answers, reasons, kind, req.coords, reply, loss_keys)
        return cast(RE, self._assemble(cast(Any, req), clients, got, reasons))

    def _read_vectors(self, answers: Any, reasons: dict[int, str], kind: str, coords: Any,
                      reply: Callable[..., Any], loss_keys: tuple[str, ...]) -> dict[int, Any]:
        """Each answer's vector (its one ArrayRecord), `num-examples` and loss (the first of
        `loss_keys` it reports) as a one-client `reply`; an unusable answer's reason goes to
        `reasons` instead."""
        got: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                where = f"client {c}'s {kind} reply"
                vector = _returned(self.factory, msg, where, coords)
                if isinstance(vector, str):
                    reasons[c] = vector
                    continue
                m = _first_metrics(msg)
                got[c] = reply(np.array([c]), vector,
                               np.array([_metric(m, ("num-examples",), None, where)]),
                               np.array([_metric(m, loss_keys, math.nan, where)]))
        return got

    def _signature(self, req: pr.EmbedRequest) -> pr.EmbedReply:
        """FLT's and PCA+kM+HC's data signatures, one `"query.signature"` per client
        (`add_signature_query`); each client's seed is the one the in-process backends give
        it (`client_seed`), so a client with the same data returns the same signature."""
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        clients = np.asarray(req.clients, dtype=np.int64)
        base: dict[str, Any] = {"method": str(req.method), "signature-dim": int(req.signature_dim),
                "k": int(req.k), "latent": int(req.latent),
                "finetune-epochs": int(req.finetune_epochs),
                "finetune-lr": float(req.finetune_lr),
                "finetune-batch-size": int(req.finetune_batch_size),
                "pca-components": int(req.pca_components),
                "kmeans-n-init": int(req.kmeans_n_init)}
        encoder = (None if req.encoder is None else
                   ArrayRecord({"encoder": req.encoder.detach().cpu().contiguous()}))
        items = []
        for c in clients.tolist():
            content: dict[str, Any] = {
                "config": ConfigRecord({**base, "seed": client_seed(req.seed, c)})}
            if encoder is not None:
                content["encoder"] = encoder
            items.append((int(c), "query.signature", RecordDict(content)))
        answers, reasons = self._answered(items)
        got: dict[int, Any] = {}
        want = (int(req.k), int(req.signature_dim))
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                where = f"client {c}'s query.signature reply"
                sig = np.asarray(msg.content.array_records["arrays"].to_torch_state_dict()
                                 ["signatures"], dtype=np.float64)
                if sig.shape != want:
                    reasons[c] = f"{where}: signatures of shape {sig.shape}, expected {want}"
                    continue
                n = _metric(_first_metrics(msg), ("num-examples",), None, where)
                got[c] = pr.EmbedReply(np.array([c]), sig[None], np.array([n]))
        return self._assemble(req, clients, got, reasons)

    def _subspace(self, req: pr.SubspaceRequest) -> pr.SubspaceReply:
        """PACFL's data subspaces, one `"query.subspace"` per client (`add_subspace_query`)."""
        from flwr.app import ConfigRecord, RecordDict

        clients = np.asarray(req.clients, dtype=np.int64)
        config = ConfigRecord({"input-dim": int(req.input_dim), "p": int(req.p),
                               "per-label": bool(req.per_label), "n-labels": int(req.n_labels),
                               "rtol": float(req.rtol)})
        answers, reasons = self._answered([(int(c), "query.subspace",
                                            RecordDict({"config": config}))
                                           for c in clients.tolist()])
        got: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                where = f"client {c}'s query.subspace reply"
                m = _first_metrics(msg)
                basis = np.asarray(next(iter(msg.content.array_records.values()))
                                   .to_torch_state_dict()["basis"], dtype=np.float64)
                if basis.shape != (int(req.input_dim), req.columns()):
                    reasons[c] = (f"{where}: basis of shape {basis.shape}, expected "
                                  f"{(int(req.input_dim), req.columns())}")
                    continue
                got[c] = pr.SubspaceReply(np.array([c]), basis[None],
                                          np.array([int(_metric(m, ("rank",), None, where))]),
                                          np.array([_metric(m, ("num-examples",), None, where)]))
        return self._assemble(req, clients, got, reasons)

    def _train(self, req: pr.TrainRequest) -> pr.TrainReply:
        return self._vectors(req, "train", self._train_config(req), pr.TrainReply,
                             ("train_loss", "train-loss", "loss"))

    def _losses(self, req: pr.LossRequest) -> pr.LossReply:
        clients = np.asarray(req.clients, dtype=np.int64)
        k = int(req.models.shape[0])
        config: dict[str, Any] = {"server-round": int(self.std.round)}
        if "query.losses" in self.std.extensions:  # one message with the K models
            from flwr.app import ConfigRecord, RecordDict

            items = []
            for c in clients.tolist():
                content = RecordDict({**{f"model-{j}": to_arrays(
                    self.factory, self.std.template, req.models[j]) for j in range(k)},
                    "config": ConfigRecord({**config, "n-models": k, "split": req.split})})
                items.append((int(c), "query.losses", content))
            answers, reasons = self._answered(items)
            return self._loss_reply(req, clients, answers, reasons, "query.losses")
        config["split"] = req.split  # honoured by a client that can (the paper's: "train")
        items = [(int(c), "evaluate", self._content(req.models[j], config))
                 for c in clients.tolist() for j in range(k)]
        replies, reasons = self._send(items)
        got: dict[int, Any] = {}
        for i, c in enumerate(clients.tolist()):
            with unusable(reasons, c):  # this client dropped, the reason kept
                mine = replies[i * k:(i + 1) * k]
                if any(m is None for m in mine):
                    reasons.setdefault(c, "not every model's evaluation came back")
                    continue
                where = f"client {c}'s evaluate reply"
                ms = [_first_metrics(m) for m in mine]
                got[c] = pr.LossReply(
                    np.array([c]),
                    np.array([[_metric(m, ("eval_loss", "eval-loss", "loss"), None, where)
                               for m in ms]]),
                    np.array([[_metric(m, ACCURACY_KEYS, math.nan, where)
                               for m in ms]]))
        return self._assemble(req, clients, got, reasons)

    def _evaluate(self, req: pr.EvaluateRequest) -> pr.EvaluateReply:
        pred = req.predictor
        clients = np.asarray(req.clients, dtype=np.int64)
        answers, reasons = self._ask_each(clients, "evaluate", lambda i: pred.models[
            int(pred.members[i, 0])], {"server-round": int(self.std.round)})
        return self._evaluated(req, clients, answers, reasons)

    def _evaluated(self, req: pr.EvaluateRequest, clients: np.ndarray,
                   answers: list[tuple[int, Any]], reasons: dict[int, str]) -> pr.EvaluateReply:
        got: dict[int, Any] = {}
        for c, msg in answers:
            with unusable(reasons, c):  # this client dropped, the reason kept
                where = f"client {c}'s evaluate reply"
                m = _first_metrics(msg)
                if not any(k in m for k in ACCURACY_KEYS):
                    other = ", ".join(map(repr, ACCURACY_KEYS[1:]))
                    self.std.warn_once(f"accuracy {c}", (
                        f"node {self.std.node(c)}'s evaluate reply has no "
                        f"{ACCURACY_KEYS[0]!r} metric (nor {other}; it holds {sorted(m)}): "
                        "its accuracy is unknown and left out of the rounds' accuracy (None "
                        "when no node reports one)"))
                got[c] = pr.EvaluateReply(
                    np.array([c]),
                    np.array([_metric(m, ACCURACY_KEYS, math.nan, where)]),
                    np.array([math.nan]),
                    np.array([_metric(m, ("eval_loss", "eval-loss", "loss"), math.nan, where)]),
                    np.array([_metric(m, ("num-examples",), None, where)]))
        return self._assemble(req, clients, got, reasons)


ACCURACY_KEYS = ("eval_acc", "eval-acc", "accuracy")
"""The metric an evaluate reply gives its accuracy in (the first it holds)."""


def _of_type(table: dict[type, Any], value: Any) -> Any:
    """`table`'s entry for `value`'s type, or for the nearest base class that has one (a
    request type of one's own built on ours takes its route); None without one."""
    return next((table[c] for c in type(value).__mro__ if c in table), None)


_ROUTES: dict[type, str] = {
    Steps: "_route_steps", pr.TrainRequest: "_route_train", pr.LossRequest: "_route_losses",
    pr.EvaluateRequest: "_route_evaluate", pr.SubspaceRequest: "_route_query",
    pr.EmbedRequest: "_route_query", pr.GradientRequest: "_route_query",
    pr.MixtureTrainRequest: "_route_mixture", pr.MixtureFitRequest: "_route_mixture",
    pr.BestCountRequest: "_route_mixture"}
"""Which route of `StandardBackend` each request type takes (a subclass: its base's)."""
_QUERIES: dict[type, tuple[str, str]] = {
    pr.SubspaceRequest: ("query.subspace", "_subspace"),
    pr.EmbedRequest: ("query.signature", "_signature"),
    pr.GradientRequest: ("query.gradient", "_gradient")}
"""The queries only an extension answers: the client handler each needs, our method."""
_MIXTURE_KINDS: dict[type, str] = {
    pr.MixtureTrainRequest: "train.mixture", pr.MixtureFitRequest: "query.mixture",
    pr.BestCountRequest: "query.best_counts"}
"""The message kind of FedEM's and FedSoft's client steps (`add_mixture_handlers`)."""


def _is_pick_train(req: Steps) -> bool:
    """IFCA's shape: the K losses, then training of the least-loss model (one `Pick`)."""
    if len(req.steps) != 2 or len(req.picks) != 1:
        return False
    if tuple(_of_type(_ROUTES, s) for s in req.steps) != ("_route_losses", "_route_train"):
        return False
    loss, train = cast(pr.LossRequest, req.steps[0]), cast(pr.TrainRequest, req.steps[1])
    p = req.picks[0]
    return ((p.step, p.source, p.into) == (1, 0, "model") and loss.offset is None
            and train.offset is None and train.prox_models is None
            and np.array_equal(np.asarray(loss.clients), np.asarray(train.clients))
            and torch.equal(loss.models, train.models))


def _returned(factory: ModelFactory, msg: Any, where: str,
              coords: np.ndarray | None) -> torch.Tensor | str:
    """The `[1, d]` (or `[1, d̂]` with `coords`) vector of a reply's one ArrayRecord, or why
    the reply is unusable: not exactly one ArrayRecord, or a parameter missing or of another
    shape (the client is dropped from the request with that reason, as a silent one is)."""
    arrays = list(msg.content.array_records.values())
    if len(arrays) != 1:
        return f"{where} holds {len(arrays)} ArrayRecords, not one"
    try:
        return narrow(from_arrays(factory, arrays[0], where)[None], coords)
    except ClusterFLError as exc:
        return str(exc)


READ_METRICS = re.compile(r"num-examples|train_loss|loss|eval_loss|eval-loss|eval_acc|"
                          r"eval-acc|accuracy|rank|cluster|picked|(loss|acc|weight|count)-\d+")
"""The metrics the strategy reads from a reply's first MetricRecord for some message (the
probe's `cluster` included; `picked`, `add_pick_train`'s note of the model it trained, is
the helper's own): a key outside them is never read."""


def unread_parts(msg: Any) -> list[str]:
    """What a standard client's reply holds that the strategy never reads: metrics outside
    `READ_METRICS`, MetricRecords after the first, ConfigRecords."""
    metrics = list(msg.content.metric_records.items())
    out = [repr(k) for k in (metrics[0][1] if metrics else {}) if not READ_METRICS.fullmatch(k)]
    out += [f"MetricRecord {name!r}" for name, _ in metrics[1:]]
    return out + [f"ConfigRecord {name!r}" for name in msg.content.config_records]


def _k_losses(c: int, m: Any, k: int, where: str) -> pr.LossReply:
    """Client `c`'s losses of K models from its metrics `m`: `loss-j` (required) and `acc-j`
    (NaN when missing)."""
    return pr.LossReply(
        np.array([c]), np.array([[_metric(m, (f"loss-{j}",), None, where) for j in range(k)]]),
        np.array([[_metric(m, (f"acc-{j}",), math.nan, where) for j in range(k)]]))


def _first_metrics(msg: Any) -> Any:
    records = list(msg.content.metric_records.values())
    return records[0] if records else {}


__all__ = ["ACCURACY_KEYS", "EXTENSIONS", "ServerFederation", "StandardBackend",
           "StandardConfig", "StandardSession", "from_arrays", "on_training_data", "to_arrays"]
