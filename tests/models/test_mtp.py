"""MTP draft heads (Nemotron-H; Qwen3-Next / Qwen3.5) against an independent float64 numpy
implementation written here (HF builds and saves no MTP weights, so it cannot be the reference).

The forward it implements is the public one of these MTP layers:
- vLLM `vllm/model_executor/models/nemotron_h_mtp.py` (vllm-project/vllm, read at 01ca277):
  `NemotronHMTPAttentionDecoderLayer` / `NemotronHMTPMoEDecoderLayer.forward` -- the first layer
  of the `mtp_hybrid_override_pattern` block fuses `eh_proj(cat([enorm(embed(t_next)),
  hnorm(h)]))`, the pattern's layers run as body layers (attention without RoPE, relu^2 MoE),
  the last applies `final_layernorm`; logits from the target's `lm_head`, embedding shared.
- vLLM `qwen3_next_mtp.py` (055e47c) / `qwen3_5_mtp.py` (01d9980),
  `Qwen3NextMultiTokenPredictor` / `Qwen3_5MultiTokenPredictor.forward` --
  `fc(cat([pre_fc_norm_embedding(embed(t_next)), pre_fc_norm_hidden(h)]))`, one full-attention
  decoder layer (own KV cache, RoPE at the target positions), `norm`; zero-centred RMSNorms.
- Megatron-LM `megatron/core/transformer/multi_token_prediction.py` (NVIDIA/Megatron-LM,
  00611e6), `MultiTokenPredictionLayer._concat_embeddings`: `enorm(decoder_input)`,
  `hnorm(hidden_states)`, `torch.cat((decoder_input, hidden_states), -1)`, `eh_proj`; then the
  inner layer(s) and `final_layernorm` (`_postprocess`): the same order, embedding first.
`test_fusion_by_hand` checks that fusion (order and norms) for one position by hand, apart from
the reference implementation below.

The fixture checkpoints get random `mtp.*` tensors under their hub names, written with the
fixture's tensors into a new HF directory that `convert.load_hf` loads (so the loader path is
tested). Then: draft T = 3 tokens from an empty MTP
cache, then two chained single-token steps that feed the head's own hidden state and argmax token
back, continuing from the cache. Tolerance 1e-5 relative to the largest reference magnitude.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from convert import ConvertError, load_hf
from models.config import load_config

FIXTURES = "tests/fixtures/hf"
RTOL = 1e-5
SLOTS = np.array([3, 1], np.int32)          # not in order, not contiguous; slot 0 = null


# ----------------------------------------------------------------------------- numpy reference

def _rms(x, w, eps, zero_centred):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1.0 + w) if zero_centred else w)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _attend(q, k_all, v_all, start):
    """q [T, nh, hd]; k_all, v_all [start + T, kv, hd]; token t sees positions <= start + t."""
    T, nh, hd = q.shape
    rep = nh // k_all.shape[1]
    out = np.zeros_like(q)
    for t in range(T):
        n = start + t + 1
        for h in range(nh):
            kh, vh = k_all[:n, h // rep], v_all[:n, h // rep]
            s = kh @ q[t, h] * hd ** -0.5
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vh
    return out


def _extend(kv, k, v, start):
    """Per-row KV memory: keep positions < start, append the new ones."""
    k_all = k if kv is None else np.concatenate([kv[0][:start], k])
    v_all = v if kv is None else np.concatenate([kv[1][:start], v])
    assert k_all.shape[0] == start + k.shape[0]
    return k_all, v_all


def _nemotron_ref(c, W, emb, head, hidden, tokens, kvs, start):
    """One Nemotron-H MTP step for one row (vLLM nemotron_h_mtp.py). hidden [T, D]; tokens [T];
    kvs: per MTP layer (k, v) or None. Returns logits [T, V], hidden [T, D], kvs."""
    eps = c.layer_norm_epsilon
    rms = lambda x, name: _rms(x, W[name], eps, False)
    e = rms(emb[tokens], "mtp.layers.0.enorm.weight")
    hh = rms(hidden, "mtp.layers.0.hnorm.weight")
    x = np.concatenate([e, hh], -1) @ W["mtp.layers.0.eh_proj.weight"].T
    T, new = len(tokens), []
    for i, kind in enumerate(c.mtp_layer_kinds):
        p = f"mtp.layers.{i}.mixer"
        y = rms(x, f"mtp.layers.{i}.norm.weight")
        kv = None
        if kind == "attention":                   # no RoPE, no q/k norm, GQA
            nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            q = (y @ W[f"{p}.q_proj.weight"].T).reshape(T, nh, hd)
            k = (y @ W[f"{p}.k_proj.weight"].T).reshape(T, nkv, hd)
            v = (y @ W[f"{p}.v_proj.weight"].T).reshape(T, nkv, hd)
            kv = _extend(kvs[i], k, v, start)
            y = _attend(q, *kv, start).reshape(T, nh * hd) @ W[f"{p}.o_proj.weight"].T
        elif kind == "moe":                       # sigmoid + correction bias, relu^2 experts
            assert c.n_group == 1
            s = _sigmoid(y @ W[f"{p}.gate.weight"].T)
            sel = s + W[f"{p}.gate.e_score_correction_bias"]
            lat = c.moe_latent_size
            u = y @ W[f"{p}.fc1_latent_proj.weight"].T if lat else y
            out = np.zeros_like(u)
            for t in range(T):
                idx = np.argsort(-sel[t])[:c.num_experts_per_tok]
                w = s[t, idx]
                if c.norm_topk_prob:
                    w = w / (w.sum() + 1e-20)
                w = w * c.routed_scaling_factor
                for wi, ei in zip(w, idx):
                    a = np.maximum(u[t] @ W[f"{p}.experts.{ei}.up_proj.weight"].T, 0) ** 2
                    out[t] += wi * (a @ W[f"{p}.experts.{ei}.down_proj.weight"].T)
            if lat:
                out = out @ W[f"{p}.fc2_latent_proj.weight"].T
            a = np.maximum(y @ W[f"{p}.shared_experts.up_proj.weight"].T, 0) ** 2
            y = out + a @ W[f"{p}.shared_experts.down_proj.weight"].T
        else:
            a = np.maximum(y @ W[f"{p}.up_proj.weight"].T, 0) ** 2
            y = a @ W[f"{p}.down_proj.weight"].T
        x = x + y
        new.append(kv)
    out = rms(x, f"mtp.layers.{len(c.mtp_layer_kinds) - 1}.final_layernorm.weight")
    return out @ head.T, out, new


def _rope(x, pos, rd, theta):
    inv = theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    f = pos[:, None] * inv                                 # [T, rd/2]
    cos, sin = np.cos(f)[:, None], np.sin(f)[:, None]
    x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rd:]], -1)


def _swiglu(x, W, p):
    return (_silu(x @ W[f"{p}.gate_proj.weight"].T) * (x @ W[f"{p}.up_proj.weight"].T)) \
        @ W[f"{p}.down_proj.weight"].T


def _qwen_ref(c, W, emb, head, hidden, tokens, kvs, start):
    """One Qwen3-Next / Qwen3.5 MTP step for one row (vLLM qwen3_*_mtp.py), RoPE at start + t."""
    eps = c.rms_norm_eps
    zrms = lambda x, name: _rms(x, W[name], eps, True)
    e = zrms(emb[tokens], "mtp.pre_fc_norm_embedding.weight")
    hh = zrms(hidden, "mtp.pre_fc_norm_hidden.weight")
    x = np.concatenate([e, hh], -1) @ W["mtp.fc.weight"].T
    T, L = len(tokens), "mtp.layers.0"
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    assert c.attn_output_gate
    y = zrms(x, f"{L}.input_layernorm.weight")
    qg = (y @ W[f"{L}.self_attn.q_proj.weight"].T).reshape(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]                   # per-head [q_h | gate_h]
    k = (y @ W[f"{L}.self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
    v = (y @ W[f"{L}.self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
    pos = start + np.arange(T, dtype=np.float64)
    rd = int(hd * c.partial_rotary_factor)
    q = _rope(zrms(q, f"{L}.self_attn.q_norm.weight"), pos, rd, c.rope_theta)
    k = _rope(zrms(k, f"{L}.self_attn.k_norm.weight"), pos, rd, c.rope_theta)
    kv = _extend(kvs[0], k, v, start)
    o = _attend(q, *kv, start) * _sigmoid(gate)
    x = x + o.reshape(T, nh * hd) @ W[f"{L}.self_attn.o_proj.weight"].T
    y = zrms(x, f"{L}.post_attention_layernorm.weight")
    m = f"{L}.mlp"
    if c.family == "qwen3_5":
        f = _swiglu(y, W, m)
    else:                                                  # softmax top-k MoE + gated shared
        logits = y @ W[f"{m}.gate.weight"].T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        f = np.zeros_like(y)
        for t in range(T):
            idx = np.argsort(-p[t])[:c.num_experts_per_tok]
            w = p[t, idx]
            if c.norm_topk_prob:
                w = w / w.sum()
            for wi, ei in zip(w, idx):
                f[t] += wi * _swiglu(y[t], W, f"{m}.experts.{ei}")
        f = f + _sigmoid(y @ W[f"{m}.shared_expert_gate.weight"].T) * _swiglu(
            y, W, f"{m}.shared_expert")
    x = x + f
    out = zrms(x, "mtp.norm.weight")
    return out @ head.T, out, [kv]


# ----------------------------------------------------------------------------- random MTP weights

def _nemotron_mtp_shapes(c):
    D = c.hidden_size
    s = {"mtp.layers.0.enorm.weight": (D,), "mtp.layers.0.hnorm.weight": (D,),
         "mtp.layers.0.eh_proj.weight": (D, 2 * D)}
    for i, kind in enumerate(c.mtp_layer_kinds):
        p = f"mtp.layers.{i}"
        s[f"{p}.norm.weight"] = (D,)
        m = f"{p}.mixer"
        if kind == "attention":
            nh, kv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            s.update({f"{m}.q_proj.weight": (nh * hd, D), f"{m}.k_proj.weight": (kv * hd, D),
                      f"{m}.v_proj.weight": (kv * hd, D), f"{m}.o_proj.weight": (D, nh * hd)})
        elif kind == "moe":
            E, F, din = c.n_routed_experts, c.moe_intermediate_size, c.moe_latent_size or D
            Fs = c.moe_shared_expert_intermediate_size
            s.update({f"{m}.gate.weight": (E, D), f"{m}.gate.e_score_correction_bias": (E,),
                      f"{m}.shared_experts.up_proj.weight": (Fs, D),
                      f"{m}.shared_experts.down_proj.weight": (D, Fs)})
            for e in range(E):
                s[f"{m}.experts.{e}.up_proj.weight"] = (F, din)
                s[f"{m}.experts.{e}.down_proj.weight"] = (din, F)
            if c.moe_latent_size:
                s[f"{m}.fc1_latent_proj.weight"] = (din, D)
                s[f"{m}.fc2_latent_proj.weight"] = (D, din)
        else:
            s[f"{m}.up_proj.weight"] = (c.intermediate_size, D)
            s[f"{m}.down_proj.weight"] = (D, c.intermediate_size)
    s[f"mtp.layers.{len(c.mtp_layer_kinds) - 1}.final_layernorm.weight"] = (D,)
    return s


def _qwen_mtp_shapes(c):
    D, L = c.hidden_size, "mtp.layers.0"
    nh, kv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    s = {"mtp.fc.weight": (D, 2 * D), "mtp.pre_fc_norm_embedding.weight": (D,),
         "mtp.pre_fc_norm_hidden.weight": (D,), "mtp.norm.weight": (D,),
         f"{L}.input_layernorm.weight": (D,), f"{L}.post_attention_layernorm.weight": (D,),
         f"{L}.self_attn.q_proj.weight": (2 * nh * hd, D),
         f"{L}.self_attn.k_proj.weight": (kv * hd, D), f"{L}.self_attn.v_proj.weight": (kv * hd, D),
         f"{L}.self_attn.o_proj.weight": (D, nh * hd),
         f"{L}.self_attn.q_norm.weight": (hd,), f"{L}.self_attn.k_norm.weight": (hd,)}
    m = f"{L}.mlp"
    if c.family == "qwen3_5":
        F = c.intermediate_size
        s.update({f"{m}.gate_proj.weight": (F, D), f"{m}.up_proj.weight": (F, D),
                  f"{m}.down_proj.weight": (D, F)})
    else:
        E, F, Fs = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        s[f"{m}.gate.weight"] = (E, D)
        for e in range(E):
            s.update({f"{m}.experts.{e}.gate_proj.weight": (F, D),
                      f"{m}.experts.{e}.up_proj.weight": (F, D),
                      f"{m}.experts.{e}.down_proj.weight": (D, F)})
        s.update({f"{m}.shared_expert.gate_proj.weight": (Fs, D),
                  f"{m}.shared_expert.up_proj.weight": (Fs, D),
                  f"{m}.shared_expert.down_proj.weight": (D, Fs),
                  f"{m}.shared_expert_gate.weight": (1, D)})
    return s


def _random(shapes, rng, zero_centred):
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:        # norms, correction bias
            if "correction_bias" in name:
                w = 0.05 * rng.standard_normal(shape)
            else:
                w = 0.2 * rng.standard_normal(shape) + (0.0 if zero_centred else 1.0)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = w.astype(np.float32)
    return out


def _fuse_experts(mtp, c):
    """Qwen3.6-style packed MTP experts: gate_up_proj [E, 2F, D] (gate rows first),
    down [E, D, F]."""
    m, E = "mtp.layers.0.mlp.experts", c.num_experts
    fused = {k: v for k, v in mtp.items() if not k.startswith(f"{m}.")}
    fused[f"{m}.gate_up_proj"] = np.stack([np.concatenate(
        [mtp[f"{m}.{e}.gate_proj.weight"], mtp[f"{m}.{e}.up_proj.weight"]]) for e in range(E)])
    fused[f"{m}.down_proj"] = np.stack([mtp[f"{m}.{e}.down_proj.weight"] for e in range(E)])
    return fused


# ----------------------------------------------------------------------------- set-up

FAMILIES = {
    "nemotron_h": dict(ref=_nemotron_ref, shapes=_nemotron_mtp_shapes, zc=False),
    "qwen": dict(ref=_qwen_ref, shapes=_qwen_mtp_shapes, zc=True),
}
VARIANTS = [("nemotron_h", "nemotron_h", False), ("nemotron_h", "nemotron_h_latent_moe", False),
            ("qwen", "qwen3_next", False), ("qwen", "qwen3_5", False),
            ("qwen", "qwen3_5_moe", False), ("qwen", "qwen3_5_moe", True)]


def _write(directory, variant, tensors):
    """An HF checkpoint dir with the fixture's config and `tensors`; returns its path."""
    with open(f"{FIXTURES}/{variant}/config.json") as f:
        cfg = json.load(f)
    if variant == "nemotron_h_latent_moe":     # fixture declares no MTP: give it "*E" (latent MoE)
        cfg["num_nextn_predict_layers"] = 1
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    return str(directory)


