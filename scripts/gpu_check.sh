#!/usr/bin/env bash
# On a CUDA machine whose python3 already has jax 0.11.2 (+ CUDA plugin): run the kernel tests
# compiled on the GPU, then the kernel benchmark. Usage: scripts/gpu_check.sh [bench args...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
REPLAYJAX_TEST_BACKEND=gpu $PY -m pytest -q -p no:cacheprovider tests/pallas_kernels
$PY -m replayjax.bench.kernels "$@"
