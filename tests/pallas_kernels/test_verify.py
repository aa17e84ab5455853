"""Speculative verify of both families (ReplaySSM and the state-per-draft baseline, Pallas and
XLA), commit and rollback, against the float64 recurrence run on the accepted tokens only.

fp32 everywhere: tolerance 5e-5 relative (outputs per window token, committed checkpoints).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ring import NULL_SLOT
from tests.pallas_kernels.families import (
    BF16,
    F32,
    FAMILIES,
    GDN,
    IMPLS,
    MOSAIC,
    each_family,
    has_mosaic,
    impl_dims,
)
from tests.pallas_kernels.helpers import (
    assert_runs_equal,
    impl_kw,
    mosaic_races_found,
    rel_err,
)

TOL = 5e-5


@functools.cache
def verify_step(ops, T, L, **kw):
    """Jitted verify + commit of n_acc tokens per row (pools and counts donated)."""
    def step(bufs, counts, args, slots, n_acc):
        out, bufs = ops.replay_verify(bufs, counts, *args, slots, **kw)
        return out, bufs, ops.commit_counts(counts, slots, n_acc, T, L)
    return jax.jit(step, donate_argnums=(0, 1))


def verify_params(cases, mosaic_cases):
    """pytest params (family, *case, impl): every case with each of IMPLS, and the Mosaic GPU
    cases (few: its interpreter is slow) for the families that have a Mosaic GPU verify."""
    return [pytest.param(f, *c, impl, id=f"{name}-{'-'.join(map(str, c))}-{impl}")
            for name, f in FAMILIES.items()
            for impl, cs in [*((i, cases) for i in IMPLS), (MOSAIC, mosaic_cases)]
            if impl != MOSAIC or has_mosaic(f, "replay_verify") for c in cs]


@pytest.mark.parametrize("family,T,L,impl,options,dims", [
    *(pytest.param(*p.values, {}, None, id=p.id) for p in verify_params(
        [(1, 4), (2, 4), (4, 4), (3, 8), (4, 16), (8, 16)], [(4, 8)])),
    *(pytest.param(f, 4, 16, "pallas", f.VERIFY_OPTIONS, None, id=f"{name}-4-16-options-pallas")
      for name, f in FAMILIES.items()),
    # the Mosaic verify's options (ring_write among them), a few to a case
    *(pytest.param(f, 4, 8, MOSAIC, opts, None, id=f"{name}-4-8-{case}-{MOSAIC}")
      for name, f in FAMILIES.items() for case, opts in f.MOSAIC_VERIFY_OPTIONS),
    # GDN's verify default from 5 tokens: the key products in the kernel, the fused prologue,
    # at T = 8
    pytest.param(GDN, 8, 16, MOSAIC, dict(key_products="kernel", prologue="fused"), None,
                 id=f"gdn-8-16-keys-kernel-fused-{MOSAIC}"),
    *(pytest.param(f, 4, 16, "pallas", opts, dims, id=f"{name}-4-16-{case}-pallas")
      for name, f in FAMILIES.items() for case, dims, opts in f.MASKED_TILE_CASES)])
def test_random_acceptance_matches_recurrence(family, T, L, impl, options, dims, interpret):
    """>= 64 verify steps (8 on the Mosaic GPU interpreter, whose step takes seconds) with
    random acceptance (all accepted and all rejected included), rows folding and not folding
    in one batch: every window output and every committed checkpoint equals the recurrence
    over the accepted tokens; `options`: the Triton verify tiling's options (the family's
    VERIFY_OPTIONS, or a masked tile case's at its `dims`; None: REPLAY_DIMS). (The Mosaic
    verify's prologue="overlap" is held bitwise to "serial" below.)"""
    pb = family(100 + 10 * T + L, batch=4, **impl_dims(family, dims or family.REPLAY_DIMS, impl))
    bufs, counts, oracle = pb.make_replay_state(L, F32, F32)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    step = verify_step(pb.ops, T, L,                  # several state chunks
                       **impl_kw(impl, interpret,
                                 pb.tiling("verify", chunk=16, impl=impl, **options)))
    folds = all_acc = none_acc = 0
    for it in range(8 if impl == MOSAIC and interpret else 64):
        window = pb.window_inputs(T)
        n_acc = pb.rng.integers(1, T + 1, pb.batch)
        n_acc[:] = T if it % 4 == 0 else (1 if it % 4 == 1 else n_acc)
        before = np.asarray(counts)
        out, bufs, counts = step(bufs, counts, (*window, *pb.consts), slots,
                                 jnp.asarray(n_acc, jnp.int32))
        out = np.asarray(out)
        assert np.isfinite(out).all() and (out[2] == 0).all()
        for r, s in live:
            st, states = oracle[s], []
            for t in range(T):
                ref, st = pb.oracle_step(st, *(a[r, t] for a in window))
                states.append(st)
                assert rel_err(out[r, t], ref) < TOL, (it, r, t, before[s])
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
    assert impl != MOSAIC or not mosaic_races_found(interpret)


