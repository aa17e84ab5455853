"""GDN-only kernel cases: input validation and the drift of a bf16 ring (the shared numerics are
in test_decode.py and test_verify.py).

A bf16 ring rounds the cached corrected update d (and k) to bf16, an error the standard step never
makes: measured, reported and bounded here (3e-2 over 4096 steps).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gdn
from pallas_kernels._mosaic_utils import resolve_tiles
from pallas_kernels.ring import NULL_SLOT
from pallas_kernels.validation import for_window
from tests.pallas_kernels.families import (
    BF16,
    F32,
    GDN,
    IMPLS,
    MOSAIC,
    long_run,
    mosaic_tiling_run,
)
from tests.pallas_kernels.helpers import assert_runs_equal, impl_kw, mosaic_races_found, same_sums


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_ring_drift_is_bounded(impl, interpret):
    """The drift the bf16 ring's documented bound covers (4096 steps; a quarter of them for
    kernels in interpret mode, as in test_decode's long run)."""
    steps = GDN.LONG_STEPS // (4 if impl != "xla" and interpret else 1)
    worst_out, worst_ck, _ = long_run(GDN, impl_kw(impl, interpret), BF16, n_steps=steps)
    print(f"\nGDN {steps}-step max relative deviation, bf16 ring ({impl}): "
          f"o {worst_out:.2e}, checkpoint {worst_ck:.2e}")
    assert worst_out < 3e-2 and worst_ck < 3e-2


def _valid_args(pb, L=16):
    q, k, v, g, beta = pb.step_inputs(2)
    return dict(buffers=pb.init_buffers(L), counts=jnp.zeros((pb.S,), jnp.int32), q=q, k=k, v=v,
                g=g, beta=beta, slots=jnp.asarray([1, 2], jnp.int32))


@pytest.mark.parametrize("change,match", [
    (lambda a, pb: a.update(v=a["v"][:, :3]), r"value heads \(3\) must be a multiple of key heads"),
    (lambda a, pb: a.update(g=a["g"].astype(BF16)), r"g has dtype bfloat16"),
    (lambda a, pb: a.update(k=a["k"][:, :, :8]), r"k has shape"),
    (lambda a, pb: a.update(slots=a["slots"][:1]), r"slots has shape"),
    (lambda a, pb: a.update(buffers=pb.init_buffers(6)), r"window L = 6 must be a power of two"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(ring_g=a["buffers"].ring_g.astype(BF16))),
     r"ring_g has dtype bfloat16"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(ring_d=a["buffers"].ring_d.astype(BF16))),
     r"ring_d has dtype bfloat16"),
])
def test_replay_decode_rejects_bad_input(change, match):
    pb = GDN(1)
    args = _valid_args(pb)
    change(args, pb)
    with pytest.raises(ValueError, match=match):
        gdn.replay_decode(**args, impl="pallas")


def test_bad_tiles_are_named():
    pb = GDN(1, K=24)
    with pytest.raises(ValueError, match=r"key dim K = 24 must be a power of two"):
        gdn.standard_decode(pb.random_state(), *pb.step_inputs(2), jnp.asarray([1, 2], jnp.int32),
                            impl="pallas")
    args = _valid_args(GDN(1))
    with pytest.raises(ValueError, match=r"block_v = 24 must be a power of two"):
        gdn.replay_decode(**args, impl="pallas", tiling=GDN(1).tiling("replay", block_v=24))
    with pytest.raises(ValueError, match=r"fold=.dot. needs L and the tiles >= 16"):
        gdn.replay_decode(**args, impl="pallas",
                          tiling=GDN(1).tiling("replay", block_k=8, fold="dot"))
    with pytest.raises(ValueError, match=r"ring_scalars must be one of 'kernel', 'xla', got 'gpu'"):
        gdn.replay_decode(**args, impl="pallas", tiling=GDN(1).tiling("replay", ring_scalars="gpu"))
    with pytest.raises(ValueError, match=r"chunk_loop must be one of 'fori', 'unrolled', got 'x'"):
        gdn.replay_decode(**args, impl="pallas", tiling=GDN(1).tiling("replay", chunk_loop="x"))
    with pytest.raises(ValueError, match=r"ring_loads must be one of 'committed', 'all', got 'x'"):
        gdn.replay_decode(**args, impl="pallas", tiling=GDN(1).tiling("replay", ring_loads="x"))
    with pytest.raises(ValueError, match=r"state_eviction must be one of 'evict_normal', "):
        gdn.replay_decode(**args, impl="pallas",
                          tiling=GDN(1).tiling("replay", state_eviction="first"))
    bad_order = (r"grid_order must be one of 'row_fastest', 'row_slowest', 'head_slowest', "
                 r"got 'head_fastest'")
    with pytest.raises(ValueError, match=bad_order):
        gdn.replay_decode(**args, impl="pallas",
                          tiling=GDN(1).tiling("replay", grid_order="head_fastest"))
    pb = GDN(1)
    with pytest.raises(ValueError, match=bad_order):                  # the baseline's too
        gdn.standard_decode(pb.random_state(), *pb.step_inputs(2), jnp.asarray([1, 2], jnp.int32),
                            impl="pallas", tiling=pb.tiling("standard", grid_order="head_fastest"))


