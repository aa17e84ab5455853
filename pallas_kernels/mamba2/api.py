"""Public Mamba-2 decode ops: validate, pick an implementation, run.

    y, state   = standard_decode(state, x, B, C, dt, A, D, slots)
    y, buffers = replay_decode(buffers, counts, x, B, C, dt, A, D, slots)
    counts     = advance_counts(counts, slots, window)     # once per model step, not per layer

Shapes: batch b rows, H heads of dim P, G groups (H % G == 0), state size N, pool of S slots
(slot 0 = null slot for padding rows), window L.
    x [b, H, P] activation dtype; B, C [b, G, N] x's dtype; dt [b, H] float32 (after
    dt_bias + softplus); A [H] float32 (= -exp(A_log)); D [H] float32; slots [b] int32;
    counts [S] int32 in [0, L - 1]; pools as in `ReplayBuffers` / state [S, H, P, N].
Rows must name distinct slots (two rows on one slot would race). The ring contract (null slot,
counts, folds, commit and rollback) is `pallas_kernels.ring`. Values are checked where they are
concrete (an eager call; under jit they stay the caller's contract): slots (and draft_slots) in
[0, S), no slot but the null slot twice, counts in [0, L - 1].

impl: "pallas" / "pallas_triton" (compiled on GPU, interpret mode elsewhere), "xla" (pure jnp),
"pallas_mosaic_gpu" (Hopper; decode and replay verify, N <= 256), "auto"
(XLA off the GPU; the Mosaic GPU kernels on sm90 where they take the shapes, see
`pallas_mosaic_gpu.takes`; Pallas Triton on other GPUs and for the rest). tiling: the Pallas
launch configuration (`Mamba2Tiling` / `Mamba2ReplayTiling`; `Mamba2MosaicTiling` for Mosaic
GPU), None for the measured one (`STANDARD_TILING`, `REPLAY_TILING`, `VERIFY_TILING`,
`MOSAIC_*_TILING`). Donate the pools at your jit boundary so the in-place update is real.
"""

from __future__ import annotations

from pallas_kernels.dispatch import family_ops
from pallas_kernels.mamba2 import pallas_mosaic_gpu, pallas_triton, xla
from pallas_kernels.mamba2.buffers import FIELDS, ReplayBuffers
from pallas_kernels.ring import MAX_VERIFY_TOKENS
from pallas_kernels.validation import (
    F32_ONLY,
    FLOAT_DTYPES,
    INT32_ONLY,
    Field,
    check,
    check_arrays,
    check_draft_slots,
    check_fields,
    check_replay_cache,
    check_state,
    is_pow2,
)

_STEP_FIELDS = (
    Field("x", ("b", "H", "P"), FLOAT_DTYPES),
    Field("B", ("b", "G", "N"), "x"),
    Field("C", ("b", "G", "N"), "x"),
    Field("dt", ("b", "H"), F32_ONLY),
    Field("A", ("H",), F32_ONLY),
    Field("D", ("H",), F32_ONLY),
    Field("slots", ("b",), INT32_ONLY),
)
_OPS = family_ops("mamba2", ("standard_decode", "replay_decode", "replay_verify",
                             "standard_verify"), xla=xla, pallas_triton=pallas_triton,
                  pallas_mosaic_gpu=pallas_mosaic_gpu)


def _check_step_inputs(x, B, C, dt, A, D, slots) -> dict[str, int]:
    """Validates one token's inputs; returns the dims (b, H, P, G, N)."""
    check_arrays(x=x, B=B, C=C, dt=dt, A=A, D=D, slots=slots)
    check(x.ndim == 3, f"x must be [batch, heads, head_dim], got shape {tuple(x.shape)}")
    check(B.ndim == 3, f"B must be [batch, groups, d_state], got shape {tuple(B.shape)}")
    H, G, N = x.shape[1], B.shape[1], B.shape[2]
    check(G > 0 and H % G == 0, f"heads ({H}) must be a multiple of groups ({G})")
    check(is_pow2(N), f"d_state N = {N} must be a power of two (Pallas Triton block sizes)")
    return check_fields(_STEP_FIELDS, dict(x=x, B=B, C=C, dt=dt, A=A, D=D, slots=slots))


