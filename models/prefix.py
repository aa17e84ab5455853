"""The device side of prefix caching: a pool of P entries, one per block of `block` tokens of
some cached prefix (or per partial block: a prompt's last tokens past its whole blocks), and
the pure functions that move entries between the pool and a model cache's slots.

An entry holds what a sequence needs to resume anywhere inside its block: per SSM layer the
state after the block (a ReplaySSM checkpoint: a prefill leaves the ring empty, count 0), the
conv state (the last K-1 pre-conv inputs) and the block's per-token inputs (the ring's data:
the in-projection outputs the conv and scan consume, in the activation dtype); per attention
layer (and MTP-head attention layer) the KV of the block's `block` positions; for an MTP
drafter the head's KV one position earlier (its entry at position p depends on token p + 1,
which the block's key holds only from its first position minus one on) and the target's
final-norm hidden states of the block's tokens (from which the head's entry before a hit is
recomputed, with the token that follows then). A partial entry's states are unused. A sequence
of n whole blocks and r < block more tokens is the chain of n entries and the entry holding
the r tokens (which entries form a prefix is the host's business, `replayjax.prefix_cache`):
restore copies the chain's states and the tokens' KV, and the prefill replays the r tokens'
inputs from the chain's state (a conv and scan, no projection).

    cache, prev, ring = restore(pool, cache, slots, hits, starts)      # before the prefill
    idx = store_index(pool, slots, stores)
    logits, hidden, cache, kept = model.prefill_from(
        cache, tokens, lengths, slots, starts, block=pool.block, ring=ring,
        keep=lambda i, blocks: store_ssm(pool.layers[i], blocks, idx))
    pool = capture(pool, cache, hidden, kept, slots, starts - ring.r, idx, ring)   # after it

Entries are copied into slots (never shared), so a slot's later decode cannot touch the pool.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from models.cache import ModelCache, SSMCache
from models.common import KVCache
from models.hybrid import ring_window
from pallas_kernels.ring import NULL_SLOT, base_rows, row_index


@struct.dataclass
class PrefixPool:
    """P entries. layers: per model layer (state [P, ...], conv [P, K-1, C], inputs [P, block,
    Cu]) for SSM layers, KVCache [P, block, kv, hd] for attention, None otherwise; mtp: the
    same for the MTP head's layers; hidden [P, block, D] (with an MTP head) or None."""
    layers: tuple
    mtp: tuple
    hidden: jax.Array | None
    block: int = struct.field(pytree_node=False)

    @property
    def num_entries(self) -> int:
        return jax.tree.leaves(self)[0].shape[0]


@struct.dataclass
class Ring:
    """The tokens a restored row holds past its last whole block, for `HybridLM.prefill_from`
    to replay: r [b] int32 in [0, block); inputs per model layer [b, block, Cu] (the SSM
    layers' per-token inputs of the entry holding them; None for other layers); hidden
    [b, block, D] that entry's hidden states (with an MTP head) or None."""
    r: jax.Array
    inputs: tuple
    hidden: jax.Array | None


def init_pool(cache: ModelCache, num_entries: int, block: int, widths, hidden=None) -> PrefixPool:
    """A zeroed pool of num_entries entries shaped after `cache` (arrays or ShapeDtypeStructs);
    widths: per layer the SSM layer's per-token input width (`HybridLM.replay_widths`; they are
    kept in the conv state's dtype); hidden: (D, dtype) of the target's hidden states for an
    MTP drafter (then the pool also holds the MTP head's KV), None otherwise."""
    P = num_entries

    def entry(lc, width=0):
        if isinstance(lc, SSMCache):
            ck = lc.buffers.checkpoint
            return (jnp.zeros((P,) + ck.shape[1:], ck.dtype),
                    jnp.zeros((P,) + lc.conv.shape[1:], lc.conv.dtype),
                    jnp.zeros((P, block, width), lc.conv.dtype))
        if isinstance(lc, KVCache):
            shape = (P, block) + lc.k.shape[2:]
            return KVCache(jnp.zeros(shape, lc.k.dtype), jnp.zeros(shape, lc.v.dtype))
        return None

    layers = tuple(map(entry, cache.layers, widths))
    if hidden is None:
        return PrefixPool(layers, (), None, block)
    mtp = tuple(entry(lc) for lc in cache.mtp)
    h = jnp.zeros((P, block, hidden[0]), hidden[1])
    return PrefixPool(layers, mtp, h, block)


