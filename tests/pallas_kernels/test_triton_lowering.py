"""The Triton replay kernels lower for an H200 (sm90) at real model shapes, without a GPU, and
their Triton IR reads the ring with masked loads (entries past the count are never fetched) and
the checkpoint with the tiling's L2 eviction policy; the kernels of both families launch their
grid in the tiling's `grid_order`. The decode conv kernel lowers too and updates its pool in
place.

Pallas lowers a Triton kernel to Triton IR in Python (an abstract H200 stands in for the GPU);
only Triton's own compile to PTX happens on the GPU, so what the IR says is what runs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest
from jax._src import mesh as mesh_lib
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.triton import dialect as tt

from pallas_kernels import conv, gdn, mamba2

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32
S, B, L, T = 257, 256, 16, 4
H200 = mesh_lib.AbstractMesh((1,), ("x",), abstract_device=mesh_lib.AbstractDevice(
    device_kind="NVIDIA H200", num_cores=132, platform="cuda"))
sds = jax.ShapeDtypeStruct


def triton_kernel(fn, *args, op="tt.load"):
    """(launch grid (x, y, z), `op` lines: `tt.load` or `tt.store`) of the one Triton kernel `fn`
    lowers to for an H200."""
    with jax.sharding.use_abstract_mesh(H200):
        module = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir()
    calls = [op for op in _ops(module.operation) if op.name == "stablehlo.custom_call"]
    assert len(calls) == 1, [op.name for op in calls]
    config = ir.DictAttr(calls[0].attributes["mhlo.backend_config"])
    ctx = mlir.make_ir_context()
    tt.register_dialect(ctx)
    with ctx:
        text = str(ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes))
    grid = tuple(ir.IntegerAttr(config[f"grid_{a}"]).value for a in "xyz")
    return grid, [line.strip() for line in text.splitlines() if op in line]


def _ops(op):
    """Every operation nested in `op`."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _ops(inner.operation)


def masked(loads):
    """tt.load with a mask and an `other` value (`tt.load %ptr, %mask, %other`), or tt.store
    with a mask (`tt.store %ptr, %value, %mask`)."""
    return [ld for ld in loads if ld.split(" : ")[0].count(",") == 2]


def gdn_args(T=None):
    Hk, Hv, K, V = 16, 32, 128, 128
    bufs = gdn.GDNBuffers(sds((S, Hv, V, K), F32), sds((S, Hk, L, K), F32),
                          sds((S, Hv, L, V), F32), sds((S, Hv, L), F32))
    w = () if T is None else (T,)
    return (bufs, sds((S,), I32), sds((B, *w, Hk, K), BF16), sds((B, *w, Hk, K), BF16),
            sds((B, *w, Hv, V), BF16), sds((B, *w, Hv), F32), sds((B, *w, Hv), F32),
            sds((B,), I32))


def mamba2_args(T=None, P=64):
    H, N, G = 128, 128, 8
    bufs = mamba2.ReplayBuffers(sds((S, H, P, N), F32), sds((S, H, L, P), BF16),
                                sds((S, G, L, N), BF16), sds((S, H, L), F32))
    w = () if T is None else (T,)
    return (bufs, sds((S,), I32), sds((B, *w, H, P), BF16), sds((B, *w, G, N), BF16),
            sds((B, *w, G, N), BF16), sds((B, *w, H), F32), sds((H,), F32), sds((H,), F32),
            sds((B,), I32))


def default_tiling(ops, op):
    return {"replay_decode": ops.REPLAY_TILING, "replay_verify": ops.VERIFY_TILING,
            "standard_decode": ops.STANDARD_TILING,
            "standard_verify": ops.standard_verify_tiling(T)}[op]


