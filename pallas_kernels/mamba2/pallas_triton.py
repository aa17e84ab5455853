"""Pallas Triton kernels for Mamba-2 decode and verify (`impl="pallas_triton"`, or "pallas").

One program per (row, head, P tile), which streams the state tile over d_state in chunks of
block_n (a loop the Triton pipeliner overlaps: many loads in flight with few registers). Pools are
passed whole and gathered by slot inside the kernel (`ref[slot, h, ...]`); the updated pools are
aliased to their inputs so the step writes in place (donate them at the outer jit). Every load and
store is a power-of-two block: the P tile divides P (P = 80 runs as five tiles of 16), N and L are
powers of two; a tiling's `p_tiles="masked"` takes a P tile that need not divide P (one of 128
over P = 80), its rows past P masked on every load and store (`_kernel_utils.tile_rows`). Bodies
use only backend-neutral Pallas; the Triton specifics are in `_kernel_utils.compiler_params`.

Launch order (every tiling's `grid_order`, `_kernel_utils.launch_grid`): "row_fastest" launches
the grid (batch, H, P tiles), "row_slowest" (P tiles, H, batch). The GPU hands out CTAs
with the first grid axis (blockIdx.x) fastest, so "row_fastest" runs one head and tile of
consecutive rows side by side, while the programs that share data are those of one row: the ring's
B of a (slot, group) ([L, N], read by every head of the group and by every P tile), the row's B / C
vectors, and its slot's state [H, P, N], one contiguous region. At batch 256 a row's programs are
then a wave apart, and its shared reads likely miss L2; "row_slowest" makes them adjacent: the
decode kernels' default (3-10% faster on the H200, below) and the ReplaySSM verify's (611 -> 593
us); the state-per-draft baseline verify stays "row_fastest" (1503 vs 1633 us row-slowest).

The public entries (`standard_decode`, ... with `tiling=` and `interpret=`) take validated
arguments (see `pallas_kernels.mamba2.api`) and resolve the tiling to concrete tiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32 as _F32
from pallas_kernels._kernel_utils import (
    call,
    dot_precision,
    launch_grid,
    like,
    load,
    masked_window,
    n_chunks,
    outer_fold,
    program_ids,
    ring_entries,
    store,
    stream,
    suffix_sums,
    tile_rows,
)
from pallas_kernels.mamba2.buffers import bc_products, write_window
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, window_positions
from pallas_kernels.validation import (
    EVICTION_POLICIES,
    RING_LOADS,
    RING_SCALARS,
    RING_WRITES,
    TILE_MODES,
    bounded_block,
    check_choice,
    fold_uses_dot,
    for_window,
    masked_block,
    resolve_tiling,
)


@dataclasses.dataclass(frozen=True)
class Mamba2Tiling:
    """Launch configuration of the standard kernels. block_p and block_n bound the head-dim tile
    and the d_state chunk: a kernel uses the largest power of two dividing P (at least 4),
    respectively N, up to them. `grid_order`: the launch order of the programs, "row_fastest"
    or "row_slowest" (a row's programs adjacent: its ring / token reads shared through L2, its
    slot's state read as one region; see the module docstring). `p_tiles`: how block_p covers
    P: "divide" (the tile above: P = 80 runs as five tiles of 16) or "masked" (block_p itself,
    or the smallest power of two >= P if less; ceil(P / tile) tiles, the last one's rows past P
    masked on every load and store: P = 80 at block_p 32 runs tiles of 32, 32 and 16 live rows
    of 32; at 128, one tile with 48 rows masked), so a program's fixed work (the replay's ring
    walk and fold setup) is spread over more rows."""
    block_p: int
    block_n: int
    num_warps: int
    num_stages: int = 2
    grid_order: str = "row_fastest"
    p_tiles: str = "divide"


@dataclasses.dataclass(frozen=True)
class Mamba2ReplayTiling(Mamba2Tiling):
    """Launch configuration of the replay decode and verify kernels: the tiles, plus how the fold
    forms X^T diag(s) B: "dot" (tensor cores, tf32x3; needs L and both tiles >= 16), "fma"
    (rank-1 updates) or "auto" (dot where it can); `state_eviction`, the L2 eviction policy of
    the checkpoint reads (`validation.EVICTION_POLICIES`: "evict_first" keeps the read-once
    state from pushing the rings out of L2); `grid_order` as in `Mamba2Tiling`. `ring_scalars`
    (replay decode; verify always takes them from XLA) is where the B_j . C products come from:
    "kernel" (every program of a group reads its slot's ring B, [L, N], in the read-only pass)
    or "xla" (one product per step before the launch, `buffers.bc_products`; the ring B is then
    read only to fold: fewer registers a program). `ring_write` (verify) is who writes the
    window's x into the ring (`validation.RING_WRITES`): "xla" after the kernel, or "kernel"
    (each program its own [T, bp] rows; B and dt stay XLA's). `ring_loads` (replay decode) is
    which ring rows a program fetches (`validation.RING_LOADS`): "committed" (below the count:
    half the ring on average, but the loads wait on the count's) or "all" (L rows, garbage
    selected away: one dependent memory round trip fewer, which matters at small batch)."""
    fold: str = "auto"
    state_eviction: str = "evict_normal"
    ring_scalars: str = "kernel"
    ring_write: str = "xla"
    ring_loads: str = "committed"


# Tilings measured best on an H200 at batch 256, fp32 state (docs/benchmarks.md). Launched
# row-slowest (seventh session, `gpu_session.sh triton-tune`): standard 556 -> 538 us, replay
# (staggered) 417 -> 391 at the 8B's shapes, 722 -> 648 at P = 80; evict_first reads of the
# checkpoint were slower (438, 413 with row-slowest).
STANDARD_TILING = Mamba2Tiling(block_p=32, block_n=64, num_warps=8, grid_order="row_slowest")
# Replay on 4 warps (stop 36, 8B shapes, staggered us; 2 warps held 255 registers and spilled):
# 2 rows 6.6 -> 6.0, 4 9.1 -> 8.7, 8 17.1 -> 16.0, 16 30.7 -> 28.8, 32 54.8 -> 50.7, 256
# 387.9 -> 365.3 (sixteenth session; `auto` runs the Mosaic replay from 16 rows).
REPLAY_TILING = Mamba2ReplayTiling(block_p=64, block_n=64, num_warps=4, grid_order="row_slowest")
# P not a multiple of those block_p (Nemotron-Nano-9B-v2's P = 80, eighth session, batch 256):
# masked P tiles, standard 711 -> 682 us (32 + 32 + 16 live rows); replay one 128-row tile of 80
# live rows on 4 warps, 649 -> 569 (2 warps 699, block_p 32 742); in 32-wide d_state chunks,
# which spill less (thirteenth session, `mamba2-spills`), 567.3 -> 543.7.
# Batch 1 (thirteenth session, `gpu_session.sh b1-tune`): one row launches H * P / block_p
# programs, 128 at the 8B's shapes on 132 SMs; 32-row tiles on 4 warps spread it over twice as
# many: replay 5.0 -> 4.5 us (8B), 5.3 -> 5.1 (P = 80, masked 32-row tiles), against the
# standard's 4.3 / 4.8 (its own tiles were no faster smaller: 4.3 / 4.7 at block_p 16). At batch
# 256 the same tiles are slower (423 vs 389 us). Fourteenth session (`gdn-b1`): its ring loads
# freed of the count's (ring_loads "all"), 4.5 -> 4.3 us (the standard's), P = 80 5.1 -> 5.0;
# fifteenth 4.5 -> 4.4 and 5.1 -> 5.0 (standard 4.3 / 4.9).
SMALL_BATCH_ROWS = 1
SMALL_BATCH_TILINGS = {
    REPLAY_TILING: dataclasses.replace(REPLAY_TILING, block_p=32, num_warps=4, ring_loads="all"),
}
RAGGED_P_TILINGS = {
    STANDARD_TILING: dataclasses.replace(STANDARD_TILING, p_tiles="masked"),
    REPLAY_TILING: dataclasses.replace(REPLAY_TILING, block_p=128, block_n=32, num_warps=4,
                                       p_tiles="masked"),
    SMALL_BATCH_TILINGS[REPLAY_TILING]: dataclasses.replace(SMALL_BATCH_TILINGS[REPLAY_TILING],
                                                            p_tiles="masked"),
}
# verify keeps T accumulators per d_state chunk: 32-wide chunks (batch 256, T = 4: 2.24x the
# baseline, against 1.83x at 64 and 1.74x at 16; T = 8: 2.43x, 2.49x at 16); launched
# row-slowest (eighth session: 611 -> 593 us at T = 4).
VERIFY_TILING = Mamba2ReplayTiling(block_p=64, block_n=32, num_warps=2, grid_order="row_slowest")
# The state-per-draft baseline's own (batch 256, T = 4, 2026-11-30 sweep): the decode kernel's
# tiles are its best (1528 us, 83% of copy bandwidth; 4 warps 1526 us, block_n 32 1933 us), and
# row-fastest (eighth session: 1503 us, row-slowest 1633).
STANDARD_VERIFY_TILING = Mamba2Tiling(block_p=32, block_n=64, num_warps=8)
# Eleventh session (batch 256): row-slowest is the faster order at T = 2 (857 vs 882 us) and
# T = 8 (3,453 vs 3,604; block_n 32 4,368, 4 warps 3,679), row-fastest at T = 4: the
# baseline's tiling by window (`standard_verify_tiling`).
_BASELINE_ROW_SLOWEST = dataclasses.replace(STANDARD_VERIFY_TILING, grid_order="row_slowest")
STANDARD_VERIFY_TILINGS = ((2, _BASELINE_ROW_SLOWEST), (4, STANDARD_VERIFY_TILING),
                           (MAX_VERIFY_TOKENS, _BASELINE_ROW_SLOWEST))


def standard_verify_tiling(T):
    """The state-per-draft baseline's measured tiling for a window of T tokens."""
    return for_window(STANDARD_VERIFY_TILINGS, T)


_MIN_BLOCK_P = 4


def for_shape(tiling, P, rows):
    """The measured tiling a kernel whose default is `tiling` runs at head dim P and `rows` rows
    a step: its small-batch variant (`SMALL_BATCH_TILINGS`) at up to SMALL_BATCH_ROWS rows,
    then that one's masked-tile variant (`RAGGED_P_TILINGS`) where its block_p does not divide
    P."""
    if rows <= SMALL_BATCH_ROWS:
        tiling = SMALL_BATCH_TILINGS.get(tiling, tiling)
    if tiling in RAGGED_P_TILINGS and P % tiling.block_p:
        return RAGGED_P_TILINGS[tiling]
    return tiling


def _tiles(tiling, default, x, N, window=None, scalars=False, verify=False):
    """The launch keywords of a tiling (None: `default` at x's head dim P and rows,
    `for_shape`; x [rows, ..., P]) for d_state N (tiles, launch order, warps, stages); with the
    ring window L, also the fold mode and the state's eviction policy; `scalars`: also where
    the ring products come from (replay decode); `verify`: also who writes the ring's x."""
    P = x.shape[-1]
    t = resolve_tiling(tiling, for_shape(default, P, x.shape[0]))
    check_choice("p_tiles", t.p_tiles, TILE_MODES)
    p_block = bounded_block if t.p_tiles == "divide" else masked_block
    tiles = dict(block_p=p_block("block_p", "head_dim P", P, t.block_p, _MIN_BLOCK_P),
                 block_n=bounded_block("block_n", "d_state N", N, t.block_n))
    if window is not None:
        tiles["fold_dot"] = fold_uses_dot(t.fold, window, **tiles)
        check_choice("state_eviction", t.state_eviction, EVICTION_POLICIES)
        tiles["eviction"] = t.state_eviction
    if scalars:
        check_choice("ring_scalars", t.ring_scalars, RING_SCALARS)
        tiles["ring_scalars"] = t.ring_scalars
        check_choice("ring_loads", t.ring_loads, RING_LOADS)
        tiles["all_ring_rows"] = t.ring_loads == "all"
    if verify:
        check_choice("ring_write", t.ring_write, RING_WRITES)
        tiles["ring_write"] = t.ring_write
    return dict(tiles, grid_order=t.grid_order, num_warps=t.num_warps, num_stages=t.num_stages)


def standard_decode(state, x, B, C, dt, A, D, slots, *, tiling, interpret):
    return _standard_decode(state, x, B, C, dt, A, D, slots, interpret=interpret,
                            **_tiles(tiling, STANDARD_TILING, x, B.shape[2]))


def replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    return _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                          **_tiles(tiling, REPLAY_TILING, x, B.shape[2], buffers.window,
                                   scalars=True))


def replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, tiling, interpret):
    tiles = _tiles(tiling, VERIFY_TILING, x, B.shape[3], buffers.window, verify=True)
    y, ck, rx = _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, interpret=interpret,
                               **tiles)
    in_kernel = tiles["ring_write"] == "kernel"
    return y, write_window(buffers._replace(checkpoint=ck, ring_x=rx), counts, slots,
                           None if in_kernel else x, B, dt)


