"""Prefix caching (models.prefix, replayjax.prefix_cache, Engine(prefix_cache_gb=)) on the tiny
HF fixtures (CPU): a prompt hits every token it shares with a cached sequence (leaving one to
prefill), at any position, and with the cache every request's tokens equal those of a run
without it and its logits agree to fp32 rounding, for both families, both SSM modes, n-gram and
MTP speculation, with concurrent requests that share and extend a prefix and with evictions
under a small pool; the host index hits the longest cached chain and then the longest shared
part of a child block, evicts least recently used leaves first and never an entry the planned
prefill uses; bad settings are refused in one line."""

import functools

import numpy as np
import pytest

from replayjax.engine import Engine, Request
from replayjax.prefix_cache import Plan, PrefixCache
from tests.models import hf_checks, test_mtp

B = 4                                                   # tokens per block in these tests


@functools.cache
def _load(name):
    return hf_checks.load(name)[0].model


def _engine(model, entries, host=0, block=B, **kw):
    """An engine whose pool holds `entries` blocks and its host pool `host` (2 slots, max_len
    32, window 4)."""
    kw = {**dict(num_slots=2, max_len=32, window=4, prefix_block=block), **kw}
    one = Engine(model, prefix_cache_gb=1e-3, **kw).prefix_stats()["entry_bytes"] / 1e9
    return Engine(model, prefix_cache_gb=(entries + 0.5) * one,
                  prefix_host_gb=(host + 0.5) * one if host else 0, **kw)


def _workload(vocab, seed=0):
    """Agents sharing a 2-block system prompt: r2 extends r0's prompt and r3 extends r2's (r2 and
    r3 are admitted together, so r3 hits blocks r2 is storing only in the second round)."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(1, vocab, n).tolist()
    system, a, c = ids(2 * B), ids(3), ids(3)
    prompts = [system + a, system + ids(5), system + a + c, system + a + c + ids(2)]
    return [Request(prompt=p, max_new_tokens=4, id=i) for i, p in enumerate(prompts)]


def _cold(eng, requests):
    """Each request alone on a cleared cache (no hits): the baseline."""
    base = []
    for r in requests:
        eng.clear_prefix_cache()
        base += eng.generate([r])
    assert all(c.cached_tokens == 0 for c in base)
    return base


def _same(base, out):
    """Tokens and recorded drafts equal, logits to fp32 rounding."""
    for want, got in zip(base, out):
        assert (got.tokens, got.drafts) == (want.tokens, want.drafts), got.id
        if want.logits is not None:
            np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=1e-4)


def _check_exact(eng, requests, rounds=2):
    """The cold baseline, then all the requests `rounds` times through the cache, each round
    equal to it. Returns the cached runs' completions."""
    base = _cold(eng, requests)
    eng.clear_prefix_cache()
    runs = [eng.generate(requests) for _ in range(rounds)]
    for out in runs:
        _same(base, out)
    return runs


def _next_turn(eng, vocab):
    """A multi-turn agent: turn 2's prompt is turn 1's prompt + its completion + a new message;
    it hits all of turn 1 (its sequence is stored after it finished), and gets what a cold run
    gets."""
    rng = np.random.default_rng(7)
    first = Request(prompt=rng.integers(1, vocab, 2 * B + 1).tolist(), max_new_tokens=4, id=0)
    eng.clear_prefix_cache()
    done, = eng.generate([first])
    second = Request(prompt=first.prompt + done.tokens + [5, 6], max_new_tokens=4, id=1)
    got, = eng.generate([second])
    assert got.cached_tokens == len(first.prompt) + len(done.tokens)
    _same(_cold(eng, [second]), [got])


@pytest.mark.parametrize("name,mode,num_draft,host", [("nemotron_h", "standard", 3, 0),
                                                      ("qwen3_next", "replay", 0, 16)])
def test_cache_changes_no_token(name, mode, num_draft, host):
    """Hits restore what is cached of a prompt (the system prompt and r0's prompt, which r2 and
    r3, admitted together, share and extend; then a request's own earlier sequence), the pool
    of 5 entries evicts least recently used leaves (or spills them to the host pool, from which
    hits load them back), and nothing the requests get changes; a next turn hits all of its
    previous turn."""
    model = _load(name)
    eng = _engine(model, 5, host, ssm_mode=mode, num_draft=num_draft, return_logits=True)
    requests = _workload(model.cfg.vocab_size)
    first, second = _check_exact(eng, requests)
    stats = eng.prefix_stats()
    assert [c.cached_tokens for c in first] == [0, 0, 2 * B + 3, 2 * B + 3]
    # without a host pool some of each request's own blocks are gone; with it, all hit
    want = ([len(r.prompt) - 1 for r in requests] if host
            else [2 * B + 2, 2 * B, 3 * B, 3 * B])
    assert [c.cached_tokens for c in second] == want
    assert stats["capacity"] == 5 and stats["entries"] == 5
    if host:
        assert stats["evictions"] == 0 and stats["spills"] > 0 and stats["loads"] > 0
    else:
        assert stats["evictions"] > 0 and stats["spills"] == stats["loads"] == 0
    assert stats["hit_tokens"] == sum(c.cached_tokens for c in first + second)
    assert stats["hit_rate"] == stats["hit_tokens"] / stats["lookup_tokens"]
    _next_turn(eng, model.cfg.vocab_size)