def _check_window_inputs(x, B, C, dt, A, D, slots) -> dict[str, int]:
    """Window inputs are [b, T, ...]: validated as T single-token steps; returns the dims + T."""
    check_arrays(x=x, B=B, C=C, dt=dt)
    check(x.ndim == 4, f"x must be [batch, T, heads, head_dim], got shape {tuple(x.shape)}")
    T = x.shape[1]
    check(1 <= T <= MAX_VERIFY_TOKENS, f"verify window T = {T} must be in [1, {MAX_VERIFY_TOKENS}]")
    for name, arr in (("B", B), ("C", C), ("dt", dt)):
        check(arr.ndim >= 2 and arr.shape[1] == T,
              f"{name} must have the window T = {T} on axis 1, got shape {tuple(arr.shape)}")
    return dict(_check_step_inputs(x[:, 0], B[:, 0], C[:, 0], dt[:, 0], A, D, slots), T=T)


def standard_decode(state, x, B, C, dt, A, D, slots, *, impl="auto", tiling=None,
                    interpret=None):
    """One standard Mamba-2 step (reads and writes the state of every row): the baseline.

    Returns y [b, H, P] in x.dtype and the updated state pool [S, H, P, N].
    """
    check_state(state, ("H", "P", "N"), _check_step_inputs(x, B, C, dt, A, D, slots), slots)
    return _OPS["standard_decode"](state, x, B, C, dt, A, D, slots, impl=impl, tiling=tiling,
                                   interpret=interpret)


def replay_decode(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots, *, impl="auto",
                  tiling=None, interpret=None):
    """One ReplaySSM step (T = 1). Reads `counts` (advance them once per model step with
    `advance_counts`). Returns y [b, H, P] in x.dtype and the updated buffers.

    Rows with count == L - 1 fold the ring and the current token into the checkpoint; the
    others only append the token to the ring. Decided per row on device.
    """
    check_replay_cache(FIELDS, buffers, counts, _check_step_inputs(x, B, C, dt, A, D, slots),
                       slots)
    return _OPS["replay_decode"](buffers, counts, x, B, C, dt, A, D, slots, impl=impl,
                                 tiling=tiling, interpret=interpret)


def replay_verify(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots, *, impl="auto",
                  tiling=None, interpret=None):
    """Speculative verify of T window tokens per row (x [b, T, H, P], B, C [b, T, G, N],
    dt [b, T, H]; 1 <= T <= min(8, L)). Returns y [b, T, H, P] in x.dtype, causal within the
    window, and the buffers with the window written into the ring beyond the committed count.

    Rows with count + T >= L fold ring[0:count] + window[0] into the checkpoint first (window[0]
    is the token sampled last step, always accepted). Then `commit_counts(counts, slots,
    n_accepted, T, L)` commits; rejected tokens are rolled back by not counting them.
    T = 1 followed by commit(1) is exactly `replay_decode` + `advance_counts`.
    """
    dims = _check_window_inputs(x, B, C, dt, A, D, slots)
    L = check_replay_cache(FIELDS, buffers, counts, dims, slots)
    check(dims["T"] <= L, f"verify window T = {dims['T']} must not exceed the ring window L = {L}")
    return _OPS["replay_verify"](buffers, counts, x, B, C, dt, A, D, slots, impl=impl,
                                 tiling=tiling, interpret=interpret)


def standard_verify(state, x, B, C, dt, A, D, slots, draft_slots, *, impl="auto", tiling=None,
                    interpret=None):
    """The usual verify (baseline and cross-check): T standard steps from the state at `slots`,
    writing the state after window token s to pool slot draft_slots[:, s] ([b, T] int32;
    NULL_SLOT skips). Rollback = continue from draft_slots[:, n_accepted - 1].
    Returns y [b, T, H, P] and the pool."""
    dims = _check_window_inputs(x, B, C, dt, A, D, slots)
    check_state(state, ("H", "P", "N"), dims, slots)
    check_draft_slots(draft_slots, dims, slots, state.shape[0])
    return _OPS["standard_verify"](state, x, B, C, dt, A, D, slots, draft_slots, impl=impl,
                                   tiling=tiling, interpret=interpret)
