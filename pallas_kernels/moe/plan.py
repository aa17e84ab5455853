"""Dispatch plan of a sparse MoE layer: (token, expert) pairs sorted by expert into row tiles.

n tokens each routed to k experts give P = n k pairs. Invalid pairs (of padding rows, or routed to
another device's experts) get the key E and sort past every group, so they own no rows and no group
counts them. Each expert's pairs are a group; every group is padded to a multiple of m = block_m
rows, so a tile of m rows belongs to exactly one expert and a grouped GEMM is one dense [m, din] x
[din, F] product per tile with that expert's weights (megablox layout).
The number of tiles is static,

    num_tiles = ceil(P / m) + min(E, P)      (>= sum over non-empty groups of ceil(size / m)),

the used ones first; the others have expert -1 and are skipped, so the work and the weight
bytes read follow the distinct experts hit, not E.

One token (a batch-1 decode step) with token validity needs no placing at all: its pairs are
its top-k, distinct experts, so pair p owns tile p of P tiles, in routing order
(`_place_one_token`: the tile experts are the routed ids themselves, the rows iotas and
selects; each array of the plan is one fusion at most, and a launch costs more than its work
at batch 1). Up to COUNT_MAX_PAIRS pairs (a decode step) the whole plan is counted:
comparisons between the P pairs ([P, P]: a pair's place in its group, its group's size and the
tiles of the groups before it) and between rows and pairs ([R, P]: which pair fills a row), with
no sort, scatter, cumsum or search, each of which XLA runs as launches of their own (at batch 1
on an H200 a layer's plan and combine were ~16 launches of 1-4 us around the two grouped GEMMs,
`replayjax bench moe --breakdown`). Above it, per-expert group sizes (a scatter-add), their
cumsums and a stable argsort place the pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

COUNT_MAX_PAIRS = 128       # [128, 128] comparisons: batch 8 of top-8 with a shared expert


class DispatchPlan(NamedTuple):
    """R = num_tiles * m padded rows; rows past a group's size are padding (token 0, weight 0)."""
    row_token: jax.Array        # [R] int32: token whose pair fills the row
    row_weight: jax.Array       # [R] float32: that pair's routing weight (0 on padding rows)
    tile_expert: jax.Array      # [num_tiles] int32: expert of each tile, -1 past the used ones
    pair_row: jax.Array         # [n, k] int32: row of each pair; R for pairs of invalid tokens
    group_sizes: jax.Array      # [E] int32: pairs per expert, valid tokens only


