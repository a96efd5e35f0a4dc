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

The strategy uses a handler when told the clients offer it (`ClusteredStrategy(...,
extensions={"train.pick"})`); a method that needs a handler the strategy was not told of
fails on its first such request with one line naming the helper.
"""

from __future__ import annotations

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


__all__ = ["add_gradient_query", "add_losses_query", "add_pick_train", "add_signature_query",
           "add_subspace_query"]
