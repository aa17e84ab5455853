"""One adapter per kernel family for the shared kernel tests: a random problem (shapes,
parameters, per-step inputs), the float64 oracle step of one row, replay states whose ring holds
what a standard run would have cached (NaN past the count), and the family's ops and tilings.

The oracle is fed exactly the values the kernels see (inputs rounded to their dtype first).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gdn, mamba2
from pallas_kernels.ring import NULL_SLOT
from tests.pallas_kernels.helpers import impl_kw, rel_err

F32, BF16 = jnp.float32, jnp.bfloat16
f64 = lambda a: np.asarray(a, np.float64)


class Problem:
    """Random problem of one family: `dims` (DIMS overridden by keywords), a pool of `S` slots,
    batches of `batch` rows with activations of dtype `act`. Subclasses give the family, and the
    shapes the shared tests run it at."""

    name: str
    ops = None                    # the family module (pallas_kernels.mamba2 / .gdn)
    DIMS: dict                    # default dims
    CHUNK_FIELDS: tuple           # tiling fields of the chunk the state is streamed in
    STATE_SCALE: float            # scale of random states
    BF16_RING: object             # ring dtype that goes with bf16 activations
    STANDARD_CASES: list          # (id, dims, tiling overrides) of the standard decode test
    REPLAY_DIMS: dict             # replay and verify over folds: two state chunks of 16
    SMALL_DIMS: dict              # L = 1 test
    LONG_DIMS: dict               # long runs, of LONG_STEPS steps
    LONG_STEPS: int
    REAL_CASES: list              # (id, dims) of real model shapes (compiled on GPU)
    COMPUTED_RING: tuple          # ring fields computed by the op (others copy the inputs)
    MOSAIC_DIMS: dict | None      # dims overridden to fit the Mosaic GPU kernels (None: none)
    MOSAIC_REAL_CASES: list       # the REAL_CASES the Mosaic GPU kernels support
    MOSAIC_CHUNK: int | None      # the state chunk of the Mosaic GPU tests
    REPLAY_OPTIONS: list          # (id, overrides): the Triton replay tiling's options
    VERIFY_OPTIONS: dict          # the Triton verify tiling's options, all at once
    MOSAIC_VERIFY_OPTIONS = []    # (id, Mosaic verify tiling fields) cases beside its default
    TILE_FIELD: str               # the Triton tilings' field of the value / head-dim tile
    MASKED_TILE_CASES: list = []  # (id, dims, overrides): Triton tiles that do not divide
                                  # their axis (masked), run by standard and replay decode
    MOSAIC_REPLAY_OPTIONS: list = []  # (id, overrides): the Mosaic replay tiling's options
    ROW_SLOWEST = dict(grid_order="row_slowest")  # the launch order every Triton tiling takes

    def __init__(self, seed, *, batch=3, num_slots=7, act=F32, **dims):
        self.rng = np.random.default_rng(seed)
        self.batch, self.S, self.act = batch, num_slots, act
        self.dims = {**self.DIMS, **dims}
        self.consts = ()

    def rand(self, shape, dtype, scale=1.0):
        return jnp.asarray(self.rng.standard_normal(shape) * scale, dtype)

    def window_inputs(self, T, b=None):
        """T tokens' inputs stacked on axis 1: [b, T, ...] each."""
        return [jnp.stack(a, axis=1) for a in zip(*(self.step_inputs(b) for _ in range(T)))]

    def random_state(self, dtype=F32):
        return self.rand(self.state_shape, dtype, self.STATE_SCALE)

    def tiling(self, kind, chunk=None, impl="pallas", **overrides):
        """The family's measured tiling of `kind` ("standard", "replay", "verify") for `impl`
        with overrides; `chunk` sets every chunk field the tiling has. The Mosaic GPU tilings
        take the overrides they have fields for (the fold is always FMA there) and the chunk
        MOSAIC_CHUNK."""
        t = getattr(self.ops, f"{'MOSAIC_' if impl == MOSAIC else ''}{kind.upper()}_TILING")
        names = {f.name for f in dataclasses.fields(t)}
        if chunk is not None:
            overrides.update({f: chunk for f in self.CHUNK_FIELDS if f in names})
        if impl == MOSAIC:
            overrides = {k: v for k, v in overrides.items() if k in names}
            overrides.update({f: self.MOSAIC_CHUNK for f in self.CHUNK_FIELDS if f in names})
        return dataclasses.replace(t, **overrides)

    def make_replay_state(self, L, state_dtype, ring_dtype):
        """Random checkpoints and per-slot counts; ring entries below the count are what a
        standard run from the checkpoint would have cached, entries above are NaN (garbage must
        never leak). Returns the buffers, counts [S] and the float64 oracle state per slot."""
        ck = self.random_state(state_dtype)
        rings = [np.full(r.shape, np.nan, np.float32) for r in self.init_buffers(L)[1:]]
        counts = self.rng.integers(0, L, self.S).astype(np.int32)
        counts[NULL_SLOT] = 0
        oracle = {}
        for s in range(self.S):
            state = f64(ck[s])
            for j in range(counts[s]):
                entries, state = self.ring_step(state, ring_dtype)
                for r, e in zip(rings, entries):
                    r[s, :, j] = e
            oracle[s] = state
        ring_dtypes = (ring_dtype, ring_dtype, F32)
        bufs = type(self.init_buffers(1))(
            ck, *(jnp.asarray(r, dt) for r, dt in zip(rings, ring_dtypes)))
        return bufs, jnp.asarray(counts), oracle