def _setup(tmp_path, family, variant, fused=False, seed=0, mute=()):
    """Loads the fixture with random mtp.* tensors (those whose name contains a string of
    `mute` zeroed). Returns cfg, model, tensors, mtp, W (float64 mtp), embedding, lm_head."""
    f = FAMILIES[family]
    tensors = load_file(f"{FIXTURES}/{variant}/model.safetensors")
    assert not any(n.startswith("mtp.") for n in tensors)
    cfg = load_config(_write(tmp_path / "base", variant, tensors))
    mtp = _random(f["shapes"](cfg), np.random.default_rng(seed), f["zc"])
    mtp = {k: np.zeros_like(v) if any(m in k for m in mute) else v for k, v in mtp.items()}
    tensors.update(_fuse_experts(mtp, cfg) if fused else mtp)
    cfg, model = load_hf(_write(tmp_path / "mtp", variant, tensors))
    assert model.mtp is not None
    W = {k: np.asarray(v, np.float64) for k, v in mtp.items()}
    if family == "nemotron_h":
        emb = np.asarray(tensors["backbone.embeddings.weight"], np.float64)
        head = np.asarray(tensors["lm_head.weight"], np.float64)
    else:
        emb = np.asarray(tensors[f"{cfg.weight_prefix}embed_tokens.weight"], np.float64)
        head = emb if cfg.tie_word_embeddings else np.asarray(tensors["lm_head.weight"], np.float64)
    return cfg, model, tensors, mtp, W, emb, head


