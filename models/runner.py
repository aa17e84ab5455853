"""Jitted pure steps over split models: `nnx.split` once, params passed as arguments (not
closed over, which would bake them into the HLO), the state (a cache, or any pytree holding
caches) donated so updates are in place. `Runner.jit` is the one way to build such a step; the
model-level methods below and the engine's multi-step decode and speculative steps all use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class Runner:
    """prefill / decode / verify / commit / greedy for any model with the `models.hybrid.HybridLM`
    methods, and `jit` for steps composed of them. `others` are further models a step may run
    (a draft model); a model given twice is split once."""

    def __init__(self, model, *others):
        self.model = model
        self.graphdef, self.params = nnx.split((model, *others))
        self._prefill = self.jit(lambda ms, cache, *a: ms[0].prefill(cache, *a))
        self._prefill_hidden = self.jit(lambda ms, cache, *a: ms[0].prefill_hidden(cache, *a))
        modes = ("mode", "impl")
        self._decode = self.jit(lambda ms, cache, *a, **kw: ms[0].decode(cache, *a, **kw),
                                static_argnames=modes)
        self._verify = self.jit(lambda ms, cache, *a, **kw: ms[0].verify(cache, *a, **kw),
                                static_argnames=modes)
        self._commit = self.jit(lambda ms, cache, *a, **kw: ms[0].commit(cache, *a, **kw),
                                static_argnames=("window_len", "mode"))

    def jit(self, fn, *, static_argnames=()):
        """fn(models, state, *args, **kw) -> out, a pure function of the merged models (the
        tuple (model, *others)), as a jitted `step(state, *args, **kw)`: params are passed as an
        argument, `state` is donated (do not use it after the call), keyword arguments named in
        static_argnames are static (hashable; one compilation per value)."""
        graphdef = self.graphdef

        def pure(params, state, *args, **kw):
            return fn(nnx.merge(graphdef, params), state, *args, **kw)

        jitted = jax.jit(pure, donate_argnums=(1,), static_argnames=static_argnames)
        return lambda state, *args, **kw: jitted(self.params, state, *args, **kw)

    def init_cache(self, *args, **kw):
        return self.model.init_cache(*args, **kw)

    def prefill(self, cache, tokens, lengths, slots):
        """tokens [b, T] int32 right-padded, lengths [b], slots [b] -> logits [b, T, V], cache."""
        return self._prefill(cache, tokens, lengths, slots)

    def prefill_hidden(self, cache, tokens, lengths, slots):
        """As `prefill`, also returning the final-normed hidden states: logits, hidden, cache."""
        return self._prefill_hidden(cache, tokens, lengths, slots)

    def decode(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, 1] -> logits [b, 1, V], cache."""
        return self._decode(cache, tokens, slots, mode=mode, impl=impl)

    def verify(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, T] -> logits [b, T, V], hidden [b, T, D], cache (window uncommitted).
        mode "standard" needs a cache from init_cache(..., ssm_mode="standard")."""
        return self._verify(cache, tokens, slots, mode=mode, impl=impl)

    def commit(self, cache, slots, n_accepted, window_len, *, mode="replay"):
        """Accept n_accepted [b] of the last verify window (same `mode` as that verify)."""
        return self._commit(cache, slots, n_accepted, window_len=window_len, mode=mode)

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
