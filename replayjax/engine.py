"""The decode engine: a fixed pool of slots, continuous batching, jitted multi-step decode.

    engine = Engine(model, num_slots=8, max_len=2048)            # ReplaySSM decode by default
    results = engine.generate([Request(prompt=[1, 5, 9], max_new_tokens=64), ...])

Requests are admitted into free slots between host visits (prefill of the new ones, padded to a
fixed batch and a power-of-two length bucket, so shapes -- and compilations -- stay fixed); every
visit runs up to `steps_per_visit` decode steps on device in one `lax.while_loop` over all slots,
with the cache donated. Finished slots are freed and reused (prefill resets a slot's state).
`generate(..., on_tokens=f)` streams each request's new tokens after every visit.
With `num_draft > 0` the engine decodes speculatively: a drafter proposes K tokens, the model
verifies T = K + 1 tokens in one step, `verify_drafts` accepts a prefix (greedy: exact match;
sampling: rejection sampling against the deterministic drafts), and `commit` rolls back the rest.
Drafters:

- "ngram" (host): prompt lookup in the request's own text.
- "mtp" (device): the model's MTP head. Prefill seeds the head's KV cache with (hidden_j,
  token_{j+1}) over the prompt and chains K greedy drafts; every speculative step re-runs the head
  over the verify window's hidden states and emitted tokens (at the window's positions) and chains
  the next K drafts, returned for the next step.
- "draft" (device): a separate, smaller `draft_model` with the same vocabulary and its own cache
  (same slots and max_len), prefilled with the same prompts. Every step chains K greedy decodes
  from its committed cache on a throwaway copy, then -- after the target's verify + commit --
  verifies the same window [last, d_1..d_K] on the real draft cache and commits the accepted
  prefix, so both caches always hold exactly the emitted tokens.

Rollback is a ring-cursor move in `ssm_mode="replay"`; in `ssm_mode="standard"` speculation is the
usual state-per-draft scheme (T SSM states per slot, commit copies the last accepted one), kept as
the baseline ReplaySSM is measured against (`replayjax bench --variants replay+mtp standard+mtp`).

With `return_logits=True` every Completion carries the fp32 logits each of its tokens was sampled
from / verified against (`Completion.logits` [n_tokens, V]); off by default (V floats per token).
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
from pallas_kernels.ring import NULL_SLOT
from replayjax import sampling

DRAFTERS = ("ngram", "mtp", "draft")


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
    logits: np.ndarray | None = None  # [len(tokens), V] fp32, with Engine(return_logits=True)

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
                 num_draft: int = 0, impl: str = "auto", drafter: str = "ngram",
                 draft_model=None, return_logits: bool = False, prefill_rows: int = 32):
        if ssm_mode not in ("replay", "standard"):
            raise ValueError(f"ssm_mode must be 'replay' or 'standard', got {ssm_mode!r}")
        if steps_per_visit < 1:
            raise ValueError(f"steps_per_visit must be >= 1, got {steps_per_visit}")
        if not 0 <= num_draft <= min(7, window - 1):
            raise ValueError(f"num_draft = {num_draft} must be in [0, {min(7, window - 1)}] "
                             f"(window L = {window}, at most 8 verify tokens)")
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(map(repr, DRAFTERS))}, "
                             f"got {drafter!r}")
        if drafter == "mtp" and getattr(model, "mtp", None) is None:
            raise ValueError("drafter='mtp' needs a model with an MTP head (build it with mtp=True "
                             "and load its mtp.* weights)")
        if (drafter == "draft") != (draft_model is not None):
            raise ValueError("drafter='draft' needs draft_model=..., and draft_model is only used "
                             "with drafter='draft'")
        if draft_model is not None and draft_model.cfg.vocab_size != model.cfg.vocab_size:
            raise ValueError(f"the draft model's vocab_size ({draft_model.cfg.vocab_size}) differs "
                             f"from the target model's ({model.cfg.vocab_size}); a draft model "
                             f"must share the target's vocabulary")
        self.runner = Runner(model)
        self.vocab = model.cfg.vocab_size
        self.S = num_slots + 1                        # + the null slot
        self.max_len, self.mode, self.impl = max_len, ssm_mode, impl
        self.steps, self.K = steps_per_visit, num_draft
        # prompts prefilled per call: bounds prefill memory (activations and logits of rows x
        # bucket positions) however many slots free up at once; a fixed shape, one compile
        self.prefill_rows = max(1, min(prefill_rows, num_slots))
        self.return_logits = return_logits
        # without drafts no drafter runs: "none" keeps prefill and state free of drafter parts
        self.drafter = drafter if num_draft else "none"

        def mk_cache(runner, mode):
            return runner.init_cache(self.S, max_len, window=window, max_verify=num_draft + 1,
                                     state_dtype=state_dtype, ssm_mode=mode)

        # device state, donated to every step: the target cache plus the drafter's own part.
        # Speculation in standard mode is the state-per-draft baseline (T states per slot).
        self.state = dict(cache=mk_cache(self.runner, ssm_mode))
        graphdefs, self.params = [self.runner.graphdef], [self.runner.params]
        if self.drafter == "mtp":
            self.state["drafts"] = jnp.zeros((self.S, num_draft), jnp.int32)  # next drafts
        elif self.drafter == "draft":
            self.draft_runner = Runner(draft_model)
            self.state["draft_cache"] = mk_cache(self.draft_runner, "replay")
            graphdefs.append(self.draft_runner.graphdef)
            self.params.append(self.draft_runner.params)
        graphdefs, self.params = tuple(graphdefs), tuple(self.params)
        static = dict(drafter=self.drafter, keep_logits=return_logits)
        self._prefill_step = jax.jit(functools.partial(_prefill_step, graphdefs, **static),
                                     donate_argnums=(1,))
        self._decode_loop = jax.jit(functools.partial(
            _decode_loop, graphdefs[0], mode=ssm_mode, impl=impl, n=steps_per_visit,
            keep_logits=return_logits), donate_argnums=(1,))
        self._spec_step = jax.jit(functools.partial(_spec_step, graphdefs, K=num_draft, impl=impl,
                                                    mode=ssm_mode, **static), donate_argnums=(1,))
        self._on_tokens = None       # the streaming callback of the current generate / serve
        self.record_drafts = False   # tests: keep (cache length, drafts) per spec step per request
        self.visits = []     # (kind, decode steps or verify steps run, seconds) per host visit

    @property
    def cache(self):
        """The target model's cache."""
        return self.state["cache"]

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
    def generate(self, requests: Sequence[Request], on_tokens=None) -> list:
        """Serves the requests with continuous batching; returns a Completion per request, in
        order. Each request's tokens do not depend on what else is in the batch.

        on_tokens(request_id, tokens, finished): streaming; called after every host visit for
        each request that got tokens there (a list of ints, already cut at a stop id or
        max_new_tokens) or finished. A request's calls concatenate to its Completion.tokens."""
        visits = self.serve(requests, on_tokens)
        while True:
            try:
                next(visits)
            except StopIteration as finished:
                return finished.value

    def serve(self, requests: Sequence[Request], on_tokens=None):
        """`generate` one host visit at a time: a generator that yields the kind of each visit
        ("prefill", "decode" or "verify") just before running it, and returns generate's
        Completions. Lets a caller act between visits (a profiler tracing only decode steps).
        The requests are validated before anything runs."""
        reqs = list(requests)
        for i, r in enumerate(reqs):
            if r.id is None:
                r.id = i
            self._check(r)
        return self._serve(reqs, on_tokens)

    def _serve(self, reqs, on_tokens):
        self._on_tokens = on_tokens
        t0 = time.perf_counter()
        queue = deque(range(len(reqs)))
        live = {}                                     # slot -> _Live
        done = [None] * len(reqs)
        P = self.prefill_rows
        while queue or live:
            free = [s for s in range(1, self.S) if s not in live]
            admit = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            for k in range(0, len(admit), P):
                yield "prefill"
                self._prefill_rows(reqs, admit[k:k + P], free[k:k + P], live, done, t0)
            if live:
                yield "verify" if self.K else "decode"
                (self._spec_visit if self.K else self._decode_visit)(live, done, t0)
        return done

    def _prefill_rows(self, reqs, admit, free, live, done, t0):
        rows = self.prefill_rows
        T = _bucket(max(len(reqs[i].prompt) for i in admit))
        tokens = np.zeros((rows, T), np.int32)
        lengths = np.ones(rows, np.int32)
        slots = np.full(rows, NULL_SLOT, np.int32)
        for r, (i, s) in enumerate(zip(admit, free)):
            p = np.asarray(reqs[i].prompt, np.int32)
            tokens[r, :len(p)], lengths[r], slots[r] = p, len(p), s
        sp = _sampling_args([reqs[i].sampling for i in admit]
                            + [SamplingParams()] * (rows - len(admit)))
        start = time.perf_counter()
        self.state, first, last = self._prefill_step(
            self.params, self.state, jnp.asarray(tokens), jnp.asarray(lengths),
            jnp.asarray(slots), sp)
        first = np.asarray(first)
        last = np.asarray(last) if self.return_logits else None
        now = time.perf_counter() - t0
        self.visits.append(("prefill", 1, time.perf_counter() - start))
        for r, (i, s) in enumerate(zip(admit, free)):
            lv = _Live(i, reqs[i], [int(first[r])], now)
            if last is not None:
                lv.logits.append(last[r:r + 1])
            live[s] = lv
            self._maybe_finish(s, lv, live, done, now)

    def _maybe_finish(self, slot, lv, live, done, now):
        """After a visit added tokens to `lv`: completes it at a stop id or max_new_tokens (the
        tokens past either are dropped), then streams what is new."""
        r = lv.req
        hit = next((j for j, t in enumerate(lv.tokens) if t in r.stop_ids), None)
        finished = hit is not None or len(lv.tokens) >= r.max_new_tokens
        if finished:
            n = min(hit + 1 if hit is not None else len(lv.tokens), r.max_new_tokens)
            reason = "stop" if hit is not None and hit < r.max_new_tokens else "length"
            logits = np.concatenate(lv.logits)[:n] if self.return_logits else None
            lv.tokens = lv.tokens[:n]
            done[lv.index] = Completion(r.id, lv.tokens, reason, lv.ttft, now,
                                        lv.verify_steps, lv.accepted, lv.drafts, logits)
            del live[slot]
        if self._on_tokens is not None and (finished or len(lv.tokens) > lv.streamed):
            new, lv.streamed = lv.tokens[lv.streamed:], len(lv.tokens)
            self._on_tokens(r.id, new, finished)

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
        return {k: jnp.asarray(v) for k, v in st.items()}, _sampling_args(params)

    def _decode_visit(self, live, done, t0):
        st, sp = self._device_state(live)
        start = time.perf_counter()
        self.state["cache"], out, logits = self._decode_loop(self.params[0], self.state["cache"],
                                                             st, sp)
        out = np.asarray(out)                                      # [S, steps], -1 = none
        logits = np.asarray(logits) if self.return_logits else None
        now = time.perf_counter() - t0
        self.visits.append(("decode", int((out >= 0).any(0).sum()), time.perf_counter() - start))
        for s in list(live):
            lv = live[s]
            ok = out[s] >= 0
            lv.tokens += [int(t) for t in out[s, ok]]
            if logits is not None:
                lv.logits.append(logits[s, ok])
            self._maybe_finish(s, lv, live, done, now)

    def _spec_visit(self, live, done, t0):
        st, sp = self._device_state(live)
        host_drafts = None
        if self.drafter == "ngram":
            host_drafts = np.zeros((self.S, self.K), np.int32)
            for s, lv in live.items():
                host_drafts[s] = ngram_drafts(list(lv.req.prompt) + lv.tokens, self.K)
            host_drafts = jnp.asarray(host_drafts)
        start = time.perf_counter()
        self.state, out = self._spec_step(self.params, self.state, st, sp, host_drafts)
        out = {k: np.asarray(v) for k, v in out.items()}
        emitted, n_acc = out["emitted"], out["n_acc"]
        now = time.perf_counter() - t0
        self.visits.append(("verify", 1, time.perf_counter() - start))
        for s in list(live):
            lv = live[s]
            if self.record_drafts:
                lv.drafts.append((len(lv.req.prompt) + len(lv.tokens) - 1,
                                  out["drafts"][s].tolist()))
            lv.tokens += [int(t) for t in emitted[s, :n_acc[s]]]
            if self.return_logits:
                lv.logits.append(out["logits"][s, :n_acc[s]])
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
    streamed: int = 0                                        # tokens passed to on_tokens
    drafts: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)   # [k, V] chunks, return_logits


