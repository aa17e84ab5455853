"""The engine's MTP drafter on the tiny HF fixtures (CPU) with random `mtp.*` weights loaded
through the loaders (tests/models/test_mtp.py): greedy speculative decoding with MTP drafts gives
HF's greedy tokens and the plain engine's, under continuous batching (more requests than slots),
K = 1 and 3; the drafts the engine proposes at every step equal drafts recomputed from scratch
(the MTP head run over the whole (hidden_j, token_{j+1}) history, then chained); a model without
an MTP head is refused. Random heads rarely guess right, so a second model is made where the
head is exact: every block's weights are zeroed (the target becomes a bigram model, hidden =
final_norm(embed(token))) and the head maps (h_j, t_{j+1}) to final_norm(embed(t_{j+1})), so
every draft is accepted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from replayjax.engine import Engine, Request, SamplingParams
from tests.models import test_mtp
from tests.models.hf_checks import load
from tests.replayjax.spec_counts import every_draft_accepted

FAMILY = {"nemotron_h": "nemotron_h", "qwen3_next": "qwen"}


@pytest.fixture(scope="module", params=["nemotron_h", "qwen3_next"])
def fixture(request, tmp_path_factory):
    model = test_mtp._setup(tmp_path_factory.mktemp("mtp"), FAMILY[request.param],
                            request.param)[1]
    plain, ref = load(request.param)
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    return model, plain.model, prompts, ref["greedy_tokens"]


_JITTED = {}


def _reference_fns(model, max_len=128):
    """Jitted (model closed over) whole-sequence MTP pass and single chain step, per model."""
    if id(model) not in _JITTED:
        slots = jnp.asarray([1], jnp.int32)

        def full(seq, n):                          # seq [1, max_len] right-padded, n [1]
            cache = model.init_cache(2, max_len)
            _, hidden, cache = model.prefill_hidden(cache, seq, n, slots)
            nxt = jnp.concatenate([seq[:, 1:], jnp.zeros_like(seq[:, :1])], axis=1)
            return model.draft(cache, hidden, nxt, slots, jnp.zeros((1,), jnp.int32))

        def step(cache, h, d, pos):
            return model.draft(cache, h, d, slots, pos)

        _JITTED[id(model)] = (model, jax.jit(full), jax.jit(step))
    return _JITTED[id(model)][1:]


def _reference_drafts(model, seq, steps, K, max_len=128):
    """Drafts from scratch: target hidden states of the whole sequence, the MTP head over
    (hidden_j, seq_{j+1}) at positions 0.. from an empty cache, then for a step at cache length p
    the chain from the head's output at p - 1 (positions >= p are overwritten by the chain)."""
    full, step = _reference_fns(model, max_len)
    padded = np.zeros((1, max_len), np.int32)
    padded[0, :len(seq)] = seq
    logits, h, base = full(jnp.asarray(padded), jnp.asarray([len(seq)], jnp.int32))
    first = np.asarray(jnp.argmax(logits[0], axis=-1))
    out = []
    for p in steps:
        d = int(first[p - 1])
        hh, c, ds = h[:, p - 1:p], base, [d]
        for k in range(1, K):
            lg, hh, c = step(c, hh, jnp.asarray([[d]], jnp.int32),
                             jnp.asarray([p + k - 1], jnp.int32))
            d = int(jnp.argmax(lg[0, 0]))
            ds.append(d)
        out.append(ds)
    return out


