"""The small-batch path of the routed experts: one Pallas launch over a grid (pair, F chunk),
then one XLA reduction. No dispatch plan, no sort, no row gather, no hidden activations in
memory, no second GEMM launch.

Program (p, c) of the P = n k (token, expert) pairs and the F / block_f chunks of the expert's
width reads e = pair_expert[p] and its token's row x[p // k], and computes

    part[p, c] = act(x W_up[e][:, chunk]) W_down[e][chunk, :]            [din] float32

(SwiGLU: also x W_gate[e][:, chunk]) as tensor-core dots on the token's row repeated to the
ROWS = 16 rows a dot needs: the weight blocks feed the dots, so the compiler pipelines their
loads over num_stages buffers (broadcast products summed on the CUDA cores were not pipelined:
the pair path took 82.8 us against the grouped path's 50.0 on Qwen3.5-35B at batch 1, H200,
twelfth GPU session). Each weight byte of an expert is read once per pair; with few pairs that is
about once per distinct expert, and the F chunks give a batch-1 call enough programs to fill the
GPU. The XLA reduction sums the chunks and a token's pairs, each pair times its routing weight.
Rounding is the grouped path's: x in the weights' dtype, float32 accumulation (float32 weights:
the same dot precision), the hidden activations rounded to the weights' dtype before the down
product. Invalid pairs (their validity read in the kernel) do no work and their (unwritten)
parts are masked out. A shared expert's chunk c (e = E + c) reads columns c F + chunk of the
shared matrices in place.
Bodies are backend-neutral Pallas; `PairTiling` holds the launch's tile caps, `TILING` the
default.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, dot_precision, n_chunks
from pallas_kernels.moe.reference import activate
from pallas_kernels.validation import bounded_block, resolve_tiling


@dataclasses.dataclass(frozen=True)
class PairTiling:
    """Tile caps of the pair kernel: block_f (a program's chunk of F) and block_d (slices of din
    in both GEMVs), each the largest power of two dividing its size and <= the cap; block_f is
    then halved (not below 16) while the grid has fewer than min_programs programs. Warps and
    stages of the launch."""
    block_f: int
    block_d: int
    num_warps: int
    num_stages: int = 3
    min_programs: int = 128     # about one per SM of an H100 / H200 (132 SMs)


# Not yet measured: 64-wide F chunks read 128 contiguous bytes of a bf16 W_up row per din row.
TILING = PairTiling(block_f=64, block_d=128, num_warps=4, num_stages=3)


def chunk_width(num_pairs: int, F: int, t: PairTiling) -> int:
    """block_f of tiling t for num_pairs pairs of experts F wide."""
    bf = bounded_block("block_f", "F", F, t.block_f, 16)
    while bf > 16 and num_pairs * (F // bf) < t.min_programs:
        bf //= 2
    return bf


def expert_ffn(x, expert_ids, weights, valid, w_up, w_down, w_gate, shared, activation: str,
               *, tiling, interpret):
    """The routed experts of `pallas_kernels.moe.expert_ffn` by pairs: x [n, din]; expert_ids,
    weights [n, k]; valid [n] or [n, k] bool. Returns [n, din] in x.dtype."""
    t = resolve_tiling(tiling, TILING)
    n, k = expert_ids.shape
    din, F = x.shape[1], w_up.shape[2]
    block_f = chunk_width(n * k, F, t)
    block_d = bounded_block("block_d", "din", din, t.block_d, 16)
    # validity per token (index p // k) or per pair, read in the kernel: no launch before it
    per_pair = valid.ndim == 2
    mats = lambda up, gate, down: (up, down) if gate is None else (up, gate, down)
    ws = mats(w_up, w_gate, w_down)
    if shared is not None:
        ws += mats(shared.w_up, shared.w_gate, shared.w_down)
    part = _pair_ffn(expert_ids.reshape(n * k), valid.reshape(-1), x.astype(w_up.dtype), ws,
                     top_k=k, per_pair=per_pair, activation=activation, block_f=block_f,
                     block_d=block_d, num_warps=t.num_warps, num_stages=t.num_stages,
                     interpret=interpret)
    ok = valid if per_pair else valid[:, None]
    part = jnp.where(ok[:, :, None, None], part.reshape(n, k, F // block_f, din), 0.0)
    return (part * weights[:, :, None, None]).sum((1, 2)).astype(x.dtype)


ROWS = 16       # a Triton dot's least rows: the token's row repeated


def _dot(a, b, precision):
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=F32)


def _pair_kernel(expert_ref, valid_ref, x_ref, *refs, top_k, per_pair, block_f, block_d,
                 activation, precision):
    # W_up (and W_gate for SwiGLU), W_down; the shared expert's (if any); the out
    *w_refs, part_ref = refs
    n = 3 if activation == "swiglu" else 2
    routed, shared = w_refs[:n], w_refs[n:]
    E, F = routed[0].shape[0], routed[0].shape[2]
    p, c = pl.program_id(0), pl.program_id(1)
    e, fs = expert_ref[p], pl.ds(c * block_f, block_f)
    live = valid_ref[p if per_pair else p // top_k]     # the ids of other pairs mean nothing

    def run(mats, up_block, down_block):    # (w, ds) -> the [bd, bf] / [bf, bd] weight block
        *ups, down_ref = mats
        tokens = jnp.full((ROWS,), p // top_k, jnp.int32)

        def up(ds, accs):                   # [ROWS, bd] x [bd, bf], per weight matrix
            xa = x_ref[tokens, ds]
            return tuple(acc + _dot(xa, up_block(w, ds), precision)
                         for acc, w in zip(accs, ups))

        zero = jnp.zeros((ROWS, block_f), F32)
        accs = n_chunks(x_ref.shape[1], block_d, up, (zero,) * len(ups))
        hid = activate(accs[0], accs[1] if len(accs) > 1 else None, activation)
        hid = hid.astype(down_ref.dtype)                                        # [ROWS, bf]
        first = lax.broadcasted_iota(jnp.int32, (ROWS, 1), 0) == 0

        def down(ds, carry):                # [ROWS, bf] x [bf, bd]: the rows are equal
            out = _dot(hid, down_block(down_ref, ds), precision)
            part_ref[p, c, ds] = jnp.sum(jnp.where(first, out, 0.0), axis=0)
            return carry

        n_chunks(x_ref.shape[1], block_d, down, None)

    pl.when(live & (e >= 0) & (e < E))(lambda: run(routed, lambda w, ds: w[e, ds, fs],
                                            lambda w, ds: w[e, fs, ds]))
    if shared:                  # chunk e - E: columns (rows of W_down) (e - E) F + fs
        sf = pl.ds((e - E) * F + fs.start, block_f)
        pl.when(live & (e >= E))(lambda: run(shared, lambda w, ds: w[ds, sf],
                                             lambda w, ds: w[sf, ds]))


@functools.partial(jax.jit, static_argnames=("top_k", "per_pair", "activation", "block_f",
                                             "block_d", "num_warps", "num_stages", "interpret"))
def _pair_ffn(pair_expert, valid, x, ws, *, top_k, per_pair, activation, block_f, block_d,
              num_warps, num_stages, interpret):
    """pair_expert [P] int32 (in [0, E + C) where valid); valid [P] bool (per_pair) or [n] bool
    (a token's: pair p's is valid[p // top_k]), False: no work; x [n, din] in the weights' dtype;
    ws: W_up[, W_gate] [E, din, F] and W_down [E, F, din], then the shared expert's [din, Fs]
    and [Fs, din], if any. Returns part [P, F / block_f, din] float32 (rows of invalid pairs
    unwritten)."""
    P, (din, F) = pair_expert.shape[0], ws[0].shape[1:]
    precision = dot_precision(interpret) if ws[0].dtype == F32 else None
    return pl.pallas_call(
        functools.partial(_pair_kernel, top_k=top_k, per_pair=per_pair, block_f=block_f,
                          block_d=block_d, activation=activation, precision=precision),
        grid=(P, F // block_f),
        out_shape=jax.ShapeDtypeStruct((P, F // block_f, din), F32),
        compiler_params=compiler_params(num_warps, num_stages, interpret),
        interpret=interpret, name="moe_pair_ffn",
    )(pair_expert, valid, x, *ws)
