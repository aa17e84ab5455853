"""Pallas Triton decode attention over the slot pool (`impl="pallas_triton"`, or "pallas").

Grid (row, KV head): one program reads its row's slot index, then that slot's K and V rows of
the whole pool (`k_ref[slot, positions, head]`, the same gather-by-index as the SSM kernels:
no copy of the pool rows), only up to the row's last visible position, in blocks of block_k
positions with an online (flash) softmax in fp32. All T x G query rows of the KV head (G = query
heads per KV head) go through each block at once, as one [M, hd] tile (M = T G padded to a power
of two >= 16, the smallest tensor-core dot). The last block is moved back to end at max_len (so
max_len need not be a multiple of block_k) and its positions already seen are masked. Padding
rows (NULL_SLOT) read no block and write zeros. Dots: bf16 pools in bf16 with fp32 accumulation
(q is rounded to bf16, the probabilities too before P V, as flash attention does); fp32 pools in
tf32x3 (HIGHEST in the interpreter).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, call, dot_precision
from pallas_kernels.ring import NULL_SLOT
from pallas_kernels.validation import check, is_pow2, resolve_tiling

MIN_BLOCK = 16          # Triton dots need >= 16 rows, columns and contraction


@dataclasses.dataclass(frozen=True)
class AttentionTiling:
    """block_k: positions per K/V block (a power of two >= 16; at most the largest power of two
    <= max_len is used), plus the launch's warps and pipeline stages."""
    block_k: int
    num_warps: int
    num_stages: int = 2


# Not yet measured on a GPU (`python -m replayjax.bench.attention` times it): flash decoding's
# usual 64-position blocks, 4 warps, double-buffered loads.
TILING = AttentionTiling(block_k=64, num_warps=4, num_stages=2)


def supports(k_pool) -> bool:
    """Whether the kernel takes a pool [S, max_len, kv, hd]: Triton tiles are powers of two and
    dots >= 16 wide, so max_len >= 16 and hd a power of two >= 16."""
    max_len, hd = k_pool.shape[1], k_pool.shape[3]
    return max_len >= MIN_BLOCK and is_pow2(hd) and hd >= MIN_BLOCK


def decode_attention(q, k_pool, v_pool, slots, starts, kv_head, *, tiling, interpret):
    """`pallas_kernels.attention.decode_attention` on validated arguments."""
    t = resolve_tiling(tiling, TILING)
    max_len, hd = k_pool.shape[1], k_pool.shape[3]
    check(is_pow2(t.block_k) and t.block_k >= MIN_BLOCK,
          f"block_k = {t.block_k} must be a power of two >= {MIN_BLOCK}")
    check(supports(k_pool), f"the Pallas decode attention needs max_len >= {MIN_BLOCK} and "
                            f"head_dim a power of two >= {MIN_BLOCK}, got max_len {max_len}, "
                            f"head_dim {hd}")
    block_k = min(t.block_k, 1 << (max_len.bit_length() - 1))
    head0 = jnp.zeros((1,), jnp.int32) if kv_head is None else (
        jnp.asarray(kv_head, jnp.int32).reshape(1))
    return _decode_attention(q, k_pool, v_pool, slots, starts, head0,
                             kv_split=kv_head is None, block_k=block_k, num_warps=t.num_warps,
                             num_stages=t.num_stages, interpret=interpret)


def _kernel(slots_ref, starts_ref, head0_ref, q_ref, k_ref, v_ref, o_ref, *, tokens, group,
            block_k, scale, precision):
    i, h = pl.program_id(0), pl.program_id(1)
    slot, start = slots_ref[i], starts_ref[i]
    head = head0_ref[0] + h
    max_len = k_ref.shape[1]
    M, hd = q_ref.shape[2], q_ref.shape[3]
    q = q_ref[i, h]                                                       # [M, hd]
    # query row r is token r // G (padding rows past T G: the last token's bound)
    r = lax.broadcasted_iota(jnp.int32, (M,), 0)
    bound = jnp.minimum(start + jnp.minimum(r // group, tokens - 1), max_len - 1)     # [M]
    last = jnp.minimum(start + tokens - 1, max_len - 1)       # the row's last visible position
    live = slot != NULL_SLOT
    n_blocks = jnp.where(live, last // block_k + 1, 0)

    def block(j, carry):
        acc, m, l = carry
        first = jnp.minimum(j * block_k, max_len - block_k)   # the last block ends at max_len
        ks = pl.ds(first, block_k)
        k, v = k_ref[slot, ks, head, :], v_ref[slot, ks, head, :]            # [bk, hd]
        pos = first + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=F32) * scale               # [M, bk]
        # positions before j * bk were seen in the block before (the last block overlaps it)
        seen = (pos >= j * block_k)[None, :] & (pos[None, :] <= bound[:, None])
        s = jnp.where(seen, s, -jnp.inf)     # block 0 always sees position 0: m stays finite
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        # positions past the row's end may hold anything (even NaN): never multiplied in
        v = jnp.where((pos <= last)[:, None], v, jnp.zeros_like(v))
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             precision=precision, preferred_element_type=F32)
        return corr[:, None] * acc + pv, m_new, corr * l + jnp.sum(p, axis=1)

    init = (jnp.zeros((M, hd), F32), jnp.full((M,), -jnp.inf, F32), jnp.zeros((M,), F32))
    acc, _, l = lax.fori_loop(0, n_blocks, block, init)
    out = acc / jnp.where(live, l, 1.0)[:, None]
    o_ref[i, h] = jnp.where(live, out, 0.0).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("kv_split", "block_k", "num_warps", "num_stages",
                                             "interpret"))
def _decode_attention(q, k_pool, v_pool, slots, starts, head0, *, kv_split, block_k, num_warps,
                      num_stages, interpret):
    """head0 [1] int32: the first pool KV head (kv_head, or 0 when the KV heads are split:
    program h then reads pool head h). Returns [b, T, nh, hd] in q.dtype."""
    b, T, nh, hd = q.shape
    heads = k_pool.shape[2] if kv_split else 1
    G = nh // heads
    M = max(MIN_BLOCK, 1 << (T * G - 1).bit_length())
    dt = k_pool.dtype
    precision = dot_precision(interpret) if dt == F32 else None
    # [b, T, heads, G, hd] -> [b, heads, T G, hd]: a KV head's query rows, token-major, padded
    qr = q.reshape(b, T, heads, G, hd).transpose(0, 2, 1, 3, 4).reshape(b, heads, T * G, hd)
    qr = jnp.pad(qr.astype(dt), ((0, 0), (0, 0), (0, M - T * G), (0, 0)))
    kernel = functools.partial(_kernel, tokens=T, group=G, block_k=block_k, scale=hd ** -0.5,
                               precision=precision)
    (out,) = call(
        kernel, name="decode_attention", grid=(b, heads),
        inputs=dict(slots_ref=slots, starts_ref=starts, head0_ref=head0, q_ref=qr,
                    k_ref=k_pool, v_ref=v_pool),
        outputs=dict(o_ref=jax.ShapeDtypeStruct((b, heads, M, hd), q.dtype)),
        aliases={}, num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    out = out[:, :, :T * G].reshape(b, heads, T, G, hd).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, T, nh, hd)