@pytest.mark.parametrize("kind,fields,match", [
    ("standard", dict(num_warps=6), r"^num_warps = 6 must be a power of two$"),
    ("standard", dict(block_v=0), r"^block_v = 0 must be >= 1$"),
    ("replay", dict(num_stages=-1), r"^num_stages = -1 must be >= 1$"),
    ("replay", dict(block_k=16.0), r"^block_k = 16.0 must be an integer >= 1$"),
    ("verify", dict(block_k_long=True), r"^block_k_long = True must be an integer >= 1$"),
])
def test_bad_tiling_integers_are_named(kind, fields, match):
    """Every Triton tiling's integer fields (`validation.check_tiling_fields`: integers >= 1,
    num_warps a power of two), before any kernel runs."""
    pb = GDN(1)
    args = _valid_args(pb)
    tiling = pb.tiling(kind, **fields)
    with pytest.raises(ValueError, match=match):
        if kind == "standard":
            gdn.standard_decode(pb.random_state(), *pb.step_inputs(2), args["slots"],
                                impl="pallas", tiling=tiling)
        elif kind == "replay":
            gdn.replay_decode(**args, impl="pallas", tiling=tiling)
        else:
            gdn.replay_verify(args["buffers"], args["counts"], *pb.window_inputs(2, b=2),
                              args["slots"], impl="pallas", tiling=tiling)


@pytest.mark.parametrize("K,V,tiling,match", [
    (512, 64, None, r"pallas_mosaic_gpu needs key dim K <= 256, got K = 512"),
    (16, 64, gdn.GDNMosaicTiling(block_k=48), r"block_k = 48 must be a power of two"),
    (4, 64, None, r"key dim K = 4 has no power-of-two tile >= 8"),
    (16, 64, gdn.STANDARD_TILING, r"tiling must be a GDNMosaicTiling, got GDNTiling"),
    (16, 64, gdn.GDNMosaicTiling(block_k=16, num_stages=0), r"num_stages = 0 must be >= 1"),
])
def test_mosaic_shapes_and_tilings_are_named(K, V, tiling, match):
    pb = GDN(1, Hk=1, Hv=1, K=K, V=V)
    args = _valid_args(pb)
    with pytest.raises(ValueError, match=match):
        gdn.standard_decode(pb.random_state(), *pb.step_inputs(2), args["slots"],
                            impl="pallas_mosaic_gpu", tiling=tiling)
    with pytest.raises(ValueError, match=match):
        gdn.replay_decode(**args, impl="pallas_mosaic_gpu", tiling=tiling)


