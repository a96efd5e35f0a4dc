#!/bin/sh
# The two small reproductions of benchmarks/oneshot/RESULTS.md, one after the other, one
# thread each. Run from the repository root with CLUSTERFL_DATA set.
set -e
export OMP_NUM_THREADS=1
OUT=${OUT:-benchmarks/runs/oneshot}
.venv/bin/clusterfl compare benchmarks/oneshot/pacfl_fmnist.toml --quiet --overwrite \
  --out "$OUT/pacfl_fmnist" \
  --algorithms "pacfl,pacfl:per_label=true:proximity=min_pair:linkage=weighted:threshold=4.9,fedavg:fraction=0.1,ifca:n_clusters=5:fraction=0.1"
.venv/bin/clusterfl compare benchmarks/oneshot/flhc_label_swap.toml --quiet --overwrite \
  --out "$OUT/flhc_label_swap" \
  --algorithms "flhc,flhc:fraction=0.5,fedavg,ifca:n_clusters=4"
