"""Pallas grouped GEMMs over the tiles of a `DispatchPlan` (GPU; interpret mode on CPU).

Two launches, each on a grid (tile, output column block):
  * gate/up: hidden[tile rows, cols] = act(x_rows[tile rows] @ W_up[e][:, cols]) (SwiGLU: also
    W_gate), the activation fused, float32 accumulation over din in block_k chunks, stored in the
    weights' dtype;
  * down: out[tile rows, cols] = (hidden[tile rows] @ W_down[e][:, cols]) * routing weight,
    float32, accumulated over F in block_k chunks.
e = tile_expert[tile] is read from an index input inside the kernel and picks the expert's slice
of the whole weight array (no BlockSpecs: the same gather-by-index as the SSM kernels' pools);
the gate/up kernel reads its rows' tokens from x by the plan's row_token (a gather load, not an
XLA gather of [R, din] rows before the launch; at batch 1, x's one row broadcast instead made
the Qwen models' gate/up 40% slower on an H100, Nemotron-3-Nano's 4% faster);
a tile of a shared expert's chunk (e >= E) reads its F-wide chunk of the shared matrices in
place, in the same launch. Programs of unused tiles (expert -1) return at once, so only the
experts hit are read. Bodies use backend-neutral Pallas; the Triton specifics are in
`compiler_params`. The launch tiling is a `MoETiling`; `TILING` is the measured default.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, dot_precision, n_chunks
from pallas_kernels.moe.plan import DispatchPlan, combine
from pallas_kernels.moe.reference import activate
from pallas_kernels.validation import bounded_block, resolve_tiling


@dataclasses.dataclass(frozen=True)
class MoETiling:
    """Tile caps of the two grouped GEMMs: (up_block_n, up_block_k) = output columns of F and
    contraction chunks of din in the gate/up GEMM, (down_block_n, down_block_k) = columns of din
    and chunks of F in the down GEMM (each the largest power of two >= 16 dividing its size and
    <= the cap), plus the launch's warps and pipeline stages."""
    up_block_n: int
    up_block_k: int
    down_block_n: int
    down_block_k: int
    num_warps: int
    num_stages: int = 3


# The best of a short sweep on an H200 (Nemotron-3-Nano and Qwen3.5-35B shapes at batch 1 and 256,
# bf16): 8 warps, 2 warps, 4 stages or narrower tiles were no better at both batches.
TILING = MoETiling(up_block_n=64, up_block_k=128, down_block_n=128, down_block_k=64,
                   num_warps=4, num_stages=3)


def expert_ffn(x, plan: DispatchPlan, w_up, w_down, w_gate, shared, activation: str,
               block_m: int, *, tiling, interpret):
    """The routed experts of `pallas_kernels.moe.expert_ffn` on the plan's rows: [n, din] in
    x.dtype."""
    t = resolve_tiling(tiling, TILING)
    din, F = x.shape[1], w_up.shape[2]
    up = (bounded_block("up_block_n", "F", F, t.up_block_n, 16),
          bounded_block("up_block_k", "din", din, t.up_block_k, 16))
    down = (bounded_block("down_block_n", "din", din, t.down_block_n, 16),
            bounded_block("down_block_k", "F", F, t.down_block_k, 16))
    ws_of = lambda a, g: (a,) if g is None else (a, g)       # W_up[, W_gate]
    ws = ws_of(w_up, w_gate)
    shared_ws = () if shared is None else ws_of(shared.w_up, shared.w_gate)
    rows = _expert_ffn(x.astype(w_up.dtype), plan.row_token, plan.tile_expert,
                       plan.row_weight, ws, w_down, shared_ws,
                       None if shared is None else shared.w_down,
                       activation=activation, block_m=block_m, up_tiles=up, down_tiles=down,
                       num_warps=t.num_warps, num_stages=t.num_stages, interpret=interpret)
    return combine(rows, plan.pair_row).astype(x.dtype)


def _dot(a, b, precision):
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=F32)


def _tile(block_m, block_n):
    t, j = pl.program_id(0), pl.program_id(1)
    return t, pl.ds(t * block_m, block_m), pl.ds(j * block_n, block_n)


def _by_expert(expert_ref, t, num_experts, routed, chunk):
    """For a used tile t of expert e (unused: -1): routed(e) if e < E, else chunk(e - E) (a
    shared expert's chunk; chunk None: there is none)."""
    e = expert_ref[t]
    live = e >= 0
    pl.when(live & (e < num_experts))(lambda: routed(e))
    if chunk is not None:
        pl.when(live & (e >= num_experts))(lambda: chunk(e - num_experts))


