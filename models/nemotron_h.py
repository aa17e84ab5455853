"""Nemotron-H / Nemotron-3 (`model_type: nemotron_h`) in Flax NNX with an explicit decode cache.

One pre-RMSNorm block per layer whose mixer is Mamba-2 (`M`), attention without positional
encoding (`*`), a relu^2 MLP (`-`) or a relu^2 MoE with sigmoid + correction-bias routing (`E`,
optionally latent). Modules hold weights only; the cache is passed in and returned:

    logits, cache = model.prefill(cache, tokens, lengths, slots)          # new requests
    logits, cache = model.decode(cache, tokens, slots, mode="replay")      # one token per row

prefill / decode / verify / commit come from `models.hybrid.HybridLM`; run it through
`models.runner.Runner` (split once, jitted pure steps with a donated cache).
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
    relu2,
    tied_logits,
)
from models.config import NemotronHConfig
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
from pallas_kernels import mamba2
from pallas_kernels.conv import conv_update
from pallas_kernels.mamba2.prefill import ssd_prefill
from pallas_kernels.moe import SharedWeights
from pallas_kernels.ring import conv_window


class Mamba2Mixer(nnx.Module):
    """in_proj -> [z | x | B | C | dt]; causal depthwise conv + SiLU over [x | B | C]; SSM
    (ReplaySSM or standard); gated grouped RMSNorm; out_proj. Under tensor parallelism the
    in_proj columns and conv channels are device-major for `tp_layout` devices (see
    `models.parallel.fused_view`) and out_proj is row-parallel: one all-reduce per mixer."""

    def __init__(self, cfg: NemotronHConfig, dtype=jnp.float32):
        H, I, C = cfg.mamba_num_heads, cfg.mamba_intermediate_size, cfg.mamba_conv_dim
        self.cfg = cfg
        self.tp_layout = 1              # set by models.sharding when the weights are laid out
        self.in_proj = Linear(cfg.hidden_size, cfg.mamba_in_proj_dim, bias=cfg.use_bias,
                              dtype=dtype)
        self.conv_weight = nnx.Param(jnp.zeros((C, cfg.conv_kernel), dtype))   # [C, K]
        self.conv_bias = nnx.Param(jnp.zeros((C,), dtype)) if cfg.use_conv_bias else None
        self.dt_bias = nnx.Param(jnp.zeros((H,), jnp.float32))
        self.A_log = nnx.Param(jnp.zeros((H,), jnp.float32))
        self.D = nnx.Param(jnp.ones((H,), jnp.float32))
        self.norm = nnx.Param(jnp.ones((I,), jnp.float32))
        self.out_proj = RowParallelLinear(I, cfg.hidden_size, bias=cfg.use_bias, dtype=dtype)

    def _split(self, zxbcdt):
        """in_proj output -> z [.., I], pre-conv xbc [.., I + 2GN] (device-major blocks, as the
        conv weights and states), dt [.., H] (this device's I, G, H)."""
        blocks, c, _ = fused_view(self.cfg, self.tp_layout)
        I, GN = c.mamba_intermediate_size, c.n_groups * c.ssm_state_size
        return split_fused(zxbcdt, (I, I + 2 * GN, c.mamba_num_heads), blocks)

    def _ssm_inputs(self, conv_out, dt_raw):
        """Post-conv [.., I + 2GN] -> x [.., H, P], B, C [.., G, N]; dt [.., H] fp32."""
        blocks, c, _ = fused_view(self.cfg, self.tp_layout)
        I, GN = c.mamba_intermediate_size, c.n_groups * c.ssm_state_size
        x, B, C = split_fused(jax.nn.silu(conv_out), (I, GN, GN), blocks)
        return self._heads(x, B, C, dt_raw)

    def _heads(self, x, B, C, dt_raw):
        """Activated x [.., I], B, C [.., GN] -> x [.., H, P], B, C [.., G, N]; dt [.., H]
        fp32."""
        d = fused_view(self.cfg, self.tp_layout)[2]
        lead = x.shape[:-1]
        x = x.reshape(lead + (d.mamba_num_heads, d.mamba_head_dim))
        B = B.reshape(lead + (d.n_groups, d.ssm_state_size))
        C = C.reshape(lead + (d.n_groups, d.ssm_state_size))
        dt = jax.nn.softplus(dt_raw.astype(jnp.float32) + self.dt_bias[...])
        lo, hi = self.cfg.time_step_limit
        if (lo, hi) != (0.0, float("inf")):
            dt = jnp.clip(dt, lo, hi)
        return x, B, C, dt

    def _output(self, y, z):
        """Gate first, then the grouped RMSNorm, then out_proj (all-reduced over tp).
        y [.., I] fp32, z [.., I]."""
        _, _, d = fused_view(self.cfg, self.tp_layout)
        y = y * jax.nn.silu(z.astype(jnp.float32))
        g = y.reshape(y.shape[:-1] + (d.n_groups, -1))
        g = g * lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + d.layer_norm_epsilon)
        y = g.reshape(y.shape) * self.norm[...]
        return tp_sum(self.out_proj(y.astype(self.out_proj.kernel[...].dtype)))

    @property
    def A(self):
        return -jnp.exp(self.A_log[...])

    @property
    def replay_width(self) -> int:
        """Channels of the per-token inputs a prefill scans: pre-conv xBC, then raw dt."""
        return self.cfg.mamba_conv_dim + self.cfg.mamba_num_heads

    def prefill(self, h, lengths, cache: SSMCache, slots, starts=None, block=0, ring=None):
        """h [b, T, D] right-padded prompts of `lengths`, continuing each slot's sequence of
        starts[i] tokens (see `models.hybrid.resume_state`; None: from a zero state), after
        which ring (prior inputs [b, block, Cu], r [b]) replays r more (see
        `models.hybrid.ring_window`; block > 0 only). Returns out [b, T, D], the cache with
        checkpoint = state after the prompt, conv state = its last K-1 pre-conv inputs, and
        with block > 0 the (state, conv state, inputs) of every block of the scan ([b, n, H,
        P, N] fp32, [b, n, K-1, C], [b, n, block, Cu] with Cu = `replay_width`; else None)."""
        z, xbc, dt_raw = self._split(self.in_proj(h))
        p = prefill_inputs(xbc, dt_raw, lengths, cache, slots, starts, self.conv_weight[...],
                           self._conv_bias(), block, ring)
        x, B, C, dt = self._ssm_inputs(p.conv, p.extra)
        y, state, *blocks = ssd_prefill(x, B, C, dt, self.A, self.D[...], p.lengths, p.state0,
                                        chunk=prefill_chunk(block), block=block)
        y = ring_output(y, h.shape[1], ring)
        out = self._output(y.reshape(y.shape[:2] + (-1,)), z)
        return (out, store_prefill(cache, slots, state, p.conv_state),
                p.kept(blocks[0] if block else None, block))

    def _conv_bias(self):
        return None if self.conv_bias is None else self.conv_bias[...]

    def decode(self, h, cache: SSMCache, counts, slots, rows, mode, impl):
        """One token per row: h [b, 1, D]. Returns out [b, 1, D] and the cache (counts are
        advanced by the model once per step). The conv and its state shift are one op
        (`pallas_kernels.conv.conv_update`: under impl "pallas" one kernel, in place), which
        reads xBC in the projection's output and writes x, B, C SiLU'd."""
        zxbcdt = self.in_proj(h)
        z, xbc, dt_raw = self._split(zxbcdt)
        blocks, c, _ = fused_view(self.cfg, self.tp_layout)
        w, bias = self.conv_weight[...], self._conv_bias()
        if blocks == 1:     # the conv reads xBC in place and writes x, B, C activated
            I, GN = c.mamba_intermediate_size, c.n_groups * c.ssm_state_size
            (x, B, C), conv_state = conv_update(
                cache.conv, zxbcdt, w, bias, slots, offset=I, activation="silu",
                out_dtype=h.dtype, splits=(I, GN, GN), impl=impl)
            x, B, C, dt = self._heads(x[:, 0], B[:, 0], C[:, 0], dt_raw[:, 0])
        else:
            conv, conv_state = conv_update(cache.conv, xbc, w, bias, slots, impl=impl)
            x, B, C, dt = self._ssm_inputs(conv[:, 0].astype(h.dtype), dt_raw[:, 0])
        if mode == "replay":
            y, bufs = mamba2.replay_decode(cache.buffers, counts, x, B, C, dt, self.A,
                                           self.D[...], slots, impl=impl)
        else:
            y, ck = mamba2.standard_decode(cache.buffers.checkpoint, x, B, C, dt, self.A,
                                           self.D[...], rows, impl=impl)
            bufs = cache.buffers._replace(checkpoint=ck)
        out = self._output(y.astype(jnp.float32).reshape(y.shape[0], 1, -1), z)
        return out, cache.replace(buffers=bufs, conv=conv_state)

    def verify(self, h, cache: SSMCache, counts, slots, rows, mode, impl):
        """A speculative window of T tokens per row: h [b, T, D]. The window goes into the rings
        (replay) or the states after each token into the slots' draft rows (standard), and its
        pre-conv inputs into `pending`, uncommitted; the model's `commit` settles it."""
        z, xbc, dt_raw = self._split(self.in_proj(h))
        conv = conv_window(cache.conv, xbc, self.conv_weight[...], self._conv_bias(), slots)
        x, B, C, dt = self._ssm_inputs(conv.astype(h.dtype), dt_raw)
        if mode == "replay":
            y, bufs = mamba2.replay_verify(cache.buffers, counts, x, B, C, dt, self.A,
                                           self.D[...], slots, impl=impl)
        else:
            drafts = verify_draft_rows(cache, rows, slots, h.shape[1])
            y, ck = mamba2.standard_verify(cache.buffers.checkpoint, x, B, C, dt, self.A,
                                           self.D[...], rows, drafts, impl=impl)
            bufs = cache.buffers._replace(checkpoint=ck)
        out = self._output(y.astype(jnp.float32).reshape(y.shape[:2] + (-1,)), z)
        return out, store_pending(cache.replace(buffers=bufs), slots, xbc)


