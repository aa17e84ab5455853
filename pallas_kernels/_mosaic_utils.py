"""Pieces shared by the Mosaic GPU kernels (`pallas_mosaic_gpu.py` of each family).

The one module that knows how a Mosaic GPU kernel is launched: `plgpu.kernel` over a named grid,
in-place pools as mutable refs (`jax.new_ref` in, `jax.freeze` out: the pool becomes an aliased
input/output of the kernel, as `input_output_aliases` does for `pallas_call`), and the Mosaic GPU
interpreter off the GPU (`plgpu.InterpretGPUParams`: simulated GMEM/SMEM, TMA and barriers).

Mosaic GPU programs one warpgroup (128 threads) per CTA on whole register arrays with explicit
layouts. The kernels hold a state tile [64, block_n] in the WGMMA layout (64 rows per
warpgroup, columns in multiples of 8), per-row vectors [64] in its row reduction (`ROW`) and
per-column vectors [block_n] in its column reduction (`COL`); scalars are uniform values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu.fragmented_array import Tiling
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.validation import (
    PRODUCTS,
    RING_WRITES,
    bounded_block,
    check,
    check_choice,
    for_window,
    resolve_tiling,
)

F32 = jnp.float32
# One warpgroup holds a [64, n] tile in the WGMMA register layout (m % 64 == 0, n % 8 == 0).
TILE_ROWS = 64
ROW = plgpu.Layout.WGMMA.reduce(1)        # [64] vectors: one value per tile row
COL = plgpu.Layout.WGMMA.reduce(0)        # [n] vectors: one value per tile column
# What a replay kernel's CTA does before its state stream (a tiling's `prologue`): "serial"
# lands its vectors and walks the ring first; "overlap" starts the stream at once (the module
# docstrings of the families say more); GDN's "fused" too, its walk then updating S0 x in place.
PROLOGUES = ("serial", "overlap", "fused")
# How a replay kernel forms S0 x from its checkpoint chunks (a tiling's `readout`): "fma"
# multiplies each chunk by the vectors x on the FMA units and sums its columns, two operations a
# state element and vector; "mma" splits each fp32 chunk into a tf32 high part and the exact
# rest and reads both with tf32 wgmmas against all the vectors at once (`mma_step`), a few
# operations a state element for any number of vectors (a verify window's 2T); "fma_deferred"
# is "fma" with each vector's column sums deferred to the stream's end (`fma_columns`);
# "fma_rows" reads each chunk with a thread a row (`rows_layout`): its sums are in-thread adds.
READOUTS = ("fma", "mma", "fma_deferred", "fma_rows")


def rows(v, shape):
    """A ROW vector [m] broadcast along the columns of `shape` [m, n]."""
    return lax.broadcast_in_dim(v, shape, (0,))


def cols(v, shape):
    """A COL vector [n] broadcast along the rows of `shape` [m, n]."""
    return lax.broadcast_in_dim(v, shape, (1,))


def zeros_row(dtype=F32, tile_rows=TILE_ROWS):
    """A ROW vector [tile_rows] of zeros."""
    return plgpu.layout_cast(jnp.zeros((tile_rows,), dtype), ROW)


def select(pred, on_true, on_false):
    """`where` with a scalar predicate (Mosaic GPU does not broadcast a select implicitly)."""
    return jnp.where(lax.broadcast_in_dim(pred, jnp.shape(on_true), ()), on_true, on_false)


def issue_all(bars, *copies, start=0):
    """TMA copies GMEM -> SMEM, (src, dst) each, all in flight at once (copy i completes
    barrier start + i of `bars`), without waiting: returns copy i's (barrier, condition) at
    index i, to wait on once (`wait_all`) before its dst is read. A copy (src, dst, cond) is
    issued, and then waited on, only where the traced bool cond holds (`ring_row_copies`); a
    copy (src, dst) always (condition None)."""
    landed = []
    for i, (src, dst, *cond) in enumerate(copies):
        landed.append((bars.at[start + i], cond[0] if cond else None))
        _when(landed[-1][1], functools.partial(plgpu.copy_gmem_to_smem, src, dst,
                                               landed[-1][0]))
    return landed


def wait_all(landed):
    """Waits until the copies of `landed` (from `issue_all`) that were issued have landed."""
    for bar, cond in landed:
        _when(cond, functools.partial(plgpu.barrier_wait, bar))


def _when(cond, fn):
    """fn() where the traced bool cond holds, or always for cond None."""
    if cond is None:
        fn()
    else:
        pl.when(cond)(fn)


def ring_row_copies(src, dst, count, block):
    """The copies of a ring's per-token rows src [L, R] (GMEM) into dst [L, R] (SMEM) that a
    walk over its `count` committed entries reads: with block 0 all L rows in one copy, else
    blocks of `block` rows, each copied only where an entry in it is committed (count > its
    first row): at a uniform count about (L - 1) / 2 + block / 2 of the L rows, not L. Entries
    past the count are never read (`issue_all` copies)."""
    L = src.shape[0]
    if not block:
        return [(src, dst)]
    return [(src.at[pl.ds(i, min(block, L - i))], dst.at[pl.ds(i, min(block, L - i))], count > i)
            for i in range(0, L, block)]


def ring_copies_count(L, block, heads=1):
    """The copies (barriers) of `heads` rings of L rows: by blocks (`ring_row_copies`) each
    ring's own, else one copy of them all."""
    return heads * pl.cdiv(L, block) if block else 1


