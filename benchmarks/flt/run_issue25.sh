#!/usr/bin/env bash
# Issue 25, FLT Scenario 2 (MNIST): one job of one thread, resumable (--resume skips a row
# already in results.json with the same overrides). Data from $CLUSTERFL_DATA.
#  1. the encoder (Fashion-MNIST ConvAE, 5 epochs; skipped if the file exists);
#  2. one clustering only (rounds=1) per seed: its UMAP points give the γ sweep of both
#     distances and both automatic-C rules (gamma_sweep.py), at no further cost;
#  3. the matched-distance row at T = 100 with the connected-components rule (Case I, so the
#     accuracy is that of `flt_matched`; the ARI is the components rule's), seeds 0, 1, 2;
#  4. the paper's min-distance row at T = 100 beside it (seed 0).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 CLUSTERFL_DATA="${CLUSTERFL_DATA:?point CLUSTERFL_DATA at the datasets}"
PY=${PY:-.venv/bin/python}
R=("$PY" benchmarks/flt/run.py s2_mnist --resume)
[ -f benchmarks/flt/encoders/conv_ae-fashion_mnist-e5.pt ] ||
    "$PY" benchmarks/flt/pretrain_encoders.py fashion_mnist
for seed in 0 1 2; do
    "${R[@]}" --methods flt --set rounds=1 --tag _clustering --seed "$seed"
    run=flt_clustering; [ "$seed" = 0 ] || run="flt_clustering_seed$seed"
    "$PY" benchmarks/flt/gamma_sweep.py s2_mnist --run "$run" --seed "$seed"
done
for seed in 0 1 2; do "${R[@]}" --methods flt_matched_cc --seed "$seed"; done
"${R[@]}" --methods flt --tag _t100 --seed 0
