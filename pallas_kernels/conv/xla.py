"""The XLA implementation of the decode conv (`impl="xla"`): `ring.conv_window` then
`ring.conv_commit` with one accepted token (bitwise what the models ran before the kernel; a
gather, a concat, the K-tap conv and a scatter, several XLA kernels), then `finish`. Arguments
as in `pallas_kernels.conv.api.conv_update`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.ring import conv_commit, conv_window


def finish(out, activation, out_dtype, splits):
    """The conv's fp32 out [b, T, C] -> activation (None or "silu", in fp32), cast to
    out_dtype, split into `splits` pieces along C (None: one array)."""
    if activation == "silu":
        out = jax.nn.silu(out)
    out = out.astype(out_dtype)
    if splits is None:
        return out
    return tuple(jnp.split(out, np.cumsum(splits)[:-1].tolist(), axis=-1))


def conv_update(conv_state, window, weight, bias, slots, *, offset, activation, out_dtype,
                splits):
    token = window[..., offset:offset + conv_state.shape[2]]
    out = conv_window(conv_state, token, weight, bias, slots)
    return (finish(out, activation, out_dtype, splits),
            conv_commit(conv_state, token, slots, jnp.ones_like(slots)))
