"""Public decode conv over the conv-state slot pool: validate, pick an implementation, run.

    out, conv_state = conv_update(conv_state, window, weight, bias, slots, *, offset=None,
                                  activation=None, out_dtype=float32, splits=None)

Shapes: b rows of one new token (decode, T = 1), C channels, a K-tap kernel (K >= 2), a pool
of S slots.
    conv_state [S, K-1, C] float32 or bfloat16 (a slot's last K-1 pre-conv inputs, oldest
    first); window [b, 1, C] float (the token's pre-conv input), or with an int offset
    [b, 1, W], W >= offset + C, whose channels offset ... offset + C - 1 are (a fused
    projection's output read in place, no slice copied first); weight [C, K] float (last tap =
    the current token); bias [C] of weight's dtype, or None; slots [b] int32 (NULL_SLOT =
    padding rows).
Returns out [b, 1, C], the conv sum_k seq[k] w[:, k] (+ bias) over seq = state + token in fp32
(`ring.conv_window`'s math), then `activation` (None or "silu", in fp32), cast to out_dtype;
with `splits` (sizes summing to C) the tuple of its consecutive channel pieces [b, 1, size]
instead (the models' x | B | C or q | k | v, each written by the kernel as its own array).
And the pool with each live row's slot shifted by one token: its last K-1 inputs, the token
cast to the pool's dtype (`ring.conv_commit` with n = 1). NULL_SLOT rows read the null slot
(their output is whatever it gives) and write no pool row. Rows must name distinct live slots
(as for every pool op, see `pallas_kernels.ring`): two rows on one slot race in the kernel (and
XLA's scatter, declared unique, is undefined too). Concrete slots (an eager call) are checked:
in [0, S), no slot but NULL_SLOT twice; under jit they stay the caller's contract. Pallas
updates the pool in place: donate it at your jit boundary.

impl: "pallas" / "pallas_triton" (compiled on GPU, interpret mode elsewhere; "pallas_mosaic_gpu"
runs it too: there is no Mosaic GPU conv), "xla" (`ring.conv_window` + `ring.conv_commit`),
"auto" (Pallas Triton on GPU while `AUTO_PALLAS` is set, XLA elsewhere).
tiling: a `ConvTiling` for Pallas (None: `pallas_triton.TILING`).
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.conv import pallas_triton, xla
from pallas_kernels.dispatch import family_ops
from pallas_kernels.validation import (
    FLOAT_DTYPES,
    INT32_ONLY,
    STATE_DTYPES,
    Field,
    check,
    check_arrays,
    check_fields,
    check_pool,
    check_slots,
    is_int,
)

_FIELDS = (
    Field("conv_state", ("S", "K-1", "C"), STATE_DTYPES),
    Field("window", ("b", "T", "W"), FLOAT_DTYPES),
    Field("weight", ("C", "K"), FLOAT_DTYPES),
    Field("slots", ("b",), INT32_ONLY),
)
ACTIVATIONS = (None, "silu")
# "auto" runs the kernel on a GPU (eighth session, H200, Nemotron-H-8B's C = 10240 and K = 4,
# one layer: batch 256 17.4 us vs XLA's gather / conv / scatter 42.7, batch 32 4.3 vs 8.2, batch
# 1 1.8 vs 2.7; Qwen3.5-9B's shapes alike).
AUTO_PALLAS = True
_OPS = family_ops("conv", ("conv_update",), xla=xla, pallas_triton=pallas_triton)


def _check(conv_state, window, weight, bias, slots, offset, activation, out_dtype,
           splits) -> None:
    check_arrays(conv_state=conv_state, window=window, weight=weight, slots=slots)
    check(conv_state.ndim == 3, f"conv_state must be [slots, K-1, channels], got shape "
                                f"{tuple(conv_state.shape)}")
    check(window.ndim == 3, f"window must be [batch, 1, channels], got shape "
                            f"{tuple(window.shape)}")
    check(weight.ndim == 2, f"weight must be [channels, K], got shape {tuple(weight.shape)}")
    check(window.shape[1] == 1, f"conv_update takes one token per row (decode), got a window of "
                                f"{window.shape[1]}: verify windows use ring.conv_window")
    check(weight.shape[1] == conv_state.shape[1] + 1,
          f"weight has K = {weight.shape[1]} taps, the conv state holds {conv_state.shape[1]} "
          f"inputs (expected K - 1)")
    check(weight.shape[1] >= 2, f"weight has K = {weight.shape[1]} taps: the conv needs K >= 2 "
                                f"(a conv state of K - 1 >= 1 inputs)")
    dims = check_fields(_FIELDS, dict(conv_state=conv_state, window=window, weight=weight,
                                      slots=slots))
    check_pool(dims["S"])
    check_slots("slots", slots, dims["S"])
    if bias is not None:
        check_fields((Field("bias", ("C",), "weight"),), dict(bias=bias, weight=weight), dims)
    C, W = dims["C"], dims["W"]
    if offset is None:          # the window is the token's C channels, no more
        check(W == C, f"window has {W} channels, the conv state {C} (pass offset= to read C "
                      f"channels of a wider window)")
    else:
        check(W >= C, f"window has {W} channels, fewer than the conv state's C = {C}")
        check(is_int(offset) and 0 <= offset <= W - C,
              f"offset = {offset!r} must be an integer in [0, W - C = {W - C}] (a window of "
              f"{W} channels, a conv state of {C})")
    check(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got "
                                     f"{activation!r}")
    try:
        out_ok = jnp.dtype(out_dtype) in FLOAT_DTYPES
    except TypeError:           # not a dtype at all ("bogus")
        out_ok = False
    check(out_ok, f"out_dtype must be one of "
          f"{', '.join(jnp.dtype(d).name for d in FLOAT_DTYPES)}, got {out_dtype!r}")
    check(splits is None or (isinstance(splits, tuple) and all(is_int(n) and n > 0
                                                               for n in splits)
                             and sum(splits) == C),
          f"splits must be None or a tuple of positive sizes summing to C = {C}, got {splits!r}")


def conv_update(conv_state, window, weight, bias, slots, *, offset=None, activation=None,
                out_dtype=jnp.float32, splits=None, impl="auto", tiling=None, interpret=None):
    """One decode token's causal depthwise conv over the slot pool (see the module docstring):
    (out [b, 1, C] in out_dtype, or its `splits` pieces, conv_state [S, K-1, C])."""
    _check(conv_state, window, weight, bias, slots, offset, activation, out_dtype, splits)
    if impl == "pallas_mosaic_gpu":     # no Mosaic GPU conv: the Triton kernel serves Hopper too
        impl = "pallas_triton"
    if impl == "auto" and not AUTO_PALLAS:
        impl = "xla"
    return _OPS["conv_update"](conv_state, window, weight, bias, slots, impl=impl,
                               tiling=tiling, interpret=interpret, offset=offset or 0,
                               activation=activation, out_dtype=jnp.dtype(out_dtype),
                               splits=splits)
