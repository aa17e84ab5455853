"""The SSM kernel families the kernel and verify benchmarks time: real layer shapes, the byte
model of one row-step, random inputs and the kernels' standard / replay entry points."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from replayjax.bench.roofline import ssm_row_bytes

MIN_POOL_BYTES = 512 * 2**20    # state pool per timing unit: >> the H200's 60 MB L2
# layer shapes per family (kept apart from the families, which import jax: flags check them)
SHAPES = {
    "mamba2": {"nemotron-h-8b": dict(H=128, P=64, N=128, G=8),
               "nemotron-nano-9b-v2": dict(H=128, P=80, N=128, G=8)},
    "gdn": {"qwen3-next": dict(Hk=16, Hv=32, K=128, V=128)},
}


@dataclasses.dataclass(frozen=True)
class Family:
    """What a driver needs to time one kernel family at one shape."""
    name: str
    shapes: dict
    state_bytes: Callable      # (dims, itemsize = 4) -> bytes of one sequence's state
    token_io: Callable         # dims -> bytes of one token's kernel inputs + outputs (bf16 acts)
    entry_bytes: Callable      # (dims, ring itemsize) -> bytes of one ring entry
    setup: Callable            # (dims, batch, S, L, ring_dtype, key, state_dtype = fp32) ->
    #                            (inputs, buffers)
    standard: Callable         # (state, inputs, slots, **kw) -> state
    replay: Callable           # (buffers, counts, inputs, slots, **kw) -> buffers
    ops: Callable              # () -> the family's kernel module (mamba2 or gdn)
    token_inputs: int          # leading per-token arrays of `setup`'s inputs (the rest: per head)
    default_ring: str          # the models' ring dtype for this family
    # (a measured default tiling, dims, rows) -> the tiling the kernel runs there with tiling=None
    for_dims: Callable = lambda tiling, dims, rows: tiling

    def min_bytes(self, d, L, ring_itemsize, state_itemsize=4):
        """(standard, replay) minimum bytes per row-step: the state read + written vs the state
        read, written once per L steps, the (L - 1) / 2 ring entries held on average read and one
        appended; token inputs/outputs for both."""
        st, io = self.state_bytes(d, state_itemsize), self.token_io(d)
        entry = self.entry_bytes(d, ring_itemsize)
        return (ssm_row_bytes(st, entry, L, "standard") + io,
                ssm_row_bytes(st, entry, L, "replay") + io)


def check_shape_names(ap, args):
    """--shapes names known to --family, else the parser's one-line error (exit 2)."""
    known = SHAPES[args.family]
    if bad := [s for s in args.shapes or () if s not in known]:
        ap.error(f"argument --shapes: unknown shape(s) {bad} for family {args.family} "
                 f"(known: {', '.join(known)})")


def pool_sets(fam: Family, dims, batch: int, slots_per_row: int, min_pool_bytes: int, seed: int,
              state_itemsize: int = 4):
    """Disjoint random slot sets for one timing unit: n_sets >= 2 sets of batch rows (each
    `slots_per_row` slots) whose states total >= min_pool_bytes, so a slot's state comes back to
    a kernel only after that many bytes of other states. Returns (n_sets, pool size S incl. the
    null slot 0, slot ids [n_sets, batch, slots_per_row])."""
    state = fam.state_bytes(dims, state_itemsize)
    n_sets = max(2, math.ceil(min_pool_bytes / (batch * state)))
    S = n_sets * batch * slots_per_row + 1
    perm = np.random.default_rng(seed).permutation(np.arange(1, S))
    return n_sets, S, perm.reshape(n_sets, batch, slots_per_row)


