"""Mixture-of-experts routing of both families and the sparse routed-expert call.

Routers return (expert ids [n, k] int32, weights [n, k] float32) from x [n, D] (any leading
shape works the same); ties between scores go to the lowest expert index (`lax.top_k`).

* Nemotron-H (`sigmoid_topk`, HF NemotronHTopkRouter): s = sigmoid(x W_g^T) in float32; experts
  are chosen on s + e_score_correction_bias (the bias selects, it never weighs), optionally only
  inside the topk_group groups of E / n_group experts whose two best biased scores sum highest;
  the weights are s at the chosen experts, divided by their sum + 1e-20 if norm_topk_prob, times
  routed_scaling_factor.
* Qwen3-Next / Qwen3.5 (`softmax_topk`, HF Qwen3NextTopKRouter): p = softmax(x W_g^T) in
  float32, top-k of p, divided by their sum if norm_topk_prob.

The families' MoE modules add the shared expert (Nemotron: relu^2 MLP on x; Qwen: SwiGLU times
sigmoid(shared_expert_gate(x))) and, for Nemotron's latent MoE, the fc1 / fc2 projections around
`routed_experts` (routing and the shared expert see the full-width x).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from models.parallel import tp_index
from pallas_kernels import moe as moe_ops

_HI = lax.Precision.HIGHEST


def _logits(x, gate):
    """x [n, D] -> float32 router logits [n, E] (gate [E, D] float32)."""
    return jnp.einsum("...d,ed->...e", x.astype(jnp.float32), gate, precision=_HI)


def sigmoid_topk(x, gate, correction_bias, *, top_k: int, n_group: int = 1,
                 topk_group: int = 1, norm_topk_prob: bool = True, scaling: float = 1.0):
    """Nemotron-H routing: x [n, D]; gate [E, D], correction_bias [E] float32."""
    s = jax.nn.sigmoid(_logits(x, gate))
    sel = s + correction_bias
    if n_group > 1:     # keep the topk_group groups with the largest sum of their top-2
        grp = sel.reshape(sel.shape[:-1] + (n_group, -1))
        best = lax.top_k(grp, min(2, grp.shape[-1]))[0].sum(-1)                  # [n, n_group]
        keep = jax.nn.one_hot(lax.top_k(best, topk_group)[1], n_group, dtype=bool).any(-2)
        sel = jnp.where(jnp.repeat(keep, grp.shape[-1], axis=-1), sel, -jnp.inf)
    _, ids = lax.top_k(sel, top_k)
    w = jnp.take_along_axis(s, ids, axis=-1)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return ids.astype(jnp.int32), w * scaling


def softmax_topk(x, gate, *, top_k: int, norm_topk_prob: bool):
    """Qwen routing: x [n, D]; gate [E, D] float32."""
    w, ids = lax.top_k(jax.nn.softmax(_logits(x, gate), axis=-1), top_k)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return ids.astype(jnp.int32), w


def routed_experts(u, expert_ids, weights, valid, w_up, w_down, *, w_gate=None,
                   activation: str, num_experts: int):
    """The routed part of a MoE layer over any leading shape: u [..., din] is what the experts
    see (x, or its latent projection), expert_ids / weights [..., k] the routing over
    `num_experts`, valid [...] bool the real tokens (None: all); the others own no (token,
    expert) pairs and come out zero. Returns [..., din] in u.dtype
    (`pallas_kernels.moe.expert_ffn`, impl and path "auto": on a GPU its pair path for at most
    PAIR_PATH_MAX_PAIRS (token, expert) pairs, once measured: 0 until then).

    Expert parallel (`models.sharding`, experts "experts"): under shard_map w_up holds this
    device's E / tp experts, the r-th slice; only the pairs routed to them are computed (the
    others are invalid pairs: no rows), and the psum after the layer adds the devices' parts."""
    lead, k = u.shape[:-1], expert_ids.shape[-1]
    ids = expert_ids.reshape(-1, k)
    valid = None if valid is None else jnp.broadcast_to(valid, lead).reshape(-1)
    local, block_m = w_up.shape[0], None
    if local < num_experts:                 # this device's slice of the experts
        ids = ids - tp_index() * local
        mine = (ids >= 0) & (ids < local)
        valid = mine if valid is None else valid[:, None] & mine
        ids = jnp.clip(ids, 0, local - 1)
        block_m = moe_ops.default_block_m(ids.size * local // num_experts, local)
    y = moe_ops.expert_ffn(u.reshape(-1, u.shape[-1]), ids, weights.reshape(-1, k), w_up,
                           w_down, w_gate=w_gate, valid=valid, activation=activation,
                           block_m=block_m)
    return y.reshape(u.shape)
