"""Jitted pure steps over a split model: `nnx.split` once, params passed as arguments (not
closed over, which would bake them into the HLO), the cache donated so updates are in place."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx


class Runner:
    """prefill / decode / greedy generation for any model with `prefill`, `decode` and
    `init_cache` methods (see models.nemotron_h)."""

    def __init__(self, model):
        self.graphdef, self.params = nnx.split(model)
        self.model = model

    def init_cache(self, *args, **kw):
        return self.model.init_cache(*args, **kw)

    @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
    def _prefill(self, params, cache, tokens, lengths, slots):
        return nnx.merge(self.graphdef, params).prefill(cache, tokens, lengths, slots)

    @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
    def _prefill_hidden(self, params, cache, tokens, lengths, slots):
        return nnx.merge(self.graphdef, params).prefill_hidden(cache, tokens, lengths, slots)

    def prefill_hidden(self, cache, tokens, lengths, slots):
        """As `prefill`, also returning the final-normed hidden states: logits, hidden, cache."""
        return self._prefill_hidden(self.params, cache, tokens, lengths, slots)

    @functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode", "impl"),
                       donate_argnums=(2,))
    def _decode(self, params, cache, tokens, slots, *, mode, impl):
        return nnx.merge(self.graphdef, params).decode(cache, tokens, slots, mode=mode, impl=impl)

    @functools.partial(jax.jit, static_argnums=(0,), static_argnames=("mode", "impl"),
                       donate_argnums=(2,))
    def _verify(self, params, cache, tokens, slots, *, mode, impl):
        return nnx.merge(self.graphdef, params).verify(cache, tokens, slots, mode=mode,
                                                       impl=impl)

    @functools.partial(jax.jit, static_argnums=(0, 5), static_argnames=("mode",),
                       donate_argnums=(2,))
    def _commit(self, params, cache, slots, n_accepted, window_len, *, mode):
        return nnx.merge(self.graphdef, params).commit(cache, slots, n_accepted, window_len,
                                                       mode=mode)

    def verify(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, T] -> logits [b, T, V], hidden [b, T, D], cache (window uncommitted).
        mode "standard" needs a cache from init_cache(..., ssm_mode="standard")."""
        return self._verify(self.params, cache, tokens, slots, mode=mode, impl=impl)

    def commit(self, cache, slots, n_accepted, window_len, *, mode="replay"):
        """Accept n_accepted [b] of the last verify window (same `mode` as that verify)."""
        return self._commit(self.params, cache, slots, n_accepted, window_len, mode=mode)

    def prefill(self, cache, tokens, lengths, slots):
        """tokens [b, T] int32 right-padded, lengths [b], slots [b] -> logits [b, T, V], cache."""
        return self._prefill(self.params, cache, tokens, lengths, slots)

    def decode(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, 1] -> logits [b, 1, V], cache."""
        return self._decode(self.params, cache, tokens, slots, mode=mode, impl=impl)

    def greedy(self, cache, prompts, lengths, slots, num_tokens, *, mode="replay", impl="auto"):
        """Greedy continuation of `num_tokens` per prompt. Returns tokens [b, n] int32, their
        logits [b, n, V] and the cache."""
        logits, cache = self.prefill(cache, prompts, lengths, slots)
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
        toks, lgs = [], []
        for _ in range(num_tokens):
            tok = jnp.argmax(last, axis=-1).astype(jnp.int32)
            toks.append(tok)
            lgs.append(last)
            logits, cache = self.decode(cache, tok[:, None], slots, mode=mode, impl=impl)
            last = logits[:, 0]
        return jnp.stack(toks, 1), jnp.stack(lgs, 1), cache
