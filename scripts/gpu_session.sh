#!/usr/bin/env bash
# GPU work in stages, each sized for one device call (< 10 min). Run from the repo root on a CUDA
# machine whose python3 has jax 0.11.2 + CUDA plugin:  scripts/gpu_session.sh STAGE [OUT_DIR]
#   tests   - the Pallas verify kernels and the tiny models of both families, compiled on the GPU
#   verify  - ReplaySSM verify + commit vs the state-per-draft baseline (T = 2, 4, 8), both families
#   e2e     - whole-model decode A/B (standard vs replay; spec MTP replay vs state-per-draft),
#             Nemotron-H-8B dims, random weights;  e2e-more - batch 32 / 128 and Qwen3.5-9B dims
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
stage=$1 out=${2:-/tmp/replayjax-gpu}
mkdir -p "$out"
case $stage in
  tests)
    REPLAYJAX_TEST_BACKEND=gpu python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_verify.py \
      tests/models/test_nemotron_h.py tests/models/test_qwen.py tests/models/test_speculative.py \
      tests/models/test_mtp.py tests/models/test_standard_spec.py \
      -k "not xla" 2>&1 | tail -15 ;;
  verify)
    # tilings first (batch 256, T = 4), then the table with the default tiling
    python3 -m replayjax.verify_bench --family mamba2 --shapes nemotron-h-8b --tokens 4 \
      --batches 256 --tune '[{}, {"block_n": 16}, {"block_n": 64}, {"num_warps": 4}]' 2>&1 | grep "^|"
    python3 -m replayjax.verify_bench --family gdn --tokens 4 --batches 256 \
      --tune '[{}, {"block_k_long": 32}, {"block_k_long": 64}, {"num_warps": 2}]' 2>&1 | grep "^|"
    for fam in mamba2 gdn; do
      python3 -m replayjax.verify_bench --family $fam --batches 1 32 256 --json "$out/verify_$fam.json" \
        2>&1 | grep -v Warning
    done ;;
  e2e)
    # decode A/B (the issue's targets: >= 1.4x at batch 256 on the Mamba-2 model, batch 1 within
    # 2%), then spec decode MTP K = 3, ReplaySSM vs state-per-draft (batch 64: the baseline's
    # T + 1 states per sequence did not fit next to the model at 128)
    run() { timeout "$1" python3 -m replayjax.e2e_bench "${@:2}" --prompt-len 128 --new-tokens 64 \
              --json 2>&1 | grep -v Warning | tee -a "$out/e2e.jsonl" | tail -c 1500; }
    run 150 --synthetic nemotron-h-8b --batch 256 --variants standard replay
    run 150 --synthetic nemotron-h-8b --batch 64 --variants replay+mtp standard+mtp
    run 70 --synthetic nemotron-h-8b --batch 1 --variants standard replay ;;
  e2e-more)
    # the rest of the issue's grid: batch 32 and 128, and the GDN model (Qwen3.5-9B dims)
    run() { timeout "$1" python3 -m replayjax.e2e_bench "${@:2}" --prompt-len 128 --new-tokens 64 \
              --json 2>&1 | grep -v Warning | tee -a "$out/e2e.jsonl" | tail -c 1500; }
    run 120 --synthetic nemotron-h-8b --batch 32 --variants standard replay
    run 140 --synthetic nemotron-h-8b --batch 128 --variants standard replay
    run 150 --synthetic qwen3.5-9b --batch 256 --variants standard replay
    run 150 --synthetic qwen3.5-9b --batch 64 --variants replay+mtp standard+mtp ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