def test_bad_mosaic_prologue_is_named():
    """A prologue other than "serial" / "overlap" / "fused" is named by replay decode and verify
    (the kernels that take it) and by the standard decode (same tiling), before any kernel
    runs."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=64)
    args = _valid_args(pb, L=4)
    kw = dict(impl="pallas_mosaic_gpu", tiling=gdn.GDNMosaicTiling(block_k=16, prologue="early"))
    match = r"^prologue must be one of 'serial', 'overlap', 'fused', got 'early'$"
    with pytest.raises(ValueError, match=match):
        gdn.replay_decode(**args, **kw)
    with pytest.raises(ValueError, match=match):
        gdn.replay_verify(args["buffers"], args["counts"], *pb.window_inputs(2, b=2),
                          args["slots"], **kw)
    with pytest.raises(ValueError, match=match):
        gdn.standard_decode(pb.random_state(), *pb.step_inputs(2), args["slots"], **kw)


@pytest.mark.parametrize("fields,match", [
    (dict(fold_stages=-1), r"^fold_stages = -1 must be >= 0 \(0: num_stages\)$"),
    (dict(fold_buffers=3), r"^fold_buffers = 3 must be 1 or 2$"),
    (dict(ring_block=-1), r"^ring_block = -1 must be >= 0 \(0: the whole ring\)$"),
    (dict(tile_rows=64.0), r"^tile_rows = 64.0 must be an integer >= 1$"),
    (dict(key_products="cuda"),
     r"^key_products must be one of 'xla', 'pallas'(, 'kernel')?, got 'cuda'$")])
def test_bad_mosaic_replay_tiles_are_named(fields, match):
    """The Mosaic replay's fold knobs and its key products' maker are checked by replay decode
    and verify before any kernel runs."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=64)
    args = _valid_args(pb, L=4)
    kw = dict(impl="pallas_mosaic_gpu", tiling=gdn.GDNMosaicTiling(block_k=16, **fields))
    with pytest.raises(ValueError, match=match):
        gdn.replay_decode(**args, **kw)
    with pytest.raises(ValueError, match=match):
        gdn.replay_verify(args["buffers"], args["counts"], *pb.window_inputs(2, b=2),
                          args["slots"], **kw)


@pytest.mark.parametrize("fields,L,ring_dtype,match", [
    (dict(readout="fma"), 16, F32, r"^key_products = 'kernel' needs readout = 'mma' \(its "
                                   r"wgmmas read the window's operands\), got 'fma'$"),
    (dict(), 16, BF16, r"^key_products = 'kernel' needs a float32 ring, got bfloat16$"),
    (dict(), 4, F32, r"^key_products = 'kernel' needs a ring window L divisible by 8, got 4$"),
    (dict(block_k=8), 16, F32, r"^key_products = 'kernel' copies the keys in K // block_k = "
                               r"16 chunks: 39 copies at T = 2, more than a barrier group's "
                               r"32$")])
def test_kernel_key_products_that_cannot_run_are_named(fields, L, ring_dtype, match):
    """key_products = "kernel" (the verify's wgmmas form its key products) needs the "mma"
    readout, an fp32 ring of whole 8-row blocks and few enough key chunks: an explicit tiling
    that asks otherwise is named before any kernel runs."""
    pb = GDN(1, Hk=1, Hv=1, K=128, V=64)
    args = _valid_args(pb, L=L)
    tiling = gdn.GDNMosaicTiling(**{"block_k": 16, "readout": "mma", **fields},
                                 key_products="kernel")
    with pytest.raises(ValueError, match=match):
        gdn.replay_verify(pb.init_buffers(L, ring_dtype), args["counts"],
                          *pb.window_inputs(2, b=2), args["slots"], impl="pallas_mosaic_gpu",
                          tiling=tiling)


