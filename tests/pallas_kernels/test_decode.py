"""Decode kernels of both families (standard and ReplaySSM, Pallas and XLA) against the float64
standard recurrence of the family (`families.py`).

Tolerances (relative Frobenius error per step, over the live rows):
  float32 activations / ring / state ........ 5e-5 (HIGHEST or tf32x3 dots, fp32 math)
  bfloat16 activations, fp32 state ........... 5e-5 on the checkpoint; 1e-2 on the outputs
                                               (they are bf16); ring bf16 for Mamba-2 (its
                                               inputs are bf16 already), fp32 for GDN
  bfloat16 state ............................. 2e-2 (the state itself is rounded to bf16)
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
    IMPLS,
    MOSAIC,
    cases,
    each_family,
    f64,
    family_impls,
    impl_cases,
    impl_dims,
    long_run,
)
from tests.pallas_kernels.helpers import (
    assert_runs_equal,
    bitwise_equal,
    impl_kw,
    mosaic_races_found,
    rel_err,
)


@functools.cache
def jitted(ops, fn_name, **kw):
    """A jitted public op (pools donated); replay_decode also advances the counts."""
    fn = getattr(ops, fn_name)
    if fn_name == "replay_decode":
        def step(bufs, counts, *args):
            out, bufs = fn(bufs, counts, *args, **kw)
            return out, bufs, ops.advance_counts(counts, args[-1], bufs.window)
        return jax.jit(step, donate_argnums=(0, 1))
    return jax.jit(functools.partial(fn, **kw), donate_argnums=(0,))


def _standard_params():
    """Every standard case with each implementation, plus the Triton kernel launched row-slowest
    on each family's last case (several tiles: every launch axis > 1), and with the family's
    masked tiles (MASKED_TILE_CASES)."""
    return impl_cases("STANDARD_CASES") + [
        pytest.param(f, (f"{c[0]}-row-slowest", c[1], {**c[2], **f.ROW_SLOWEST}), "pallas",
                     id=f"{name}-{c[0]}-row-slowest-pallas")
        for name, f in FAMILIES.items() for c in f.STANDARD_CASES[-1:]] + [
        pytest.param(f, (c[0], c[1], dict(c[2], chunk=16)), "pallas", id=f"{name}-{c[0]}-pallas")
        for name, f in FAMILIES.items() for c in f.MASKED_TILE_CASES]


@pytest.mark.parametrize("family,case,impl", _standard_params())
def test_standard_decode_matches_recurrence(family, case, impl, interpret):
    _, dims, tiles = case
    pb = family(0, **impl_dims(family, dims, impl))
    state = pb.random_state()
    oracle = {s: f64(state[s]) for s in range(pb.S)}
    slots = jnp.asarray([3, NULL_SLOT, 1], jnp.int32)
    idle = jnp.asarray([0, 2, 4, 5, 6])
    idle_before = np.asarray(state[idle])
    step = jitted(pb.ops, "standard_decode",
                  **impl_kw(impl, interpret, pb.tiling("standard", impl=impl, **tiles)))
    for _ in range(5):
        args = pb.step_inputs()
        out, state = step(state, *args, *pb.consts, slots)
        out = np.asarray(out)
        assert np.isfinite(out).all(), "outputs not fully written"
        assert (out[1] == 0).all(), "padding row must output zeros"
        for r, s in ((0, 3), (2, 1)):
            ref, oracle[s] = pb.oracle_step(oracle[s], *(a[r] for a in args))
            assert rel_err(out[r], ref) < 5e-5
            assert rel_err(state[s], oracle[s]) < 5e-5
    assert bitwise_equal(state[idle], idle_before)              # null slot and idle slots
    assert impl != MOSAIC or not mosaic_races_found(interpret)


REPLAY_CASES = [
    # (L, act dtype, ring dtype, state dtype, out tol, checkpoint tol, fold); ring None: the
    # family's ring for bf16 activations (BF16_RING)
    pytest.param(4, F32, F32, F32, 5e-5, 5e-5, "fma", id="L4-f32-fma"),
    pytest.param(16, F32, F32, F32, 5e-5, 5e-5, "dot", id="L16-f32-dot"),
    pytest.param(16, F32, F32, F32, 5e-5, 5e-5, "fma", id="L16-f32-fma"),
    pytest.param(16, BF16, None, F32, 1e-2, 5e-5, "dot", id="L16-bf16act-dot"),
    pytest.param(8, BF16, BF16, BF16, 2e-2, 2e-2, "fma", id="L8-bf16-fma"),
]
# Mosaic GPU (always an fp32 FMA fold): the serving dtypes, through its interpreter, at the
# default tiling (both families' replay: the "overlap" prologue; "serial" gives the same sums,
# `test_mosaic_overlap_prologue_equals_serial`); and fp32 throughout, whose tight output
# tolerance catches a wrong ring product (the kernel computes the ring x token products itself:
# a dropped ring entry passes the bf16 case's 1e-2 by a hair).
MOSAIC_REPLAY_CASE = pytest.param(4, BF16, None, F32, 1e-2, 5e-5, "fma", id="L4-bf16act")
MOSAIC_F32_CASE = pytest.param(4, F32, F32, F32, 5e-5, 5e-5, "fma", id="L4-f32")


# The Triton kernel's tiling options (the family's REPLAY_OPTIONS) run these cases.
OPTION_CASES = ("L16-f32-dot", "L8-bf16-fma")


def _replay_params():
    params = [pytest.param(f, *c.values, {}, f.REPLAY_DIMS, impl, id=f"{name}-{c.id}-{impl}")
              for name, f in FAMILIES.items() for c in REPLAY_CASES for impl in IMPLS]
    params += [pytest.param(f, *c.values, opts, f.REPLAY_DIMS, "pallas",
                            id=f"{name}-{c.id}-{opt_id}-pallas")
               for name, f in FAMILIES.items() for opt_id, opts in f.REPLAY_OPTIONS
               for c in REPLAY_CASES if c.id in OPTION_CASES]
    params += [pytest.param(f, *c.values, opts, dims, "pallas", id=f"{name}-{c.id}-{opt_id}-pallas")
               for name, f in FAMILIES.items() for opt_id, dims, opts in f.MASKED_TILE_CASES
               for c in REPLAY_CASES if c.id in OPTION_CASES]
    # the Mosaic default in both cases, its options (slow in the interpreter) in the fp32 one
    return params + [pytest.param(f, *c.values, opts, f.REPLAY_DIMS, MOSAIC,
                                  id=f"{name}-{c.id}{opt_id}-{MOSAIC}")
                     for name, f in FAMILIES.items() if f.MOSAIC_DIMS is not None
                     for opt_id, opts, cases in [("", {}, (MOSAIC_REPLAY_CASE, MOSAIC_F32_CASE)),
                                                 *((f"-{i}", o, (MOSAIC_F32_CASE,))
                                                   for i, o in f.MOSAIC_REPLAY_OPTIONS)]
                     for c in cases]


@pytest.mark.parametrize("family,L,act,ring,state_dt,out_tol,ck_tol,fold,options,dims,impl",
                         _replay_params())
def test_replay_matches_recurrence_over_folds(family, L, act, ring, state_dt, out_tol, ck_tol,
                                              fold, options, dims, impl, interpret):
    """Outputs every step and the checkpoint after every fold equal the standard recurrence,
    over > 3 fold cycles, with rows at different counts (NaN ring entries past them), a padding
    row and untouched slots (bitwise); `options`: tiling fields beside the fold mode, at `dims`
    (the family's REPLAY_DIMS, or a masked tile case's)."""
    pb = family(L, batch=4, act=act, **impl_dims(family, dims, impl))
    bufs, counts, oracle = pb.make_replay_state(L, state_dt, ring or family.BF16_RING)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    idle = jnp.asarray([0, 3, 4, 6])
    idle_before = [np.asarray(a[idle]) for a in bufs]
    step = jitted(pb.ops, "replay_decode",                     # two state chunks
                  **impl_kw(impl, interpret,
                            pb.tiling("replay", chunk=16, impl=impl, fold=fold, **options)))
    folds = 0
    for _ in range(3 * L + 5):
        args = pb.step_inputs()
        before = np.asarray(counts)
        out, bufs, counts = step(bufs, counts, *args, *pb.consts, slots)
        out = np.asarray(out)
        assert np.isfinite(out).all(), "outputs not fully written"
        assert (out[2] == 0).all(), "padding row must output zeros"
        for r, s in live:
            ref, oracle[s] = pb.oracle_step(oracle[s], *(a[r] for a in args))
            assert rel_err(out[r], ref) < out_tol, (r, before[s])
            if before[s] == L - 1:
                folds += 1
                assert counts[s] == 0
                assert rel_err(bufs.checkpoint[s], oracle[s]) < ck_tol
            else:
                assert counts[s] == before[s] + 1
    assert folds >= 3 * len(live)
    for a, b in zip(bufs, idle_before):
        assert bitwise_equal(a[idle], b)                         # null slot and idle slots
    assert int(counts[NULL_SLOT]) == 0
    assert impl != MOSAIC or not mosaic_races_found(interpret)


MOSAIC_FAMILIES = [pytest.param(f, id=name) for name, f in FAMILIES.items()
                   if f.MOSAIC_DIMS is not None]


@pytest.mark.parametrize("family", MOSAIC_FAMILIES)
def test_mosaic_overlap_prologue_equals_serial(family, interpret):
    """prologue="overlap" only moves the ring walk after the checkpoint readout in time: the
    same sums, so outputs, checkpoints, rings and counts equal "serial"'s bitwise (compiled:
    within an ulp, `assert_runs_equal`) over two fold cycles (rows at different counts, NaN ring
    entries past them, a padding row)."""
    L = 4
    runs = []
    for prologue in ("serial", "overlap"):
        pb = family(5, batch=3, **impl_dims(family, family.REPLAY_DIMS, MOSAIC))
        bufs, counts, _ = pb.make_replay_state(L, F32, F32)
        slots = jnp.asarray([5, NULL_SLOT, 1], jnp.int32)
        step = jitted(pb.ops, "replay_decode", **impl_kw(
            MOSAIC, interpret, pb.tiling("replay", impl=MOSAIC, prologue=prologue)))
        outs = []
        for _ in range(2 * L):
            out, bufs, counts = step(bufs, counts, *pb.step_inputs(), *pb.consts, slots)
            outs.append(out)
        runs.append((outs, bufs, counts))
    assert_runs_equal(*runs, interpret)
    assert not mosaic_races_found(interpret)


@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("family,impl", family_impls())
def test_window_one_is_the_standard_step(family, impl, rows, interpret):
    """L = 1: every step folds, so the checkpoint is the standard state after every token; at
    the measured tilings of `rows` rows (one row: the Triton kernels' small-batch tiles)."""
    pb = family(3, batch=rows, **impl_dims(family, family.SMALL_DIMS, impl))
    state = pb.random_state()
    bufs = pb.init_buffers(1, F32)._replace(checkpoint=state)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([4, 2][:rows], jnp.int32)
    rstep = jitted(pb.ops, "replay_decode", **impl_kw(impl, interpret))
    sstep = jitted(pb.ops, "standard_decode", **impl_kw(impl, interpret))
    std = state.copy()
    for _ in range(6):
        args = pb.step_inputs() + pb.consts + (slots,)
        out_std, std = sstep(std, *args)
        out_rep, bufs, counts = rstep(bufs, counts, *args)
        assert rel_err(out_rep, out_std) < 1e-5
        assert rel_err(bufs.checkpoint, std) < 1e-5
        assert (np.asarray(counts) == 0).all()
    assert impl != MOSAIC or not mosaic_races_found(interpret)


@pytest.mark.parametrize("impl", IMPLS)
@each_family
def test_long_run_stays_within_tolerance(family, impl, interpret):
    """LONG_STEPS steps (2048 for Mamba-2, 4096 for GDN: 128 / 256 folds at L = 16), fp32 state
    and ring, against the f64 recurrence: outputs and every folded checkpoint within 5e-5.
    Kernels in interpret mode (CPU) run a quarter of them: the interpreter is ~50x slower than
    the XLA path, which runs them all; compiled on a GPU every implementation runs them all."""
    steps = family.LONG_STEPS // (4 if impl != "xla" and interpret else 1)
    worst_out, worst_ck, counts = long_run(family, impl_kw(impl, interpret), F32, n_steps=steps)
    print(f"\n{family.name} {steps}-step max relative deviation ({impl}): "
          f"out {worst_out:.2e}, checkpoint {worst_ck:.2e}")
    assert worst_out < 5e-5 and worst_ck < 5e-5
    assert (counts == 0).all()                      # a whole number of fold cycles


# Bad values of an eager call's slots, counts and draft rows (pool of S = 7 slots, window
# L = 4, two rows on slots 1 and 2): op, changes to the valid arguments (`_pool_args`), the
# error and its message. Checked before any implementation runs (the api's validation).
_I32 = lambda *v: jnp.asarray(v, jnp.int32)     # noqa: E731
BAD_VALUES = {
    "slot negative": ("replay_decode", dict(slots=_I32(-1, 2)),
                      ValueError, r"^slots\[0\] = -1 is outside the pool \[0, 7\)$"),
    "slot past the pool": ("standard_decode", dict(slots=_I32(1, 7)),
                           ValueError, r"^slots\[1\] = 7 is outside the pool \[0, 7\)$"),
    "slot twice": ("replay_decode", dict(slots=_I32(3, 3)),
                   ValueError, r"^slots: slot 3 is named more than once \(rows must name "
                               r"distinct slots; only the null slot 0 may repeat\)$"),
    "verify slot twice": ("replay_verify", dict(slots=_I32(5, 5)),
                          ValueError, r"^slots: slot 5 is named more than once"),
    "standard verify slot": ("standard_verify", dict(slots=_I32(1, 9)),
                             ValueError, r"^slots\[1\] = 9 is outside the pool"),
    "count L": ("replay_decode", dict(counts=jnp.zeros((7,), jnp.int32).at[4].set(4)),
                ValueError, r"^counts\[4\] = 4 is outside \[0, L - 1 = 3\] \(window L = 4\)$"),
    "count negative": ("replay_verify", dict(counts=jnp.zeros((7,), jnp.int32).at[2].set(-1)),
                       ValueError, r"^counts\[2\] = -1 is outside \[0, L - 1 = 3\]"),
    "draft slot past the pool": ("standard_verify", dict(draft_slots=_I32([3, 4], [5, 99])),
                                 ValueError, r"^draft_slots\[1, 1\] = 99 is outside the pool "
                                             r"\[0, 7\)$"),
    "draft slot twice": ("standard_verify", dict(draft_slots=_I32([3, 4], [4, 5])),
                         ValueError, r"^draft_slots: slot 4 is named more than once"),
    "batch 0": ("replay_decode", dict(rows=0), ValueError,
                r"has shape \(0, .*\): every dimension must be >= 1 \(no empty batch"),
    "verify batch 0": ("standard_verify", dict(rows=0), ValueError,
                       r"has shape \(0, .*\): every dimension must be >= 1"),
    "slots a list": ("replay_decode", dict(slots=[1, 2]), TypeError,
                     r"^slots must be an array \(jax.Array or numpy.ndarray\), got list$"),
    "buffers a tuple": ("replay_decode", dict(buffers=tuple), TypeError,
                        r"^buffers must be the family's NamedTuple of \(checkpoint, ring_.*\), "
                        r"got tuple$"),
}


def _pool_args(pb, op, rows=2, slots=None, counts=None, buffers=None, draft_slots=None):
    """Valid arguments of `op` (a pool op of pb's family; verify windows of T = 2) on rows
    of `slots` (default 1, 2), with the given ones replaced (buffers=tuple: the buffers as a
    plain tuple)."""
    T = 2
    inputs = pb.window_inputs(T, b=rows) if "verify" in op else pb.step_inputs(rows)
    slots = _I32(1, 2)[:rows] if slots is None else slots
    if op.startswith("standard"):
        head = (pb.random_state(),)
    else:
        bufs = pb.init_buffers(4)
        head = (tuple(bufs) if buffers is tuple else bufs,
                jnp.zeros((pb.S,), jnp.int32) if counts is None else counts)
    tail = ()
    if op == "standard_verify":
        tail = (_I32([3, 4], [5, 6])[:rows] if draft_slots is None else draft_slots,)
    return head + tuple(inputs) + pb.consts + (slots,) + tail


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(BAD_VALUES))
@each_family
def test_bad_slots_and_counts_give_one_line_errors(family, case, impl, interpret):
    """An eager call's out-of-pool or repeated slots, counts outside [0, L - 1], bad draft
    rows, an empty batch and arguments of the wrong kind are one-line errors naming the
    argument, on every implementation (no NaN, no write to another slot)."""
    op, changes, error, match = BAD_VALUES[case]
    pb = family(5, num_slots=7)
    with pytest.raises(error, match=match) as e:
        getattr(pb.ops, op)(*_pool_args(pb, op, **changes), **impl_kw(impl, interpret))
    assert "\n" not in str(e.value)


