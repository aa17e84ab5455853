"""Pallas Triton decode conv over the conv-state slot pool (`impl="pallas_triton"`, or "pallas").

One program per (row, channel block): it reads the row's slot, then that slot's K-1 state inputs
and the row's token over block_c channels (`ref[slot, k, channels]`: the pool is gathered by
index inside the kernel, no copy), the K weight taps and the bias, writes the conv (its
activation applied, in the output dtype; with splits into the piece holding the block) and
stores the shifted state (inputs 1..K-2 and the token) back into the same slot rows: the pool
output is aliased to its input, so the step updates it in place (donate it at the outer jit).
A program reads all of its slot's channels before it writes them and no other program touches
them (rows name distinct slots), so the in-place update needs no ordering between programs.

The one launch replaces XLA's gather + concat + conv and its commit scatter (issue 17: several
kernels per layer). Loads and stores are [block_c] vectors, one per tap (K - 1 = 3 is no power
of two, a Triton block's shape must be); channels past C (the last block of a C that block_c
does not divide) are masked, and NULL_SLOT rows store no state (their mask is all off).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, call, launch_grid, like, load, program_ids, store
from pallas_kernels.conv.xla import finish
from pallas_kernels.ring import NULL_SLOT
from pallas_kernels.validation import largest_pow2_divisor, masked_block, resolve_tiling


@dataclasses.dataclass(frozen=True)
class ConvTiling:
    """block_c: channels per program (a power of two; a C below it runs one block of the next
    power of two >= C, masked); the launch's warps and stages (no loop: stages do not matter);
    `grid_order` (`_kernel_utils.launch_grid`): "row_fastest" runs one channel block of
    consecutive rows side by side (the block's weights shared through L2), "row_slowest" a row's
    blocks together (its slot's state read as one region); "head_slowest" needs a head
    axis: refused."""
    block_c: int
    num_warps: int
    num_stages: int = 1
    grid_order: str = "row_fastest"


# Measured best (eighth session, H200, batch 1 / 32 / 256): 512 channels over 4 warps, 4 per
# thread: 17.4 us at the 8B's batch 256 (63% of copy bandwidth), where 1024 channels took 27.7
# (1024 on 8 warps 17.5, 2048 on 8 warps 28.1); row-slowest launches were no faster.
TILING = ConvTiling(block_c=512, num_warps=4)


def conv_update(conv_state, window, weight, bias, slots, *, offset, activation, out_dtype,
                splits, tiling, interpret):
    """`pallas_kernels.conv.conv_update` on validated arguments. With `splits` each program's
    channel block lies in one piece (block_c then also divides every piece; below 16 channels
    the pieces are split by XLA after one output)."""
    t = resolve_tiling(tiling, TILING)
    C = conv_state.shape[2]
    block_c = masked_block("block_c", "channels C", C, t.block_c)
    pieces = splits
    if splits is not None:
        common = min(largest_pow2_divisor(n, t.block_c) for n in splits)
        if common >= 16:
            block_c = common
        else:
            pieces = None
    new_state, outs = _conv_update(
        conv_state, window, weight, bias, slots, block_c=block_c, grid_order=t.grid_order,
        offset=offset, activation=activation, out_dtype=out_dtype, pieces=pieces or (C,),
        num_warps=t.num_warps, num_stages=t.num_stages, interpret=interpret)
    if pieces is None:
        return finish(outs[0], None, out_dtype, splits), new_state
    return outs, new_state


def _kernel(slots_ref, weight_ref, bias_ref, window_ref, state_ref, new_state_ref, out_refs, *,
            block_c, grid_order, offset, activation, pieces):
    i, j = program_ids(grid_order, 2)
    slot = slots_ref[i]
    Km1, C = state_ref.shape[1], state_ref.shape[2]
    first = j * block_c
    cols = pl.ds(first, block_c)
    keep = first + lax.broadcasted_iota(jnp.int32, (block_c,), 0) < C
    taps = [jnp.int32(k) for k in range(Km1 + 1)]    # (the interpreter takes no Python ints)
    # seq = state + token, oldest first: K vectors [block_c] in their stored dtypes
    seq = [load(state_ref.at[slot, k, cols], keep) for k in taps[:-1]]
    seq.append(load(window_ref.at[i, taps[0], pl.ds(offset + first, block_c)], keep))
    w = [load(weight_ref.at[cols, k], keep).astype(F32) for k in taps]
    # ring.conv_window's sum, term by term in the same order, then xla.finish's activation
    out = sum(s.astype(F32) * wk for s, wk in zip(seq, w))
    if bias_ref is not None:
        out = out + load(bias_ref.at[cols], keep).astype(F32)
    if activation == "silu":
        out = jax.nn.silu(out)
    if len(pieces) == 1:
        store(out_refs[0].at[i, taps[0], cols], out.astype(out_refs[0].dtype), keep)
    else:                           # whole blocks: each lies in one piece
        for ref, start in zip(out_refs, itertools.accumulate((0,) + pieces[:-1])):
            pl.when((first >= start) & (first < start + ref.shape[2]))(functools.partial(
                store, ref.at[i, taps[0], pl.ds(first - start, block_c)], out.astype(ref.dtype)))
    write = keep & (slot != NULL_SLOT)
    for k in range(Km1):
        store(new_state_ref.at[slot, taps[k], cols], seq[k + 1].astype(new_state_ref.dtype),
              write)


@functools.partial(jax.jit, static_argnames=("block_c", "grid_order", "offset", "activation",
                                             "out_dtype", "pieces", "num_warps", "num_stages",
                                             "interpret"))
def _conv_update(conv_state, window, weight, bias, slots, *, block_c, grid_order, offset,
                 activation, out_dtype, pieces, num_warps, num_stages, interpret):
    """Returns (the pool, the out pieces [b, 1, n] for n in pieces)."""
    b, C = window.shape[0], conv_state.shape[2]
    kernel = functools.partial(_kernel, block_c=block_c, grid_order=grid_order, offset=offset,
                               activation=activation, pieces=pieces)
    new_state, outs = call(
        kernel, name="conv_update", grid=launch_grid((b, pl.cdiv(C, block_c)), grid_order),
        inputs=dict(slots_ref=slots, weight_ref=weight, bias_ref=bias, window_ref=window,
                    state_ref=conv_state),
        outputs=dict(new_state_ref=like(conv_state),
                     out_refs=tuple(jax.ShapeDtypeStruct((b, 1, n), out_dtype) for n in pieces)),
        aliases={"state_ref": "new_state_ref"}, num_warps=num_warps, num_stages=num_stages,
        interpret=interpret)
    return new_state, outs
