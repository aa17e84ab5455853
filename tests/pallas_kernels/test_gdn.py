"""Gated DeltaNet decode kernels against a float64 numpy gated delta rule.

Tolerances (relative Frobenius error per step, live rows):
  float32 activations / ring / state ........ 5e-5
  bfloat16 activations, fp32 ring + state .... 1e-2 on o (o is bf16); 5e-5 on the checkpoint
  bfloat16 ring (cached d and k) ............. see test_long_run_numerics: the cached d is
                                               rounded to bf16, an error the standard step
                                               never makes; measured, reported, bounded
  bfloat16 state ............................. 2e-2
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gdn
from pallas_kernels._common import NULL_SLOT
from pallas_kernels.gdn import GDNBuffers
from tests.pallas_kernels.helpers import bitwise_equal, impl_kw, rel_err

F32, BF16 = jnp.float32, jnp.bfloat16


class Problem:
    """Random GDN shapes and per-step inputs; float64 oracle."""

    def __init__(self, seed, *, Hk=2, Hv=4, K=16, V=16, batch=3, num_slots=7, act=F32):
        self.rng = np.random.default_rng(seed)
        self.Hk, self.Hv, self.K, self.V = Hk, Hv, K, V
        self.batch, self.S, self.act = batch, num_slots, act

    def rand(self, shape, dtype, scale=1.0):
        return jnp.asarray(self.rng.standard_normal(shape) * scale, dtype)

    def step_inputs(self, b=None):
        b = self.batch if b is None else b
        q, k = gdn.prepare_qk(self.rand((b, self.Hk, self.K), F32), self.rand((b, self.Hk, self.K), F32))
        q, k = q.astype(self.act), k.astype(self.act)
        v = self.rand((b, self.Hv, self.V), self.act)
        g = jnp.asarray(-np.exp(self.rng.uniform(np.log(0.005), np.log(0.5), (b, self.Hv))), F32)
        beta = jnp.asarray(1 / (1 + np.exp(-self.rng.standard_normal((b, self.Hv)))), F32)
        return q, k, v, g, beta

    def oracle_step(self, state, q, k, v, g, beta):
        """float64 gated delta rule on one row: state [Hv, V, K]."""
        f = lambda a: np.asarray(a, np.float64)
        q, k, v, g, beta = map(f, (q, k, v, g, beta))
        r = self.Hv // self.Hk
        qh, kh = np.repeat(q, r, 0), np.repeat(k, r, 0)
        alpha = np.exp(g)[:, None]
        d = beta[:, None] * (v - alpha * np.einsum("hvk,hk->hv", state, kh))
        new = alpha[:, :, None] * state + d[:, :, None] * kh[:, None, :]
        return np.einsum("hvk,hk->hv", new, qh), new


def make_replay_state(pb: Problem, L, state_dtype, ring_dtype):
    """Random checkpoints and per-slot counts; ring entries below the count are the (k, d, g)
    a standard run would have produced, entries above are NaN."""
    S, Hk, Hv, K, V = pb.S, pb.Hk, pb.Hv, pb.K, pb.V
    ck = pb.rand((S, Hv, V, K), state_dtype, 0.3)
    rk = np.full((S, Hk, L, K), np.nan, np.float32)
    rd = np.full((S, Hv, L, V), np.nan, np.float32)
    rg = np.full((S, Hv, L), np.nan, np.float32)
    counts = pb.rng.integers(0, L, S).astype(np.int32)
    counts[NULL_SLOT] = 0
    oracle = {}
    r = Hv // Hk
    for s in range(S):
        state = np.asarray(ck[s], np.float64)
        for j in range(counts[s]):
            q, k, v, g, beta = (np.asarray(a[0]) for a in pb.step_inputs(1))
            k = np.asarray(jnp.asarray(k, ring_dtype), np.float64)
            kh = np.repeat(k, r, 0)
            d = beta[:, None] * (v - np.exp(g)[:, None] * np.einsum("hvk,hk->hv", state, kh))
            d = np.asarray(jnp.asarray(d, ring_dtype), np.float64)   # what the ring holds
            state = np.exp(g)[:, None, None] * state + d[:, :, None] * kh[:, None, :]
            rk[s, :, j], rd[s, :, j], rg[s, :, j] = k, d, g
        oracle[s] = state
    bufs = GDNBuffers(ck, jnp.asarray(rk, ring_dtype), jnp.asarray(rd, ring_dtype), jnp.asarray(rg))
    return bufs, jnp.asarray(counts), oracle


@functools.cache
def _jitted(fn_name, **kw):
    fn = getattr(gdn, fn_name)
    if fn_name == "replay_decode":
        def step(bufs, counts, *args):
            o, bufs = fn(bufs, counts, *args, **kw)
            return o, bufs, gdn.advance_counts(counts, args[-1], bufs.window)
        return jax.jit(step, donate_argnums=(0, 1))
    return jax.jit(functools.partial(fn, **kw), donate_argnums=(0,))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("shape,block_v", [(dict(Hk=2, Hv=4, K=16, V=16), None),
                                           (dict(Hk=1, Hv=2, K=32, V=32), 16)])
def test_standard_decode_matches_recurrence(impl, shape, block_v, interpret):
    pb = Problem(0, **shape)
    state = pb.rand((pb.S, pb.Hv, pb.V, pb.K), F32, 0.3)
    oracle = {s: np.asarray(state[s], np.float64) for s in range(pb.S)}
    slots = jnp.asarray([3, NULL_SLOT, 1], jnp.int32)
    idle = jnp.asarray([0, 2, 4, 5, 6])
    idle_before = np.asarray(state[idle])
    step = _jitted("standard_decode", **impl_kw(impl, interpret, block_v=block_v))
    for _ in range(5):
        args = pb.step_inputs()
        o, state = step(state, *args, slots)
        o = np.asarray(o)
        assert np.isfinite(o).all(), "outputs not fully written"
        assert (o[1] == 0).all(), "padding row must output zeros"
        for r, s in ((0, 3), (2, 1)):
            o_ref, oracle[s] = pb.oracle_step(oracle[s], *(a[r] for a in args))
            assert rel_err(o[r], o_ref) < 5e-5
            assert rel_err(state[s], oracle[s]) < 5e-5
    assert bitwise_equal(state[idle], idle_before)


REPLAY_CASES = [
    # (L, act dtype, ring dtype, state dtype, o tol, checkpoint tol, fold)
    (4, F32, F32, F32, 5e-5, 5e-5, "fma"),
    (16, F32, F32, F32, 5e-5, 5e-5, "dot"),
    (16, F32, F32, F32, 5e-5, 5e-5, "fma"),
    (16, BF16, F32, F32, 1e-2, 5e-5, "dot"),
    (8, BF16, BF16, BF16, 2e-2, 2e-2, "fma"),
]


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("L,act,ring,state_dt,o_tol,ck_tol,fold", REPLAY_CASES)
def test_replay_matches_recurrence_over_folds(impl, L, act, ring, state_dt, o_tol, ck_tol, fold,
                                              interpret):
    """Outputs every step and the checkpoint after every fold equal the gated delta rule, over
    > 3 fold cycles, rows at different counts, a padding row and untouched slots."""
    pb = Problem(L, Hk=2, Hv=4, K=32, V=16, batch=4, act=act)
    bufs, counts, oracle = make_replay_state(pb, L, state_dt, ring)
    slots = jnp.asarray([5, 2, NULL_SLOT, 1], jnp.int32)
    live = [(0, 5), (1, 2), (3, 1)]
    idle = jnp.asarray([0, 3, 4, 6])
    idle_before = [np.asarray(a[idle]) for a in bufs]
    step = _jitted("replay_decode", **impl_kw(impl, interpret, block_k=16, fold=fold))
    folds = 0
    for _ in range(3 * L + 5):
        args = pb.step_inputs()
        before = np.asarray(counts)
        o, bufs, counts = step(bufs, counts, *args, slots)
        o = np.asarray(o)
        assert np.isfinite(o).all(), "outputs not fully written"
        assert (o[2] == 0).all(), "padding row must output zeros"
        for r, s in live:
            o_ref, oracle[s] = pb.oracle_step(oracle[s], *(a[r] for a in args))
            assert rel_err(o[r], o_ref) < o_tol, (r, before[s])
            if before[s] == L - 1:
                folds += 1
                assert counts[s] == 0
                assert rel_err(bufs.checkpoint[s], oracle[s]) < ck_tol
            else:
                assert counts[s] == before[s] + 1
    assert folds >= 3 * len(live)
    for a, b in zip(bufs, idle_before):
        assert bitwise_equal(a[idle], b)
    assert int(counts[NULL_SLOT]) == 0


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_window_one_is_the_standard_step(impl, interpret):
    pb = Problem(3, Hk=1, Hv=2, K=16, V=16, batch=2)
    state = pb.rand((pb.S, pb.Hv, pb.V, pb.K), F32, 0.3)
    bufs = gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=1)._replace(checkpoint=state)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([4, 2], jnp.int32)
    rstep = _jitted("replay_decode", **impl_kw(impl, interpret))
    sstep = _jitted("standard_decode", **impl_kw(impl, interpret))
    std = state.copy()
    for _ in range(6):
        args = pb.step_inputs() + (slots,)
        o_std, std = sstep(std, *args)
        o_rep, bufs, counts = rstep(bufs, counts, *args)
        assert rel_err(o_rep, o_std) < 1e-5
        assert rel_err(bufs.checkpoint, std) < 1e-5
        assert (np.asarray(counts) == 0).all()


def _long_run(impl, interpret, ring_dtype, n_steps=4096, L=16):
    """n_steps of replay decode (one scan) against the f64 recurrence; returns the worst relative
    deviation of o over all steps and of the checkpoint after every fold."""
    pb = Problem(7, Hk=1, Hv=2, K=16, V=16, batch=2, num_slots=3)
    bufs = gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=L, ring_dtype=ring_dtype)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([1, 2], jnp.int32)
    inputs = [jnp.stack(a) for a in zip(*(pb.step_inputs() for _ in range(n_steps)))]
    kw = impl_kw(impl, interpret)

    @jax.jit
    def run(bufs, counts):
        def body(carry, inp):
            bufs, counts = carry
            o, bufs = gdn.replay_decode(bufs, counts, *inp, slots, **kw)
            return (bufs, gdn.advance_counts(counts, slots, L)), (o, bufs.checkpoint[slots])
        return jax.lax.scan(body, (bufs, counts), inputs)

    _, (os_, cks) = run(bufs, counts)
    os_, cks = np.asarray(os_), np.asarray(cks)
    state = np.zeros((2, pb.Hv, pb.V, pb.K))
    worst_o = worst_ck = 0.0
    for t in range(n_steps):
        for r in range(2):
            o_ref, state[r] = pb.oracle_step(state[r], *(a[t, r] for a in inputs))
            worst_o = max(worst_o, rel_err(os_[t, r], o_ref))
            if t % L == L - 1:
                worst_ck = max(worst_ck, rel_err(cks[t, r], state[r]))
    return worst_o, worst_ck


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_long_run_numerics(impl, interpret):
    """4096 steps (256 folds), fp32 state: the fp32 ring tracks the fp32 recurrence to rounding;
    the bf16 ring (d and k rounded to bf16) drifts by ~1e-3: measured and bounded here."""
    f32_o, f32_ck = _long_run(impl, interpret, F32)
    bf_o, bf_ck = _long_run(impl, interpret, BF16)
    print(f"\nGDN 4096-step max relative deviation ({impl}): fp32 ring o {f32_o:.2e} "
          f"checkpoint {f32_ck:.2e}; bf16 ring o {bf_o:.2e} checkpoint {bf_ck:.2e}")
    assert f32_o < 5e-5 and f32_ck < 5e-5
    assert bf_o < 3e-2 and bf_ck < 3e-2


def _valid_args(pb, L=16):
    bufs = gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=L)
    q, k, v, g, beta = pb.step_inputs(2)
    return dict(buffers=bufs, counts=jnp.zeros((pb.S,), jnp.int32), q=q, k=k, v=v, g=g,
                beta=beta, slots=jnp.asarray([1, 2], jnp.int32))


@pytest.mark.parametrize("change,match", [
    (lambda a, pb: a.update(v=a["v"][:, :3]), r"value heads \(3\) must be a multiple of key heads"),
    (lambda a, pb: a.update(g=a["g"].astype(BF16)), r"g has dtype bfloat16"),
    (lambda a, pb: a.update(k=a["k"][:, :, :8]), r"k has shape"),
    (lambda a, pb: a.update(slots=a["slots"][:1]), r"slots has shape"),
    (lambda a, pb: a.update(buffers=gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=6)),
     r"window L = 6 must be a power of two"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(ring_g=a["buffers"].ring_g.astype(BF16))),
     r"ring_g has dtype bfloat16"),
    (lambda a, pb: a.update(buffers=a["buffers"]._replace(ring_d=a["buffers"].ring_d.astype(BF16))),
     r"ring_d has dtype bfloat16"),
])
def test_replay_decode_rejects_bad_input(change, match):
    pb = Problem(1)
    args = _valid_args(pb)
    change(args, pb)
    with pytest.raises(ValueError, match=match):
        gdn.replay_decode(**args, impl="pallas")


def test_bad_tiles_are_named():
    pb = Problem(1, K=24)
    args = _valid_args(Problem(1))
    state = pb.rand((pb.S, pb.Hv, pb.V, 24), F32)
    q, k, v, g, beta = pb.step_inputs(2)
    with pytest.raises(ValueError, match=r"key dim K = 24 must be a power of two"):
        gdn.standard_decode(state, q, k, v, g, beta, args["slots"], impl="pallas")
    with pytest.raises(ValueError, match=r"block_v = 32 must be a power of two dividing value dim"):
        gdn.replay_decode(**args, impl="pallas", block_v=32)
    with pytest.raises(ValueError, match=r"fold=.dot. needs L and the tiles >= 16"):
        gdn.replay_decode(**args, impl="pallas", block_k=8, fold="dot")


@pytest.mark.gpu
def test_real_shapes_compiled():
    """Qwen3-Next shapes (Hk=16, Hv=32, K=V=128), bf16 activations, fp32 state and ring:
    compiled kernels against the XLA implementation over a full fold cycle."""
    pb = Problem(11, Hk=16, Hv=32, K=128, V=128, batch=8, num_slots=24, act=BF16)
    bufs = gdn.init_gdn_buffers(pb.S, pb.Hk, pb.Hv, pb.K, pb.V, window=16)
    bufs = bufs._replace(checkpoint=pb.rand(bufs.checkpoint.shape, F32, 0.3))
    counts = jnp.asarray(pb.rng.integers(0, 16, pb.S), jnp.int32).at[0].set(0)
    slots = jnp.asarray(pb.rng.permutation(np.arange(1, pb.S))[:pb.batch], jnp.int32)
    ref_bufs = bufs
    state = ref_state = bufs.checkpoint
    for _ in range(17):
        args = pb.step_inputs() + (slots,)
        o, bufs = gdn.replay_decode(bufs, counts, *args, impl="pallas")
        o_ref, ref_bufs = gdn.replay_decode(ref_bufs, counts, *args, impl="xla")
        counts = gdn.advance_counts(counts, slots, 16)
        assert rel_err(o, o_ref) < 1e-2
        os_, state = gdn.standard_decode(state, *args, impl="pallas")
        os_ref, ref_state = gdn.standard_decode(ref_state, *args, impl="xla")
        assert rel_err(os_, os_ref) < 1e-2
    assert rel_err(bufs.checkpoint, ref_bufs.checkpoint) < 5e-5
    assert rel_err(state, ref_state) < 5e-5
