"""The decode engine: a fixed pool of slots, continuous batching, jitted multi-step decode.

    engine = Engine(model, num_slots=8, max_len=2048)            # ReplaySSM decode by default
    results = engine.generate([Request(prompt=[1, 5, 9], max_new_tokens=64), ...])

Requests are admitted into free slots between host visits (prefill of the new ones, padded to a
fixed batch and a power-of-two length bucket, so shapes -- and compilations -- stay fixed); every
visit runs up to `steps_per_visit` decode steps on device in one `lax.while_loop` over all slots,
with the cache donated. Finished slots are freed and reused (prefill resets a slot's state).
With `num_draft > 0` the engine decodes speculatively: an n-gram drafter proposes K tokens from the
request's own text, the model verifies T = K + 1 tokens in one step, `verify_drafts` accepts a
prefix (greedy: exact match; sampling: rejection sampling), and `commit` rolls back the rest.
With `drafter="mtp"` the drafts come from the model's MTP head instead, all on device: prefill
seeds the head's KV cache with (hidden_j, token_{j+1}) over the prompt and chains K greedy drafts;
every speculative step re-runs the head over the verify window's hidden states and emitted tokens
(at the window's positions) and chains the next K drafts, returned for the next step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.runner import Runner
from pallas_kernels._common import NULL_SLOT
from replayjax import sampling


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0 = greedy
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1 = off
    seed: int = 0


@dataclasses.dataclass
class Request:
    prompt: Sequence[int]
    max_new_tokens: int = 32
    stop_ids: tuple = ()
    sampling: SamplingParams = SamplingParams()
    id: object = None


@dataclasses.dataclass
class Completion:
    id: object
    tokens: list
    finish_reason: str              # "stop" | "length"
    ttft_s: float                   # submission to first token
    completion_s: float             # submission to last token
    verify_steps: int = 0           # speculative steps this request took part in
    accepted_drafts: int = 0
    drafts: list = dataclasses.field(default_factory=list)  # (cache length, drafts) per spec
                                                            # step, with Engine.record_drafts

    @property
    def tpot_s(self):
        """Mean time per output token after the first."""
        return (self.completion_s - self.ttft_s) / max(len(self.tokens) - 1, 1)


class RequestError(ValueError):
    """A request the engine cannot serve (named field and limit in the message)."""


def _bucket(n, minimum=16):
    return max(minimum, 1 << (n - 1).bit_length())


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


class Engine:
    def __init__(self, model, *, num_slots: int = 8, max_len: int = 1024, ssm_mode: str = "replay",
                 window: int = 16, state_dtype=jnp.float32, steps_per_visit: int = 8,
                 num_draft: int = 0, impl: str = "auto", drafter: str = "ngram"):
        if ssm_mode not in ("replay", "standard"):
            raise ValueError(f"ssm_mode must be 'replay' or 'standard', got {ssm_mode!r}")
        if num_draft and ssm_mode != "replay":
            raise ValueError("speculative decoding needs ssm_mode='replay' (rollback by cursor)")
        if not 0 <= num_draft <= min(7, window - 1):
            raise ValueError(f"num_draft = {num_draft} must be in [0, {min(7, window - 1)}] "
                             f"(window L = {window}, at most 8 verify tokens)")
        if drafter not in ("ngram", "mtp"):
            raise ValueError(f"drafter must be 'ngram' or 'mtp', got {drafter!r}")
        if drafter == "mtp" and getattr(model, "mtp", None) is None:
            raise ValueError("drafter='mtp' needs a model with an MTP head (build it with mtp=True "
                             "and load its mtp.* weights)")
        self.drafter = drafter
        self.runner = Runner(model)
        self.vocab = model.cfg.vocab_size
        self.S = num_slots + 1                        # + the null slot
        self.max_len, self.mode, self.impl = max_len, ssm_mode, impl
        self.steps, self.K = steps_per_visit, num_draft
        self.cache = self.runner.init_cache(self.S, max_len, window=window,
                                            max_verify=num_draft + 1, state_dtype=state_dtype)
        self._decode_loop = jax.jit(functools.partial(_decode_loop, self.runner.graphdef,
                                                      mode=ssm_mode, impl=impl, n=steps_per_visit),
                                    donate_argnums=(1,))
        self._spec_step = jax.jit(functools.partial(_spec_step, self.runner.graphdef, impl=impl),
                                  donate_argnums=(1,))
        self._mtp = drafter == "mtp" and num_draft > 0
        if self._mtp:
            self._mtp_prefill = jax.jit(functools.partial(_mtp_prefill, self.runner.graphdef),
                                        donate_argnums=(1,))
            self._mtp_seed = jax.jit(functools.partial(_mtp_seed, self.runner.graphdef),
                                     donate_argnums=(1,))
            self._spec_step = jax.jit(functools.partial(_spec_step_mtp, self.runner.graphdef,
                                                        impl=impl), donate_argnums=(1,))
            self._drafts = jnp.zeros((self.S, num_draft), jnp.int32)   # next drafts per slot
        self.record_drafts = False   # tests: keep (cache length, drafts) per spec step per request
        self.visits = []     # (kind, decode steps or verify steps run, seconds) per host visit

    # ------------------------------------------------------------------ validation
    def _check(self, r: Request):
        if len(r.prompt) == 0:
            raise RequestError(f"request {r.id!r}: empty prompt")
        bad = [t for t in r.prompt if not 0 <= int(t) < self.vocab]
        if bad:
            raise RequestError(f"request {r.id!r}: token ids {bad[:5]} out of the vocabulary "
                               f"[0, {self.vocab})")
        if r.max_new_tokens < 1:
            raise RequestError(f"request {r.id!r}: max_new_tokens must be >= 1")
        need = len(r.prompt) + r.max_new_tokens + self.K
        if need > self.max_len:
            raise RequestError(f"request {r.id!r}: prompt ({len(r.prompt)}) + max_new_tokens "
                               f"({r.max_new_tokens}) + drafts ({self.K}) = {need} exceeds the "
                               f"cache length max_len = {self.max_len}")

    # ------------------------------------------------------------------ main loop
    def generate(self, requests: Sequence[Request]) -> list:
        """Serves the requests with continuous batching; returns a Completion per request, in
        order. Each request's tokens do not depend on what else is in the batch."""
        reqs = list(requests)
        for i, r in enumerate(reqs):
            if r.id is None:
                r.id = i
            self._check(r)
        t0 = time.perf_counter()
        queue = deque(range(len(reqs)))
        live = {}                                     # slot -> _Live
        done = [None] * len(reqs)
        while queue or live:
            free = [s for s in range(1, self.S) if s not in live]
            admit = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            if admit:
                self._prefill(reqs, admit, free, live, done, t0)
            if live:
                (self._spec_visit if self.K else self._decode_visit)(live, done, t0)
        return done

    def _prefill(self, reqs, admit, free, live, done, t0):
        rows = self.S - 1
        T = _bucket(max(len(reqs[i].prompt) for i in admit))
        tokens = np.zeros((rows, T), np.int32)
        lengths = np.ones(rows, np.int32)
        slots = np.full(rows, NULL_SLOT, np.int32)
        for r, (i, s) in enumerate(zip(admit, free)):
            p = np.asarray(reqs[i].prompt, np.int32)
            tokens[r, :len(p)], lengths[r], slots[r] = p, len(p), s
        start = time.perf_counter()
        if self._mtp:
            logits, hidden, self.cache = self._mtp_prefill(
                self.runner.params, self.cache, jnp.asarray(tokens), jnp.asarray(lengths),
                jnp.asarray(slots))
        else:
            logits, self.cache = self.runner.prefill(self.cache, jnp.asarray(tokens),
                                                     jnp.asarray(lengths), jnp.asarray(slots))
        last = logits[jnp.arange(rows), jnp.asarray(lengths) - 1]
        params = [reqs[i].sampling for i in admit] + [SamplingParams()] * (rows - len(admit))
        first = sampling.sample(last, *_params(params),
                                sampling.row_keys(jnp.asarray([p.seed for p in params]),
                                                  jnp.zeros(rows, jnp.int32)))
        if self._mtp:
            self.cache, self._drafts = self._mtp_seed(
                self.runner.params, self.cache, hidden, jnp.asarray(tokens), jnp.asarray(lengths),
                jnp.asarray(slots), first, self._drafts)
        first = np.asarray(first)
        now = time.perf_counter() - t0
        self.visits.append(("prefill", 1, time.perf_counter() - start))
        for r, (i, s) in enumerate(zip(admit, free)):
            lv = _Live(i, reqs[i], [int(first[r])], now)
            live[s] = lv
            self._maybe_finish(s, lv, live, done, now)

    def _maybe_finish(self, slot, lv, live, done, now):
        r = lv.req
        hit = next((j for j, t in enumerate(lv.tokens) if t in r.stop_ids), None)
        if hit is not None or len(lv.tokens) >= r.max_new_tokens:
            n = min(hit + 1 if hit is not None else len(lv.tokens), r.max_new_tokens)
            reason = "stop" if hit is not None and hit < r.max_new_tokens else "length"
            done[lv.index] = Completion(r.id, lv.tokens[:n], reason, lv.ttft, now,
                                        lv.verify_steps, lv.accepted, lv.drafts)
            del live[slot]

    def _device_state(self, live):
        S = self.S
        st = dict(last=np.zeros(S, np.int32), active=np.zeros(S, bool),
                  remaining=np.zeros(S, np.int32), gen_pos=np.zeros(S, np.int32),
                  stops=np.full((S, 8), -1, np.int32))
        params = [SamplingParams()] * S
        for s, lv in live.items():
            st["last"][s], st["active"][s] = lv.tokens[-1], True
            st["remaining"][s] = lv.req.max_new_tokens - len(lv.tokens)
            st["gen_pos"][s] = len(lv.tokens)
            stops = list(lv.req.stop_ids)[:8]
            st["stops"][s, :len(stops)] = stops
            params[s] = lv.req.sampling
        st = {k: jnp.asarray(v) for k, v in st.items()}
        temp, top_k, top_p = _params(params)
        return st, (temp, top_k, top_p, jnp.asarray([p.seed for p in params], jnp.int32))

    def _decode_visit(self, live, done, t0):
        st, sp = self._device_state(live)
        start = time.perf_counter()
        self.cache, out = self._decode_loop(self.runner.params, self.cache, st, sp)
        out = np.asarray(out)                                      # [S, steps], -1 = none
        now = time.perf_counter() - t0
        self.visits.append(("decode", int((out >= 0).any(0).sum()), time.perf_counter() - start))
        for s in list(live):
            lv = live[s]
            lv.tokens += [int(t) for t in out[s] if t >= 0]
            self._maybe_finish(s, lv, live, done, now)

    def _spec_visit(self, live, done, t0):
        st, sp = self._device_state(live)
        if self._mtp:
            drafts = self._drafts
        else:
            drafts = np.zeros((self.S, self.K), np.int32)
            for s, lv in live.items():
                drafts[s] = ngram_drafts(list(lv.req.prompt) + lv.tokens, self.K)
            drafts = jnp.asarray(drafts)
        if self.record_drafts:
            host = np.asarray(drafts)
            for s, lv in live.items():
                lv.drafts.append((len(lv.req.prompt) + len(lv.tokens) - 1, host[s].tolist()))
        start = time.perf_counter()
        if self._mtp:
            self.cache, emitted, n_acc, self._drafts = self._spec_step(
                self.runner.params, self.cache, st, sp, drafts)
        else:
            self.cache, emitted, n_acc = self._spec_step(self.runner.params, self.cache, st, sp,
                                                         drafts)
        emitted, n_acc = np.asarray(emitted), np.asarray(n_acc)
        now = time.perf_counter() - t0
        self.visits.append(("verify", 1, time.perf_counter() - start))
        for s in list(live):
            lv = live[s]
            lv.tokens += [int(t) for t in emitted[s, :n_acc[s]]]
            lv.verify_steps += 1
            lv.accepted += int(n_acc[s]) - 1
            self._maybe_finish(s, lv, live, done, now)


