"""Dispatch plan of a sparse MoE layer: (token, expert) pairs sorted by expert into row tiles.

n tokens each routed to k experts give P = n k pairs. Invalid pairs (of padding rows, or routed to
another device's experts) get the key E and sort past every group, so they own no rows and no group
counts them. Each expert's pairs are a group; every group is padded to a multiple of m = block_m
rows, so a tile of m rows belongs to exactly one expert and a grouped GEMM is one dense [m, din] x
[din, F] product per tile with that expert's weights (megablox layout).
The number of tiles is static,

    num_tiles = ceil(P / m) + min(E, P)      (>= sum over non-empty groups of ceil(size / m)),

and only the first `num_used_tiles` hold pairs: the rest are skipped, so the work and the weight
bytes read follow the distinct experts hit, not E. A pair's place in the expert order is its rank
among the keys: counted ([P, P] comparisons, one fusion) for up to RANK_MAX_PAIRS pairs (a decode
step), where a sort would be XLA's sort kernels (two launches, ~2.5 us each at batch 1 on an
H200, `replayjax bench moe --breakdown`), else the inverse of a stable argsort.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

RANK_MAX_PAIRS = 128        # [128, 128] comparisons: batch 8 of top-8 with a shared expert


class DispatchPlan(NamedTuple):
    """R = num_tiles * m padded rows; rows past a group's size are padding (token 0, weight 0)."""
    row_token: jax.Array        # [R] int32: token whose pair fills the row
    row_weight: jax.Array       # [R] float32: that pair's routing weight (0 on padding rows)
    tile_expert: jax.Array      # [num_tiles] int32: expert of each tile (E - 1 past the used ones)
    num_used_tiles: jax.Array   # [1] int32
    pair_row: jax.Array         # [n, k] int32: row of each pair; R for pairs of invalid tokens
    group_sizes: jax.Array      # [E] int32: pairs per expert, valid tokens only


def num_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static tile count that holds any routing of `num_pairs` pairs to `num_experts` groups."""
    return -(-num_pairs // block_m) + min(num_experts, num_pairs)


def rank(keys):
    """Each key's position in a stable sort of keys [P] int32 (ties in index order): [P] int32."""
    P = keys.shape[0]
    idx = jnp.arange(P, dtype=jnp.int32)
    if P <= RANK_MAX_PAIRS:
        before = (keys[None, :] < keys[:, None]) | ((keys[None, :] == keys[:, None])
                                                    & (idx[None, :] < idx[:, None]))
        return before.sum(1, dtype=jnp.int32)
    return jnp.zeros((P,), jnp.int32).at[jnp.argsort(keys, stable=True)].set(idx)


def make_plan(expert_ids, weights, valid, num_experts: int, block_m: int) -> DispatchPlan:
    """expert_ids [n, k] int32 in [0, E); weights [n, k] float32; valid [n] bool (tokens) or
    [n, k] bool (pairs: an expert-parallel shard's own pairs)."""
    n, k = expert_ids.shape
    P, E, m = n * k, num_experts, block_m
    R = num_tiles(P, E, m) * m
    keys = jnp.where(valid if valid.ndim == 2 else valid[:, None], expert_ids, E).reshape(P)
    group_sizes = jnp.zeros((E + 1,), jnp.int32).at[keys].add(1)[:E]
    group_start = jnp.cumsum(group_sizes) - group_sizes
    group_tiles = -(-group_sizes // m)
    tile_end = jnp.cumsum(group_tiles)              # first tile after each group
    key = jnp.minimum(keys, E - 1)
    # by expert, then token (the rank); invalid pairs own no row (R)
    row = (tile_end - group_tiles)[key] * m + rank(keys) - group_start[key]
    row = jnp.where(keys < E, row, R).astype(jnp.int32)
    pair_row = row.reshape(n, k)
    row_pair = jnp.full((R,), P, jnp.int32).at[row].set(jnp.arange(P, dtype=jnp.int32),
                                                         mode="drop")
    filled = row_pair < P
    pair = jnp.minimum(row_pair, P - 1)
    # compare_all: one fused [tiles, E] comparison (the default binary search is ~log2 E small
    # kernels on GPU, ~15 us at decode)
    tile_expert = jnp.searchsorted(tile_end, jnp.arange(R // m), side="right",
                                   method="compare_all")
    return DispatchPlan(
        row_token=jnp.where(filled, pair // k, 0).astype(jnp.int32),
        row_weight=jnp.where(filled, weights.reshape(P).astype(jnp.float32)[pair], 0.0),
        tile_expert=jnp.minimum(tile_expert, E - 1).astype(jnp.int32),
        num_used_tiles=tile_end[-1:].astype(jnp.int32),
        pair_row=pair_row, group_sizes=group_sizes)


def combine(rows, pair_row):
    """Weighted expert outputs per row [R, din] -> per token [n, din]: each token's k rows summed
    in routing order (a gather, so deterministic); pairs of invalid tokens read zeros."""
    return jnp.take(rows, pair_row, axis=0, mode="fill", fill_value=0).sum(axis=1)
