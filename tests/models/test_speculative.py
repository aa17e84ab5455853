"""Speculative decoding at the model level, both families: verify windows of T = 4 (the last
token + 3 drafts, a third of them corrupted), greedy acceptance per row, commit. The emitted
tokens must be HF's greedy tokens exactly, so the rollback of rings, conv states and KV lengths is
exact; the GDN window's corrected updates go through the Pallas WY/UT verify kernel too."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.hf_checks import load, speculative_greedy

_runner = load


@pytest.mark.parametrize("variant,impl", [("nemotron_h", "xla"), ("nemotron_h", "pallas"),
                                          ("qwen3_next", "xla"), ("qwen3_next", "pallas"),
                                          ("qwen3_5_moe", "xla")])
def test_speculative_greedy_equals_hf_greedy(variant, impl):
    runner, ref = _runner(variant)
    prompts, lens = jnp.asarray(ref["prompts"]), jnp.asarray(ref["prompt_lens"])
    slots = jnp.asarray([4, 1, 3], jnp.int32)
    want = ref["greedy_tokens"]
    n = want.shape[1]
    T = 4
    cache = runner.init_cache(6, 96, window=4, max_verify=T)
    out, accepted_drafts = speculative_greedy(runner, cache, prompts, lens, slots, want, T,
                                              np.random.default_rng(0), impl=impl)
    np.testing.assert_array_equal(out, want)
    assert accepted_drafts > n          # the drafts were really used


def test_verify_needs_room_in_the_cache():
    runner, ref = _runner("qwen3_next")
    cache = runner.init_cache(6, 96, window=4)              # max_verify = 1
    with pytest.raises(ValueError, match=r"verify window T = 4 needs a cache with verify "
                       r"buffers; this one was built with max_verify = 1"):
        runner.verify(cache, jnp.zeros((3, 4), jnp.int32), jnp.asarray([4, 1, 3], jnp.int32))
