"""Pure-jnp Gated DeltaNet decode: the oracle for the kernels and the XLA implementation.

Per value head (state S is [V, K]: value rows, key columns, so S k and S q reduce over the
contiguous axis; HF stores the transpose), with q, k L2-normalised, q scaled by K^-1/2,
alpha = exp(g), g = -exp(A_log) softplus(a + dt_bias) <= 0, beta = sigmoid(b):

    standard step:  d = beta (v - alpha S k),  S <- alpha S + d k^T,  o = S q
    replay step:    ring holds (k_j, d_j, g_j) for the c tokens since the checkpoint S0;
                    e_j = exp(sum_{j<i<c} g_i), E = exp(sum_{i<c} g_i)
                    S k = E (S0 k) + sum_j e_j (k_j . k) d_j      (likewise S q; S never formed)
                    d = beta (v - alpha S k),  o = alpha S q + d (k . q)
                    fold when c == L - 1 (current token = entry c, w_j = exp(sum_{j<i<=c} g_i)):
                      S0 <- exp(sum_{i<=c} g_i) S0 + sum_j w_j d_j k_j^T,  count <- 0
                    otherwise append (k, d, g) at c, count <- c + 1
Caching the corrected update d (not v) makes S_{t-1} a plain weighted sum of outer products.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels._common import NULL_SLOT, row_index, verify_folds, write_window_rings

_HI = lax.Precision.HIGHEST
QK_NORM_EPS = 1e-6


class GDNBuffers(NamedTuple):
    """Per-layer ReplaySSM cache for GDN over a pool of S slots (slot 0 = null slot).

    checkpoint: [S, Hv, V, K] state dtype (float32 default, bfloat16 optional)
    ring_k:     [S, Hk, L, K] ring dtype, normalised keys of the tokens since the checkpoint
    ring_d:     [S, Hv, L, V] ring dtype, their corrected updates d = beta (v - alpha S k)
    ring_g:     [S, Hv, L]    float32, their log-decays g
    Counts ([S] int32) are shared by all layers and live outside; L = ring_k.shape[2].
    """

    checkpoint: jax.Array
    ring_k: jax.Array
    ring_d: jax.Array
    ring_g: jax.Array

    @property
    def window(self) -> int:
        return self.ring_k.shape[2]


def init_gdn_buffers(num_slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                     head_v_dim: int, window: int = 16, state_dtype=jnp.float32,
                     ring_dtype=jnp.float32) -> GDNBuffers:
    """Zeroed buffers. The ring defaults to float32: cached d values enter every later output
    and every fold, and bf16 d drifts (docs/benchmarks.md has the numbers)."""
    return GDNBuffers(
        checkpoint=jnp.zeros((num_slots, num_v_heads, head_v_dim, head_k_dim), state_dtype),
        ring_k=jnp.zeros((num_slots, num_k_heads, window, head_k_dim), ring_dtype),
        ring_d=jnp.zeros((num_slots, num_v_heads, window, head_v_dim), ring_dtype),
        ring_g=jnp.zeros((num_slots, num_v_heads, window), jnp.float32),
    )


def prepare_qk(q, k):
    """L2-normalise q and k over the key dim in fp32 (eps inside the sqrt of the sum of squares,
    as FLA's l2norm) and scale q by K^-1/2. q, k [..., K] -> float32."""
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    norm = lambda t: t * lax.rsqrt(jnp.sum(t * t, -1, keepdims=True) + QK_NORM_EPS)
    return norm(q) * q.shape[-1] ** -0.5, norm(k)


def gates(a, b, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias) (log-decay) and beta = sigmoid(b), float32.
    a, b [..., Hv]; A_log, dt_bias [Hv]."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    g = -jnp.exp(A_log.astype(jnp.float32)) * jax.nn.softplus(a + dt_bias.astype(jnp.float32))
    return g, jax.nn.sigmoid(b)


def _ct(*arrays):
    return jnp.float64 if any(a.dtype == jnp.float64 for a in arrays) else jnp.float32


def _heads(t, num_heads):
    """[b, Hk, ...] per-key-head tensor -> [b, Hv, ...]: value head j uses key head j // r."""
    return jnp.repeat(t, num_heads // t.shape[1], axis=1)


def delta_step(state, q, k, v, g, beta):
    """One standard gated delta rule step for a batch of rows (no pool).

    state [b, Hv, V, K]; q, k [b, Hk, K] (prepared); v [b, Hv, V]; g, beta [b, Hv].
    Returns o [b, Hv, V] and the new state, both in the compute dtype.
    """
    ct = _ct(state, q, v, g)
    Hv = v.shape[1]
    state, v, g, beta = (t.astype(ct) for t in (state, v, g, beta))
    qh, kh = _heads(q.astype(ct), Hv), _heads(k.astype(ct), Hv)
    alpha = jnp.exp(g)[..., None]
    sk = jnp.einsum("bhvk,bhk->bhv", state, kh, precision=_HI)
    d = beta[..., None] * (v - alpha * sk)
    new = alpha[..., None] * state + d[..., None] * kh[:, :, None, :]
    return jnp.einsum("bhvk,bhk->bhv", new, qh, precision=_HI), new


def _suffix(v):
    """out[..., j] = sum_{i > j} v[..., i]."""
    L = v.shape[-1]
    j = jnp.arange(L)
    return jnp.einsum("...i,ji->...j", v, (j[None, :] > j[:, None]).astype(v.dtype),
                      precision=_HI)


def replay_step(s0, ring_k, ring_d, ring_g, count, q, k, v, g, beta):
    """Closed-form replay step for a batch of rows (no pool). Ring entries at positions >=
    count are ignored (NaN included). Returns o [b, Hv, V], the folded state [b, Hv, V, K]
    (meaningful where count == L - 1) and this token's corrected update d [b, Hv, V]."""
    ct = _ct(s0, q, v, g)
    Hv, L = v.shape[1], ring_k.shape[2]
    j = jnp.arange(L)
    valid = j[None, :] < count[:, None]
    cur = j[None, :] == count[:, None]

    def sel(mask, ring):
        return mask.reshape(mask.shape[:1] + (1, L) + (1,) * (ring.ndim - 3))

    def hist(ring):            # ring entries below the count, zeros elsewhere
        return jnp.where(sel(valid, ring), ring.astype(ct), 0)

    def window(ring, token):   # history + the current token at the count
        return jnp.where(sel(cur, ring), token.astype(ct)[:, :, None], hist(ring))

    s0, v, g, beta = (t.astype(ct) for t in (s0, v, g, beta))
    qh, kh = _heads(q.astype(ct), Hv), _heads(k.astype(ct), Hv)
    kh_ring, d_ring, g_ring = _heads(hist(ring_k), Hv), hist(ring_d), hist(ring_g)
    e = jnp.exp(_suffix(g_ring))                                   # [b, Hv, L]
    E = jnp.exp(g_ring.sum(-1))[..., None]                         # [b, Hv, 1]
    ein = lambda s, *a: jnp.einsum(s, *a, precision=_HI)
    sk = E * ein("bhvk,bhk->bhv", s0, kh) + ein("bhl,bhlv->bhv", e * ein("bhlk,bhk->bhl", kh_ring, kh), d_ring)
    sq = E * ein("bhvk,bhk->bhv", s0, qh) + ein("bhl,bhlv->bhv", e * ein("bhlk,bhk->bhl", kh_ring, qh), d_ring)
    alpha = jnp.exp(g)[..., None]
    d = beta[..., None] * (v - alpha * sk)
    o = alpha * sq + d * jnp.sum(kh * qh, -1, keepdims=True)

    gw = window(ring_g, g)
    w = jnp.exp(_suffix(gw))
    decay = jnp.exp(gw.sum(-1))[..., None, None]
    dw, kw = window(ring_d, d), _heads(window(ring_k, k), Hv)
    folded = decay * s0 + ein("bhlv,bhlk->bhvk", dw * w[..., None], kw)
    return o, folded, d


def standard_decode(state, q, k, v, g, beta, slots):
    """Standard GDN decode over a pool (reads and writes every row's state).
    Returns o [b, Hv, V] (v.dtype) and the updated pool."""
    live = slots != NULL_SLOT
    o, new = delta_step(state[slots], q, k, v, g, beta)
    o = jnp.where(live[:, None, None], o, 0).astype(v.dtype)
    return o, state.at[row_index(slots, live, state.shape[0])].set(
        new.astype(state.dtype), mode="drop")


def replay_decode(buffers: GDNBuffers, counts, q, k, v, g, beta, slots):
    """ReplaySSM GDN decode (T = 1) over a pool; counts are read, not advanced.
    Returns o [b, Hv, V] (v.dtype) and the updated buffers."""
    S, L = buffers.checkpoint.shape[0], buffers.window
    live = slots != NULL_SLOT
    count = counts[slots]
    o, folded, d = replay_step(buffers.checkpoint[slots], buffers.ring_k[slots],
                               buffers.ring_d[slots], buffers.ring_g[slots], count,
                               q, k, v, g, beta)
    o = jnp.where(live[:, None, None], o, 0).astype(v.dtype)
    idx = row_index(slots, live, S)
    fold_idx = jnp.where(count == L - 1, idx, S)
    c = jnp.minimum(count, L - 1)
    return o, GDNBuffers(
        checkpoint=buffers.checkpoint.at[fold_idx].set(
            folded.astype(buffers.checkpoint.dtype), mode="drop"),
        ring_k=buffers.ring_k.at[idx, :, c, :].set(k.astype(buffers.ring_k.dtype), mode="drop"),
        ring_d=buffers.ring_d.at[idx, :, c, :].set(d.astype(buffers.ring_d.dtype), mode="drop"),
        ring_g=buffers.ring_g.at[idx, :, c].set(g.astype(jnp.float32), mode="drop"),
    )


def replay_verify(buffers: GDNBuffers, counts, q, k, v, g, beta, slots):
    """Speculative verify over T window tokens per row, the oracle/XLA form (the Pallas kernel
    uses the one-chunk WY/UT form of the same recurrence).

    q, k [b, T, Hk, K]; v [b, T, Hv, V]; g, beta [b, T, Hv]. Window token s is output from the
    committed state + window[0:s+1]; its corrected update d_s is what s single steps would cache.
    Rows with count + T >= L fold ring[0:count] + window[0] into the checkpoint; the window is
    written into the ring uncommitted (see `write_window`). Returns o [b, T, Hv, V] (v.dtype),
    the buffers and the window's d [b, T, Hv, V] float32.
    """
    S, L = buffers.checkpoint.shape[0], buffers.window
    T = v.shape[1]
    live = slots != NULL_SLOT
    count = counts[slots]
    rows = jnp.arange(v.shape[0])
    ext = [jnp.concatenate([r[slots], jnp.zeros(r[slots].shape[:2] + (T,) + r.shape[3:], r.dtype)],
                           axis=2) for r in (buffers.ring_k, buffers.ring_d, buffers.ring_g)]
    s0 = buffers.checkpoint[slots]
    os_, ds = [], []
    for s in range(T):
        o, folded, d = replay_step(s0, *ext, count + s, q[:, s], k[:, s], v[:, s], g[:, s],
                                   beta[:, s])
        os_.append(o)
        ds.append(d)
        if s == 0:
            first_fold = folded
        ext = [e.at[rows, :, count + s].set(t.astype(e.dtype))
               for e, t in zip(ext, (k[:, s], d, g[:, s]))]
    o = jnp.where(live[:, None, None, None], jnp.stack(os_, 1), 0).astype(v.dtype)
    d = jnp.stack(ds, 1)
    fold = live & verify_folds(count, T, L)
    out = buffers._replace(checkpoint=buffers.checkpoint.at[jnp.where(fold, slots, S)].set(
        first_fold.astype(buffers.checkpoint.dtype), mode="drop"))
    return o, write_window(out, counts, slots, k, d, g), d


def write_window(buffers: GDNBuffers, counts, slots, k, d, g):
    """Writes a verify window's (k [b, T, Hk, K], d [b, T, Hv, V], g [b, T, Hv]) into the rings,
    uncommitted (see `pallas_kernels._common.write_window_rings`)."""
    rk, rd, rg = write_window_rings((buffers.ring_k, buffers.ring_d, buffers.ring_g),
                                    (k, d, g.astype(jnp.float32)), counts, slots, buffers.window)
    return buffers._replace(ring_k=rk, ring_d=rd, ring_g=rg)


def standard_verify(state, q, k, v, g, beta, slots, draft_slots):
    """Baseline: T standard steps, the state after window token s written to draft_slots[:, s]."""
    live = slots != NULL_SLOT
    st = state[slots]
    os_ = []
    for s in range(v.shape[1]):
        o, st = delta_step(st, q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s])
        os_.append(o)
        idx = row_index(draft_slots[:, s], live & (draft_slots[:, s] != NULL_SLOT), state.shape[0])
        state = state.at[idx].set(st.astype(state.dtype), mode="drop")
    return jnp.where(live[:, None, None, None], jnp.stack(os_, 1), 0).astype(v.dtype), state
