"""Public Gated DeltaNet decode ops: validate, pick an implementation, run.

    o, state   = standard_decode(state, q, k, v, g, beta, slots)
    o, buffers = replay_decode(buffers, counts, q, k, v, g, beta, slots)
    counts     = advance_counts(counts, slots, window)     # once per model step, not per layer

Shapes: batch b rows, Hk key heads and Hv value heads (Hv % Hk == 0; value head j uses key head
j // (Hv / Hk)), key dim K, value dim V, pool of S slots (slot 0 = null slot), window L.
    q, k [b, Hk, K]: L2-normalised, q scaled by K^-1/2 (`reference.prepare_qk`), float32 or the
    activation dtype; v [b, Hv, V] activation dtype; g, beta [b, Hv] float32
    (`reference.gates`); slots [b] int32; counts [S] int32 in [0, L - 1];
    state [S, Hv, V, K]; buffers as in `GDNBuffers`.
Rows must name distinct slots. Donate the pools at your jit boundary.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._common import (FLOAT_DTYPES, STATE_DTYPES, advance_counts, check,
                                    check_dtype, check_shape, commit_counts, is_pow2, pick_block,
                                    resolve_impl, resolve_interpret, use_fold_dot)
from pallas_kernels.gdn import kernels, reference
from pallas_kernels.gdn.reference import GDNBuffers, gates, init_gdn_buffers, prepare_qk

__all__ = ["GDNBuffers", "init_gdn_buffers", "prepare_qk", "gates", "standard_decode",
           "replay_decode", "advance_counts", "replay_verify", "standard_verify", "commit_counts",
           "MAX_WINDOW", "MAX_VERIFY_TOKENS"]

MAX_WINDOW = 64
MAX_VERIFY_TOKENS = 8
# Tilings measured on an H200 at batch 256, fp32 state (docs/benchmarks.md):
# standard (block_v cap, num_warps); replay (block_v cap, block_k cap, num_warps).
STANDARD_TILING = (128, 8)
REPLAY_TILING = (64, 64, 4)
# verify (block_v cap, block_k cap for T <= 2, block_k cap for T > 2, num_warps): the kernel keeps
# T accumulators per key chunk, so larger T wants narrower chunks (batch 256 sweep: T = 2 2.19x the
# baseline at block_k 32 vs 1.72x at 16; T = 4 2.01x at 16 vs 1.90x; T = 8 1.65x vs 1.38x).
VERIFY_TILING = (64, 32, 16, 4)


def _check_step_inputs(q, k, v, g, beta, slots, state):
    check(v.ndim == 3, f"v must be [batch, value_heads, V], got shape {tuple(v.shape)}")
    b, Hv, V = v.shape
    check(q.ndim == 3, f"q must be [batch, key_heads, K], got shape {tuple(q.shape)}")
    Hk, K = q.shape[1], q.shape[2]
    check(Hk > 0 and Hv % Hk == 0, f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    check(is_pow2(K), f"key dim K = {K} must be a power of two (Pallas Triton block sizes)")
    check_shape("q", q, (b, Hk, K))
    check_shape("k", k, (b, Hk, K))
    check_shape("g", g, (b, Hv))
    check_shape("beta", beta, (b, Hv))
    check_shape("slots", slots, (b,))
    check_shape("state pool", state, (None, Hv, V, K))
    check(state.shape[0] >= 2, f"the pool needs slot 0 (null) plus one slot, has {state.shape[0]}")
    for name, arr in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, arr, FLOAT_DTYPES)
    for name, arr in (("g", g), ("beta", beta)):
        check_dtype(name, arr, (jnp.float32,))
    check_dtype("slots", slots, (jnp.int32,))
    check_dtype("state", state, STATE_DTYPES)
    return Hk, Hv, K, V


def check_buffers(buffers: GDNBuffers, counts):
    """Validates a replay cache; returns its window L."""
    ck, rk, rd, rg = buffers
    check_shape("checkpoint", ck, (None, None, None, None))
    S, Hv, V, K = ck.shape
    check_shape("ring_k", rk, (S, None, None, K))
    L = rk.shape[2]
    check(is_pow2(L) and L <= MAX_WINDOW,
          f"window L = {L} must be a power of two in [1, {MAX_WINDOW}]")
    check_shape("ring_d", rd, (S, Hv, L, V))
    check_shape("ring_g", rg, (S, Hv, L))
    check_shape("counts", counts, (S,))
    check_dtype("ring_k", rk, FLOAT_DTYPES)
    check_dtype("ring_d", rd, (rk.dtype,))
    check_dtype("ring_g", rg, (jnp.float32,))
    check_dtype("counts", counts, (jnp.int32,))
    return L


def standard_decode(state, q, k, v, g, beta, slots, *, impl="auto", block_v=None, num_warps=None,
                    num_stages=2, interpret=None):
    """One standard gated delta rule step (reads and writes every row's state): the baseline.
    Returns o [b, Hv, V] in v.dtype and the updated pool [S, Hv, V, K]."""
    _, _, _, V = _check_step_inputs(q, k, v, g, beta, slots, state)
    if resolve_impl(impl) == "xla":
        return reference.standard_decode(state, q, k, v, g, beta, slots)
    bv_cap, warps = STANDARD_TILING
    return kernels.standard_decode_pallas(
        state, q, k, v, g, beta, slots, block_v=pick_block("block_v", "value dim V", V, block_v,
                                                           bv_cap, 4),
        num_warps=num_warps or warps, num_stages=num_stages,
        interpret=resolve_interpret(interpret))


def replay_decode(buffers: GDNBuffers, counts, q, k, v, g, beta, slots, *, impl="auto",
                  block_v=None, block_k=None, fold="auto", num_warps=None, num_stages=2,
                  interpret=None):
    """One ReplaySSM GDN step (T = 1). Reads `counts` (advance them once per model step with
    `advance_counts`). Returns o [b, Hv, V] in v.dtype and the updated buffers.

    Rows with count == L - 1 fold ring + current token into the checkpoint; the others append
    (k, d, g) to the ring. `fold`: "dot" (tensor cores, tf32x3; L, block_v, block_k >= 16),
    "fma" (rank-1 updates) or "auto".
    """
    check_buffers(buffers, counts)
    Hk, _, K, V = _check_step_inputs(q, k, v, g, beta, slots, buffers.checkpoint)
    check_shape("ring_k", buffers.ring_k, (None, Hk, None, None))
    if resolve_impl(impl) == "xla":
        return reference.replay_decode(buffers, counts, q, k, v, g, beta, slots)
    bv_cap, bk_cap, warps = REPLAY_TILING
    block_v = pick_block("block_v", "value dim V", V, block_v, bv_cap, 4)
    block_k = pick_block("block_k", "key dim K", K, block_k, bk_cap)
    fold_dot = use_fold_dot(fold, buffers.window, block_v=block_v, block_k=block_k)
    return kernels.replay_decode_pallas(
        buffers, counts, q, k, v, g, beta, slots, block_v=block_v, block_k=block_k,
        fold_dot=fold_dot, num_warps=num_warps or warps,
        num_stages=num_stages, interpret=resolve_interpret(interpret))


def _check_window_inputs(q, k, v, g, beta, slots, state):
    check(v.ndim == 4, f"v must be [batch, T, value_heads, V], got shape {tuple(v.shape)}")
    T = v.shape[1]
    check(1 <= T <= MAX_VERIFY_TOKENS, f"verify window T = {T} must be in [1, {MAX_VERIFY_TOKENS}]")
    for name, arr in (("q", q), ("k", k), ("g", g), ("beta", beta)):
        check(arr.ndim >= 2 and arr.shape[1] == T,
              f"{name} must have the window T = {T} on axis 1, got shape {tuple(arr.shape)}")
    return T, _check_step_inputs(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], slots, state)


def replay_verify(buffers: GDNBuffers, counts, q, k, v, g, beta, slots, *, impl="auto",
                  block_v=None, block_k=None, fold="auto", num_warps=None, num_stages=2,
                  interpret=None):
    """Speculative verify of T window tokens per row (q, k [b, T, Hk, K]; v [b, T, Hv, V];
    g, beta [b, T, Hv]; 1 <= T <= min(8, L)). Returns o [b, T, Hv, V] in v.dtype, causal within
    the window, and the buffers with the window's (k, d, g) written into the ring beyond the
    committed count (d exactly as T single steps would have cached it).

    Rows with count + T >= L fold ring[0:count] + window[0] into the checkpoint first. Commit
    with `commit_counts(counts, slots, n_accepted, T, L)`; T = 1 + commit(1) is `replay_decode`.
    """
    L = check_buffers(buffers, counts)
    T, (Hk, _, K, V) = _check_window_inputs(q, k, v, g, beta, slots, buffers.checkpoint)
    check(T <= L, f"verify window T = {T} must not exceed the ring window L = {L}")
    check_shape("ring_k", buffers.ring_k, (None, Hk, None, None))
    if resolve_impl(impl) == "xla":
        o, out, _ = reference.replay_verify(buffers, counts, q, k, v, g, beta, slots)
        return o, out
    bv_cap, bk_short, bk_long, warps = VERIFY_TILING
    block_v = pick_block("block_v", "value dim V", V, block_v, bv_cap, 4)
    block_k = pick_block("block_k", "key dim K", K, block_k, bk_short if T <= 2 else bk_long)
    fold_dot = use_fold_dot(fold, L, block_v=block_v, block_k=block_k)
    o, d, ck = kernels.replay_verify_pallas(
        buffers, counts, q, k, v, g, beta, slots, block_v=block_v, block_k=block_k, fold_dot=fold_dot,
        num_warps=num_warps or warps, num_stages=num_stages,
        interpret=resolve_interpret(interpret))
    out = reference.write_window(buffers._replace(checkpoint=ck), counts, slots, k, d, g)
    return o, out


def standard_verify(state, q, k, v, g, beta, slots, draft_slots, *, impl="auto", block_v=None,
                    num_warps=None, num_stages=2, interpret=None):
    """The usual verify (baseline and cross-check): T standard steps from the state at `slots`,
    the state after window token s written to draft_slots[:, s] ([b, T] int32; NULL_SLOT skips).
    Returns o [b, T, Hv, V] and the pool."""
    T, (_, _, _, V) = _check_window_inputs(q, k, v, g, beta, slots, state)
    check_shape("draft_slots", draft_slots, (v.shape[0], T))
    check_dtype("draft_slots", draft_slots, (jnp.int32,))
    if resolve_impl(impl) == "xla":
        return reference.standard_verify(state, q, k, v, g, beta, slots, draft_slots)
    bv_cap, warps = STANDARD_TILING
    return kernels.standard_verify_pallas(
        state, q, k, v, g, beta, slots, draft_slots,
        block_v=pick_block("block_v", "value dim V", V, block_v, bv_cap, 4),
        num_warps=num_warps or warps, num_stages=num_stages,
        interpret=resolve_interpret(interpret))