def _close(got, ref, what):
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max(), err_msg=what)


def _run_chain(family, cfg, model, W, emb, head, rng, steps=2):
    """T = 3 from an empty MTP cache, then `steps` chained single-token drafts (the head's own
    hidden and argmax token fed back) continuing from the cache; checks every step against the
    numpy reference. Returns the first step's logits."""
    ref_fn = FAMILIES[family]["ref"]
    b, T, D, V = len(SLOTS), 3, cfg.hidden_size, cfg.vocab_size
    cache = model.init_cache(5, 16)
    assert len(cache.mtp) == len(model.mtp.layers)
    hidden = rng.standard_normal((b, T, D)).astype(np.float32)
    tokens = rng.integers(0, V, (b, T)).astype(np.int32)
    slots = jnp.asarray(SLOTS)
    kvs = [[None] * len(model.mtp.layers) for _ in range(b)]
    start, first = 0, None
    for step in range(steps + 1):
        logits, h, cache = model.draft(cache, jnp.asarray(hidden), jnp.asarray(tokens), slots,
                                       jnp.full((b,), start, jnp.int32))
        n = tokens.shape[1]
        assert logits.shape == (b, n, V) and logits.dtype == jnp.float32
        assert h.shape == (b, n, D)
        for r in range(b):
            rl, rh, kvs[r] = ref_fn(cfg, W, emb, head, hidden[r].astype(np.float64), tokens[r],
                                    kvs[r], start)
            _close(logits[r], rl, f"step {step} row {r} logits")
            _close(h[r], rh, f"step {step} row {r} hidden")
            assert int(np.argmax(rl[-1])) == int(np.argmax(np.asarray(logits[r, -1])))
        first = logits if first is None else first
        start += n
        hidden = np.asarray(h[:, -1:])                              # chained drafting
        tokens = np.asarray(jnp.argmax(logits[:, -1:], axis=-1)).astype(np.int32)
    return first


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("family,variant,fused", VARIANTS)
def test_draft_matches_numpy_reference(tmp_path, family, variant, fused):
    cfg, model, _, _, W, emb, head = _setup(tmp_path, family, variant, fused)
    _run_chain(family, cfg, model, W, emb, head, np.random.default_rng(1))


