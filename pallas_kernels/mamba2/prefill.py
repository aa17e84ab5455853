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
    [b, T // block, H, P, N] float32 (past a prompt's length they equal its final state).
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
    y = _ein("bcgrls,bcsgrp->bclgrp", m, xdt) + D[:, :, None] * x

    if initial_state is None:
        s0 = jnp.zeros((b, G, R, P, N), _F32)
    else:
        s0 = initial_state.astype(_F32).reshape(b, G, R, P, N)

    # State passing: a scan over chunks (chunk-major inputs) that reads the state entering each
    # chunk with C (inter-chunk output, decayed from the chunk start: exp(cs) <= 1) and adds the
    # chunk's own contribution. No per-chunk state is kept: a [b, nc, G, R, P, N] buffer of them
    # (64x the state per 64 tokens, 4.3 GB a layer at 32 x 2048) updated in a loop was copied
    # whole by XLA on every chunk. The sum over chunks runs in order whatever the padded length.
    # Chunks are grouped `per` to a block (padded with identity chunks: decay 1, inputs 0), so
    # an outer scan emits the state after each block alone.
    per = block // Q if block else nc
    nb = -(-nc // per)

    def blocked(t, fill=0.0):
        t = jnp.moveaxis(t, 1, 0)                                            # [nc, b, ...]
        t = jnp.pad(t, [(0, nb * per - nc)] + [(0, 0)] * (t.ndim - 1), constant_values=fill)
        return t.reshape((nb, per) + t.shape[1:])

    to_end = jnp.exp(csT[..., -1:] - csT)                                    # [b, nc, G, R, Q]
    xs = (blocked(C), blocked(B), blocked(xdt), blocked(to_end), blocked(jnp.exp(cs)),
          blocked(jnp.exp(csT[..., -1]), fill=1.0))

    def chunk_step(s, inp):            # s [b, G, R, P, N]; one chunk's inputs, no chunk axis
        Cc, Bc, xdtc, to_endc, ecs, decay = inp
        y_in = _ein("blgn,bgrpn->blgrp", Cc, s) * ecs[..., None]            # [b, Q, G, R, P]
        xe = xdtc * jnp.moveaxis(to_endc, -1, 1)[..., None]                  # [b, Q, G, R, P]
        s = decay[..., None, None] * s + _ein("bsgrp,bsgn->bgrpn", xe, Bc)
        return s, y_in

    def block_step(s, inp):
        s, y_in = lax.scan(chunk_step, s, inp)
        return s, (y_in, s)

    final, (y_in, after) = lax.scan(block_step, s0, xs)
    y_in = y_in.reshape((nb * per,) + y_in.shape[2:])[:nc]                   # [nc, b, Q, G, R, P]
    y = y + jnp.moveaxis(y_in, 0, 1)

    y = y.reshape(b, Tp, H, P)[:, :T]
    y = jnp.where(valid[:, :, None, None], y, 0)
    if not block:
        return y, final.reshape(b, H, P, N)
    blocks = jnp.moveaxis(after[:T // block], 0, 1)      # after[i]: the state after block i + 1
    return y, final.reshape(b, H, P, N), blocks.reshape(b, -1, H, P, N)
