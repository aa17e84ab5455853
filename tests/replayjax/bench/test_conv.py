"""The decode conv benchmark's plumbing on CPU (the kernel in interpret mode)."""

import jax
import pytest

from replayjax.bench import conv as bench
from replayjax.bench import timing


@pytest.mark.parametrize("biased", [True, False])
def test_bench_plumbing_runs_on_cpu(monkeypatch, biased):
    """Both variants run and agree, the pools they leave bitwise; the untimed fresh-pool kernel
    (each iteration's first) is left out (fake CUPTI times); the bytes are the row's."""
    C, b = 24, 3
    monkeypatch.setitem(bench.SHAPES, "tiny", (C, biased))
    monkeypatch.setattr(bench, "MIN_POOL_BYTES", 2 * b * (bench.K - 1) * C * 2)   # two sets
    monkeypatch.setattr(timing, "kernel_times", lambda fn, *args, iterations: (
        jax.block_until_ready(fn(*args)), [[("fresh", 100.0), ("k", 6.0), ("k", 2.0)]]
                                          * iterations)[1])
    row = bench.bench("tiny", b, [{}, {"block_c": 16, "grid_order": "row_slowest"}],
                      iterations=1)
    pallas = {"pallas", "pallas {'block_c': 16, 'grid_order': 'row_slowest'}"}
    assert row.sets == 2 and set(row.us) == {"xla"} | pallas
    assert all(us == 4.0 for us in row.us.values())
    assert set(row.rel_err) == pallas and all(e < 1e-6 for e in row.rel_err.values())
    assert row.same_pool == dict.fromkeys(pallas, True)
    assert row.bytes == b * C * (2 * 3 * 2 + 2 + 4) + C * (4 + biased) * 2
    line = row.line(1e12)
    assert line.startswith(f"| tiny | {b} |") and line.endswith("1.00x |") and "pool equal" in line
