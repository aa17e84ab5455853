"""Token sampling on device: greedy, temperature, top-k, top-p, per-row parameters and keys.

Keys are derived per request and position (`fold_in(key(seed), position)`), so a request samples
the same tokens whatever else is in the batch. Speculative verification: greedy acceptance, and
rejection sampling against a deterministic drafter (n-gram lookup, or an MTP/draft model decoding
greedily), which preserves the target distribution exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# The vocabulary-wide work (sort for top-k / top-p, softmax, one draw per row) runs under
# `lax.cond` only when some row needs it: an all-greedy batch pays an argmax, an unfiltered one
# no sort. On the H200 at batch 256 x 131072 tokens the sort alone took ~2 ms of a 24 ms step.


def row_keys(seeds, positions):
    """seeds [b] int32, positions [b] int32 -> [b] keys."""
    return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, positions)


def filtered_probs(logits, temperature, top_k, top_p):
    """Target distribution per row. logits [b, V] fp32; temperature [b] (> 0), top_k [b] (0 =
    off), top_p [b] (1 = off). Returns probabilities [b, V] fp32 (zero outside the filters)."""
    V = logits.shape[-1]

    def filtered(z):
        srt = jnp.sort(z, axis=-1)[:, ::-1]                               # descending
        k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
        kth = jnp.take_along_axis(srt, (k - 1)[:, None], axis=-1)
        z = jnp.where(z >= kth, z, -jnp.inf)
        p_sorted = jax.nn.softmax(jnp.where(srt >= kth, srt, -jnp.inf), axis=-1)
        cum = jnp.cumsum(p_sorted, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        cutoff_idx = jnp.sum(cum - p_sorted < top_p[:, None], axis=-1)     # tokens kept
        cutoff = jnp.take_along_axis(srt, (jnp.maximum(cutoff_idx, 1) - 1)[:, None], axis=-1)
        return jnp.where(z >= cutoff, z, -jnp.inf)

    z = logits / temperature[:, None]
    z = lax.cond(jnp.any((top_k > 0) | (top_p < 1)), filtered, lambda z: z, z)
    return jax.nn.softmax(z, axis=-1)


def sample(logits, temperature, top_k, top_p, keys):
    """Next token per row [b] int32; rows with temperature <= 0 are greedy."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def drawn(_):
        probs = filtered_probs(logits, jnp.where(temperature > 0, temperature, 1.0), top_k, top_p)
        tok = jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys, probs)
        return jnp.where(temperature > 0, tok, greedy).astype(jnp.int32)

    return lax.cond(jnp.any(temperature > 0), drawn, lambda _: greedy, None)


def verify_drafts(logits, drafts, temperature, top_k, top_p, seeds, positions):
    """Accept a prefix of deterministic drafts and pick the next token.

    logits [b, T, V] (verify outputs for [last, d_1..d_K]); drafts [b, K] (K = T - 1); sampling
    parameters [b]; positions [b] = position of the first new token. Greedy rows accept d_i while
    it equals the argmax; sampling rows accept d_i with probability p_i(d_i) and, at the first
    rejection, sample from p_i with d_i removed (renormalised) -- for a point-mass drafter that is
    exactly rejection sampling, so outputs follow the target distribution. If every draft is
    accepted the bonus token is sampled from p_K. Returns n_accepted [b] in 1..T (tokens of the
    window to commit: the last token plus accepted drafts) and the new token [b].
    """
    K = logits.shape[1] - 1
    greedy = jnp.argmax(logits, axis=-1)                                  # [b, T]

    def greedy_rows(_):
        ok = drafts == greedy[:, :K]
        n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
        new = jnp.take_along_axis(greedy, n_ok[:, None], axis=1)[:, 0]
        return (n_ok + 1).astype(jnp.int32), new.astype(jnp.int32)

    return lax.cond(jnp.any(temperature > 0), _verify_sampled, greedy_rows,
                    (logits, greedy, drafts, temperature, top_k, top_p, seeds, positions))


def _verify_sampled(args):
    """verify_drafts for a batch with sampling rows (greedy rows as in the greedy branch)."""
    logits, greedy, drafts, temperature, top_k, top_p, seeds, positions = args
    b, T, V = logits.shape
    K = T - 1
    temp = jnp.where(temperature > 0, temperature, 1.0)
    probs = jax.vmap(lambda lg: filtered_probs(lg, temp, top_k, top_p), in_axes=1, out_axes=1)(logits)
    sampling = (temperature > 0)[:, None]
    keys = jax.vmap(lambda s, p: jax.random.split(jax.random.fold_in(jax.random.key(s), p), T + 1)
                    )(seeds, positions)                                   # [b, T+1]
    u = jax.vmap(jax.vmap(jax.random.uniform))(keys[:, :K])               # [b, K]
    p_draft = jnp.take_along_axis(probs[:, :K], drafts[:, :, None], axis=-1)[..., 0]
    ok = jnp.where(sampling, u < p_draft, drafts == greedy[:, :K])        # [b, K]
    n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)     # accepted drafts
    pos = jnp.minimum(n_ok, K)                                            # where the new token comes from
    p_next = jnp.take_along_axis(probs, pos[:, None, None], axis=1)[:, 0]  # [b, V]
    rejected = n_ok < K
    rej_tok = jnp.take_along_axis(drafts, jnp.minimum(n_ok, K - 1)[:, None], axis=1)[:, 0] if K else n_ok
    residual = jnp.where(rejected[:, None] & (jnp.arange(V)[None, :] == rej_tok[:, None]), 0.0, p_next)
    residual = residual / jnp.maximum(residual.sum(-1, keepdims=True), 1e-30)
    drawn = jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys[:, K], residual)
    greedy_next = jnp.take_along_axis(greedy, pos[:, None], axis=1)[:, 0]
    new = jnp.where(temperature > 0, drawn, greedy_next).astype(jnp.int32)
    return (n_ok + 1).astype(jnp.int32), new
