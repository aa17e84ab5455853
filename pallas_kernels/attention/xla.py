"""The XLA implementations of attention over the slot pool.

* `decode_attention` (`impl="xla"`): the dense `reference` math over the gathered pool rows
  (bitwise what the models ran before the kernel). Arguments as in
  `pallas_kernels.attention.api`.
* `prefill_attention`: any number T of new tokens (a prefill) in blocks, with an online softmax:
  its memory grows with block_q x block_k, not with T x max_len (the dense path's scores of a
  65k-token prompt took ~200 GB), and its work with the positions the rows can see, not with
  max_len.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.attention import reference
from pallas_kernels.ring import NULL_SLOT

_HI = lax.Precision.HIGHEST
BLOCK_Q, BLOCK_K = 512, 512


def decode_attention(q, k_pool, v_pool, slots, starts, kv_head):
    return reference.attention(q, k_pool, v_pool, slots, starts, kv_head)


def prefill_attention(q, k_pool, v_pool, slots, starts, kv_head=None, *, block_q=BLOCK_Q,
                      block_k=BLOCK_K):
    """`reference.attention`'s result (to fp32 rounding) by blocks: q [b, T, nh, hd]; k_pool,
    v_pool [S, max_len, kv, hd]; slots, starts [b] int32; kv_head None or an int32 scalar.
    Token t of row i attends to positions <= starts[i] + t of pool row slots[i]; NULL_SLOT
    rows give zeros. Returns [b, T, nh, hd] in q.dtype.

    Queries go in chunks of block_q (one after the other), each over the key blocks of
    block_k positions up to the last one a row of the chunk sees (a loop of dynamic length).
    Key blocks start at multiples of block_k whatever the chunk, and a block a query does not
    see changes nothing of its sums (exactly), so a token sums the same blocks however the
    prompt was cut (a prefix-cache hit prefills only its rest): equal up to the dots' rounding.
    Positions a row cannot see are never read into its sums (their V is zeroed, so stale or NaN
    pool entries cannot leak). fp32 HIGHEST dots, as the reference."""
    b, T, nh, hd = q.shape
    max_len = k_pool.shape[1]
    # the KV heads each block gathers: all, or the one every query head uses
    heads = (jnp.arange(k_pool.shape[2]) if kv_head is None
             else jnp.reshape(kv_head, (1,)).astype(jnp.int32))
    kv = heads.shape[0]
    bq, bk = min(block_q, T), min(block_k, max_len)
    chunks = -(-T // bq)
    qg = q.astype(jnp.float32).reshape(b, T, kv, nh // kv, hd) * hd ** -0.5
    qg = jnp.pad(qg, ((0, 0), (0, chunks * bq - T), (0, 0), (0, 0), (0, 0)))
    qg = qg.reshape(b, chunks, bq, kv, nh // kv, hd).transpose(1, 0, 2, 3, 4, 5)

    def chunk(args):
        qc, first = args                                    # [b, bq, kv, g, hd], its first t
        # the chunk's padding (past T) repeats token T - 1: it sees nothing T - 1 does not
        pos = starts[:, None] + jnp.minimum(first + jnp.arange(bq), T - 1)[None, :]  # [b, bq]
        last = jnp.minimum(pos[:, -1].max(), max_len - 1)   # the last position any row sees

        def key_block(j, carry):
            m, den, acc = carry
            lo = jnp.minimum(j * bk, max_len - bk)          # the last block moves back...
            kpos = lo + jnp.arange(bk)
            # the rows' block only (one gather: not every slot's block, then the rows')
            at = (slots[:, None, None], kpos[None, :, None], heads[None, None, :])
            keys, vals = (pool[at] for pool in (k_pool, v_pool))          # [b, bk, kv, hd]
            new = kpos >= j * bk                            # ...and skips what came before
            seen = new[None, None, :] & (kpos[None, None, :] <= pos[:, :, None])  # [b, bq, bk]
            anyone = new[None, :] & (kpos[None, :] <= pos[:, -1:])               # [b, bk]
            vals = jnp.where(anyone[:, :, None, None], vals.astype(jnp.float32), 0.0)
            s = jnp.einsum("btgqd,bsgd->bgqts", qc, keys.astype(jnp.float32), precision=_HI)
            s = jnp.where(seen[:, None, None], s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[..., None])
            scale = jnp.exp(m - m_new)
            acc = acc * scale[..., None] + jnp.einsum("bgqts,bsgd->bgqtd", p, vals, precision=_HI)
            return m_new, den * scale + p.sum(-1), acc

        shape = (b, kv, nh // kv, bq)
        init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(shape + (hd,), jnp.float32))
        _, den, acc = lax.fori_loop(0, last // bk + 1, key_block, init)
        return acc / den[..., None]                         # [b, kv, g, bq, hd]

    out = lax.map(chunk, (qg, jnp.arange(chunks) * bq))     # [chunks, b, kv, g, bq, hd]
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, chunks * bq, nh, hd)[:, :T]
    out = jnp.where((slots != NULL_SLOT)[:, None, None, None], out, 0.0)
    return out.astype(q.dtype)
