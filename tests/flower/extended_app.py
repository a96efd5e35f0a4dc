"""The standard app of `standard_app.py` with clusterfl's client helpers added: IFCA's round
in one `"train.pick"` message, the K losses in one `"query.losses"` message, and PACFL's data
subspace (`"query.subspace"`). The helpers import only flwr, numpy and torch."""

from __future__ import annotations

from flwr.app import Context
from flwr.clientapp import ClientApp

from clusterfl.flower.client import add_losses_query, add_pick_train, add_subspace_query
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