@dataclasses.dataclass
class _Live:
    index: int
    req: Request
    tokens: list
    ttft: float
    verify_steps: int = 0
    accepted: int = 0
    drafts: list = dataclasses.field(default_factory=list)


def _params(params):
    return (jnp.asarray([p.temperature for p in params], jnp.float32),
            jnp.asarray([p.top_k for p in params], jnp.int32),
            jnp.asarray([p.top_p for p in params], jnp.float32))


def _decode_loop(graphdef, params, cache, st, sp, *, mode, impl, n):
    """Up to n decode steps over all slots (inactive ones as null-slot rows). Returns the cache
    and the sampled tokens [S, n] (-1 where a row was inactive)."""
    model = nnx.merge(graphdef, params)
    temp, top_k, top_p, seeds = sp
    S = st["last"].shape[0]
    ids = jnp.arange(S, dtype=jnp.int32)

    def cond(c):
        return (c[0] < n) & jnp.any(c[2]["active"])

    def body(c):
        i, cache, s, out = c
        slots = jnp.where(s["active"], ids, NULL_SLOT)
        logits, cache = model.decode(cache, s["last"][:, None], slots, mode=mode, impl=impl)
        tok = sampling.sample(logits[:, 0], temp, top_k, top_p,
                              sampling.row_keys(seeds, s["gen_pos"]))
        out = out.at[:, i].set(jnp.where(s["active"], tok, -1))
        remaining = s["remaining"] - s["active"]
        stop = jnp.any(tok[:, None] == s["stops"], axis=1)
        active = s["active"] & (remaining > 0) & ~stop
        s = dict(s, last=jnp.where(s["active"], tok, s["last"]), active=active,
                 remaining=remaining, gen_pos=s["gen_pos"] + s["active"])
        return i + 1, cache, s, out

    out = jnp.full((S, n), -1, jnp.int32)
    _, cache, _, out = jax.lax.while_loop(cond, body, (0, cache, st, out))
    return cache, out


