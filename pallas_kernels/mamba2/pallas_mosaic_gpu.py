"""Mosaic GPU kernels for Mamba-2 (`impl="pallas_mosaic_gpu"`): the standard step, the ReplaySSM
step with its fold, and ReplaySSM verify (T window tokens). The state-per-draft baseline verify
runs on the other backends.

Grid (batch, H, ceil(P / 64)): one CTA (one warpgroup) per (row, head, 64-row P tile; the last
one ragged where 64 does not divide P, `tile_rows_of`). The slot read from `slots` picks the
pool rows the TMA copies (`ref.at[slot, h]`); the state tile [64, N] streams through shared
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
    chunk,
    cols,
    issue_all,
    load_all,
    measured_tiling,
    mosaic_call,
    resolve_tiles,
    rows,
    rows_box,
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
)
from pallas_kernels.mamba2.buffers import bc_products, write_window
from pallas_kernels.mamba2.pallas_triton import decode_bc_products
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, verify_folds, window_positions
from pallas_kernels.validation import check_choice, for_window, resolve_tiling

GRID_NAMES = ("row", "head", "ptile")


@dataclasses.dataclass(frozen=True)
class Mamba2MosaicTiling:
    """Launch configuration of the Mosaic GPU kernels: block_n bounds the d_state chunk streamed
    per pipeline step (the largest power of two dividing N up to it: at least 8, and 16 for a bf16
    state), num_stages the chunks in flight. The P tile is one warpgroup's 64 rows. prologue
    (replay decode and verify; the standard kernel has no walk): "serial" lands the CTA's
    vectors and walks the ring before the checkpoint stream starts, "overlap" starts the stream
    at once and walks after it (module docstring; the same sums). ring_write (verify): who
    writes the window's x into the ring (`validation.RING_WRITES`): "xla" after the kernel, or
    "kernel" (each CTA its own [T, 64] rows; B and dt stay XLA's). bc_products (replay
    decode): what forms the B . C products before the launch (`BC_PRODUCTS`): "xla"
    (`buffers.bc_products`) or "pallas" (`pallas_triton.decode_bc_products`, one launch).
    fold_stages, fold_buffers (replay decode): the fold's chunks in flight (0: num_stages) and
    its write-back's staging buffers (2 or 1). The fold's SMEM (the group's ring B, the
    staging, its pipeline) is allocated in the fold's own scope, over the read-only pass's: the
    kernel's peak SMEM is the larger of the two passes', so a leaner fold lets the read-only
    pass keep more chunks in flight at the same CTAs an SM."""
    block_n: int
    num_stages: int = 2
    prologue: str = "serial"
    ring_write: str = "xla"
    bc_products: str = "xla"
    fold_stages: int = 0
    fold_buffers: int = 2


BC_PRODUCTS = ("xla", "pallas")


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
MOSAIC_REPLAY_TILING = Mamba2MosaicTiling(block_n=32, prologue="overlap", bc_products="pallas")
MOSAIC_VERIFY_TILING = Mamba2MosaicTiling(block_n=32)
MOSAIC_VERIFY_TILINGS = ((MAX_VERIFY_TOKENS, MOSAIC_VERIFY_TILING),)     # one for every window
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
# Longer windows keep the Triton verify (eleventh session, batch 256, T = 8: 1,260 vs 1,321 us,
# 1,254 vs 1,314 in another run; T = 2 / 4: Mosaic 372 / 547 vs 383 / 588).
AUTO_MAX_WINDOW = {"replay_verify": 4}
# At P = 80 (Nemotron-Nano-9B-v2: a 64-row tile and a ragged one of 16; fifteenth session)
# the Mosaic verify wins from where the Triton one falls off: T = 4 from 128 rows (518.1 vs
# 666.3 us; 1,003.6 vs 1,272.1 at 256: 1.95x the state-per-draft baseline against 1.54x),
# T = 2 at 256 (614.0 vs 632.5); Triton wins below (T = 4 at 64: 257.3 vs 271.3; T = 2 at
# 128: 290.7 vs 319.8). Its replay decode tied (543.5 vs 539.4 us staggered, batch 256) and
# its standard lost (792.2 vs 682.9), so those stay on Triton there. The least batch by window
# ((largest T, rows), ...).
AUTO_RAGGED_MIN_BATCH = {"replay_verify": ((2, 256), (MAX_VERIFY_TOKENS, 128))}
_MAX_N = 256                      # one TMA box per B / C vector


def _tiles(tiling, default, N, state_dtype, verify=False, fold=False):
    return resolve_tiles(tiling, default, field="block_n", chunk=("d_state N", N),
                         max_chunk=_MAX_N, state_dtype=state_dtype, verify=verify, fold=fold)


def takes(op, args) -> bool:
    """Whether impl="auto" runs op's Mosaic kernel on sm90 for the op's (validated) `args`: a
    measured winner (`AUTO_OPS`) at the batch and window it won (`AUTO_MIN_BATCH`,
    `AUTO_MAX_WINDOW`) whose default tiling takes their shapes (N <= 256), at whole P tiles
    (P a multiple of 64) or, for the ops that also won there, a ragged last one
    (Nemotron-Nano-9B-v2's P = 80) at the batches it won (`AUTO_RAGGED_MIN_BATCH`)."""
    state = args[0] if op == "standard_decode" else args[0].checkpoint
    x, B = args[1:3] if op == "standard_decode" else args[2:4]
    T = x.shape[1] if op == "replay_verify" else 1
    if x.shape[-1] % TILE_ROWS and op in AUTO_RAGGED_MIN_BATCH:
        min_batch = for_window(AUTO_RAGGED_MIN_BATCH[op], T)
    else:
        min_batch = AUTO_MIN_BATCH.get(op, 1)
    if x.shape[0] < min_batch:
        return False
    if T > AUTO_MAX_WINDOW.get(op, T):
        return False
    return auto_takes(op, AUTO_OPS, x.shape[-1], lambda: _tiles(
        None, measured_tiling(_DEFAULT_TILING, op, T), B.shape[-1], state.dtype),
        ragged_ops=AUTO_RAGGED_MIN_BATCH.keys())


def standard_decode(state, x, B, C, dt, A, D, slots, *, tiling, interpret):
    tiles = _tiles(tiling, MOSAIC_STANDARD_TILING, B.shape[2], state.dtype)
    return _standard_decode(state, x, B, C, dt, A, D, slots, interpret=interpret,
                            block_n=tiles["block_n"], num_stages=tiles["num_stages"])


def replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    products = resolve_tiling(tiling, MOSAIC_REPLAY_TILING).bc_products
    check_choice("bc_products", products, BC_PRODUCTS)
    return _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                          bc_kernel=products == "pallas",
                          **_tiles(tiling, MOSAIC_REPLAY_TILING, B.shape[2],
                                   buffers.checkpoint.dtype, fold=True))


def replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    default = measured_tiling(_DEFAULT_TILING, "replay_verify", x.shape[1])
    tiles = _tiles(tiling, default, B.shape[3], buffers.checkpoint.dtype, verify=True)
    y, ck, rx = _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                               **tiles)
    in_kernel = tiles["ring_write"] == "kernel"
    return y, write_window(buffers._replace(checkpoint=ck, ring_x=rx), counts, slots,
                           None if in_kernel else x, B, dt)


def _position(heads_per_group):
    """(row b, head h, group g, P tile t) of this CTA."""
    b, h, t = (lax.axis_index(n) for n in GRID_NAMES)
    return b, h, h // heads_per_group, t


def _walk(body, init, *, count, ring_dt, a, suffix):
    """Folds body(j, s_j, carry) over the committed ring entries j = count-1 .. 0 (newest first;
    entries past the count are never read) with s_j = dt_j exp(A (suffix + sum_{j<i<count} dt_i)):
    `suffix` is the dt sum of the tokens after the ring. ring_dt(j) reads entry j's dt. Returns
    (suffix + the ring's dt sum, carry)."""
    def step(k, carry):
        sfx, acc = carry
        j = count - 1 - k
        dtj = ring_dt(j)
        return sfx + dtj, body(j, dtj * jnp.exp(a * sfx), acc)
    return lax.fori_loop(0, count, step, (suffix, init))


