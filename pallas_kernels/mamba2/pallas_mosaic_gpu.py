"""Mosaic GPU kernels for Mamba-2 decode (`impl="pallas_mosaic_gpu"`): the standard step and the
ReplaySSM step with its fold. Verify runs on the other backends.

Grid (batch, H, P // 64): one CTA (one warpgroup) per (row, head, 64-row P tile). The slot read
from `slots` picks the pool rows the TMA copies (`ref.at[slot, h]`); the state tile [64, N]
streams through shared memory in chunks of block_n with `plgpu.emit_pipeline` (num_stages
copies in flight; chunks tiled and swizzled in SMEM) and is computed on in registers (WGMMA
layout, see `_mosaic_utils`). Updated chunks go back by TMA from a double-buffered SMEM
staging area, for live rows only (the null slot is never written).

Replay: the per-group products B_j . C (ring x current C) and B . C are computed by XLA before
the kernel (a [b, G, L] read of the ring's B: under 1% of the state traffic), so the kernel needs
no [L]-vectors: it walks the committed ring entries backwards (a loop of `count` steps; entries
past the count are never read), carrying the suffix sum of dt for s_j = dt_j exp(A sum_{i>j} dt_i).
The fold (one step in L) re-streams the checkpoint and adds X^T diag(s) B as rank-1 updates on
the FMA units, in fp32: a tf32 wgmma would lose the state's precision and a 3-pass tf32 split
is not worth it for a pass that runs once every L steps. Non-fold steps append the token to the
ring (x, dt, and B from the group's first head).

Requires P % 64 == 0 (Nemotron-H: P = 64) and N % block_n == 0 with block_n % 8 == 0. The
public entries take validated arguments (see `pallas_kernels.mamba2.api`).
"""

from __future__ import annotations

import dataclasses
import functools

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
    chunk_specs,
    cols,
    load_wait,
    mosaic_call,
    rows,
    staging_smem,
    store_async,
    write_chunk,
    write_out,
    zeros_row,
)
from pallas_kernels.ring import NULL_SLOT
from pallas_kernels.validation import bounded_block, check, resolve_tiling

GRID_NAMES = ("row", "head", "ptile")


@dataclasses.dataclass(frozen=True)
class Mamba2MosaicTiling:
    """Launch configuration of the Mosaic GPU kernels: block_n bounds the d_state chunk streamed
    per pipeline step (the largest power of two dividing N up to it, at least 8), num_stages the
    chunks in flight. The P tile is one warpgroup's 64 rows."""
    block_n: int
    num_stages: int = 2


# Not yet measured on the H200: the chunk of the Triton kernels' best tilings.
MOSAIC_STANDARD_TILING = Mamba2MosaicTiling(block_n=64)
MOSAIC_REPLAY_TILING = Mamba2MosaicTiling(block_n=64)
_MIN_BLOCK_N = 8                  # WGMMA layout columns; TMA rows of >= 16 bytes


def _tiles(tiling, default, P, N):
    t = resolve_tiling(tiling, default)
    check(P % TILE_ROWS == 0,
          f"pallas_mosaic_gpu needs head_dim P a multiple of {TILE_ROWS}, got P = {P}")
    check(t.num_stages >= 1, f"num_stages = {t.num_stages} must be >= 1")
    return dict(block_n=bounded_block("block_n", "d_state N", N, t.block_n, _MIN_BLOCK_N),
                num_stages=t.num_stages)


def standard_decode(state, x, B, C, dt, A, D, slots, *, tiling, interpret):
    return _standard_decode(state, x, B, C, dt, A, D, slots, interpret=interpret,
                            **_tiles(tiling, MOSAIC_STANDARD_TILING, x.shape[2], B.shape[2]))


def replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    return _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                          **_tiles(tiling, MOSAIC_REPLAY_TILING, x.shape[2], B.shape[2]))


