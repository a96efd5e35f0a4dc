"""The standard app of `standard_app.py` with clusterfl's client helpers added: IFCA's round
in one `"train.pick"` message, the K losses in one `"query.losses"` message, PACFL's data
subspace (`"query.subspace"`), PCA+kM+HC's and FLT's data signature (`"query.signature"`),
gradients (`"query.gradient"`: CFL-GP's gradient protocol, IFCA's gradient averaging), CAM's
training against a frozen offset (`add_cam_handlers`) and FedEM's and FedSoft's mixture steps
(`add_mixture_handlers`). The helpers import only flwr, numpy and torch."""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import Context
from flwr.clientapp import ClientApp
from torch import nn

from clusterfl.flower.client import (
    add_cam_handlers,
    add_gradient_query,
    add_losses_query,
    add_mixture_handlers,
    add_pick_train,
    add_signature_query,
    add_subspace_query,
)
from tests.flower import standard_app as std

app = ClientApp()
app.train()(std.train)
app.evaluate()(std.evaluate)


def load_train(context: Context):  # type: ignore[no-untyped-def]
    x, y, _, _ = std.load_data(int(context.node_config["partition-id"]), std._groups(context))
    return x, y


add_losses_query(app, std.evaluate_model)
add_pick_train(app, std.evaluate_model, std.train_model)
add_subspace_query(app, load_train)
add_signature_query(app, load_train)


def gradient_model(state: dict[str, torch.Tensor], config: Any, context: Context
                   ) -> tuple[dict[str, torch.Tensor], int, float]:
    """The mean cross-entropy gradient at `state` on a seeded batch (all data for 0)."""
    model = std.Net()
    model.load_state_dict(state)
    x, y = load_train(context)
    b = int(config.get("batch-size", 0))
    if 0 < b < len(x):
        pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(
            int(config["seed"]) * 1000 + int(context.node_config["partition-id"])))[:b]
        x, y = x[pick], y[pick]
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return ({n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}, len(x), float(loss.item()))


add_gradient_query(app, gradient_model)


def load_data(context: Context, split: str):  # type: ignore[no-untyped-def]
    x, y, xv, yv = std.load_data(int(context.node_config["partition-id"]),
                                 std._groups(context))
    return (x, y) if split == "train" else (xv, yv)


add_cam_handlers(app, std.Net, load_data)
add_mixture_handlers(app, std.Net, load_data)