def _fold(tile, rb_smem, bv_smem, x, dt, decay, walk, ring_row, out_smem, live, *, block_n,
          num_stages):
    """The fold: S0 <- decay S0 + dt x B^T + sum_j s_j x_j B_j^T over the committed ring
    entries j, for the state tile [64, N] in GMEM, chunk by chunk, as fp32 rank-1 updates.
    rb_smem: the group's ring B [L, N] (SMEM); bv_smem: the folded token's B [N] (SMEM); x [64]
    ROW and dt: the folded token; walk: `_walk` bound to the ring with suffix dt."""
    N = bv_smem.shape[0]

    def fold_chunk(idx, s_smem):
        (n,) = idx
        s = s_smem[...].astype(F32)
        upd = decay * s + rows(dt * x, s.shape) * cols(chunk(bv_smem, n, block_n), s.shape)

        def entry(j, sj, acc):
            bj = chunk(rb_smem.at[j], n, block_n)
            return acc + rows(sj * ring_row(j), s.shape) * cols(bj, s.shape)
        write_chunk(walk(entry, upd, suffix=dt)[1], n, out_smem, tile, block_n, live)

    plgpu.emit_pipeline(
        fold_chunk, grid=(N // block_n,), in_specs=[state_spec(tile.dtype, block_n)],
        max_concurrent_steps=num_stages,
    )(tile)


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every live row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, state_ref, y_ref,
                     x_smem, bv_smem, cv_smem, out_smem, bars, *, heads_per_group, block_n,
                     num_stages):
    b, h, g, t = _position(heads_per_group)
    ps = rows_box(t)
    N = b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    load_all(bars, (x_ref.at[b, h, ps], x_smem), (b_ref.at[b, g], bv_smem),
             (c_ref.at[b, g], cv_smem))
    x = plgpu.load(x_smem, layout=ROW).astype(F32)
    dt = dt_ref[b, h]
    da, dtx = jnp.exp(dt * a_ref[h]), dt * x
    tile = state_ref.at[slot, h, ps]                                  # [64, N] in GMEM

    def step(idx, s_smem, y):
        (n,) = idx
        s = s_smem[...].astype(F32)                                   # [64, bn]
        s = da * s + rows(dtx, s.shape) * cols(chunk(bv_smem, n, block_n), s.shape)
        write_chunk(s, n, out_smem, tile, block_n, live)     # the null slot is never written
        return y + jnp.sum(s * cols(chunk(cv_smem, n, block_n), s.shape), axis=1)

    y = plgpu.emit_pipeline(
        step, grid=(N // block_n,), in_specs=[state_spec(state_ref.dtype, block_n)],
        max_concurrent_steps=num_stages, init_carry=zeros_row(),
    )(tile)
    write_out(y + d_ref[h] * x, live, x_smem, y_ref.at[b, h], t)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_n", "num_stages", "interpret"))
def _standard_decode(state, x, B, C, dt, A, D, slots, *, block_n, num_stages, interpret):
    batch, H, P = x.shape
    G = B.shape[1]
    kernel = functools.partial(_standard_kernel, heads_per_group=H // G, block_n=block_n,
                               num_stages=num_stages)
    (y,), (state,) = mosaic_call(
        kernel, name="mamba2_standard_decode_mgpu", grid=(batch, H, tile_rows_of(P)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt, a_ref=A, d_ref=D,
                    state_ref=state),
        outputs=dict(y_ref=like(x)),
        inplace=("state_ref",),
        scratch=dict(x_smem=plgpu.SMEM((TILE_ROWS,), x.dtype),
                     bv_smem=plgpu.SMEM(B.shape[2:], B.dtype),
                     cv_smem=plgpu.SMEM(C.shape[2:], C.dtype),
                     out_smem=staging_smem(block_n, state.dtype),
                     bars=plgpu.Barrier(num_barriers=3)),
        interpret=interpret)
    return y, state


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): y from checkpoint + ring + current token, state written on folds.
# --------------------------------------------------------------------------------------------
def _replay_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcc_ref, s_ref, rx_ref, rb_ref, rdt_ref, y_ref, vec_smem, rx_smem, bars,
                   fold_bar, *, vectors, heads_per_group, block_n, num_stages, prologue,
                   fold_stages, fold_buffers):
    b, h, g, t = _position(heads_per_group)
    ps = rows_box(t)
    v = vectors.views(vec_smem)
    L, N = rx_ref.shape[2], b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    dt, a = dt_ref[b, h], a_ref[h]
    # The walk's scalars: the ring's dt [L] and B_j . C [L] (whole: entries >= c are not read;
    # the append's dt write at c, by another P tile's CTA, lands in an entry no walk reads).
    walk_copies, (ring_dt, ring_bc) = scalar_vectors((rdt_ref.at[slot, h], v.ring_dt),
                                                     (bcr_ref.at[b, g], v.ring_bc))
    # The token's x, B, C, the ring's x rows and the walk's scalars, all in flight at once.
    copies = ((x_ref.at[b, h, ps], v.x), (rx_ref.at[slot, h, :, ps], rx_smem),
              (b_ref.at[b, g], v.b), (c_ref.at[b, g], v.c), *walk_copies)

    def ring_row(j):
        return plgpu.load(rx_smem.at[j], layout=ROW).astype(F32)

    walk = functools.partial(_walk, count=c, ring_dt=ring_dt, a=a)

    def landed_part():
        """x [64], the decay and y's part from the ring and the token: what needs the copies
        landed, the readout aside. y = decay S0 C + sum_j s_j (B_j . C) x_j + D x, the current
        token with s = dt."""
        x = plgpu.load(v.x, layout=ROW).astype(F32)
        total, y_ring = walk(lambda j, sj, acc: acc + (sj * ring_bc(j)) * ring_row(j),
                             (dt * bcc_ref[b, g]) * x, suffix=dt)
        return x, jnp.exp(a * total), y_ring

    overlap = prologue == "overlap"
    if overlap:                   # the state stream first; the readout waits for C
        landed = issue_all(bars, *copies)
    else:
        load_all(bars, *copies)
        x, decay, y_ring = landed_part()
    tile = s_ref.at[slot, h, ps]                                      # [64, N] in GMEM

    def readout(idx, s_smem, acc):
        (n,) = idx
        if overlap:
            wait_on_first_step(n, landed[3:4])              # copy 3: C
        s = s_smem[...].astype(F32)
        # The pipeline's next TMA into this stage's buffers must follow these reads (an
        # input-only pipeline has no fence of its own; the interpreter flags the race).
        plgpu.commit_smem()
        return acc + jnp.sum(s * cols(chunk(v.c, n, block_n), s.shape), axis=1)

    s0c = plgpu.emit_pipeline(
        readout, grid=(N // block_n,), in_specs=[state_spec(s_ref.dtype, block_n)],
        max_concurrent_steps=num_stages, init_carry=zeros_row(),
    )(tile)
    if overlap:                   # the rest landed while the state streamed: now the walk
        wait_all(landed[:3] + landed[4:])
        x, decay, y_ring = landed_part()
    write_out(decay * s0c + y_ring + d_ref[h] * x, live, v.x, y_ref.at[b, h], t)

    # Fold (one step in L): S0 <- decay S0 + X^T diag(s) B, chunk by chunk, rank-1 updates.
    fold = c == L - 1

    def folded(rb_smem, out_smem):
        load_all(fold_bar, (rb_ref.at[slot, g], rb_smem))
        _fold(tile, rb_smem, v.b, x, dt, decay, walk, ring_row, out_smem, live,
              block_n=block_n, num_stages=fold_stages)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)    # the staging leaves with the scope

    # The fold's SMEM in its own scope, over the read-only pipeline's (done and fenced).
    pl.when(live & fold)(lambda: pl.run_scoped(
        folded, plgpu.SMEM((L, N), rb_ref.dtype),
        staging_smem(block_n, s_ref.dtype, fold_buffers)))

    # Otherwise append the current token at `c`. The fold reads all L ring B rows, and rows < c
    # are the only ones the other CTAs of the group read otherwise: no CTA writes a row another
    # one reads.
    @pl.when(live & ~fold)
    def _append():
        store_rows(x, v.ring_x, rx_ref.at[slot, h, c], t)

        @pl.when(t == 0)
        def _():
            rdt_ref[slot, h, c] = dt

            @pl.when(h % heads_per_group == 0)
            def _():
                store_async(plgpu.load(v.b, layout=COL), v.ring_b, rb_ref.at[slot, g, c])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_n", "num_stages", "prologue", "fold_stages",
                                             "fold_buffers", "bc_kernel", "interpret"))
