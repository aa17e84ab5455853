"""The engine's device steps: pure functions of (models, donated `EngineState`, inputs), jitted
by `models.runner.Runner.jit` with the static settings bound (functools.partial). `models` is
the merged tuple (target, *drafter.models). S = slots including the null slot (0)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from models import prefix as pool_ops
from models.cache import ModelCache
from models.parallel import gather_vocab
from pallas_kernels.ring import NULL_SLOT
from replayjax.drafters import Drafter, Prefilled, Verified
from replayjax.sampling import SamplingArrays


@dataclasses.dataclass(frozen=True)
class Keep:
    """What a step returns per token besides the token (a static setting): nothing; its logits
    [V] fp32 (`logits`); or (`logprobs` = K >= 0) its log probability and the K most likely
    tokens' ids and log probabilities, from the log-softmax of its fp32 logits (the model's own
    distribution, before temperature and filters)."""
    logits: bool = False
    logprobs: int = -1

    @property
    def any(self) -> bool:
        return self.logits or self.logprobs >= 0

    def of(self, logits, tokens):
        """logits [..., V] fp32 and the tokens chosen from them [...] -> what is kept: logits,
        or (logprob [...], top ids [..., K] int32, top logprobs [..., K])."""
        if self.logits:
            return logits
        lse = jax.nn.logsumexp(logits, axis=-1)
        chosen = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0] - lse
        top, ids = jax.lax.top_k(logits, self.logprobs)
        return chosen, ids.astype(jnp.int32), top - lse[..., None]

    def buffers(self, lead: tuple, V: int):
        """Zeros shaped as `of` of logits [*lead, V] (None: nothing kept)."""
        if not self.any:
            return None
        return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(
            self.of, jax.ShapeDtypeStruct((*lead, V), jnp.float32),
            jax.ShapeDtypeStruct(lead, jnp.int32)))


NOTHING = Keep()


@struct.dataclass
class EngineState:
    """The device state donated to every step."""
    cache: ModelCache       # the target model's cache
    drafter: Any = None     # the drafter's own pytree (`Drafter.init_state`), or None
    prefix: Any = None      # the prefix cache's `models.prefix.PrefixPool`, or None (off)


@struct.dataclass
class PrefixRows:
    """A prefill's prefix-cache work per row (see `models.prefix`)."""
    starts: jax.Array       # [b] int32 cached tokens restored before the row's prompt remainder
    hits: jax.Array         # [b, nh] int32 pool entries of those tokens' blocks (nh may be 0)
    stores: jax.Array       # [b, n] int32 pool entry for each block of the SSM scan from the
                            # row's last whole cached block (`models.hybrid.ring_blocks`), -1


@struct.dataclass
class SlotInputs:
    """Per-row decode inputs of one host visit ([b]: a row per running slot, padded, or every
    slot; inactive rows run as null-slot rows)."""
    slots: jax.Array        # [b] int32 the slot each row decodes (NULL_SLOT: padding)
    last: jax.Array         # [b] int32 each row's last token (the next step's input)
    active: jax.Array       # [b] bool
    remaining: jax.Array    # [b] int32 tokens a row may still generate
    gen_pos: jax.Array      # [b] int32 tokens generated so far (the next one's sampling position)
    stops: jax.Array        # [b, W] int32 stop ids, -1 padded


