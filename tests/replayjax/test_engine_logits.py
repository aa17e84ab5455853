"""Engine(return_logits=True) on the tiny HF fixtures (CPU): every completion's logits [n, V]
equal a teacher-forced prefill over prompt + generated tokens (1e-4), for plain decode and for
speculative steps (accepted rows of the verify window), with greedy, sampled and stopped requests
sharing two slots. Engine(logprobs=K): the log-softmax of those logits, per token and its top K."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayjax.engine import Engine, Request, SamplingParams
from tests.replayjax.test_engine_draft import load, noisy_copy

MAX_LEN = 64


def _teacher_forced(runner, seq):
    """Target logits [len(seq), V] of one sequence from a fresh cache."""
    cache = runner.init_cache(2, MAX_LEN, window=4)
    tokens = np.zeros((1, MAX_LEN), np.int32)
    tokens[0, :len(seq)] = seq
    logits, _ = runner.prefill(cache, jnp.asarray(tokens), jnp.asarray([len(seq)], jnp.int32),
                               jnp.asarray([1], jnp.int32))
    return np.asarray(logits[0, :len(seq)])


@pytest.mark.parametrize("name,K", [("nemotron_h", 0), ("qwen3_5", 0), ("nemotron_h", 3),
                                    ("qwen3_5", 2)])
def test_logits_equal_teacher_forced(name, K):
    """K > 0: a noisy copy of the target drafts, so windows are accepted partly."""
    runner, prompts, want = load(name)
    spec = dict(num_draft=K, drafter="draft", draft_model=noisy_copy(name)) if K else {}
    eng = Engine(runner.model, num_slots=2, max_len=MAX_LEN, window=4, steps_per_visit=5,
                 return_logits=True, **spec)
    stop = int(want[2, 6])
    reqs = [Request(prompt=prompts[0], max_new_tokens=14),
            Request(prompt=prompts[1], max_new_tokens=11,
                    sampling=SamplingParams(temperature=0.8, seed=3)),
            Request(prompt=prompts[2], max_new_tokens=20, stop_ids=(stop,))]
    out = eng.generate(reqs)
    assert out[2].finish_reason == "stop" and out[2].tokens[-1] == stop
    for r, c in zip(reqs, out):
        assert c.logits.shape == (len(c.tokens), 128) and c.logits.dtype == np.float32
        ref = _teacher_forced(runner, list(r.prompt) + c.tokens)[len(r.prompt) - 1:-1]
        np.testing.assert_allclose(c.logits, ref, atol=1e-4, rtol=0)
    if K:
        assert sum(c.accepted_drafts for c in out) > 0


@pytest.mark.parametrize("name,K,top", [("nemotron_h", 0, 3), ("qwen3_5", 2, 5),
                                        ("nemotron_h", 0, 0)])
def test_logprobs_are_the_log_softmax_of_the_logits(name, K, top):
    """Engine(logprobs=top): each token's log probability and the top most likely tokens', as
    the log-softmax of the logits a return_logits engine gives for the same requests (the same
    tokens: greedy, sampled, stopped; plain decode and speculative steps); a request's events
    carry them in order, cut where its tokens are."""
    runner, prompts, want = load(name)
    spec = dict(num_draft=K, drafter="draft", draft_model=noisy_copy(name)) if K else {}
    settings = dict(num_slots=2, max_len=MAX_LEN, window=4, steps_per_visit=5, **spec)
    stop = int(want[2, 6])
    reqs = [Request(prompt=prompts[0], max_new_tokens=14),
            Request(prompt=prompts[1], max_new_tokens=11,
                    sampling=SamplingParams(temperature=0.8, seed=3)),
            Request(prompt=prompts[2], max_new_tokens=20, stop_ids=(stop,))]
    ref = Engine(runner.model, return_logits=True, **settings).generate(reqs)
    eng = Engine(runner.model, logprobs=top, **settings)
    ids = [eng.submit(r) for r in reqs]
    events, done = {}, {}
    while len(done) < len(reqs):
        for ev in eng.step():
            events.setdefault(ev.id, []).append(ev)
            if ev.finished:
                done[ev.id] = ev.completion
    out = [done[i] for i in ids]
    assert out[2].finish_reason == "stop"
    for c, r in zip(out, ref):
        assert c.tokens == r.tokens and c.logits is None and len(c.logprobs) == len(c.tokens)
        lsm = np.asarray(jax.nn.log_softmax(jnp.asarray(r.logits), axis=-1))
        np.testing.assert_allclose([lp for lp, _ in c.logprobs],
                                   lsm[np.arange(len(r.tokens)), r.tokens], atol=1e-5)
        for row, (_, alts) in zip(lsm, c.logprobs):
            ids = [i for i, _ in alts]
            assert len(ids) == top and sorted(row[ids], reverse=True) == row[ids].tolist()
            assert all(row[ids[-1]] >= np.delete(row, ids)) if top else True
            np.testing.assert_allclose([lp for _, lp in alts], row[ids], atol=1e-5)
        evs = events[c.id]
        assert sum((ev.logprobs for ev in evs), []) == c.logprobs
        assert [len(ev.logprobs) for ev in evs] == [len(ev.tokens) for ev in evs]


@pytest.mark.parametrize("kw,match", [(dict(logprobs=21), "logprobs must be None or an integer"),
                                      (dict(logprobs=-1), "logprobs must be None or an integer"),
                                      (dict(logprobs=True), "logprobs must be None or an integer"),
                                      (dict(logprobs=2, return_logits=True), "exclusive")])
def test_bad_logprobs_settings_are_named(kw, match):
    runner, _, _ = load("nemotron_h")
    with pytest.raises(ValueError, match=match):
        Engine(runner.model, num_slots=1, max_len=MAX_LEN, **kw)
