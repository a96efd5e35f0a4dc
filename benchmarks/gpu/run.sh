#!/usr/bin/env bash
# Issue 37's GPU check in one go (about 3 minutes on an H200): the GPU tests, then cases (a)-(e).
# From the checkout root:  bash benchmarks/gpu/run.sh [WHEELS_DIR] [OUT_DIR]
# WHEELS_DIR holds CPython 3.12 manylinux wheels of what the machine lacks (pydantic,
# pydantic-core, annotated-types, typing-inspection, tomli-w); they are installed into a
# temporary folder, not into the machine's Python.
set -o pipefail
wheels=${1:-.whl}
out=${2:-benchmarks/gpu/out}
mkdir -p "$out"
site=$(mktemp -d)
if compgen -G "$wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl || exit 3
fi
export PYTHONPATH="$site:src:." PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" || true
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/engine/test_device.py \
  tests/engine/test_precision.py -k "cuda or gpu or resumes or chunks or bf16" \
  2>&1 | tee "$out/tests.log" | tail -3
timeout 200 python3 benchmarks/gpu/cases.py --device cuda --budget-s 120 \
  --out "$out/cases_cuda.json" 2>&1 | tee "$out/cases.log"
