"""Pallas Triton decode attention over the slot pool (`impl="pallas_triton"`, or "pallas").

Grid (row, KV head, split): one program reads its row's slot index, then that slot's K and V
rows of the whole pool (`k_ref[slot, positions, head]`, the same gather-by-index as the SSM
kernels: no copy of the pool rows), only up to the row's last visible position, in blocks of
block_k positions with an online (flash) softmax in fp32. All T x G query rows of the KV head
(G = query heads per KV head) go through each block at once, as one [M, hd] tile (M = T G padded
to a power of two >= 16, the smallest tensor-core dot). The last block is moved back to end at
max_len (so max_len need not be a multiple of block_k) and its positions already seen are
masked. Padding rows (NULL_SLOT) read no block and write zeros.

Few rows (batch x KV heads below the tiling's min_programs) would leave most of the GPU idle, so
each row's blocks are then split over several programs (flash decoding): each writes its
normalised partial output and log-sum-exp, and XLA combines the splits (a few KB per row).

Dots: bf16 pools in bf16 with fp32 accumulation (q is rounded to bf16, the probabilities too
before P V, as flash attention does); fp32 pools in tf32x3 (HIGHEST in the interpreter).
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
    <= max_len is used); the launch's warps and pipeline stages; min_programs: rows' blocks are
    split over the fewest (power of two) programs per (row, KV head) that make at least this
    many programs (1: never split), at most one split per block."""
    block_k: int
    num_warps: int
    num_stages: int = 2
    min_programs: int = 256


# Measured on the H200 (docs/benchmarks.md, sixth GPU session; bf16 pools, GQA 4, batch 1 /
# 32 / 256): 128-position blocks for head_dim 128 (Nemotron-H-8B, batch 32: 187 vs 221 us at
# 64), 64 for head_dim 256 (Qwen3.5-9B, batch 32: 181 vs 204 at 128): a K block of 16K elements;
# 4 warps (8: 10-20% slower), the split from 256 programs (1: 6x slower at batch 1).
TILING = AttentionTiling(block_k=128, num_warps=4, num_stages=2, min_programs=256)
_BLOCK_ELEMENTS = 128 * 128


