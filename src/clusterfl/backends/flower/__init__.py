"""The `flower` backend: every method on Flower (flwr 1.41.0) through the Message API.

Modules (none imports Flower at import time except the two apps):

- `codec`: generic wire format of protocol dataclasses (RecordDict ⇄ request/reply).
- `backend`: `FlowerBackend`, one message per selected client over the ServerApp's Grid.
- `server_app`: the ServerApp (`@app.main()`), handshake, runs our `Experiment`.
- `app/`: the Flower App project for `flwr run`; its light ClientApp
  (`app/clusterfl_app/client.py`) forwards each message to the node's persistent `worker`.
- `client_app`: the same ClientApp for in-process use (Ray simulation); `node`: what a node
  does with a message (shared by all paths).
- `clientdata`: a node's own data (.npz format, simulation-style partitions).
- `launch`: start/stop SuperLink, SuperNodes and `flwr run` as processes (tests, benchmarks);
  `certs`: test TLS certificates and SuperNode authentication keys.

See docs/deploy.md for a several-machine deployment with TLS and node authentication.
"""

FLOWER_VERSION = "1.41.0"
"""The Flower release this backend is built and tested against (pinned)."""
