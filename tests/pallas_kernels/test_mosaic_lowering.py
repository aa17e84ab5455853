"""The Mosaic GPU kernels lower for Hopper (sm90) at real model shapes, without a GPU.

Lowering runs Pallas' Mosaic GPU lowering and Mosaic's own passes (layout inference, TMA and
SMEM checks) in Python; only the final PTX compile happens on the GPU. It needs the Mosaic GPU
bindings of the CUDA plugin (`pip install --no-deps jax-cuda12-plugin==<jax version>`, no GPU
or CUDA needed); without them this file is skipped.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import gdn, mamba2, ring_products
from pallas_kernels.ring import MAX_VERIFY_TOKENS

try:
    from jax._src.lib import mosaic_gpu  # noqa: F401  (the bindings, from the CUDA plugin)
except ImportError:
    pytest.skip("needs the Mosaic GPU bindings (pip install --no-deps jax-cuda12-plugin)",
                allow_module_level=True)

F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.fixture(autouse=True)
def _products_by_xla(monkeypatch):
    """The replay kernels' dot products by the Triton launch (`ring_products`: defaults, their
    fallbacks, explicit tilings) lower only with a GPU present: here XLA forms them. The
    Mosaic kernels, the ones under test, are the same."""
    def by_xla(ring, slots, windows, pairs=(), **_):
        return ring_products.products(ring, slots, windows, pairs, by="xla")
    monkeypatch.setattr(ring_products, "window_products", by_xla)


def _lower(fn, *args):
    """StableHLO text of `fn` lowered for CUDA from abstract arguments."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _mamba2_args(S, b, H, P, N, G, L, state_dtype):
    sds = jax.ShapeDtypeStruct
    bufs = mamba2.ReplayBuffers(sds((S, H, P, N), state_dtype), sds((S, H, L, P), BF16),
                                sds((S, G, L, N), BF16), sds((S, H, L), F32))
    step = (sds((b, H, P), BF16), sds((b, G, N), BF16), sds((b, G, N), BF16), sds((b, H), F32),
            sds((H,), F32), sds((H,), F32), sds((b,), jnp.int32))
    return bufs, sds((S,), jnp.int32), step


@pytest.mark.parametrize("tiling,state_dtype", [
    (None, F32), (mamba2.Mamba2MosaicTiling(block_n=32, num_stages=3), F32),
    (mamba2.Mamba2MosaicTiling(block_n=16), BF16),
    (mamba2.Mamba2MosaicTiling(block_n=32, prologue="overlap"), F32),
    (dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, heads=2), F32),
    (dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, readout="fma_rows"), F32),
    (dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, ring_block=0), F32)],
    ids=["default", "bn32-3stages", "bf16-bn16", "overlap", "two-heads", "rows",
         "whole-ring"])
def test_mamba2_mosaic_kernels_lower_for_sm90(tiling, state_dtype):
    """Nemotron-H-8B shapes (H 128, P 64, N 128, G 8), batch 256, L = 16."""
    bufs, counts, step = _mamba2_args(S=257, b=256, H=128, P=64, N=128, G=8, L=16,
                                      state_dtype=state_dtype)
    kw = dict(impl="pallas_mosaic_gpu", interpret=False)
    for text in (_lower(functools.partial(mamba2.standard_decode, tiling=tiling, **kw),
                        bufs.checkpoint, *step),
                 _lower(functools.partial(mamba2.replay_decode, tiling=tiling, **kw),
                        bufs, counts, *step)):
        assert "mosaic_gpu" in text


@pytest.mark.parametrize("fields", [dict(heads=1), dict(heads=1, prologue="overlap"),
                                    dict(heads=2), dict(heads=1, readout="fma_rows")])
def test_mamba2_mosaic_replay_128_row_tiles_lower_at_p80(fields):
    """Nemotron-Nano-9B-v2 shapes (H 128, P 80, N 128, G 8), batch 256, L = 16: the replay
    decode over 128-row tiles, one CTA a head's 80 rows."""
    bufs, counts, step = _mamba2_args(S=257, b=256, H=128, P=80, N=128, G=8, L=16,
                                      state_dtype=F32)
    tiling = dataclasses.replace(mamba2.MOSAIC_REPLAY_TILING, tile_rows=128, **fields)
    fn = functools.partial(mamba2.replay_decode, impl="pallas_mosaic_gpu", tiling=tiling,
                           interpret=False)
    assert "mosaic_gpu" in _lower(fn, bufs, counts, *step)


