"""Helpers a Flower ClientApp adds for the clustered methods that need more than the standard
`"train"` / `"evaluate"` (docs/flower.md). Importing this module imports only flwr, numpy and
torch; a handler imports the one clusterfl function it computes with when it first runs
(`clusterfl.protocol.steps.pick_rows`, `clusterfl.engine.subspace.client_subspace`: numpy and
torch only).

Each helper registers one handler on the app and takes the app's own functions:

- `add_losses_query(app, evaluate_model)`: `"query.losses"`, the K models of a message
  evaluated at once (IFCA's and FeSEM's cluster-identity losses in one message instead of K
  evaluate messages). `evaluate_model(state_dict, context, split) -> (loss, accuracy)`,
  `split` being `"train"` (the papers' losses: on the training data) or `"test"`.
- `add_pick_train(app, evaluate_model, train_model)`: `"train.pick"`, IFCA's whole round in
  one message as its paper describes the client's step: the K models' training losses, the
  least-loss model ĵ, local training of θ_ĵ. `train_model(state_dict, config, context) ->
  (state_dict, num_examples, train_loss)` is the app's own training.
- `add_subspace_query(app, load_train)`: `"query.subspace"`, PACFL's one-off data subspace
  (the p leading left singular vectors of the client's data, per label or whole).
  `load_train(context) -> (x, y)` returns the client's training inputs and labels.
- `add_signature_query(app, load_train)`: `"query.signature"`, the one-off data signature of
  FLT (k k-means centroids of the client's images embedded by the sent encoder, optionally
  fine-tuned) and of the PCA+kM+HC baseline (k-means in the client's PCA space, centroids
  mapped back). Its handler computes with `clusterfl.engine.signatures.client_signature`,
  so the client needs clusterfl with scikit-learn installed (the import happens when the
  first query arrives, not when the helper is added).
- `add_gradient_query(app, gradient_model)`: `"query.gradient"`, the gradient of the
  training loss at the sent model (IFCA's gradient averaging, CFL-GP's gradient protocol).
  `gradient_model(state_dict, config, context) -> (gradients, num_examples, loss)`, the
  gradients keyed by the parameters' names; `config["batch-size"]` (0: all the training
  data) and `config["seed"]` say which samples.

- `add_cam_handlers(app, make_model, load_data)`: `"train.offset"`, `"query.offset_losses"`,
  `"evaluate.predictor"` (`CAM_HANDLERS`), the client steps of IFCA-CAM and FeSEM-CAM.
- `add_mixture_handlers(app, make_model, load_data)`: `"train.mixture"`, `"query.mixture"`,
  `"query.best_counts"`, `"train.prox"`, `"evaluate.predictor"` (`MIXTURE_HANDLERS`), the
  client steps of FedEM and FedSoft.
  These two take the app's architecture (`make_model() -> nn.Module`) and data
  (`load_data(context, split) -> (x, y)`) and compute with clusterfl's reference arithmetic
  (`clusterfl.engine.reference`, `engine.common`, `engine.schedule`: numpy and torch only),
  because their training needs the loss itself (an added frozen model's logits, per-sample
  weights, a pull toward several models), which an app's `train` function does not expose.

The strategy uses a handler when told the clients offer it (`ClusteredStrategy(...,
extensions={"train.pick"})`); a method that needs a handler the strategy was not told of
fails on its first such request with one line naming the helper.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

StateDict = dict[str, torch.Tensor]


def _models(msg: Message) -> list[StateDict]:
    config: Any = msg.content["config"]
    k = int(config["n-models"])
    records = msg.content.array_records
    return [records[f"model-{j}"].to_torch_state_dict() for j in range(k)]


def add_losses_query(app: Any, evaluate_model: Callable[[StateDict, Context, str],
                                                        tuple[float, float]]) -> None:
    """Register `"query.losses"` (module docstring) on `app`."""

    @app.query("losses")
    def losses(msg: Message, context: Context) -> Message:
        config: Any = msg.content["config"]
        split = str(config.get("split", "train"))
        metrics: dict[str, Any] = {}
        for j, state in enumerate(_models(msg)):
            loss, acc = evaluate_model(state, context, split)
            metrics[f"loss-{j}"], metrics[f"acc-{j}"] = float(loss), float(acc)
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def add_pick_train(app: Any,
                   evaluate_model: Callable[[StateDict, Context, str], tuple[float, float]],
                   train_model: Callable[[StateDict, Any, Context], tuple[StateDict, int, float]]
                   ) -> None:
    """Register `"train.pick"` (module docstring) on `app`."""

    @app.train("pick")
    def pick(msg: Message, context: Context) -> Message:
        from clusterfl.protocol.steps import pick_rows

        config: Any = msg.content["config"]
        models = _models(msg)
        scores = [evaluate_model(state, context, "train") for state in models]
        loss = np.array([[s[0] for s in scores]], dtype=np.float64)
        acc = np.array([[s[1] for s in scores]], dtype=np.float64)
        j = int(pick_rows(loss, acc, "accuracy" if config.get("pick-by") == "accuracy"
                          else "loss")[0])
        state, n, train_loss = train_model(models[j], config, context)
        metrics: dict[str, Any] = {
            "num-examples": int(n), "train_loss": float(train_loss), "picked": j,
            **{f"loss-{i}": float(loss[0, i]) for i in range(len(models))},
            **{f"acc-{i}": float(acc[0, i]) for i in range(len(models))}}
        return Message(RecordDict({"arrays": ArrayRecord(state),
                                   "metrics": MetricRecord(metrics)}), reply_to=msg)


def add_subspace_query(app: Any, load_train: Callable[[Context], tuple[Any, Any]]) -> None:
    """Register `"query.subspace"` (module docstring) on `app`."""

    @app.query("subspace")
    def subspace(msg: Message, context: Context) -> Message:
        from clusterfl.engine.subspace import client_subspace
        from clusterfl.protocol.messages import SubspaceRequest

        c: Any = msg.content["config"]
        request = SubspaceRequest(np.zeros(1, dtype=np.int64), int(c["input-dim"]),
                                  int(c["p"]), bool(c["per-label"]), int(c["n-labels"]),
                                  float(c["rtol"]))
        x, y = load_train(context)
        x, y = torch.as_tensor(x), (None if y is None else torch.as_tensor(y))
        basis, rank = client_subspace(x, y, request)
        return Message(RecordDict({
            "arrays": ArrayRecord({"basis": torch.from_numpy(np.ascontiguousarray(basis))}),
            "metrics": MetricRecord({"rank": int(rank), "num-examples": len(x)})}),
            reply_to=msg)


def add_signature_query(app: Any, load_train: Callable[[Context], tuple[Any, Any]]) -> None:
    """Register `"query.signature"` (module docstring) on `app`."""

    @app.query("signature")
    def signature(msg: Message, context: Context) -> Message:
        from clusterfl.engine.signatures import client_signature
        from clusterfl.protocol.messages import EmbedRequest

        c: Any = msg.content["config"]
        arrays = msg.content.array_records
        encoder = (arrays["encoder"].to_torch_state_dict()["encoder"]
                   if "encoder" in arrays else None)
        request = EmbedRequest(
            np.zeros(1, dtype=np.int64), str(c["method"]), encoder, int(c["signature-dim"]),
            k=int(c["k"]), latent=int(c["latent"]), finetune_epochs=int(c["finetune-epochs"]),
            finetune_lr=float(c["finetune-lr"]),
            finetune_batch_size=int(c["finetune-batch-size"]),
            pca_components=int(c["pca-components"]), kmeans_n_init=int(c["kmeans-n-init"]))
        x, y = load_train(context)
        x, y = torch.as_tensor(x), (None if y is None else torch.as_tensor(y))
        sig = client_signature(x, y, request, int(c["seed"]))
        return Message(RecordDict({
            "arrays": ArrayRecord({"signatures": torch.from_numpy(np.ascontiguousarray(sig))}),
            "metrics": MetricRecord({"num-examples": len(x)})}), reply_to=msg)


def add_gradient_query(app: Any,
                       gradient_model: Callable[[StateDict, Any, Context],
                                                tuple[StateDict, int, float]]) -> None:
    """Register `"query.gradient"` (module docstring) on `app`."""

    @app.query("gradient")
    def gradient(msg: Message, context: Context) -> Message:
        state = msg.content.array_records["arrays"].to_torch_state_dict()
        grads, n, loss = gradient_model(state, msg.content["config"], context)
        return Message(RecordDict({
            "arrays": ArrayRecord({k: torch.as_tensor(v) for k, v in grads.items()}),
            "metrics": MetricRecord({"num-examples": int(n), "loss": float(loss)})}),
            reply_to=msg)


# ------------------------------------------------------------------ CAM and the mixtures
CAM_HANDLERS = ("train.offset", "query.offset_losses", "evaluate.predictor")
"""What `add_cam_handlers` registers: the strategy's `extensions` for IFCA-CAM / FeSEM-CAM."""
MIXTURE_HANDLERS = ("train.mixture", "query.mixture", "query.best_counts", "train.prox",
                    "evaluate.predictor")