class Mamba2(Problem):
    name = "mamba2"
    ops = mamba2
    DIMS = dict(H=4, P=16, N=16, G=2)
    CHUNK_FIELDS = ("block_n",)
    STATE_SCALE = 0.5
    BF16_RING = BF16              # the ring holds activations that are bf16 already
    COMPUTED_RING = ()
    REPLAY_OPTIONS = [("evict-first", dict(state_eviction="evict_first")),
                      ("row-slowest", Problem.ROW_SLOWEST),
                      ("xla-scalars", dict(ring_scalars="xla")),
                      ("all-ring-rows", dict(ring_loads="all"))]
    TILE_FIELD = "block_p"
    # two P tiles of 8 (an FMA fold): every launch axis > 1 in the row-slowest order; the
    # window's x written by the kernel
    VERIFY_OPTIONS = dict(state_eviction="evict_first", block_p=8, ring_write="kernel",
                          **Problem.ROW_SLOWEST)
    STANDARD_CASES = [("grouped", dict(H=4, P=16, N=16, G=2), {}),
                      ("p80", dict(H=2, P=80, N=32, G=1), dict(chunk=16))]  # 5 P tiles of 16
    REPLAY_DIMS = dict(H=4, P=16, N=32, G=2)
    # p_tiles="masked" at P = 80: tiles of 32, 32 and 16 live rows of 32; one of 128, 48 masked
    MASKED_TILE_CASES = [(f"p80-masked{bp}", dict(H=2, P=80, N=32, G=1),
                          dict(p_tiles="masked", block_p=bp)) for bp in (32, 128)]
    SMALL_DIMS = dict(H=2, P=16, N=16, G=1)
    LONG_DIMS = dict(H=2, P=8, N=16, G=1)
    LONG_STEPS = 2048
    REAL_CASES = [("nemotron-h-8b", dict(H=128, P=64, N=128, G=8)),
                  ("nemotron-nano-9b-v2", dict(H=128, P=80, N=128, G=8))]
    # Two P tiles (P = 80: a warpgroup's 64 rows and a ragged one of 16, as Nemotron-Nano-9B-v2
    # runs), few CTAs (the interpreter is slow), and N in four chunks of MOSAIC_CHUNK: the
    # double-buffered write-back reuses its buffers (race detection sees it).
    MOSAIC_DIMS = dict(H=2, G=1, P=80, N=64)
    MOSAIC_CHUNK = 16
    MOSAIC_REAL_CASES = REAL_CASES
    # its options, several to a case (the interpreter is slow): the B . C products by XLA
    # with a lean fold (2 chunks in flight, one staging buffer: each write-back waits for the
    # one before) under a 4-stage read-only pass, the ring's x rows by blocks of 2 (L = 4: the
    # default's 4 copy them in one block, only where a row is committed)
    MOSAIC_REPLAY_OPTIONS = [("bc-xla-lean-fold-ring-block", dict(
        bc_products="xla", num_stages=4, fold_stages=2, fold_buffers=1, ring_block=2))]
    # the verify's B . C products by the Pallas launch (the test tiling's: XLA), the window's
    # ring rows written by the kernel, the ring's x rows by blocks of 3 (L = 8: a ragged last
    # block)
    MOSAIC_VERIFY_OPTIONS = [("bc-pallas-ring-write-ring-block", dict(
        bc_products="pallas", ring_write="kernel", ring_block=3))]

    def __init__(self, seed, **kw):
        super().__init__(seed, **kw)
        H = self.dims["H"]
        self.A = jnp.asarray(-np.exp(self.rng.uniform(-1, 1, H)), F32)
        self.D = jnp.asarray(self.rng.standard_normal(H), F32)
        self.consts = (self.A, self.D)

    @property
    def state_shape(self):
        d = self.dims
        return (self.S, d["H"], d["P"], d["N"])

    def init_buffers(self, L, ring_dtype=BF16):
        d = self.dims
        return mamba2.init_replay_buffers(self.S, d["H"], d["P"], d["N"], d["G"], window=L,
                                          ring_dtype=ring_dtype)

    def step_inputs(self, b=None):
        """x [b, H, P], B, C [b, G, N], dt [b, H]."""
        b = self.batch if b is None else b
        H, P, N, G = (self.dims[k] for k in "HPNG")
        x = self.rand((b, H, P), self.act)
        B = self.rand((b, G, N), self.act, N ** -0.5)
        C = self.rand((b, G, N), self.act, N ** -0.5)
        dt = jnp.asarray(self.rng.uniform(0.005, 0.15, (b, H)), F32)
        return x, B, C, dt

    def oracle_step(self, state, x, B, C, dt):
        """float64 standard recurrence on one row: state [H, P, N]; returns y, new state."""
        x, B, C, dt, A, D = map(f64, (x, B, C, dt, self.A, self.D))
        hg = self.dims["H"] // self.dims["G"]
        Bh, Ch = np.repeat(B, hg, 0), np.repeat(C, hg, 0)
        new = np.exp(dt * A)[:, None, None] * state + (dt[:, None] * x)[:, :, None] * Bh[:, None, :]
        return np.einsum("hpn,hn->hp", new, Ch) + D[:, None] * x, new

    def ring_step(self, state, ring_dtype):
        """One random token through the oracle: its ring entries (x, B, dt) and the new state."""
        x, B, C, dt = (np.asarray(a[0]) for a in self.step_inputs(1))
        x, B = (np.asarray(jnp.asarray(a, ring_dtype), np.float32) for a in (x, B))
        _, state = self.oracle_step(state, x, B, C, dt)
        return (x, B, dt), state