def op_args(ops, op, **dims):
    """Abstract arguments of `op` at the family's real shape (replay buffers, or the state pool
    and, for the baseline verify, the draft slots); `dims` override the shape's."""
    args = (gdn_args if ops is gdn else mamba2_args)(None if op.endswith("decode") else T, **dims)
    if op.startswith("standard"):
        args = (args[0].checkpoint, *args[2:])
    return args + ((sds((B, T), I32),) if op == "standard_verify" else ())


# (batch, heads, tiles) of the real shapes at the default tilings: GDN Hv = 32, V = 128 in value
# tiles of 64 (standard decode: 128, its verify baseline at T = 4: 8); Mamba-2 H = 128, P = 64
# in one tile (standard: two of 32).
LOGICAL_GRIDS = {(gdn, "replay"): (B, 32, 2), (gdn, "standard"): (B, 32, 1),
                 (gdn, "standard_verify"): (B, 32, 16),
                 (mamba2, "replay"): (B, 128, 1), (mamba2, "standard"): (B, 128, 2)}


# (family, op, tiling overrides, masked ring loads: the [L, tile] ring vectors and the [L]
# scalars read once, and the ring's keys / B in the state pass and in the fold)
CASES = [
    (gdn, "replay_decode", dict(ring_scalars="kernel"), 4),  # d, g; k in the readout and fold
    (gdn, "replay_decode", dict(ring_scalars="xla"), 3),   # the readout reads no ring keys
    (gdn, "replay_verify", {}, 3),                         # d, g; k in the fold
    (mamba2, "replay_decode", {}, 4),                      # x, dt; B in the readout and fold
    (mamba2, "replay_decode", dict(ring_scalars="xla"), 3),  # the readout reads no ring B
    (mamba2, "replay_verify", {}, 3),                      # x, dt; B in the fold
]


@pytest.mark.parametrize("eviction", ["evict_normal", "evict_first"])
@pytest.mark.parametrize("ops,op,overrides,n_masked", CASES,
                         ids=[f"{c[0].__name__.split('.')[-1]}-{c[1]}-{'-'.join(c[2].values())}"
                              for c in CASES])
def test_replay_kernels_mask_ring_loads(ops, op, overrides, n_masked, eviction):
    """Real shapes (Qwen3-Next GDN, Nemotron-H-8B Mamba-2), batch 256, L = 16, T = 4."""
    tiling = dataclasses.replace(default_tiling(ops, op), state_eviction=eviction,
                                 grid_order="row_fastest", **overrides)
    fn = functools.partial(getattr(ops, op), impl="pallas_triton", tiling=tiling,
                           interpret=False)
    grid, loads = triton_kernel(fn, *op_args(ops, op))
    assert grid == LOGICAL_GRIDS[ops, "replay"]       # row_fastest: blockIdx.x is the row
    assert len(masked(loads)) == n_masked, loads
    assert all(ld.split(" : ")[1].startswith(f"tensor<{L}") for ld in masked(loads)), loads
    evicting = [ld for ld in loads if "evict_first" in ld]
    # the checkpoint tile [tile, chunk] in the state pass: one load, or one per window token
    assert len(evicting) == (eviction == "evict_first"), loads


GRID_CASES = [case for case in CASES if case[2].get("ring_scalars") != "xla"] + [
    (ops, op, {}, 0) for ops in (gdn, mamba2) for op in ("standard_decode", "standard_verify")]


@pytest.mark.parametrize("ops,op,overrides,n_masked", GRID_CASES,
                         ids=[f"{c[0].__name__.split('.')[-1]}-{c[1]}" for c in GRID_CASES])
def test_row_slowest_launches_a_rows_programs_together(ops, op, overrides, n_masked):
    """grid_order="row_slowest" launches (tiles, heads, batch): blockIdx.x, which the GPU hands
    out fastest, is the tile, then the head, so one row's programs are adjacent; the kernel reads
    the same masked ring entries as in the default order."""
    tiling = dataclasses.replace(default_tiling(ops, op), grid_order="row_slowest", **overrides)
    fn = functools.partial(getattr(ops, op), impl="pallas_triton", tiling=tiling,
                           interpret=False)
    grid, loads = triton_kernel(fn, *op_args(ops, op))
    assert grid == LOGICAL_GRIDS.get((ops, op), LOGICAL_GRIDS[ops, op.split("_")[0]])[::-1]
    assert len(masked(loads)) == n_masked, loads