@pytest.mark.parametrize("tiling,state_dtype", [
    (None, F32), (mamba2.Mamba2MosaicTiling(block_n=32, num_stages=3), F32),
    (mamba2.Mamba2MosaicTiling(block_n=16), BF16),
    (mamba2.Mamba2MosaicTiling(block_n=32, prologue="overlap"), F32),
    (mamba2.Mamba2MosaicTiling(block_n=32, heads=2), F32)],
    ids=["default", "bn32-3stages", "bf16-bn16", "overlap", "two-heads"])
def test_mamba2_mosaic_verify_lowers_for_sm90(tiling, state_dtype):
    """Nemotron-H-8B shapes, batch 256, L = 16, a window of T = 4 tokens."""
    T = 4
    bufs, counts, (x, B, C, dt, A, D, slots) = _mamba2_args(
        S=257, b=256, H=128, P=64, N=128, G=8, L=16, state_dtype=state_dtype)
    window = [jax.ShapeDtypeStruct((a.shape[0], T, *a.shape[1:]), a.dtype) for a in (x, B, C, dt)]
    fn = functools.partial(mamba2.replay_verify, impl="pallas_mosaic_gpu", tiling=tiling,
                           interpret=False)
    assert "mosaic_gpu" in _lower(fn, bufs, counts, *window, A, D, slots)


# An H200 SM has 228 KiB of shared memory and reserves 1 KiB per CTA: 3 CTAs need <= 75 KiB.
_THREE_CTAS_SMEM = 75 * 1024


def _smem_bytes(monkeypatch, fn, *args):
    """The SMEM scratch bytes Pallas' Mosaic GPU lowering allocates for `fn`'s kernel (its own
    estimate, every scratch buffer in a 1 KiB aligned slot: what the CTA is launched with)."""
    from jax._src.pallas.mosaic_gpu import lowering
    seen, estimate = [], lowering._estimate_resources

    def spy(ctx, jaxpr):
        resources = estimate(ctx, jaxpr)
        seen.append(resources.smem_scratch_bytes)
        return resources
    monkeypatch.setattr(lowering, "_estimate_resources", spy)
    _lower(fn, *args)
    return max(seen)


def _gdn_args(S, b, Hk, Hv, K, V, L, state_dtype, ring_dtype):
    sds = jax.ShapeDtypeStruct
    bufs = gdn.GDNBuffers(sds((S, Hv, V, K), state_dtype), sds((S, Hk, L, K), ring_dtype),
                          sds((S, Hv, L, V), ring_dtype), sds((S, Hv, L), F32))
    step = (sds((b, Hk, K), BF16), sds((b, Hk, K), BF16), sds((b, Hv, V), BF16),
            sds((b, Hv), F32), sds((b, Hv), F32), sds((b,), jnp.int32))
    return bufs, sds((S,), jnp.int32), step


@pytest.mark.parametrize("tiling,state_dtype,ring_dtype", [
    (None, F32, F32), (gdn.GDNMosaicTiling(block_k=32, num_stages=3), F32, F32),
    (gdn.GDNMosaicTiling(block_k=128), F32, BF16),
    (gdn.GDNMosaicTiling(block_k=16), BF16, BF16),
    (gdn.GDNMosaicTiling(block_k=64, prologue="overlap"), F32, F32),
    (dataclasses.replace(gdn.MOSAIC_REPLAY_TILING, readout="mma"), F32, F32),
    (dataclasses.replace(gdn.MOSAIC_REPLAY_TILING, readout="fma_rows"), F32, F32),
    (gdn.GDNMosaicTiling(block_k=64, readout="fma_rows"), F32, BF16),
    (gdn.GDNMosaicTiling(block_k=32, readout="fma_rows", tile_rows=128), BF16, BF16),
    (dataclasses.replace(gdn.MOSAIC_REPLAY_TILING, ring_block=0), F32, F32)],
    ids=["default", "bk32-3stages", "bk128-bf16ring", "bf16-bk16", "overlap", "mma",
         "rows-128", "rows-64-bk64", "rows-128-bf16", "whole-ring"])
def test_gdn_mosaic_kernels_lower_for_sm90(tiling, state_dtype, ring_dtype):
    """Qwen3-Next shapes (Hk 16, Hv 32, K = V = 128), batch 256, L = 16."""
    bufs, counts, step = _gdn_args(S=257, b=256, Hk=16, Hv=32, K=128, V=128, L=16,
                                   state_dtype=state_dtype, ring_dtype=ring_dtype)
    kw = dict(impl="pallas_mosaic_gpu", tiling=tiling, interpret=False)
    for text in (_lower(functools.partial(gdn.standard_decode, **kw), bufs.checkpoint, *step),
                 _lower(functools.partial(gdn.replay_decode, **kw), bufs, counts, *step)):
        assert "mosaic_gpu" in text


