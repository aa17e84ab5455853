"""The decode engine: a fixed pool of slots, continuous batching, jitted multi-step decode,
speculative decoding, live admission and cancellation.

    engine = Engine(model, num_slots=8, max_len=2048)            # ReplaySSM decode by default
    results = engine.generate([Request(prompt=[1, 5, 9], max_new_tokens=64), ...])

    rid = engine.submit(Request(prompt=[1, 5, 9]))    # live serving: any thread submits/cancels,
    while engine.has_work:                            # one thread steps
        for event in engine.step():                   # event.id, .tokens, .completion
            ...

Each `step` is one host visit: queued requests are admitted into free slots (prefill of up to
`prefill_rows` prompts and `prefill_tokens` padded positions, padded to a power-of-two length
bucket and a batch fixed per bucket, so shapes -- and compilations -- stay few), or up to
`steps_per_visit` decode steps run on device in one `lax.while_loop` over all slots (as many
speculative steps with a device drafter, one with a host drafter: `Drafter.on_host`), with the
device state donated.
Admission goes in rounds: a round admits min(free slots, queued) requests, then one decode or
verify visit runs before the next round, so a stream of arrivals cannot starve running requests.
Finished slots are freed and reused (prefill resets a slot's state). Sampling keys depend only
on a request's seed and position, so its tokens do not depend on its batch or admission visit.
`generate` and `serve` are loops over `step`.

With `num_draft > 0` the engine decodes speculatively: a drafter (`replayjax.drafters`: "ngram",
"mtp", "draft") proposes K tokens, the model verifies T = K + 1 tokens in one step,
`verify_drafts` accepts a prefix (greedy: exact match; sampling: rejection sampling against the
deterministic drafts), and `commit` rolls back the rest. Rollback is a ring-cursor move in
`ssm_mode="replay"`; in `ssm_mode="standard"` speculation is the usual state-per-draft scheme (T
SSM states per slot, commit copies the last accepted one), kept as the baseline ReplaySSM is
measured against (`replayjax bench --variants replay+mtp standard+mtp`).

With `return_logits=True` every Completion carries the fp32 logits each of its tokens was sampled
from / verified against (`Completion.logits` [n_tokens, V]); off by default (V floats per token).
With `logprobs=K` (0 ... MAX_TOP_LOGPROBS) every token comes with its log probability under the
model (the log-softmax of those logits) and the K most likely tokens' ids and log probabilities,
computed on the device: `Event.logprobs` / `Completion.logprobs`, a (logprob, ((id, logprob),
...)) per token.

Prefix caching: `Engine(model, prefix_cache_gb=X)` keeps a device pool of X GB of cached prompt
blocks (`prefix_block` tokens each: per SSM layer the checkpoint and conv state after the block
and its tokens' inputs, per attention layer its KV; `models.prefix`, indexed by
`replayjax.prefix_cache`). A prompt gets every token it shares with a cached one restored into
its slot -- whole blocks copied, the tokens past them replayed from their inputs -- and
prefills only the rest; a prompt's blocks (its last partial one too) are cached after its
prefill, and a finished request's whole sequence after it finishes (a re-prefill, so a next
turn extending its completion hits all of it; LRU eviction).
`prefix_host_gb=Y` spills evicted entries to Y GB of host memory (numpy) instead of dropping
them; a hit copies them back. Tokens do not change (up to fp32
rounding of the logits); `prefix_stats()` reports hits, `Completion.cached_tokens` per request.

Tensor parallelism: `Engine(model, mesh=models.sharding.make_mesh(tp))`, or a model loaded onto
such a mesh (`replayjax.loading.load_model(path, mesh=...)`). Every step then runs under
`shard_map` over the mesh with the state sharded on heads (donated, the same shardings in and
out), and the host loop is the same on every device and process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import prefix as pool_ops
from models import sharding
from models.hybrid import SSM_MODES, ring_blocks
from models.runner import Runner
from pallas_kernels.dispatch import IMPLS
from pallas_kernels.ring import MAX_VERIFY_TOKENS, MAX_WINDOW, NULL_SLOT
from pallas_kernels.validation import STATE_DTYPES
from replayjax import memory, steps
from replayjax.drafters import MTPDrafter, make_drafter
from replayjax.prefix_cache import PrefixCache
from replayjax.requests import (
    MAX_TOP_LOGPROBS,
    Completion,
    Event,
    Request,
    RequestError,
    check_request,
    is_int,
)
from replayjax.sampling import SamplingArrays, SamplingParams
from replayjax.steps import EngineState, Keep, PrefixRows, SlotInputs

__all__ = ["Engine", "Request", "Completion", "Event", "RequestError", "SamplingParams"]


MIN_DECODE_ROWS = 8          # the smallest decode batch (fewer compilations below it)
# XLA options of the decode and verify loops. XLA's dot merger joins the q, k and v projections
# (dots sharing their input) into one dot over the concatenated weights, and inside a while loop
# that concatenation of loop-invariant weights runs every step (XLA does not hoist an op that
# grows the live memory): 26 us per attention layer and step on Nemotron-H-8B dims, 44 on
# Qwen3.5-9B's, at batch 256 on an H200. Off, the three dots run apart: the step's device time
# 15.06 -> 14.97 ms (8B) and ~0.14 ms less (Qwen3.5-9B) (docs/benchmarks.md, stop 36). Prefill
# runs once a call and keeps the merger.
LOOP_COMPILER_OPTIONS = {"xla_gpu_dot_merger_threshold_mb": 0}


def _bucket(n, minimum=16):
    return max(minimum, 1 << (n - 1).bit_length())


def _check_settings(*, model, num_slots, max_len, ssm_mode, window, state_dtype,
                    steps_per_visit, num_draft, impl, prefill_rows, prefill_tokens,
                    prefix_cache_gb, prefix_block, prefix_host_gb, mesh, logprobs,
                    return_logits):
    """ValueError (TypeError for a wrong kind of object) naming the first invalid engine setting
    and its rule."""
    if not isinstance(model, nnx.Module) or not hasattr(model, "cfg"):
        raise TypeError(f"model must be a loaded model (`replayjax.loading.load_model`, "
                        f"`convert.load_hf`), got a {type(model).__name__}")
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (`models.sharding.make_mesh`) or "
                        f"None, got a {type(mesh).__name__}")
    for name, value in (("num_slots", num_slots), ("max_len", max_len),
                        ("steps_per_visit", steps_per_visit), ("prefill_rows", prefill_rows),
                        ("prefill_tokens", prefill_tokens)):
        if not is_int(value):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if ssm_mode not in SSM_MODES:
        raise ValueError(f"ssm_mode must be {' or '.join(map(repr, SSM_MODES))}, got "
                         f"{ssm_mode!r}")
    if not (is_int(window) and 1 <= window <= MAX_WINDOW and window & (window - 1) == 0):
        raise ValueError(f"window must be a power of two in [1, {MAX_WINDOW}] (the ReplaySSM "
                         f"ring length L), got {window!r}")
    try:
        state_ok = jnp.dtype(state_dtype) in [jnp.dtype(d) for d in STATE_DTYPES]
    except TypeError:
        state_ok = False
    if not state_ok:
        raise ValueError(f"state_dtype must be float32 or bfloat16 (the SSM state), got "
                         f"{state_dtype!r}")
    limit = min(MAX_VERIFY_TOKENS - 1, window - 1)
    if not (is_int(num_draft) and 0 <= num_draft <= limit):
        raise ValueError(f"num_draft = {num_draft!r} must be in [0, {limit}] (window L = "
                         f"{window}, at most {MAX_VERIFY_TOKENS} verify tokens)")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
    for name, gb in (("prefix_cache_gb", prefix_cache_gb), ("prefix_host_gb", prefix_host_gb)):
        if not (isinstance(gb, (int, float)) and not isinstance(gb, bool) and math.isfinite(gb)
                and gb >= 0):
            raise ValueError(f"{name} must be a finite number >= 0 (0: off), got {gb!r}")
    if prefix_host_gb and not prefix_cache_gb:
        raise ValueError("prefix_host_gb needs prefix_cache_gb > 0 (it holds the entries the "
                         "device pool evicts)")
    if logprobs is not None and not (is_int(logprobs) and 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}] (the "
                         f"most likely tokens reported with each token), got {logprobs!r}")
    if logprobs is not None and return_logits:
        raise ValueError("logprobs and return_logits are exclusive (the logits hold the "
                         "log probabilities: log_softmax of them)")
    if not (is_int(prefix_block) and prefix_block >= window
            and prefix_block & (prefix_block - 1) == 0):
        raise ValueError(f"prefix_block must be a power of two >= window = {window} (blocks end "
                         f"on ring folds), got {prefix_block!r}")


@dataclasses.dataclass
class _Entry:
    """A queued or running request's host-side record."""
    req: Request
    submitted: float                                        # time.perf_counter() at submit
    stops: frozenset
    tokens: list = dataclasses.field(default_factory=list)
    ttft: float = math.nan
    cached: int = 0                                         # prompt tokens from the prefix cache
    verify_steps: int = 0
    accepted: int = 0
    streamed: int = 0                                       # tokens reported in events
    drafts: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)  # [k, V] chunks, return_logits
    logprobs: list = dataclasses.field(default_factory=list)    # a token's, Engine(logprobs=K)
    capture: bool = False           # a re-prefill storing a finished request's decoded blocks
    # the visit's verify steps: (first token, tokens, (cache length, drafts) or None)
    spec_steps: list = dataclasses.field(default_factory=list)

    def count_steps(self):
        """Folds the visit's verify steps into verify_steps / accepted / drafts, over the tokens
        kept (a stop id or max_new_tokens cuts a step short, or drops later ones): a step
        counts if it kept a token, and its drafts among the kept tokens count as accepted (a
        step's tokens are its accepted drafts, then the verifier's own token)."""
        n = len(self.tokens)
        for start, k, drafts in self.spec_steps:
            kept = min(max(n - start, 0), k)
            if kept:
                self.verify_steps += 1
                self.accepted += min(kept, k - 1)
                if drafts is not None:
                    self.drafts.append(drafts)
        self.spec_steps.clear()


