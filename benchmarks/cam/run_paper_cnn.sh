#!/usr/bin/env bash
# CAM §5 main setting (cluster-wise n-class (3, 2), K = 5) at the paper's scale (200 clients,
# full Fashion-MNIST, 100 rounds with 30 of warm-up, 10 local steps, batch 32, SGD lr 0.001
# momentum 0.9, standardized inputs) with a small CNN: two 5x5 convolutions of stride 2
# (8 and 16 channels) and one linear layer (11,274 parameters). One seed (SEED=0, 1 or 2;
# RESULTS.md has all three), the clustered methods and the one-model baselines, two jobs of
# one thread each. Results: results/paper_cnn/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 CLUSTERFL_DATA="${CLUSTERFL_DATA:-$(cd .. && pwd)/shared/datasets}"
PY=${PY:-.venv/bin/python}
R=("$PY" benchmarks/cam/run.py --scale paper --normalize --tag _cnn --out benchmarks/runs/cam
   --set 'model={name="lenet", channels=[8, 16], hidden=[], downsample="stride"}'
   --settings cluster_n_class_k5 --seeds "${SEED:-0}")
mkdir -p benchmarks/cam/logs
"${R[@]}" --methods ifca_cam ifca_cam_mean fedavg local > benchmarks/cam/logs/paper_cnn_a.log 2>&1 &
"${R[@]}" --methods ifca fesem fesem_cam > benchmarks/cam/logs/paper_cnn_b.log 2>&1 &
wait
"$PY" benchmarks/cam/run.py --scale paper --tag _cnn --table
