"""Bad input to the model-level API (models.validation), both families: HybridLM's prefill /
decode / verify / commit, Runner's entry points, init_cache and model construction. Each case
is a one-line ValueError / TypeError naming the argument (never NaN logits, a deep JAX error or a
silent clip). Value checks run on concrete arrays only: under jit they are skipped, shape checks
still run.

The errors are raised before any compute, so the cases are cheap; the fixture models are the HF
fixtures (vocab 128)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from convert import load_hf
from models import validation
from models.runner import Runner

FAMILIES = ["nemotron_h", "qwen3_next"]
V = 128                                          # the fixtures' vocab_size
S, MAX_LEN = 4, 16
TOKENS = np.array([[1, 2, 3, 4], [5, 6, 7, 0]], np.int32)
LENGTHS = np.array([4, 3], np.int32)
SLOTS = np.array([1, 2], np.int32)


@functools.cache
def _model(variant):
    cfg, model = load_hf(f"tests/fixtures/hf/{variant}")
    assert cfg.vocab_size == V
    return model


@functools.cache
def _runner(variant):
    return Runner(_model(variant))


def _cache(variant, max_verify=1, ssm_mode="replay", held=None):
    """A cache of S slots; held {slot: tokens} sets slots' lengths (no compute)."""
    cache = _model(variant).init_cache(S, MAX_LEN, window=4, max_verify=max_verify,
                                       ssm_mode=ssm_mode)
    for slot, n in (held or {}).items():
        cache = cache.replace(lengths=cache.lengths.at[slot].set(n))
    return cache


def _set(a, index, value):
    a = np.array(a)
    a[index] = value
    return a


# ----------------------------------------------------------------------------- prefill

# id, overrides of (tokens, lengths, slots, starts), error, message
PREFILL_ERRORS = [
    ("id-vocab", dict(tokens=_set(TOKENS, (0, 0), V)), ValueError,
     r"^tokens\[0, 0\] = 128 is not a token id: ids must be in \[0, 128\)"),
    ("id-negative", dict(tokens=_set(TOKENS, (1, 2), -1)), ValueError,
     r"^tokens\[1, 2\] = -1 is not a token id"),
    ("id-padding", dict(tokens=_set(TOKENS, (1, 3), 500)), ValueError,   # past lengths too
     r"^tokens\[1, 3\] = 500 is not a token id"),
    ("tokens-float", dict(tokens=TOKENS.astype(np.float32)), TypeError,
     r"^tokens must have an integer dtype, got float32$"),
    ("tokens-bool", dict(tokens=TOKENS > 2), TypeError, r"^tokens must have an integer dtype"),
    ("tokens-rank1", dict(tokens=TOKENS[0]), ValueError,
     r"^tokens must be \[batch, T\] of token ids, got shape \(4,\)$"),
    ("tokens-list", dict(tokens=TOKENS.tolist()), TypeError,
     r"^tokens must be an array \[batch, T\] of token ids \(jax or numpy\), got list$"),
    ("batch-0", dict(tokens=TOKENS[:0], lengths=LENGTHS[:0], slots=SLOTS[:0]), ValueError,
     r"^tokens has batch 0; need at least one row"),
    ("T-0", dict(tokens=TOKENS[:, :0]), ValueError, r"^tokens has T = 0 tokens per row"),
    ("lengths-size", dict(lengths=LENGTHS[:1]), ValueError,
     r"^lengths has shape \(1,\), expected \(2,\) \(one per row of tokens\)$"),
    ("lengths-float", dict(lengths=LENGTHS.astype(np.float32)), TypeError,
     r"^lengths must have an integer dtype"),
    ("slots-size", dict(slots=np.array([1, 2, 3], np.int32)), ValueError,
     r"^slots has shape \(3,\), expected \(2,\)"),
    ("slots-rank", dict(slots=SLOTS[:, None]), ValueError, r"^slots must be \[batch\]"),
    ("starts-size", dict(starts=np.zeros(3, np.int32)), ValueError,
     r"^starts has shape \(3,\), expected \(2,\)"),
    ("length-past-T", dict(lengths=np.array([9, 3], np.int32)), ValueError,
     r"^lengths\[0\] = 9 must be in \[1, T = 4\]"),
    ("length-0", dict(lengths=np.array([4, 0], np.int32)), ValueError,
     r"^lengths\[1\] = 0 must be in \[1, T = 4\]"),
    ("slot-past-pool", dict(slots=np.array([1, S], np.int32)), ValueError,
     r"^slots\[1\] = 4 is outside the cache's pool \[0, 4\)$"),
    ("slot-negative", dict(slots=np.array([-1, 2], np.int32)), ValueError,
     r"^slots\[0\] = -1 is outside the cache's pool"),
    ("slot-twice", dict(slots=np.array([2, 2], np.int32)), ValueError,
     r"^slots name slot 2 twice"),
    ("past-max_len", dict(tokens=np.ones((2, 20), np.int32), lengths=np.array([20, 3], np.int32)),
     ValueError, r"^row 0 \(slot 1\): the prefill takes the slot from 0 to 20 tokens, past the "
                 r"cache's max_len = 16$"),
    ("starts-past-max_len", dict(starts=np.array([0, 14], np.int32)), ValueError,
     r"^row 1 \(slot 2\): the prefill takes the slot from 14 to 17 tokens, past the cache's "
     r"max_len = 16$"),
    ("starts-negative", dict(starts=np.array([-2, 0], np.int32)), ValueError,
     r"^starts\[0\] = -2 must be >= 0$"),
]


