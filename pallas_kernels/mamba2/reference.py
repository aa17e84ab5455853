"""Mamba-2 decode math per batch row (no pool): the oracle, and what `xla.py` runs per row.

Notation (per head h of dim P, group g = h // (H // G), state size N):

    standard step:  S <- exp(dt A) S + dt x B^T          y = S C + D x
    replay step:    tokens w_0..w_c = ring[0:c] + current token (c = count)
                    s_j = dt_j exp(A sum_{i>j} dt_i),  decay = exp(A sum_j dt_j)
                    y = decay (S0 C) + sum_j s_j (B_j . C) x_j + D x          (never forms S)
                    fold when c == L - 1:  S0 <- decay S0 + sum_j s_j x_j B_j^T,  count <- 0
                    otherwise:             ring[c] <- (x, B, dt),              count <- c + 1

`dt` is always the value after dt_bias and softplus, float32; `A = -exp(A_log)`.
All math runs in float32 (float64 if the inputs are float64) at HIGHEST matmul precision.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def _compute_dtype(*arrays):
    return jnp.float64 if any(a.dtype == jnp.float64 for a in arrays) else jnp.float32


def _heads(v, num_heads):
    """[b, G, ...] per-group tensor -> [b, H, ...] per-head view."""
    return jnp.repeat(v, num_heads // v.shape[1], axis=1)


def ssm_step(state, x, B, C, dt, A, D):
    """One standard recurrence step for a batch of rows (no pool).

    state [b, H, P, N]; x [b, H, P]; B, C [b, G, N]; dt [b, H]; A, D [H].
    Returns y [b, H, P] and the new state [b, H, P, N], both in the compute dtype.
    """
    ct = _compute_dtype(state, x, B, dt)
    H = x.shape[1]
    state, x, dt, A, D = (a.astype(ct) for a in (state, x, dt, A, D))
    Bh, Ch = _heads(B.astype(ct), H), _heads(C.astype(ct), H)
    da = jnp.exp(dt * A)
    new = da[..., None, None] * state + (dt[..., None] * x)[..., None] * Bh[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", new, Ch, precision=_HI) + D[:, None] * x
    return y, new


def replay_step(s0, ring_x, ring_b, ring_dt, count, x, B, C, dt, A, D):
    """Closed-form replay step for a batch of rows (no pool).

    s0 [b, H, P, N]; ring_x [b, H, L, P]; ring_b [b, G, L, N]; ring_dt [b, H, L]; count [b] in
    [0, L - 1]; current token x [b, H, P], B, C [b, G, N], dt [b, H]; A, D [H].
    Ring entries at positions >= count are ignored whatever they hold (NaN included).
    Returns y [b, H, P] and the folded state [b, H, P, N] (the new checkpoint where
    count == L - 1; meaningless elsewhere).
    """
    ct = _compute_dtype(s0, x, B, dt)
    H, L = x.shape[1], ring_x.shape[2]
    j = jnp.arange(L)
    valid = j[None, :] < count[:, None]                       # [b, L]
    cur = j[None, :] == count[:, None]

    def window(ring, token):                                  # ring [b, H or G, L, ...]
        shape = (valid.shape[0], 1, L) + (1,) * (ring.ndim - 3)
        v, c = valid.reshape(shape), cur.reshape(shape)
        return jnp.where(v, ring.astype(ct), jnp.where(c, token.astype(ct)[:, :, None], 0))

    xw = window(ring_x, x)                                 # [b, H, L, P]
    bw = _heads(window(ring_b, B), H)                   # [b, H, L, N]
    dtw = window(ring_dt, dt)                              # [b, H, L]
    A, D = A.astype(ct), D.astype(ct)
    later = (j[None, :] > j[:, None]).astype(ct)              # later[j, i] = i > j
    suffix = jnp.einsum("bhi,ji->bhj", dtw, later, precision=_HI)
    s = dtw * jnp.exp(A[:, None] * suffix)                    # [b, H, L]
    decay = jnp.exp(A * dtw.sum(-1))                          # [b, H]
    Ch = _heads(C.astype(ct), H)
    s0 = s0.astype(ct)
    bc = jnp.einsum("bhln,bhn->bhl", bw, Ch, precision=_HI)
    y = (decay[..., None] * jnp.einsum("bhpn,bhn->bhp", s0, Ch, precision=_HI)
         + jnp.einsum("bhl,bhlp->bhp", s * bc, xw, precision=_HI)
         + D[:, None] * x.astype(ct))
    folded = decay[..., None, None] * s0 + jnp.einsum(
        "bhlp,bhln->bhpn", xw * s[..., None], bw, precision=_HI)
    return y, folded
