"""Public Mamba-2 decode ops: validate, pick an implementation, run.

    y, state   = standard_decode(state, x, B, C, dt, A, D, slots)
    y, buffers = replay_decode(buffers, counts, x, B, C, dt, A, D, slots)
    counts     = advance_counts(counts, slots, window)     # once per model step, not per layer

Shapes: batch b rows, H heads of dim P, G groups (H % G == 0), state size N, pool of S slots
(slot 0 = null slot for padding rows), window L.
    x [b, H, P] activation dtype; B, C [b, G, N] activation dtype; dt [b, H] float32 (after
    dt_bias + softplus); A [H] float32 (= -exp(A_log)); D [H] float32; slots [b] int32;
    counts [S] int32 in [0, L - 1]; pools as in `ReplayBuffers` / state [S, H, P, N].
Rows must name distinct slots (two rows on one slot would race).

impl: "pallas" (compiled on GPU, interpret mode elsewhere), "xla" (pure jnp), "auto" (Pallas on
GPU, XLA elsewhere). Donate the pools at your jit boundary so the in-place update is real.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._common import (FLOAT_DTYPES, STATE_DTYPES, advance_counts, check,
                                    check_dtype, check_shape, commit_counts, is_pow2, pick_block,
                                    resolve_impl, resolve_interpret, use_fold_dot)
from pallas_kernels.mamba2 import kernels, reference
from pallas_kernels.mamba2.reference import ReplayBuffers, init_replay_buffers

__all__ = ["ReplayBuffers", "init_replay_buffers", "standard_decode", "replay_decode",
           "advance_counts", "replay_verify", "standard_verify", "commit_counts", "MAX_WINDOW",
           "MAX_VERIFY_TOKENS"]

MAX_VERIFY_TOKENS = 8

MAX_WINDOW = 64
_MIN_BLOCK_P = 4
# Tilings measured best on an H200 at batch 256, fp32 state (docs/benchmarks.md):
# (block_p cap, block_n cap, num_warps) per kernel.
STANDARD_TILING = (32, 64, 8)
REPLAY_TILING = (64, 64, 2)
# verify keeps T accumulators per d_state chunk: 32-wide chunks (batch 256, T = 4: 2.24x the
# baseline, against 1.83x at 64 and 1.74x at 16; T = 8: 2.43x, 2.49x at 16).
VERIFY_TILING = (64, 32, 2)


def _check_step_inputs(x, B, C, dt, A, D, slots, num_slots, state):
    check(x.ndim == 3, f"x must be [batch, heads, head_dim], got shape {tuple(x.shape)}")
    b, H, P = x.shape
    check(B.ndim == 3, f"B must be [batch, groups, d_state], got shape {tuple(B.shape)}")
    G, N = B.shape[1], B.shape[2]
    check(G > 0 and H % G == 0, f"heads ({H}) must be a multiple of groups ({G})")
    check(is_pow2(N), f"d_state N = {N} must be a power of two (Pallas Triton block sizes)")
    check_shape("B", B, (b, G, N))
    check_shape("C", C, (b, G, N))
    check_shape("dt", dt, (b, H))
    check_shape("A", A, (H,))
    check_shape("D", D, (H,))
    check_shape("slots", slots, (b,))
    check_shape("state pool", state, (num_slots, H, P, N))
    for name, arr in (("x", x), ("B", B), ("C", C)):
        check_dtype(name, arr, FLOAT_DTYPES)
    for name, arr in (("dt", dt), ("A", A), ("D", D)):
        check_dtype(name, arr, (jnp.float32,))
    check_dtype("slots", slots, (jnp.int32,))
    check(num_slots >= 2, f"the pool needs slot 0 (null) plus at least one slot, has {num_slots}")
    return H, P, G, N


def standard_decode(state, x, B, C, dt, A, D, slots, *, impl="auto", block_p=None,
                    block_n=None, num_warps=None, num_stages=2, interpret=None):
    """One standard Mamba-2 step (reads and writes the state of every row): the baseline.

    Returns y [b, H, P] in x.dtype and the updated state pool [S, H, P, N].
    """
    check_shape("state", state, (None, None, None, None))
    check_dtype("state", state, STATE_DTYPES)
    _, P, _, N = _check_step_inputs(x, B, C, dt, A, D, slots, state.shape[0], state)
    if resolve_impl(impl) == "xla":
        return reference.standard_decode(state, x, B, C, dt, A, D, slots)
    bp_cap, bn_cap, warps = STANDARD_TILING
    return kernels.standard_decode_pallas(
        state, x, B, C, dt, A, D, slots,
        block_p=pick_block("block_p", "head_dim P", P, block_p, bp_cap, _MIN_BLOCK_P),
        block_n=pick_block("block_n", "d_state N", N, block_n, bn_cap), num_warps=num_warps or warps,
        num_stages=num_stages, interpret=resolve_interpret(interpret))


def check_buffers(buffers: ReplayBuffers, counts):
    """Validates a replay cache; returns its window L."""
    ck, rx, rb, rdt = buffers
    check_shape("checkpoint", ck, (None, None, None, None))
    S, H, P, N = ck.shape
    check_shape("ring_x", rx, (S, H, None, P))
    L = rx.shape[2]
    check(is_pow2(L) and L <= MAX_WINDOW,
          f"window L = {L} must be a power of two in [1, {MAX_WINDOW}]")
    check_shape("ring_b", rb, (S, None, L, N))
    check_shape("ring_dt", rdt, (S, H, L))
    check_shape("counts", counts, (S,))
    check_dtype("checkpoint", ck, STATE_DTYPES)
    check_dtype("ring_x", rx, FLOAT_DTYPES)
    check_dtype("ring_b", rb, (rx.dtype,))
    check_dtype("ring_dt", rdt, (jnp.float32,))
    check_dtype("counts", counts, (jnp.int32,))
    return L


def replay_decode(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots, *, impl="auto",
                  block_p=None, block_n=None, fold="auto", num_warps=None, num_stages=2,
                  interpret=None):
    """One ReplaySSM step (T = 1). Reads `counts` (advance them once per model step with
    `advance_counts`). Returns y [b, H, P] in x.dtype and the updated buffers.

    Rows with count == L - 1 fold the ring and the current token into the checkpoint; the
    others only append the token to the ring. Decided per row on device. `fold` picks how the
    Pallas kernel forms X^T diag(s) B: "dot" (tensor cores, tf32x3; needs L, block_p and
    block_n >= 16), "fma" (rank-1 updates) or "auto".
    """
    check_buffers(buffers, counts)
    _, P, G, N = _check_step_inputs(x, B, C, dt, A, D, slots, buffers.checkpoint.shape[0],
                                    buffers.checkpoint)
    check_shape("ring_b", buffers.ring_b, (None, G, None, None))
    if resolve_impl(impl) == "xla":
        return reference.replay_decode(buffers, counts, x, B, C, dt, A, D, slots)
    bp_cap, bn_cap, warps = REPLAY_TILING
    block_p = pick_block("block_p", "head_dim P", P, block_p, bp_cap, _MIN_BLOCK_P)
    block_n = pick_block("block_n", "d_state N", N, block_n, bn_cap)
    fold_dot = use_fold_dot(fold, buffers.window, block_p=block_p, block_n=block_n)
    return kernels.replay_decode_pallas(
        buffers, counts, x, B, C, dt, A, D, slots, block_p=block_p, block_n=block_n,
        fold_dot=fold_dot, num_warps=num_warps or warps, num_stages=num_stages,
        interpret=resolve_interpret(interpret))


def _check_window_inputs(x, B, C, dt, A, D, slots, state):
    """Window inputs are [b, T, ...]: validated as T single-token steps."""
    check(x.ndim == 4, f"x must be [batch, T, heads, head_dim], got shape {tuple(x.shape)}")
    T = x.shape[1]
    check(1 <= T <= MAX_VERIFY_TOKENS, f"verify window T = {T} must be in [1, {MAX_VERIFY_TOKENS}]")
    for name, arr in (("B", B), ("C", C), ("dt", dt)):
        check(arr.ndim >= 2 and arr.shape[1] == T,
              f"{name} must have the window T = {T} on axis 1, got shape {tuple(arr.shape)}")
    dims = _check_step_inputs(x[:, 0], B[:, 0], C[:, 0], dt[:, 0], A, D, slots,
                              state.shape[0], state)
    return T, dims


def replay_verify(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots, *, impl="auto",
                  block_p=None, block_n=None, fold="auto", num_warps=None, num_stages=2,
                  interpret=None):
    """Speculative verify of T window tokens per row (x [b, T, H, P], B, C [b, T, G, N],
    dt [b, T, H]; 1 <= T <= min(8, L)). Returns y [b, T, H, P] in x.dtype, causal within the
    window, and the buffers with the window written into the ring beyond the committed count.

    Rows with count + T >= L fold ring[0:count] + window[0] into the checkpoint first (window[0]
    is the token sampled last step, always accepted). Then `commit_counts(counts, slots,
    n_accepted, T, L)` commits; rejected tokens are rolled back by not counting them.
    T = 1 followed by commit(1) is exactly `replay_decode` + `advance_counts`.
    """
    L = check_buffers(buffers, counts)
    T, (_, P, G, N) = _check_window_inputs(x, B, C, dt, A, D, slots, buffers.checkpoint)
    check(T <= L, f"verify window T = {T} must not exceed the ring window L = {L}")
    check_shape("ring_b", buffers.ring_b, (None, G, None, None))
    if resolve_impl(impl) == "xla":
        return reference.replay_verify(buffers, counts, x, B, C, dt, A, D, slots)
    bp_cap, bn_cap, warps = VERIFY_TILING
    block_p = pick_block("block_p", "head_dim P", P, block_p, bp_cap, _MIN_BLOCK_P)
    block_n = pick_block("block_n", "d_state N", N, block_n, bn_cap)
    fold_dot = use_fold_dot(fold, L, block_p=block_p, block_n=block_n)
    y, ck = kernels.replay_verify_pallas(
        buffers, counts, x, B, C, dt, A, D, slots, block_p=block_p, block_n=block_n,
        fold_dot=fold_dot, num_warps=num_warps or warps,
        num_stages=num_stages, interpret=resolve_interpret(interpret))
    out = reference.write_window(buffers._replace(checkpoint=ck), counts, slots, x, B, dt)
    return y, out


def standard_verify(state, x, B, C, dt, A, D, slots, draft_slots, *, impl="auto", block_p=None,
                    block_n=None, num_warps=None, num_stages=2, interpret=None):
    """The usual verify (baseline and cross-check): T standard steps from the state at `slots`,
    writing the state after window token s to pool slot draft_slots[:, s] ([b, T] int32;
    NULL_SLOT skips). Rollback = continue from draft_slots[:, n_accepted - 1].
    Returns y [b, T, H, P] and the pool."""
    T, (_, P, _, N) = _check_window_inputs(x, B, C, dt, A, D, slots, state)
    check_shape("draft_slots", draft_slots, (x.shape[0], T))
    check_dtype("draft_slots", draft_slots, (jnp.int32,))
    if resolve_impl(impl) == "xla":
        return reference.standard_verify(state, x, B, C, dt, A, D, slots, draft_slots)
    bp_cap, bn_cap, warps = STANDARD_TILING
    return kernels.standard_verify_pallas(
        state, x, B, C, dt, A, D, slots, draft_slots,
        block_p=pick_block("block_p", "head_dim P", P, block_p, bp_cap, _MIN_BLOCK_P),
        block_n=pick_block("block_n", "d_state N", N, block_n, bn_cap),
        num_warps=num_warps or warps, num_stages=num_stages,
        interpret=resolve_interpret(interpret))
