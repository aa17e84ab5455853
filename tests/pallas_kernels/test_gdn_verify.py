"""GDN speculative verify (one-chunk WY/UT form), commit and rollback against the float64 gated
delta rule on the accepted tokens only; the state-per-draft baseline. fp32: tolerance 5e-5."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gdn
from pallas_kernels._common import NULL_SLOT
from tests.pallas_kernels.helpers import impl_kw, rel_err
from tests.pallas_kernels.test_gdn import Problem, make_replay_state

F32 = jnp.float32
TOL = 5e-5


def window_inputs(pb, T):
    return [jnp.stack(a, axis=1) for a in zip(*(pb.step_inputs() for _ in range(T)))]


@functools.cache
def _verify_step(T, L, **kw):
    def step(bufs, counts, q, k, v, g, beta, slots, n_acc):
        o, bufs = gdn.replay_verify(bufs, counts, q, k, v, g, beta, slots, **kw)
        return o, bufs, gdn.commit_counts(counts, slots, n_acc, T, L)
    return jax.jit(step, donate_argnums=(0, 1))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("T,L", [(1, 4), (2, 4), (4, 4), (3, 8), (4, 16), (8, 16)])
def test_random_acceptance_matches_recurrence(impl, T, L, interpret):
    """>= 64 verify steps, random acceptance (all and none of the drafts included), folding and
    non-folding rows mixed: window outputs and committed checkpoints equal the recurrence."""
    pb = Problem(200 + 10 * T + L, Hk=2, Hv=4, K=32, V=16, batch=4)
    bufs, counts, oracle = make_replay_state(pb, L, F32, F32)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    step = _verify_step(T, L, **impl_kw(impl, interpret, block_k=16))
    folds = 0
    for it in range(64):
        args = window_inputs(pb, T)
        n_acc = pb.rng.integers(1, T + 1, pb.batch)
        n_acc[:] = T if it % 4 == 0 else (1 if it % 4 == 1 else n_acc)
        before = np.asarray(counts)
        o, bufs, counts = step(bufs, counts, *args, slots, jnp.asarray(n_acc, jnp.int32))
        o = np.asarray(o)
        assert np.isfinite(o).all() and (o[2] == 0).all()
        for r, s in live:
            st, states = oracle[s], []
            for t in range(T):
                o_ref, st = pb.oracle_step(st, *(a[r, t] for a in args))
                states.append(st)
                assert rel_err(o[r, t], o_ref) < TOL, (it, r, t, before[s])
            oracle[s] = states[n_acc[r] - 1]
            if before[s] + T >= L:
                folds += 1
                assert rel_err(bufs.checkpoint[s], states[0]) < TOL
                assert counts[s] == n_acc[r] - 1
            else:
                assert counts[s] == before[s] + n_acc[r]
    assert folds >= 6


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("T", [1, 4])
def test_verify_equals_stepping_decode(impl, T, interpret):
    """Window outputs equal T single decode steps from the same cache; T = 1 plus commit(1)
    leaves the cache decode leaves (for T > 1 the two fold at different points, both exact; the
    cached d of longer windows is checked through every later output of the acceptance test)."""
    L = 8
    pb = Problem(17 + T, Hk=2, Hv=4, K=16, V=16, batch=3)
    bufs, counts, _ = make_replay_state(pb, L, F32, F32)
    slots = jnp.asarray([3, 6, 1], jnp.int32)
    args = window_inputs(pb, T)
    kw = impl_kw(impl, interpret)
    o, vbufs = gdn.replay_verify(bufs, counts, *args, slots, **kw)
    vcounts = gdn.commit_counts(counts, slots, jnp.full((3,), T, jnp.int32), T, L)
    dbufs, dcounts = bufs, counts
    for t in range(T):
        od, dbufs = gdn.replay_decode(dbufs, dcounts, *(a[:, t] for a in args), slots, **kw)
        dcounts = gdn.advance_counts(dcounts, slots, L)
        assert rel_err(o[:, t], od) < 1e-5
    if T == 1:
        np.testing.assert_array_equal(vcounts, dcounts)
        np.testing.assert_allclose(vbufs.checkpoint, dbufs.checkpoint, rtol=1e-6, atol=1e-6)
        for s in np.asarray(slots):
            c = int(dcounts[s])
            np.testing.assert_allclose(vbufs.ring_d[s, :, :c], dbufs.ring_d[s, :, :c],
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_state_per_draft_baseline(impl, interpret):
    T, L = 4, 16
    pb = Problem(23, Hk=2, Hv=4, K=16, V=16, batch=2, num_slots=12)
    bufs, counts, oracle = make_replay_state(pb, L, F32, F32)
    slots = jnp.asarray([1, 2], jnp.int32)
    draft = jnp.asarray([[3, 4, 5, 6], [7, NULL_SLOT, 8, 9]], jnp.int32)
    state = bufs.checkpoint.at[1].set(jnp.asarray(oracle[1], F32)).at[2].set(
        jnp.asarray(oracle[2], F32))
    args = window_inputs(pb, T)
    kw = impl_kw(impl, interpret)
    o, state = gdn.standard_verify(state, *args, slots, draft, **kw)
    o_rep, _ = gdn.replay_verify(bufs, counts, *args, slots, **kw)
    assert rel_err(o, o_rep) < TOL
    for r, s in enumerate([1, 2]):
        st = oracle[s]
        for t in range(T):
            _, st = pb.oracle_step(st, *(a[r, t] for a in args))
            if int(draft[r, t]) != NULL_SLOT:
                assert rel_err(state[int(draft[r, t])], st) < TOL


def test_verify_rejects_window_larger_than_ring():
    pb = Problem(1)
    bufs = gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=2)
    with pytest.raises(ValueError, match=r"T = 4 must not exceed the ring window L = 2"):
        gdn.replay_verify(bufs, jnp.zeros((pb.S,), jnp.int32), *window_inputs(pb, 4)[:5],
                          jnp.asarray([1, 2, 3], jnp.int32), impl="pallas")
