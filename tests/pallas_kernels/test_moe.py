"""Sparse routed experts (`pallas_kernels.moe`) against a float64 per-token loop.

Implementations: "xla" and "pallas" (the grouped path: sorted into tiles), "pairs" (Pallas, the
small-batch path: one program per (pair, F chunk)), "reference" (dense).
Tolerances (relative Frobenius error over the valid rows):
  float32 weights and activations ... 1e-5 (xla, pallas and pairs interpret, the dense reference)
  bfloat16 .......................... 1e-2 (x and the hidden activations are rounded to bf16; the
                                      oracle is fed the bf16-rounded inputs and rounds nothing)
Rows that are not valid must come out exactly zero and own no (token, expert) pairs.
With a shared expert (`moe.SharedWeights`, C = Fs / F chunks routed to every token with one
per-token scale), the oracle adds the scale times the whole shared FFN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import moe
from pallas_kernels.moe.plan import num_tiles
from tests.pallas_kernels.helpers import rel_err

F32, BF16 = jnp.float32, jnp.bfloat16
IMPLS = ["xla", "pallas", "pairs", "reference"]
DIN, F = 32, 48


def routing(kind, rng, n, E, k):
    """expert_ids [n, k] (distinct per row) and valid [n] for a named routing pattern."""
    valid = np.ones(n, bool)
    if kind == "one_expert":            # every token picks expert 2 (and k - 1 others)
        ids = np.stack([np.r_[2, rng.choice(np.delete(np.arange(E), 2), k - 1, replace=False)]
                        for _ in range(n)])
    elif kind == "empty_experts":       # only experts 1 and E - 2 ... are ever used
        pool = np.array([1, E - 2, E - 1])[:max(k, 2)]
        ids = np.stack([rng.choice(pool, k, replace=False) for _ in range(n)])
    elif kind == "ties":                # every token picks the same experts (equal weights)
        ids = np.tile(rng.choice(E, k, replace=False), (n, 1))
    else:
        ids = np.stack([rng.choice(E, k, replace=False) for _ in range(n)])
    if kind == "padding":
        valid[rng.choice(n, n // 3, replace=False)] = False
        valid[-1] = False
    return ids.astype(np.int32), valid


def run(impl, interpret, *args, **kw):
    """`moe.expert_ffn` (or the dense reference) as one of IMPLS, the path forced."""
    if impl == "reference":
        return moe.reference.expert_ffn(*args, **kw)
    if impl != "xla":
        kw.update(interpret=interpret, path="pairs" if impl == "pairs" else "grouped")
    return moe.expert_ffn(*args, impl="xla" if impl == "xla" else "pallas", **kw)


class Problem:
    """A routing problem; shared = C > 0 adds a shared expert C F wide, scaled per token by
    uniform(0.1, 1) (Qwen's sigmoid gate) or 1 (Nemotron, and where tokens tie)."""

    def __init__(self, seed, *, n=12, E=6, k=2, activation="relu2", dtype=F32, kind="random",
                 ffn=F, shared=0):
        rng = np.random.default_rng(seed)
        self.activation, self.dtype = activation, dtype
        ids, valid = routing(kind, rng, n, E, k)
        self.ids, self.valid = jnp.asarray(ids), jnp.asarray(valid)
        self.weights = jnp.asarray(rng.uniform(0.1, 1.0, (n, k)), F32)
        r = lambda *s: jnp.asarray(rng.standard_normal(s) * s[-2] ** -0.5, dtype)
        self.x = jnp.asarray(rng.standard_normal((n, DIN)), dtype)
        if kind == "ties":              # and tokens 2i and 2i + 1 are the same
            self.weights = jnp.full((n, k), 1.0 / k, F32)
            self.x = jnp.repeat(self.x[::2], 2, axis=0)[:n]
        self.w_up, self.w_down = r(E, DIN, ffn), r(E, ffn, DIN)
        self.w_gate = r(E, DIN, ffn) if activation == "swiglu" else None
        self.shared, self.scale = None, np.ones(n)
        if shared:
            fs = shared * ffn
            self.shared = moe.SharedWeights(r(DIN, fs), r(fs, DIN),
                                            r(DIN, fs) if activation == "swiglu" else None)
            if activation == "swiglu" and kind != "ties":
                self.scale = rng.uniform(0.1, 1.0, n)

    def routing(self):
        """(expert_ids, weights) as `moe.expert_ffn` takes them: the shared expert's chunks
        E ... E + C - 1 appended to every row, each with the row's scale."""
        if self.shared is None:
            return self.ids, self.weights
        n, E, F = self.ids.shape[0], self.w_up.shape[0], self.w_up.shape[2]
        C = self.shared.w_up.shape[1] // F
        ids = jnp.concatenate([self.ids, jnp.broadcast_to(E + jnp.arange(C, dtype=jnp.int32),
                                                          (n, C))], axis=1)
        scale = jnp.broadcast_to(jnp.asarray(self.scale, F32)[:, None], (n, C))
        return ids, jnp.concatenate([self.weights, scale], axis=1)

    def run(self, impl, interpret=True, **kw):
        args = (self.x, *self.routing(), self.w_up, self.w_down)
        kw = dict(w_gate=self.w_gate, valid=self.valid, activation=self.activation,
                  shared=self.shared, **kw)
        return run(impl, interpret, *args, **kw)

    def oracle(self):
        """float64 loop over tokens and their experts."""
        f = lambda a: None if a is None else np.asarray(jnp.asarray(a, F32), np.float64)
        x, wu, wd, wg = f(self.x), f(self.w_up), f(self.w_down), f(self.w_gate)
        ids, w, valid = np.asarray(self.ids), np.asarray(self.weights), np.asarray(self.valid)
        ffn = lambda v, up, down, gate: (
            np.maximum(v @ up, 0) ** 2 if self.activation == "relu2"
            else (g := v @ gate) / (1 + np.exp(-g)) * (v @ up)) @ down
        y = np.zeros_like(x)
        for i in np.flatnonzero(valid):
            for j, e in enumerate(ids[i]):
                y[i] += w[i, j] * ffn(x[i], wu[e], wd[e], None if wg is None else wg[e])
            if self.shared is not None:
                y[i] += self.scale[i] * ffn(x[i], *map(f, self.shared))
        return y


def check(pb: Problem, y, tol):
    valid = np.asarray(pb.valid)
    assert y.dtype == pb.x.dtype and y.shape == pb.x.shape
    assert rel_err(np.asarray(y, np.float64)[valid], pb.oracle()[valid]) < tol
    assert np.all(np.asarray(y)[~valid] == 0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("activation", ["relu2", "swiglu"])
@pytest.mark.parametrize("kind", ["random", "empty_experts", "one_expert", "padding", "ties"])
@pytest.mark.parametrize("shared", [0, 2])
def test_matches_oracle(impl, activation, kind, shared, interpret):
    pb = Problem(0, activation=activation, kind=kind, shared=shared)
    y = pb.run(impl, interpret)
    check(pb, y, 1e-5)
    if kind == "ties":                  # equal tokens, experts and weights: equal rows, exactly
        np.testing.assert_array_equal(y[0::2], y[1::2])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("k", [1, 6])
@pytest.mark.parametrize("shared", [0, 1])
def test_top1_and_top_all_experts(impl, k, shared, interpret):
    pb = Problem(1, E=6, k=k, activation="swiglu", kind="padding", shared=shared)
    check(pb, pb.run(impl, interpret), 1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("activation,shared", [("swiglu", 0), ("swiglu", 1), ("relu2", 2)])
def test_bfloat16(impl, activation, shared, interpret):
    pb = Problem(2, dtype=BF16, activation=activation, kind="padding", shared=shared)
    check(pb, pb.run(impl, interpret), 1e-2)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("shared", [0, 2])
def test_several_tiles_per_expert_and_tilings(impl, shared, interpret):
    """More pairs than a tile per expert (n k = 80 over 3 experts, m = 16; a shared expert's
    chunks: 40 rows each), jitted; Pallas with several column blocks and contraction chunks in
    both GEMMs."""
    pb = Problem(3, n=40, E=3, k=2, activation="relu2", kind="padding", shared=shared)
    kw = dict(block_m=16)
    if impl == "pallas":
        kw.update(tiling=moe.MoETiling(16, 16, 16, 16, num_warps=4))
    check(pb, jax.jit(lambda: pb.run(impl, interpret, **kw))(), 1e-5)


@pytest.mark.parametrize("ffn,block_f,shared", [(48, 16, 0), (64, 32, 0), (48, 16, 2)])
def test_pairs_several_chunks_and_din_slices(ffn, block_f, shared, interpret):
    """The pair path with several chunks of F (3 x 16, 2 x 32) and 2 slices of din (32 / 16),
    jitted."""
    pb = Problem(3, n=5, E=4, k=3, activation="swiglu", kind="padding", ffn=ffn, shared=shared)
    kw = dict(tiling=moe.PairTiling(block_f, block_d=16, num_warps=4, min_programs=1))
    check(pb, jax.jit(lambda: pb.run("pairs", interpret, **kw))(), 1e-5)


@pytest.mark.parametrize("pairs,F,cap,block_f", [
    (6, 1856, 64, 64),      # Nemotron-3-Nano, batch 1: 6 x 29 = 174 programs
    (8, 512, 64, 32),       # Qwen3.5-35B, batch 1: 8 x 16 = 128
    (11, 512, 64, 32),      # Qwen3-Next-80B, batch 1 with the shared chunk: 11 x 16
    (48, 1856, 64, 64),     # Nemotron-3-Nano, batch 8: 48 x 29
    (1, 48, 64, 16), (64, 512, 32, 32)])
def test_pair_chunks_fill_the_gpu(pairs, F, cap, block_f):
    assert moe.pairs.chunk_width(pairs, F, moe.PairTiling(cap, 128, 4)) == block_f


@pytest.mark.parametrize("impl,path,n,tiling,want", [
    ("pallas", "auto", 8, None, "pairs"), ("pallas", "auto", 9, None, "grouped"),
    ("xla", "auto", 1, None, "grouped"), ("pallas", "grouped", 1, None, "grouped"),
    ("xla", "pairs", 99, None, "pairs"), ("pallas", "auto", 1, moe.TILING, "grouped"),
    ("pallas", "auto", 99, moe.PairTiling(64, 128, 4), "pairs")])
def test_path_follows_pair_count(impl, path, n, tiling, want, monkeypatch):
    """"auto": the pair path for Pallas at <= PAIR_PATH_MAX_PAIRS (n x 8 pairs here, at a
    threshold of 64; the shipped 0 keeps "auto" on the grouped path until measured)."""
    monkeypatch.setattr(moe.api, "PAIR_PATH_MAX_PAIRS", 64)
    assert moe.api.pick_path(path, impl, n * 8, tiling) == want


@pytest.mark.parametrize("impl", IMPLS)
def test_expert_shards_with_pair_validity_sum_to_the_whole(impl, interpret):
    """Expert parallelism's split: each of 3 shards holds 2 of the 6 experts and gets every
    pair, valid only where routed to its own (ids shifted into [0, 2), the others clipped);
    the shards' outputs sum to the whole layer's, padding rows stay zero, and k = 2 may equal
    a shard's expert count."""
    pb = Problem(4, n=12, E=6, k=2, activation="swiglu", kind="padding")
    ids, parts = np.asarray(pb.ids), []
    for r in range(3):
        local = ids - 2 * r
        mine = np.asarray(pb.valid)[:, None] & (local >= 0) & (local < 2)
        parts.append(run(impl, interpret, pb.x, jnp.asarray(np.clip(local, 0, 1), jnp.int32),
                         pb.weights, pb.w_up[2 * r:2 * r + 2], pb.w_down[2 * r:2 * r + 2],
                         w_gate=pb.w_gate[2 * r:2 * r + 2], valid=jnp.asarray(mine),
                         activation=pb.activation))
    check(pb, sum(parts), 1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_expert_shards_with_a_width_split_shared_expert(impl, interpret):
    """Expert parallelism with a shared expert (`models.moe.routed_experts`' layout): each of 3
    shards holds 2 whole experts and a third of the shared width (one F-wide chunk, its expert
    2), routed to every valid token; the shards sum to the whole layer."""
    pb = Problem(8, n=12, E=6, k=2, activation="swiglu", kind="padding", shared=3)
    ids, valid, parts = np.asarray(pb.ids), np.asarray(pb.valid), []
    cols = lambda r: slice(F * r, F * (r + 1))
    for r in range(3):
        local = ids - 2 * r
        mine = valid[:, None] & (local >= 0) & (local < 2)
        shard_ids = np.c_[np.clip(local, 0, 1), np.full(12, 2)].astype(np.int32)
        shared = moe.SharedWeights(pb.shared.w_up[:, cols(r)], pb.shared.w_down[cols(r)],
                                   pb.shared.w_gate[:, cols(r)])
        parts.append(run(impl, interpret, pb.x, jnp.asarray(shard_ids),
                         jnp.c_[pb.weights, jnp.asarray(pb.scale, F32)],
                         pb.w_up[2 * r:2 * r + 2], pb.w_down[2 * r:2 * r + 2],
                         w_gate=pb.w_gate[2 * r:2 * r + 2], shared=shared,
                         valid=jnp.asarray(np.c_[mine, valid]), activation=pb.activation))
    check(pb, sum(parts), 1e-5)


def test_padding_rows_own_no_pairs():
    pb = Problem(4, n=12, E=6, k=2, kind="padding")
    plan = moe.make_plan(pb.ids, pb.weights, pb.valid, 6, 16)
    ids, valid = np.asarray(pb.ids), np.asarray(pb.valid)
    sizes = np.bincount(ids[valid].ravel(), minlength=6)
    np.testing.assert_array_equal(plan.group_sizes, sizes)
    used = int(np.sum(-(-sizes // 16)))
    assert int(moe.plan.num_used_tiles(plan)) == used
    assert np.all(np.asarray(plan.tile_expert)[used:] == -1)
    R = plan.row_token.shape[0]
    rows = np.asarray(plan.pair_row)
    assert np.all(rows[~valid] == R) and np.all(rows[valid] < R)
    assert len(np.unique(rows[valid])) == rows[valid].size
    # every used row holds its pair's token and weight; the rest are padding (weight 0)
    tok, wt = np.asarray(plan.row_token), np.asarray(plan.row_weight)
    for i, j in zip(*np.nonzero(valid[:, None] & np.ones_like(rows, bool))):
        assert tok[rows[i, j]] == i and wt[rows[i, j]] == np.asarray(pb.weights)[i, j]
    assert np.count_nonzero(wt) == valid.sum() * 2
    # tile -> expert: each used tile belongs to the expert of the rows it holds
    te = np.asarray(plan.tile_expert)
    for i, j in zip(*np.nonzero(valid[:, None] & np.ones_like(rows, bool))):
        assert te[rows[i, j] // 16] == ids[i, j]


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_padding_rows_does_not_leak(impl, interpret):
    pb = Problem(5, kind="padding", activation="swiglu")
    want = pb.run(impl, interpret)
    pb.x = jnp.where(pb.valid[:, None], pb.x, jnp.nan)
    got = pb.run(impl, interpret)
    np.testing.assert_array_equal(np.asarray(got)[~np.asarray(pb.valid)], 0)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("n,k,E,kind", [
    (2, 8, 256, "random"), (2, 9, 257, "one_expert"), (8, 10, 16, "padding"),
    (12, 6, 6, "ties"), (40, 2, 3, "padding"), (16, 8, 64, "pairs")])
def test_plan_by_counting_is_the_plan_by_sort(n, k, E, kind, monkeypatch):
    """Up to COUNT_MAX_PAIRS pairs the plan is counted (comparisons only), above it placed by a
    sort: the same plan, every field (ties in token order, padding pairs last), over two tokens,
    top-k = E, padding rows, groups of more than one tile (40 x 2 pairs over 3 experts) and an
    expert-parallel shard's own pairs (a [n, k] valid)."""
    rng = np.random.default_rng(n * k)
    ids, valid = routing("padding" if kind == "pairs" else kind, rng, n, E, k)
    if kind == "pairs":
        valid = rng.random((n, k)) < 0.5
    weights = jnp.asarray(rng.random((n, k)), F32)
    plans = []
    for limit in (n * k, n * k - 1):    # counted, sorted
        monkeypatch.setattr(moe.plan, "COUNT_MAX_PAIRS", limit)
        plans.append(moe.make_plan(jnp.asarray(ids), weights, jnp.asarray(valid), E, 16))
    for name, a, b in zip(moe.DispatchPlan._fields, *plans):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind,shared", [("random", 0), ("random", 2), ("padding", 2)])
def test_one_token_gets_a_tile_per_pair(impl, kind, shared, interpret):
    """A batch-1 step's plan needs no placing: pair p (top-k first, then the shared expert's
    chunks) fills the first row of tile p of P, the rest are padding; its token invalid
    ("padding"), no tile is used and the row comes out zero. The layer matches the oracle."""
    pb = Problem(9, n=1, E=8, k=3, activation="swiglu", kind=kind, shared=shared)
    ids, weights = pb.routing()
    P, m = ids.shape[1], 16
    plan = moe.make_plan(ids, weights, pb.valid, 8 + shared, m)
    live = bool(pb.valid[0])
    assert plan.row_token.shape == (P * m,)
    np.testing.assert_array_equal(plan.tile_expert, ids[0] if live else np.full(P, -1))
    if live:
        np.testing.assert_array_equal(plan.pair_row[0], np.arange(P) * m)
        wt = np.zeros(plan.row_weight.shape[0], np.float32)
        wt[np.arange(P) * m] = weights[0]
        np.testing.assert_array_equal(plan.row_weight, wt)
    else:
        assert np.all(np.asarray(plan.pair_row) == plan.row_token.shape[0])
        assert not np.any(np.asarray(plan.row_weight))
    np.testing.assert_array_equal(plan.row_token, 0)
    check(pb, pb.run(impl, interpret), 1e-5)


def test_tile_count_follows_pairs_not_experts():
    """The static tile count is ceil(P / m) + min(E, P): a decode step (P = 8 pairs) over 512
    experts has 9 tiles of 16 rows, and the XLA loop runs only the used ones."""
    assert num_tiles(8, 512, 16) == 9 and num_tiles(2560, 512, 16) == 160 + 512
    pb = Problem(6, n=4, E=512, k=2, kind="padding")
    plan = moe.make_plan(pb.ids, pb.weights, pb.valid, 512, 16)
    assert plan.tile_expert.shape == (9,)
    assert int(moe.plan.num_used_tiles(plan)) == len(
        np.unique(np.asarray(pb.ids)[np.asarray(pb.valid)]))
    check(pb, pb.run("xla"), 1e-5)


@pytest.mark.parametrize("n,k,E,m", [(1, 6, 128, 16), (256, 6, 128, 16), (256, 10, 512, 16),
                                     (4096, 8, 64, 128)])
def test_default_block_m(n, k, E, m):
    assert moe.default_block_m(n * k, E) == m


def _shared(*shapes, dtype=F32):
    return moe.SharedWeights(*(jnp.zeros(s, dtype) for s in shapes))


def _ids(changes):
    """Problem(7)'s valid expert ids (distinct per row, in [0, 6)) with {(row, col): id}."""
    ids = np.asarray(Problem(7, activation="swiglu").ids).copy()
    for at, e in changes.items():
        ids[at] = e
    return jnp.asarray(ids)


def test_x_may_have_another_float_dtype_than_the_weights():
    """x is rounded to the weights' dtype for the GEMMs and y comes back in x's (documented):
    bf16 x with fp32 weights is the fp32 run on the bf16 values, rounded to bf16."""
    pb = Problem(7, activation="swiglu")
    args = (pb.ids, pb.weights, pb.w_up, pb.w_down)
    kw = dict(w_gate=pb.w_gate, valid=pb.valid, activation="swiglu", impl="xla")
    xb = pb.x.astype(BF16)
    got = moe.expert_ffn(xb, *args, **kw)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got, moe.expert_ffn(xb.astype(F32), *args, **kw).astype(BF16))


def test_ids_of_pairs_that_do_not_run_are_ignored():
    """Rows that are not valid (and invalid pairs of a [n, k] valid) may carry any ids: only
    the pairs that run are checked, and the result is the one with in-range ids there."""
    pb = Problem(7, activation="swiglu", kind="padding")
    kw = dict(w_gate=pb.w_gate, activation="swiglu", impl="xla")
    rows = np.flatnonzero(~np.asarray(pb.valid))
    junk = pb.ids.at[rows].set(jnp.asarray([99, 99], jnp.int32))
    want = moe.expert_ffn(pb.x, pb.ids, pb.weights, pb.w_up, pb.w_down, valid=pb.valid, **kw)
    got = moe.expert_ffn(pb.x, junk, pb.weights, pb.w_up, pb.w_down, valid=pb.valid, **kw)
    np.testing.assert_array_equal(got, want)
    pairs = jnp.asarray(np.asarray(pb.ids) < 3) & pb.valid[:, None]
    got = moe.expert_ffn(pb.x, jnp.where(pairs, pb.ids, -5), pb.weights, pb.w_up, pb.w_down,
                         valid=pairs, **kw)
    want = moe.expert_ffn(pb.x, pb.ids, pb.weights, pb.w_up, pb.w_down, valid=pairs, **kw)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("change,match", [
    (dict(activation="gelu"), "activation must be one of"),
    (dict(w_gate=None, activation="swiglu"), "w_gate is needed by activation 'swiglu'"),
    (dict(w_down=jnp.zeros((6, DIN, F))),
     r"w_down has shape \(6, 32, 48\), expected \(6, 48, 32\)"),
    (dict(expert_ids=jnp.zeros((12, 2), jnp.int64 if jax.config.x64_enabled else jnp.float32)),
     "expert_ids has dtype"),
    (dict(weights=jnp.zeros((12, 3), F32)), r"weights has shape \(12, 3\)"),
    (dict(valid=jnp.ones((12,), jnp.int32)), "valid has dtype int32"),
    (dict(expert_ids=jnp.zeros((12, 7), jnp.int32), weights=jnp.zeros((12, 7), F32)),
     r"top_k = 7 must be in \[1, experts = 6\]"),
    (dict(block_m=24), "block_m = 24 must be a power of two"),
    (dict(impl="pallas", tiling=moe.MoETiling(64, 24, 64, 64, num_warps=4)),
     r"up_block_k = 24 must be a power of two"),
    (dict(impl="pallas", tiling=(64, 128)), "tiling must be a MoETiling"),
    (dict(path="sorted"), "path must be one of"),
    (dict(impl="xla", path="pairs"), "moe.expert_ffn path 'pairs' has no xla implementation"),
    (dict(impl="pallas", path="pairs", tiling=moe.TILING), "tiling must be a PairTiling"),
    (dict(impl="pallas", tiling=moe.PairTiling(64, 24, 4)), r"block_d = 24 must be a power"),
    (dict(shared=(jnp.zeros((DIN, F)),) * 3), "shared must be a SharedWeights, got tuple"),
    (dict(shared=_shared((DIN, 40), (40, DIN), (DIN, 40))),
     "the shared expert's width 40 must be a multiple of the experts' 48"),
    (dict(shared=_shared((DIN, F), (F, DIN))), "shared.w_gate is needed by activation 'swiglu'"),
    (dict(shared=_shared((DIN, F), (DIN, F), (DIN, F))),
     r"shared.w_down has shape \(32, 48\), expected \(48, 32\)"),
    (dict(shared=_shared((DIN, F), (F, DIN), (DIN, F), dtype=BF16)),
     "shared.w_up has dtype bfloat16"),
    (dict(expert_ids=jnp.zeros((12, 8), jnp.int32), weights=jnp.zeros((12, 8), F32),
          shared=_shared((DIN, F), (F, DIN), (DIN, F))),
     r"top_k = 8 must be in \[1, experts = 7\]"),
    # concrete ids (an eager call) of the pairs that run, on both implementations
    (dict(expert_ids=_ids({(3, 1): 6}), valid=None),
     r"^expert_ids\[3, 1\] = 6 is outside \[0, experts = 6\)$"),
    (dict(expert_ids=_ids({(0, 0): -1}), valid=None, impl="pallas"),
     r"^expert_ids\[0, 0\] = -1 is outside \[0, experts = 6\)$"),
    (dict(expert_ids=_ids({(5, 0): 7}), valid=jnp.ones((12,), bool)),
     r"^expert_ids\[5, 0\] = 7 is outside \[0, experts = 6\) \(valid pairs\)$"),
    (dict(expert_ids=_ids({(2, 0): 7}), shared=_shared((DIN, F), (F, DIN), (DIN, F)),
          valid=None), r"^expert_ids\[2, 0\] = 7 is outside \[0, experts = 7\)$"),
    (dict(expert_ids=_ids({(4, 0): 1, (4, 1): 1}), valid=None),
     r"^expert_ids\[4\] = \[1, 1\] names an expert more than once"),
    (dict(block_m=0), r"^block_m = 0 must be a power of two >= 16$"),
    (dict(block_m=16.0), r"^block_m = 16.0 must be a power of two >= 16$"),
    (dict(x=jnp.zeros((0, DIN)), expert_ids=jnp.zeros((0, 2), jnp.int32),
          weights=jnp.zeros((0, 2), F32), valid=None),
     r"^x has shape \(0, 32\): every dimension must be >= 1 \(no empty batch or axis\)$"),
    (dict(x=jnp.zeros((0, DIN)), expert_ids=jnp.zeros((0, 2), jnp.int32),
          weights=jnp.zeros((0, 2), F32), valid=None, impl="pallas"), r"^x has shape \(0, 32\)"),
    (dict(impl="pallas", tiling=moe.MoETiling(64, 64, 64, 64, num_warps=0)),
     r"^num_warps = 0 must be >= 1$"),
    (dict(impl="pallas", tiling=moe.PairTiling(64, 64, 4, min_programs=-1)),
     r"^min_programs = -1 must be >= 1$"),
])
def test_bad_input_is_named(change, match):
    pb = Problem(7, activation="swiglu")
    kw = dict(x=pb.x, expert_ids=pb.ids, weights=pb.weights, w_up=pb.w_up, w_down=pb.w_down,
              w_gate=pb.w_gate, valid=pb.valid, activation="swiglu")
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        moe.expert_ffn(**kw)


@pytest.mark.parametrize("path,n", [("grouped", 1), ("grouped", 8), ("pairs", 1)])
@pytest.mark.parametrize("din,E,k,ffn,shared,activation", [
    (2688, 128, 6, 1856, 3712, "relu2"),        # Nemotron-3-Nano, shared expert 2 F wide
    (2048, 256, 8, 512, 512, "swiglu"),         # Qwen3.5-35B-A3B
    (2048, 256, 8, 512, 0, "swiglu")])
def test_triton_lowering_at_model_shapes(path, n, din, E, k, ffn, shared, activation,
                                        monkeypatch):
    """Batch 1 and 8 (the grouped path's rows' tokens gathered in the kernel), bf16: the
    kernels, with the shared expert's chunks read in place, lower to Triton for sm90
    without a GPU (Pallas' lowering runs in Python; only the PTX compile needs the GPU): every
    primitive in them has a Triton lowering."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: type("Info", (), {"compute_capability": "9.0"}))
    sds, C = jax.ShapeDtypeStruct, shared // ffn
    w = lambda *s: sds(s, BF16)
    gate = activation == "swiglu"

    def fn(x, ids, weights, up, down, wg, s_up, s_down, s_gate):
        sh = None if not C else moe.SharedWeights(s_up, s_down, s_gate if gate else None)
        return moe.expert_ffn(x, ids, weights, up, down, w_gate=wg if gate else None,
                              shared=sh, activation=activation, impl="pallas", path=path,
                              interpret=False)
    hlo = jax.jit(fn).trace(
        w(n, din), sds((n, k + C), jnp.int32), sds((n, k + C), F32), w(E, din, ffn),
        w(E, ffn, din), w(E, din, ffn), w(din, max(shared, ffn)), w(max(shared, ffn), din),
        w(din, max(shared, ffn))).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in hlo.lower()
