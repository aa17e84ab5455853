"""Mamba-2-only kernel cases: input validation (the shared numerics are in test_decode.py and
test_verify.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import mamba2
from pallas_kernels.mamba2 import pallas_triton
from pallas_kernels.validation import masked_block
from tests.pallas_kernels.families import BF16, F32, Mamba2, mosaic_tiling_run
from tests.pallas_kernels.helpers import (
    assert_runs_equal,
    bitwise_equal,
    mosaic_races_found,
    same_sums,
)


def _valid_args(pb, L=16):
    x, B, C, dt = pb.step_inputs(2)
    return dict(buffers=pb.init_buffers(L), counts=jnp.zeros((pb.S,), jnp.int32), x=x, B=B, C=C,
                dt=dt, A=pb.A, D=pb.D, slots=jnp.asarray([1, 2], jnp.int32))


@pytest.mark.parametrize("change,match", [
    (lambda a, pb: a.update(x=a["x"][:, :3]), r"heads \(3\) must be a multiple of groups"),
    (lambda a, pb: a.update(dt=a["dt"].astype(BF16)), r"dt has dtype bfloat16"),
    (lambda a, pb: a.update(slots=a["slots"].astype(jnp.int16)), r"slots has dtype int16"),
    (lambda a, pb: a.update(C=a["C"][:, :, :8]), r"C has shape"),
    (lambda a, pb: a.update(buffers=pb.init_buffers(12)), r"window L = 12 must be a power of two"),
    (lambda a, pb: a.update(counts=a["counts"][:3]), r"counts has shape"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(
        ring_dt=a["buffers"].ring_dt.astype(BF16))), r"ring_dt has dtype bfloat16"),
    # B and C share x's (activation) dtype
    (lambda a, pb: a.update(B=a["B"].astype(BF16)),
     r"^B has dtype bfloat16, expected one of: float32$"),
    (lambda a, pb: a.update(x=a["x"].astype(BF16)),
     r"^B has dtype float32, expected one of: bfloat16$"),
    (lambda a, pb: a.update(x=a["x"][:, :, :0]),        # P = 0
     r"^x has shape \(2, 4, 0\): every dimension must be >= 1 \(no empty batch or axis\)$"),
])
def test_replay_decode_rejects_bad_input(change, match):
    pb = Mamba2(1)
    args = _valid_args(pb)
    change(args, pb)
    with pytest.raises(ValueError, match=match):
        mamba2.replay_decode(**args, impl="pallas")


@pytest.mark.parametrize("P,N,tiling,match", [
    (12, 24, None, r"d_state N = 24 must be a power of two"),
    (12, 16, mamba2.Mamba2Tiling(block_p=12, block_n=16, num_warps=4),
     r"block_p = 12 must be a power of two"),
    (6, 16, mamba2.Mamba2Tiling(block_p=32, block_n=16, num_warps=4),
     r"head_dim P = 6 has no power-of-two tile >= 4 dividing it"),
    (16, 16, mamba2.REPLAY_TILING, r"tiling must be a Mamba2Tiling, got Mamba2ReplayTiling"),
    (80, 16, mamba2.Mamba2Tiling(block_p=48, block_n=16, num_warps=4, p_tiles="masked"),
     r"block_p = 48 must be a power of two"),
    (16, 16, mamba2.Mamba2Tiling(block_p=16, block_n=16, num_warps=4, p_tiles="pad"),
     r"^p_tiles must be one of 'divide', 'masked', got 'pad'$"),
    # every tiling's integer fields (`validation.check_tiling_fields`)
    (16, 16, mamba2.Mamba2Tiling(block_p=16, block_n=16, num_warps=3),
     r"^num_warps = 3 must be a power of two$"),
    (16, 16, mamba2.Mamba2Tiling(block_p=16, block_n=16, num_warps=4, num_stages=0),
     r"^num_stages = 0 must be >= 1$"),
    (16, 16, mamba2.Mamba2Tiling(block_p=1.5, block_n=16, num_warps=4),
     r"^block_p = 1.5 must be an integer >= 1$"),
    (16, 16, mamba2.Mamba2Tiling(block_p=16, block_n=16, num_warps="4"),
     r"^num_warps = '4' must be an integer >= 1$"),
])
def test_bad_shapes_and_tilings_are_named(P, N, tiling, match):
    pb = Mamba2(1, P=P, N=N)
    with pytest.raises(ValueError, match=match):
        mamba2.standard_decode(pb.random_state(), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="pallas", tiling=tiling)


@pytest.mark.parametrize("P,block_p,tile", [(80, 32, 32), (80, 128, 128), (80, 256, 128),
                                            (64, 128, 64), (6, 4, 4), (2, 16, 4)])
def test_masked_p_tile_is_the_bound_up_to_p(P, block_p, tile):
    """p_tiles="masked" takes block_p itself (it need not divide P), but no tile larger than the
    power of two covering P, and none under the kernels' minimum of 4 rows."""
    assert masked_block("block_p", "head_dim P", P, block_p, 4) == tile