@pytest.mark.parametrize("tiling,state_dtype,ring_dtype", [
    (None, F32, F32), (gdn.GDNMosaicTiling(block_k=32, num_stages=3), F32, F32),
    (gdn.GDNMosaicTiling(block_k=16), BF16, BF16),
    (gdn.GDNMosaicTiling(block_k=64, prologue="overlap"), F32, F32),
    (gdn.GDNMosaicTiling(block_k=32, tile_rows=128, readout="mma"), F32, F32),
    (gdn.GDNMosaicTiling(block_k=32, tile_rows=128, readout="mma", key_products="kernel"),
     F32, F32),
    (gdn.GDNMosaicTiling(block_k=16, readout="mma", key_products="kernel", prologue="overlap",
                         ring_write="kernel"), F32, F32),
    (gdn.GDNMosaicTiling(block_k=32, tile_rows=128, readout="mma", key_products="kernel",
                         prologue="fused", ring_write="kernel"), F32, F32),
    (gdn.GDNMosaicTiling(block_k=32, tile_rows=128, readout="fma_rows", prologue="fused"),
     F32, F32),
    (None, BF16, BF16),
    (gdn.GDNMosaicTiling(block_k=32, tile_rows=128, readout="mma", key_products="kernel",
                         prologue="fused", ring_write="kernel", ring_block=4), F32, F32)],
    ids=["default", "bk32-3stages", "bf16-bk16", "overlap", "mma", "keys-kernel",
         "keys-kernel-bk16-overlap-ring-write", "keys-kernel-fused", "rows-fused",
         "default-bf16", "keys-kernel-fused-ring-block"])
@pytest.mark.parametrize("T", [2, 4, MAX_VERIFY_TOKENS])
def test_gdn_mosaic_verify_lowers_for_sm90(tiling, state_dtype, ring_dtype, T):
    """Qwen3-Next shapes, batch 256, L = 16, a window of T tokens."""
    bufs, counts, (*token, slots) = _gdn_args(S=257, b=256, Hk=16, Hv=32, K=128, V=128, L=16,
                                              state_dtype=state_dtype, ring_dtype=ring_dtype)
    window = [jax.ShapeDtypeStruct((a.shape[0], T, *a.shape[1:]), a.dtype) for a in token]
    fn = functools.partial(gdn.replay_verify, impl="pallas_mosaic_gpu", tiling=tiling,
                           interpret=False)
    assert "mosaic_gpu" in _lower(fn, bufs, counts, *window, slots)


def _window(T, *token):
    return [jax.ShapeDtypeStruct((a.shape[0], T, *a.shape[1:]), a.dtype) for a in token]


@pytest.mark.parametrize("family,kernel,T", [
    ("mamba2", "replay_decode", 1), ("mamba2", "replay_verify", MAX_VERIFY_TOKENS),
    ("gdn", "replay_decode", 1), ("gdn", "replay_verify", 4),
    ("gdn", "replay_verify", MAX_VERIFY_TOKENS)])
def test_fp32_replay_kernels_fit_three_ctas_per_sm(monkeypatch, family, kernel, T):
    """The latency-bound replay kernels hide latency with resident CTAs: at real shapes (L = 16,
    N = K = 128, the default tilings, an fp32 state) a third one fits an SM. GDN: with a bf16
    ring (an fp32 one's keys and d rows take 6 KiB more), and verify at T = 4 and 8 (from 5
    tokens the fused prologue's in-kernel products take a scope after the stream)."""
    kw = dict(impl="pallas_mosaic_gpu", tiling=None, interpret=False)
    if family == "mamba2":
        bufs, counts, (*token, A, D, slots) = _mamba2_args(
            S=257, b=256, H=128, P=64, N=128, G=8, L=16, state_dtype=F32)
        consts = (A, D, slots)
    else:
        bufs, counts, (*token, slots) = _gdn_args(S=257, b=256, Hk=16, Hv=32, K=128, V=128,
                                                  L=16, state_dtype=F32, ring_dtype=BF16)
        consts = (slots,)
    if kernel == "replay_verify":
        token = _window(T, *token)
    fn = functools.partial(getattr({"mamba2": mamba2, "gdn": gdn}[family], kernel), **kw)
    smem = _smem_bytes(monkeypatch, fn, bufs, counts, *token, *consts)
    assert smem <= _THREE_CTAS_SMEM, f"{family} {kernel}: {smem / 1024} KiB of SMEM"
