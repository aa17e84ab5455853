"""Decode attention over the slot pool (`pallas_kernels.attention`) against a float64 loop.

Every case draws fresh random inputs: slots at random (a padding row on NULL_SLOT, a row on the
pool's last slot), starts covering length 1 (start 0), the whole pool (the window ends at
max_len - 1), a window running past max_len (its last tokens see all max_len positions) and
random ones. For the Pallas kernel every pool position a row must not use (past its last
visible one, the null slot, slots no row names) is NaN, so a read that reaches the output shows;
its output starts NaN too (the interpreter fills outputs with NaN), so an unwritten element
shows. max_len = 40 is no multiple of block_k (the last block is moved back, overlapping); the
few rows split their blocks over programs (flash decoding) unless the tiling says otherwise.

Tolerances (relative Frobenius error over the live rows; padding rows must be exactly zero):
  float32 pools ... 1e-5 (HIGHEST dots in the interpreter; tf32x3 on the GPU)
  bfloat16 pools .. 1e-2 (the oracle is fed the bf16 q, K and V and rounds nothing; the kernel
                    rounds the probabilities to bf16 before P V and the output to q's bf16)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.common import KVCache, cached_attention
from pallas_kernels import attention
from pallas_kernels.ring import NULL_SLOT
from tests.pallas_kernels.helpers import impl_kw, rel_err

F32, BF16 = jnp.float32, jnp.bfloat16
S, MAX_LEN = 9, 40
_i32 = lambda *v: jnp.asarray(v, jnp.int32)     # noqa: E731


class Problem:
    """b rows of T new tokens over a pool [S, max_len, kv, hd]."""

    def __init__(self, seed, *, T, nh, kv, hd=16, b=6, dtype=F32, kv_head=None, max_len=MAX_LEN):
        rng = np.random.default_rng(seed)
        self.T, self.kv_head, self.dtype, self.max_len = T, kv_head, dtype, max_len
        slots = rng.choice(np.arange(1, S - 1), b, replace=False)
        slots[0], slots[1] = S - 1, NULL_SLOT              # the pool's last slot; a padding row
        starts = rng.integers(0, max_len - T + 1, b)
        starts[0], starts[2], starts[3] = max_len - T, 0, max_len - 1   # full, length 1, past
        self.slots, self.starts = (jnp.asarray(a, jnp.int32) for a in (slots, starts))
        r = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
        self.q = r(b, T, nh, hd)
        self.k_pool, self.v_pool = r(S, max_len, kv, hd), r(S, max_len, kv, hd)
        self.live = slots != NULL_SLOT
        self.last = np.minimum(starts + T - 1, max_len - 1)       # each row's last position

    def poisoned(self, pool):
        """NaN at every pool position no live row may use."""
        used = np.zeros(pool.shape[:2], bool)
        for s, last, live in zip(np.asarray(self.slots), self.last, self.live):
            used[s, :last + 1] |= live
        return jnp.where(jnp.asarray(used)[:, :, None, None], pool, jnp.nan)

    def run(self, impl, interpret, tiling=None):
        if impl == "reference":
            return attention.reference.attention(self.q, self.k_pool, self.v_pool, self.slots,
                                                 self.starts, self.kv_head)
        pools = (self.k_pool, self.v_pool)
        if impl == "pallas":     # the dense XLA path multiplies every position (0 x NaN)
            pools = tuple(map(self.poisoned, pools))
        return attention.decode_attention(self.q, *pools, self.slots, self.starts,
                                          kv_head=self.kv_head, **impl_kw(impl, interpret,
                                                                          tiling))

    def oracle(self):
        """float64 loop over rows, tokens and query heads, over the visible positions only."""
        f = lambda a: np.asarray(jnp.asarray(a, F32), np.float64)
        q, kp, vp = f(self.q), f(self.k_pool), f(self.v_pool)
        b, T, nh, hd = q.shape
        kv = kp.shape[2]
        out = np.zeros_like(q)
        for i in np.flatnonzero(self.live):
            s, start = int(self.slots[i]), int(self.starts[i])
            for t in range(T):
                n = min(start + t, self.max_len - 1) + 1
                for h in range(nh):
                    g = self.kv_head if self.kv_head is not None else h // (nh // kv)
                    sc = kp[s, :n, g] @ q[i, t, h] * hd ** -0.5
                    p = np.exp(sc - sc.max())
                    out[i, t, h] = p @ vp[s, :n, g] / p.sum()
        return out

    def check(self, out, tol):
        assert out.shape == self.q.shape and out.dtype == self.q.dtype
        out = np.asarray(jnp.asarray(out, F32), np.float64)
        assert rel_err(out[self.live], self.oracle()[self.live]) < tol
        assert np.all(out[~self.live] == 0)


CASES = {
    "decode_gqa1": dict(T=1, nh=4, kv=4),
    "decode_gqa4": dict(T=1, nh=8, kv=2),
    "verify_gqa8": dict(T=4, nh=16, kv=2),
    "verify_T3": dict(T=3, nh=4, kv=1),
    "verify_T8": dict(T=8, nh=8, kv=2, hd=32),
    "kv_head": dict(T=2, nh=4, kv=2, kv_head=1),
    "bf16_decode": dict(T=1, nh=8, kv=2, dtype=BF16),
    "bf16_verify_kv_head": dict(T=5, nh=8, kv=4, dtype=BF16, kv_head=3),
}
TOL = {F32: 1e-5, BF16: 1e-2}


@pytest.mark.parametrize("impl", ["xla", "pallas", "reference"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_oracle(impl, case, interpret):
    pb = Problem(list(CASES).index(case), **CASES[case])
    pb.check(pb.run(impl, interpret), TOL[pb.dtype])


@pytest.mark.parametrize("block_k, min_programs, max_len", [
    (16, 1, 40), (16, 256, 40), (64, 1, 40), (16, 256, 100)])
def test_tilings(block_k, min_programs, max_len, interpret):
    """block_k 16: three blocks, the last moved back over the second (40 = 2 x 16 + 8); 64:
    capped at 32, one block and one overlapping. min_programs 1: one program per (row, KV head);
    256: each row's blocks split over two programs (short rows leave the second one empty), at
    max_len 100 over four (7 blocks: 2 per split, rows of 1..7 blocks)."""
    pb = Problem(7, T=4, nh=8, kv=2, max_len=max_len)
    tiling = attention.AttentionTiling(block_k, num_warps=4, min_programs=min_programs)
    pb.check(pb.run("pallas", interpret, tiling), 1e-5)


@pytest.mark.parametrize("T, block_q, block_k, max_len, kv_head, dtype", [
    (37, 16, 16, 100, None, F32),   # 3 query chunks (the last padded), 7 key blocks (the last
    #                                 moved back)
    (37, 64, 512, 100, None, F32),  # one chunk, one key block (both capped)
    (12, 8, 32, 40, 1, F32),        # a replicated KV head; blocks of 32 over 40 positions
    (20, 16, 16, 40, None, BF16)])
def test_prefill_attention_matches_oracle(T, block_q, block_k, max_len, kv_head, dtype):
    """The blocked prefill attention against the float64 loop, every pool position no live row
    may see NaN (V zeroed where unseen, K masked), padding rows exactly zero."""
    pb = Problem(T, T=T, nh=8, kv=2, max_len=max_len, kv_head=kv_head, dtype=dtype)
    pools = tuple(map(pb.poisoned, (pb.k_pool, pb.v_pool)))
    out = jax.jit(lambda q, k, v, sl, st: attention.prefill_attention(
        q, k, v, sl, st, pb.kv_head, block_q=block_q, block_k=block_k))(
            pb.q, *pools, pb.slots, pb.starts)
    pb.check(out, TOL[dtype])


def test_prefill_attention_does_not_depend_on_the_cut():
    """A prompt prefilled whole or in two parts (the second continuing from the first's
    positions, as a prefix-cache hit does) gives every token the same output: bitwise where
    the chunks have the same shape, else to fp32 rounding (the dots of other shapes)."""
    pb = Problem(3, T=45, nh=4, kv=2, max_len=100)
    run = jax.jit(lambda q, st: attention.prefill_attention(
        q, pb.k_pool, pb.v_pool, pb.slots, st, None, block_q=16, block_k=16))
    whole = np.asarray(run(pb.q, pb.starts))
    for cut in (7, 16, 30):
        head = np.asarray(run(pb.q[:, :cut], pb.starts))
        tail = np.asarray(run(pb.q[:, cut:], pb.starts + cut))
        np.testing.assert_allclose(np.concatenate([head, tail], 1), whole, rtol=0, atol=1e-6)
        if cut % 16 == 0:
            np.testing.assert_array_equal(np.concatenate([head, tail], 1), whole)


def test_num_splits():
    assert attention.pallas_triton.num_splits(2048, 8192, 64, 256) == 1
    assert attention.pallas_triton.num_splits(8, 8192, 64, 256) == 32
    assert attention.pallas_triton.num_splits(8, 100, 64, 256) == 2       # at most the blocks
    assert attention.pallas_triton.num_splits(8, 8192, 64, 1) == 1


@pytest.mark.parametrize("T", [1, 4])
def test_cached_attention_pallas_matches_the_jnp_path(T, interpret):
    """The models' entry: writes the new K/V into the pool, then attends; both impls agree and
    the cache they return is the same."""
    rng = np.random.default_rng(T)
    r = lambda *s: jnp.asarray(rng.standard_normal(s), F32)
    cache = KVCache(r(S, MAX_LEN, 2, 16), r(S, MAX_LEN, 2, 16))
    q, k, v = r(3, T, 4, 16), r(3, T, 2, 16), r(3, T, 2, 16)
    slots, starts = jnp.asarray([2, 0, 5], jnp.int32), jnp.asarray([9, 3, 0], jnp.int32)
    run = lambda impl: jax.jit(lambda: cached_attention(q, k, v, cache, slots, starts,
                                                        impl=impl))()
    (want, want_cache), (out, out_cache) = run("xla"), run("pallas")
    assert rel_err(out, want) < 1e-5
    assert np.array_equal(out_cache.k, want_cache.k) and np.array_equal(out_cache.v, want_cache.v)


def test_auto_falls_back_to_xla_on_a_pool_the_kernel_does_not_take():
    pb = Problem(8, T=1, nh=2, kv=1, hd=8)
    pb.check(attention.decode_attention(pb.q, pb.k_pool, pb.v_pool, pb.slots, pb.starts), 1e-5)


def test_mosaic_impl_runs_the_triton_kernel(monkeypatch):
    """A model run with impl="pallas_mosaic_gpu" (its SSM kernels) gets the Triton attention
    kernel (there is no Mosaic GPU one), not an error."""
    seen = []
    kernel = attention.api._OPS["decode_attention"].impls["pallas_triton"]
    monkeypatch.setitem(attention.api._OPS["decode_attention"].impls, "pallas_triton",
                        lambda *a, **kw: seen.append(1) or kernel(*a, **kw))
    pb = Problem(9, T=2, nh=4, kv=2)
    pb.check(attention.decode_attention(pb.q, pb.k_pool, pb.v_pool, pb.slots, pb.starts,
                                        impl="pallas_mosaic_gpu", interpret=True), 1e-5)
    assert seen


@pytest.mark.parametrize("change, match", [
    (dict(q=jnp.zeros((6, 9, 8, 16))), "T = 1..8"),
    (dict(q=jnp.zeros((6, 16))), "q must be"),
    (dict(q=jnp.zeros((6, 1, 5, 16))), "multiple of KV heads"),
    (dict(v_pool=jnp.zeros((S, MAX_LEN, 2, 16), BF16)), "v_pool has dtype"),
    (dict(k_pool=jnp.zeros((S, MAX_LEN, 2, 8)), v_pool=jnp.zeros((S, MAX_LEN, 2, 8))),
     "k_pool has shape"),
    (dict(starts=jnp.zeros((6,), jnp.uint32)), "starts has dtype"),
    (dict(kv_head=2), r"kv_head = 2 must be in \[0, kv_heads = 2\)"),
    (dict(impl="pallas", k_pool=jnp.zeros((S, 8, 2, 16)), v_pool=jnp.zeros((S, 8, 2, 16))),
     "max_len >= 16"),
    (dict(impl="pallas", tiling=attention.AttentionTiling(24, 4)), "block_k = 24"),
    # concrete values (an eager call), on both implementations
    (dict(slots=_i32(1, 2, 3, 4, 5, 9)), r"^slots\[5\] = 9 is outside the pool \[0, 9\)$"),
    (dict(slots=_i32(1, 2, 3, 4, 5, -1), impl="pallas"), r"^slots\[5\] = -1 is outside"),
    (dict(slots=_i32(1, 2, 3, 4, 2, NULL_SLOT)), r"^slots: slot 2 is named more than once"),
    (dict(slots=_i32(1, 2, 3, 4, 5, 6), starts=_i32(0, 0, -1, 0, 0, 0)),
     r"^starts\[2\] = -1 is outside \[0, 2\^31\) \(cached tokens\)$"),
    (dict(slots=_i32(1, 2, 3, 4, 5, 6), starts=_i32(0, 0, -1, 0, 0, 0), impl="pallas"),
     r"^starts\[2\] = -1 is outside"),
    (dict(kv_head=np.int32(2)), r"^kv_head = 2 must be in \[0, kv_heads = 2\)$"),
    (dict(kv_head=jnp.int32(-1), impl="pallas"), r"^kv_head = -1 must be in \[0, kv_heads"),
    (dict(q=jnp.zeros((0, 1, 8, 16)), slots=_i32(), starts=_i32()),
     r"^q has shape \(0, 1, 8, 16\): every dimension must be >= 1"),
    (dict(impl="pallas", tiling=attention.AttentionTiling(16, 5)),
     "^num_warps = 5 must be a power of two$"),
    (dict(impl="pallas", tiling=attention.AttentionTiling(16, 4, min_programs=0)),
     "^min_programs = 0 must be >= 1$"),
])
def test_errors_are_one_line(change, match):
    pb = Problem(9, T=1, nh=8, kv=2)
    kw = dict(q=pb.q, k_pool=pb.k_pool, v_pool=pb.v_pool, slots=pb.slots, starts=pb.starts,
              kv_head=None, impl="xla", interpret=True) | change
    with pytest.raises(ValueError, match=match) as e:
        attention.decode_attention(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("change, match", [
    (dict(kv_head=1.0), r"^kv_head must be None or an integer scalar, got 1.0$"),
    (dict(kv_head=True), r"^kv_head must be None or an integer scalar, got True$"),
    (dict(kv_head=jnp.zeros((1,), jnp.int32)),
     r"^kv_head must be None or an integer scalar, got an array of shape \(1,\) and dtype "
     r"int32$"),
    (dict(kv_head=np.float32(1)), r"^kv_head must be None .* dtype float32$"),
    (dict(slots=[1, 2, 3, 4, 5, 6]), r"^slots must be an array .*, got list$"),
])
def test_arguments_of_the_wrong_kind_are_type_errors(change, match):
    pb = Problem(9, T=1, nh=8, kv=2)
    kw = dict(q=pb.q, k_pool=pb.k_pool, v_pool=pb.v_pool, slots=pb.slots, starts=pb.starts,
              kv_head=None, impl="xla", interpret=True) | change
    with pytest.raises(TypeError, match=match):
        attention.decode_attention(**kw)


@pytest.mark.parametrize("kv_head", [1, np.int32(1), np.int64(1), jnp.int32(1)],
                         ids=["int", "np.int32", "np.int64", "jnp.int32"])
def test_kv_head_takes_integer_scalars(kv_head):
    """Python, NumPy and jax integer scalars pick the same KV head; a padding row's negative
    start is never read (only live rows' starts are checked)."""
    pb = Problem(9, T=1, nh=8, kv=2, kv_head=1)
    want = pb.run("xla", True)
    got = attention.decode_attention(pb.q, pb.k_pool, pb.v_pool, pb.slots,
                                     pb.starts.at[1].set(-7), kv_head=kv_head, impl="xla")
    assert pb.slots[1] == NULL_SLOT
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, T, b, dtype, kv_head", [
    ((32, 8, 128), 1, 256, BF16, None),       # Nemotron-H-8B decode, one program per head
    ((16, 4, 256), 4, 1, BF16, None),         # Qwen3.5-9B verify, blocks split over programs
    ((32, 8, 128), 3, 2, F32, 1),             # fp32 pool (tf32x3 dots), TP's replicated head
])
def test_triton_lowering_at_model_shapes(shape, T, b, dtype, kv_head, monkeypatch):
    """The kernel lowers to Triton for sm90 without a GPU (Pallas' lowering runs in Python; only
    the PTX compile needs the GPU): every primitive in it has a Triton lowering."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    monkeypatch.setattr(registration.gpu_info_lib, "get_gpu_info",
                        lambda: type("Info", (), {"compute_capability": "9.0"}))
    (nh, kv, hd), sds = shape, jax.ShapeDtypeStruct
    pool = sds((b + 1, 4096, kv, hd), dtype)
    fn = lambda q, k, v, s, st: attention.decode_attention(q, k, v, s, st, kv_head=kv_head,
                                                           impl="pallas", interpret=False)
    hlo = jax.jit(fn).trace(sds((b, T, nh, hd), dtype), pool, pool, sds((b,), jnp.int32),
                            sds((b,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in hlo.lower()


def test_default_tiling_keeps_a_k_block_of_16k_elements():
    """Measured on the H200: 128-position blocks at head_dim 128, 64 at 256."""
    from pallas_kernels.attention import default_tiling
    assert [default_tiling(hd).block_k for hd in (16, 64, 128, 256, 512)] == [128, 128, 128, 64,
                                                                              32]
