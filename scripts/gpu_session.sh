#!/usr/bin/env bash
# GPU work in stages, each sized for one device call (< 10 min). Run from the repo root on a CUDA
# machine whose python3 has jax 0.11.2 + CUDA plugin:  scripts/gpu_session.sh STAGE [OUT_DIR]
#   tests    - the Pallas verify kernels and the tiny models of both families, compiled on the GPU
#   kernels  - decode kernels, standard vs ReplaySSM (staggered headline), both families
#   kernels-bf16 - the decode kernels with a bf16 state (and GDN's bf16 ring), Triton and Mosaic;
#              BF16_FAMILIES picks some
#   triton-tune - the Triton decode kernels' tiling options at batch 256 (staggered counts)
#              against their defaults (launched row-slowest since the seventh session; the
#              standard kernel, the baseline, launched the same way): grid_order "row_fastest",
#              state_eviction "evict_first" (the checkpoint read once, kept from pushing the
#              rings out of L2), GDN ring_scalars "xla" (k_j . k, k_j . q by one einsum per
#              step, counted in the step since the seventh session); Mamba-2 also at P = 80
#              (Nemotron-Nano-9B-v2) with P tiles that do not divide P (p_tiles "masked");
#              < 7 min;  triton-tune-gdn - GDN's, and the ReplaySSM authors' choices: 1-2 warps /
#              3 stages, grid_order "head_slowest", chunk_loop "unrolled" (docs/design.md);
#              < 6 min;  gdn-occupancy - GDN replay tiles that hold fewer registers (Triton) or
#              less shared memory (Mosaic), < 6 min;  mamba2-spills - the Triton Mamba-2
#              replay's tiles that hold fewer registers (it spills at the default), and its
#              ring products from XLA (ring_scalars), batch 1 and 256, < 5 min;  b1-tune -
#              both families' Triton decode kernels at batch 1 over smaller tiles and fewer
#              warps (one row fills few SMs), < 4 min;  small-batch - the batch-1 tiles
#              against the batch-256 ones at 1 / 2 / 4 / 8 rows (where SMALL_BATCH_ROWS ends);
#              gdn-b1 - the small-batch replay tilings (ring_loads "all", GDN's unrolled key
#              chunks) compiled, then against the ones they replaced at 1 / 2 / 4 rows;
#              gdn-b1-tiles - GDN's tiny-batch replay over tiles and warps at 1 / 2 rows
#   ring-block - the replay kernels' ring rows by blocks (ring_block 4, the default since stop
#              57) and the products launch over committed rows, compiled, then against one whole
#              copy on an H200: both families' decode at batch 256, GDN's verify at T = 2 / 4
#   p80-rows128 - the Mosaic Mamba-2 replay over 128-row tiles at P = 80, compiled, timed
#              beside the Triton standard (the 1.6x target's baseline)
#   moe-b1-route - the MoE layer at batch 1 / 8 / 32 with the shared columns from the router
#              kernel, beside OLD_TREE's (the commit before) in the same call
#   moe-pairs - the MoE pair path with tensor-core dots (one launch for both GEMMs) against the
#              grouped path at batch 1 / 2, over PairTiling neighbours, after its compiled tests
#   h200-59  - the targets' H200 rows in one call (needs_h200: Mamba-2's T = 8 baseline): GDN
#              verify T = 4 / 8, P = 80 replay beside its Triton standard, GDN replay decode,
#              Mamba-2 verify T = 8
#   h200-56  - stop 56's H200 rows in one call: the fused GDN verify at T = 8 / 5, Mamba-2's
#              verify at T = 8 with the overlap prologue, "fma_rows" (decode, verify T = 2)
#   m2-rows  - the Mosaic Mamba-2 replay's readout "fma_rows": compiled tests, P = 80 and the
#              8B at batch 256, then P = 80's Triton standard (the 1.6x target's baseline)
#   rows     - the Mosaic GDN kernels' readout "fma_rows" (a thread a row): compiled readout
#              tests, the standard kernel and the replay decode at batch 256 against "fma" /
#              "fma_deferred", verify T = 2
#   lean-fold - the Mosaic Mamba-2 replay with its fold in its own SMEM scope: compiled fold
#              tests, lean folds under 3-4 read-only stages at batch 256; the Mosaic GDN replay
#              beside Triton at batch 1 / 32 / 256
#   gdn-rows - the Mosaic GDN kernels over 128-row V tiles against 64-row ones, batch 1..512;
#              gdn-rows-tune - the 128-row tilings' neighbours, decode and verify (T = 4, 8);
#              gdn-rows-small - where the replay's 4-stage small-batch default should end
#   m2-heads - the Mosaic Mamba-2 kernels over two / four heads a CTA, replay and standard
#              tilings at batch 256; m2-heads-verify - verify T = 4 / 8 and the standard
#              m2-heads-tune - their neighbours, P = 80, the batch sweep with two heads a CTA
#              m2-heads-defaults - the two-heads defaults: compiled tests, verify by window
#              m2-heads-final - the defaults beside the peers (needs .peer_bench carried)
#              prologue-t4 - the T = 4 GDN verify's prologue, serial vs overlap, twice
#              std-tune - the Triton standard kernels over small tiles on 1-2 warps, batch 256,
#              then the verify baselines (state per draft, T = 4) over the same
#              m2-heads-e2e - Nemotron-H-8B end to end with them, P = 80's neighbours
#              h200-tune - P = 80's last replay neighbours beside its Triton standard, the
#              GDN verify's mma defaults against their neighbours at T = 4 / 8
#   gdn-final - the GDN verify's mma defaults beside the peers (needs .peer_bench carried): the
#              peer harness, the GDN sweep batch 1..512, verify + commit T = 2 / 4 / 8
#   gdn-mma  - the Mosaic GDN replay and verify with readout "mma" (tf32 wgmmas of each fp32
#              checkpoint chunk's high and low parts against all keys and queries at once):
#              compiled tests, then decode and verify T = 4 at batch 256 against "fma";
#              gdn-mma-verify - verify T = 2 and 8 (and the verify's lean fold)
#   bc-products - the Mosaic Mamba-2 replay's B . C products by a Pallas launch vs XLA's
#   products - the replay steps' dot products by one Pallas launch (`ring_products`) vs XLA's:
#              compiled tests, the Mosaic GDN replay at batch 32 / 256 and the GDN verify at
#              T = 2 / 4 / 8 both ways (key_products), the launch alone over warps
#              (scripts/ring_products_bench.py), < 9 min; PRODUCT_FAMILIES="gdn mamba2" adds
#              Mamba-2's verify (bc_products), PRODUCT_BATCHES the replay's batches;
#   keys-kernel - the GDN verify's key products in the kernel (tf32 wgmmas, key_products
#              "kernel") vs the launch / XLA: its compiled tests, then T = 2 / 4 / 8 at batch
#              256 (defaults, kernel, kernel + overlap prologue) with the breakdown, then its
#              T = 8 tiles, < 9 min
#              products-decode - both families' Mosaic replay decode at batch 32 / 256 with
#              the products by the launch and by XLA, then the verify's defaults by window
#   verify   - ReplaySSM verify + commit vs state-per-draft (T = 2, 4, 8), both families; first
#              the tiling sweeps at T = 4, batch 256, and both kernels launched row-slowest;
#              verify-t8 - T = 2 / 4 / 8, Triton and Mosaic, against the baselines by window
#              ring-write - the verify kernels writing the window's per-row ring entries
#              (ring_write="kernel") against XLA's scatter after them, T = 4, batch 256
#              fused - GDN's "fused" prologue (the verify's default from 5 tokens) against the
#              serial one, verify T = 8 / 4 / 5, and the decode's tilings of 4-5 CTAs an SM
#              m2-overlap - the Mamba-2 verify's "overlap" prologue (3 CTAs an SM at T = 8, 5
#              at T = 4 with 16-column chunks)
#              options-compiled - the Mosaic kernels' option cases compiled;  verify-split -
#              the Mosaic verify's non-fold and fold steps (counts held) at T = 4 / 8
#   e2e      - whole-model decode A/B, Nemotron-H-8B dims, random weights, mixed prompt lengths;
#              e2e-spec - MTP speculation, ReplaySSM vs state-per-draft;  e2e-spec-visits -
#              the same, speculative steps chained on device (16 a visit) against one a visit;
#              e2e-spec-qwen - the same on Qwen3.5-9B dims (GDN verify);
#              e2e-more - Qwen3.5-9B
#              dims (each variant compiles for ~175 s: 420 s for both);  e2e-32 - batch 32;
#              e2e-moe / e2e-moe-qwen - the MoE hybrids that fit one H200 (Nemotron-3-Nano,
#              Qwen3.5-35B) at batch 256 / 32 / 1;  e2e-attn -
#              e2e with --impl pallas (the decode attention and conv kernels; e2e's rows are
#              --impl auto)
#              e2e-attn-check - is the Pallas decode attention exact end to end: standard
#              decode three times, each in its own process, at batch 256: @pallas (the reference),
#              @pallas_triton (the same kernels again: greedy 100% unless a run is not
#              deterministic) and @xla (the kernel's greedy agreement with the XLA path; the
#              greedy prefix column tells a late divergence from an early one)
#   profile  - one decode step's kernels by class with the roofline (Nemotron-H-8B, batch 256)
#   profile-b1 - the same at batch 1 on Nemotron-3-Nano-30B-A3B dims, standard then replay
#   profile-qwen - the replay step of Qwen3.5-9B dims (batch 256) by class and kernel
#   profile-spec - the kernels of a speculative verify step by class (MTP K = 3, batch 64,
#              Nemotron-H-8B dims), ReplaySSM then the state-per-draft baseline, < 9 min
#   prefill  - prefill tokens/s of 32 x 2048-token prompts, standard and replay caches, with the
#              FLOP / byte roofline and the kernels by class: Nemotron-H-8B and Qwen3.5-9B dims
#              (issue 17)
#   serve    - latency-throughput curves over HTTP: `replayjax serve --synthetic nemotron-h-8b`
#              (256 slots), ReplaySSM then standard, each loaded by `replayjax bench serve` at
#              concurrency 1 / 16 / 64 / 256 (needs starlette + uvicorn wheels on the GPU machine);
#              SERVE_FLAGS=--dynamic-batch: steps over the occupied slots only
#   prefix   - prefix cache on the agents trace (shared system prompt, multi-turn histories):
#              TTFT and throughput with and without it, Nemotron-H-8B and Qwen3.5-9B dims
#              (PREFIX_MODELS="..." picks some: one per GPU side by side on a 2-GPU machine;
#              PREFIX_FLAGS=--dynamic-batch: prefill rows by arrivals)
#   mosaic   - the Mosaic GPU kernels: the sm90 lowering check, their tests compiled, each test
#              in its own process (a CUDA error is sticky for its process: one crash no longer
#              hides the others; a PASS / FAIL line per test with its first error line), then
#              decode of Mamba-2 and GDN at batch 1 / 32 / 256 beside the Triton kernels, then a
#              small tiling sweep of each at batch 256 (issue 16 targets: Mamba-2 replay <= 320 us
#              amortised, staggered within 5%, standard <= 530 us; GDN replay <= 145 us), the
#              replay's prologue="serial" first;  mosaic-verify - verify T = 4 at batch 256 of
#              both families beside the Triton verify, a Mamba-2 tiling sweep, and each with
#              prologue="overlap";  mosaic-p80 - the Mosaic kernels at ragged tiles: compiled
#              tests of both families (P / V = 80), then Mamba-2 at P = 80 beside Triton: decode
#              at 1 / 32 / 256, verify;  p80-verify - Mamba-2's verify at P = 80, T = 2 / 4,
#              batch 32 / 256, Triton beside Mosaic
#   replay-tiles - the Triton Mamba-2 replay's tiles at 2 / 4 / 8 rows (8B and P = 80)
#   p80-tiles - the Triton Mamba-2 replay (y before its fold) compiled, at batch 1 / 32 /
#              256, then P = 80's and the 8B's tiles again at batch 256
#   mosaic-diag - scripts/mosaic_diag.py: every Mosaic kernel (both families; standard, replay
#              with a fold, verify) x shape x tiling in its own process against XLA, one row
#              per case (OK + relative error, or the error's last line): the real shapes at
#              block 32 / 64 / 128, then 3 stages, then the unit tests' shapes;
#              DIAG_FLAGS="..." runs that matrix instead (e.g. --shapes real --blocks 32)
#   peers    - issue 16's side-by-side table in one run: the peers' kernels
#              (../shared/peer_bench copied to .peer_bench, git-ignored, carried) at batch 1 / 32 /
#              256 / 512, then our decode kernels (Triton and Mosaic GPU) over the batch sweep
#              1..512, both families
#   ncu      - Nsight Compute on one launch of each replay kernel at batch 256 (Triton and Mosaic,
#              both families; scripts/ncu_kernels.py runs them without CUPTI; NCU_LIMIT seconds
#              each, default 120: a Triton compile under ncu can need more): speed of light,
#              memory, occupancy, warp stalls, one CSV per kernel; the clocks as found
#              (--clock-control none: ncu's default would lock them to base); only the replay
#              kernel's launches counted (the ninth session's skip of 40 launches landed on the
#              ring counts' update); NCU_FAMILIES / NCU_IMPLS pick some; NCU_KERNELS="replay
#              verify" also profiles ReplaySSM verify at T = 4 (CSVs ncu_F_I_verify.csv)
#   check    - one call after a restructure: every kernel and model test compiled (6 processes),
#              decode kernels at batch 1 / 32 / 256, verify T = 4 at batch 256 with the baseline's
#              tiling sweep, one MoE layer (ours vs tokamax when .whl carries it)
#   ncu-gdn  - the authors' GDN replay kernel (.peer_bench carried) under Nsight Compute beside
#              ours (Triton default and at their 1 warp / 3 stages, Mosaic; bf16 rings), then
#              their and our batch-256 times in the same run
#   gdn-warps - our Triton GDN replay at 1-2 warps a program (the authors' launch), ring key
#              products from XLA, bf16 rings, batch 256
#   e2e-qwen-mosaic - the Mosaic GDN kernels' compiled tests, then the Qwen3.5-9B replay step
#              at batch 256 with today's `auto`, then without the Mosaic replay (one process each,
#              --isolate none; QWEN_VARIANTS="standard replay" adds the standard step)
#   isa-gdn  - static opcode histogram of the Mosaic GDN replay's PTX (scripts/isa_histogram.py)
#   attention - decode attention over the slot pool: the Pallas kernel (in-kernel gather) vs the
#              XLA gather + einsum, batch 1 / 32 / 256, T = 1 and 4, a tiling sweep
#   conv     - the decode conv + conv-state update over the slot pool: the Pallas kernel (one
#              launch, in place) vs XLA's gather / conv / scatter, batch 1 / 32 / 256, a
#              tiling sweep (sets conv.TILING and whether conv.api.AUTO_PALLAS)
#   moe-small - one MoE layer at batch 1 / 8 / 32: the default path (grouped, the shared expert
#              in its launch, the plan counted) and the pair path, with the per-kernel
#              breakdown (issue 14);
#              moe-grid - the rows still missing: Qwen3.5-35B and Qwen3-Next-80B at 32-256
#   moe-router - one MoE layer at batch 1 / 8 / 32, routing in XLA (sparse) vs the router kernel
#              (sparse-shared) with XLA's logits GEMM (the default) or the logits in the kernel
#              at three launch sizes, with the per-kernel breakdown (sets router.TILING.logits
#              and MAX_TOKENS)
# Tensor parallelism, on a 2-GPU machine (nvidia-h200-x2):
#   tp       - the TP tests on the GPUs (tp = 2: every fixture, both modes, speculation, MTP),
#              and the Mosaic GPU kernels under shard_map (test_mosaic_in_model.py)
#   tp-check - TP = 2 tokens = TP = 1 on synthetic Nemotron-H-8B and Qwen3.5-9B (fp32) and on
#              every fixture with speculation; the two-process run (`replayjax launch`) = one
#   tp-8b    - decode step at batch 256, Nemotron-H-8B dims, TP = 2 vs TP = 1 (target <= 0.6x);
#              tp-8b-oneshot - its TP = 2 row with XLA's one-shot all-reduce kernel
#   tp-profile - `profile` at TP = 2: where the step's time goes, collectives (NCCL) included
#   tp-lm-head - the LM head replicated vs vocab-parallel (scripts/tp_lm_head.py), three shapes
#   tp-allreduce - one block's all-reduce [b, 4096] bf16: NCCL (default, LL, LL128) vs XLA's
#              one-shot kernel (scripts/tp_allreduce.py), each in its own process
#   tp-80b   - Qwen3-Next-80B-A3B dims (bf16, does not fit one H200) at TP = 2, replay vs
#              standard at batch 64;  tp-80b-256 - the same at batch 256;  tp-80b-ep - replay
#              with --expert-parallel at batch 64 and 256 (experts split by count, not width)
# DEADLINE=EPOCH_SECONDS cuts every timeout to what is left of a device call (see `limit`).
# Each e2e variant runs in its own process (peak memory per variant); rows go to OUT/e2e.jsonl,
# stderr (XLA warnings) to OUT/e2e.log, so the JSONL stays valid.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0     # never NVLink multicast (multimem): plain NCCL all-reduce
export REPLAYJAX_LOG_STAGES=1  # the benchmarks log each stage's seconds (where did a timeout go?)
# JAX's persistent compilation cache, and with it XLA's per-fusion autotuning cache: the variant
# processes of one model share their GEMM autotuning (an 80B MoE variant compiled for ~4 min),
# and a stage re-run on the same machine reuses its programs ("compile s" then reads lower)
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/replayjax-jax-cache}
if [ $# -lt 1 ]; then
  echo "usage: scripts/gpu_session.sh STAGE [OUT_DIR] (the stages: this file's header)" >&2; exit 2
fi
stage=$1 out=${2:-gpu-out}
mkdir -p "$out"
limit() {  # limit SECONDS CMD...: timeout SECONDS, cut to what is left before $DEADLINE (epoch
           # seconds, optional: a device call's end); skipped when under 20 s are left
  local t=$1
  if [ -n "${DEADLINE:-}" ] && (( DEADLINE - $(date +%s) < t )); then t=$((DEADLINE - $(date +%s))); fi
  if (( t < 20 )); then echo "skipped (deadline): ${*:2}" >&2; return 124; fi
  timeout "$t" "${@:2}"
}
e2e() {   # e2e SECONDS ARGS...: one JSON object per run appended to OUT/e2e.jsonl
  limit "$1" python3 -m replayjax.bench.e2e "${@:2}" --new-tokens 64 --json \
    2>>"$out/e2e.log" | tee -a "$out/e2e.jsonl" | tail -c 1500
}
ncu_csv() {  # ncu_csv NAME KERNEL_REGEX CMD...: Nsight Compute on 2 launches of the kernels
  # matching KERNEL_REGEX after 40 (clocks as found: ncu's default would lock them to base) into
  # OUT/ncu_NAME.csv, then its headline rows
  limit ${NCU_LIMIT:-120} ncu --clock-control none --kernel-name regex:$2 --launch-skip 40 \
    --launch-count 2 --csv --page details --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats "${@:3}" > "$out/ncu_$1.csv" \
    2>>"$out/ncu.log" || true
  # a timed-out ncu leaves its target running, holding the GPU's memory (the next process then
  # fails with CUDA_ERROR_OUT_OF_MEMORY at start-up: eleventh session)
  pkill -f "scripts/ncu_" || true
  grep -E "Kernel Name|Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread|\
Theoretical Occupancy|Block Limit|Dynamic Shared|Warp Cycles Per Issued|Issued Warp|\
Spilling Requests\"" "$out/ncu_$1.csv" | head -24 || true
}
verify_tune() {  # verify_tune SECONDS FAMILY SHAPE NAME T CONFIGS: the Mosaic verify at window
  # T over the tilings CONFIGS (--tune), batch 256, rows to OUT/verify_NAME_tT.json
  limit "$1" python3 -m replayjax.bench.verify --family "$2" --shapes "$3" --tokens "$5" \
    --batches 256 --impls pallas_mosaic_gpu --tune "$6" --json "$out/verify_$4_t$5.json" \
    2>>"$out/verify.log" | grep "^|" || true
}
gdn_mma_verify() {  # gdn_mma_verify T: the Mosaic GDN verify at window T, batch 256: its
  # default, with a lean fold (the fold's SMEM scope: 72 -> 48 KiB at T = 4), and readout "mma"
  # (16-key chunks in 4 / 3 stages, 32-key ones in 2) with lean folds (51-80 KiB)
  verify_tune 120 gdn qwen3-next gdn_mma "$1" '[{}, {"fold_stages": 2, "fold_buffers": 1},
    {"readout": "mma", "block_k": 16, "num_stages": 4, "fold_stages": 2, "fold_buffers": 1},
    {"readout": "mma", "block_k": 16, "num_stages": 3, "fold_stages": 1, "fold_buffers": 1},
    {"readout": "mma", "block_k": 32, "num_stages": 2, "fold_stages": 1, "fold_buffers": 1}]'
}
each_test() {  # each_test SECONDS PYTEST_ARGS...: the compiled kernel tests of test_decode.py
  # and test_verify.py that PYTEST_ARGS select, one process each (a CUDA error is sticky for its
  # process), for at most SECONDS in all: a PASS / FAIL line per test with its first error line,
  # full logs to OUT/mosaic_tests.log; rc 124 is a timeout, 139 a segfault
  local end=$(( $(date +%s) + $1 )) ids id log rc first
  ids=$(REPLAYJAX_TEST_BACKEND=gpu limit 60 python3 -m pytest --collect-only -q \
    -p no:cacheprovider tests/pallas_kernels/test_decode.py \
    tests/pallas_kernels/test_verify.py "${@:2}" 2>/dev/null | grep "::" || true)
  while IFS= read -r id; do
    [ -n "$id" ] || continue
    if (( $(date +%s) > end )); then echo "SKIPPED ($1 s of tests spent) $id"; continue; fi
    log=$(REPLAYJAX_TEST_BACKEND=gpu limit 90 python3 -m pytest -q -p no:cacheprovider \
      -W ignore "$id" 2>&1 </dev/null) && rc=0 || rc=$?
    printf '%s\n' "== $id (rc $rc)" "$log" >> "$out/mosaic_tests.log"
    if (( rc == 0 )); then echo "PASS $id"; else
      first=$(grep -m1 -E "^E |Fatal Python error" <<<"$log" || tail -n1 <<<"$log")
      echo "FAIL (rc $rc) $id: $first"
    fi
  done <<<"$ids"
}
case $stage in
  tests)
    REPLAYJAX_TEST_BACKEND=gpu python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_verify.py \
      tests/models/test_hf_parity.py tests/models/test_speculative.py \
      tests/models/test_mtp.py tests/models/test_standard_spec.py \
      -k "not xla" 2>&1 | tail -15 ;;
  kernels)
    for fam in mamba2 gdn; do
      python3 -m replayjax.bench.kernels --family $fam --batches 1 32 256 \
        --json "$out/kernels_$fam.json" 2>>"$out/kernels.log"
    done ;;
  triton-tune)
    # (a --tune entry's fields the standard tiling has apply to the standard kernel too)
    limit 200 python3 -m replayjax.bench.kernels --family mamba2 --batches 256 --impls pallas \
      --tune '[{}, {"grid_order": "row_fastest"}, {"state_eviction": "evict_first"}]' \
      --json "$out/kernels_triton_tune_mamba2.json" 2>>"$out/kernels.log" | grep "^|"
    # P = 80: the default's five tiles of 16 amortise a replay program's ring walk over 16 rows
    # (replay 1.10x its standard; target >= 1.6x). p_tiles "masked" (the last tile's rows past
    # P masked): alone, standard 32 + 32 + 16 of 32 rows, replay 64 + 16 of 64; block_p 32: both
    # in tiles of 32; 128: one tile of 80 live rows (2, or 4 warps: the fp32 [128, 64] tile)
    limit 180 python3 -m replayjax.bench.kernels --family mamba2 --batches 256 --impls pallas \
      --shapes nemotron-nano-9b-v2 \
      --tune '[{}, {"p_tiles": "masked"}, {"p_tiles": "masked", "block_p": 32},
               {"p_tiles": "masked", "block_p": 128},
               {"p_tiles": "masked", "block_p": 128, "num_warps": 4}]' \
      --json "$out/kernels_triton_tune_mamba2_p80.json" 2>>"$out/kernels.log" | grep "^|" ;;
  triton-tune-gdn)
    # the ReplaySSM authors' launch choices (docs/design.md, "GDN replay decode beside the
    # authors' kernel"): 1 warp / 3 stages (their config; the standard kernel's column then runs
    # 1 warp too: ignore it), their grid order, the unrolled chunk walk
    limit 330 python3 -m replayjax.bench.kernels --family gdn --batches 256 --impls pallas \
      --tune '[{}, {"grid_order": "row_fastest"}, {"state_eviction": "evict_first"},
               {"ring_scalars": "xla"}, {"ring_scalars": "xla", "state_eviction": "evict_first"},
               {"num_warps": 1, "num_stages": 3}, {"num_warps": 2, "num_stages": 3},
               {"num_stages": 3}, {"chunk_loop": "unrolled"},
               {"chunk_loop": "unrolled", "num_warps": 2}, {"grid_order": "head_slowest"},
               {"num_warps": 1, "num_stages": 3, "grid_order": "head_slowest"}]' \
      --json "$out/kernels_triton_tune_gdn.json" 2>>"$out/kernels.log" | grep "^|" ;;
  mamba2-spills)
    # the twelfth session's ncu: the Triton Mamba-2 replay (block_p 64, block_n 64, 2 warps)
    # holds 255 registers a thread and spills (20 local-memory requests a program); tiles that
    # hold fewer registers a thread, the fold on the FMA units (its tf32x3 dot keeps split
    # operands live), the ring's B . C from XLA (no [L, block_n] ring B tile in the read-only
    # pass); only the replay column counts (the standard follows block_n / num_warps). First
    # the new ring_scalars="xla" path compiled against the recurrence
    REPLAYJAX_TEST_BACKEND=gpu limit 120 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_decode.py -k "mamba2 and xla-scalars" 2>&1 | tail -3
    limit 220 python3 -m replayjax.bench.kernels --family mamba2 --batches 256 --impls pallas \
      --tune '[{}, {"num_warps": 4}, {"block_n": 32}, {"block_n": 32, "num_warps": 4},
               {"block_p": 32}, {"fold": "fma"}, {"ring_scalars": "xla"},
               {"ring_scalars": "xla", "num_warps": 4}]' \
      --json "$out/kernels_mamba2_spills.json" 2>>"$out/kernels.log" | grep "^|"
    limit 90 python3 -m replayjax.bench.kernels --family mamba2 --batches 1 --impls pallas \
      --tune '[{}, {"ring_scalars": "xla"}, {"num_warps": 4}]' \
      --json "$out/kernels_mamba2_spills_b1.json" 2>>"$out/kernels.log" | grep "^|" ;;
  b1-tune)
    # batch 1 (issue 16: replay within 10% of standard): one row launches H x P / block_p
    # programs (Mamba-2 8B: 128 at block_p 64 on 132 SMs; GDN's standard 32 at block_v 128),
    # so smaller tiles and fewer warps a program; both columns follow the tiling's fields
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --batches 1 --impls pallas \
      --tune '[{}, {"num_warps": 4}, {"num_warps": 1}, {"block_p": 32}, {"block_p": 32, "num_warps": 4},
               {"block_p": 32, "num_warps": 1}, {"block_p": 16}, {"block_p": 16, "num_warps": 1},
               {"block_n": 32, "num_warps": 4}, {"block_p": 32, "block_n": 32}]' \
      --json "$out/kernels_mamba2_b1_tune.json" 2>>"$out/kernels.log" | grep "^|"
    limit 100 python3 -m replayjax.bench.kernels --family gdn --batches 1 --impls pallas \
      --tune '[{}, {"block_v": 32}, {"block_v": 16}, {"block_v": 32, "num_warps": 2},
               {"block_v": 16, "num_warps": 2}, {"block_v": 16, "num_warps": 1},
               {"block_v": 32, "block_k": 32}, {"num_warps": 2}]' \
      --json "$out/kernels_gdn_b1_tune.json" 2>>"$out/kernels.log" | grep "^|" ;;
  gdn-b1)
    # the fourteenth session's batch-1 choices, now the small-batch defaults ({}): GDN's replay
    # with ring_loads "all" and its key chunks unrolled, Mamba-2's with ring_loads "all",
    # against the tiles they replaced, at 1 / 2 / 4 rows (GDN's small tiles run to 4 rows,
    # Mamba-2's to 1); first those kernels compiled at one and two rows
    REPLAYJAX_TEST_BACKEND=gpu limit 120 python3 -m pytest -q -p no:cacheprovider \
      -W ignore tests/pallas_kernels/test_decode.py tests/pallas_kernels/test_verify.py \
      -k "pallas] and not real" 2>&1 | tail -2 || true
    for b in 1 2 4; do
      limit 60 python3 -m replayjax.bench.kernels --family gdn --batches $b --impls pallas \
        --tune '[{}, {"ring_loads": "committed", "chunk_loop": "fori"}]' \
        --json "$out/kernels_gdn_b1_check_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
    done
    limit 60 python3 -m replayjax.bench.kernels --family mamba2 --batches 1 --impls pallas \
      --shapes nemotron-h-8b nemotron-nano-9b-v2 --tune '[{}, {"ring_loads": "committed"}]' \
      --json "$out/kernels_mamba2_b1_check.json" 2>>"$out/kernels.log" | grep "^|" || true ;;
  gdn-b1-tiles)
    # GDN's replay at 1 / 2 rows on its tiny-batch tiling (ring_loads "all", unrolled key
    # chunks: 3.4 / 4.4 us against the standard's 2.9 / 4.1): the tiles and warps b1-tune
    # swept before those options, again with them (more, smaller programs on 132 SMs)
    for b in 1 2; do
      limit 90 python3 -m replayjax.bench.kernels --family gdn --batches $b --impls pallas \
        --tune '[{}, {"block_v": 16}, {"block_v": 16, "num_warps": 2}, {"num_warps": 2},
                 {"block_v": 16, "num_warps": 2, "num_stages": 3}, {"block_k": 128},
                 {"block_v": 16, "block_k": 128}]' \
        --json "$out/kernels_gdn_tiny_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
    done ;;
  small-batch)
    # where the batch-1 tiles (`SMALL_BATCH_TILINGS`, b1-tune's winners) stop winning: the
    # defaults ({}: the small tiles up to SMALL_BATCH_ROWS, the batch-256 ones above) against both
    # tile sets at 1 / 2 / 4 / 8 rows, and GDN's Mosaic standard kernel beside its Triton one;
    # first the decode kernels at one row with their default tiles, compiled
    REPLAYJAX_TEST_BACKEND=gpu limit 120 python3 -m pytest -q -p no:cacheprovider \
      -W ignore tests/pallas_kernels/test_decode.py -k "window_one and pallas" 2>&1 | tail -2
    for b in 1 2 4 8; do
      limit 80 python3 -m replayjax.bench.kernels --family mamba2 --batches $b --impls pallas \
        --tune '[{}, {"block_p": 32, "num_warps": 4}, {"block_p": 64, "num_warps": 2}]' \
        --json "$out/kernels_mamba2_small_b$b.json" 2>>"$out/kernels.log" | grep "^|"
      limit 60 python3 -m replayjax.bench.kernels --family gdn --batches $b --impls pallas \
        --tune '[{}, {"block_v": 16}, {"block_v": 32}, {"block_v": 64}, {"block_v": 128}]' \
        --json "$out/kernels_gdn_small_b$b.json" 2>>"$out/kernels.log" | grep "^|"
      limit 40 python3 -m replayjax.bench.kernels --family gdn --batches $b \
        --impls pallas_mosaic_gpu --tune '[{}]' \
        --json "$out/kernels_gdn_mosaic_b$b.json" 2>>"$out/kernels.log" | grep "^|"
    done ;;
  gdn-occupancy)
    # the tenth session's ncu: the Triton GDN replay holds 25% occupancy (127 registers a
    # thread: 4 CTAs an SM), the Mosaic one 12.5% (81 KB of shared memory: 2 CTAs); smaller
    # tiles hold fewer registers / less shared memory (the standard column follows block_v and
    # num_warps too: read only the replay column there)
    limit 220 python3 -m replayjax.bench.kernels --family gdn --batches 256 --impls pallas \
      --tune '[{}, {"block_v": 32}, {"block_v": 32, "num_warps": 2}, {"block_k": 32},
               {"block_k": 32, "num_stages": 3}, {"block_k": 128}, {"block_k": 32, "block_v": 32}]' \
      --json "$out/kernels_gdn_occupancy.json" 2>>"$out/kernels.log" | grep "^|"
    limit 140 python3 -m replayjax.bench.kernels --family gdn --batches 256 \
      --impls pallas_mosaic_gpu --tune '[{}, {"block_k": 32}, {"block_k": 32, "num_stages": 3},
               {"block_k": 16, "num_stages": 4}]' \
      --json "$out/kernels_gdn_occupancy_mosaic.json" 2>>"$out/kernels.log" | grep "^|" ;;
  kernels-bf16)
    for fam in ${BF16_FAMILIES:-mamba2 gdn}; do
      limit 150 python3 -m replayjax.bench.kernels --family $fam --batches 1 32 256 \
        --state-dtype bfloat16 --impls pallas pallas_mosaic_gpu \
        --json "$out/kernels_bf16_$fam.json" 2>>"$out/kernels.log" | grep "^|"
    done
    limit 100 python3 -m replayjax.bench.kernels --family gdn --batches 1 32 256 \
      --ring-dtype bfloat16 --impls pallas pallas_mosaic_gpu \
      --json "$out/kernels_bf16ring_gdn.json" 2>>"$out/kernels.log" | grep "^|" ;;
  verify)
    # tilings first (batch 256, T = 4), then the table with the default tiling
    python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b --tokens 4 \
      --batches 256 --tune '[{}, {"block_n": 16}, {"block_n": 64}, {"num_warps": 4}]' \
      2>>"$out/verify.log" | grep "^|"
    python3 -m replayjax.bench.verify --family gdn --tokens 4 --batches 256 \
      --tune '[{}, {"block_k_long": 32}, {"block_k_long": 64}, {"num_warps": 2}]' \
      2>>"$out/verify.log" | grep "^|"
    # both kernels launched row-slowest (against the {} rows above: the same order on both sides)
    python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b --tokens 4 \
      --batches 256 --tune '[{"grid_order": "row_slowest"}]' \
      --tune-baseline '[{"grid_order": "row_slowest"}]' 2>>"$out/verify.log" | grep "^|"
    python3 -m replayjax.bench.verify --family gdn --tokens 4 --batches 256 \
      --tune '[{"grid_order": "row_slowest"}]' \
      --tune-baseline '[{"grid_order": "row_slowest"}]' 2>>"$out/verify.log" | grep "^|"
    for fam in mamba2 gdn; do
      python3 -m replayjax.bench.verify --family $fam --batches 1 32 256 \
        --json "$out/verify_$fam.json" 2>>"$out/verify.log"
    done ;;
  verify-t8)
    # both families' ReplaySSM verify at T = 2 / 4 / 8, Triton and Mosaic, against the
    # baselines tuned by window (GDN block_v 16 since the twelfth session, Mamba-2's order by
    # T); then GDN's baseline at block_v 8, the one narrower tile not yet timed
    for fam in mamba2:nemotron-h-8b gdn:qwen3-next; do
      limit 150 python3 -m replayjax.bench.verify --family ${fam%%:*} --shapes ${fam##*:} \
        --tokens 2 4 8 --batches 256 --impls pallas pallas_mosaic_gpu \
        --json "$out/verify_t248_${fam%%:*}.json" 2>>"$out/verify.log" | grep "^|"
    done
    limit 120 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens 4 8 \
      --batches 256 --tune-baseline '[{}, {"block_v": 8}]' \
      --json "$out/verify_baseline_gdn.json" 2>>"$out/verify.log" | grep "^|" ;;
  e2e)
    # decode A/B (the issue's targets: >= 1.4x at batch 256 on the Mamba-2 model, batch 1 within
    # 2%); prompts log-uniform around 128 tokens
    e2e 330 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants standard replay
    e2e 200 --synthetic nemotron-h-8b --batch 1 --prompt-len 128 --variants standard replay ;;
  e2e-attn)
    e2e 330 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants standard replay \
      --impl pallas ;;
  e2e-attn-check)
    e2e 290 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 \
      --variants standard@pallas standard@pallas_triton standard@xla ;;
  e2e-spec)
    # MTP K = 3, ReplaySSM vs state-per-draft (batch 64: the baseline's T + 1 states per sequence
    # did not fit next to the model at 128)
    e2e 330 --synthetic nemotron-h-8b --batch 64 --prompt-len 128 --variants replay+mtp standard+mtp
    e2e 250 --synthetic nemotron-h-8b --batch 64 --prompt-len 128 --workload sync \
      --variants replay+mtp standard+mtp ;;
  e2e-spec-qwen)
    # MTP K = 3 on the GDN hybrid (Qwen3.5-9B dims, its MTP head; the GDN verify by tf32
    # wgmmas since stop 44), ReplaySSM vs state-per-draft at batch 64, mixed prompts
    e2e 520 --synthetic qwen3.5-9b --batch 64 --prompt-len 128 --variants replay+mtp standard+mtp ;;
  e2e-spec-visits)
    # a device drafter's verify steps chained in one while_loop (--steps-per-visit 16, the
    # bench's default) against one step a host visit (the engine before stop 36), mixed prompts
    e2e 290 --synthetic nemotron-h-8b --batch 64 --prompt-len 128 --variants replay+mtp standard+mtp
    e2e 280 --synthetic nemotron-h-8b --batch 64 --prompt-len 128 --steps-per-visit 1 \
      --variants replay+mtp standard+mtp ;;
  e2e-more)
    e2e 420 --synthetic qwen3.5-9b --batch 256 --prompt-len 128 --variants standard replay ;;
  e2e-qwen-mosaic)
    # the Mosaic GDN kernels' compiled tests, then the Qwen3.5-9B step at batch 256 with
    # today's `auto` (the Mosaic GDN replay from 16 rows since the nineteenth session) and
    # without that replay (AUTO_OPS patched in that process, --isolate none), for a same-run
    # ratio. QWEN_VARIANTS (default "replay": the patch leaves the standard step as it is)
    # picks the variants of each run
    REPLAYJAX_TEST_BACKEND=gpu limit 110 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels -k "gdn and mosaic" 2>&1 | tail -3 || true
    for patch in "" "m.AUTO_OPS = m.AUTO_OPS - {'replay_decode'}"; do
      limit 240 python3 -c "import sys; import pallas_kernels.gdn.pallas_mosaic_gpu as m; $patch