def default_tiling(head_dim: int) -> AttentionTiling:
    """The measured tiling for a head_dim: `TILING` with block_k * head_dim <= 16K elements."""
    return dataclasses.replace(TILING, block_k=max(MIN_BLOCK, min(
        TILING.block_k, _BLOCK_ELEMENTS // head_dim)))


def num_splits(rows: int, max_len: int, block_k: int, min_programs: int) -> int:
    """Programs per (row, KV head): the fewest power of two making rows x splits >= min_programs,
    at most the blocks of max_len."""
    splits = 1
    while rows * splits < min_programs and splits * 2 <= -(-max_len // block_k):
        splits *= 2
    return splits


def supports(k_pool) -> bool:
    """Whether the kernel takes a pool [S, max_len, kv, hd]: Triton tiles are powers of two and
    dots >= 16 wide, so max_len >= 16 and hd a power of two >= 16."""
    max_len, hd = k_pool.shape[1], k_pool.shape[3]
    return max_len >= MIN_BLOCK and is_pow2(hd) and hd >= MIN_BLOCK


def decode_attention(q, k_pool, v_pool, slots, starts, kv_head, *, tiling, interpret):
    """`pallas_kernels.attention.decode_attention` on validated arguments."""
    max_len, hd = k_pool.shape[1], k_pool.shape[3]
    t = resolve_tiling(tiling, default_tiling(hd))
    check(is_pow2(t.block_k) and t.block_k >= MIN_BLOCK,
          f"block_k = {t.block_k} must be a power of two >= {MIN_BLOCK}")
    check(t.min_programs >= 1, f"min_programs = {t.min_programs} must be >= 1")
    check(supports(k_pool), f"the Pallas decode attention needs max_len >= {MIN_BLOCK} and "
                            f"head_dim a power of two >= {MIN_BLOCK}, got max_len {max_len}, "
                            f"head_dim {hd}")
    block_k = min(t.block_k, 1 << (max_len.bit_length() - 1))
    heads = k_pool.shape[2] if kv_head is None else 1
    head0 = jnp.zeros((1,), jnp.int32) if kv_head is None else (
        jnp.asarray(kv_head, jnp.int32).reshape(1))
    return _decode_attention(q, k_pool, v_pool, slots, starts, head0, heads=heads,
                             block_k=block_k, splits=num_splits(q.shape[0] * heads, max_len,
                                                                block_k, t.min_programs),
                             num_warps=t.num_warps, num_stages=t.num_stages,
                             interpret=interpret)


def _kernel(slots_ref, starts_ref, head0_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, tokens,
            group, block_k, scale, precision):
    i, h, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    slot, start = slots_ref[i], starts_ref[i]
    head = head0_ref[0] + h
    max_len = k_ref.shape[1]
    M, hd = q_ref.shape[2], q_ref.shape[3]
    q = q_ref[i, h]                                                       # [M, hd]
    # query row r is token r // G (padding rows past T G: the last token's bound)
    r = lax.broadcasted_iota(jnp.int32, (M,), 0)
    bound = jnp.minimum(start + jnp.minimum(lax.div(r, group), tokens - 1), max_len - 1)  # [M]
    last = jnp.minimum(start + tokens - 1, max_len - 1)       # the row's last visible position
    live = slot != NULL_SLOT
    n_blocks = jnp.where(live, lax.div(last, block_k) + 1, 0)     # (lax.div: operands >= 0)
    per_split = pl.cdiv(n_blocks, pl.num_programs(2))
    lo = jnp.minimum(sp * per_split, n_blocks)

    def block(j, carry):
        acc, m, denom = carry           # sum_j p_j v_j, running max, sum_j p_j
        first = jnp.minimum(j * block_k, max_len - block_k)   # the last block ends at max_len
        ks = pl.ds(first, block_k)
        k, v = k_ref[slot, ks, head, :], v_ref[slot, ks, head, :]            # [bk, hd]
        pos = first + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=F32) * scale               # [M, bk]
        # positions before j * bk were seen in the block before (the last block overlaps it)
        seen = (pos >= j * block_k)[None, :] & (pos[None, :] <= bound[:, None])
        s = jnp.where(seen, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))   # finite: m starts at the lowest float
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        # positions past the row's end may hold anything (even NaN): never multiplied in
        v = jnp.where((pos <= last)[:, None], v, jnp.zeros_like(v))
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             precision=precision, preferred_element_type=F32)
        return corr[:, None] * acc + pv, m_new, corr * denom + jnp.sum(p, axis=1)

    init = (jnp.zeros((M, hd), F32), jnp.full((M,), jnp.finfo(F32).min, F32),
            jnp.zeros((M,), F32))
    acc, m, denom = lax.fori_loop(lo, jnp.minimum(lo + per_split, n_blocks), block, init)
    # a split that saw nothing (past the row's blocks, or a padding row) weighs 0 (lse -inf)
    # and writes zeros
    some = denom > 0
    denom = jnp.where(some, denom, 1.0)
    o_ref[i, h, sp] = jnp.where(some[:, None], acc / denom[:, None], 0.0).astype(o_ref.dtype)
    lse_ref[i, h, sp] = jnp.where(some, m + jnp.log(denom), -jnp.inf)


@functools.partial(jax.jit, static_argnames=("heads", "block_k", "splits", "num_warps",
                                             "num_stages", "interpret"))
def _decode_attention(q, k_pool, v_pool, slots, starts, head0, *, heads, block_k, splits,
                      num_warps, num_stages, interpret):
    """head0 [1] int32: the pool KV head of program head 0 (kv_head, or 0 when the KV heads are
    split, heads = kv). Returns [b, T, nh, hd] in q.dtype."""
    b, T, nh, hd = q.shape
    G = nh // heads
    M = max(MIN_BLOCK, 1 << (T * G - 1).bit_length())
    dt = k_pool.dtype
    precision = dot_precision(interpret) if dt == F32 else None
    # [b, T, heads, G, hd] -> [b, heads, T G, hd]: a KV head's query rows, token-major, padded
    qr = q.reshape(b, T, heads, G, hd).transpose(0, 2, 1, 3, 4).reshape(b, heads, T * G, hd)
    qr = jnp.pad(qr.astype(dt), ((0, 0), (0, 0), (0, M - T * G), (0, 0)))
    kernel = functools.partial(_kernel, tokens=T, group=G, block_k=block_k, scale=hd ** -0.5,
                               precision=precision)
    out, lse = call(
        kernel, name="decode_attention", grid=(b, heads, splits),
        inputs=dict(slots_ref=slots, starts_ref=starts, head0_ref=head0, q_ref=qr,
                    k_ref=k_pool, v_ref=v_pool),
        outputs=dict(o_ref=jax.ShapeDtypeStruct((b, heads, splits, M, hd),
                                                q.dtype if splits == 1 else F32),
                     lse_ref=jax.ShapeDtypeStruct((b, heads, splits, M), F32)),
        aliases={}, num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    if splits == 1:
        out = out[:, :, 0]
    else:       # weights exp(lse_s - max lse); rows no split saw (padding rows) stay zero
        top = jnp.max(lse, axis=2, keepdims=True)
        w = jnp.exp(lse - jnp.where(jnp.isfinite(top), top, 0.0))
        out = jnp.sum(w[..., None] * out, axis=2) / jnp.maximum(jnp.sum(w, axis=2), 1e-30)[
            ..., None]
    out = out[:, :, :T * G].astype(q.dtype).reshape(b, heads, T, G, hd).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, T, nh, hd)