class GDN(Problem):
    name = "gdn"
    ops = gdn
    DIMS = dict(Hk=2, Hv=4, K=16, V=16)
    CHUNK_FIELDS = ("block_k", "block_k_long")
    STATE_SCALE = 0.3
    BF16_RING = F32               # the cached d drifts in bf16: rings stay fp32 by default
    COMPUTED_RING = ("ring_d",)
    REPLAY_OPTIONS = [("evict-first", dict(state_eviction="evict_first")),
                      ("xla-scalars", dict(ring_scalars="xla")),
                      ("xla-scalars-evict-first", dict(ring_scalars="xla",
                                                       state_eviction="evict_first")),
                      ("row-slowest", Problem.ROW_SLOWEST),
                      ("head-slowest", dict(grid_order="head_slowest")),
                      ("all-ring-rows", dict(ring_loads="all")),
                      ("unrolled", dict(chunk_loop="unrolled"))]
    TILE_FIELD = "block_v"
    # two V tiles of 8 (an FMA fold): every launch axis > 1 in the row-slowest order; the
    # window's d written by the kernel
    VERIFY_OPTIONS = dict(state_eviction="evict_first", block_v=8, ring_write="kernel",
                          **Problem.ROW_SLOWEST)
    STANDARD_CASES = [("grouped", dict(Hk=2, Hv=4, K=16, V=16), {}),
                      ("tiled", dict(Hk=1, Hv=2, K=32, V=32), dict(block_v=16))]
    REPLAY_DIMS = dict(Hk=2, Hv=4, K=32, V=16)
    SMALL_DIMS = LONG_DIMS = dict(Hk=1, Hv=2, K=16, V=16)
    LONG_STEPS = 4096
    REAL_CASES = [("qwen3-next", dict(Hk=16, Hv=32, K=128, V=128))]
    # Two V tiles (a warpgroup's 64 rows and a ragged one of 16), few CTAs (the interpreter is
    # slow), two value heads on one key head (the key append is the group's), and K in four
    # chunks of MOSAIC_CHUNK: the replay fold's double-buffered write-back reuses its buffers
    # (race detection sees it).
    MOSAIC_DIMS = dict(Hk=1, Hv=2, K=64, V=80)
    MOSAIC_CHUNK = 16
    MOSAIC_REAL_CASES = REAL_CASES
    # the default's fold is lean (2 chunks in flight, one staging buffer: each write-back
    # waits for the one before); the fold as the read-only pass, double-buffered, beside it
    # (with the walk updating S0 k and S0 q in place, the "fused" prologue, and the ring's d
    # rows in one copy, ring_block 0); the ring's d rows by blocks of 3 (L = 4: a ragged last
    # block; the default's 4 copy them in one block, only where a row is committed), with the
    # mma readout and XLA's key products (the default's: the launch, over committed keys)
    MOSAIC_REPLAY_OPTIONS = [("full-fold-fused-whole-ring", dict(
                                 num_stages=3, fold_stages=0, fold_buffers=2, prologue="fused",
                                 ring_block=0)),
                             ("mma-keys-xla-ring-block", dict(
                                 readout="mma", key_products="xla", ring_block=3))]
    # the verify's default reads by tf32 wgmmas with a lean fold (one chunk in flight, one
    # buffer); the FMA readout with the fold as the read-only pass, double-buffered, beside it;
    # the key products by the Pallas launch (the default to T = 4), and in the kernel by tf32
    # wgmmas with the overlap prologue and the window's ring rows written by the kernel, and
    # with the serial prologue (their rows in its scope; the fused prologue's in-kernel
    # products, the default from T = 5: the T = 8 case)
    MOSAIC_VERIFY_OPTIONS = [("fma-full-fold", dict(readout="fma", fold_stages=0,
                                                    fold_buffers=2)),
                             ("keys-pallas", dict(key_products="pallas")),
                             ("keys-kernel-overlap-ring-xla",
                              dict(key_products="kernel", prologue="overlap",
                                   ring_write="xla")),
                             ("keys-kernel-serial-ring-block", dict(
                                 key_products="kernel", prologue="serial", ring_block=3)),
                             # a non-fp32 state's (or ring's) default from T = 5
                             ("fused-fma-keys-pallas", dict(prologue="fused", readout="fma",
                                                            key_products="pallas"))]

    @property
    def state_shape(self):
        d = self.dims
        return (self.S, d["Hv"], d["V"], d["K"])

    def init_buffers(self, L, ring_dtype=F32):
        d = self.dims
        return gdn.init_gdn_buffers(self.S, d["Hk"], d["Hv"], d["K"], d["V"], window=L,
                                    ring_dtype=ring_dtype)

    def step_inputs(self, b=None):
        """q, k [b, Hk, K] (prepared), v [b, Hv, V], g, beta [b, Hv]."""
        b = self.batch if b is None else b
        Hk, Hv, K, V = (self.dims[k] for k in ("Hk", "Hv", "K", "V"))
        q, k = gdn.prepare_qk(self.rand((b, Hk, K), F32), self.rand((b, Hk, K), F32))
        q, k = q.astype(self.act), k.astype(self.act)
        v = self.rand((b, Hv, V), self.act)
        g = jnp.asarray(-np.exp(self.rng.uniform(np.log(0.005), np.log(0.5), (b, Hv))), F32)
        beta = jnp.asarray(1 / (1 + np.exp(-self.rng.standard_normal((b, Hv)))), F32)
        return q, k, v, g, beta

    def _key_heads(self, t):
        return np.repeat(t, self.dims["Hv"] // self.dims["Hk"], 0)

    def oracle_step(self, state, q, k, v, g, beta):
        """float64 gated delta rule on one row: state [Hv, V, K]; returns o, new state."""
        q, k, v, g, beta = map(f64, (q, k, v, g, beta))
        qh, kh = self._key_heads(q), self._key_heads(k)
        alpha = np.exp(g)[:, None]
        d = beta[:, None] * (v - alpha * np.einsum("hvk,hk->hv", state, kh))
        new = alpha[:, :, None] * state + d[:, :, None] * kh[:, None, :]
        return np.einsum("hvk,hk->hv", new, qh), new

    def ring_step(self, state, ring_dtype):
        """One random token through the oracle: its ring entries (k, d, g) as the ring holds
        them (d rounded to the ring dtype, and the state continued from that d)."""
        q, k, v, g, beta = (np.asarray(a[0]) for a in self.step_inputs(1))
        k = np.asarray(jnp.asarray(k, ring_dtype), np.float64)
        kh = self._key_heads(k)
        d = beta[:, None] * (v - np.exp(g)[:, None] * np.einsum("hvk,hk->hv", state, kh))
        d = np.asarray(jnp.asarray(d, ring_dtype), np.float64)
        state = np.exp(g)[:, None, None] * state + d[:, :, None] * kh[:, None, :]
        return (k, d, g), state


FAMILIES = {"mamba2": Mamba2, "gdn": GDN}
IMPLS = ["pallas", "xla"]
MOSAIC = "pallas_mosaic_gpu"
each_family = pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))


