"""Gated DeltaNet decode math per batch row (no pool): the oracle, and what `xla.py` runs per row.

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

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST
QK_NORM_EPS = 1e-6


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
    sk = E * ein("bhvk,bhk->bhv", s0, kh) + ein(
        "bhl,bhlv->bhv", e * ein("bhlk,bhk->bhl", kh_ring, kh), d_ring)
    sq = E * ein("bhvk,bhk->bhv", s0, qh) + ein(
        "bhl,bhlv->bhv", e * ein("bhlk,bhk->bhl", kh_ring, qh), d_ring)
    alpha = jnp.exp(g)[..., None]
    d = beta[..., None] * (v - alpha * sk)
    o = alpha * sq + d * jnp.sum(kh * qh, -1, keepdims=True)

    gw = window(ring_g, g)
    w = jnp.exp(_suffix(gw))
    decay = jnp.exp(gw.sum(-1))[..., None, None]
    dw, kw = window(ring_d, d), _heads(window(ring_k, k), Hv)
    folded = decay * s0 + ein("bhlv,bhlk->bhvk", dw * w[..., None], kw)
    return o, folded, d
