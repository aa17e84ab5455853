"""The family-free parts of the ring contract: conv windows, commit (rollback) and prefill."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ring
from pallas_kernels.ring import NULL_SLOT, conv_commit, conv_prefill, conv_window

F32 = jnp.float32


def test_conv_rollback_equals_accepted_tokens_only():
    rng = np.random.default_rng(5)
    S, K, Ch, T = 5, 4, 6, 4
    conv = jnp.asarray(rng.standard_normal((S, K - 1, Ch)), F32)
    w = jnp.asarray(rng.standard_normal((Ch, K)), F32)
    bias = jnp.asarray(rng.standard_normal(Ch), F32)
    slots = jnp.asarray([2, NULL_SLOT, 4], jnp.int32)
    window = jnp.asarray(rng.standard_normal((3, T, Ch)), F32)
    n_acc = jnp.asarray([1, 2, 3], jnp.int32)
    out = conv_window(conv, window, w, bias, slots)
    new = conv_commit(conv, window, slots, n_acc)
    for r, s in ((0, 2), (2, 4)):
        hist = np.asarray(conv[s])
        for t in range(T):           # token by token: output, then shift the state
            seq = np.concatenate([hist, np.asarray(window[r, t])[None]], 0)
            np.testing.assert_allclose(out[r, t], (seq * np.asarray(w).T).sum(0) + bias,
                                       rtol=1e-5, atol=1e-6)
            hist = seq[1:]
            if t + 1 == int(n_acc[r]):
                np.testing.assert_array_equal(new[s], hist)
    np.testing.assert_array_equal(new[jnp.asarray([0, 1, 3])], conv[jnp.asarray([0, 1, 3])])


def test_conv_prefill_equals_windows_from_a_zero_state():
    """Prefill of right-padded prompts = conv_window from a zero state, and its conv state = the
    prompt's last K - 1 inputs (what conv_commit of the prompt's length keeps)."""
    rng = np.random.default_rng(6)
    K, Ch, T = 4, 6, 7
    xbc = jnp.asarray(rng.standard_normal((2, T, Ch)), F32)
    w = jnp.asarray(rng.standard_normal((Ch, K)), F32)
    lengths = jnp.asarray([7, 2], jnp.int32)
    out, state = conv_prefill(xbc, w, None, lengths)
    zero = jnp.zeros((3, K - 1, Ch), F32)
    slots = jnp.asarray([1, 2], jnp.int32)
    np.testing.assert_allclose(out, conv_window(zero, xbc, w, None, slots), rtol=1e-6, atol=1e-6)
    for r, n in enumerate(np.asarray(lengths)):
        kept = conv_commit(zero, xbc[:, :n], slots, jnp.full((2,), n, jnp.int32))
        np.testing.assert_array_equal(state[r], kept[r + 1])


@pytest.mark.parametrize("T", [2, 4, 8])
def test_draft_rows_stay_in_the_slot_group_and_never_overwrite_the_state(T):
    """Standard-mode layout: slot s owns rows s (T + 1) .. s (T + 1) + T; from any state row of
    its group, a window of w <= T tokens writes w distinct other rows of that group, and
    committing draft n - 1 (the remap) keeps that true for the next window."""
    rng = np.random.default_rng(T)
    slots = jnp.arange(1, 6, dtype=jnp.int32)
    rows = ring.base_rows(slots, T)
    np.testing.assert_array_equal(rows, np.arange(1, 6) * (T + 1))
    for _ in range(20):
        w = int(rng.integers(1, T + 1))
        d = np.asarray(ring.draft_rows(rows, slots, T, w))
        base = np.asarray(slots)[:, None] * (T + 1)
        assert ((d >= base) & (d <= base + T)).all()
        assert (d != np.asarray(rows)[:, None]).all()
        assert all(len(set(r)) == w for r in d)
        n = rng.integers(1, w + 1, len(slots))
        rows = jnp.asarray(d[np.arange(len(slots)), n - 1])


def test_row_updates_have_unique_indices_and_drop_padding():
    """Padding rows get distinct indices past the pool (so a scatter may declare its indices
    unique: plain stores on the GPU) and change nothing; live rows are written."""
    slots = jnp.array([3, NULL_SLOT, 1, NULL_SLOT], jnp.int32)
    idx = np.asarray(ring.row_index(slots, slots != NULL_SLOT, 5))
    assert idx[0] == 3 and idx[2] == 1 and len(set(idx.tolist())) == 4 and (idx[[1, 3]] >= 5).all()
    pool = jnp.arange(10, dtype=jnp.float32).reshape(5, 2)
    new = ring.set_rows(pool, jnp.asarray(idx), -jnp.ones((4, 2)))
    np.testing.assert_array_equal(new, np.where(np.isin(np.arange(5), [1, 3])[:, None], -1,
                                                np.asarray(pool)))


@pytest.mark.parametrize("call,match", [
    (lambda c, s: ring.advance_counts(c, s, 0), r"^window = 0 must be >= 1 \(the ring window L\)$"),
    (lambda c, s: ring.advance_counts(c, s, -4), r"^window = -4 must be >= 1"),
    (lambda c, s: ring.commit_counts(c, s, s, 8, 4),
     r"^window_len = 8 must be in \[1, window = 4\] \(the verify window T\)$"),
    (lambda c, s: ring.commit_counts(c, s, s, 0, 4),
     r"^window_len = 0 must be in \[1, window = 4\]"),
    (lambda c, s: ring.commit_counts(c, s, s, np.int64(5), np.int32(4)),
     r"^window_len = 5 must be in \[1, window = 4\]"),
])
def test_bad_static_windows_are_named(call, match):
    """A commit's static window sizes (Python or NumPy ints): L >= 1 and T in [1, L]."""
    counts, slots = jnp.zeros((4,), jnp.int32), jnp.asarray([1, 2], jnp.int32)
    with pytest.raises(ValueError, match=match):
        call(counts, slots)


def test_commit_at_the_edges_of_the_window():
    """T = L (every row folds) and T = 1 (decode) are legal: counts n - 1 after the fold."""
    counts, slots = jnp.asarray([0, 2, 3, 1], jnp.int32), jnp.asarray([1, 2], jnp.int32)
    np.testing.assert_array_equal(ring.commit_counts(counts, slots, slots + 1, 4, 4),
                                  [0, 1, 2, 1])
    np.testing.assert_array_equal(ring.advance_counts(counts, slots, 4), [0, 3, 0, 1])
