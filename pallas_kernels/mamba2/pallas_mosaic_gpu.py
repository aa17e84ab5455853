"""Mosaic GPU kernels for Mamba-2 (`impl="pallas_mosaic_gpu"`): the standard step, the ReplaySSM
step with its fold, and ReplaySSM verify (T window tokens). The state-per-draft baseline verify
runs on the other backends.

Grid (batch, H / heads, ceil(P / 64)): one CTA (one warpgroup) per (row, `heads` heads of a
group, 64-row P tile; the last one ragged where 64 does not divide P, `tile_rows_of`; the
replay decode's tiles may take 128 rows, `tile_rows`). The slot
read from `slots` picks the pool rows the TMA copies (the pool seen as [S * H, P, N],
`_heads_flat`); the state tile [heads, 64, N] streams through shared
memory in chunks of block_n with `plgpu.emit_pipeline` (num_stages copies in flight; chunks
tiled and swizzled in SMEM) and is computed on in registers (WGMMA layout, see
`_mosaic_utils`). The vectors B, C (and the ring's B in a fold) are copied whole
before the pipeline (`state_spec` says why); the token's vectors share one SMEM buffer per
dtype with the other small ones (`VectorPack`: a buffer of its own takes 1 KiB). Updated chunks
go back by TMA from a double-buffered SMEM staging area, for live rows only (the null slot is
never written).

Replay: the per-group products B_j . C (ring x current C) and B . C are computed by XLA before
the kernel (a [b, G, L] read of the ring's B: under 1% of the state traffic; computing them in
every CTA instead made each CTA copy its group's whole ring B every step, L x N: 4 KiB at the
8B's shapes, an eighth of its state tile). Their two launches are a fixed cost per layer, so
"auto" keeps the Triton replay at small batches (`AUTO_MIN_BATCH`). The kernel walks the
committed ring entries backwards (a loop of `count` steps; entries past the count are never
read), carrying the suffix sum of dt for s_j = dt_j exp(A sum_{i>j} dt_i); the walk's scalars
(ring dt, B_j . C) are copied whole into SMEM with the first vectors (`scalar_vectors`), so the
loop waits on no GMEM round trip.
The fold (one step in L) re-streams the checkpoint and adds X^T diag(s) B as rank-1 updates on
the FMA units, in fp32: a tf32 wgmma would lose the state's precision and a 3-pass tf32 split
is not worth it for a pass that runs once every L steps. Non-fold steps append the token to the
ring (x, dt, and B from the group's first head).

Prologue (a tiling's `prologue`, replay decode and verify): a CTA streams only its 64 x N
checkpoint tile (32 KiB in fp32 at N = 128), so what it does before the first state chunk is
requested shows in the kernel's time. "serial" (the verify's) lands the token's vectors, the
ring's x rows and the walk's scalars, walks the ring, and only then starts the checkpoint
pipeline: a TMA round trip plus up to L - 1 walk steps before a state byte is asked for.
"overlap" (the replay decode's, measured faster) issues the same copies without waiting and
starts the pipeline at once (its first state chunks go out behind them); the readout waits for C
on its first step only, and the rest (x, the ring, the walk) follows the readout: the walk's
terms enter only after it (y = decay S0 C + the ring's part). Both compute the same sums in the
same order: the outputs are equal.

Verify: one pass over the checkpoint tile serves all T tokens (T accumulators S0 C_t per
chunk, C_t for the T tokens in one [T, block_n] tile per step); one ring walk gives every
token's history term; the within-window terms use the precomputed window B_r . C_t. Rows with
c + T >= L fold ring[0:c] + window[0] as decode folds. XLA writes the window into the ring after
the kernel (`write_window`), as the Triton verify does; a tiling's ring_write="kernel" has each
CTA write its own x rows instead, leaving XLA B and dt (another CTA's fold may still read the
group's ring B rows the window overwrites).

Takes any P (Nemotron-H: P = 64; Nemotron-Nano-9B-v2: P = 80, a tile of 64 and a ragged one of
16), N <= 256 (B and C are one TMA box each) and N % block_n == 0 with block_n >= 8 and chunk
rows of >= 32 bytes (`state_block`). The public
entries take validated arguments (see `pallas_kernels.mamba2.api`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

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
    auto_takes,
    check_rows_readout,
    chunk,
    cols,
    fma_rows,
    issue_all,
    load_all,
    measured_tiling,
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
    state_spec,
    store_async,
    store_rows,
    tile_rows_of,
    wait_all,
    wait_on_first_step,
    write_chunk,
    write_out,
    zeros_row,
    zeros_rows,
)
from pallas_kernels.mamba2.buffers import bc_products, write_window
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, verify_folds, window_positions
from pallas_kernels.validation import check_choice, for_window, resolve_tiling

GRID_NAMES = ("row", "head", "ptile")


@dataclasses.dataclass(frozen=True)
class Mamba2MosaicTiling:
    """Launch configuration of the Mosaic GPU kernels: block_n bounds the d_state chunk streamed
    per pipeline step (the largest power of two dividing N up to it: at least 8, and 16 for a bf16
    state), num_stages the chunks in flight. The P tile is one warpgroup's 64 rows (the replay
    decode's: `tile_rows`). prologue
    (replay decode and verify; the standard kernel has no walk): "serial" lands the CTA's
    vectors and walks the ring before the checkpoint stream starts, "overlap" starts the stream
    at once and walks after it (module docstring; the same sums). ring_write (verify): who
    writes the window's x into the ring (`validation.RING_WRITES`): "xla" after the kernel, or
    "kernel" (each CTA its own [T, 64] rows; B and dt stay XLA's). bc_products (replay
    decode and verify): what forms the B . C products before the launch
    (`validation.PRODUCTS`, `buffers.bc_products`): "xla" or "pallas" (one launch).
    fold_stages, fold_buffers (replay decode and verify): the fold's chunks in flight (0:
    num_stages) and its write-back's staging buffers (2 or 1). The fold's SMEM (the group's
    ring B, the staging, its pipeline) is allocated in the fold's own scope, over the read-only
    pass's: the kernel's peak SMEM is the larger of the two passes', so a leaner fold lets the
    read-only pass keep more chunks in flight at the same CTAs an SM. heads: the heads of one
    group a CTA covers (1, 2 or 4; a bound as block_n is: the largest power of two up to it
    dividing the heads of a group), each one's [64, N] tile in the same pipeline steps: a CTA's
    fixed work (the vectors' copies and barriers, the ring walk's loop, the group's B, C and
    walk scalars) is paid once for all of them. readout (replay decode): how the read-only
    pass forms S0 C, by FMAs in the WGMMA layout ("fma") or with a thread a row of each chunk
    ("fma_rows", `_mosaic_utils.rows_layout`: no swizzle selects, the row sums after the
    stream; C converted to an fp32 copy first). ring_block (replay decode and verify): the
    ring's x rows a walk reads copied in blocks of ring_block rows, each only where the count
    reaches it (`_mosaic_utils.ring_row_copies`), or 0: all L rows in one copy. tile_rows
    (replay decode): the P rows of a CTA's tiles, 64 or, where P > 64, 128 (two WGMMA tiles in
    the warpgroup's registers; at P = 80 one CTA a head's 80 rows, the 48 past P read as zeros
    by the TMA box, where 64-row tiles take a CTA for 64 and one for the ragged 16)."""
    block_n: int
    num_stages: int = 2
    prologue: str = "serial"
    ring_write: str = "xla"
    bc_products: str = "xla"
    fold_stages: int = 0
    fold_buffers: int = 2
    heads: int = 1
    readout: str = "fma"
    ring_block: int = 0
    tile_rows: int = TILE_ROWS


_HEADS = (1, 2, 4)
_READOUTS = ("fma", "fma_rows")
_TILE_ROWS = (TILE_ROWS, 2 * TILE_ROWS)


# Measured on the H200 (docs/benchmarks.md, sixth GPU session; Nemotron-H-8B shapes, batch 256,
# fp32 state): standard 549 us at block_n 64 (573 at 32); replay (staggered) 328 us at block_n 32,
# 379 at 64, 490 at 128; verify T = 4 552 us at 32, 571 at 64; 3 or 4 stages change nothing.
# Seventh session: the replay's "overlap" prologue 329 -> 320 us (3 stages with it: 345).
MOSAIC_STANDARD_TILING = Mamba2MosaicTiling(block_n=64)
# Seventeenth session (stop 36): the B . C products by one Pallas launch, 8B at batch 256 326.8 ->
# 324.8 us staggered, 327.7 -> 326.7 amortised (XLA's fusions 6.5 us a step, the launch 5.1);
# batch 32 the same; batch 1 6.7 -> 7.0, where `auto` runs Triton (AUTO_MIN_BATCH). Nineteenth:
# the fold's lean SMEM options, staggered at 256: default 323.5 us, fold_buffers 1 322.8 (noise),
# 4 / 3 read-only stages with a 2-stage single-buffered fold 333.4 / 349.6: the default stays.
# Twenty-first (stop 42): two heads a CTA with a one-stage single-buffered fold (5 CTAs an SM,
# 10 head tiles) 324.3 -> 313.5 / 314.0 us staggered ("overlap"), 310.0 ("serial"); with the
# default fold (3 CTAs) 372.6; four heads 400.8-431.2; 16-column chunks 340-343.
# Stop 57 (an H100, batch 256, staggered): the ring's x rows by blocks of 4, only those the
# count reaches (`ring_block`), 8B 441.3 / 441.5 -> 430.1 us (blocks of 2 / 8: 427.9-428.3 /
# 432.6), P = 80 548.3 -> 550.7 (blocks of 2 556.5: more copies a CTA of ragged tiles).
MOSAIC_REPLAY_TILING = Mamba2MosaicTiling(block_n=32, bc_products="pallas", heads=2,
                                          fold_stages=1, fold_buffers=1, ring_block=4)
# Stop 58 (an H100, batch 256, staggered, two calls): where 64 does not divide P > 64, a head's
# P rows in one 128-row tile, one head a CTA. P = 80: 539.5 / 538.0 -> 524.3 / 524.6 us
# (1.69x -> 1.74x the Triton standard's 911.5; blocks of 2 / 8 / one copy 524.5 / 525.9 /
# 529.1, with the overlap prologue and "fma_rows" 524.8, 3 stages 548.5, two heads in 16-column
# chunks 616.6).
RAGGED_P_TILINGS = {MOSAIC_REPLAY_TILING: dataclasses.replace(
    MOSAIC_REPLAY_TILING, heads=1, tile_rows=2 * TILE_ROWS)}
# Verify (twenty-first session, batch 256, us, x the state-per-draft baseline): two heads a CTA
# from T = 3. T = 4: 545.6 (2.76x) -> 497.8 (3.02x) in 32-column chunks, 2 stages, a one-stage
# single-buffered fold in its own scope (5 CTAs an SM by SMEM, 3 by its 168 registers:
# scripts/mosaic_ptxas.py, stop 55); 16-column chunks 509.9-523.9. T = 8:
# 1,319.7 -> 1,129.9 (3.06x) in 16-column chunks, 4 stages, the fold's as many (1,164.0 with
# the one-stage fold: verify folds a row every L / T steps, the decode every L). T = 2 with
# two heads in 16-column chunks lost to Triton (407.5 vs 383.0): one head, as before (372 vs
# 383, eleventh session).
MOSAIC_VERIFY_TILING = Mamba2MosaicTiling(block_n=16, num_stages=4, heads=2)
# Stop 48 (an H100, batch 256): the B . C products by one Pallas launch (`ring_products`), T = 2
# 456.7 -> 449.8 us, T = 4 562.5 -> 550.3 (3.54x -> 3.62x the baseline); T = 8 not timed (its
# baseline did not fit the H100): XLA's there.
MOSAIC_VERIFY_TILINGS = ((2, Mamba2MosaicTiling(block_n=32, bc_products="pallas")),
                         (4, Mamba2MosaicTiling(block_n=32, heads=2, fold_stages=1,
                                                fold_buffers=1, bc_products="pallas")),
                         (MAX_VERIFY_TOKENS, MOSAIC_VERIFY_TILING))
_DEFAULT_TILING = {"standard_decode": MOSAIC_STANDARD_TILING,
                   "replay_decode": MOSAIC_REPLAY_TILING, "replay_verify": MOSAIC_VERIFY_TILINGS}
# impl="auto" on sm90 runs the Mosaic kernels that beat the Triton ones on the H200: replay 320
# vs 391 us (staggered, batch 256, seventh session, both at their best tilings), verify 552 vs
# 613 (sixth). The standard decode went back to Triton once launched row-slowest: 538 vs 550 us
# at batch 256, 4.3 vs 4.6 at batch 1.
AUTO_OPS = frozenset({"replay_decode", "replay_verify"})
# Below this batch "auto" keeps the Triton replay (eighth session, staggered, wrapper counted):
# batch 1 6.7 vs 8.1 us (the Mosaic wrapper's two B.C einsums are a fixed cost per layer), 8
# 19.2 vs 19.4; Mosaic from 32 (52.7 vs 57.4), 128 (171 vs 201), 256 (330 vs 392).
AUTO_MIN_BATCH = {"replay_decode": 16}
# Every window runs the Mosaic verify since two heads a CTA (twenty-first session, batch 256,
# T = 8: 1,163.6 vs Triton's 1,254.5 us; T = 4 523.8 vs 588.5; eleventh, T = 2: 372 vs 383).
# At P = 80 (Nemotron-Nano-9B-v2: a 64-row tile and a ragged one of 16; fifteenth session)
# the Mosaic verify wins from where the Triton one falls off: T = 4 from 128 rows (518.1 vs
# 666.3 us; 1,003.6 vs 1,272.1 at 256: 1.95x the state-per-draft baseline against 1.54x),
# T = 2 at 256 (614.0 vs 632.5); Triton wins below (T = 4 at 64: 257.3 vs 271.3; T = 2 at
# 128: 290.7 vs 319.8). Its replay decode tied then (543.5 vs 539.4 us staggered, batch 256)
# and its standard lost (792.2 vs 682.9), which stays on Triton there. The least batch by window
# ((largest T, rows), ...). Windows past 4 were not measured there with two heads a CTA: Triton.
# Twenty-first session: with two heads a CTA its replay decode wins from 32 rows (staggered
# 65.3 vs 69.4 us at 32, 223.6 vs 247.9 at 128, 436.7 vs 485.7 at 256; 23.5 vs 21.3 at 8).
AUTO_RAGGED_MIN_BATCH = {"replay_verify": ((2, 256), (4, 128), (MAX_VERIFY_TOKENS, math.inf)),
                         "replay_decode": ((1, 32),)}
_MAX_N = 256                      # one TMA box per B / C vector


def _tiles(tiling, default, N, state_dtype, verify=False, fold=False, heads_per_group=1, P=None):
    """`resolve_tiles` and "heads": the tiling's bound on the heads a CTA covers, as run for
    groups of `heads_per_group` heads; for the replay decode (fold, not verify, its P given)
    "readout" and "tile_rows" (128 only where P > 64)."""
    tiles = resolve_tiles(tiling, default, field="block_n", chunk=("d_state N", N),
                          max_chunk=_MAX_N, state_dtype=state_dtype, verify=verify, fold=fold,
                          products="bc_products" if fold else None,
                          prologues=("serial", "overlap"))
    t = resolve_tiling(tiling, default)
    check_choice("heads", t.heads, _HEADS)
    heads = t.heads
    while heads_per_group % heads:
        heads //= 2
    if fold and not verify:                   # the replay decode's readout and tile rows
        check_choice("readout", t.readout, _READOUTS)
        check_choice("tile_rows", t.tile_rows, _TILE_ROWS)
        rows = t.tile_rows if P is not None and P > TILE_ROWS else TILE_ROWS
        check_rows_readout(t.readout, rows, state_dtype)
        tiles.update(readout=t.readout, tile_rows=rows)
    return {**tiles, "heads": heads}


def for_shape(tiling, P):
    """The measured tiling a kernel whose default is `tiling` runs at head dim P: its 128-row
    variant (`RAGGED_P_TILINGS`) where 64 does not divide P > 64."""
    return RAGGED_P_TILINGS.get(tiling, tiling) if P > TILE_ROWS and P % TILE_ROWS else tiling


def takes(op, args) -> bool:
    """Whether impl="auto" runs op's Mosaic kernel on sm90 for the op's (validated) `args`: a
    measured winner (`AUTO_OPS`) at the batch it won (`AUTO_MIN_BATCH`) whose default tiling
    takes their shapes (N <= 256), at whole P tiles (P a multiple of 64) or, for the ops that
    also won there, a ragged last one (Nemotron-Nano-9B-v2's P = 80) at the batches and
    windows it won (`AUTO_RAGGED_MIN_BATCH`)."""
    state = args[0] if op == "standard_decode" else args[0].checkpoint
    x, B = args[1:3] if op == "standard_decode" else args[2:4]
    T = x.shape[1] if op == "replay_verify" else 1
    if x.shape[-1] % TILE_ROWS and op in AUTO_RAGGED_MIN_BATCH:
        min_batch = for_window(AUTO_RAGGED_MIN_BATCH[op], T)
    else:
        min_batch = AUTO_MIN_BATCH.get(op, 1)
    if x.shape[0] < min_batch:
        return False
    return auto_takes(op, AUTO_OPS, x.shape[-1], lambda: _tiles(
        None, measured_tiling(_DEFAULT_TILING, op, T), B.shape[-1], state.dtype),
        ragged_ops=AUTO_RAGGED_MIN_BATCH.keys())


def standard_decode(state, x, B, C, dt, A, D, slots, *, tiling, interpret):
    tiles = _tiles(tiling, MOSAIC_STANDARD_TILING, B.shape[2], state.dtype,
                   heads_per_group=x.shape[1] // B.shape[1])
    return _standard_decode(state, x, B, C, dt, A, D, slots, interpret=interpret,
                            heads=tiles["heads"], block_n=tiles["block_n"],
                            num_stages=tiles["num_stages"])


def replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    return _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                          **_tiles(tiling, for_shape(MOSAIC_REPLAY_TILING, x.shape[2]),
                                   B.shape[2], buffers.checkpoint.dtype, fold=True,
                                   heads_per_group=x.shape[1] // B.shape[1], P=x.shape[2]))


def replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    default = measured_tiling(_DEFAULT_TILING, "replay_verify", x.shape[1])
    tiles = _tiles(tiling, default, B.shape[3], buffers.checkpoint.dtype, verify=True,
                   fold=True, heads_per_group=x.shape[2] // B.shape[2])
    y, ck, rx = _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                               **tiles)
    in_kernel = tiles["ring_write"] == "kernel"
    return y, write_window(buffers._replace(checkpoint=ck, ring_x=rx), counts, slots,
                           None if in_kernel else x, B, dt)


def _position(heads_per_group, heads):
    """(row b, the CTA's first head h0, group g, P tile t) of this CTA: it covers heads h0 ..
    h0 + heads - 1, all of group g."""
    b, hc, t = (lax.axis_index(n) for n in GRID_NAMES)
    h0 = hc * heads
    return b, h0, h0 // heads_per_group, t


def _heads_flat(state):
    """The state pool [S, H, P, N] as [S * H, P, N] (a free reshape, in place): a CTA's tile
    [heads, 64, N] is then one TMA box of three dims (slot and heads merged), within the five a
    copy takes once the chunk's [64, block] is tiled into four."""
    S, H, P, N = state.shape
    return state.reshape(S * H, P, N)


def _ring_x_copies(rx_ref, rx_smem, slot, h0, ps, count, ring_block):
    """The copies of the CTA's heads' ring x rows [heads, L, 64] (`ring_row_copies`): one of
    them all, or by blocks, each head's own."""
    heads = rx_smem.shape[0]
    if not ring_block:
        return [(rx_ref.at[slot, pl.ds(h0, heads), :, ps], rx_smem)]
    return [cp for k in range(heads) for cp in ring_row_copies(
        rx_ref.at[slot, h0 + k, :, ps], rx_smem.at[k], count, ring_block)]


def _walk(body, init, *, count, ring_dts, a, suffix):
    """Folds body(j, s_j, carry) over the committed ring entries j = count-1 .. 0 (newest first;
    entries past the count are never read), for the CTA's heads k at once: s_j is a tuple of
    s_jk = dt_jk exp(a_k (suffix_k + sum_{j<i<count} dt_ik)), `suffix` (a tuple) the dt sums
    of the tokens after the ring, ring_dts per head a reader j -> dt_jk. Returns (per head
    suffix_k + the ring's dt sum, carry)."""
    def step(i, carry):
        sfx, acc = carry
        j = count - 1 - i
        dts = tuple(dt_of(j) for dt_of in ring_dts)
        s = tuple(d * jnp.exp(ak * sk) for d, ak, sk in zip(dts, a, sfx, strict=True))
        return tuple(sk + d for sk, d in zip(sfx, dts)), body(j, s, acc)
    return lax.fori_loop(0, count, step, (tuple(suffix), init))


def _fold(tile, rb_smem, bv_smem, xs, dts, decays, walk, ring_rows, out_smem, live, *, block_n,
          num_stages):
    """The fold: S0 <- decay S0 + dt x B^T + sum_j s_j x_j B_j^T over the committed ring
    entries j, for the CTA's state tile [heads, 64, N] in GMEM, chunk by chunk, as fp32 rank-1
    updates. rb_smem: the group's ring B [L, N] (SMEM); bv_smem: the folded token's B [N]
    (SMEM); per head (tuples) xs [64] ROW, dts, decays: the folded token; ring_rows: readers
    j -> ring x_j [64]; walk: `_walk` bound to the ring."""
    N = bv_smem.shape[0]
    spec = state_spec(tile.dtype, block_n, tile.shape[1], lead=tile.shape[:1])

    def fold_chunk(idx, s_smem):
        (n,) = idx
        bv = chunk(bv_smem, n, block_n)
        ups = []
        for k, (x, dt, decay) in enumerate(zip(xs, dts, decays, strict=True)):
            s = s_smem.at[k][...].astype(F32)
            ups.append(decay * s + rows(dt * x, s.shape) * cols(bv, s.shape))

        def entry(j, sj, acc):
            bj = chunk(rb_smem.at[j], n, block_n)
            return tuple(u + rows(sjk * ring_row(j), u.shape) * cols(bj, u.shape)
                         for u, sjk, ring_row in zip(acc, sj, ring_rows, strict=True))
        write_chunk(walk(entry, tuple(ups), suffix=dts)[1], n, out_smem, tile, block_n, live)

    plgpu.emit_pipeline(
        fold_chunk, grid=(N // block_n,), in_specs=[spec], max_concurrent_steps=num_stages,
    )(tile)


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every live row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, state_ref, y_ref,
                     x_smem, bv_smem, cv_smem, out_smem, bars, *, heads_per_group, heads,
                     block_n, num_stages):
    b, h0, g, t = _position(heads_per_group, heads)
    ps = rows_box(t)
    hs = range(heads)
    N = b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    load_all(bars, *((x_ref.at[b, h0 + k, ps], x_smem.at[k]) for k in hs),
             (b_ref.at[b, g], bv_smem), (c_ref.at[b, g], cv_smem))
    xs = [plgpu.load(x_smem.at[k], layout=ROW).astype(F32) for k in hs]
    dts = [dt_ref[b, h0 + k] for k in hs]
    das = [jnp.exp(dt * a_ref[h0 + k]) for k, dt in enumerate(dts)]
    dtxs = [dt * x for dt, x in zip(dts, xs)]
    tile = state_ref.at[pl.ds(slot * x_ref.shape[1] + h0, heads), ps]  # [heads, 64, N], GMEM

    def step(idx, s_smem, ys):
        (n,) = idx
        bv, cv = chunk(bv_smem, n, block_n), chunk(cv_smem, n, block_n)
        news, out = [], []
        for k, y in enumerate(ys):
            s = s_smem.at[k][...].astype(F32)                         # [64, bn]
            s = das[k] * s + rows(dtxs[k], s.shape) * cols(bv, s.shape)
            news.append(s)
            out.append(y + jnp.sum(s * cols(cv, s.shape), axis=1))
        write_chunk(tuple(news), n, out_smem, tile, block_n, live)   # never the null slot
        return tuple(out)

    ys = plgpu.emit_pipeline(
        step, grid=(N // block_n,), in_specs=[state_spec(state_ref.dtype, block_n, lead=(heads,))],
        max_concurrent_steps=num_stages, init_carry=(zeros_row(),) * heads,
    )(tile)
    for k, y in enumerate(ys):
        write_out(y + d_ref[h0 + k] * xs[k], live, x_smem.at[k], y_ref.at[b, h0 + k], t)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("heads", "block_n", "num_stages", "interpret"))
def _standard_decode(state, x, B, C, dt, A, D, slots, *, heads, block_n, num_stages, interpret):
    batch, H, P = x.shape
    G = B.shape[1]
    kernel = functools.partial(_standard_kernel, heads_per_group=H // G, heads=heads,
                               block_n=block_n, num_stages=num_stages)
    (y,), (flat,) = mosaic_call(
        kernel, name="mamba2_standard_decode_mgpu", grid=(batch, H // heads, tile_rows_of(P)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt, a_ref=A, d_ref=D,
                    state_ref=_heads_flat(state)),
        outputs=dict(y_ref=like(x)),
        inplace=("state_ref",),
        scratch=dict(x_smem=plgpu.SMEM((heads, TILE_ROWS), x.dtype),
                     bv_smem=plgpu.SMEM(B.shape[2:], B.dtype),
                     cv_smem=plgpu.SMEM(C.shape[2:], C.dtype),
                     out_smem=staging_smem(block_n, state.dtype, lead=(heads,)),
                     bars=plgpu.Barrier(num_barriers=heads + 2)),
        interpret=interpret)
    return y, flat.reshape(state.shape)


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): y from checkpoint + ring + current token, state written on folds.
# --------------------------------------------------------------------------------------------
def _replay_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcc_ref, s_ref, rx_ref, rb_ref, rdt_ref, y_ref, vec_smem, rx_smem, c32_smem,
                   bars, fold_bar, *, vectors, heads_per_group, heads, block_n, num_stages,
                   prologue, fold_stages, fold_buffers, readout, ring_block):
    b, h0, g, t = _position(heads_per_group, heads)
    v = vectors.views(vec_smem)
    R = v.x[0].shape[0]                                   # the CTA's P rows a head: 64 or 128
    ps = rows_box(t, R)
    hs = range(heads)
    L, N = rx_ref.shape[2], b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    dts = tuple(dt_ref[b, h0 + k] for k in hs)
    a = tuple(a_ref[h0 + k] for k in hs)
    # The walk's scalars: per head the ring's dt [L], and the group's B_j . C [L] (whole:
    # entries >= c are not read; the append's dt write at c, by another P tile's CTA, lands in
    # an entry no walk reads).
    walk_copies, (*ring_dts, ring_bc) = scalar_vectors(
        *((rdt_ref.at[slot, h0 + k], v.ring_dt[k]) for k in hs), (bcr_ref.at[b, g], v.ring_bc))
    # C first (the overlapped readout waits for it alone), then the token's x and B, the ring's
    # x rows and the walk's scalars, all in flight at once.
    copies = ((c_ref.at[b, g], v.c), *((x_ref.at[b, h0 + k, ps], v.x[k]) for k in hs),
              (b_ref.at[b, g], v.b), *_ring_x_copies(rx_ref, rx_smem, slot, h0, ps, c,
                                                     ring_block), *walk_copies)
    ring_rows = tuple(
        (lambda j, k=k: plgpu.load(rx_smem.at[k, j], layout=ROW).astype(F32)) for k in hs)
    walk = functools.partial(_walk, count=c, ring_dts=ring_dts, a=a)

    def landed_part():
        """Per head x [64], the decay and y's part from the ring and the token: what needs the
        copies landed, the readout aside. y = decay S0 C + sum_j s_j (B_j . C) x_j + D x, the
        current token with s = dt."""
        xs = tuple(plgpu.load(v.x[k], layout=ROW).astype(F32) for k in hs)

        def entry(j, sj, acc):
            return tuple(y + (sjk * ring_bc(j)) * ring_row(j)
                         for y, sjk, ring_row in zip(acc, sj, ring_rows))
        bcc = bcc_ref[b, g]
        totals, y_ring = walk(entry, tuple((dt * bcc) * x for dt, x in zip(dts, xs)),
                              suffix=dts)
        return xs, tuple(jnp.exp(ak * tk) for ak, tk in zip(a, totals)), y_ring

    overlap = prologue == "overlap"
    if overlap:                   # the state stream first; the readout waits for C
        landed = issue_all(bars, *copies)
    else:
        load_all(bars, *copies)
        xs, decays, y_ring = landed_part()
    tile = s_ref.at[pl.ds(slot * x_ref.shape[1] + h0, heads), ps]    # [heads, 64, N], GMEM

    layout = rows_layout(R) if readout == "fma_rows" else None
    c_vec = v.c if c32_smem is None else c32_smem

    def readout_step(idx, s_smem, acc):
        (n,) = idx
        if overlap:
            wait_on_first_step(n, landed[:1])               # copy 0: C
        if c32_smem is not None:                            # C's fp32 copy, once
            @pl.when(n == 0)
            def _():
                c32_smem[...] = v.c[...].astype(F32)
        ss = [(s_smem.at[k][...] if layout is None else
               plgpu.load(s_smem.at[k], layout=layout)).astype(F32) for k in hs]
        # The pipeline's next TMA into this stage's buffers must follow these reads (an
        # input-only pipeline has no fence of its own; the interpreter flags the race); the
        # warpgroup's barrier also orders C's conversion before the reads below.
        plgpu.commit_smem()
        if layout is not None:                              # the row sums after the stream
            return tuple(fma_rows(y, s, c_vec, n, block_n) for y, s in zip(acc, ss))
        cv = chunk(c_vec, n, block_n)
        return tuple(y + jnp.sum(s * cols(cv, s.shape), axis=1) for y, s in zip(acc, ss))

    s0c = plgpu.emit_pipeline(
        readout_step, grid=(N // block_n,),
        in_specs=[state_spec(s_ref.dtype, block_n, R, lead=(heads,))],
        max_concurrent_steps=num_stages,
        init_carry=((zeros_row(tile_rows=R) if layout is None else zeros_rows(R)),) * heads,
    )(tile)
    if layout is not None:
        s0c = relayout_rows(tuple(jnp.sum(acc, axis=1) for acc in s0c))
    if overlap:                   # the rest landed while the state streamed: now the walk
        wait_all(landed[1:])
        xs, decays, y_ring = landed_part()
    for k in hs:
        write_out(decays[k] * s0c[k] + y_ring[k] + d_ref[h0 + k] * xs[k], live, v.x[k],
                  y_ref.at[b, h0 + k], t)

    # Fold (one step in L): S0 <- decay S0 + X^T diag(s) B, chunk by chunk, rank-1 updates.
    fold = c == L - 1

    def folded(rb_smem, out_smem):
        load_all(fold_bar, (rb_ref.at[slot, g], rb_smem))
        _fold(tile, rb_smem, v.b, xs, dts, decays, walk, ring_rows, out_smem, live,
              block_n=block_n, num_stages=fold_stages)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)    # the staging leaves with the scope

    # The fold's SMEM in its own scope, over the read-only pipeline's (done and fenced).
    pl.when(live & fold)(lambda: pl.run_scoped(
        folded, plgpu.SMEM((L, N), rb_ref.dtype),
        staging_smem(block_n, s_ref.dtype, fold_buffers, R, lead=(heads,))))

    # Otherwise append the current token at `c`. The fold reads all L ring B rows, and rows < c
    # are the only ones the other CTAs of the group read otherwise: no CTA writes a row another
    # one reads.
    @pl.when(live & ~fold)
    def _append():
        for k in hs:
            store_rows(xs[k], v.ring_x[k], rx_ref.at[slot, h0 + k, c], t)

        @pl.when(t == 0)
        def _():
            for k in hs:
                rdt_ref[slot, h0 + k, c] = dts[k]

            @pl.when(h0 % heads_per_group == 0)
            def _():
                store_async(plgpu.load(v.b, layout=COL), v.ring_b, rb_ref.at[slot, g, c])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("heads", "block_n", "num_stages", "prologue",
                                             "fold_stages", "fold_buffers", "products",
                                             "readout", "ring_block", "tile_rows",
                                             "interpret"))
