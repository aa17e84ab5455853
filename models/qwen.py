"""Qwen3-Next (`qwen3_next`) and Qwen3.5 dense / MoE (`qwen3_5`, `qwen3_5_moe`, text part) in Flax
NNX with an explicit decode cache (same contract as `models.nemotron_h`).

Every layer is two pre-norm residual sub-blocks: a token mixer, Gated DeltaNet (`gdn`) or gated
attention (`attention`), then an FFN (a softmax top-k MoE with a sigmoid-gated shared expert, or a
SwiGLU MLP). Layer, q/k and final norms are zero-centred (x (1 + w)); the GDN output norm is plain
(x w), applied per value head before the silu(z) gate. Modules hold weights only:

    logits, cache = model.prefill(cache, tokens, lengths, slots)          # new requests
    logits, cache = model.decode(cache, tokens, slots, mode="replay")      # one token per row
    (verify / commit for speculative windows: see models.hybrid.HybridLM)
    logits, hidden, cache = model.draft(cache, hidden, next_tokens, slots, starts)  # mtp=True

GDN projections are stored in the flat Qwen3.5 order, fused into one `in_proj` with output columns
[q (Hk dk) | k (Hk dk) | v (Hv dv) | z (Hv dv) | b (Hv) | a (Hv)]; the weight table
(`convert.mappings.qwen`) de-interleaves Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` at load
time, so one code path serves both. Use `models.runner.Runner` to run it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from models import moe
from models.cache import ModelCache, SSMCache
from models.common import (
    KVCache,
    Linear,
    RMSNorm,
    RowParallelLinear,
    cached_attention,
    rms_norm,
    tied_logits,
)
from models.config import QwenHybridConfig
from models.hybrid import (
    HybridLM,
    prefill_chunk,
    prefill_inputs,
    ring_output,
    ssm_buffers,
    ssm_cache,
    store_pending,
    store_prefill,
    token_validity,
    verify_draft_rows,
)
from models.parallel import fused_view, kv_head, split_fused, tp_sum
from models.validation import check_cache_settings, check_model_dtype
from pallas_kernels import gdn
from pallas_kernels.conv import conv_update
from pallas_kernels.gdn.prefill import chunk_gated_delta_rule
from pallas_kernels.moe import SharedWeights
from pallas_kernels.moe.router import shared_scale
from pallas_kernels.ring import conv_window

_HI = lax.Precision.HIGHEST


class GatedDeltaNet(nnx.Module):
    """GDN mixer: in_proj -> causal depthwise conv (no bias) + SiLU over [q | k | v] -> L2-normed
    q, k (q * dk^-1/2) -> gated delta rule -> per-head plain RMSNorm, * silu(z) -> out_proj.
    Under tensor parallelism the in_proj columns and conv channels are device-major for
    `tp_layout` devices (see `models.parallel.fused_view`) and out_proj is row-parallel: one
    all-reduce per mixer."""

    def __init__(self, cfg: QwenHybridConfig, dtype=jnp.float32):
        Hv, C = cfg.linear_num_value_heads, cfg.gdn_conv_dim
        self.cfg = cfg
        self.tp_layout = 1              # set by models.sharding when the weights are laid out
        self.in_proj = Linear(cfg.hidden_size, C + cfg.gdn_value_dim + 2 * Hv, dtype=dtype)
        self.conv_weight = nnx.Param(jnp.zeros((C, cfg.linear_conv_kernel_dim), dtype))   # [C, K]
        self.dt_bias = nnx.Param(jnp.zeros((Hv,), jnp.float32))
        self.A_log = nnx.Param(jnp.zeros((Hv,), jnp.float32))
        self.norm = nnx.Param(jnp.ones((cfg.linear_value_head_dim,), jnp.float32))
        self.out_proj = RowParallelLinear(cfg.gdn_value_dim, cfg.hidden_size, dtype=dtype)

    def _split(self, proj):
        """in_proj output [.., C + Hv dv + 2 Hv] -> pre-conv qkv [.., C] (device-major blocks,
        as the conv weights and states), z [.., Hv, dv], and the raw gate inputs ba [.., 2 Hv]
        (b then a; see `_gates`) (this device's C and Hv)."""
        blocks, c, d = fused_view(self.cfg, self.tp_layout)
        Hv = c.linear_num_value_heads
        qkv, z, b, a = split_fused(proj, (c.gdn_conv_dim, c.gdn_value_dim, Hv, Hv), blocks)
        z = z.reshape(z.shape[:-1] + (d.linear_num_value_heads, d.linear_value_head_dim))
        return qkv, z, jnp.concatenate([b, a], axis=-1)

    def _gates(self, ba):
        """ba [.., 2 Hv] -> g, beta [.., Hv] fp32 (`gdn.gates` of a, b)."""
        b, a = jnp.split(ba, 2, axis=-1)
        return gdn.gates(a, b, self.A_log[...], self.dt_bias[...])

    @property
    def replay_width(self) -> int:
        """Channels of the per-token inputs a prefill scans: pre-conv qkv, then raw b, a."""
        return self.cfg.gdn_conv_dim + 2 * self.cfg.linear_num_value_heads

    def _qkv(self, conv_out):
        """Post-conv [.., C] -> q, k [.., Hk, dk] prepared fp32, v [.., Hv, dv]."""
        blocks, c, _ = fused_view(self.cfg, self.tp_layout)
        KD = c.gdn_key_dim
        return self._heads(*split_fused(jax.nn.silu(conv_out), (KD, KD, c.gdn_value_dim),
                                        blocks))

    def _heads(self, q, k, v):
        """Activated q, k [.., Hk dk], v [.., Hv dv] -> q, k [.., Hk, dk] prepared fp32,
        v [.., Hv, dv]."""
        d = fused_view(self.cfg, self.tp_layout)[2]
        lead = q.shape[:-1]
        q = q.reshape(lead + (d.linear_num_key_heads, d.linear_key_head_dim))
        k = k.reshape(lead + (d.linear_num_key_heads, d.linear_key_head_dim))
        v = v.reshape(lead + (d.linear_num_value_heads, d.linear_value_head_dim))
        q, k = gdn.prepare_qk(q, k)
        return q, k, v

    def _output(self, o, z):
        """Norm first (plain weight, per value head over dv), then the gate, then out_proj
        (all-reduced over tp). o, z [.., Hv, dv] -> [.., D]."""
        y = rms_norm(o.astype(jnp.float32), self.norm[...], self.cfg.rms_norm_eps)
        y = y * jax.nn.silu(z.astype(jnp.float32))
        y = y.reshape(y.shape[:-2] + (-1,))
        return tp_sum(self.out_proj(y.astype(self.out_proj.kernel[...].dtype)))

    def prefill(self, h, lengths, cache: SSMCache, slots, starts=None, block=0, ring=None):
        """h [b, T, D] right-padded prompts of `lengths`, continuing each slot's sequence of
        starts[i] tokens (see `models.hybrid.resume_state`; None: from a zero state), after
        which ring (prior inputs [b, block, Cu], r [b]) replays r more (see
        `models.hybrid.ring_window`; block > 0 only). Returns out [b, T, D], the cache with
        checkpoint = state after the prompt [Hv, dv, dk], conv state = its last K-1 pre-conv
        inputs, and with block > 0 the (state, conv state, inputs) of every block of the scan
        ([b, n, Hv, dv, dk] fp32, [b, n, K-1, C], [b, n, block, Cu] with Cu =
        `replay_width`; else None)."""
        qkv, z, ba = self._split(self.in_proj(h))
        p = prefill_inputs(qkv, ba, lengths, cache, slots, starts, self.conv_weight[...], None,
                           block, ring)
        q, k, v = self._qkv(p.conv)
        g, beta = self._gates(p.extra)
        o, state, *blocks = chunk_gated_delta_rule(q, k, v, g, beta, p.lengths, p.state0,
                                                   chunk=prefill_chunk(block), block=block)
        return (self._output(ring_output(o, h.shape[1], ring), z),
                store_prefill(cache, slots, state, p.conv_state),
                p.kept(blocks[0] if block else None, block))

    def decode(self, h, cache: SSMCache, counts, slots, rows, mode, impl):
        """One token per row: h [b, 1, D]. Returns out [b, 1, D] and the cache (counts are
        advanced by the model once per step). The conv and its state shift are one op
        (`pallas_kernels.conv.conv_update`: under impl "pallas" one kernel, in place), which
        reads qkv in the projection's output and writes q, k, v SiLU'd."""
        proj = self.in_proj(h)
        qkv, z, ba = self._split(proj)
        g, beta = self._gates(ba)
        blocks, c, _ = fused_view(self.cfg, self.tp_layout)
        if blocks == 1:     # the conv reads qkv in place and writes q, k, v activated
            KD = c.gdn_key_dim
            (q, k, v), conv_state = conv_update(
                cache.conv, proj, self.conv_weight[...], None, slots, offset=0,
                activation="silu", out_dtype=h.dtype, splits=(KD, KD, c.gdn_value_dim),
                impl=impl)
            q, k, v = self._heads(q[:, 0], k[:, 0], v[:, 0])
        else:
            conv, conv_state = conv_update(cache.conv, qkv, self.conv_weight[...], None,
                                           slots, impl=impl)   # [b, 1, C] f32
            q, k, v = self._qkv(conv[:, 0].astype(h.dtype))
        if mode == "replay":
            o, bufs = gdn.replay_decode(cache.buffers, counts, q, k, v, g[:, 0], beta[:, 0],
                                        slots, impl=impl)
        else:
            o, ck = gdn.standard_decode(cache.buffers.checkpoint, q, k, v, g[:, 0], beta[:, 0],
                                        rows, impl=impl)
            bufs = cache.buffers._replace(checkpoint=ck)
        out = self._output(o[:, None], z)
        return out, cache.replace(buffers=bufs, conv=conv_state)

    def verify(self, h, cache: SSMCache, counts, slots, rows, mode, impl):
        """A speculative window of T tokens per row: h [b, T, D]; the window's (k, d, g) go into
        the rings (replay) or the states after each token into the slots' draft rows
        (standard), its pre-conv inputs into `pending`, uncommitted."""
        qkv, z, ba = self._split(self.in_proj(h))
        g, beta = self._gates(ba)
        conv = conv_window(cache.conv, qkv, self.conv_weight[...], None, slots)   # [b, T, C] f32
        q, k, v = self._qkv(conv.astype(h.dtype))
        if mode == "replay":
            o, bufs = gdn.replay_verify(cache.buffers, counts, q, k, v, g, beta, slots,
                                        impl=impl)
        else:
            drafts = verify_draft_rows(cache, rows, slots, h.shape[1])
            o, ck = gdn.standard_verify(cache.buffers.checkpoint, q, k, v, g, beta, rows,
                                        drafts, impl=impl)
            bufs = cache.buffers._replace(checkpoint=ck)
        return self._output(o, z), store_pending(cache.replace(buffers=bufs), slots, qkv)


def rope(x, positions, rotary_dim: int, theta: float):
    """NeoX (rotate-half) RoPE on the first `rotary_dim` dims of x [b, T, heads, hd] at
    positions [b, T]; the other dims pass through. Computed in fp32."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)
    f = positions.astype(jnp.float32)[..., None] * inv_freq                  # [b, T, rd/2]
    cos, sin = jnp.cos(f)[:, :, None], jnp.sin(f)[:, :, None]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :rotary_dim // 2], xf[..., rotary_dim // 2:rotary_dim]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., rotary_dim:]], -1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    """Causal GQA attention with zero-centred q/k norms, partial RoPE and a per-head sigmoid
    output gate: q_proj yields [q_h | gate_h] per head (M-RoPE reduces to 1-D RoPE for text).
    Under tensor parallelism each device has 1/tp of the query heads (and of the KV heads, or
    all of them replicated when there are fewer than tp); o_proj is row-parallel."""

    def __init__(self, cfg: QwenHybridConfig, dtype=jnp.float32):
        nh, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        D = cfg.hidden_size
        self.nh, self.kv, self.hd = nh, kv, hd
        self.gated = cfg.attn_output_gate
        self.rotary_dim, self.theta = cfg.rotary_dim, cfg.rope_theta
        bias = cfg.attention_bias
        self.q_proj = Linear(D, nh * hd * (2 if self.gated else 1), bias=bias, dtype=dtype)
        self.k_proj = Linear(D, kv * hd, bias=bias, dtype=dtype)
        self.v_proj = Linear(D, kv * hd, bias=bias, dtype=dtype)
        self.o_proj = RowParallelLinear(nh * hd, D, bias=bias, dtype=dtype)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, zero_centered=True)

    def __call__(self, h, cache: KVCache, slots, starts, impl="auto"):
        """h [b, T, D]; token t of row i sits at position starts[i] + t. Returns [b, T, D]."""
        b, T, _ = h.shape
        qg = self.q_proj(h).reshape(b, T, -1, self.hd * (2 if self.gated else 1))  # its heads
        q = qg[..., :self.hd]
        pos = starts[:, None] + jnp.arange(T)[None, :]
        q = rope(self.q_norm(q), pos, self.rotary_dim, self.theta)
        k = rope(self.k_norm(self.k_proj(h).reshape(b, T, -1, self.hd)), pos,
                 self.rotary_dim, self.theta)
        v = self.v_proj(h).reshape(b, T, -1, self.hd)
        o, cache = cached_attention(q, k, v, cache, slots, starts, kv_head(self.nh, self.kv),
                                    impl)
        if self.gated:
            o = o * jax.nn.sigmoid(qg[..., self.hd:])
        return tp_sum(self.o_proj(o.reshape(b, T, -1))), cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); under tensor parallelism column- then row-parallel."""

    def __init__(self, din, width, dtype=jnp.float32):
        self.gate_proj = Linear(din, width, dtype=dtype)
        self.up_proj = Linear(din, width, dtype=dtype)
        self.down_proj = RowParallelLinear(width, din, dtype=dtype)

    def __call__(self, x):
        return tp_sum(self.partial(x))

    def partial(self, x):
        """This device's partial sum (before the all-reduce): the MoE adds it to its own."""
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))

    def weights(self):
        """As a MoE's shared expert in the routed experts' launch."""
        return SharedWeights(self.up_proj.kernel[...], self.down_proj.kernel[...],
                             self.gate_proj.kernel[...])