def _shared(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _ring_workload(vocab, block):
    """Prompts that diverge from cached ones inside a block (window L = block / 2): r0's
    partial block a, r1 off its block by r < L tokens, r2 by L < r, r3 shorter than a block,
    r4 exactly two blocks (all cached: it hits 2 block - 1), r5 a 3-token prompt r6 extends."""
    rng = np.random.default_rng(3)
    ids = lambda n: rng.integers(1, vocab, n).tolist()
    system, a, c, q = ids(block), ids(block - 3), ids(6), ids(3)
    prompts = [system + a, system + a[:3] + ids(4), system + a + c, system[:6],
               system + a + c[:3], q, q + ids(4)]
    return [Request(prompt=p, max_new_tokens=4, id=i) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("name,mode,num_draft", [("nemotron_h", "replay", 0),
                                                 ("qwen3_next", "standard", 2)])
def test_hits_inside_blocks(name, mode, num_draft):
    """Blocks of 8 tokens (2 ring windows): requests served one after another each hit exactly
    what they share with an earlier request's prompt + completion (capped at len - 1): whole
    blocks and r tokens more of a block or a partial block (r < L, r > L, r not a multiple of
    L; a prompt shorter than a block), and get what a cold run gets; so do all of them admitted
    together (rows of one prefill share and extend prefixes), twice."""
    model = _load(name)
    eng = _engine(model, 64, block=8, ssm_mode=mode, num_draft=num_draft, return_logits=True)
    requests = _ring_workload(model.cfg.vocab_size, 8)
    base = _cold(eng, requests)
    eng.clear_prefix_cache()
    alone = [eng.generate([r])[0] for r in requests]
    _same(base, alone)
    want = [min(len(r.prompt) - 1, max((_shared(r.prompt, q.prompt + c.tokens)
                                        for q, c in zip(requests[:i], alone)), default=0))
            for i, r in enumerate(requests)]
    assert [c.cached_tokens for c in alone] == want
    assert (want[1], want[3], want[4], want[6]) == (8 + 3, 5, 15, 3) and want[2] >= 8 + 5
    _check_exact(eng, requests)


def test_warm_up_leaves_nothing_to_compile():
    """With a prefix cache, `warm_up` compiles a prefill for every length bucket up to the
    longest prompt's: hits leave remainders of any length (and a finished sequence is
    re-prefilled to be cached), and none of them may compile while requests wait (seconds
    each on a real model, in some request's TTFT)."""
    import jax
    model = _load("nemotron_h")
    eng = _engine(model, 64, block=8, max_len=128)
    rng = np.random.default_rng(5)
    system = rng.integers(1, model.cfg.vocab_size, 70).tolist()
    requests = [Request(prompt=system + rng.integers(1, 99, n).tolist(), max_new_tokens=4)
                for n in (0, 5, 20, 40)]
    eng.warm_up(requests)
    compiles = []
    listen = lambda name, secs, **kw: compiles.append(name) if "backend_compile" in name else 0
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for r in requests:                  # remainders 70 (cold), then 5, 20, 40
            eng.generate([r])
        eng.generate(requests)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert eng.prefix_stats()["hit_tokens"] > 0 and compiles == []


def test_mtp_drafts_unchanged(tmp_path):
    """With an MTP drafter the head's KV and the target's hidden states are cached too, and
    the head's entry just before a hit is recomputed (it depends on the token after the
    prefix): with hits inside blocks, drafts equal a run without the cache at every step."""
    model = test_mtp._setup(tmp_path, "nemotron_h", "nemotron_h")[1]
    eng = _engine(model, 64, num_draft=2, drafter="mtp")
    eng.record_drafts = True
    first, second = _check_exact(eng, _workload(model.cfg.vocab_size, seed=1))
    assert [c.cached_tokens for c in second] == [2 * B + 2, 3 * B, 3 * B + 1, 4 * B - 1]
    _next_turn(eng, model.cfg.vocab_size)


def test_index_longest_chain_lru_leaves_pins():
    """Hits are the longest cached chain, then the shared part of the next block (leaving a
    token to prefill); a prefill's rows store each new block once; with the pool full the
    least recently used leaf (whole or partial) goes first (a parent is kept while it has
    children), and never an entry the planned prefill hits."""
    idx = PrefixCache(capacity=3, block=2, entry_bytes=10)
    assert idx.plan([[1, 2, 3, 4]]) == [Plan([], 0, [0, 1])]
    # both blocks hit and the partial block [9] is stored; a prompt of exactly the two cached
    # blocks hits all but its last token (the second block's first token: a hit inside it)
    assert idx.plan([[1, 2, 3, 4, 9], [1, 2, 3, 4]]) == [Plan([0, 1], 4, [2]),
                                                         Plan([0, 1], 3, [-1])]
    # diverges inside [3, 4]; the pool is full: the LRU leaf [9] goes for [3, 7], and there is
    # no room for the partial [7] (every other entry is hit)
    assert idx.plan([[1, 2, 3, 7, 7]]) == [Plan([0, 1], 3, [2, -1])]
    assert idx.plan([[5, 6]]) == [Plan([], 0, [1])]        # [3, 4] goes: [1, 2] has children
    assert idx.plan([[5, 6, 8]]) == [Plan([1], 2, [2])]    # [3, 7] goes
    # [1, 2] is hit (pinned): [8], then [5, 6] (a leaf again) go; no room for [7]
    assert idx.plan([[1, 2, 0], [7, 7, 7]]) == [Plan([0], 2, [2]), Plan([], 0, [1, -1])]
    s = idx.stats
    assert (s.lookups, s.hit_tokens, s.evictions, s.entries) == (8, 4 + 3 + 3 + 2 + 2, 5, 3)
    assert s.hit_rate == s.hit_tokens / s.lookup_tokens
    idx.clear()
    assert idx.stats.entries == 0 and idx.plan([[1, 2, 3]])[0].hits == []


def test_index_hits_inside_blocks():
    """Past the chain a prompt hits the child, whole or partial, sharing the longest token
    prefix with it (at most len - 1 tokens in all); a partial block is stored unless a cached
    child starts with it, and a prompt shorter than a block hits an earlier one's."""
    idx = PrefixCache(capacity=8, block=4, entry_bytes=10)
    assert idx.plan([[1, 2, 3, 4, 5, 6, 7, 8, 9]]) == [Plan([], 0, [0, 1, 2])]
    assert idx.plan([[1, 2, 3, 4, 5, 6]]) == [Plan([0, 1], 5, [-1])]     # capped, inside [5..8]
    assert idx.plan([[1, 2, 3, 4, 5, 6, 0]]) == [Plan([0, 1], 6, [3])]   # partial [5, 6, 0]
    # [5, 6, 0] shares 3 tokens, [5, 6, 7, 8] 2: the partial one is hit
    assert idx.plan([[1, 2, 3, 4, 5, 6, 0, 1, 1]]) == [Plan([0, 3], 7, [4, 5])]
    assert idx.plan([[7, 7]]) == [Plan([], 0, [6])]
    assert idx.plan([[7, 7, 2]]) == [Plan([6], 2, [7])]
    assert idx.plan([[7, 7]]) == [Plan([6], 1, [-1])]
    assert idx.stats.hit_tokens == 5 + 6 + 7 + 2 + 1 and idx.stats.entries == 8


def test_index_host_spills_and_loads():
    """With a host pool the LRU device leaf (here a partial block) is spilled instead of
    dropped and a hit inside it loads it back; a full host pool drops its LRU leaf, never one
    being loaded (then the device leaf is dropped)."""
    idx = PrefixCache(capacity=2, block=2, entry_bytes=10, host_capacity=1)
    assert idx.plan([[1, 2, 3]]) == [Plan([], 0, [0, 1])] and idx.take_moves() == []
    assert idx.plan([[5]]) == [Plan([], 0, [1])]
    assert idx.take_moves() == [("spill", 1, 0)]               # [3] to the host
    assert idx.plan([[1, 2, 3, 4]]) == [Plan([0, 1], 3, [-1])]  # [3] back: [5] dropped
    assert idx.take_moves() == [("load", 0, 1)]
    s = idx.stats
    assert (s.spills, s.loads, s.evictions, s.entries, s.host_entries) == (1, 1, 1, 2, 0)


@pytest.mark.parametrize("kw,match", [
    (dict(prefix_cache_gb=-1), "prefix_cache_gb must be a finite number >= 0"),
    (dict(prefix_cache_gb=float("nan")), "prefix_cache_gb must be a finite number"),
    (dict(prefix_cache_gb=1e-12), "holds no entry: one block of 16 tokens takes"),
    (dict(prefix_cache_gb=1, prefix_host_gb=-2), "prefix_host_gb must be a finite number >= 0"),
    (dict(prefix_host_gb=1), "prefix_host_gb needs prefix_cache_gb > 0"),
    (dict(prefix_cache_gb=1, prefix_host_gb=1e-12), "prefix_host_gb = 1e-12 holds no entry"),
    (dict(prefix_cache_gb=1, prefix_block=2), "prefix_block must be a power of two >= window"),
    (dict(prefix_cache_gb=1, prefix_block=24), "prefix_block must be a power of two"),
    (dict(prefix_cache_gb=1, prefix_block=128), "prefix_block = 128 exceeds max_len = 64"),
    # pools past free memory: refused before the index or the (lazily made) host pool exist
    (dict(prefix_cache_gb=1e12), r"prefix_cache_gb = 1e\+12: the pool of \d+ entries needs"),
    (dict(prefix_cache_gb=1, prefix_host_gb=1e9), r"prefix_host_gb = 1e\+09: the host pool "
                                                   r"of \d+ entries needs"),
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        Engine(_load("nemotron_h"), num_slots=1, max_len=64, window=4, **dict(
            dict(prefix_block=16), **kw))