def _sampling_args(params):
    """Per-row SamplingParams -> (temperature, top_k, top_p, seed) arrays [b]."""
    return (jnp.asarray([p.temperature for p in params], jnp.float32),
            jnp.asarray([p.top_k for p in params], jnp.int32),
            jnp.asarray([p.top_p for p in params], jnp.float32),
            jnp.asarray([p.seed for p in params], jnp.int32))


# ---------------------------------------------------------------------- jitted steps
# Pure functions of (params, state, ...): graphdefs and flags are bound with functools.partial
# (static), params are arguments (not baked into the HLO), the state pytree is donated.

def _prefill_step(graphdefs, params, state, tokens, lengths, slots, sp, *, drafter, keep_logits):
    """Admits prompts: tokens [b, T] right-padded, lengths [b], slots [b] (NULL_SLOT = unused
    row), sampling arrays sp [b]. Prefills the target (and, per drafter, seeds the MTP drafts or
    prefills the draft model) and samples each row's first token. Returns the state, the first
    tokens [b] and their logits [b, V] fp32 (None unless keep_logits)."""
    model = nnx.merge(graphdefs[0], params[0])
    temp, top_k, top_p, seeds = sp
    logits, hidden, cache = model.prefill_hidden(state["cache"], tokens, lengths, slots,
                                                 last_only=True)
    last = logits[:, 0]
    first = sampling.sample(last, temp, top_k, top_p,
                            sampling.row_keys(seeds, jnp.zeros_like(lengths)))
    state = dict(state, cache=cache)
    if drafter == "mtp":
        state["cache"], state["drafts"] = _mtp_seed(model, cache, hidden, tokens, lengths, slots,
                                                    first, state["drafts"])
    elif drafter == "draft":
        draft = nnx.merge(graphdefs[1], params[1])
        _, state["draft_cache"] = draft.prefill(state["draft_cache"], tokens, lengths, slots)
    return state, first, last if keep_logits else None