class MoE(nnx.Module):
    """Softmax router (fp32), top-k, renormalised if norm_topk_prob (`models.moe.softmax_topk`);
    SwiGLU experts run sparsely; plus a shared SwiGLU expert scaled by
    sigmoid(shared_expert_gate(x)) (in the routed experts' launch where
    `models.moe.shared_chunks` says so). Under tensor parallelism every expert (and the
    shared one) has 1/tp of its width on each device and routing is replicated: one all-reduce.
    """

    def __init__(self, cfg: QwenHybridConfig, dtype=jnp.float32):
        E, F, D = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.cfg = cfg
        self.gate = nnx.Param(jnp.zeros((E, D), jnp.float32))          # router
        self.gate_w = nnx.Param(jnp.zeros((E, D, F), dtype))
        self.up = nnx.Param(jnp.zeros((E, D, F), dtype))
        self.down = nnx.Param(jnp.zeros((E, F, D), dtype))
        Fs = cfg.shared_expert_intermediate_size
        self.shared = MLP(D, Fs, dtype) if Fs else None
        self.shared_gate = Linear(D, 1, dtype=dtype) if Fs else None

    def route(self, x, impl="auto", tiling=None, shared_chunks=0):
        """x [..., D] -> expert ids [..., k + C] int32, weights [..., k + C] fp32, the shared
        expert's C = shared_chunks chunks last, weighted by its gate (impl, tiling:
        `models.moe.softmax_topk`'s)."""
        gate = self.shared_gate.kernel[...].reshape(-1) if shared_chunks else None   # [D]
        return moe.softmax_topk(x, self.gate[...], top_k=self.cfg.num_experts_per_tok,
                                norm_topk_prob=self.cfg.norm_topk_prob,
                                shared_chunks=shared_chunks, shared_gate=gate, impl=impl,
                                tiling=tiling)

    def shared_partial(self, x):
        """The shared expert outside the routed launch, times its gate: this device's partial
        sum [..., D] (a replicated gate times a partial sum)."""
        scale = shared_scale(x, self.shared_gate.kernel[...].reshape(-1))
        return scale[..., None].astype(x.dtype) * self.shared.partial(x)

    def __call__(self, x, valid=None, *, shared_in_launch=None):
        """x [..., D]; valid [...] bool: the real tokens (the others get no routed experts).
        shared_in_launch: force the shared expert into (True) or out of (False) the routed
        experts' launch; None: `models.moe.shared_chunks`."""
        up = self.up[...]
        C = 0 if self.shared is None else moe.shared_chunks(
            x, up.shape[2], self.shared.up_proj.kernel.shape[1], shared_in_launch)
        ids, weights = self.route(x, shared_chunks=C)
        y = moe.routed_experts(x, ids, weights, valid, up, self.down[...],
                               w_gate=self.gate_w[...], activation="swiglu",
                               num_experts=self.cfg.num_experts,
                               shared=self.shared.weights() if C else None)
        return tp_sum(y + self.shared_partial(x) if self.shared is not None and not C else y)


