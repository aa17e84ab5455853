"""Input validation shared by the kernel families: one-line ValueErrors (TypeErrors for an
argument of the wrong kind) that name what is wrong.

Shapes are checked against symbolic dimensions (`Field` tables): the first array that has a
dimension binds it, every later one must agree, so a family states its layout once. Every
dimension must be >= 1 (no empty batch or axis).

Values (slot ids, ring counts, attention starts, expert ids, prompt lengths) are checked only
where they are concrete, i.e. known in Python (an eager call); under jit they are tracers and
stay the caller's contract (`concrete`).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.ring import MAX_WINDOW, NULL_SLOT

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
STATE_DTYPES = (jnp.float32, jnp.bfloat16)
F32_ONLY = (jnp.float32,)
INT32_ONLY = (jnp.int32,)
# Triton's L2 eviction policies of a load (a tiling's `state_eviction`).
EVICTION_POLICIES = ("evict_normal", "evict_first", "evict_last")
# How a Triton kernel's programs (row, head, tile) are launched (a tiling's `grid_order`, see
# `_kernel_utils.launch_grid`).
GRID_ORDERS = ("row_fastest", "row_slowest", "head_slowest")
# Where a Triton replay decode kernel gets its ring dot products (a tiling's `ring_scalars`):
# each program from the ring rows, or one XLA product per step before the launch.
RING_SCALARS = ("kernel", "xla")
# Who writes a verify window's per-row ring entries (Mamba-2's x, GDN's d; a verify tiling's
# `ring_write`): XLA after the kernel (`write_window`), or the kernel, whose programs own those
# rows. The group-shared entries (B, k) and the per-head scalars are XLA's either way: a fold
# reads them in other programs, which the window's rows would overwrite.
RING_WRITES = ("xla", "kernel")
# Who forms the dot products a Mosaic replay step takes as inputs (a tiling's `bc_products` /
# `key_products`): XLA (`ring.row_products`) or one Pallas launch (`ring_products`) before the
# kernel, or (GDN's verify with readout "mma") the kernel itself, by tf32 wgmmas.
PRODUCTS = ("xla", "pallas", "kernel")
# Tiling fields whose 0 has a meaning of its own (the Mosaic kernels' fold_stages 0: the
# read-only pass's num_stages; ring_block 0: the ring's rows in one copy), with that meaning; a
# tiling's other integer fields are sizes and counts, >= 1 (`check_tiling_fields`).
ZERO_FIELDS = {"fold_stages": "num_stages", "ring_block": "the whole ring"}
# Which ring rows a Triton replay decode program fetches (a tiling's `ring_loads`): those below
# the count, or all L (the loads then need not wait for the count's).
RING_LOADS = ("committed", "all")
# How a tile bound covers its axis (a tiling's `p_tiles`): "divide", the largest power of two
# dividing the axis (`bounded_block`); "masked", the bound itself, the last tile masked
# (`masked_block`).
TILE_MODES = ("divide", "masked")


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_choice(name: str, value, choices) -> None:
    check(value in choices,
          f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_array(name: str, arr) -> None:
    """A TypeError unless `arr` is an array (jax or NumPy: has a shape and a dtype), e.g. for
    slots given as a Python list."""
    if not (hasattr(arr, "shape") and hasattr(arr, "dtype")):
        raise TypeError(f"{name} must be an array (jax.Array or numpy.ndarray), got "
                        f"{type(arr).__name__}")


def check_arrays(**arrays) -> None:
    """`check_array` of each named argument (before reading their shapes)."""
    for name, arr in arrays.items():
        check_array(name, arr)


def check_shape(name: str, arr, shape: tuple) -> None:
    """`shape` may contain None for dimensions that are not checked."""
    check_array(name, arr)
    ok = len(arr.shape) == len(shape) and all(
        s is None or a == s for a, s in zip(arr.shape, shape))
    if not ok:
        want = ", ".join("*" if s is None else str(s) for s in shape)
        want = f"({want},)" if len(shape) == 1 else f"({want})"
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {want}")


def check_nonempty(name: str, arr) -> None:
    """Every dimension >= 1: a batch of 0 rows or an empty axis is refused, not run."""
    check(0 not in arr.shape, f"{name} has shape {tuple(arr.shape)}: every dimension must be "
                              f">= 1 (no empty batch or axis)")


def check_dtype(name: str, arr, allowed) -> None:
    check_array(name, arr)
    if jnp.dtype(arr.dtype) not in [jnp.dtype(a) for a in allowed]:
        names = ", ".join(jnp.dtype(a).name for a in allowed)
        raise ValueError(f"{name} has dtype {jnp.dtype(arr.dtype).name}, expected one of: {names}")


@dataclasses.dataclass(frozen=True)
class Field:
    """One array of a layout: its name, symbolic dims (e.g. ("S", "H", "L", "P")) and allowed
    dtypes, or the name of an earlier field whose dtype it must share."""
    name: str
    dims: tuple[str, ...]
    dtypes: tuple | str


def check_fields(fields, arrays, dims=None) -> dict[str, int]:
    """Checks `arrays` (a mapping name -> array) against a `Field` table, in table order: each
    an array of its dims (all >= 1) and dtype. `dims` holds dimensions already known; returns
    them with the ones the table bound."""
    dims = dict(dims or {})
    for f in fields:
        arr = arrays[f.name]
        check_shape(f.name, arr, tuple(dims.get(d) for d in f.dims))
        check_nonempty(f.name, arr)
        dims.update(zip(f.dims, arr.shape))
        allowed = (arrays[f.dtypes].dtype,) if isinstance(f.dtypes, str) else f.dtypes
        check_dtype(f.name, arr, allowed)
    return dims


def check_pool(num_slots: int) -> None:
    check(num_slots >= 2, f"the pool needs slot 0 (null) plus at least one slot, has {num_slots}")


def is_concrete(arr) -> bool:
    """Whether `arr`'s values can be read here: not a tracer (under jit) nor an array partly on
    other processes."""
    return not (isinstance(arr, jax.core.Tracer)
                or (isinstance(arr, jax.Array) and not arr.is_fully_addressable))


def concrete(arr):
    """`arr`'s values as a NumPy array where they are known in Python (an eager call), else None
    (`is_concrete`): value checks never trigger a trace-time error and never run inside jit."""
    if not is_concrete(arr):
        return None
    try:
        return np.asarray(arr)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _at(name: str, flat: int, shape) -> str:
    """`name[i]` / `name[i, j]` of flat index `flat` into an array of `shape`."""
    return f"{name}[{', '.join(map(str, np.unravel_index(flat, shape)))}]"


def check_range(name: str, arr, lo: int, hi: int, what: str, mask=None) -> None:
    """Concrete values of `arr` (those under `mask`, a bool array broadcasting to it, if given)
    in [lo, hi]; the first one out of it is named with `what` (e.g. "the pool [0, 4)")."""
    v = concrete(arr)
    if v is None:
        return
    bad = (v < lo) | (v > hi)
    if mask is not None:
        m = concrete(mask)
        if m is None:
            return
        bad &= np.broadcast_to(m, bad.shape)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{_at(name, i, v.shape)} = {v.flat[i]} is outside {what}")


def check_slots(name: str, slots, num_slots: int, live=None) -> None:
    """Concrete slot ids (any shape) in the pool [0, num_slots), and no slot other than the
    null slot named twice (two rows on one slot race; padding rows all name NULL_SLOT, which is
    legal). live: a bool array broadcasting to `slots`, the entries that must be distinct
    (None: every non-null one). Traced slots are the caller's contract (`concrete`)."""
    v = concrete(slots)
    if v is None:
        return
    check_range(name, v, 0, num_slots - 1, f"the pool [0, {num_slots})")
    keep = v != NULL_SLOT
    if live is not None:
        m = concrete(live)
        if m is None:
            return
        keep &= np.broadcast_to(m, v.shape)
    named, counts = np.unique(v[keep], return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{name}: slot {named[counts > 1][0]} is named more than once (rows "
                         f"must name distinct slots; only the null slot {NULL_SLOT} may repeat)")


def check_counts(counts, window: int) -> None:
    """Concrete ring counts in [0, L - 1] (the ring contract, `pallas_kernels.ring`)."""
    check_range("counts", counts, 0, window - 1, f"[0, L - 1 = {window - 1}] (window L = "
                                                 f"{window})")


def check_state(state, dims, known, slots) -> None:
    """A state pool [S, *dims] of a state dtype with the null slot and at least one more, and
    the rows' `slots` in it (`check_slots`); `known` binds the dims."""
    S = check_fields((Field("state", ("S", *dims), STATE_DTYPES),), {"state": state}, known)["S"]
    check_pool(S)
    check_slots("slots", slots, S)


def check_draft_slots(draft_slots, known, slots, num_slots: int) -> None:
    """The state-per-draft rows of a verify window: [b, T] int32 in the pool [0, S), the non-null
    draft rows of the live rows (slots[i] != NULL_SLOT) distinct (a padding row writes none:
    its draft rows may repeat)."""
    check_fields((Field("draft_slots", ("b", "T"), INT32_ONLY),), {"draft_slots": draft_slots},
                 known)
    s = concrete(slots)
    if s is None:           # the rows unknown: the range only
        check_range("draft_slots", draft_slots, 0, num_slots - 1, f"the pool [0, {num_slots})")
    else:
        check_slots("draft_slots", draft_slots, num_slots, live=(s != NULL_SLOT)[:, None])


def check_buffers(fields, buffers) -> dict:
    """A family's replay buffers, the NamedTuple laid out by `fields`, as a name -> array map;
    a TypeError naming the fields for anything else (a plain tuple, another family's)."""
    names = tuple(f.name for f in fields)
    if not (isinstance(buffers, tuple) and getattr(buffers, "_fields", None) == names):
        raise TypeError(f"buffers must be the family's NamedTuple of ({', '.join(names)}), got "
                        f"{type(buffers).__name__}")
    return buffers._asdict()


def check_replay_cache(fields, buffers, counts, dims, slots) -> int:
    """Validates a family's replay buffers (a NamedTuple laid out by `fields`, window dim "L",
    pool dim "S"), the counts [S] int32 in [0, L - 1] against the known `dims` and the rows'
    `slots` in the pool (`check_slots`); returns the window L."""
    dims = check_fields(fields, check_buffers(fields, buffers), dims)
    L = dims["L"]
    check(is_pow2(L) and L <= MAX_WINDOW,
          f"window L = {L} must be a power of two in [1, {MAX_WINDOW}]")
    check_fields((Field("counts", ("S",), INT32_ONLY),), {"counts": counts}, dims)
    check_pool(dims["S"])
    check_counts(counts, L)
    check_slots("slots", slots, dims["S"])
    return L


def is_int(x) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def largest_pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two that divides `n` and is <= `cap`."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def pick_block(name: str, dim_name: str, dim: int, block: int | None, cap: int,
               minimum: int = 1) -> int:
    """A power-of-two tile dividing `dim`: `block` if given, else the largest one <= cap."""
    if block is None:
        block = largest_pow2_divisor(dim, cap)
    check(is_pow2(block) and dim % block == 0,
          f"{name} = {block} must be a power of two dividing {dim_name} = {dim}")
    check(block >= minimum, f"{dim_name} = {dim} has no power-of-two tile >= {minimum} dividing it")
    return block


