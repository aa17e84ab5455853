"""Engine(return_logits=True) on the tiny HF fixtures (CPU): every completion's logits [n, V]
equal a teacher-forced prefill over prompt + generated tokens (1e-4), for plain decode and for
speculative steps (accepted rows of the verify window), with greedy, sampled and stopped requests
sharing two slots."""

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
