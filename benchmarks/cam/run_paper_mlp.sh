#!/usr/bin/env bash
# CAM §5 at the paper's scale (200 clients, full Fashion-MNIST, 100 rounds with 30 of warm-up,
# 10 local steps, batch 32, SGD lr 0.001 momentum 0.9) with the MLP 784-200-10 in place of the
# paper's CNN, inputs standardized. Two jobs of one thread each (the machine has 2 cores):
# the main table's 3 seeds, and the three one-seed settings. Results: results/paper_mlp/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 CLUSTERFL_DATA="${CLUSTERFL_DATA:-$(cd .. && pwd)/shared/datasets}"
PY=${PY:-.venv/bin/python}
R=("$PY" benchmarks/cam/run.py --scale paper --normalize --set model.name=mlp --tag _mlp
   --out benchmarks/runs/cam)
mkdir -p benchmarks/cam/logs
"${R[@]}" --settings cluster_n_class_k5 --seeds 0 1 2 > benchmarks/cam/logs/paper_mlp_main.log 2>&1 &
"${R[@]}" --settings cluster_dirichlet_k5 dirichlet_k5 cluster_n_class_k10 --seeds 0 \
    > benchmarks/cam/logs/paper_mlp_other.log 2>&1 &
wait
"$PY" benchmarks/cam/run.py --scale paper --tag _mlp --table
