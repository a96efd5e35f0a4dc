"""Deploying clusterfl on Flower (flwr 1.41.0): the apps, the nodes, the processes.

The backend itself (`FlowerBackend`, the wire codec) is `clusterfl.backends.flower`; this
package is what runs it (it may use `clusterfl.experiment` and `clusterfl.config`, the
backends never import it). Modules (none imports Flower at import time except the two apps):

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