@pytest.mark.parametrize("default,P,rows,want", [
    (mamba2.STANDARD_TILING, 80, 8, dict(block_p=32, num_warps=8)),
    (mamba2.REPLAY_TILING, 80, 8, dict(block_p=128, block_n=32, num_warps=4)),
    (mamba2.STANDARD_TILING, 64, 8, dict(block_p=32, num_warps=8)),
    (mamba2.REPLAY_TILING, 64, 8, dict(block_p=64, num_warps=4)),
    (mamba2.REPLAY_TILING, 64, 1, dict(block_p=32, num_warps=4)),    # one row: small tiles
    (mamba2.REPLAY_TILING, 80, 1, dict(block_p=32, num_warps=4)),    # masked: 32 + 32 + 16
    (mamba2.STANDARD_TILING, 64, 1, dict(block_p=32, num_warps=8)),
])
def test_default_tiles_mask_p_only_where_block_p_does_not_divide_it(default, P, rows, want):
    """P = 80 (Nemotron-Nano-9B-v2) takes the measured masked tiles (the last one's rows past
    P masked: block_p 32 / 128, where whole tiles would be five of 16); P = 64 keeps the
    default's whole tiles; one row a step takes the replay's small tiles (masked at P = 80)."""
    window = 16 if default is mamba2.REPLAY_TILING else None
    x = jax.ShapeDtypeStruct((rows, 4, P), jnp.bfloat16)
    tiles = pallas_triton._tiles(None, default, x, 128, window)
    assert {k: tiles[k] for k in want} == want


@pytest.mark.parametrize("kind", ["standard", "replay"])
def test_bad_grid_order_is_named(kind):
    pb = Mamba2(1)
    args = _valid_args(pb)
    tiling = pb.tiling(kind, grid_order="head_fastest")
    with pytest.raises(ValueError, match=r"grid_order must be one of 'row_fastest', "
                                         r"'row_slowest'.*, got 'head_fastest'"):
        if kind == "standard":
            mamba2.standard_decode(pb.random_state(), *pb.step_inputs(2), pb.A, pb.D,
                                   args["slots"], impl="pallas", tiling=tiling)
        else:
            mamba2.replay_decode(**args, impl="pallas", tiling=tiling)


def test_bad_ring_options_are_named():
    pb = Mamba2(1)
    with pytest.raises(ValueError, match=r"ring_scalars must be one of 'kernel', 'xla', got 'gpu'"):
        mamba2.replay_decode(**_valid_args(pb), impl="pallas",
                             tiling=pb.tiling("replay", ring_scalars="gpu"))
    with pytest.raises(ValueError, match=r"ring_loads must be one of 'committed', 'all', got 'x'"):
        mamba2.replay_decode(**_valid_args(pb), impl="pallas",
                             tiling=pb.tiling("replay", ring_loads="x"))


def test_unknown_impl_is_named():
    pb = Mamba2(1)
    with pytest.raises(ValueError, match=r"impl must be one of"):
        mamba2.standard_decode(pb.random_state(F32), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="cuda")