def _decode_loop(graphdef, params, cache, st, sp, *, mode, impl, n, keep_logits):
    """Up to n decode steps over all slots (inactive ones as null-slot rows). Returns the cache,
    the sampled tokens [S, n] (-1 where a row was inactive) and, with keep_logits, the logits
    they were sampled from [S, n, V] fp32 (else None)."""
    model = nnx.merge(graphdef, params)
    temp, top_k, top_p, seeds = sp
    S = st["last"].shape[0]
    ids = jnp.arange(S, dtype=jnp.int32)

    def cond(c):
        return (c[0] < n) & jnp.any(c[2]["active"])

    def body(c):
        i, cache, s, out, lg = c
        slots = jnp.where(s["active"], ids, NULL_SLOT)
        logits, cache = model.decode(cache, s["last"][:, None], slots, mode=mode, impl=impl)
        tok = sampling.sample(logits[:, 0], temp, top_k, top_p,
                              sampling.row_keys(seeds, s["gen_pos"]))
        out = out.at[:, i].set(jnp.where(s["active"], tok, -1))
        if keep_logits:
            lg = lg.at[:, i].set(logits[:, 0])
        remaining = s["remaining"] - s["active"]
        stop = jnp.any(tok[:, None] == s["stops"], axis=1)
        active = s["active"] & (remaining > 0) & ~stop
        s = dict(s, last=jnp.where(s["active"], tok, s["last"]), active=active,
                 remaining=remaining, gen_pos=s["gen_pos"] + s["active"])
        return i + 1, cache, s, out, lg

    out = jnp.full((S, n), -1, jnp.int32)
    lg = jnp.zeros((S, n, model.cfg.vocab_size), jnp.float32) if keep_logits else None
    _, cache, _, out, lg = jax.lax.while_loop(cond, body, (0, cache, st, out, lg))
    return cache, out, lg


