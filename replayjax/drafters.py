"""Drafters: what proposes the K tokens each speculative step verifies.

The engine reaches a drafter only through the `Drafter` interface and finds it by name in
`DRAFTERS` (`make_drafter`); registering a class there makes a new drafter available to
`Engine(model, drafter=name, num_draft=K)`.

- "none": no speculation (num_draft = 0); the engine runs plain decode steps.
- "ngram" (host): prompt lookup in the request's own text (`ngram_drafts`).
- "mtp" (device): the model's MTP head. Prefill seeds the head's KV cache with (hidden_j,
  token_{j+1}) over the prompt and chains K greedy drafts; after every commit the head re-runs
  over the verify window's hidden states and emitted tokens (at the window's positions) and chains
  the next K drafts, kept in the drafter's state for the next step.
- "draft" (device): a separate, smaller `draft_model` with the same vocabulary and its own cache
  (same slots and max_len), prefilled with the same prompts. Every step chains K greedy decodes
  from its committed cache on a throwaway copy, then -- after the target's verify + commit --
  verifies the same window [last, d_1..d_K] on the real draft cache and commits the accepted
  prefix, so both caches always hold exactly the emitted tokens.

Device hooks (`prefill`, `propose`, `commit`) are traced inside the engine's jitted steps: pure
functions of their arguments. `target` is the target model and `own` the drafter's `models`, both
merged from the step's params; `cache` is the target's cache (`models.cache.ModelCache`, which
also holds an MTP head's KV cache); `state` is the drafter's own pytree (what `init_state` built,
None by default). S = slots including the null slot, K = num_draft, T = K + 1.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from models.parallel import vocab_argmax
from pallas_kernels.ring import NULL_SLOT


@struct.dataclass
class Prefilled:
    """A prefill call's rows, as the drafter sees them after the target's prefill."""
    tokens: jax.Array       # [b, T] int32 right-padded prompts
    lengths: jax.Array      # [b] int32
    slots: jax.Array        # [b] int32, NULL_SLOT = unused row
    hidden: jax.Array       # [b, T, D] the target's final-norm hidden states
    first: jax.Array        # [b] int32 each row's first sampled token
    starts: jax.Array | None = None   # [b] int32 tokens before the window (a prefix-cache hit)
    prev_hidden: jax.Array | None = None  # [b, D] the target's hidden state at position
                                          # starts - 1 (prefix cache with an MTP head)


@struct.dataclass
class Verified:
    """A speculative step's outcome over its b rows, after the target's verify + commit."""
    last: jax.Array         # [b] int32 the window's first token (sampled by the previous step)
    drafts: jax.Array       # [b, K] int32 the proposals verified
    emitted: jax.Array      # [b, T] int32 accepted drafts, then the new token
    n_acc: jax.Array        # [b] int32 in 1..T: window tokens committed
    hidden: jax.Array       # [b, T, D] the target's final-norm hidden states over the window
    starts: jax.Array       # [b] int32 the window's first position
    slots: jax.Array        # [b] int32 each row's slot, NULL_SLOT where inactive
    active: jax.Array       # [b] bool


class Drafter(abc.ABC):
    """The engine's view of a drafter. Subclasses set `name`, implement `propose` and override
    the hooks they need; the defaults keep no state and change nothing."""

    name: ClassVar[str]
    speculative: ClassVar[bool] = True      # proposes num_draft >= 1 tokens per step
    models: tuple = ()          # models its device hooks run besides the target (a draft model)

    def __init__(self, model, *, num_draft: int, draft_model=None, impl: str = "auto"):
        """Checks that this drafter can serve `model` with these settings (one-line
        ValueErrors)."""
        if self.speculative and num_draft < 1:
            raise ValueError(f"drafter={self.name!r} proposes num_draft >= 1 tokens per step, "
                             f"got num_draft = {num_draft} (drop drafter for plain decoding)")
        if not self.speculative and num_draft != 0:
            raise ValueError(f"drafter={self.name!r} proposes no drafts: num_draft must be 0, "
                             f"got {num_draft}")
        if draft_model is not None:
            raise ValueError(f"draft_model is only used with drafter='draft' (this is "
                             f"drafter={self.name!r})")
        self.num_draft, self.impl = num_draft, impl

    @property
    def on_host(self) -> bool:
        """Whether it drafts on the host (it overrides `host_drafts`): the host runs between two
        steps, so a visit is one step; device drafters chain up to steps_per_visit steps on
        device."""
        return type(self).host_drafts is not Drafter.host_drafts

    def init_state(self, num_slots: int, init_cache: Callable) -> Any:
        """The drafter's device state for a pool of num_slots slots (donated with the target
        cache to every step). init_cache(model) builds a replay-mode cache shaped like the
        target's."""
        return None

    def host_drafts(self, num_rows: int, histories: Mapping[int, tuple]) -> jax.Array | None:
        """Proposals computed on the host before a step: [b, K] int32 for the step's b rows,
        or None (device drafters). histories: row -> (prompt, generated tokens) of every
        active row."""
        return None

    def prefill(self, target, own, cache, state, p: Prefilled):
        """After the target's prefill of `p`'s rows: returns (cache, state)."""
        return cache, state

    @abc.abstractmethod
    def propose(self, target, own, cache, state, last, slots, host):
        """The drafts [b, K] int32 of this step's rows. last [b] int32 (each row's last token,
        the window's first), slots [b] the rows' slots (NULL_SLOT where inactive), host:
        `host_drafts`' output."""

    def commit(self, target, own, cache, state, v: Verified):
        """After the target's verify + commit of a step: returns (cache, state)."""
        return cache, state


