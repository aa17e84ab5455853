"""Jitted pure steps over split models: `nnx.split` once, params passed as arguments (not
closed over, which would bake them into the HLO), the state (a cache, or any pytree holding
caches) donated so updates are in place. `Runner.jit` is the one way to build such a step; the
model-level methods below and the engine's multi-step decode and speculative steps all use it.

Models placed on a tensor-parallel mesh (`models.sharding`: a loader given a mesh, or
`shard_model`) run each whole step under one `jax.shard_map` over that mesh: params and caches
enter with their shardings (each device computes on its heads), every other input is
replicated, outputs other than caches come back replicated, and the state keeps its shardings
from step to step (donated in place)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from models import sharding
from models.validation import (
    check_commit,
    check_greedy,
    check_mode,
    check_prefill,
    check_window,
)


class Step:
    """A step of `Runner.jit`: `step(state, *args, **kw)` runs it (state donated);
    `extra_bytes(state, *args, **kw)` is what running it would allocate beyond its arguments
    (XLA's temporaries and the outputs not aliasing the donated state), from the executable
    that a call compiles anyway (shared with it), per device; None where XLA does not say."""

    def __init__(self, jitted, params, prepare):
        self._jitted, self._params, self._prepare = jitted, params, prepare

    def __call__(self, state, *args, **kw):
        return self._jitted(self._params(), state, *self._prepare(args), **kw)

    def extra_bytes(self, state, *args, **kw) -> int | None:
        lowered = self._jitted.lower(self._params(), state, *self._prepare(args), **kw)
        m = lowered.compile().memory_analysis()
        if m is None:
            return None
        return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes


class Runner:
    """prefill / decode / verify / commit / greedy for any model with the `models.hybrid.HybridLM`
    methods, and `jit` for steps composed of them. `others` are further models a step may run
    (a draft model); a model given twice is split once. `mesh`: the tp mesh the models' params
    are on (None: single device), found from the params.

    The model-level methods check their inputs before the jitted step (`models.validation`:
    under jit only shapes can be checked), so bad token ids, lengths or slots, or a slot past
    max_len, are a ValueError here; this reads the per-row arrays (and, for decode / verify,
    the cache's lengths) back to the host. Steps built with `jit` check shapes only."""

    def __init__(self, model, *others):
        self.model = model
        self.graphdef, self.params = nnx.split((model, *others))
        self.mesh = sharding.params_mesh(self.params)
        self._prefill = self.jit(lambda ms, cache, *a, **kw: ms[0].prefill(cache, *a, **kw),
                                 static_argnames=("last_only",))
        self._prefill_hidden = self.jit(lambda ms, cache, *a: ms[0].prefill_hidden(cache, *a))
        modes = ("mode", "impl")
        self._decode = self.jit(lambda ms, cache, *a, **kw: ms[0].decode(cache, *a, **kw),
                                static_argnames=modes)
        self._verify = self.jit(lambda ms, cache, *a, **kw: ms[0].verify(cache, *a, **kw),
                                static_argnames=modes)
        self._commit = self.jit(lambda ms, cache, *a, **kw: ms[0].commit(cache, *a, **kw),
                                static_argnames=("window_len", "mode"))

    def jit(self, fn, *, static_argnames=(), compiler_options=None):
        """fn(models, state, *args, **kw) -> out, a pure function of the merged models (the
        tuple (model, *others)), as a jitted `Step`, `step(state, *args, **kw)`: params are
        passed as an argument, `state` is donated (do not use it after the call), keyword
        arguments named in static_argnames are static (hashable; one compilation per value).
        On a tp mesh the step runs under shard_map (see the module docstring); positional args
        are replicated onto the mesh first. compiler_options: XLA options of this program
        (`jax.jit`'s)."""
        graphdef, mesh = self.graphdef, self.mesh
        jit = functools.partial(jax.jit, donate_argnums=(1,), static_argnames=static_argnames,
                                compiler_options=compiler_options)

        def pure(params, state, *args, **kw):
            return fn(nnx.merge(graphdef, params), state, *args, **kw)

        if mesh is None:
            return Step(jit(pure), lambda: self.params, lambda args: args)
        tp = sharding.mesh_tp(mesh)
        param_specs = jax.tree.map(lambda a: a.sharding.spec, self.params)

        def spmd(params, state, *args, **kw):
            local = functools.partial(pure, **kw)
            out = jax.eval_shape(local, params, state, *args)   # the global output structure
            return jax.shard_map(
                local, mesh=mesh, check_vma=False,
                in_specs=(param_specs, sharding.state_specs(state, tp)) + (P(),) * len(args),
                out_specs=sharding.state_specs(out, tp))(params, state, *args)

        return Step(jit(spmd), lambda: self.params, lambda args: sharding.replicate(args, mesh))

    def place(self, build):
        """build() -> a pytree holding caches (a cache, an engine state), created where the
        steps put their outputs, so the first step and the next share a compilation: on a tp
        mesh sharded (each device allocates only its shards), else committed to the params'
        device."""
        if self.mesh is not None:
            return sharding.place(build, self.mesh)
        home = jax.tree.leaves(self.params)[0].sharding
        if isinstance(home, jax.sharding.NamedSharding):
            home = jax.sharding.NamedSharding(home.mesh, P())
        return jax.device_put(build(), home)

    def init_cache(self, *args, **kw):
        """The model's `init_cache(*args, **kw)`, placed for the steps (`place`)."""
        return self.place(lambda: self.model.init_cache(*args, **kw))

    def prefill(self, cache, tokens, lengths, slots, *, last_only=False):
        """tokens [b, T] int32 right-padded, lengths [b], slots [b] -> logits [b, T, V] fp32
        (with last_only those of each prompt's last token, [b, 1, V]), cache."""
        check_prefill(self.model, cache, tokens, lengths, slots)
        return self._prefill(cache, tokens, lengths, slots, last_only=last_only)

    def prefill_hidden(self, cache, tokens, lengths, slots):
        """As `prefill`, also returning the final-normed hidden states: logits, hidden, cache."""
        check_prefill(self.model, cache, tokens, lengths, slots)
        return self._prefill_hidden(cache, tokens, lengths, slots)

    def decode(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, 1] -> logits [b, 1, V], cache."""
        check_window(self.model, cache, tokens, slots, mode, "decode")
        return self._decode(cache, tokens, slots, mode=mode, impl=impl)

    def verify(self, cache, tokens, slots, *, mode="replay", impl="auto"):
        """tokens [b, T] -> logits [b, T, V], hidden [b, T, D], cache (window uncommitted).
        mode "standard" needs a cache from init_cache(..., ssm_mode="standard")."""
        check_window(self.model, cache, tokens, slots, mode, "verify")
        return self._verify(cache, tokens, slots, mode=mode, impl=impl)

    def commit(self, cache, slots, n_accepted, window_len, *, mode="replay"):
        """Accept n_accepted [b] of the last verify window (same `mode` as that verify)."""
        check_commit(cache, slots, n_accepted, window_len, mode)
        return self._commit(cache, slots, n_accepted, window_len=window_len, mode=mode)

    def greedy(self, cache, prompts, lengths, slots, num_tokens, *, mode="replay", impl="auto"):
        """Greedy continuation of `num_tokens` per prompt. Returns tokens [b, n] int32, their
        logits [b, n, V] and the cache."""
        check_prefill(self.model, cache, prompts, lengths, slots)
        check_mode(mode, cache)
        check_greedy(cache, lengths, slots, num_tokens)     # room for all: the steps unchecked
        logits, cache = self._prefill(cache, prompts, lengths, slots, last_only=False)
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
        toks, lgs = [], []
        for _ in range(num_tokens):
            tok = jnp.argmax(last, axis=-1).astype(jnp.int32)
            toks.append(tok)
            lgs.append(last)
            logits, cache = self._decode(cache, tok[:, None], slots, mode=mode, impl=impl)
            last = logits[:, 0]
        return jnp.stack(toks, 1), jnp.stack(lgs, 1), cache
