#!/usr/bin/env bash
# Issue 37's GPU check in one go (about 5 minutes on an H200): the GPU tests, cases (a)-(e),
# then the LeNet case with the grouped convolution (against the default unfolded products)
# and the profiles of both, the tf32 and bf16-mixed timings, and the server-step cases (f)
# FeSEM and (g) CFL-GP.
# From the checkout root:  bash benchmarks/gpu/run.sh [WHEELS_DIR] [OUT_DIR] [PARTS]
# PARTS (default "tests,fp32,extra,server") picks and orders the steps: "tests" the GPU tests,
# "fp32" cases (a)-(e), "extra" the grouped-convolution, profile, tf32 and bf16-mixed rows,
# "server" cases (f) and (g). All four take up to about 10 minutes; a shorter lease runs fewer.
# WHEELS_DIR holds CPython 3.12 manylinux wheels of what the machine lacks (pydantic,
# pydantic-core, annotated-types, typing-inspection, tomli-w); they are installed into a
# temporary folder, not into the machine's Python.
set -o pipefail
wheels=${1:-.whl}
out=${2:-benchmarks/gpu/out}
parts=${3:-tests,fp32,extra,server}
for part in ${parts//,/ }; do
  case $part in tests|fp32|extra|server) ;;
    *) echo "run.sh: PARTS: unknown part '$part' (allowed: tests, fp32, extra, server)"; exit 2;;
  esac
done
mkdir -p "$out"
site=$(mktemp -d)
if compgen -G "$wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl || exit 3
fi
export PYTHONPATH="$site:src:." PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" || true
cases="python3 benchmarks/gpu/cases.py --device cuda"
run_tests() {
  timeout 180 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu tests/engine/test_device.py \
    tests/engine/test_precision.py -k "cuda or gpu or resumes or chunks or bf16" \
    2>&1 | tee "$out/tests.log" | tail -3
}
run_fp32() {
  timeout 170 $cases --budget-s 100 --out "$out/cases_fp32.json" 2>&1 | tee "$out/cases.log"
}
run_extra() {
  {
    timeout 50 $cases --only b-cnn --kernel cnn-grouped --no-baselines --profile b-cnn \
      --out "$out/cases_grouped.json"
    timeout 40 $cases --only b-cnn --no-baselines --profile b-cnn
    timeout 70 $cases --precision tf32 --only a-mlp,b-cnn,c-resnet18,e-fedavg-10k \
      --no-baselines --out "$out/cases_tf32.json"
    timeout 50 $cases --precision bf16-mixed --only b-cnn,c-resnet18 --no-baselines \
      --out "$out/cases_bf16.json"
  } 2>&1 | tee "$out/extra.log" | grep -E "s/round|FAILED|Error"
}
run_server() {
  timeout 90 $cases --only f-fesem-1k,g-cflgp-200 --out "$out/cases_server.json" 2>&1 \
    | tee "$out/server.log"
}
for part in ${parts//,/ }; do
  "run_$part"
done