class Attention(nnx.Module):
    """Causal GQA attention, no positional encoding, no q/k norm. Under tensor parallelism each
    device has 1/tp of the query heads (and of the KV heads, or all of them replicated when
    there are fewer than tp); o_proj is row-parallel."""

    def __init__(self, cfg: NemotronHConfig, dtype=jnp.float32):
        nh, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        D = cfg.hidden_size
        self.nh, self.kv, self.hd = nh, kv, hd
        bias = cfg.attention_bias
        self.q_proj = Linear(D, nh * hd, bias=bias, dtype=dtype)
        self.k_proj = Linear(D, kv * hd, bias=bias, dtype=dtype)
        self.v_proj = Linear(D, kv * hd, bias=bias, dtype=dtype)
        self.o_proj = RowParallelLinear(nh * hd, D, bias=bias, dtype=dtype)

    def __call__(self, h, cache: KVCache, slots, starts, impl="auto"):
        b, T, _ = h.shape
        q = self.q_proj(h).reshape(b, T, -1, self.hd)           # this device's heads
        k = self.k_proj(h).reshape(b, T, -1, self.hd)
        v = self.v_proj(h).reshape(b, T, -1, self.hd)
        o, cache = cached_attention(q, k, v, cache, slots, starts, kv_head(self.nh, self.kv),
                                    impl)
        return tp_sum(self.o_proj(o.reshape(b, T, -1))), cache


