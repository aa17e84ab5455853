"""The XLA implementation of the GDN pool ops (`impl="xla"`): `reference` math per row over the
slot pool (`pallas_kernels.xla_pool`). Arguments as in `pallas_kernels.gdn.api`."""

from __future__ import annotations

from pallas_kernels import xla_pool
from pallas_kernels.gdn.buffers import GDNBuffers, write_window
from pallas_kernels.gdn.reference import delta_step, replay_step


def _replay_row(s0, ring_k, ring_d, ring_g, count, q, k, v, g, beta):
    o, folded, d = replay_step(s0, ring_k, ring_d, ring_g, count, q, k, v, g, beta)
    return o, folded, (k, d, g)


def standard_decode(state, q, k, v, g, beta, slots):
    return xla_pool.standard_decode(delta_step, state, (q, k, v, g, beta), slots, v.dtype)


def replay_decode(buffers: GDNBuffers, counts, q, k, v, g, beta, slots):
    return xla_pool.replay_decode(_replay_row, buffers, counts, (q, k, v, g, beta), slots,
                                  v.dtype)


def replay_verify(buffers: GDNBuffers, counts, q, k, v, g, beta, slots):
    """The oracle form of verify (the Pallas kernel uses the one-chunk WY/UT form of the same
    recurrence): token s's corrected update d_s is what s single steps would cache."""
    return xla_pool.replay_verify(_replay_row, write_window, buffers, counts, (q, k, v, g, beta),
                                  (), slots, v.dtype)


def standard_verify(state, q, k, v, g, beta, slots, draft_slots):
    return xla_pool.standard_verify(delta_step, state, (q, k, v, g, beta), (), slots,
                                    draft_slots, v.dtype)
