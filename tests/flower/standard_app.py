"""A standard Flower ClientApp, written as Flower's quickstart examples write one: it imports
only flwr, torch and numpy, has a model and data of its own, answers `"train"` with the
trained arrays and `{"train_loss", "num-examples"}`, and `"evaluate"` with `{"eval_loss",
"eval_acc", "num-examples"}`, and keeps nothing between messages.

Its data: node `partition-id` p holds 10-class Gaussian data in 16 dimensions, seen through
the rotation of its group p % GROUPS (an orthogonal matrix per group): a rotation federation
of GROUPS hidden groups, and one group when the run config says `groups = 1` (iid).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

DIM, CLASSES, GROUPS = 16, 10, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, 32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def load_data(partition: int, groups: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_val, y_val) of one partition."""
    means = np.random.default_rng(1234).normal(0, 1.0, (CLASSES, DIM))
    group = partition % groups
    rot = np.linalg.qr(np.random.default_rng(100 + group).normal(size=(DIM, DIM)))[0]
    rng = np.random.default_rng(partition)
    y = rng.integers(0, CLASSES, 240)
    x = (means[y] + 0.6 * rng.normal(size=(240, DIM))) @ rot.T
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)
    return xt[:200], yt[:200], xt[200:], yt[200:]


def _groups(context: Context) -> int:
    return int(context.run_config.get("groups", context.node_config.get("groups", GROUPS)))


def train_model(state: dict[str, torch.Tensor], config: Any, context: Context
                ) -> tuple[dict[str, torch.Tensor], int, float]:
    """Local training from `state`: (trained state, examples, mean batch loss)."""
    model = Net()
    model.load_state_dict(state)
    x, y, _, _ = load_data(int(context.node_config["partition-id"]), _groups(context))
    epochs = int(context.run_config.get("local-epochs", 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    # the app's own reproducible shuffling (the quickstart's DataLoader shuffles unseeded)
    order = torch.Generator().manual_seed(
        1000 * int(context.node_config["partition-id"]) + int(config.get("server-round", 0)))
    losses = []
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=order).split(20):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model.state_dict(), len(x), float(np.mean(losses))


def evaluate_model(state: dict[str, torch.Tensor], context: Context, split: str = "test"
                   ) -> tuple[float, float]:
    """(loss, accuracy) of `state` on the validation split (or the training split)."""
    model = Net()
    model.load_state_dict(state)
    x, y, xv, yv = load_data(int(context.node_config["partition-id"]), _groups(context))
    if split != "train":
        x, y = xv, yv
    with torch.no_grad():
        out = model(x)
        return (nn.functional.cross_entropy(out, y).item(),
                (out.argmax(1) == y).float().mean().item())


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    state, n, loss = train_model(msg.content["arrays"].to_torch_state_dict(),
                                 msg.content["config"], context)
    content = RecordDict({"arrays": ArrayRecord(state),
                          "metrics": MetricRecord({"train_loss": loss, "num-examples": n})})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    loss, acc = evaluate_model(msg.content["arrays"].to_torch_state_dict(), context)
    metrics = {"eval_loss": loss, "eval_acc": acc, "num-examples": 40}
    if context.run_config.get("report-cluster"):  # diagnostics for the tests' ARI only
        metrics["cluster"] = int(context.node_config["partition-id"]) % _groups(context)
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