def _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, block_n, num_stages, prologue,
                   fold_stages, fold_buffers, bc_kernel, interpret):
    batch, H, P = x.shape
    G, N = B.shape[1:]
    L = buffers.window
    # Per-group B . C products (ring x current, current x current): tiny next to the state.
    if bc_kernel:
        bc_ring, bc_cur = decode_bc_products(buffers.ring_b, slots, B, C,
                                             interpret=bool(interpret))
    else:
        bc_ring, bc_cur = bc_products(buffers.ring_b, slots, B[:, None], C[:, None])
        bc_ring, bc_cur = bc_ring[:, :, 0], bc_cur[:, :, 0, 0]      # [b, G, L], [b, G]
    ring_dtype = buffers.ring_x.dtype
    vectors = VectorPack.of(x=(TILE_ROWS, x.dtype), b=(N, B.dtype), c=(N, C.dtype),
                            ring_x=(TILE_ROWS, ring_dtype), ring_b=(N, ring_dtype),
                            ring_dt=(L, F32), ring_bc=(L, F32))
    kernel = functools.partial(_replay_kernel, vectors=vectors, heads_per_group=H // G,
                               block_n=block_n, num_stages=num_stages, prologue=prologue,
                               fold_stages=fold_stages, fold_buffers=fold_buffers)
    (y,), new = mosaic_call(
        kernel, name="mamba2_replay_decode_mgpu", grid=(batch, H, tile_rows_of(P)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcc_ref=bc_cur,
                    s_ref=buffers.checkpoint, rx_ref=buffers.ring_x, rb_ref=buffers.ring_b,
                    rdt_ref=buffers.ring_dt),
        outputs=dict(y_ref=like(x)),
        inplace=("s_ref", "rx_ref", "rb_ref", "rdt_ref"),
        scratch=dict(vec_smem=vectors.smem(),
                     rx_smem=plgpu.SMEM((L, TILE_ROWS), ring_dtype),
                     bars=plgpu.Barrier(num_barriers=6),
                     fold_bar=plgpu.Barrier(num_barriers=1)),
        interpret=interpret)
    return y, type(buffers)(*new)