def _position(heads_per_group):
    """(row b, head h, group g, P tile slice) of this CTA."""
    b, h, t = (lax.axis_index(n) for n in GRID_NAMES)
    return b, h, h // heads_per_group, pl.ds(t * TILE_ROWS, TILE_ROWS)


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every live row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, state_ref, y_ref,
                     x_smem, out_smem, bar, *, heads_per_group, block_n, num_stages):
    b, h, g, ps = _position(heads_per_group)
    N = b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    load_wait(x_ref.at[b, h, ps], x_smem, bar)
    x = plgpu.load(x_smem, layout=ROW).astype(F32)
    dt = dt_ref[b, h]
    da, dtx = jnp.exp(dt * a_ref[h]), dt * x
    tile = state_ref.at[slot, h, ps]                                  # [64, N] in GMEM

    def chunk(idx, s_smem, bv_smem, cv_smem, y):
        (n,) = idx
        s = s_smem[...].astype(F32)                                   # [64, bn]
        bv = plgpu.load(bv_smem, layout=COL).astype(F32)
        cv = plgpu.load(cv_smem, layout=COL).astype(F32)
        s = da * s + rows(dtx, s.shape) * cols(bv, s.shape)
        write_chunk(s, n, out_smem, tile, block_n, live)     # the null slot is never written
        return y + jnp.sum(s * cols(cv, s.shape), axis=1)

    y = plgpu.emit_pipeline(
        chunk, grid=(N // block_n,),
        in_specs=chunk_specs(state_ref.dtype, "state", None, None, block=block_n),
        max_concurrent_steps=num_stages, init_carry=zeros_row(),
    )(tile, b_ref.at[b, g], c_ref.at[b, g])
    write_out(y + d_ref[h] * x, live, x_smem, y_ref.at[b, h, ps])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_n", "num_stages", "interpret"))
def _standard_decode(state, x, B, C, dt, A, D, slots, *, block_n, num_stages, interpret):
    batch, H, P = x.shape
    G = B.shape[1]
    kernel = functools.partial(_standard_kernel, heads_per_group=H // G, block_n=block_n,
                               num_stages=num_stages)
    (y,), (state,) = mosaic_call(
        kernel, name="mamba2_standard_decode_mgpu", grid=(batch, H, P // TILE_ROWS),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt, a_ref=A, d_ref=D,
                    state_ref=state),
        outputs=dict(y_ref=like(x)),
        inplace=("state_ref",),
        scratch=dict(x_smem=plgpu.SMEM((TILE_ROWS,), x.dtype),
                     out_smem=staging_smem(block_n, state.dtype),
                     bar=plgpu.Barrier()),
        interpret=interpret)
    return y, state


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): y from checkpoint + ring + current token, state written on folds.
# --------------------------------------------------------------------------------------------
def _replay_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcc_ref, s_ref, rx_ref, rb_ref, rdt_ref, y_ref, x_smem, rx_smem, xr_smem,
                   bv_smem, br_smem, out_smem, bars, *, heads_per_group, block_n, num_stages):
    b, h, g, ps = _position(heads_per_group)
    L, N = rx_ref.shape[2], b_ref.shape[-1]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]                                   # committed ring entries, 0..L-1
    # Both copies in flight at once: the current token's x and the ring's x rows.
    plgpu.copy_gmem_to_smem(x_ref.at[b, h, ps], x_smem, bars.at[0])
    plgpu.copy_gmem_to_smem(rx_ref.at[slot, h, :, ps], rx_smem, bars.at[1])
    dt, a = dt_ref[b, h], a_ref[h]
    plgpu.barrier_wait(bars.at[0])
    plgpu.barrier_wait(bars.at[1])
    x = plgpu.load(x_smem, layout=ROW).astype(F32)

    def ring_row(j):
        return plgpu.load(rx_smem.at[j], layout=ROW).astype(F32)

    def walk(body, init):
        """Folds body(j, s_j, carry) over the committed entries j = c-1 .. 0 (newest first)
        with s_j = dt_j exp(A sum_{i>j} dt_i), the sum over the window after j (current token
        included). Returns (sum of the window's dt, carry)."""
        def step(k, carry):
            suffix, acc = carry
            j = c - 1 - k
            dtj = rdt_ref[slot, h, j]
            return suffix + dtj, body(j, dtj * jnp.exp(a * suffix), acc)
        return lax.fori_loop(0, c, step, (dt, init))

    # y = decay S0 C + sum_j s_j (B_j . C) x_j + D x, the current token with s = dt.
    total, y_ring = walk(lambda j, sj, acc: acc + (sj * bcr_ref[b, g, j]) * ring_row(j),
                         (dt * bcc_ref[b, g]) * x)
    decay = jnp.exp(a * total)
    tile = s_ref.at[slot, h, ps]                                      # [64, N] in GMEM

    def readout(idx, s_smem, cv_smem, acc):
        s = s_smem[...].astype(F32)
        cv = plgpu.load(cv_smem, layout=COL).astype(F32)
        # The pipeline's next TMA into this stage's buffers must follow these reads (an
        # input-only pipeline has no fence of its own; the interpreter flags the race).
        plgpu.commit_smem()
        return acc + jnp.sum(s * cols(cv, s.shape), axis=1)

    s0c = plgpu.emit_pipeline(
        readout, grid=(N // block_n,),
        in_specs=chunk_specs(s_ref.dtype, "state", None, block=block_n),
        max_concurrent_steps=num_stages, init_carry=zeros_row(),
    )(tile, c_ref.at[b, g])
    write_out(decay * s0c + y_ring + d_ref[h] * x, live, x_smem, y_ref.at[b, h, ps])

    # Fold (one step in L): S0 <- decay S0 + X^T diag(s) B, chunk by chunk, rank-1 updates.
    fold = c == L - 1

    @pl.when(live & fold)
    def _fold():
        def fold_chunk(idx, s_smem, rb_smem, bv_smem):
            (n,) = idx
            s = s_smem[...].astype(F32)
            cur = plgpu.load(bv_smem, layout=COL).astype(F32)
            upd = decay * s + rows(dt * x, s.shape) * cols(cur, s.shape)

            def entry(j, sj, acc):
                bj = plgpu.load(rb_smem.at[j], layout=COL).astype(F32)
                return acc + rows(sj * ring_row(j), s.shape) * cols(bj, s.shape)
            write_chunk(walk(entry, upd)[1], n, out_smem, tile, block_n, live)

        plgpu.emit_pipeline(
            fold_chunk, grid=(N // block_n,),
            in_specs=chunk_specs(s_ref.dtype, "state", L, None, block=block_n),
            max_concurrent_steps=num_stages,
        )(tile, rb_ref.at[slot, g], b_ref.at[b, g])

    # Otherwise append the current token at `c`. The fold's ring B tiles span all L rows, and
    # rows < c are the only ones the other CTAs of the group read otherwise: no CTA writes a
    # row another one reads.
    @pl.when(live & ~fold)
    def _append():
        store_async(x, xr_smem, rx_ref.at[slot, h, c, ps])

        @pl.when(lax.axis_index(GRID_NAMES[2]) == 0)
        def _():
            rdt_ref[slot, h, c] = dt

            @pl.when(h % heads_per_group == 0)
            def _():
                load_wait(b_ref.at[b, g], bv_smem, bars.at[2])
                store_async(plgpu.load(bv_smem, layout=COL), br_smem, rb_ref.at[slot, g, c])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("block_n", "num_stages", "interpret"))
def _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, block_n, num_stages,
                   interpret):
    batch, H, P = x.shape
    G, N = B.shape[1:]
    L = buffers.window
    hi = lax.Precision.HIGHEST
    C32 = C.astype(F32)
    # Per-group B . C products (ring x current, current x current): tiny next to the state.
    bc_ring = jnp.einsum("bgln,bgn->bgl", buffers.ring_b[slots].astype(F32), C32, precision=hi)
    bc_cur = jnp.einsum("bgn,bgn->bg", B.astype(F32), C32, precision=hi)
    kernel = functools.partial(_replay_kernel, heads_per_group=H // G, block_n=block_n,
                               num_stages=num_stages)
    ring_dtype = buffers.ring_x.dtype
    (y,), new = mosaic_call(
        kernel, name="mamba2_replay_decode_mgpu", grid=(batch, H, P // TILE_ROWS),
        grid_names=GRID_NAMES,
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcc_ref=bc_cur,
                    s_ref=buffers.checkpoint, rx_ref=buffers.ring_x, rb_ref=buffers.ring_b,
                    rdt_ref=buffers.ring_dt),
        outputs=dict(y_ref=like(x)),
        inplace=("s_ref", "rx_ref", "rb_ref", "rdt_ref"),
        scratch=dict(x_smem=plgpu.SMEM((TILE_ROWS,), x.dtype),
                     rx_smem=plgpu.SMEM((L, TILE_ROWS), ring_dtype),
                     xr_smem=plgpu.SMEM((TILE_ROWS,), ring_dtype),
                     bv_smem=plgpu.SMEM((N,), B.dtype),
                     br_smem=plgpu.SMEM((N,), ring_dtype),
                     out_smem=staging_smem(block_n, buffers.checkpoint.dtype),
                     bars=plgpu.Barrier(num_barriers=3)),
        interpret=interpret)
    return y, type(buffers)(*new)