@pytest.mark.parametrize("P,N,tiling,match", [
    (64, 16, mamba2.Mamba2MosaicTiling(block_n=48), r"block_n = 48 must be a power of two"),
    (64, 4, None, r"d_state N = 4 has no power-of-two tile >= 8"),
    (64, 512, None, r"pallas_mosaic_gpu needs d_state N <= 256, got N = 512"),
    (64, 16, mamba2.STANDARD_TILING, r"tiling must be a Mamba2MosaicTiling, got Mamba2Tiling"),
])
def test_mosaic_shapes_and_tilings_are_named(P, N, tiling, match):
    pb = Mamba2(1, P=P, N=N)
    with pytest.raises(ValueError, match=match):
        mamba2.standard_decode(pb.random_state(), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="pallas_mosaic_gpu",
                               tiling=tiling)


@pytest.mark.parametrize("fields,match", [
    (dict(fold_stages=-1), r"^fold_stages = -1 must be >= 0 \(0: num_stages\)$"),
    (dict(fold_buffers=3), r"^fold_buffers = 3 must be 1 or 2$"),
    (dict(fold_buffers=0), r"^fold_buffers = 0 must be >= 1$"),
    (dict(ring_block=-2), r"^ring_block = -2 must be >= 0 \(0: the whole ring\)$"),
    (dict(num_stages=0), r"^num_stages = 0 must be >= 1$"),
    (dict(heads=2.0), r"^heads = 2.0 must be an integer >= 1$")])
def test_bad_mosaic_fold_tiles_are_named(fields, match):
    """The Mosaic replay's fold knobs are checked before any kernel runs."""
    with pytest.raises(ValueError, match=match):
        mamba2.replay_decode(**_valid_args(Mamba2(1, P=64, N=64), L=4),
                             impl="pallas_mosaic_gpu",
                             tiling=mamba2.Mamba2MosaicTiling(block_n=16, **fields))


def test_bad_mosaic_prologue_is_named():
    """A prologue other than "serial" / "overlap" is named by replay decode and verify (the
    kernels that take it) and by the standard decode (same tiling), before any kernel runs."""
    pb = Mamba2(1, P=64, N=64)
    args = _valid_args(pb, L=4)
    kw = dict(impl="pallas_mosaic_gpu", tiling=mamba2.Mamba2MosaicTiling(block_n=16,
                                                                         prologue="early"))
    match = r"^prologue must be one of 'serial', 'overlap', got 'early'$"
    with pytest.raises(ValueError, match=match):
        mamba2.replay_decode(**args, **kw)
    with pytest.raises(ValueError, match=match):
        mamba2.replay_verify(args["buffers"], args["counts"], *pb.window_inputs(2, b=2), pb.A,
                             pb.D, args["slots"], **kw)
    with pytest.raises(ValueError, match=match):
        mamba2.standard_decode(pb.random_state(), *pb.step_inputs(2), pb.A, pb.D,
                               args["slots"], **kw)


def test_mosaic_bf16_state_needs_chunk_rows_of_32_bytes():
    """Mosaic GPU swizzles 32, 64 or 128 bytes: a bf16 chunk of 8 (16 bytes) is refused."""
    pb = Mamba2(1, P=64, N=64)
    with pytest.raises(ValueError, match=r"state chunk rows of >= 32 bytes: block_n = 8 of a "
                                         r"bfloat16 state is 16"):
        mamba2.standard_decode(pb.random_state(BF16), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="pallas_mosaic_gpu",
                               tiling=mamba2.Mamba2MosaicTiling(block_n=8))


def test_an_op_without_mosaic_kernel_is_named():
    pb = Mamba2(1, P=64)
    x, B, C, dt = pb.window_inputs(2, 2)
    with pytest.raises(ValueError, match=r"mamba2.standard_verify has no pallas_mosaic_gpu"):
        mamba2.standard_verify(pb.random_state(), x, B, C, dt, pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32),
                               jnp.asarray([[3, 4], [5, 6]], jnp.int32),
                               impl="pallas_mosaic_gpu")