class MLP(nnx.Module):
    """down(relu(up(x))^2); under tensor parallelism column- then row-parallel."""

    def __init__(self, din, width, dtype=jnp.float32, bias=False):
        self.up_proj = Linear(din, width, bias=bias, dtype=dtype)
        self.down_proj = RowParallelLinear(width, din, bias=bias, dtype=dtype)

    def __call__(self, x):
        return tp_sum(self.partial(x))

    def partial(self, x):
        """This device's partial sum (before the all-reduce): the MoE adds it to its own."""
        return self.down_proj(relu2(self.up_proj(x)))

    def weights(self):
        """As a MoE's shared expert in the routed experts' launch (no bias there)."""
        return SharedWeights(self.up_proj.kernel[...], self.down_proj.kernel[...])


class MoE(nnx.Module):
    """Sigmoid router with a selection-only correction bias, top-k (optionally group-limited),
    renormalised weights times routed_scaling_factor (`models.moe.sigmoid_topk`); relu^2 experts
    run sparsely (on a latent projection of x when moe_latent_size is set); a shared expert on
    x (in the routed experts' launch where `models.moe.shared_chunks` says so). Under tensor
    parallelism every expert (and the shared one) has 1/tp of its width on each device and
    routing is replicated: one all-reduce for the layer."""

    def __init__(self, cfg: NemotronHConfig, dtype=jnp.float32):
        E, F, D = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.cfg = cfg
        din = cfg.moe_latent_size or D
        self.gate = nnx.Param(jnp.zeros((E, D), jnp.float32))
        self.correction_bias = nnx.Param(jnp.zeros((E,), jnp.float32))
        self.up = nnx.Param(jnp.zeros((E, din, F), dtype))
        self.down = nnx.Param(jnp.zeros((E, F, din), dtype))
        if cfg.moe_latent_size:
            self.fc1_latent = Linear(D, din, dtype=dtype)
            self.fc2_latent = Linear(din, D, dtype=dtype)
        self.shared = (MLP(D, cfg.moe_shared_expert_intermediate_size, dtype)
                       if cfg.n_shared_experts else None)

    def route(self, x, impl="auto", tiling=None, shared_chunks=0):
        """x [..., D] -> expert ids [..., k + C] int32, weights [..., k + C] fp32, the shared
        expert's C = shared_chunks chunks last (impl, tiling: `models.moe.sigmoid_topk`'s)."""
        c = self.cfg
        return moe.sigmoid_topk(x, self.gate[...], self.correction_bias[...],
                                top_k=c.num_experts_per_tok, n_group=c.n_group,
                                topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob,
                                scaling=c.routed_scaling_factor, shared_chunks=shared_chunks,
                                impl=impl, tiling=tiling)

    def shared_partial(self, x):
        """The shared expert outside the routed launch: this device's partial sum [..., D]."""
        return self.shared.partial(x)

    def __call__(self, x, valid=None, *, shared_in_launch=None):
        """x [..., D]; valid [...] bool: the real tokens (the others get no routed experts).
        shared_in_launch: force the shared expert into (True) or out of (False) the routed
        experts' launch; None: `models.moe.shared_chunks`. Never with a latent MoE (its
        experts see another input)."""
        latent, up = self.cfg.moe_latent_size, self.up[...]
        C = 0 if self.shared is None or latent else moe.shared_chunks(
            x, up.shape[2], self.shared.up_proj.kernel.shape[1], shared_in_launch)
        ids, weights = self.route(x, shared_chunks=C)
        u = self.fc1_latent(x) if latent else x
        y = moe.routed_experts(u, ids, weights, valid, up, self.down[...], activation="relu2",
                               num_experts=self.cfg.n_routed_experts,
                               shared=self.shared.weights() if C else None)
        if latent:
            y = self.fc2_latent(y)          # linear: applied to the partial sum
        return tp_sum(y + self.shared_partial(x) if self.shared is not None and not C else y)


