"""An independent oracle for the name tables: the imperative Hugging Face weight loader that the
package used before `convert.load_hf` (tests only).

`read_safetensors(dir)` returns {name: np.ndarray} for a single file or a sharded index (read
whole by `safetensors.numpy.load_file`). `load_nemotron_h(model, tensors)` and
`load_qwen_hybrid(model, tensors)` fill a model built from the matching config with plain numpy
indexing and transposes, checking every shape and refusing missing or unused tensors (`mtp.*`
tensors are ignored when the model has no MTP head and required when it has one). Tests compare
the table path against it bitwise (tests/convert/test_load_hf.py, test_convert.py).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (bfloat16 for safetensors.numpy)
import numpy as np
from safetensors.numpy import load_file


class WeightsError(ValueError):
    """A checkpoint that does not match the model (missing, unused or misshapen tensors)."""


def read_safetensors(model_dir):
    """All tensors of `model.safetensors` or of the shards listed in
    `model.safetensors.index.json`."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(load_file(os.path.join(model_dir, name)))
    return tensors


class _Taker:
    """Hands out tensors by name, checks shapes, remembers what was used."""

    def __init__(self, tensors):
        self.tensors, self.used = tensors, set()

    def __call__(self, name, shape=None, transpose=False):
        if name not in self.tensors:
            raise WeightsError(f"missing tensor {name}")
        self.used.add(name)
        t = np.asarray(self.tensors[name])
        t = t.T if transpose else t
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise WeightsError(f"tensor {name}: expected shape {tuple(shape)}, "
                               f"found {tuple(t.shape)}")
        return t

    def unused(self, ignore=()):
        return sorted(n for n in self.tensors if n not in self.used
                      and not any(n.startswith(p) for p in ignore))


def _set(param, value):
    param[...] = jnp.asarray(value, param[...].dtype)


def _linear(take, lin, name):
    _set(lin.kernel, take(f"{name}.weight", lin.kernel[...].shape, transpose=True))
    if lin.bias is not None:
        _set(lin.bias, take(f"{name}.bias", lin.bias[...].shape))


def _nemotron_block(take, layer, p):
    """One Nemotron-H block (`{p}.norm.weight`, `{p}.mixer.*`); body and MTP layers alike."""
    _set(layer.norm.weight, take(f"{p}.norm.weight", layer.norm.weight[...].shape))
    m, mp = layer.mixer, f"{p}.mixer"
    if layer.kind == "mamba":
        _linear(take, m.in_proj, f"{mp}.in_proj")
        _linear(take, m.out_proj, f"{mp}.out_proj")
        C, K = m.conv_weight[...].shape
        _set(m.conv_weight, take(f"{mp}.conv1d.weight", (C, 1, K))[:, 0])
        if m.conv_bias is not None:
            _set(m.conv_bias, take(f"{mp}.conv1d.bias", (C,)))
        for attr, name in (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("D", "D"),
                           ("norm", "norm.weight")):
            _set(getattr(m, attr), take(f"{mp}.{name}", getattr(m, attr)[...].shape))
    elif layer.kind == "attention":
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _linear(take, getattr(m, proj), f"{mp}.{proj}")
    elif layer.kind == "mlp":
        _linear(take, m.up_proj, f"{mp}.up_proj")
        _linear(take, m.down_proj, f"{mp}.down_proj")
    else:
        _set(m.gate, take(f"{mp}.gate.weight", m.gate[...].shape))
        _set(m.correction_bias, take(f"{mp}.gate.e_score_correction_bias",
                                     m.correction_bias[...].shape))
        E, din, F = m.up[...].shape
        _set(m.up, np.stack([take(f"{mp}.experts.{e}.up_proj.weight", (F, din)).T
                             for e in range(E)]))
        _set(m.down, np.stack([take(f"{mp}.experts.{e}.down_proj.weight", (din, F)).T
                               for e in range(E)]))
        if m.shared is not None:
            _linear(take, m.shared.up_proj, f"{mp}.shared_experts.up_proj")
            _linear(take, m.shared.down_proj, f"{mp}.shared_experts.down_proj")
        if m.cfg.moe_latent_size:
            _linear(take, m.fc1_latent, f"{mp}.fc1_latent_proj")
            _linear(take, m.fc2_latent, f"{mp}.fc2_latent_proj")


def _require_mtp(tensors, what):
    if not any(n.startswith("mtp.") for n in tensors):
        raise WeightsError(f"the model was built with an MTP head (mtp=True) but the checkpoint "
                           f"has no mtp.* tensors ({what}); build it with mtp=False")


