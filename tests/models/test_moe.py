"""MoE routing (`models.moe`) against numpy ports of the HF routers (transformers 5.24
NemotronHTopkRouter, Qwen3NextTopKRouter), ties going to the lowest expert index, the validity
mask the models hand their MoE layers (padding rows get no experts), and the shared expert in the
routed experts' launch against the family's MLP (one device, tensor and expert parallel)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from convert import load_hf
from models import moe, sharding
from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from pallas_kernels.ring import NULL_SLOT
from replayjax.bench.synthetic import random_model

FIXTURES = "tests/fixtures/hf"


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hf_sigmoid_router(x, gate, bias, k, n_group, topk_group, norm, scaling):
    """numpy float64 port of NemotronHTopkRouter.forward (expert ids sorted per row)."""
    s = _sigmoid(x @ gate.T)
    sel = s + bias
    grp = sel.reshape(len(x), n_group, -1)
    best = np.sort(grp, axis=-1)[..., -2:].sum(-1)
    keep = np.zeros_like(best, bool)
    np.put_along_axis(keep, np.argsort(-best, axis=-1, kind="stable")[:, :topk_group], True, -1)
    sel = np.where(np.repeat(keep, grp.shape[-1], axis=-1), sel, -np.inf)
    ids = np.sort(np.argsort(-sel, axis=-1, kind="stable")[:, :k], axis=-1)
    w = np.take_along_axis(s, ids, -1)
    if norm:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return ids, w * scaling


def hf_softmax_router(x, gate, k, norm):
    """numpy float64 port of Qwen3NextTopKRouter.forward (expert ids sorted per row)."""
    z = x @ gate.T
    p = np.exp(z - z.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    ids = np.sort(np.argsort(-p, axis=-1, kind="stable")[:, :k], axis=-1)
    w = np.take_along_axis(p, ids, -1)
    return ids, (w / w.sum(-1, keepdims=True)) if norm else w


def _sorted(ids, w):
    ids, w = np.asarray(ids), np.asarray(w)
    o = np.argsort(ids, axis=-1)
    return np.take_along_axis(ids, o, -1), np.take_along_axis(w, o, -1)


@pytest.mark.parametrize("n_group,topk_group,norm,scaling,impl", [
    (1, 1, True, 2.5, "xla"), (1, 1, True, 2.5, "pallas"), (1, 1, False, 1.5, "pallas"),
    (4, 2, True, 1.0, "xla"), (4, 1, False, 1.5, "xla")])
def test_sigmoid_router_matches_hf(n_group, topk_group, norm, scaling, impl):
    """impl "pallas": the router kernel (interpret mode on CPU); group-limited is XLA only."""
    rng = np.random.default_rng(0)
    x, gate = rng.standard_normal((16, 24)), rng.standard_normal((16, 24)) * 0.3
    bias = rng.standard_normal(16) * 0.1
    ids, w = moe.sigmoid_topk(jnp.asarray(x, jnp.float32), jnp.asarray(gate, jnp.float32),
                              jnp.asarray(bias, jnp.float32), top_k=3, n_group=n_group,
                              topk_group=topk_group, norm_topk_prob=norm, scaling=scaling,
                              impl=impl)
    assert ids.dtype == jnp.int32 and w.dtype == jnp.float32 and ids.shape == (16, 3)
    want_ids, want_w = hf_sigmoid_router(
        np.asarray(jnp.asarray(x, jnp.float32), np.float64),
        np.asarray(jnp.asarray(gate, jnp.float32), np.float64),
        np.asarray(jnp.asarray(bias, jnp.float32), np.float64), 3, n_group, topk_group, norm,
        scaling)
    ids, w = _sorted(ids, w)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("norm", [True, False])
def test_softmax_router_matches_hf(norm, impl):
    rng = np.random.default_rng(1)
    x, gate = rng.standard_normal((16, 24)), rng.standard_normal((8, 24)) * 0.3
    ids, w = moe.softmax_topk(jnp.asarray(x, jnp.float32), jnp.asarray(gate, jnp.float32),
                              top_k=2, norm_topk_prob=norm, impl=impl)
    want_ids, want_w = hf_softmax_router(np.asarray(jnp.asarray(x, jnp.float32), np.float64),
                                         np.asarray(jnp.asarray(gate, jnp.float32), np.float64),
                                         2, norm)
    ids, w = _sorted(ids, w)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=5e-6)    # fp32 softmax (GPU exp: 1.2e-6 seen)


def test_ties_go_to_the_lowest_index():
    """x = 0 makes every score equal: the lowest expert indices win. With groups of two and
    biased selection scores [.5 .5 | .5 .5 | .75 .25 | .25 .25], groups 0, 1 and 2 tie on
    their top-2 sum (1.0): exactly topk_group = 2 groups are kept (0 and 1), so expert 4 (the
    best single score) is not eligible."""
    x = jnp.zeros((2, 4), jnp.float32)
    ids, w = moe.softmax_topk(x, jnp.ones((8, 4), jnp.float32), top_k=3, norm_topk_prob=False)
    np.testing.assert_array_equal(ids, [[0, 1, 2]] * 2)
    np.testing.assert_allclose(w, 1 / 8)
    bias = jnp.asarray([0, 0, 0, 0, 0.25, -0.25, -0.25, -0.25], jnp.float32)
    ids, w = moe.sigmoid_topk(x, jnp.ones((8, 4), jnp.float32), bias, top_k=1, n_group=4,
                              topk_group=2, scaling=2.0)
    np.testing.assert_array_equal(ids, [[0]] * 2)
    np.testing.assert_allclose(w, 2.0)
    ids, _ = moe.sigmoid_topk(x, jnp.ones((8, 4), jnp.float32), bias, top_k=3, n_group=4,
                              topk_group=2)
    np.testing.assert_array_equal(ids, [[0, 1, 2]] * 2)


@pytest.fixture
def seen_valid(monkeypatch):
    """Records the `valid` mask of every routed-expert call (inside jit: a debug callback)."""
    seen, inner = [], moe.moe_ops.expert_ffn

    def spy(*args, valid=None, **kw):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), valid, ordered=True)
        return inner(*args, valid=valid, **kw)

    monkeypatch.setattr(moe.moe_ops, "expert_ffn", spy)
    return seen


def _expect(seen, n_layers, want):
    assert len(seen) == n_layers
    for v in seen:
        np.testing.assert_array_equal(v, np.asarray(want).reshape(-1))
    seen.clear()


def test_models_hand_padding_rows_to_the_moe_as_invalid(seen_valid):
    """Prefill: null-slot rows and positions past a prompt's length; decode and verify: null-slot
    rows. Nemotron-H with latent MoE layers (loaded fixture), jitted steps."""
    d = f"{FIXTURES}/nemotron_h_latent_moe"
    _, model = load_hf(d, dtype=jnp.float32)
    n_moe = model.cfg.layer_kinds.count("moe")
    slots = jnp.asarray([4, NULL_SLOT, 3], jnp.int32)
    cache = model.init_cache(6, 16, window=4, max_verify=3)
    lengths = jnp.asarray([2, 4, 3], jnp.int32)
    runner = Runner(model)
    _, cache = runner.prefill(cache, jnp.ones((3, 4), jnp.int32), lengths, slots)
    _expect(seen_valid, n_moe, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]])
    _, cache = runner.decode(cache, jnp.ones((3, 1), jnp.int32), slots)
    _expect(seen_valid, n_moe, [[1], [0], [1]])
    jax.block_until_ready(runner.verify(cache, jnp.ones((3, 3), jnp.int32), slots))
    _expect(seen_valid, n_moe, [[1] * 3, [0] * 3, [1] * 3])


def test_qwen_and_its_mtp_head_hand_padding_rows_to_the_moe_as_invalid(seen_valid):
    model = QwenHybrid(load_config(f"{FIXTURES}/qwen3_next"), mtp=True)   # zero weights
    slots = jnp.asarray([NULL_SLOT, 2], jnp.int32)
    cache = model.init_cache(4, 16, window=4)
    _, hidden, cache = Runner(model).prefill_hidden(cache, jnp.ones((2, 3), jnp.int32),
                                                    jnp.asarray([3, 1], jnp.int32), slots)
    _expect(seen_valid, len(model.layers), [[0, 0, 0], [1, 0, 0]])
    jax.block_until_ready(jax.jit(model.draft)(cache, hidden, jnp.ones((2, 3), jnp.int32),
                                               slots, jnp.zeros((2,), jnp.int32)))
    _expect(seen_valid, 1, [[0, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize("variant,tp,experts", [
    ("nemotron_h", 1, "width"), ("qwen3_5_moe", 1, "width"), ("nemotron_h", 2, "width"),
    ("qwen3_5_moe", 2, "width"), ("qwen3_5_moe", 2, "experts")])
def test_shared_expert_in_the_routed_launch(variant, tp, experts, monkeypatch):
    """A fixture's config with the shared expert 2 F wide, random fp32 weights: with
    `models.moe.shared_chunks`' rule made to hold on CPU (the XLA implementation of the
    same routing), every MoE call takes the shared expert's C = 2 (tp 2, experts split: 1)
    chunks as experts, and prefill and decode logits of the real rows equal the family's
    MLP's within 1e-5 (relative); at tp = 2 the shared expert is split on its width."""
    cfg = load_config(f"{FIXTURES}/{variant}")
    field = ("moe_shared_expert_intermediate_size" if variant == "nemotron_h"
             else "shared_expert_intermediate_size")
    cfg = dataclasses.replace(cfg, **{field: 2 * cfg.moe_intermediate_size})
    model = random_model(cfg, jnp.float32, seed=3, experts=experts,
                         mesh=sharding.make_mesh(tp) if tp > 1 else None)
    tokens = jnp.asarray([[5, 9, 2, 7], [3, 3, 3, 3], [11, 4, 8, 1]], jnp.int32)
    lengths, slots = jnp.asarray([4, 4, 2], jnp.int32), jnp.asarray([4, NULL_SLOT, 3], jnp.int32)

    def logits():
        runner = Runner(model)
        cache = runner.init_cache(6, 16, window=4)
        prefill, cache = runner.prefill(cache, tokens, lengths, slots)
        decode, _ = runner.decode(cache, tokens[:, :1], slots)
        prefill = np.asarray(prefill)           # the real positions only
        return prefill[0], prefill[2, :2], np.asarray(decode)[[0, 2]]

    want = logits()
    joined, inner = [], moe.moe_ops.expert_ffn

    def spy(*args, shared=None, **kw):
        joined.append(None if shared is None else shared.w_up.shape[1] // args[3].shape[2])
        return inner(*args, shared=shared, **kw)

    monkeypatch.setattr(moe.moe_ops, "expert_ffn", spy)
    monkeypatch.setattr(moe, "resolve_impl", lambda impl: "pallas_triton")
    monkeypatch.setattr(moe, "SHARED_IN_LAUNCH_MAX_TOKENS", 12)
    got = logits()
    # (the runner also traces the step outside shard_map, on global shapes: C = 2)
    assert None not in joined and (1 if experts == "experts" else 2) in joined
    for g, w in zip(got, want):
        assert np.linalg.norm(g - w) <= 1e-5 * np.linalg.norm(w)


def test_shared_chunks_rule(monkeypatch):
    """On a GPU up to SHARED_IN_LAUNCH_MAX_TOKENS tokens when the width divides (Fs / F chunks);
    never on CPU unless forced."""
    x = jnp.zeros((2, 4, 8))
    monkeypatch.setattr(moe, "resolve_impl", lambda impl: "xla")          # a CPU
    assert moe.shared_chunks(x, 16, 32) == 0
    assert moe.shared_chunks(x, 16, 48, force=True) == 3
    monkeypatch.setattr(moe, "resolve_impl", lambda impl: "pallas_triton")
    limit = moe.SHARED_IN_LAUNCH_MAX_TOKENS
    assert moe.shared_chunks(jnp.zeros((limit, 8)), 16, 32) == 2
    assert moe.shared_chunks(jnp.zeros((limit + 1, 8)), 16, 32) == 0
    assert moe.shared_chunks(x, 16, 24) == 0
    assert moe.shared_chunks(x, 16, 32, force=False) == 0