def _verify_commit(model, cache, st, sp, drafts, impl):
    """Verify [last, drafts] for every active slot, accept a prefix, commit. Returns the cache,
    the emitted tokens [S, T] (accepted drafts then the new token), n_accepted [S], the verify
    hidden states [S, T, D], the slots used and the window's start positions."""
    temp, top_k, top_p, seeds = sp
    S, K = drafts.shape
    slots = jnp.where(st["active"], jnp.arange(S, dtype=jnp.int32), NULL_SLOT)
    starts = cache.lengths[slots]
    window = jnp.concatenate([st["last"][:, None], drafts], axis=1)
    logits, hidden, cache = model.verify(cache, window, slots, impl=impl)
    n_acc, new = sampling.verify_drafts(logits, drafts, temp, top_k, top_p, seeds, st["gen_pos"])
    cache = model.commit(cache, slots, n_acc, K + 1)
    emitted = jnp.concatenate([drafts, jnp.zeros((S, 1), jnp.int32)], axis=1)
    emitted = emitted.at[jnp.arange(S), n_acc - 1].set(new)
    return cache, emitted, n_acc, hidden, slots, starts


def _spec_step(graphdef, params, cache, st, sp, drafts, *, impl):
    """One speculative step with host-made drafts. Returns the cache, the emitted tokens [S, T]
    and how many of them are valid [S]."""
    cache, emitted, n_acc, *_ = _verify_commit(nnx.merge(graphdef, params), cache, st, sp,
                                               drafts, impl)
    return cache, emitted, jnp.where(st["active"], n_acc, 0)