def test_kernel_key_products_are_the_verifys():
    """The decodes take their key products from XLA or the launch: "kernel" is named there."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=64)
    tiling = gdn.GDNMosaicTiling(block_k=16, readout="mma", key_products="kernel")
    with pytest.raises(ValueError, match=r"^key_products must be one of 'xla', 'pallas', got "
                                         r"'kernel'$"):
        gdn.replay_decode(**_valid_args(pb), impl="pallas_mosaic_gpu", tiling=tiling)


@pytest.mark.parametrize("state_dtype,ring_dtype", [(BF16, F32), (F32, BF16)],
                         ids=["bf16-state", "bf16-ring"])
def test_default_verify_takes_the_launch_where_kernel_products_cannot_run(state_dtype,
                                                                        ring_dtype, interpret):
    """The default verify tiling of a long window forms its key products in the kernel, which
    needs an fp32 state (the "mma" readout; a default reads others by FMAs) and an fp32 ring:
    elsewhere the default runs with the launch's products, equal to an explicit tiling's with
    them."""
    T = 8
    default = for_window(gdn.MOSAIC_VERIFY_TILINGS, T)
    assert default.key_products == "kernel"
    pb = GDN(3, batch=2, Hk=1, Hv=1, K=64, V=64)
    bufs, counts, _ = pb.make_replay_state(16, state_dtype, ring_dtype)
    inputs = pb.window_inputs(T)
    slots = jnp.asarray([1, 2], jnp.int32)
    runs = [gdn.replay_verify(bufs, counts, *inputs, slots, impl="pallas_mosaic_gpu",
                              tiling=tiling, interpret=interpret)
            for tiling in (None, dataclasses.replace(
                default, key_products="pallas", readout="mma" if state_dtype == F32 else "fma"))]
    for a, b in zip(*(jax.tree.leaves(r) for r in runs)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_mosaic_bf16_state_needs_chunk_rows_of_32_bytes():
    """Mosaic GPU swizzles 32, 64 or 128 bytes: a bf16 chunk of 8 (16 bytes) is refused."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=64)
    args = _valid_args(pb)
    args["buffers"] = args["buffers"]._replace(
        checkpoint=args["buffers"].checkpoint.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"state chunk rows of >= 32 bytes: block_k = 8 of a "
                                         r"bfloat16 state is 16"):
        gdn.replay_decode(**args, impl="pallas_mosaic_gpu",
                          tiling=gdn.GDNMosaicTiling(block_k=8))


def test_an_op_without_mosaic_kernel_is_named():
    pb = GDN(1, V=64)
    with pytest.raises(ValueError, match=r"gdn.standard_verify has no pallas_mosaic_gpu"):
        gdn.standard_verify(pb.random_state(), *pb.window_inputs(2, 2),
                            jnp.asarray([1, 2], jnp.int32),
                            jnp.asarray([[3, 4], [5, 6]], jnp.int32),
                            impl="pallas_mosaic_gpu")


@pytest.mark.parametrize("options", [dict(grid_order="head_slowest"), dict(chunk_loop="unrolled"),
                                     dict(grid_order="head_slowest", chunk_loop="unrolled")],
                         ids=["head-slowest", "unrolled", "both"])
def test_replay_launch_options_compute_the_same_sums(options, interpret):
    """The ReplaySSM-authors-style launch options only reorder programs / loads: outputs, pools
    and counts equal the default tiling's bitwise (compiled: within an ulp) over two fold cycles,
    on a grid whose axes all differ in size (batch 3, Hv 4, two V tiles of 8; two K chunks),
    with a padding row and NaN ring entries past the counts."""
    L, runs = 4, []
    for opts in ({}, options):
        pb = GDN(7, batch=3, Hk=2, Hv=4, K=32, V=16)
        bufs, counts, _ = pb.make_replay_state(L, jnp.float32, jnp.float32)
        slots = jnp.asarray([5, NULL_SLOT, 1], jnp.int32)
        tiling = pb.tiling("replay", block_v=8, block_k=16, **opts)
        outs = []
        for _ in range(2 * L):
            out, bufs = gdn.replay_decode(bufs, counts, *pb.step_inputs(), slots,
                                          **impl_kw("pallas", interpret, tiling))
            counts = gdn.advance_counts(counts, slots, L)
            outs.append(out)
        runs.append((outs, bufs, counts))
    assert all(np.isfinite(o).all() and (np.asarray(o)[1] == 0).all() for o in runs[0][0])
    assert_runs_equal(*runs, interpret)