def _mamba2() -> Family:
    import jax
    import jax.numpy as jnp

    from pallas_kernels import mamba2

    def setup(d, batch, S, L, ring_dtype, key, state_dtype=jnp.float32):
        H, P, N, G = d["H"], d["P"], d["N"], d["G"]
        k = jax.random.split(key, 8)
        inputs = (jax.random.normal(k[0], (batch, H, P), jnp.bfloat16),
                  (jax.random.normal(k[1], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16),
                  (jax.random.normal(k[2], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16),
                  jax.random.uniform(k[3], (batch, H), jnp.float32, 0.005, 0.1),
                  -jnp.exp(jax.random.uniform(k[4], (H,), jnp.float32, -1, 1)),
                  jax.random.normal(k[5], (H,), jnp.float32))
        bufs = mamba2.init_replay_buffers(S, H, P, N, G, window=L, state_dtype=state_dtype,
                                          ring_dtype=ring_dtype)
        ck = jax.random.normal(k[6], bufs.checkpoint.shape, jnp.float32).astype(state_dtype)
        return inputs, bufs._replace(checkpoint=ck)

    return Family(
        name="mamba2",
        shapes=SHAPES["mamba2"],
        state_bytes=lambda d, itemsize=4: d["H"] * d["P"] * d["N"] * itemsize,
        # x, y, B, C (bf16), dt (fp32); a ring entry holds x, B (ring dtype) and dt (fp32)
        token_io=lambda d: d["H"] * d["P"] * 2 * 2 + 2 * d["G"] * d["N"] * 2 + d["H"] * 4,
        entry_bytes=lambda d, ring: d["H"] * d["P"] * ring + d["G"] * d["N"] * ring + d["H"] * 4,
        setup=setup,
        standard=lambda st, inp, slots, **kw: mamba2.standard_decode(st, *inp, slots, **kw)[1],
        replay=lambda b, c, inp, slots, **kw: mamba2.replay_decode(b, c, *inp, slots, **kw)[1],
        ops=lambda: mamba2, token_inputs=4, default_ring="bfloat16",
        for_dims=lambda t, d, rows: mamba2.pallas_mosaic_gpu.for_shape(
            mamba2.pallas_triton.for_shape(t, d["P"], rows), d["P"]))


def _gdn() -> Family:
    import jax
    import jax.numpy as jnp

    from pallas_kernels import gdn

    def setup(d, batch, S, L, ring_dtype, key, state_dtype=jnp.float32):
        Hk, Hv, K, V = d["Hk"], d["Hv"], d["K"], d["V"]
        k = jax.random.split(key, 8)
        q, kk = gdn.prepare_qk(jax.random.normal(k[0], (batch, Hk, K)),
                               jax.random.normal(k[1], (batch, Hk, K)))
        g, beta = gdn.gates(jax.random.normal(k[2], (batch, Hv)),
                            jax.random.normal(k[3], (batch, Hv)),
                            jax.random.uniform(k[4], (Hv,), jnp.float32, 0, 2.7), jnp.zeros((Hv,)))
        inputs = (q.astype(jnp.bfloat16), kk.astype(jnp.bfloat16),
                  jax.random.normal(k[5], (batch, Hv, V), jnp.bfloat16), g, beta)
        bufs = gdn.init_gdn_buffers(S, Hk, Hv, K, V, window=L, state_dtype=state_dtype,
                                    ring_dtype=ring_dtype)
        ck = jax.random.normal(k[6], bufs.checkpoint.shape, jnp.float32) * 0.1
        return inputs, bufs._replace(checkpoint=ck.astype(state_dtype))

    return Family(
        name="gdn",
        shapes=SHAPES["gdn"],
        state_bytes=lambda d, itemsize=4: d["Hv"] * d["V"] * d["K"] * itemsize,
        # q, k, v, o (bf16), g, beta (fp32); a ring entry holds k, d (ring dtype) and g (fp32)
        token_io=lambda d: 2 * d["Hk"] * d["K"] * 2 + 2 * d["Hv"] * d["V"] * 2 + d["Hv"] * 8,
        entry_bytes=lambda d, ring: d["Hk"] * d["K"] * ring + d["Hv"] * d["V"] * ring + d["Hv"] * 4,
        setup=setup,
        standard=lambda st, inp, slots, **kw: gdn.standard_decode(st, *inp, slots, **kw)[1],
        replay=lambda b, c, inp, slots, **kw: gdn.replay_decode(b, c, *inp, slots, **kw)[1],
        ops=lambda: gdn, token_inputs=5, default_ring="float32",
        for_dims=lambda t, d, rows: gdn.pallas_mosaic_gpu.for_shape(
            gdn.pallas_triton.for_shape(t, rows), rows))


FAMILIES = {"mamba2": _mamba2, "gdn": _gdn}
