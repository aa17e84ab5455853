"""The ring contract, shared by both families (Mamba-2, GDN) and every implementation.

Slots. A layer's cache is a pool of S slots; batch row i works on slot `slots[i]` ([b] int32),
and the rows of one call name distinct slots. Slot 0 is the null slot (`NULL_SLOT`): padded batch
rows point at it, ops write zeros to their outputs and nothing to any pool for them, so a fixed
batch shape needs no branches (pools are zero-initialised, so the null slot reads finite values).

Per slot: a checkpoint state, a ring of L entries (L a power of two <= `MAX_WINDOW`; Mamba-2:
post-conv x, B and dt after softplus; GDN: normalised k, the corrected update
d = beta (v - alpha S k), and g), and a committed count c in [0, L - 1].

Counts. Ring entries at positions >= c are garbage (possibly NaN) and are only ever selected away
with `where`, never multiplied by a mask. Every SSM layer of a model advances in lockstep, so one
[S] int32 array (`models.cache.ModelCache.counts`) serves all layers and is updated once per model
step (`advance_counts`, `commit_counts`). The ops only read it.

Decode (T = 1). The output comes from checkpoint + ring[0:c] + the current token in closed form,
without writing the state. When c == L - 1 the row folds ring + current token into the checkpoint
and the count becomes 0; otherwise the token is appended at c and the count becomes c + 1. So the
state is written once every L steps, and L = 1 is exactly the standard recurrence.

Verify (T tokens, 1 <= T <= min(`MAX_VERIFY_TOKENS`, L)). Outputs for every window token,
causally. A row folds when c + T >= L (`verify_folds`), folding ring[0:c] + window[0] (the token
sampled last step, always accepted) and writing window[1:] at 0..T-2; otherwise the window goes to
c..c+T-1 (`write_window_rings`). Window entries are uncommitted until the commit.

Commit and rollback. `commit_counts(counts, slots, n, T, L)` accepts n in [1, T] window tokens:
the count becomes n - 1 after a fold and c + n otherwise. Rejected tokens stay in the ring past
the count and are overwritten later: rollback is this cursor move. T = 1 with n = 1 is exactly
decode (`advance_counts`).

Conv state. A slot's conv state holds its last K - 1 pre-conv inputs, oldest first.
`conv_prefill` convolves right-padded prompts from a zero state and returns each prompt's last
K - 1 inputs; `conv_window` convolves a decode or verify window against state + window without
changing the state; `conv_commit` keeps the last K - 1 inputs of state + window[0:n], exactly as
if only the n accepted tokens had run. A decode step (T = 1) does both in one op,
`pallas_kernels.conv.conv_update` (a Pallas kernel that updates the pool in place).

Standard-mode drafts (the state-per-draft baseline, as a tuned engine runs it). A standard-mode
pool keeps a full state per window token instead of a ring: for T = max_verify > 1 its checkpoint
pool has S * (1 + T) rows (`draft_pool_size`), T + 1 per slot: slot s owns rows s * (T + 1) + j,
j = 0..T (`base_rows`), and a per-slot index (the model cache's `state_rows`) says which of them
holds its committed state. Standard verify reads that row and writes window token t's state to the
slot's t-th other row, cyclically after it (`draft_rows`); commit points the index at draft
n - 1: rollback is a slot remap, no state is copied. A sequence then holds T + 1 states per layer,
against one state plus L ring entries in replay mode. Without drafts the index is the identity.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

NULL_SLOT = 0
MAX_WINDOW = 64
MAX_VERIFY_TOKENS = 8


def row_index(slots, live, num_slots):
    """Scatter index for pool updates: padding rows point past the pool, each at its own index,
    and are dropped (live slots are distinct: the indices are unique, see `set_rows`)."""
    return jnp.where(live, slots, num_slots + jnp.arange(slots.shape[0], dtype=slots.dtype))


def set_rows(pool, idx, values):
    """pool.at[idx].set(values, mode="drop") for `row_index` indices, declared unique: XLA then
    writes the rows with plain stores, where a scatter that must allow duplicate indices is a
    compare-and-swap loop per element on the GPU for 16-bit types (XLA issue 26371; a profile put
    the bf16 conv-state commit at 63 us per Mamba-2 layer at batch 256, for 16 MB)."""
    return pool.at[idx].set(values.astype(pool.dtype), mode="drop", unique_indices=True)


# Windows of up to this many vectors take `row_products`' fused multiply-and-sum; longer ones a
# batched GEMM (eleventh GPU session, batch 256: against the GEMM the sum took GDN's verify at
# T = 2 307 -> 283 us and Mamba-2's at T = 4 595 -> 588, but GDN's at T = 8 877-887 -> 937).
ROW_SUM_MAX_VECTORS = 4


def row_products(rows, x):
    """r . x_t of rows r [b, G, M, N] (a ring's L rows of each batch row's slot, or a window's
    own T) and vectors x [b, T, G, N]: [b, G, T, M] float32, in fp32. Up to
    `ROW_SUM_MAX_VECTORS` vectors, one multiply and sum that XLA may fuse with the gather of the
    rows; for more, an einsum at HIGHEST precision, which XLA lowers to a batched GEMM of
    [M, N] x [N, T] tiles after a gather of its own (44 + 18 us at T = 8 for 34 MB of GDN ring
    keys), but which reads each row once where the sum may read it T times. The two agree up to
    the order of the sums."""
    f32 = jnp.float32
    if x.shape[1] > ROW_SUM_MAX_VECTORS:
        return jnp.einsum("bgmn,btgn->bgtm", rows.astype(f32), x.astype(f32),
                          precision=jax.lax.Precision.HIGHEST)
    return jnp.sum(rows.astype(f32)[:, :, None] * jnp.moveaxis(x.astype(f32), 1, 2)[:, :, :, None],
                   axis=-1)


def verify_folds(count, window_len: int, window: int):
    """Fold decision of a verify step over `window_len` tokens (T = 1 is plain decode): fold when
    the committed entries plus the window would fill the ring. The fold takes the committed ring
    entries plus the window's first token, which is always accepted (it was sampled last step)."""
    return count + window_len >= window


