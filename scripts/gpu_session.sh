#!/usr/bin/env bash
# GPU work in stages, each sized for one device call (< 10 min). Run from the repo root on a CUDA
# machine whose python3 has jax 0.11.2 + CUDA plugin:  scripts/gpu_session.sh STAGE [OUT_DIR]
#   tests   - the Pallas verify kernels and the tiny models of both families, compiled on the GPU
#   verify  - ReplaySSM verify + commit vs the state-per-draft baseline (T = 2, 4, 8), both families
#   e2e     - whole-model decode A/B (standard vs replay vs replay+ngram), real dims, random weights
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
stage=$1 out=${2:-/tmp/replayjax-gpu}
mkdir -p "$out"
case $stage in
  tests)
    REPLAYJAX_TEST_BACKEND=gpu python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2_verify.py tests/pallas_kernels/test_gdn_verify.py \
      tests/models/test_nemotron_h.py tests/models/test_qwen.py tests/models/test_speculative.py \
      -k "not xla" 2>&1 | tail -15 ;;
  verify)
    for fam in mamba2 gdn; do
      python3 -m replayjax.verify_bench --family $fam --batches 1 32 256 --json "$out/verify_$fam.json" \
        2>&1 | grep -v Warning
    done ;;
  e2e)
    for m in nemotron-h-8b qwen3.5-9b; do
      for b in 1 32 256; do
        python3 -m replayjax.e2e_bench --synthetic $m --batch $b --prompt-len 128 --new-tokens 64 \
          --variants standard replay replay+ngram 2>&1 | grep -v Warning | tail -6
      done
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
