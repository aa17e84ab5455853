"""The engine's sampled tokens, end to end, for every drafter on the tiny Nemotron-H fixture (CPU):
speculative decoding emits plain sampling's distribution, at every position of the verify window;
a request's tokens depend only on its seed, prompt and parameters.

Each case serves 512 requests (same prompt, seeds 0..511, four sampling settings in turn)
through 128 slots with `record_drafts`, so every emitted token's window index (0..K, K = the
bonus) and the draft proposed there are known. Its true distribution comes from the model's
logits given prompt + emitted prefix: for "draft" (the fixture drafting for itself: greedy drafts
that are often accepted) a teacher-forced prefill of every completion; for "ngram" and "mtp" the
fixture with every block zeroed, a bigram model whose logits depend on the previous token only
(its MTP head made exact: tests/replayjax/test_engine_mtp.py), tabulated. The logits the engine
returns must equal that truth, and per window index and sampling setting the tokens must fit it
(tests/replayjax/gof.py: G-test over [the draft | other tokens by rank], filtered tokens never).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from replayjax.engine import Engine, Request, SamplingParams
from tests.replayjax import gof
from tests.replayjax.test_engine_draft import load
from tests.replayjax.test_engine_mtp import _bigram_with_exact_head

SLOTS, N, NEW = 128, 512, 10
SETTINGS = [dict(temperature=1.0, top_k=2), dict(temperature=0.3),
            dict(temperature=0.8, top_k=3, top_p=0.8), dict(temperature=1.2)]
CASES = [("ngram", 2), ("mtp", 1), ("mtp", 4), ("draft", 3)]      # (drafter, K)


def _requests(prompt, seeds):
    return [Request(prompt=prompt, max_new_tokens=NEW,
                    sampling=SamplingParams(**SETTINGS[s % len(SETTINGS)], seed=s))
            for s in seeds]


def _bigram_cycle(table, start=0):
    """The cycle that the greedy chain of a bigram logits table [V, V] falls into from `start`,
    repeated as often as it fits in 16 tokens (once, cut at 16, if longer): a prompt whose
    n-gram drafts are the model's argmax continuations."""
    seen, t = [], start
    while t not in seen:
        seen.append(t)
        t = int(np.argmax(table[t]))
    cycle = seen[seen.index(t):]
    return (cycle * max(1, 16 // len(cycle)))[:16]


def _teacher_forced(runner, prompt, completions):
    """Target logits [n, NEW, V] of every completion's tokens, one batched prefill."""
    n, L = len(completions), len(prompt) + NEW
    seqs = np.array([list(prompt) + c.tokens for c in completions], np.int32)
    cache = runner.init_cache(n + 1, L, window=8)
    logits, _ = runner.prefill(cache, jnp.asarray(seqs), jnp.full(n, L, jnp.int32),
                               jnp.arange(1, n + 1, dtype=jnp.int32))
    return np.asarray(logits)[:, len(prompt) - 1:-1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(engine, prompt, requests, completions, truth logits [N, NEW, V]) per case, built once."""
    cache = {}

    def get(drafter, K):
        if (drafter, K) not in cache:
            if drafter == "draft":
                runner, prompts, _ = load("nemotron_h")
                model, spec = runner.model, dict(draft_model=runner.model)
                prompt = prompts[1]
            else:
                model, spec = _bigram_with_exact_head(tmp_path_factory.mktemp("mtp"),
                                                      "nemotron_h", "nemotron_h"), {}
                table = np.asarray(model.lm_head(model.norm_f(model.embeddings[...])))
                prompt = _bigram_cycle(table)
            eng = Engine(model, num_slots=SLOTS, max_len=32, window=8, num_draft=K,
                         drafter=drafter, return_logits=True, prefill_rows=SLOTS, **spec)
            eng.record_drafts = True
            reqs = _requests(prompt, range(N))
            out = eng.generate(reqs)
            if drafter == "draft":
                truth = _teacher_forced(runner, prompt, out)
            else:
                prev = np.array([[prompt[-1]] + c.tokens[:-1] for c in out])
                truth = table[prev]
            cache[drafter, K] = eng, prompt, reqs, out, truth
        return cache[drafter, K]

    return get


def _window_index(prompt, completion):
    """Per token of a completion: its verify-window index 0..K (-1 = sampled at prefill) and the
    draft proposed at that index (-1 = none: prefill or the bonus)."""
    n = len(completion.tokens)
    index, draft = np.full(n, -1), np.full(n, -1)
    starts = [length - len(prompt) + 1 for length, _ in completion.drafts] + [n]
    for (_, drafts), a, b in zip(completion.drafts, starts, starts[1:]):
        b = min(b, n)
        index[a:b] = np.arange(b - a)
        draft[a:b] = (drafts + [-1])[:b - a]
    return index, draft


@pytest.mark.parametrize("drafter,K", CASES)
def test_speculative_tokens_follow_the_target_distribution(served, drafter, K):
    """Returned logits = the truth; per setting and window index the tokens fit it."""
    _, prompt, reqs, out, truth = served(drafter, K)
    for c, t in zip(out, truth):
        assert len(c.tokens) == NEW
        np.testing.assert_allclose(c.logits, t, atol=1e-4, rtol=0)
    setting = np.repeat([r.sampling.seed % len(SETTINGS) for r in reqs], NEW)
    index, draft = map(np.concatenate, zip(*(_window_index(prompt, c) for c in out)))
    tokens = np.concatenate([c.tokens for c in out])
    sp = [r.sampling for r in reqs for _ in range(NEW)]
    probs, ambiguous = gof.target_probs(truth.reshape(-1, truth.shape[-1]),
                                        [s.temperature for s in sp], [s.top_k for s in sp],
                                        [s.top_p for s in sp])
    assert ambiguous.mean() < 0.01
    for s, params in enumerate(SETTINGS):
        for j in range(-1, K + 1):
            at = (setting == s) & (index == j) & ~ambiguous
            what = f"{drafter} K={K}, {params}, window index {j}"
            gof.assert_never_filtered(probs[at], tokens[at], what)
            gof.assert_fits(*gof.rank_cells(probs[at], tokens[at], draft[at]), what)
    counts = np.bincount(index + 1, minlength=K + 2)
    assert counts.min() >= 50, f"tokens per window index (prefill, 0..K): {counts}"


def test_seeded_requests_reproduce_in_any_company(served):
    """The draft case again, its first 24 requests reversed and mixed into a busy batch (other
    prompts, greedy and sampled, other lengths; repeats): same tokens wherever they are admitted.
    Different seeds give different tokens."""
    eng, prompt, reqs, out, _ = served("draft", 3)
    again = _requests(prompt, range(23, -1, -1))
    busy = [Request(prompt=prompt[:3 + i % 9], max_new_tokens=1 + (7 * i) % 13,
                    sampling=SamplingParams(temperature=0.7 * (i % 3), seed=N + i))
            for i in range(300)]
    mixed = busy[:150] + again[:12] + busy[150:] + again[12:] + _requests(prompt, range(3))
    for r, c in zip(mixed, eng.generate(mixed)):
        if r.sampling.seed < N:
            assert c.tokens == out[r.sampling.seed].tokens, r.sampling
    flat = [tuple(c.tokens) for r, c in zip(reqs, out) if r.sampling.temperature == 1.2]
    assert len(set(flat)) > 0.9 * len(flat)