# --------------------------------------------------------------------------------------------
# ReplaySSM verify (T window tokens): y for every window token, causally, from checkpoint +
# committed ring + window; folds ring[0:c] + window[0] into the checkpoint when c + T >= L. The
# ring's B and dt are written after the kernel (`write_window`), as the Triton verify does: the
# fold reads ring rows the window overwrites, in other CTAs of the same group (the x rows are
# each CTA's own: ring_write="kernel" writes them here).
# --------------------------------------------------------------------------------------------
def _verify_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcw_ref, s_ref, rx_ref, rb_ref, rdt_ref, y_ref, vec_smem, rx_smem, rb_smem,
                   out_smem, bars, fold_bars, *, vectors, heads_per_group, block_n,
                   num_stages, prologue, write_ring):
    # The checkpoint tile is streamed once for all T tokens (T mat-vecs S0 C_t per chunk); the
    # B . C products (ring x window, window x window) are per group and come precomputed.
    b, h, g, pt = _position(heads_per_group)
    ps = rows_box(pt)
    v = vectors.views(vec_smem)
    T, L, N = x_ref.shape[1], rx_ref.shape[2], c_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    a = a_ref[h]
    dts = [dt_ref[b, t, h] for t in range(T)]
    # The walk's scalars: the ring's dt [L] and B_j . C_t [T * L] (t-major).
    walk_copies, (ring_dt, ring_bc) = scalar_vectors((rdt_ref.at[slot, h], v.ring_dt),
                                                     (bcr_ref.at[b, g], v.ring_bc))
    # The window's x and C rows one 1-D copy each (into the pack, not a [T, n] buffer of its
    # own), the ring's x rows [L, 64] and the walk's scalars.
    copies = (*((x_ref.at[b, t, h, ps], v.x[t]) for t in range(T)),
              *((c_ref.at[b, t, g], v.c[t]) for t in range(T)),
              (rx_ref.at[slot, h, :, ps], rx_smem), *walk_copies)

    def ring_row(j):
        return plgpu.load(rx_smem.at[j], layout=ROW).astype(F32)

    walk = functools.partial(_walk, count=c, ring_dt=ring_dt, a=a)

    # Ring history at the window start: sum_j s_j (B_j . C_t) x_j per token t, one walk.
    def entry(j, sj, acc):
        xj = ring_row(j)
        return tuple(acc_t + (sj * ring_bc(t * L + j)) * xj for t, acc_t in enumerate(acc))

    def landed_part():
        """The x_t, the ring's dt sum, its decay and history terms (as the decode's)."""
        xs = [plgpu.load(v.x[t], layout=ROW).astype(F32) for t in range(T)]
        hist_dt, y_hist = walk(entry, (zeros_row(),) * T, suffix=jnp.zeros((), F32))
        return xs, hist_dt, jnp.exp(a * hist_dt), y_hist

    overlap = prologue == "overlap"
    if overlap:                   # as the decode: the readout waits for the C_t
        landed = issue_all(bars, *copies)
    else:
        load_all(bars, *copies)
        xs, hist_dt, decay_hist, y_hist = landed_part()
    tile = s_ref.at[slot, h, ps]                                      # [64, N] in GMEM

    def readout(idx, s_smem, acc):
        (n,) = idx
        if overlap:
            wait_on_first_step(n, landed[T:2 * T])          # the C_t
        s = s_smem[...].astype(F32)
        plgpu.commit_smem()                  # as in the decode readout: fence the next TMA
        return tuple(acc_t + jnp.sum(s * cols(chunk(v.c[t], n, block_n), s.shape), axis=1)
                     for t, acc_t in enumerate(acc))

    s0c = plgpu.emit_pipeline(
        readout, grid=(N // block_n,), in_specs=[state_spec(s_ref.dtype, block_n)],
        max_concurrent_steps=num_stages, init_carry=(zeros_row(),) * T,
    )(tile)
    if overlap:                   # the rest, then the walk
        wait_all(landed[:T] + landed[2 * T:])
        xs, hist_dt, decay_hist, y_hist = landed_part()

    # y_t = exp(A cum_t) (decay_hist S0 C_t + history_t) + sum_{r<=t} dt_r exp(A (cum_t - cum_r))
    #       (B_r . C_t) x_r + D x_t, with cum_t = sum_{r<=t} dt_r.
    cum = list(itertools.accumulate(dts))
    for t in range(T):
        y = jnp.exp(a * cum[t]) * (decay_hist * s0c[t] + y_hist[t]) + d_ref[h] * xs[t]
        for r in range(t + 1):
            y = y + (dts[r] * jnp.exp(a * (cum[t] - cum[r])) * bcw_ref[b, g, r, t]) * xs[r]
        write_out(y, live, v.x[t], y_ref.at[b, t, h], pt)     # x_t is in registers

    # Fold ring[0:c] + window[0] (always accepted) when the window would fill the ring.
    @pl.when(live & verify_folds(c, T, L))
    def _():
        load_all(fold_bars, (rb_ref.at[slot, g], rb_smem), (b_ref.at[b, 0, g], v.b))
        _fold(tile, rb_smem, v.b, xs[0], dts[0], jnp.exp(a * (hist_dt + dts[0])), walk,
              ring_row, out_smem, live, block_n=block_n, num_stages=num_stages)

    if write_ring:      # the window's x into the ring: this CTA's own rows, read (landed) above
        for t, pos in enumerate(window_positions(c, T, L)):
            @pl.when(live & (pos >= 0))
            def _(t=t, pos=pos):
                store_rows(xs[t], v.ring_x[t], rx_ref.at[slot, h, pos], pt)
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_n", "num_stages", "prologue", "ring_write",
                                             "interpret"))
