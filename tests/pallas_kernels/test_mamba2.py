"""Mamba-2 decode kernels against a float64 numpy standard recurrence.

Tolerances (relative Frobenius error per step, over the live rows):
  float32 activations / ring / state ........ 5e-5 (HIGHEST or tf32x3 dots, fp32 math)
  bfloat16 activations + ring, fp32 state .... 5e-5 on the checkpoint; 1e-2 on y (y is bf16)
  bfloat16 state ............................. 2e-2 (the state itself is rounded to bf16)
The oracle is fed exactly the values the kernel sees (inputs rounded to their dtype first).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import mamba2
from pallas_kernels._common import NULL_SLOT
from pallas_kernels.mamba2 import ReplayBuffers
from tests.pallas_kernels.helpers import bitwise_equal, impl_kw as _kw, rel_err

F32, BF16 = jnp.float32, jnp.bfloat16


class Problem:
    """Random Mamba-2 shapes, parameters and per-step inputs; f64 oracle state per slot."""

    def __init__(self, seed, *, H=4, P=16, N=16, G=2, batch=3, num_slots=7, act=F32):
        self.rng = np.random.default_rng(seed)
        self.H, self.P, self.N, self.G, self.batch, self.S, self.act = H, P, N, G, batch, num_slots, act
        self.A = jnp.asarray(-np.exp(self.rng.uniform(-1, 1, H)), F32)
        self.D = jnp.asarray(self.rng.standard_normal(H), F32)

    def rand(self, shape, dtype, scale=1.0):
        return jnp.asarray(self.rng.standard_normal(shape) * scale, dtype)

    def step_inputs(self, b=None):
        b = self.batch if b is None else b
        x = self.rand((b, self.H, self.P), self.act)
        B = self.rand((b, self.G, self.N), self.act, self.N ** -0.5)
        C = self.rand((b, self.G, self.N), self.act, self.N ** -0.5)
        dt = jnp.asarray(self.rng.uniform(0.005, 0.15, (b, self.H)), F32)
        return x, B, C, dt

    def oracle_step(self, state, x, B, C, dt):
        """float64 standard recurrence on one row: state [H, P, N]; returns y, new state."""
        f = lambda a: np.asarray(a, np.float64)
        x, B, C, dt, A, D = map(f, (x, B, C, dt, self.A, self.D))
        hg = self.H // self.G
        Bh, Ch = np.repeat(B, hg, 0), np.repeat(C, hg, 0)
        new = np.exp(dt * A)[:, None, None] * state + (dt[:, None] * x)[:, :, None] * Bh[:, None, :]
        return np.einsum("hpn,hn->hp", new, Ch) + D[:, None] * x, new


def make_replay_state(pb: Problem, L, state_dtype, ring_dtype):
    """Random checkpoints, random per-slot counts with valid ring entries below the count and NaN
    above it (garbage must never leak), plus the matching f64 oracle states."""
    S, H, P, N, G = pb.S, pb.H, pb.P, pb.N, pb.G
    ck = pb.rand((S, H, P, N), state_dtype, 0.5)
    rx = np.full((S, H, L, P), np.nan, np.float32)
    rb = np.full((S, G, L, N), np.nan, np.float32)
    rdt = np.full((S, H, L), np.nan, np.float32)
    counts = pb.rng.integers(0, L, S).astype(np.int32)
    counts[NULL_SLOT] = 0
    oracle = {}
    for s in range(S):
        state = np.asarray(ck[s], np.float64)
        for j in range(counts[s]):
            x, B, C, dt = (np.asarray(a[0]) for a in pb.step_inputs(1))
            x, B = (np.asarray(jnp.asarray(a, ring_dtype), np.float32) for a in (x, B))
            rx[s, :, j], rb[s, :, j], rdt[s, :, j] = x, B, dt
            _, state = pb.oracle_step(state, x, B, C, dt)
        oracle[s] = state
    bufs = ReplayBuffers(ck, jnp.asarray(rx, ring_dtype), jnp.asarray(rb, ring_dtype),
                         jnp.asarray(rdt))
    return bufs, jnp.asarray(counts), oracle


@functools.cache
def _jitted(fn_name, **kw):
    fn = getattr(mamba2, fn_name)
    if fn_name == "replay_decode":
        def step(bufs, counts, *args):
            y, bufs = fn(bufs, counts, *args, **kw)
            return y, bufs, mamba2.advance_counts(counts, args[-1], bufs.window)
        return jax.jit(step, donate_argnums=(0, 1))
    return jax.jit(functools.partial(fn, **kw), donate_argnums=(0,))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("shape,block_n", [(dict(H=4, P=16, N=16, G=2), None),  # grouped heads
                                           (dict(H=2, P=80, N=32, G=1), 16)])   # P = 80, 2 N chunks
def test_standard_decode_matches_recurrence(impl, shape, block_n, interpret):
    pb = Problem(0, **shape)
    state = pb.rand((pb.S, pb.H, pb.P, pb.N), F32, 0.5)
    oracle = {s: np.asarray(state[s], np.float64) for s in range(pb.S)}
    slots = jnp.asarray([3, NULL_SLOT, 1], jnp.int32)
    untouched = np.asarray(state[jnp.asarray([0, 2, 4, 5, 6])])
    step = _jitted("standard_decode", **_kw(impl, interpret, block_n=block_n))
    for _ in range(5):
        x, B, C, dt = pb.step_inputs()
        y, state = step(state, x, B, C, dt, pb.A, pb.D, slots)
        y = np.asarray(y)
        assert np.isfinite(y).all(), "outputs not fully written"
        assert (y[1] == 0).all(), "padding row must output zeros"
        for r, s in ((0, 3), (2, 1)):
            y_ref, oracle[s] = pb.oracle_step(oracle[s], x[r], B[r], C[r], dt[r])
            assert rel_err(y[r], y_ref) < 5e-5
            assert rel_err(state[s], oracle[s]) < 5e-5
    np.testing.assert_array_equal(np.asarray(state[jnp.asarray([0, 2, 4, 5, 6])]), untouched)


REPLAY_CASES = [
    # (L, act dtype, ring dtype, state dtype, y tol, checkpoint tol, fold)
    (4, F32, F32, F32, 5e-5, 5e-5, "fma"),
    (16, F32, F32, F32, 5e-5, 5e-5, "dot"),
    (16, F32, F32, F32, 5e-5, 5e-5, "fma"),
    (16, BF16, BF16, F32, 1e-2, 5e-5, "dot"),
    (8, BF16, BF16, BF16, 2e-2, 2e-2, "fma"),
]


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("L,act,ring,state_dt,y_tol,ck_tol,fold", REPLAY_CASES)
def test_replay_matches_recurrence_over_folds(impl, L, act, ring, state_dt, y_tol, ck_tol, fold,
                                              interpret):
    """Outputs every step and the checkpoint after every fold equal the standard recurrence,
    over > 3 fold cycles, with rows at different counts, a padding row and untouched slots."""
    pb = Problem(L, H=4, P=16, N=32, G=2, batch=4, act=act)
    bufs, counts, oracle = make_replay_state(pb, L, state_dt, ring)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    idle = jnp.asarray([0, 3, 4, 6])
    idle_before = [np.asarray(a[idle]) for a in bufs]
    step = _jitted("replay_decode", **_kw(impl, interpret, block_n=16, fold=fold))  # 2 N chunks
    folds = 0
    for _ in range(3 * L + 5):
        x, B, C, dt = pb.step_inputs()
        before = np.asarray(counts)
        y, bufs, counts = step(bufs, counts, x, B, C, dt, pb.A, pb.D, slots)
        y = np.asarray(y)
        assert np.isfinite(y).all(), "outputs not fully written"
        assert (y[2] == 0).all(), "padding row must output zeros"
        for r, s in live:
            y_ref, oracle[s] = pb.oracle_step(oracle[s], x[r], B[r], C[r], dt[r])
            assert rel_err(y[r], y_ref) < y_tol, (r, before[s])
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


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_window_one_is_the_standard_step(impl, interpret):
    """L = 1: every step folds, so the checkpoint is the standard state after every token."""
    pb = Problem(3, H=2, P=16, N=16, G=1, batch=2)
    state = pb.rand((pb.S, pb.H, pb.P, pb.N), F32, 0.5)
    bufs = mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G, window=1,
                                      ring_dtype=F32)._replace(checkpoint=state)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([4, 2], jnp.int32)
    rstep = _jitted("replay_decode", **_kw(impl, interpret))
    sstep = _jitted("standard_decode", **_kw(impl, interpret))
    std = state.copy()
    for _ in range(6):
        args = pb.step_inputs() + (pb.A, pb.D, slots)
        y_std, std = sstep(std, *args)
        y_rep, bufs, counts = rstep(bufs, counts, *args)
        assert rel_err(y_rep, y_std) < 1e-5
        assert rel_err(bufs.checkpoint, std) < 1e-5
        assert (np.asarray(counts) == 0).all()


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_long_run_stays_within_tolerance(impl, interpret):
    """2048 steps (128 folds at L = 16), fp32 state, against the f64 recurrence."""
    n_steps, L = 2048, 16
    pb = Problem(7, H=2, P=8, N=16, G=1, batch=2, num_slots=3)
    bufs = mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G, window=L, ring_dtype=F32)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([1, 2], jnp.int32)
    xs, Bs, Cs, dts = zip(*(pb.step_inputs() for _ in range(n_steps)))
    xs, Bs, Cs, dts = map(jnp.stack, (xs, Bs, Cs, dts))
    kw = _kw(impl, interpret)

    @jax.jit
    def run(bufs, counts):
        def body(carry, inp):
            bufs, counts = carry
            y, bufs = mamba2.replay_decode(bufs, counts, *inp, pb.A, pb.D, slots, **kw)
            return (bufs, mamba2.advance_counts(counts, slots, L)), y
        return jax.lax.scan(body, (bufs, counts), (xs, Bs, Cs, dts))

    (bufs, counts), ys = run(bufs, counts)
    ys = np.asarray(ys)
    state = np.zeros((2, pb.H, pb.P, pb.N))
    worst_y = worst_ck = 0.0
    for t in range(n_steps):
        for r in range(2):
            y_ref, state[r] = pb.oracle_step(state[r], xs[t, r], Bs[t, r], Cs[t, r], dts[t, r])
            worst_y = max(worst_y, rel_err(ys[t, r], y_ref))
    for r, s in enumerate([1, 2]):
        worst_ck = max(worst_ck, rel_err(bufs.checkpoint[s], state[r]))
    print(f"\n2048-step max relative deviation ({impl}): y {worst_y:.2e}, checkpoint {worst_ck:.2e}")
    assert int(counts[1]) == 0 and worst_y < 5e-5 and worst_ck < 5e-5


def _valid_args(pb, L=16):
    bufs = mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G, window=L)
    counts = jnp.zeros((pb.S,), jnp.int32)
    x, B, C, dt = pb.step_inputs(2)
    return dict(buffers=bufs, counts=counts, x=x, B=B, C=C, dt=dt, A=pb.A, D=pb.D,
                slots=jnp.asarray([1, 2], jnp.int32))


@pytest.mark.parametrize("change,match", [
    (lambda a, pb: a.update(x=a["x"][:, :3]), r"heads \(3\) must be a multiple of groups"),
    (lambda a, pb: a.update(dt=a["dt"].astype(BF16)), r"dt has dtype bfloat16"),
    (lambda a, pb: a.update(slots=a["slots"].astype(jnp.int16)), r"slots has dtype int16"),
    (lambda a, pb: a.update(C=a["C"][:, :, :8]), r"C has shape"),
    (lambda a, pb: a.update(buffers=mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G,
                                                               window=12)),
     r"window L = 12 must be a power of two"),
    (lambda a, pb: a.update(counts=a["counts"][:3]), r"counts has shape"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(ring_dt=a["buffers"].ring_dt.astype(BF16))),
     r"ring_dt has dtype bfloat16"),
])
def test_replay_decode_rejects_bad_input(change, match):
    pb = Problem(1, H=4, P=16, N=16, G=2)
    args = _valid_args(pb)
    change(args, pb)
    with pytest.raises(ValueError, match=match):
        mamba2.replay_decode(**args, impl="pallas")


def test_bad_shapes_are_named():
    pb = Problem(1, H=4, P=12, N=24, G=2)
    with pytest.raises(ValueError, match=r"d_state N = 24 must be a power of two"):
        mamba2.standard_decode(pb.rand((pb.S, 4, 12, 24), F32), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="pallas")
    pb = Problem(1, H=4, P=12, N=16, G=2)
    with pytest.raises(ValueError, match=r"block_p = 8 must be a power of two dividing head_dim"):
        mamba2.standard_decode(pb.rand((pb.S, 4, 12, 16), F32), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="pallas", block_p=8)
    with pytest.raises(ValueError, match=r"impl must be one of"):
        mamba2.standard_decode(pb.rand((pb.S, 4, 12, 16), F32), *pb.step_inputs(2), pb.A, pb.D,
                               jnp.asarray([1, 2], jnp.int32), impl="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [64, 80])
def test_real_shapes_compiled(P):
    """Nemotron-H shapes (H=128, N=128, G=8), bf16 activations and ring, fp32 state: compiled
    kernels against the XLA implementation (HIGHEST precision) over a full fold cycle."""
    pb = Problem(11, H=128, P=P, N=128, G=8, batch=8, num_slots=24, act=BF16)
    bufs = mamba2.init_replay_buffers(pb.S, pb.H, pb.P, pb.N, pb.G, window=16)
    bufs = bufs._replace(checkpoint=pb.rand(bufs.checkpoint.shape, F32, 0.5))
    counts = jnp.asarray(pb.rng.integers(0, 16, pb.S), jnp.int32).at[0].set(0)
    slots = jnp.asarray(pb.rng.permutation(np.arange(1, pb.S))[:pb.batch], jnp.int32)
    ref_bufs, ref_counts = bufs, counts
    state = ref_state = bufs.checkpoint
    for _ in range(17):
        args = pb.step_inputs() + (pb.A, pb.D, slots)
        y, bufs = mamba2.replay_decode(bufs, counts, *args, impl="pallas")
        y_ref, ref_bufs = mamba2.replay_decode(ref_bufs, ref_counts, *args, impl="xla")
        counts = mamba2.advance_counts(counts, slots, 16)
        ref_counts = counts
        assert rel_err(y, y_ref) < 1e-2
        ys, state = mamba2.standard_decode(state, *args, impl="pallas")
        ys_ref, ref_state = mamba2.standard_decode(ref_state, *args, impl="xla")
        assert rel_err(ys, ys_ref) < 1e-2
    assert rel_err(bufs.checkpoint, ref_bufs.checkpoint) < 5e-5
    assert rel_err(state, ref_state) < 5e-5
