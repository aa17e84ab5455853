r"""Runs a few Mamba-2 decode steps at batch 256 for Nsight Compute to inspect.

    ncu --clock-control none -k regex:mamba2_ \
        python3 scripts/ncu_mamba2.py BLOCK_P BLOCK_N WARPS [FOLD]
Replay steps run at ring counts 0..15 (the 16th folds), then one standard step.
"""
import sys

import jax
import jax.numpy as jnp

from pallas_kernels import mamba2

bp, bn, warps = (int(v) for v in sys.argv[1:4])
fold = sys.argv[4] if len(sys.argv) > 4 else "auto"
H, P, N, G, L, batch = 128, 64, 128, 8, 16, 256
S = 2 * batch + 1
k = jax.random.split(jax.random.key(0), 6)
x = jax.random.normal(k[0], (batch, H, P), jnp.bfloat16)
B = jax.random.normal(k[1], (batch, G, N), jnp.bfloat16)
C = jax.random.normal(k[2], (batch, G, N), jnp.bfloat16)
dt = jax.random.uniform(k[3], (batch, H), jnp.float32, 0.005, 0.1)
A = -jnp.ones((H,), jnp.float32)
D = jnp.ones((H,), jnp.float32)
slots = jax.random.permutation(k[4], jnp.arange(1, S, dtype=jnp.int32))[:batch]
bufs = mamba2.init_replay_buffers(S, H, P, N, G, window=L)
counts = jnp.zeros((S,), jnp.int32)
kw = dict(impl="pallas", tiling=mamba2.Mamba2Tiling(bp, bn, warps))
rkw = dict(impl="pallas", tiling=mamba2.Mamba2ReplayTiling(bp, bn, warps, fold=fold))
step = jax.jit(lambda b, c: mamba2.replay_decode(b, c, x, B, C, dt, A, D, slots, **rkw)[1],
               donate_argnums=(0,))
for _ in range(L):
    bufs = step(bufs, counts)
    counts = mamba2.advance_counts(counts, slots, L)
y, st = mamba2.standard_decode(bufs.checkpoint, x, B, C, dt, A, D, slots, **kw)
jax.block_until_ready(st)
print("done")
