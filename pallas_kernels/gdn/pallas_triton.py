"""Pallas Triton kernels for Gated DeltaNet decode and verify (`impl="pallas_triton"`/"pallas").

One program per (row, value head, V tile). The standard kernel holds its [block_v, K] state tile
in registers (S k is needed before the update); the replay kernel streams the checkpoint over K in
chunks of block_k. Pools are gathered by slot inside the kernel and updated in place through
input_output_aliases, as in the Mamba-2 kernels.

Launch order (every tiling's `grid_order`, `_kernel_utils.launch_grid`): "row_fastest" launches
the grid (batch, Hv, V // block_v), "row_slowest" (V // block_v, Hv, batch). The GPU hands out
CTAs with the first grid axis (blockIdx.x) fastest, so "row_fastest" runs one head and tile of
consecutive rows side by side, while the programs that share data are those of one row: the ring
keys ring_k[slot, hk] ([L, K], read by every value head of the key head and by every V tile), the
row's q / k vectors, and its slot's state [Hv, V, K], one contiguous region. At batch 256 a row's
programs are then a wave apart, and its shared reads likely miss L2; "row_slowest" makes them
adjacent (the ReplaySSM authors' GDN kernel launches the V tile fastest, then the row): the
decode kernels' default (3-7% faster on the H200, below) and both verify kernels' (572 -> 548 us,
the baseline 789 -> 767). "head_slowest" is the authors' exact order (V tile,
row, head), opt-in until `gpu_session.sh triton-tune-gdn` has timed it (docs/design.md).

The public entries (`standard_decode`, ... with `tiling=` and `interpret=`) take validated
arguments (see `pallas_kernels.gdn.api`) and resolve the tiling to concrete tiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import (
    F32,
    call,
    dot_precision,
    launch_grid,
    like,
    masked_window,
    n_chunks,
    outer_fold,
    program_ids,
    ring_entries,
    stream,
    suffix_sums,
)
from pallas_kernels.gdn.buffers import ring_key_products, verify_key_products, write_window
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, window_positions
from pallas_kernels.validation import (
    EVICTION_POLICIES,
    RING_LOADS,
    RING_SCALARS,
    RING_WRITES,
    bounded_block,
    check_choice,
    fold_uses_dot,
    for_window,
    resolve_tiling,
)

CHUNK_LOOPS = ("fori", "unrolled")


@dataclasses.dataclass(frozen=True)
class GDNTiling:
    """Launch configuration of the standard kernels (the [block_v, K] state tile is held
    whole). block_v bounds the value tile: a kernel uses the largest power of two dividing V,
    at least 4, up to it. `grid_order` (every Triton tiling of both families): the launch order
    of the programs, "row_fastest", "row_slowest" (a row's programs adjacent: its ring / token
    reads shared through L2, its slot's state read as one region; see the module docstring) or
    "head_slowest" (the V tiles of a row, then the rows, of one head)."""
    block_v: int
    num_warps: int
    num_stages: int = 2
    grid_order: str = "row_fastest"


@dataclasses.dataclass(frozen=True)
class GDNReplayTiling:
    """Launch configuration of the replay decode kernel: block_v as in `GDNTiling`, block_k
    bounds the key chunk the checkpoint is streamed in; `fold` is how the fold forms
    sum_j w_j d_j k_j^T: "dot" (tensor cores, tf32x3; needs L and both tiles >= 16), "fma"
    (rank-1 updates) or "auto" (dot where it can). `state_eviction` is the L2 eviction policy
    of the checkpoint reads (`validation.EVICTION_POLICIES`: "evict_first" keeps the read-once
    state from pushing the rings out of L2). `ring_scalars` is where k_j . k and k_j . q come
    from: "kernel" (every program reads the ring keys of its slot, [L, K]) or "xla" (one
    einsum per step computes them per key head; programs read [L] scalars, and the ring keys
    only to fold). `grid_order` as in `GDNTiling`. `chunk_loop` is how the K chunks are walked:
    "fori" (a loop; the Triton pipeliner overlaps `num_stages` chunks) or "unrolled" (straight-
    line code that issues every checkpoint chunk of the read-only pass right after the slot
    load, before the count and the ring loads that depend on it: a [block_v, K] tile in flight
    per program, as the ReplaySSM authors' kernel gets from its 2-chunk loop at num_stages 3).
    `ring_loads` is which ring rows a program fetches (`validation.RING_LOADS`): "committed"
    (those below the count: half the ring on average, but the loads wait on the count's) or
    "all" (L rows, the garbage ones selected away: one dependent memory round trip fewer, which
    matters at small batch)."""
    block_v: int
    block_k: int
    num_warps: int
    num_stages: int = 2
    fold: str = "auto"
    state_eviction: str = "evict_normal"
    ring_scalars: str = "kernel"
    grid_order: str = "row_fastest"
    chunk_loop: str = "fori"
    ring_loads: str = "committed"

    def key_block(self, num_tokens: int) -> int:
        return self.block_k


@dataclasses.dataclass(frozen=True)
class GDNVerifyTiling:
    """Launch configuration of the replay verify kernel, as `GDNReplayTiling` except that the key
    chunk depends on the window: the kernel keeps T accumulators per key chunk, so larger T wants
    narrower chunks. block_k bounds it for T <= 2, block_k_long for T > 2. (The ring key
    products always come from XLA here.) `ring_write` is who writes the window's d into the
    ring (`validation.RING_WRITES`): "xla" after the kernel, or "kernel" (each program its own
    [T, bv] rows; k and g stay XLA's)."""
    block_v: int
    block_k: int
    block_k_long: int
    num_warps: int
    num_stages: int = 2
    fold: str = "auto"
    state_eviction: str = "evict_normal"
    grid_order: str = "row_fastest"
    ring_write: str = "xla"

    def key_block(self, num_tokens: int) -> int:
        return self.block_k if num_tokens <= 2 else self.block_k_long


# Tilings measured on an H200 at batch 256, fp32 state (docs/benchmarks.md). Seventh session
# (`gpu_session.sh triton-tune`, Qwen3-Next shapes): row-slowest launches took the standard
# kernel 292 -> 284 us and the replay (staggered) 223 -> 208. The replay kernel alone took 204
# with ring_scalars "xla" and evict_first reads, but that run did not count the XLA einsum
# "xla" adds (a gather of the ring keys, ~34 MB a step at batch 256: more than the 4 us saved),
# so both stay off until `bench kernels` (which now counts every kernel of a step) says otherwise.
STANDARD_TILING = GDNTiling(block_v=128, num_warps=8, grid_order="row_slowest")
REPLAY_TILING = GDNReplayTiling(block_v=64, block_k=64, num_warps=4, grid_order="row_slowest")
# verify batch 256 sweep: T = 2 2.19x the baseline at block_k 32 vs 1.72x at 16; T = 4 2.01x at
# 16 vs 1.90x; T = 8 1.65x vs 1.38x. Both verify kernels launch row-slowest (eighth session,
# batch 256, T = 4): this one 572 -> 548 us, the baseline 789 -> 767.
# Small batches (thirteenth session, `gpu_session.sh b1-tune` and `small-batch`, Qwen3-Next
# shapes): one row launches Hv * V / block_v programs, 32 for the standard kernel at block_v 128
# on 132 SMs. 16-wide value tiles took the standard 5.0 -> 2.9 us at 1 row, 5.3 -> 4.1 at 2,
# 7.0 -> 5.8 at 4 (10.7 -> 10.4 at 8); 32-wide the replay 4.6 -> 4.0, 5.2 -> 4.8, 6.8 -> 6.3
# (at 8 rows 64 wins: 10.1 vs 10.9).
SMALL_BATCH_ROWS = 4
SMALL_BATCH_TILINGS = {
    STANDARD_TILING: dataclasses.replace(STANDARD_TILING, block_v=16),
    REPLAY_TILING: dataclasses.replace(REPLAY_TILING, block_v=32),
}
# Fourteenth session (`gdn-b1`, 1 row): the replay's ring loads freed of the count's
# (ring_loads "all") and its key chunks unrolled, 4.0 -> 3.4 us (each alone 3.8 / 3.7;
# ring_scalars "xla" 6.3, 1 or 3 stages 4.0 / 3.9, block_k 32 / 128 4.9 / 3.9, evict_first
# 4.1). Fifteenth: 4.7 -> 4.4 at 2 rows, but 6.3 -> 6.6 at 4 (the standard 2.9 / 4.1 / 5.8).
TINY_BATCH_ROWS = 2
TINY_BATCH_TILINGS = {
    SMALL_BATCH_TILINGS[REPLAY_TILING]: dataclasses.replace(
        SMALL_BATCH_TILINGS[REPLAY_TILING], ring_loads="all", chunk_loop="unrolled"),
}
VERIFY_TILING = GDNVerifyTiling(block_v=64, block_k=32, block_k_long=16, num_warps=4,
                                grid_order="row_slowest")
# The state-per-draft baseline's own (batch 256, T = 4, 2026-11-30 sweep): 4 warps 795 us (80% of
# copy bandwidth) vs 1214 us with the decode kernel's 8 warps and 858 us at block_v 64.
# Eleventh session (batch 256): at T = 8 block_v 128 took 3,905 us (29% of copy bandwidth),
# 64 1,372-1,636 and 32 1,307 (87%); 32 is also the fastest at T = 2 (434 vs 501 us) and T = 4
# (747 vs 767-773). Twelfth session: block_v 16 is faster still at every T: 425.3 vs 429.9 us
# (T = 2), 721.8 vs 748.4 (T = 4), 1,296.1 vs 1,308.6 (T = 8; 88-89% of copy).
# Stop 46 (T = 4): fla's decode launch, [8, K] tiles on one warp in 3 stages, 712.1 -> 702.1 us
# (90% of copy; block_v 16 on 1 / 2 warps 710.3 / 726.4). Stop 47 (an H100): T = 8 1,746.1 ->
# 1,728.5 us with it, T = 2 even (562.2 / 563.7): block_v 16 stays at T = 2.
STANDARD_VERIFY_TILING = GDNTiling(block_v=16, num_warps=4, grid_order="row_slowest")
STANDARD_VERIFY_TILINGS = (
    (2, STANDARD_VERIFY_TILING),
    (MAX_VERIFY_TOKENS, GDNTiling(block_v=8, num_warps=1, num_stages=3,
                                  grid_order="row_slowest")))


def standard_verify_tiling(T):
    """The state-per-draft baseline's measured tiling for a window of T tokens."""
    return for_window(STANDARD_VERIFY_TILINGS, T)


def for_shape(tiling, rows):
    """The measured tiling a kernel whose default is `tiling` runs at `rows` rows a step: its
    small-batch variant (`SMALL_BATCH_TILINGS`) at up to SMALL_BATCH_ROWS rows, then that
    one's (`TINY_BATCH_TILINGS`) at up to TINY_BATCH_ROWS."""
    if rows <= SMALL_BATCH_ROWS:
        tiling = SMALL_BATCH_TILINGS.get(tiling, tiling)
    if rows <= TINY_BATCH_ROWS:
        tiling = TINY_BATCH_TILINGS.get(tiling, tiling)
    return tiling


_MIN_BLOCK_V = 4


def _tiles(tiling, default, V, K=None, window=None, num_tokens=1):
    """The launch keywords of a tiling (None: `default`) for value dim V (tiles, launch order,
    warps, stages); with key dim K and the ring window L, also the key chunk (for a window of
    `num_tokens`), the fold mode, the state's eviction policy and (replay decode) where the ring
    scalars come from and how its K chunks are walked; verify: who writes the ring's d)."""
    t = resolve_tiling(tiling, default)
    tiles = dict(block_v=bounded_block("block_v", "value dim V", V, t.block_v, _MIN_BLOCK_V))
    if K is not None:
        tiles["block_k"] = bounded_block("block_k", "key dim K", K, t.key_block(num_tokens))
        tiles["fold_dot"] = fold_uses_dot(t.fold, window, **tiles)
        check_choice("state_eviction", t.state_eviction, EVICTION_POLICIES)
        tiles["eviction"] = t.state_eviction
    if hasattr(t, "ring_scalars"):
        check_choice("ring_scalars", t.ring_scalars, RING_SCALARS)
        tiles["ring_scalars"] = t.ring_scalars
    if hasattr(t, "chunk_loop"):
        check_choice("chunk_loop", t.chunk_loop, CHUNK_LOOPS)
        tiles["unrolled"] = t.chunk_loop == "unrolled"
    if hasattr(t, "ring_loads"):
        check_choice("ring_loads", t.ring_loads, RING_LOADS)
        tiles["all_ring_rows"] = t.ring_loads == "all"
    if hasattr(t, "ring_write"):
        check_choice("ring_write", t.ring_write, RING_WRITES)
        tiles["ring_write"] = t.ring_write
    return dict(tiles, grid_order=t.grid_order, num_warps=t.num_warps, num_stages=t.num_stages)


def standard_decode(state, q, k, v, g, beta, slots, *, tiling, interpret):
    return _standard_decode(state, q, k, v, g, beta, slots, interpret=interpret,
                            **_tiles(tiling, for_shape(STANDARD_TILING, v.shape[0]),
                                     v.shape[2]))


def replay_decode(buffers, counts, q, k, v, g, beta, slots, *, tiling, interpret):
    return _replay_decode(buffers, counts, q, k, v, g, beta, slots, interpret=interpret,
                          **_tiles(tiling, for_shape(REPLAY_TILING, v.shape[0]), v.shape[2],
                                   k.shape[2], buffers.window))


def replay_verify(buffers, counts, q, k, v, g, beta, slots, *, tiling, interpret):
    tiles = _tiles(tiling, VERIFY_TILING, v.shape[3], k.shape[3], buffers.window,
                   num_tokens=v.shape[1])
    o, d, ck, rd = _replay_verify(buffers, counts, q, k, v, g, beta, slots, interpret=interpret,
                                  **tiles)
    in_kernel = tiles["ring_write"] == "kernel"
    return o, write_window(buffers._replace(checkpoint=ck, ring_d=rd), counts, slots, k,
                           None if in_kernel else d, g)


def standard_verify(state, q, k, v, g, beta, slots, draft_slots, *, tiling, interpret):
    return _standard_verify(state, q, k, v, g, beta, slots, draft_slots, interpret=interpret,
                            **_tiles(tiling, standard_verify_tiling(v.shape[1]), v.shape[3]))


def _program(grid_order, heads_per_key_head, block_v):
    """(row b, value head hv, key head hk, V tile t, the tile's slice) of this program, launched
    by `launch_grid((batch, Hv, V // block_v), grid_order)`."""
    b, hv, t = program_ids(grid_order)
    return b, hv, hv // heads_per_key_head, t, pl.ds(t * block_v, block_v)


# --------------------------------------------------------------------------------------------
# Standard decode: reads and writes the state of every row every step.
# --------------------------------------------------------------------------------------------
def _standard_kernel(slots_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, s_in, o_ref, s_out, *,
                     grid_order, heads_per_key_head, block_v):
    b, hv, hk, _, vs = _program(grid_order, heads_per_key_head, block_v)
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    q = q_ref[b, hk, :].astype(F32)                   # [K]
    k = k_ref[b, hk, :].astype(F32)
    v = v_ref[b, hv, vs].astype(F32)                  # [bv]
    alpha = jnp.exp(g_ref[b, hv])
    s = s_in[slot, hv, vs, :].astype(F32)             # [bv, K]
    d = beta_ref[b, hv] * (v - alpha * jnp.sum(s * k[None, :], axis=1))
    s = alpha * s + d[:, None] * k[None, :]
    o_ref[b, hv, vs] = jnp.where(live, jnp.sum(s * q[None, :], axis=1), 0.0).astype(o_ref.dtype)

    @pl.when(live)
    def _():
        s_out[slot, hv, vs, :] = s.astype(s_out.dtype)


@functools.partial(jax.jit, static_argnames=("block_v", "grid_order", "num_warps", "num_stages",
                                             "interpret"))
def _standard_decode(state, q, k, v, g, beta, slots, *, block_v, grid_order, num_warps,
                     num_stages, interpret):
    batch, Hv, V = v.shape
    Hk = q.shape[1]
    kernel = functools.partial(_standard_kernel, grid_order=grid_order,
                               heads_per_key_head=Hv // Hk, block_v=block_v)
    return call(
        kernel, name="gdn_standard_decode",
        grid=launch_grid((batch, Hv, V // block_v), grid_order),
        inputs=dict(slots_ref=slots, q_ref=q, k_ref=k, v_ref=v, g_ref=g, beta_ref=beta,
                    s_in=state),
        outputs=dict(o_ref=like(v), s_out=like(state)),
        aliases={"s_in": "s_out"}, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret)


# --------------------------------------------------------------------------------------------
# ReplaySSM decode (T = 1): S k and S q from checkpoint + ring, state written on folds only.
# --------------------------------------------------------------------------------------------
def _walk_chunks(n, block, body, init, unrolled):
    """`n_chunks` (a fori_loop over chunks of a dimension of size n; body(slice, carry) ->
    carry), or the same chunks as straight-line code when `unrolled`."""
    if not unrolled:
        return n_chunks(n, block, body, init)
    for i in range(n // block):
        init = body(pl.ds(i * block, block), init)
    return init


def _replay_kernel(slots_ref, counts_ref, q_ref, k_ref, v_ref, g_ref, beta_ref,
                   s_in, rk_in, rd_in, rg_in, rkx_ref, o_ref, s_out, rk_out, rd_out, rg_out, *,
                   grid_order, heads_per_key_head, block_v, block_k, window, fold_dot, precision,
                   eviction, unrolled, all_ring_rows):
    # rkx_ref: None (the readout forms k_j . k, k_j . q from the ring keys) or [b, Hk, 2, L]
    # float32, those products precomputed per key head (ring_scalars="xla"). all_ring_rows:
    # the read-only pass fetches all L ring rows (`ring_entries` with no count).
    b, hv, hk, t, vs = _program(grid_order, heads_per_key_head, block_v)
    L, K = window, s_in.shape[3]
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    # unrolled: every checkpoint chunk is loaded here, before the count (a second dependent
    # load) and the ring reads that wait on it; in-order issue would otherwise hold the state
    # stream back by one memory round trip. {chunk start: [bv, bk] tile}.
    early = ({i: stream(s_in.at[slot, hv, vs, pl.ds(i, block_k)], eviction)
              for i in range(0, K, block_k)} if unrolled else {})
    c = counts_ref[slot]
    # Only the committed ring entries are fetched (masked loads: ~half the ring on average), or
    # with all_ring_rows all of them, the garbage ones selected away below.
    rc = None if all_ring_rows else c
    ring_d = ring_entries(rd_in.at[slot, hv, :, vs], rc)                    # [L, bv]
    ring_g = ring_entries(rg_in.at[slot, hv, :], rc)                        # [L]
    v = v_ref[b, hv, vs].astype(F32)                  # [bv]
    g, beta = g_ref[b, hv], beta_ref[b, hv]

    # Read-only pass over the checkpoint: S0 k, S0 q (and k_j . k, k_j . q for every ring entry
    # when they do not come precomputed).
    def readout(ks, carry):
        s0k, s0q, rkk, rkq, kq = carry
        kc = k_ref[b, hk, ks].astype(F32)
        qc = q_ref[b, hk, ks].astype(F32)
        s0 = (early[ks.start] if unrolled                                   # [bv, bk]
              else stream(s_in.at[slot, hv, vs, ks], eviction)).astype(F32)
        if rkx_ref is None:
            rk = ring_entries(rk_in.at[slot, hk, :, ks], rc).astype(F32)  # [L, bk]
            rkk = rkk + jnp.sum(rk * kc[None, :], axis=1)
            rkq = rkq + jnp.sum(rk * qc[None, :], axis=1)
        return (s0k + jnp.sum(s0 * kc[None, :], axis=1), s0q + jnp.sum(s0 * qc[None, :], axis=1),
                rkk, rkq, kq + jnp.sum(kc * qc))

    zv, zl = jnp.zeros((block_v,), F32), jnp.zeros((L,), F32)
    s0k, s0q, rkk, rkq, kq = _walk_chunks(K, block_k, readout,
                                          (zv, zv, zl, zl, jnp.float32(0)), unrolled)
    if rkx_ref is not None:
        rkk, rkq = rkx_ref[b, hk, 0, :], rkx_ref[b, hk, 1, :]

    j = lax.broadcasted_iota(jnp.int32, (L,), 0)
    valid, cur = j < c, j == c
    g_hist = jnp.where(valid, ring_g, 0.0)
    e = jnp.exp(suffix_sums(g_hist))                  # e_j = exp(sum_{j<i<c} g_i)
    big_e = jnp.exp(jnp.sum(g_hist))
    d_hist = jnp.where(valid[:, None], ring_d.astype(F32), 0.0)             # [L, bv]
    sk = big_e * s0k + jnp.sum(jnp.where(valid, e * rkk, 0.0)[:, None] * d_hist, axis=0)
    sq = big_e * s0q + jnp.sum(jnp.where(valid, e * rkq, 0.0)[:, None] * d_hist, axis=0)
    alpha = jnp.exp(g)
    d = beta * (v - alpha * sk)                                              # [bv]
    o_ref[b, hv, vs] = jnp.where(live, alpha * sq + d * kq, 0.0).astype(o_ref.dtype)

    # Fold (one step in L): S0 <- exp(sum g) S0 + sum_j w_j d_j k_j^T over ring + current token.
    @pl.when(live & (c == L - 1))
    def _fold():
        g_win = jnp.where(valid, ring_g, jnp.where(cur, g, 0.0))
        w = jnp.exp(suffix_sums(g_win))
        decay = jnp.exp(jnp.sum(g_win))
        wd = w[:, None] * masked_window(valid, cur, ring_d, d)              # [L, bv]

        def fold_chunk(ks, carry):
            kw = masked_window(valid, cur, ring_entries(rk_in.at[slot, hk, :, ks], c),
                               k_ref[b, hk, ks].astype(F32))                # [L, bk]
            s0 = s_in[slot, hv, vs, ks].astype(F32)
            upd = outer_fold(wd, kw, precision, fold_dot)                   # [bv, bk]
            s_out[slot, hv, vs, ks] = (decay * s0 + upd).astype(s_out.dtype)
            return carry
        _walk_chunks(K, block_k, fold_chunk, 0, unrolled)

    # Append (k, d, g) at `c` (after a fold it lies past the reset count: harmless).
    @pl.when(live)
    def _append():
        rd_out[slot, hv, c, vs] = d.astype(rd_out.dtype)

        @pl.when(t == 0)
        def _():
            rg_out[slot, hv, c] = g

            @pl.when(hv % heads_per_key_head == 0)
            def _():
                rk_out[slot, hk, c, :] = k_ref[b, hk, :].astype(rk_out.dtype)


@functools.partial(jax.jit, static_argnames=("block_v", "block_k", "fold_dot", "eviction",
                                             "ring_scalars", "unrolled", "all_ring_rows",
                                             "grid_order", "num_warps", "num_stages",
                                             "interpret"))
def _replay_decode(buffers, counts, q, k, v, g, beta, slots, *, block_v, block_k, fold_dot,
                   eviction, ring_scalars, unrolled, all_ring_rows, grid_order, num_warps,
                   num_stages, interpret):
    batch, Hv, V = v.shape
    Hk = q.shape[1]
    L = buffers.ring_k.shape[2]
    rkx = (jnp.concatenate(ring_key_products(buffers.ring_k, slots, k[:, None], q[:, None]),
                           axis=2) if ring_scalars == "xla" else None)     # [b, Hk, 2, L]
    kernel = functools.partial(
        _replay_kernel, grid_order=grid_order, heads_per_key_head=Hv // Hk, block_v=block_v,
        block_k=block_k, window=L, fold_dot=fold_dot, precision=dot_precision(interpret),
        eviction=eviction, unrolled=unrolled, all_ring_rows=all_ring_rows)
    o, *new = call(
        kernel, name="gdn_replay_decode",
        grid=launch_grid((batch, Hv, V // block_v), grid_order),
        inputs=dict(slots_ref=slots, counts_ref=counts, q_ref=q, k_ref=k, v_ref=v, g_ref=g,
                    beta_ref=beta, s_in=buffers.checkpoint, rk_in=buffers.ring_k,
                    rd_in=buffers.ring_d, rg_in=buffers.ring_g, rkx_ref=rkx),
        outputs=dict(o_ref=like(v), s_out=like(buffers.checkpoint), rk_out=like(buffers.ring_k),
                     rd_out=like(buffers.ring_d), rg_out=like(buffers.ring_g)),
        aliases={"s_in": "s_out", "rk_in": "rk_out", "rd_in": "rd_out", "rg_in": "rg_out"},
        num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    return o, type(buffers)(*new)


# --------------------------------------------------------------------------------------------
# ReplaySSM verify (T window tokens): one-chunk WY/UT form. With S_w the committed state at the
# window start and G_s = sum_{r<=s} g_r:
#   d_s = beta_s (v_s - e^{G_s} S_w k_s) - sum_{r<s} beta_s e^{G_s-G_r} (k_r . k_s) d_r
#   o_s = e^{G_s} S_w q_s + sum_{r<=s} e^{G_s-G_r} (k_r . q_s) d_r
# S_w k and S_w q come from checkpoint + ring without forming S_w. Rows with c + T >= L fold
# ring[0:c] + window[0]. The ring is written by the caller from the returned d (with
# ring_write="kernel", its d rows by the kernel itself).
# --------------------------------------------------------------------------------------------
def _verify_kernel(slots_ref, counts_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, rkk_ref,
                   rkq_ref, wkk_ref, wkq_ref, s_in, rk_in, rd_in, rg_in, o_ref, d_ref, s_out,
                   rd_out, *, grid_order, heads_per_key_head, block_v, block_k, window,
                   num_tokens, fold_dot, precision, eviction, write_ring):
    # One pass over the checkpoint serves all T tokens: per state chunk, mat-vecs S0 k_t and
    # S0 q_t (the decode kernel's readout, T times). The key products (ring x window, window x
    # window) are per key head, not per program: they come precomputed (rkk/rkq/wkk/wkq_ref).
    # Every per-token value is a [bv] / [L] vector or a scalar (no [T, tile, chunk] products).
    b, hv, hk, _, vs = _program(grid_order, heads_per_key_head, block_v)
    L, K, T = window, s_in.shape[3], num_tokens
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    c = counts_ref[slot]
    ring_d = ring_entries(rd_in.at[slot, hv, :, vs], c)                     # [L, bv]
    ring_g = ring_entries(rg_in.at[slot, hv, :], c)                         # [L]
    vs_ = [v_ref[b, t, hv, vs].astype(F32) for t in range(T)]             # T x [bv]
    gs = [g_ref[b, t, hv] for t in range(T)]                               # T scalars
    betas = [beta_ref[b, t, hv] for t in range(T)]
    rkk = [rkk_ref[b, hk, t, :] for t in range(T)]                         # T x [L] k_j . k_t
    rkq = [rkq_ref[b, hk, t, :] for t in range(T)]                         # T x [L] k_j . q_t
    pairs = [(r, t) for t in range(T) for r in range(t + 1)]               # r <= t
    wkk = {rt: wkk_ref[b, hk, rt[0], rt[1]] for rt in pairs}               # k_r . k_t
    wkq = {rt: wkq_ref[b, hk, rt[0], rt[1]] for rt in pairs}               # k_r . q_t

    def readout(ks, carry):
        s0 = stream(s_in.at[slot, hv, vs, ks], eviction).astype(F32)      # [bv, bk]
        s0k, s0q = carry
        return (tuple(acc + jnp.sum(s0 * k_ref[b, t, hk, ks].astype(F32)[None, :], axis=1)
                      for t, acc in enumerate(s0k)),
                tuple(acc + jnp.sum(s0 * q_ref[b, t, hk, ks].astype(F32)[None, :], axis=1)
                      for t, acc in enumerate(s0q)))

    zt = (jnp.zeros((block_v,), F32),) * T
    s0k, s0q = n_chunks(K, block_k, readout, (zt, zt))

    j = lax.broadcasted_iota(jnp.int32, (L,), 0)
    valid = j < c
    g_hist = jnp.where(valid, ring_g, 0.0)
    e = jnp.exp(suffix_sums(g_hist))
    big_e = jnp.exp(jnp.sum(g_hist))
    d_hist = jnp.where(valid[:, None], ring_d.astype(F32), 0.0)                  # [L, bv]

    def through_history(s0x, rkx):                   # S_w x for one window token: [bv]
        w = jnp.where(valid, e * rkx, 0.0)                                       # [L]
        return big_e * s0x + jnp.sum(w[:, None] * d_hist, axis=0)

    cum = [sum(gs[:t + 1]) for t in range(T)]        # G_t = sum_{r <= t} g_r
    ds = []
    for t in range(T):                               # forward substitution, T <= 8
        corr = jnp.exp(cum[t]) * through_history(s0k[t], rkk[t])
        for r in range(t):
            corr = corr + jnp.exp(cum[t] - cum[r]) * wkk[r, t] * ds[r]
        ds.append(betas[t] * (vs_[t] - corr))
        o = jnp.exp(cum[t]) * through_history(s0q[t], rkq[t])
        for r in range(t + 1):
            o = o + jnp.exp(cum[t] - cum[r]) * wkq[r, t] * ds[r]
        o_ref[b, t, hv, vs] = jnp.where(live, o, 0.0).astype(o_ref.dtype)
        if not write_ring:
            d_ref[b, t, hv, vs] = ds[t]

    @pl.when(live & (c + T >= L))
    def _fold():
        cur = j == c
        g_win = jnp.where(valid, ring_g, jnp.where(cur, gs[0], 0.0))
        w = jnp.exp(suffix_sums(g_win))
        decay = jnp.exp(jnp.sum(g_win))
        wd = w[:, None] * masked_window(valid, cur, ring_d, ds[0])              # [L, bv]

        def fold_chunk(ks, carry):
            kw = masked_window(valid, cur, ring_entries(rk_in.at[slot, hk, :, ks], c),
                               k_ref[b, 0, hk, ks].astype(F32))                  # [L, bk]
            s0 = s_in[slot, hv, vs, ks].astype(F32)
            s_out[slot, hv, vs, ks] = (decay * s0 + outer_fold(wd, kw, precision, fold_dot)
                                       ).astype(s_out.dtype)
            return carry
        n_chunks(K, block_k, fold_chunk, 0)

    if not write_ring:
        return
    # The window's d into the ring (ring_write="kernel"; `write_window_rings`' positions): these
    # rows [L, bv] are this program's alone, and it read them above.
    for t, pos in enumerate(window_positions(c, T, L)):
        @pl.when(live & (pos >= 0))
        def _(t=t, pos=pos):
            rd_out[slot, hv, pos, vs] = ds[t].astype(rd_out.dtype)


@functools.partial(jax.jit, static_argnames=("block_v", "block_k", "fold_dot", "eviction",
                                             "ring_write", "grid_order", "num_warps",
                                             "num_stages", "interpret"))
def _replay_verify(buffers, counts, q, k, v, g, beta, slots, *, block_v, block_k, fold_dot,
                   eviction, ring_write, grid_order, num_warps, num_stages, interpret):
    """Window inputs q, k [b, T, Hk, K], v [b, T, Hv, V], g, beta [b, T, Hv]. Returns
    o [b, T, Hv, V], the window's d [b, T, Hv, V] float32 (not written if ring_write is
    "kernel"), the checkpoint pool and the ring_d pool (in place: with the window's d if
    ring_write is "kernel", else unchanged; k and g are not written)."""
    batch, T, Hv, V = v.shape
    Hk = q.shape[2]
    # [b, Hk, T, L] (ring x window), [b, Hk, T, T] (window x window)
    rkk, rkq, wkk, wkq = verify_key_products(buffers.ring_k, slots, k, q)
    kernel = functools.partial(
        _verify_kernel, grid_order=grid_order, heads_per_key_head=Hv // Hk, block_v=block_v,
        block_k=block_k, window=buffers.ring_k.shape[2], num_tokens=T, fold_dot=fold_dot,
        precision=dot_precision(interpret), eviction=eviction, write_ring=ring_write == "kernel")
    return call(
        kernel, name="gdn_replay_verify",
        grid=launch_grid((batch, Hv, V // block_v), grid_order),
        inputs=dict(slots_ref=slots, counts_ref=counts, q_ref=q, k_ref=k, v_ref=v, g_ref=g,
                    beta_ref=beta, rkk_ref=rkk, rkq_ref=rkq, wkk_ref=wkk, wkq_ref=wkq,
                    s_in=buffers.checkpoint, rk_in=buffers.ring_k, rd_in=buffers.ring_d,
                    rg_in=buffers.ring_g),
        outputs=dict(o_ref=like(v), d_ref=jax.ShapeDtypeStruct(v.shape, F32),
                     s_out=like(buffers.checkpoint), rd_out=like(buffers.ring_d)),
        aliases={"s_in": "s_out", "rd_in": "rd_out"}, num_warps=num_warps,
        num_stages=num_stages, interpret=interpret)


# --------------------------------------------------------------------------------------------
# Baseline verify: T standard steps, one full state written per window token.
# --------------------------------------------------------------------------------------------
def _standard_verify_kernel(slots_ref, draft_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, s_in,
                            o_ref, s_out, *, grid_order, heads_per_key_head, block_v,
                            num_tokens):
    b, hv, hk, _, vs = _program(grid_order, heads_per_key_head, block_v)
    slot = slots_ref[b]
    live = slot != NULL_SLOT
    s = s_in[slot, hv, vs, :].astype(F32)             # [bv, K]
    for t in range(num_tokens):
        q = q_ref[b, t, hk, :].astype(F32)
        k = k_ref[b, t, hk, :].astype(F32)
        alpha = jnp.exp(g_ref[b, t, hv])
        d = beta_ref[b, t, hv] * (v_ref[b, t, hv, vs].astype(F32)
                                  - alpha * jnp.sum(s * k[None, :], axis=1))
        s = alpha * s + d[:, None] * k[None, :]
        o_ref[b, t, hv, vs] = jnp.where(live, jnp.sum(s * q[None, :], axis=1), 0.0
                                        ).astype(o_ref.dtype)
        dslot = draft_ref[b, t]

        @pl.when(live & (dslot != NULL_SLOT))
        def _(dslot=dslot, s=s):
            s_out[dslot, hv, vs, :] = s.astype(s_out.dtype)


@functools.partial(jax.jit, static_argnames=("block_v", "grid_order", "num_warps", "num_stages",
                                             "interpret"))
def _standard_verify(state, q, k, v, g, beta, slots, draft_slots, *, block_v, grid_order,
                     num_warps, num_stages, interpret):
    batch, T, Hv, V = v.shape
    Hk = q.shape[2]
    kernel = functools.partial(_standard_verify_kernel, grid_order=grid_order,
                               heads_per_key_head=Hv // Hk, block_v=block_v, num_tokens=T)
    return call(
        kernel, name="gdn_standard_verify",
        grid=launch_grid((batch, Hv, V // block_v), grid_order),
        inputs=dict(slots_ref=slots, draft_ref=draft_slots, q_ref=q, k_ref=k, v_ref=v, g_ref=g,
                    beta_ref=beta, s_in=state),
        outputs=dict(o_ref=like(v), s_out=like(state)),
        aliases={"s_in": "s_out"}, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret)