def _norm(take, norm, name):
    _set(norm.weight, take(name, norm.weight[...].shape))


def load_nemotron_h(model, tensors):
    """Fills a `models.nemotron_h.NemotronH` from HF tensors (hub names `backbone.*`).

    With an MTP head (mtp=True) also `mtp.layers.{i}.*` (as Nemotron-3 ships them): every MTP layer
    has `norm.weight` and `mixer.*` named as in the body; `mtp.layers.0` carries the fusion
    `enorm.weight`, `hnorm.weight`, `eh_proj.weight` (D, 2D) and the last MTP layer
    `final_layernorm.weight`. Without an MTP head, `mtp.*` tensors are ignored."""
    take = _Taker(tensors)
    _set(model.embeddings, take("backbone.embeddings.weight", model.embeddings[...].shape))
    _set(model.norm_f.weight, take("backbone.norm_f.weight", model.norm_f.weight[...].shape))
    _linear(take, model.lm_head, "lm_head")
    for i, layer in enumerate(model.layers):
        _nemotron_block(take, layer, f"backbone.layers.{i}")
    ignore = ("mtp.",)
    if model.mtp is not None:
        _require_mtp(tensors, "expected mtp.layers.{i}.*")
        head, last = model.mtp, len(model.mtp.layers) - 1
        _norm(take, head.enorm, "mtp.layers.0.enorm.weight")
        _norm(take, head.hnorm, "mtp.layers.0.hnorm.weight")
        _linear(take, head.eh_proj, "mtp.layers.0.eh_proj")
        for i, layer in enumerate(head.layers):
            _nemotron_block(take, layer, f"mtp.layers.{i}")
        _norm(take, head.final_layernorm, f"mtp.layers.{last}.final_layernorm.weight")
        ignore = ()
    unused = take.unused(ignore=ignore)
    if unused:
        raise WeightsError(f"unused tensors ({len(unused)}): {', '.join(unused[:8])}"
                           + (" ..." if len(unused) > 8 else ""))
    return model


def _qwen_gdn_in_proj(take, cfg, mp):
    """The GDN input projections as one [D, out] kernel in the flat order
    [q | k | v | z | b | a]. Qwen3.5 ships in_proj_qkv / _z / _b / _a flat; Qwen3-Next ships
    in_proj_qkvz / in_proj_ba interleaved per key-head group i (q_i, k_i, v and z of value heads
    i*r .. i*r+r-1; b then a of the same heads), which is de-interleaved here."""
    D, Hk, Hv = cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gdn_heads_ratio
    if cfg.gdn_layout == "flat":
        parts = [take(f"{mp}.in_proj_qkv.weight", (cfg.gdn_conv_dim, D)),
                 take(f"{mp}.in_proj_z.weight", (cfg.gdn_value_dim, D)),
                 take(f"{mp}.in_proj_b.weight", (Hv, D)),
                 take(f"{mp}.in_proj_a.weight", (Hv, D))]
    else:
        qkvz = take(f"{mp}.in_proj_qkvz.weight", (2 * cfg.gdn_key_dim + 2 * cfg.gdn_value_dim, D))
        ba = take(f"{mp}.in_proj_ba.weight", (2 * Hv, D))
        qkvz = qkvz.reshape(Hk, 2 * dk + 2 * r * dv, D)
        ba = ba.reshape(Hk, 2 * r, D)
        flat = lambda t: t.reshape(-1, D)
        q, k = flat(qkvz[:, :dk]), flat(qkvz[:, dk:2 * dk])
        v, z = flat(qkvz[:, 2 * dk:2 * dk + r * dv]), flat(qkvz[:, 2 * dk + r * dv:])
        parts = [np.concatenate([q, k, v]), z, flat(ba[:, :r]), flat(ba[:, r:])]
    return np.concatenate(parts).T


