"""Input validation shared by the kernel families: one-line ValueErrors that name what is wrong.

Shapes are checked against symbolic dimensions (`Field` tables): the first array that has a
dimension binds it, every later one must agree, so a family states its layout once.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax.numpy as jnp

from pallas_kernels.ring import MAX_WINDOW

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
# read-only pass's num_stages; ring_block 0: the ring's rows in one copy); a tiling's other
# integer fields are sizes and counts, >= 1.
ZERO_FIELDS = ("fold_stages", "ring_block")
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


def check_shape(name: str, arr, shape: tuple) -> None:
    """`shape` may contain None for dimensions that are not checked."""
    ok = len(arr.shape) == len(shape) and all(
        s is None or a == s for a, s in zip(arr.shape, shape))
    if not ok:
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {want}")


def check_dtype(name: str, arr, allowed) -> None:
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
    """Checks `arrays` (a mapping name -> array) against a `Field` table, in table order.
    `dims` holds dimensions already known; returns them with the ones the table bound."""
    dims = dict(dims or {})
    for f in fields:
        arr = arrays[f.name]
        check_shape(f.name, arr, tuple(dims.get(d) for d in f.dims))
        dims.update(zip(f.dims, arr.shape))
        allowed = (arrays[f.dtypes].dtype,) if isinstance(f.dtypes, str) else f.dtypes
        check_dtype(f.name, arr, allowed)
    return dims


def check_pool(num_slots: int) -> None:
    check(num_slots >= 2, f"the pool needs slot 0 (null) plus at least one slot, has {num_slots}")


def check_state(state, dims, known) -> None:
    """A state pool [S, *dims] of a state dtype with the null slot and at least one more; `known`
    binds the dims."""
    check_pool(check_fields((Field("state", ("S", *dims), STATE_DTYPES),), {"state": state},
                            known)["S"])


def check_draft_slots(draft_slots, known) -> None:
    """The state-per-draft rows of a verify window: [b, T] int32."""
    check_fields((Field("draft_slots", ("b", "T"), INT32_ONLY),), {"draft_slots": draft_slots},
                 known)


def check_replay_cache(fields, buffers, counts, dims) -> int:
    """Validates a family's replay buffers (a NamedTuple laid out by `fields`, window dim "L",
    pool dim "S") and the counts [S] int32 against the known `dims`; returns the window L."""
    dims = check_fields(fields, buffers._asdict(), dims)
    L = dims["L"]
    check(is_pow2(L) and L <= MAX_WINDOW,
          f"window L = {L} must be a power of two in [1, {MAX_WINDOW}]")
    check_fields((Field("counts", ("S",), INT32_ONLY),), {"counts": counts}, dims)
    check_pool(dims["S"])
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


def resolve_tiling(tiling, default):
    """`tiling` if given (of the default's type), else the measured default."""
    if tiling is None:
        return default
    check(type(tiling) is type(default),
          f"tiling must be a {type(default).__name__}, got {type(tiling).__name__}")
    return tiling