class NoDrafter(Drafter):
    """No speculation: the engine decodes one token per step."""

    name = "none"
    speculative = False

    def propose(self, target, own, cache, state, last, slots, host):
        raise TypeError("drafter='none' proposes nothing: the engine decodes without drafts")


def ngram_drafts(history: Sequence[int], k: int, max_n: int = 3) -> list:
    """Prompt-lookup drafter: find the latest earlier occurrence of the longest trailing n-gram
    (n = max_n..1) and propose the k tokens that followed it (repeating the last token if the
    history runs out or nothing matches)."""
    h = list(history)
    for n in range(min(max_n, len(h) - 1), 0, -1):
        tail = h[-n:]
        for start in range(len(h) - n - 1, -1, -1):
            if h[start:start + n] == tail:
                nxt = h[start + n:start + n + k]
                return nxt + [h[-1]] * (k - len(nxt))
    return [h[-1]] * k


class NgramDrafter(Drafter):
    """Prompt lookup on the host (`ngram_drafts` over prompt + generated tokens)."""

    name = "ngram"

    def host_drafts(self, num_rows, histories):
        out = np.zeros((num_rows, self.num_draft), np.int32)
        for s, (prompt, tokens) in histories.items():
            out[s] = ngram_drafts(list(prompt) + list(tokens), self.num_draft)
        return jnp.asarray(out)

    def propose(self, target, own, cache, state, last, slots, host):
        return host


class MTPDrafter(Drafter):
    """The target's MTP head; state: each slot's next drafts [S, K] int32, chained after each
    commit (and at prefill) from the head's KV cache, which lives in the target cache."""

    name = "mtp"

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        if getattr(model, "mtp", None) is None:
            raise ValueError("drafter='mtp' needs a model with an MTP head (build it with "
                             "mtp=True and load its mtp.* weights)")

    def init_state(self, num_slots, init_cache):
        return jnp.zeros((num_slots, self.num_draft), jnp.int32)

    def prefill(self, target, own, cache, state, p):
        return _mtp_seed(target, cache, p, state)

    def propose(self, target, own, cache, state, last, slots, host):
        return state[slots]

    def commit(self, target, own, cache, state, v):
        nxt, cache = _mtp_chain(target, cache, v.hidden, v.emitted, v.slots, v.starts,
                                v.n_acc - 1, self.num_draft)
        rows = jnp.where(v.active, v.slots, state.shape[0])        # inactive rows: dropped
        return cache, state.at[rows].set(nxt, mode="drop")


class DraftModelDrafter(Drafter):
    """A separate draft model with the target's vocabulary; state: its cache (replay mode)."""

    name = "draft"

    def __init__(self, model, *, num_draft: int, draft_model=None, impl: str = "auto"):
        if draft_model is None:
            raise ValueError("drafter='draft' needs draft_model=... (a smaller model with the "
                             "target's vocabulary)")
        super().__init__(model, num_draft=num_draft, impl=impl)
        if draft_model.cfg.vocab_size != model.cfg.vocab_size:
            raise ValueError(f"the draft model's vocab_size ({draft_model.cfg.vocab_size}) "
                             f"differs from the target model's ({model.cfg.vocab_size}); a draft "
                             f"model must share the target's vocabulary")
        self.models = (draft_model,)

    def init_state(self, num_slots, init_cache):
        return init_cache(self.models[0])

    def prefill(self, target, own, cache, state, p):
        _, state = own[0].prefill(state, p.tokens, p.lengths, p.slots, last_only=True)
        return cache, state

    def propose(self, target, own, cache, state, last, slots, host):
        return _draft_chain(own[0], state, last, slots, self.num_draft, self.impl)

    def commit(self, target, own, cache, state, v):
        return cache, _draft_sync(own[0], state, v.last, v.drafts, v.slots, v.n_acc, self.impl)


DRAFTERS: dict[str, type[Drafter]] = {
    cls.name: cls for cls in (NoDrafter, NgramDrafter, MTPDrafter, DraftModelDrafter)}