def load_all(bars, *copies, start=0):
    """`issue_all` then `wait_all`: returns when every copy has landed."""
    wait_all(issue_all(bars, *copies, start=start))


def wait_on_first_step(n, landed):
    """In a pipeline body at step n: waits for the copies of `landed` on step 0 only (a barrier
    completes once; the later steps read what step 0 saw land)."""
    @pl.when(n == 0)
    def _():
        wait_all(landed)


# A TMA copy's size and GMEM offset are multiples of 16 bytes; its SMEM address is 128-byte
# aligned (`state_spec`).
_TMA_BYTES, _SMEM_ALIGN = 16, 128


@dataclasses.dataclass(frozen=True)
class VectorPack:
    """Small 1-D SMEM vectors in one buffer per dtype, each at a 128-byte aligned offset (so
    each may be a TMA source or destination). Every scratch buffer takes a 1024-byte aligned
    slot: on their own, the replay kernels' vectors (x, B, C, the ring's appended rows, the
    walk's scalars: under 1.5 KiB in all) took 1 KiB each, and with them an fp32 replay CTA
    did not leave room for a third one on an SM.

    vectors: (name, rows, length, dtype name) each (`of`): `rows` vectors of `length`, or one
    if rows is None. `smem()` is the scratch type (a dict dtype name -> SMEM buffer);
    `views(bufs)` turns those buffers into a namespace name -> vector ref [length] (a tuple of
    `rows` of them where rows is given)."""
    vectors: tuple[tuple[str, int | None, int, str], ...]

    @classmethod
    def of(cls, **vectors):
        """A pack of name=(length, dtype) vectors, or name=((rows, length), dtype) rows."""
        return cls(tuple((name, *(n if isinstance(n, tuple) else (None, n)), jnp.dtype(dt).name)
                         for name, (n, dt) in vectors.items()))

    def _offsets(self):
        """name -> offsets (elements) of its rows in its dtype's buffer, and dtype name ->
        buffer length."""
        ends, offsets = {}, {}
        for name, rows, n, dt in self.vectors:
            step = _SMEM_ALIGN // jnp.dtype(dt).itemsize
            size = pl.cdiv(n, step) * step
            offsets[name] = [ends.get(dt, 0) + r * size for r in range(rows or 1)]
            ends[dt] = offsets[name][-1] + size
        return offsets, ends

    def smem(self):
        return {dt: plgpu.SMEM((n,), jnp.dtype(dt)) for dt, n in self._offsets()[1].items()}

    def views(self, bufs):
        offsets, _ = self._offsets()
        views = {}
        for name, rows, n, dt in self.vectors:
            refs = tuple(bufs[dt].at[pl.ds(off, n)] for off in offsets[name])
            views[name] = refs if rows else refs[0]
        return types.SimpleNamespace(**views)