def cases(attr):
    """pytest params (family, case) over every family's list `attr`, with ids."""
    return [pytest.param(f, c, id=f"{name}-{c[0]}") for name, f in FAMILIES.items()
            for c in getattr(f, attr)]


def impl_cases(attr, mosaic=1):
    """pytest params (family, case, impl): each of IMPLS with every case of every family's list
    `attr`, plus Mosaic GPU on the first `mosaic` cases of the families that have it (the Mosaic
    GPU interpreter costs ~0.1 s per CTA and step)."""
    params = []
    for name, f in FAMILIES.items():
        fcases = [(c, f"{name}-{c[0]}") for c in getattr(f, attr)]
        params += [pytest.param(f, c, impl, id=f"{i}-{impl}") for impl in IMPLS for c, i in fcases]
        if f.MOSAIC_DIMS is not None:
            params += [pytest.param(f, c, MOSAIC, id=f"{i}-{MOSAIC}") for c, i in fcases[:mosaic]]
    return params


def has_mosaic(family, op):
    """Whether `family` has a Mosaic GPU kernel for the op named `op` (and dims that fit one)."""
    return family.MOSAIC_DIMS is not None and hasattr(family.ops.pallas_mosaic_gpu, op)


def family_impls(mosaic=True):
    """pytest params (family, impl): each family with each of IMPLS, and with Mosaic GPU where
    it has it (if `mosaic`)."""
    return [pytest.param(f, impl, id=f"{name}-{impl}") for name, f in FAMILIES.items()
            for impl in IMPLS + ([MOSAIC] if mosaic and f.MOSAIC_DIMS is not None else [])]


