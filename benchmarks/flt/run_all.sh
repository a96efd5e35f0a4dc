#!/bin/sh
# The FLT reproduction as it was actually run here (priority order; shared, heavily loaded
# 2-core machine, so some runs are scaled down, see RESULTS.md):
#   OMP_NUM_THREADS=1 sh benchmarks/flt/run_all.sh     (data from $CLUSTERFL_DATA)
set -e
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
R=benchmarks/flt/run.py
$PY benchmarks/flt/pretrain_encoders.py fashion_mnist mnist   # 5 epochs each (authors: 30)
$PY $R s1_mnist --methods flt
$PY $R s1_mnist --methods fedavg,pca_km_hc
$PY $R s1_mnist --methods local --set rounds=20               # 20 local epochs per client
$PY $R s1_mnist --methods fesem
$PY $R s2_mnist --methods flt,fedavg --set rounds=50          # T = 50 instead of 100
$PY $R s2_mnist --methods flt_matched --set rounds=50         # the authors' adjacency
$PY $R s1_mnist --methods flt_clusters                        # Case II
$PY $R s1_fashion --methods flt,fedavg
$PY $R s2_fashion --methods flt,fedavg --set rounds=50
$PY $R s4_mnist --methods flt,fedavg
