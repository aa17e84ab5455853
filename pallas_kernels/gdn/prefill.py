"""Pure-jnp (XLA) Gated DeltaNet prefill: chunked WY/UT form over a right-padded batch.

Same recurrence as `reference.delta_step`, per value head (S is [V, K], value rows):

    S <- exp(g_t) S;   d_t = beta_t (v_t - S k_t);   S <- S + d_t k_t^T;   o_t = S q_t

Within a chunk (G_i = inclusive cumsum of g, <= 0, non-increasing; S0 = state entering it):

    exp(g_i) S_{i-1} = exp(G_i) S0 + sum_{j<i} exp(G_i - G_j) d_j k_j^T, hence
    (I + A) d = beta v - beta exp(G) (S0 k),   A_ij = beta_i exp(G_i - G_j) (k_i . k_j), i > j
    => d = u - w S0^T  with  u = (I + A)^{-1} beta v,  w = (I + A)^{-1} beta exp(G) k
    o_i   = exp(G_i) S0 q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) d_j
    S_out = exp(G_last) S0 + sum_j exp(G_last - G_j) d_j k_j^T

u, w and the masked q.k matrix do not depend on S0, so they are computed for all chunks at
once (one batched unit-lower triangular solve); only d, o and the state passing run in a
`lax.scan` over chunks. All exponents are <= 0 (masked with `where` before `exp`). Padded
positions (t >= length) get g = 0, beta = 0 and q = k = v = 0: identity steps, o = 0.
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

# The arguments' layout (dims b, T, Hk, K, Hv, V).
_FIELDS = (
    Field("q", ("b", "T", "Hk", "K"), FLOAT_DTYPES),
    Field("k", ("b", "T", "Hk", "K"), FLOAT_DTYPES),
    Field("v", ("b", "T", "Hv", "V"), FLOAT_DTYPES),
    Field("g", ("b", "T", "Hv"), F32_ONLY),
    Field("beta", ("b", "T", "Hv"), F32_ONLY),
)


def _ein(spec, *ops):
    return jnp.einsum(spec, *ops, precision=_HI)


def chunk_gated_delta_rule(q, k, v, g, beta, lengths, initial_state=None, *, chunk=64,
                           block=0):
    """Chunked gated delta rule prefill for a batch of right-padded prompts.

    q, k [b, T, Hk, K] (from `prepare_qk`: L2-normalised, q scaled by K^-1/2); v [b, T, Hv, V]
    any float dtype; g, beta [b, T, Hv] float32 (log-decay <= 0, beta in (0, 1), see `gates`);
    lengths [b] int32 in [1, T]; initial_state [b, Hv, V, K] float32 or None (zeros). Value
    head j uses key head j // (Hv // Hk). T need not be a multiple of `chunk`.

    Returns o [b, T, Hv, V] float32 (exactly 0 at t >= lengths) and the final state
    [b, Hv, V, K] float32 after exactly lengths[i] tokens. All math in float32, HIGHEST dots.
    block > 0 (a multiple of chunk): also the states after block, 2 block, ... tokens
    [b, T // block, Hv, V, K] float32 (past a prompt's length they equal its final state).
    Bad arguments (shapes, dtypes, chunk, block; lengths outside [1, T] where concrete, i.e. an
    eager call) are a one-line ValueError.
    """
    dims = check_prefill(_FIELDS, dict(q=q, k=k, v=v, g=g, beta=beta), lengths, initial_state,
                         ("Hv", "V", "K"), chunk, block)
    check(dims["Hv"] % dims["Hk"] == 0,
          f"value heads ({dims['Hv']}) must be a multiple of key heads ({dims['Hk']})")
    return _chunk_gated_delta_rule(q, k, v, g, beta, lengths, initial_state, chunk=chunk,
                                   block=block)


@functools.partial(jax.jit, static_argnames=("chunk", "block"))
def _chunk_gated_delta_rule(q, k, v, g, beta, lengths, initial_state, *, chunk, block):
    b, T, Hk, K = k.shape
    Hv, V = v.shape[2:]
    R, Q = Hv // Hk, chunk
    nc = -(-T // Q)
    Tp = nc * Q

    valid = jnp.arange(T)[None, :] < lengths[:, None]                      # [b, T]

    def prep(t):
        return to_chunks(t, valid, Q)

    # Value heads are kept as (Hk, R) so q, k and their products are formed once per key head.
    q, k = prep(q), prep(k)                                                 # [b, nc, Q, Hk, K]
    v = prep(v).reshape(b, nc, Q, Hk, R, V)
    g = prep(g).reshape(b, nc, Q, Hk, R)
    beta = prep(beta).reshape(b, nc, Q, Hk, R)

    G = jnp.moveaxis(jnp.cumsum(g, axis=2), 2, -1)                          # [b, nc, Hk, R, Q]
    beta = jnp.moveaxis(beta, 2, -1)                                        # [b, nc, Hk, R, Q]
    i = jnp.arange(Q)
    diff = G[..., :, None] - G[..., None, :]                                # G_i - G_j
    decay_strict = jnp.exp(jnp.where(i[:, None] > i[None, :], diff, -jnp.inf))
    decay_incl = jnp.exp(jnp.where(i[:, None] >= i[None, :], diff, -jnp.inf))

    kk = _ein("bcihk,bcjhk->bchij", k, k)[:, :, :, None]                    # [b, nc, Hk, 1, Q, Q]
    qk = _ein("bcihk,bcjhk->bchij", q, k)[:, :, :, None]
    A = beta[..., :, None] * decay_strict * kk                              # strictly lower
    attn = decay_incl * qk                                                  # [b, nc, Hk, R, Q, Q]

    # UT transform: one unit-lower solve for [u | w] = (I + A)^{-1} [beta v | beta exp(G) k].
    kc = jnp.moveaxis(k, 2, -2)[:, :, :, None]                              # [b, nc, Hk, 1, Q, K]
    rhs = jnp.concatenate([
        beta[..., None] * jnp.moveaxis(v, 2, -2),
        jnp.broadcast_to((beta * jnp.exp(G))[..., None] * kc, (b, nc, Hk, R, Q, K)),
    ], axis=-1)
    uw = jax.scipy.linalg.solve_triangular(A, rhs, lower=True, unit_diagonal=True)
    u, w = uw[..., :V], uw[..., V:]

    if initial_state is None:
        s0 = jnp.zeros((b, Hk, R, V, K), _F32)
    else:
        s0 = initial_state.astype(_F32).reshape(b, Hk, R, V, K)

    def step(s, inp):
        u, w, qc, kc, Gc, attn = inp          # per chunk; qc, kc [b, Hk, Q, K], Gc [b, Hk, R, Q]
        d = u - _ein("bhrqk,bhrvk->bhrqv", w, s)                            # corrected updates
        o = (jnp.exp(Gc)[..., None] * _ein("bhqk,bhrvk->bhrqv", qc, s)
             + _ein("bhrij,bhrjv->bhriv", attn, d))
        last = Gc[..., -1:]
        s = (jnp.exp(last)[..., None] * s
             + _ein("bhrjv,bhjk->bhrvk", d * jnp.exp(last - Gc)[..., None], kc))
        return s, (o, s) if block else o

    to_scan = lambda t: jnp.moveaxis(t, 1, 0)
    final, o = lax.scan(step, s0, tuple(map(to_scan, (
        u, w, jnp.moveaxis(q, 2, -2), jnp.moveaxis(k, 2, -2), G, attn))))
    if block:
        o, after = o                                        # after: the state after each chunk
    # o [nc, b, Hk, R, Q, V] -> [b, T, Hv, V]
    o = jnp.transpose(o, (1, 0, 4, 2, 3, 5)).reshape(b, Tp, Hv, V)[:, :T]
    o = jnp.where(valid[:, :, None, None], o, 0)
    if not block:
        return o, final.reshape(b, Hv, V, K)
    per = block // Q
    blocks = jnp.moveaxis(after[per - 1::per][:T // block], 0, 1)
    return o, final.reshape(b, Hv, V, K), blocks.reshape(b, -1, Hv, V, K)
