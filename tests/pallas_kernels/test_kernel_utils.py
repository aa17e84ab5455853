"""The shared kernel pieces of `pallas_kernels._kernel_utils`, in interpret mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import launch_grid, program_ids, ring_entries


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



@pytest.mark.parametrize("order", ["row_fastest", "row_slowest", "head_slowest"])
def test_grid_order_visits_every_program_once(order, interpret):
    """A (row, head, tile) = (4, 3, 2) grid launched in `order`: every program maps back to its
    own logical ids, each exactly once (a count per cell, accumulated in place), and the first
    launch axis (CUDA's blockIdx.x, the one the GPU hands out fastest) is the row for
    "row_fastest", the tile for "row_slowest" and "head_slowest" (whose last axis is the head)."""
    dims = (4, 3, 2)
    grid = launch_grid(dims, order)
    assert grid == {"row_fastest": dims, "row_slowest": dims[::-1],
                    "head_slowest": (2, 4, 3)}[order]

    def kernel(seen_in, seen_ref, ids_ref, first_ref):
        b, h, t = program_ids(order, len(dims))
        seen_ref[b, h, t] = seen_ref[b, h, t] + 1
        ids_ref[b, h, t] = 100 * b + 10 * h + t
        first_ref[b, h, t] = pl.program_id(0)

    seen, ids, first = pl.pallas_call(
        kernel, grid=grid, out_shape=[jax.ShapeDtypeStruct(dims, jnp.int32)] * 3,
        input_output_aliases={0: 0}, interpret=interpret)(jnp.zeros(dims, jnp.int32))
    b, h, t = np.indices(dims)
    np.testing.assert_array_equal(seen, 1)
    np.testing.assert_array_equal(ids, 100 * b + 10 * h + t)
    np.testing.assert_array_equal(first, b if order == "row_fastest" else t)


def test_grid_order_is_checked():
    with pytest.raises(ValueError, match=r"grid_order must be one of 'row_fastest', "
                                         r"'row_slowest', 'head_slowest', got 'tile_fastest'"):
        launch_grid((4, 3, 2), "tile_fastest")
    with pytest.raises(ValueError, match=r"'head_slowest' needs a \(row, head, tile\) grid, "
                                         r"got 2 axes"):
        launch_grid((4, 3), "head_slowest")
