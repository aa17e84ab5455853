"""impl="auto": which backend runs an op, on CPU, on a GPU, and on Hopper (sm90) where the
Mosaic GPU kernels are the measured choice for the shapes they take; and which tiling the
Triton kernels run with tiling=None at a shape and batch."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import attention, conv, dispatch, gdn, mamba2, moe
from pallas_kernels.gdn import api as gdn_api
from pallas_kernels.mamba2 import api as mamba2_api
from pallas_kernels.validation import ZERO_FIELDS, resolve_tiling

F32, BF16 = jnp.float32, jnp.bfloat16


def _arr(shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _mamba2_args(op, P=64, N=128, state=F32, T=4, batch=32):
    lead = (batch, T) if op == "replay_verify" else (batch,)
    x, B = _arr(lead + (8, P)), _arr(lead + (2, N))
    pool = _arr((5, 8, P, N), state)
    head = (pool,) if op == "standard_decode" else (types.SimpleNamespace(checkpoint=pool), None)
    return head + (x, B)


def _gdn_args(op, K=128, V=128, state=F32, T=4, batch=32):
    lead = (batch, T) if op == "replay_verify" else (batch,)
    q, k, v = _arr(lead + (2, K)), _arr(lead + (2, K)), _arr(lead + (4, V))
    pool = _arr((5, 4, V, K), state)
    head = (pool,) if op == "standard_decode" else (types.SimpleNamespace(checkpoint=pool), None)
    return head + (q, k, v)


@pytest.fixture
def device(monkeypatch):
    """device(gpu, hopper): pretend the default device is (not) a GPU, (not) an sm90 one."""
    def pretend(gpu, hopper):
        monkeypatch.setattr(dispatch, "on_gpu", lambda: gpu)
        monkeypatch.setattr(dispatch, "on_hopper", lambda: hopper)
    return pretend


MAMBA2_OPS = ("standard_decode", "replay_decode", "replay_verify")


@pytest.mark.parametrize("op", ["replay_decode", "replay_verify"])
def test_auto_runs_mosaic_on_hopper_only(device, op):
    args = _mamba2_args(op)
    for (gpu, hopper), want in (((False, False), "xla"), ((True, False), "pallas_triton"),
                                ((True, True), "pallas_mosaic_gpu")):
        device(gpu, hopper)
        assert mamba2_api._OPS[op].backend(args) == want
    assert mamba2_api._OPS[op].backend(args, impl="pallas") == "pallas_triton"
    assert mamba2_api._OPS[op].backend(args, impl="xla") == "xla"


@pytest.mark.parametrize("batch,want", [(1, "pallas_triton"), (15, "pallas_triton"),
                                        (16, "pallas_mosaic_gpu"), (256, "pallas_mosaic_gpu")])
def test_auto_keeps_triton_replay_at_small_batch(device, batch, want):
    """Mamba-2's Mosaic replay decode launches two XLA einsums before its kernel, a fixed cost
    that loses to the Triton replay below 16 rows on the H200; verify stays Mosaic."""
    device(True, True)
    assert mamba2_api._OPS["replay_decode"].backend(
        _mamba2_args("replay_decode", batch=batch)) == want
    assert mamba2_api._OPS["replay_verify"].backend(
        _mamba2_args("replay_verify", batch=batch)) == "pallas_mosaic_gpu"


@pytest.mark.parametrize("op,batch,want", [
    ("standard_decode", 1, "pallas_triton"), ("standard_decode", 8, "pallas_triton"),
    ("standard_decode", 9, "pallas_mosaic_gpu"), ("standard_decode", 256, "pallas_mosaic_gpu"),
    ("replay_decode", 1, "pallas_triton"), ("replay_decode", 15, "pallas_triton"),
    ("replay_decode", 16, "pallas_mosaic_gpu"), ("replay_decode", 256, "pallas_mosaic_gpu")])
def test_auto_keeps_triton_gdn_decode_at_small_batch(device, op, batch, want):
    """GDN's Triton decode kernels beat the Mosaic ones on the H200 at a few rows (standard up
    to 8: 2.9 vs 3.8 us at one row, on its small-batch tiles; replay 3.4 vs 5.9 us at one row,
    10.2 vs 12.3 at 8; the Mosaic replay wins from 32 rows: 30.1 vs 33.0)."""
    device(True, True)
    assert gdn_api._OPS[op].backend(_gdn_args(op, batch=batch)) == want


def test_triton_kernels_take_their_small_batch_tiles_at_one_row():
    """A few rows a step fill few SMs: the replay (and GDN's standard) kernels take smaller
    tiles up to where they won (Mamba-2: one row, GDN: four), their batch-256 tiles after;
    Mamba-2's P = 80 masks the small tile. The replays fetch every ring row at one row (GDN: up
    to two, with its key chunks unrolled)."""
    t = mamba2.pallas_triton
    small = t.for_shape(t.REPLAY_TILING, 64, 1)
    assert (small.block_p, small.num_warps, small.p_tiles, small.ring_loads) == (
        32, 4, "divide", "all")
    assert t.for_shape(t.REPLAY_TILING, 64, 2) == t.REPLAY_TILING
    assert t.for_shape(t.REPLAY_TILING, 80, 1).p_tiles == "masked"
    assert t.for_shape(t.REPLAY_TILING, 80, 2).block_p == 128             # the P = 80 tile
    assert t.for_shape(t.STANDARD_TILING, 64, 1) == t.STANDARD_TILING
    g = gdn.pallas_triton
    assert g.for_shape(g.STANDARD_TILING, 4).block_v == 16
    for rows, loads, loop in [(1, "all", "unrolled"), (2, "all", "unrolled"),
                              (3, "committed", "fori"), (4, "committed", "fori")]:
        r = g.for_shape(g.REPLAY_TILING, rows)
        assert (r.block_v, r.ring_loads, r.chunk_loop) == (32, loads, loop)
    assert g.for_shape(g.STANDARD_TILING, 5) == g.STANDARD_TILING
    assert g.for_shape(g.REPLAY_TILING, 5) == g.REPLAY_TILING


def test_mosaic_gdn_replay_keeps_more_chunks_in_flight_up_to_64_rows(monkeypatch):
    """The Mosaic GDN replay's default runs 4 stages up to 64 rows (18.8 / 30.3 / 52.6 vs 20.6
    / 33.4 / 54.8 us at 16 / 32 / 64 on the H200), 3 after (177.9 vs 184.2 at 256), and the
    ring whole with XLA's key products there (what the blocks and the launch save pays from
    128 rows only); a tiling passed in is run as given at every batch."""
    m = gdn.pallas_mosaic_gpu
    small = m.for_shape(m.MOSAIC_REPLAY_TILING, 64)
    assert (small.num_stages, small.ring_block, small.key_products) == (4, 0, "xla")
    assert m.for_shape(m.MOSAIC_REPLAY_TILING, 65) == m.MOSAIC_REPLAY_TILING
    assert m.for_shape(m.MOSAIC_STANDARD_TILING, 1) == m.MOSAIC_STANDARD_TILING
    seen = []
    monkeypatch.setattr(m, "_replay_decode", lambda *a, num_stages, **kw: seen.append(num_stages))
    for batch in (64, 65):
        args = _gdn_args("replay_decode", batch=batch)
        m.replay_decode(*args, None, None, None, tiling=None, interpret=True)
        m.replay_decode(*args, None, None, None, tiling=m.MOSAIC_REPLAY_TILING, interpret=True)
    assert seen == [4, 3, 3, 3]


@pytest.mark.parametrize("T", [2, 4, 5, 8])
def test_auto_takes_the_mosaic_verify_at_every_window(device, T):
    """Both families' Mosaic verify beat Triton's at every window on the H200 (Mamba-2 at
    batch 256, two heads a CTA: T = 8 1,163.6 vs 1,254.5 us, T = 4 523.8 vs 588.5; T = 2 372
    vs 383 with one head)."""
    device(True, True)
    assert mamba2_api._OPS["replay_verify"].backend(_mamba2_args("replay_verify", T=T)) == (
        "pallas_mosaic_gpu")
    assert gdn_api._OPS["replay_verify"].backend(_gdn_args("replay_verify", T=T)) == (
        "pallas_mosaic_gpu")


@pytest.mark.parametrize("op", MAMBA2_OPS)
@pytest.mark.parametrize("shape", [dict(P=80), dict(N=512), dict(N=8, state=BF16)])
def test_auto_keeps_triton_for_shapes_mosaic_does_not_take(device, op, shape):
    """At 16 rows: d_state past one TMA box, bf16 chunk rows under 32 bytes; P = 80
    (Nemotron-Nano-9B-v2, a ragged last P tile), where Mosaic lost on the H200 (replay decode
    below 32 rows, standard decode, verify at this batch); GDN's value dim at 80 (no model has
    it, not measured)."""
    device(True, True)
    assert mamba2_api._OPS[op].backend(_mamba2_args(op, batch=16, **shape)) == "pallas_triton"
    assert gdn_api._OPS[op].backend(_gdn_args(op, V=80)) == "pallas_triton"


@pytest.mark.parametrize("P,T,batch,want", [
    (80, 4, 128, "pallas_mosaic_gpu"), (80, 4, 64, "pallas_triton"),
    (80, 2, 256, "pallas_mosaic_gpu"), (80, 2, 128, "pallas_triton"),
    (80, 8, 256, "pallas_triton"), (72, 4, 256, "pallas_mosaic_gpu"),
    (68, 4, 256, "pallas_triton")])
def test_auto_takes_the_mosaic_verify_at_a_ragged_p_tile(device, P, T, batch, want):
    """At P = 80 Mamba-2's Mosaic verify beat Triton from 128 rows at T = 4 (1.95x the
    baseline vs 1.54x at 256) and at 256 at T = 2, and lost below: `auto` takes it at ragged
    P tiles there, up to T = 4 (longer windows not measured there), where the ragged tile's
    rows fill whole 16-byte bf16 stores (P % 64 a multiple of 8)."""
    device(True, True)
    args = _mamba2_args("replay_verify", P=P, T=T, batch=batch)
    assert mamba2_api._OPS["replay_verify"].backend(args) == want


@pytest.mark.parametrize("batch,want", [(32, "pallas_mosaic_gpu"), (256, "pallas_mosaic_gpu"),
                                        (16, "pallas_triton")])
def test_auto_takes_the_mosaic_replay_at_p80_from_32_rows(device, batch, want):
    """At P = 80 the Mosaic replay decode (two heads a CTA) beat Triton's from 32 rows on the
    H200 (65.3 vs 69.4 us at 32, 436.7 vs 485.7 at 256) and lost at 8 (23.5 vs 21.3)."""
    device(True, True)
    args = _mamba2_args("replay_decode", P=80, batch=batch)
    assert mamba2_api._OPS["replay_decode"].backend(args) == want


def test_auto_with_a_tiling_stays_on_its_backend(device):
    device(True, True)
    args = _mamba2_args("replay_decode")
    assert mamba2_api._OPS["replay_decode"].backend(args, tiling=object()) == "pallas_triton"


def test_auto_follows_the_measured_choice_per_op(device):
    """The Mosaic kernels that won on the H200: all of GDN's (its replay decode since the lean
    fold: the Qwen3.5-9B step 13.73 vs 13.99 ms), Mamba-2's replay decode and verify (its
    standard decode lost to Triton launched row-slowest); the state-per-draft baseline has no
    Mosaic kernel."""
    device(True, True)
    backend = {op: gdn_api._OPS[op].backend(_gdn_args(op)) for op in MAMBA2_OPS}
    assert backend == {"standard_decode": "pallas_mosaic_gpu",
                       "replay_decode": "pallas_mosaic_gpu", "replay_verify": "pallas_mosaic_gpu"}
    backend = {op: mamba2_api._OPS[op].backend(_mamba2_args(op)) for op in MAMBA2_OPS}
    assert backend == {"standard_decode": "pallas_triton", "replay_decode": "pallas_mosaic_gpu",
                       "replay_verify": "pallas_mosaic_gpu"}
    assert gdn_api._OPS["standard_decode"].backend(_gdn_args("standard_decode", V=32)) == (
        "pallas_triton")
    device(True, True)
    assert mamba2_api._OPS["standard_verify"].backend(_mamba2_args("standard_decode")) == (
        "pallas_triton")


# Every tiling dataclass's measured default (Triton and Mosaic GPU, every family).
ALL_TILINGS = {
    "mamba2-standard": mamba2.STANDARD_TILING, "mamba2-replay": mamba2.REPLAY_TILING,
    "mamba2-mosaic": mamba2.MOSAIC_REPLAY_TILING, "gdn-standard": gdn.STANDARD_TILING,
    "gdn-replay": gdn.REPLAY_TILING, "gdn-verify": gdn.VERIFY_TILING,
    "gdn-mosaic": gdn.MOSAIC_REPLAY_TILING, "attention": attention.TILING, "conv": conv.TILING,
    "moe": moe.TILING, "moe-pairs": moe.pairs.TILING, "router": moe.router.TILING}


@pytest.mark.parametrize("name", list(ALL_TILINGS))
def test_every_tiling_takes_the_integer_field_rule(name):
    """One rule (`validation.check_tiling_fields`, run by `resolve_tiling`) for every tiling:
    integer fields are integers (not bools or floats), >= 1, or >= 0 for ZERO_FIELDS;
    num_warps a power of two. The defaults pass it."""
    default = ALL_TILINGS[name]
    assert resolve_tiling(default, default) is default
    ints = [f.name for f in dataclasses.fields(default) if f.type == "int"]
    assert ints
    for field in ints:
        low = 0 if field in ZERO_FIELDS else 1
        for bad, match in ((low - 1, f"must be >= {low}"), (2.0, "must be an integer"),
                           (True, "must be an integer"), ("4", "must be an integer")):
            with pytest.raises(ValueError, match=rf"^{field} = {bad!r} {match}"):
                resolve_tiling(dataclasses.replace(default, **{field: bad}), default)
    if "num_warps" in ints:
        with pytest.raises(ValueError, match=r"^num_warps = 6 must be a power of two$"):
            resolve_tiling(dataclasses.replace(default, num_warps=6), default)
        assert resolve_tiling(dataclasses.replace(default, num_warps=np.int64(8)), default)
