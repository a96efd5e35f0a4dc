"""Local: every client trains only its own model; nothing is communicated.

The models live on the devices (`keep_local`, `models_held`: no floats booked); in
simulation the server holds them for the devices, to continue and to evaluate them.

Sampling (our choice, `SampledConfig`): each round the sampled clients (`fraction` or
`per_round`; all by default) train their own model; the others keep theirs unchanged, as a
client that is offline would. The server's table holds the start model and one row per
client that has trained (`ClientModels`, shared with FedSoft), so its memory grows with the
clients sampled; a round writes the rows of the clients that trained, in place.

On a GPU the trained models come back to the CPU with the reply (no `device_update`): the
update only copies them into the table, which lives in host memory, so a step on the device
would still end in the same one copy.

Placing a client that did not train (`placement`): it trains alone, from the same initial
model as every client (row 0 of the table, the start kept in the state, whatever the placing
context's seed: `clusterfl place --set seed=7` changes the data, not the start), with the
budget a trained client got over a finished run: T (`ctx.rounds`) times the `[train]` local
training, in one request (T·steps steps, or T·epochs epochs; the optimizer state is not reset
between the T parts, as it is between rounds). Nothing is communicated. It belongs to no
shared cluster (-1) and predicts with its own model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from clusterfl.algorithms.base import Algorithm, Ask, Context, Update
from clusterfl.algorithms.common import (
    ClientModels,
    LossExtras,
    Placement,
    SampledConfig,
    answered,
)
from clusterfl.protocol import Predictor, TrainReply, TrainRequest, mean_finite


class LocalConfig(SampledConfig):
    name: Literal["local"] = "local"
    display: ClassVar[str] = "Local"
    shares_updates: ClassVar[bool] = False


#: Local's state is its clients' models (`ClientModels`: the start model and a row per client
#: that trained, written in place; the same layout, `models` and `row_of`, as before)
LocalState = ClientModels


class Local(Algorithm[LocalConfig, LocalState]):
    name = "local"
    Config = LocalConfig
    State = LocalState

    def setup(self, ctx: Context) -> None:
        self.state = ClientModels.start(ctx.factory.init(ctx.seed), ctx.n_clients)

    def ask(self, state: LocalState, t: int, phase: str, ctx: Context) -> Ask[TrainReply]:
        """The sampled clients train their own models (row i of `models` is client i's)."""
        clients = ctx.sample_round(self.config)
        return Ask(TrainRequest(clients, state.models, state.rows()[clients], ctx.training,
                                ctx.next_seed(), models_held=True, keep_local=True))

    def update(self, state: LocalState, t: int, ask: Ask[Any],
               reply: TrainReply) -> Update[LocalState]:
        """Each answering client's model becomes its trained one; the others keep theirs."""
        return Update(state.put(reply.clients, reply.params),
                      LossExtras(train_loss=mean_finite(reply.loss)))

    def assignment(self) -> np.ndarray:
        return np.arange(len(self.state.rows()), dtype=np.int64)

    def n_clusters(self) -> int:
        return len(self.state.rows())

    def predictor(self) -> Predictor:
        """Each client's own model: the rows in use (the start only while a client has not
        trained), numbered in row order; each client evaluated with its own stacked copy
        (`Predictor.own`), as with the table of every client's model Local kept before
        (the start, shared by the clients not trained yet, would otherwise be run over all
        their rows at once, which can differ in the last bits)."""
        return Predictor.single(*self.state.members(), own=True)

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """The newcomer trains alone for T rounds' worth of local training (module doc)."""
        ids = np.asarray(clients, dtype=np.int64)
        rounds = max(1, int(ctx.rounds or 1))
        tr = ctx.training
        budget = (replace(tr, steps=tr.steps * rounds) if tr.steps > 0
                  else replace(tr, epochs=tr.epochs * rounds))
        start = self._start(ctx)
        zeros = np.zeros(len(ids), dtype=np.int64)
        reply = ctx.send(TrainRequest(ids, start[None], zeros, budget, ctx.next_seed(),
                                      models_held=True, keep_local=True))
        models = start[None].repeat(len(ids), 1)
        rows = answered(ids, reply.clients, np.arange(len(reply.clients)), -1)
        for i, r in enumerate(rows.tolist()):
            if r >= 0:
                models[i] = reply.params[r]
        return Placement(ids, np.full(len(ids), -1, dtype=np.int64),
                         Predictor.single(models, np.arange(len(ids))),
                         [{"local_rounds": rounds} for _ in ids])

    def _start(self, ctx: Context) -> torch.Tensor:
        """The common initial model every client started from: the table's row 0, which
        does not depend on the placing context's seed (`clusterfl place --set seed=7` draws
        fresh data, not another start); a table of every client's (a checkpoint of before
        `ClientModels.row_of`) keeps no start: `factory.init(ctx.seed)`."""
        if self.state.row_of is not None:
            return self.state.models[0].clone()
        return ctx.factory.init(ctx.seed)