class Block(nnx.Module):
    def __init__(self, cfg: QwenHybridConfig, kind: str, ffn_kind: str, dtype=jnp.float32):
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                                                zero_centered=True)
        self.mixer = GatedDeltaNet(cfg, dtype) if kind == "gdn" else Attention(cfg, dtype)
        self.mlp = MoE(cfg, dtype) if ffn_kind == "moe" else MLP(cfg.hidden_size,
                                                                 cfg.intermediate_size, dtype)

    def ffn(self, h, valid):
        """The FFN sub-block's residual branch; valid [b, T] bool marks the real tokens (MoE)."""
        x = self.post_attention_layernorm(h)
        if not isinstance(self.mlp, MoE):
            return self.mlp(x)
        with jax.named_scope("moe"):     # its class in profiles (`replayjax.bench.trace`)
            return self.mlp(x, valid)


def num_mtp_layers(cfg: QwenHybridConfig) -> int:
    """MTP layers of a model built with mtp=True: the config's count, or 1 when it declares none
    (vLLM reads `num_nextn_predict_layers` / `mtp_num_hidden_layers` with default 1; our config
    parser cannot tell an absent field from 0)."""
    return cfg.num_mtp_layers or 1


class MTPHead(nnx.Module):
    """Multi-token-prediction head (`mtp.*` as the hub checkpoints ship it; vLLM
    Qwen3NextMultiTokenPredictor, Qwen3_5MultiTokenPredictor):

        x = fc([pre_fc_norm_embedding(embed(t+1)) | pre_fc_norm_hidden(h_t)])   # embedding first
        x = x + Attn(input_layernorm(x), positions)       # full gated attention, RoPE, own KV
        x = x + FFN(post_attention_layernorm(x))           # MoE (Qwen3-Next, 3.5-MoE) / SwiGLU
        out = norm(x)                                      # logits: the target's lm_head

    All four norms (pre_fc_norm_embedding, pre_fc_norm_hidden, the layer's two, mtp.norm) and the
    q/k norms are zero-centred (x (1 + w)). h_t is the target's hidden state after its final norm.
    The embedding and the LM head are the target's. With n MTP layers, draft step k uses layer
    k % n (vLLM `spec_step_idx % num_mtp_layers`; n = 1 in every known checkpoint)."""

    def __init__(self, cfg: QwenHybridConfig, dtype=jnp.float32):
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = RMSNorm(D, eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(D, eps, zero_centered=True)
        self.fc = Linear(2 * D, D, dtype=dtype)
        self.layers = nnx.List([Block(cfg, "attention", cfg.mtp_ffn_kind, dtype)
                                for _ in range(num_mtp_layers(cfg))])
        self.norm = RMSNorm(D, eps, zero_centered=True)

    def __call__(self, embeddings, hidden, next_tokens, caches, slots, starts, step=0):
        """hidden [b, T, D] (target, final-normed); next_tokens [b, T]; caches: one KVCache per
        MTP layer; starts [b] = positions already in the MTP cache (token t sits at RoPE position
        starts + t). Returns the head's output hidden [b, T, D] (after mtp.norm) and the caches."""
        e = self.pre_fc_norm_embedding(jnp.take(embeddings, next_tokens, axis=0))
        x = self.fc(jnp.concatenate([e, self.pre_fc_norm_hidden(hidden).astype(e.dtype)], -1))
        i = step % len(self.layers)
        layer = self.layers[i]
        out, kv = layer.mixer(layer.input_layernorm(x), caches[i], slots, starts)
        x = x + out.astype(x.dtype)
        x = x + layer.ffn(x, token_validity(slots, x.shape[1])).astype(x.dtype)
        return self.norm(x), caches[:i] + (kv,) + caches[i + 1:]


class QwenHybrid(HybridLM):
    def __init__(self, cfg: QwenHybridConfig, dtype=jnp.float32, *, mtp: bool = False):
        """`mtp=True` builds the MTP head (checkpoints that ship `mtp.*` tensors; HF-saved ones
        have none, so it is off by default)."""
        dtype = check_model_dtype(dtype)
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
        if mtp and cfg.mtp_use_dedicated_embeddings:
            raise ValueError("mtp_use_dedicated_embeddings = true is not supported (the MTP head "
                             "shares the target's embedding)")
        self.cfg = cfg
        self.embed_tokens = nnx.Param(jnp.zeros((cfg.vocab_size, cfg.hidden_size), dtype))
        self.layers = nnx.List([Block(cfg, k, f, dtype)
                                for k, f in zip(cfg.layer_kinds, cfg.ffn_kinds)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype))
        self.mtp = MTPHead(cfg, dtype) if mtp else None

    def draft_hidden(self, cache: ModelCache, hidden, next_tokens, slots, starts, *,
                     step: int = 0):
        """One MTP step up to the LM head (`HybridLM.draft`): the head's hidden [b, T, D] (its
        `local_logits` predict the token after `next_tokens`; feed it back to draft further)
        and the cache (MTP KV written at positions starts..starts+T-1).

        RoPE positions are the MTP cache positions starts + t. vLLM gives the drafter the target
        positions of the hidden states it consumes (vLLM qwen3_next_mtp.py: input_ids[i] =
        target_ids[i+1] at target position i, +1 per further draft step); keeping the MTP cache
        aligned with the target (MTP entry j <-> the target's hidden at position j, next token
        j+1) makes the two identical. `step` (static) picks MTP layer step % n."""
        if self.mtp is None:
            raise ValueError("this model was built without an MTP head")
        h, mtp_caches = self.mtp(self.embed_tokens[...], hidden, next_tokens, cache.mtp, slots,
                                 starts, step)
        return h, cache.replace(mtp=mtp_caches)

    def local_logits(self, x):
        """The LM head (`HybridLM`'s contract): final-normed [..., D] -> fp32 logits of this
        device's vocabulary shard under a vocab-parallel head, else all [..., V]."""
        logits = (tied_logits(x, self.embed_tokens[...]) if self.lm_head is None
                  else self.lm_head(x))
        return logits.astype(jnp.float32)

    # ---------------------------------------------------------------- cache
    def init_cache(self, num_slots: int, max_len: int, *, window: int = 16, max_verify: int = 1,
                   state_dtype=jnp.float32, ring_dtype=None, kv_dtype=None,
                   ssm_mode: str = "replay") -> ModelCache:
        """Zeroed cache for `num_slots` slots (slot 0 = null slot) of up to `max_len` tokens;
        `max_verify` > 1 makes room for speculative windows of up to that many tokens.
        GDN rings default to float32 (bf16 corrected updates drift, see `gdn.init_gdn_buffers`).
        `ssm_mode="standard"`: one-entry rings (`window` unused) and, for max_verify = T > 1,
        T draft states per slot for standard-mode verify (see `models.cache`); decode in either
        mode works on a replay cache. The arguments are checked by
        `models.validation.check_cache_settings`."""
        c = self.cfg
        act = self.embed_tokens[...].dtype
        state_dtype, ring_dtype, kv_dtype = check_cache_settings(
            num_slots, max_len, window=window, max_verify=max_verify, ssm_mode=ssm_mode,
            state_dtype=state_dtype,
            ring_dtype=jnp.float32 if ring_dtype is None else ring_dtype,
            kv_dtype=act if kv_dtype is None else kv_dtype)
        init = lambda S, L: gdn.init_gdn_buffers(
            S, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
            c.linear_value_head_dim, L, state_dtype, ring_dtype)
        layers = []
        for kind in c.layer_kinds:
            if kind == "gdn":
                bufs = ssm_buffers(init, num_slots, window, max_verify, ssm_mode)
                layers.append(ssm_cache(bufs, num_slots, c.linear_conv_kernel_dim, c.gdn_conv_dim,
                                        act, max_verify))
            else:
                layers.append(KVCache.zeros(num_slots, max_len, c.num_key_value_heads, c.head_dim,
                                            kv_dtype))
        mtp = ()
        if self.mtp is not None:
            mtp = tuple(KVCache.zeros(num_slots, max_len, c.num_key_value_heads, c.head_dim,
                                      kv_dtype) for _ in self.mtp.layers)
        return ModelCache.create(num_slots, tuple(layers), mtp)

    # ---------------------------------------------------------------- forward
    def _run(self, tokens, cache: ModelCache, mixer_fn, valid):
        h = jnp.take(self.embed_tokens[...], tokens, axis=0)
        new_layers = []
        for layer, lc in zip(self.layers, cache.layers):
            out, lc = mixer_fn(layer, layer.input_layernorm(h), lc)
            h = h + out.astype(h.dtype)
            h = h + layer.ffn(h, valid).astype(h.dtype)
            new_layers.append(lc)
        return self.norm(h), tuple(new_layers)