@pytest.mark.parametrize("op", ["standard_decode", "replay_decode"])
def test_mosaic_ragged_tile_rows_must_fill_16_bytes(op):
    """A ragged P tile's vector stores copy its P % 64 rows only (a TMA store of a vector is
    bounded by the whole array, not by P: `_mosaic_utils.store_rows`); 2 rows of a y vector
    are under one 16-byte TMA unit, so P = 66 is refused, naming the rows (the replay decode's
    default takes 128-row tiles there, whose 66 rows are no better)."""
    pb = Mamba2(1, P=66, N=64)
    args = _valid_args(pb)
    if op == "standard_decode":
        args = dict(state=pb.random_state(), **{k: args[k] for k in "x B C dt A D slots".split()})
    with pytest.raises(ValueError, match=r"ragged tile's rows in multiples of 16 bytes: "
                                         r"66 % (64 = 2|128 = 66) rows of \w+ are \d+ "
                                         r"bytes"):
        getattr(mamba2, op)(**args, impl="pallas_mosaic_gpu")


def test_bad_bc_products_is_named():
    """A bc_products other than "xla" / "pallas" is named by replay decode and verify before
    any kernel runs."""
    pb = Mamba2(1, P=64, N=64)
    args = _valid_args(pb, L=4)
    kw = dict(impl="pallas_mosaic_gpu", tiling=mamba2.Mamba2MosaicTiling(block_n=16,
                                                                         bc_products="cuda"))
    match = r"^bc_products must be one of 'xla', 'pallas', got 'cuda'$"
    with pytest.raises(ValueError, match=match):
        mamba2.replay_decode(**args, **kw)
    with pytest.raises(ValueError, match=match):
        mamba2.replay_verify(args["buffers"], args["counts"], *pb.window_inputs(2, b=2),
                             pb.A, pb.D, args["slots"], **kw)


@pytest.mark.parametrize("op", ["standard_decode", "replay_decode", "replay_verify"])
def test_mosaic_heads_per_cta_compute_the_one_head_sums(op, interpret):
    """heads=2 (one CTA over two heads of a group, their tiles in the same pipeline steps, the
    group's vectors and walk scalars copied once) computes every row's sums as one head a CTA
    does: outputs, pools and counts bitwise equal (compiled: within an ulp) over the steps of
    `mosaic_tiling_run` (folds included), across two groups and a ragged P tile; no data
    races."""
    # two groups of two heads, P = 80 (a 64-row and a ragged 16-row tile), N in four chunks
    # (the write-back's buffers reused)
    dims = dict(H=4, G=2, P=80, N=64)
    assert_runs_equal(*(mosaic_tiling_run(Mamba2, dims, op, "heads", h, interpret, BF16)
                        for h in (1, 2)), interpret)
    assert not mosaic_races_found(interpret)


@pytest.mark.parametrize("readout, heads", [("fma", 2), ("fma_rows", 2), ("fma", 1)],
                         ids=["fma", "fma_rows", "fma-one-head"])
def test_mosaic_128_row_tiles_compute_the_64_row_sums(readout, heads, interpret):
    """tile_rows=128 (replay decode): at P = 80 one CTA a head's 80 rows (the 48 past P read
    as zeros by the TMA box, and neither stored nor appended), where 64-row tiles take a CTA
    for 64 rows and one for the ragged 16: outputs, pools and counts as the 64-row tiles'
    (bitwise in the interpreter; "fma_rows" sums a row's columns in another order at 64 rows,
    two lanes a row, so within 1e-6; compiled within an ulp) over two fold cycles, two heads a
    CTA across two groups or one (the default at ragged P > 64), the padding row's output zero;
    no data races. At P = 64 the bound leaves 64-row tiles."""
    dims = dict(H=4, G=2, P=80, N=64)
    assert_runs_equal(*(mosaic_tiling_run(Mamba2, dims, "replay_decode", "tile_rows", r,
                                          interpret, BF16, readout=readout, heads=heads)
                        for r in (64, 128)), interpret,
                      interpret_rtol=0.0 if readout == "fma" else 1e-6)
    assert not mosaic_races_found(interpret)
    tiles = mamba2.pallas_mosaic_gpu._tiles(
        dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, tile_rows=128),
        mamba2.MOSAIC_REPLAY_TILING, 64, F32, fold=True, P=64)
    assert tiles["tile_rows"] == 64