def restore(pool: PrefixPool, cache: ModelCache, slots, hits, starts):
    """Copies cached prefixes into slots: row i's slot gets the first starts[i] tokens of the
    entries hits [b, nh] int32 (pool indices, entry j holding tokens [j block, (j + 1) block);
    the rest are ignored): their attention KV at positions [0, starts), and the SSM and conv
    states of entry n - 1 for n = starts // block whole blocks (none when n = 0). Returns the
    cache (lengths and counts are set by the prefill that follows), the hidden state [b, D] at
    each row's last cached token (None without an MTP head) and the `Ring` of the r = starts %
    block tokens past the whole blocks (held by entry n)."""
    B = pool.block
    b, nh = hits.shape
    n = starts // B
    at = lambda j: jnp.take_along_axis(hits, jnp.clip(j, 0, nh - 1)[:, None], axis=1)[:, 0]
    last, held = at(n - 1), at(n)
    live = slots != NULL_SLOT
    go = live & (n > 0)

    def kv(lc: KVCache, entry: KVCache, shift):
        pos = jnp.arange(nh * B) - shift
        keep = live[:, None] & (pos[None] >= 0) & (pos[None] < starts[:, None] - shift)
        rows = jnp.where(keep, slots[:, None], lc.k.shape[0])
        put = lambda dst, src: dst.at[rows, jnp.maximum(pos, 0)[None]].set(
            src[hits].reshape((b, nh * B) + src.shape[2:]), mode="drop")
        return KVCache(put(lc.k, entry.k), put(lc.v, entry.v))

    def layer(lc, entry, shift=0):
        if isinstance(lc, KVCache):
            return kv(lc, entry, shift)
        if isinstance(lc, SSMCache):
            state, conv, _ = entry
            ck = lc.buffers.checkpoint
            i = row_index(base_rows(slots, lc.num_drafts), go, ck.shape[0])
            bufs = lc.buffers._replace(checkpoint=ck.at[i].set(state[last], mode="drop"))
            j = row_index(slots, go, lc.conv.shape[0])
            return lc.replace(buffers=bufs, conv=lc.conv.at[j].set(conv[last], mode="drop"))
        return lc

    cache = cache.replace(layers=tuple(map(layer, cache.layers, pool.layers)),
                          mtp=tuple(layer(lc, e, 1) for lc, e in zip(cache.mtp, pool.mtp))
                          if pool.mtp else cache.mtp)
    inputs = tuple(e[2][held] if isinstance(lc, SSMCache) else None
                   for lc, e in zip(cache.layers, pool.layers))
    if pool.hidden is None:
        return cache, None, Ring(starts % B, inputs, None)
    prev = pool.hidden[at((starts - 1) // B), (starts - 1) % B]
    return cache, prev, Ring(starts % B, inputs, pool.hidden[held])


def store_index(pool: PrefixPool, slots, stores):
    """stores [b, n] int32 (pool entry per block of a prefill's scan, -1: not stored) as the
    scatter index of `store_ssm` and `capture`: [b, n], P where nothing is stored."""
    return jnp.where((stores >= 0) & (slots != NULL_SLOT)[:, None], stores, pool.num_entries)


def _put(dst, src, idx):
    return dst.at[idx].set(src.astype(dst.dtype), mode="drop")


def store_ssm(entry, blocks, idx):
    """An SSM layer's pool arrays (state, conv, inputs) with the blocks of its prefill scan
    (`HybridLM.prefill_from`: [b, n, ...] each) written at idx [b, n] (`store_index`)."""
    return tuple(_put(dst, src, idx) for dst, src in zip(entry, blocks))


def capture(pool: PrefixPool, cache: ModelCache, hidden, kept, slots, base, idx, ring=None):
    """Writes the blocks a prefill just computed into the pool: block j of row i's scan
    (positions base[i] + j * block ...; base = starts - ring.r, block-aligned) into entry
    idx[i, j] (`store_index`). kept: `prefill_from`'s per-layer results of `store_ssm` (the
    SSM layers' pool arrays, already written); hidden [b, T, D] the prefill's final-norm hidden
    states; ring: the prefill's `Ring` or None. Call it after the drafter's prefill (an MTP
    head's KV is read from the cache). Returns the pool."""
    b, nb = idx.shape
    B = pool.block
    pos = base[:, None, None] + (jnp.arange(nb) * B)[None, :, None] + jnp.arange(B)
    put = lambda dst, src: _put(dst, src, idx)

    def kv(entry: KVCache, lc: KVCache, shift):
        take = lambda a: a[slots[:, None, None], jnp.clip(pos - shift, 0, a.shape[1] - 1)]
        return KVCache(put(entry.k, take(lc.k)), put(entry.v, take(lc.v)))

    def layer(entry, lc, ssm, shift=0):
        if isinstance(lc, KVCache):
            return kv(entry, lc, shift)
        return ssm if isinstance(lc, SSMCache) else entry

    layers = tuple(map(layer, pool.layers, cache.layers, kept))
    mtp = tuple(layer(e, lc, None, 1) for e, lc in zip(pool.mtp, cache.mtp))   # () without
    h = pool.hidden
    if h is not None:
        prior = None if ring is None else (ring.hidden, ring.r)
        h = put(h, ring_window(hidden, B, prior).reshape(b, nb, B, -1))
    return pool.replace(layers=layers, mtp=mtp, hidden=h)
