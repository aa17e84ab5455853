"""Public Gated DeltaNet decode ops: validate, pick an implementation, run.

    o, state   = standard_decode(state, q, k, v, g, beta, slots)
    o, buffers = replay_decode(buffers, counts, q, k, v, g, beta, slots)
    counts     = advance_counts(counts, slots, window)     # once per model step, not per layer

Shapes: batch b rows, Hk key heads and Hv value heads (Hv % Hk == 0; value head j uses key head
j // (Hv / Hk)), key dim K, value dim V, pool of S slots (slot 0 = null slot), window L.
    q, k [b, Hk, K]: L2-normalised, q scaled by K^-1/2 (`prepare_qk`), float32 or the
    activation dtype; v [b, Hv, V] activation dtype; g, beta [b, Hv] float32 (`gates`);
    slots [b] int32; counts [S] int32 in [0, L - 1]; state [S, Hv, V, K]; buffers as in
    `GDNBuffers`.
Rows must name distinct slots. The ring contract is `pallas_kernels.ring`. Values are checked
where concrete, as in `pallas_kernels.mamba2.api`.

impl: as in `pallas_kernels.mamba2.api` ("pallas_mosaic_gpu": decode and replay verify,
K <= 256). tiling: the Pallas launch configuration (`GDNTiling`, `GDNReplayTiling`,
`GDNVerifyTiling`; `GDNMosaicTiling` for Mosaic GPU), None for the measured one
(`STANDARD_TILING`, `REPLAY_TILING`, `VERIFY_TILING`, `MOSAIC_*_TILING`). Donate the pools
at your jit boundary.
"""

from __future__ import annotations

from pallas_kernels.dispatch import family_ops
from pallas_kernels.gdn import pallas_mosaic_gpu, pallas_triton, xla
from pallas_kernels.gdn.buffers import FIELDS, GDNBuffers
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
    Field("v", ("b", "Hv", "V"), FLOAT_DTYPES),
    Field("q", ("b", "Hk", "K"), FLOAT_DTYPES),
    Field("k", ("b", "Hk", "K"), FLOAT_DTYPES),
    Field("g", ("b", "Hv"), F32_ONLY),
    Field("beta", ("b", "Hv"), F32_ONLY),
    Field("slots", ("b",), INT32_ONLY),
)
_OPS = family_ops("gdn", ("standard_decode", "replay_decode", "replay_verify",
                          "standard_verify"), xla=xla, pallas_triton=pallas_triton,
                  pallas_mosaic_gpu=pallas_mosaic_gpu)


def _check_step_inputs(q, k, v, g, beta, slots) -> dict[str, int]:
    """Validates one token's inputs; returns the dims (b, Hk, Hv, K, V)."""
    check_arrays(q=q, k=k, v=v, g=g, beta=beta, slots=slots)
    check(v.ndim == 3, f"v must be [batch, value_heads, V], got shape {tuple(v.shape)}")
    check(q.ndim == 3, f"q must be [batch, key_heads, K], got shape {tuple(q.shape)}")
    Hv, Hk, K = v.shape[1], q.shape[1], q.shape[2]
    check(Hk > 0 and Hv % Hk == 0, f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    check(is_pow2(K), f"key dim K = {K} must be a power of two (Pallas Triton block sizes)")
    return check_fields(_STEP_FIELDS, dict(q=q, k=k, v=v, g=g, beta=beta, slots=slots))


def _check_window_inputs(q, k, v, g, beta, slots) -> dict[str, int]:
    """Window inputs are [b, T, ...]: validated as T single-token steps; returns the dims + T."""
    check_arrays(q=q, k=k, v=v, g=g, beta=beta)
    check(v.ndim == 4, f"v must be [batch, T, value_heads, V], got shape {tuple(v.shape)}")
    T = v.shape[1]
    check(1 <= T <= MAX_VERIFY_TOKENS, f"verify window T = {T} must be in [1, {MAX_VERIFY_TOKENS}]")
    for name, arr in (("q", q), ("k", k), ("g", g), ("beta", beta)):
        check(arr.ndim >= 2 and arr.shape[1] == T,
              f"{name} must have the window T = {T} on axis 1, got shape {tuple(arr.shape)}")
    return dict(_check_step_inputs(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], slots), T=T)


def standard_decode(state, q, k, v, g, beta, slots, *, impl="auto", tiling=None, interpret=None):
    """One standard gated delta rule step (reads and writes every row's state): the baseline.
    Returns o [b, Hv, V] in v.dtype and the updated pool [S, Hv, V, K]."""
    check_state(state, ("Hv", "V", "K"), _check_step_inputs(q, k, v, g, beta, slots), slots)
    return _OPS["standard_decode"](state, q, k, v, g, beta, slots, impl=impl, tiling=tiling,
                                   interpret=interpret)


def replay_decode(buffers: GDNBuffers, counts, q, k, v, g, beta, slots, *, impl="auto",
                  tiling=None, interpret=None):
    """One ReplaySSM GDN step (T = 1). Reads `counts` (advance them once per model step with
    `advance_counts`). Returns o [b, Hv, V] in v.dtype and the updated buffers.

    Rows with count == L - 1 fold ring + current token into the checkpoint; the others append
    (k, d, g) to the ring.
    """
    check_replay_cache(FIELDS, buffers, counts, _check_step_inputs(q, k, v, g, beta, slots),
                       slots)
    return _OPS["replay_decode"](buffers, counts, q, k, v, g, beta, slots, impl=impl,
                                 tiling=tiling, interpret=interpret)


def replay_verify(buffers: GDNBuffers, counts, q, k, v, g, beta, slots, *, impl="auto",
                  tiling=None, interpret=None):
    """Speculative verify of T window tokens per row (q, k [b, T, Hk, K]; v [b, T, Hv, V];
    g, beta [b, T, Hv]; 1 <= T <= min(8, L)). Returns o [b, T, Hv, V] in v.dtype, causal within
    the window, and the buffers with the window's (k, d, g) written into the ring beyond the
    committed count (d exactly as T single steps would have cached it).

    Rows with count + T >= L fold ring[0:count] + window[0] into the checkpoint first. Commit
    with `commit_counts(counts, slots, n_accepted, T, L)`; T = 1 + commit(1) is `replay_decode`.
    """
    dims = _check_window_inputs(q, k, v, g, beta, slots)
    L = check_replay_cache(FIELDS, buffers, counts, dims, slots)
    check(dims["T"] <= L, f"verify window T = {dims['T']} must not exceed the ring window L = {L}")
    return _OPS["replay_verify"](buffers, counts, q, k, v, g, beta, slots, impl=impl,
                                 tiling=tiling, interpret=interpret)


def standard_verify(state, q, k, v, g, beta, slots, draft_slots, *, impl="auto", tiling=None,
                    interpret=None):
    """The usual verify (baseline and cross-check): T standard steps from the state at `slots`,
    the state after window token s written to draft_slots[:, s] ([b, T] int32; NULL_SLOT skips).
    Returns o [b, T, Hv, V] and the pool."""
    dims = _check_window_inputs(q, k, v, g, beta, slots)
    check_state(state, ("Hv", "V", "K"), dims, slots)
    check_draft_slots(draft_slots, dims, slots, state.shape[0])
    return _OPS["standard_verify"](state, q, k, v, g, beta, slots, draft_slots, impl=impl,
                                   tiling=tiling, interpret=interpret)
