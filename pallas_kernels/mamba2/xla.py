"""The XLA implementation of the Mamba-2 pool ops (`impl="xla"`): `reference` math per row over
the slot pool (`pallas_kernels.xla_pool`). Arguments as in `pallas_kernels.mamba2.api`."""

from __future__ import annotations

from pallas_kernels import xla_pool
from pallas_kernels.mamba2.buffers import ReplayBuffers, write_window
from pallas_kernels.mamba2.reference import replay_step, ssm_step


def _replay_row(s0, ring_x, ring_b, ring_dt, count, x, B, C, dt, A, D):
    y, folded = replay_step(s0, ring_x, ring_b, ring_dt, count, x, B, C, dt, A, D)
    return y, folded, (x, B, dt)


def standard_decode(state, x, B, C, dt, A, D, slots):
    return xla_pool.standard_decode(ssm_step, state, (x, B, C, dt, A, D), slots, x.dtype)


def replay_decode(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots):
    return xla_pool.replay_decode(_replay_row, buffers, counts, (x, B, C, dt, A, D), slots,
                                  x.dtype)


def replay_verify(buffers: ReplayBuffers, counts, x, B, C, dt, A, D, slots):
    return xla_pool.replay_verify(_replay_row, write_window, buffers, counts, (x, B, C, dt),
                                  (A, D), slots, x.dtype)


def standard_verify(state, x, B, C, dt, A, D, slots, draft_slots):
    return xla_pool.standard_verify(ssm_step, state, (x, B, C, dt), (A, D), slots, draft_slots,
                                    x.dtype)