def impl_dims(family, dims, impl):
    """`dims` as the problem runs them with `impl` (Mosaic GPU: the family's MOSAIC_DIMS)."""
    return {**dims, **family.MOSAIC_DIMS} if impl == MOSAIC else dims


def mosaic_tiling_run(family, dims, op, field, value, interpret, ring_dtype, L=4, T=4,
                      **fields):
    """Steps of `op` on the Mosaic kernels of `family` at `dims` (fresh random inputs of one
    seed: two runs see the same ones) at their measured tiling with `field` = `value`:
    "replay_decode" two fold cycles (2 L steps), "replay_verify" T windows (each one folds at
    T = L, accepting 1..T tokens), "standard_decode" two steps (it has no cycle; the
    interpreter is slow); rows on slots 5, the null slot (a padding row) and 1, the pools' ring
    entries past the counts NaN (`make_replay_state`). Returns (outputs per step, final pools,
    final counts) for `assert_runs_equal`; checks the outputs are finite and the padding row's
    zero. `fields`: more of the tiling's fields, the same in every run."""
    pb = family(17, batch=3, **dims)
    ops = pb.ops
    bufs, counts, _ = pb.make_replay_state(L, jnp.float32, ring_dtype)
    slots = jnp.asarray([5, NULL_SLOT, 1], jnp.int32)
    kind = {"standard_decode": "standard", "replay_decode": "replay", "replay_verify": "verify"}[op]
    tiling = dataclasses.replace(pb.tiling(kind, impl=MOSAIC), **{field: value}, **fields)
    kw = impl_kw(MOSAIC, interpret, tiling)
    outs, state = [], bufs.checkpoint
    for i in range({"standard_decode": 2, "replay_decode": 2 * L, "replay_verify": T}[op]):
        if op == "standard_decode":
            out, state = ops.standard_decode(state, *pb.step_inputs(), *pb.consts, slots, **kw)
        elif op == "replay_decode":
            out, bufs = ops.replay_decode(bufs, counts, *pb.step_inputs(), *pb.consts, slots,
                                          **kw)
            counts = ops.advance_counts(counts, slots, L)
        else:
            out, bufs = ops.replay_verify(bufs, counts, *pb.window_inputs(T), *pb.consts, slots,
                                          **kw)
            accepted = jnp.asarray([(i % T) + 1, 1, T - (i % T)], jnp.int32)
            counts = ops.commit_counts(counts, slots, accepted, T, L)
        outs.append(out)
    assert np.isfinite(np.asarray(outs)).all() and (np.asarray(outs)[:, 1] == 0).all()
    return outs, (state,) if op == "standard_decode" else bufs, counts


