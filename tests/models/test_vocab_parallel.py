"""The vocab-parallel LM head at tp = 2 and 4 (4 CPU devices, tests/conftest.py): the head's
columns split over the devices, `gather_vocab` / `vocab_argmax` equal to the single-device
logits and argmax (exact ties across shards: the lowest id), the engine's decode loop and
speculative steps (their all-greedy paths gather no logits) and sampled rows giving tp = 1's
tokens, a tied head replicated."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from models import sharding
from models.config import load_config
from models.parallel import gather_vocab, vocab_argmax
from models.runner import Runner
from replayjax.bench.synthetic import random_model
from replayjax.engine import Engine, Request
from replayjax.sampling import SamplingParams
from tests.models.test_tp import _devices, _dir, _model, _ref, oracle_prompts

V = 16


def _tie_logits():
    """[8, V] fp32 whose argmax rows test the shard bookkeeping: random rows, a maximum in the
    last column, exact ties across shards (at tp = 4, 4 ids per shard) and inside one, a
    constant row and a NaN."""
    x = np.random.default_rng(0).normal(size=(8, V)).astype(np.float32)
    x[1, 15] = 9                                # the last id of the last shard
    x[2, [13, 5]] = 9                           # tie across shards 3 and 1: 5
    x[3, [2, 3, 9]] = 9                         # tie inside shard 0 and with shard 2: 2
    x[4, [12, 8]] = 9                           # tie across shards 3 and 2 (not 0): 8
    x[5] = 1                                    # all equal: 0
    x[6, [6, 11]] = np.nan                      # the first NaN, as jnp.argmax
    return jnp.asarray(x)


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_argmax_and_gather_equal_the_whole_vocabulary(tp):
    x = _tie_logits()
    mesh = sharding.make_mesh(tp)
    run = lambda f: jax.jit(jax.shard_map(lambda z: f(z, V), mesh=mesh, in_specs=P(None, "tp"),
                                          out_specs=P(), check_vma=False))(x)
    want = jnp.argmax(x, axis=-1)
    assert want[2:7].tolist() == [5, 2, 8, 0, 6]
    np.testing.assert_array_equal(run(vocab_argmax), want)
    np.testing.assert_array_equal(run(gather_vocab), x)
    # outside shard_map (tp = 1) both are the single-device identity
    np.testing.assert_array_equal(vocab_argmax(x, V), want)
    assert gather_vocab(x, V) is x


@pytest.mark.parametrize("variant,tp", [("nemotron_h", 2), ("qwen3_next", 4)])
def test_head_is_vocab_parallel(variant, tp):
    """Loaded onto the mesh (load_hf) or placed by shard_model: each device holds V / tp of
    the head's columns."""
    model = _model(variant, 2) if tp == 2 else sharding.shard_model(_model(variant),
                                                                   sharding.make_mesh(tp))
    k = model.lm_head.kernel.get_value()
    assert k.sharding.spec == P(None, "tp")
    assert {s.data.shape for s in k.addressable_shards} == {(k.shape[0], k.shape[1] // tp)}


@pytest.mark.parametrize("variant,tp", [("nemotron_h", 2), ("qwen3_5", 4)])
def test_greedy_decode_loop_equals_single_device(variant, tp):
    """The engine's plain decode loop (all-greedy rows, no logits kept: the (max, argmax)
    path) gives HF's greedy tokens, as tp = 1 does."""
    ref = _ref(variant)
    prompts = [ref["prompts"][i, :n].tolist() for i, n in enumerate(ref["prompt_lens"])]
    engine = Engine(_model(variant), mesh=sharding.make_mesh(tp), num_slots=4, max_len=64,
                    window=4)
    out = engine.generate([Request(prompt=p, max_new_tokens=20) for p in prompts])
    assert [c.tokens for c in out] == ref["greedy_tokens"][:, :20].tolist()


@pytest.mark.parametrize("variant,tp,drafter", [("nemotron_h", 4, "oracle"),
                                                ("qwen3_5", 2, "draft")])
def test_greedy_speculation_equals_single_device(variant, tp, drafter, monkeypatch):
    """Speculative steps without kept logits (verify accepts against `vocab_argmax`; a draft
    model chains its drafts with it): HF's greedy tokens. The oracle's drafts are partly
    wrong; the draft model is the target itself."""
    ref, prompts = oracle_prompts(variant, tp, monkeypatch)
    engine = Engine(_model(variant), mesh=sharding.make_mesh(tp), num_slots=4, max_len=64,
                    window=4, num_draft=3, drafter=drafter,
                    draft_model=_model(variant) if drafter == "draft" else None)
    out = engine.generate([Request(prompt=p, max_new_tokens=20) for p in prompts])
    assert [c.tokens for c in out] == ref["greedy_tokens"][:, :20].tolist()
    assert all(c.accepted_drafts > 0 for c in out)


@pytest.mark.devices(2)
def test_sampled_rows_equal_single_device():
    """A batch mixing sampled rows (temperature, top-k, top-p; fixed seeds) with a greedy
    one: the same tokens at tp = 2 and 4 as at tp = 1 (the sampled path gathers the logits)."""
    ref = _ref("qwen3_next")
    prompts = [ref["prompts"][i, :n].tolist() for i, n in enumerate(ref["prompt_lens"])]
    params = [SamplingParams(temperature=1.0, seed=7), SamplingParams(),
              SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3)]
    reqs = lambda: [Request(prompt=p, max_new_tokens=16, sampling=s)
                    for p, s in zip(prompts, params)]
    tokens = {}
    for tp in (1, 2, 4):
        _devices(tp)
        mesh = sharding.make_mesh(tp) if tp > 1 else None
        engine = Engine(_model("qwen3_next"), mesh=mesh, num_slots=4, max_len=64, window=4)
        tokens[tp] = [c.tokens for c in engine.generate(reqs())]
    assert tokens[2] == tokens[1] and tokens[4] == tokens[1]
    assert tokens[1][1] == ref["greedy_tokens"][1, :16].tolist()
    assert tokens[1][0] != ref["greedy_tokens"][0, :16].tolist()       # really sampled


@pytest.mark.devices(2)
def test_tied_head_stays_replicated():
    """A tied Qwen head (logits from the embedding) is not split: no lm_head param, the
    embedding replicated, greedy tokens at tp = 2 equal tp = 1's."""
    cfg = dataclasses.replace(load_config(_dir("qwen3_5")), tie_word_embeddings=True)
    one = random_model(cfg, jnp.float32, seed=1)
    two = random_model(cfg, jnp.float32, seed=1, mesh=sharding.make_mesh(2))
    assert two.lm_head is None
    assert two.embed_tokens.get_value().sharding.spec == P()
    prompts = jnp.asarray([[3, 5, 7, 9], [11, 2, 0, 0]], jnp.int32)
    lens, slots = jnp.asarray([4, 2], jnp.int32), jnp.asarray([1, 2], jnp.int32)
    toks = [r.greedy(r.init_cache(3, 32, window=4), prompts, lens, slots, 6)[0]
            for r in (Runner(one), Runner(two))]
    np.testing.assert_array_equal(toks[1], toks[0])