from replayjax.bench.e2e import main; sys.exit(main(sys.argv[1:]))" --synthetic qwen3.5-9b \
        --batch 256 --prompt-len 128 --variants ${QWEN_VARIANTS:-replay} --isolate none \
        --new-tokens 64 --json 2>>"$out/e2e.log" | tee -a "$out/e2e.jsonl" | tail -c 800 || true
    done ;;
  e2e-32)
    e2e 250 --synthetic nemotron-h-8b --batch 32 --prompt-len 128 --variants standard replay ;;
  e2e-moe|e2e-moe-qwen)
    # issue 14's rows: standard vs replay decode steps at batch 256, 32, 1 (equal 128-token
    # prompts: one prefill program per process, the compilation these MoE models pay per process)
    m=$([ $stage = e2e-moe ] && echo nemotron-3-nano-30b-a3b || echo qwen3.5-35b-a3b)
    for b in 256 32 1; do
      e2e 200 --synthetic $m --batch $b --prompt-len 128 --workload sync \
        --variants standard replay
    done ;;
  check)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    REPLAYJAX_TEST_BACKEND=gpu limit 330 python3 -m pytest -q -p no:cacheprovider -W ignore \
      -n 6 tests/pallas_kernels tests/models -k "not xla" 2>&1 | tee "$out/tests.log" | tail -8 \
      || true    # (failed tests: the benchmarks still run)
    for fam in mamba2 gdn; do
      limit 50 python3 -m replayjax.bench.kernels --family $fam --batches 1 32 256 \
        --json "$out/kernels_$fam.json" 2>>"$out/kernels.log" | grep "^|"
    done
    limit 50 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 4 --batches 256 --tune-baseline '[{}, {"block_n": 32}, {"num_warps": 4}]' \
      --json "$out/verify_mamba2.json" 2>>"$out/verify.log" | grep "^|"
    limit 50 python3 -m replayjax.bench.verify --family gdn --tokens 4 --batches 256 \
      --tune-baseline '[{}, {"block_v": 64}, {"num_warps": 4}]' \
      --json "$out/verify_gdn.json" 2>>"$out/verify.log" | grep "^|"
    limit 100 python3 -m replayjax.bench.moe --batches 1 32 256 --json "$out/moe.json" \
      2>>"$out/moe.log" | grep -v "^WARNING" ;;
  peers)
    limit 150 python3 .peer_bench/peer_bench.py --out "$out" --batches 1 32 256 512 \
      2>>"$out/peers.log" | tail -40 || true
    for fam in mamba2 gdn; do
      limit 200 python3 -m replayjax.bench.kernels --family $fam --batches 1 8 32 64 128 256 512 \
        --impls pallas pallas_mosaic_gpu --json "$out/kernels_sweep_$fam.json" \
        2>>"$out/kernels.log" | grep "^|"
    done ;;
  ncu)
    # NCU_KERNELS (scripts/ncu_kernels.py --kernel), NCU_FAMILIES, NCU_IMPLS; verify at each
    # window of NCU_TOKENS (default 4)
    for kern in ${NCU_KERNELS:-replay}; do
      name=replay_decode suffix="" windows=1              # replay's CSVs keep their old names
      if [ "$kern" = verify ]; then name=replay_verify windows=${NCU_TOKENS:-4}; fi
      for T in $windows; do
        if [ "$kern" = verify ]; then suffix=_verify_t$T; fi
        for fam in ${NCU_FAMILIES:-mamba2 gdn}; do
          for impl in ${NCU_IMPLS:-pallas pallas_mosaic_gpu}; do
            ncu_csv "${fam}_$impl$suffix" $name python3 scripts/ncu_kernels.py --family $fam \
              --impl $impl --kernel $kern --tokens $T
          done
        done
      done
    done ;;
  ncu-gdn)
    # issue 16's GDN replay (ours 196.6-208 us against the authors' 162.6 at batch 256): the
    # authors' kernel under the same Nsight Compute sections as ours, every kernel on bf16 rings
    # (the authors' and the models'), ours at its default and the authors' launch (1 warp, 3
    # stages); then the same run's times (peer harness, GDN only, and `bench kernels`)
    ncu_csv gdn_authors replayssm python3 scripts/ncu_peer_gdn.py --peer .peer_bench
    ncu_csv gdn_pallas_bf16 replay_decode python3 scripts/ncu_kernels.py --family gdn \
      --ring-dtype bfloat16
    ncu_csv gdn_pallas_bf16_w1s3 replay_decode python3 scripts/ncu_kernels.py --family gdn \
      --ring-dtype bfloat16 --tiling '{"num_warps": 1, "num_stages": 3}'
    ncu_csv gdn_mosaic_bf16 replay_decode python3 scripts/ncu_kernels.py --family gdn \
      --impl pallas_mosaic_gpu --ring-dtype bfloat16
    limit 90 python3 .peer_bench/peer_bench.py --out "$out" --batches 256 --families gdn \
      --no-fla --skip-check 2>>"$out/peers.log" | tail -12 || true
    limit 150 python3 -m replayjax.bench.kernels --family gdn --batches 256 --ring-dtype bfloat16 \
      --impls pallas pallas_mosaic_gpu --json "$out/kernels_gdn_bf16.json" \
      2>>"$out/kernels.log" | grep "^|" ;;
  gdn-warps)
    # the authors' GDN replay runs 1 warp a program at 238 registers, 8 warps an SM, with 75%
    # of DRAM throughput (ncu-gdn); ours at 1 warp spilled. Our Triton replay at 1-2 warps with
    # the ring key products from XLA (no [L, bk] ring keys live in the state pass), bf16 rings
    limit 240 python3 -m replayjax.bench.kernels --family gdn --batches 256 --ring-dtype bfloat16 \
      --tune '[{}, {"ring_scalars": "xla"}, {"num_warps": 1, "num_stages": 3},
        {"num_warps": 1, "num_stages": 3, "ring_scalars": "xla"},
        {"num_warps": 1, "num_stages": 2, "ring_scalars": "xla"},
        {"num_warps": 2, "num_stages": 3, "ring_scalars": "xla"},
        {"num_warps": 1, "num_stages": 3, "ring_scalars": "xla", "block_k": 32},
        {"num_warps": 1, "num_stages": 3, "ring_scalars": "xla", "grid_order": "head_slowest"},
        {"num_warps": 1, "ring_scalars": "xla", "chunk_loop": "unrolled"}]' \
      --json "$out/kernels_gdn_warps.json" 2>>"$out/kernels.log" | grep "^|" ;;
  isa-gdn)
    # static opcode histogram of the Mosaic GDN replay's PTX (scripts/isa_histogram.py; the
    # H200 image has no nvdisasm for SASS, and XLA's dump holds no Triton PTX); the dump, gzipped
    rm -rf /tmp/isa-m && mkdir -p /tmp/isa-m
    MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/isa-m limit 90 \
      python3 scripts/ncu_kernels.py --family gdn --impl pallas_mosaic_gpu \
      --ring-dtype bfloat16 --steps 2 >/dev/null || true
    cat /tmp/isa-m/*.ptxas 2>/dev/null || true
    python3 scripts/isa_histogram.py $(ls /tmp/isa-m/*.ptx 2>/dev/null) --top 30 || true
    tar czf "$out/isa_gdn.tgz" -C /tmp isa-m || true ;;
  attention)
    limit 280 python3 -m replayjax.bench.attention --batches 1 32 256 --tokens 1 4 \
      --tune '[{}, {"block_k": 32}, {"block_k": 64}, {"block_k": 128}, {"num_stages": 3}]' \
      --json "$out/attention.json" 2>>"$out/attention.log" | grep "^|" ;;
  conv)
    limit 240 python3 -m replayjax.bench.conv --batches 1 32 256 \
      --tune '[{}, {"block_c": 512}, {"block_c": 2048, "num_warps": 8}, {"num_warps": 8},
      {"grid_order": "row_slowest"}]' --json "$out/conv.json" 2>>"$out/conv.log" | grep "^|" ;;
  moe-small)
    # the default path (the twelfth session's, with the counted plan: 61.7 / 39.6 / 43.2 us at
    # batch 1 on an H200; since then one token's plan of P tiles and the rows' tokens gathered
    # in the gate/up kernel), then the pair path (MOE_VARIANTS); the narrower tiles lost (tenth
    # session)
    limit 300 python3 -m replayjax.bench.moe --batches 1 8 32 \
      --variants ${MOE_VARIANTS:-sparse-shared sparse-small} --breakdown \
      --json "$out/moe_small.json" 2>>"$out/moe.log" | grep -v "^WARNING" ;;
  moe-pairs)
    # the pair path with tensor-core dots (stop 61: both GEMMs in one launch, their weight loads
    # pipelined; no plan, no hidden activations in memory) against the grouped path, both with
    # the shared expert's chunks and the router kernel: compiled pair tests, then batch 1 over
    # PairTiling neighbours, and the router kernel on 1 warp (its top-k rounds' reductions
    # within a warp) (MOE_PAIRS_BATCHES, MOE_PAIRS_TILINGS, MOE_ROUTER_TILINGS, MOE_PAIRS_S)
    pair_tilings='[{}, {"min_programs": 256}, {"min_programs": 1}, {"num_stages": 4},
                   {"block_d": 256}]'
    router_tilings='[{}, {"num_warps": 1}]'
    REPLAYJAX_TEST_BACKEND=gpu limit 120 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_moe.py -k "pairs and not lowering" 2>&1 | tail -4
    limit "${MOE_PAIRS_S:-300}" python3 -m replayjax.bench.moe \
      --batches ${MOE_PAIRS_BATCHES:-1} --variants sparse-shared sparse-small --breakdown \
      --small-tilings "${MOE_PAIRS_TILINGS:-$pair_tilings}" \
      --router-tilings "${MOE_ROUTER_TILINGS:-$router_tilings}" \
      --json "$out/moe_pairs.json" 2>>"$out/moe.log" | grep -v "^WARNING" ;;
  moe-b1-route)
    # the router kernel writing the shared expert's chunk columns (and Qwen's shared gate) in
    # its launch (stop 60: at batch 1 two concatenations and the gate's GEMV were ~4.4 us of
    # Qwen3.5-35B's 39.5 us layer on an H100): the default path at batch 1 / 8 / 32, then the
    # same in OLD_TREE (the commit before, `git archive` into an ignored folder and carried),
    # if given, in the same call
    # (MOE_ROUTE_BATCHES, MOE_ROUTE_S: fewer batches and seconds a half for a short call)
    limit "${MOE_ROUTE_S:-220}" python3 -m replayjax.bench.moe \
      --batches ${MOE_ROUTE_BATCHES:-1 8 32} --variants sparse-shared --breakdown \
      --json "$out/moe_route.json" 2>>"$out/moe.log" | grep -v "^WARNING"
    if [ -n "${OLD_TREE:-}" ]; then
      (cd "$OLD_TREE" && limit "${MOE_ROUTE_S:-220}" python3 -m replayjax.bench.moe \
        --batches ${MOE_ROUTE_BATCHES:-1 8 32} --variants sparse-shared --breakdown \
        --json "$out/moe_route_old.json" 2>>"$out/moe.log" | grep -v "^WARNING")
    fi ;;
  moe-router)
    limit 300 python3 -m replayjax.bench.moe --batches 1 8 32 --variants sparse sparse-shared \
      --breakdown --router-tilings '[{}, {"logits": "kernel"}, {"logits": "kernel",
      "num_warps": 8, "tile_elems": 16384}, {"logits": "kernel", "num_warps": 16,
      "tile_elems": 32768}]' --json "$out/moe_router.json" 2>>"$out/moe.log" \
      | grep -v "^WARNING" ;;
  moe-grid)
    limit 300 python3 -m replayjax.bench.moe --models qwen3.5-35b-a3b qwen3-next-80b-a3b \
      --batches 1 8 32 128 256 --variants sparse tokamax --json "$out/moe_grid.json" \
      2>>"$out/moe.log" | grep -v "^WARNING" ;;
  tp)
    REPLAYJAX_TEST_BACKEND=gpu timeout 540 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/models/test_tp.py tests/models/test_mosaic_in_model.py 2>&1 | tail -8 ;;
  tp-check)
    for m in nemotron-h-8b qwen3.5-9b; do
      limit 150 python3 scripts/tp_check.py --synthetic $m --dtype float32 --tp 2 --batch 8 \
        --new-tokens 32 2>>"$out/tp.log" | tee -a "$out/tp.jsonl" || true
    done
    # every HF fixture with n-gram speculation (rollbacks), the modes alternating
    mode=standard
    for f in tests/fixtures/hf/*/; do
      mode=$([ $mode = replay ] && echo standard || echo replay)
      limit 60 python3 scripts/tp_check.py --model "$f" --tp 2 --num-draft 3 --mode $mode \
        2>>"$out/tp.log" | tee -a "$out/tp.jsonl" || true
    done
    gen="generate --model tests/fixtures/hf/nemotron_h --max-new-tokens 24 --json \
      --prompt-ids 62,24,25,9,11 --prompt-ids 7,8,9,10,11,12,13"
    limit 60 python3 -m replayjax.cli $gen --tp 1 2>>"$out/tp.log" > "$out/tp_one.json"
    limit 90 python3 -m replayjax.cli launch --nproc 2 -- $gen --tp 2 2>>"$out/tp.log" \
      > "$out/tp_two.json"
    python3 -c "import json, sys; t = [[r['tokens'] for r in json.load(open(f))['results']]
      for f in sys.argv[1:]]; print('two-process tokens == one-process:', t[0] == t[1])" \
      "$out/tp_one.json" "$out/tp_two.json" ;;
  tp-8b)
    # the TP = 1 row first, then TP = 2 (each variant in its own process)
    e2e 280 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants replay --tp 1
    e2e 280 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants replay --tp 2 ;;
  tp-8b-oneshot)
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true" \
      e2e 280 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants replay --tp 2 ;;
  tp-80b)
    e2e 560 --synthetic qwen3-next-80b-a3b --batch 64 --prompt-len 128 --tp 2 \
      --variants replay standard ;;
  tp-lm-head)
    # replicated vs vocab-parallel LM head (gathering logits or only argmaxes), per step
    limit 200 python3 scripts/tp_lm_head.py --tp 2 --batches 1 64 256 2>>"$out/tp.log" ;;
  tp-allreduce)
    limit 150 python3 scripts/tp_allreduce.py --tp 2 --batches 1 64 256 2>>"$out/tp.log" ;;
  tp-80b-ep)
    # expert parallel vs the width split (tp-80b's replay rows), batch 64 then 256
    for b in 64 256; do
      e2e 280 --synthetic qwen3-next-80b-a3b --batch $b --prompt-len 128 --tp 2 \
        --expert-parallel --variants replay
    done ;;
  tp-80b-256)
    e2e 560 --synthetic qwen3-next-80b-a3b --batch 256 --prompt-len 128 --tp 2 \
      --variants replay standard ;;
  mosaic)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    limit 60 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mosaic_lowering.py 2>&1 | tee "$out/mosaic_tests.log" | tail -3 \
      || true
    # at most 420 s of tests: 22 with the prologue="overlap" ones
    each_test 420 -k mosaic
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 1 32 256 --impls pallas pallas_mosaic_gpu --json "$out/kernels_mosaic.json" \
      2>>"$out/mosaic.log" | grep "^|"
    limit 150 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 1 32 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/kernels_mosaic_gdn.json" 2>>"$out/mosaic.log" | grep "^|"
    # prologue "serial" (the ring walk before the state stream) right after the default
    # ("overlap"): the A/B comes first if the limit cuts the sweep
    limit 260 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_mosaic_tune.json" \
      --tune '[{}, {"prologue": "serial"}, {"num_stages": 3}, {"block_n": 16}, {"block_n": 64}]' \
      2>>"$out/mosaic.log" | grep "^|"
    limit 260 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_mosaic_tune_gdn.json" \
      --tune '[{}, {"prologue": "serial"}, {"num_stages": 3}, {"block_k": 32}, {"block_k": 128}]' \
      2>>"$out/mosaic.log" | grep "^|" ;;
  bc-products)
    # the Mosaic Mamba-2 replay's B . C products by one Pallas launch (bc_products="pallas", the
    # default since stop 36) against XLA's gather-and-reduce fusions (6.5 us a step at 256):
    # compiled tests, then the 8B's replay both ways at batch 1 / 32 / 256 (amortised rows)
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py tests/pallas_kernels/test_decode.py \
      -k "bc_products or bc-xla or (mamba2 and mosaic and replay_matches)" 2>&1 | tail -3 \
      || true
    for cfg in '{"bc_products": "xla"}' '{}'; do
      tag=$([ "$cfg" = '{}' ] && echo pallas || echo xla)
      limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
        --batches 1 32 256 --impls pallas_mosaic_gpu --replay-config "$cfg" \
        --json "$out/kernels_bc_$tag.json" 2>>"$out/kernels.log" | grep "^|" || true
    done ;;
  products)
    REPLAYJAX_TEST_BACKEND=gpu limit 170 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_ring_products.py tests/pallas_kernels/test_decode.py \
      tests/pallas_kernels/test_verify.py -k "ring_products or keys-pallas or bc-pallas" \
      > "$out/tests.log" 2>&1 || true
    tail -3 "$out/tests.log"
    limit 90 python3 scripts/ring_products_bench.py 2>>"$out/kernels.log" | grep -v "^WARNING" \
      | tee "$out/ring_products.md" || true
    for b in ${PRODUCT_BATCHES:-256 32}; do
      limit 90 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches $b \
        --impls pallas_mosaic_gpu --tune '[{}, {"key_products": "pallas"}]' \
        --json "$out/kernels_keys_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
    done
    for fam in ${PRODUCT_FAMILIES:-gdn}; do
      cfg=$([ $fam = gdn ] && echo '{"key_products": "pallas"}' || echo '{"bc_products": "pallas"}')
      shape=$([ $fam = gdn ] && echo qwen3-next || echo nemotron-h-8b)
      limit 280 python3 -m replayjax.bench.verify --family $fam --shapes $shape --tokens 2 4 8 \
        --batches 256 --impls pallas_mosaic_gpu --tune "[{}, $cfg]" --breakdown \
        --json "$out/verify_products_$fam.json" 2>>"$out/verify.log" | grep -v "^WARNING" \
        || true
    done ;;
  keys-kernel)
    each_test 200 -k "gdn and mosaic and (keys or 4-8-pallas)" | tee "$out/tests.txt"
    limit 200 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens 2 4 8 \
      --batches 256 --impls pallas_mosaic_gpu --breakdown --tune '[{}, {"key_products": "kernel"},
      {"key_products": "kernel", "prologue": "overlap"}]' \
      --json "$out/verify_keys_kernel.json" 2>>"$out/verify.log" | grep -v "^WARNING" || true
    # T = 8 with the products in the kernel: chunks of 16 keys in 3-4 stages, 32 in 3
    verify_tune 150 gdn qwen3-next keys_kernel_tiles 8 '[{"key_products": "kernel"},
      {"key_products": "kernel", "block_k": 16, "num_stages": 3},
      {"key_products": "kernel", "block_k": 16, "num_stages": 4},
      {"key_products": "kernel", "num_stages": 3}]' ;;
  keys-kernel-windows)
    # the window products k_r . k_t, k_r . q_t in SMEM with the walk's scalars (no GMEM scalar
    # reads in the substitution) and the products in the kernel from 5 tokens: compiled tests,
    # then the verify at T = 2 / 4 by default and with the window's d written to the ring by
    # the kernel, the tree before it (OLD_TREE, a copy of its packages) at T = 2 / 4, and
    # T = 5 / 8 by default and with the launch's products
    each_test 120 -k "gdn and mosaic and random_acceptance and (4-8-pallas or keys-pallas or 8-16)" \
      | tee "$out/tests.txt"
    limit 100 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next \
      --tokens 2 4 --batches 256 --impls pallas_mosaic_gpu \
      --tune '[{}, {"ring_write": "kernel"}]' --json "$out/verify_window_smem_t24.json" \
      2>>"$out/verify.log" | grep "^|" || true
    if [ -n "${OLD_TREE:-}" ]; then
      (cd "$OLD_TREE" && limit 100 python3 -m replayjax.bench.verify --family gdn \
        --shapes qwen3-next --tokens 2 4 --batches 256 --impls pallas_mosaic_gpu \
        --json "$out/verify_window_gmem.json" 2>>"$out/verify.log" | grep "^|" || true)
    fi
    limit 130 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next \
      --tokens 5 8 --batches 256 --impls pallas_mosaic_gpu --tune '[{}, {"key_products":
      "pallas"}]' --json "$out/verify_window_smem_t58.json" \
      2>>"$out/verify.log" | grep "^|" || true ;;
  options-compiled)
    # the Mosaic kernels' options as the CPU tests merge them (stop 52), compiled: Mamba-2's
    # replay bc-xla + lean fold, verify bc-pallas + ring_write="kernel"; GDN's replay full fold,
    # mma + keys-pallas, verify fma + full fold, keys-pallas, in-kernel keys + overlap +
    # ring_write="xla" (GDN's default writes in the kernel since stop 54), in-kernel keys at T = 8
    each_test 170 -k "mosaic and (lean-fold or full-fold or keys-pallas or ring-write or keys-kernel)" \
      | tee "$out/tests.txt" ;;
  rows)
    # readout "fma_rows" (stop 56: a thread a row, 16-byte loads of the swizzled chunk without
    # selects, in-thread row sums; by ptxas the decode's read-only loop body 268 ("fma") / 217
    # ("fma_deferred") -> 175 instructions, registers 115 -> 110): the readout tests compiled
    # (fma / mma / fma_deferred / fma_rows agree; 128- and 64-row tiles), then the replay decode
    # at batch 256 with the standard kernel beside it, then the verify at T = 2 by FMAs in rows
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_gdn.py -k "readouts or standard_rows" 2>&1 | tail -4 \
      | tee "$out/tests.txt" || true
    # (a --tune entry's fields go to the standard kernel too: "fma_rows" there reads and updates
    # a thread a row, 1136 -> 752 instructions a CTA by ptxas, 192 selects fewer; block_k 32
    # the replay's own, the standard's 64 -> 32: 72 registers, 6 CTAs an SM)
    limit 240 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 256 \
      --impls pallas_mosaic_gpu --tune '[{}, {"readout": "fma_deferred"}, {"readout":
      "fma_rows"}, {"readout": "fma_rows", "block_k": 32}, {"readout": "fma_rows", "prologue":
      "fused"}, {"readout": "fma_rows", "block_k": 16, "num_stages": 6}]' \
      --json "$out/kernels_rows_b256.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 120 gdn qwen3-next rows 2 '[{}, {"readout": "fma_rows", "key_products":
      "pallas", "prologue": "fused"}, {"readout": "fma_rows", "key_products": "pallas"}]' ;;
  ring-block)
    # ring_block (stop 57): the ring rows a replay walk reads (GDN's d, Mamba-2's x) copied in
    # blocks of 4, each only where the count reaches it, the default since an H100 run
    # (docs/benchmarks.md, thirty-second session): the compiled cases first, then each
    # default against one whole copy (ring_block 0)
    # (the products launch reads each slot's committed ring rows only since stop 57, not yet
    # compiled: its tests first; GDN's decode takes the launch by default since, XLA's
    # products beside it)
    REPLAYJAX_TEST_BACKEND=gpu limit 60 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_ring_products.py 2>&1 | tail -1 | tee "$out/tests.txt" || true
    each_test 120 -k "mosaic and (ring-block or whole-ring or L4-f32 or 4-8)" \
      | tee -a "$out/tests.txt"
    limit 120 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 256 \
      --impls pallas_mosaic_gpu --tune '[{}, {"ring_block": 0}, {"key_products": "xla"}]' \
      --json "$out/kernels_gdn_ring_block_b256.json" 2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 80 gdn qwen3-next ring_block 4 '[{}, {"ring_block": 0}]'
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      nemotron-nano-9b-v2 --batches 256 --impls pallas_mosaic_gpu --tune '[{}, {"ring_block":
      0}]' --json "$out/kernels_m2_ring_block_b256.json" 2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 80 gdn qwen3-next ring_block 2 '[{}, {"ring_block": 0}]'
    # (from 5 tokens the fused prologue's default copies the ring whole: blocks cost it 15
    # registers at T = 8, 2 CTAs an SM; at T = 5 / 6 / 7 2 / 0 / 7, still 3 CTAs, by ptxas)
    verify_tune 80 gdn qwen3-next ring_block 6 '[{}, {"ring_block": 4}]' ;;
  p80-rows128)
    # the Mosaic Mamba-2 replay decode over 128-row tiles at P = 80 (stop 57: one CTA a head's
    # 80 rows, the 48 past P zeros from the TMA box, where 64-row tiles take a CTA of 64 rows
    # and a ragged one of 16; by ptxas with one head a CTA 80 registers, 43 KiB, 5 CTAs an SM
    # as the default; 1.59x its standard on the H200 against the 1.6x target): compiled, then
    # P = 80 at batch 256, the Triton standard (the target's baseline) in the same call
    REPLAYJAX_TEST_BACKEND=gpu limit 100 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py -k "128_row" 2>&1 | tail -2 | tee "$out/tests.txt" \
      || true
    # (the default there since stop 58, 1.74x on an H100: `{}`; the 64-row tiles beside it)
    limit 240 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu --tune '[{}, {"tile_rows": 64, "heads": 2},
      {"prologue": "overlap"}, {"ring_block": 2}, {"readout": "fma_rows"}]' \
      --json "$out/kernels_m2_p80_rows128_b256.json" 2>>"$out/kernels.log" | grep "^|" || true
    limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas --json "$out/kernels_m2_p80_triton_b256.json" \
      2>>"$out/kernels.log" | grep "^|" || true ;;
  h200-59)
    # the H200 rows the targets are measured on, in one call (run with needs_h200: Mamba-2's
    # T = 8 state-per-draft baseline, 9 states a row, does not fit an H100's memory): the GDN
    # verify's defaults at T = 4 / 8 (3x targets; H100 2.88x / 3.40x), P = 80's replay over
    # 128-row tiles beside its Triton standard (1.6x target; H100 1.74x), the GDN replay decode
    # (145 us target; H100 226.9), then Mamba-2's verify at T = 8 (3.06x on the H200 before)
    limit 150 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens 4 8 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/verify_gdn_t4_t8.json" \
      2>>"$out/verify.log" | grep "^|" || true
    limit 130 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu pallas --json "$out/kernels_m2_p80_b256.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 100 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 256 \
      --impls pallas_mosaic_gpu --json "$out/kernels_gdn_b256.json" 2>>"$out/kernels.log" \
      | grep "^|" || true
    verify_tune 150 mamba2 nemotron-h-8b m2 8 '[{}]' ;;
  h200-56)
    # stop 56's H200 rows in one call (run with needs_h200: Mamba-2's T = 8 baseline did not fit
    # an H100's memory): the GDN verify's fused default at T = 8 / 5 against the serial prologue
    # (3.40x / 2.84x on an H100), Mamba-2's T = 8 with the overlap prologue, then "fma_rows"
    verify_tune 130 gdn qwen3-next fused 8 '[{}, {"prologue": "serial"}]'
    verify_tune 100 gdn qwen3-next fused 5 '[{}, {"prologue": "serial"}]'
    verify_tune 150 mamba2 nemotron-h-8b m2_overlap 8 '[{}, {"prologue": "overlap"}]'
    limit 130 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 256 \
      --impls pallas_mosaic_gpu --tune '[{}, {"readout": "fma_rows"}]' \
      --json "$out/kernels_rows_b256.json" 2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 80 gdn qwen3-next rows 2 '[{}, {"readout": "fma_rows", "key_products":
      "pallas"}]' ;;
  m2-rows)
    # the Mosaic Mamba-2 replay's readout "fma_rows" (stop 56; by `mosaic_ptxas.py --sass` its
    # read-only loop 186 -> 105 instructions a 32-column chunk of two heads, registers 87 -> 105:
    # 4 CTAs an SM where 5 were; with the overlap prologue 94 registers and 5 CTAs, with
    # 16-column chunks in 4 stages 79 and 5): compiled tests, then P = 80 (Nemotron-Nano-9B-v2,
    # 1.59x its standard on the H200, target 1.6x: a ragged 16-row tile a head) and the 8B
    REPLAYJAX_TEST_BACKEND=gpu limit 100 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py -k "rows_readout" 2>&1 | tail -2 | tee "$out/tests.txt" \
      || true
    limit 420 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      nemotron-h-8b --batches 256 --impls pallas_mosaic_gpu --tune '[{}, {"readout":
      "fma_rows"}, {"readout": "fma_rows", "prologue": "overlap"}, {"readout": "fma_rows",
      "block_n": 16, "num_stages": 4}]' --json "$out/kernels_m2_rows_b256.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    # (the P = 80 target's standard is the Triton kernel, row-slowest: the same call's row)
    limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas --json "$out/kernels_m2_p80_triton_b256.json" \
      2>>"$out/kernels.log" | grep "^|" || true ;;
  fused)
    # GDN's "fused" prologue (the walk after the stream, updating S0 x in place; by
    # scripts/mosaic_ptxas.py: T = 8 222 -> 166 registers with its own products, whose SMEM then
    # takes a scope after the stream: 3 CTAs an SM where 2 were), the verify's default from 5
    # tokens since the thirtieth session (H100: T = 8 563.0 -> 502.9 us): compiled tests, then
    # the verify against the serial prologue by window and the decode's tilings of 4-5 CTAs an
    # SM (the decode's fold in one stage, 16-key chunks: no gain on the H100), at batch 256
    each_test 100 -k "gdn and mosaic and (fused or keys-pallas or keys-kernel or 8-16)" \
      | tee "$out/tests.txt"
    REPLAYJAX_TEST_BACKEND=gpu limit 90 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_gdn.py -k "readouts" 2>&1 | tail -3 | tee -a "$out/tests.txt" || true
    verify_tune 150 gdn qwen3-next fused 8 '[{}, {"prologue": "serial"}, {"key_products":
      "pallas"}]'
    # (T = 4's products in the kernel under the serial prologue, their rows in its scope since
    # stop 55: 69 KiB, 3 CTAs an SM where they held 2, not yet timed)
    verify_tune 150 gdn qwen3-next fused 4 '[{}, {"key_products": "kernel"}, {"prologue":
      "fused"}, {"prologue": "fused", "key_products": "kernel"}]'
    # (the decode's readout "fma_deferred": the FMAs' column sums once, after the stream: its
    # read-only loop 268 -> 217 SASS instructions a chunk by ptxas, registers unchanged)
    limit 150 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 256 \
      --impls pallas_mosaic_gpu --tune '[{}, {"readout": "fma_deferred"}, {"readout":
      "fma_deferred", "prologue": "fused"}, {"num_stages": 2, "fold_stages": 1}]' \
      --json "$out/kernels_fused_b256.json" 2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 100 gdn qwen3-next fused 5 '[{}, {"prologue": "serial"}]' ;;
  m2-overlap)
    # the Mosaic Mamba-2 verify with the "overlap" prologue (its walk after the stream): by
    # scripts/mosaic_ptxas.py T = 8 245 -> 167 registers, 3 CTAs an SM where 2 were (T = 4 168 ->
    # 153); the default's compiled tests first (a T = 8 baseline needs an H200's memory)
    each_test 60 -k "mamba2 and overlap" | tee "$out/tests.txt"
    verify_tune 200 mamba2 nemotron-h-8b m2_overlap 8 '[{}, {"prologue": "overlap"},
      {"prologue": "overlap", "num_stages": 3}]'
    # (T = 4 with 16-column chunks: 127 registers, 4 CTAs serial; 95 and 5 with "overlap";
    # the H100 had the default and "overlap" even, 550.6 / 548.2 us, thirtieth session)
    verify_tune 150 mamba2 nemotron-h-8b m2_overlap 4 '[{}, {"prologue": "overlap"},
      {"prologue": "overlap", "block_n": 16}, {"prologue": "overlap", "block_n": 16,
      "num_stages": 4}]' ;;
  verify-split)
    # the Mosaic verify's non-fold and fold steps (counts held: no row folds / every row does)
    # beside its step under random acceptance, T = 4 / 8, batch 256 (VERIFY_SPLIT_FAMILIES,
    # default gdn): how much of the step the folds are, i.e. what a lower fold rate would gain
    for fam in ${VERIFY_SPLIT_FAMILIES:-gdn}; do
      shape=qwen3-next; if [ "$fam" = mamba2 ]; then shape=nemotron-h-8b; fi
      limit 150 python3 -m replayjax.bench.verify --family "$fam" --shapes $shape --tokens 4 8 \
        --batches 256 --impls pallas_mosaic_gpu --split --json "$out/verify_split_$fam.json" \
        2>>"$out/verify.log" | grep "^|" || true
    done ;;
  verify-regs)
    # ptxas' registers and spills of the Mosaic GDN verify by window (T = 4 -> 5 adds ~90 us of
    # kernel time on an H100, twenty-seventh session): one short verify run per T with the
    # kernels' PTX and ptxas reports dumped, the reports printed and kept
    for T in 4 5 8; do
      rm -rf /tmp/isa-v$T && mkdir -p /tmp/isa-v$T
      MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=/tmp/isa-v$T limit 90 \
        python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens $T \
        --batches 256 --impls pallas_mosaic_gpu >/dev/null 2>>"$out/verify.log" || true
      echo "== T = $T"; grep -H -i "registers\|spill\|smem" /tmp/isa-v$T/*.ptxas \
        2>/dev/null | sort | uniq -c || true
    done
    tar czf "$out/isa_verify.tgz" -C /tmp isa-v4 isa-v5 isa-v8 || true ;;
  products-decode)
    for b in 256 32; do
      limit 80 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
        --batches $b --impls pallas_mosaic_gpu --tune '[{"bc_products": "xla"}, {}]' \
        --json "$out/kernels_bc_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
    done
    limit 80 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next --batches 32 \
      --impls pallas_mosaic_gpu --tune '[{}, {"key_products": "pallas"}]' \
      --json "$out/kernels_keys_b32.json" 2>>"$out/kernels.log" | grep "^|" || true
    for fam in gdn:qwen3-next mamba2:nemotron-h-8b; do
      limit 150 python3 -m replayjax.bench.verify --family ${fam%%:*} --shapes ${fam##*:} \
        --tokens 2 4 --batches 256 --impls pallas_mosaic_gpu \
        --json "$out/verify_defaults_${fam%%:*}.json" 2>>"$out/verify.log" | grep "^|" || true
    done ;;
  lean-fold)
    # the Mosaic Mamba-2 replay's fold in its own SMEM scope (as GDN's since stop 37): its
    # compiled fold tests (the lean-fold option too), the 8B at batch 256 with lean folds under
    # 3-4 read-only stages beside the default; then the Mosaic GDN replay's lean-fold default
    # beside Triton over batches (fp32 rings)
    REPLAYJAX_TEST_BACKEND=gpu limit 170 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py tests/pallas_kernels/test_decode.py \
      -k "fold_tiles or (mamba2 and mosaic and replay_matches)" 2>&1 | tail -3 || true
    limit 230 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_lean_fold.json" \
      --tune '[{}, {"num_stages": 4, "fold_stages": 2, "fold_buffers": 1},
               {"num_stages": 3, "fold_stages": 2, "fold_buffers": 1}, {"fold_buffers": 1}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 170 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 1 32 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/kernels_gdn_lean_sweep.json" 2>>"$out/kernels.log" | grep "^|" || true ;;
  replay-tiles)
    # the Triton Mamba-2 replay between batch 1 and `auto`'s Mosaic switch (16 rows): the 8B's
    # default (64 x 64 tiles on 2 warps: 255 registers and spills at 256) against 4 warps and
    # 32-wide chunks on 4 warps (365.3 / 360.6 vs 387.9 us at 256, sixteenth session), and P =
    # 80's (Triton at every batch) against its batch-1 tiles, at 2 / 4 / 8 rows
    for b in 2 4 8; do
      limit 60 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
        --batches $b --impls pallas --tune '[{}, {"num_warps": 4},
                 {"block_n": 32, "num_warps": 4}]' \
        --json "$out/kernels_8b_tiles_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
      limit 50 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
        --batches $b --impls pallas --tune '[{}, {"block_p": 32, "ring_loads": "all"}]' \
        --json "$out/kernels_p80_tiles_b$b.json" 2>>"$out/kernels.log" | grep "^|" || true
    done ;;
  p80-tiles)
    # the Triton Mamba-2 replay with y stored before its fold, the fold's window terms formed
    # again inside it (stop 35: the fewer registers live took P = 80's replay from 539 to 479 us
    # staggered at batch 256): its compiled tests, both shapes at batch 1 / 32 / 256, then the
    # tiles again at batch 256 (P = 80's default: one masked 128-row tile, 32-wide d_state
    # chunks, 4 warps; the 8B's: 64 x 64 on 2 warps)
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_decode.py -k "mamba2 and pallas] and not xla" 2>&1 | tail -3 \
      || true
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --batches 1 32 256 \
      --impls pallas --json "$out/kernels_mamba2_order.json" 2>>"$out/kernels.log" \
      | grep "^|" || true
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas --tune '[{}, {"block_n": 64}, {"num_warps": 8},
               {"block_n": 64, "num_warps": 8}, {"block_p": 64, "num_warps": 2},
               {"block_p": 64, "num_warps": 4}]' \
      --json "$out/kernels_p80_tiles.json" 2>>"$out/kernels.log" | grep "^|" || true
    limit 100 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas --tune '[{}, {"block_n": 32, "num_warps": 4},
               {"num_warps": 4}, {"block_n": 32}]' \
      --json "$out/kernels_8b_tiles.json" 2>>"$out/kernels.log" | grep "^|" || true ;;
  mosaic-p80)
    # The Mosaic kernels at ragged tiles (Nemotron-Nano-9B-v2's P = 80: a 64-row tile and one of
    # 16; the unit shapes' P / V = 80 too). The fourteenth session found their vector stores
    # writing past a ragged tile, now `_mosaic_utils.store_rows`: first the compiled Mosaic tests
    # of both families in one process (a failure is a result: the benches still run), then
    # decode at P = 80, Triton beside Mosaic, at 1 / 32 / 256, verify T = 4 at 256, Mosaic's
    # chunk widths and prologue at 256 (issue 16: P = 80 replay >= 1.6x its standard; `auto`
    # keeps Triton at P = 80 until this says otherwise)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    REPLAYJAX_TEST_BACKEND=gpu limit 270 python3 -m pytest -v -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_decode.py tests/pallas_kernels/test_verify.py -k mosaic \
      > "$out/mosaic_tests.log" 2>&1 || true
    grep -cE " PASSED" "$out/mosaic_tests.log" || true
    grep -E " (FAILED|ERROR)|^E .*(rel|error)" "$out/mosaic_tests.log" | head -12 || true
    tail -n1 "$out/mosaic_tests.log"
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 1 32 256 --impls pallas pallas_mosaic_gpu --json "$out/kernels_mosaic_p80.json" \
      2>>"$out/mosaic.log" | grep "^|" || true
    limit 100 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-nano-9b-v2 \
      --tokens 4 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_mosaic_p80.json" 2>>"$out/mosaic.log" | grep "^|" || true
    limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_mosaic_p80_tune.json" \
      --tune '[{}, {"block_n": 16}, {"block_n": 64}, {"prologue": "serial"}]' \
      2>>"$out/mosaic.log" | grep "^|" || true ;;
  p80-verify)
    # `auto` takes Mamba-2's Mosaic verify at P = 80 from the T = 4, batch-256 row (1.95x the
    # baseline vs Triton's 1.54x): T = 2 and 4 at batch 32 and 256, Triton beside Mosaic
    limit 300 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-nano-9b-v2 \
      --tokens 2 4 --batches 32 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_p80.json" 2>>"$out/verify.log" | grep "^|" || true ;;
  ring-write)
    # issue 16's ring scatter fused into the verify kernels: ring_write="kernel" (each program
    # writes its own rows of the window's ring entries, Mamba-2's x / GDN's d; XLA the rest)
    # against "xla" (XLA writes all of them after the kernel): the compiled tests, then verify +
    # commit at T = 4, batch 256, Triton and Mosaic
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_verify.py -k "ring_write or ring-write or options" 2>&1 | tail -3
    for pair in "mamba2 nemotron-h-8b" "gdn qwen3-next"; do
      read -r fam shape <<<"$pair"
      for impl in pallas pallas_mosaic_gpu; do
        limit 100 python3 -m replayjax.bench.verify --family "$fam" --shapes "$shape" \
          --tokens 4 --batches 256 --impls "$impl" \
          --tune '[{"ring_write": "xla"}, {"ring_write": "kernel"}]' \
          --json "$out/verify_ring_write_${fam}_$impl.json" 2>>"$out/verify.log" | grep "^|"
      done
    done ;;
  gdn-rows)
    # the Mosaic GDN kernels over 128-row V tiles (one CTA over two WGMMA tiles: half the CTAs,
    # each one's fixed work, prologue copies and barriers, ring walk, epilogue, over twice the
    # state bytes) against the 64-row ones: compiled tests, then Qwen3-Next shapes at batch 256
    # (standard and replay over tilings; verify at T = 4), then the batch sweep both ways
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_gdn.py -k mosaic 2>&1 | tail -3 || true
    limit 220 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_gdn_rows.json" \
      --tune '[{}, {"tile_rows": 128}, {"tile_rows": 128, "num_stages": 3},
               {"tile_rows": 128, "block_k": 16, "num_stages": 6},
               {"tile_rows": 128, "prologue": "serial"}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 90 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens 4 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/verify_gdn_rows.json" \
      --tune '[{}, {"tile_rows": 128}, {"tile_rows": 128, "num_stages": 2}]' \
      2>>"$out/verify.log" | grep "^|" || true
    for rows in 64 128; do
      limit 90 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
        --batches 1 32 256 512 --impls pallas_mosaic_gpu --std-config "{\"tile_rows\": $rows}" \
        --replay-config "{\"tile_rows\": $rows}" --json "$out/kernels_gdn_rows_$rows.json" \
        2>>"$out/kernels.log" | grep "^|" || true
    done ;;
  gdn-rows-tune)
    # the 128-row tiles' neighbours at batch 256 (gdn-rows: replay 186.7 -> 177.9 us in 3
    # stages, verify T = 4 465.4 -> 422.9 in 2): fewer stages and smaller key chunks (4 CTAs an
    # SM under 56 KiB), the fold's staging; verify at T = 4 and 8
    limit 200 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_gdn_rows_tune.json" \
      --tune '[{"tile_rows": 128, "num_stages": 3}, {"tile_rows": 128, "num_stages": 2},
               {"tile_rows": 128, "block_k": 16, "num_stages": 4},
               {"tile_rows": 128, "num_stages": 3, "fold_buffers": 2},
               {"tile_rows": 128, "num_stages": 3, "fold_stages": 1}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 90 gdn qwen3-next gdn_rows 4 '[{"tile_rows": 128, "num_stages": 2},
      {"tile_rows": 128, "num_stages": 3}, {"tile_rows": 128, "block_k": 16, "num_stages": 4}]'
    verify_tune 90 gdn qwen3-next gdn_rows 8 '[{}, {"tile_rows": 128},
      {"tile_rows": 128, "block_k": 32, "num_stages": 2}]' ;;
  gdn-mma)
    # readout "mma" against the FMA readout: compiled tests (equal sums, the long run, the
    # checks, the shared numerics with it), then the decode (SMEM by the lowering's estimate,
    # the models' fp32 q, k: fma 68 KiB; mma 84 at the default chunks, 60 at 16-key ones in 4
    # stages, 68 at 2 stages with a one-stage fold) and verify T = 4 at batch 256, fp32 state
    # and rings; gdn-mma-verify: T = 2 and 8
    REPLAYJAX_TEST_BACKEND=gpu limit 200 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_gdn.py tests/pallas_kernels/test_decode.py \
      tests/pallas_kernels/test_verify.py -k "mma or readout" 2>&1 | tail -3 || true
    limit 150 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_gdn_mma.json" \
      --tune '[{}, {"readout": "mma"}, {"readout": "mma", "block_k": 16, "num_stages": 4},
               {"readout": "mma", "num_stages": 2, "fold_stages": 1}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    gdn_mma_verify 4 ;;
  gdn-mma-verify)
    gdn_mma_verify 2; gdn_mma_verify 8 ;;
  gdn-rows-small)
    # where the Mosaic GDN replay's 4-stage small-batch default (up to MOSAIC_SMALL_BATCH_ROWS
    # = 64 rows) should end: the default (4 stages up to 64 rows, 3 after) against the other
    # stage count at 96 / 128 / 192 rows, then the Qwen3.5-9B step at batch 32
    for b in 96 128 192; do
      limit 60 python3 -m replayjax.bench.kernels --family gdn --shapes qwen3-next \
        --batches $b --impls pallas_mosaic_gpu --json "$out/kernels_gdn_rows_b$b.json" \
        --tune '[{}, {"num_stages": 4}]' 2>>"$out/kernels.log" | grep "^|" || true
    done
    [ -n "${ROWS_ONLY:-}" ] || \
      e2e 300 --synthetic qwen3.5-9b --batch 32 --prompt-len 128 --variants standard replay ;;
  m2-heads)
    # the Mosaic Mamba-2 kernels over two (four) heads of a group a CTA (`heads`: each CTA's
    # fixed work, the vectors' copies and barriers, the walk's loop, the group's B, C and walk
    # scalars, over twice the state bytes): compiled tests, then Nemotron-H-8B shapes at batch
    # 256, replay and standard over tilings (heads=2 doubles a pipeline step's bytes: the
    # chunks and stages that keep CTAs an SM)
    REPLAYJAX_TEST_BACKEND=gpu limit 150 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py -k "mosaic and heads" 2>&1 | tail -3 || true
    limit 260 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads.json" \
      --tune '[{}, {"heads": 2}, {"heads": 2, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 2, "block_n": 16, "num_stages": 3},
               {"heads": 2, "block_n": 16, "num_stages": 4, "fold_stages": 2, "fold_buffers": 1},
               {"heads": 4, "block_n": 16, "num_stages": 2, "fold_stages": 2, "fold_buffers": 1}]' \
      2>>"$out/kernels.log" | grep "^|" || true ;;
  m2-heads-verify)
    # heads=2 for the Mosaic Mamba-2 verify (T = 4, 8) and the standard decode (against the
    # Triton standard `auto` runs), batch 256
    verify_tune 120 mamba2 nemotron-h-8b m2_heads 4 '[{}, {"heads": 2, "block_n": 16},
      {"heads": 2, "block_n": 16, "num_stages": 3}, {"heads": 2}]'
    verify_tune 120 mamba2 nemotron-h-8b m2_heads 8 '[{}, {"heads": 2, "block_n": 16},
      {"heads": 2, "block_n": 16, "num_stages": 3}]'
    limit 150 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads_std.json" \
      --tune '[{"heads": 2, "block_n": 32}, {"heads": 2, "block_n": 32, "num_stages": 3},
               {"heads": 2, "block_n": 16, "num_stages": 4}]' \
      2>>"$out/kernels.log" | grep "^|" || true ;;
  m2-heads-tune)
    # m2-heads' neighbours (two heads a CTA with a one-stage single-buffered fold: 324.3 ->
    # 313.5 us; verify T = 4 / 8 with 16-column chunks in 3 stages 2.94x / 3.00x): replay at
    # batch 256 and its sweep (amortised too), P = 80's replay, verify at T = 4 and 8
    limit 160 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads_tune.json" \
      --tune '[{"heads": 2, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 2, "num_stages": 3, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 2, "block_n": 16, "num_stages": 4, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 4, "block_n": 16, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 2, "fold_stages": 1, "fold_buffers": 1, "prologue": "serial"}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 100 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads_p80.json" \
      --tune '[{}, {"heads": 2, "fold_stages": 1, "fold_buffers": 1},
               {"heads": 4, "block_n": 16, "fold_stages": 1, "fold_buffers": 1}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 120 mamba2 nemotron-h-8b m2_heads_tune 4 '[{"heads": 2, "block_n": 16,
      "num_stages": 4}, {"heads": 2, "block_n": 8, "num_stages": 4}, {"heads": 2, "block_n": 16,
      "num_stages": 3, "prologue": "overlap"}, {"heads": 4, "block_n": 16}]'
    verify_tune 120 mamba2 nemotron-h-8b m2_heads_tune 8 '[{"heads": 2, "block_n": 16,
      "num_stages": 4}, {"heads": 2, "block_n": 8, "num_stages": 4},
      {"heads": 4, "block_n": 8, "num_stages": 3}]'
    limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 32 128 256 512 --impls pallas_mosaic_gpu \
      --replay-config '{"heads": 2, "fold_stages": 1, "fold_buffers": 1}' \
      --json "$out/kernels_m2_heads_sweep.json" 2>>"$out/kernels.log" | grep "^|" || true ;;
  m2-heads-defaults)
    # the two-heads defaults (replay: one-stage single-buffered fold, "serial"; verify: 16-column
    # chunks, the fold in its own lean scope): compiled tests, the replay's prologue once more,
    # verify's lean fold against the kept one, then verify Triton vs Mosaic at T = 2 / 4 / 8
    REPLAYJAX_TEST_BACKEND=gpu limit 200 python3 -m pytest -q -p no:cacheprovider -W ignore \
      tests/pallas_kernels/test_mamba2.py tests/pallas_kernels/test_decode.py \
      tests/pallas_kernels/test_verify.py -k "mosaic and (mamba2 or Mamba2 or heads)" 2>&1 \
      | tail -4 || true
    limit 80 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads_prologue.json" \
      --tune '[{}, {"prologue": "overlap"}]' 2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 100 mamba2 nemotron-h-8b m2_heads_lean 4 '[{}, {"fold_stages": 3,
      "fold_buffers": 2}, {"num_stages": 4}, {"block_n": 32, "num_stages": 2}]'
    verify_tune 100 mamba2 nemotron-h-8b m2_heads_lean 8 '[{}, {"fold_stages": 4,
      "fold_buffers": 2}, {"num_stages": 6}]'
    limit 150 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 2 4 8 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_m2_heads_t248.json" 2>>"$out/verify.log" | grep "^|" || true ;;
  m2-heads-final)
    # the two-heads defaults beside the peers in one run: the peer harness, the Mamba-2 sweep
    # (both shapes, Triton and Mosaic, batch 1..512), verify + commit by window at batch 256
    limit 150 python3 .peer_bench/peer_bench.py --out "$out" --batches 1 32 256 512 \
      2>>"$out/peers.log" | tail -40 || true
    limit 200 python3 -m replayjax.bench.kernels --family mamba2 --batches 1 8 32 64 128 256 512 \
      --impls pallas pallas_mosaic_gpu --json "$out/kernels_sweep_mamba2.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 150 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 2 4 8 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_m2_final.json" 2>>"$out/verify.log" | grep "^|" || true ;;
  gdn-final)
    # the GDN verify's mma defaults beside the peers in one run: the peer harness, the GDN sweep
    # (Triton and Mosaic, batch 1..512), verify + commit by window at batch 256
    limit 150 python3 .peer_bench/peer_bench.py --out "$out" --batches 1 32 256 512 \
      2>>"$out/peers.log" | tail -40 || true
    limit 200 python3 -m replayjax.bench.kernels --family gdn --batches 1 8 32 64 128 256 512 \
      --impls pallas pallas_mosaic_gpu --json "$out/kernels_sweep_gdn.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 150 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next \
      --tokens 2 4 8 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_gdn_final.json" 2>>"$out/verify.log" | grep "^|" || true ;;
  h200-tune)
    # P = 80 (1.59x its Triton standard, target 1.6x): the Triton standard and the Mosaic replay's
    # untried neighbours in one run; the GDN verify's mma defaults (picked on an H100) against
    # their neighbours on this GPU at T = 4 and 8
    limit 60 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas --json "$out/kernels_p80_triton.json" \
      2>>"$out/kernels.log" | grep "^|" || true
    limit 120 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_p80_last_tune.json" \
      --tune '[{}, {"prologue": "overlap"}, {"heads": 1, "fold_stages": 1, "fold_buffers": 1},
               {"block_n": 64, "num_stages": 2}, {"fold_buffers": 2}]' \
      2>>"$out/kernels.log" | grep "^|" || true
    verify_tune 100 gdn qwen3-next gdn_h200 4 '[{}, {"readout": "fma"},
      {"block_k": 16, "num_stages": 4}, {"num_stages": 3}, {"prologue": "serial"}]'
    verify_tune 90 gdn qwen3-next gdn_h200 8 '[{}, {"block_k": 16, "num_stages": 4},
      {"num_stages": 3}]' ;;
  std-tune)
    # the Triton standard kernels (the baselines; target >= 95% of copy) at batch 256 over small
    # tiles on 1-2 warps: fla's GDN decode launches [8, K] tiles on one warp (3 stages) and
    # streams at 98-99% of copy in the peer harness; vLLM's Mamba-2 config is 4 rows on one
    # warp. The replay column follows the same fields: ignore it. The peers beside them.
    limit 70 python3 .peer_bench/peer_bench.py --out "$out" --batches 256 \
      2>>"$out/peers.log" | tail -24 || true
    limit 200 python3 -m replayjax.bench.kernels --family gdn --batches 256 --impls pallas \
      --tune '[{}, {"block_v": 8, "num_warps": 1, "num_stages": 3},
               {"block_v": 8, "num_warps": 1, "num_stages": 3, "grid_order": "row_fastest"},
               {"block_v": 4, "num_warps": 1, "num_stages": 3}, {"block_v": 16, "num_warps": 1},
               {"block_v": 16, "num_warps": 2}, {"block_v": 32, "num_warps": 2},
               {"block_v": 32, "num_warps": 4}]' \
      --json "$out/kernels_std_tune_gdn.json" 2>>"$out/kernels.log" | grep "^|" || true
    limit 200 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-h-8b \
      --batches 256 --impls pallas \
      --tune '[{}, {"block_p": 8, "block_n": 128, "num_warps": 1},
               {"block_p": 4, "block_n": 128, "num_warps": 1},
               {"block_p": 16, "block_n": 128, "num_warps": 2},
               {"block_p": 16, "block_n": 128, "num_warps": 4},
               {"block_p": 32, "block_n": 128, "num_warps": 4},
               {"block_p": 8, "block_n": 64, "num_warps": 1}]' \
      --json "$out/kernels_std_tune_mamba2.json" 2>>"$out/kernels.log" | grep "^|" || true
    # the state-per-draft verify baselines over the same small tiles (T = 4), against the
    # Mosaic ReplaySSM verify's default
    limit 150 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next --tokens 4 \
      --batches 256 --impls pallas_mosaic_gpu --tune-baseline '[{},
      {"block_v": 8, "num_warps": 1, "num_stages": 3}, {"block_v": 16, "num_warps": 1},
      {"block_v": 16, "num_warps": 2}]' --json "$out/verify_baseline_tune_gdn.json" \
      2>>"$out/verify.log" | grep "^|" || true
    limit 150 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 4 --batches 256 --impls pallas_mosaic_gpu --tune-baseline '[{},
      {"block_p": 8, "block_n": 128, "num_warps": 1}, {"block_p": 16, "block_n": 128,
      "num_warps": 2}]' --json "$out/verify_baseline_tune_mamba2.json" \
      2>>"$out/verify.log" | grep "^|" || true ;;
  prologue-t4)
    # the T = 4 GDN verify's prologue: "serial" won by 1.2-1.6% on three H100 runs, "overlap"
    # (the default) was taken on an H200 with the FMA readout
    verify_tune 100 gdn qwen3-next gdn_prologue 4 '[{}, {"prologue": "serial"}, {},
      {"prologue": "serial"}]' ;;
  m2-heads-e2e)
    # Nemotron-H-8B end to end with the two-heads Mosaic replay (batch 256, mixed prompts), then
    # P = 80's replay neighbours (1.58x its standard staggered at 256 in m2-heads-final)
    e2e 330 --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --variants standard replay
    limit 90 python3 -m replayjax.bench.kernels --family mamba2 --shapes nemotron-nano-9b-v2 \
      --batches 256 --impls pallas_mosaic_gpu --json "$out/kernels_m2_heads_p80_tune.json" \
      --tune '[{}, {"num_stages": 3}, {"fold_stages": 2}, {"block_n": 16, "num_stages": 4}]' \
      2>>"$out/kernels.log" | grep "^|" || true ;;
  mosaic-verify)
    limit 120 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 4 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_mosaic.json" 2>>"$out/mosaic.log" | grep "^|"
    limit 120 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next \
      --tokens 4 --batches 256 --impls pallas pallas_mosaic_gpu \
      --json "$out/verify_mosaic_gdn.json" 2>>"$out/mosaic.log" | grep "^|"
    limit 150 python3 -m replayjax.bench.verify --family mamba2 --shapes nemotron-h-8b \
      --tokens 4 --batches 256 --impls pallas_mosaic_gpu --json "$out/verify_mosaic_tune.json" \
      --tune '[{"block_n": 32}, {"block_n": 32, "prologue": "overlap"}, {"block_n": 128},
               {"num_stages": 3}]' \
      2>>"$out/mosaic.log" | grep "^|"
    limit 120 python3 -m replayjax.bench.verify --family gdn --shapes qwen3-next \
      --tokens 4 --batches 256 --impls pallas_mosaic_gpu \
      --json "$out/verify_mosaic_tune_gdn.json" --tune '[{}, {"prologue": "overlap"}]' \
      2>>"$out/mosaic.log" | grep "^|" ;;
  mosaic-diag)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    diag() {  # diag SECONDS JSON_NAME FLAGS...
      limit "$1" python3 scripts/mosaic_diag.py --timeout 120 --json "$out/$2" "${@:3}" \
        2>>"$out/mosaic.log" || true
    }
    if [ -n "${DIAG_FLAGS:-}" ]; then
      diag 560 mosaic_diag.json $DIAG_FLAGS
    else
      diag 260 mosaic_diag_real.json --shapes real --stages 2
      diag 120 mosaic_diag_real_stages3.json --shapes real --blocks 64 --stages 3
      diag 170 mosaic_diag_unit.json --shapes unit --blocks 16 32 64 --stages 2
    fi ;;
  serve)
    # one server at a time on the whole GPU (two side by side ran out of memory in prefill),
    # the same requests against each; then one table and plot
    for mode in replay standard; do
      python3 -m replayjax.cli serve --synthetic nemotron-h-8b --num-slots 256 --max-len 1024 \
        --max-queue 1024 --ssm-mode $mode --port 8001 --log-level warning ${SERVE_FLAGS:-} \
        2>>"$out/serve_$mode.log" & pid=$!
      timeout 200 bash -c "until python3 -c \"import httpx; httpx.get('http://127.0.0.1:8001/health').raise_for_status()\" 2>/dev/null; do sleep 3; done"
      bench="python3 -m replayjax.cli bench serve --url http://127.0.0.1:8001 --max-tokens 64
        --vocab 131072 --ignore-eos --json"
      # warm-up: every prefill length bucket compiles once (one prompt per bucket, then a
      # crowd), so the sweep times no compilation
      for p in 32 64 128 256 512; do
        timeout 60 $bench --concurrency 1 --num-requests 1 --workload sync --prompt-len $p \
          > /dev/null 2>>"$out/serve_bench.log" || true
      done
      timeout 60 $bench --concurrency 64 --num-requests 64 --prompt-len 128 > /dev/null \
        2>>"$out/serve_bench.log" || true
      timeout 150 $bench --concurrency 1 16 64 256 --num-requests 8 64 256 512 --prompt-len 128 \
        > "$out/serve_$mode.json" 2>>"$out/serve_bench.log" || true
      kill -TERM $pid 2>/dev/null || true; wait $pid || true   # (a server that died: go on)
    done
    python3 -c "import json, sys; from replayjax.bench import serve
rows = [dict(r, server=m) for m in ('replay', 'standard')
        for r in json.load(open(f'{sys.argv[1]}/serve_{m}.json'))]
rows.sort(key=lambda r: int(r['load'].split('=')[1]))
open(f'{sys.argv[1]}/serve.md', 'w').write(serve.markdown(rows))
serve.plot(rows, f'{sys.argv[1]}/serve.png')
print(serve.markdown(rows))" "$out" ;;
  prefix)
    for m in ${PREFIX_MODELS:-nemotron-h-8b qwen3.5-9b}; do
      e2e 420 --synthetic $m --batch 64 --prompt-len 1024 --workload agents \
        --prefix-cache-gb 16 --variants replay ${PREFIX_FLAGS:-}
    done ;;
  prefill)
    # tokens/s (the traced call of --profile, by kernel class, took the 8B past 360 s on an
    # H100 in the thirty-fourth session: PREFILL_FLAGS=--profile adds it, one model a call)
    for m in ${PREFILL_MODELS:-nemotron-h-8b qwen3.5-9b}; do
      limit 280 python3 -m replayjax.bench.prefill --synthetic $m --batch 32 --prompt-len 2048 \
        ${PREFILL_FLAGS:-} 2>>"$out/prefill.log" | tee -a "$out/prefill.md"
    done ;;
  profile-b1)
    # batch 1 of the MoE hybrid whose replay step was 3.6% slower than standard (issue 17: at
    # most 2%): both modes' kernels side by side
    for mode in standard replay; do
      limit 200 python3 -m replayjax.bench.profile --synthetic nemotron-3-nano-30b-a3b --batch 1 \
        --prompt-len 128 --steps 16 --mode $mode --top 25 2>>"$out/profile.log"
    done ;;
  profile-spec)
    # issue 17's speculative target (2x at batch 64, measured 1.43x): where a verify step's time
    # goes, ReplaySSM then the state-per-draft baseline (MTP K = 3, Nemotron-H-8B dims)
    for mode in replay standard; do
      limit 260 python3 -m replayjax.bench.profile --synthetic nemotron-h-8b --batch 64 \
        --prompt-len 128 --steps 16 --mode $mode --drafter mtp --num-draft 3 --top 30 \
        2>>"$out/profile.log"
    done ;;
  profile-qwen)
    # issue 17's Qwen3.5-9B row (1.09x against 1.35x): where a replay step's time goes outside
    # its 24 GDN kernels (never profiled)
    limit 330 python3 -m replayjax.bench.profile --synthetic qwen3.5-9b --batch 256 \
      --prompt-len 128 --steps 16 --mode replay --top 40 2>>"$out/profile.log" ;;
  profile|tp-profile)
    tp=$([ $stage = tp-profile ] && echo 2 || echo 1)
    limit 300 python3 -m replayjax.bench.profile --synthetic nemotron-h-8b --batch 256 \
      --prompt-len 128 --steps 16 --mode replay --top 30 --tp $tp --trace-dir "$out/trace$tp" \
      2>>"$out/profile.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