@pytest.mark.parametrize("variant", FAMILIES)
@pytest.mark.parametrize("over, error, match", [c[1:] for c in PREFILL_ERRORS],
                         ids=[c[0] for c in PREFILL_ERRORS])
def test_prefill_errors(variant, over, error, match):
    a = dict(tokens=TOKENS, lengths=LENGTHS, slots=SLOTS, starts=None) | over
    with pytest.raises(error, match=match):
        _model(variant).prefill_from(_cache(variant), a["tokens"], a["lengths"], a["slots"],
                                     a["starts"])


def test_prefill_accepts_padding_rows():
    """Rows on the null slot (any number of them, length 0) are padding: not checked for
    lengths, distinctness or room (check only: no compute)."""
    cache = _cache("nemotron_h", held={1: MAX_LEN})
    validation.check_prefill(_model("nemotron_h"), cache, np.zeros((3, 4), np.int32),
                             np.array([4, 0, 0], np.int32), np.array([1, 0, 0], np.int32))
    validation.check_window(_model("nemotron_h"), _cache("nemotron_h"), np.zeros((3, 1),
                            np.int32), np.array([2, 0, 0], np.int32), "replay", "decode")


# ----------------------------------------------------------------------------- decode / verify

# id, method, tokens, slots, cache kwargs, error, message
WINDOW_ERRORS = [
    ("decode-id", "decode", [[V], [4]], SLOTS, {}, ValueError,
     r"^tokens\[0, 0\] = 128 is not a token id"),
    ("decode-T2", "decode", [[1, 2], [3, 4]], SLOTS, {}, ValueError,
     r"^decode takes one token per row, tokens \[batch, 1\]; got shape \(2, 2\)"),
    ("decode-rank", "decode", [1, 2], SLOTS, {}, ValueError,
     r"^tokens must be \[batch, T\]"),
    ("decode-float", "decode", np.ones((2, 1), np.float32), SLOTS, {}, TypeError,
     r"^tokens must have an integer dtype"),
    ("decode-slots", "decode", [[1], [2]], SLOTS[:1], {}, ValueError,
     r"^slots has shape \(1,\), expected \(2,\)"),
    ("decode-slot-pool", "decode", [[1], [2]], [1, 7], {}, ValueError,
     r"^slots\[1\] = 7 is outside the cache's pool \[0, 4\)"),
    ("decode-full", "decode", [[1], [2]], SLOTS, dict(held={2: MAX_LEN}), ValueError,
     r"^row 1 \(slot 2\): a decode step takes the slot from 16 to 17 tokens, past the cache's "
     r"max_len = 16$"),
    ("decode-mode", "decode", [[1], [2]], SLOTS, {}, "mode", r"^mode must be one of"),
    ("verify-id", "verify", np.full((2, 2), 500), SLOTS, dict(max_verify=4), ValueError,
     r"^tokens\[0, 0\] = 500 is not a token id"),
    ("verify-T0", "verify", np.ones((2, 0), np.int32), SLOTS, dict(max_verify=4), ValueError,
     r"^tokens has T = 0"),
    ("verify-no-buffers", "verify", np.ones((2, 2), np.int32), SLOTS, {}, ValueError,
     r"^verify window T = 2 needs a cache with verify buffers; this one was built with "
     r"max_verify = 1: build it with init_cache\(\.\.\., max_verify=2\)$"),
    ("verify-past-room", "verify", np.ones((2, 4), np.int32), SLOTS, dict(max_verify=2),
     ValueError, r"^verify window T = 4 exceeds the cache's max_verify \(2\); build the cache "
                 r"with init_cache\(\.\.\., max_verify=4\)$"),
    ("verify-standard-drafts", "verify", np.ones((2, 4), np.int32), SLOTS,
     dict(max_verify=4), "standard", r"^standard-mode verify of T = 4 needs 4 draft states"),
    ("verify-full", "verify", np.ones((2, 3), np.int32), SLOTS,
     dict(max_verify=4, held={1: 14}), ValueError,
     r"^row 0 \(slot 1\): a verify window of T = 3 takes the slot from 14 to 17 tokens"),
]


