"""The `flower` backend: every method on Flower (flwr 1.41.0) through the Message API.

Only the backend lives here (neither module imports Flower at import time):

- `codec`: generic wire format of protocol dataclasses (RecordDict ⇄ request/reply).
- `backend`: `FlowerBackend`, one message per selected client over the ServerApp's Grid;
  `FlowerSession` / `active_session` (the Grid of the running ServerApp); `FlowerConfig`,
  the `[backend]` table of `name = "flower"`.

The deployment side — the ServerApp and ClientApp, the Flower App project, what a node does
with a message, the node worker, the local launcher and test certificates — is
`clusterfl.deploy`. See docs/deploy.md for a several-machine deployment with TLS and node
authentication.
"""

FLOWER_VERSION = "1.41.0"
"""The Flower release this backend is built and tested against (pinned)."""
