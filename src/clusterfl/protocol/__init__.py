"""The requests a server may send to clients, and the replies (floor 0, docs/architecture.md).

Algorithms never touch client data: they build one of these requests for a set of clients
and hand it to `Context.send`. Three modules, every public name re-exported here:

- `messages`: the requests and replies, each carrying its per-type behaviour (its cost, its
  kind, its empty reply, its update rows), `LocalTraining`, `Predictor`, `Executor`;
- `rows`: taking some clients of a message and joining replies (`subset`, `select`, `join`,
  `positions_of`);
- `steps`: a client's whole round in one message (`Steps`, `Pick`, `run_steps`).
"""

from clusterfl.protocol import messages, rows, steps
from clusterfl.protocol.messages import *  # noqa: F403
from clusterfl.protocol.rows import *  # noqa: F403
from clusterfl.protocol.steps import *  # noqa: F403

Request = (messages.TrainRequest | messages.GradientRequest | messages.LossRequest
           | messages.EvaluateRequest | messages.EmbedRequest | messages.MixtureTrainRequest
           | messages.MixtureFitRequest | messages.BestCountRequest | messages.SubspaceRequest
           | steps.Steps)
"""Any request (the base class of all of them is `Asks`)."""

__all__ = [*messages.__all__, *rows.__all__, *steps.__all__, "Request"]