def test_mosaic_ragged_tile_rows_must_fill_16_bytes():
    """A ragged V tile's vector stores copy its V % 64 rows only (`_mosaic_utils.store_rows`):
    V = 66 leaves 2 rows, under one 16-byte TMA unit, and is refused naming them."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=66)
    with pytest.raises(ValueError, match=r"ragged tile's rows in multiples of 16 bytes: "
                                         r"66 % 64 = 2 rows of \w+ are \d+ bytes"):
        gdn.replay_decode(**_valid_args(pb), impl="pallas_mosaic_gpu")


@pytest.mark.parametrize("op", ["standard_decode", "replay_decode", "replay_verify"])
def test_mosaic_128_row_tiles_compute_the_64_row_sums(op, interpret):
    """tile_rows=128 (one CTA over two WGMMA tiles of V rows) computes every row's sums as the
    64-row tiles do: outputs, pools and counts equal to an ulp (relative error <= 1e-7; XLA:CPU
    vectorises the interpreter's [128, n] and [64, n] sums differently on some CPUs: an AMD
    EPYC's verify outputs differed by 2e-8) over the steps of `mosaic_tiling_run` (folds
    included); no data races."""
    # V = 256: two 128-row tiles, four 64-row ones; two value heads on one key head
    dims = dict(Hk=1, Hv=2, K=32, V=256)
    assert_runs_equal(*(mosaic_tiling_run(GDN, dims, op, "tile_rows", r, interpret, F32)
                        for r in (64, 128)), interpret, interpret_rtol=1e-7)
    assert not mosaic_races_found(interpret)


@pytest.mark.parametrize("act", [F32, BF16], ids=["fp32-inputs", "bf16-inputs"])
@pytest.mark.parametrize("op,V", [("replay_decode", 128), ("replay_verify", 128),
                                  ("replay_decode", 64)])
def test_mosaic_readouts_compute_the_fma_sums(op, V, act, interpret):
    """readout="mma" (tf32 wgmmas of each checkpoint chunk's high and low parts against all the
    keys and queries), "fma_deferred" (the FMAs' column sums after the stream) and "fma_rows"
    (a thread a row: 128-row tiles, and 64-row ones at V = 64, whose rows take two lanes each;
    that case against "fma" only) give the FMA readout's results to fp32 rounding: every
    step's outputs and the final pools within 1e-5 relative over `mosaic_tiling_run`'s steps,
    folds included (four key chunks; reading the high part only is ~1e-3 off), no data races;
    inputs in fp32 (their low parts are operands too) and bf16 (exact in tf32; "fma_rows"
    converts them to fp32 copies first).
    Outputs take the inputs' dtype: bf16 ones may round a sum that moved by 2^-21 to the
    neighbouring bf16 value (compiled, the H100 did), so they are held to bf16's ulp, 2^-8; the
    fp32 pools (checkpoint and ring d) still hold the 1e-5."""
    dims = dict(Hk=1, Hv=2, K=128, V=V, act=act)
    readouts = ("fma", "mma", "fma_deferred", "fma_rows") if V == 128 else ("fma", "fma_rows")
    (outs, bufs, counts), *others = (
        mosaic_tiling_run(GDN, dims, op, "readout", r, interpret, F32) for r in readouts)
    out_tol = 1e-5 if act == F32 else 2.0 ** -8
    for outs_r, bufs_r, counts_r in others:
        assert all(same_sums(a, b, out_tol) for a, b in zip(outs, outs_r, strict=True))
        assert all(same_sums(a, b, 1e-5) for a, b in zip(bufs, bufs_r, strict=True))
        assert (np.asarray(counts) == np.asarray(counts_r)).all()
    assert not mosaic_races_found(interpret)


@pytest.mark.parametrize("act", [F32, BF16], ids=["fp32-inputs", "bf16-inputs"])
@pytest.mark.parametrize("tile_rows", [64, 128])
def test_mosaic_standard_rows_readout_computes_the_fma_sums(tile_rows, act, interpret):
    """The standard kernel's readout "fma_rows" (a thread a row: its S k, update and S q) gives
    the WGMMA layout's outputs and pool to fp32 rounding (1e-5 relative; bf16 outputs to their
    ulp), at 64-row tiles (two lanes a row) and 128-row ones, fp32 and bf16 q / k (converted
    to fp32 copies first), the padding row's output zero; no data races."""
    dims = dict(Hk=1, Hv=2, K=128, V=128, act=act)
    runs = [mosaic_tiling_run(GDN, dims, "standard_decode", "tile_rows", tile_rows, interpret,
                              F32, readout=r) for r in ("fma", "fma_rows")]
    (outs, pools, _), (outs_r, pools_r, _) = runs
    out_tol = 1e-5 if act == F32 else 2.0 ** -8
    assert all(same_sums(a, b, out_tol) for a, b in zip(outs, outs_r, strict=True))
    assert all(same_sums(a, b, 1e-5) for a, b in zip(pools, pools_r, strict=True))
    assert not mosaic_races_found(interpret)