def _bigram_with_exact_head(tmp_path, family, variant):
    model = test_mtp._setup(tmp_path, family, variant)[1]
    for tree in (model.layers, model.mtp.layers):
        for _, v in nnx.iter_graph(tree):
            if isinstance(v, nnx.Param):
                v[...] = jnp.zeros_like(v[...])
    D = model.cfg.hidden_size
    head, final = model.mtp, model.norm_f if family == "nemotron_h" else model.norm
    proj, enorm, out = ((head.eh_proj, head.enorm, head.final_layernorm) if family == "nemotron_h"
                        else (head.fc, head.pre_fc_norm_embedding, head.norm))
    proj.kernel[...] = jnp.concatenate([jnp.eye(D), jnp.zeros((D, D))]).astype(proj.kernel.dtype)
    if proj.bias is not None:
        proj.bias[...] = jnp.zeros_like(proj.bias[...])
    unit = jnp.zeros_like if enorm.zero_centered else jnp.ones_like     # weight giving x 1
    enorm.weight[...] = unit(enorm.weight[...])
    out.weight[...] = final.weight[...]
    return model


@pytest.mark.parametrize("variant", ["qwen3_next"])     # Nemotron-H's head: the test below
def test_exact_head_accepts_every_draft(tmp_path, variant):
    model = _bigram_with_exact_head(tmp_path, FAMILY[variant], variant)
    reqs = lambda: [Request(prompt=[3, 9, 27, 81][:i + 1], max_new_tokens=n) for i, n in
                    enumerate([17, 4, 30])]
    want = [c.tokens for c in Engine(model, num_slots=2, max_len=64, window=4).generate(reqs())]
    K = 3
    out = Engine(model, num_slots=2, max_len=64, window=4, num_draft=K,
                 drafter="mtp").generate(reqs())
    assert [c.tokens for c in out] == want
    assert all(every_draft_accepted(c, K) for c in out)


@pytest.mark.parametrize("invariant", [True, False])
def test_mtp_speculative_matches_greedy(fixture, invariant):
    """Six requests through two slots: HF's greedy tokens, the plain engine's tokens for two
    extra prompts, and at every step the drafts of the from-scratch MTP reference. K = 1 on
    Nemotron-H, K = 3 on Qwen3-Next (a chained draft; the pairs repeat the same code paths).
    batch_invariant=False: rows are the running slots in order (row != slot), so the drafts
    kept per slot are gathered and scattered by slot."""
    model, _, prompts, want = fixture
    K = 1 if model.cfg.family == "nemotron_h" else 3
    order = [0, 1, 2, 2, 0, 1]
    lengths = [40, 7, 23, 30, 3, 20]
    extra = [prompts[0][::-1] + prompts[1], prompts[2][:5]]
    reqs = [Request(prompt=prompts[i], max_new_tokens=n) for i, n in zip(order, lengths)]
    reqs += [Request(prompt=p, max_new_tokens=25) for p in extra]
    eng = Engine(model, num_slots=2, max_len=128, window=4, num_draft=K, drafter="mtp",
                 batch_invariant=invariant)
    eng.record_drafts = True
    out = eng.generate(reqs)
    for c, i, n in zip(out, order, lengths):
        assert c.tokens == list(want[i, :n]) and c.finish_reason == "length"
    plain = Engine(model, num_slots=2, max_len=128, window=4, steps_per_visit=5).generate(
        [Request(prompt=p, max_new_tokens=25) for p in extra])
    assert [c.tokens for c in out[-2:]] == [c.tokens for c in plain]
    steps = drafts_total = hits = 0
    for r, c in zip(reqs, out):
        assert 0 <= c.accepted_drafts <= K * c.verify_steps and c.verify_steps == len(c.drafts)
        # only kept tokens count: each step kept its drafts and (unless cut) its own token
        assert c.accepted_drafts + c.verify_steps <= len(c.tokens)
        seq = [int(t) for t in r.prompt] + c.tokens
        ref = _reference_drafts(model, seq, [p for p, _ in c.drafts], K)
        got = [d for _, d in c.drafts]
        hits += sum(a == b for a, b in zip(got, ref))
        steps += len(got)
        drafts_total += c.accepted_drafts
    assert hits == steps, f"{steps - hits} of {steps} steps' drafts differ from the reference"
    print(f"K={K}: {drafts_total} drafts accepted over {steps} steps")