@pytest.mark.parametrize("family,T,impl", verify_params([(1,), (3,), (4,)], [(1,), (4,)]))
def test_verify_equals_stepping_decode(family, T, impl, interpret):
    """The T window outputs equal T single-token decode steps from the same cache; T = 1 plus
    commit(1) leaves exactly the cache decode leaves (for T > 1 the two fold at different points,
    both exact; the ring entries of longer windows are checked through every later output of the
    acceptance test)."""
    L = 8
    pb = family(7 + T, batch=3, **impl_dims(family, {}, impl))
    bufs, counts, _ = pb.make_replay_state(L, F32, F32)
    slots = jnp.asarray([3, 6, 1], jnp.int32)
    window = pb.window_inputs(T)
    kw = impl_kw(impl, interpret)
    out, vbufs = pb.ops.replay_verify(bufs, counts, *window, *pb.consts, slots, **kw)
    vcounts = pb.ops.commit_counts(counts, slots, jnp.full((3,), T, jnp.int32), T, L)
    dbufs, dcounts = bufs, counts
    for t in range(T):
        out_d, dbufs = pb.ops.replay_decode(dbufs, dcounts, *(a[:, t] for a in window),
                                            *pb.consts, slots, **kw)
        dcounts = pb.ops.advance_counts(dcounts, slots, L)
        assert rel_err(out[:, t], out_d) < 1e-5
    if T == 1:
        np.testing.assert_array_equal(vcounts, dcounts)
        np.testing.assert_allclose(vbufs.checkpoint, dbufs.checkpoint, rtol=1e-6, atol=1e-6)
        for s in np.asarray(slots):          # committed ring entries agree
            c = int(dcounts[s])
            for name in vbufs._fields[1:]:
                v, d = getattr(vbufs, name)[s, :, :c], getattr(dbufs, name)[s, :, :c]
                if name in family.COMPUTED_RING:
                    np.testing.assert_allclose(v, d, rtol=1e-5, atol=1e-6)
                else:
                    np.testing.assert_array_equal(v, d)
    assert impl != MOSAIC or not mosaic_races_found(interpret)


@pytest.mark.parametrize("family", [pytest.param(f, id=name) for name, f in FAMILIES.items()
                                    if has_mosaic(f, "replay_verify")])
def test_mosaic_overlap_prologue_equals_serial(family, interpret):
    """The Mosaic verify with prologue="overlap" (the ring walk after the checkpoint readout)
    computes "serial"'s sums: outputs, pools and counts bitwise equal (compiled: within an ulp,
    `assert_runs_equal`) over steps with random acceptance, rows folding and not."""
    runs = [_verify_run(family, 31, MOSAIC, interpret, F32, F32,
                        overrides=dict(prologue=prologue)) for prologue in ("serial", "overlap")]
    assert_runs_equal(*runs, interpret)
    assert not mosaic_races_found(interpret)


def _verify_run(family, seed, impl, interpret, act, ring, overrides, T=4, L=8):
    """Four verify + commit steps (T, L) from one random state with random acceptance, rows
    folding and not, at the verify tiling with `overrides`: (outputs, buffers, counts) for
    `assert_runs_equal`."""
    pb = family(seed, batch=3, act=act, **impl_dims(family, family.REPLAY_DIMS, impl))
    bufs, counts, _ = pb.make_replay_state(L, F32, ring)
    slots = jnp.asarray([5, NULL_SLOT, 1], jnp.int32)
    step = verify_step(pb.ops, T, L, **impl_kw(
        impl, interpret, pb.tiling("verify", chunk=16, impl=impl, **overrides)))
    outs = []
    for _ in range(4):
        n_acc = jnp.asarray(pb.rng.integers(1, T + 1, pb.batch), jnp.int32)
        out, bufs, counts = step(bufs, counts, (*pb.window_inputs(T), *pb.consts), slots, n_acc)
        outs.append(np.asarray(out))
    return outs, bufs, counts