def long_run(family, impl_kw, ring_dtype, L=16, n_steps=None):
    """n_steps (default LONG_STEPS) steps of replay decode (one scan) against the f64 recurrence;
    returns the worst relative deviation of the outputs over all steps and of the checkpoint after
    every fold, and the final counts of the two rows' slots."""
    pb = family(7, batch=2, num_slots=3, **family.LONG_DIMS)
    n_steps = n_steps or family.LONG_STEPS
    bufs = pb.init_buffers(L, ring_dtype)
    counts = jnp.zeros((pb.S,), jnp.int32)
    slots = jnp.asarray([1, 2], jnp.int32)
    # stacked by numpy: jnp.stack of n_steps arrays compiles a concatenate of n_steps operands
    # (~40 s at XLA:CPU -O0 for GDN's 4096)
    np_inputs = [np.stack([np.asarray(x) for x in a])
                 for a in zip(*(pb.step_inputs() for _ in range(n_steps)))]
    inputs = [jnp.asarray(a) for a in np_inputs]
    ops = pb.ops

    @jax.jit
    def run(bufs, counts, inputs):   # inputs an argument: closed over, they are HLO constants
        def body(carry, inp):
            bufs, counts = carry
            out, bufs = ops.replay_decode(bufs, counts, *inp, *pb.consts, slots, **impl_kw)
            return (bufs, ops.advance_counts(counts, slots, L)), (out, bufs.checkpoint[slots])
        return jax.lax.scan(body, (bufs, counts), inputs)

    (_, counts), (outs, cks) = run(bufs, counts, inputs)
    outs, cks = np.asarray(outs), np.asarray(cks)
    state = np.zeros((2,) + pb.state_shape[1:])
    worst_out = worst_ck = 0.0
    for t in range(n_steps):
        for r in range(2):
            ref, state[r] = pb.oracle_step(state[r], *(a[t, r] for a in np_inputs))
            worst_out = max(worst_out, rel_err(outs[t, r], ref))
            if t % L == L - 1:
                worst_ck = max(worst_ck, rel_err(cks[t, r], state[r]))
    return worst_out, worst_ck, np.asarray(counts[slots])