def scalar_vectors(*pairs):
    """Per-entry scalars a loop reads (the ring walks), off GMEM latency: each fp32 vector
    src [n] in GMEM is copied whole by TMA into its SMEM vector dst [n] (`VectorPack`), given
    as (src, dst) pairs. Returns (the copies, for `load_all`; per vector a reader j -> src[j]
    from SMEM). A vector TMA cannot copy (n * 4 bytes not a multiple of 16, so neither is its
    offset in a pool of such rows: rings of L < 4, in tests) is read from GMEM instead."""
    copies, readers = [], []
    for src, dst in pairs:
        (n,) = src.shape
        if n * 4 % _TMA_BYTES:
            readers.append(lambda j, src=src: src[j])
        else:
            copies.append((src, dst))
            readers.append(lambda j, dst=dst: dst[j])
    return copies, readers


def store_async(value, smem, dst):
    """Registers -> SMEM -> GMEM (TMA); wait with `plgpu.wait_smem_to_gmem` before reusing
    `smem` or ending the kernel."""
    smem[...] = value.astype(smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, dst)


def rows_box(t, tile_rows=TILE_ROWS):
    """The box of tile t (of tile_rows rows, 64 or a multiple) along a state dim
    (`tile_rows_of`): what its loads copy (a TMA load fills rows past the dim's end with
    zeros). Its stores go through `store_rows`."""
    return pl.ds(t * tile_rows, tile_rows)


def store_rows(value, smem, dst, t):
    """`store_async` of tile t's rows [m] (a ROW vector, m = smem's length: 64 or a multiple) to dst
    [R] in GMEM, the whole vector of a state dim of R rows. A TMA copy of a vector to GMEM is a bulk
    copy, bounded by the whole array rather than by its last dim, as tensor copies (loads, the
    swizzled state chunks) are: a ragged tile's 64-row box would write the next head's rows (the
    interpreter clips at the dim, so only the GPU shows it). So the ragged tile copies its R % m
    rows only."""
    smem[...] = value.astype(smem.dtype)
    plgpu.commit_smem()
    m = smem.shape[-1]
    full, rem = divmod(dst.shape[-1], m)
    if not rem:
        plgpu.copy_smem_to_gmem(smem, dst.at[rows_box(t, m)])
        return
    nbytes = rem * jnp.dtype(dst.dtype).itemsize
    check(nbytes % _TMA_BYTES == 0,
          f"pallas_mosaic_gpu needs a ragged tile's rows in multiples of {_TMA_BYTES} bytes: "
          f"{dst.shape[-1]} % {m} = {rem} rows of {jnp.dtype(dst.dtype).name} are "
          f"{nbytes} bytes")

    @pl.when(t < full)
    def _():
        plgpu.copy_smem_to_gmem(smem, dst.at[rows_box(t, m)])

    @pl.when(t == full)
    def _():
        plgpu.copy_smem_to_gmem(smem.at[pl.ds(0, rem)], dst.at[pl.ds(full * m, rem)])


def write_out(value, live, smem, dst, t):
    """Tile t's rows of an output vector through `smem` to dst [R] (see `store_rows`): zeros for
    padding rows."""
    store_rows(select(live, value, jnp.zeros_like(value)), smem, dst, t)


def state_block(name, dim_name, dim, bound, state_dtype):
    """The state chunk a tiling's `bound` gives (`bounded_block`): at least 8 columns (the WGMMA
    layout) and rows of at least 32 bytes (Mosaic GPU swizzles 32, 64 or 128 bytes; a bf16 chunk
    of 8 would need a 16-byte one)."""
    block = bounded_block(name, dim_name, dim, bound, 8)
    dtype = jnp.dtype(state_dtype)
    check(block * dtype.itemsize >= 32,
          f"pallas_mosaic_gpu needs state chunk rows of >= 32 bytes: {name} = {block} of a "
          f"{dtype.name} state is {block * dtype.itemsize}")
    return block


def measured_tiling(defaults, op, T=1):
    """A family's measured tiling of `op` for a window of T tokens: `defaults[op]`, a tiling, or
    ((largest T, tiling), ...) rows by window (`validation.for_window`)."""
    tiling = defaults[op]
    return for_window(tiling, T) if isinstance(tiling, tuple) else tiling


