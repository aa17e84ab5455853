"""MoE routing (`pallas_kernels.moe.route`): the Pallas kernel (interpret mode on CPU) against
the XLA routers (the models' math, checked against Hugging Face in tests/models/test_moe.py).

Ids must be equal (order included: best first, ties to the lowest index) and weights within
1e-6 relative: the kernel's logits are exact float32 products and sums in another order than
XLA's einsum, a few ulps apart, and a weight's relative error is about its logits' absolute
one. Logits here are ~N(0, 1) as in a trained router (gate ~ N(0, 1 / D)); D stays small so the
XLA reference's own float32 error stays well under 1e-6 (at D = 2048 it is ~1.6e-6 on CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import dispatch, moe
from pallas_kernels.moe import router

F32, BF16 = jnp.float32, jnp.bfloat16


def problem(seed, n, D, E, bias_scale=0.1, dtype=F32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, D)), dtype)
    gate = jnp.asarray(rng.standard_normal((E, D)) / np.sqrt(D), F32)
    bias = jnp.asarray(rng.standard_normal(E) * bias_scale, F32)
    return x, gate, bias


def both(x, gate, bias, interpret, tiling=None, **kw):
    """(XLA, Pallas) routings of the same call."""
    return (moe.route(x, gate, bias, impl="xla", **kw),
            moe.route(x, gate, bias, impl="pallas", interpret=interpret, tiling=tiling, **kw))


FUSED = moe.RouterTiling(4096, 4, logits="kernel")      # the logits in the launch
XLA_LOGITS = moe.RouterTiling(4096, 4, logits="xla")


def assert_same(want, got, rtol=1e-6):
    (want_ids, want_w), (ids, w) = want, got
    assert ids.dtype == jnp.int32 and w.dtype == F32 and ids.shape == want_ids.shape
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=rtol, atol=0)


SIGMOID = dict(score="sigmoid", norm_topk_prob=True, scaling=2.5)       # Nemotron-3-Nano
SOFTMAX = dict(score="softmax", norm_topk_prob=True)                     # Qwen


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
@pytest.mark.parametrize("n,D,E,k", [(3, 64, 32, 6), (8, 48, 128, 6), (2, 64, 512, 10),
                                     (4, 32, 16, 1), (2, 32, 16, 16)])
@pytest.mark.parametrize("kw,with_bias", [
    (SIGMOID, True), (dict(SIGMOID, norm_topk_prob=False), True), (SOFTMAX, False),
    (dict(SOFTMAX, norm_topk_prob=False), False), (SOFTMAX, True)])
def test_matches_xla(n, D, E, k, kw, with_bias, tiling, interpret):
    x, gate, bias = problem(n * E + k, n, D, E)
    assert_same(*both(x, gate, bias if with_bias else None, interpret, tiling, top_k=k, **kw))


def test_default_tiling(interpret):
    """tiling None is `router.TILING`."""
    x, gate, bias = problem(9, 3, 64, 128)
    assert_same(*both(x, gate, bias, interpret, top_k=8, **SIGMOID))


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
def test_bfloat16_tokens(tiling, interpret):
    x, gate, bias = problem(5, 4, 64, 128, dtype=BF16)
    assert_same(*both(x, gate, bias, interpret, tiling, top_k=6, **SIGMOID))


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
@pytest.mark.parametrize("kw", [SIGMOID, SOFTMAX])
def test_ties_go_to_the_lowest_index(kw, tiling, interpret):
    """Equal gate rows give bitwise-equal scores: experts 9, 3 and 12 share the best row, 5 and
    1 the next (the others score far lower); x = 0 makes every score equal. Both paths pick
    them lowest index first."""
    _, gate, _ = problem(3, 2, 32, 16)
    v = jnp.full((32,), 5 / 32, F32)
    gate = (gate * 0.1).at[jnp.array([9, 3, 12])].set(v).at[jnp.array([5, 1])].set(v / 2)
    x = jnp.ones((2, 32), F32)
    want, got = both(x, gate, None, interpret, tiling, top_k=5, **kw)
    assert_same(want, got)
    np.testing.assert_array_equal(got[0], [[3, 9, 12, 1, 5]] * 2)
    zero, got = both(jnp.zeros_like(x), gate, None, interpret, tiling, top_k=4, **kw)
    assert_same(zero, got)
    np.testing.assert_array_equal(got[0], [[0, 1, 2, 3]] * 2)


def test_a_highest_index_tie_rule_fails_the_tie_test(interpret, monkeypatch):
    """The tie test catches a kernel that breaks ties toward the highest index."""
    monkeypatch.setattr(router, "_first_max",
                        lambda v, index: (jnp.max(v),
                                          jnp.max(jnp.where(v == jnp.max(v), index, -1))))
    router._route.clear_cache()
    try:
        with pytest.raises(AssertionError):
            test_ties_go_to_the_lowest_index(SOFTMAX, FUSED, interpret)
    finally:
        monkeypatch.undo()
        router._route.clear_cache()


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
def test_bias_selects_but_never_weighs(tiling, interpret):
    """A bias of 1 on the expert with the lowest score makes it the first choice; its weight is
    still its unbiased sigmoid score (times scaling, without normalisation)."""
    x, gate, _ = problem(4, 3, 64, 32)
    plain = moe.route(x, gate, jnp.zeros(32, F32), top_k=4, score="sigmoid",
                      norm_topk_prob=False, impl="xla")
    s = jax.nn.sigmoid(jnp.dot(x, gate.T, precision="highest"))   # (GPU default: TF32)
    worst = int(jnp.argmin(s[0]))
    bias = jnp.zeros(32, F32).at[worst].set(1.0)
    want, got = both(x, gate, bias, interpret, tiling, top_k=4, score="sigmoid",
                     norm_topk_prob=False, scaling=2.0)
    assert_same(want, got)
    assert got[0][0, 0] == worst and worst not in np.asarray(plain[0][0])
    np.testing.assert_allclose(got[1][0, 0], 2.0 * s[0, worst], rtol=1e-6)


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
@pytest.mark.parametrize("kw,with_bias,C,gate_dtype", [
    (SIGMOID, True, 2, None),            # Nemotron-3-Nano: two chunks, weight 1
    (SOFTMAX, False, 1, F32),            # Qwen: one chunk, weighted by its gate
    (SOFTMAX, False, 3, F32)])
def test_shared_chunks_follow_the_routed_experts(kw, with_bias, C, gate_dtype, tiling,
                                                 interpret):
    """shared_chunks C: the routed columns are unchanged (not renormalised, not scaled over the
    shared ones) and C columns follow, ids E ... E + C - 1, weight 1 or sigmoid(x . g)."""
    n, D, E, k = 3, 96, 32, 4
    x, gate, bias = problem(C, n, D, E)
    g = None if gate_dtype is None else jnp.asarray(
        np.random.default_rng(C).standard_normal(D) / np.sqrt(D), gate_dtype)
    bias = bias if with_bias else None
    plain = moe.route(x, gate, bias, top_k=k, impl="xla", **kw)
    want, got = both(x, gate, bias, interpret, tiling, top_k=k, shared_chunks=C,
                     shared_gate=g, **kw)
    assert_same(want, got)
    ids, w = (np.asarray(a) for a in got)
    assert ids.shape == (n, k + C)
    np.testing.assert_array_equal(ids[:, :k], plain[0])
    np.testing.assert_array_equal(ids[:, k:], np.broadcast_to(E + np.arange(C), (n, C)))
    np.testing.assert_allclose(w[:, :k], plain[1], rtol=1e-6)
    scale = (np.ones(n) if g is None
             else 1 / (1 + np.exp(-np.asarray(x, np.float64) @ np.asarray(g, np.float64))))
    np.testing.assert_allclose(w[:, k:], np.broadcast_to(scale[:, None], (n, C)), rtol=1e-6)


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
def test_a_bfloat16_shared_gate_rounds_as_the_models_linear(tiling, interpret):
    """A bf16 gate (a bf16 model's shared_expert_gate): the scale is the bf16 Linear's rounded
    logit through a float32 sigmoid rounded to bf16 (as torch computes a bf16 sigmoid); the
    kernel's own float32 sum may land one bf16 ulp away where it meets a rounding boundary."""
    n, D, E = 16, 256, 32
    x, gate, _ = problem(11, n, D, E, dtype=BF16)
    g = jnp.asarray(np.random.default_rng(12).standard_normal(D) / 4, BF16)
    want, got = both(x, gate, None, interpret, tiling, top_k=2, shared_chunks=1,
                     shared_gate=g, **SOFTMAX)
    np.testing.assert_array_equal(got[0], want[0])
    z = np.asarray(x @ g[:, None], np.float32)[:, 0]           # XLA's bf16 Linear
    linear = np.asarray(jnp.asarray(1 / (1 + np.exp(-z.astype(np.float64))), BF16), np.float32)
    np.testing.assert_array_equal(want[1][:, 2], linear)
    scale = np.asarray(got[1][:, 2])
    np.testing.assert_allclose(scale, linear, rtol=2 ** -8, atol=0)
    np.testing.assert_array_equal(scale, np.asarray(jnp.asarray(scale, BF16), np.float32))
    assert np.mean(scale == linear) >= 0.75         # one ulp only at a boundary


@pytest.mark.parametrize("impl,gpu,n,E,k,n_group,want", [
    ("auto", True, 1, 128, 6, 1, "pallas_triton"),
    ("auto", True, router.MAX_TOKENS, 512, 10, 1, "pallas_triton"),
    ("auto", True, router.MAX_TOKENS + 1, 128, 6, 1, "xla"),
    ("auto", True, 1, 128, 6, 4, "xla"),                 # group-limited: XLA
    ("auto", True, 1, 96, 6, 1, "xla"),                  # E not a power of two
    ("auto", True, 1, 128, router.MAX_TOP_K + 1, 1, "xla"),
    ("auto", False, 1, 128, 6, 1, "xla"),                # CPU: unchanged
    ("pallas", True, 64, 128, 6, 1, "pallas_triton"),
    ("xla", True, 1, 128, 6, 1, "xla")])
def test_auto_takes_the_kernel_for_a_decode_step_on_a_gpu(impl, gpu, n, E, k, n_group, want,
                                                          monkeypatch):
    monkeypatch.setattr(dispatch, "on_gpu", lambda: gpu)
    assert router.pick_backend(impl, n, E, k, n_group) == want


def test_auto_can_be_turned_off(monkeypatch):
    """`router.AUTO = False` keeps XLA's routing in "auto"; an explicit "pallas" still runs."""
    monkeypatch.setattr(dispatch, "on_gpu", lambda: True)
    monkeypatch.setattr(router, "AUTO", False)
    assert router.pick_backend("auto", 1, 128, 6) == "xla"
    assert router.pick_backend("pallas", 1, 128, 6) == "pallas_triton"


@pytest.mark.parametrize("change,match", [
    (dict(score="relu"), "score must be one of"),
    (dict(gate=jnp.zeros((16, 32), BF16)), "gate has dtype bfloat16"),
    (dict(gate=jnp.zeros((16, 24), F32)), r"gate has shape \(16, 24\), expected \(16, 32\)"),
    (dict(bias=jnp.zeros((8,), F32)), r"bias has shape \(8,\), expected \(16,\)"),
    (dict(top_k=17), r"top_k = 17 must be in \[1, 16\]"),
    (dict(n_group=3), "n_group = 3 must divide the expert count E = 16"),
    (dict(n_group=4, topk_group=2, impl="xla", top_k=9), r"top_k = 9 must be in \[1, 8\]"),
    (dict(n_group=4, topk_group=2), r"group-limited routing \(n_group = 4\) has no Pallas"),
    (dict(gate=jnp.zeros((12, 32), F32), bias=None), "power-of-two expert count, got E = 12"),
    (dict(gate=jnp.zeros((32, 32), F32), bias=None, top_k=17), "takes top_k <= 16, got 17"),
    (dict(tiling=moe.RouterTiling(8, 4, logits="kernel")),
     "tile_elems = 8 must be a power of two >= E = 16"),
    (dict(tiling=moe.RouterTiling(4096, 4, logits="dot")), "logits must be one of"),
    (dict(tiling=moe.RouterTiling(4096, 3)), "^num_warps = 3 must be a power of two$"),
    (dict(tiling=moe.RouterTiling(4096, 4, num_stages=0)), "^num_stages = 0 must be >= 1$"),
    (dict(x=jnp.zeros((0, 32), F32)), r"^x has shape \(0, 32\): every dimension must be >= 1"),
    (dict(x=jnp.zeros((0, 32), F32), impl="xla"), r"^x has shape \(0, 32\)"),
    (dict(shared_chunks=-1), r"^shared_chunks = -1 must be an integer >= 0$"),
    (dict(shared_chunks=1.5), r"^shared_chunks = 1.5 must be an integer >= 0$"),
    (dict(shared_gate=jnp.zeros((32,), F32)), "shared_gate needs shared_chunks >= 1"),
    (dict(shared_chunks=1, shared_gate=jnp.zeros((16,), F32)),
     r"shared_gate has shape \(16,\), expected \(32,\)"),
    (dict(shared_chunks=1, shared_gate=jnp.zeros((32,), jnp.int32)), "shared_gate has dtype"),
])
def test_bad_input_is_named(change, match):
    kw = dict(x=jnp.zeros((2, 32), F32), gate=jnp.zeros((16, 32), F32),
              bias=jnp.zeros((16,), F32), top_k=4, score="sigmoid", impl="pallas")
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        moe.route(**kw)


@pytest.mark.parametrize("tiling", [FUSED, XLA_LOGITS], ids=["fused", "xla_logits"])
@pytest.mark.parametrize("n", [1, router.MAX_TOKENS])
@pytest.mark.parametrize("D,E,k,score", [(2688, 128, 6, "sigmoid"),     # Nemotron-3-Nano
                                         (2048, 256, 8, "softmax"),     # Qwen3.5-35B-A3B
                                         (2048, 512, 10, "softmax")])   # Qwen3-Next-80B-A3B
@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared"])
def test_triton_lowering_at_model_shapes(n, D, E, k, score, tiling, shared, monkeypatch):
    """bf16 tokens: the kernel lowers to Triton for sm90 without a GPU (every primitive in it
    has a Triton lowering; only the PTX compile needs the GPU); shared: with the models' shared
    columns (Nemotron-3-Nano's 2 chunks, Qwen's one with its bf16 gate)."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: type("Info", (), {"compute_capability": "9.0"}))
    sds = jax.ShapeDtypeStruct
    bias = sds((E,), F32) if score == "sigmoid" else None
    chunks = (2 if score == "sigmoid" else 1) if shared else 0
    g = sds((D,), BF16) if shared and score == "softmax" else None

    def fn(x, gate, bias, g):
        return moe.route(x, gate, bias, top_k=k, score=score, scaling=2.5, impl="pallas",
                         shared_chunks=chunks, shared_gate=g, tiling=tiling, interpret=False)
    hlo = jax.jit(fn).trace(sds((n, D), BF16), sds((E, D), F32), bias, g).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "triton" in hlo.lower()
