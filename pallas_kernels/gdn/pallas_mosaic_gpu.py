"""Mosaic GPU kernels for Gated DeltaNet (`impl="pallas_mosaic_gpu"`): the standard step, the
ReplaySSM step with its fold and ReplaySSM verify (math: `pallas_kernels.gdn.reference`). The
state-per-draft baseline verify runs on the other backends.

Grid (batch, Hv, ceil(V / R)): one CTA (one warpgroup) per (row, value head, V tile of R =
`tile_rows` rows, 64 or 128; the last one ragged where R does not divide V, `tile_rows_of`).
The slot read from `slots` picks the pool rows the TMA copies (`ref.at[slot, hv, vs]`); the
state tile [R, K] is copied into shared memory in key chunks of block_k (tiled and swizzled)
and computed on in registers (WGMMA layout, see `_mosaic_utils`). The vectors q, k (and the
ring's keys in a fold) are copied whole (`state_spec` says why); the token's vectors share one
SMEM buffer per dtype with the other small ones (`VectorPack`). Updated chunks go back by TMA,
for live rows only (the null slot is never written).

Standard: S k is needed whole before any update, so every chunk of the tile is in flight at once
(R x K state elements of SMEM: 32 KiB at R = 64, K = 128, fp32): pass 1 reduces S k chunk by
chunk as they land, pass 2 updates each chunk in its SMEM buffer, copies it out and reduces
o = S q.

Replay: the per-key-head products k_j . k, k_j . q (ring x current) are computed before the
kernel, by XLA or one Pallas launch (a tiling's `key_products`; a [b, Hk, L, K] read of the
ring's keys: L Hk / (V Hv) = 1/16 of the checkpoint read at Qwen3-Next shapes; the Triton
kernel's ring_scalars="kernel" reads the same keys from every CTA, and its "xla" is faster at
batch 256; the verify's key_products="kernel" forms them in the kernel). k . q needs only the
token's k and q, already in SMEM: each CTA computes it
(`dot`), one XLA op fewer before the launch (batch-1 latency).
The kernel walks the committed ring entries backwards (a loop of `count` steps; entries past
the count are never read), carrying the suffix sum of g for e_j = exp(sum_{j<i<c} g_i); the
walk's scalars (ring g, k_j . k, k_j . q) are copied whole into SMEM with the first vectors
(`scalar_vectors`), so the loop waits on no GMEM round trip. One pipelined read-only pass over
the checkpoint gives S0 k and S0 q. The fold (one step in L) re-streams the checkpoint and adds
sum_j w_j d_j k_j^T + d k^T as rank-1 updates on the FMA units, in fp32: a tf32 wgmma would lose
the state's precision and a 3-pass tf32 split is not worth it for a pass that runs once every L
steps. Non-fold steps append (k, d, g) to the ring (k from the key head's first value head, g
from its first V tile).

Prologue (a tiling's `prologue`, replay decode and verify): a CTA streams only its 64 x K
checkpoint tile (32 KiB in fp32), so what it does before the first state chunk is requested
shows in the kernel's time. "serial" (the verify's) lands the token's vectors, the ring's d rows
and the walk's scalars, walks the ring, and only then starts the checkpoint pipeline: a TMA
round trip plus up to L - 1 walk steps before a state byte is asked for. "overlap" (the replay
decode's, measured faster) issues the same copies without waiting and starts the pipeline at
once (its first state chunks go out behind them); the readout waits for k and q on its first
step only, and the rest (v, the ring, the walk) follows the readout: the walk's terms enter only
after it (S k = e^{sum g} S0 k + the ring's part). Both compute the same sums in the same order:
the outputs are equal. "fused" starts the stream as "overlap" does, and then walks the ring
oldest entry first, updating S0 x in place by Horner's rule (`_horner`: y <- exp(g_j) y +
(k_j . x) d_j): the walk's own row vectors (2 per x: 2T in a verify window) are never live
beside S0 x, nor during the stream (the serial prologue's are); the verify's in-kernel products
follow the stream, their SMEM in a scope of its own. By ptxas (scripts/mosaic_ptxas.py, 128-row
tiles, fp32): the verify at T = 4 141 -> 106 registers, at T = 8 (in-kernel products) 222 ->
166 and 80 -> 72 KiB, under the 168 registers and 75 KiB that 3 CTAs an SM allow. Other
rounding than the two others (exp(g_j) per step, not of the suffix sums), within the same
tolerances.

Verify (T window tokens): one pass over the checkpoint tile gives S0 k_t and S0 q_t for all T
tokens (k_t, q_t as [T, block_k] tiles per step), one ring walk their history terms; the
window's d come by forward substitution over the precomputed window products k_r . k_t and
k_r . q_t. Rows with c + T >= L fold ring[0:c] + window[0] as decode folds. Each CTA writes
its own window d rows into the ring (the default tiling's ring_write="kernel"), leaving XLA k
and g (another CTA's fold may still read the key head's ring keys the window overwrites); with
ring_write="xla" the kernel returns the window's d and XLA writes the ring after it
(`write_window`), as the Triton verify does.

Takes any V (Qwen3-Next: V = 128; a ragged last tile as Mamba-2's P = 80), K <= 256 (q and k
are one TMA box each) and K % block_k == 0 with block_k >= 8 and chunk rows of >= 32 bytes
(`state_block`). The public
entries take validated arguments (see `pallas_kernels.gdn.api`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels._kernel_utils import like
from pallas_kernels._mosaic_utils import (
    COL,
    F32,
    ROW,
    TILE_ROWS,
    VectorPack,
    acc_column,
    auto_takes,
    check_rows_readout,
    chunk,
    chunk_products,
    cols,
    dot,
    fma_columns,
    fma_rows,
    issue_all,
    load_all,
    measured_tiling,
    mma_operand_smem,
    mma_operands,
    mma_step,
    mosaic_call,
    relayout_rows,
    resolve_tiles,
    ring_copies_count,
    ring_row_copies,
    rows,
    rows_box,
    rows_layout,
    scalar_vectors,
    staging_smem,
    state_layout,
    state_spec,
    store_async,
    store_rows,
    tile_rows_of,
    wait_all,
    wait_on_first_step,
    write_chunk,
    write_out,
    zeros_columns,
    zeros_row,
    zeros_rows,
)
from pallas_kernels.gdn.buffers import ring_key_products, verify_key_products, write_window
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, verify_folds, window_positions
from pallas_kernels.validation import check

GRID_NAMES = ("row", "head", "vtile")


@dataclasses.dataclass(frozen=True)
class GDNMosaicTiling:
    """Launch configuration of the Mosaic GPU kernels: block_k bounds the key chunk the state
    tile is copied in (the largest power of two dividing K up to it: at least 8, and 16 for a
    bf16 state), num_stages the replay pipelines' chunks in flight (the standard kernel has all
    of its tile in flight). prologue (replay decode and
    verify; the standard kernel has no walk): "serial" lands the CTA's vectors and walks the
    ring before the checkpoint stream starts, "overlap" starts the stream at once and walks
    after it (module docstring; the same sums), "fused" as "overlap" with the walk updating
    S0 x in place (fewer registers, other rounding). ring_write (verify): who writes the window's d
    into the ring (`validation.RING_WRITES`): "xla" after the kernel, or "kernel" (each CTA its
    own [T, tile_rows] rows; k and g stay XLA's). fold_stages, fold_buffers (replay decode and
    verify): the
    fold's chunks in flight (0: num_stages) and its write-back's staging buffers (2 or 1). The
    fold's SMEM (the ring's keys, the staging, its pipeline) is allocated in the fold's own
    scope, over the read-only pass's: the kernel's peak SMEM is the larger of the two passes',
    so a leaner fold lets the read-only pass keep more chunks in flight at the same CTAs an
    SM. tile_rows: the V rows of a CTA, 64 (one WGMMA tile) or 128 (two in the warpgroup's
    registers: half the CTAs, each paying its fixed work, the prologue's copies and barriers,
    the walk and the epilogue, over twice the state bytes), a bound as block_k is: 128 runs
    64-row tiles where V is not a multiple of 128. readout (replay decode and verify;
    `_mosaic_utils.READOUTS`): how the checkpoint pass forms S0 k and S0 q, "fma" on the FMA
    units, "fma_deferred" likewise with the column sums after the stream (`fma_columns`),
    "fma_rows" likewise with a thread a row of each chunk (`rows_layout`), or "mma" (a float32
    state) by tf32 wgmmas of the chunk's high and low parts against all of the window's keys
    and queries at once (`_readout`). The standard kernel, which updates each chunk between
    its two reads, takes "fma_rows" (a thread a row for both reads and the update) and reads
    by FMAs in the WGMMA layout for the others. key_products (replay decode and
    verify; `validation.PRODUCTS`): what forms the key products, "xla"
    (`buffers.ring_key_products`, `verify_key_products`) or "pallas" (one launch) before the
    launch, or for verify with readout "mma" and an fp32 ring "kernel": its CTAs by tf32
    wgmmas (`_mosaic_utils.chunk_products`; a default falls back to "pallas" where it cannot).
    ring_block (replay decode and verify): the ring's d rows a walk reads copied in blocks of
    ring_block rows, each only where the count reaches it (`_mosaic_utils.ring_row_copies`),
    or 0: all L rows in one copy."""
    block_k: int
    num_stages: int = 2
    prologue: str = "serial"
    ring_write: str = "xla"
    fold_stages: int = 0
    fold_buffers: int = 2
    tile_rows: int = TILE_ROWS
    readout: str = "fma"
    key_products: str = "xla"
    ring_block: int = 0


# The key chunk of the Triton replay kernel's best tiling; only the default was timed on the
# H200 (docs/benchmarks.md, sixth GPU session). Seventh session: the replay's "overlap" prologue
# 252 -> 230 us (Qwen3-Next shapes, batch 256, staggered). Tenth: Nsight Compute found the
# replay at 12.5% occupancy, two CTAs an SM by their 81 KB of shared memory; chunks of 32 keys
# in 3 stages take 200.6 us (block_k 64: 224.8-247.8; 32 in 2 stages 204.1, in 4 209.2; 16 in
# 4-6 208.0-221.7; "serial" 206.1), ahead of the Triton replay's 207.9.
MOSAIC_STANDARD_TILING = GDNMosaicTiling(block_k=64)
# Eighteenth: the fold's SMEM in its own scope, 2 chunks in flight and one staging buffer, so
# 4 read-only chunks (the whole 64 x 128 tile) fit 4 CTAs an SM: 197.3 -> 185.0 us (bf16
# rings, staggered; 4 stages with the full fold needed 56 KB: 3 CTAs an SM). Twentieth:
# 128-row tiles (half the CTAs, each one's prologue, walk and epilogue over twice the bytes)
# in 3 stages, 67 KB: 3 CTAs an SM, 186.7 -> 177.9 / 179.8 us (2 stages 178.1; 4 stages
# 184.2; the standard kernel gained nothing from them, 273.3 vs 274.4, nor batch 1).
# Stop 57 (an H100, batch 256, staggered, one machine): the ring's d rows by blocks of 4, only
# those the count reaches (~4 of the 8 KiB a CTA copied whole at a uniform count) 249.7 /
# 249.2 -> 237.4 / 238.1 us (blocks of 2 / 8: 236.5 / 240.9; batch 32 37.1 -> 36.8). The ring
# key products by the launch (`ring_products`), which now reads the committed keys only
# (about half of the 34 MB of fp32 ring keys a step XLA's gather reads): it was already even
# with XLA's reading them all (twenty-fifth session, an H100: 241.3 vs 242.6 us at 256, 36.6
# vs 36.4 at 32); with the counts (stop 58, an H100): 232.2 -> 226.9 us at 256.
MOSAIC_REPLAY_TILING = GDNMosaicTiling(block_k=32, num_stages=3, prologue="overlap",
                                       fold_stages=2, fold_buffers=1, tile_rows=128,
                                       ring_block=4, key_products="pallas")
# Verify by window (eleventh session, batch 256; Nsight Compute at T = 4: 251 registers a
# thread and 83 KB of SMEM, 2 CTAs an SM): chunks of 32 keys, 4 in flight, the overlap
# prologue took T = 4 531.7 -> 459.5 us, and T = 8 886.8 -> 946.0. Twentieth, 128-row tiles:
# T = 4 in chunks of 16 keys, 4 in flight, 465.4 -> 403.6 us (1.55x -> 1.77x the baseline;
# chunks of 32 in 2-3 stages 417-423); T = 8 in chunks of 32, 2 in flight, 877.4 -> 687.7
# (1.45x -> 1.85x; the 64-key chunks at 128 rows 1026.7). Stop 44 (an H100, batch 256, same
# run): readout "mma" (all 2T products by tf32 wgmmas) in chunks of 32, 2 in flight, with a
# one-stage single-buffered fold: T = 2 304.8 -> 303.9 us, T = 4 432.2 -> 411.0 (2.20x ->
# 2.31x), T = 8 719.4 -> 654.2 (2.43x -> 2.67x); 16-key mma chunks in 3-4 stages 424-438 /
# 670-704; the FMA readout with a lean fold 436.9 / 720.7. (The decode's 2 products stay
# FMAs: mma 259.8-284.7 us against 249.3.) Stop 46 (H200, batch 256, twice each): the "serial"
# prologue at T = 4 358.4 / 358.6 us against "overlap" 365.5 / 367.4 (three H100 runs: 1.2-1.6%),
# so every window takes it. Stop 54 (H200, batch 256, as the twenty-eighth session's T = 2 / 4
# rows): each CTA writes its window's d rows (ring_write "kernel"), T = 2 / 4 / 8 246.6 / 317.4
# / 550.9 -> 242.4 / 309.1 / 545.0 us.
MOSAIC_VERIFY_TILING = GDNMosaicTiling(block_k=32, num_stages=2, tile_rows=128, readout="mma",
                                       fold_stages=1, fold_buffers=1, ring_write="kernel")
# Stop 48 (an H100, batch 256): the key products by one Pallas launch (`ring_products`) instead
# of XLA's fusions took T = 2 from 299.2 to 290.3 us and T = 4 from 400.1 to 357.9 (2.38x ->
# 2.66x the baseline); at T = 8 XLA's batched GEMM is as fast (652.0 vs 655.6): up to 4 tokens.
# Stop 51 (an H100, batch 256, same call): the products in the kernel (`chunk_products`) from 5
# tokens, T = 5 / 6 / 7 / 8 461.2 / 504.8 / 543.4 / 569.0 us against XLA's 508.7 / 550.4 /
# 601.9 / 654.5 (2.27x -> 2.50x ... 2.64x -> 3.04x; the launch at T = 5 475.1); at T = 2 / 4 they
# lose to the launch (336.3 / 408.4 against 297.3 / 362.9; wider chunks, 3 stages or 64-row
# tiles no better).
# Stop 55 (an H100, batch 256, one machine): from 5 tokens the "fused" prologue (3 CTAs an SM
# where the serial one held 2 by registers): T = 5 / 6 / 7 / 8 453.0 / 492.1 / 526.5 / 563.0 ->
# 400.7 / 433.1 / 465.3 / 502.9 us (2.54x -> 2.87x ... 3.07x -> 3.43x; at T = 8 with the
# launch's products 532.9); up to 4 tokens, already at 3 CTAs, no gain (T = 2 280.6 / 281.0, T
# = 4 342.1 / 344.7; 16-key chunks at 4 CTAs 367.9). Stop 57 (an H100, batch 256): the ring's
# d rows by blocks of 4 (`ring_block`) up to 4 tokens, T = 2 285.9 -> 280.0 us (1.98x ->
# 2.02x), T = 4 344.8 -> 341.5 (2.78x -> 2.81x); at T = 8 they cost the fused prologue 15
# registers (166 -> 181 by ptxas, 2 CTAs an SM where 3 were): 510.9 -> 580.7.
MOSAIC_VERIFY_TILINGS = ((4, dataclasses.replace(MOSAIC_VERIFY_TILING, key_products="pallas",
                                                 ring_block=4)),
                         (MAX_VERIFY_TOKENS, dataclasses.replace(
                             MOSAIC_VERIFY_TILING, key_products="kernel", prologue="fused")))
# Twentieth, up to 64 rows the replay keeps 4 chunks in flight: 18.8 / 30.3 / 52.6 us at 16 /
# 32 / 64 rows (staggered) against 3 stages' 20.6 / 33.4 / 54.8 (2 stages 19.3 / 31.1 / 52.9;
# 64-row tiles in 4 stages 18.2 / 30.2 / 53.1); 128 rows were not timed. Stop 58 (an H100,
# staggered us, the default / one ring copy with XLA's key products / XLA's products only):
# the ring blocks and the products launch pay from 128 rows (122.5 / 129.2 / 124.2; 256:
# 226.9 / 236.6 (one copy, the launch) / 232.2), not below: 64 rows 65.6 / 65.9 / 65.5, 32
# 38.0 / 36.7 / -, 8 14.9 / 13.3 / 13.9, 1 7.0 / 5.7 / - (below 16 rows `auto` runs Triton).
MOSAIC_SMALL_BATCH_ROWS = 64
MOSAIC_SMALL_BATCH_TILINGS = {
    MOSAIC_REPLAY_TILING: dataclasses.replace(MOSAIC_REPLAY_TILING, num_stages=4, ring_block=0,
                                              key_products="xla")}
_DEFAULT_TILING = {"standard_decode": MOSAIC_STANDARD_TILING,
                   "replay_decode": MOSAIC_REPLAY_TILING, "replay_verify": MOSAIC_VERIFY_TILINGS}
# impl="auto" on sm90 runs the Mosaic kernels that beat the Triton ones on the H200 (Qwen3-Next
# shapes, fp32 state, batch 256): standard 274 vs 287 us, verify T = 4 528 vs 548 (tenth
# session, the Triton verify row-slowest); the replay decode since its lean fold (nineteenth:
# fp32 rings, amortised / staggered 185.8 / 186.4 vs 199.9 / 208.8 at 256, 29.3 / 30.1 vs 30.3 /
# 33.0 at 32), and the Qwen3.5-9B step at batch 256 with it 13.73 ms against 13.99 with Triton
# (the tenth-session tiling had lost: 15.22 vs 14.70 ms, ninth).
AUTO_OPS = frozenset({"standard_decode", "replay_decode", "replay_verify"})
# Below these batches "auto" keeps the Triton kernels: standard (thirteenth session: 2.9 / 4.1 /
# 5.8 / 10.7 us at 1 / 2 / 4 / 8 rows against this kernel's 3.8 / 4.6 / 6.9 / 11.3; at 256, 272
# vs 284); replay (batch 1 3.4 vs 5.9 us, nineteenth; 8 10.2 vs 12.3, tenth), as Mamba-2's.
AUTO_MIN_BATCH = {"standard_decode": 9, "replay_decode": 16}
_MAX_K = 256                      # one TMA box per q / k vector


_TILE_ROWS = (TILE_ROWS, 2 * TILE_ROWS)


def _tiles(tiling, default, K, V, state_dtype, verify=False, fold=False, readout=True):
    tiles = resolve_tiles(tiling, default, field="block_k", chunk=("key dim K", K),
                          max_chunk=_MAX_K, state_dtype=state_dtype, verify=verify, fold=fold,
                          readout=readout, products="key_products" if fold else None,
                          kernel_products=verify)
    rows = (tiling or default).tile_rows
    check(rows in _TILE_ROWS, f"tile_rows = {rows} must be one of {_TILE_ROWS}")
    # a bound, as block_k: two WGMMA tiles a CTA only where they tile V exactly
    rows = rows if V % rows == 0 else TILE_ROWS
    check_rows_readout(tiles.get("readout"), rows, state_dtype)
    return {**tiles, "tile_rows": rows}


def for_shape(tiling, rows):
    """The measured tiling a kernel whose default is `tiling` runs at `rows` rows a step: its
    small-batch variant (`MOSAIC_SMALL_BATCH_TILINGS`) up to MOSAIC_SMALL_BATCH_ROWS rows."""
    return MOSAIC_SMALL_BATCH_TILINGS.get(tiling, tiling) if rows <= MOSAIC_SMALL_BATCH_ROWS \
        else tiling


def takes(op, args) -> bool:
    """Whether impl="auto" runs op's Mosaic kernel on sm90 for the op's (validated) `args`: a
    measured winner (`AUTO_OPS`) at the batch it won (`AUTO_MIN_BATCH`) whose default tiling
    takes their shapes (K <= 256), at whole V tiles (V a multiple of 64)."""
    state = args[0] if op == "standard_decode" else args[0].checkpoint
    k, v = args[2:4] if op == "standard_decode" else args[3:5]
    if v.shape[0] < AUTO_MIN_BATCH.get(op, 1):
        return False
    T = v.shape[1] if op == "replay_verify" else 1
    return auto_takes(op, AUTO_OPS, v.shape[-1], lambda: _tiles(
        None, measured_tiling(_DEFAULT_TILING, op, T), k.shape[-1], v.shape[-1], state.dtype,
        readout=op != "standard_decode"))


def standard_decode(state, q, k, v, g, beta, slots, *, tiling, interpret):
    tiles = _tiles(tiling, MOSAIC_STANDARD_TILING, k.shape[2], v.shape[2], state.dtype)
    return _standard_decode(state, q, k, v, g, beta, slots, interpret=interpret,
                            block_k=tiles["block_k"], tile_rows=tiles["tile_rows"],
                            readout="fma_rows" if tiles["readout"] == "fma_rows" else "fma")


def replay_decode(buffers, counts, q, k, v, g, beta, slots, *, tiling, interpret):
    return _replay_decode(buffers, counts, q, k, v, g, beta, slots, interpret=interpret,
                          **_tiles(tiling, for_shape(MOSAIC_REPLAY_TILING, v.shape[0]),
                                   k.shape[2], v.shape[2], buffers.checkpoint.dtype, fold=True))


def replay_verify(buffers, counts, q, k, v, g, beta, slots, *, tiling, interpret):
    default = measured_tiling(_DEFAULT_TILING, "replay_verify", v.shape[1])
    tiles = _tiles(tiling, default, k.shape[3], v.shape[3], buffers.checkpoint.dtype,
                   verify=True, fold=True)
    if tiles["products"] == "kernel":
        tiles["products"] = _kernel_products(buffers, v.shape[1], tiles["block_k"],
                                             tiles["readout"], tiles["ring_block"],
                                             tiling is None)
    o, d, ck, rd = _replay_verify(buffers, counts, q, k, v, g, beta, slots, interpret=interpret,
                                  **tiles)
    in_kernel = tiles["ring_write"] == "kernel"
    return o, write_window(buffers._replace(checkpoint=ck, ring_d=rd), counts, slots, k,
                           None if in_kernel else d, g)


def _kernel_products(buffers, T, block_k, readout, ring_block, default):
    """key_products "kernel" where the verify kernel can form them (`chunk_products`: the
    "mma" readout's operands, an fp32 ring, its keys copied in 8-row blocks: L % 8 == 0, a
    barrier for each of its copies); else a default (whose readout is "fma" on a non-fp32
    state) takes the launch, an explicit tiling raises."""
    L, nk = buffers.window, buffers.ring_k.shape[3] // block_k
    copies = _verify_copies(T, nk, 2, True, ring_copies_count(L, ring_block))
    needs = ((readout == "mma", f"needs readout = 'mma' (its wgmmas read the window's "
              f"operands), got {readout!r}"),
             (buffers.ring_k.dtype == F32, f"needs a float32 ring, got "
              f"{jnp.dtype(buffers.ring_k.dtype).name}"),
             (L % 8 == 0, f"needs a ring window L divisible by 8, got {L}"),
             (copies <= _MAX_BARRIERS, f"copies the keys in K // block_k = {nk} chunks: "
              f"{copies} copies at T = {T}, more than a barrier group's {_MAX_BARRIERS}"))
    if default and not all(ok for ok, _ in needs):
        return "pallas"
    for ok, what in needs:
        check(ok, f"key_products = 'kernel' {what}")
    return "kernel"


# A barrier group holds at most 32 barriers: the in-kernel products' 2 copies a key chunk fit
# 8 chunks at T = 8.
_MAX_BARRIERS = 32


def _verify_copies(T, nk, operand_copies, in_kernel, ring_copies):
    """The verify kernel's copies before its stream (one barrier each): with readout "mma"
    (in_kernel products need it) its operands, T v rows, the ring's d (`ring_copies` of
    them), k_0 and the ring's g, and 2 a key chunk (nk of them) for the products in the
    kernel; else at most 3 T + 5 + ring_copies (the k and q rows or k_0, the v rows, the
    ring's d, five scalar vectors) and the operands'."""
    return operand_copies + ring_copies + (T + 2 + 2 * nk if in_kernel else 3 * T + 5)


def _product_block_rows(L, Tp):
    """The rows of a key chunk in the in-kernel products' rows (`chunk_products`): the ring's
    L and the window's Tp, rounded up to 16 (times the operands' N, a multiple of 8: whole
    warpgroup loads when the chunks' parts are summed)."""
    return pl.cdiv(L + Tp, 16) * 16


def _product_rows(M, block_k):
    """The SMEM of the in-kernel products' rows (or their low parts): [M, block_k] fp32 in the
    layout a wgmma reads."""
    return plgpu.SMEM((M, block_k), F32, transforms=state_layout(block_k, F32))


def _window_key_rows(k, block_k):
    """The window's keys k [b, T, Hk, K] as fp32 rows by key chunk, [b, Hk, K // block_k, Tp,
    block_k] (Tp = T rounded up to 8, the extra rows zero): each chunk one TMA box into the
    verify's product rows (`chunk_products`)."""
    b, T, Hk, K = k.shape
    Tp = pl.cdiv(T, 8) * 8
    rows_ = jnp.pad(jnp.moveaxis(k.astype(F32), 1, 2), ((0, 0), (0, 0), (0, Tp - T), (0, 0)))
    return rows_.reshape(b, Hk, Tp, K // block_k, block_k).swapaxes(2, 3)


class _Operands(NamedTuple):
    """A replay kernel's "mma" readout refs (`_operands`): the inputs xh_ref, xl_ref and the
    scratch xh_smem, xl_smem (None where unused)."""
    inputs: dict
    scratch: dict

    @property
    def copies(self) -> int:
        """The TMA copies (barriers) they add."""
        return sum(x is not None for x in self.inputs.values())


def _operands(readout, x, block_k):
    """The refs of readout "mma" for the vectors x [b, n, Hk, K] (`mma_operands`): their
    fp32 hi (and lo) rows and the SMEM they land in; for "fma" all None."""
    if readout != "mma":
        return _Operands(dict(xh_ref=None, xl_ref=None), dict(xh_smem=None, xl_smem=None))
    hi, *lo = mma_operands(x, block_k)
    lo = lo[0] if lo else None
    smem = mma_operand_smem(x.shape[-1], hi.shape[3], block_k)
    return _Operands(dict(xh_ref=hi, xl_ref=lo),
                     dict(xh_smem=smem, xl_smem=None if lo is None else smem))


def _position(heads_per_key_head, tile_rows):
    """(row b, value head hv, key head hk, V tile index, V tile slice) of this CTA."""
    b, hv, t = (lax.axis_index(n) for n in GRID_NAMES)
    return b, hv, hv // heads_per_key_head, t, rows_box(t, tile_rows)


def _walk(body, init, *, count, ring_g):
    """Folds body(j, e_j, carry) over the committed ring entries j = count-1 .. 0 (newest first;
    entries past the count are never read) with e_j = exp(sum_{j<i<count} g_i); ring_g(j) reads
    entry j's g. Returns (sum of the committed g, carry)."""
    def step(i, carry):
        suffix, acc = carry
        j = count - 1 - i
        return suffix + ring_g(j), body(j, jnp.exp(suffix), acc)
    return lax.fori_loop(0, count, step, (jnp.float32(0), init))


def _horner(s0, *, count, ring_g, ring_d, ring_x):
    """S_w x_i = e^{sum g} S0 x_i + sum_j e_j (k_j . x_i) d_j for each of the ROW vectors
    s0[i] = S0 x_i, by Horner's rule over the committed ring entries j = 0 .. count-1 (oldest
    first): y <- exp(g_j) y + (k_j . x_i) d_j, in place of the S0 x (no second set of vectors
    live). ring_x(i, j): k_j . x_i. Returns (sum of the committed g, the S_w x_i)."""
    def step(j, carry):
        total, ys = carry
        gj, dj = ring_g(j), ring_d(j)
        a = jnp.exp(gj)
        return total + gj, tuple(a * y + ring_x(i, j) * dj for i, y in enumerate(ys))
    return lax.fori_loop(0, count, step, (jnp.float32(0), tuple(s0)))


def _readout(tile, vectors, *, block_k, num_stages, wait_first=(), operands=None,
             readout="fma"):
    """S0 x [R] (ROW vectors, fp32) for each of the vectors x, from one pipelined read-only pass
    over the checkpoint tile [R, K] in GMEM (num_stages chunks of block_k keys in flight); the
    pass waits for the copies of `wait_first` (`issue_all`'s) on its first step. The FMA readouts
    (operands None): `vectors` are the SMEM vectors x [K], each chunk times each x summed along
    its columns: "fma" a chunk at a time, "fma_deferred" over each thread's 8-column slices
    only, the row sums once after the stream (`fma_columns`), "fma_rows" in a thread a row
    (`rows_layout`), the sums moved to ROW vectors once after the stream. "mma": `vectors` is
    their number m and `operands` the x as the rows of `mma_operands` in SMEM
    (`_mosaic_utils.mma_step`): one [R, N] accumulator for all of them, its first m columns
    the results, and the chunk's low part's SMEM, both in the pass's own scope."""
    R, K = tile.shape
    pipeline = functools.partial(plgpu.emit_pipeline, grid=(K // block_k,),
                                 in_specs=[state_spec(tile.dtype, block_k, R)],
                                 max_concurrent_steps=num_stages)

    def first(n):
        if wait_first:
            wait_on_first_step(n, wait_first)

    if operands is None:
        if readout == "fma_rows" and any(x.dtype != F32 for x in vectors):
            # A thread a row reads all of a chunk's columns of each x (4x the WGMMA layout's):
            # the CTA converts them to fp32 copies once, on the first step, after they land.
            return pl.run_scoped(lambda xs: _fma_readout(pipeline, tile, first, vectors, xs,
                                                         block_k, readout),
                                 plgpu.SMEM((len(vectors), K), F32))
        return _fma_readout(pipeline, tile, first, vectors, None, block_k, readout)

    def run(acc_ref, lo_smem):
        def mma_step_(idx, s_smem):
            (n,) = idx
            first(n)
            mma_step(acc_ref, s_smem, lo_smem, operands, n)
        pipeline(mma_step_)(tile)
        acc = acc_ref[...]
        return tuple(acc_column(acc, j) for j in range(vectors))
    # (a scope holds either registers or memory: the accumulator's inside the SMEM one)
    return pl.run_scoped(
        lambda lo_smem: pl.run_scoped(lambda acc_ref: run(acc_ref, lo_smem),
                                      plgpu.ACC((R, operands[0].shape[1]), F32)),
        plgpu.SMEM((R, block_k), F32, transforms=state_layout(block_k, F32)))


def _fma_readout(pipeline, tile, first, vectors, xs, block_k, readout):
    """`_readout`'s FMA readouts of `tile` over `pipeline` (first(n): its first step's
    waits); xs: an SMEM scratch [len(vectors), K] fp32 the x are converted into on the first
    step, or None to read them as they are."""
    R = tile.shape[0]
    layout = rows_layout(R) if readout == "fma_rows" else None

    def fma_step(idx, s_smem, acc):
        (n,) = idx
        first(n)
        xv = vectors
        if xs is not None:
            xv = tuple(xs.at[i] for i in range(len(vectors)))

            @pl.when(n == 0)
            def _():
                for x, dst in zip(vectors, xv):
                    dst[...] = x[...].astype(F32)
        s = (s_smem[...] if layout is None else plgpu.load(s_smem, layout=layout)).astype(F32)
        # The pipeline's next TMA into this stage's buffers must follow these reads (an
        # input-only pipeline has no fence of its own; the interpreter flags the race); the
        # warpgroup's barrier also orders the first step's conversions before the reads below.
        plgpu.commit_smem()
        if readout == "fma_deferred":          # the row sums after the stream
            return tuple(fma_columns(a, s, x, n, block_k) for a, x in zip(acc, xv))
        if readout == "fma_rows":
            return tuple(fma_rows(a, s, x, n, block_k) for a, x in zip(acc, xv))
        return tuple(a + jnp.sum(s * cols(chunk(x, n, block_k), s.shape), axis=1)
                     for a, x in zip(acc, xv))
    init = {"fma_deferred": lambda: zeros_columns(R), "fma_rows": lambda: zeros_rows(R),
            }.get(readout, lambda: zeros_row(tile_rows=R))()
    acc = pipeline(fma_step, init_carry=(init,) * len(vectors))(tile)
    if readout == "fma":
        return acc
    sums = tuple(jnp.sum(a, axis=1) for a in acc)
    return relayout_rows(sums) if readout == "fma_rows" else sums


def _readout_copies(vector_copies, operand_refs, at):
    """The copies a replay kernel's readout waits for, its "mma" operands and the other copies:
    with readout "fma" (operand refs None) the (src, dst) `vector_copies` of the x, else the
    copies of the operand_refs ((GMEM, SMEM) each, `mma_operands` of the kernel's row and key
    head `at`; the vectors then follow the readout, for the fold and the epilogue)."""
    operands = [(ref.at[at], smem) for ref, smem in operand_refs if ref is not None]
    if not operands:
        return vector_copies, None, ()
    return operands, [smem for _, smem in operands], vector_copies


def _fold(tile, ring_keys, fold_bar, kc_smem, d, alpha, big_e, walk, ring_d, live, *, block_k,
          num_stages, buffers):
    """The fold of the ring and one more token (k, d, g = log alpha) into the state tile [R, K]
    in GMEM: S0 <- big_e alpha S0 + d k^T + sum_j alpha e_j d_j k_j^T (big_e = exp of the ring's
    g sum), chunk by chunk, as fp32 rank-1 updates. ring_keys: the key head's ring keys [L, K]
    (GMEM, copied in on fold_bar); kc_smem: the token's key [K] (SMEM); d [R] ROW; walk: `_walk`
    bound to the ring; num_stages chunks in flight, `buffers` write-back staging buffers. Its
    SMEM (the ring keys, the staging, its pipeline) lives in its own scope, over the read-only
    pass's (done and fenced): the kernel's peak SMEM is the larger of the two passes'."""
    R, K = tile.shape

    def folded(rk_smem, out_smem):
        load_all(fold_bar, (ring_keys, rk_smem))

        def fold_chunk(idx, s_smem):
            (n,) = idx
            s = s_smem[...].astype(F32)
            upd = (big_e * alpha) * s + rows(d, s.shape) * cols(chunk(kc_smem, n, block_k),
                                                                 s.shape)

            def entry(j, ej, acc):
                kj = chunk(rk_smem.at[j], n, block_k)
                return acc + rows((alpha * ej) * ring_d(j), s.shape) * cols(kj, s.shape)
            write_chunk(walk(entry, upd)[1], n, out_smem, tile, block_k, live)

        plgpu.emit_pipeline(
            fold_chunk, grid=(K // block_k,), in_specs=[state_spec(tile.dtype, block_k, R)],
            max_concurrent_steps=num_stages,
        )(tile)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)    # the staging leaves with the scope

    pl.run_scoped(folded, plgpu.SMEM(ring_keys.shape, ring_keys.dtype),
                  staging_smem(block_k, tile.dtype, buffers, R))


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every live row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, state_ref, o_ref, q_smem,
                     k_smem, v_smem, s_smem, x32_smem, bars, *, heads_per_key_head, block_k,
                     readout):
    R = v_smem.shape[0]                                               # the CTA's V rows
    b, hv, hk, vt, vs = _position(heads_per_key_head, R)
    n_chunks = s_smem.shape[0]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    tile = state_ref.at[slot, hv, vs]                                 # [R, K] in GMEM
    # Every chunk of the tile in flight at once (barrier n), then the token's vectors.
    for n in range(n_chunks):
        plgpu.copy_gmem_to_smem(tile.at[:, pl.ds(n * block_k, block_k)], s_smem.at[n],
                                bars.at[n])
    for i, (src, dst) in enumerate(((q_ref.at[b, hk], q_smem), (k_ref.at[b, hk], k_smem),
                                    (v_ref.at[b, hv, vs], v_smem))):
        plgpu.copy_gmem_to_smem(src, dst, bars.at[n_chunks + i])
    alpha, beta = jnp.exp(g_ref[b, hv]), beta_ref[b, hv]
    for i in range(3):
        plgpu.barrier_wait(bars.at[n_chunks + i])
    # "fma": the chunks in the WGMMA layout; "fma_rows": a thread a row (`rows_layout`), the
    # token's q and k read as fp32 copies (a thread reads 4x the columns of the WGMMA layout)
    layout = rows_layout(R) if readout == "fma_rows" else None
    row = ROW if layout is None else layout.reduce(1)
    if x32_smem is not None:
        for x, dst in ((q_smem, x32_smem.at[0]), (k_smem, x32_smem.at[1])):
            dst[...] = x[...].astype(F32)
        plgpu.commit_smem()
        q_smem, k_smem = x32_smem.at[0], x32_smem.at[1]
    v = plgpu.load(v_smem, layout=row).astype(F32)

    def load(n):
        ref = s_smem.at[n]
        return (ref[...] if layout is None else plgpu.load(ref, layout=layout)).astype(F32)

    def dot(s, x, n):                                                 # s x_n [R]
        if layout is None:
            return jnp.sum(s * cols(chunk(x, n, block_k), s.shape), axis=1)
        return jnp.sum(fma_rows(zeros_rows(R), s, x, n, block_k), axis=1)

    # Pass 1: S k of the old state, chunk by chunk as the copies land.
    sk = plgpu.layout_cast(jnp.zeros((R,), F32), row)
    for n in range(n_chunks):
        plgpu.barrier_wait(bars.at[n])
        sk = sk + dot(load(n), k_smem, n)
    d = beta * (v - alpha * sk)                                       # [R]
    # Pass 2: S <- alpha S + d k^T in each chunk's buffer, copied out for live rows; o = S q.
    o = plgpu.layout_cast(jnp.zeros((R,), F32), row)
    for n in range(n_chunks):
        s = load(n)
        s = alpha * s + rows(d, s.shape) * cols(
            chunk(k_smem, n, block_k, COL if layout is None else layout.reduce(0)), s.shape)
        o = o + dot(s, q_smem, n)
        s_smem.at[n][...] = s.astype(s_smem.dtype)
        plgpu.commit_smem()

        @pl.when(live)
        def _(n=n):
            plgpu.copy_smem_to_gmem(s_smem.at[n], tile.at[:, pl.ds(n * block_k, block_k)])
    write_out(o, live, v_smem, o_ref.at[b, hv], vt)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_k", "tile_rows", "readout", "interpret"))
def _standard_decode(state, q, k, v, g, beta, slots, *, block_k, tile_rows, readout, interpret):
    batch, Hv, V = v.shape
    Hk, K = q.shape[1:]
    n_chunks = K // block_k
    kernel = functools.partial(_standard_kernel, heads_per_key_head=Hv // Hk, block_k=block_k,
                               readout=readout)
    x32 = readout == "fma_rows" and (q.dtype != F32 or k.dtype != F32)
    (o,), (state,) = mosaic_call(
        kernel, name="gdn_standard_decode_mgpu", grid=(batch, Hv, tile_rows_of(V, tile_rows)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, q_ref=q, k_ref=k, v_ref=v, g_ref=g, beta_ref=beta,
                    state_ref=state),
        outputs=dict(o_ref=like(v)),
        inplace=("state_ref",),
        scratch=dict(q_smem=plgpu.SMEM((K,), q.dtype), k_smem=plgpu.SMEM((K,), k.dtype),
                     v_smem=plgpu.SMEM((tile_rows,), v.dtype),
                     s_smem=plgpu.SMEM((n_chunks, tile_rows, block_k), state.dtype,
                                       transforms=state_layout(block_k, state.dtype)),
                     x32_smem=plgpu.SMEM((2, K), F32) if x32 else None,
                     bars=plgpu.Barrier(num_barriers=n_chunks + 3)),
        interpret=interpret)
    return o, state


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): S k and S q from checkpoint + ring, state written on folds only.
# --------------------------------------------------------------------------------------------
def _replay_kernel(slots_ref, counts_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, rkk_ref,
                   rkq_ref, xh_ref, xl_ref, s_ref, rk_ref, rd_ref, rg_ref, o_ref, vec_smem,
                   rd_smem, xh_smem, xl_smem, bars, fold_bar, *, vectors,
                   heads_per_key_head, block_k, num_stages, prologue, fold_stages,
                   fold_buffers, readout, ring_block):
    sv = vectors.views(vec_smem)
    R = sv.v.shape[0]                                                 # the CTA's V rows
    b, hv, hk, t, vs = _position(heads_per_key_head, R)
    L = rd_ref.shape[2]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    g, beta = g_ref[b, hv], beta_ref[b, hv]
    alpha = jnp.exp(g)
    # The walk's scalars: the ring's g [L], k_j . k and k_j . q [L] (whole: entries >= c are not
    # read; the append's g write at c, by another V tile's CTA, lands in an entry no walk reads).
    walk_copies, (ring_g, ring_kk, ring_kq) = scalar_vectors(
        (rg_ref.at[slot, hv], sv.ring_g), (rkk_ref.at[b, hk], sv.ring_kk),
        (rkq_ref.at[b, hk], sv.ring_kq))
    # What the readout reads first (k and q, or for readout "mma" their wgmma operands), then
    # the token's v, the ring's d rows, the walk's scalars: all in flight at once.
    readout_copies, operands, rest = _readout_copies(
        ((k_ref.at[b, hk], sv.k), (q_ref.at[b, hk], sv.q)),
        ((xh_ref, xh_smem), (xl_ref, xl_smem)), (b, hk))
    copies = (*readout_copies, (v_ref.at[b, hv, vs], sv.v),
              *ring_row_copies(rd_ref.at[slot, hv, :, vs], rd_smem, c, ring_block), *rest,
              *walk_copies)
    n_first = len(readout_copies)

    def ring_d(j):
        return plgpu.load(rd_smem.at[j], layout=ROW).astype(F32)

    walk = functools.partial(_walk, count=c, ring_g=ring_g)

    # The ring's parts of S k and S q: sum_j e_j (k_j . k) d_j, likewise with q.
    def through_ring(j, ej, acc):
        dj = ring_d(j)
        return (acc[0] + (ej * ring_kk(j)) * dj, acc[1] + (ej * ring_kq(j)) * dj)

    def landed_part():
        """v [R], exp of the ring's g sum and the ring's (S k, S q) parts: what needs the
        copies landed, the readout aside."""
        v = plgpu.load(sv.v, layout=ROW).astype(F32)
        total, ring = walk(through_ring, (zeros_row(tile_rows=R),) * 2)
        return v, jnp.exp(total), ring

    late = prologue != "serial"
    if late:                      # the state stream first; the readout waits for k and q
        landed = issue_all(bars, *copies)
    else:
        load_all(bars, *copies)
        v, big_e, (sk_ring, sq_ring) = landed_part()
    tile = s_ref.at[slot, hv, vs]                                     # [R, K] in GMEM
    s0k, s0q = _readout(tile, 2 if operands else (sv.k, sv.q), block_k=block_k,
                        num_stages=num_stages, wait_first=landed[:n_first] if late else (),
                        operands=operands, readout=readout)
    if late:                      # the rest landed while the state streamed: now the walk
        wait_all(landed[n_first:])
    if prologue == "fused":       # S k and S q from S0 k and S0 q in place
        total, (sk, sq) = _horner((s0k, s0q), count=c, ring_g=ring_g, ring_d=ring_d,
                                  ring_x=lambda i, j: (ring_kk, ring_kq)[i](j))
        big_e, v = jnp.exp(total), plgpu.load(sv.v, layout=ROW).astype(F32)
    else:
        if late:
            v, big_e, (sk_ring, sq_ring) = landed_part()
        sk, sq = big_e * s0k + sk_ring, big_e * s0q + sq_ring
    d = beta * (v - alpha * sk)                                       # [R]
    # k . q here, from the token's vectors in SMEM (no XLA op before the launch, see `dot`).
    write_out(alpha * sq + dot(sv.k, sv.q, block_k) * d, live, sv.v, o_ref.at[b, hv], t)

    # Fold (one step in L): S0 <- exp(sum g) S0 + d k^T + sum_j w_j d_j k_j^T, chunk by chunk,
    # rank-1 updates, with w_j = exp(sum_{j<i<=c} g_i) = alpha e_j.
    fold = c == L - 1

    pl.when(live & fold)(lambda: _fold(
        tile, rk_ref.at[slot, hk], fold_bar, sv.k, d, alpha, big_e, walk, ring_d, live,
        block_k=block_k, num_stages=fold_stages, buffers=fold_buffers))

    # Otherwise append (k, d, g) at `c`. The fold reads all L ring keys, and no other CTA reads
    # the ring's keys otherwise (their products come from XLA): no CTA writes a row another one
    # reads.
    @pl.when(live & ~fold)
    def _append():
        store_rows(d, sv.ring_d, rd_ref.at[slot, hv, c], t)

        @pl.when(t == 0)
        def _():
            rg_ref[slot, hv, c] = g

            @pl.when(hv % heads_per_key_head == 0)
            def _():
                store_async(plgpu.load(sv.k, layout=COL), sv.ring_k, rk_ref.at[slot, hk, c])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_k", "num_stages", "prologue", "fold_stages",
                                             "fold_buffers", "tile_rows", "readout",
                                             "products", "ring_block", "interpret"))
