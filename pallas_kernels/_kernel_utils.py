"""Pieces shared by the Pallas kernel bodies and builders of every family.

This is the one module that knows the Triton backend (`compiler_params`); kernel bodies use only
backend-neutral Pallas so a Mosaic GPU port changes the builders, not the math.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32


def compiler_params(num_warps, num_stages, interpret):
    if interpret:
        return None
    from jax.experimental.pallas import triton as pltr  # only the GPU path needs Triton
    return pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def dot_precision(interpret):
    """tf32x3 keeps fp32 accuracy (~1e-6) on tensor cores; the CPU interpreter takes HIGHEST."""
    return lax.Precision.HIGHEST if interpret else lax.DotAlgorithmPreset.TF32_TF32_F32_X3


def n_chunks(n, block, body, init):
    """fori_loop over chunks of a dimension of size n; body(slice, carry) -> carry."""
    return lax.fori_loop(0, n // block, lambda k, c: body(pl.ds(k * block, block), c), init)


def suffix_sums(v):
    """out[j] = sum_{i > j} v[i] for a [L] vector, as a masked [L, L] reduction (no cumsum, no
    cancellation)."""
    L = v.shape[0]
    jj = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    ii = lax.broadcasted_iota(jnp.int32, (L, L), 1)
    return jnp.sum(jnp.where(ii > jj, v[None, :], 0.0), axis=1)


def masked_window(valid, cur, ring, token):
    """Ring rows below the count, the current token at the count, zeros after. Rows past the
    count are garbage (maybe NaN), so they are dropped with `where`, never multiplied by 0."""
    return jnp.where(valid[:, None], ring.astype(F32), jnp.where(cur[:, None], token[None, :], 0.0))


def outer_fold(lhs, rhs, precision, use_dot):
    """sum_j lhs[j, :]^T rhs[j, :] for lhs [L, M], rhs [L, K] -> [M, K] in fp32: a tensor-core dot
    (needs L, M, K >= 16) or L rank-1 updates on the FMA units."""
    if use_dot:
        return lax.dot_general(lhs, rhs, (((0,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=F32)
    L = lhs.shape[0]
    j = lax.broadcasted_iota(jnp.int32, (L,), 0)

    def rank1(k, acc):
        sel = (j == k)[:, None]
        a = jnp.sum(jnp.where(sel, lhs, 0.0), axis=0)
        b = jnp.sum(jnp.where(sel, rhs, 0.0), axis=0)
        return acc + a[:, None] * b[None, :]
    return lax.fori_loop(0, L, rank1, jnp.zeros((lhs.shape[1], rhs.shape[1]), F32))
