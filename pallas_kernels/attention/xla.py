"""The XLA implementation of decode attention (`impl="xla"`): the dense `reference` math over
the gathered pool rows (bitwise what the models ran before the kernel). Arguments as in
`pallas_kernels.attention.api`."""

from __future__ import annotations

from pallas_kernels.attention import reference


def decode_attention(q, k_pool, v_pool, slots, starts, kv_head):
    return reference.attention(q, k_pool, v_pool, slots, starts, kv_head)