def make_drafter(name: str | None, model, *, num_draft: int, draft_model=None,
                 impl: str = "auto") -> Drafter:
    """The registered drafter `name` for `model`; None: "ngram" when num_draft > 0, else
    "none". ValueError for an unknown name or settings the drafter cannot serve."""
    if name is None:
        name = "ngram" if num_draft else "none"
    if name not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(map(repr, DRAFTERS))}, got "
                         f"{name!r}")
    return DRAFTERS[name](model, num_draft=num_draft, draft_model=draft_model, impl=impl)


# ---------------------------------------------------------------------- MTP head (on device)

def _mtp_chain(model, cache, hidden, next_tokens, slots, starts, idx, K):
    """Runs the MTP head over (hidden[:, t], next_tokens[:, t]) at positions starts + t (writing its
    KV there), takes its output at index idx [b] as the source of the first draft, then chains
    K - 1 single-token steps (the head's own hidden and argmax draft fed back) at positions
    starts + idx + 1, ... Returns the greedy drafts [b, K] and the cache."""
    def draft(cache, h, tok, pos, k):
        return model.draft_hidden(cache, h, tok, slots, pos, step=k)

    def argmax(h):          # h [b, 1, D]: greedy drafts [b], no logits gathered
        return vocab_argmax(model.local_logits(h[:, 0]), model.cfg.vocab_size)

    rows = jnp.arange(hidden.shape[0])
    h, cache = draft(cache, hidden, next_tokens, starts, 0)
    h = h[rows, idx][:, None]
    d = argmax(h)
    out, pos = [d], starts + idx + 1
    for k in range(1, K):
        h, cache = draft(cache, h, d[:, None], pos, k)
        d = argmax(h)
        out.append(d)
        pos = pos + 1
    return jnp.stack(out, axis=1), cache


def _mtp_seed(model, cache, p: Prefilled, drafts):
    """After prefill: the MTP cache gets (hidden_j, prompt_{j+1}) for j < n-1 and (hidden_{n-1},
    first token) at n-1 (positions past that are scratch); the first K drafts of each admitted
    slot go into `drafts` [S, K]. A window continuing a cached prefix (p.starts > 0) also
    rewrites the entry before it, (p.prev_hidden, prompt_0) at starts - 1: the cached one was
    made with whatever token followed the prefix then. Returns the cache and drafts."""
    rows = jnp.arange(p.tokens.shape[0])
    nxt = jnp.concatenate([p.tokens[:, 1:], jnp.zeros_like(p.tokens[:, :1])], axis=1)
    nxt = nxt.at[rows, p.lengths - 1].set(p.first)
    hidden, starts, idx = p.hidden, jnp.zeros_like(p.slots), p.lengths - 1
    if p.prev_hidden is not None:           # one more position in front where continuing
        back = p.starts > 0
        pad = lambda a, front: jnp.where(
            back.reshape((-1,) + (1,) * (a.ndim - 1)),
            jnp.concatenate([front[:, None].astype(a.dtype), a], axis=1),
            jnp.concatenate([a, jnp.zeros_like(a[:, :1])], axis=1))
        hidden, nxt = pad(hidden, p.prev_hidden), pad(nxt, p.tokens[:, 0])
        starts, idx = p.starts - back, idx + back
    new, cache = _mtp_chain(model, cache, hidden, nxt, p.slots, starts, idx, drafts.shape[1])
    i = jnp.where(p.slots != NULL_SLOT, p.slots, drafts.shape[0])
    return cache, drafts.at[i].set(new, mode="drop")


# ---------------------------------------------------------------------- draft model (on device)

def _draft_chain(draft, dcache, last, slots, K, impl):
    """K greedy draft-model decodes (a scan: one compiled decode) from its committed cache, fed
    last [b] then its own argmax: returns the drafts [b, K]. The decoded cache is dropped --
    `_draft_sync` rewrites the same positions from the committed state -- so the step's donated
    draft cache must survive the chain: XLA copies its pools once per step, which is cheap for a
    small draft model."""
    def step(carry, _):
        c, tok = carry
        h, c = draft.decode_hidden(c, tok[:, None], slots, mode="replay", impl=impl)
        tok = vocab_argmax(draft.local_logits(h[:, 0]), draft.cfg.vocab_size)
        return (c, tok), tok

    _, drafts = jax.lax.scan(step, (dcache, last), None, length=K)
    return drafts.T


def _draft_sync(draft, dcache, last, drafts, slots, n_acc, impl):
    """Brings the draft cache level with the target's: verify the window [last, drafts] [b, K+1]
    and commit its first n_acc [b] tokens, so it holds every emitted token but the newest (the
    next step's `last`), exactly as the target's cache does."""
    window = jnp.concatenate([last[:, None], drafts], axis=1)
    _, dcache = draft.verify_hidden(dcache, window, slots, impl=impl)
    return draft.commit(dcache, slots, n_acc, window.shape[1])
