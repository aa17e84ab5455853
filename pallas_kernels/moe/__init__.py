"""Sparse mixture-of-experts: routing (`route`: logits, scores, top-k, weights; one kernel for
few tokens), (token, expert) pairs sorted by expert into tiles, grouped GEMMs
(activation fused), weighted combine; for few pairs one kernel over (pair, F chunk) (`pairs`);
a shared expert's width chunks as extra experts (`SharedWeights`); a dense oracle in
`reference`."""

from pallas_kernels.moe import reference, router
from pallas_kernels.moe.api import (
    PAIR_PATH_MAX_PAIRS,
    PATHS,
    SharedWeights,
    default_block_m,
    expert_ffn,
)
from pallas_kernels.moe.pairs import PairTiling
from pallas_kernels.moe.pallas_triton import TILING, MoETiling
from pallas_kernels.moe.plan import DispatchPlan, make_plan
from pallas_kernels.moe.router import RouterTiling, route

__all__ = ["expert_ffn", "default_block_m", "SharedWeights", "DispatchPlan", "make_plan",
           "reference", "MoETiling", "TILING", "PairTiling", "PATHS", "PAIR_PATH_MAX_PAIRS",
           "route", "router", "RouterTiling"]