def test_mosaic_ragged_p_replay_takes_128_row_tiles_by_default():
    """Where 64 does not divide P > 64 the Mosaic replay decode's default covers a head's P
    rows in one 128-row tile, one head a CTA; whole 64-row tiles, P <= 64 and a tiling given
    by the caller are left as they are."""
    m = mamba2.pallas_mosaic_gpu
    for P in (80, 96, 112):
        t = m.for_shape(mamba2.MOSAIC_REPLAY_TILING, P)
        assert (t.tile_rows, t.heads) == (128, 1)
        assert m._tiles(None, t, 128, F32, fold=True, P=P)["tile_rows"] == 128
    for P in (32, 48, 64, 128, 192):
        assert m.for_shape(mamba2.MOSAIC_REPLAY_TILING, P) is mamba2.MOSAIC_REPLAY_TILING
    mine = dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, num_stages=3)
    assert m.for_shape(mine, 80) is mine


@pytest.mark.parametrize("act", [F32, BF16], ids=["fp32-inputs", "bf16-inputs"])
def test_mosaic_rows_readout_computes_the_fma_sums(act, interpret):
    """The Mosaic replay decode's readout "fma_rows" (a thread a row of each chunk, C as an
    fp32 copy for bf16 inputs, the row sums after the stream) gives the WGMMA layout's S0 C:
    outputs (bf16 ones to their ulp) and pools within 1e-5 relative over two fold cycles, two
    heads a CTA over a 64-row and a ragged 16-row P tile (P = 80), the padding row's output
    zero; no data races."""
    dims = dict(H=4, G=2, P=80, N=64, act=act)
    (outs, bufs, counts), (outs_r, bufs_r, counts_r) = (
        mosaic_tiling_run(Mamba2, dims, "replay_decode", "readout", r, interpret, BF16)
        for r in ("fma", "fma_rows"))
    out_tol = 1e-5 if act == F32 else 2.0 ** -8
    assert all(same_sums(a, b, out_tol) for a, b in zip(outs, outs_r, strict=True))
    assert all(same_sums(a, b, 1e-5) for a, b in zip(bufs, bufs_r, strict=True))
    assert bitwise_equal(counts, counts_r)
    assert not mosaic_races_found(interpret)


def test_mosaic_readout_is_checked():
    """The Mosaic replay decode's readout is "fma" or "fma_rows"; another is named, and so is
    "fma_rows" on a bf16 state (its 64-row tiles take a float32 one), before any tracing."""
    pb = Mamba2(1, H=2, G=2, P=64, N=64)
    with pytest.raises(ValueError, match=r"^readout must be one of 'fma', 'fma_rows', got "
                                         r"'mma'$"):
        mamba2.replay_decode(**_valid_args(pb, L=4), impl="pallas_mosaic_gpu",
                             tiling=mamba2.Mamba2MosaicTiling(block_n=16, readout="mma"))
    args = _valid_args(pb, L=4)
    args["buffers"] = args["buffers"]._replace(
        checkpoint=args["buffers"].checkpoint.astype(BF16))
    with pytest.raises(ValueError, match=r"^readout 'fma_rows' at 64-row tiles needs a float32 "
                                         r"state, got bfloat16$"):
        mamba2.replay_decode(**args, impl="pallas_mosaic_gpu",
                             tiling=mamba2.Mamba2MosaicTiling(block_n=16, readout="fma_rows"))


def test_mosaic_heads_are_checked():
    """A heads other than 1 / 2 / 4 is named; it is a bound, as block_n: groups of two heads run
    two a CTA at heads=4, a group of one head one."""
    pb = Mamba2(1, H=2, G=2, P=64, N=64)
    with pytest.raises(ValueError, match=r"^heads must be one of 1, 2, 4, got 3$"):
        mamba2.replay_decode(**_valid_args(pb, L=4), impl="pallas_mosaic_gpu",
                             tiling=mamba2.Mamba2MosaicTiling(block_n=16, heads=3))
    tiling = mamba2.Mamba2MosaicTiling(block_n=16, heads=4)
    for per_group, heads in ((2, 2), (1, 1), (8, 4)):
        tiles = mamba2.pallas_mosaic_gpu._tiles(tiling, mamba2.MOSAIC_REPLAY_TILING, 64, F32,
                                                heads_per_group=per_group)
        assert tiles["heads"] == heads
