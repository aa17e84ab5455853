"""The shared kernel pieces of `pallas_kernels._kernel_utils`, in interpret mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import ring_entries


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ring_entries_reads_zero_past_the_count(dtype, interpret):
    """Every count 0..L-1 of a NaN-poisoned ring [S, L, 4]: rows below the count are the ring's,
    rows at and past it exactly 0 (a mask one row too long reads the NaN at the count, one row
    too short loses the last committed entry)."""
    L, S = 8, 3
    ring = np.full((S, L, 4), np.nan, np.float32)
    counts = np.asarray([0, 3, L - 1], np.int32)
    for s, c in enumerate(counts):
        ring[s, :c] = np.arange(c * 4).reshape(c, 4) + 1
    ring = jnp.asarray(ring, dtype)

    def kernel(counts_ref, ring_ref, out_ref):
        s = pl.program_id(0)
        out_ref[s] = ring_entries(ring_ref.at[s], counts_ref[s])

    out = pl.pallas_call(kernel, grid=(S,), out_shape=jax.ShapeDtypeStruct(ring.shape, dtype),
                         interpret=interpret)(jnp.asarray(counts), ring)
    out = np.asarray(out, np.float32)
    for s, c in enumerate(counts):
        np.testing.assert_array_equal(out[s, :c], np.asarray(ring[s, :c], np.float32))
        assert (out[s, c:] == 0).all(), (s, c, out[s])