def test_head_slowest_launches_a_heads_rows_together():
    """grid_order="head_slowest" (the ReplaySSM authors' GDN launch) is (tiles, batch, heads):
    blockIdx.x the V tile, then the row; the head is the slowest axis."""
    tiling = dataclasses.replace(gdn.REPLAY_TILING, grid_order="head_slowest")
    fn = functools.partial(gdn.replay_decode, impl="pallas_triton", tiling=tiling,
                           interpret=False)
    grid, loads = triton_kernel(fn, *op_args(gdn, "replay_decode"))
    assert grid == (2, B, 32)
    assert len(masked(loads)) == 4, loads


@pytest.mark.parametrize("chunk_loop", ["fori", "unrolled"])
def test_unrolled_chunk_loop_loads_the_checkpoint_before_the_count(chunk_loop):
    """GDN replay decode, chunk_loop="unrolled": the read-only pass's K // block_k checkpoint
    tiles (the evict_first loads) come right after the slot load, ahead of the count and the
    masked ring loads that wait on it; "fori" loads its one tile inside the loop, after them.
    The ring reads stay masked: d, g, and the keys per chunk in the readout and in the fold."""
    tiling = dataclasses.replace(gdn.REPLAY_TILING, state_eviction="evict_first",
                                 chunk_loop=chunk_loop)
    fn = functools.partial(gdn.replay_decode, impl="pallas_triton", tiling=tiling,
                           interpret=False)
    _, loads = triton_kernel(fn, *op_args(gdn, "replay_decode"))
    scalars = [i for i, ld in enumerate(loads) if ld.endswith("!tt.ptr<i32>")]   # slot, count
    state = [i for i, ld in enumerate(loads) if "evict_first" in ld]
    chunks = 128 // tiling.block_k
    assert scalars[:2] == [0, 1 + chunks if chunk_loop == "unrolled" else 1], loads
    if chunk_loop == "unrolled":
        assert state == list(range(1, 1 + chunks)), loads
        assert len(masked(loads)) == 2 + 2 * chunks, loads
    else:
        assert len(state) == 1 and state[0] > min(map(loads.index, masked(loads))), loads
        assert len(masked(loads)) == 4, loads


# Mamba-2 at P = 80 with p_tiles="masked": (loads, stores) of [tile] / [tile, chunk] blocks on the
# P axis. decode: x and the state (replay: in the readout and the fold; and the ring's x, masked
# by count anyway); stores: the state and y (replay: and the ring's x). verify (T = 4, unrolled):
# x and y per token, the baseline's state per token. Beside them, the replay kernels' masked ring
# dt and B loads (CASES), and one masked load per masked store: Pallas lowers a store as a swap,
# whose read of the old value is dead (Triton erases it). The ring's dt and B stores are not on P.
MASKED_P = {"standard_decode": (2, 2), "replay_decode": (4, 3), "replay_verify": (3 + T, 1 + T),
            "standard_verify": (T + 1, 2 * T)}
RING_LOADS = {"replay_decode": 3, "replay_verify": 2}