def _up_kernel(expert_ref, token_ref, x_ref, *refs, n_mats, block_m, block_n,
               block_k, activation, precision):
    # W_up (and W_gate for SwiGLU), the shared expert's (if any), the hidden out
    w_refs, s_refs, h_ref = refs[:n_mats], refs[n_mats:-1], refs[-1]
    t, rows, cols = _tile(block_m, block_n)
    E, F = w_refs[0].shape[0], w_refs[0].shape[2]

    def run(mats, block):           # block(w, ks): the [bk, bn] block of w to multiply
        tokens = token_ref[rows]                                                 # [m]

        def step(ks, accs):
            xa = x_ref[tokens, ks]                                               # [m, bk]
            return tuple(acc + _dot(xa, block(w, ks), precision)
                         for acc, w in zip(accs, mats))

        zero = jnp.zeros((block_m, block_n), F32)
        accs = n_chunks(x_ref.shape[1], block_k, step, (zero,) * len(mats))
        hid = activate(accs[0], accs[1] if len(accs) > 1 else None, activation)
        h_ref[rows, cols] = hid.astype(h_ref.dtype)

    # a shared chunk c is columns c F + cols of the shared [din, Fs] matrices
    _by_expert(expert_ref, t, E,
               lambda e: run(w_refs, lambda w, ks: w[e, ks, cols]),
               (lambda c: run(s_refs, lambda w, ks: w[ks, pl.ds(c * F + cols.start, block_n)]))
               if s_refs else None)


def _down_kernel(expert_ref, weight_ref, h_ref, w_ref, *refs, block_m, block_n,
                 block_k, precision):
    *s_ref, out_ref = refs                  # the shared expert's W_down (if any), the out
    t, rows, cols = _tile(block_m, block_n)
    E, F = w_ref.shape[0], w_ref.shape[1]

    def run(block):                 # block(fs): the [bk, bn] block of W_down to multiply
        acc = n_chunks(F, block_k, lambda fs, acc: acc + _dot(h_ref[rows, fs], block(fs),
                                                                precision),
                       jnp.zeros((block_m, block_n), F32))
        out_ref[rows, cols] = acc * weight_ref[rows][:, None]

    # a shared chunk c is rows c F + fs of the shared [Fs, din] W_down
    _by_expert(expert_ref, t, E,
               lambda e: run(lambda fs: w_ref[e, fs, cols]),
               (lambda c: run(lambda fs: s_ref[0][pl.ds(c * F + fs.start, block_k), cols]))
               if s_ref else None)


@functools.partial(jax.jit, static_argnames=("activation", "block_m", "up_tiles", "down_tiles",
                                             "num_warps", "num_stages", "interpret"))
def _expert_ffn(x, row_token, tile_expert, row_weight, ws, w_down, shared_ws,
                shared_down, *, activation, block_m, up_tiles, down_tiles, num_warps,
                num_stages, interpret):
    """x [n, din] (the weights' dtype); row_token [R] int32 (the plan's: the token of each row);
    tile_expert [R // m] int32 (-1: unused); row_weight [R] float32; ws (W_up[, W_gate])
    [E, din, F], w_down [E, F, din]; shared_ws (its W_up[, W_gate]) [din, Fs] and shared_down
    [Fs, din], or () and None. up_tiles / down_tiles: (block_n, block_k) of each GEMM. Returns
    the weighted expert output of every row [R, din] float32 (rows of unused tiles are
    unwritten)."""
    R, din = row_token.shape[0], x.shape[1]
    F, dt = ws[0].shape[2], ws[0].dtype
    precision = dot_precision(interpret) if dt == F32 else None
    params = compiler_params(num_warps, num_stages, interpret)
    (un, uk), (dn, dk) = up_tiles, down_tiles
    hid = pl.pallas_call(
        functools.partial(_up_kernel, n_mats=len(ws), block_m=block_m, block_n=un,
                          block_k=uk, activation=activation, precision=precision),
        grid=(R // block_m, F // un),
        out_shape=jax.ShapeDtypeStruct((R, F), dt),
        compiler_params=params, interpret=interpret, name="moe_gate_up",
    )(tile_expert, row_token, x, *ws, *shared_ws)
    return pl.pallas_call(
        functools.partial(_down_kernel, block_m=block_m, block_n=dn, block_k=dk,
                          precision=precision),
        grid=(R // block_m, din // dn),
        out_shape=jax.ShapeDtypeStruct((R, din), F32),
        compiler_params=params, interpret=interpret, name="moe_down",
    )(tile_expert, row_weight, hid, w_down,
      *(() if shared_down is None else (shared_down,)))