def _verify_commit(model, cache, st, sp, drafts, slots, impl, mode="replay"):
    """Verify [last, drafts] for every active slot (slots [S]: NULL_SLOT where inactive), accept
    a prefix, commit. Returns the cache, the emitted tokens [S, T] (accepted drafts then the new
    token), n_accepted [S] in 1..T, the verify logits [S, T, V] and hidden states [S, T, D], and
    the window's start positions [S]."""
    temp, top_k, top_p, seeds = sp
    S, K = drafts.shape
    starts = cache.lengths[slots]
    window = jnp.concatenate([st["last"][:, None], drafts], axis=1)
    logits, hidden, cache = model.verify(cache, window, slots, mode=mode, impl=impl)
    n_acc, new = sampling.verify_drafts(logits, drafts, temp, top_k, top_p, seeds, st["gen_pos"])
    cache = model.commit(cache, slots, n_acc, K + 1, mode=mode)
    emitted = jnp.concatenate([drafts, jnp.zeros((S, 1), jnp.int32)], axis=1)
    emitted = emitted.at[jnp.arange(S), n_acc - 1].set(new)
    return cache, emitted, n_acc, logits, hidden, starts


def _spec_step(graphdefs, params, state, st, sp, host_drafts, *, K, drafter, impl, mode,
               keep_logits):
    """One speculative step over all slots. Drafts [S, K] come from the host (ngram: host_drafts),
    from the state (mtp: chained by the previous step or prefill) or from the draft model (draft:
    chained now). Returns the state and a dict of emitted [S, T], n_acc [S] (0 for inactive
    rows: how many emitted tokens are valid), the drafts verified [S, K] and, with keep_logits,
    the verify logits [S, T, V] fp32 (rows 0..n_acc-1 are the emitted tokens' logits)."""
    model = nnx.merge(graphdefs[0], params[0])
    S = st["last"].shape[0]
    slots = jnp.where(st["active"], jnp.arange(S, dtype=jnp.int32), NULL_SLOT)
    if drafter == "ngram":
        drafts = host_drafts
    elif drafter == "mtp":
        drafts = state["drafts"]
    else:
        draft = nnx.merge(graphdefs[1], params[1])
        drafts = _draft_chain(draft, state["draft_cache"], st["last"], slots, K, impl)
    cache, emitted, n_acc, logits, hidden, starts = _verify_commit(model, state["cache"], st, sp,
                                                                   drafts, slots, impl, mode)
    state = dict(state, cache=cache)
    if drafter == "mtp":
        nxt, state["cache"] = _mtp_chain(model, cache, hidden, emitted, slots, starts, n_acc - 1,
                                         K)
        state["drafts"] = jnp.where(st["active"][:, None], nxt, drafts)
    elif drafter == "draft":
        state["draft_cache"] = _draft_sync(draft, state["draft_cache"], st["last"], drafts, slots,
                                           n_acc, impl)
    out = dict(emitted=emitted, n_acc=jnp.where(st["active"], n_acc, 0), drafts=drafts)
    if keep_logits:
        out["logits"] = logits
    return state, out