def standard_verify(state, x, B, C, dt, A, D, slots, draft_slots, *, tiling, interpret):
    return _standard_verify(state, x, B, C, dt, A, D, slots, draft_slots, interpret=interpret,
                            **_tiles(tiling, standard_verify_tiling(x.shape[1]), x, B.shape[3]))


def _row_head_tile(grid_order, heads_per_group, block_p, P):
    """(row b, head h, group g, P tile t, the tile's slice, its live rows: a [block_p] mask, or
    None when block_p divides P) of this program, launched by `_grid`."""
    b, h, t = program_ids(grid_order)
    return (b, h, h // heads_per_group, t, *tile_rows(t, block_p, P))


def _grid(batch, H, P, block_p, grid_order):
    """The launch grid of one program per (row, head, P tile): ceil(P / block_p) tiles (the last
    one masked when block_p does not divide P)."""
    return launch_grid((batch, H, pl.cdiv(P, block_p)), grid_order)


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, s_in,
                     y_ref, s_out, *, grid_order, heads_per_group, block_p, block_n):
    b, h, g, _, ps, rows = _row_head_tile(grid_order, heads_per_group, block_p, x_ref.shape[2])
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    x = load(x_ref.at[b, h, ps], rows).astype(_F32)  # [bp]
    dt = dt_ref[b, h]
    da, dtx = jnp.exp(dt * a_ref[h]), dt * x

    def chunk(ns, y):
        s = load(s_in.at[slot, h, ps, ns], rows).astype(_F32)  # [bp, bn]
        s = da * s + dtx[:, None] * b_ref[b, g, ns].astype(_F32)[None, :]

        @pl.when(live)
        def _():
            store(s_out.at[slot, h, ps, ns], s.astype(s_out.dtype), rows)
        return y + jnp.sum(s * c_ref[b, g, ns].astype(_F32)[None, :], axis=1)

    y = n_chunks(s_in.shape[3], block_n, chunk, jnp.zeros_like(x)) + d_ref[h] * x
    store(y_ref.at[b, h, ps], jnp.where(live, y, 0.0).astype(y_ref.dtype), rows)


