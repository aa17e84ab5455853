"""The dot products a replay step's Mosaic kernels take as inputs, as one Pallas launch (Triton on
a GPU, interpret mode elsewhere): the launch-side twin of `ring.row_products`.

A replay step over a window of T tokens (T = 1: decode) needs, per batch row and group (Mamba-2:
B's groups; GDN: key heads), the products of its slot's L ring rows r_j (ring B; ring keys) with
the window's vectors (C; k and q), and of the window's vectors with each other (B_r . C_t;
k_r . k_t and k_r . q_t). XLA forms the ring's as a gather of the rows, then one multiply-and-sum
per vector (or a batched GEMM beyond `ring.ROW_SUM_MAX_VECTORS` vectors), and the window's as
more small fusions. Here program (row, group) loads its slot's [L, N] rows and the window's
vectors once, every load issued before any product, and forms the products exactly in fp32
(summed in another order than XLA's: equal within fp32 rounding), [L] or [T] of them at a time.
Each load is a power-of-two block: a window is read one [N] row at a time, or as one block of
the next power of two rows with those past T masked (never fetched; their products never
stored), so T may be any size. One warp a program: a tf32x3 dot of the window against the rows
(16-row blocks) took 46-590 us at batch 256 on an H100, 2-8 warps longer still.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, load, store
from pallas_kernels.ring import row_products


def _kernel(slots_ref, ring_ref, *refs, windows, pairs, n_in, T, counted):
    counts_ref, refs = (refs[0], refs[1:]) if counted else (None, refs)
    ins, outs = refs[:n_in], refs[n_in:]
    i, g = pl.program_id(0), pl.program_id(1)
    # a pair's second window as one block of Tp (a power of two) rows, those past T masked
    Tp = pl.next_power_of_2(T)
    ts, live = pl.ds(0, Tp), (None if Tp == T else jnp.arange(Tp) < T)
    # every load issued before any product (each waits on GMEM once, not once a product); with
    # the counts, ring rows past the slot's are not fetched (their products are garbage anyway)
    slot = slots_ref[i]
    committed = (None if counts_ref is None
                 else jnp.arange(ring_ref.shape[2]) < counts_ref[slot])
    ring = load(ring_ref.at[slot, g], committed).astype(F32)                     # [L, N]
    rows = {x: [ins[x][i, t, g].astype(F32) for t in range(T)]                   # T x [N]
            for x in sorted({*windows, *(u for u, _ in pairs)})}
    blocks = {w: load(ins[w].at[i, ts, g], live).astype(F32) for _, w in pairs}  # [Tp, N]
    for x, o_ref in zip(windows, outs):
        for t in range(T):          # r_j . x_t for the L rows j at once
            o_ref[i, g, t] = jnp.sum(ring * rows[x][t][None, :], axis=1)
    for (u, w), o_ref in zip(pairs, outs[len(windows):]):
        for r in range(T):          # u_r . w_t for every t at once
            row = jnp.sum(blocks[w] * rows[u][r][None, :], axis=1)                  # [Tp]
            store(o_ref.at[i, g, jnp.int32(r), ts], row, live)


def products(ring, slots, windows, pairs=(), *, by="xla", counts=None, interpret=False):
    """`window_products`' results formed by `by` (`validation.PRODUCTS`): "xla" (one gather of
    the ring rows, then `ring.row_products` per window and per pair) or "pallas" (the launch;
    counts, if given, spare it the rows past each slot's count; interpret: off the GPU)."""
    if by == "pallas":
        return window_products(ring, slots, windows, pairs, counts=counts, interpret=interpret)
    rows = ring[slots] if windows else None
    return (tuple(row_products(rows, x) for x in windows),
            tuple(row_products(jnp.moveaxis(w, 1, 2), u) for u, w in pairs))


def window_products(ring, slots, windows, pairs=(), *, counts=None, num_warps=1,
                    interpret=False):
    """ring [S, G, L, N] (any float dtype; L and N powers of two), slots [b] int32;
    windows: a tuple of windows x [b, T, G, N] to multiply with the ring's rows, pairs: a tuple
    of (u, w) windows [b, T, G, N] to multiply with each other (any float dtypes; a window given
    twice is read once). Returns (one [b, G, T, L] array per window: r_j . x_t over each row's
    slot's rows, as `ring.row_products(ring[slots], x)`; one [b, G, T (r), T (t)] array per
    pair: u_r . w_t), float32. Ring entries past a slot's count give garbage products: select
    them away. counts [S] int32 (the slots' committed entries), if given: those rows are not
    read (their products are then 0), about half the ring's bytes at a uniform count."""
    distinct, index = [], {}
    for x in (*windows, *(x for pair in pairs for x in pair)):
        if id(x) not in index:
            index[id(x)] = len(distinct)
            distinct.append(x)
    out = _window_products(ring, slots, counts, tuple(distinct),
                           windows=tuple(index[id(x)] for x in windows),
                           pairs=tuple((index[id(u)], index[id(w)]) for u, w in pairs),
                           num_warps=num_warps, interpret=interpret)
    return out[:len(windows)], out[len(windows):]


@functools.partial(jax.jit, static_argnames=("windows", "pairs", "num_warps", "interpret"))
def _window_products(ring, slots, counts, vectors, *, windows, pairs, num_warps, interpret):
    """`window_products` over the distinct windows `vectors`: windows and pairs index them."""
    b, T, G, _ = vectors[0].shape
    L = ring.shape[2]
    out_shape = ((jax.ShapeDtypeStruct((b, G, T, L), F32),) * len(windows)
                 + (jax.ShapeDtypeStruct((b, G, T, T), F32),) * len(pairs))
    return tuple(pl.pallas_call(
        functools.partial(_kernel, windows=windows, pairs=pairs, n_in=len(vectors), T=T,
                          counted=counts is not None),
        grid=(b, G), out_shape=out_shape,
        compiler_params=compiler_params(num_warps, 1, interpret), interpret=interpret,
        name="ring_window_products",
    )(slots, ring, *(() if counts is None else (counts,)), *vectors))
