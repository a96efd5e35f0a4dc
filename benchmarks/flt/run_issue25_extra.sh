#!/usr/bin/env bash
# Issue 25, FLT Scenario 2 (MNIST), two checks of what run_issue25.sh found (one job of one
# thread, resumable like it):
#  1. the paper's min distance with γ = 0.3 instead of 1 at T = 100 (seed 0): at γ 0.1–0.5
#     the largest-gap rule found the 5 clusters in every seed; does Case I reach the paper?
#  2. k = 3 centroids per client instead of 5 (the authors' code takes k from the number of
#     classes of the client's cluster): one clustering per seed and its γ sweep, to test
#     whether k is why the matched distance fills the blocks of Ã only partly; then the
#     matched distance with k = 3 at T = 100 (seed 0), and the paper's min distance with k = 3
#     at T = 100 (seed 0; run by hand beside the previous one the first time).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 CLUSTERFL_DATA="${CLUSTERFL_DATA:?point CLUSTERFL_DATA at the datasets}"
PY=${PY:-.venv/bin/python}
R=("$PY" benchmarks/flt/run.py s2_mnist --resume)
"${R[@]}" --methods flt --tag _t100_gamma0.3 --alg threshold=0.3 --seed 0
for seed in 0 1 2; do
    "${R[@]}" --methods flt --set rounds=1 --tag _k3_clustering --alg k=3 --seed "$seed"
    run=flt_k3_clustering; [ "$seed" = 0 ] || run="flt_k3_clustering_seed$seed"
    "$PY" benchmarks/flt/gamma_sweep.py s2_mnist --run "$run" --seed "$seed"
done
"${R[@]}" --methods flt_matched_cc --tag _k3 --alg k=3 --seed 0
"${R[@]}" --methods flt --tag _k3_t100 --alg k=3 --seed 0