class Block(nnx.Module):
    def __init__(self, cfg: NemotronHConfig, kind: str, dtype=jnp.float32):
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        if kind == "mamba":
            self.mixer = Mamba2Mixer(cfg, dtype)
        elif kind == "attention":
            self.mixer = Attention(cfg, dtype)
        elif kind == "moe":
            self.mixer = MoE(cfg, dtype)
        else:
            self.mixer = MLP(cfg.hidden_size, cfg.intermediate_size, dtype, cfg.mlp_bias)

    def ffn(self, x, valid):
        """An MLP or MoE layer's mixer; valid [b, T] bool marks the real tokens (for the MoE)."""
        if self.kind != "moe":
            return self.mixer(x)
        with jax.named_scope("moe"):     # its class in profiles (`replayjax.bench.trace`)
            return self.mixer(x, valid)


class MTPHead(nnx.Module):
    """Multi-token-prediction head (`mtp.layers.*` as Nemotron-3 checkpoints ship it; vLLM
    nemotron_h_mtp.py):
    x = eh_proj([enorm(embed(t+1)) | hnorm(h_t)]) (embedding first; plain-weight RMSNorms), then
    the MTP blocks of `mtp_layer_kinds` (e.g. "*E": attention without positions, own KV cache;
    MoE), each x = x + mixer(norm(x)), then final_layernorm; logits through the target's
    lm_head (no own embedding / head). h_t is the target's hidden state after its final norm;
    drafting K tokens applies the same depth-1 head K times on its own output.
    Checkpoint names: enorm / hnorm / eh_proj sit on `mtp.layers.0`, final_layernorm on the last
    MTP layer (see `convert.mappings.nemotron_h`)."""

    def __init__(self, cfg: NemotronHConfig, dtype=jnp.float32):
        if "mamba" in cfg.mtp_layer_kinds:
            raise ValueError("Mamba layers inside the MTP head are not supported")
        if cfg.num_mtp_layers != 1:     # vLLM asserts the same (nemotron_h_mtp.py)
            raise ValueError(f"only one MTP depth is supported (num_nextn_predict_layers = 1), "
                             f"got {cfg.num_mtp_layers}")
        D, eps = cfg.hidden_size, cfg.layer_norm_epsilon
        self.enorm, self.hnorm = RMSNorm(D, eps), RMSNorm(D, eps)
        self.eh_proj = Linear(2 * D, D, dtype=dtype)
        self.layers = nnx.List([Block(cfg, k, dtype) for k in cfg.mtp_layer_kinds])
        self.final_layernorm = RMSNorm(D, eps)

    def __call__(self, embeddings, hidden, next_tokens, caches, slots, starts):
        """hidden [b, T, D] (target, final-normed); next_tokens [b, T]; caches: per MTP layer
        KVCache or None; starts [b] = positions already in the MTP caches. Returns the head's
        output hidden [b, T, D] (final-normed) and the caches."""
        e = self.enorm(jnp.take(embeddings, next_tokens, axis=0))
        x = self.eh_proj(jnp.concatenate([e, self.hnorm(hidden).astype(e.dtype)], axis=-1))
        new = []
        for layer, lc in zip(self.layers, caches):
            y = layer.norm(x)
            if layer.kind == "attention":
                y, lc = layer.mixer(y, lc, slots, starts)
            else:
                y = layer.ffn(y, token_validity(slots, y.shape[1]))
            x = x + y.astype(x.dtype)
            new.append(lc)
        return self.final_layernorm(x), tuple(new)