@pytest.mark.parametrize("family,impl", [
    pytest.param(f, impl, id=f"{name}-{impl}") for name, f in FAMILIES.items()
    for impl in ("pallas", MOSAIC) if impl != MOSAIC or has_mosaic(f, "replay_verify")])
def test_ring_write_in_kernel_equals_xla(family, impl, interpret):
    """ring_write="kernel" (the verify kernel writes the window's per-row ring entries, XLA the
    rest) leaves what "xla" (XLA writes all of them after the kernel) does: outputs, pools and
    counts bitwise equal (compiled: within an ulp) over steps with random acceptance, rows
    folding and not, with bf16 activations and the family's ring for them."""
    runs = [_verify_run(family, 41, impl, interpret, BF16, family.BF16_RING,
                        overrides=dict(ring_write=ring_write)) for ring_write in ("xla", "kernel")]
    assert_runs_equal(*runs, interpret)
    assert impl != MOSAIC or not mosaic_races_found(interpret)


@pytest.mark.parametrize("impl,row_slowest", [*((i, False) for i in IMPLS), ("pallas", True)],
                         ids=[*IMPLS, "pallas-row-slowest"])
@each_family
def test_state_per_draft_baseline(family, impl, row_slowest, interpret):
    """The baseline writes the state after every window token to its draft slot; rollback picks
    draft_slots[n - 1]. Its outputs equal replay verify's; the null slot stays untouched.
    `row_slowest`: the baseline's Triton kernel launched row-slowest, in two tiles of 8."""
    T, L = 4, 16
    pb = family(21, batch=2, num_slots=12)
    bufs, counts, oracle = pb.make_replay_state(L, F32, F32)
    slots = jnp.asarray([1, 2], jnp.int32)
    draft = jnp.asarray([[3, 4, 5, 6], [7, 8, NULL_SLOT, 9]], jnp.int32)
    # The baseline's committed state is the full state: give it the oracle states of slots 1, 2.
    state = bufs.checkpoint.at[1].set(jnp.asarray(oracle[1], F32)).at[2].set(
        jnp.asarray(oracle[2], F32))
    window = pb.window_inputs(T)
    kw = impl_kw(impl, interpret)
    tiling = (pb.tiling("standard_verify", **{family.TILE_FIELD: 8}, **family.ROW_SLOWEST)
              if row_slowest else None)
    out, state = pb.ops.standard_verify(state, *window, *pb.consts, slots, draft,
                                        **impl_kw(impl, interpret, tiling))
    out_rep, _ = pb.ops.replay_verify(bufs, counts, *window, *pb.consts, slots, **kw)
    assert rel_err(out, out_rep) < TOL
    for r, s in enumerate([1, 2]):
        st = oracle[s]
        for t in range(T):
            _, st = pb.oracle_step(st, *(a[r, t] for a in window))
            if int(draft[r, t]) != NULL_SLOT:
                assert rel_err(state[int(draft[r, t])], st) < TOL
    assert (np.asarray(state[NULL_SLOT]) == np.asarray(bufs.checkpoint[NULL_SLOT])).all()


@pytest.mark.parametrize("impl", ["pallas", MOSAIC])
@each_family
def test_bad_ring_write_is_named(family, impl):
    pb = family(1, batch=2, **impl_dims(family, {}, impl))
    with pytest.raises(ValueError, match=r"ring_write must be one of 'xla', 'kernel', got 'xl'"):
        pb.ops.replay_verify(pb.init_buffers(8), jnp.zeros((pb.S,), jnp.int32),
                             *pb.window_inputs(4), *pb.consts, jnp.asarray([1, 2], jnp.int32),
                             impl=impl, tiling=pb.tiling("verify", impl=impl, ring_write="xl"))


@pytest.mark.parametrize("T,L,match", [(5, 4, r"must not exceed the ring window L = 4"),
                                       (4, 2, r"T = 4 must not exceed the ring window L = 2"),
                                       (9, 16, r"verify window T = 9 must be in \[1, 8\]")])
@each_family
def test_verify_rejects_bad_windows(family, T, L, match):
    pb = family(1, batch=2)
    with pytest.raises(ValueError, match=match):
        pb.ops.replay_verify(pb.init_buffers(L), jnp.zeros((pb.S,), jnp.int32),
                             *pb.window_inputs(T), *pb.consts, jnp.asarray([1, 2], jnp.int32),
                             impl="pallas")