def prefill(models, state: EngineState, tokens, lengths, slots, sp: SamplingArrays,
            rows: PrefixRows | None = None, *, drafter: Drafter, keep: Keep = NOTHING):
    """Admits prompts: tokens [b, T] right-padded, lengths [b], slots [b] (NULL_SLOT = unused
    row), sp [b]. With a prefix cache (`state.prefix` and `rows`), each row first gets its
    cached prefix of rows.starts tokens restored (the tokens past its last whole block are
    replayed by the prefill), tokens are the prompt past it, and the blocks named in
    rows.stores go into the pool (the SSM layers' inside the prefill). Prefills the target,
    hands the rows to the drafter and samples each row's first token. Returns the state, the
    first tokens [b] and what `keep` keeps of their logits [b, ...] (None: nothing)."""
    target, own = models[0], models[1:]
    cache, pool, starts, prev, ring, store = state.cache, state.prefix, None, None, None, None
    if pool is not None:
        if rows.hits.shape[1]:
            starts = rows.starts
            cache, prev, ring = pool_ops.restore(pool, cache, slots, rows.hits, starts)
        idx = pool_ops.store_index(pool, slots, rows.stores)
        store = lambda i, blocks: pool_ops.store_ssm(pool.layers[i], blocks, idx)
        if prev is None and pool.hidden is not None:
            prev = jnp.zeros((tokens.shape[0], pool.hidden.shape[-1]), pool.hidden.dtype)
    logits, hidden, cache, kept = target.prefill_from(
        cache, tokens, lengths, slots, starts, last_only=True,
        block=0 if pool is None else pool.block, ring=ring, keep=store)
    last = logits[:, 0]
    first = sp.sample(last, jnp.zeros_like(lengths))
    begin = jnp.zeros_like(lengths) if starts is None else starts
    cache, dstate = drafter.prefill(target, own, cache, state.drafter,
                                    Prefilled(tokens, lengths, slots, hidden, first, begin, prev))
    if pool is not None:
        base = begin if ring is None else begin - ring.r
        pool = pool_ops.capture(pool, cache, hidden, kept, slots, base, idx, ring)
    return (state.replace(cache=cache, drafter=dstate, prefix=pool), first,
            keep.of(last, first) if keep.any else None)


def _advance(s: SlotInputs, emitted, n) -> SlotInputs:
    """The rows after a step that emitted tokens emitted[:, :n] ([b, W] int32, n [b] int32; 0
    for a row that took no part): each one's last token, remaining and next sampling position
    move on, and it stays active while it may generate more and emitted no stop id (the host
    drops the tokens past either)."""
    valid = jnp.arange(emitted.shape[1])[None, :] < n[:, None]                   # [b, W]
    stop = jnp.any(valid & jnp.any(emitted[:, :, None] == s.stops[:, None, :], axis=2), axis=1)
    remaining = s.remaining - n
    last = jnp.take_along_axis(emitted, jnp.maximum(n - 1, 0)[:, None], axis=1)[:, 0]
    return s.replace(last=jnp.where(n > 0, last, s.last),
                     active=s.active & (remaining > 0) & ~stop,
                     remaining=remaining, gen_pos=s.gen_pos + n)


def decode_loop(models, state: EngineState, inp: SlotInputs, sp: SamplingArrays, *, mode: str,
                impl: str, n: int, keep: Keep = NOTHING):
    """Up to n decode steps over the rows of `inp` (each decoding its slot), stopping early
    once no row is active. Returns the state, the sampled tokens [b, n] (-1 where a row was
    inactive) and what `keep` keeps of the logits they were sampled from ([b, n, ...]; else
    None). Under a vocab-parallel LM head an all-greedy step keeping nothing gathers no
    logits, only each device's (max, argmax) (`SamplingArrays.sample_local`)."""
    model = models[0]
    b, V = inp.last.shape[0], model.cfg.vocab_size

    def cond(c):
        return (c[0] < n) & jnp.any(c[2].active)

    def body(c):
        i, cache, s, out, lg = c
        slots = jnp.where(s.active, inp.slots, NULL_SLOT)
        hidden, cache = model.decode_hidden(cache, s.last[:, None], slots, mode=mode,
                                            impl=impl)
        local = model.local_logits(hidden[:, 0])
        if keep.any:            # kept: gathered once and sampled from
            logits = gather_vocab(local, V)
            tok = sp.sample(logits, s.gen_pos)
            lg = jax.tree.map(lambda buf, x: buf.at[:, i].set(x), lg, keep.of(logits, tok))
        else:                   # greedy batches gather only each shard's (max, argmax)
            tok = sp.sample_local(local, V, s.gen_pos)
        out = out.at[:, i].set(jnp.where(s.active, tok, -1))
        return i + 1, cache, _advance(s, tok[:, None], s.active.astype(jnp.int32)), out, lg

    out = jnp.full((b, n), -1, jnp.int32)
    lg = keep.buffers((b, n), V)
    _, cache, _, out, lg = jax.lax.while_loop(cond, body, (0, state.cache, inp, out, lg))
    return state.replace(cache=cache), out, lg


