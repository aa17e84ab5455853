"""The dot products a replay step's Mosaic kernels take as inputs, as one Pallas launch (Triton on
a GPU, interpret mode elsewhere): the launch-side twin of `ring.row_products`.

A replay step over a window of T tokens (T = 1: decode) needs, per batch row and group (Mamba-2:
B's groups; GDN: key heads), the products of its slot's L ring rows r_j (ring B; ring keys) with
the window's vectors (C; k and q), and of the window's vectors with each other (B_r . C_t;
k_r . k_t and k_r . q_t). XLA forms the ring's as a gather of the rows, then one multiply-and-sum
per vector (or a batched GEMM beyond `ring.ROW_SUM_MAX_VECTORS` vectors), and the window's as
more small fusions. Here program (row, group) loads its slot's [L, N] rows and each distinct
window [T, N] once, and forms each set of products as one dot, x_t . r_j for all t, j (tf32x3 on
a GPU: fp32 accuracy on the tensor cores; products summed over N on the FMA units cost far more
than the loads: 167 against 22 us at T = 8, batch 256, on an H100). Triton's dots take blocks of
>= 16 rows: a window (or a ring) is read as a block of the next power of two >= 16 rows, the
rows past it masked (never fetched; their products never stored), so T may be any size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, dot_precision, load, store

_MIN_ROWS = 16      # Triton's dots take blocks of >= 16 rows


def _rows(n):
    """(slice, mask or None) of a block over the first n rows: a power of two >= _MIN_ROWS."""
    m = max(_MIN_ROWS, pl.next_power_of_2(n))
    return pl.ds(0, m), (None if m == n else jnp.arange(m) < n)


def _kernel(slots_ref, ring_ref, *refs, windows, pairs, n_in, T, L, precision):
    ins, outs = refs[:n_in], refs[n_in:]
    i, g = pl.program_id(0), pl.program_id(1)
    (ts, t_live), (js, j_live) = _rows(T), _rows(L)
    # every load issued before any product: the ring's rows, each distinct window once
    ring = load(ring_ref.at[slots_ref[i], g, js], j_live).astype(F32)              # [Lp, N]
    xs = [load(ref.at[i, ts, g], t_live).astype(F32) for ref in ins]               # [Tp, N]
    dot = lambda x, y: lax.dot_general(x, y, (((1,), (1,)), ((), ())), precision=precision,
                                       preferred_element_type=F32)
    for x, o_ref in zip(windows, outs):
        store(o_ref.at[i, g, ts, js], dot(xs[x], ring), _mask(t_live, j_live, ts, js))
    for (u, w), o_ref in zip(pairs, outs[len(windows):]):
        store(o_ref.at[i, g, ts, ts], dot(xs[u], xs[w]), _mask(t_live, t_live, ts, ts))


def _mask(a, b, sa, sb):
    """The [len a, len b] store mask of rows a and columns b (None: all of them), or None."""
    if a is None and b is None:
        return None
    a = jnp.ones((sa.size,), bool) if a is None else a
    b = jnp.ones((sb.size,), bool) if b is None else b
    return a[:, None] & b[None, :]


def window_products(ring, slots, windows, pairs=(), *, num_warps=1, interpret=False):
    """ring [S, G, L, N] (any float dtype; L and N powers of two, N >= 16), slots [b] int32;
    windows: a tuple of windows x [b, T, G, N] to multiply with the ring's rows, pairs: a tuple
    of (u, w) windows [b, T, G, N] to multiply with each other (any float dtypes; a window given
    twice is read once). Returns (one [b, G, T, L] array per window: r_j . x_t over each row's
    slot's rows, as `ring.row_products(ring[slots], x)`; one [b, G, T (r), T (t)] array per
    pair: u_r . w_t), float32 (tf32x3 dots on a GPU). Ring entries past a slot's count give
    garbage products: select them away."""
    distinct, index = [], {}
    for x in (*windows, *(x for pair in pairs for x in pair)):
        if id(x) not in index:
            index[id(x)] = len(distinct)
            distinct.append(x)
    out = _window_products(ring, slots, tuple(distinct),
                           windows=tuple(index[id(x)] for x in windows),
                           pairs=tuple((index[id(u)], index[id(w)]) for u, w in pairs),
                           num_warps=num_warps, interpret=interpret)
    return out[:len(windows)], out[len(windows):]


@functools.partial(jax.jit, static_argnames=("windows", "pairs", "num_warps", "interpret"))
def _window_products(ring, slots, vectors, *, windows, pairs, num_warps, interpret):
    """`window_products` over the distinct windows `vectors`: windows and pairs index them."""
    b, T, G, _ = vectors[0].shape
    L = ring.shape[2]
    out_shape = ((jax.ShapeDtypeStruct((b, G, T, L), F32),) * len(windows)
                 + (jax.ShapeDtypeStruct((b, G, T, T), F32),) * len(pairs))
    return tuple(pl.pallas_call(
        functools.partial(_kernel, windows=windows, pairs=pairs, n_in=len(vectors), T=T, L=L,
                          precision=dot_precision(interpret)),
        grid=(b, G), out_shape=out_shape,
        compiler_params=compiler_params(num_warps, 1, interpret), interpret=interpret,
        name="ring_window_products",
    )(slots, ring, *vectors))