@functools.partial(jax.jit, static_argnames=("block_p", "block_n", "grid_order", "num_warps",
                                             "num_stages", "interpret"))
def _standard_decode(state, x, B, C, dt, A, D, slots, *, block_p, block_n, grid_order,
                     num_warps, num_stages, interpret):
    batch, H, P = x.shape
    G = B.shape[1]
    kernel = functools.partial(_standard_kernel, grid_order=grid_order, heads_per_group=H // G,
                               block_p=block_p, block_n=block_n)
    return call(
        kernel, name="mamba2_standard_decode",
        grid=_grid(batch, H, P, block_p, grid_order),
        inputs=dict(slots_ref=slots, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt, a_ref=A, d_ref=D,
                    s_in=state),
        outputs=dict(y_ref=like(x), s_out=like(state)),
        aliases={"s_in": "s_out"}, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret)


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): y from checkpoint + ring + current token, state written on folds only.
# --------------------------------------------------------------------------------------------
def _replay_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref,
                   s_in, rx_in, rb_in, rdt_in, bcr_ref, bcc_ref, y_ref, s_out, rx_out, rb_out,
                   rdt_out, *, grid_order, heads_per_group, block_p, block_n, window, fold_dot,
                   precision, eviction, all_ring_rows):
    # bcr_ref / bcc_ref: None (the readout forms B_j . C and B . C from the ring and the token)
    # or [b, G, L] / [b, G] float32, precomputed (ring_scalars="xla"). all_ring_rows: the
    # read-only pass fetches all L ring rows (`ring_entries` with no count).
    b, h, g, t, ps, rows = _row_head_tile(grid_order, heads_per_group, block_p, x_ref.shape[2])
    L, N = window, s_in.shape[3]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    # Issue the ring loads before the state pass and use the values after it. Only the committed
    # entries are fetched (masked loads: ~half the ring on average), or with all_ring_rows all
    # of them, the garbage ones selected away below.
    c = counts_ref[slot]                              # committed ring entries, 0..L-1
    rc = None if all_ring_rows else c
    ring_x = ring_entries(rx_in.at[slot, h, :, ps], rc, rows)               # [L, bp]
    ring_dt = ring_entries(rdt_in.at[slot, h, :], rc)                       # [L]
    x = load(x_ref.at[b, h, ps], rows).astype(_F32)  # current token
    dt = dt_ref[b, h]

    # Read-only pass over the checkpoint: S0 C and (unless precomputed), for every ring entry,
    # B_j . C.
    def readout(ns, carry):
        s0c, bc_ring, bc_cur = carry
        cv = c_ref[b, g, ns].astype(_F32)
        s0 = stream(s_in.at[slot, h, ps, ns], eviction, rows).astype(_F32)  # [bp, bn]
        s0c = s0c + jnp.sum(s0 * cv[None, :], axis=1)
        if bcr_ref is not None:
            return s0c, bc_ring, bc_cur
        rb = ring_entries(rb_in.at[slot, g, :, ns], rc).astype(_F32)     # [L, bn]
        return (s0c, bc_ring + jnp.sum(rb * cv[None, :], axis=1),
                bc_cur + jnp.sum(b_ref[b, g, ns].astype(_F32) * cv))

    zero_p = jnp.zeros((block_p,), _F32)
    s0c, bc_ring, bc_cur = n_chunks(N, block_n, readout,
                                     (zero_p, jnp.zeros((L,), _F32), jnp.float32(0)))
    if bcr_ref is not None:
        bc_ring, bc_cur = bcr_ref[b, g, :], bcc_ref[b, g]
    a = a_ref[h]

    # Window = ring[0:c] + current token at position c (entries past c are garbage).
    j = lax.broadcasted_iota(jnp.int32, (L,), 0)
    valid, cur = j < c, j == c

    def window_terms():
        """X [L, bp] over the window, s_j = dt_j exp(A sum_{i>j} dt_i) [L] and the decay."""
        dtw = jnp.where(valid, ring_dt, jnp.where(cur, dt, 0.0))       # [L]
        return (masked_window(valid, cur, ring_x, x), dtw * jnp.exp(a * suffix_sums(dtw)),
                jnp.exp(a * jnp.sum(dtw)))

    # y first: its [L] / [bp] terms are dead before the fold's [L, bn] tiles are live (at
    # P = 80's 128-row tile the fold after y took the replay from 539 to 479 us, batch 256).
    xw, s, decay = window_terms()
    bc = jnp.where(valid, bc_ring, jnp.where(cur, bc_cur, 0.0))        # [L]  B_j . C
    y = decay * s0c + jnp.sum((s * bc)[:, None] * xw, axis=0) + d_ref[h] * x
    store(y_ref.at[b, h, ps], jnp.where(live, y, 0.0).astype(y_ref.dtype), rows)

    # Fold pass (one step in L): S0 <- decay S0 + X^T diag(s) B, chunk by chunk; the S0 chunks
    # were just read by this program and come back from L2. Its window terms are formed again
    # here (cheap), so none stay live across the store above.
    @pl.when(live & (c == L - 1))
    def _fold():
        xw, s, decay = window_terms()

        def fold_chunk(ns, carry):
            sbw = s[:, None] * masked_window(valid, cur, ring_entries(rb_in.at[slot, g, :, ns], c),
                                             b_ref[b, g, ns].astype(_F32))  # [L, bn]
            s0 = load(s_in.at[slot, h, ps, ns], rows).astype(_F32)
            upd = outer_fold(xw, sbw, precision, fold_dot)              # [bp, bn]
            store(s_out.at[slot, h, ps, ns], (decay * s0 + upd).astype(s_out.dtype), rows)
            return carry
        n_chunks(N, block_n, fold_chunk, 0)

    # Append the current token at `c` (after a fold it lies past the reset count: harmless).
    @pl.when(live)
    def _append():
        store(rx_out.at[slot, h, c, ps], x.astype(rx_out.dtype), rows)

        @pl.when(t == 0)
        def _():
            rdt_out[slot, h, c] = dt

            @pl.when(h % heads_per_group == 0)
            def _():
                rb_out[slot, g, c, :] = b_ref[b, g, :].astype(rb_out.dtype)


