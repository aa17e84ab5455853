"""Prefix caching (models.prefix, replayjax.prefix_cache, Engine(prefix_cache_gb=)) on the tiny
HF fixtures (CPU): with the cache, every request's tokens equal those of a run without it and
its logits agree to fp32 rounding, for both families, both SSM modes, n-gram and MTP speculation,
with concurrent requests that share and extend a prefix and with evictions under a small pool;
the host index hits the longest cached chain, evicts least recently used leaves first and never
an entry the planned prefill uses; bad settings are refused in one line."""

import functools

import numpy as np
import pytest

from replayjax.engine import Engine, Request
from replayjax.prefix_cache import PrefixCache
from tests.models import hf_checks, test_mtp

B = 4                                                   # tokens per block in these tests


@functools.cache
def _load(name):
    return hf_checks.load(name)[0].model


def _engine(model, entries, host=0, **kw):
    """An engine whose pool holds `entries` blocks and its host pool `host` (2 slots, max_len
    32, window 4)."""
    kw = dict(num_slots=2, max_len=32, window=4, prefix_block=B, **kw)
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
    it hits the block turn 1 decoded (stored after it finished), past its prompt's blocks, and
    gets what a cold run gets."""
    rng = np.random.default_rng(7)
    first = Request(prompt=rng.integers(1, vocab, 2 * B + 1).tolist(), max_new_tokens=4, id=0)
    eng.clear_prefix_cache()
    done, = eng.generate([first])
    second = Request(prompt=first.prompt + done.tokens + [5, 6], max_new_tokens=4, id=1)
    got, = eng.generate([second])
    assert got.cached_tokens == 3 * B > len(first.prompt) // B * B
    _same(_cold(eng, [second]), [got])


@pytest.mark.parametrize("name,mode,num_draft,host", [("nemotron_h", "standard", 3, 0),
                                                      ("qwen3_next", "replay", 0, 16)])
def test_cache_changes_no_token(name, mode, num_draft, host):
    """Hits restore whole blocks (the system prompt, then a request's own earlier prompt or
    decoded blocks), the pool of 5 entries evicts least recently used leaves (or spills them
    to the host pool, from which hits load them back), and nothing the requests get
    changes; a next turn hits the blocks its previous turn decoded."""
    model = _load(name)
    eng = _engine(model, 5, host, ssm_mode=mode, num_draft=num_draft, return_logits=True)
    first, second = _check_exact(eng, _workload(model.cfg.vocab_size))
    stats = eng.prefix_stats()
    assert [c.cached_tokens for c in first] == [0, 0, 2 * B, 2 * B]
    # without a host pool each request's own block is gone; with it, every full block hits
    want = [2 * B, 3 * B, 3 * B, 3 * B] if host else [2 * B] * 4
    assert [c.cached_tokens for c in second] == want
    assert stats["capacity"] == 5 and stats["entries"] == 5
    if host:
        assert stats["evictions"] == 0 and stats["spills"] > 0 and stats["loads"] > 0
    else:
        assert stats["evictions"] > 0 and stats["spills"] == stats["loads"] == 0
    assert stats["hit_tokens"] == sum(c.cached_tokens for c in first + second)
    assert stats["hit_rate"] == stats["hit_tokens"] / stats["lookup_tokens"]
    _next_turn(eng, model.cfg.vocab_size)


def test_mtp_drafts_unchanged(tmp_path):
    """With an MTP drafter the head's KV is cached too, and its entry just before a hit is
    recomputed (it depends on the token after the prefix): drafts equal a run without the
    cache at every step."""
    model = test_mtp._setup(tmp_path, "nemotron_h", "nemotron_h")[1]
    eng = _engine(model, 64, num_draft=2, drafter="mtp")
    eng.record_drafts = True
    first, second = _check_exact(eng, _workload(model.cfg.vocab_size, seed=1))
    assert [c.cached_tokens for c in second] == [2 * B, 3 * B, 3 * B, 3 * B]
    _next_turn(eng, model.cfg.vocab_size)


def test_index_longest_chain_lru_leaves_pins():
    """Hits are the longest cached chain (leaving a token to prefill); a prefill's rows store
    each new block once; with the pool full the least recently used leaf goes first (a parent
    is kept while it has children), and never an entry the planned prefill hits."""
    idx = PrefixCache(capacity=3, block=2, entry_bytes=10)
    (h, st), = idx.plan([[1, 2, 3, 4, 5]])
    assert h == [] and sorted(st) == [0, 1]
    (h, st), (h2, st2) = idx.plan([[1, 2, 3, 4, 9], [1, 2, 3, 4]])
    assert h == [0, 1] and st == []
    assert h2 == [0] and st2 == [-1]                # at most (len - 1) // B blocks hit
    (h, st), = idx.plan([[1, 2, 7, 7, 7]])
    assert h == [0] and st == [2]                   # the pool is full now
    (h, st), = idx.plan([[5, 5, 6, 6, 0]])          # evicts [3, 4] (LRU leaf), then [7, 7]:
    assert h == [] and sorted(st) == [1, 2]         # [1, 2] had a child when it was older
    assert idx.stats.evictions == 2 and idx.stats.entries == 3
    assert idx.plan([[1, 2, 7, 7, 0]])[0] == ([0], [2])    # evicts [6, 6], the LRU leaf
    (h, st), (h2, st2) = idx.plan([[5, 5, 6, 6, 1], [9, 9, 9]])
    assert (h, st) == ([1], [2])                    # [5, 5] is pinned: [7, 7] goes
    assert (h2, st2) == ([], [0])                   # then [1, 2], a leaf again
    assert idx.stats.evictions == 5
    s = idx.stats
    assert (s.lookups, s.hit_tokens) == (8, 2 * (2 + 1 + 1 + 1 + 1))
    assert s.hit_rate == s.hit_tokens / s.lookup_tokens
    idx.clear()
    assert idx.stats.entries == 0 and idx.plan([[1, 2, 3]])[0][0] == []


def test_index_host_spills_and_loads():
    """With a host pool the LRU device leaf is spilled instead of dropped and a hit loads it
    back (the moves in order); a full host pool drops its LRU leaf, never one being loaded."""
    idx = PrefixCache(capacity=2, block=2, entry_bytes=10, host_capacity=1)
    assert idx.plan([[1, 2, 3, 4, 5]]) == [([], [0, 1])] and idx.take_moves() == []
    assert idx.plan([[7, 7, 0]]) == [([], [1])]
    assert idx.take_moves() == [("spill", 1, 0)]               # [3, 4] to the host
    assert idx.plan([[1, 2, 3, 4, 9]]) == [([0, 1], [])]       # [3, 4] back on entry 1
    assert idx.take_moves() == [("load", 0, 1)]                # [7, 7] dropped: host is full
    assert idx.plan([[8, 8, 0]]) == [([], [1])]
    assert idx.take_moves() == [("spill", 1, 0)]
    s = idx.stats
    assert (s.spills, s.loads, s.evictions, s.entries, s.host_entries) == (2, 1, 1, 2, 1)


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
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        Engine(_load("nemotron_h"), num_slots=1, max_len=64, window=4, **dict(
            dict(prefix_block=16), **kw))