# ---------------------------------------------------------------------- MTP drafter (on device)

def _mtp_prefill(graphdef, params, cache, tokens, lengths, slots):
    """Prefill that keeps the final-normed hidden states for the MTP head."""
    return nnx.merge(graphdef, params).prefill_hidden(cache, tokens, lengths, slots)


def _mtp_chain(model, cache, hidden, next_tokens, slots, starts, idx, K):
    """Runs the MTP head over (hidden[:, t], next_tokens[:, t]) at positions starts + t (writing its
    KV there), takes its output at index idx [b] as the source of the first draft, then chains
    K - 1 single-token steps (the head's own hidden and argmax draft fed back) at positions
    starts + idx + 1, ... Returns the greedy drafts [b, K] and the cache."""
    def draft(cache, h, tok, pos, k):
        return model.draft(cache, h, tok, slots, pos, step=k)

    rows = jnp.arange(hidden.shape[0])
    logits, h, cache = draft(cache, hidden, next_tokens, starts, 0)
    d = jnp.argmax(logits[rows, idx], axis=-1).astype(jnp.int32)
    h = h[rows, idx][:, None]
    out, pos = [d], starts + idx + 1
    for k in range(1, K):
        logits, h, cache = draft(cache, h, d[:, None], pos, k)
        d = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        out.append(d)
        pos = pos + 1
    return jnp.stack(out, axis=1), cache


def _mtp_seed(graphdef, params, cache, hidden, tokens, lengths, slots, first, drafts):
    """After prefill: the MTP cache gets (hidden_j, prompt_{j+1}) for j < n-1 and (hidden_{n-1},
    first token) at n-1 (positions past that are scratch); the first K drafts of each admitted
    slot go into `drafts` [S, K]."""
    model = nnx.merge(graphdef, params)
    rows = jnp.arange(tokens.shape[0])
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    nxt = nxt.at[rows, lengths - 1].set(first)
    new, cache = _mtp_chain(model, cache, hidden, nxt, slots, jnp.zeros_like(slots), lengths - 1,
                            drafts.shape[1])
    i = jnp.where(slots != NULL_SLOT, slots, drafts.shape[0])
    return cache, drafts.at[i].set(new, mode="drop")


def _spec_step_mtp(graphdef, params, cache, st, sp, drafts, *, impl):
    """`_spec_step` with the MTP drafter: after verify + commit the head runs over the window's
    hidden states and emitted tokens at the window's positions p.. (entries past n_acc - 1 are
    scratch, overwritten later) and chains the next K drafts from index n_acc - 1. Returns the
    cache, emitted tokens [S, T], n_acc [S] and the next drafts [S, K]."""
    model = nnx.merge(graphdef, params)
    cache, emitted, n_acc, hidden, slots, starts = _verify_commit(model, cache, st, sp, drafts,
                                                                  impl)
    nxt, cache = _mtp_chain(model, cache, hidden, emitted, slots, starts, n_acc - 1,
                            drafts.shape[1])
    nxt = jnp.where(st["active"][:, None], nxt, drafts)
    return cache, emitted, jnp.where(st["active"], n_acc, 0), nxt