def _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, heads, block_n, num_stages,
                   prologue, fold_stages, fold_buffers, products, readout, ring_block,
                   tile_rows, interpret):
    batch, H, P = x.shape
    G, N = B.shape[1:]
    L = buffers.window
    # Per-group B . C products (ring x current, current x current): tiny next to the state.
    bc_ring, bc_cur = bc_products(buffers.ring_b, slots, B[:, None], C[:, None], by=products,
                                  counts=counts, interpret=bool(interpret))
    bc_ring, bc_cur = bc_ring[:, :, 0], bc_cur[:, :, 0, 0]          # [b, G, L], [b, G]
    ring_dtype = buffers.ring_x.dtype
    vectors = VectorPack.of(x=((heads, tile_rows), x.dtype), b=(N, B.dtype), c=(N, C.dtype),
                            ring_x=((heads, tile_rows), ring_dtype), ring_b=(N, ring_dtype),
                            ring_dt=((heads, L), F32), ring_bc=(L, F32))
    kernel = functools.partial(_replay_kernel, vectors=vectors, heads_per_group=H // G,
                               heads=heads, block_n=block_n, num_stages=num_stages,
                               prologue=prologue, fold_stages=fold_stages,
                               fold_buffers=fold_buffers, readout=readout,
                               ring_block=ring_block)
    (y,), new = mosaic_call(
        kernel, name="mamba2_replay_decode_mgpu",
        grid=(batch, H // heads, tile_rows_of(P, tile_rows)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcc_ref=bc_cur,
                    s_ref=_heads_flat(buffers.checkpoint), rx_ref=buffers.ring_x,
                    rb_ref=buffers.ring_b,
                    rdt_ref=buffers.ring_dt),
        outputs=dict(y_ref=like(x)),
        inplace=("s_ref", "rx_ref", "rb_ref", "rdt_ref"),
        scratch=dict(vec_smem=vectors.smem(),
                     rx_smem=plgpu.SMEM((heads, L, tile_rows), ring_dtype),
                     c32_smem=plgpu.SMEM((N,), F32)
                     if readout == "fma_rows" and C.dtype != F32 else None,
                     bars=plgpu.Barrier(num_barriers=2 * heads + 3
                                        + ring_copies_count(L, ring_block, heads)),
                     fold_bar=plgpu.Barrier(num_barriers=1)),
        interpret=interpret)
    return y, type(buffers)(new[0].reshape(buffers.checkpoint.shape), *new[1:])