def bounded_block(name: str, dim_name: str, dim: int, bound: int, minimum: int = 1) -> int:
    """The tile a tiling's bound gives: the largest power of two dividing `dim` and <= `bound`
    (a power of two itself), at least `minimum`."""
    check(is_pow2(bound), f"{name} = {bound} must be a power of two")
    return pick_block(name, dim_name, dim, None, bound, minimum)


def masked_block(name: str, dim_name: str, dim: int, bound: int, minimum: int = 1) -> int:
    """The tile of a masked tiling (tiles need not divide `dim`: the last one is masked): the
    bound itself (a power of two, at least `minimum`), or the smallest power of two >= `dim`
    if that is less (no tile larger than the axis needs)."""
    check(is_pow2(bound), f"{name} = {bound} must be a power of two")
    check(bound >= minimum, f"{name} = {bound} must be at least {minimum}")
    return min(bound, max(minimum, 1 << max(dim - 1, 0).bit_length()))


def fold_uses_dot(fold: str, window: int, **tiles) -> bool:
    """Resolves a kernel's `fold` option: "dot" (tensor cores; needs L and the tiles >= 16),
    "fma" (rank-1 updates) or "auto" (dot where it can)."""
    check(fold in ("auto", "dot", "fma"), f"fold must be 'auto', 'dot' or 'fma', got {fold!r}")
    dot_ok = min(window, *tiles.values()) >= 16
    names = ", ".join(f"{k} = {v}" for k, v in tiles.items())
    check(fold != "dot" or dot_ok,
          f"fold='dot' needs L and the tiles >= 16 (L = {window}, {names})")
    return fold == "dot" or (fold == "auto" and dot_ok)