def _replay_decode(buffers, counts, q, k, v, g, beta, slots, *, block_k, num_stages, prologue,
                   fold_stages, fold_buffers, tile_rows, readout, products, ring_block,
                   interpret):
    batch, Hv, V = v.shape
    Hk, K = q.shape[1:]
    L = buffers.window
    # Per-key-head ring x current products: small next to the state (k . q: in the kernel).
    rkk, rkq = (p[:, :, 0] for p in ring_key_products(                 # [b, Hk, L]
        buffers.ring_k, slots, k[:, None], q[:, None], by=products, counts=counts,
        interpret=bool(interpret)))
    ring_dtype = buffers.ring_k.dtype
    vectors = VectorPack.of(v=(tile_rows, v.dtype), k=(K, k.dtype), q=(K, q.dtype),
                            ring_d=(tile_rows, ring_dtype), ring_k=(K, ring_dtype),
                            ring_g=(L, F32), ring_kk=(L, F32), ring_kq=(L, F32))
    kernel = functools.partial(_replay_kernel, vectors=vectors, heads_per_key_head=Hv // Hk,
                               block_k=block_k, num_stages=num_stages, prologue=prologue,
                               fold_stages=fold_stages, fold_buffers=fold_buffers,
                               readout=readout, ring_block=ring_block)
    operands = _operands(readout, jnp.stack([k, q], axis=1), block_k)
    (o,), new = mosaic_call(
        kernel, name="gdn_replay_decode_mgpu", grid=(batch, Hv, tile_rows_of(V, tile_rows)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, q_ref=q, k_ref=k, v_ref=v, g_ref=g,
                    beta_ref=beta, rkk_ref=rkk, rkq_ref=rkq, **operands.inputs,
                    s_ref=buffers.checkpoint, rk_ref=buffers.ring_k, rd_ref=buffers.ring_d,
                    rg_ref=buffers.ring_g),
        outputs=dict(o_ref=like(v)),
        inplace=("s_ref", "rk_ref", "rd_ref", "rg_ref"),
        scratch=dict(vec_smem=vectors.smem(),
                     rd_smem=plgpu.SMEM((L, tile_rows), ring_dtype), **operands.scratch,
                     bars=plgpu.Barrier(num_barriers=6 + operands.copies
                                        + ring_copies_count(L, ring_block)),
                     fold_bar=plgpu.Barrier(num_barriers=1)),
        interpret=interpret)
    return o, type(buffers)(*new)


