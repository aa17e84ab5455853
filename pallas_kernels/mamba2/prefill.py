"""Pure-jnp (XLA) Mamba-2 prefill: chunked SSD over a right-padded batch of prompts.

Same recurrence as `reference.ssm_step`, per head h (group g = h // (H // G)):

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T        y_t = S_t C_t + D x_t

evaluated chunk by chunk (chunk length Q). With a_t = dt_t A <= 0 and cs_l the inclusive cumsum
of a over the chunk (cs <= 0, non-increasing):

    intra:  y_l += sum_{s <= l} exp(cs_l - cs_s) (C_l . B_s) dt_s x_s     (quadratic, masked)
    inter:  y_l += exp(cs_l) (S_in C_l)                                   (state entering chunk)
    state:  S_out = exp(cs_{Q-1}) S_in + sum_s exp(cs_{Q-1} - cs_s) dt_s x_s B_s^T

The intra-chunk terms are computed for all chunks at once; the state passing (with the inter
term and each chunk's state contribution) runs in a `lax.scan` over chunks. Every exponent is
<= 0 (masked with `where` before `exp`), so nothing overflows. Padded positions (t >= length)
get dt = 0 and x = B = C = 0: those steps are the identity on the state and emit y = 0, so the
final state is the state after `length` tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.chunks import check_prefill, to_chunks
from pallas_kernels.validation import F32_ONLY, FLOAT_DTYPES, Field, check

_HI = lax.Precision.HIGHEST
_F32 = jnp.float32

# The arguments' layout (dims b, T, H, P, G, N).
_FIELDS = (
    Field("x", ("b", "T", "H", "P"), FLOAT_DTYPES),
    Field("B", ("b", "T", "G", "N"), FLOAT_DTYPES),
    Field("C", ("b", "T", "G", "N"), "B"),
    Field("dt", ("b", "T", "H"), F32_ONLY),
    Field("A", ("H",), F32_ONLY),
    Field("D", ("H",), F32_ONLY),
)


def _ein(spec, *ops):
    return jnp.einsum(spec, *ops, precision=_HI)


def ssd_prefill(x, B, C, dt, A, D, lengths, initial_state=None, *, chunk=64, block=0):
    """Chunked SSD prefill for a batch of right-padded prompts.

    x [b, T, H, P] any float dtype; B, C [b, T, G, N] any float dtype (one); dt [b, T, H]
    float32 (after dt_bias and softplus); A, D [H] float32 (A = -exp(A_log)); lengths [b] int32
    in [1, T]; initial_state [b, H, P, N] float32 or None (zeros). T need not be a multiple of
    `chunk`.

    Returns y [b, T, H, P] float32 (exactly 0 at t >= lengths) and the final state
    [b, H, P, N] float32 after exactly lengths[i] tokens. All math in float32, HIGHEST dots.
    block > 0 (a multiple of chunk): also the states after block, 2 block, ... tokens
    [b, T // block, H, P, N] float32 (past a prompt's length they equal its final state).
    Bad arguments (shapes, dtypes, chunk, block; lengths outside [1, T] where concrete, i.e. an
    eager call) are a one-line ValueError.
    """
    dims = check_prefill(_FIELDS, dict(x=x, B=B, C=C, dt=dt, A=A, D=D), lengths, initial_state,
                         ("H", "P", "N"), chunk, block)
    check(dims["H"] % dims["G"] == 0,
          f"heads ({dims['H']}) must be a multiple of groups ({dims['G']})")
    return _ssd_prefill(x, B, C, dt, A, D, lengths, initial_state, chunk=chunk, block=block)


@functools.partial(jax.jit, static_argnames=("chunk", "block"))
def _ssd_prefill(x, B, C, dt, A, D, lengths, initial_state, *, chunk, block):
    b, T, H, P = x.shape
    G, N = B.shape[2:]
    R, Q = H // G, chunk
    nc = -(-T // Q)
    Tp = nc * Q

    valid = jnp.arange(T)[None, :] < lengths[:, None]                       # [b, T]

    def prep(t):
        return to_chunks(t, valid, Q)

    # Heads are kept as (G, R) so B, C and C.B are computed once per group, not per head.
    x = prep(x).reshape(b, nc, Q, G, R, P)
    dt = prep(dt).reshape(b, nc, Q, G, R)
    B, C = prep(B), prep(C)                                                  # [b, nc, Q, G, N]
    A = A.astype(_F32).reshape(G, R)
    D = D.astype(_F32).reshape(G, R)

    cs = jnp.cumsum(dt * A, axis=2)                                          # [b, nc, Q, G, R]
    csT = jnp.moveaxis(cs, 2, -1)                                            # [b, nc, G, R, Q]
    xdt = x * dt[..., None]                                                  # [b, nc, Q, G, R, P]

    # Intra-chunk: segment-sum decay, masked to l >= s before the exp (exp(-inf) = 0).
    pos = jnp.arange(Q)
    causal = pos[:, None] >= pos[None, :]
    seg = jnp.where(causal, csT[..., :, None] - csT[..., None, :], -jnp.inf)
    cb = _ein("bclgn,bcsgn->bcgls", C, B)                                    # per group
    m = jnp.exp(seg) * cb[:, :, :, None]                                     # [b, nc, G, R, Q, Q]
    y = _ein("bcgrls,bcsgrp->bclgrp", m, xdt) + D[:, :, None] * x

    if initial_state is None:
        s0 = jnp.zeros((b, G, R, P, N), _F32)
    else:
        s0 = initial_state.astype(_F32).reshape(b, G, R, P, N)

    # State passing, chunk by chunk in order (a prompt's state rounds the same whatever the
    # padded length), in place on chunk-major buffers: each chunk reads the state entering it
    # with C (the inter-chunk output, decayed from the chunk start: exp(cs) <= 1) into its rows
    # of y, then adds its own contribution to the state. No per-chunk state is kept: a
    # [b, nc, G, R, P, N] buffer of them (4.3 GB a layer at 32 x 2048) read and rewritten in a
    # loop was copied whole by XLA on every chunk. y is carried, not a scan's stacked output:
    # XLA allocated those zero-initialised buffers up front, every layer's at once.
    cm = lambda t: jnp.moveaxis(t, 1, 0)                                     # noqa: E731
    Cm, Bm, xdtm, ecs = cm(C), cm(B), cm(xdt), cm(jnp.exp(cs))
    to_end = cm(jnp.exp(csT[..., -1:] - csT))                               # [nc, b, G, R, Q]
    decay = cm(jnp.exp(csT[..., -1]))[..., None, None]                      # [nc, b, G, R, 1, 1]

    def chunk_step(c, carry):
        s, y = carry                   # s [b, G, R, P, N]; y [nc, b, Q, G, R, P]
        at = lambda t: lax.dynamic_index_in_dim(t, c, keepdims=False)       # noqa: E731
        y_in = _ein("blgn,bgrpn->blgrp", at(Cm), s) * at(ecs)[..., None]
        y = lax.dynamic_update_index_in_dim(y, at(y) + y_in, c, 0)
        xe = at(xdtm) * jnp.moveaxis(at(to_end), -1, 1)[..., None]          # [b, Q, G, R, P]
        return at(decay) * s + _ein("bsgrp,bsgn->bgrpn", xe, at(Bm)), y

    y = cm(y)
    if block:       # whole blocks first, keeping the state after each, then the rest
        per, full = block // Q, T // block

        def block_step(i, carry):
            s, y, states = carry
            s, y = lax.fori_loop(i * per, (i + 1) * per, chunk_step, (s, y))
            return s, y, lax.dynamic_update_index_in_dim(states, s, i, 0)

        s, y, after = lax.fori_loop(0, full, block_step,
                                    (s0, y, jnp.zeros((full,) + s0.shape, _F32)))
        final, y = lax.fori_loop(full * per, nc, chunk_step, (s, y))
    else:
        final, y = lax.fori_loop(0, nc, chunk_step, (s0, y))
    y = jnp.moveaxis(y, 0, 1)

    y = y.reshape(b, Tp, H, P)[:, :T]
    y = jnp.where(valid[:, :, None, None], y, 0)
    if not block:
        return y, final.reshape(b, H, P, N)
    blocks = jnp.moveaxis(after, 0, 1)                    # after[i]: the state after block i + 1
    return y, final.reshape(b, H, P, N), blocks.reshape(b, -1, H, P, N)