@pytest.mark.parametrize("block_p,tiles", [(32, 3), (128, 1)])
@pytest.mark.parametrize("op", list(MASKED_P))
def test_masked_p_tiles_mask_every_access_on_p(op, block_p, tiles):
    """Nemotron-Nano-9B-v2's P = 80 with p_tiles="masked": ceil(80 / block_p) tiles (32, 32, 16
    live rows of 32; or one tile of 128), and every load and store on the P axis masked (no read
    or write past a head's 80 rows: the next head's). The default "divide" (five tiles of 16)
    masks none of its stores."""
    default = default_tiling(mamba2, op)
    fn = functools.partial(getattr(mamba2, op), impl="pallas_triton", interpret=False,
                           tiling=dataclasses.replace(default, p_tiles="masked", block_p=block_p))
    args = op_args(mamba2, op, P=80)
    grid, loads = triton_kernel(fn, *args)
    _, stores = triton_kernel(fn, *args, op="tt.store")
    assert sorted(grid) == sorted((B, 128, tiles)), grid
    p_loads, p_stores = MASKED_P[op]
    assert len(masked(stores)) == p_stores, stores
    assert len(masked(loads)) == p_loads + RING_LOADS.get(op, 0) + p_stores, loads
    divide = functools.partial(getattr(mamba2, op), impl="pallas_triton", interpret=False,
                               tiling=default)
    grid, stores = triton_kernel(divide, *args, op="tt.store")
    assert sorted(grid) == sorted((B, 128, 5)) and masked(stores) == [], (grid, stores)


# (conv channels, bias) of the models' decode conv: Nemotron-H-8B, Qwen3.5-9B
CONV_SHAPES = {"nemotron-h-8b": (10240, True), "qwen3.5-9b": (8192, False)}


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("grid_order", ["row_fastest", "row_slowest"])
@pytest.mark.parametrize("model", list(CONV_SHAPES))
def test_conv_update_lowers_in_place(model, grid_order, fused):
    """The models' decode conv (bf16 pool and inputs; Nemotron-H-8B's biased, Qwen3.5-9B's
    not), batch 256, the default channel blocks: one Triton kernel whose grid is (rows,
    channel blocks) in the tiling's order, that writes the output and the K-1 shifted state
    rows with masked [block_c] stores, and whose pool output aliases the pool operand (in place,
    no copy). fused: as the models call it, the channels at an offset of the wider projection,
    SiLU'd into three bf16 pieces (each block stores into the one holding it: 3 guarded
    stores)."""
    (C, biased), block_c = CONV_SHAPES[model], conv.TILING.block_c
    W, offset = (C + 8192 + 64, 8192) if fused else (C, None)
    args = (sds((S, 3, C), BF16), sds((B, 1, W), BF16), sds((C, 4), BF16),
            sds((C,), BF16) if biased else None, sds((B,), I32))
    tiling = dataclasses.replace(conv.TILING, grid_order=grid_order)
    pieces = (C - 2048, 1024, 1024)
    fn = functools.partial(conv.conv_update, impl="pallas_triton", tiling=tiling,
                           interpret=False, offset=offset,
                           **(dict(activation="silu", out_dtype=BF16, splits=pieces) if fused
                              else {}))
    with jax.sharding.use_abstract_mesh(H200):
        module = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir()
    (call,) = [op for op in _ops(module.operation) if op.name == "stablehlo.custom_call"]
    aliases = str(call.attributes["output_operand_aliases"])
    pool = 3 + biased                 # operands: slots, weight, (bias,) window, pool
    assert f"output_tuple_indices = [0], operand_index = {pool}" in aliases, aliases
    config = ir.DictAttr(call.attributes["mhlo.backend_config"])
    grid = tuple(ir.IntegerAttr(config[f"grid_{a}"]).value for a in "xyz")
    logical = (B, C // block_c)
    assert grid == (logical if grid_order == "row_fastest" else logical[::-1]) + (1,)
    ctx = mlir.make_ir_context()
    tt.register_dialect(ctx)
    with ctx:
        text = str(ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes))
    stores = [line.strip() for line in text.splitlines() if "tt.store" in line]
    outs = 3 if fused else 1
    assert len(stores) == 3 + outs, stores
    assert sorted(st.split(" : ")[1] for st in stores) == sorted(
        [f"tensor<{block_c}x!tt.ptr<{'bf16' if fused else 'f32'}>>"] * outs
        + [f"tensor<{block_c}x!tt.ptr<bf16>>"] * 3), stores