@pytest.mark.parametrize("family,variant", [("nemotron_h", "nemotron_h"), ("qwen", "qwen3_5")])
def test_fusion_by_hand(tmp_path, family, variant):
    """One position, written out from the references in the module docstring: with the block's
    mixers muted (zero weights: each adds 0 to the residual stream), the head's hidden state is
    final_norm(W_fuse @ [norm_e(embed(t)) | norm_h(h)]) and its logits lm_head @ that. Swapping
    the halves or dropping either norm moves the result far outside the tolerance."""
    mute = (".mixer.",) if family == "nemotron_h" else (".self_attn.", ".mlp.")
    cfg, model, _, _, W, emb, head = _setup(tmp_path, family, variant, mute=mute)
    if family == "nemotron_h":
        last = len(cfg.mtp_layer_kinds) - 1
        eps, unit, names = cfg.layer_norm_epsilon, 0.0, [
            "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
            "mtp.layers.0.eh_proj.weight", f"mtp.layers.{last}.final_layernorm.weight"]
    else:                                                 # zero-centred: x * (1 + w)
        eps, unit, names = cfg.rms_norm_eps, 1.0, [
            "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.fc.weight", "mtp.norm.weight"]
    w_e, w_h, fuse, w_out = (W[n] for n in names)
    rms = lambda x, w: x / np.sqrt(np.mean(x * x) + eps) * (unit + w)
    rng = np.random.default_rng(4)
    h = rng.standard_normal(cfg.hidden_size).astype(np.float32)
    tok = int(rng.integers(cfg.vocab_size))
    e_n, h_n = rms(emb[tok], w_e), rms(h.astype(np.float64), w_h)
    want = rms(fuse @ np.concatenate([e_n, h_n]), w_out)
    logits, hidden, _ = model.draft(model.init_cache(2, 4), jnp.asarray(h[None, None]),
                                    jnp.asarray([[tok]], jnp.int32), jnp.asarray([1], jnp.int32),
                                    jnp.zeros((1,), jnp.int32))
    _close(hidden[0], want[None], "hidden")
    _close(logits[0], (head @ want)[None], "logits")
    for what, x in (("[hidden | embedding]", [h_n, e_n]), ("no embedding norm", [emb[tok], h_n]),
                    ("no hidden norm", [e_n, h])):
        other = rms(fuse @ np.concatenate(x), w_out)
        assert np.abs(other - want).max() > 100 * RTOL * np.abs(want).max(), what


