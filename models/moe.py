"""Mixture-of-experts routing of both families and the sparse routed-expert call.

Routers return (expert ids [n, k] int32, weights [n, k] float32) from x [n, D] (any leading
shape works the same); ties between scores go to the lowest expert index (`lax.top_k`). Both are
`pallas_kernels.moe.route`: one Pallas kernel on a GPU for a decode step's few tokens, XLA
elsewhere.

* Nemotron-H (`sigmoid_topk`, HF NemotronHTopkRouter): s = sigmoid(x W_g^T) in float32; experts
  are chosen on s + e_score_correction_bias (the bias selects, it never weighs), optionally only
  inside the topk_group groups of E / n_group experts whose two best biased scores sum highest;
  the weights are s at the chosen experts, divided by their sum + 1e-20 if norm_topk_prob, times
  routed_scaling_factor.
* Qwen3-Next / Qwen3.5 (`softmax_topk`, HF Qwen3NextTopKRouter): p = softmax(x W_g^T) in
  float32, top-k of p, divided by their sum if norm_topk_prob.

The families' MoE modules add the shared expert (Nemotron: relu^2 MLP on x; Qwen: SwiGLU times
sigmoid(shared_expert_gate(x))) and, for Nemotron's latent MoE, the fc1 / fc2 projections around
`routed_experts` (routing and the shared expert see the full-width x). Where `shared_chunks`
says so, the shared expert runs inside `routed_experts` instead: its width's F-wide chunks are
C more experts every token is routed to (weight 1, or Qwen's gate), read in place by the same
grouped launch (`pallas_kernels.moe.SharedWeights`); the routers return those C columns
(`pallas_kernels.moe.route`'s shared_chunks: in the router kernel's launch on a GPU, the gate's
dot too); elsewhere it is the family's XLA MLP.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from models.parallel import tp_index
from pallas_kernels import moe as moe_ops
from pallas_kernels.dispatch import resolve_impl

# Up to this many tokens a call, on a GPU, the shared expert runs in the routed experts' grouped
# Pallas launch: XLA's GEMV fusions read it at ~0.7 TB/s, the grouped kernels at 2.8. Measured
# on an H200 with the router kernel (`bench moe --variants sparse sparse-shared --batches 1 8
# 32`, docs/benchmarks.md, seventh session), one layer, us: Nemotron-3-Nano 116 -> 82 (b1),
# 272 -> 264 (b8), 599 -> 582 (b32); Qwen3.5-35B 82 -> 50, 149 -> 138, 337 -> 332; Qwen3-Next-80B
# 68 -> 58, 183 -> 173, 473 -> 466. Not timed beyond 32 tokens.
SHARED_IN_LAUNCH_MAX_TOKENS = 32


def _route(x, gate, bias, **kw):
    """`pallas_kernels.moe.route` over any leading shape: x [..., D] -> ids, weights [..., k]."""
    ids, w = moe_ops.route(x.reshape(-1, x.shape[-1]), gate, bias, **kw)
    return ids.reshape(x.shape[:-1] + ids.shape[-1:]), w.reshape(x.shape[:-1] + w.shape[-1:])


def sigmoid_topk(x, gate, correction_bias, *, top_k: int, n_group: int = 1,
                 topk_group: int = 1, norm_topk_prob: bool = True, scaling: float = 1.0,
                 shared_chunks: int = 0, impl: str = "auto", tiling=None):
    """Nemotron-H routing: x [..., D]; gate [E, D], correction_bias [E] float32 -> ids, weights
    [..., top_k + shared_chunks] (the shared expert's chunks last, weight 1). impl "auto": the
    router kernel on a GPU for a decode step (`pallas_kernels.moe.router.AUTO`, MAX_TOKENS);
    tiling: the kernel's `RouterTiling` (None: its default)."""
    return _route(x, gate, correction_bias, top_k=top_k, score="sigmoid",
                  norm_topk_prob=norm_topk_prob, scaling=scaling, n_group=n_group,
                  topk_group=topk_group, shared_chunks=shared_chunks, impl=impl, tiling=tiling)


def softmax_topk(x, gate, *, top_k: int, norm_topk_prob: bool, shared_chunks: int = 0,
                 shared_gate=None, impl: str = "auto", tiling=None):
    """Qwen routing: x [..., D]; gate [E, D] float32 -> ids, weights [..., top_k +
    shared_chunks] (the shared expert's chunks last, weighted sigmoid(x . shared_gate), [D] in
    the model's dtype). impl and tiling as `sigmoid_topk`."""
    return _route(x, gate, None, top_k=top_k, score="softmax", norm_topk_prob=norm_topk_prob,
                  shared_chunks=shared_chunks, shared_gate=shared_gate, impl=impl,
                  tiling=tiling)


def shared_chunks(x, ffn: int, shared_ffn: int, force: bool | None = None) -> int:
    """How many F-wide chunks of a MoE layer's shared expert (shared_ffn wide, on x [..., D],
    which the routed experts F = ffn wide see too) run inside `routed_experts`: shared_ffn / F,
    or 0 where it runs apart. In the launch if `force`, apart if not force; for None on a GPU,
    for at most SHARED_IN_LAUNCH_MAX_TOKENS tokens, when its width is a multiple of F (static
    shapes: under shard_map the local widths)."""
    joined = force if force is not None else (
        shared_ffn % ffn == 0 and math.prod(x.shape[:-1]) <= SHARED_IN_LAUNCH_MAX_TOKENS
        and resolve_impl("auto") == "pallas_triton")
    return shared_ffn // ffn if joined else 0


def routed_experts(u, expert_ids, weights, valid, w_up, w_down, *, w_gate=None,
                   activation: str, num_experts: int, shared=None):
    """The routed part of a MoE layer over any leading shape: u [..., din] is what the experts
    see (x, or its latent projection), expert_ids / weights [..., k] the routing over
    `num_experts`, valid [...] bool the real tokens (None: all); the others own no (token,
    expert) pairs and come out zero. Returns [..., din] in u.dtype
    (`pallas_kernels.moe.expert_ffn`, impl and path "auto": on a GPU its pair path for at most
    PAIR_PATH_MAX_PAIRS (token, expert) pairs, once measured: 0 until then).

    Expert parallel (`models.sharding`, experts "experts"): under shard_map w_up holds this
    device's E / tp experts, the r-th slice; only the pairs routed to them are computed (the
    others are invalid pairs: no rows), and the psum after the layer adds the devices' parts.

    shared: a `pallas_kernels.moe.SharedWeights` (this device's width of it) computed in the
    same launch: its C = Fs / F chunks are the routing's last C columns, ids num_experts ...
    num_experts + C - 1 (the routers' shared_chunks), each token's weight on them its scale."""
    lead, k = u.shape[:-1], expert_ids.shape[-1]
    ids, weights = expert_ids.reshape(-1, k), weights.reshape(-1, k)
    n, local = ids.shape[0], w_up.shape[0]
    tokens = None if valid is None else jnp.broadcast_to(valid, lead).reshape(-1)
    C = 0 if shared is None else shared.w_up.shape[1] // w_up.shape[2]
    mine = None
    if local < num_experts:                 # this device's slice of the experts
        chunk = ids >= num_experts          # the shared expert's chunks: local + c here
        ids = jnp.where(chunk, ids - num_experts + local, ids - tp_index() * local)
        mine = chunk | ((ids >= 0) & (ids < local))
        ids = jnp.clip(ids, 0, local + C - 1)
    valid = tokens if mine is None else mine if tokens is None else tokens[:, None] & mine
    block_m = None if local == num_experts else moe_ops.default_block_m(
        n * (k - C) * local // num_experts + n * C, local + C)
    y = moe_ops.expert_ffn(u.reshape(-1, u.shape[-1]), ids, weights, w_up, w_down,
                           w_gate=w_gate, valid=valid, activation=activation, shared=shared,
                           block_m=block_m)
    return y.reshape(u.shape)
