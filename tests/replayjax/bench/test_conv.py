"""The decode conv benchmark's plumbing on CPU (the kernel in interpret mode)."""

import json

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


def test_command_prints_a_row_per_case_and_writes_them(monkeypatch, capsys, tmp_path):
    """`bench conv` (the loop `bench attention` shares, `timing.run_sweep`): the device line,
    the table's header, one row per (shape, batch) as it is timed, the rows as JSON with the
    copy bandwidth (the GPU, CUPTI and the bandwidth faked)."""
    from replayjax import commandline as cli
    seen = []

    def fake_bench(shape, batch, tilings):
        seen.append((shape, batch))
        return bench.Row(shape, batch, 1, 1e6, {"xla": 2.0, "pallas": 1.0}, {"pallas": 0.0},
                         {"pallas": True})

    monkeypatch.setattr(cli, "require_gpu", lambda: None)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(bench, "bench", fake_bench)
    out = tmp_path / "conv.json"
    assert bench.main(["--batches", "1", "8", "--shapes", "qwen3.5-9b", "--json",
                       str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert seen == [("qwen3.5-9b", 1), ("qwen3.5-9b", 8)]
    assert "copy bandwidth 4.00 TB/s; bf16 pools, K = 4" in lines[0]
    assert lines[1].startswith("| shape | batch |")
    assert [ln.split(" | ")[:2] for ln in lines[3:]] == [["| qwen3.5-9b", "1"],
                                                          ["| qwen3.5-9b", "8"]]
    assert [r["batch"] for r in json.loads(out.read_text())] == [1, 8]
    assert json.loads(out.read_text())[0]["copy_bw"] == 4e12
