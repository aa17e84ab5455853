"""Shared helpers for the kernel families: implementation dispatch and validation.

Kernel bodies in this package use only backend-neutral Pallas (`ref[...]` indexing, `pl.when`,
`jnp` math, `lax.dot_general`), so the Triton lowering used today and a later Mosaic GPU port differ
only in the `pallas_call` builders (`compiler_params`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Pool slot 0 is reserved: rows of a batch whose slot index is NULL_SLOT are padding. Kernels write
# zeros to their outputs and never touch slot 0, so padded rows cost no branches and corrupt nothing.
NULL_SLOT = 0

IMPLS = ("auto", "pallas", "xla")


@functools.cache
def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def resolve_impl(impl: str) -> str:
    """`auto` means Pallas on an NVIDIA GPU and XLA elsewhere."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "pallas" if on_gpu() else "xla"
    return impl


def resolve_interpret(interpret: bool | None) -> bool:
    """Pallas runs compiled on GPU and in interpret mode everywhere else (CPU CI)."""
    return (not on_gpu()) if interpret is None else bool(interpret)


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


def use_fold_dot(fold: str, window: int, **tiles) -> bool:
    """Resolves a kernel's `fold` option: "dot" (tensor cores; needs L and the tiles >= 16),
    "fma" (rank-1 updates) or "auto" (dot where it can)."""
    check(fold in ("auto", "dot", "fma"), f"fold must be 'auto', 'dot' or 'fma', got {fold!r}")
    dot_ok = min(window, *tiles.values()) >= 16
    names = ", ".join(f"{k} = {v}" for k, v in tiles.items())
    check(fold != "dot" or dot_ok, f"fold='dot' needs L and the tiles >= 16 (L = {window}, {names})")
    return fold == "dot" or (fold == "auto" and dot_ok)


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


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


FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
STATE_DTYPES = (jnp.float32, jnp.bfloat16)


def row_index(slots, live, num_slots):
    """Scatter index for pool updates: padding rows point past the pool and are dropped."""
    return jnp.where(live, slots, num_slots)


def verify_folds(count, window_len: int, window: int):
    """Fold decision of a verify step over `window_len` tokens (T = 1 is plain decode): fold when
    the committed entries plus the window would fill the ring. The fold takes the committed ring
    entries plus the window's first token, which is always accepted (it was sampled last step)."""
    return count + window_len >= window


def write_window_rings(rings, values, counts, slots, window: int):
    """Writes a verify window into ring tensors (uncommitted): at count..count+T-1, or window[1:]
    at 0..T-2 for rows that fold (window[0] went into the checkpoint). rings: arrays
    [S, heads, L, ...]; values: matching [b, T, heads, ...]. Returns the new rings."""
    S, T = rings[0].shape[0], values[0].shape[1]
    count = counts[slots]
    idx = row_index(slots, slots != NULL_SLOT, S)
    s = jnp.arange(T)
    pos = jnp.where(verify_folds(count, T, window)[:, None], s - 1, count[:, None] + s)  # [b, T]
    i = jnp.where((pos >= 0) & (pos < window), idx[:, None], S)     # out of the pool: dropped
    p = jnp.clip(pos, 0, window - 1)
    # one scatter per ring: r[i, :, p] with i, p [b, T] addresses [b, T, heads, ...] = values
    return tuple(r.at[i, :, p].set(v.astype(r.dtype), mode="drop") for r, v in zip(rings, values))


def commit_counts(counts, slots, n_accepted, window_len: int, window: int):
    """Commit n_accepted (clamped to [1, T]) of a verify window per live row: the count becomes
    n - 1 after a fold (the first token went into the checkpoint) and count + n otherwise.
    Rejected entries stay in the ring past the count and are overwritten later: rollback is this
    cursor move. counts [S] int32 (shared by every SSM layer: once per model step), slots and
    n_accepted [b] int32; NULL_SLOT rows change nothing."""
    live = slots != NULL_SLOT
    c = counts[slots]
    n = jnp.clip(n_accepted, 1, window_len)
    new = jnp.where(verify_folds(c, window_len, window), n - 1, c + n).astype(counts.dtype)
    return counts.at[row_index(slots, live, counts.shape[0])].set(new, mode="drop")


def advance_counts(counts, slots, window: int):
    """Commit one decoded token per live row (T = 1): count + 1, or 0 after a fold."""
    return commit_counts(counts, slots, jnp.ones_like(slots), 1, window)


def to_chunks(t, valid, chunk: int):
    """Prefill input [b, T, ...] -> float32 [b, nc, chunk, ...]: positions where `valid` [b, T] is
    False are zeroed (NaN garbage too, so padded steps are identities) and T is padded to a
    multiple of `chunk`."""
    b, T = valid.shape
    nc = -(-T // chunk)
    t = jnp.where(valid.reshape(valid.shape + (1,) * (t.ndim - 2)), t.astype(jnp.float32), 0)
    t = jnp.pad(t, [(0, 0), (0, nc * chunk - T)] + [(0, 0)] * (t.ndim - 2))
    return t.reshape((b, nc, chunk) + t.shape[2:])
