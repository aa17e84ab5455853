"""The XLA implementation of the four pool ops, over a family's per-row math.

Each op gathers the rows' slots from the pool, runs the family's batched row step (its
`reference.py`), zeroes the outputs of NULL_SLOT rows and scatters back what the ring contract
(`pallas_kernels.ring`) says is written. A family's `xla.py` binds its steps:

    standard step  step(state, *token, *consts) -> (out, new state)
    replay step    step(s0, *rings, count, *token, *consts) -> (out, folded state, ring entries)

where `token` holds one token's inputs per row ([b, ...]; a window is [b, T, ...]) and the ring
entries are the token's values in ring order. Buffers are NamedTuples (checkpoint, *rings) with
rings [S, heads, L, ...].
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.ring import NULL_SLOT, row_index, verify_folds


def _masked(out, live, dtype):
    """Outputs of padding rows are zeros."""
    return jnp.where(live.reshape(live.shape + (1,) * (out.ndim - 1)), out, 0).astype(dtype)


def standard_decode(step, state, args, slots, out_dtype):
    """One standard step per row; reads and writes the state of every live row.
    Returns out (out_dtype) and the updated pool."""
    live = slots != NULL_SLOT
    out, new = step(state[slots], *args)
    return _masked(out, live, out_dtype), state.at[row_index(slots, live, state.shape[0])].set(
        new.astype(state.dtype), mode="drop")


def replay_decode(step, buffers, counts, args, slots, out_dtype):
    """ReplaySSM decode (T = 1); counts are read, not advanced. Returns out and the buffers."""
    ck, rings = buffers[0], buffers[1:]
    S, L = ck.shape[0], rings[0].shape[2]
    live = slots != NULL_SLOT
    count = counts[slots]
    out, folded, entries = step(ck[slots], *(r[slots] for r in rings), count, *args)
    idx = row_index(slots, live, S)
    fold_idx = jnp.where(count == L - 1, idx, S)
    # The current token is appended at `count` on every step; after a fold that entry is
    # past the (reset) count and therefore ignored.
    c = jnp.minimum(count, L - 1)
    return _masked(out, live, out_dtype), type(buffers)(
        ck.at[fold_idx].set(folded.astype(ck.dtype), mode="drop"),
        *(r.at[idx, :, c].set(e.astype(r.dtype), mode="drop") for r, e in zip(rings, entries)))


def replay_verify(step, write_window, buffers, counts, window, consts, slots, out_dtype):
    """Speculative verify over a window of T tokens per row (window inputs [b, T, ...]): token s
    is output from checkpoint + ring[0:count] + window[0:s+1], as s decode steps would. Rows with
    count + T >= L fold ring[0:count] + window[0] into the checkpoint; the window's ring entries
    go in through `write_window(buffers, counts, slots, *entries)`, uncommitted.
    Returns out [b, T, ...] (out_dtype) and the buffers."""
    ck, rings = buffers[0], buffers[1:]
    S, L = ck.shape[0], rings[0].shape[2]
    T = window[0].shape[1]
    live = slots != NULL_SLOT
    count = counts[slots]
    rows = jnp.arange(window[0].shape[0])
    # Extended ring: committed entries, then the window tokens appended one by one.
    ext = [jnp.concatenate([r[slots], jnp.zeros(r[slots].shape[:2] + (T,) + r.shape[3:], r.dtype)],
                           axis=2) for r in rings]
    s0 = ck[slots]
    outs, entries = [], []
    for s in range(T):
        out, folded, ent = step(s0, *ext, count + s, *(a[:, s] for a in window), *consts)
        outs.append(out)
        entries.append(ent)
        if s == 0:
            first_fold = folded
        ext = [e.at[rows, :, count + s].set(t.astype(e.dtype)) for e, t in zip(ext, ent)]
    fold = live & verify_folds(count, T, L)
    out = buffers._replace(checkpoint=ck.at[jnp.where(fold, slots, S)].set(
        first_fold.astype(ck.dtype), mode="drop"))
    return (_masked(jnp.stack(outs, 1), live, out_dtype),
            write_window(out, counts, slots, *(jnp.stack(e, 1) for e in zip(*entries))))


def standard_verify(step, state, window, consts, slots, draft_slots, out_dtype):
    """The state-per-draft baseline: T standard steps from the state at `slots`, the state after
    window token s written to pool row draft_slots[:, s] ([b, T] int32; NULL_SLOT skips).
    Returns out [b, T, ...] and the pool."""
    live = slots != NULL_SLOT
    st = state[slots]
    outs = []
    for s in range(window[0].shape[1]):
        out, st = step(st, *(a[:, s] for a in window), *consts)
        outs.append(out)
        idx = row_index(draft_slots[:, s], live & (draft_slots[:, s] != NULL_SLOT), state.shape[0])
        state = state.at[idx].set(st.astype(state.dtype), mode="drop")
    return _masked(jnp.stack(outs, 1), live, out_dtype), state
