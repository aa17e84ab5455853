"""Decode attention over the attention KV slot pool (decode and speculative verify windows):
a Pallas Triton kernel that reads each row's K/V straight from its pool slot, and the dense XLA
path; for any number of new tokens (a prefill) `prefill_attention`, XLA by blocks.

Modules: `api` (the public op: validate, dispatch), `reference` (the dense math over gathered
rows, any T), `xla` and `pallas_triton` (implementations).
"""

from pallas_kernels.attention import reference
from pallas_kernels.attention.api import decode_attention
from pallas_kernels.attention.pallas_triton import TILING, AttentionTiling, default_tiling
from pallas_kernels.attention.xla import prefill_attention

__all__ = ["decode_attention", "prefill_attention", "reference", "AttentionTiling", "TILING",
           "default_tiling"]