# --------------------------------------------------------------------------------------------
# ReplaySSM verify (T window tokens), one-chunk WY/UT form as the Triton verify: with S_w the
# committed state at the window start and G_s = sum_{r<=s} g_r,
#   d_s = beta_s (v_s - e^{G_s} S_w k_s) - sum_{r<s} beta_s e^{G_s-G_r} (k_r . k_s) d_r
#   o_s = e^{G_s} S_w q_s + sum_{r<=s} e^{G_s-G_r} (k_r . q_s) d_r
# S_w k_s and S_w q_s come from checkpoint + ring without forming S_w: one pass over the
# checkpoint tile for all T tokens, one ring walk. Rows with c + T >= L fold ring[0:c] +
# window[0]. The ring is written after the kernel from the returned d (`write_window`): the
# fold reads ring rows the window overwrites, in other CTAs of the same key head.
# --------------------------------------------------------------------------------------------
def _verify_kernel(slots_ref, counts_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, rkk_ref,
                   rkq_ref, wkk_ref, wkq_ref, wk_ref, xh_ref, xl_ref, s_ref, rk_ref, rd_ref,
                   rg_ref, o_ref, d_ref, vec_smem, rd_smem, xh_smem, xl_smem, rows_smem,
                   prod_smem, bars, fold_bar, *, vectors, heads_per_key_head, block_k,
                   num_stages, prologue, write_ring, fold_stages, fold_buffers, scoped,
                   readout, ring_block):
    sv = vectors.views(vec_smem)
    R = sv.v[0].shape[0]                                              # the CTA's V rows
    b, hv, hk, vt, vs = _position(heads_per_key_head, R)
    T, L = v_ref.shape[1], rd_ref.shape[2]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    gs = [g_ref[b, t, hv] for t in range(T)]
    betas = [beta_ref[b, t, hv] for t in range(T)]
    in_kernel = wk_ref is not None                  # key_products "kernel"
    if in_kernel:
        # The ring's keys and the window's, chunk n of each at rows n * W (ring) and
        # n * W + L (window) of rows (`_product_rows`): `chunk_products` forms k_j . x and
        # k_r . x for the window's x = k_t, q_t (the readout's operands) after they land, into
        # the first W rows of prod [M, N]. Both are the kernel's (rows_smem, prod_smem) or,
        # where `scoped` gives their types, a scope's (the serial prologue's rows; all of
        # the fused prologue's, whose products follow the stream).
        nk, Tp, bk = wk_ref.shape[2:]
        W = _product_block_rows(L, Tp)
        walk_copies, (ring_g,) = scalar_vectors((rg_ref.at[slot, hv], sv.ring_g))

        def product_copies(rows):
            return [pair for n in range(nk) for pair in (
                (rk_ref.at[slot, hk, :, pl.ds(n * bk, bk)], rows.at[pl.ds(n * W, L)]),
                (wk_ref.at[b, hk, n], rows.at[pl.ds(n * W + L, Tp)]))]

        def ring_x(prod, p, t, j):    # p: 0 k_j . k_t, 1 k_j . q_t
            return prod[j, p * T + t]

        def window_x(prod, p, r, t):  # p: 0 k_r . k_t, 1 k_r . q_t
            return prod[L + r, p * T + t]
    else:
        # The walk's scalars: the ring's g [L], k_j . k_t and k_j . q_t [T * L] (t-major); the
        # substitution's k_r . k_t and k_r . q_t [T * T] (r-major) with them, off GMEM latency
        # (read as GMEM scalars, one round trip each, on the CTA's critical path).
        walk_copies, (ring_g, *readers) = scalar_vectors(
            (rg_ref.at[slot, hv], sv.ring_g), (rkk_ref.at[b, hk], sv.ring_kk),
            (rkq_ref.at[b, hk], sv.ring_kq), (wkk_ref.at[b, hk], sv.window_kk),
            (wkq_ref.at[b, hk], sv.window_kq))

        def product_copies(rows):
            return []

        def ring_x(prod, p, t, j):
            return readers[p](t * L + j)

        def window_x(prod, p, r, t):
            return readers[2 + p](r * T + t)
    # The window's k, q rows (or their "mma" operands, and k_0 for the fold) first, then its v
    # rows, one 1-D copy each (into the pack, not [T, n] buffers of their own), the ring's d
    # rows [L, R] and the walk's scalars.
    queries = getattr(sv, "q", ())                                    # none with "mma"
    readout_copies, operands, rest = _readout_copies(
        (*((k_ref.at[b, t, hk], k_t) for t, k_t in enumerate(sv.k)),
         *((q_ref.at[b, t, hk], q_t) for t, q_t in enumerate(queries))),
        ((xh_ref, xh_smem), (xl_ref, xl_smem)), (b, hk))
    copies = (*readout_copies, *((v_ref.at[b, t, hv, vs], sv.v[t]) for t in range(T)),
              *ring_row_copies(rd_ref.at[slot, hv, :, vs], rd_smem, c, ring_block), *rest,
              *walk_copies)
    n_first = len(readout_copies)

    def ring_d(j):
        return plgpu.load(rd_smem.at[j], layout=ROW).astype(F32)

    walk = functools.partial(_walk, count=c, ring_g=ring_g)

    # The ring's parts of S_w k_t and S_w q_t: sum_j e_j (k_j . k_t) d_j, likewise with q_t.
    def through_ring(prod):
        def body(j, ej, acc):
            dj = ring_d(j)
            return tuple(tuple(acc_t + (ej * ring_x(prod, p, t, j)) * dj
                               for t, acc_t in enumerate(a)) for p, a in enumerate(acc))
        return body
    zt = (zeros_row(tile_rows=R),) * T

    def products(rows, prod):
        """The in-kernel products (their low parts' scratch in its own scope), once their rows
        landed."""
        if in_kernel:
            pl.run_scoped(lambda lo_smem: chunk_products(
                rows, lo_smem, operands, prod, block_rows=W), _product_rows(rows.shape[0], bk))

    def landed_part(rows):
        """exp of the ring's g sum and the ring's parts (as the decode's); with in-kernel
        products, those first."""
        products(rows, prod_smem)
        total, ring = walk(through_ring(prod_smem), (zt, zt))
        return jnp.exp(total), ring

    def serial(rows):
        load_all(bars, *copies, *product_copies(rows))
        out = landed_part(rows)
        plgpu.commit_smem()           # the stream's copies may reuse a scope's SMEM
        return out

    def substitute(swk, swq, prod):
        """The window's d_t (forward substitution, T <= 8) and outputs o_t (written) from
        S_w k_t and S_w q_t."""
        cum = list(itertools.accumulate(gs))         # G_t = sum_{r <= t} g_r
        ds = []
        for t in range(T):
            corr = jnp.exp(cum[t]) * swk[t]
            for r in range(t):
                corr = corr + (jnp.exp(cum[t] - cum[r]) * window_x(prod, 0, r, t)) * ds[r]
            ds.append(betas[t] * (plgpu.load(sv.v[t], layout=ROW).astype(F32) - corr))
            o = jnp.exp(cum[t]) * swq[t]
            for r in range(t + 1):
                o = o + (jnp.exp(cum[t] - cum[r]) * window_x(prod, 1, r, t)) * ds[r]
            write_out(o, live, sv.v[t], o_ref.at[b, t, hv], vt)   # v_t is in registers
            if not write_ring:
                store_rows(ds[t], sv.d[t], d_ref.at[b, t, hv], vt)
        return ds

    def fused(s0, rows, prod):
        """After the stream: the products (their rows copied in now), S_w x from S0 x in
        place, oldest entry first, and the substitution; returns (its d_t, big_e)."""
        if in_kernel:
            load_all(bars, *product_copies(rows), start=len(copies))
            products(rows, prod)
        total, sw = _horner(s0, count=c, ring_g=ring_g, ring_d=ring_d,
                            ring_x=lambda i, j: ring_x(prod, i // T, i % T, j))
        ds = substitute(sw[:T], sw[T:], prod)
        plgpu.commit_smem()           # the fold's copies may reuse a scope's SMEM
        return ds, jnp.exp(total)

    late = prologue != "serial"
    if late:                      # as the decode: the readout waits for the k_t and q_t
        landed = issue_all(bars, *copies, *(() if scoped else product_copies(rows_smem)))
    elif scoped:                  # the products' rows in the prologue's own scope: the
        # stream's pipeline takes their SMEM (the kernel's peak is the larger of the two)
        big_e, (sk_ring, sq_ring) = pl.run_scoped(serial, *scoped)
    else:
        big_e, (sk_ring, sq_ring) = serial(rows_smem)
    tile = s_ref.at[slot, hv, vs]                                     # [R, K] in GMEM
    s0 = _readout(tile, 2 * T if operands else (*sv.k, *queries), block_k=block_k,
                  num_stages=num_stages, wait_first=landed[:n_first] if late else (),
                  operands=operands, readout=readout)
    if late:                      # the rest, then the walk
        wait_all(landed[n_first:])
    if prologue == "fused":
        ds, big_e = (pl.run_scoped(functools.partial(fused, s0), *scoped) if scoped
                     else fused(s0, None, None))
    else:
        if late:
            big_e, (sk_ring, sq_ring) = landed_part(rows_smem)
        sw = [big_e * x + r for x, r in zip(s0, (*sk_ring, *sq_ring))]
        ds = substitute(sw[:T], sw[T:], prod_smem)

    if write_ring:      # the window's d into the ring: this CTA's own rows, read (landed) above
        for t, pos in enumerate(window_positions(c, T, L)):
            @pl.when(live & (pos >= 0))
            def _(t=t, pos=pos):
                store_rows(ds[t], sv.d[t], rd_ref.at[slot, hv, pos], vt)

    # Fold ring[0:c] + window[0] (always accepted) when the window would fill the ring.
    pl.when(live & verify_folds(c, T, L))(lambda: _fold(
        tile, rk_ref.at[slot, hk], fold_bar, sv.k[0], ds[0], jnp.exp(gs[0]), big_e, walk,
        ring_d, live, block_k=block_k, num_stages=fold_stages, buffers=fold_buffers))
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_k", "num_stages", "prologue", "ring_write",
                                             "fold_stages", "fold_buffers", "tile_rows",
                                             "readout", "products", "ring_block", "interpret"))