def speculate(models, state: EngineState, inp: SlotInputs, sp: SamplingArrays, host, *,
              drafter: Drafter, mode: str, impl: str, keep: Keep = NOTHING):
    """One speculative step over the rows of `inp` (each its slot's): the drafter proposes K
    drafts (host: its `host_drafts`, or None), the target verifies [last, drafts],
    `SamplingArrays.verify` accepts a prefix, the target commits it and the drafter follows.
    Returns the state, the emitted tokens [b, T], n_acc [b] (valid emitted tokens; 0 for
    inactive rows), the drafts verified [b, K] and what `keep` keeps of the verify logits
    [b, T, ...] (rows 0..n_acc-1 are the emitted tokens'; else None). Under a vocab-parallel
    LM head an all-greedy verify keeping nothing gathers no logits
    (`SamplingArrays.verify_local`)."""
    target, own = models[0], models[1:]
    b, V = inp.last.shape[0], target.cfg.vocab_size
    slots = jnp.where(inp.active, inp.slots, NULL_SLOT)
    drafts = drafter.propose(target, own, state.cache, state.drafter, inp.last, slots, host)
    K = drafts.shape[1]
    starts = state.cache.lengths[slots]
    window = jnp.concatenate([inp.last[:, None], drafts], axis=1)
    hidden, cache = target.verify_hidden(state.cache, window, slots, mode=mode, impl=impl)
    local = target.local_logits(hidden)
    if keep.any:
        logits = gather_vocab(local, V)
        n_acc, new = sp.verify(logits, drafts, inp.gen_pos)
    else:                   # greedy batches gather only each shard's (max, argmax)
        logits = None
        n_acc, new = sp.verify_local(local, V, drafts, inp.gen_pos)
    cache = target.commit(cache, slots, n_acc, K + 1, mode=mode)
    emitted = jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1)
    emitted = emitted.at[jnp.arange(b), n_acc - 1].set(new)
    cache, dstate = drafter.commit(target, own, cache, state.drafter, Verified(
        inp.last, drafts, emitted, n_acc, hidden, starts, slots, inp.active))
    return (state.replace(cache=cache, drafter=dstate), emitted, jnp.where(inp.active, n_acc, 0),
            drafts, None if logits is None else keep.of(logits, emitted))


def speculate_loop(models, state: EngineState, inp: SlotInputs, sp: SamplingArrays, host, *,
                   n: int, drafter: Drafter, mode: str, impl: str, keep: Keep = NOTHING):
    """Up to n `speculate` steps over the rows of `inp` in one `lax.while_loop`, stopping early
    once no row is active: a row stays active while it may generate more tokens and none of
    its emitted ones is a stop id (the host drops the tokens past either, as after one step).
    host (`Drafter.host_drafts`) serves every step, so a host drafter runs with n = 1.
    Returns the state, the emitted tokens [b, n, T], n_acc [b, n] (0 for a row inactive at a
    step, and for steps not run), the drafts verified [b, n, K] and what `keep` keeps of the
    verify logits ([b, n, T, ...]; else None)."""
    b, K, V = inp.last.shape[0], drafter.num_draft, models[0].cfg.vocab_size
    T = K + 1

    def cond(c):
        return (c[0] < n) & jnp.any(c[2].active)

    def body(c):
        i, st, s, out, acc, dr, lg = c
        st, emitted, n_acc, drafts, kept = speculate(
            models, st, s, sp, host, drafter=drafter, mode=mode, impl=impl, keep=keep)
        s = _advance(s, emitted, n_acc)
        if keep.any:
            lg = jax.tree.map(lambda buf, x: buf.at[:, i].set(x), lg, kept)
        return (i + 1, st, s, out.at[:, i].set(emitted), acc.at[:, i].set(n_acc),
                dr.at[:, i].set(drafts), lg)

    init = (0, state, inp, jnp.zeros((b, n, T), jnp.int32), jnp.zeros((b, n), jnp.int32),
            jnp.zeros((b, n, K), jnp.int32), keep.buffers((b, n, T), V))
    _, state, _, out, acc, dr, lg = jax.lax.while_loop(cond, body, init)
    return state, out, acc, dr, lg
