#!/usr/bin/env bash
# Issue 25: the unbiased warm-started IFCA (`ifca_warm`) beside IFCA with independent
# initialisation, and a second regime (lr 0.01 instead of the paper's 0.001, everything else
# as run_paper_mlp.sh: MLP 784-200-10, standardized inputs, 200 clients, 100 rounds with 30 of
# warm-up, 10 local steps of batch 32, momentum 0.9). One job of one thread; resumable: a run
# whose result JSON exists is skipped, so the script can be restarted any time (a run cut
# short starts again from its first round). Order: seed 0 of the main setting first.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 CLUSTERFL_DATA="${CLUSTERFL_DATA:?point CLUSTERFL_DATA at the datasets}"
PY=${PY:-.venv/bin/python}
R=("$PY" benchmarks/cam/run.py --scale paper --normalize --set model.name=mlp
   --out benchmarks/runs/cam --resume)
P1=("${R[@]}" --tag _mlp)                              # the paper's lr 0.001
P2=("${R[@]}" --tag _mlp_lr0.01 --set train.lr=0.01)   # the second regime
MAIN=cluster_n_class_k5
ALL2=(fedavg ifca ifca_warm ifca_cam ifca_cam_mean fesem fesem_cam local)
table() {  # a failing table must not stop the queue
  "$PY" benchmarks/cam/run.py --scale paper --tag _mlp --table >/dev/null || true
  "$PY" benchmarks/cam/run.py --scale paper --tag _mlp_lr0.01 --table >/dev/null || true
  "$PY" benchmarks/cam/tables.py >/dev/null || true; }
"${P1[@]}" --settings $MAIN --seeds 0 --methods ifca_warm; table
"${P2[@]}" --settings $MAIN --seeds 0 --methods "${ALL2[@]}"; table
"${P1[@]}" --settings cluster_dirichlet_k5 dirichlet_k5 cluster_n_class_k10 --seeds 0 \
    --methods ifca_warm; table
"${P1[@]}" --settings $MAIN --seeds 1 2 --methods ifca_warm; table
"${P2[@]}" --settings $MAIN --seeds 1 2 --methods "${ALL2[@]}"; table
"${P2[@]}" --settings cluster_dirichlet_k5 dirichlet_k5 cluster_n_class_k10 --seeds 0 \
    --methods ifca ifca_warm ifca_cam ifca_cam_mean fesem fesem_cam; table
"${P2[@]}" --settings dirichlet_k5 --seeds 0 --methods fedavg local; table
"${P2[@]}" --settings cluster_n_class_k10 --seeds 0 --methods fedavg_plus local; table
