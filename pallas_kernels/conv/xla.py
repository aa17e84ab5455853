"""The XLA implementation of the decode conv (`impl="xla"`): `ring.conv_window` then
`ring.conv_commit` with one accepted token (bitwise what the models ran before the kernel; a
gather, a concat, the K-tap conv and a scatter, several XLA kernels). Arguments as in
`pallas_kernels.conv.api.conv_update`."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.ring import conv_commit, conv_window


def conv_update(conv_state, window, weight, bias, slots):
    out = conv_window(conv_state, window, weight, bias, slots)
    return out, conv_commit(conv_state, window, slots, jnp.ones_like(slots))
