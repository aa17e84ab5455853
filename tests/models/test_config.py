"""models.config: HF config.json parsing, legacy aliases, derived sizes, errors, round trip.

Dims are those of the models' public config.json files and Megatron-Bridge recipes.
"""

import copy
import dataclasses
import json
import math
import pathlib

import pytest

from models.config import (
    SUPPORTED_MODEL_TYPES,
    ConfigError,
    NemotronHConfig,
    QwenHybridConfig,
    config_from_dict,
    load_config,
    parse_config,
)

# ----------------------------------------------------------------------------- inline configs

NEMOTRON_H_8B = {  # Nemotron-H-8B-Base-8K, remote-code era field names
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4096,
    "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attention_head_dim": 128,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "layer_norm_epsilon": 1e-5,
    "rope_theta": 10000,  # present but unused (no RoPE)
    "time_step_limit": [0.0, "Infinity"],
    "tie_word_embeddings": False,
    "residual_in_fp32": False,
}

NEMOTRON_NANO_9B_V2 = {  # NVIDIA-Nemotron-Nano-9B-v2: P = 80, head_dim != hidden/heads
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4480,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 15680,
    "mamba_num_heads": 128,
    "mamba_head_dim": 80,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "layer_norm_epsilon": 1e-5,
    "mamba_ssm_cache_dtype": "float32",
}

NEMOTRON_3_NANO_30B = {  # NVIDIA-Nemotron-3-Nano-30B-A3B (MoE), transformers 5.x list form
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 2688,
    "num_hidden_layers": 52,
    "layers_block_type": [
        {"M": "linear_attention", "E": "moe", "*": "full_attention"}[c]
        for c in "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    ],
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856,
    "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 3712,
    "moe_latent_size": None,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 0,
    "mtp_layers_block_type": ["full_attention", "moe"],
    "max_position_embeddings": 262144,
    "time_step_limit": [0.0, {"__float__": "Infinity"}],
    "layer_norm_epsilon": 1e-5,
}

QWEN3_NEXT_80B = {  # Qwen3-Next-80B-A3B-Instruct
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "rope_scaling": None,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 5120,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_QWEN35_GDN = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
               "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}

QWEN35_9B = {  # Qwen3.5-9B (dense), multimodal wrapper
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152},
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 * 8,  # fixed below
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "rope_parameters": _QWEN35_ROPE,
        **_QWEN35_GDN,
        "intermediate_size": 12288,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "tie_word_embeddings": False,
    },
}
QWEN35_9B["text_config"]["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
QWEN35_9B["text_config"]["layer_types"] *= 8

QWEN35_35B_A3B = {  # Qwen3.5-35B-A3B (MoE), multimodal wrapper, no norm_topk_prob field
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": 248320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "rope_parameters": _QWEN35_ROPE,
        **_QWEN35_GDN,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "rms_norm_eps": 1e-6,
        "mtp_num_hidden_layers": 1,
    },
}


def _with(cfg, path, value):
    """Deep copy of cfg with cfg[path...] = value (value _DEL removes the key)."""
    out = copy.deepcopy(cfg)
    *parents, last = path.split(".")
    d = out
    for p in parents:
        d = d[p]
    if value is _DEL:
        del d[last]
    else:
        d[last] = value
    return out


_DEL = object()

# ----------------------------------------------------------------------------- Nemotron-H


def test_nemotron_h_8b():
    c = parse_config(NEMOTRON_H_8B)
    assert isinstance(c, NemotronHConfig) and c.family == "nemotron_h"
    assert c.num_hidden_layers == 52
    assert c.layers_of("mamba") == tuple(i for i in range(52) if c.layer_kinds[i] == "mamba")
    assert (c.layer_kinds.count("mamba"), c.layer_kinds.count("attention"),
            c.layer_kinds.count("mlp")) == (24, 4, 24)
    assert c.layer_kinds[:5] == ("mamba", "mlp", "mamba", "mlp", "mamba")
    assert c.hybrid_override_pattern == NEMOTRON_H_8B["hybrid_override_pattern"]
    assert c.head_dim == 128  # from legacy attention_head_dim
    assert c.mamba_intermediate_size == 8192
    assert c.mamba_conv_dim == 8192 + 2 * 8 * 128
    assert c.mamba_in_proj_dim == 2 * 8192 + 2 * 8 * 128 + 128
    assert c.time_step_limit == (0.0, math.inf)
    assert c.intermediate_size == 21504 and c.n_routed_experts == 0
    assert c.num_mtp_layers == 0 and c.mtp_layer_kinds == ()
    assert c.weight_prefix == "backbone." and not c.tie_word_embeddings


