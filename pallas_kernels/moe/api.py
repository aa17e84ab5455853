"""Public sparse MoE op: validate, plan, pick an implementation, run.

    y = expert_ffn(x, expert_ids, weights, w_up, w_down, w_gate=None, valid=None,
                   activation="relu2", shared=None)

Shapes: n tokens of width din, E experts of width F, k experts per token.
    x [n, din] float (any float dtype: rounded to the weights' dtype for the GEMMs, the result
    returned in x's); expert_ids [n, k] int32 in [0, E) (E + C: `shared`), distinct per row
    (the ids of pairs that are not valid are ignored);
    weights [n, k] float32 (the routing weights, applied here); valid [n] bool (None: all rows)
    or [n, k] bool (which pairs to compute: an expert-parallel shard's own; top_k may exceed E)
    w_up [E, din, F], w_gate [E, din, F] (SwiGLU only), w_down [E, F, din]; one float dtype.
    activation: "relu2" (relu(x W_up)^2, Nemotron-H) or "swiglu" (silu(x W_gate) * x W_up, Qwen).
    shared: None or `SharedWeights` (w_up [din, Fs], w_down [Fs, din], w_gate [din, Fs] for
    SwiGLU), Fs a multiple of F: C = Fs / F more experts, ids E + c naming the F-wide column
    chunk c of these arrays (rows c F ... of w_down), read in place. The FFN is linear in its
    width's chunks, so routing a token to all C of them with weight s is s times the whole
    shared FFN: a MoE layer's shared expert in the routed experts' launch (`models.moe`).
Returns y[i] = sum_j weights[i, j] FFN_{expert_ids[i, j]}(x[i]) as [n, din] in x.dtype; rows that
are not valid own no (token, expert) pairs, do no expert work and come out zero.
n, din, E, F >= 1. Concrete expert_ids (an eager call) of the valid pairs are checked against
[0, E + C) and for repeats in a row; under jit they stay the caller's contract.

impl: "pallas" (compiled on GPU, interpret mode elsewhere), "xla" (sparse, plain XLA), "auto"
(Pallas on GPU, XLA elsewhere), dispatched through `pallas_kernels.dispatch`.
path: how the pairs are laid out,
  * "grouped": sorted by expert into tiles of block_m rows (see `pallas_kernels.moe.plan`) and
    grouped GEMMs; block_m defaults to the expected pairs per expert, as a power of two in
    [16, 128]; tiling a `pallas_triton.MoETiling` (None: the measured `TILING`);
  * "pairs" (Pallas only): one program per (pair, F chunk), no plan (`pallas_kernels.moe.pairs`);
    tiling a `pairs.PairTiling`;
  * "auto": "pairs" for Pallas when n k <= PAIR_PATH_MAX_PAIRS, else "grouped" (a given
    tiling's type picks its path). block_m and a MoETiling are the grouped path's only.
`reference.expert_ffn` is the dense oracle.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.dispatch import Op, resolve_impl
from pallas_kernels.moe import pairs, pallas_triton, xla
from pallas_kernels.moe.plan import make_plan
from pallas_kernels.moe.reference import ACTIVATIONS
from pallas_kernels.validation import (
    FLOAT_DTYPES,
    check,
    check_arrays,
    check_dtype,
    check_nonempty,
    check_range,
    check_shape,
    concrete,
    is_int,
    is_pow2,
)

__all__ = ["expert_ffn", "default_block_m", "SharedWeights", "PATHS", "PAIR_PATH_MAX_PAIRS"]

MIN_BLOCK_M, MAX_BLOCK_M = 16, 128      # Triton dots need >= 16 rows
PATHS = ("auto", "grouped", "pairs")
# Up to 64 pairs the pair path would read each expert about once (pairs ~ distinct experts: batch
# 8 of Nemotron-3-Nano's top-6 over 128 and of Qwen3.5's top-8 over 256). 0 until it has run on a
# GPU (`replayjax bench moe --variants sparse sparse-small`): "auto" keeps the measured grouped
# path until then.
PAIR_PATH_MAX_PAIRS = 0
_EXPERT_FFN = Op("moe.expert_ffn", {"xla": xla.expert_ffn,
                                    "pallas_triton": pallas_triton.expert_ffn})
_PAIR_FFN = Op("moe.expert_ffn path 'pairs'", {"pallas_triton": pairs.expert_ffn})


class SharedWeights(NamedTuple):
    """A shared expert's matrices, as experts E ... E + Fs / F - 1 (`expert_ffn`'s `shared`):
    w_up [din, Fs], w_down [Fs, din], w_gate [din, Fs] (SwiGLU) or None; the routed experts'
    dtype."""
    w_up: jax.Array
    w_down: jax.Array
    w_gate: jax.Array | None = None


def default_block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per tile: the mean pairs per expert rounded up to a power of two, in [16, 128]."""
    mean = -(-num_pairs // num_experts)
    return min(MAX_BLOCK_M, max(MIN_BLOCK_M, 1 << (mean - 1).bit_length()))


def _check(x, expert_ids, weights, w_up, w_down, w_gate, valid, activation, shared):
    check(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got "
                                     f"{activation!r}")
    check_arrays(x=x, expert_ids=expert_ids, weights=weights, w_up=w_up, w_down=w_down)
    check(x.ndim == 2, f"x must be [tokens, din], got shape {tuple(x.shape)}")
    check(w_up.ndim == 3, f"w_up must be [experts, din, F], got shape {tuple(w_up.shape)}")
    check_nonempty("x", x)
    check_nonempty("w_up", w_up)
    n, din = x.shape
    E, _, F = w_up.shape
    check(expert_ids.ndim == 2 and expert_ids.shape[0] == n,
          f"expert_ids must be [tokens = {n}, top_k], got shape {tuple(expert_ids.shape)}")
    k = expert_ids.shape[1]
    pairs = valid is not None and valid.ndim == 2
    experts = E + _check_shared(shared, din, F, w_up.dtype, activation)
    check(1 <= k and (pairs or k <= experts), f"top_k = {k} must be in [1, experts = {experts}]")
    check_shape("w_up", w_up, (E, din, F))
    check_shape("w_down", w_down, (E, F, din))
    check_shape("weights", weights, (n, k))
    check((w_gate is not None) == (activation == "swiglu"),
          f"w_gate is needed by activation 'swiglu' and only by it (activation {activation!r})")
    if w_gate is not None:
        check_shape("w_gate", w_gate, (E, din, F))
        check_dtype("w_gate", w_gate, (w_up.dtype,))
    if valid is not None:
        check_shape("valid", valid, (n, k) if pairs else (n,))
        check_dtype("valid", valid, (jnp.bool_,))
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("w_up", w_up, FLOAT_DTYPES)
    check_dtype("w_down", w_down, (w_up.dtype,))
    check_dtype("expert_ids", expert_ids, (jnp.int32,))
    check_dtype("weights", weights, (jnp.float32,))
    # concrete ids (an eager call) of the pairs that run: in [0, E + C), distinct per row
    mask = None if valid is None else valid if pairs else valid[:, None]
    check_range("expert_ids", expert_ids, 0, experts - 1,
                f"[0, experts = {experts})" + (" (valid pairs)" if valid is not None else ""),
                mask=mask)
    ids = concrete(expert_ids)
    live = None if ids is None else np.ones((1, 1), bool) if mask is None else concrete(mask)
    if live is not None:        # a pair that does not run gets an id of its own (< 0)
        keyed = np.sort(np.where(np.broadcast_to(live, ids.shape), ids, -1 - np.arange(k)), 1)
        twice = (keyed[:, 1:] == keyed[:, :-1]).any(1)
        if twice.any():
            i = int(np.flatnonzero(twice)[0])
            raise ValueError(f"expert_ids[{i}] = {ids[i].tolist()} names an expert more than "
                             f"once (a row's experts must be distinct)")
    return n, experts, k


def _check_shared(shared, din, F, dtype, activation) -> int:
    """The shared expert's chunk count C (0 without one)."""
    if shared is None:
        return 0
    check(isinstance(shared, SharedWeights),
          f"shared must be a SharedWeights, got {type(shared).__name__}")
    check(shared.w_up.ndim == 2 and shared.w_up.shape[0] == din,
          f"shared.w_up must be [din = {din}, Fs], got shape {tuple(shared.w_up.shape)}")
    Fs = shared.w_up.shape[1]
    check(Fs % F == 0, f"the shared expert's width {Fs} must be a multiple of the experts' {F}")
    check_shape("shared.w_down", shared.w_down, (Fs, din))
    check((shared.w_gate is not None) == (activation == "swiglu"),
          f"shared.w_gate is needed by activation 'swiglu' and only by it (activation "
          f"{activation!r})")
    if shared.w_gate is not None:
        check_shape("shared.w_gate", shared.w_gate, (din, Fs))
    for name, w in zip(SharedWeights._fields, shared):
        if w is not None:
            check_dtype(f"shared.{name}", w, (dtype,))
    return Fs // F


def pick_path(path: str, impl: str, num_pairs: int, tiling=None) -> str:
    """The path that runs, "grouped" or "pairs": `path` unless "auto" (module docstring)."""
    check(path in PATHS, f"path must be one of {PATHS}, got {path!r}")
    if path != "auto":
        return path
    if tiling is not None:
        return "pairs" if isinstance(tiling, pairs.PairTiling) else "grouped"
    small = resolve_impl(impl) == "pallas_triton" and num_pairs <= PAIR_PATH_MAX_PAIRS
    return "pairs" if small else "grouped"


def expert_ffn(x, expert_ids, weights, w_up, w_down, *, w_gate=None, valid=None,
               activation="relu2", shared=None, impl="auto", path="auto", block_m=None,
               tiling=None, interpret=None):
    """Routed experts of a MoE layer, sparse (see the module docstring)."""
    # experts: E, and a shared expert's chunks
    n, experts, k = _check(x, expert_ids, weights, w_up, w_down, w_gate, valid, activation,
                           shared)
    if valid is None:
        valid = jnp.ones((n,), bool)
    if pick_path(path, impl, n * k, tiling) == "pairs":
        return _PAIR_FFN(x, expert_ids, weights, valid, w_up, w_down, w_gate, shared,
                         activation, impl=impl, tiling=tiling, interpret=interpret)
    if block_m is None:
        block_m = default_block_m(n * k, experts)
    check(is_int(block_m) and is_pow2(block_m) and block_m >= MIN_BLOCK_M,
          f"block_m = {block_m!r} must be a power of two >= {MIN_BLOCK_M}")
    plan = make_plan(expert_ids, weights, valid, experts, block_m)
    return _EXPERT_FFN(x, plan, w_up, w_down, w_gate, shared, activation, block_m, impl=impl,
                       tiling=tiling, interpret=interpret)