@functools.partial(jax.jit, static_argnames=("block_p", "block_n", "fold_dot", "eviction",
                                             "ring_scalars", "all_ring_rows", "grid_order",
                                             "num_warps", "num_stages", "interpret"))
def _replay_decode(buffers, counts, x, B, C, dt, A, D, slots, *, block_p, block_n, fold_dot,
                   eviction, ring_scalars, all_ring_rows, grid_order, num_warps, num_stages,
                   interpret):
    batch, H, P = x.shape
    G = B.shape[1]
    L = buffers.ring_x.shape[2]
    bcr = bcc = None
    if ring_scalars == "xla":
        bcr, bcc = bc_products(buffers.ring_b, slots, B[:, None], C[:, None])
        bcr, bcc = bcr[:, :, 0], bcc[:, :, 0, 0]                        # [b, G, L], [b, G]
    kernel = functools.partial(
        _replay_kernel, grid_order=grid_order, heads_per_group=H // G, block_p=block_p,
        block_n=block_n, window=L, fold_dot=fold_dot, precision=dot_precision(interpret),
        eviction=eviction, all_ring_rows=all_ring_rows)
    y, *new = call(
        kernel, name="mamba2_replay_decode",
        grid=_grid(batch, H, P, block_p, grid_order),
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, s_in=buffers.checkpoint, rx_in=buffers.ring_x,
                    rb_in=buffers.ring_b, rdt_in=buffers.ring_dt, bcr_ref=bcr, bcc_ref=bcc),
        outputs=dict(y_ref=like(x), s_out=like(buffers.checkpoint), rx_out=like(buffers.ring_x),
                     rb_out=like(buffers.ring_b), rdt_out=like(buffers.ring_dt)),
        aliases={"s_in": "s_out", "rx_in": "rx_out", "rb_in": "rb_out", "rdt_in": "rdt_out"},
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    return y, type(buffers)(*new)