def test_nemotron_nano_9b_v2_head_dim_80():
    c = parse_config(NEMOTRON_NANO_9B_V2)
    assert c.num_hidden_layers == 56
    assert (c.layer_kinds.count("mamba"), c.layer_kinds.count("attention"),
            c.layer_kinds.count("mlp")) == (27, 4, 25)
    # I = H * P = 10240 (mamba_num_heads x mamba_head_dim), not expand * hidden = 8960
    assert c.mamba_intermediate_size == 10240 != 2 * c.hidden_size
    assert (c.mamba_in_proj_dim, c.mamba_conv_dim) == (22656, 12288)
    assert c.head_dim == 128 != c.hidden_size // c.num_attention_heads


def test_nemotron_3_nano_moe():
    c = parse_config(NEMOTRON_3_NANO_30B)
    assert c.num_hidden_layers == 52
    assert c.hybrid_override_pattern == "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert (c.layer_kinds.count("mamba"), c.layer_kinds.count("attention"),
            c.layer_kinds.count("moe")) == (23, 6, 23)
    assert (c.mamba_in_proj_dim, c.mamba_conv_dim,
            c.mamba_intermediate_size) == (10304, 6144, 4096)
    assert (c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 6, 1856)
    assert (c.n_shared_experts, c.moe_shared_expert_intermediate_size) == (1, 3712)
    assert c.routed_scaling_factor == 2.5 and c.norm_topk_prob and c.moe_latent_size is None
    assert c.moe_expert_input_size == 2688
    assert (c.num_key_value_heads, c.max_position_embeddings) == (2, 262144)
    assert c.num_mtp_layers == 0 and c.mtp_layer_kinds == ()  # listed MTP kinds ignored at depth 0


def test_nemotron_mtp_and_latent():
    c = parse_config(_with(_with(NEMOTRON_3_NANO_30B, "num_nextn_predict_layers", 1),
                           "moe_latent_size", 1024))
    assert c.num_mtp_layers == 1 and c.mtp_layer_kinds == ("attention", "moe")
    assert c.moe_expert_input_size == 1024
    d = _with(_with(NEMOTRON_3_NANO_30B, "num_nextn_predict_layers", 1),
              "mtp_layers_block_type", _DEL)
    assert parse_config(_with(d, "mtp_hybrid_override_pattern", "*E*E")).mtp_layer_kinds == (
        "attention", "moe", "attention", "moe")
    assert parse_config(d).mtp_layer_kinds == ("attention", "moe")  # HF default


def test_nemotron_legacy_names():
    legacy = {
        "model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 32,
        # pre-5.x names (TRL tiny config)
        "layers_block_type": ["mamba", "attention", "mlp", "moe"],
        "num_attention_heads": 4, "attention_head_dim": 8,  # num_key_value_heads absent -> heads
        "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 16,
        "mamba_n_groups": 2, "mamba_d_conv": 3, "mamba_conv_bias": False, "mamba_chunk_size": 64,
        "mamba_dt_min": 0.002, "mamba_dt_max": 0.2, "mamba_dt_init_floor": 1e-3,
        "mamba_dt_limit": [0.0, "inf"], "norm_eps": 1e-6,
        "intermediate_size": [48, 48],  # vLLM per-layer list, all equal
        "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "moe_shared_expert_intermediate_size": 24,
        "mamba_proj_bias": True,
    }
    c = parse_config(legacy)
    assert c.layer_kinds == ("mamba", "attention", "mlp", "moe")
    assert (c.n_groups, c.conv_kernel, c.use_conv_bias, c.chunk_size) == (2, 3, False, 64)
    assert (c.time_step_min, c.time_step_max, c.time_step_floor) == (0.002, 0.2, 1e-3)
    assert c.time_step_limit == (0.0, math.inf) and c.layer_norm_epsilon == 1e-6
    assert (c.num_key_value_heads, c.head_dim, c.intermediate_size,
            c.n_routed_experts) == (4, 8, 48, 4)
    assert c.use_bias and c.n_shared_experts == 1
    # the modern names and the pattern string give the same config
    modern = {k: v for k, v in legacy.items() if not k.startswith("mamba_") or k in (
        "mamba_num_heads", "mamba_head_dim")}
    modern.update(hybrid_override_pattern="M*-E", n_groups=2, conv_kernel=3, use_conv_bias=False,
                  chunk_size=64, time_step_min=0.002, time_step_max=0.2, time_step_floor=1e-3,
                  use_bias=True, layer_norm_epsilon=1e-6, head_dim=8, n_routed_experts=4)
    for k in ("layers_block_type", "norm_eps", "attention_head_dim", "num_local_experts"):
        modern.pop(k)
    assert parse_config(modern) == c


