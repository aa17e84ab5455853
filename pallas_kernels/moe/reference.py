"""Dense oracle for the routed experts of a MoE layer: every token through every expert, weighted
by its routing (zero off its top-k). Exact and simple; its [n, E, F] intermediate and E times the
weight reads are what the sparse implementations avoid. It is also the dense baseline of
`replayjax.bench.moe`.

Rounding (shared with the sparse implementations): x is cast to the weights' dtype, both GEMMs
accumulate in float32 (HIGHEST precision for float32 weights), the activation runs in float32 and
the hidden activations are rounded to the weights' dtype before the down GEMM; the result is cast
to x.dtype. Here the routing weight scales the hidden activations (one contraction over experts
and F, no [n, E, din] intermediate); the sparse paths scale each pair's float32 output instead,
the same up to rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
ACTIVATIONS = ("relu2", "swiglu")


def precision(dtype):
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == F32 else None


def activate(up, gate, activation: str):
    """float32 GEMM outputs -> hidden activations (float32): relu(up)^2 (Nemotron-H) or
    silu(gate) * up (SwiGLU, Qwen)."""
    if activation == "relu2":
        return jnp.square(jax.nn.relu(up))
    return jax.nn.silu(gate) * up


def dense_weights(expert_ids, weights, valid, num_experts: int):
    """Routing as a dense [n, E] float32 matrix (invalid tokens' rows and pairs are zero)."""
    w = jnp.where(valid if valid.ndim == 2 else valid[:, None], weights.astype(F32), 0.0)
    rows = jnp.arange(expert_ids.shape[0])[:, None]
    return jnp.zeros((expert_ids.shape[0], num_experts), F32).at[rows, expert_ids].add(w)


def with_shared(w_up, w_down, w_gate, shared):
    """The experts' arrays with a shared expert's F-wide chunks appended as experts E ...
    (`pallas_kernels.moe.expert_ffn`'s `shared`): [E + C, din, F] / [E + C, F, din]. A copy of
    every weight: the oracle's way, not the kernels'."""
    if shared is None:
        return w_up, w_down, w_gate
    E, din, F = w_up.shape
    chunks = lambda w, s: jnp.concatenate([w, jnp.moveaxis(s.reshape(din, -1, F), 1, 0)])
    gate = None if w_gate is None else chunks(w_gate, shared.w_gate)
    down = jnp.concatenate([w_down, shared.w_down.reshape(-1, F, din)])
    return chunks(w_up, shared.w_up), down, gate


def expert_ffn(x, expert_ids, weights, w_up, w_down, *, w_gate=None, valid=None,
               activation="relu2", shared=None):
    """y[i] = sum_j weights[i, j] FFN_{expert_ids[i, j]}(x[i]), densely. Shapes as
    `pallas_kernels.moe.expert_ffn`; returns [n, din] in x.dtype (zero rows where not valid)."""
    w_up, w_down, w_gate = with_shared(w_up, w_down, w_gate, shared)
    E, dt = w_up.shape[0], w_up.dtype
    if valid is None:
        valid = jnp.ones(x.shape[:1], bool)
    xe, hi = x.astype(dt), precision(dt)
    mm = lambda w: jnp.einsum("nd,edf->nef", xe, w, precision=hi, preferred_element_type=F32)
    hid = activate(mm(w_up), None if w_gate is None else mm(w_gate), activation)
    hid = hid * dense_weights(expert_ids, weights, valid, E)[:, :, None]
    y = jnp.einsum("nef,efd->nd", hid.astype(dt), w_down, precision=hi,
                   preferred_element_type=F32)
    tokens = valid if valid.ndim == 1 else valid.any(-1)
    return jnp.where(tokens[:, None], y, 0.0).astype(x.dtype)
