#!/usr/bin/env bash
# Reproduction check of the foundation issue: FedAvg on CFL-GP's rotated MNIST, 3 seeds.
# Usage: CLUSTERFL_DATA=/path/to/datasets benchmarks/foundation/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
for seed in 0 1 2; do
  .venv/bin/clusterfl run benchmarks/foundation/rotated_mnist_fedavg.toml --quiet \
    --set seed=$seed --out "runs/foundation/rmnist_fedavg_s$seed"
done
.venv/bin/python benchmarks/foundation/collect.py runs/foundation > benchmarks/foundation/RESULTS.md
