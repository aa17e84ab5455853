"""Causal GQA attention over the slot pool, dense: every row's whole max_len gathered from the
pool, fp32 HIGHEST einsums, softmax in fp32 (what `models.common.cached_attention` always ran;
the oracle of the kernels and the XLA implementation). Any number T of new tokens.
Arguments as in `pallas_kernels.attention.api.decode_attention`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.ring import NULL_SLOT

_HI = lax.Precision.HIGHEST


def attention(q, k_pool, v_pool, slots, starts, kv_head=None):
    """q [b, T, nh, hd]; k_pool, v_pool [S, max_len, kv, hd]; slots, starts [b] int32; kv_head
    None or an int32 scalar. Token t of row i attends to positions <= starts[i] + t of pool row
    slots[i]; NULL_SLOT rows give zeros. Returns [b, T, nh, hd] in q.dtype."""
    b, T, nh, hd = q.shape
    max_len = k_pool.shape[1]
    keys, vals = k_pool[slots], v_pool[slots]                            # [b, max_len, kv, hd]
    if kv_head is not None:
        keys, vals = (lax.dynamic_slice_in_dim(a, kv_head, 1, axis=2) for a in (keys, vals))
    kv = keys.shape[2]
    pos = starts[:, None] + jnp.arange(T)[None, :]                       # [b, T]
    qg = q.reshape(b, T, kv, nh // kv, hd).astype(jnp.float32)
    s = jnp.einsum("btgqd,bsgd->bgqts", qg, keys.astype(jnp.float32), precision=_HI) * hd ** -0.5
    visible = jnp.arange(max_len)[None, None, :] <= pos[:, :, None]       # [b, T, max_len]
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bgqts,bsgd->btgqd", p, vals.astype(jnp.float32), precision=_HI)
    out = jnp.where((slots != NULL_SLOT)[:, None, None, None, None], out, 0.0)
    return out.reshape(b, T, nh, hd).astype(q.dtype)