def window_positions(count, window_len: int, window: int):
    """The ring positions of a verify window's tokens t = 0..T-1: count + t, or t - 1 for a row
    that folds (window[0] went into the checkpoint: -1, not written). count: an int32 array of
    any shape (a row's count, or [b]); returns T arrays of its shape."""
    folds = verify_folds(count, window_len, window)
    return [jnp.where(folds, t - 1, count + t) for t in range(window_len)]


def write_window_rings(rings, values, counts, slots, window: int):
    """Writes a verify window into ring tensors (uncommitted), at `window_positions`. rings:
    arrays [S, heads, L, ...]; values: matching [b, T, heads, ...]. Returns the new rings."""
    S, (b, T) = rings[0].shape[0], values[0].shape[:2]
    pos = jnp.stack(window_positions(counts[slots], T, window), axis=1)              # [b, T]
    keep = (slots != NULL_SLOT)[:, None] & (pos >= 0)
    # the rest out of the pool (dropped), each at its own row: (i, p) pairs are unique
    i = jnp.where(keep, slots[:, None], S + jnp.arange(b * T, dtype=slots.dtype).reshape(b, T))
    p = jnp.clip(pos, 0, window - 1)
    # one scatter per ring: r[i, :, p] with i, p [b, T] addresses [b, T, heads, ...] = values
    return tuple(r.at[i, :, p].set(v.astype(r.dtype), mode="drop", unique_indices=True)
                 for r, v in zip(rings, values))


def write_window_fields(buffers, counts, slots, **entries):
    """`write_window_rings` into the named ring fields of a family's buffers (a NamedTuple with
    a `window`): entries maps field name -> window values [b, T, heads, ...], None for a field
    the verify kernel wrote itself. Returns the buffers with those rings replaced."""
    names = [n for n, v in entries.items() if v is not None]
    rings = write_window_rings(tuple(getattr(buffers, n) for n in names),
                               tuple(entries[n] for n in names), counts, slots, buffers.window)
    return buffers._replace(**dict(zip(names, rings)))


def _static_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_window(window_len, window) -> None:
    """The static window sizes of a commit: a ring window L >= 1 and a verify window T in
    [1, L] (checked where they are Python or NumPy ints; traced values are the caller's)."""
    if _static_int(window) and window < 1:
        raise ValueError(f"window = {window} must be >= 1 (the ring window L)")
    too_long = _static_int(window) and _static_int(window_len) and window_len > window
    if _static_int(window_len) and (window_len < 1 or too_long):
        raise ValueError(f"window_len = {window_len} must be in [1, window = {window}] (the "
                         f"verify window T)")


def commit_counts(counts, slots, n_accepted, window_len: int, window: int):
    """Commit n_accepted (clamped to [1, T]) of a verify window per live row: the count becomes
    n - 1 after a fold (the first token went into the checkpoint) and count + n otherwise.
    counts [S] int32 (shared by every SSM layer: once per model step), slots and n_accepted [b]
    int32; NULL_SLOT rows change nothing; window_len T in [1, window], window L >= 1 (refused
    otherwise when they are Python ints). Returns the new counts."""
    _check_window(window_len, window)
    live = slots != NULL_SLOT
    c = counts[slots]
    n = jnp.clip(n_accepted, 1, window_len)
    new = jnp.where(verify_folds(c, window_len, window), n - 1, c + n).astype(counts.dtype)
    return set_rows(counts, row_index(slots, live, counts.shape[0]), new)


