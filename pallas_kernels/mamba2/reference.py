"""Pure-jnp Mamba-2 decode: the oracle for the kernels and the XLA implementation (`impl="xla"`).

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

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels._common import (NULL_SLOT, row_index as _row_index, verify_folds,
                                    write_window_rings)

_HI = lax.Precision.HIGHEST


class ReplayBuffers(NamedTuple):
    """Per-layer ReplaySSM cache for a pool of `S` sequence slots (slot 0 is the null slot).

    checkpoint: [S, H, P, N] state dtype (float32 default, bfloat16 optional)
    ring_x:     [S, H, L, P] ring dtype, post-conv x of the tokens since the checkpoint
    ring_b:     [S, G, L, N] ring dtype, their B
    ring_dt:    [S, H, L]    float32, their dt (after bias + softplus)

    The committed count per slot ([S] int32) is shared by every SSM layer of a model and lives
    outside this tuple; `L` (the window) is `ring_x.shape[2]`.
    """

    checkpoint: jax.Array
    ring_x: jax.Array
    ring_b: jax.Array
    ring_dt: jax.Array

    @property
    def window(self) -> int:
        return self.ring_x.shape[2]


def init_replay_buffers(num_slots: int, num_heads: int, head_dim: int, d_state: int,
                        n_groups: int, window: int = 16, state_dtype=jnp.float32,
                        ring_dtype=jnp.bfloat16) -> ReplayBuffers:
    """Zeroed buffers (never jnp.empty: padding rows read slot 0)."""
    return ReplayBuffers(
        checkpoint=jnp.zeros((num_slots, num_heads, head_dim, d_state), state_dtype),
        ring_x=jnp.zeros((num_slots, num_heads, window, head_dim), ring_dtype),
        ring_b=jnp.zeros((num_slots, n_groups, window, d_state), ring_dtype),
        ring_dt=jnp.zeros((num_slots, num_heads, window), jnp.float32),
    )


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


def standard_decode(state, x, B, C, dt, A, D, slots):
    """Standard decode over a state pool: reads and writes the state of every row.

    state [S, H, P, N]; slots [b] int32 (NULL_SLOT rows are padding: y = 0, nothing written).
    Returns y [b, H, P] (x.dtype) and the updated pool.
    """
    live = slots != NULL_SLOT
    y, new = ssm_step(state[slots], x, B, C, dt, A, D)
    y = jnp.where(live[:, None, None], y, 0).astype(x.dtype)
    idx = _row_index(slots, live, state.shape[0])
    return y, state.at[idx].set(new.astype(state.dtype), mode="drop")


def replay_decode(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots):
    """ReplaySSM decode (T = 1) over a pool; the counts are read, not advanced (see
    `advance_counts`). Returns y [b, H, P] (x.dtype) and the updated buffers."""
    S, L = buffers.checkpoint.shape[0], buffers.window
    live = slots != NULL_SLOT
    count = counts[slots]
    y, folded = replay_step(buffers.checkpoint[slots], buffers.ring_x[slots],
                            buffers.ring_b[slots], buffers.ring_dt[slots], count,
                            x, B, C, dt, A, D)
    y = jnp.where(live[:, None, None], y, 0).astype(x.dtype)
    idx = _row_index(slots, live, S)
    fold_idx = jnp.where(count == L - 1, idx, S)
    # The current token is appended at `count` on every step; after a fold that entry is
    # past the (reset) count and therefore ignored.
    c = jnp.minimum(count, L - 1)
    return y, ReplayBuffers(
        checkpoint=buffers.checkpoint.at[fold_idx].set(
            folded.astype(buffers.checkpoint.dtype), mode="drop"),
        ring_x=buffers.ring_x.at[idx, :, c, :].set(x.astype(buffers.ring_x.dtype), mode="drop"),
        ring_b=buffers.ring_b.at[idx, :, c, :].set(B.astype(buffers.ring_b.dtype), mode="drop"),
        ring_dt=buffers.ring_dt.at[idx, :, c].set(dt.astype(jnp.float32), mode="drop"),
    )


def replay_verify(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots):
    """Speculative verify over a window of T tokens per row, the oracle/XLA form.

    x [b, T, H, P]; B, C [b, T, G, N]; dt [b, T, H]; others as in `replay_decode`. Window token s
    is output causally from checkpoint + ring[0:count] + window[0:s+1]. Rows whose count + T >= L
    fold ring[0:count] + window[0] into the checkpoint and write window[1:] at ring 0..T-2; the
    others write the window at count..count+T-1. The window entries are uncommitted until
    `commit_counts`. Returns y [b, T, H, P] (x.dtype) and the buffers.
    """
    S, L = buffers.checkpoint.shape[0], buffers.window
    T = x.shape[1]
    live = slots != NULL_SLOT
    count = counts[slots]
    rows = jnp.arange(x.shape[0])
    # Extended ring: committed entries, then the window tokens appended one by one.
    ext = [jnp.concatenate([r[slots], jnp.zeros(r[slots].shape[:2] + (T,) + r.shape[3:], r.dtype)],
                           axis=2) for r in (buffers.ring_x, buffers.ring_b, buffers.ring_dt)]
    s0 = buffers.checkpoint[slots]
    ys = []
    for s in range(T):
        y, folded = replay_step(s0, *ext, count + s, x[:, s], B[:, s], C[:, s], dt[:, s], A, D)
        ys.append(y)
        if s == 0:
            first_fold = folded
        ext = [e.at[rows, :, count + s].set(t.astype(e.dtype))
               for e, t in zip(ext, (x[:, s], B[:, s], dt[:, s]))]
    y = jnp.where(live[:, None, None, None], jnp.stack(ys, 1), 0).astype(x.dtype)
    fold = live & verify_folds(count, T, L)
    out = buffers._replace(checkpoint=buffers.checkpoint.at[jnp.where(fold, slots, S)].set(
        first_fold.astype(buffers.checkpoint.dtype), mode="drop"))
    return y, write_window(out, counts, slots, x, B, dt)


def write_window(buffers: ReplayBuffers, counts, slots, x, B, dt):
    """Writes a verify window (x [b, T, H, P], B [b, T, G, N], dt [b, T, H]) into the rings,
    uncommitted (see `pallas_kernels._common.write_window_rings`)."""
    rx, rb, rdt = write_window_rings((buffers.ring_x, buffers.ring_b, buffers.ring_dt),
                                     (x, B, dt.astype(jnp.float32)), counts, slots,
                                     buffers.window)
    return buffers._replace(ring_x=rx, ring_b=rb, ring_dt=rdt)


def standard_verify(state, x, B, C, dt, A, D, slots, draft_slots):
    """The usual verify, kept as a baseline and cross-check: T standard steps from the state at
    `slots`, writing the state after window token s into pool slot draft_slots[:, s] (one full
    state write per draft token; rollback = use the state of the last accepted token).
    draft_slots [b, T] int32. Returns y [b, T, H, P] and the pool."""
    live = slots != NULL_SLOT
    st = state[slots]
    ys = []
    for s in range(x.shape[1]):
        y, st = ssm_step(st, x[:, s], B[:, s], C[:, s], dt[:, s], A, D)
        ys.append(y)
        idx = _row_index(draft_slots[:, s], live & (draft_slots[:, s] != NULL_SLOT), state.shape[0])
        state = state.at[idx].set(st.astype(state.dtype), mode="drop")
    return jnp.where(live[:, None, None, None], jnp.stack(ys, 1), 0).astype(x.dtype), state