def for_window(tilings, T: int):
    """The tiling of `tilings` ((largest window T it is for, tiling), ... ascending T) for a
    verify window of T tokens."""
    return next(t for max_t, t in tilings if T <= max_t)


def check_tiling_fields(tiling) -> None:
    """The rule every tiling dataclass (Triton and Mosaic GPU) shares: each integer field is an
    integer (Python or NumPy, not a bool), >= 1 (sizes and counts), or >= 0 for `ZERO_FIELDS`;
    num_warps a power of two."""
    for f in dataclasses.fields(tiling):
        if f.type not in ("int", int):
            continue
        v = getattr(tiling, f.name)
        low = 0 if f.name in ZERO_FIELDS else 1
        note = f" (0: {ZERO_FIELDS[f.name]})" if low == 0 else ""
        check(is_int(v), f"{f.name} = {v!r} must be an integer >= {low}{note}")
        check(v >= low, f"{f.name} = {v!r} must be >= {low}{note}")
        check(f.name != "num_warps" or is_pow2(v), f"num_warps = {v} must be a power of two")


def resolve_tiling(tiling, default):
    """`tiling` if given (of the default's type, its fields checked: `check_tiling_fields`),
    else the measured default."""
    if tiling is None:
        return default
    check(type(tiling) is type(default),
          f"tiling must be a {type(default).__name__}, got {type(tiling).__name__}")
    check_tiling_fields(tiling)
    return tiling