"""What `add_mixture_handlers` registers: the strategy's `extensions` for FedEM / FedSoft."""

LoadData = Callable[[Context, str], tuple[Any, Any]]


class _Step:
    """One message's computation on the client (the CAM and mixture handlers).

    The message holds ArrayRecords `model-j` (`config["n-model"]` of them), `offset-j` and
    `prox-j` (the same), state dicts of the app's architecture; they become flat vectors of
    `make_model()`'s parameters, and the computations are clusterfl's reference arithmetic
    (`clusterfl.engine.reference`, `engine.common`: numpy and torch only), with the batch
    schedule of the in-process backends for the server's client number `config["client"]`
    and `config["seed"]`, so that a client holding the data of a clusterfl federation
    computes what `clusterfl run` computes for it."""

    def __init__(self, make_model: Callable[[], Any], load_data: LoadData, msg: Message,
                 context: Context) -> None:
        self.module = make_model()
        config: Any = msg.content["config"]
        self.config: Any = config
        self.records = msg.content.array_records
        self.load_data, self.context = load_data, context
        self.client, self.seed = int(config.get("client", 0)), int(config.get("seed", 0))

    def flats(self, prefix: str) -> list[torch.Tensor]:
        from clusterfl.models.params import get_flat

        out = []
        for j in range(int(self.config.get(f"n-{prefix}", 0))):
            self.module.load_state_dict(self.records[f"{prefix}-{j}"].to_torch_state_dict())
            out.append(get_flat(self.module))
        return out

    def arrays(self, flat: torch.Tensor) -> ArrayRecord:
        from clusterfl.models.params import set_flat

        set_flat(self.module, flat)
        return ArrayRecord({k: v.detach().clone() for k, v in self.module.state_dict().items()})

    def data(self, split: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.load_data(self.context, split or str(self.config.get("split", "train")))
        return torch.as_tensor(x), torch.as_tensor(y)

    def weights(self) -> np.ndarray:
        return np.array([float(self.config[f"weight-{j}"])
                         for j in range(int(self.config.get("n-model", 0)))])

    def training(self) -> Any:
        from clusterfl.protocol import LocalTraining

        c = self.config
        optimizer: Any = str(c.get("optimizer", "sgd"))
        return LocalTraining(optimizer=optimizer, lr=float(c["lr"]),
                             momentum=float(c.get("momentum", 0.0)),
                             weight_decay=float(c.get("weight-decay", 0.0)),
                             batch_size=int(c["batch-size"]), epochs=int(c["local-epochs"]),
                             steps=int(c["local-steps"]), mu=float(c.get("proximal-mu", 0.0)),
                             betas=(float(c.get("adam-beta1", 0.9)),
                                    float(c.get("adam-beta2", 0.999))),
                             eps=float(c.get("adam-eps", 1e-8)))

    def schedule(self, n: int, seed: int) -> torch.Tensor:
        from clusterfl.engine.schedule import batch_schedule

        tr = self.training()
        return torch.from_numpy(batch_schedule(np.array([n]), np.array([self.client]),
                                               tr.batch_size, tr.epochs, tr.steps, seed))[0]

    def outputs(self, flats: list[torch.Tensor], x: torch.Tensor, combine: str = "sum_logits",
                weights: np.ndarray | None = None) -> torch.Tensor:
        """The members' outputs combined as the predictor says (`engine.common.combine`)."""
        from clusterfl.engine import reference as ref
        from clusterfl.engine.common import combine as combine_outputs

        w = None if weights is None else torch.as_tensor(weights, dtype=torch.float64)
        return combine_outputs([ref.predict(self.module, f, x) for f in flats],
                               combine, w)  # type: ignore[arg-type]

    def per_sample(self, models: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor
                   ) -> torch.Tensor:
        """`[n, K]` per-sample losses of the K models (eval mode)."""
        from clusterfl.engine import reference as ref
        from clusterfl.engine.common import per_sample_losses

        if len(x) == 0:
            return torch.zeros(0, len(models), dtype=torch.float64)
        return per_sample_losses(torch.stack([ref.predict(self.module, m, x) for m in models],
                                             1), y, "classification")

    def train(self, start: torch.Tensor, x: torch.Tensor, y: torch.Tensor, seed: int,
              **kw: Any) -> tuple[torch.Tensor, float]:
        from clusterfl.engine import reference as ref
        from clusterfl.protocol import client_seed

        torch.manual_seed(client_seed(self.seed, self.client))  # dropout noise, as in-process
        return ref.train_client(self.module, start, x, y, self.schedule(len(x), seed),
                                self.training(), "classification", **kw)

    def reply(self, metrics: dict[str, Any], msg: Message,
              arrays: dict[str, ArrayRecord] | None = None) -> Message:
        content: dict[str, Any] = dict(arrays or {})
        content["metrics"] = MetricRecord(metrics)
        return Message(RecordDict(content), reply_to=msg)


def _register_evaluate(app: Any, make_model: Callable[[], Any], load_data: LoadData) -> None:
    """`"evaluate.predictor"` (once per app): the loss and accuracy of a predictor that
    combines the `model-j` members (`config["combine"]`: "sum_logits", CAM's h + f_k;
    "mean_probs" with `weight-j`, FedEM's mixture Σ_k π_k softmax(h_k)) on the test split."""
    done = app.__dict__.setdefault("_clusterfl_handlers", set())
    if "evaluate.predictor" in done:
        return
    done.add("evaluate.predictor")

    @app.evaluate("predictor")
    def predictor(msg: Message, context: Context) -> Message:
        from clusterfl.engine.common import per_sample_loss

        step = _Step(make_model, load_data, msg, context)
        x, y = step.data(str(step.config.get("split", "test")))
        how = str(step.config["combine"])
        weights = step.weights() if "weight-0" in step.config else None
        out = step.outputs(step.flats("model"), x, how, weights)
        loss = float(per_sample_loss(out, y, "classification").mean()) if len(y) else math.nan
        acc = float((out.argmax(-1) == y).double().mean()) if len(y) else math.nan
        return step.reply({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)}, msg)