# --------------------------------------------------------------------------------------------
# ReplaySSM verify (T window tokens): y for every window token, causally, from checkpoint +
# committed ring + window; folds ring[0:c] + window[0] into the checkpoint when c + T >= L. The
# ring's B and dt are written after the kernel (`write_window`), as the Triton verify does: the
# fold reads ring rows the window overwrites, in other CTAs of the same group (the x rows are
# each CTA's own: ring_write="kernel" writes them here).
# --------------------------------------------------------------------------------------------
def _verify_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcw_ref, s_ref, rx_ref, rb_ref, rdt_ref, y_ref, vec_smem, rx_smem, bars,
                   fold_bars, *, vectors, heads_per_group, heads, block_n, num_stages, prologue,
                   write_ring, fold_stages, fold_buffers, ring_block):
    # The checkpoint tile is streamed once for all T tokens (T mat-vecs S0 C_t per chunk); the
    # B . C products (ring x window, window x window) are per group and come precomputed.
    b, h0, g, pt = _position(heads_per_group, heads)
    ps = rows_box(pt)
    hs = range(heads)
    v = vectors.views(vec_smem)
    T, L, N = x_ref.shape[1], rx_ref.shape[2], c_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    a = tuple(a_ref[h0 + k] for k in hs)
    dts = [[dt_ref[b, t, h0 + k] for k in hs] for t in range(T)]          # [T][heads]
    # The walk's scalars: per head the ring's dt [L], and the group's B_j . C_t [T * L]
    # (t-major).
    walk_copies, (*ring_dts, ring_bc) = scalar_vectors(
        *((rdt_ref.at[slot, h0 + k], v.ring_dt[k]) for k in hs), (bcr_ref.at[b, g], v.ring_bc))
    # The window's C rows first (the overlapped readout waits for them alone), then its x rows
    # (one 1-D copy each, into the pack: x of token t and head k at v.x[t * heads + k]), the
    # ring's x rows [heads, L, 64] and the walk's scalars.
    copies = (*((c_ref.at[b, t, g], v.c[t]) for t in range(T)),
              *((x_ref.at[b, t, h0 + k, ps], v.x[t * heads + k]) for t in range(T) for k in hs),
              *_ring_x_copies(rx_ref, rx_smem, slot, h0, ps, c, ring_block), *walk_copies)
    ring_rows = tuple(
        (lambda j, k=k: plgpu.load(rx_smem.at[k, j], layout=ROW).astype(F32)) for k in hs)
    walk = functools.partial(_walk, count=c, ring_dts=ring_dts, a=a)

    # Ring history at the window start: sum_j s_j (B_j . C_t) x_j per token t and head k, one
    # walk (acc[t][k]).
    def entry(j, sj, acc):
        xj = [ring_row(j) for ring_row in ring_rows]
        return tuple(tuple(acc_tk + (sj[k] * ring_bc(t * L + j)) * xj[k]
                           for k, acc_tk in enumerate(acc_t)) for t, acc_t in enumerate(acc))

    def landed_part():
        """The x_t per head, the ring's dt sums, its decays and history terms (as the
        decode's)."""
        xs = [[plgpu.load(v.x[t * heads + k], layout=ROW).astype(F32) for k in hs]
              for t in range(T)]
        hist_dt, y_hist = walk(entry, ((zeros_row(),) * heads,) * T,
                               suffix=(jnp.zeros((), F32),) * heads)
        return xs, hist_dt, [jnp.exp(ak * hk) for ak, hk in zip(a, hist_dt)], y_hist

    overlap = prologue == "overlap"
    if overlap:                   # as the decode: the readout waits for the C_t
        landed = issue_all(bars, *copies)
    else:
        load_all(bars, *copies)
        xs, hist_dt, decay_hist, y_hist = landed_part()
    tile = s_ref.at[pl.ds(slot * x_ref.shape[2] + h0, heads), ps]    # [heads, 64, N], GMEM

    def readout(idx, s_smem, acc):
        (n,) = idx
        if overlap:
            wait_on_first_step(n, landed[:T])               # the C_t
        ss = [s_smem.at[k][...].astype(F32) for k in hs]
        plgpu.commit_smem()                  # as in the decode readout: fence the next TMA
        cvs = [chunk(v.c[t], n, block_n) for t in range(T)]
        return tuple(tuple(acc_tk + jnp.sum(s * cols(cv, s.shape), axis=1)
                           for acc_tk, s in zip(acc_t, ss)) for acc_t, cv in zip(acc, cvs))

    s0c = plgpu.emit_pipeline(
        readout, grid=(N // block_n,), in_specs=[state_spec(s_ref.dtype, block_n, lead=(heads,))],
        max_concurrent_steps=num_stages, init_carry=((zeros_row(),) * heads,) * T,
    )(tile)
    if overlap:                   # the rest, then the walk
        wait_all(landed[T:])
        xs, hist_dt, decay_hist, y_hist = landed_part()

    # y_t = exp(A cum_t) (decay_hist S0 C_t + history_t) + sum_{r<=t} dt_r exp(A (cum_t - cum_r))
    #       (B_r . C_t) x_r + D x_t, with cum_t = sum_{r<=t} dt_r (per head).
    for k in hs:
        cum = list(itertools.accumulate(dts[t][k] for t in range(T)))
        for t in range(T):
            y = (jnp.exp(a[k] * cum[t]) * (decay_hist[k] * s0c[t][k] + y_hist[t][k])
                 + d_ref[h0 + k] * xs[t][k])
            for r in range(t + 1):
                y = y + (dts[r][k] * jnp.exp(a[k] * (cum[t] - cum[r])) * bcw_ref[b, g, r, t]
                         ) * xs[r][k]
            write_out(y, live, v.x[t * heads + k], y_ref.at[b, t, h0 + k], pt)   # x in regs

    # Fold ring[0:c] + window[0] (always accepted) when the window would fill the ring, its
    # SMEM in its own scope over the readout's (as the decode's fold).
    def folded(rb_smem, out_smem):
        load_all(fold_bars, (rb_ref.at[slot, g], rb_smem), (b_ref.at[b, 0, g], v.b))
        _fold(tile, rb_smem, v.b, xs[0], dts[0],
              [jnp.exp(ak * (hk + d)) for ak, hk, d in zip(a, hist_dt, dts[0])], walk,
              ring_rows, out_smem, live, block_n=block_n, num_stages=fold_stages)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)    # the staging leaves with the scope

    pl.when(live & verify_folds(c, T, L))(lambda: pl.run_scoped(
        folded, plgpu.SMEM((L, N), rb_ref.dtype),
        staging_smem(block_n, s_ref.dtype, fold_buffers, lead=(heads,))))

    if write_ring:      # the window's x into the ring: this CTA's own rows, read (landed) above
        for t, pos in enumerate(window_positions(c, T, L)):
            @pl.when(live & (pos >= 0))
            def _(t=t, pos=pos):
                for k in hs:
                    store_rows(xs[t][k], v.ring_x[t * heads + k], rx_ref.at[slot, h0 + k, pos],
                               pt)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("heads", "block_n", "num_stages", "prologue",
                                             "ring_write", "fold_stages", "fold_buffers",
                                             "products", "ring_block", "interpret"))
