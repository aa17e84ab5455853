"""Token sampling on device: greedy, temperature, top-k, top-p, per-row parameters and keys.

Keys are derived per request and position (`fold_in(key(seed), position)`), so a request samples
the same tokens whatever else is in the batch. Speculative verification: greedy acceptance, and
rejection sampling against a deterministic drafter (n-gram lookup, or an MTP/draft model decoding
greedily), which preserves the target distribution exactly.

A request's `SamplingParams` (host) become one row of `SamplingArrays` ([b] arrays, a pytree) on
device; its `sample` and `verify` methods apply `sample` and `verify_drafts` below to those rows.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from models.parallel import gather_vocab, vocab_argmax

# The vocabulary-wide work (sort for top-k / top-p, softmax, one draw per row) runs under
# `lax.cond` only when some row needs it: an all-greedy batch pays an argmax, an unfiltered one
# no sort. On the H200 at batch 256 x 131072 tokens the sort alone took ~2 ms of a 24 ms step.

SEED_LIMIT = 2 ** 31            # seeds key int32 arrays on device
TOP_K_LIMIT = 2 ** 31           # top_k goes into an int32 array (past the vocabulary: off)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings (host side; `check` says whether they are valid)."""
    temperature: float = 0.0        # 0 = greedy
    top_k: int = 0                  # 0 = off (as is the vocabulary size or more)
    top_p: float = 1.0              # 1 = off
    seed: int = 0                   # in [0, 2^31)

    def check(self) -> None:
        """ValueError naming the first invalid field and its rule."""
        def fail(field, rule):
            raise ValueError(f"sampling.{field} must be {rule}, got {getattr(self, field)!r}")

        if not (_is_real(self.temperature) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            fail("temperature", "a finite number >= 0 (0 = greedy)")
        if not (_is_int(self.top_k) and 0 <= self.top_k < TOP_K_LIMIT):
            fail("top_k", "an integer in [0, 2^31) (0 = off)")
        if not (_is_real(self.top_p) and 0 < self.top_p <= 1):
            fail("top_p", "a number in (0, 1] (1 = off)")
        if not (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT):
            fail("seed", "an integer in [0, 2^31)")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@struct.dataclass
class SamplingArrays:
    """Per-row sampling parameters on device, from per-request `SamplingParams`."""
    temperature: jax.Array          # [b] fp32, 0 = greedy
    top_k: jax.Array                # [b] int32, 0 = off
    top_p: jax.Array                # [b] fp32, 1 = off
    seed: jax.Array                 # [b] int32

    @classmethod
    def of(cls, params: Sequence[SamplingParams]) -> SamplingArrays:
        """One row per SamplingParams (already checked)."""
        return cls(jnp.asarray([p.temperature for p in params], jnp.float32),
                   jnp.asarray([p.top_k for p in params], jnp.int32),
                   jnp.asarray([p.top_p for p in params], jnp.float32),
                   jnp.asarray([p.seed for p in params], jnp.int32))

    def sample(self, logits, positions):
        """`sample` with each row's key at its position: logits [b, V] fp32, positions [b]
        int32 (generated tokens before this one) -> tokens [b] int32."""
        return sample(logits, self.temperature, self.top_k, self.top_p,
                      row_keys(self.seed, positions))

    def sample_local(self, logits, vocab: int, positions):
        """`sample` of a vocab-parallel LM head's logits [b, Vl] fp32 (this device's shard, see
        `models.parallel.gather_vocab`; Vl = vocab: all of them): an all-greedy batch takes
        `vocab_argmax` (no logits gathered), one with a sampling row gathers the logits and
        samples. Returns tokens [b] int32, those of `sample` over the gathered logits."""
        return lax.cond(jnp.any(self.temperature > 0),
                        lambda z: self.sample(gather_vocab(z, vocab), positions),
                        lambda z: vocab_argmax(z, vocab), logits)

    def verify(self, logits, drafts, positions):
        """`verify_drafts` with these rows' parameters: (n_accepted [b], new token [b])."""
        return verify_drafts(logits, drafts, self.temperature, self.top_k, self.top_p,
                             self.seed, positions)

    def verify_local(self, logits, vocab: int, drafts, positions):
        """`verify` of a vocab-parallel LM head's logits [b, T, Vl] fp32 (as `sample_local`):
        an all-greedy batch accepts against `vocab_argmax` (no logits gathered), one with a
        sampling row gathers the logits. Returns `verify`'s (n_accepted [b], new token [b])."""
        return lax.cond(jnp.any(self.temperature > 0),
                        lambda z: self.verify(gather_vocab(z, vocab), drafts, positions),
                        lambda z: accept_greedy(vocab_argmax(z, vocab), drafts), logits)


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
        # top_p = 1 is "off": keep the whole top-k (an fp32 cumsum reaches 1 before the tail)
        cutoff_idx = jnp.where(top_p >= 1, k, cutoff_idx)
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
    greedy = jnp.argmax(logits, axis=-1)                                  # [b, T]
    return lax.cond(jnp.any(temperature > 0), _verify_sampled,
                    lambda args: accept_greedy(args[1], args[2]),
                    (logits, greedy, drafts, temperature, top_k, top_p, seeds, positions))


def accept_greedy(greedy, drafts):
    """`verify_drafts` of an all-greedy batch from the window's argmax tokens greedy [b, T]:
    accept d_i while it equals the argmax before it. Returns (n_accepted [b], new token [b])
    int32."""
    ok = drafts == greedy[:, :drafts.shape[1]]
    n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    new = jnp.take_along_axis(greedy, n_ok[:, None], axis=1)[:, 0]
    return (n_ok + 1).astype(jnp.int32), new.astype(jnp.int32)


def _verify_sampled(args):
    """verify_drafts for a batch with sampling rows (greedy rows as in the greedy branch)."""
    logits, greedy, drafts, temperature, top_k, top_p, seeds, positions = args
    b, T, V = logits.shape
    K = T - 1
    temp = jnp.where(temperature > 0, temperature, 1.0)
    probs = jax.vmap(lambda lg: filtered_probs(lg, temp, top_k, top_p), in_axes=1,
                     out_axes=1)(logits)
    sampling = (temperature > 0)[:, None]
    keys = jax.vmap(lambda s, p: jax.random.split(jax.random.fold_in(jax.random.key(s), p), T + 1)
                    )(seeds, positions)                                   # [b, T+1]
    u = jax.vmap(jax.vmap(jax.random.uniform))(keys[:, :K])               # [b, K]
    p_draft = jnp.take_along_axis(probs[:, :K], drafts[:, :, None], axis=-1)[..., 0]
    ok = jnp.where(sampling, u < p_draft, drafts == greedy[:, :K])        # [b, K]
    n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)     # accepted drafts
    pos = jnp.minimum(n_ok, K)                                # where the new token comes from
    p_next = jnp.take_along_axis(probs, pos[:, None, None], axis=1)[:, 0]  # [b, V]
    rejected = n_ok < K
    rej_tok = (jnp.take_along_axis(drafts, jnp.minimum(n_ok, K - 1)[:, None], axis=1)[:, 0]
               if K else n_ok)
    residual = jnp.where(rejected[:, None] & (jnp.arange(V)[None, :] == rej_tok[:, None]), 0.0,
                         p_next)
    residual = residual / jnp.maximum(residual.sum(-1, keepdims=True), 1e-30)
    drawn = jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys[:, K], residual)
    greedy_next = jnp.take_along_axis(greedy, pos[:, None], axis=1)[:, 0]
    new = jnp.where(temperature > 0, drawn, greedy_next).astype(jnp.int32)
    return (n_ok + 1).astype(jnp.int32), new