# --------------------------------------------------------------------------------------------
# ReplaySSM verify (T window tokens): y for every window token, causally, from checkpoint +
# committed ring + window; folds ring[0:c] + window[0] into the checkpoint when c + T >= L.
# The ring itself is written by the caller after this kernel (the fold rows overwrite ring rows
# other programs of the same group still read here).
# --------------------------------------------------------------------------------------------
def _verify_kernel(slots_ref, counts_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref, bcr_ref,
                   bcw_ref, s_in, rx_in, rb_in, rdt_in, y_ref, s_out, rx_out, *, grid_order,
                   heads_per_group, block_p, block_n, window, num_tokens, fold_dot, precision,
                   eviction, write_ring):
    # One pass over the checkpoint serves all T tokens: per state chunk, T mat-vecs S0 C_t (the
    # decode kernel's readout, T times). The B . C products (ring x window, window x window) are
    # per group, not per head: they come precomputed (bcr_ref, bcw_ref). Everything per token is
    # a [bp] / [L] vector or a scalar: no [T, tile, chunk] products (they spill registers).
    b, h, g, _, ps, rows = _row_head_tile(grid_order, heads_per_group, block_p, x_ref.shape[3])
    L, N, T = window, s_in.shape[3], num_tokens
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]
    ring_x = ring_entries(rx_in.at[slot, h, :, ps], c, rows)                # [L, bp]
    ring_dt = ring_entries(rdt_in.at[slot, h, :], c)                        # [L]
    # (token indices as int32 arrays: the interpreter's masked loads / stores take no Python int)
    xs = [load(x_ref.at[b, jnp.int32(t), h, ps], rows).astype(_F32) for t in range(T)]  # T x [bp]
    dts = [dt_ref[b, t, h] for t in range(T)]                              # T scalars
    bc_ring = [bcr_ref[b, g, t, :] for t in range(T)]                      # T x [L] B_j . C_t
    bc_win = {(r, t): bcw_ref[b, g, r, t] for t in range(T) for r in range(t + 1)}  # B_r . C_t

    def readout(ns, s0c):
        s0 = stream(s_in.at[slot, h, ps, ns], eviction, rows).astype(_F32)  # [bp, bn]
        return tuple(acc + jnp.sum(s0 * c_ref[b, t, g, ns].astype(_F32)[None, :], axis=1)
                     for t, acc in enumerate(s0c))

    s0c = n_chunks(N, block_n, readout, (jnp.zeros((block_p,), _F32),) * T)

    a = a_ref[h]
    j = lax.broadcasted_iota(jnp.int32, (L,), 0)
    valid = j < c
    dth = jnp.where(valid, ring_dt, 0.0)
    s_hist = dth * jnp.exp(a * suffix_sums(dth))      # weights of ring entries at window start
    decay_hist = jnp.exp(a * jnp.sum(dth))
    xh = jnp.where(valid[:, None], ring_x.astype(_F32), 0.0)                # [L, bp]
    cum = [sum(dts[:t + 1]) for t in range(T)]       # sum_{r <= t} dt_r
    for t in range(T):
        w = jnp.where(valid, s_hist * bc_ring[t], 0.0)                    # garbage rows -> 0
        y = (jnp.exp(a * cum[t]) * (decay_hist * s0c[t] + jnp.sum(w[:, None] * xh, axis=0))
             + d_ref[h] * xs[t])
        for r in range(t + 1):
            y = y + dts[r] * jnp.exp(a * (cum[t] - cum[r])) * bc_win[r, t] * xs[r]
        store(y_ref.at[b, jnp.int32(t), h, ps], jnp.where(live, y, 0.0).astype(y_ref.dtype), rows)

    # Fold ring[0:c] + window[0] (always accepted) when the window would fill the ring.
    @pl.when(live & (c + T >= L))
    def _fold():
        cur = j == c
        dtf = jnp.where(valid, ring_dt, jnp.where(cur, dts[0], 0.0))
        sf = dtf * jnp.exp(a * suffix_sums(dtf))
        decay = jnp.exp(a * jnp.sum(dtf))
        xf = masked_window(valid, cur, ring_x, xs[0])                        # [L, bp]

        def fold_chunk(ns, carry):
            sbw = sf[:, None] * masked_window(valid, cur,
                                              ring_entries(rb_in.at[slot, g, :, ns], c),
                                              b_ref[b, 0, g, ns].astype(_F32))  # [L, bn]
            s0 = load(s_in.at[slot, h, ps, ns], rows).astype(_F32)
            store(s_out.at[slot, h, ps, ns],
                  (decay * s0 + outer_fold(xf, sbw, precision, fold_dot)).astype(s_out.dtype),
                  rows)
            return carry
        n_chunks(N, block_n, fold_chunk, 0)

    if not write_ring:
        return
    # The window's x into the ring (ring_write="kernel"; `write_window_rings`' positions): these
    # rows [L, bp] are this program's alone, and it read them above.
    for t, pos in enumerate(window_positions(c, T, L)):
        @pl.when(live & (pos >= 0))
        def _(t=t, pos=pos):
            store(rx_out.at[slot, h, pos, ps], xs[t].astype(rx_out.dtype), rows)