def _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, heads, block_n, num_stages,
                   prologue, ring_write, fold_stages, fold_buffers, products, ring_block,
                   interpret):
    """Window inputs x [b, T, H, P], B, C [b, T, G, N], dt [b, T, H]. Returns y [b, T, H, P],
    the checkpoint pool (folded rows updated) and the ring_x pool (with the window's x if
    ring_write is "kernel", else as it was; B and dt are not written)."""
    batch, T, H, P = x.shape
    G, N = B.shape[2:]
    L = buffers.window
    bc_ring, bc_win = bc_products(buffers.ring_b, slots, B, C, by=products,  # [b, G, T, L],
                                  counts=counts, interpret=bool(interpret))  # [b, G, T, T]
    bc_ring = bc_ring.reshape(batch, G, T * L)
    write_ring = ring_write == "kernel"
    ring_dtype = buffers.ring_x.dtype
    rows_x = (T * heads, TILE_ROWS)
    vectors = VectorPack.of(x=(rows_x, x.dtype), c=((T, N), C.dtype), b=(N, B.dtype),
                            ring_dt=((heads, L), F32), ring_bc=(T * L, F32),
                            **({"ring_x": (rows_x, ring_dtype)} if write_ring else {}))
    kernel = functools.partial(_verify_kernel, vectors=vectors, heads_per_group=H // G,
                               heads=heads, block_n=block_n, num_stages=num_stages,
                               prologue=prologue, write_ring=write_ring,
                               fold_stages=fold_stages, fold_buffers=fold_buffers,
                               ring_block=ring_block)
    (y,), new = mosaic_call(
        kernel, name="mamba2_replay_verify_mgpu", grid=(batch, H // heads, tile_rows_of(P)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcw_ref=bc_win,
                    s_ref=_heads_flat(buffers.checkpoint), rx_ref=buffers.ring_x,
                    rb_ref=buffers.ring_b,
                    rdt_ref=buffers.ring_dt),
        outputs=dict(y_ref=like(x)),
        inplace=("s_ref", "rx_ref") if write_ring else ("s_ref",),
        scratch=dict(vec_smem=vectors.smem(),
                     rx_smem=plgpu.SMEM((heads, L, TILE_ROWS), ring_dtype),
                     bars=plgpu.Barrier(num_barriers=(heads + 1) * T + heads + 1
                                        + ring_copies_count(L, ring_block, heads)),
                     fold_bars=plgpu.Barrier(num_barriers=2)),
        interpret=interpret)
    new = (new[0].reshape(buffers.checkpoint.shape), *new[1:])
    return (y, *new) if write_ring else (y, *new, buffers.ring_x)
