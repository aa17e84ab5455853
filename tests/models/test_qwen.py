"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE against Hugging Face transformers 5.24 (tests/fixtures/hf,
fp32): prefill logits for a ragged batch, teacher-forced decode logits in both SSM modes, 40 greedy
tokens, replay == standard, the GDN layers through the Pallas kernels, loader checks.

Tolerance: 1e-4 absolute on logits of std ~1 (HF fp32 vs fp64 differ by up to 3.5e-5 here)."""

import numpy as np
import pytest

from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from models.weights import WeightsError, load_qwen_hybrid, read_safetensors
from tests.models.hf_checks import (check_greedy, check_pallas_greedy,
                                   check_prefill_and_forced)

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


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


def test_prefill_and_teacher_forced_decode(loaded):
    check_prefill_and_forced(*loaded)


def test_greedy_matches_hf_and_replay_equals_standard(loaded):
    check_greedy(*loaded)


def test_pallas_kernels_inside_the_model():
    """The GDN layers through the Pallas kernels (interpret mode on CPU) give HF's greedy tokens
    too, in both modes (Qwen3-Next: the interleaved layout, Hv = 2 Hk, MoE)."""
    check_pallas_greedy(*_load("qwen3_next"))


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
