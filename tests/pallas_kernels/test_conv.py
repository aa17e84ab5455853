"""The decode conv over the conv-state slot pool (`pallas_kernels.conv.conv_update`): both
implementations against a float64 loop, the Pallas kernel against the XLA path bit for bit.

Every case draws fresh random inputs: b = 6 rows on random distinct slots (one on the pool's
last slot) and two padding rows on NULL_SLOT. The pool rows of slots no row names are NaN, so a
read of them shows in an output and a write to them shows in the pool; the null slot holds
random finite values (pools are zero-initialised, any value must do), which its rows' outputs
use and which must stay bitwise. The kernel's output starts NaN (the interpreter fills outputs
with NaN), so an unwritten element shows. C = 40 is no multiple of the 16-channel block (the
last block is masked), C = 64 is; the default tiling runs one masked block of the next power of
two.

Tolerances: the pool is a copy (bitwise always); the conv output is the same fp32 sums in the
same order (bitwise interpreted; compiled, FMA contraction may round an ulp apart: 1e-6), and
within 1e-6 of the float64 loop on the rounded inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import conv, dispatch
from pallas_kernels.ring import NULL_SLOT
from tests.pallas_kernels.helpers import bitwise_equal, impl_kw, rel_err, same_sums

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32
S, K, B = 12, 4, 6
BLOCK16 = conv.ConvTiling(block_c=16, num_warps=4)


class Problem:
    """b rows of one token over a conv-state pool [S, K-1, C] of `pool` dtype; window, weight
    and bias of `inputs` dtype."""

    def __init__(self, seed, *, C, pool=F32, inputs=F32, bias=True, taps=K):
        rng = np.random.default_rng(seed)
        slots = rng.choice(np.arange(1, S - 1), B, replace=False)
        slots[0], slots[2], slots[4] = S - 1, NULL_SLOT, NULL_SLOT
        self.slots = jnp.asarray(slots, I32)
        self.live = slots != NULL_SLOT
        r = lambda dtype, *s: jnp.asarray(rng.standard_normal(s), dtype)
        named = np.zeros(S, bool)
        named[slots] = True                                    # the null slot included
        self.state = jnp.where(jnp.asarray(named)[:, None, None], r(pool, S, taps - 1, C), jnp.nan)
        self.window = r(inputs, B, 1, C)
        self.weight = r(inputs, C, taps)
        self.bias = r(inputs, C) if bias else None

    def args(self):
        return self.state, self.window, self.weight, self.bias, self.slots

    def oracle(self):
        """float64 loop: out [b, 1, C]; the pool with each live row's slot shifted by its token
        (cast to the pool's dtype), every other row as it was."""
        f = lambda a: np.asarray(jnp.asarray(a, F32), np.float64)
        state, window, weight = f(self.state), f(self.window), f(self.weight)
        out = np.zeros(window.shape)
        pool = np.array(self.state)
        for i, s in enumerate(np.asarray(self.slots)):
            seq = np.concatenate([state[s], window[i]])                     # [K, C]
            out[i, 0] = np.sum(seq * weight.T, axis=0)
            if self.bias is not None:
                out[i, 0] += f(self.bias)
            if self.live[i]:
                pool[s] = np.concatenate([pool[s, 1:], np.asarray(
                    jnp.asarray(self.window[i], self.state.dtype))])
        return out, pool


def run(pb, impl, interpret, tiling=None):
    fn = functools.partial(conv.conv_update, **impl_kw(impl, interpret, tiling))
    return jax.jit(fn)(*pb.args())


def check_against_oracle(pb, out, pool):
    want_out, want_pool = pb.oracle()
    assert out.shape == pb.window.shape and out.dtype == F32
    assert pool.shape == pb.state.shape and pool.dtype == pb.state.dtype
    assert rel_err(out, want_out) < 1e-6
    # shifted live slots, and every other row (null slot, NaN rows) bitwise as it was
    assert bitwise_equal(pool, want_pool)


DTYPES = {"f32": (F32, F32), "bf16": (BF16, BF16), "f32_pool_bf16_inputs": (F32, BF16)}
CASES = [(d, bias, C) for d in DTYPES for bias in (True, False) for C in (40, 64)]


@pytest.mark.parametrize("dtypes,bias,C", CASES,
                         ids=[f"{d}-{'bias' if b else 'nobias'}-C{C}" for d, b, C in CASES])
def test_kernel_matches_xla_and_the_oracle(dtypes, bias, C, interpret):
    pool, inputs = DTYPES[dtypes]
    pb = Problem(CASES.index((dtypes, bias, C)), C=C, pool=pool, inputs=inputs, bias=bias)
    got = run(pb, "pallas", interpret, BLOCK16)
    want = run(pb, "xla", interpret)
    check_against_oracle(pb, *want)
    check_against_oracle(pb, *got)
    assert same_sums(got[0], want[0], 0 if interpret else 1e-6)
    assert bitwise_equal(got[1], want[1])


@pytest.mark.parametrize("tiling", [None, dataclasses.replace(BLOCK16, grid_order="row_slowest"),
                                    conv.ConvTiling(block_c=32, num_warps=1)],
                         ids=["default", "row_slowest", "block32"])
def test_tilings(tiling, interpret):
    """The default (one block of 64 over C = 40), row-slowest launch, 32-channel blocks."""
    pb = Problem(99, C=40, pool=BF16, inputs=BF16)
    out, pool = run(pb, "pallas", interpret, tiling)
    check_against_oracle(pb, out, pool)


@pytest.mark.parametrize("taps,C", [(2, 5), (3, 130)])
def test_other_kernel_widths(taps, C, interpret):
    """K = 2 (a one-input state) over C = 5 (one masked block of 8), K = 3 over C = 130 (nine
    16-channel blocks, the last holding 2)."""
    pb = Problem(taps, C=C, taps=taps)
    for tiling in (None, BLOCK16):
        out, pool = run(pb, "pallas", interpret, tiling)
        check_against_oracle(pb, out, pool)


def test_decode_steps_chain(interpret):
    """K steps through the kernel: each row's state ends as its last K-1 tokens, and the conv
    of each step sees the tokens before it (what the XLA path gives, step by step)."""
    pb = Problem(5, C=24)
    pools = {"pallas": pb.state, "xla": pb.state}
    for step in range(K):
        window = jnp.asarray(np.random.default_rng(step).standard_normal((B, 1, 24)), F32)
        outs = {}
        for impl in pools:
            fn = jax.jit(functools.partial(conv.conv_update, **impl_kw(impl, interpret,
                                                                       BLOCK16)))
            outs[impl], pools[impl] = fn(pools[impl], window, pb.weight, pb.bias, pb.slots)
        assert same_sums(outs["pallas"], outs["xla"], 0 if interpret else 1e-6)
        assert bitwise_equal(pools["pallas"], pools["xla"])
    live = np.asarray(pb.slots)[pb.live]
    assert not np.isnan(np.asarray(pools["pallas"])[live]).any()    # the initial state is gone


FUSED = [(64, (32, 16, 16), BF16), (64, None, F32), (40, (24, 16), BF16)]


@pytest.mark.parametrize("C,splits,out_dtype", FUSED,
                         ids=["xBC-bf16", "whole-f32", "pieces-under-16-bf16"])
def test_offset_activation_and_splits(C, splits, out_dtype, interpret):
    """The models' fused form: the token's channels read at an offset of a wider window (a
    projection's output), SiLU applied in fp32, the result cast and split into pieces, each its
    own array: the kernel gives the XLA path bitwise (interpreted; compiled within FMA rounding)
    and the float64 oracle's silu(conv) within the cast's rounding; the pool as without them.
    Pieces of 24 and 16 channels share no 16-channel block: split by XLA after the kernel."""
    pb = Problem(7, C=C, pool=BF16, inputs=BF16)
    rng = np.random.default_rng(8)
    wide = jnp.asarray(rng.standard_normal((B, 1, C + 13)), BF16)
    pb.window = wide[..., 5:5 + C]                        # what the oracle reads
    kw = dict(offset=5, activation="silu", out_dtype=out_dtype, splits=splits)
    outs = {}
    for impl in ("pallas", "xla"):
        fn = jax.jit(functools.partial(conv.conv_update, **kw,
                                       **impl_kw(impl, interpret, BLOCK16)))
        outs[impl] = fn(pb.state, wide, pb.weight, pb.bias, pb.slots)
    want_out, want_pool = pb.oracle()
    silu = want_out / (1 + np.exp(-want_out))
    for out, pool in outs.values():
        pieces = out if splits else (out,)
        assert [p.shape for p in pieces] == [(B, 1, n) for n in splits or (C,)]
        assert all(p.dtype == out_dtype for p in pieces)
        tol = 1e-2 if out_dtype == BF16 else 1e-6
        assert rel_err(np.concatenate([np.asarray(p, np.float64) for p in pieces], -1),
                       silu) < tol
        assert bitwise_equal(pool, want_pool)
    for got, want in zip(jax.tree.leaves(outs["pallas"][0]), jax.tree.leaves(outs["xla"][0])):
        assert same_sums(got, want, 0 if interpret else 1e-2 if out_dtype == BF16 else 1e-6)


@pytest.mark.parametrize("auto_pallas", [True, False])
def test_auto_backend(auto_pallas, monkeypatch):
    """"auto" runs the kernel on a GPU while AUTO_PALLAS is set (the default) and the XLA ops
    otherwise and off the GPU: bitwise the backend it names."""
    assert conv.api.AUTO_PALLAS is True
    monkeypatch.setattr(conv.api, "AUTO_PALLAS", auto_pallas)
    pb = Problem(3, C=40)
    expected = "pallas" if auto_pallas and dispatch.on_gpu() else "xla"
    auto, ref = run(pb, "auto", True), run(pb, expected, True)
    assert all(bitwise_equal(a, r) for a, r in zip(auto, ref))


def _bad(**changes):
    pb = Problem(0, C=40)
    args = dict(zip(("conv_state", "window", "weight", "bias", "slots"), pb.args()))
    kw = {k: changes.pop(k) for k in ("impl", "tiling", "offset", "activation", "out_dtype",
                                      "splits") if k in changes}
    args.update(changes)
    return args, kw


BAD = {
    "window T > 1": (dict(window=jnp.zeros((B, 2, 40))), "one token per row"),
    "window 2-d": (dict(window=jnp.zeros((B, 40))), "window must be [batch, 1, channels]"),
    "window channels": (dict(window=jnp.zeros((B, 1, 48))),
                        "window has 48 channels, the conv state 40 (pass offset="),
    "window narrower": (dict(window=jnp.zeros((B, 1, 32)), offset=0),
                        "window has 32 channels, fewer than the conv state's C = 40"),
    "offset past": (dict(window=jnp.zeros((B, 1, 48)), offset=9),
                    "offset = 9 must be an integer in [0, W - C = 8]"),
    "offset type": (dict(window=jnp.zeros((B, 1, 48)), offset=1.0),
                    "offset = 1.0 must be an integer"),
    "activation": (dict(activation="gelu"), "activation must be one of (None, 'silu')"),
    "out_dtype": (dict(out_dtype=I32), "out_dtype must be one of"),
    "splits sum": (dict(splits=(16, 16)), "splits must be None or a tuple of positive sizes "
                                          "summing to C = 40, got (16, 16)"),
    "splits list": (dict(splits=[20, 20]), "splits must be None or a tuple"),
    "weight taps": (dict(weight=jnp.zeros((40, 3))), "weight has K = 3 taps"),
    "weight channels": (dict(weight=jnp.zeros((48, K))), "weight has shape"),
    "state dtype": (dict(conv_state=jnp.zeros((S, K - 1, 40), jnp.float16)),
                    "conv_state has dtype float16"),
    "slots dtype": (dict(slots=jnp.zeros((B,), F32)), "slots has dtype float32"),
    "slots batch": (dict(slots=jnp.zeros((B + 1,), I32)), "slots has shape"),
    "bias shape": (dict(bias=jnp.zeros((41,))), "bias has shape"),
    "bias dtype": (dict(bias=jnp.zeros((40,), BF16)), "bias has dtype bfloat16"),
    "no null slot": (dict(conv_state=jnp.zeros((1, K - 1, 40))), "slot 0 (null)"),
    "impl": (dict(impl="cuda"), "impl must be one of"),
    "block_c": (dict(impl="pallas", tiling=conv.ConvTiling(block_c=48, num_warps=4)),
                "block_c = 48 must be a power of two"),
    "tiling type": (dict(impl="pallas", tiling=object()), "tiling must be a ConvTiling"),
    "grid_order": (dict(impl="pallas", tiling=dataclasses.replace(BLOCK16, grid_order="x")),
                   "grid_order must be one of"),
    "head_slowest": (dict(impl="pallas", tiling=dataclasses.replace(
        BLOCK16, grid_order="head_slowest")), "needs a (row, head, tile) grid"),
    "num_warps": (dict(impl="pallas", tiling=dataclasses.replace(BLOCK16, num_warps=6)),
                  "num_warps = 6 must be a power of two"),
    "num_stages": (dict(impl="pallas", tiling=dataclasses.replace(BLOCK16, num_stages=0)),
                   "num_stages = 0 must be >= 1"),
    "block_c type": (dict(impl="pallas", tiling=dataclasses.replace(BLOCK16, block_c=16.0)),
                     "block_c = 16.0 must be an integer >= 1"),
    "out_dtype name": (dict(out_dtype="bogus"), "out_dtype must be one of float32, bfloat16, "
                                                "float16, got 'bogus'"),
    # K = 1 (a conv state of no inputs) and empty dims
    "one tap": (dict(conv_state=jnp.zeros((S, 0, 40)), weight=jnp.zeros((40, 1))),
                "weight has K = 1 taps: the conv needs K >= 2"),
    "one tap pallas": (dict(conv_state=jnp.zeros((S, 0, 40)), weight=jnp.zeros((40, 1)),
                            impl="pallas"), "weight has K = 1 taps: the conv needs K >= 2"),
    "no channels": (dict(conv_state=jnp.zeros((S, K - 1, 0)), window=jnp.zeros((B, 1, 0)),
                         weight=jnp.zeros((0, K)), bias=None),
                    "conv_state has shape (12, 3, 0): every dimension must be >= 1"),
    "batch 0": (dict(window=jnp.zeros((0, 1, 40)), slots=jnp.zeros((0,), I32), impl="pallas"),
                "window has shape (0, 1, 40): every dimension must be >= 1"),
    # concrete slots (an eager call), on both implementations
    "slot past the pool": (dict(slots=jnp.asarray([1, 2, 3, 4, 5, 12], I32)),
                           "slots[5] = 12 is outside the pool [0, 12)"),
    "slot negative": (dict(slots=jnp.asarray([-1, 2, 3, 4, 5, 6], I32), impl="pallas"),
                      "slots[0] = -1 is outside the pool [0, 12)"),
    "slot twice": (dict(slots=jnp.asarray([7, 2, 3, 0, 7, 0], I32)),
                   "slots: slot 7 is named more than once (rows must name distinct slots; "
                   "only the null slot 0 may repeat)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_give_one_line_errors(case):
    changes, message = BAD[case]
    args, kw = _bad(**dict(changes))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        conv.conv_update(*args.values(), interpret=True, **kw)
    assert "\n" not in str(err.value)


def test_slots_must_be_an_array():
    args, kw = _bad(slots=[1, 2, 3, 4, 5, 6])
    with pytest.raises(TypeError, match=r"^slots must be an array .*, got list$"):
        conv.conv_update(*args.values(), interpret=True, **kw)