def num_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static tile count that holds any routing of `num_pairs` pairs to `num_experts` groups."""
    return -(-num_pairs // block_m) + min(num_experts, num_pairs)


def make_plan(expert_ids, weights, valid, num_experts: int, block_m: int) -> DispatchPlan:
    """expert_ids [n, k] int32 in [0, E); weights [n, k] float32; valid [n] bool (tokens) or
    [n, k] bool (pairs: an expert-parallel shard's own pairs)."""
    n, k = expert_ids.shape
    P, E, m = n * k, num_experts, block_m
    # invalid pairs get the key E: they sort last and own no row (R)
    keys = jnp.where(valid if valid.ndim == 2 else valid[:, None], expert_ids, E).reshape(P)
    if n == 1 and valid.ndim == 1:
        place, R = _place_one_token, P * m
    else:
        place = _place_by_count if P <= COUNT_MAX_PAIRS else _place_by_sort
        R = num_tiles(P, E, m) * m
    row, row_pair, tile_expert, group_sizes = place(keys, E, m, R)
    filled = row_pair < P
    pair = jnp.minimum(row_pair, P - 1)
    return DispatchPlan(
        row_token=jnp.where(filled, pair // k, 0).astype(jnp.int32),
        row_weight=jnp.where(filled, weights.reshape(P).astype(jnp.float32)[pair], 0.0),
        tile_expert=jnp.where(tile_expert < E, tile_expert, -1).astype(jnp.int32),
        pair_row=row.reshape(n, k), group_sizes=group_sizes)


def num_used_tiles(plan: DispatchPlan):
    """The tiles that hold pairs (they come first): [] int32."""
    return (plan.tile_expert >= 0).sum(dtype=jnp.int32)


def _place_by_sort(keys, E, m, R):
    """(row of each pair [P] (R: none), pair of each row [R] (P: none), expert of each tile
    [R / m] (>= E past the used ones), pairs per expert [E]) through per-expert counts, cumsums
    and a stable argsort."""
    P = keys.shape[0]
    group_sizes = jnp.zeros((E + 1,), jnp.int32).at[keys].add(1)[:E]
    group_start = jnp.cumsum(group_sizes) - group_sizes
    group_tiles = -(-group_sizes // m)
    tile_end = jnp.cumsum(group_tiles)              # first tile after each group
    key = jnp.minimum(keys, E - 1)
    rank = jnp.zeros((P,), jnp.int32).at[jnp.argsort(keys, stable=True)].set(
        jnp.arange(P, dtype=jnp.int32))
    # by expert, then token (the rank)
    row = (tile_end - group_tiles)[key] * m + rank - group_start[key]
    row = jnp.where(keys < E, row, R).astype(jnp.int32)
    row_pair = jnp.full((R,), P, jnp.int32).at[row].set(jnp.arange(P, dtype=jnp.int32),
                                                         mode="drop")
    # compare_all: one fused [tiles, E] comparison (the default binary search is ~log2 E small
    # kernels on GPU, ~15 us at decode)
    tile_expert = jnp.searchsorted(tile_end, jnp.arange(R // m), side="right",
                                   method="compare_all")
    return row, row_pair, tile_expert, group_sizes


def _place_one_token(keys, E, m, R):
    """`_place_by_sort`'s arrays for one token's pairs, all valid or all not (keys E), over
    R = P m rows: pair p fills the first row of tile p, so no comparisons, sort or scatter. A
    tile per pair keeps each tile one expert's even if a caller repeats an expert."""
    P = keys.shape[0]
    valid = keys < E
    row = jnp.where(valid, jnp.arange(P, dtype=jnp.int32) * m, R)
    r = jnp.arange(R, dtype=jnp.int32)
    row_pair = jnp.where((r % m == 0) & valid[0], r // m, P)
    return row, row_pair, keys, _count_groups(keys, E)


def _place_by_count(keys, E, m, R):
    """`_place_by_sort`'s arrays from comparisons only (P <= COUNT_MAX_PAIRS): the pairs of a
    group fill its rows in pair order from its first tile, the tiles of the groups of smaller
    expert ids first."""
    P = keys.shape[0]
    idx = jnp.arange(P, dtype=jnp.int32)
    valid = keys < E
    same = keys[:, None] == keys[None, :]                         # [P, P]
    place = (same & (idx[None, :] < idx[:, None])).sum(1, dtype=jnp.int32)   # in its group
    tiles = -(-same.sum(1, dtype=jnp.int32) // m)                 # its group's tiles
    first = valid & (place == 0)                                  # one pair per group
    before = first[None, :] & (keys[None, :] < keys[:, None])     # groups of smaller experts
    row = jnp.where(valid, (before * tiles[None, :]).sum(1, dtype=jnp.int32) * m + place, R)
    match = row[None, :] == jnp.arange(R, dtype=jnp.int32)[:, None]          # [R, P]
    row_pair = jnp.where(match.any(1), (match * idx[None, :]).sum(1, dtype=jnp.int32), P)
    # a used tile's first row holds a pair of its expert; unused tiles get E
    lead = row_pair[::m]
    tile_expert = jnp.where(lead < P, keys[jnp.minimum(lead, P - 1)], E)
    return row.astype(jnp.int32), row_pair, tile_expert, _count_groups(keys, E)


def _count_groups(keys, E):
    """Pairs per expert [E] int32 by comparisons (a few pairs: no scatter launch); keys E (invalid
    pairs) count nowhere."""
    return (keys[None, :] == jnp.arange(E, dtype=jnp.int32)[:, None]).sum(1, dtype=jnp.int32)


def combine(rows, pair_row):
    """Weighted expert outputs per row [R, din] -> per token [n, din]: each token's k rows summed
    in routing order (a gather, so deterministic); pairs of invalid tokens read zeros."""
    return jnp.take(rows, pair_row, axis=0, mode="fill", fill_value=0).sum(axis=1)
