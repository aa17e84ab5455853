"""The benchmark's byte model reproduces the minimum bytes the issues quote (per sequence,
layer and step at fp32 state, bf16 activations and ring, L = 16)."""

import numpy as np
import pytest

from replayjax import kernel_bench


@pytest.mark.parametrize("family,shape,std_mb,rep_mb", [
    ("mamba2", "nemotron-h-8b", 8.43, 4.65),
    ("gdn", "qwen3-next", 4.22, 2.36),
])
def test_min_bytes_match_published_anchors(family, shape, std_mb, rep_mb):
    fam = kernel_bench.FAMILIES[family]()
    std, rep = fam.min_bytes(fam.shapes[shape], 16, 2)
    assert round(std / 1e6, 2) == std_mb and round(rep / 1e6, 2) == rep_mb
    assert std / rep == pytest.approx(std_mb / rep_mb, rel=5e-3)


def test_cli_lists_subcommands(capsys):
    from replayjax import cli
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(c in out for c in ("generate", "convert", "bench kernels", "bench verify", "profile"))
    assert cli.main(["nonsense"]) == 2


@pytest.fixture
def fake_cupti(monkeypatch):
    """Runs the timed functions for real (interpret-mode Pallas on CPU) and returns made-up
    launch times, so the benchmark plumbing is exercised without a GPU."""
    from replayjax import verify_bench

    def device_times(fn, *args, name, iterations=3):
        import jax
        jax.block_until_ready(fn(*args))
        return [np.ones(calls[name]) for _ in range(iterations)]

    def step_us(fn, args, first_kernel, n_steps, iterations=3):
        import jax
        jax.block_until_ready(fn(*args))
        return float(n_steps)

    calls = {}
    monkeypatch.setattr(kernel_bench, "_device_times", device_times)
    monkeypatch.setattr(verify_bench, "_step_us", step_us)
    return calls


@pytest.mark.parametrize("family,dims", [("mamba2", dict(H=2, P=16, N=16, G=1)),
                                         ("gdn", dict(Hk=1, Hv=2, K=16, V=16))])
def test_bench_plumbing_runs_on_cpu(fake_cupti, family, dims):
    from replayjax import verify_bench
    fam = kernel_bench.FAMILIES[family]()
    fam.shapes["tiny"] = dims
    n_steps = 2 * 4                           # two slot sets, L = 4
    fake_cupti.update(standard=n_steps, replay=n_steps)
    r = kernel_bench.bench(fam, "tiny", 2, L=4, iterations=1, min_pool_bytes=1)
    assert r["standard_us"] == 1.0 and r["replay_us"] == 1.0
    v = verify_bench.bench_verify(fam, "tiny", 2, 2, L=4, ring="float32", iterations=1,
                                  min_pool_bytes=1, steps_per_set=2)
    assert v["speedup"] == 1.0 and v["baseline_mem_per_seq"] == 3 * fam.state_bytes(dims)


def test_verify_byte_model_reduces_to_decode_at_one_token():
    """With T = 1 every step accepts one token: the ring folds once per L steps holding (L - 1) / 2
    entries on average, exactly the decode byte model; more tokens per step fold more often."""
    from replayjax import verify_bench
    assert verify_bench.fold_statistics(1, 16) == pytest.approx((1 / 16, 7.5), rel=1e-3)
    fam = kernel_bench.FAMILIES["mamba2"]()
    dims = fam.shapes["nemotron-h-8b"]
    rep, base = verify_bench.min_bytes(fam, dims, 1, 16, 2)
    assert (base, rep) == pytest.approx(fam.min_bytes(dims, 16, 2), rel=1e-3)
    rate4, _ = verify_bench.fold_statistics(4, 16)
    assert 1 / 16 < rate4 < 2.5 / (16 - 3)     # 2.5 tokens per step, >= L - T + 1 per fold
    rep4, base4 = verify_bench.min_bytes(fam, dims, 4, 16, 2)
    assert base4 / rep4 > 3                      # the 3x target is reachable in bytes
