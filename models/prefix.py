"""The device side of prefix caching: a pool of P entries, one per block of `block` tokens of
some cached prefix, and the two pure functions that move entries between the pool and a
model cache's slots.

An entry holds what a sequence needs to resume right after its block: per SSM layer the state
after the block (a ReplaySSM checkpoint: a prefill leaves the ring empty, count 0) and the conv
state (the last K-1 pre-conv inputs); per attention layer (and MTP-head attention layer) the KV
of the block's `block` positions; for an MTP drafter the head's KV one position earlier (its
entry at position p depends on token p + 1, which the block's key holds only from its first
position minus one on) and the target's final-norm hidden state at the block's last token (from
which the head's entry there is recomputed at a hit, with the token that follows then). A
sequence of n cached blocks is the chain of n entries (which entries form a prefix is the
host's business, `replayjax.prefix_cache`).

    cache, prev = restore(pool, cache, slots, hits, starts)        # before a continuing prefill
    logits, hidden, cache, blocks = model.prefill_from(cache, tokens, lengths, slots, starts,
                                                       block=pool.block)
    pool = capture(pool, cache, hidden, blocks, slots, starts, stores)   # after it

Entries are copied into slots (never shared), so a slot's later decode cannot touch the pool.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from models.cache import ModelCache, SSMCache
from models.common import KVCache
from pallas_kernels.ring import NULL_SLOT, base_rows, row_index


@struct.dataclass
class PrefixPool:
    """P entries. layers: per model layer (state [P, ...], conv [P, K-1, C]) for SSM layers,
    KVCache [P, block, kv, hd] for attention, None otherwise; mtp: the same for the MTP head's
    layers; hidden [P, D] (with an MTP head) or None."""
    layers: tuple
    mtp: tuple
    hidden: jax.Array | None
    block: int = struct.field(pytree_node=False)

    @property
    def num_entries(self) -> int:
        return jax.tree.leaves(self)[0].shape[0]


def init_pool(cache: ModelCache, num_entries: int, block: int, hidden=None) -> PrefixPool:
    """A zeroed pool of num_entries entries shaped after `cache` (arrays or ShapeDtypeStructs);
    hidden: (D, dtype) of the target's hidden states for an MTP drafter (then the pool also
    holds the MTP head's KV), None otherwise."""
    P = num_entries

    def entry(lc):
        if isinstance(lc, SSMCache):
            ck = lc.buffers.checkpoint
            return (jnp.zeros((P,) + ck.shape[1:], ck.dtype),
                    jnp.zeros((P,) + lc.conv.shape[1:], lc.conv.dtype))
        if isinstance(lc, KVCache):
            shape = (P, block) + lc.k.shape[2:]
            return KVCache(jnp.zeros(shape, lc.k.dtype), jnp.zeros(shape, lc.v.dtype))
        return None

    layers = tuple(entry(lc) for lc in cache.layers)
    if hidden is None:
        return PrefixPool(layers, (), None, block)
    mtp = tuple(entry(lc) for lc in cache.mtp)
    h = jnp.zeros((P, hidden[0]), hidden[1])
    return PrefixPool(layers, mtp, h, block)


def restore(pool: PrefixPool, cache: ModelCache, slots, hits, starts):
    """Copies cached prefixes into slots: row i's slot gets the first starts[i] // block
    entries of hits [b, nh] int32 (pool indices; the rest are ignored): their attention KV at
    positions [0, starts), and the SSM and conv states of the last one. starts [b] int32 are
    multiples of block (0: nothing is copied). Returns the cache (lengths and counts are set by
    the prefill that follows) and the hidden state [b, D] at each row's last cached token (None
    without an MTP head)."""
    B = pool.block
    b, nh = hits.shape
    n = starts // B
    last = jnp.take_along_axis(hits, jnp.maximum(n - 1, 0)[:, None], axis=1)[:, 0]
    go = (slots != NULL_SLOT) & (n > 0)

    def kv(lc: KVCache, entry: KVCache, shift):
        pos = jnp.arange(nh * B) - shift
        keep = go[:, None] & (pos[None] >= 0) & (pos[None] < starts[:, None] - shift)
        rows = jnp.where(keep, slots[:, None], lc.k.shape[0])
        put = lambda dst, src: dst.at[rows, jnp.maximum(pos, 0)[None]].set(
            src[hits].reshape((b, nh * B) + src.shape[2:]), mode="drop")
        return KVCache(put(lc.k, entry.k), put(lc.v, entry.v))

    def layer(lc, entry, shift=0):
        if isinstance(lc, KVCache):
            return kv(lc, entry, shift)
        if isinstance(lc, SSMCache):
            state, conv = entry
            ck = lc.buffers.checkpoint
            i = row_index(base_rows(slots, lc.num_drafts), go, ck.shape[0])
            bufs = lc.buffers._replace(checkpoint=ck.at[i].set(state[last], mode="drop"))
            j = row_index(slots, go, lc.conv.shape[0])
            return lc.replace(buffers=bufs, conv=lc.conv.at[j].set(conv[last], mode="drop"))
        return lc

    cache = cache.replace(layers=tuple(map(layer, cache.layers, pool.layers)),
                          mtp=tuple(layer(lc, e, 1) for lc, e in zip(cache.mtp, pool.mtp))
                          if pool.mtp else cache.mtp)
    return cache, None if pool.hidden is None else pool.hidden[last]


def capture(pool: PrefixPool, cache: ModelCache, hidden, blocks, slots, starts, stores):
    """Writes the blocks a prefill just computed into the pool: block j of row i's window
    (positions starts[i] + j * block ...) into entry stores[i, j] (-1: not stored). hidden
    [b, T, D] the prefill's final-norm hidden states; blocks: `prefill_from`'s per-layer block
    states [b, T // block, ...]; stores [b, T // block] int32. Call it after the drafter's
    prefill (an MTP head's KV is read from the cache). Returns the pool."""
    b, nb = stores.shape
    if nb == 0:
        return pool
    B = pool.block
    idx = jnp.where((stores >= 0) & (slots != NULL_SLOT)[:, None], stores, pool.num_entries)
    pos = starts[:, None, None] + (jnp.arange(nb) * B)[None, :, None] + jnp.arange(B)
    put = lambda dst, src: dst.at[idx].set(src.astype(dst.dtype), mode="drop")

    def kv(entry: KVCache, lc: KVCache, shift):
        take = lambda a: a[slots[:, None, None], jnp.clip(pos - shift, 0, a.shape[1] - 1)]
        return KVCache(put(entry.k, take(lc.k)), put(entry.v, take(lc.v)))

    def layer(entry, lc, block_states, shift=0):
        if isinstance(lc, KVCache):
            return kv(entry, lc, shift)
        if isinstance(lc, SSMCache):
            return tuple(map(put, entry, block_states))
        return entry

    layers = tuple(map(layer, pool.layers, cache.layers, blocks))
    mtp = tuple(layer(e, lc, None, 1) for e, lc in zip(pool.mtp, cache.mtp))   # () without
    h = pool.hidden
    if h is not None:
        ends = (jnp.arange(nb) + 1) * B - 1
        h = put(h, hidden[:, ends])
    return pool.replace(layers=layers, mtp=mtp, hidden=h)
