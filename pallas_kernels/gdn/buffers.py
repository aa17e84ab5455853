"""The GDN ReplaySSM cache of one layer: buffer type, layout, init and the window write."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.ring import write_window_fields
from pallas_kernels.ring_products import products
from pallas_kernels.validation import F32_ONLY, FLOAT_DTYPES, STATE_DTYPES, Field


class GDNBuffers(NamedTuple):
    """Per-layer ReplaySSM cache for GDN over a pool of S slots (slot 0 = null slot).

    checkpoint: [S, Hv, V, K] state dtype (float32 default, bfloat16 optional)
    ring_k:     [S, Hk, L, K] ring dtype, normalised keys of the tokens since the checkpoint
    ring_d:     [S, Hv, L, V] ring dtype, their corrected updates d = beta (v - alpha S k)
    ring_g:     [S, Hv, L]    float32, their log-decays g
    Counts ([S] int32) are shared by all layers and live outside; L = ring_k.shape[2].
    """

    checkpoint: jax.Array
    ring_k: jax.Array
    ring_d: jax.Array
    ring_g: jax.Array

    @property
    def window(self) -> int:
        return self.ring_k.shape[2]


# The layout above as a validation table (dims shared with the step inputs: Hk, Hv, K, V).
FIELDS = (
    Field("checkpoint", ("S", "Hv", "V", "K"), STATE_DTYPES),
    Field("ring_k", ("S", "Hk", "L", "K"), FLOAT_DTYPES),
    Field("ring_d", ("S", "Hv", "L", "V"), "ring_k"),
    Field("ring_g", ("S", "Hv", "L"), F32_ONLY),
)


def init_gdn_buffers(num_slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                     head_v_dim: int, window: int = 16, state_dtype=jnp.float32,
                     ring_dtype=jnp.float32) -> GDNBuffers:
    """Zeroed buffers. The ring defaults to float32: cached d values enter every later output
    and every fold, and bf16 d drifts (docs/benchmarks.md has the numbers)."""
    return GDNBuffers(
        checkpoint=jnp.zeros((num_slots, num_v_heads, head_v_dim, head_k_dim), state_dtype),
        ring_k=jnp.zeros((num_slots, num_k_heads, window, head_k_dim), ring_dtype),
        ring_d=jnp.zeros((num_slots, num_v_heads, window, head_v_dim), ring_dtype),
        ring_g=jnp.zeros((num_slots, num_v_heads, window), jnp.float32),
    )


def write_window(buffers: GDNBuffers, counts, slots, k, d, g) -> GDNBuffers:
    """Writes a verify window's (k [b, T, Hk, K], d [b, T, Hv, V], g [b, T, Hv]) into the rings,
    uncommitted (see `pallas_kernels.ring.write_window_rings`); d None: the verify kernel wrote
    the ring's d (a tiling's ring_write="kernel"), k and g only."""
    return write_window_fields(buffers, counts, slots, ring_k=k, ring_d=d, ring_g=g)


def ring_key_products(ring_k, slots, *vectors, by="xla", counts=None, interpret=False):
    """k_j . x for the L ring keys of each row's slot (ring_k [S, Hk, L, K], slots [b]) and each
    window of vectors x [b, T, Hk, K]: one [b, Hk, T, L] float32 array per x, in fp32. Entries
    past a slot's count are garbage: select them away. by, counts, interpret:
    `ring_products.products`' ("xla": one gather of the keys for all; or one Pallas launch,
    which with the counts reads the committed keys only)."""
    return products(ring_k, slots, vectors, by=by, counts=counts, interpret=interpret)[0]


def verify_key_products(ring_k, slots, k, q, *, by="xla", counts=None, interpret=False):
    """A verify window's (k, q [b, T, Hk, K]) key products: `ring_key_products` of k and q
    ([b, Hk, T, L] each), then k_r . k_t and k_r . q_t within the window ([b, Hk, T (r), T (t)]
    each), float32; by "pallas": all four from one launch."""
    ring, window = products(ring_k, slots, (k, q), ((k, k), (k, q)), by=by, counts=counts,
                            interpret=interpret)
    return (*ring, *window)