@pytest.mark.parametrize("family,variant", [("nemotron_h", "nemotron_h"), ("qwen", "qwen3_next")])
def test_head_shares_target_embedding_and_lm_head(tmp_path, family, variant):
    cfg, model, _, mtp, W, emb, head = _setup(tmp_path, family, variant)
    # no own copies: the head's parameters are exactly the mtp.* tensors
    n_head = sum(int(np.prod(x.shape))
                 for x in jax.tree_util.tree_leaves(nnx.state(model.mtp, nnx.Param)))
    assert n_head == sum(v.size for v in mtp.values())
    base = _run_chain(family, cfg, model, W, emb, head, np.random.default_rng(2), steps=0)
    rng = np.random.default_rng(3)
    emb2 = emb + 0.5 * rng.standard_normal(emb.shape)
    table = model.embeddings if family == "nemotron_h" else model.embed_tokens
    table[...] = jnp.asarray(emb2, jnp.float32)
    new = _run_chain(family, cfg, model, W, emb2, head, np.random.default_rng(2), steps=0)
    assert np.abs(np.asarray(new) - np.asarray(base)).max() > 1e-2
    head2 = head + 0.5 * rng.standard_normal(head.shape)
    model.lm_head.kernel[...] = jnp.asarray(head2.T, jnp.float32)
    _run_chain(family, cfg, model, W, emb2, head2, np.random.default_rng(2), steps=0)


