"""The Mamba-2 ReplaySSM cache of one layer: buffer type, layout, init and the window write."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.ring import write_window_fields
from pallas_kernels.ring_products import products
from pallas_kernels.validation import F32_ONLY, FLOAT_DTYPES, STATE_DTYPES, Field


class ReplayBuffers(NamedTuple):
    """Per-layer ReplaySSM cache for a pool of `S` sequence slots (slot 0 is the null slot).

    checkpoint: [S, H, P, N] state dtype (float32 default, bfloat16 optional)
    ring_x:     [S, H, L, P] ring dtype, post-conv x of the tokens since the checkpoint
    ring_b:     [S, G, L, N] ring dtype, their B
    ring_dt:    [S, H, L]    float32, their dt (after bias + softplus)

    The committed count per slot ([S] int32) is shared by every SSM layer of a model and lives
    outside this tuple; `L` (the window) is `ring_x.shape[2]`.
    """

    checkpoint: jax.Array
    ring_x: jax.Array
    ring_b: jax.Array
    ring_dt: jax.Array

    @property
    def window(self) -> int:
        return self.ring_x.shape[2]


# The layout above as a validation table (dims shared with the step inputs: H, P, G, N).
FIELDS = (
    Field("checkpoint", ("S", "H", "P", "N"), STATE_DTYPES),
    Field("ring_x", ("S", "H", "L", "P"), FLOAT_DTYPES),
    Field("ring_b", ("S", "G", "L", "N"), "ring_x"),
    Field("ring_dt", ("S", "H", "L"), F32_ONLY),
)


def init_replay_buffers(num_slots: int, num_heads: int, head_dim: int, d_state: int,
                        n_groups: int, window: int = 16, state_dtype=jnp.float32,
                        ring_dtype=jnp.bfloat16) -> ReplayBuffers:
    """Zeroed buffers (never jnp.empty: padding rows read slot 0)."""
    return ReplayBuffers(
        checkpoint=jnp.zeros((num_slots, num_heads, head_dim, d_state), state_dtype),
        ring_x=jnp.zeros((num_slots, num_heads, window, head_dim), ring_dtype),
        ring_b=jnp.zeros((num_slots, n_groups, window, d_state), ring_dtype),
        ring_dt=jnp.zeros((num_slots, num_heads, window), jnp.float32),
    )


def write_window(buffers: ReplayBuffers, counts, slots, x, B, dt) -> ReplayBuffers:
    """Writes a verify window (x [b, T, H, P], B [b, T, G, N], dt [b, T, H]) into the rings,
    uncommitted (see `pallas_kernels.ring.write_window_rings`); x None: the verify kernel wrote
    the ring's x (a tiling's ring_write="kernel"), B and dt only."""
    return write_window_fields(buffers, counts, slots, ring_x=x, ring_b=B, ring_dt=dt)


def bc_products(ring_b, slots, B, C, *, by="xla", counts=None, interpret=False):
    """The B . C products a replay step's kernels take as inputs, in fp32: for the window's
    C [b, T, G, N], (ring, [b, G, T, L]: B_j . C_t for the L ring B rows of each row's slot,
    ring_b [S, G, L, N], slots [b]; entries past a slot's count are garbage: select them away)
    and (window, [b, G, T, T]: B_r . C_t for the window's own B [b, T, G, N]). by, counts,
    interpret: `ring_products.products`' ("xla" or one Pallas launch, which with the counts
    reads the committed rows only)."""
    (ring,), (window,) = products(ring_b, slots, (C,), ((B, C),), by=by, counts=counts,
                                  interpret=interpret)
    return ring, window