@each_family
@pytest.mark.parametrize("op", ["standard_decode", "replay_decode", "replay_verify",
                                "standard_verify"])
def test_padding_rows_may_repeat_the_null_slot(family, op):
    """Padding rows all on NULL_SLOT (and a padding row's draft rows, which it never writes,
    repeated) are legal; values are not checked under jit (tracing with bad slots and counts
    raises nothing: they stay the caller's contract there)."""
    pb = family(5, num_slots=7)
    fn = getattr(pb.ops, op)
    args = _pool_args(pb, op, rows=3, slots=_I32(NULL_SLOT, 4, NULL_SLOT),
                      draft_slots=_I32([1, 2], [5, 6], [1, 2]))
    out = fn(*args, impl="xla")[0]
    assert (np.asarray(out)[[0, 2]] == 0).all()
    bad = _pool_args(pb, op, slots=_I32(-1, 9), counts=jnp.full((pb.S,), 99, jnp.int32),
                     draft_slots=_I32([3, 3], [99, -5]))
    jax.eval_shape(lambda *a: fn(*a, impl="xla"), *bad)


REAL_PARAMS = [pytest.param(*p.values, "pallas", id=f"{p.id}-pallas")
               for p in cases("REAL_CASES")] + [
    pytest.param(f, c, MOSAIC, id=f"{name}-{c[0]}-{MOSAIC}")
    for name, f in FAMILIES.items() for c in f.MOSAIC_REAL_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("family,case,impl", REAL_PARAMS)
def test_real_shapes_compiled(family, case, impl):
    """Real model shapes, bf16 activations, fp32 state: compiled kernels against the XLA
    implementation (HIGHEST precision) over a full fold cycle, standard and replay."""
    pb = family(11, batch=8, num_slots=24, act=BF16, **case[1])
    bufs = pb.init_buffers(16, family.BF16_RING)._replace(checkpoint=pb.random_state())
    counts = jnp.asarray(pb.rng.integers(0, 16, pb.S), jnp.int32).at[0].set(0)
    slots = jnp.asarray(pb.rng.permutation(np.arange(1, pb.S))[:pb.batch], jnp.int32)
    ref_bufs = bufs
    state = ref_state = bufs.checkpoint
    ops = pb.ops
    for _ in range(17):
        args = pb.step_inputs() + pb.consts + (slots,)
        out, bufs = ops.replay_decode(bufs, counts, *args, impl=impl)
        out_ref, ref_bufs = ops.replay_decode(ref_bufs, counts, *args, impl="xla")
        counts = ops.advance_counts(counts, slots, 16)
        assert rel_err(out, out_ref) < 1e-2
        out, state = ops.standard_decode(state, *args, impl=impl)
        out_ref, ref_state = ops.standard_decode(ref_state, *args, impl="xla")
        assert rel_err(out, out_ref) < 1e-2
    assert rel_err(bufs.checkpoint, ref_bufs.checkpoint) < 5e-5
    assert rel_err(state, ref_state) < 5e-5
