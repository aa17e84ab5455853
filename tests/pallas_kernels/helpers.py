"""Shared helpers for the kernel tests."""

import numpy as np


def rel_err(a, b):
    """Relative Frobenius error ||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def impl_kw(impl, interpret, tiling=None):
    """Keyword arguments for a public op: tiling and interpret only apply to Pallas (Triton or
    Mosaic GPU)."""
    if impl == "xla":
        return dict(impl=impl)
    return dict(impl=impl, interpret=interpret, tiling=tiling)


def bitwise_equal(a, b):
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def same_sums(a, b, rtol: float) -> bool:
    """Bitwise equal (rtol 0), or NaN at the same places and a relative error <= rtol on the
    rest."""
    if rtol == 0:
        return bitwise_equal(a, b)
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a)
    return bool((nan == np.isnan(b)).all()) and rel_err(a[~nan], b[~nan]) <= rtol


def assert_runs_equal(run, other, interpret: bool = True, interpret_rtol: float = 0.0):
    """Two runs of (outputs per step, final pools, final counts) are equal bit for bit (in the
    interpreter: up to interpret_rtol); compiled (interpret False) the same sums may round apart
    by an ulp (ptxas contracts multiply-adds into FMAs per the code's layout, not per the math):
    relative error <= 1e-6, NaNs alike."""
    (outs, bufs, counts), (outs_o, bufs_o, counts_o) = run, other
    rtol = interpret_rtol if interpret else 1e-6
    assert all(same_sums(a, b, rtol) for a, b in zip(outs, outs_o, strict=True))
    assert all(same_sums(a, b, rtol) for a, b in zip(bufs, bufs_o, strict=True))
    assert bitwise_equal(counts, counts_o)


def mosaic_races_found(interpret: bool) -> bool:
    """Whether the Mosaic GPU interpreter (race detection on, see `_mosaic_utils`) has seen a
    data race between TMA copies and SMEM accesses in this process (jax 0.11.2 keeps the state
    in a private module). Compiled kernels run no race detector: False."""
    if not interpret:
        return False
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    return bool(interpret_pallas_call.get_races().races_found)