class NemotronH(HybridLM):
    def __init__(self, cfg: NemotronHConfig, dtype=jnp.float32, *, mtp: bool = False):
        """`mtp=True` builds the MTP head the config describes (checkpoints that ship
        `mtp.*` tensors); HF-saved checkpoints have none, so it is off by default."""
        dtype = check_model_dtype(dtype)
        self.cfg = cfg
        self.embeddings = nnx.Param(jnp.zeros((cfg.vocab_size, cfg.hidden_size), dtype))
        self.layers = nnx.List([Block(cfg, k, dtype) for k in cfg.layer_kinds])
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype))
        if mtp and not cfg.num_mtp_layers:
            raise ValueError("the config declares no MTP layers (num_nextn_predict_layers = 0)")
        self.mtp = MTPHead(cfg, dtype) if mtp else None

    def draft_hidden(self, cache: ModelCache, hidden, next_tokens, slots, starts, *,
                     step: int = 0):
        """One MTP step up to the LM head (`HybridLM.draft`): the head's hidden [b, T, D] (its
        `local_logits` predict the token after `next_tokens`; feed it back to draft further)
        and the cache (MTP KV written at positions starts..starts+T-1). `step` (the draft
        index) is accepted for symmetry with Qwen; Nemotron's single MTP block is applied
        repeatedly."""
        if self.mtp is None:
            raise ValueError("this model was built without an MTP head")
        h, mtp_caches = self.mtp(self.embeddings[...], hidden, next_tokens, cache.mtp, slots,
                                 starts)
        return h, cache.replace(mtp=mtp_caches)

    # ---------------------------------------------------------------- cache
    def init_cache(self, num_slots: int, max_len: int, *, window: int = 16, max_verify: int = 1,
                   state_dtype=jnp.float32, ring_dtype=None, kv_dtype=None,
                   ssm_mode: str = "replay") -> ModelCache:
        """Zeroed cache for `num_slots` slots (slot 0 = null slot) of up to `max_len` tokens;
        `max_verify` > 1 makes room for speculative windows of up to that many tokens.
        `ssm_mode="standard"`: one-entry rings (`window` unused) and, for max_verify = T > 1,
        T draft states per slot for standard-mode verify (see `models.cache`); decode in either
        mode works on a replay cache. The arguments are checked by
        `models.validation.check_cache_settings`."""
        c = self.cfg
        act = self.embeddings[...].dtype
        state_dtype, ring_dtype, kv_dtype = check_cache_settings(
            num_slots, max_len, window=window, max_verify=max_verify, ssm_mode=ssm_mode,
            state_dtype=state_dtype, ring_dtype=act if ring_dtype is None else ring_dtype,
            kv_dtype=act if kv_dtype is None else kv_dtype)
        init = lambda S, L: mamba2.init_replay_buffers(
            S, c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.n_groups, L,
            state_dtype, ring_dtype)
        layers = []
        for kind in c.layer_kinds:
            if kind == "mamba":
                bufs = ssm_buffers(init, num_slots, window, max_verify, ssm_mode)
                layers.append(ssm_cache(bufs, num_slots, c.conv_kernel, c.mamba_conv_dim, act,
                                        max_verify))
            elif kind == "attention":
                layers.append(KVCache.zeros(num_slots, max_len, c.num_key_value_heads, c.head_dim,
                                            kv_dtype))
            else:
                layers.append(None)
        mtp = ()
        if self.mtp is not None:
            mtp = tuple(KVCache.zeros(num_slots, max_len, c.num_key_value_heads, c.head_dim,
                                      kv_dtype) if k == "attention" else None
                        for k in c.mtp_layer_kinds)
        return ModelCache.create(num_slots, tuple(layers), mtp)

    # ---------------------------------------------------------------- forward
    def _run(self, tokens, cache: ModelCache, mixer_fn, valid):
        h = jnp.take(self.embeddings[...], tokens, axis=0)
        new_layers = []
        for layer, lc in zip(self.layers, cache.layers):
            x = layer.norm(h)
            if layer.kind in ("mamba", "attention"):
                out, lc = mixer_fn(layer, x, lc)
            else:
                out = layer.ffn(x, valid)
            h = h + out.astype(h.dtype)
            new_layers.append(lc)
        return self.norm_f(h), tuple(new_layers)

    def local_logits(self, hidden):
        """The LM head (`HybridLM`'s contract): final-normed [..., D] -> fp32 logits of this
        device's vocabulary shard under a vocab-parallel head, else all [..., V]."""
        logits = (tied_logits(hidden, self.embeddings[...]) if self.lm_head is None
                  else self.lm_head(hidden))
        return logits.astype(jnp.float32)
