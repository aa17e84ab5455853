"""The dot products a replay step's Mosaic kernels take as inputs, as one Pallas launch (Triton on
a GPU, interpret mode elsewhere): the launch-side twin of `ring.row_products`.

A replay step over a window of T tokens (T = 1: decode) needs, per batch row and group (Mamba-2:
B's groups; GDN: key heads), the products of its slot's L ring rows r_j (ring B; ring keys) with
the window's vectors (C; k and q), and of the window's vectors with each other (B_r . C_t;
k_r . k_t and k_r . q_t). XLA forms the ring's as a gather of the rows, then one multiply-and-sum
per vector (or a batched GEMM beyond `ring.ROW_SUM_MAX_VECTORS` vectors), and the window's as
more small fusions. Here program (row, group) reads its slot's [L, N] rows once into registers
and forms all of them, exactly in fp32 (summed in another order than XLA's: equal within fp32
rounding). Every load is a power-of-two block: a window of T vectors is read as one of the next
power of two rows, the rows past T masked (never fetched or stored), so T may be any size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, load, store


def _kernel(slots_ref, ring_ref, *refs, n_windows, n_pairs, T):
    ins, outs = refs[:n_windows + 2 * n_pairs], refs[n_windows + 2 * n_pairs:]
    i, g = pl.program_id(0), pl.program_id(1)
    # a window's [T, N] vectors as one power-of-two block of Tp rows, those past T masked
    Tp = pl.next_power_of_2(T)
    rows, live = pl.ds(0, Tp), (None if Tp == T else jnp.arange(Tp) < T)
    window = lambda ref: load(ref.at[i, rows, g], live).astype(F32)             # [Tp, N]
    ring = ring_ref[slots_ref[i], g].astype(F32)                                 # [L, N]
    # every load issued before any product: [Tp, L] = x_t . r_j, [Tp, Tp] = u_r . w_t
    xs = [window(ref) for ref in ins]
    products = [jnp.sum(x[:, None, :] * ring[None], axis=2) for x in xs[:n_windows]]
    products += [jnp.sum(u[:, None, :] * w[None], axis=2)
                 for u, w in zip(xs[n_windows::2], xs[n_windows + 1::2])]
    pair_live = None if live is None else live[:, None] & live[None, :]
    for o_ref, value in zip(outs[:n_windows], products):
        store(o_ref.at[i, g, rows], value, live)
    for o_ref, value in zip(outs[n_windows:], products[n_windows:]):
        store(o_ref.at[i, g, rows, rows], value, pair_live)


@functools.partial(jax.jit, static_argnames=("num_warps", "interpret"))
def window_products(ring, slots, windows, pairs=(), *, num_warps=4, interpret=False):
    """ring [S, G, L, N] (any float dtype; L and N powers of two), slots [b] int32; windows: a
    tuple of windows x [b, T, G, N] to multiply with the ring's rows, pairs: a tuple of (u, w)
    windows [b, T, G, N] to multiply with each other (any float dtypes). Returns (one
    [b, G, T, L] array per window: r_j . x_t over each row's slot's rows, as
    `ring.row_products(ring[slots], x)`; one [b, G, T (r), T (t)] array per pair: u_r . w_t),
    float32. Ring entries past a slot's count give garbage products: select them away."""
    b, T, G, _ = (windows or pairs[0])[0].shape
    L = ring.shape[2]
    flat = [*windows, *(x for pair in pairs for x in pair)]
    out_shape = ((jax.ShapeDtypeStruct((b, G, T, L), F32),) * len(windows)
                 + (jax.ShapeDtypeStruct((b, G, T, T), F32),) * len(pairs))
    out = pl.pallas_call(
        functools.partial(_kernel, n_windows=len(windows), n_pairs=len(pairs), T=T),
        grid=(b, G), out_shape=out_shape,
        compiler_params=compiler_params(num_warps, 1, interpret), interpret=interpret,
        name="ring_window_products",
    )(slots, ring, *flat)
    return tuple(out[:len(windows)]), tuple(out[len(windows):])