def _qwen_layer(take, tensors, cfg, layer, lp):
    """One Qwen decoder layer (`{lp}.input_layernorm`, `linear_attn.*` / `self_attn.*`,
    `post_attention_layernorm`, `mlp.*`); body and MTP layers alike."""
    for norm in ("input_layernorm", "post_attention_layernorm"):
        _norm(take, getattr(layer, norm), f"{lp}.{norm}.weight")
    m = layer.mixer
    if layer.kind == "gdn":
        mp = f"{lp}.linear_attn"
        _set(m.in_proj.kernel, _qwen_gdn_in_proj(take, cfg, mp))
        C, K = m.conv_weight[...].shape
        _set(m.conv_weight, take(f"{mp}.conv1d.weight", (C, 1, K))[:, 0])
        for attr, name in (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("norm", "norm.weight")):
            _set(getattr(m, attr), take(f"{mp}.{name}", getattr(m, attr)[...].shape))
        _linear(take, m.out_proj, f"{mp}.out_proj")
    else:
        mp = f"{lp}.self_attn"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _linear(take, getattr(m, proj), f"{mp}.{proj}")
        for norm in ("q_norm", "k_norm"):
            _norm(take, getattr(m, norm), f"{mp}.{norm}.weight")
    f, fp = layer.mlp, f"{lp}.mlp"
    if hasattr(f, "route"):      # MoE
        _set(f.gate, take(f"{fp}.gate.weight", f.gate[...].shape))
        E, D, F = f.up[...].shape
        if f"{fp}.experts.gate_up_proj" in tensors:
            gu = take(f"{fp}.experts.gate_up_proj", (E, 2 * F, D))
            _set(f.gate_w, gu[:, :F].transpose(0, 2, 1))
            _set(f.up, gu[:, F:].transpose(0, 2, 1))
            _set(f.down, take(f"{fp}.experts.down_proj", (E, D, F)).transpose(0, 2, 1))
        else:
            for attr, name, shape in (("gate_w", "gate_proj", (F, D)),
                                      ("up", "up_proj", (F, D)), ("down", "down_proj", (D, F))):
                _set(getattr(f, attr), np.stack(
                    [take(f"{fp}.experts.{e}.{name}.weight", shape).T for e in range(E)]))
        if f.shared is not None:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                _linear(take, getattr(f.shared, proj), f"{fp}.shared_expert.{proj}")
            _linear(take, f.shared_gate, f"{fp}.shared_expert_gate")
    else:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            _linear(take, getattr(f, proj), f"{fp}.{proj}")


def load_qwen_hybrid(model, tensors):
    """Fills a `models.qwen.QwenHybrid` from HF tensors: `model.*` (Qwen3-Next) or
    `model.language_model.*` (Qwen3.5 multimodal checkpoints) plus top-level `lm_head.weight`.
    Skipped on purpose: `model.visual.*` (the vision tower of a Qwen3.5 checkpoint; this is a
    text-only model), `mtp.*` when the model has no MTP head, and `lm_head.weight` when
    embeddings are tied. Routed experts are accepted per expert
    (`experts.{e}.{gate,up,down}_proj.weight`) or fused (`experts.gate_up_proj` [E, 2F, D] gate
    rows first, `experts.down_proj` [E, D, F]), in the body and in the MTP layer alike.

    With an MTP head (mtp=True; as Qwen3-Next / Qwen3.5 ship it), always top-level:
    `mtp.fc.weight` (D, 2D), `mtp.pre_fc_norm_embedding.weight`,
    `mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight` (zero-centred, D) and `mtp.layers.{i}.*`,
    a full-attention decoder layer named like a body layer (`input_layernorm`,
    `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`, `post_attention_layernorm`, `mlp.*`)."""
    cfg = model.cfg
    p = cfg.weight_prefix
    take = _Taker(tensors)
    _set(model.embed_tokens, take(f"{p}embed_tokens.weight", model.embed_tokens[...].shape))
    _norm(take, model.norm, f"{p}norm.weight")
    if model.lm_head is not None:
        _linear(take, model.lm_head, "lm_head")
    for i, layer in enumerate(model.layers):
        _qwen_layer(take, tensors, cfg, layer, f"{p}layers.{i}")
    ignore = (("model.visual.",) if cfg.multimodal else ()) + (
        ("lm_head.",) if model.lm_head is None else ())
    if model.mtp is None:
        ignore += ("mtp.",)
    else:
        _require_mtp(tensors, "expected mtp.fc, mtp.pre_fc_norm_*, mtp.layers.{i}.*, mtp.norm")
        head = model.mtp
        _linear(take, head.fc, "mtp.fc")
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            _norm(take, getattr(head, norm), f"mtp.{norm}.weight")
        for i, layer in enumerate(head.layers):
            _qwen_layer(take, tensors, cfg, layer, f"mtp.layers.{i}")
    unused = take.unused(ignore=ignore)
    if unused:
        raise WeightsError(f"unused tensors ({len(unused)}): {', '.join(unused[:8])}"
                           + (" ..." if len(unused) > 8 else ""))
    return model
