"""The engine's draft-model drafter on the tiny HF fixtures (CPU, vocab 128 each): greedy
speculative decoding with a separate draft model gives HF's greedy tokens (= the plain engine's),
under continuous batching (five requests through two slots), K = 1 and 3, both families as target
and as draft. Drafts from the other family are almost never accepted, from a noisy copy of the
target about half the time, from the target itself always (so the draft cache tracks the target's
exactly across steps). A draft model with another vocabulary is refused."""

import dataclasses

import jax
import pytest
from flax import nnx

from models.qwen import QwenHybrid
from replayjax.engine import Engine, Request
from tests.models import hf_checks
from tests.replayjax.spec_counts import every_draft_accepted

FAMILIES = ("nemotron_h", "qwen3_5")
ORDER, LENGTHS = [0, 1, 2, 1, 0], [20, 9, 12, 15, 5]


def load(name):
    """(runner, prompts, HF greedy tokens [3, 40]) of a fixture; a fresh model every call."""
    runner, ref = hf_checks.load(name)
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    return runner, prompts, ref["greedy_tokens"]


def noisy_copy(name, sigma=0.03, seed=0):
    """The fixture's model with every weight scaled by 1 + sigma * N(0, 1): a draft model that
    agrees with the target about half the time."""
    model = load(name)[0].model
    key = jax.random.key(seed)
    for i, (_, v) in enumerate(nnx.iter_graph(model)):
        if isinstance(v, nnx.Param):
            noise = jax.random.normal(jax.random.fold_in(key, i), v[...].shape, v[...].dtype)
            v[...] = v[...] * (1 + sigma * noise)
    return model


@pytest.fixture(scope="module")
def fixtures():
    return {name: load(name) for name in FAMILIES}


@pytest.mark.parametrize("target,draft,K", [
    ("nemotron_h", "qwen3_5", 1), ("qwen3_5", "nemotron_h", 3),        # other family
    ("nemotron_h", "noisy", 3),                                        # partial acceptance
    ("qwen3_5", "self", 3),                                            # everything accepted
])
def test_draft_model_speculative_matches_greedy(fixtures, target, draft, K):
    runner, prompts, want = fixtures[target]
    draft_model = (runner.model if draft == "self" else noisy_copy(target) if draft == "noisy"
                   else fixtures[draft][0].model)
    eng = Engine(runner.model, num_slots=2, max_len=64, window=4, num_draft=K, drafter="draft",
                 draft_model=draft_model)
    eng.record_drafts = True
    out = eng.generate([Request(prompt=prompts[i], max_new_tokens=n) for i, n in
                        zip(ORDER, LENGTHS)])
    for c, i, n in zip(out, ORDER, LENGTHS):
        assert c.tokens == list(want[i, :n]) and c.finish_reason == "length"
        assert c.verify_steps == len(c.drafts) > 0 and c.logits is None
        assert all(len(d) == K for _, d in c.drafts)
    accepted = sum(c.accepted_drafts for c in out)
    total = K * sum(c.verify_steps for c in out)
    print(f"{target} <- {draft}, K={K}: {accepted} of {total} drafts accepted")
    if draft == "self":
        assert all(every_draft_accepted(c, K) for c in out)
    elif draft == "noisy":
        assert 0.2 * total < accepted < total


def test_draft_vocab_must_match(fixtures):
    model = fixtures["qwen3_5"][0].model
    small = QwenHybrid(dataclasses.replace(model.cfg, vocab_size=96))
    with pytest.raises(ValueError, match=r"vocab_size \(96\) differs from the target model's "
                                         r"\(128\)"):
        Engine(model, window=4, num_draft=2, drafter="draft", draft_model=small)
    with pytest.raises(ValueError, match="drafter='draft' needs draft_model"):
        Engine(model, window=4, num_draft=2, drafter="draft")
    with pytest.raises(ValueError, match="draft_model is only used with drafter='draft'"):
        Engine(model, window=4, num_draft=2, draft_model=model)