# ---------------------------------------------------------------------- MTP drafter (on device)

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


def _mtp_seed(model, cache, hidden, tokens, lengths, slots, first, drafts):
    """After prefill: the MTP cache gets (hidden_j, prompt_{j+1}) for j < n-1 and (hidden_{n-1},
    first token) at n-1 (positions past that are scratch); the first K drafts of each admitted
    slot go into `drafts` [S, K]. Returns the cache and drafts."""
    rows = jnp.arange(tokens.shape[0])
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    nxt = nxt.at[rows, lengths - 1].set(first)
    new, cache = _mtp_chain(model, cache, hidden, nxt, slots, jnp.zeros_like(slots), lengths - 1,
                            drafts.shape[1])
    i = jnp.where(slots != NULL_SLOT, slots, drafts.shape[0])
    return cache, drafts.at[i].set(new, mode="drop")


# ---------------------------------------------------------------------- draft model (on device)

def _draft_chain(draft, dcache, last, slots, K, impl):
    """K greedy draft-model decodes (a scan: one compiled decode) from its committed cache, fed
    last [S] then its own argmax: returns the drafts [S, K]. The decoded cache is dropped --
    `_draft_sync` rewrites the same positions from the committed state -- so the step's donated
    draft cache must survive the chain: XLA copies its pools once per step, which is cheap for a
    small draft model."""
    def step(carry, _):
        c, tok = carry
        logits, c = draft.decode(c, tok[:, None], slots, mode="replay", impl=impl)
        tok = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        return (c, tok), tok

    _, drafts = jax.lax.scan(step, (dcache, last), None, length=K)
    return drafts.T


def _draft_sync(draft, dcache, last, drafts, slots, n_acc, impl):
    """Brings the draft cache level with the target's: verify the window [last, drafts] [S, K+1]
    and commit its first n_acc [S] tokens, so it holds every emitted token but the newest (the
    next step's `last`), exactly as the target's cache does."""
    window = jnp.concatenate([last[:, None], drafts], axis=1)
    _, _, dcache = draft.verify(dcache, window, slots, impl=impl)
    return draft.commit(dcache, slots, n_acc, window.shape[1])
