"""Speculative decoding in standard SSM mode (the state-per-draft baseline), both families: verify
runs T standard steps writing every intermediate state into the slot's draft rows, commit copies
the last accepted one back. It must match replay-mode verify + commit and plain decode over the
accepted tokens step for step (random acceptance, a padding row on the null slot), and its
speculative greedy must be plain greedy."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from models.cache import SSMCache
from tests.models import hf_checks
from tests.models.hf_checks import batch, speculative_greedy

FAMILIES = ["nemotron_h", "qwen3_5"]
MODES = ("replay", "standard")
S, MAX_LEN, MAX_T = 6, 96, 4        # every cache has room for T = 4: shapes (compiles) shared
TOL = dict(rtol=1e-4, atol=1e-4)     # logits of std ~1


@functools.cache
def _load(variant):
    """One Runner per family for the module: its jitted steps compile once."""
    return hf_checks.load(variant)


@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("variant", FAMILIES)
def test_standard_verify_commit_equals_replay_and_plain_decode(variant, T):
    runner, ref = _load(variant)
    prompts, lens, slots = batch(ref)
    b, V = len(lens), ref["prefill_logits"].shape[-1]
    vslots = jnp.concatenate([slots, jnp.zeros((1,), jnp.int32)])   # + a padding row
    caches = {m: runner.init_cache(S, MAX_LEN, window=4, max_verify=MAX_T, ssm_mode=m)
              for m in MODES}
    plain = runner.init_cache(S, MAX_LEN, window=4, max_verify=MAX_T)
    for m in MODES:
        logits, caches[m] = runner.prefill(caches[m], prompts, lens, slots)
    logits, plain = runner.prefill(plain, prompts, lens, slots)
    last = np.asarray(jnp.argmax(logits[jnp.arange(b), lens - 1], -1))
    rng = np.random.default_rng(T)
    for _ in range(12):
        window = np.concatenate([last[:, None], rng.integers(3, V, (b, T - 1))], 1)
        window = np.concatenate([window, rng.integers(3, V, (1, T))]).astype(np.int32)
        n_acc = rng.integers(1, T + 1, b + 1).astype(np.int32)
        out = {}
        for m in MODES:
            lg, hid, caches[m] = runner.verify(caches[m], jnp.asarray(window), vslots, mode=m)
            caches[m] = runner.commit(caches[m], vslots, jnp.asarray(n_acc), T, mode=m)
            out[m] = np.asarray(lg)[:b], np.asarray(hid)[:b]
        np.testing.assert_allclose(out["standard"][0], out["replay"][0], **TOL)
        np.testing.assert_allclose(out["standard"][1], out["replay"][1], **TOL)
        std = out["standard"][0]
        for t in range(int(n_acc[:b].max())):          # plain decode over the accepted tokens
            live = n_acc[:b] > t
            lg, plain = runner.decode(plain, jnp.asarray(window[:b, t:t + 1]),
                                      jnp.where(jnp.asarray(live), slots, 0))
            np.testing.assert_allclose(std[live, t], np.asarray(lg)[live, 0], **TOL)
        last = std[np.arange(b), n_acc[:b] - 1].argmax(-1)
    std = caches["standard"]
    np.testing.assert_array_equal(std.lengths, plain.lengths)
    np.testing.assert_array_equal(std.counts, 0)                    # rings unused
    untouched = np.array([0, 2, 5])                                 # null + free slots
    groups = (untouched[:, None] * (1 + MAX_T) + np.arange(1 + MAX_T)).reshape(-1)
    rows = np.asarray(std.state_rows)                   # each slot's state in its own group
    assert ((rows // (1 + MAX_T)) == np.arange(S)).all() and (rows[untouched] ==
                                                              untouched * (1 + MAX_T)).all()
    for lc in std.layers:
        if isinstance(lc, SSMCache):
            assert lc.buffers.checkpoint.shape[0] == S * (1 + MAX_T) and lc.buffers.window == 1
            assert not np.asarray(lc.buffers.checkpoint[groups]).any()
            assert not np.asarray(lc.conv[untouched]).any()


@pytest.mark.parametrize("variant", FAMILIES)
def test_standard_speculative_greedy_equals_greedy(variant):
    runner, ref = _load(variant)
    prompts, lens, slots = batch(ref)
    n, T = 24, MAX_T
    want, _, _ = runner.greedy(runner.init_cache(S, MAX_LEN, window=4, max_verify=MAX_T),
                               prompts, lens, slots, n)
    want = np.asarray(want)
    np.testing.assert_array_equal(want, ref["greedy_tokens"][:, :n])
    # the shapes of the test above (a padding row included): its compiles are reused
    cache = runner.init_cache(S, MAX_LEN, window=4, max_verify=MAX_T, ssm_mode="standard")
    out, accepted_drafts = speculative_greedy(runner, cache, prompts, lens, slots, want, T,
                                              np.random.default_rng(1), pad_rows=1,
                                              mode="standard")
    np.testing.assert_array_equal(out, want)
    assert accepted_drafts > n // 2           # the drafts were really used


def test_bad_modes_and_missing_draft_room():
    runner, ref = _load("qwen3_5")
    window, slots = jnp.zeros((3, 4), jnp.int32), jnp.asarray([4, 1, 3], jnp.int32)
    with pytest.raises(ValueError, match="ssm_mode must be one of"):
        runner.init_cache(S, 16, ssm_mode="stanard")
    cache = runner.init_cache(S, 16, max_verify=4)                  # replay: no draft rows
    with pytest.raises(ValueError, match="needs 4 draft states per slot, the cache has 0"):
        runner.verify(cache, window, slots, mode="standard")
    with pytest.raises(ValueError, match="mode must be one of"):
        runner.verify(cache, window, slots, mode="bogus")
    with pytest.raises(ValueError, match="mode must be one of"):
        runner.commit(cache, slots, jnp.ones((3,), jnp.int32), 4, mode="bogus")
    small = runner.init_cache(S, 16, max_verify=2, ssm_mode="standard")
    with pytest.raises(ValueError, match="needs 4 draft states per slot, the cache has 2"):
        runner.verify(small, window, slots, mode="standard")
    with pytest.raises(ValueError, match="built with ssm_mode='standard'"):
        runner.decode(small, window[:, :1], slots, mode="replay")