# ----------------------------------------------------------------------------- Qwen


def test_qwen3_next_80b():
    c = parse_config(QWEN3_NEXT_80B)
    assert isinstance(c, QwenHybridConfig) and c.family == "qwen3_next" and not c.multimodal
    assert c.num_hidden_layers == 48 and c.layers_of("attention") == tuple(range(3, 48, 4))
    assert c.gdn_layout == "interleaved" and c.weight_prefix == "model."
    assert (c.rope_theta, c.rotary_dim, c.mrope_section) == (1e7, 64, None)
    assert (c.gdn_key_dim, c.gdn_value_dim, c.gdn_conv_dim,
            c.gdn_heads_ratio) == (2048, 4096, 8192, 2)
    assert c.ffn_kinds == ("moe",) * 48 and c.mtp_ffn_kind == "moe"
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
            c.shared_expert_intermediate_size, c.intermediate_size) == (512, 10, 512, 512, 5120)
    assert c.num_mtp_layers == 0  # not declared; vLLM assumes 1 for qwen3_next
    assert parse_config(_with(QWEN3_NEXT_80B, "num_nextn_predict_layers", 1)).num_mtp_layers == 1


def test_qwen3_next_dense_layers_and_sparse_step():
    c = parse_config(_with(_with(QWEN3_NEXT_80B, "mlp_only_layers", [0, 5]),
                           "decoder_sparse_step", 2))
    assert c.ffn_kinds[:6] == ("mlp", "moe", "mlp", "moe", "mlp", "mlp")


def test_qwen3_next_dense():
    d = {k: v for k, v in QWEN3_NEXT_80B.items() if k not in (
        "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")}
    c = parse_config(_with(d, "num_experts", 0))
    assert c.ffn_kinds == ("mlp",) * 48 and c.intermediate_size == 5120


def test_qwen3_next_rope_parameters_form():
    d = _with(_with(QWEN3_NEXT_80B, "rope_theta", _DEL), "partial_rotary_factor", _DEL)
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}
    c = parse_config(d)
    assert (c.rope_theta, c.rotary_dim) == (5e6, 128)
    del d["rope_parameters"]
    assert (parse_config(d).rope_theta, parse_config(d).rotary_dim) == (10000.0, 64)  # HF defaults


def test_qwen35_dense_wrapper():
    c = parse_config(QWEN35_9B)
    assert c.family == "qwen3_5" and c.multimodal
    assert c.weight_prefix == "model.language_model." and c.gdn_layout == "flat"
    assert c.num_hidden_layers == 32 and c.layers_of("attention") == tuple(range(3, 32, 4))
    assert (c.hidden_size, c.num_key_value_heads, c.intermediate_size,
            c.vocab_size) == (4096, 4, 12288, 248320)
    assert c.ffn_kinds == ("mlp",) * 32 and c.mtp_ffn_kind == "mlp" and c.num_experts == 0
    assert (c.rotary_dim, c.mrope_section, c.mrope_interleaved,
            c.rope_theta) == (64, (11, 11, 10), True, 1e7)
    assert c.num_mtp_layers == 1 and c.attn_output_gate and c.mamba_ssm_dtype == "float32"


def test_qwen35_moe_wrapper_and_text_form():
    c = parse_config(QWEN35_35B_A3B)
    assert c.family == "qwen3_5_moe" and c.multimodal and c.gdn_layout == "flat"
    assert c.num_hidden_layers == 40 and c.ffn_kinds == ("moe",) * 40
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (256, 8, 512)
    assert c.norm_topk_prob  # always renormalised, no field
    text = parse_config(QWEN35_35B_A3B["text_config"])  # qwen3_5_moe_text, saved by ...ForCausalLM
    assert text.family == "qwen3_5_moe" and not text.multimodal and text.weight_prefix == "model."
    assert text.to_dict() | {"multimodal": True} == c.to_dict()