def test_mosaic_mma_readout_long_run_stays_within_tolerance(interpret):
    """The fp32 long run's bound (test_decode: 5e-5 against the f64 recurrence, 4096 steps;
    64 of them, four folds, in the interpreter: the drift is the compiled run's to show) holds
    with readout="mma"."""
    tiling = dataclasses.replace(gdn.MOSAIC_REPLAY_TILING, readout="mma")
    steps = 64 if interpret else GDN.LONG_STEPS
    worst_out, worst_ck, _ = long_run(GDN, impl_kw(MOSAIC, interpret, tiling), F32,
                                      n_steps=steps)
    print(f"\nGDN {steps}-step max relative deviation, mma readout: o {worst_out:.2e}, "
          f"checkpoint {worst_ck:.2e}")
    assert worst_out < 5e-5 and worst_ck < 5e-5


def test_mosaic_verify_default_reads_non_fp32_states_by_fma():
    """The verify's measured default reads an fp32 checkpoint by tf32 wgmmas ("mma"); a bf16
    one, which "mma" refuses when asked for, gets the FMA readout rather than an error."""
    default = gdn.MOSAIC_VERIFY_TILING
    assert default.readout == "mma"
    for dtype, readout in ((jnp.float32, "mma"), (jnp.bfloat16, "fma")):
        tiles = resolve_tiles(None, default, field="block_k", chunk=("key dim K", 128),
                              max_chunk=256, state_dtype=dtype, readout=True)
        assert tiles["readout"] == readout
    with pytest.raises(ValueError, match=r"readout = 'mma' needs a float32 state"):
        resolve_tiles(default, default, field="block_k", chunk=("key dim K", 128),
                      max_chunk=256, state_dtype=jnp.bfloat16, readout=True)


def test_mosaic_readout_is_checked():
    """An unknown readout, "mma" on a bf16 state (its wgmma would read bf16 operands) and
    "fma_rows" on a bf16 state at 64-row tiles are named."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=64)
    with pytest.raises(ValueError, match=r"^readout must be one of 'fma', 'mma', 'fma_deferred', "
                                         r"'fma_rows', got 'tf32'$"):
        gdn.replay_decode(**_valid_args(pb, L=4), impl=MOSAIC,
                          tiling=gdn.GDNMosaicTiling(block_k=16, readout="tf32"))
    args = _valid_args(pb, L=4)
    args["buffers"] = args["buffers"]._replace(
        checkpoint=args["buffers"].checkpoint.astype(BF16))
    with pytest.raises(ValueError, match=r"readout = 'mma' needs a float32 state, got bfloat16"):
        gdn.replay_decode(**args, impl=MOSAIC,
                          tiling=gdn.GDNMosaicTiling(block_k=16, readout="mma"))
    # "fma_rows" at 64-row tiles (V = 64) takes a float32 state only (`rows_layout`)
    with pytest.raises(ValueError, match=r"^readout 'fma_rows' at 64-row tiles needs a float32 "
                                         r"state, got bfloat16$"):
        gdn.replay_decode(**args, impl=MOSAIC,
                          tiling=gdn.GDNMosaicTiling(block_k=16, readout="fma_rows"))


def test_mosaic_tile_rows_are_checked():
    """A tile_rows other than 64 / 128 is named; 128 is a bound, as block_k: it runs 64-row
    tiles where V is not a multiple of 128 (V = 80: a 64-row and a ragged 16-row tile)."""
    pb = GDN(1, Hk=1, Hv=1, K=64, V=80)
    with pytest.raises(ValueError, match=r"^tile_rows = 96 must be one of \(64, 128\)$"):
        gdn.replay_decode(**_valid_args(pb, L=4), impl="pallas_mosaic_gpu",
                          tiling=gdn.GDNMosaicTiling(block_k=16, tile_rows=96))
    for V, rows in ((80, 64), (256, 128)):
        tiles = gdn.pallas_mosaic_gpu._tiles(None, gdn.MOSAIC_REPLAY_TILING, 64, V, jnp.float32,
                                             fold=True)
        assert tiles["tile_rows"] == rows
