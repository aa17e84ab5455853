"""Qwen3-Next / Qwen3.5 / Qwen3.5-MoE: HF hub tensor names -> `models.qwen.QwenHybrid`.

P = `model.` (qwen3_next, *_text) or `model.language_model.` (the Qwen3.5 multimodal wrapper,
whose `model.visual.*` vision tower is skipped with a note); `lm_head.weight` and `mtp.*` are
top-level.

    P.embed_tokens.weight / P.norm.weight           -> embed_tokens / norm/weight         copy
    lm_head.weight                                  -> lm_head/kernel (unless tied)       T
    P.layers.N.{input,post_attention}_layernorm     -> layers/N/.../weight                copy
    GDN  linear_attn.in_proj_qkv/_z/_b/_a (flat, 3.5)            -> mixer/in_proj/kernel  cols_T
         linear_attn.in_proj_qkvz / in_proj_ba (interleaved per key-head group, Next)
                                                    -> the same flat [q|k|v|z|b|a] columns, cols_T
         linear_attn.conv1d.weight (C, 1, K)        -> mixer/conv_weight (C, K)           copy
         linear_attn.{dt_bias, A_log, norm.weight}  -> mixer/{dt_bias, A_log, norm}       copy
         linear_attn.out_proj.weight                -> mixer/out_proj/kernel              T
    attn self_attn.{q,k,v,o}_proj (+ bias)          -> mixer/{q,k,v,o}_proj/kernel        T
         self_attn.{q,k}_norm.weight                -> mixer/{q,k}_norm/weight            copy
    MoE  mlp.gate.weight (E, D)                     -> mlp/gate (fp32)                    copy
         mlp.experts.{e}.{gate,up,down}_proj.weight -> mlp/{gate_w,up,down} [E, ...]      stack_T
         or fused mlp.experts.gate_up_proj (E, 2F, D) (gate rows first) -> gate_w, up     fused_T
                  mlp.experts.down_proj (E, D, F)   -> down                               fused_T
         mlp.shared_expert.{gate,up,down}_proj      -> mlp/shared/...                     T
         mlp.shared_expert_gate.weight (1, D)       -> mlp/shared_gate/kernel (D, 1)      T
    MLP  mlp.{gate,up,down}_proj.weight             -> mlp/{gate,up,down}_proj/kernel     T
    MTP  mtp.fc.weight (D, 2D)                      -> mtp/fc/kernel                      T
         mtp.{pre_fc_norm_embedding,pre_fc_norm_hidden,norm}.weight -> mtp/.../weight    copy
         mtp.layers.i.*  (attention layer + its FFN, names as in the body) -> mtp/layers/i/...
"""

from __future__ import annotations

from convert.table import Part, TableBuilder


def _gdn_in_proj(b: TableBuilder, cfg, path: tuple, mp: str) -> None:
    D, Hk, Hv = cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gdn_heads_ratio
    KD, VD, C = cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_conv_dim
    Z, B, A = C, C + VD, C + VD + Hv                      # first column of z, b, a
    if b.has(f"{mp}.in_proj_qkvz.weight") or b.has(f"{mp}.in_proj_ba.weight"):   # interleaved
        G = 2 * dk + 2 * r * dv
        qkvz = b.source(f"{mp}.in_proj_qkvz.weight", (Hk * G, D))
        ba = b.source(f"{mp}.in_proj_ba.weight", (Hk * 2 * r, D))
        pieces = []
        for i in range(Hk):
            g = i * G
            pieces += [
                (Part(qkvz, rows=(g, g + dk)), (i * dk, (i + 1) * dk)),
                (Part(qkvz, rows=(g + dk, g + 2 * dk)), (KD + i * dk, KD + (i + 1) * dk)),
                (Part(qkvz, rows=(g + 2 * dk, g + 2 * dk + r * dv)),
                 (2 * KD + i * r * dv, 2 * KD + (i + 1) * r * dv)),
                (Part(qkvz, rows=(g + 2 * dk + r * dv, g + G)),
                 (Z + i * r * dv, Z + (i + 1) * r * dv)),
                (Part(ba, rows=(2 * r * i, 2 * r * i + r)), (B + i * r, B + (i + 1) * r)),
                (Part(ba, rows=(2 * r * i + r, 2 * r * (i + 1))), (A + i * r, A + (i + 1) * r)),
            ]
    else:                                                   # flat
        pieces = [(Part(b.source(f"{mp}.in_proj_qkv.weight", (C, D))), (0, C)),
                  (Part(b.source(f"{mp}.in_proj_z.weight", (VD, D))), (Z, B)),
                  (Part(b.source(f"{mp}.in_proj_b.weight", (Hv, D))), (B, A)),
                  (Part(b.source(f"{mp}.in_proj_a.weight", (Hv, D))), (A, A + Hv))]
    b.cols_T(path, pieces)