@pytest.mark.parametrize("variant", FAMILIES)
@pytest.mark.parametrize("method, tokens, slots, cache_kw, error, match",
                         [c[1:] for c in WINDOW_ERRORS], ids=[c[0] for c in WINDOW_ERRORS])
def test_decode_verify_errors(variant, method, tokens, slots, cache_kw, error, match):
    model = _model(variant)
    mode = {"mode": "bogus", "standard": "standard"}.get(error, "replay")
    error = ValueError if isinstance(error, str) else error
    tokens = tokens if isinstance(tokens, np.ndarray) else np.array(tokens, np.int32)
    with pytest.raises(error, match=match):
        getattr(model, method)(_cache(variant, **cache_kw), jnp.asarray(tokens),
                               jnp.asarray(slots, jnp.int32), mode=mode)


# ----------------------------------------------------------------------------- commit

COMMIT_ERRORS = [
    ("no-buffers", 1, [1, 1], 2, ValueError,
     r"^commit window_len = 2 needs a cache with verify buffers; this one was built with "
     r"max_verify = 1"),
    ("past-room", 4, [1, 1], 5, ValueError,
     r"^commit window_len = 5 exceeds the cache's max_verify \(4\)"),
    ("window_len-0", 4, [1, 1], 0, ValueError, r"^window_len must be an integer >= 1 .*got 0$"),
    ("window_len-float", 4, [1, 1], 2.0, ValueError,
     r"^window_len must be an integer >= 1 .*got 2\.0$"),
    ("n-float", 4, np.array([1.0, 1.0], np.float32), 2, TypeError,
     r"^n_accepted must have an integer dtype, got float32$"),
    ("n-size", 4, [1], 2, ValueError, r"^n_accepted has shape \(1,\), expected \(2,\)"),
    ("n-past-window", 4, [3, 1], 2, ValueError,
     r"^n_accepted\[0\] = 3 must be in \[1, window_len = 2\]$"),
    ("n-0", 4, [1, 0], 2, ValueError, r"^n_accepted\[1\] = 0 must be in \[1, window_len = 2\]$"),
]


@pytest.mark.parametrize("variant", FAMILIES)
@pytest.mark.parametrize("max_verify, n_accepted, window_len, error, match",
                         [c[1:] for c in COMMIT_ERRORS], ids=[c[0] for c in COMMIT_ERRORS])
def test_commit_errors(variant, max_verify, n_accepted, window_len, error, match):
    n = n_accepted if isinstance(n_accepted, np.ndarray) else np.array(n_accepted, np.int32)
    with pytest.raises(error, match=match):
        _model(variant).commit(_cache(variant, max_verify=max_verify), jnp.asarray(SLOTS),
                               jnp.asarray(n), window_len)


# ----------------------------------------------------------------------------- every entry point