class Engine:
    """Serves `Request`s on `model` (see the module docstring)."""

    def __init__(self, model, *, num_slots: int = 8, max_len: int = 1024, ssm_mode: str = "replay",
                 window: int = 16, state_dtype=jnp.float32, steps_per_visit: int = 8,
                 num_draft: int = 0, impl: str = "auto", drafter: str | None = None,
                 draft_model=None, return_logits: bool = False, prefill_rows: int = 32,
                 prefill_tokens: int = 16384, batch_invariant: bool = True, mesh=None,
                 prefix_cache_gb: float = 0.0, prefix_block: int = 64,
                 prefix_host_gb: float = 0.0, logprobs: int | None = None):
        """drafter: a name in `replayjax.drafters.DRAFTERS`; None means "ngram" when
        num_draft > 0, else "none" (plain decoding). draft_model: drafter="draft" only.
        steps_per_visit: decode steps a visit runs on device, or speculative steps with a
        device drafter ("mtp", "draft"; "ngram" drafts on the host: one step a visit).
        mesh: a tensor-parallel mesh (`models.sharding.make_mesh`) to run on; models on one
        device are laid out and placed on it (`models.sharding.shard_model`). None: where the
        model's params are (a model loaded onto a mesh runs on that mesh).
        prefix_cache_gb: device memory for the prefix cache (0: off), in entries of
        prefix_block tokens (a power of two >= window; a prompt hits every token it shares
        with a cached one). prefix_host_gb: host memory the entries the device pool evicts are
        spilled to (0: dropped).
        logprobs: None, or K: every token's log probability and the K most likely tokens'
        (module docstring); not with return_logits.
        prefill_rows, prefill_tokens: a prefill call takes at most prefill_rows prompts and
        rows x length bucket <= prefill_tokens padded positions (at least one prompt): its
        activations grow with the positions, so long prompts are prefilled fewer at a time.
        batch_invariant: decode and verify steps have the same shapes whatever the load (all
        slots) and a prefill call the budget's rows, so a decode step rounds the same at any
        load (a prefill still pads to the length bucket of the prompts it takes together, so a
        prompt can round differently with different company); False: steps run only the
        occupied slots and prefill only the arrived prompts (padded to a few sizes), much
        faster at low load, but rounding then also depends on the batch size, so greedy
        near-ties flip between loads more often."""
        _check_settings(model=model, num_slots=num_slots, max_len=max_len, ssm_mode=ssm_mode,
                        window=window, state_dtype=state_dtype,
                        steps_per_visit=steps_per_visit, num_draft=num_draft, impl=impl,
                        prefill_rows=prefill_rows, prefill_tokens=prefill_tokens,
                        prefix_cache_gb=prefix_cache_gb, prefix_block=prefix_block,
                        prefix_host_gb=prefix_host_gb, mesh=mesh, logprobs=logprobs,
                        return_logits=return_logits)
        if sharding.mesh_tp(mesh) > 1:
            model = _on_mesh(model, mesh, "model")
            draft_model = draft_model and _on_mesh(draft_model, mesh, "draft_model")
        self.drafter = make_drafter(drafter, model, num_draft=num_draft, draft_model=draft_model,
                                    impl=impl)
        self.runner = Runner(model, *self.drafter.models)
        self.vocab = model.cfg.vocab_size
        self.S = num_slots + 1                        # + the null slot
        self.max_len = max_len
        # prompts prefilled per call: bounds prefill memory (activations of rows x bucket
        # positions) however many slots free up at once and however long the prompts
        self.prefill_rows = min(prefill_rows, num_slots)
        self.prefill_tokens = prefill_tokens
        self.batch_invariant = bool(batch_invariant)
        self.return_logits = return_logits
        self.keep = Keep(bool(return_logits), -1 if logprobs is None else logprobs)

        def init_cache(m, mode="replay"):
            return m.init_cache(self.S, max_len, window=window, max_verify=num_draft + 1,
                                state_dtype=state_dtype, ssm_mode=mode)

        self.prefix = None
        if prefix_cache_gb:
            self.prefix = self._prefix_index(
                model, jax.eval_shape(lambda: init_cache(model, ssm_mode)), prefix_cache_gb,
                prefix_block, prefix_host_gb)

        # speculation in standard mode is the state-per-draft baseline (T states per slot)
        def init_state():
            cache = init_cache(model, ssm_mode)
            pool = (None if self.prefix is None else pool_ops.init_pool(
                cache, self.prefix.capacity, prefix_block, model.replay_widths(),
                self._pool_hidden))
            return EngineState(cache, self.drafter.init_state(self.S, init_cache), pool)

        # refused before allocating: a cache past the host's memory gets the process killed;
        # on a mesh each device allocates only its shards (heads split tp ways)
        need = memory.tree_bytes(jax.eval_shape(init_state)) // sharding.mesh_tp(self.runner.mesh)
        if why := memory.shortfall(need):
            raise MemoryError(f"the cache of num_slots = {num_slots} x max_len = {max_len} {why}")
        self.state = self.runner.place(init_state)
        static = dict(mode=ssm_mode, impl=impl, keep=self.keep)
        self._prefill = self.runner.jit(functools.partial(
            steps.prefill, drafter=self.drafter, keep=self.keep))
        self._decode = self.runner.jit(functools.partial(steps.decode_loop, n=steps_per_visit,
                                                         **static),
                                       compiler_options=LOOP_COMPILER_OPTIONS)
        self._speculate = self.runner.jit(functools.partial(
            steps.speculate_loop, drafter=self.drafter,
            n=1 if self.drafter.on_host else steps_per_visit, **static),
            compiler_options=LOOP_COMPILER_OPTIONS)
        self._visit_kind = "verify" if self.drafter.speculative else "decode"
        self.record_drafts = False   # tests: keep (cache length, drafts) per spec step per request
        self.visits = []     # (kind, decode steps or verify steps run, seconds) per host visit
        self._prefill_fits = {}     # prefill shape -> None (fits) or why not (`_prefill_shortfall`)

        # Host bookkeeping. submit / cancel may run in other threads: they touch only what the
        # lock guards; _running and the round belong to the thread that steps.
        self._lock = threading.Condition()
        self._queue = deque()          # _Entry, in submission order
        self._ids = set()              # ids of queued and running requests
        self._cancel = set()           # ids of running requests to finish as cancelled
        self._dropped = []             # cancelled queued _Entry, not yet reported
        self._next_id = 0              # the next id `submit` gives a request without one
        self._running = {}             # slot -> _Entry
        self._round = 0                # requests still to admit in this admission round
        self._decode_due = False       # a round just ended: decode / verify before the next

    @property
    def cache(self):
        """The target model's cache."""
        return self.state.cache

    def _prefix_index(self, model, cache, gb, block, host_gb) -> PrefixCache:
        """The host index of a prefix pool of `gb` GB and a host pool of `host_gb` GB
        (ValueError when no entry fits, a pool does not fit in free memory, or the setup cannot
        cache prefixes)."""
        if sharding.mesh_tp(self.runner.mesh) > 1:
            raise ValueError("prefix_cache_gb is not supported with tensor parallelism yet")
        if self.drafter.models:
            raise ValueError(f"prefix_cache_gb is not supported with drafter="
                             f"{self.drafter.name!r} (its own cache is not cached)")
        if block > self.max_len:
            raise ValueError(f"prefix_block = {block} exceeds max_len = {self.max_len}: no "
                             f"prompt fills a block")
        # an MTP drafter re-seeds the head's entry before a hit from the target's hidden there
        self._pool_hidden = ((model.cfg.hidden_size, jnp.float32)
                             if isinstance(self.drafter, MTPDrafter) else None)
        one = memory.tree_bytes(jax.eval_shape(
            lambda: pool_ops.init_pool(cache, 1, block, model.replay_widths(),
                                       self._pool_hidden)))
        n = int(gb * 1e9 // one)
        if n < 1:
            raise ValueError(f"prefix_cache_gb = {gb} holds no entry: one block of {block} "
                             f"tokens takes {one / 1e6:.2f} MB")
        host = int(host_gb * 1e9 // one)
        if host_gb and host < 1:
            raise ValueError(f"prefix_host_gb = {host_gb} holds no entry: one block of {block} "
                             f"tokens takes {one / 1e6:.2f} MB")
        # refused here, before the index lists its free entries (a list of n ints) and before
        # the host pool is allocated at the first spill, mid-run
        if why := memory.shortfall(n * one):
            raise ValueError(f"prefix_cache_gb = {gb:g}: the pool of {n} entries {why}")
        if host and (why := memory.shortfall(host * one, host=True)):
            raise ValueError(f"prefix_host_gb = {host_gb:g}: the host pool of {host} entries {why}")
        self._host_pool = None         # numpy leaves [host, ...] of the pool's, made at need
        return PrefixCache(n, block, one, host)

    def _move_entries(self):
        """Copies the entries the last plan spilled to the host pool or loaded back from it,
        in the index's order (a slot or entry freed by one move may be reused by a later one).
        """
        for kind, src, dst in self.prefix.take_moves():
            leaves, tree = jax.tree.flatten(self.state.prefix)
            if self._host_pool is None:
                self._host_pool = [np.zeros((self.prefix.host_capacity,) + a.shape[1:], a.dtype)
                                   for a in leaves]
            if kind == "spill":
                for h, a in zip(self._host_pool, leaves):
                    h[dst] = np.asarray(a[src])
            else:
                rows = [h[src] for h in self._host_pool]
                self.state = _load_entry(self.state, tree, jnp.int32(dst), rows)

    def prefix_stats(self) -> dict:
        """Prefix-cache counters: lookups, lookup_tokens, hit_tokens (prompt tokens restored
        instead of prefilled), hit_rate, evictions, entries, capacity, block, entry_bytes,
        bytes. {} without a prefix cache."""
        return {} if self.prefix is None else self.prefix.stats.as_dict()

    def clear_prefix_cache(self):
        """Forgets every cached prefix and resets `prefix_stats` (e.g. after a warm-up)."""
        if self.prefix is not None:
            self.prefix.clear()

    def warm_up_buckets(self, every_bucket: bool = True) -> float:
        """`warm_up` for a server that does not know its requests: one short prompt per
        prompt-length bucket up to max_len (every_bucket False: the smallest bucket only), so a
        prefill of a new length never stalls every running stream behind a compilation
        (seconds on an 8B model); then forgets what the warm-up cached. Returns its seconds."""
        limit = self.max_len - 2 - self.drafter.num_draft       # prompt + 2 new + drafts
        lengths, T = [], _bucket(1)
        while limit >= 1:
            lengths.append(min(T, limit))
            if T >= limit or not every_bucket:
                break
            T *= 2
        took = self.warm_up([Request(prompt=[0] * n, max_new_tokens=2) for n in lengths])
        self.clear_prefix_cache()
        return took

    # ------------------------------------------------------------------ live serving
    def submit(self, request: Request) -> Hashable:
        """Checks `request` (RequestError naming the field and the rule) and queues it; returns
        its id: request.id, or when that is None the next integer not in use (0, 1, ...). Ids of
        queued and running requests are unique. Thread-safe: may run while another thread
        steps the engine."""
        with self._lock:
            while self._next_id in self._ids:
                self._next_id += 1
            request = _with_id(request, self._next_id)
            self._enqueue([request])
            if request.id == self._next_id:        # taken: ids are not reused
                self._next_id += 1
        return request.id

    def cancel(self, request_id: Hashable) -> bool:
        """Cancels a queued or running request: at the next `step` a queued one is dropped
        (never prefilled), a running one stops with the tokens it has and frees its slot; either
        is reported there as a completion with finish_reason "cancelled" (a running one that
        the visit already on the device finishes, by length or a stop id, completes as it
        would have). Returns False if no queued or running request has this id. Thread-safe."""
        if not isinstance(request_id, Hashable):
            return False                            # no request has an unhashable id
        with self._lock:
            if request_id not in self._ids:
                return False
            entry = next((e for e in self._queue if e.req.id == request_id), None)
            if entry is not None:
                self._queue.remove(entry)
                self._dropped.append(entry)
            else:
                self._cancel.add(request_id)
            self._lock.notify_all()
            return True

    @property
    def has_work(self) -> bool:
        """Whether `step` has something to do: queued or running requests, or cancellations
        to report."""
        with self._lock:
            return bool(self._queue or self._running or self._dropped)

    @property
    def num_slots(self) -> int:
        """Slots for requests (the null slot aside)."""
        return self.S - 1

    @property
    def num_queued(self) -> int:
        """Requests waiting for a slot. Thread-safe."""
        with self._lock:
            return len(self._queue)

    @property
    def num_running(self) -> int:
        """Slots holding a request; a finished or cancelled one frees its slot at the host
        visit that reports it. Thread-safe (a snapshot)."""
        return len(self._running)

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Blocks until `has_work` (a submit or cancel from another thread) or the timeout;
        returns has_work."""
        with self._lock:
            return bool(self._lock.wait_for(
                lambda: self._queue or self._running or self._dropped, timeout))

    def step(self) -> list[Event]:
        """One host visit: reports cancellations, then either admits queued requests into free
        slots (one prefill call) or runs one decode / verify visit over the running requests.
        Returns the visit's events: each request's new tokens, and its Completion if it
        finished (stop id, max_new_tokens, cancelled, or "error": its prefill failed before it
        consumed the engine's state, and the engine goes on; an error that took the state
        propagates). Nothing to do: []. Call it from one
        thread at a time."""
        return _drain(self._visit())

    # ------------------------------------------------------------------ batch API
    def generate(self, requests: Sequence[Request], on_tokens=None) -> list:
        """Serves the requests with continuous batching; returns a Completion per request, in
        order. Each request's tokens do not depend on what else is in the batch.

        on_tokens(request_id, tokens, finished): streaming; called after every host visit for
        each request that got tokens there (a list of ints, already cut at a stop id or
        max_new_tokens) or finished. A request's calls concatenate to its Completion.tokens."""
        return _drain(self.serve(requests, on_tokens))

    def warm_up(self, requests: Sequence[Request]) -> float:
        """Compiles what serving `requests` will run -- a prefill per prompt-length bucket and
        the decode or verify step -- with one two-token copy of a request per bucket (same stop
        ids and sampling), so a timed run after it excludes compilation. With a prefix cache,
        every bucket up to the longest prompt's (a hit leaves any remainder), each from an
        empty cache. Returns its seconds."""
        first = {}
        for r in requests:
            first.setdefault(_bucket(len(r.prompt)), r)
        if self.prefix is not None and first:
            # a hit prefills only the rest of its prompt, of any length: every bucket below too
            top, T = max(first), _bucket(1)
            while T < top:
                first.setdefault(T, dataclasses.replace(first[top], prompt=first[top].prompt[:T]))
                T *= 2
        warm = [dataclasses.replace(r, id=None, max_new_tokens=min(r.max_new_tokens, 2))
                for r in first.values()]
        t0 = time.perf_counter()
        for r in warm:
            self.clear_prefix_cache()       # a hit would shorten the prefill it is here to compile
            self.generate([r])
        return time.perf_counter() - t0

    def serve(self, requests: Sequence[Request], on_tokens=None):
        """`generate` one host visit at a time: a generator that yields the kind of each visit
        ("prefill", "decode" or "verify") just before running it, and returns generate's
        Completions. Lets a caller act between visits (a profiler tracing only decode steps).
        The requests are checked before anything runs (a request without an id gets its index);
        the engine must have no other queued or running requests."""
        if on_tokens is not None and not callable(on_tokens):
            raise TypeError(f"on_tokens must be callable or None, got a "
                            f"{type(on_tokens).__name__}")
        reqs = [_with_id(r, i) for i, r in enumerate(requests)]
        with self._lock:
            if self._queue or self._running or self._dropped:
                raise RuntimeError("generate / serve need an idle engine; this one has queued or "
                                   "running requests (drive it with step())")
            self._enqueue(reqs)
        return self._serve([r.id for r in reqs], on_tokens)

    def _serve(self, ids, on_tokens):
        done = {}
        while self.has_work:
            for ev in (yield from self._visit()):
                if on_tokens is not None:
                    try:
                        on_tokens(ev.id, ev.tokens, ev.finished)
                    except Exception:           # (an interrupt is not held up by a visit)
                        self._abandon(ids)      # the engine stays usable; the caller's error
                        raise
                if ev.finished:
                    done[ev.id] = ev.completion
        return [done[i] for i in ids]

    def _abandon(self, ids):
        """Cancels `ids` and runs the engine until they are gone (a `generate` whose callback
        raised leaves an idle engine, as it found it)."""
        for i in ids:
            self.cancel(i)
        while self.has_work:
            _drain(self._visit())

    # ------------------------------------------------------------------ host visits
    def _enqueue(self, reqs):
        """Checks every request, then queues them all (or raises and queues none). The caller
        holds the lock."""
        seen = set()
        for r in reqs:
            check_request(r, vocab=self.vocab, max_len=self.max_len,
                          num_draft=self.drafter.num_draft)
            if r.id in self._ids or r.id in seen:
                raise RequestError(f"request {r.id!r}: id already used by a queued or running "
                                   f"request")
            seen.add(r.id)
        now = time.perf_counter()
        self._queue.extend(_Entry(r, now, frozenset(int(t) for t in r.stop_ids)) for r in reqs)
        self._ids |= seen
        self._lock.notify_all()

    def _visit(self):
        """One host visit as a generator: yields its kind just before running it (nothing when
        there are only cancellations to report) and returns its events."""
        events = self._cancellations()
        kind, batch = self._plan()
        if kind is not None:
            yield kind
            events += (self._prefill_visit(batch) if kind == "prefill" else
                       self._spec_visit() if self.drafter.speculative else self._decode_visit())
        return events

    def _plan(self):
        """The next visit: ("prefill", [(entry, slot), ...]), (decode or verify, None), or
        (None, None) when idle. Takes the admitted entries off the queue."""
        if self._decode_due and self._running:
            self._decode_due = False
            return self._visit_kind, None
        self._decode_due = False
        with self._lock:
            free = [s for s in range(1, self.S) if s not in self._running]
            # a round's size is fixed when it starts; cancellations may shrink the queue
            self._round = min(self._round or len(free), len(self._queue))
            take = min(self.prefill_rows, self._round)
            batch, longest = [], 0
            for s in free[:take]:            # while the batch fits the positions budget
                longest = max(longest, len(self._queue[0].req.prompt))
                if batch and len(batch) >= self._prefill_batch(_bucket(longest)):
                    break
                batch.append((self._queue.popleft(), s))
        if batch:
            self._round -= len(batch)
            self._decode_due = not self._round
            return "prefill", batch
        return (self._visit_kind if self._running else None), None

    def _cancellations(self) -> list:
        """Events for the requests cancelled since the last visit (running ones free their
        slot)."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
            cancel = set(self._cancel)
        now = time.perf_counter()
        events = [self._finish(e, "cancelled", now) for e in dropped]
        for s, e in list(self._running.items()):
            if e.req.id in cancel:
                del self._running[s]
                events.append(self._finish(e, "cancelled", now))
        return events

    def _finish(self, e: _Entry, reason: str, now: float, error: str = "") -> Event:
        """The Event completing `e` (its tokens since the last event), which leaves the
        engine."""
        logits = (np.concatenate(e.logits or [np.zeros((0, self.vocab), np.float32)])
                  if self.return_logits else None)
        lps = e.logprobs if self.keep.logprobs >= 0 else None
        c = Completion(e.req.id, e.tokens, reason, e.ttft, now - e.submitted, e.verify_steps,
                       e.accepted, e.drafts, logits, e.cached, error, lps)
        with self._lock:
            self._ids.discard(e.req.id)
            self._cancel.discard(e.req.id)
        return self._event(e, c)

    def _event(self, e: _Entry, completion: Completion | None = None) -> Event:
        """The Event of e's tokens (and logprobs) since its last one."""
        start, e.streamed = e.streamed, len(e.tokens)
        return Event(e.req.id, e.tokens[start:], completion, e.cached,
                     e.logprobs[start:] if self.keep.logprobs >= 0 else None)

    def _keep(self, e: _Entry, kept, index) -> None:
        """Adds to e what the visit kept of its new tokens' logits: kept[index] ([k, ...])."""
        if kept is None:
            return
        if self.keep.logits:
            e.logits.append(kept[index])
            return
        lp, ids, top = (a[index].tolist() for a in kept)      # one conversion each
        e.logprobs += [(p, tuple(zip(i, t))) for p, i, t in zip(lp, ids, top)]

    def _settle(self, slot, e: _Entry, now: float) -> list:
        """After a visit added tokens to `e`: completes it at a stop id or max_new_tokens (the
        tokens past either are dropped). Returns its event ([] if nothing new)."""
        r = e.req
        hit = next((j for j in range(e.streamed, len(e.tokens)) if e.tokens[j] in e.stops),
                   None) if e.stops else None
        if hit is None and len(e.tokens) < r.max_new_tokens:
            e.count_steps()
            if len(e.tokens) == e.streamed:
                return []
            return [self._event(e)]
        n = min(len(e.tokens) if hit is None else hit + 1, r.max_new_tokens)
        e.tokens = e.tokens[:n]
        e.logprobs = e.logprobs[:n]
        e.count_steps()
        if self.return_logits:
            e.logits = [np.concatenate(e.logits)[:n]]
        del self._running[slot]
        self._queue_capture(e)
        return [self._finish(e, "stop" if hit is not None and hit < n else "length", now)]

    def _queue_capture(self, e: _Entry):
        """With a prefix cache, queues (first) a re-prefill of e's prompt + tokens: it hits the
        prompt, prefills the rest and stores its blocks (a next turn that extends this
        completion hits all of it), and reports nothing. The cached states are a prefill's, as
        in a run without the cache."""
        if self.prefix is None:
            return
        seq = list(e.req.prompt) + e.tokens
        with self._lock:
            self._queue.appendleft(_Entry(Request(seq, 1, id=object()), e.submitted,
                                          frozenset(), capture=True))

    def _slot_inputs(self):
        """([(row, slot)] of the running requests, SlotInputs, SamplingArrays) of a decode or
        speculative step. batch_invariant: row s is slot s, S rows (fixed shapes); else one row
        per running request (in slot order), padded with null-slot rows to a power of two >=
        MIN_DECODE_ROWS (at most S), so a step's cost follows the occupied slots, not the pool
        (a few compilations, one per size). Stop ids are padded to a power of two >= 8, so
        their number only recompiles past that."""
        order = sorted(self._running)
        if self.batch_invariant:            # row s is slot s
            rows, pairs = self.S, list(zip(order, order))
            slots = np.arange(rows, dtype=np.int32)
        else:
            rows = min(self.S, _bucket(len(order), MIN_DECODE_ROWS))
            slots = np.array(order + [NULL_SLOT] * (rows - len(order)), np.int32)
            pairs = list(enumerate(order))
        width = _bucket(max((len(e.stops) for e in self._running.values()), default=0), 8)
        last, remaining, gen_pos = (np.zeros(rows, np.int32) for _ in range(3))
        active = np.zeros(rows, bool)
        stops = np.full((rows, width), -1, np.int32)
        params = [SamplingParams()] * rows
        for r, s in pairs:
            e = self._running[s]
            last[r], active[r] = e.tokens[-1], True
            remaining[r] = e.req.max_new_tokens - len(e.tokens)
            gen_pos[r] = len(e.tokens)
            stops[r, :len(e.stops)] = sorted(e.stops)
            params[r] = e.req.sampling
        inp = SlotInputs(*(jnp.asarray(a) for a in (slots, last, active, remaining, gen_pos,
                                                      stops)))
        return pairs, inp, SamplingArrays.of(params)

    def _prefill_batch(self, T: int, n: int | None = None) -> int:
        """Rows of a prefill call of n prompts (None: the most it may take) whose bucket is T:
        the budget's (batch_invariant), else at most that, the power of four >= n (a lone
        prompt is one row, not prefill_rows: a few compilations per T instead of padding every
        call)."""
        most = max(1, min(self.prefill_rows, self.prefill_tokens // T))
        if n is None or self.batch_invariant:
            return most
        rows = 1
        while rows < n:
            rows *= 4
        return min(most, rows)

    def _prefill_visit(self, batch):
        prompts = [np.asarray(e.req.prompt, np.int32) for e, _ in batch]
        plans = (self.prefix.plan(prompts, [not e.capture for e, _ in batch])
                 if self.prefix is not None else None)
        if plans is not None:
            self._move_entries()
        cached = [plan.cached for plan in plans] if plans else [0] * len(prompts)
        T = _bucket(max(len(p) - c for p, c in zip(prompts, cached)))
        rows = self._prefill_batch(T, len(batch))
        starts = np.array(cached + [0] * (rows - len(cached)), np.int32)
        tokens = np.zeros((rows, T), np.int32)
        lengths = np.ones(rows, np.int32)
        slots = np.full(rows, NULL_SLOT, np.int32)
        for r, ((e, s), p) in enumerate(zip(batch, prompts)):
            rest = p[starts[r]:]
            tokens[r, :len(rest)], lengths[r], slots[r] = rest, len(rest), s
            e.cached = int(starts[r])
        sp = SamplingArrays.of([e.req.sampling for e, _ in batch]
                               + [SamplingParams()] * (rows - len(batch)))
        args = [jnp.asarray(a) for a in (tokens, lengths, slots)] + [sp]
        if plans is not None:
            args.append(self._prefix_rows(plans, starts, T))
        try:
            why = self._prefill_shortfall(T, rows, args)
        except Exception as e:  # noqa: BLE001 -- its compilation failed: the call's would too
            return self._prefill_failed(batch, self.state, e)
        if why is not None:
            return self._prefill_refused(batch, prompts, cached, T, why)
        start = time.perf_counter()
        before = self.state
        try:
            state, first, last = self._prefill(self.state, *args)
            first = np.asarray(first)     # (an error at run time surfaces here)
        except Exception as e:  # noqa: BLE001 -- refused before running, or the engine breaks
            return self._prefill_failed(batch, before, e)
        self.state = state
        last = jax.tree.map(np.asarray, last)
        now = time.perf_counter()
        self.visits.append(("prefill", 1, now - start))
        events = []
        for r, (e, s) in enumerate(batch):
            if e.capture:                   # its slot stays free
                continue
            e.tokens, e.ttft = [int(first[r])], now - e.submitted
            self._keep(e, last, slice(r, r + 1))
            self._running[s] = e
            events += self._settle(s, e, now)
        return events

    def _prefill_shortfall(self, T, rows, args) -> str | None:
        """Why a prefill call of this shape would not fit in free memory (what XLA says it
        allocates beyond its arguments, from the executable the call compiles anyway: checked
        once a shape), or None: run out of memory while running, it would take the engine's
        donated state with it."""
        key = (T, rows, len(args))
        if key not in self._prefill_fits:
            need = self._prefill.extra_bytes(self.state, *args)
            self._prefill_fits[key] = None if need is None else memory.shortfall(need)
        return self._prefill_fits[key]

    def _prefill_refused(self, batch, prompts, cached, T, why) -> list:
        """A prefill that would not fit: the prompts of a shorter bucket go back to the front of
        the queue (a later call of fewer positions takes them), those that set the bucket
        fail (`_prefill_errors`)."""
        own = [_bucket(len(p) - c) for p, c in zip(prompts, cached)]
        back = [e for (e, _), b in zip(batch, own) if b < T]
        with self._lock:
            self._queue.extendleft(reversed(back))
        if back:
            self._round += len(back)
            self._decode_due = False
        return self._prefill_errors(
            [e for (e, _), b in zip(batch, own) if b == T],
            lambda e: f"a prompt of {len(e.req.prompt)} tokens cannot be prefilled here: its "
                      f"prefill {why}")

    def _prefill_failed(self, batch, before, error) -> list:
        """A prefill call that raised: if it had not consumed the engine's state (its donated
        buffers intact: it failed at compilation or dispatch, e.g. an allocation refused
        there), its requests fail (`_prefill_errors`) and the engine goes on; else the error
        propagates: the state is gone (an error while the call ran, such as XLA's out of memory
        at run time on a CPU)."""
        if any(isinstance(a, jax.Array) and a.is_deleted() for a in jax.tree.leaves(before)):
            raise error
        first = " ".join(str(error).split())[:300]
        why = f"the prefill failed ({type(error).__name__}: {first})"
        return self._prefill_errors([e for e, _ in batch], lambda e: why)

    def _prefill_errors(self, entries, why) -> list:
        """Events finishing the entries a prefill could not serve with finish_reason "error"
        and `why(entry)` (their slots stay free; prefix-cache captures report nothing). A
        prefix cache forgets everything: the call's plan may have claimed entries it never
        filled."""
        if self.prefix is not None:
            self.prefix.clear()
        now = time.perf_counter()
        return [self._finish(e, "error", now, why(e)) for e in entries if not e.capture]

    def _prefix_rows(self, plans, starts, T) -> PrefixRows:
        """The prefill's PrefixRows: hit entries padded to the most a slot can hold (a fixed
        width: a width per chain length multiplied the prefill's compilations, which cost
        seconds each on an 8B model), store entries per block of the rows' SSM scans."""
        B, rows = self.prefix.block, len(starts)
        hits = np.zeros((rows, -(-self.max_len // B)), np.int32)
        stores = np.full((rows, ring_blocks(T, B, True)), -1, np.int32)
        for r, p in enumerate(plans):
            hits[r, :len(p.hits)] = p.hits
            stores[r, :len(p.stores)] = p.stores
        return PrefixRows(*(jnp.asarray(a) for a in (starts, hits, stores)))

    def _decode_visit(self):
        pairs, inp, sp = self._slot_inputs()
        start = time.perf_counter()
        self.state, out, kept = self._decode(self.state, inp, sp)
        out = np.asarray(out)                                   # [rows, steps], -1 = none
        kept = jax.tree.map(np.asarray, kept)
        now = time.perf_counter()
        self.visits.append(("decode", int((out >= 0).any(0).sum()), now - start))
        events = []
        for r, s in pairs:
            e = self._running[s]
            ok = out[r] >= 0
            e.tokens += out[r, ok].tolist()
            self._keep(e, kept, (r, ok))
            events += self._settle(s, e, now)
        return events

    def _spec_visit(self):
        pairs, inp, sp = self._slot_inputs()
        host = None
        if self.drafter.on_host:        # a device drafter needs no histories built
            host = self.drafter.host_drafts(inp.last.shape[0], {
                r: (self._running[s].req.prompt, self._running[s].tokens) for r, s in pairs})
        start = time.perf_counter()
        self.state, emitted, n_acc, drafts, kept = self._speculate(self.state, inp, sp, host)
        emitted, n_acc = np.asarray(emitted), np.asarray(n_acc)   # [rows, steps, T], [rows, steps]
        drafts = np.asarray(drafts) if self.record_drafts else None
        kept = jax.tree.map(np.asarray, kept)
        now = time.perf_counter()
        self.visits.append(("verify", int((n_acc > 0).any(0).sum()), now - start))
        events = []
        for r, s in pairs:
            e = self._running[s]
            for j in np.flatnonzero(n_acc[r]):      # the steps the row took part in
                k = int(n_acc[r, j])
                e.spec_steps.append((len(e.tokens), k, None if drafts is None else (
                    len(e.req.prompt) + len(e.tokens) - 1, drafts[r, j].tolist())))
                e.tokens += emitted[r, j, :k].tolist()
                self._keep(e, kept, (r, j, slice(0, k)))
            events += self._settle(s, e, now)
        return events


@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
def _load_entry(state: EngineState, tree, entry, rows):
    """The state with prefix pool entry `entry` set to rows (one per pool leaf)."""
    leaves = [a.at[entry].set(r) for a, r in zip(jax.tree.leaves(state.prefix), rows)]
    return state.replace(prefix=jax.tree.unflatten(tree, leaves))


def _on_mesh(model, mesh, what: str):
    """`model` laid out and placed on the tp mesh (as is when it already is there)."""
    on = sharding.params_mesh(nnx.state(model, nnx.Param))
    if on is None:
        return sharding.shard_model(model, mesh)
    if on != mesh:
        raise ValueError(f"{what} is placed on another mesh ({dict(on.shape)}) than mesh= "
                         f"({dict(mesh.shape)})")
    return model


def _with_id(r: Request, default: Hashable) -> Request:
    """r, or a copy with id `default` if it has none (RequestError if r is no Request)."""
    if not isinstance(r, Request):
        raise RequestError(f"expected a Request, got a {type(r).__name__}")
    return r if r.id is not None else dataclasses.replace(r, id=default)


def _drain(gen):
    """Runs a generator to its end; returns its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as end:
            return end.value