def test_mtp_sampling_top1_is_greedy(fixture):
    model, _, prompts, want = fixture
    eng = Engine(model, num_slots=2, max_len=128, window=4, num_draft=2, drafter="mtp")
    out = eng.generate([Request(prompt=prompts[1], max_new_tokens=12,
                                sampling=SamplingParams(temperature=1.0, top_k=1, seed=1)),
                        Request(prompt=prompts[0], max_new_tokens=9,
                                sampling=SamplingParams(temperature=0.7, seed=4))])
    assert out[0].tokens == list(want[1, :12]) and len(out[1].tokens) == 9


def test_mtp_drafter_needs_an_mtp_head(fixture):
    _, plain, _, _ = fixture
    with pytest.raises(ValueError, match="drafter='mtp' needs a model with an MTP head"):
        Engine(plain, window=4, num_draft=2, drafter="mtp")
    with pytest.raises(ValueError, match="drafter must be one of .*'draft', got 'eagle'"):
        Engine(plain, window=4, num_draft=2, drafter="eagle")


@pytest.mark.parametrize("exact", [False, True])
def test_speculative_steps_chained_on_device_match_one_per_visit(fixture, tmp_path, exact):
    """A device drafter runs up to steps_per_visit speculative steps per visit: each request
    gets what one step per visit gives it (tokens, finish reason, verify steps, accepted
    drafts, the drafts of every step and the logits), with stop ids and length limits reached
    mid-visit, greedy and seeded sampling. exact: the head whose drafts are all accepted, so a
    step emits K + 1 tokens and a stop id can land inside a window."""
    model, _, prompts, want = fixture
    if exact:
        if model.cfg.family != "qwen3_next":
            pytest.skip("the exact head is built for Qwen3-Next")
        model = _bigram_with_exact_head(tmp_path, "qwen", "qwen3_next")
    greedy = [c.tokens for c in Engine(model, num_slots=3, max_len=128, window=4).generate(
        [Request(prompt=p, max_new_tokens=20) for p in prompts[:3]])]
    stop = greedy[0][9]             # a token the first request emits mid-way

    def run(steps):
        eng = Engine(model, num_slots=3, max_len=128, window=4, num_draft=3, drafter="mtp",
                     steps_per_visit=steps, return_logits=True)
        eng.record_drafts = True
        out = eng.generate([
            Request(prompt=prompts[0], max_new_tokens=20, stop_ids=[stop]),
            Request(prompt=prompts[1], max_new_tokens=13),
            Request(prompt=prompts[2], max_new_tokens=17,
                    sampling=SamplingParams(temperature=0.8, seed=3)),
            Request(prompt=prompts[1][:4], max_new_tokens=6)])
        return out, [n for kind, n, _ in eng.visits if kind == "verify"]

    (one, visits1), (many, visits6) = run(1), run(6)
    assert set(visits1) == {1} and max(visits6) > 1
    assert one[0].finish_reason == "stop" and one[0].tokens[-1] == stop
    for a, b in zip(one, many):
        assert (a.tokens, a.finish_reason, a.verify_steps, a.accepted_drafts, a.drafts) == (
            b.tokens, b.finish_reason, b.verify_steps, b.accepted_drafts, b.drafts)
        np.testing.assert_array_equal(a.logits, b.logits)
    if exact:
        assert all(c.accepted_drafts > 0 for c in one)


def test_a_cut_step_counts_only_the_drafts_kept():
    """A visit's verify steps count over the tokens kept after a stop id or max_new_tokens:
    a cut step's kept tokens are all drafts, a dropped step does not count."""
    from replayjax.engine import _Entry
    e = _Entry(Request(prompt=[1], max_new_tokens=7), 0.0, frozenset(), tokens=[9] * 7)
    e.spec_steps = [(1, 4, (1, [9, 9, 9])), (5, 4, (5, [9, 9, 9])), (9, 4, (9, [9, 9, 9]))]
    e.count_steps()
    assert (e.verify_steps, e.accepted, [p for p, _ in e.drafts]) == (2, 3 + 2, [1, 5])
    assert not e.spec_steps