BAD_ID = r"^tokens\[0, 0\] = 128 is not a token id"
ENTRY_POINTS = {
    "model.prefill": lambda m, r, c: m.prefill(c, TOKENS_BAD, LENGTHS, SLOTS),
    "model.prefill_hidden": lambda m, r, c: m.prefill_hidden(c, TOKENS_BAD, LENGTHS, SLOTS),
    "runner.prefill": lambda m, r, c: r.prefill(c, TOKENS_BAD, LENGTHS, SLOTS, last_only=True),
    "runner.prefill_hidden": lambda m, r, c: r.prefill_hidden(c, TOKENS_BAD, LENGTHS, SLOTS),
    "model.decode": lambda m, r, c: m.decode(c, TOKENS_BAD[:, :1], SLOTS),
    "model.decode_hidden": lambda m, r, c: m.decode_hidden(c, TOKENS_BAD[:, :1], SLOTS),
    "runner.decode": lambda m, r, c: r.decode(c, TOKENS_BAD[:, :1], SLOTS),
    "model.verify": lambda m, r, c: m.verify(c, TOKENS_BAD[:, :2], SLOTS),
    "model.verify_hidden": lambda m, r, c: m.verify_hidden(c, TOKENS_BAD[:, :2], SLOTS),
    "runner.verify": lambda m, r, c: r.verify(c, TOKENS_BAD[:, :2], SLOTS),
    "runner.greedy": lambda m, r, c: r.greedy(c, TOKENS_BAD, LENGTHS, SLOTS, 2),
}
TOKENS_BAD = jnp.asarray(_set(TOKENS, (0, 0), V))


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_checks_values(entry):
    """Runner's methods check before their jitted step (where only shapes could be)."""
    variant = "qwen3_next"
    cache = _runner(variant).init_cache(S, MAX_LEN, window=4, max_verify=2)
    with pytest.raises(ValueError, match=BAD_ID):
        ENTRY_POINTS[entry](_model(variant), _runner(variant), cache)


RUNNER_ERRORS = [
    ("greedy-num_tokens", lambda r, c: r.greedy(c, TOKENS, LENGTHS, SLOTS, -1),
     r"^num_tokens must be an integer >= 1, got -1$"),
    ("greedy-num_tokens-0", lambda r, c: r.greedy(c, TOKENS, LENGTHS, SLOTS, 0),
     r"^num_tokens must be an integer >= 1, got 0$"),
    ("greedy-room", lambda r, c: r.greedy(c, TOKENS, LENGTHS, SLOTS, 13),
     r"^row 0 \(slot 1\): greedy decoding of 13 tokens after the prompt takes the slot from 4 to "
     r"17 tokens, past the cache's max_len = 16$"),
    ("greedy-mode", lambda r, c: r.greedy(c, TOKENS, LENGTHS, SLOTS, 2, mode="x"),
     r"^mode must be one of"),
    ("commit-window_len", lambda r, c: r.commit(c, SLOTS, np.ones(2, np.int32), 3),
     r"^commit window_len = 3 exceeds the cache's max_verify \(2\)"),
    ("commit-n", lambda r, c: r.commit(c, SLOTS, np.array([1, 5], np.int32), 2),
     r"^n_accepted\[1\] = 5 must be in \[1, window_len = 2\]"),
]


@pytest.mark.parametrize("call, match", [c[1:] for c in RUNNER_ERRORS],
                         ids=[c[0] for c in RUNNER_ERRORS])
def test_runner_errors(call, match):
    runner = _runner("nemotron_h")
    with pytest.raises(ValueError, match=match):
        call(runner, runner.init_cache(S, MAX_LEN, window=4, max_verify=2))


def test_under_jit_only_shapes_are_checked():
    """Inside a jitted step (the engine's) the arrays are tracers: value checks are skipped
    (nothing is read back), shape checks still raise while tracing."""
    runner = _runner("nemotron_h")
    step = runner.jit(lambda ms, cache, t, s: ms[0].decode(cache, t, s))
    cache = runner.init_cache(S, MAX_LEN, window=4)
    logits, cache = step(cache, jnp.asarray([[V], [4]], jnp.int32), jnp.asarray(SLOTS))
    assert logits.shape == (2, 1, V)                            # an unchecked id: no error
    with pytest.raises(ValueError, match=r"^tokens must be \[batch, T\]"):
        step(cache, jnp.asarray([V, 4], jnp.int32), jnp.asarray(SLOTS))