def advance_counts(counts, slots, window: int):
    """Commit one decoded token per live row (T = 1): count + 1, or 0 after a fold."""
    return commit_counts(counts, slots, jnp.ones_like(slots), 1, window)


def conv_prefill(xbc, weight, bias, lengths, state=None, block=0):
    """Causal depthwise conv over right-padded prompts.

    xbc [b, T, C] pre-conv inputs; weight [C, K]; bias [C] or None; lengths [b]; state
    [b, K-1, C] the inputs before the prompts (a prefill continuing a sequence; None: zeros, a
    fresh start). Returns the pre-activation outputs [b, T, C] and the conv state [b, K-1, C]
    (the last K-1 inputs of each prompt); block > 0: also the conv states after block,
    2 block, ... tokens [b, T // block, K-1, C]."""
    K, T = weight.shape[1], xbc.shape[1]
    left = (jnp.zeros_like(xbc[:, :K - 1]) if state is None
            else state.astype(xbc.dtype))
    pad = jnp.concatenate([left, xbc], axis=1)                              # [b, K-1+T, C]
    out = sum(pad[:, k:k + T] * weight[:, k] for k in range(K))
    if bias is not None:
        out = out + bias
    tail = lambda ends: jnp.take_along_axis(     # the K-1 inputs before each end [b, n, K-1, C]
        pad[:, None], (ends[:, :, None] + jnp.arange(K - 1))[..., None], axis=2)
    final = tail(lengths[:, None])[:, 0]
    if not block:
        return out, final
    ends = jnp.broadcast_to(jnp.arange(1, T // block + 1) * block, (xbc.shape[0], T // block))
    return out, final, tail(ends)


def conv_window(conv_state, window, weight, bias, slots):
    """conv_state [S, K-1, C]; window [b, T, C]; weight [C, K] (last tap = current token);
    bias [C] or None; slots [b]. Returns the pre-activation outputs [b, T, C] in float32; the
    state is not changed (see `conv_commit`)."""
    K = weight.shape[1]
    T = window.shape[1]
    f32 = jnp.float32
    state = conv_state[slots]
    # input j of the sequence state + window, sliced statically: no [b, K-1+T, C] concatenation
    # in fp32 for XLA to materialise (a profile put it at 14 us per Mamba-2 layer at batch 64,
    # T = 4, on the H200), one fusion with the gather and the taps
    seq = lambda j: (state[:, j] if j < K - 1 else window[:, j - K + 1]).astype(f32)  # noqa: E731
    w = weight.astype(f32)
    out = jnp.stack([sum(seq(t + k) * w[:, k] for k in range(K)) for t in range(T)], axis=1)
    return out if bias is None else out + bias.astype(f32)


def conv_commit(conv_state, window, slots, n_accepted):
    """New state = the last K-1 inputs of state + window[0:n_accepted] (n clamped to [1, T]).
    NULL_SLOT rows change nothing. Returns the updated pool [S, K-1, C]."""
    Km1, T = conv_state.shape[1], window.shape[1]
    seq = jnp.concatenate([conv_state[slots], window.astype(conv_state.dtype)], axis=1)
    n = jnp.clip(n_accepted, 1, T)
    idx = n[:, None] + jnp.arange(Km1)[None, :]                            # [b, K-1]
    new = jnp.take_along_axis(seq, idx[:, :, None], axis=1)
    live = slots != NULL_SLOT
    return set_rows(conv_state, row_index(slots, live, conv_state.shape[0]), new)


def draft_pool_size(num_slots: int, max_verify: int) -> int:
    """Checkpoint rows of a standard-mode pool: S running states + T drafts per slot (T > 1)."""
    return num_slots * (1 + max_verify) if max_verify > 1 else num_slots


def base_rows(slots, num_drafts: int):
    """First pool row of each slot's group of num_drafts + 1 rows: slot * (num_drafts + 1)
    (the identity for a pool without drafts). slots [b] int32."""
    return (slots * (num_drafts + 1)).astype(jnp.int32)


def draft_rows(rows, slots, num_drafts: int, window_len: int):
    """Pool rows [b, window_len] int32 that a standard verify writes window token t's state to:
    the slot's other rows cyclically after its state row, base + (j + 1 + t) mod (T + 1) with
    j = rows - base and T = num_drafts >= window_len. rows, slots [b] int32 (the NULL_SLOT row is
    row 0: a kernel writes nothing for it)."""
    base = base_rows(slots, num_drafts)
    t = jnp.arange(window_len, dtype=jnp.int32)[None, :]
    j = (rows - base)[:, None]
    return (base[:, None] + (j + 1 + t) % (num_drafts + 1)).astype(jnp.int32)
