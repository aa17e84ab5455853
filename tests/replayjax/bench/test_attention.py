"""The decode attention benchmark's plumbing on CPU (the kernel in interpret mode)."""

import jax
import numpy as np
import pytest

from replayjax.bench import attention as bench
from replayjax.bench import timing


def test_bench_plumbing_runs_on_cpu(monkeypatch):
    """Both variants run and agree (fake CUPTI times); the bytes are the valid K/V's."""
    monkeypatch.setitem(bench.SHAPES, "tiny", (4, 2, 16))
    monkeypatch.setattr(bench, "MIN_POOL_BYTES", 3 * 2 * 32 * 2 * 16 * 2 * 2)   # two sets
    monkeypatch.setattr(timing, "kernel_times", lambda fn, *args, iterations: (
        jax.block_until_ready(fn(*args)), [[("k", 6.0), ("k", 2.0)]] * iterations)[1])
    row = bench.bench("tiny", 3, 2, 32, [{}, {"block_k": 16}], iterations=1)
    assert row.sets == 2 and set(row.us) == {"xla", "pallas", "pallas {'block_k': 16}"}
    assert all(us == 4.0 for us in row.us.values())
    assert all(e < 1e-2 for e in row.rel_err.values()) and len(row.rel_err) == 2
    _, _, _, _, starts = bench.problem("tiny", 3, 2, 32)[0]
    assert row.bytes == pytest.approx(np.mean(np.sum(np.asarray(starts) + 2, axis=1))
                                      * 2 * 16 * 2 * 2)
    assert row.line(1e12).startswith("| tiny | 3 | 2 |") and row.line(1e12).endswith("1.00x |")
