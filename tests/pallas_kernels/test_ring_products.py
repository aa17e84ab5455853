"""The replay steps' dot products by one Pallas launch (`pallas_kernels.ring_products`, a
tiling's bc_products / key_products = "pallas") against XLA's (`ring.row_products`), within 1e-6
relative (Frobenius): both exact fp32 products, summed in other orders."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.gdn.buffers import ring_key_products, verify_key_products
from pallas_kernels.mamba2.buffers import bc_products
from pallas_kernels.ring import NULL_SLOT
from tests.pallas_kernels.families import BF16, F32
from tests.pallas_kernels.helpers import rel_err

S, G, L, N = 7, 2, 8, 32
SLOTS = jnp.asarray([5, NULL_SLOT, 2, 6], jnp.int32)      # a padding row reads the null slot


def _inputs(seed, T, dtype, n_vectors):
    """A ring [S, G, L, N] and n_vectors windows [4, T, G, N], fresh normal values."""
    k = jax.random.split(jax.random.PRNGKey(seed), n_vectors + 1)
    ring = jax.random.normal(k[0], (S, G, L, N)).astype(dtype)
    return ring, [jax.random.normal(kk, (4, T, G, N)).astype(dtype) for kk in k[1:]]


def _both(fn, *args, interpret):
    """fn(*args, by=...) by the launch and by XLA, each jitted."""
    run = lambda by: jax.jit(functools.partial(fn, by=by, interpret=interpret))(*args)
    return run("pallas"), run("xla")


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_mamba2_bc_products(T, dtype, interpret):
    """B_j . C_t over each row's own slot's ring B rows and B_r . C_t within the window, every
    group, at windows of 1 (decode), 3 (not a power of two: a pair's window read as a masked
    block of 4 rows) and 8 tokens: every output element written."""
    ring_b, (B, C) = _inputs(T, T, dtype, 2)
    (ring, window), (want_ring, want_window) = _both(bc_products, ring_b, SLOTS, B, C,
                                                     interpret=interpret)
    assert ring.shape == (4, G, T, L) and window.shape == (4, G, T, T)
    assert rel_err(ring, want_ring) < 1e-6
    assert rel_err(window, want_window) < 1e-6


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_gdn_key_products(T, dtype, interpret):
    """k_j . k_t and k_j . q_t over the ring's keys (the decode's, `ring_key_products`) and with
    the window's k_r . k_t and k_r . q_t (the verify's, `verify_key_products`), as XLA's."""
    ring_k, (k, q) = _inputs(10 + T, T, dtype, 2)
    got, want = _both(ring_key_products, ring_k, SLOTS, k, q, interpret=interpret)
    assert len(got) == 2 and all(g.shape == (4, G, T, L) for g in got)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-6
    got, want = _both(verify_key_products, ring_k, SLOTS, k, q, interpret=interpret)
    assert [g.shape for g in got] == [(4, G, T, L)] * 2 + [(4, G, T, T)] * 2
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-6


def test_pair_order(interpret):
    """A pair (u, w) gives u_r . w_t at [r, t] (not its transpose): u = w scaled by the row
    index r + 1 makes the two differ."""
    ring_k, (k,) = _inputs(3, 4, F32, 1)
    scaled = k * (1.0 + jnp.arange(4, dtype=F32))[None, :, None, None]
    _, kq = verify_key_products(ring_k, SLOTS, k, scaled, by="pallas", interpret=interpret)[2:]
    _, want = verify_key_products(ring_k, SLOTS, k, scaled)[2:]
    assert rel_err(kq, want) < 1e-6
    assert rel_err(kq, jnp.swapaxes(want, -1, -2)) > 0.1


@pytest.mark.parametrize("T", [1, 3])
def test_counts_spare_the_uncommitted_rows(T, interpret):
    """With the slots' counts the launch reads each slot's committed ring rows only: the
    products of rows below the count equal XLA's (1e-6), those at or past it are 0 (never
    fetched), the window's products unchanged; counts 0 and L included."""
    ring_b, (B, C) = _inputs(20 + T, T, F32, 2)
    counts = jnp.asarray([3, 1, 8, 1, 5, 2, 0], jnp.int32)   # slots 5 / 2 / 6: 2 / L / 0
    got_ring, got_window = jax.jit(functools.partial(
        bc_products, by="pallas", counts=counts, interpret=interpret))(ring_b, SLOTS, B, C)
    want_ring, want_window = bc_products(ring_b, SLOTS, B, C)
    committed = jnp.arange(L)[None, :] < counts[SLOTS][:, None]            # [b, L]
    mask = committed[:, None, None, :]
    assert rel_err(jnp.where(mask, got_ring, 0), jnp.where(mask, want_ring, 0)) < 1e-6
    assert (jnp.where(mask, 0, got_ring) == 0).all()
    assert rel_err(got_window, want_window) < 1e-6
