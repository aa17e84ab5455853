"""Chunking of right-padded prompt batches for the chunked prefill scans of both families."""

from __future__ import annotations

import jax.numpy as jnp


def to_chunks(t, valid, chunk: int):
    """Prefill input [b, T, ...] -> float32 [b, nc, chunk, ...]: positions where `valid` [b, T] is
    False are zeroed (NaN garbage too, so padded steps are identities) and T is padded to a
    multiple of `chunk`."""
    b, T = valid.shape
    nc = -(-T // chunk)
    t = jnp.where(valid.reshape(valid.shape + (1,) * (t.ndim - 2)), t.astype(jnp.float32), 0)
    t = jnp.pad(t, [(0, 0), (0, nc * chunk - T)] + [(0, 0)] * (t.ndim - 2))
    return t.reshape((b, nc, chunk) + t.shape[2:])