def _layer(b: TableBuilder, cfg, path: tuple, lp: str, kind: str) -> None:
    for norm in ("input_layernorm", "post_attention_layernorm"):
        b.copy(path + (norm, "weight"), f"{lp}.{norm}.weight")
    m = path + ("mixer",)
    if kind == "gdn":
        mp = f"{lp}.linear_attn"
        _gdn_in_proj(b, cfg, m + ("in_proj", "kernel"), mp)
        b.conv(m + ("conv_weight",), f"{mp}.conv1d.weight")
        for attr, name in (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("norm", "norm.weight")):
            b.copy(m + (attr,), f"{mp}.{name}")
        b.linear(m + ("out_proj",), f"{mp}.out_proj")
    else:
        mp = f"{lp}.self_attn"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            b.linear(m + (proj,), f"{mp}.{proj}")
        for norm in ("q_norm", "k_norm"):
            b.copy(m + (norm, "weight"), f"{mp}.{norm}.weight")
    f, fp = path + ("mlp",), f"{lp}.mlp"
    if b.has_param(f + ("gate",)):                          # MoE
        b.copy(f + ("gate",), f"{fp}.gate.weight")
        E, D, F = b.shape(f + ("up",))
        if b.has(f"{fp}.experts.gate_up_proj"):             # fused (Qwen3.5-MoE releases)
            gu = f"{fp}.experts.gate_up_proj"
            b.fused_T(f + ("gate_w",), gu, (E, 2 * F, D), rows=(0, F))
            b.fused_T(f + ("up",), gu, (E, 2 * F, D), rows=(F, 2 * F))
            b.fused_T(f + ("down",), f"{fp}.experts.down_proj", (E, D, F))
        else:
            for attr, name in (("gate_w", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                b.stack_T(f + (attr,), [f"{fp}.experts.{e}.{name}.weight" for e in range(E)])
        if b.has_param(f + ("shared", "gate_proj", "kernel")):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                b.linear(f + ("shared", proj), f"{fp}.shared_expert.{proj}")
            b.linear(f + ("shared_gate",), f"{fp}.shared_expert_gate")
    else:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            b.linear(f + (proj,), f"{fp}.{proj}")


def _prefix(cfg, b: TableBuilder) -> str:
    """cfg.weight_prefix, or the other one when only that one is in the checkpoint (text-only
    Qwen3.5 checkpoints that kept `model.language_model.`)."""
    for p in (cfg.weight_prefix, "model.language_model.", "model."):
        if b.has(f"{p}embed_tokens.weight"):
            if p != cfg.weight_prefix:
                b.notes.append(f"text weights found under {p!r} "
                               f"(config implies {cfg.weight_prefix!r})")
            return p
    return cfg.weight_prefix


def build_table(cfg, b: TableBuilder, mtp: bool) -> None:
    p = _prefix(cfg, b)
    b.copy(("embed_tokens",), f"{p}embed_tokens.weight")
    b.copy(("norm", "weight"), f"{p}norm.weight")
    if b.has_param(("lm_head", "kernel")):
        b.linear(("lm_head",), "lm_head")
    elif b.has("lm_head.weight"):
        b.skip("lm_head.weight", "tied word embeddings: the model uses embed_tokens")
    for i, kind in enumerate(cfg.layer_kinds):
        _layer(b, cfg, ("layers", i), f"{p}layers.{i}", kind)
    if cfg.multimodal or p == "model.language_model.":
        b.skip("model.visual.", "vision tower (the model is text-only)")
    if mtp:
        b.linear(("mtp", "fc"), "mtp.fc")
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            b.copy(("mtp", norm, "weight"), f"mtp.{norm}.weight")
        i = 0
        while b.has_param(("mtp", "layers", i, "input_layernorm", "weight")):
            _layer(b, cfg, ("mtp", "layers", i), f"mtp.layers.{i}", "attention")
            i += 1
