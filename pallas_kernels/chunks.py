"""Chunking of right-padded prompt batches for the chunked prefill scans of both families."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.validation import (
    F32_ONLY,
    INT32_ONLY,
    Field,
    check,
    check_arrays,
    check_fields,
    check_range,
    is_int,
)


def to_chunks(t, valid, chunk: int):
    """Prefill input [b, T, ...] -> float32 [b, nc, chunk, ...]: positions where `valid` [b, T] is
    False are zeroed (NaN garbage too, so padded steps are identities) and T is padded to a
    multiple of `chunk`."""
    check_chunking(chunk)
    b, T = valid.shape
    nc = -(-T // chunk)
    t = jnp.where(valid.reshape(valid.shape + (1,) * (t.ndim - 2)), t.astype(jnp.float32), 0)
    t = jnp.pad(t, [(0, 0), (0, nc * chunk - T)] + [(0, 0)] * (t.ndim - 2))
    return t.reshape((b, nc, chunk) + t.shape[2:])


def check_chunking(chunk, block=0) -> None:
    """A prefill scan's static chunk length (an integer >= 1) and block (0, or a positive
    multiple of chunk: the states after every block tokens)."""
    check(is_int(chunk) and chunk >= 1, f"chunk = {chunk!r} must be an integer >= 1")
    check(is_int(block) and block >= 0 and block % chunk == 0,
          f"block = {block!r} must be 0 or a positive multiple of chunk = {chunk}")


def check_prefill(fields, arrays, lengths, initial_state, state_dims, chunk, block) -> dict:
    """Validates a prefill scan's arguments: the sequence inputs against the family's `Field`
    table (dims "b", "T", ...), lengths [b] int32 (concrete ones in [1, T]), initial_state
    [b, *state_dims] float32 or None, and the chunking. Returns the dims."""
    check_chunking(chunk, block)
    check_arrays(**arrays)
    dims = check_fields((*fields, Field("lengths", ("b",), INT32_ONLY)),
                        dict(arrays, lengths=lengths))
    if initial_state is not None:
        check_fields((Field("initial_state", ("b", *state_dims), F32_ONLY),),
                     dict(initial_state=initial_state), dims)
    T = dims["T"]
    check_range("lengths", lengths, 1, T, f"[1, T = {T}]")
    return dims