def test_qwen35_tie_word_embeddings_from_text_config():
    d = _with(QWEN35_9B, "text_config.tie_word_embeddings", True)
    assert parse_config(d).tie_word_embeddings
    d = _with(_with(QWEN35_9B, "text_config.tie_word_embeddings", _DEL),
              "tie_word_embeddings", True)
    assert parse_config(d).tie_word_embeddings  # falls back to the wrapper's value


def test_qwen_legacy_layer_type_name():
    d = _with(QWEN3_NEXT_80B, "layer_types", (["linear_attention"] * 3 + ["attention"]) * 12)
    assert parse_config(d).layer_kinds == parse_config(QWEN3_NEXT_80B).layer_kinds


# ----------------------------------------------------------------------------- errors

ERRORS = [
    ({"model_type": "llama"}, r"unsupported model_type 'llama'.*nemotron_h.*qwen3_5_moe_text"),
    ({"hidden_size": 8}, r"unsupported model_type None"),
    (_with(NEMOTRON_H_8B, "n_groups", 3),
     r"'mamba_num_heads' \(128\) must be a multiple of 'n_groups' \(3\)"),
    (_with(NEMOTRON_H_8B, "num_key_value_heads", 5),
     r"'num_attention_heads' \(32\) must be a multiple of 'num_key_value_heads' \(5\)"),
    (_with(NEMOTRON_H_8B, "hybrid_override_pattern", "M-M*X-"),
     r"hybrid_override_pattern has unknown character 'X' at position 4"),
    (_with(NEMOTRON_H_8B, "num_hidden_layers", 50),
     r"num_hidden_layers = 50 but the layer pattern has 52"),
    (_with(NEMOTRON_H_8B, "hybrid_override_pattern", _DEL),
     r"missing required field 'hybrid_override_pattern'"),
    (_with(_with(NEMOTRON_H_8B, "hybrid_override_pattern", ""), "num_hidden_layers", _DEL),
     r"pattern is empty"),
    (_with(NEMOTRON_H_8B, "mamba_head_dim", _DEL), r"missing required field 'mamba_head_dim'"),
    (_with(NEMOTRON_H_8B, "attention_head_dim", _DEL),
     r"missing required field 'head_dim' \(or 'attention_head_dim'\)"),
    (_with(NEMOTRON_H_8B, "ssm_state_size", 0),
     r"'ssm_state_size' must be a positive integer, got 0"),
    (_with(NEMOTRON_H_8B, "hidden_size", -4096), r"'hidden_size' must be a positive integer"),
    (_with(NEMOTRON_H_8B, "vocab_size", "big"), r"'vocab_size' must be an integer"),
    (_with(NEMOTRON_H_8B, "mamba_n_groups", 4),
     r"'n_groups' = 8 conflicts with its alias 'mamba_n_groups' = 4"),
    (_with(NEMOTRON_H_8B, "time_step_limit", [0.1]), r"'time_step_limit' must be a pair"),
    (_with(NEMOTRON_H_8B, "layers_block_type", ["mamba", "ssm"]),
     r"layers_block_type\[1\] = 'ssm'"),
    (_with(NEMOTRON_H_8B, "intermediate_size", [1, 2]), r"per-layer 'intermediate_size'"),
    (_with(NEMOTRON_H_8B, "sliding_window", 4096), r"'sliding_window' is set"),
    (_with(NEMOTRON_3_NANO_30B, "num_experts_per_tok", 200),
     r"'num_experts_per_tok' \(200\) exceeds 'n_routed_experts'"),
    (_with(NEMOTRON_3_NANO_30B, "moe_intermediate_size", _DEL),
     r"missing required field 'moe_intermediate_size'"),
    (_with(NEMOTRON_3_NANO_30B, "moe_shared_expert_intermediate_size", _DEL),
     r"'moe_shared_expert_intermediate_size' must be positive"),
    (_with(NEMOTRON_3_NANO_30B, "topk_group", 2),
     r"'topk_group' \(2\) exceeds 'n_group' \(1\)"),
    (_with(_with(NEMOTRON_3_NANO_30B, "num_nextn_predict_layers", 1),
           "mtp_hybrid_override_pattern", "*-"),
     r"mtp_hybrid_override_pattern disagrees with mtp_layers_block_type"),
    (_with(QWEN3_NEXT_80B, "linear_num_value_heads", 24),
     r"'linear_num_value_heads' \(24\) must be a multiple of 'linear_num_key_heads' \(16\)"),
    (_with(QWEN3_NEXT_80B, "num_key_value_heads", 3),
     r"'num_attention_heads' \(16\) must be a multiple"),
    (_with(QWEN3_NEXT_80B, "layer_types", ["linear_attention", "full_attention"] * 10),
     r"layer_types has 20 entries but num_hidden_layers = 48"),
    (_with(QWEN3_NEXT_80B, "layer_types", ["linear_attention", "sliding_attention"] * 24),
     r"layer_types\[1\] = 'sliding_attention'"),
    (_with(QWEN3_NEXT_80B, "num_hidden_layers", _DEL),
     r"missing required field 'num_hidden_layers'"),
    (_with(QWEN3_NEXT_80B, "head_dim", _DEL),
     r"qwen3_next config: missing required field 'head_dim'"),
    (_with(QWEN3_NEXT_80B, "linear_key_head_dim", 0),
     r"'linear_key_head_dim' must be a positive integer"),
    (_with(QWEN3_NEXT_80B, "full_attention_interval", 0),
     r"'full_attention_interval' must be positive"),
    (_with(QWEN3_NEXT_80B, "mlp_only_layers", [48]),
     r"'mlp_only_layers' has indices out of range"),
    (_with(_with(QWEN3_NEXT_80B, "mlp_only_layers", [0]), "intermediate_size", _DEL),
     r"'intermediate_size' must be a positive integer"),
    (_with(QWEN3_NEXT_80B, "num_experts", _DEL), r"missing required field 'num_experts'"),
    (_with(QWEN3_NEXT_80B, "moe_intermediate_size", _DEL),
     r"missing required field 'moe_intermediate_size'"),
    (_with(QWEN3_NEXT_80B, "partial_rotary_factor", 75 / 256),
     r"rotary_dim 75; need an even value"),
    (_with(QWEN3_NEXT_80B, "rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
     r"rope_type 'yarn' is not supported"),
    (_with(QWEN35_9B, "text_config.rope_parameters",
           dict(_QWEN35_ROPE, mrope_section=[8, 8, 8])),
     r"'mrope_section' \[8, 8, 8\] must sum to rotary_dim/2 = 32"),
    (_with(QWEN35_9B, "text_config", _DEL),
     r"qwen3_5 config: missing required field 'text_config'"),
    (_with(QWEN35_9B, "text_config.model_type", "qwen3_5_moe_text"),
     r"text_config.model_type is 'qwen3_5_moe_text'"),
    (_with(QWEN35_9B, "text_config.intermediate_size", _DEL),
     r"qwen3_5 config \(text_config\): missing required field 'intermediate_size'"),
    (_with(QWEN35_9B, "text_config.hidden_size", True),
     r"'hidden_size' must be an integer, got True"),
    # values the models do not implement: refused, never silently replaced
    (_with(NEMOTRON_H_8B, "mlp_hidden_act", "gelu"),
     r"field 'mlp_hidden_act' is 'gelu'; only 'relu2' is supported"),
    (_with(NEMOTRON_H_8B, "mamba_hidden_act", "relu"),
     r"field 'mamba_hidden_act' is 'relu'; only 'silu' is supported"),
    (_with(QWEN3_NEXT_80B, "rope_theta", -5), r"field 'rope_theta' must be > 0, got -5.0"),
    (_with(QWEN35_9B, "text_config.rope_parameters", dict(_QWEN35_ROPE, rope_theta=0)),
     r"field 'rope_theta' must be > 0, got 0.0"),
    (_with(QWEN3_NEXT_80B, "rope_scaling", "x"), r"field 'rope_scaling' must be an object"),
    (_with(NEMOTRON_H_8B, "max_position_embeddings", -5),
     r"'max_position_embeddings' must be a positive integer, got -5"),
    (_with(NEMOTRON_H_8B, "mamba_ssm_cache_dtype", "bogus"),
     r"'mamba_ssm_cache_dtype' must be one of float32, bfloat16, float16, got 'bogus'"),
    (_with(NEMOTRON_3_NANO_30B, "routed_scaling_factor", -1),
     r"'routed_scaling_factor' must be > 0, got -1.0"),
    (_with(QWEN3_NEXT_80B, "mamba_ssm_dtype", "int8"), r"'mamba_ssm_dtype' must be one of"),
    (_with(QWEN35_9B, "text_config.rope_parameters", [1]),
     r"field 'rope_parameters' must be an object, got \[1\]"),
    # values the kernels refuse later (inside the first decode): refused when parsed
    (_with(NEMOTRON_H_8B, "ssm_state_size", 12),
     r"field 'ssm_state_size' must be a power of two \(the Mamba-2 kernels' d_state N\), got 12"),
    (_with(NEMOTRON_H_8B, "conv_kernel", 1), r"field 'conv_kernel' must be >= 2 .*, got 1"),
    (_with(_with(NEMOTRON_H_8B, "conv_kernel", _DEL), "mamba_d_conv", 1),
     r"field 'conv_kernel' must be >= 2"),
    (_with(QWEN3_NEXT_80B, "linear_key_head_dim", 96),
     r"field 'linear_key_head_dim' must be a power of two \(the GDN kernels' key dim K\), "
     r"got 96"),
    (_with(QWEN3_NEXT_80B, "linear_conv_kernel_dim", 1),
     r"field 'linear_conv_kernel_dim' must be >= 2 .*, got 1"),
    (_with(QWEN3_NEXT_80B, "rope_theta", "nan"), r"field 'rope_theta' must be > 0, got nan"),
]


@pytest.mark.parametrize("cfg, match", ERRORS, ids=[m[:40] for _, m in ERRORS])
def test_errors(cfg, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(cfg)


# Direct construction (dataclasses.replace, from_dict) runs the same __post_init__ checks as a
# parse, including the rules that a parsed JSON value cannot break (bool fields given non-bools).
_BASE = {"nemotron": lambda: parse_config(NEMOTRON_3_NANO_30B),
         "qwen": lambda: parse_config(QWEN3_NEXT_80B)}
CONSTRUCTION_ERRORS = [
    ("nemotron", "ssm_state_size", 12, r"'ssm_state_size' must be a power of two"),
    ("nemotron", "ssm_state_size", 0, r"'ssm_state_size' must be a positive integer"),
    ("nemotron", "conv_kernel", 1, r"'conv_kernel' must be >= 2"),
    ("nemotron", "residual_in_fp32", "no", r"field 'residual_in_fp32' must be True or False, "
                                           r"got 'no'"),
    ("nemotron", "tie_word_embeddings", 1, r"'tie_word_embeddings' must be True or False, got 1"),
    ("nemotron", "use_conv_bias", None, r"'use_conv_bias' must be True or False, got None"),
    ("nemotron", "norm_topk_prob", "true", r"'norm_topk_prob' must be True or False"),
    ("nemotron", "layer_kinds", "MM*", r"field 'layer_kinds' must be a tuple \(or list\), "
                                       r"got 'MM\*'"),
    ("nemotron", "time_step_limit", 0.5, r"field 'time_step_limit' must be a tuple"),
    ("qwen", "linear_key_head_dim", 48, r"'linear_key_head_dim' must be a power of two"),
    ("qwen", "linear_conv_kernel_dim", 1, r"'linear_conv_kernel_dim' must be >= 2"),
    ("qwen", "rope_theta", -1.0, r"qwen3_next config: field 'rope_theta' must be > 0, got -1.0"),
    ("qwen", "rope_theta", 0, r"field 'rope_theta' must be > 0, got 0"),
    ("qwen", "rope_theta", math.nan, r"field 'rope_theta' must be > 0, got nan"),
    ("qwen", "rope_theta", "1e4", r"field 'rope_theta' must be (> 0|a number), got '1e4'"),
    ("qwen", "attn_output_gate", "yes", r"'attn_output_gate' must be True or False, got 'yes'"),
    ("qwen", "multimodal", 0, r"'multimodal' must be True or False, got 0"),
    ("qwen", "mrope_section", 5, r"field 'mrope_section' must be a tuple"),
]


@pytest.mark.parametrize("base, field, value, match", CONSTRUCTION_ERRORS,
                         ids=[f"{f}={v!r}" for _, f, v, _ in CONSTRUCTION_ERRORS])
def test_construction_errors(base, field, value, match):
    cfg = _BASE[base]()
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(cfg, **{field: value})
    with pytest.raises(ConfigError, match=match):        # our own serialisation: same rules
        config_from_dict(cfg.to_dict() | {field: value})


def test_tuple_fields_accept_lists():
    """A list where the config holds a tuple is converted (the config stays hashable)."""
    c = parse_config(QWEN3_NEXT_80B)
    d = dataclasses.replace(c, layer_kinds=list(c.layer_kinds), mlp_only_layers=[])
    assert d == c and hash(d) == hash(c) and isinstance(d.layer_kinds, tuple)
    n = parse_config(NEMOTRON_H_8B)
    m = NemotronHConfig(**{f.name: getattr(n, f.name) for f in dataclasses.fields(n)}
                        | {"layer_kinds": list(n.layer_kinds), "time_step_limit": [0.0, math.inf]})
    assert m == n and hash(m) == hash(n)


def test_fixture_configs_keep_the_kernel_rules():
    """Every HF fixture config passes the rules above (so do the synthetic presets, parsed in
    tests/replayjax/bench)."""
    for d in sorted(pathlib.Path("tests/fixtures/hf").glob("*/config.json")):
        c = load_config(d)
        if isinstance(c, NemotronHConfig):
            assert c.ssm_state_size & (c.ssm_state_size - 1) == 0 and c.conv_kernel >= 2
        else:
            assert c.linear_key_head_dim & (c.linear_key_head_dim - 1) == 0


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)
    assert set(SUPPORTED_MODEL_TYPES) == {"nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_text",
                                          "qwen3_5_moe", "qwen3_5_moe_text"}


# ----------------------------------------------------------------------------- round trip and files

ALL = [NEMOTRON_H_8B, NEMOTRON_NANO_9B_V2, NEMOTRON_3_NANO_30B, QWEN3_NEXT_80B, QWEN35_9B,
       QWEN35_35B_A3B]


@pytest.mark.parametrize("hf", ALL, ids=lambda d: d["model_type"] + "_" + str(
    d.get("hidden_size") or d["text_config"]["hidden_size"]))
def test_to_dict_round_trip(hf):
    c = parse_config(hf)
    d = c.to_dict()
    text = json.dumps(d, allow_nan=False)  # strict JSON: inf stored as "inf"
    back = config_from_dict(json.loads(text))
    assert back == c and type(back).from_dict(d) == c
    assert hash(back) == hash(c)  # frozen, hashable


def test_from_dict_refuses_bad_input():
    d = parse_config(NEMOTRON_H_8B).to_dict()
    with pytest.raises(ConfigError, match="unknown fields"):
        config_from_dict(d | {"bogus": 1})
    with pytest.raises(ConfigError, match="config_class"):
        config_from_dict(d | {"config_class": "Nope"})
    with pytest.raises(ConfigError, match="must be a multiple"):  # validated like a parse
        config_from_dict(d | {"n_groups": 3})
    with pytest.raises(ConfigError, match="vocab_size"):
        config_from_dict({k: v for k, v in d.items() if k != "vocab_size"})


def test_frozen():
    c = parse_config(QWEN35_9B)
    with pytest.raises(AttributeError):
        c.hidden_size = 1


def test_load_config_file_and_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_9B))
    assert load_config(tmp_path) == load_config(tmp_path / "config.json") == parse_config(QWEN35_9B)
    assert parse_config(str(tmp_path)) == parse_config(QWEN35_9B)
    with pytest.raises(ConfigError, match="no config file"):
        load_config(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path / "bad.json")


FIXTURES = sorted((pathlib.Path(__file__).parents[1] / "fixtures" / "hf").glob("*/config.json"))


@pytest.mark.skipif(not FIXTURES, reason="tests/fixtures/hf not generated")
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_hf_fixture_configs(path):
    """Tiny configs written by transformers 5.24 save_pretrained parse and round-trip."""
    raw = json.loads(path.read_text())
    c = load_config(path.parent)
    assert config_from_dict(json.loads(json.dumps(c.to_dict(), allow_nan=False))) == c
    if raw["model_type"] == "nemotron_h":
        assert len(c.layer_kinds) == len(raw["layers_block_type"])
        assert c.time_step_limit == (0.0, math.inf)
        assert c.mamba_intermediate_size == raw["mamba_num_heads"] * raw["mamba_head_dim"]
        assert c.num_mtp_layers == raw["num_nextn_predict_layers"]
    else:
        text = raw.get("text_config", raw)
        assert c.num_hidden_layers == text["num_hidden_layers"]
        assert c.multimodal == ("text_config" in raw)
        assert c.gdn_layout == ("interleaved" if raw["model_type"] == "qwen3_next" else "flat")
