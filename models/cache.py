"""The decode cache of a hybrid model: one pytree for a pool of S sequence slots.

Slot 0 is the null slot (padding rows point at it and change nothing). `counts` are the ReplaySSM
ring counts, `lengths` the committed tokens per slot; both are shared by every layer, so a verify
step commits once per model step. Per layer: `SSMCache` (Mamba-2 or GDN ring buffers + conv
state) for SSM mixers, `KVCache` for attention, None for MLP/MoE layers. In `standard` SSM mode
the checkpoint holds the running state and the rings are unused.

Standard-mode speculative decoding (the state-per-draft baseline) needs T draft states per slot:
a cache built with `init_cache(..., ssm_mode="standard", max_verify=T)` (T > 1) has a checkpoint
pool of S * (1 + T) states, T + 1 rows per slot, and `state_rows` [S] names the row that holds
each slot's committed state; commit remaps it to the last accepted draft instead of copying a
state (`pallas_kernels.ring` documents the layout). So a sequence holds T + 1 full SSM states per
layer, against one state plus L ring entries in replay mode. Without drafts `state_rows` is the
identity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from models.common import KVCache
from pallas_kernels.ring import base_rows


@struct.dataclass
class SSMCache:
    buffers: tuple          # ReplayBuffers (Mamba-2) or GDNBuffers
    conv: jax.Array         # [S, K - 1, conv_channels] last pre-conv inputs, oldest first
    pending: jax.Array | None = None  # [S, W, conv_channels] pre-conv inputs of an uncommitted
                                      # verify window (W = max window; None: decode only)

    @property
    def num_drafts(self) -> int:
        """Draft states per slot in the checkpoint pool (T of a standard-mode cache, else 0)."""
        return self.buffers.checkpoint.shape[0] // self.conv.shape[0] - 1


@struct.dataclass
class ModelCache:
    counts: jax.Array       # [S] int32
    lengths: jax.Array      # [S] int32
    layers: tuple           # per layer: SSMCache | KVCache | None
    state_rows: jax.Array   # [S] int32 checkpoint-pool row of each slot's state (see above)
    mtp: tuple = ()         # per MTP-head layer: KVCache | None (empty without an MTP head)

    @classmethod
    def create(cls, num_slots: int, layers: tuple, mtp: tuple = ()) -> ModelCache:
        """Zero counts and lengths; each slot's state at the first row of its group (the
        layers' standard-mode draft rows, if any, decide the group size)."""
        drafts = next((lc.num_drafts for lc in layers if isinstance(lc, SSMCache)), 0)
        zeros = lambda: jnp.zeros((num_slots,), jnp.int32)     # distinct buffers: donated
        return cls(counts=zeros(), lengths=zeros(), layers=layers,
                   state_rows=base_rows(jnp.arange(num_slots, dtype=jnp.int32), drafts), mtp=mtp)

    @property
    def num_slots(self) -> int:
        return self.counts.shape[0]

    @property
    def max_len(self) -> int:
        kv = [c for c in self.layers if isinstance(c, KVCache)]
        return kv[0].k.shape[1] if kv else jnp.iinfo(jnp.int32).max