@pytest.mark.parametrize("family,variant,missing,bad", [
    ("nemotron_h", "nemotron_h", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight"),
    ("nemotron_h", "nemotron_h", "mtp.layers.1.final_layernorm.weight",
     "mtp.layers.1.mixer.experts.3.up_proj.weight"),
    ("qwen", "qwen3_next", "mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"),
    ("qwen", "qwen3_5", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight"),
    ("qwen", "qwen3_5_moe", "mtp.layers.0.mlp.experts.5.down_proj.weight", "mtp.norm.weight"),
])
def test_loader_errors(tmp_path, family, variant, missing, bad):
    """The MTP head's tensors are checked like the body's: mtp=True without mtp.* tensors,
    missing, misshapen and unused tensors are one-line ConvertErrors naming the tensor."""
    cfg, _, tensors, mtp, *_ = _setup(tmp_path, family, variant)
    base = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    with pytest.raises(ConvertError, match="mtp=True but .* has no mtp"):
        load_hf(_write(tmp_path / "none", variant, base), mtp=True)
    with pytest.raises(ConvertError, match=f"missing 1 tensor.*: {missing}$"):
        load_hf(_write(tmp_path / "missing", variant,
                       {k: v for k, v in tensors.items() if k != missing}))
    shape = mtp[bad].shape
    # transposed / longer
    shape = shape[::-1] if len(set(shape)) > 1 else (shape[0] + 1,) + shape[1:]
    wrong = dict(tensors, **{bad: np.zeros(shape, np.float32)})
    with pytest.raises(ConvertError, match=f"shape mismatch for {bad}: expected"):
        load_hf(_write(tmp_path / "wrong", variant, wrong))
    with pytest.raises(ConvertError, match="1 unused tensor.*: mtp.layers.0.extra.weight$"):
        load_hf(_write(tmp_path / "extra", variant,
                       dict(tensors, **{"mtp.layers.0.extra.weight": mtp[bad]})))
    # without an MTP head the mtp.* tensors are skipped, and draft refuses
    _, model = load_hf(tmp_path / "mtp", mtp=False)
    assert model.mtp is None and model.init_cache(2, 4).mtp == ()
    with pytest.raises(ValueError, match="without an MTP head"):
        model.draft(model.init_cache(2, 4), jnp.zeros((1, 1, cfg.hidden_size)),
                    jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32),
                    jnp.zeros((1,), jnp.int32))