# ----------------------------------------------------------------------------- init_cache

CACHE_ERRORS = [
    (dict(num_slots=0), r"^num_slots must be >= 2 \(the null slot 0 plus at least one sequence "
                        r"slot\), got 0$"),
    (dict(num_slots=1), r"^num_slots must be >= 2"),
    (dict(num_slots=2.5), r"^num_slots must be an integer, got 2\.5$"),
    (dict(max_len=0), r"^max_len must be >= 1, got 0$"),
    (dict(max_len=-1), r"^max_len must be >= 1, got -1$"),
    (dict(max_len="16"), r"^max_len must be an integer, got '16'$"),
    (dict(window=3), r"^window must be a power of two in \[1, 64\] \(the ReplaySSM ring length "
                     r"L\), got 3$"),
    (dict(window=0), r"^window must be a power of two in \[1, 64\]"),
    (dict(window=128), r"^window must be a power of two in \[1, 64\]"),
    (dict(window=4.0), r"^window must be a power of two in \[1, 64\].*got 4\.0$"),
    (dict(max_verify=0), r"^max_verify must be an integer in \[1, 4\]"),
    (dict(max_verify=5), r"^max_verify must be an integer in \[1, 4\] .*window = 4\), got 5$"),
    (dict(max_verify=9, ssm_mode="standard"), r"^max_verify must be an integer in \[1, 8\]"),
    (dict(ssm_mode="stanard"), r"^ssm_mode must be one of"),
    (dict(state_dtype=jnp.float16), r"^state_dtype must be one of float32, bfloat16, got "
                                    r"float16$"),
    (dict(state_dtype=jnp.int32), r"^state_dtype must be one of float32, bfloat16, got int32$"),
    (dict(state_dtype="bogus"), r"^state_dtype must be one of float32, bfloat16, got 'bogus'$"),
    (dict(ring_dtype=jnp.int8), r"^ring_dtype must be one of float32, bfloat16, float16, got "
                                r"int8$"),
    (dict(kv_dtype="bogus"), r"^kv_dtype must be one of float32, bfloat16 .*got 'bogus'$"),
    (dict(kv_dtype=jnp.float16), r"^kv_dtype must be one of float32, bfloat16 .*got float16$"),
]


@pytest.mark.parametrize("variant", FAMILIES)
@pytest.mark.parametrize("kw, match", CACHE_ERRORS, ids=[str(k) for k, _ in CACHE_ERRORS])
def test_init_cache_errors(variant, kw, match):
    a = dict(num_slots=S, max_len=MAX_LEN, window=4) | kw
    with pytest.raises(ValueError, match=match):
        _model(variant).init_cache(a.pop("num_slots"), a.pop("max_len"), **a)


@pytest.mark.parametrize("variant", FAMILIES)
def test_init_cache_limits_accepted(variant):
    """The edges of the rules build: 2 slots, 1 position, window 64 / 1, max_verify 8 in standard
    mode whatever the window, bf16 state and KV."""
    model = _model(variant)
    for kw in (dict(window=64, max_verify=8), dict(window=1), dict(window=1, max_verify=8,
               ssm_mode="standard"), dict(state_dtype="bfloat16", kv_dtype=jnp.bfloat16)):
        jax.eval_shape(lambda kw=kw: model.init_cache(2, 1, **kw))


# ----------------------------------------------------------------------------- construction

@pytest.mark.parametrize("variant", FAMILIES)
@pytest.mark.parametrize("dtype, got", [(jnp.int32, "int32"), (np.int8, "int8"),
                                        (jnp.float64, "float64"), ("bogus", "'bogus'"),
                                        (None, "float64"), (bool, "bool")])
def test_model_dtype_errors(variant, dtype, got):
    model = _model(variant)
    with pytest.raises(ValueError, match=rf"^dtype must be one of float32, bfloat16, float16 "
                                         rf"\(the model's parameter dtype\), got {got}$"):
        type(model)(model.cfg, dtype=dtype)
