"""Pure-jnp (XLA) Mamba-2 prefill: chunked SSD over a right-padded batch of prompts.

Same recurrence as `reference.ssm_step`, per head h (group g = h // (H // G)):

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T        y_t = S_t C_t + D x_t

evaluated chunk by chunk (chunk length Q). With a_t = dt_t A <= 0 and cs_l the inclusive cumsum
of a over the chunk (cs <= 0, non-increasing):

    intra:  y_l += sum_{s <= l} exp(cs_l - cs_s) (C_l . B_s) dt_s x_s     (quadratic, masked)
    inter:  y_l += exp(cs_l) (S_in C_l)                                   (state entering chunk)
    state:  S_out = exp(cs_{Q-1}) S_in + sum_s exp(cs_{Q-1} - cs_s) dt_s x_s B_s^T

The per-chunk contributions are computed for all chunks at once; only the state passing runs
chunk by chunk (in place, see below). Every exponent is <= 0 (masked with `where`
before `exp`), so nothing overflows. Padded positions (t >= length) get dt = 0 and x = B = C = 0:
those steps are the identity on the state and emit y = 0, so the final state is the state after
`length` tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.chunks import to_chunks

_HI = lax.Precision.HIGHEST
_F32 = jnp.float32


def _ein(spec, *ops):
    return jnp.einsum(spec, *ops, precision=_HI)


@functools.partial(jax.jit, static_argnames=("chunk", "block"))
def ssd_prefill(x, B, C, dt, A, D, lengths, initial_state=None, *, chunk=64, block=0):
    """Chunked SSD prefill for a batch of right-padded prompts.

    x [b, T, H, P] any float dtype; B, C [b, T, G, N]; dt [b, T, H] float32 (after dt_bias and
    softplus); A, D [H] float32 (A = -exp(A_log)); lengths [b] int32 in [1, T];
    initial_state [b, H, P, N] float32 or None (zeros). T need not be a multiple of `chunk`.

    Returns y [b, T, H, P] float32 (exactly 0 at t >= lengths) and the final state
    [b, H, P, N] float32 after exactly lengths[i] tokens. All math in float32, HIGHEST dots.
    block > 0 (a multiple of chunk): also the states after block, 2 block, ... tokens
    [b, T // block, H, P, N] float32 (the chunk states the scan computes anyway; past a
    prompt's length they equal its final state).
    """
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
    y = _ein("bcgrls,bcsgrp->bclgrp", m, xdt)

    # Each chunk's own contribution to the state at its end, and its total decay.
    to_end = jnp.exp(csT[..., -1:] - csT)                                    # [b, nc, G, R, Q]
    chunk_states = _ein("bcgrs,bcsgrp,bcsgn->bcgrpn", to_end, xdt, B)

    if initial_state is None:
        s0 = jnp.zeros((b, G, R, P, N), _F32)
    else:
        s0 = initial_state.astype(_F32).reshape(b, G, R, P, N)

    # State passing, chunk by chunk, in place: chunk_states[c] is replaced by the state
    # entering chunk c (the state after c chunks) once read. Not a `lax.scan`: its stacked
    # output was a zero-initialised buffer per layer that XLA allocated up front for every layer
    # at once (~80 KB per prompt position per Mamba-2 layer of an 8B model, alive together).
    # Not a product over chunk pairs either: its sum's order depends on the padded length, so a
    # prompt's state would round differently in another batch.
    decay = jnp.exp(csT[..., -1])[..., None, None]                           # [b, nc, G, R, 1, 1]

    def step(c, carry):
        s, buf = carry
        add = lax.dynamic_index_in_dim(buf, c, axis=1, keepdims=False)
        buf = lax.dynamic_update_index_in_dim(buf, s, c, axis=1)
        d = lax.dynamic_index_in_dim(decay, c, axis=1, keepdims=False)
        return d * s + add, buf

    final, s_in = lax.fori_loop(0, nc, step, (s0, chunk_states))             # s_in [b, nc, ...]
    # Inter-chunk: the entering state read by C, decayed from the chunk start (exp(cs) <= 1).
    y = y + _ein("bclgn,bcgrpn->bclgrp", C, s_in) * jnp.exp(cs)[..., None]
    y = y + D[:, :, None] * x

    y = y.reshape(b, Tp, H, P)[:, :T]
    y = jnp.where(valid[:, :, None, None], y, 0)
    if not block:
        return y, final.reshape(b, H, P, N)
    per = block // Q                                # s_in[:, c]: the state after c chunks
    blocks = jnp.concatenate([s_in[:, per::per], final[:, None]], axis=1)[:, :T // block]
    return y, final.reshape(b, H, P, N), blocks.reshape(b, -1, H, P, N)
