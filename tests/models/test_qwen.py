"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE against Hugging Face transformers 5.24 (tests/fixtures/hf,
fp32): prefill logits for a ragged batch, teacher-forced decode logits in both SSM modes, 40 greedy
tokens, replay == standard, the GDN layers through the Pallas kernels, loader checks.

Tolerance: 1e-4 absolute on logits of std ~1 (HF fp32 vs fp64 differ by up to 3.5e-5 here)."""

import jax.numpy as jnp
import numpy as np
import pytest

from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from models.weights import WeightsError, load_qwen_hybrid, read_safetensors

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]
ATOL = 1e-4


def _model(variant, tensors=None):
    d = f"{FIXTURES}/{variant}"
    model = QwenHybrid(load_config(d))
    load_qwen_hybrid(model, read_safetensors(d) if tensors is None else tensors)
    return model


def _load(variant):
    return Runner(_model(variant)), dict(np.load(f"{FIXTURES}/{variant}/reference.npz"))


@pytest.fixture(scope="module", params=VARIANTS)
def loaded(request):
    return _load(request.param)


def _batch(ref):
    prompts, lens = jnp.asarray(ref["prompts"]), jnp.asarray(ref["prompt_lens"])
    slots = jnp.asarray([4, 1, 3][:len(lens)], jnp.int32)       # not in order, not contiguous
    return prompts, lens, slots


def test_prefill_and_teacher_forced_decode(loaded):
    runner, ref = loaded
    prompts, lens, slots = _batch(ref)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        logits, cache = runner.prefill(cache, prompts, lens, slots)
        for i, n in enumerate(np.asarray(lens)):
            np.testing.assert_allclose(logits[i, :n], ref["prefill_logits"][i, :n], atol=ATOL)
        forced = ref["forced_tokens"]
        for t in range(forced.shape[1]):          # 8 steps at L = 4: two folds per row
            logits, cache = runner.decode(cache, jnp.asarray(forced[:, t:t + 1]), slots, mode=mode)
            np.testing.assert_allclose(logits[:, 0], ref["forced_logits"][:, t], atol=ATOL)


def test_greedy_matches_hf_and_replay_equals_standard(loaded):
    runner, ref = loaded
    prompts, lens, slots = _batch(ref)
    n = ref["greedy_tokens"].shape[1]
    out = {}
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)          # 40 tokens = 10 fold cycles
        toks, lgs, _ = runner.greedy(cache, prompts, lens, slots, n, mode=mode)
        np.testing.assert_array_equal(toks, ref["greedy_tokens"])
        np.testing.assert_allclose(lgs, ref["greedy_logits"], atol=ATOL)
        out[mode] = toks
    np.testing.assert_array_equal(out["replay"], out["standard"])


def test_pallas_kernels_inside_the_model():
    """The GDN layers through the Pallas kernels (interpret mode on CPU) give HF's greedy tokens
    too, in both modes (Qwen3-Next: the interleaved layout, Hv = 2 Hk, MoE)."""
    runner, ref = _load("qwen3_next")
    prompts, lens, slots = _batch(ref)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        toks, _, _ = runner.greedy(cache, prompts, lens, slots, 12, mode=mode, impl="pallas")
        np.testing.assert_array_equal(toks, ref["greedy_tokens"][:, :12])


def test_fused_experts_load_like_per_expert():
    """Qwen3.5-MoE checkpoints may ship fused experts.gate_up_proj [E, 2F, D] (gate rows first)
    and experts.down_proj [E, D, F]; they load to the same weights as the per-expert form."""
    d = f"{FIXTURES}/qwen3_5_moe"
    tensors = read_safetensors(d)
    fused = dict(tensors)
    E = load_config(d).num_experts
    for i in range(4):
        mp = f"model.language_model.layers.{i}.mlp.experts"
        per = lambda name: np.stack([fused.pop(f"{mp}.{e}.{name}.weight") for e in range(E)])
        gate, up, down = per("gate_proj"), per("up_proj"), per("down_proj")
        fused[f"{mp}.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        fused[f"{mp}.down_proj"] = down
    a, b = _model("qwen3_5_moe", tensors).layers[0].mlp, _model("qwen3_5_moe", fused).layers[0].mlp
    for attr in ("gate_w", "up", "down"):
        np.testing.assert_array_equal(getattr(a, attr)[...], getattr(b, attr)[...])


def test_checkpoint_mismatches_are_named():
    d = f"{FIXTURES}/qwen3_5"
    tensors = read_safetensors(d)
    model = QwenHybrid(load_config(d))
    name = "model.language_model.layers.0.linear_attn.A_log"
    with pytest.raises(WeightsError, match=rf"{name}: expected shape \(4,\)"):
        load_qwen_hybrid(model, dict(tensors, **{name: np.zeros(5, np.float32)}))
    missing = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    with pytest.raises(WeightsError, match="missing tensor lm_head.weight"):
        load_qwen_hybrid(model, missing)
    with pytest.raises(WeightsError, match="unused tensors"):
        load_qwen_hybrid(model, dict(tensors, extra=np.zeros(1, np.float32)))
    # Qwen3-Next: the interleaved projections are checked under their own names.
    d = f"{FIXTURES}/qwen3_next"
    tensors = read_safetensors(d)
    name = "model.layers.1.linear_attn.in_proj_ba.weight"
    with pytest.raises(WeightsError, match=rf"{name}: expected shape \(8, 32\)"):
        load_qwen_hybrid(QwenHybrid(load_config(d)), dict(tensors, **{name: np.zeros((4, 32))}))
