#!/usr/bin/env bash
# FedEM and FedSoft against FedAvg and IFCA on two MNIST federations (no paper number of
# either method is reachable here: docs/fedem.md, docs/fedsoft.md).
# Usage: CLUSTERFL_DATA=DATA_DIR OMP_NUM_THREADS=1 benchmarks/mixtures/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
METHODS="fedavg,ifca:n_clusters=4,fedem:n_components=4,fedsoft:n_clusters=4"
for name in label_swap_mnist_mlp rotated_mnist_4; do
  /usr/bin/time -v .venv/bin/clusterfl compare "benchmarks/mixtures/$name.toml" --quiet \
    --algorithms "$METHODS" --out "benchmarks/runs/mixtures/$name" --overwrite \
    2> "benchmarks/runs/mixtures-$name.time" | tee "benchmarks/runs/mixtures-$name.txt"
done