def auto_takes(op, auto_ops, rows, resolve, ragged_ops=frozenset()) -> bool:
    """Whether impl="auto" runs op's Mosaic kernel on sm90 (a family's `takes`): op is one of
    `auto_ops` (the measured winners), its state dim of `rows` splits into whole 64-row tiles,
    or op is one of `ragged_ops` (those that also won with a ragged last tile, `tile_rows_of`)
    and that tile's rows fill whole 16-byte stores of bf16 (`store_rows`), and resolve() (its
    default tiling for the call's shapes) raises no ValueError."""
    ragged = rows % TILE_ROWS
    if op not in auto_ops or (ragged and (op not in ragged_ops or ragged % 8)):
        return False
    try:
        resolve()
    except ValueError:
        return False
    return True


def resolve_tiles(tiling, default, *, field, chunk, max_chunk, state_dtype, verify=False,
                  fold=False, readout=False, products=None, kernel_products=False,
                  prologues=PROLOGUES):
    """A family's validated launch tiles {field: state chunk width, "num_stages": n,
    "prologue": one of its `prologues`} for `tiling` (None: `default`), with `verify` also
    "ring_write" (one of `validation.RING_WRITES`) and with `fold` (the replay decodes, whose
    fold has its own SMEM scope) "fold_stages" (0 in the tiling: num_stages), "fold_buffers"
    (1 or 2) and "ring_block" (>= 0, `ring_row_copies`), with `readout` "readout" (one of
    READOUTS; "mma" for a float32 state only: a default's "mma" reads other states by FMAs),
    with `products` (the name of the tiling's field that says who forms the replay's dot
    products) "products" (one of `validation.PRODUCTS`; "kernel" only where
    `kernel_products`: the caller checks what it needs):
    chunk = (name, size) of the dim streamed in chunks of `field` (at most `max_chunk`: its
    vectors are one TMA box each; the name ends in the dim's letter, "d_state N"). The other
    state dim, split into one warpgroup's 64-row tiles, may have any size (`tile_rows_of`)."""
    t = resolve_tiling(tiling, default)     # integer fields >= 1 (>= 0: ZERO_FIELDS) there
    chunk_name, C = chunk
    check(C <= max_chunk, f"pallas_mosaic_gpu needs {chunk_name} <= {max_chunk}, "
          f"got {chunk_name.split()[-1]} = {C}")
    check_choice("prologue", t.prologue, prologues)
    tiles = {field: state_block(field, chunk_name, C, getattr(t, field), state_dtype),
             "num_stages": t.num_stages, "prologue": t.prologue}
    if verify:
        check_choice("ring_write", t.ring_write, RING_WRITES)
        tiles["ring_write"] = t.ring_write
    if readout:
        check_choice("readout", t.readout, READOUTS)
        fp32 = jnp.dtype(state_dtype) == F32
        # a measured default's "mma" was measured on fp32 states: other states read by FMAs
        tiles["readout"] = t.readout if fp32 or tiling is not None else "fma"
        check(tiles["readout"] != "mma" or fp32,
              f"readout = 'mma' needs a float32 state, got {jnp.dtype(state_dtype).name}")
    if fold:
        check(t.fold_buffers in (1, 2), f"fold_buffers = {t.fold_buffers} must be 1 or 2")
        tiles.update(fold_stages=t.fold_stages or t.num_stages, fold_buffers=t.fold_buffers,
                     ring_block=t.ring_block)
    if products:
        choices = tuple(p for p in PRODUCTS if kernel_products or p != "kernel")
        check_choice(products, getattr(t, products), choices)
        tiles["products"] = getattr(t, products)
    return tiles


def tile_rows_of(R: int, tile_rows: int = TILE_ROWS) -> int:
    """The CTAs along a state dim of R rows: one per tile of tile_rows (64: one warpgroup's
    WGMMA tile; 128: two of them in one warpgroup's registers), the last one ragged when
    tile_rows does not divide R. A ragged tile needs no masks: its loads are TMA boxes
    (`rows_box`), which read rows past the dim's end as zeros, and so are its state chunk
    stores, which drop them; its vector stores copy its rows only (`store_rows`). Its CTA
    computes on zeros there and its results for them are dropped."""
    return pl.cdiv(R, tile_rows)


