"""Mamba-2 speculative verify, commit and rollback against the float64 recurrence run on the
accepted tokens only; the state-per-draft baseline; conv-state rollback.

fp32 everywhere: tolerance 5e-5 relative (outputs per window token, committed checkpoints).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import mamba2
from pallas_kernels._common import NULL_SLOT
from pallas_kernels.conv1d import conv_commit, conv_window
from tests.pallas_kernels.helpers import impl_kw, rel_err
from tests.pallas_kernels.test_mamba2 import Problem, make_replay_state

F32 = jnp.float32
TOL = 5e-5


def window_inputs(pb, T):
    steps = [pb.step_inputs() for _ in range(T)]
    return [jnp.stack(a, axis=1) for a in zip(*steps)]          # x [b, T, H, P], ...


@functools.cache
def _verify_step(T, L, **kw):
    def step(bufs, counts, x, B, C, dt, A, D, slots, n_acc):
        y, bufs = mamba2.replay_verify(bufs, counts, x, B, C, dt, A, D, slots, **kw)
        return y, bufs, mamba2.commit_counts(counts, slots, n_acc, T, L)
    return jax.jit(step, donate_argnums=(0, 1))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("T,L", [(1, 4), (2, 4), (4, 4), (3, 8), (4, 16), (8, 16)])
def test_random_acceptance_matches_recurrence(impl, T, L, interpret):
    """>= 64 verify steps with random acceptance (all accepted and all rejected included), rows
    folding and not folding in one batch: every window output and every committed checkpoint
    equals the recurrence over the accepted tokens."""
    pb = Problem(100 + 10 * T + L, H=4, P=16, N=32, G=2, batch=4)
    bufs, counts, oracle = make_replay_state(pb, L, F32, F32)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    step = _verify_step(T, L, **impl_kw(impl, interpret, block_n=16))
    folds = all_acc = none_acc = 0
    for it in range(64):
        x, B, C, dt = window_inputs(pb, T)
        n_acc = pb.rng.integers(1, T + 1, pb.batch)
        n_acc[:] = T if it % 4 == 0 else (1 if it % 4 == 1 else n_acc)
        before = np.asarray(counts)
        y, bufs, counts = step(bufs, counts, x, B, C, dt, pb.A, pb.D, slots,
                               jnp.asarray(n_acc, jnp.int32))
        y = np.asarray(y)
        assert np.isfinite(y).all() and (y[2] == 0).all()
        for r, s in live:
            st, states = oracle[s], []
            for t in range(T):
                y_ref, st = pb.oracle_step(st, x[r, t], B[r, t], C[r, t], dt[r, t])
                states.append(st)
                assert rel_err(y[r, t], y_ref) < TOL, (it, r, t, before[s])
            oracle[s] = states[n_acc[r] - 1]
            if before[s] + T >= L:                       # folded ring + window[0]
                folds += 1
                assert rel_err(bufs.checkpoint[s], states[0]) < TOL
                assert counts[s] == n_acc[r] - 1
            else:
                assert counts[s] == before[s] + n_acc[r]
            all_acc += n_acc[r] == T
            none_acc += n_acc[r] == 1
    assert folds >= 6 and all_acc and none_acc
    assert int(counts[NULL_SLOT]) == 0


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("T", [1, 3, 4])
def test_verify_equals_stepping_decode(impl, T, interpret):
    """The T window outputs equal T single-token decode steps from the same cache; T = 1 plus
    commit(1) leaves exactly the cache decode leaves."""
    L = 8
    pb = Problem(7 + T, H=4, P=16, N=16, G=2, batch=3)
    bufs, counts, _ = make_replay_state(pb, L, F32, F32)
    slots = jnp.asarray([3, 6, 1], jnp.int32)
    x, B, C, dt = window_inputs(pb, T)
    kw = impl_kw(impl, interpret)
    y, vbufs = mamba2.replay_verify(bufs, counts, x, B, C, dt, pb.A, pb.D, slots, **kw)
    vcounts = mamba2.commit_counts(counts, slots, jnp.full((3,), T, jnp.int32), T, L)
    dbufs, dcounts = bufs, counts
    for t in range(T):
        yd, dbufs = mamba2.replay_decode(dbufs, dcounts, x[:, t], B[:, t], C[:, t], dt[:, t],
                                         pb.A, pb.D, slots, **kw)
        dcounts = mamba2.advance_counts(dcounts, slots, L)
        assert rel_err(y[:, t], yd) < 1e-5
    if T == 1:
        np.testing.assert_array_equal(vcounts, dcounts)
        np.testing.assert_allclose(vbufs.checkpoint, dbufs.checkpoint, rtol=1e-6, atol=1e-6)
        for s in np.asarray(slots):          # committed ring entries agree
            c = int(dcounts[s])
            np.testing.assert_array_equal(vbufs.ring_x[s, :, :c], dbufs.ring_x[s, :, :c])
            np.testing.assert_array_equal(vbufs.ring_dt[s, :, :c], dbufs.ring_dt[s, :, :c])


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_state_per_draft_baseline(impl, interpret):
    """The baseline writes the state after every window token to its draft slot; rollback picks
    draft_slots[n - 1]. Its outputs equal replay verify's."""
    T, L = 4, 16
    pb = Problem(21, H=4, P=16, N=16, G=2, batch=2, num_slots=12)
    bufs, counts, oracle = make_replay_state(pb, L, F32, F32)
    state = bufs.checkpoint
    slots = jnp.asarray([1, 2], jnp.int32)
    draft = jnp.asarray([[3, 4, 5, 6], [7, 8, NULL_SLOT, 9]], jnp.int32)
    # The baseline's committed state is the full state: give it the oracle states of slots 1, 2.
    state = state.at[1].set(jnp.asarray(oracle[1], F32)).at[2].set(jnp.asarray(oracle[2], F32))
    x, B, C, dt = window_inputs(pb, T)
    kw = impl_kw(impl, interpret)
    y, state = mamba2.standard_verify(state, x, B, C, dt, pb.A, pb.D, slots, draft, **kw)
    y_rep, _ = mamba2.replay_verify(bufs, counts, x, B, C, dt, pb.A, pb.D, slots, **kw)
    assert rel_err(y, y_rep) < TOL
    for r, s in enumerate([1, 2]):
        st = oracle[s]
        for t in range(T):
            _, st = pb.oracle_step(st, x[r, t], B[r, t], C[r, t], dt[r, t])
            if int(draft[r, t]) != NULL_SLOT:
                assert rel_err(state[int(draft[r, t])], st) < TOL
    assert (np.asarray(state[NULL_SLOT]) == np.asarray(bufs.checkpoint[NULL_SLOT])).all()


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


@pytest.mark.parametrize("T,L,match", [(5, 4, r"must not exceed the ring window L = 4"),
                                       (9, 16, r"verify window T = 9 must be in \[1, 8\]")])
def test_verify_rejects_bad_windows(T, L, match):
    pb = Problem(1, H=4, P=16, N=16, G=2, batch=2)
    bufs = mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G, window=L)
    x, B, C, dt = window_inputs(pb, T)
    with pytest.raises(ValueError, match=match):
        mamba2.replay_verify(bufs, jnp.zeros((pb.S,), jnp.int32), x, B, C, dt, pb.A, pb.D,
                             jnp.asarray([1, 2], jnp.int32), impl="pallas")