def _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, block_n, num_stages, prologue,
                   ring_write, interpret):
    """Window inputs x [b, T, H, P], B, C [b, T, G, N], dt [b, T, H]. Returns y [b, T, H, P],
    the checkpoint pool (folded rows updated) and the ring_x pool (with the window's x if
    ring_write is "kernel", else as it was; B and dt are not written)."""
    batch, T, H, P = x.shape
    G, N = B.shape[2:]
    L = buffers.window
    bc_ring, bc_win = bc_products(buffers.ring_b, slots, B, C)        # [b, G, T, L], [b, G, T, T]
    bc_ring = bc_ring.reshape(batch, G, T * L)
    write_ring = ring_write == "kernel"
    ring_dtype = buffers.ring_x.dtype
    vectors = VectorPack.of(x=((T, TILE_ROWS), x.dtype), c=((T, N), C.dtype), b=(N, B.dtype),
                            ring_dt=(L, F32), ring_bc=(T * L, F32),
                            **({"ring_x": ((T, TILE_ROWS), ring_dtype)} if write_ring else {}))
    kernel = functools.partial(_verify_kernel, vectors=vectors, heads_per_group=H // G,
                               block_n=block_n, num_stages=num_stages, prologue=prologue,
                               write_ring=write_ring)
    (y,), new = mosaic_call(
        kernel, name="mamba2_replay_verify_mgpu", grid=(batch, H, tile_rows_of(P)),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcw_ref=bc_win,
                    s_ref=buffers.checkpoint, rx_ref=buffers.ring_x, rb_ref=buffers.ring_b,
                    rdt_ref=buffers.ring_dt),
        outputs=dict(y_ref=like(x)),
        inplace=("s_ref", "rx_ref") if write_ring else ("s_ref",),
        scratch=dict(vec_smem=vectors.smem(),
                     rx_smem=plgpu.SMEM((L, TILE_ROWS), ring_dtype),
                     rb_smem=plgpu.SMEM((L, N), buffers.ring_b.dtype),
                     out_smem=staging_smem(block_n, buffers.checkpoint.dtype),
                     bars=plgpu.Barrier(num_barriers=2 * T + 3),
                     fold_bars=plgpu.Barrier(num_barriers=2)),
        interpret=interpret)
    return (y, *new) if write_ring else (y, *new, buffers.ring_x)