def state_layout(block, dtype):
    """SMEM transforms of a state chunk [tile rows, block]: 8-row tiles, swizzled as wide as
    the rows allow, so the warpgroup's WGMMA-layout reads and writes spread over the banks."""
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(block * bits, "the state chunk")
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def state_spec(state_dtype, block, tile_rows=TILE_ROWS, lead=()):
    """The BlockSpec of one [*lead, tile_rows, block] chunk of the state tile per pipeline step
    (swizzled; `lead`: untiled leading dims, the heads of a CTA that covers several).

    The pipelines stream the state only. Each of their SMEM buffers holds `num_stages` slots back
    to back, and a TMA tensor copy needs its SMEM address 128-byte aligned: a slot of a [block]
    vector (block x itemsize bytes) breaks that (64 bytes at block 32, bf16; CUDA reports
    CUDA_ERROR_MISALIGNED_ADDRESS), so the kernels copy their vectors whole before the pipeline
    and read chunks of them with `chunk` (a register load, no alignment rule)."""
    return plgpu.BlockSpec((*lead, tile_rows, block), lambda n: (*(0 for _ in lead), 0, n),
                           transforms=state_layout(block, state_dtype))


def chunk(ref, n, block, layout=COL):
    """Chunk n [block] of the SMEM vector `ref` [N] as a COL vector (or in `layout`), fp32."""
    return plgpu.load(ref.at[pl.ds(n * block, block)], layout=layout).astype(F32)


def rows_layout(R):
    """The register layout of readout "fma_rows" for a state chunk [R, block] (R 64 or a
    multiple of 128, block % 8 == 0; 64 for a float32 state only, `check_rows_readout`): a
    thread holds 4-element column
    vectors of one row, all of the chunk's columns at R % 128 == 0 (lane l of warp w: row
    32 w + l), half of them at R = 64 (lanes l and l + 16 share row 16 w + l % 16). In the
    WGMMA layout a thread holds 8-byte column pairs of 8 rows, and a warp's reads of a 128-byte
    swizzled chunk come out as pairs to swap (32 selects a 32-key chunk of 128 rows, by
    ptxas); here every read is a vector load from a loop-invariant address (the swizzle spreads
    a warp's rows over the banks), a row sum is in-thread adds (and one lane shuffle at 64
    rows), and the vectors' columns are uniform loads (`layout.reduce(0)`, replicated over the
    rows). With `fma_rows`'s deferred sums, the GDN replay's read-only loop body is 175
    instructions a 32-key chunk of 128 rows (64 FFMAs; ~150 on the steps after the first,
    which converts bf16 q, k) against 268 ("fma") and 217 ("fma_deferred"), by
    `scripts/mosaic_ptxas.py --sass`."""
    if R % 128 == 0:
        return plgpu.Layout.TILED(Tiling(((128, 4), (32, 4))), warp_dims=(-4,),
                                  lane_dims=(-2,), vector_dim=-1)
    check(R == TILE_ROWS, f"readout 'fma_rows' needs 64 or a multiple of 128 rows, got {R}")
    return plgpu.Layout.TILED(Tiling(((64, 8), (16, 8), (4,))), warp_dims=(-5,),
                              lane_dims=(-2, -3), vector_dim=-1)


def check_rows_readout(readout, tile_rows, state_dtype):
    """ValueError (one line) where readout "fma_rows" cannot take the tiles: 64-row ones of a
    non-float32 state (Mosaic's layout inference finds no transfer of a bf16 chunk in
    `rows_layout(64)`)."""
    check(readout != "fma_rows" or tile_rows % 128 == 0 or jnp.dtype(state_dtype) == F32,
          "readout 'fma_rows' at 64-row tiles needs a float32 state, got "
          f"{jnp.dtype(state_dtype).name}")


def rows_slice(R):
    """The column slice of `rows_layout(R)` that one thread's registers hold whole: 4 at R % 128
    == 0, 8 at R = 64 (two lanes a row: 4 each)."""
    return 4 if R % 128 == 0 else 8