@functools.partial(jax.jit, static_argnames=("block_p", "block_n", "fold_dot", "eviction",
                                             "ring_write", "grid_order", "num_warps",
                                             "num_stages", "interpret"))
def _replay_verify(buffers, counts, x, B, C, dt, A, D, slots, *, block_p, block_n, fold_dot,
                   eviction, ring_write, grid_order, num_warps, num_stages, interpret):
    """Window inputs x [b, T, H, P], B, C [b, T, G, N], dt [b, T, H]. Returns y [b, T, H, P],
    the checkpoint pool (folded rows updated) and the ring_x pool (in place: with the window's
    x if ring_write is "kernel", else unchanged; B and dt are not written)."""
    batch, T, H, P = x.shape
    G = B.shape[2]
    bc_ring, bc_win = bc_products(buffers.ring_b, slots, B, C)        # [b, G, T, L], [b, G, T, T]
    kernel = functools.partial(
        _verify_kernel, grid_order=grid_order, heads_per_group=H // G, block_p=block_p,
        block_n=block_n, window=buffers.ring_x.shape[2], num_tokens=T, fold_dot=fold_dot,
        precision=dot_precision(interpret), eviction=eviction, write_ring=ring_write == "kernel")
    ck, rx = buffers.checkpoint, buffers.ring_x
    return call(
        kernel, name="mamba2_replay_verify",
        grid=_grid(batch, H, P, block_p, grid_order),
        inputs=dict(slots_ref=slots, counts_ref=counts, x_ref=x, b_ref=B, c_ref=C, dt_ref=dt,
                    a_ref=A, d_ref=D, bcr_ref=bc_ring, bcw_ref=bc_win, s_in=ck,
                    rx_in=rx, rb_in=buffers.ring_b, rdt_in=buffers.ring_dt),
        outputs=dict(y_ref=like(x), s_out=like(ck), rx_out=like(rx)),
        aliases={"s_in": "s_out", "rx_in": "rx_out"}, num_warps=num_warps,
        num_stages=num_stages, interpret=interpret)


