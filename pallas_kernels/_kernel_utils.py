"""Pieces shared by the Pallas kernel bodies and builders of every family.

This is the one module that knows the Triton backend (`compiler_params`); kernel bodies use only
backend-neutral Pallas (`ref[...]` indexing, `pl.when`, jnp math, `lax.dot_general`) so a Mosaic
GPU port changes the builders, not the math.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.validation import GRID_ORDERS, check, check_choice

F32 = jnp.float32


def compiler_params(num_warps, num_stages, interpret):
    if interpret:
        return None
    from jax.experimental.pallas import triton as pltr  # only the GPU path needs Triton
    return pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def like(a):
    """The output shape and dtype of array `a`."""
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


def alias_indices(inputs, outputs, aliases) -> dict[int, int]:
    """`input_output_aliases` by index from names: inputs and outputs are ordered name lists,
    aliases maps an input name to the output name that updates it in place."""
    for i, o in aliases.items():
        if i not in inputs or o not in outputs:
            raise ValueError(f"alias {i!r} -> {o!r} names no input / output of the kernel")
    return {list(inputs).index(i): list(outputs).index(o) for i, o in aliases.items()}


def call(kernel, *, name, grid, inputs, outputs, aliases, num_warps, num_stages, interpret):
    """`pl.pallas_call` with named arguments: `inputs` (name -> array, or None: the kernel gets
    None, an input a variant does without) and `outputs` (name -> ShapeDtypeStruct) are ordered
    dicts whose names are the kernel's ref parameters in order (checked); `aliases` maps input
    names to the output names that update them in place. Returns the outputs as a tuple."""
    refs = [p.name for p in inspect.signature(kernel).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD]
    if refs != [*inputs, *outputs]:
        raise ValueError(f"{name}: inputs + outputs {[*inputs, *outputs]} are not the kernel's "
                         f"refs {refs}")
    return pl.pallas_call(
        kernel,
        grid=grid,
        out_shape=tuple(outputs.values()),
        input_output_aliases=alias_indices([n for n, a in inputs.items() if a is not None],
                                           outputs, aliases),
        compiler_params=compiler_params(num_warps, num_stages, interpret),
        interpret=interpret,
        name=name,
    )(*inputs.values())


def launch_grid(dims, order):
    """The launch grid of a kernel with one program per (row, *inner) = `dims`, e.g. (batch,
    heads, tiles), in `order` (`validation.GRID_ORDERS`). Pallas Triton launches grid axis i as
    CUDA's blockIdx axis i, and the GPU hands out CTAs with blockIdx.x fastest:
      "row_fastest": `dims` as given: consecutive CTAs are the rows of one (head, tile);
      "row_slowest": reversed, (tiles, heads, batch): consecutive CTAs are the tiles, then the
        heads, of one row, so a row's programs run together (its ring / token reads shared
        through L2, its slot's state read as one region).
      "head_slowest" (3 axes): (tiles, batch, heads): consecutive CTAs are the tiles of one
        row, then the rows, of one head (the ReplaySSM authors' GDN launch).
    `program_ids(order, len(dims))` maps a program back to (row, *inner). Every Triton kernel
    builds its grid here, so a tiling's bad `grid_order` is refused here, in one line."""
    check_choice("grid_order", order, GRID_ORDERS)
    check(order != "head_slowest" or len(dims) == 3,
          f"grid_order 'head_slowest' needs a (row, head, tile) grid, got {len(dims)} axes")
    if order == "head_slowest":
        return (dims[2], dims[0], dims[1])
    return tuple(dims) if order == "row_fastest" else tuple(reversed(dims))


def program_ids(order, n=3):
    """This program's logical ids (row, *inner) in a grid of `n` axes built by `launch_grid` in
    `order` (checked there): int32 scalars."""
    ids = tuple(pl.program_id(i) for i in range(n))
    if order == "head_slowest":
        return ids[1], ids[2], ids[0]
    return ids if order == "row_fastest" else ids[::-1]


def ring_entries(ref, count, cols=None):
    """The ring rows of one slot, `ref` [L, ...] (a view: `ring.at[slot, h, :, tile]`), loaded
    with a mask: rows at positions >= count are never fetched (Triton issues no memory access
    for masked lanes) and read exactly 0. Callers still select them away with `where` (the ring
    contract). count None: all L rows are fetched (garbage past the count), so the load need
    not wait for the count's. `cols`: a [bp] mask of a masked tile's live columns
    (`tile_rows`; a [L, bp] view), or None. -> [L, ...] of the ring's dtype."""
    from jax.experimental.pallas import triton as pltr
    keep = (jnp.ones(ref.shape, jnp.bool_) if count is None
            else lax.broadcasted_iota(jnp.int32, ref.shape, 0) < count)
    if cols is not None:
        keep = keep & axis_mask(cols, ref.shape, 1)
    return pltr.load(ref, mask=keep, other=jnp.zeros((), ref.dtype))


def stream(ref, eviction, rows=None):
    """`ref[...]` loaded with the L2 eviction policy `eviction` (`validation.EVICTION_POLICIES`): a
    read-once stream such as the checkpoint marked "evict_first" leaves L2 to the data that is
    read again (rings, token vectors). The interpreter ignores the policy. `rows`: a [bp] mask of
    the view's first axis (`tile_rows`; masked rows are not fetched and read 0), or None."""
    from jax.experimental.pallas import triton as pltr
    if rows is None:
        return pltr.load(ref, eviction_policy=eviction)
    return pltr.load(ref, mask=axis_mask(rows, ref.shape, 0), other=jnp.zeros((), ref.dtype),
                     eviction_policy=eviction)


def tile_rows(t, block, dim):
    """(slice, mask) of tile `t` of `block` rows over an axis of `dim` rows: the mask, [block]
    bool, marks the rows < dim, and is None when `block` divides `dim` (every tile full: nothing
    masked, the kernel's IR unchanged). A tile that does not divide its axis reads and writes its
    live rows only (`load` / `store` / `stream` / `ring_entries` with the mask): the last tile's
    padding rows are never fetched (read 0) and never stored."""
    sl = pl.ds(t * block, block)
    if dim % block == 0:
        return sl, None
    return sl, t * block + lax.broadcasted_iota(jnp.int32, (block,), 0) < dim


def axis_mask(mask, shape, axis):
    """A [shape[axis]] mask broadcast along the other axes of `shape`."""
    return lax.broadcast_in_dim(mask, shape, (axis,))


def load(ref, rows=None):
    """`ref[...]`; with `rows` (a [n] mask of the view's first axis), masked rows are not fetched
    and read 0."""
    if rows is None:
        return ref[...]
    from jax.experimental.pallas import triton as pltr
    return pltr.load(ref, mask=axis_mask(rows, ref.shape, 0), other=jnp.zeros((), ref.dtype))


def store(ref, value, rows=None):
    """`ref[...] = value`; with `rows` (a [n] mask of the view's first axis), masked rows are not
    written (Triton issues no store for them: no write past the axis)."""
    if rows is None:
        ref[...] = value
        return
    from jax.experimental.pallas import triton as pltr
    pltr.store(ref, value, mask=axis_mask(rows, ref.shape, 0))


def dot_precision(interpret):
    """tf32x3 keeps fp32 accuracy (~1e-6) on tensor cores; the CPU interpreter takes HIGHEST."""
    return lax.Precision.HIGHEST if interpret else lax.DotAlgorithmPreset.TF32_TF32_F32_X3


def n_chunks(n, block, body, init):
    """fori_loop over chunks of a dimension of size n; body(slice, carry) -> carry."""
    return lax.fori_loop(0, n // block, lambda k, c: body(pl.ds(k * block, block), c), init)


def suffix_sums(v):
    """out[j] = sum_{i > j} v[i] for a [L] vector, as a masked [L, L] reduction (no cumsum, no
    cancellation)."""
    L = v.shape[0]
    jj = lax.broadcasted_iota(jnp.int32, (L, L), 0)
    ii = lax.broadcasted_iota(jnp.int32, (L, L), 1)
    return jnp.sum(jnp.where(ii > jj, v[None, :], 0.0), axis=1)


def masked_window(valid, cur, ring, token):
    """Ring rows below the count, the current token at the count, zeros after. Rows past the
    count are garbage (maybe NaN), so they are dropped with `where`, never multiplied by 0."""
    return jnp.where(valid[:, None], ring.astype(F32), jnp.where(cur[:, None], token[None, :], 0.0))


def outer_fold(lhs, rhs, precision, use_dot):
    """sum_j lhs[j, :]^T rhs[j, :] for lhs [L, M], rhs [L, K] -> [M, K] in fp32: a tensor-core dot
    (needs L, M, K >= 16) or L rank-1 updates on the FMA units."""
    if use_dot:
        return lax.dot_general(lhs, rhs, (((0,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=F32)
    L = lhs.shape[0]
    j = lax.broadcasted_iota(jnp.int32, (L,), 0)

    def rank1(k, acc):
        sel = (j == k)[:, None]
        a = jnp.sum(jnp.where(sel, lhs, 0.0), axis=0)
        b = jnp.sum(jnp.where(sel, rhs, 0.0), axis=0)
        return acc + a[:, None] * b[None, :]
    return lax.fori_loop(0, L, rank1, jnp.zeros((lhs.shape[1], rhs.shape[1]), F32))