def add_cam_handlers(app: Any, make_model: Callable[[], Any], load_data: LoadData) -> None:
    """Register CAM's handlers (IFCA-CAM, FeSEM-CAM; Ma et al. 2023, Alg. 1) on `app`:

    - `"train.offset"`: local training of `model-0` whose logits are added to those of the
      frozen `offset-j` models on every sample (Eq. 5 / 8: the cluster part with Θ_g frozen,
      or Θ_g with the cluster part frozen; FeSEM-CAM's pull as `proximal-mu`);
    - `"query.offset_losses"`: the loss and accuracy of each `model-j` plus the frozen
      offset, on `config["split"]` (Eq. 2: IFCA-CAM's assignment, both methods' placement);
    - `"evaluate.predictor"`: the additive model h + f_k on the test split.

    `make_model()` builds the app's architecture (its `state_dict` names are the strategy's
    model's); `load_data(context, split)` returns the client's `(x, y)` of `"train"` or
    `"test"`. Tell the strategy: `extensions=CAM_HANDLERS`."""
    _register_evaluate(app, make_model, load_data)

    @app.train("offset")
    def offset_train(msg: Message, context: Context) -> Message:
        step = _Step(make_model, load_data, msg, context)
        x, y = step.data("train")
        offsets = step.flats("offset")
        base = step.outputs(offsets, x) if offsets else None
        params, loss = step.train(step.flats("model")[0], x, y, step.seed, offset=base)
        return step.reply({"num-examples": len(x), "train_loss": float(loss)}, msg,
                          {"arrays": step.arrays(params)})

    @app.query("offset_losses")
    def offset_losses(msg: Message, context: Context) -> Message:
        from clusterfl.engine import reference as ref
        from clusterfl.engine.common import per_sample_loss

        step = _Step(make_model, load_data, msg, context)
        x, y = step.data()
        offsets = step.flats("offset")
        base = step.outputs(offsets, x) if offsets else None
        metrics: dict[str, Any] = {"num-examples": len(x)}
        for j, model in enumerate(step.flats("model")):
            out = ref.predict(step.module, model, x)
            if base is not None:
                out = out + base
            metrics[f"loss-{j}"] = float(per_sample_loss(out, y, "classification").mean())
            metrics[f"acc-{j}"] = float((out.argmax(-1) == y).double().mean())
        return step.reply(metrics, msg)