# --------------------------------------------------------------------------------------------
# Baseline verify: T standard steps, one full state written per window token.
# --------------------------------------------------------------------------------------------
def _standard_verify_kernel(slots_ref, draft_ref, x_ref, b_ref, c_ref, dt_ref, a_ref, d_ref,
                            s_in, y_ref, s_out, *, grid_order, heads_per_group, block_p,
                            block_n, num_tokens):
    b, h, g, _, ps, rows = _row_head_tile(grid_order, heads_per_group, block_p, x_ref.shape[3])
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    a = a_ref[h]
    xs = [load(x_ref.at[b, jnp.int32(s), h, ps], rows).astype(_F32)  # (int32: see _verify_kernel)
          for s in range(num_tokens)]
    dts = [dt_ref[b, s, h] for s in range(num_tokens)]

    def chunk(ns, ys):
        st = load(s_in.at[slot, h, ps, ns], rows).astype(_F32)
        out = []
        for s in range(num_tokens):
            st = jnp.exp(dts[s] * a) * st + (dts[s] * xs[s])[:, None] * b_ref[b, s, g, ns].astype(
                _F32)[None, :]
            dslot = draft_ref[b, s]

            @pl.when(live & (dslot != NULL_SLOT))
            def _(dslot=dslot, st=st):
                store(s_out.at[dslot, h, ps, ns], st.astype(s_out.dtype), rows)
            out.append(ys[s] + jnp.sum(st * c_ref[b, s, g, ns].astype(_F32)[None, :], axis=1))
        return tuple(out)

    ys = n_chunks(s_in.shape[3], block_n, chunk, tuple(jnp.zeros_like(xs[0]) for _ in xs))
    for s in range(num_tokens):
        store(y_ref.at[b, jnp.int32(s), h, ps],
              jnp.where(live, ys[s] + d_ref[h] * xs[s], 0.0).astype(y_ref.dtype), rows)


@functools.partial(jax.jit, static_argnames=("block_p", "block_n", "grid_order", "num_warps",
                                             "num_stages", "interpret"))
def _standard_verify(state, x, B, C, dt, A, D, slots, draft_slots, *, block_p, block_n,
                     grid_order, num_warps, num_stages, interpret):
    batch, T, H, P = x.shape
    G = B.shape[2]
    kernel = functools.partial(_standard_verify_kernel, grid_order=grid_order,
                               heads_per_group=H // G, block_p=block_p, block_n=block_n,
                               num_tokens=T)
    return call(
        kernel, name="mamba2_standard_verify",
        grid=_grid(batch, H, P, block_p, grid_order),
        inputs=dict(slots_ref=slots, draft_ref=draft_slots, x_ref=x, b_ref=B, c_ref=C,
                    dt_ref=dt, a_ref=A, d_ref=D, s_in=state),
        outputs=dict(y_ref=like(x), s_out=like(state)),
        aliases={"s_in": "s_out"}, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret)
