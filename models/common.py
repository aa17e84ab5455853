"""Building blocks shared by the model families: linear layers, norms, the attention KV cache.

Weights are fp32 or bf16 `nnx.Param`s; activations follow the weights' dtype, norms and softmax
run in fp32. Linear kernels are [in, out] (HF stores [out, in]; the loader transposes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax import lax

from models.parallel import tp_index
from pallas_kernels import attention
from pallas_kernels.ring import MAX_VERIFY_TOKENS, NULL_SLOT, row_index

_HI = lax.Precision.HIGHEST


class Linear(nnx.Module):
    """y = x @ kernel (+ bias); kernel [in, out]. fp32 weights use HIGHEST precision so GPU
    results match CPU (no silent TF32)."""

    def __init__(self, din: int, dout: int, *, bias: bool = False, dtype=jnp.float32):
        self.kernel = nnx.Param(jnp.zeros((din, dout), dtype))
        self.bias = nnx.Param(jnp.zeros((dout,), dtype)) if bias else None

    def __call__(self, x):
        y = self._matmul(x)
        return y if self.bias is None else y + self.bias[...]

    def _matmul(self, x):
        k = self.kernel[...]
        return jnp.einsum("...i,io->...o", x.astype(k.dtype), k,
                          precision=_HI if k.dtype == jnp.float32 else None)


class RowParallelLinear(Linear):
    """The out-projection of a tensor-parallel block: its input features (rows of the kernel)
    are split over the "tp" axis, so it returns this device's partial sum, with the bias added
    on device 0 only; the block closes with `models.parallel.tp_sum`. At tp = 1 a Linear."""

    def __call__(self, x):
        y = self._matmul(x)
        if self.bias is None:
            return y
        return y + jnp.where(tp_index() == 0, self.bias[...], jnp.zeros_like(self.bias[...]))


def rms_norm(x, weight, eps, *, zero_centered=False):
    """RMSNorm over the last axis in fp32; `zero_centered` multiplies by (1 + w) (Qwen)."""
    xf = x.astype(jnp.float32)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    w = weight.astype(jnp.float32)
    return (y * (1.0 + w if zero_centered else w)).astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, zero_centered: bool = False):
        self.weight = nnx.Param(jnp.zeros((dim,), jnp.float32) if zero_centered
                                else jnp.ones((dim,), jnp.float32))
        self.eps, self.zero_centered = eps, zero_centered

    def __call__(self, x):
        return rms_norm(x, self.weight[...], self.eps, zero_centered=self.zero_centered)


def tied_logits(x, embedding):
    """A head tied to the input embedding (`tie_word_embeddings`): x [..., D] against
    embedding [V, D] -> [..., V] in the embedding's dtype (fp32: HIGHEST)."""
    return jnp.einsum("...d,vd->...v", x.astype(embedding.dtype), embedding,
                      precision=_HI if embedding.dtype == jnp.float32 else None)


def relu2(x):
    return jnp.square(jax.nn.relu(x))


@struct.dataclass
class KVCache:
    """Attention cache of one layer for a pool of S slots: k, v [S, max_len, kv_heads, head_dim].
    Valid positions per slot are given by the model cache's `lengths` (rollback = shorter)."""
    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, num_slots, max_len, kv_heads, head_dim, dtype=jnp.float32):
        shape = (num_slots, max_len, kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def cached_attention(q, k, v, cache: KVCache, slots, starts, kv_head=None, impl="auto"):
    """Causal GQA attention for T new tokens per row against the slot's cached prefix.

    q [b, T, nh, hd]; k, v [b, T, kv, hd]; slots [b]; starts [b] = cached tokens before the new
    ones. The new k, v are written at positions starts..starts+T-1 (positions past max_len are
    dropped); token t attends to positions <= starts + t. Scale hd^-1/2, softmax in fp32.
    kv_head (int32 scalar, tensor parallel with replicated KV heads): every query head attends
    with that one cached KV head. Windows of T <= MAX_VERIFY_TOKENS (decode, verify) run
    `pallas_kernels.attention.decode_attention` with `impl` (its Pallas kernel reads each row's
    valid K/V straight from the pool); longer ones (prefill) `prefill_attention`, XLA by blocks
    of queries and keys (memory independent of T and max_len). Returns out [b, T, nh, hd] and
    the updated cache.
    """
    # the scope names the class in profiles (`replayjax.bench.trace`): a GPU event whose module
    # the trace lacks is classed by the op_name scopes it carries, not by this function's frame
    with jax.named_scope("attention"):
        return _cached_attention(q, k, v, cache, slots, starts, kv_head, impl)


def _cached_attention(q, k, v, cache, slots, starts, kv_head, impl):
    T = q.shape[1]
    pos = starts[:, None] + jnp.arange(T)[None, :]                       # [b, T]
    live = slots != NULL_SLOT                                   # padding rows write nothing
    rows = jnp.broadcast_to(row_index(slots, live, cache.k.shape[0])[:, None], pos.shape)
    # (row, position) pairs are unique (see `set_rows`): plain stores, no atomics
    ck = cache.k.at[rows, pos].set(k.astype(cache.k.dtype), mode="drop", unique_indices=True)
    cv = cache.v.at[rows, pos].set(v.astype(cache.v.dtype), mode="drop", unique_indices=True)
    if T <= MAX_VERIFY_TOKENS:
        out = attention.decode_attention(q, ck, cv, slots, starts, kv_head=kv_head, impl=impl)
    else:
        out = attention.prefill_attention(q, ck, cv, slots, starts, kv_head)
    return out, KVCache(ck, cv)