def add_mixture_handlers(app: Any, make_model: Callable[[], Any], load_data: LoadData) -> None:
    """Register the handlers of FedEM (Marfoq et al. 2021) and FedSoft (Ruan & Joe-Wong
    2022) on `app`:

    - `"train.mixture"`: FedEM's client step with the K `model-j` and the client's weights
      π (`weight-j`): the E-step q_j(k) ∝ π_k exp(−ℓ_jk) on each training sample, π ← mean q,
      then each model trained with sample j's loss weighted by q_j(k); the K trained models
      (`model-j`) and the new π (`weight-j` metrics) come back;
    - `"query.mixture"`: π fitted over the K frozen models (`iterations` EM steps; FedEM's
      placement of a newcomer), with the mixture's negative log-likelihood as `loss`;
    - `"query.best_counts"`: per model, the samples on which it has the least loss
      (`count-j`; FedSoft's importance estimate);
    - `"train.prox"`: local training of `model-0` with the proximal pull
      `proximal-mu`/2 Σ_s u_s ||w − prox-s||² toward the client's mix of the S cluster
      models (FedSoft);
    - `"evaluate.predictor"`: FedEM's mixture Σ_k π_k softmax(h_k) on the test split.

    `make_model` and `load_data` as for `add_cam_handlers`. Tell the strategy:
    `extensions=MIXTURE_HANDLERS`."""
    _register_evaluate(app, make_model, load_data)

    @app.train("mixture")
    def mixture_train(msg: Message, context: Context) -> Message:
        from clusterfl.engine.common import responsibilities
        from clusterfl.engine.schedule import mixture_seed

        step = _Step(make_model, load_data, msg, context)
        x, y = step.data("train")
        models, prior = step.flats("model"), torch.as_tensor(step.weights())
        q = responsibilities(step.per_sample(models, x, y), prior.expand(len(x), -1))
        pi = (q.mean(0) if len(x) else prior).numpy()
        arrays, total = {}, 0.0
        for j, model in enumerate(models):
            params, loss = step.train(model, x, y, mixture_seed(step.seed, j),
                                      sample_weight=q[:, j])
            arrays[f"model-{j}"], total = step.arrays(params), total + loss
        return step.reply({"num-examples": len(x), "train_loss": float(total),
                           **{f"weight-{j}": float(v) for j, v in enumerate(pi)}}, msg, arrays)

    @app.query("mixture")
    def mixture_fit(msg: Message, context: Context) -> Message:
        from clusterfl.engine.common import fit_mixture

        step = _Step(make_model, load_data, msg, context)
        x, y = step.data()
        pi, nll = fit_mixture(step.per_sample(step.flats("model"), x, y), np.array([len(x)]),
                              step.weights()[None], int(step.config["iterations"]))
        return step.reply({"num-examples": len(x), "loss": float(nll[0]),
                           **{f"weight-{j}": float(v) for j, v in enumerate(pi[0])}}, msg)

    @app.query("best_counts")
    def best_counts(msg: Message, context: Context) -> Message:
        from clusterfl.engine.common import best_counts as count

        step = _Step(make_model, load_data, msg, context)
        x, y = step.data()
        counts = count(step.per_sample(step.flats("model"), x, y), np.array([len(x)]))[0]
        return step.reply({"num-examples": len(x),
                           **{f"count-{j}": int(v) for j, v in enumerate(counts)}}, msg)

    @app.train("prox")
    def prox_train(msg: Message, context: Context) -> Message:
        step = _Step(make_model, load_data, msg, context)
        x, y = step.data("train")
        mix = torch.as_tensor(np.array([float(step.config[f"prox-weight-{s}"]) for s in
                                        range(int(step.config["n-prox"]))]))
        params, loss = step.train(step.flats("model")[0], x, y, step.seed,
                                  prox=(torch.stack(step.flats("prox")), mix))
        return step.reply({"num-examples": len(x), "train_loss": float(loss)}, msg,
                          {"arrays": step.arrays(params)})


__all__ = ["CAM_HANDLERS", "MIXTURE_HANDLERS", "add_cam_handlers", "add_gradient_query",
           "add_losses_query", "add_mixture_handlers", "add_pick_train", "add_signature_query",
           "add_subspace_query"]