def fma_rows(acc, s, x, n, block):
    """acc + the products of a state chunk s [R, block] (`rows_layout`, converted to fp32) and
    chunk n of the SMEM vector x (fp32), summed over s's column slices only (`rows_slice`):
    acc [R, w] (the same layout) holds each thread's own columns, so a stream of chunks is one
    FMA a state element and vector (no FMULs or adds), and a row sum (`jnp.sum(acc, axis=1)`:
    in-thread adds, and one lane shuffle at 64 rows) comes once, at its end."""
    R, w = s.shape[0], acc.shape[1]
    xn = chunk(x, n, block, rows_layout(R).reduce(0))    # uniform loads, once a chunk
    for j in range(block // w):
        sj = lax.slice(s, (0, w * j), (R, w * (j + 1)))
        acc = acc + sj * cols(lax.slice(xn, (w * j,), (w * (j + 1),)), sj.shape)
    return acc


def zeros_rows(R):
    """The [R, rows_slice(R)] fp32 zero accumulator of `fma_rows` (`rows_layout`)."""
    return plgpu.layout_cast(jnp.zeros((R, rows_slice(R)), F32), rows_layout(R))


def relayout_rows(vectors):
    """[R] fp32 vectors (any register layouts) as ROW vectors, through an SMEM scratch of their
    own: each is stored in its layout and read back in the other, once a kernel (the
    warpgroup's barriers order the stores, the loads and the scratch's next user)."""
    R = vectors[0].shape[0]

    def moved(buf):
        for i, v in enumerate(vectors):
            buf.at[i][...] = v
        plgpu.commit_smem()
        out = tuple(plgpu.load(buf.at[i], layout=ROW) for i in range(len(vectors)))
        plgpu.commit_smem()
        return out
    return pl.run_scoped(moved, plgpu.SMEM((len(vectors), R), F32))


def fma_columns(acc, s, x, n, block):
    """acc + the products of a state chunk s [R, block] (WGMMA layout, fp32) and chunk n of the
    SMEM vector x, summed over s's 8-column slices only: acc [R, 8] (WGMMA layout) holds each
    thread's own columns, so a stream of chunks is one FMA a state element and vector, and the
    lane shuffles of a row sum (`jnp.sum(acc, axis=1)`) come once, at its end, instead of once
    a chunk (by ptxas, the GDN replay's read-only loop body 268 -> 217 instructions at
    block 32, two vectors)."""
    R = s.shape[0]
    for j in range(block // 8):
        sj = lax.slice(s, (0, 8 * j), (R, 8 * (j + 1)))
        acc = acc + sj * cols(chunk(x, n * (block // 8) + j, 8), sj.shape)
    return acc


def zeros_columns(rows):
    """An [rows, 8] fp32 zero accumulator in the WGMMA layout (`fma_columns`)."""
    return plgpu.layout_cast(jnp.zeros((rows, 8), F32), plgpu.Layout.WGMMA)


def dot(u, w, block):
    """u . w of two SMEM vectors [n] (any float dtypes) as an fp32 scalar: the products of each
    chunk of `block` (COL vectors, see `chunk`) summed, then the chunks' sums in order. A COL
    vector lies whole in every warp, so its sum takes lane shuffles only (no cross-warp
    reduction, no SMEM) and every thread holds the result. The replay kernels take their small
    per-group products this way instead of from an XLA op before the launch (one launch per
    layer and step: at batch 1 each extra op cost a few us of latency)."""
    (n,) = u.shape
    total = None
    for i in range(n // block):
        part = jnp.sum(chunk(u, i, block) * chunk(w, i, block))
        total = part if total is None else total + part
    return total


def tf32_hi(x):
    """x (fp32) with its 13 low mantissa bits cleared, a tf32 value; x - tf32_hi(x) is exact."""
    return lax.bitcast_convert_type(
        lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-(1 << 13)), F32)


def mma_operands(x, block):
    """The B operands of the "mma" readout (XLA, before the launch): vectors x [b, n, H, K]
    (any float dtype; n per row and head, e.g. a window's k_t then q_t) as fp32 rows
    [b, H, K // block, N, block] (N = n rounded up to 8, the extra rows zero; chunk c of K in
    [:, :, c], the layout `mma_step` reads), its tf32 high part and, for inputs a tf32 read
    would round (fp32), its exact rest: a list of one or two arrays."""
    b, n, H, K = x.shape
    N = pl.cdiv(n, 8) * 8
    rows_ = jnp.pad(jnp.moveaxis(x.astype(F32), 1, 2), ((0, 0), (0, 0), (0, N - n), (0, 0)))
    hi = tf32_hi(rows_)
    parts = [rows_] if jnp.dtype(x.dtype).itemsize <= 2 else [hi, rows_ - hi]
    return [p.reshape(b, H, N, K // block, block).swapaxes(2, 3) for p in parts]


def mma_operand_smem(K, N, block):
    """The SMEM of one `mma_operands` array of a row and head: [K // block, N, block] fp32, each
    chunk tiled and swizzled as the state chunks are (a wgmma's operands share one swizzle)."""
    return plgpu.SMEM((K // block, N, block), F32, transforms=state_layout(block, F32))


def mma_step(acc, chunk_smem, lo_smem, operands, n):
    """acc [R, N] (a WGMMA accumulator ref) += S x_i for fp32 state chunk n (chunk_smem [R,
    block] in SMEM) and the rows x_i of `operands` (`mma_operands` in SMEM, `mma_operand_smem`).
    S = hi + lo: hi (`tf32_hi`) is written over the chunk and lo to lo_smem (its layout), so
    each tf32 wgmma reads its operand exactly (whether the hardware truncates or rounds);
    hi x_hi + hi x_lo + lo x_hi leaves out lo x_lo and the tf32 rounding of lo and x_lo, under
    2^-21 of |S| |x| in all (fp32 FMAs: 2^-24). Waits for the wgmmas: the pipeline may refill
    the chunk's buffer, and the next step rewrites lo_smem."""
    s = chunk_smem[...]
    hi = tf32_hi(s)
    chunk_smem[...] = hi
    lo_smem[...] = s - hi
    plgpu.commit_smem()                       # the stores, visible to the wgmmas (async proxy)
    for a, parts in ((chunk_smem, operands), (lo_smem, operands[:1])):
        for x in parts:
            plgpu.wgmma(acc, a, x.at[n].T)
    plgpu.wgmma_wait(0)


def chunk_products(rows_smem, lo_smem, operands, out_smem, *, block_rows):
    """The dot products of a few row vectors r with the vectors x_i of `operands` (the "mma"
    readout's, `mma_operands` in SMEM: [K // block, N, block] each), by tf32 wgmmas: r . x_i
    to out_smem[r, i] (out_smem [M, N] fp32).

    rows_smem [M, block] (fp32, `state_layout`) holds the rows chunk by chunk: chunk c of row
    r at row c * block_rows + r (block_rows * N a multiple of 128: the chunks' parts are summed
    by the whole warpgroup; M, a multiple of 64, may leave rows unwritten: they never mix into
    a written row's products). A wgmma's M is 64, and these rows are few (a ring's L keys):
    stacking the chunks fills its rows with the whole rows' bytes instead of zeros, and wgmma c
    (against chunk c of the x) keeps only its block's rows. rows_smem is split in place into
    its tf32 high part and the rest (to lo_smem, [M, block] in its layout), read as `mma_step`
    reads a state chunk (2^-21 of |r| |x| at most)."""
    nk, N, _ = operands[0].shape
    M = rows_smem.shape[0]
    s = rows_smem[...]
    hi = tf32_hi(s)
    rows_smem[...] = hi
    lo_smem[...] = s - hi
    plgpu.commit_smem()
    row = plgpu.broadcasted_iota(jnp.int32, (M, N), 0, layout=plgpu.Layout.WGMMA)
    total = None
    for c in range(nk):
        def run(acc_ref, c=c):
            for a, parts in ((rows_smem, operands), (lo_smem, operands[:1])):
                for x in parts:
                    plgpu.wgmma(acc_ref, a, x.at[c].T)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        acc = pl.run_scoped(run, plgpu.ACC((M, N), F32))
        zero = jnp.zeros_like(acc)
        part = jnp.where(row >= c * block_rows,
                         jnp.where(row < (c + 1) * block_rows, acc, zero), zero)
        total = part if total is None else total + part
    out_smem[...] = total
    plgpu.commit_smem()
    if nk > 1:            # the chunks' parts, in order, to the first block (a strided layout:
        blocks = [out_smem.at[pl.ds(c * block_rows, block_rows)] for c in range(nk)]
        total = blocks[0][...]                # each thread sums and writes its own elements)
        for block in blocks[1:]:
            total = total + block[...]
        blocks[0][...] = total
        plgpu.commit_smem()                   # (a warpgroup barrier: every thread reads them)


def acc_column(acc, j):
    """Column j of a WGMMA accumulator value [R, N] as a ROW vector [R]."""
    iota = plgpu.broadcasted_iota(jnp.int32, acc.shape, 1, layout=plgpu.Layout.WGMMA)
    return jnp.sum(jnp.where(iota == j, acc, jnp.zeros_like(acc)), axis=1)


def staging_smem(block, dtype, buffers=2, tile_rows=TILE_ROWS, lead=()):
    """The staging area of state chunk writes [*lead, tile_rows, block] (see `write_chunk`):
    double-buffered, or with buffers=1 single (each write waits for the copy before it to have
    left)."""
    return plgpu.SMEM((buffers, *lead, tile_rows, block), dtype,
                      transforms=state_layout(block, dtype))


def write_chunk(value, n, out_smem, tile, block, live):
    """Writes state chunk n ([rows, block], or a tuple of them, one per leading index of a
    [*lead, rows, block] chunk) of `tile` (GMEM [*lead, rows, N]) if `live`, through an SMEM
    staging area out_smem [m, *lead, rows, block] of m buffers (`staging_smem`): the copy
    issued m chunks ago has left its buffer when at most m - 1 copies are still reading. The
    kernels' pipelines have inputs only: their output copies would write rows of the null slot
    too."""
    m = out_smem.shape[0]
    buf = out_smem.at[n % m]
    plgpu.wait_smem_to_gmem(m - 1, wait_read_only=True)
    if isinstance(value, tuple):
        for k, part in enumerate(value):
            buf.at[k][...] = part.astype(buf.dtype)
    else:
        buf[...] = value.astype(buf.dtype)
    plgpu.commit_smem()

    @pl.when(live)
    def _():
        lead = (slice(None),) * (tile.ndim - 1)
        plgpu.copy_smem_to_gmem(buf, tile.at[(*lead, pl.ds(n * block, block))])


def interpret_params(interpret: bool):
    """The Mosaic GPU interpreter for interpret mode, None (compiled) otherwise. It detects data
    races between TMA copies and SMEM accesses (little extra cost); unwritten outputs read NaN."""
    return plgpu.InterpretGPUParams(detect_races=True) if interpret else None


# Every reduction sums along a tile's rows (ROW results, within a warp: no SMEM). The default
# reserves 2 KiB of SMEM for cross-warp ones in each pipeline step's scope, which the fp32
# replay kernels need to fit 3 CTAs per SM (a cross-warp reduction now fails to lower).
_COMPILER_PARAMS = plgpu.CompilerParams(reduction_scratch_bytes=0)


def mosaic_call(kernel, *, name, grid, grid_names, inputs, outputs, inplace, scratch, interpret):
    """`plgpu.kernel` with named arguments: `inputs` (name -> array), `outputs`
    (name -> ShapeDtypeStruct) and `scratch` (name -> SMEM / Barrier type) are ordered dicts whose
    names are the kernel's ref parameters in order (checked); the inputs named in `inplace` are
    updated in place (donate them at the outer jit). An input or scratch given as None is not
    allocated and its parameter is None (what a tiling does not use). Returns (outputs tuple,
    updated inplace arrays tuple, in `inplace` order)."""
    refs = [p.name for p in inspect.signature(kernel).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD]
    if refs != [*inputs, *outputs, *scratch]:
        raise ValueError(f"{name}: inputs + outputs + scratch {[*inputs, *outputs, *scratch]} "
                         f"are not the kernel's refs {refs}")
    for n in inplace:
        if n not in inputs:
            raise ValueError(f"{name}: in-place {n!r} names no input of the kernel")
    args = {n: jax.new_ref(a) if n in inplace else a for n, a in inputs.items()
            if a is not None}
    given = [n for n, v in {**inputs, **outputs, **scratch}.items() if v is not None]

    def body(*given_refs):
        named = dict(zip(given, given_refs))
        kernel(*(named.get(n) for n in refs))
    outs = plgpu.kernel(
        body, out_type=tuple(outputs.values()),
        scratch_types=tuple(v for v in scratch.values() if v is not None),
        grid=grid, grid_names=grid_names, interpret=interpret_params(interpret),
        compiler_params=_COMPILER_PARAMS, kernel_name=name)(*args.values())
    return tuple(outs), tuple(jax.freeze(args[n]) for n in inplace)