def _replay_verify(buffers, counts, q, k, v, g, beta, slots, *, block_k, num_stages, prologue,
                   ring_write, fold_stages, fold_buffers, tile_rows, readout, products,
                   ring_block, interpret):
    """Window inputs q, k [b, T, Hk, K], v [b, T, Hv, V], g, beta [b, T, Hv]. Returns
    o [b, T, Hv, V], the window's d [b, T, Hv, V] float32 (not written if ring_write is
    "kernel"), the checkpoint pool (folded rows updated) and the ring_d pool (with the window's
    d if ring_write is "kernel", else as it was; k and g are not written)."""
    batch, T, Hv, V = v.shape
    Hk, K = q.shape[2:]
    L = buffers.window
    # Per-key-head products (ring x window, window x window): small next to the state; formed
    # before the launch, or in the kernel from the window's keys by chunk (`_window_key_rows`)
    in_kernel = products == "kernel"
    rkk = rkq = wkk = wkq = wk = None
    if in_kernel:
        wk = _window_key_rows(k, block_k)
    else:
        rkk, rkq, wkk, wkq = verify_key_products(buffers.ring_k, slots, k, q, by=products,
                                                 counts=counts, interpret=bool(interpret))
        # flat per key head, as the kernel reads them: [b, Hk, T L] (t-major) and [b, Hk, T T]
        # (r-major)
        rkk, rkq, wkk, wkq = (p.reshape(batch, Hk, -1) for p in (rkk, rkq, wkk, wkq))
    write_ring = ring_write == "kernel"
    ring_dtype = buffers.ring_d.dtype
    # d goes out through sv.d: to the ring in its dtype, or to the d output in float32
    # k and q rows for the FMA readout; with "mma" k_0 only (the fold's key)
    fma = readout != "mma"
    vectors = VectorPack.of(v=((T, tile_rows), v.dtype), k=((T if fma else 1, K), k.dtype),
                            **({"q": ((T, K), q.dtype)} if fma else {}),
                            d=((T, tile_rows), ring_dtype if write_ring else F32),
                            ring_g=(L, F32), **({} if in_kernel else {
                                "ring_kk": (T * L, F32), "ring_kq": (T * L, F32),
                                "window_kk": (T * T, F32), "window_kq": (T * T, F32)}))
    operands = _operands(readout, jnp.concatenate([k, q], axis=1), block_k)
    # in-kernel products: the ring's and the window's keys by chunk (a multiple of 64 rows, a
    # wgmma's M), and their products with the 2T operand vectors. The serial prologue is done
    # with the rows before the stream starts: they take its own scope (T = 4: 85 -> 69 KiB a
    # CTA, room for a third one on an SM); the fused one copies them in after the stream, rows
    # and products in a scope of their own; the overlap one's copies go out with the first
    # ones, so both are the kernel's.
    nk = K // block_k
    product_scratch, scoped = dict(rows_smem=None, prod_smem=None), ()
    if in_kernel:
        M = pl.cdiv(nk * _product_block_rows(L, wk.shape[3]), 64) * 64
        rows = _product_rows(M, block_k)
        prod = plgpu.SMEM((M, operands.inputs["xh_ref"].shape[3]), F32)
        scoped = {"serial": (rows,), "overlap": (), "fused": (rows, prod)}[prologue]
        product_scratch = dict(rows_smem=None if scoped else rows,
                               prod_smem=None if prologue == "fused" else prod)
    kernel = functools.partial(_verify_kernel, vectors=vectors, heads_per_key_head=Hv // Hk,
                               block_k=block_k, num_stages=num_stages, prologue=prologue,
                               write_ring=write_ring, fold_stages=fold_stages,
                               fold_buffers=fold_buffers, scoped=scoped,
                               readout=readout, ring_block=ring_block)
    (o, d), new = mosaic_call(
        kernel, name="gdn_replay_verify_mgpu", grid=(batch, Hv, tile_rows_of(V, tile_rows)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, q_ref=q, k_ref=k, v_ref=v, g_ref=g,
                    beta_ref=beta, rkk_ref=rkk, rkq_ref=rkq, wkk_ref=wkk, wkq_ref=wkq,
                    wk_ref=wk, **operands.inputs, s_ref=buffers.checkpoint, rk_ref=buffers.ring_k,
                    rd_ref=buffers.ring_d, rg_ref=buffers.ring_g),
        outputs=dict(o_ref=like(v), d_ref=jax.ShapeDtypeStruct(v.shape, F32)),
        inplace=("s_ref", "rd_ref") if write_ring else ("s_ref",),
        scratch=dict(vec_smem=vectors.smem(),
                     rd_smem=plgpu.SMEM((L, tile_rows), ring_dtype),
                     **operands.scratch, **product_scratch,
                     bars=plgpu.Barrier(num_barriers=_verify_copies(
                         T, nk, operands.copies, in_kernel, ring_copies_count(L, ring_block))),
                     fold_bar=plgpu.Barrier(num_barriers=1)),
        interpret=interpret)
    return (o, d, *new) if write_ring else (o, d, *new, buffers.ring_d)
