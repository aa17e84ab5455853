"""Cache plumbing shared by the hybrid model families (Nemotron-H, Qwen3-Next / Qwen3.5).

A family subclasses `HybridLM`, builds `self.layers` (each with a `kind` and a `mixer`) and
implements `_run(tokens, cache, mixer_fn, valid) -> (final-normed hidden, layer caches)` (valid
[b, T] bool marks the real tokens, see `token_validity`: MoE layers give the others no experts)
and `local_logits(hidden) -> fp32 logits` of its LM head (this device's vocabulary shard under a
vocab-parallel head, see `models.sharding`; `_logits` gathers the whole vocabulary), and with
an MTP head `draft_hidden` (`draft` adds the logits). SSM mixers (kinds "mamba", "gdn")
implement `prefill(h, lengths, cache, slots, starts, block, ring)`,
`decode(h, cache, counts, slots, mode, impl)` and `verify(h, cache, counts, slots, mode, impl)`;
attention mixers are called as `mixer(h, kv_cache, slots, starts, impl)` (impl of decode
attention, `pallas_kernels.attention`; prefill and MTP heads leave it "auto"). `HybridLM` turns
those into:

    logits, cache         = model.prefill(cache, tokens, lengths, slots)   # new requests
    logits, hidden, cache = model.prefill_hidden(...)                      # + hidden, for MTP
    logits, cache         = model.decode(cache, tokens, slots, mode=...)   # one token per row
    hidden, cache         = model.decode_hidden(...)     # up to the LM head (`local_logits`)
    logits, hidden, cache = model.verify(cache, tokens, slots, mode=...)   # T-token window
    hidden, cache         = model.verify_hidden(...)     # up to the LM head
    cache                 = model.commit(cache, slots, n_accepted, T, mode=...)  # accept n

Speculative `mode="replay"` writes the window into the rings and commits by moving the ring
counts; `mode="standard"` is the state-per-draft baseline: T standard steps writing the state
after every window token into the slot's draft rows of the checkpoint pool (a cache built with
`ssm_mode="standard"`, see `models.cache`), and commit points the slot's `state_rows` entry at the
last accepted draft (a remap, as a tuned engine does it: no state is copied).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from models.cache import ModelCache, SSMCache
from models.parallel import gather_vocab
from models.validation import (  # noqa: F401  (SSM_MODES, check_mode: re-exported)
    SSM_MODES,
    check_commit,
    check_draft_room,
    check_mode,
    check_prefill,
    check_window,
)
from pallas_kernels.ring import (
    NULL_SLOT,
    advance_counts,
    base_rows,
    commit_counts,
    conv_commit,
    conv_prefill,
    draft_pool_size,
    draft_rows,
    row_index,
    set_rows,
)

SSM_KINDS = ("mamba", "gdn")
PREFILL_CHUNK = 64      # chunk length of the chunked prefill scans


def prefill_chunk(block: int) -> int:
    """The prefill scans' chunk length: PREFILL_CHUNK, or a smaller block (a power of two, so
    chunks and blocks nest and block ends are chunk ends)."""
    return min(PREFILL_CHUNK, block) if block else PREFILL_CHUNK


def ring_blocks(T: int, block: int, ring: bool) -> int:
    """Blocks of the SSM scan of a T-token prefill window (`ring_window`): ceil(T / block), one
    more when the window continues a ring (its r replayed tokens come first)."""
    return -(-T // block) + ring


def ring_window(u, block: int, ring=None):
    """What an SSM prefill with block > 0 scans: u [b, T, Cu] the window's per-token inputs
    (the in-projection outputs the conv and scan consume, see the mixers' `prefill`); ring
    (prior [b, block, Cu], r [b]) or None. Row i gets its first r[i] prior inputs (the tokens
    since its last whole block, replayed), then u, zero padded to `ring_blocks` whole blocks:
    [b, n * block, Cu]. The scan then starts at a block boundary, so its blocks are the
    prefix cache's."""
    b, T = u.shape[:2]
    n = ring_blocks(T, block, ring is not None) * block
    if ring is None:
        return jnp.pad(u, ((0, 0), (0, n - T), (0, 0)))
    prior, r = ring
    padded = jnp.pad(u, ((0, 0), (block, n - T), (0, 0)))
    shifted = jax.vmap(lambda a, s: lax.dynamic_slice_in_dim(a, s, n))(padded, block - r)
    prior = jnp.pad(prior.astype(u.dtype), ((0, 0), (0, n - block), (0, 0)))
    return jnp.where((jnp.arange(n)[None, :] < r[:, None])[..., None], prior, shifted)


def ring_output(y, T: int, ring=None):
    """The window's part [b, T, ...] of a `ring_window` scan's per-token output y [b, n, ...]
    (row i's from r[i] on)."""
    if ring is None:
        return y[:, :T]
    return jax.vmap(lambda a, s: lax.dynamic_slice_in_dim(a, s, T))(y, ring[1])


class PrefillInputs(NamedTuple):
    """What both SSM mixers' prefill scans (`prefill_inputs`): conv [b, n, C] fp32 (the causal
    conv's output), extra [b, n, E] (the scan's other per-token inputs), lengths [b] (+ the
    ring's r), the resumed state0, the conv state after the prompt, the conv states at block
    ends (block > 0, else None) and u [b, n, C + E] (the inputs, as the prefix cache keeps
    them)."""
    conv: jax.Array
    extra: jax.Array
    lengths: jax.Array
    state0: jax.Array | None
    conv_state: jax.Array
    conv_blocks: jax.Array | None
    u: jax.Array

    def kept(self, state_blocks, block: int):
        """The (state, conv state, inputs) of every block of the scan, or None (block 0)."""
        if not block:
            return None
        u = self.u
        return state_blocks, self.conv_blocks, u.reshape(u.shape[0], -1, block, u.shape[-1])


def prefill_inputs(pre, extra, lengths, cache: SSMCache, slots, starts, weight, bias, block,
                   ring) -> PrefillInputs:
    """The front both SSM mixers' prefill share: the per-token inputs u = [pre, extra] (pre
    [b, T, C] pre-conv channels, extra [b, T, E]), with block > 0 laid out for a block-aligned
    scan after the ring's replayed inputs (`ring_window`), through the causal conv from each
    slot's resumed conv state (`resume_state`)."""
    C = pre.shape[-1]
    u = jnp.concatenate([pre, extra], axis=-1)
    if block:
        u = ring_window(u, block, ring)
        lengths = lengths if ring is None else lengths + ring[1]
    state0, conv0 = resume_state(cache, slots, starts)
    with jax.named_scope("conv"):           # its own class in `replayjax bench prefill --profile`
        conv, conv_state, *conv_blocks = conv_prefill(u[..., :C], weight, bias, lengths, conv0,
                                                      block)
    return PrefillInputs(conv, u[..., C:], lengths, state0, conv_state,
                         conv_blocks[0] if block else None, u)


def resume_state(cache: SSMCache, slots, starts):
    """What a prefill continuing sequences of starts [b] tokens starts from: (state [b, ...]
    fp32, conv state [b, K-1, C]) read from each slot (the checkpoint at the first row of its
    group, which a prefix-cache restore writes, and the conv state); zeros for rows with
    start 0. starts None: (None, None), a fresh start for every row (the scans' own zeros)."""
    if starts is None:
        return None, None
    go = starts > 0
    ck = cache.buffers.checkpoint
    state = ck[base_rows(slots, cache.num_drafts)].astype(jnp.float32)
    state = jnp.where(go.reshape((-1,) + (1,) * (state.ndim - 1)), state, 0)
    return state, jnp.where(go[:, None, None], cache.conv[slots], 0)


def token_validity(slots, window_len: int, lengths=None):
    """[b, T] bool: the real tokens of a batch, i.e. rows on a live slot (not NULL_SLOT) and,
    for right-padded prompts, positions below `lengths` [b]."""
    valid = jnp.broadcast_to((slots != NULL_SLOT)[:, None], (slots.shape[0], window_len))
    if lengths is None:
        return valid
    return valid & (jnp.arange(window_len)[None, :] < lengths[:, None])


def store_prefill(cache: SSMCache, slots, state, conv_state):
    """Writes a prefilled slot: checkpoint = state after the prompt (at the first row of the
    slot's group, where `HybridLM.prefill` points its `state_rows`), conv state."""
    live = slots != NULL_SLOT
    bufs = cache.buffers
    ck = bufs.checkpoint
    rows = base_rows(slots, cache.num_drafts)
    bufs = bufs._replace(checkpoint=set_rows(ck, row_index(rows, live, ck.shape[0]), state))
    i = row_index(slots, live, cache.conv.shape[0])
    return cache.replace(buffers=bufs, conv=set_rows(cache.conv, i, conv_state))


def store_pending(cache: SSMCache, slots, window):
    """Keeps a verify window's pre-conv inputs [b, T, C] until `commit`."""
    T = window.shape[1]
    if cache.pending is None or cache.pending.shape[1] < T:   # `check_window` says it first
        have = 1 if cache.pending is None else cache.pending.shape[1]
        raise ValueError(f"verify window T = {T} exceeds the cache's max_verify ({have}); "
                         f"build the cache with init_cache(..., max_verify={T})")
    i = row_index(slots, slots != NULL_SLOT, cache.conv.shape[0])
    return cache.replace(pending=cache.pending.at[i, :T].set(
        window.astype(cache.pending.dtype), mode="drop", unique_indices=True))


def ssm_buffers(init, num_slots: int, window: int, max_verify: int, ssm_mode: str):
    """A layer's SSM buffers for `ssm_mode`. init(num_slots, window) builds ReplayBuffers or
    GDNBuffers. Replay: as built. Standard: the rings are unused, so they shrink to one entry,
    and the checkpoint pool grows to S * (1 + T) rows for T = max_verify > 1 (draft states).
    The settings are the caller's `init_cache`'s, checked there (`check_cache_settings`)."""
    if ssm_mode == "replay":
        return init(num_slots, window)
    bufs = init(num_slots, 1)
    ck = bufs.checkpoint
    return bufs._replace(checkpoint=jnp.zeros((draft_pool_size(num_slots, max_verify),)
                                              + ck.shape[1:], ck.dtype))


def verify_draft_rows(cache: SSMCache, rows, slots, window_len: int):
    """Draft rows [b, T] for a standard-mode verify window from the slots' state rows [b], or a
    ValueError without room."""
    check_draft_room(cache.num_drafts, window_len)
    return draft_rows(rows, slots, cache.num_drafts, window_len)


def ssm_cache(buffers, num_slots, conv_kernel, conv_channels, dtype, max_verify):
    conv = jnp.zeros((num_slots, conv_kernel - 1, conv_channels), dtype)
    pending = (jnp.zeros((num_slots, max_verify, conv_channels), dtype) if max_verify > 1
               else None)
    return SSMCache(buffers, conv, pending)


class HybridLM(nnx.Module):
    """prefill / decode / verify / commit over the family's `_run`. Each checks its inputs
    (`models.validation`): shapes and dtypes always, values (token ids, lengths, slots, room
    in the slot) when the arrays are concrete, i.e. not when the call is traced under jit."""

    def prefill(self, cache: ModelCache, tokens, lengths, slots, *, last_only=False):
        """tokens [b, T] right-padded prompts, lengths [b] in 1..T, slots [b]: starts the slots
        afresh (any earlier content is discarded). Returns logits [b, T, V] fp32 (positions past
        a prompt are meaningless), or with last_only those of each prompt's last token [b, 1, V]
        (what a generator needs: the LM head over b rows, not b x T), and the cache."""
        logits, _, cache = self.prefill_hidden(cache, tokens, lengths, slots, last_only=last_only)
        return logits, cache

    def prefill_hidden(self, cache: ModelCache, tokens, lengths, slots, *, last_only=False):
        """`prefill` that also returns the final-norm hidden states [b, T, D] (what an MTP head
        drafts from): (logits, hidden, cache)."""
        logits, hidden, cache, _ = self.prefill_from(cache, tokens, lengths, slots,
                                                     last_only=last_only)
        return logits, hidden, cache

    def prefill_from(self, cache: ModelCache, tokens, lengths, slots, starts=None, *,
                     last_only=False, block=0, ring=None, keep=None):
        """`prefill_hidden` continuing sequences: row i's tokens [b, T] sit at positions
        starts[i] + t after a prefix the slot already holds (attention KV at [0, starts), SSM
        state and conv state after position base = starts - r in the checkpoint row and conv
        state, ring count 0: what `models.prefix.restore` leaves); starts None is a fresh start
        (prefill_hidden's computation). lengths [b] counts the new tokens; the slot ends with
        starts + lengths. ring (block > 0): a `models.prefix.Ring`, the r [b] tokens in
        [0, block) between base and starts, replayed from their per-layer inputs; None: r = 0.

        block > 0 (a power of two): the SSM scans run in chunks of min(64, block) from base
        (`ring_window`) and each SSM layer i hands its scan's blocks to keep(i, blocks) inside
        the layer (only what keep returns outlives it; None: the blocks themselves): the state
        after each block [b, n, ...] fp32, the conv state [b, n, K-1, C] and the per-token
        inputs [b, n, block, Cu] (the mixer's `replay_width` Cu, the activation dtype) of the
        n = `ring_blocks` blocks from base. Returns (logits, hidden, cache, kept): kept per
        layer, None for non-SSM layers (all None without block)."""
        check_prefill(self, cache, tokens, lengths, slots, starts)
        begin = jnp.zeros_like(slots) if starts is None else starts
        base = starts if ring is None else starts - ring.r
        index = {id(layer): i for i, layer in enumerate(self.layers)}
        kept = {}

        def mixer(layer, x, lc):
            if layer.kind in SSM_KINDS:
                i = index[id(layer)]
                prior = None if ring is None else (ring.inputs[i], ring.r)
                out, lc, blocks = layer.mixer.prefill(x, lengths, lc, slots, base, block, prior)
                kept[i] = blocks if keep is None or blocks is None else keep(i, blocks)
                return out, lc
            return layer.mixer(x, lc, slots, begin)

        valid = token_validity(slots, tokens.shape[1], lengths)
        hidden, layers = self._run(tokens, cache, mixer, valid)
        last = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)   # [b, 1, D]
        logits = self._logits(last if last_only else hidden)
        i = row_index(slots, slots != NULL_SLOT, cache.num_slots)
        rows = base_rows(slots, self._num_drafts(cache))
        cache = cache.replace(counts=cache.counts.at[i].set(0, mode="drop"),
                              lengths=cache.lengths.at[i].set(begin + lengths, mode="drop"),
                              state_rows=cache.state_rows.at[i].set(rows, mode="drop"),
                              layers=layers)
        return logits, hidden, cache, tuple(kept.get(i) for i in range(len(self.layers)))

    def replay_widths(self) -> tuple[int, ...]:
        """Per layer the SSM mixer's `replay_width` (0 for other layers): the per-token inputs
        a prefix-cache entry keeps (`models.prefix.init_pool`)."""
        return tuple(layer.mixer.replay_width if layer.kind in SSM_KINDS else 0
                     for layer in self.layers)

    def _logits(self, hidden):
        """hidden [..., D] -> all the logits [..., V] fp32 (gathered under a vocab-parallel
        head)."""
        return gather_vocab(self.local_logits(hidden), self.cfg.vocab_size)

    def draft(self, cache: ModelCache, hidden, next_tokens, slots, starts, *, step: int = 0):
        """One MTP step (the family's `draft_hidden`, for a model built with mtp=True): logits
        [b, T, V] fp32 for the token after `next_tokens`, the head's hidden [b, T, D] (feed it
        back to draft further) and the cache (MTP KV written at positions
        starts..starts+T-1)."""
        h, cache = self.draft_hidden(cache, hidden, next_tokens, slots, starts, step=step)
        return self._logits(h), h, cache

    def decode(self, cache: ModelCache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, 1]: one new token per row at position lengths[slot]. Returns logits
        [b, 1, V] fp32 and the cache (ring counts and lengths advanced)."""
        hidden, cache = self.decode_hidden(cache, tokens, slots, mode=mode, impl=impl)
        return self._logits(hidden), cache

    def decode_hidden(self, cache: ModelCache, tokens, slots, *, mode="replay", impl="auto"):
        """`decode` up to the LM head: the final-normed hidden states [b, 1, D] (the
        activation dtype) and the cache; `local_logits` of them are the logits."""
        check_window(self, cache, tokens, slots, mode, "decode")
        rows = cache.state_rows[slots]
        hidden, layers = self._window_pass(
            cache, tokens, slots,
            lambda m, x, lc: m.decode(x, lc, cache.counts, slots, rows, mode, impl), impl)
        i = row_index(slots, slots != NULL_SLOT, cache.num_slots)
        counts = (advance_counts(cache.counts, slots, self._window(cache)) if mode == "replay"
                  else cache.counts)
        return hidden, cache.replace(counts=counts, layers=layers,
                                     lengths=cache.lengths.at[i].add(1, mode="drop"))

    def verify(self, cache: ModelCache, tokens, slots, *, mode="replay", impl="auto"):
        """Speculative verify: tokens [b, T] at positions lengths[slot]..+T-1; tokens[:, 0] is
        the last sampled token, the rest drafts. Returns logits [b, T, V] fp32, the final-norm
        hidden states [b, T, D] (what an MTP head drafts from) and the cache with the window
        written but not committed: call `commit` with the same mode next. mode "replay": window
        into the rings; "standard": the state after every window token into the slot's draft
        rows (needs a cache built with ssm_mode="standard", max_verify >= T)."""
        hidden, cache = self.verify_hidden(cache, tokens, slots, mode=mode, impl=impl)
        return self._logits(hidden), hidden, cache

    def verify_hidden(self, cache: ModelCache, tokens, slots, *, mode="replay", impl="auto"):
        """`verify` up to the LM head: (hidden [b, T, D], cache); `local_logits` of hidden are
        the logits."""
        check_window(self, cache, tokens, slots, mode, "verify")
        rows = cache.state_rows[slots]
        hidden, layers = self._window_pass(
            cache, tokens, slots,
            lambda m, x, lc: m.verify(x, lc, cache.counts, slots, rows, mode, impl), impl)
        return hidden, cache.replace(layers=layers)

    def _window_pass(self, cache: ModelCache, tokens, slots, ssm_fn, impl):
        """tokens [b, T] at positions lengths[slot]..: SSM mixers through ssm_fn(mixer, x, lc),
        attention at those positions with `impl`. Returns (final-normed hidden, layer caches)."""
        starts = cache.lengths[slots]

        def mixer(layer, x, lc):
            if layer.kind in SSM_KINDS:
                return ssm_fn(layer.mixer, x, lc)
            return layer.mixer(x, lc, slots, starts, impl)

        return self._run(tokens, cache, mixer, token_validity(slots, tokens.shape[1]))

    def commit(self, cache: ModelCache, slots, n_accepted, window_len: int, *, mode="replay"):
        """Accept the first n_accepted (1..T) tokens of each row's verify window: conv states and
        attention lengths roll back the rest exactly; the SSM state by ring counts (replay) or
        by pointing the slot's `state_rows` at draft n - 1 (standard; counts untouched).
        window_len is the verify window's T (a Python int, static under jit); n_accepted outside
        1..T is an error on concrete arrays and clipped to it under jit."""
        check_commit(cache, slots, n_accepted, window_len, mode)
        n = jnp.clip(n_accepted, 1, window_len)
        layers = tuple(lc.replace(conv=conv_commit(lc.conv, lc.pending[slots][:, :window_len],
                                                   slots, n))
                       if isinstance(lc, SSMCache) else lc for lc in cache.layers)
        i = row_index(slots, slots != NULL_SLOT, cache.num_slots)
        counts, state_rows = cache.counts, cache.state_rows
        if mode == "replay":
            counts = commit_counts(counts, slots, n, window_len, self._window(cache))
        elif self._num_drafts(cache):
            drafts = draft_rows(state_rows[slots], slots, self._num_drafts(cache), window_len)
            state_rows = state_rows.at[i].set(
                jnp.take_along_axis(drafts, (n - 1)[:, None], axis=1)[:, 0], mode="drop")
        return cache.replace(counts=counts, state_rows=state_rows, layers=layers,
                             lengths=cache.lengths.at[i].add(n, mode="drop"))

    @staticmethod
    def _num_drafts(cache: ModelCache) -> int:
        """Draft states per slot of a standard-mode cache (0 otherwise)."""
        return next((lc.num_drafts for lc in cache.layers if isinstance(lc, SSMCache)), 0)

    @staticmethod
    def _window(cache: ModelCache) -> int:
        """The ring window L (1 for a model without SSM layers: counts are then unused)."""
        return next((lc.buffers.window for lc in cache.layers if isinstance(lc, SSMCache)), 1)
