"""Sparse mixture-of-experts: (token, expert) pairs sorted by expert into tiles, grouped GEMMs
(activation fused), weighted combine; a dense oracle in `reference`."""

from pallas_kernels.moe import reference
from pallas_kernels.moe.api import default_block_m, expert_ffn
from pallas_kernels.moe.pallas_triton import TILING, MoETiling
from pallas_kernels.moe.plan import DispatchPlan, make_plan

__all__ = ["expert_ffn", "default_block_m", "DispatchPlan", "make_plan", "reference", "MoETiling",
           "TILING"]
