"""The MoE benchmark's pure parts (bytes, FLOPs, distinct experts) and its plumbing on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayjax.bench import moe as bench

NANO = bench.SHAPES["nemotron-3-nano-30b-a3b"]
Q35 = bench.SHAPES["qwen3.5-35b-a3b"]


def test_distinct_experts():
    assert bench.distinct_experts(np.array([[3, 1], [1, 7], [3, 0]])) == 4
    assert bench.distinct_experts(np.array([[5]])) == 1


def test_bytes_and_flops_by_hand():
    # Nemotron-3-Nano: relu^2 experts (up + down) 2688 x 1856 bf16; shared 3712 wide; fp32 router
    assert bench.expert_bytes(NANO) == 2 * 2688 * 1856 * 2
    assert bench.layer_bytes(NANO, 6) == (6 * 2 * 2688 * 1856 * 2 + 2 * 2688 * 3712 * 2
                                          + 128 * 2688 * 4 + 128 * 4)
    # Qwen3.5-35B: SwiGLU experts (gate, up, down) 2048 x 512; shared 512 + its [2048, 1] gate
    assert bench.expert_bytes(Q35) == 3 * 2048 * 512 * 2
    assert bench.layer_bytes(Q35, 8) == (8 * 3 * 2048 * 512 * 2 + 3 * 2048 * 512 * 2 + 2048 * 2
                                         + 256 * 2048 * 4)
    assert bench.layer_flops(NANO, 2) == 2 * 2 * 2688 * (6 * 2 * 1856 + 2 * 3712 + 128)
    assert bench.layer_flops(Q35, 1) == 2 * 2048 * (8 * 3 * 512 + 3 * 512 + 256 + 1)
    assert bench.peak_tflops("NVIDIA H200") == 989.0 and bench.peak_tflops("cpu") is None


@pytest.mark.parametrize("shape", [bench.MoEShape("nemotron_h", 32, 8, 2, 16, 48, 2.5),
                                   bench.MoEShape("qwen", 32, 8, 3, 16, 16)])
def test_layer_call_is_the_models_layer(shape):
    """The benchmark's composition with the sparse experts is the model's MoE __call__ (the
    Pallas variant runs in interpret mode here), with the shared expert in the launch too (as
    the module forced to; and routed by the router kernel, as sparse-shared runs it), and the
    dense variant agrees."""
    layer = bench.make_layer(shape, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, shape.hidden), jnp.bfloat16)
    ws = bench.expert_weights(layer)
    call = lambda experts, ws=ws, route=bench.XLA_ROUTE: np.asarray(jax.jit(
        lambda x: bench.layer_call(layer, x, ws, experts, route))(x), np.float32)
    want = np.asarray(jax.jit(layer)(x), np.float32)
    np.testing.assert_allclose(call(bench.sparse_experts), want, rtol=2e-2, atol=2e-2)
    joined = call(bench.shared_experts, bench.shared_weights(layer))
    np.testing.assert_allclose(joined, want, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(joined, np.asarray(jax.jit(
        lambda x: layer(x, shared_in_launch=True))(x), np.float32))
    routed = call(bench.shared_experts, bench.shared_weights(layer), {"impl": "pallas"})
    np.testing.assert_allclose(routed, joined, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(call(bench.small_experts), want, rtol=2e-2, atol=2e-2)
    dense = call(bench.dense_experts)
    np.testing.assert_allclose(dense, want, rtol=2e-2, atol=2e-2)


# two iterations of a call over 2 copies: per copy a router fusion, a Pallas kernel, a reduction
FAKE_TIMES = [[("fusion_3", 1.0), ("moe_pair_ffn", 5.0), ("input_reduce_fusion.2", 1.0),
               ("fusion_7", 1.0), ("moe_pair_ffn", 5.0), ("input_reduce_fusion.5", 1.0)],
              [("fusion_3", 2.0), ("moe_pair_ffn", 6.0), ("input_reduce_fusion.2", 1.0),
               ("fusion_7", 2.0), ("moe_pair_ffn", 6.0), ("input_reduce_fusion.5", 1.0)]]


def test_breakdown_per_layer_call():
    """Kernels group by name without XLA's numbering; launches and us are per layer call."""
    kernels = bench.breakdown(FAKE_TIMES, copies=2)
    assert [k["kernel"] for k in kernels] == ["moe_pair_ffn", "fusion", "input_reduce_fusion"]
    assert [k["launches"] for k in kernels] == [1, 1, 1]
    assert [k["us"] for k in kernels] == [5.5, 1.5, 1.0]
    assert sum(k["share"] for k in kernels) == pytest.approx(1.0)
    assert kernels[0]["share"] == pytest.approx(5.5 / 8)
    assert bench.kernel_family("triton_gemm_dot_3.1") == "triton_gemm_dot"


def test_bench_plumbing_runs_on_cpu(monkeypatch):
    """Every variant runs (no GPU: fake CUPTI times); the row's counts come from the routing;
    the breakdown prints after the table; sparse-small stops above SMALL_MAX_BATCH."""
    monkeypatch.setattr(bench, "_kernel_times", lambda fn, args, iterations=5: (
        jax.block_until_ready(fn(*args)), FAKE_TIMES)[1])
    shape = bench.MoEShape("qwen", 32, 8, 2, 16, 16)
    row = bench.bench("tiny", shape, 3, copies=2, iterations=1)
    assert set(row.us) >= {"sparse", "sparse-shared", "sparse-small", "dense"}
    assert all(v == 8.0 for v in row.us.values()) and set(row.kernels) == set(row.us)
    lines = bench.breakdown_lines(row)
    assert "\ntiny, batch 3, sparse-small: kernels of one layer call" in lines
    assert "| moe_pair_ffn | 1 | 5.5 | 69% |" in lines
    assert 2 <= row.distinct <= 6
    assert row.bytes == pytest.approx(bench.layer_bytes(shape, row.distinct))
    assert row.flops == bench.layer_flops(shape, 3)
    assert "| tiny | 3 |" in row.line(1e12, 989.0)
    big = bench.bench("tiny", shape, bench.SMALL_MAX_BATCH + 1, copies=1, iterations=1,
                      only=["sparse-small"])
    assert big.us == {"sparse-small": None} and "sparse-small: skipped (batch > 32)" in big.line(
        1e12, None)


@pytest.mark.parametrize("variant,experts,flag,config,name,fields,want", [
    ("sparse-small", "small_experts", "small_tilings", {"block_f": 32, "num_warps": 8},
     'sparse-small {"block_f":32,"num_warps":8}', ("block_f", "num_warps"), [(64, 4), (32, 8)]),
    ("sparse", "sparse_experts", "grouped_tilings", {"up_block_n": 32, "num_warps": 8},
     'sparse {"up_block_n":32,"num_warps":8}', ("up_block_n", "num_warps"), [(64, 4), (32, 8)])])
def test_tilings_are_variants(monkeypatch, variant, experts, flag, config, name, fields, want):
    """--small-tilings / --grouped-tilings: one sparse-small (PairTiling) / sparse (MoETiling)
    variant per override, each running it."""
    seen = []
    monkeypatch.setattr(bench, experts, lambda *a, tiling: (
        seen.append(tiling), bench.dense_experts(*a))[1])
    monkeypatch.setattr(bench, "_kernel_times", lambda fn, args, iterations=5: (
        jax.block_until_ready(fn(*args)), FAKE_TIMES)[1])
    shape = bench.MoEShape("nemotron_h", 32, 8, 2, 16, 48, 2.5)
    row = bench.bench("tiny", shape, 2, copies=1, iterations=1, only=[variant],
                      **{flag: [{}, config]})
    assert list(row.us) == [variant, name]
    assert [tuple(getattr(t, f) for f in fields) for t in seen] == want


def test_router_tilings_are_variants(monkeypatch):
    """--router-tilings: one sparse-shared variant per RouterTiling override, each routing
    through the router kernel with it (sparse-small through its default; the other variants
    route in XLA)."""
    seen = []
    monkeypatch.setattr(bench, "layer_call", lambda layer, x, ws, experts, route: (
        seen.append(route), experts(x, *layer.route(x, **route), ws))[1])
    monkeypatch.setattr(bench, "_kernel_times", lambda fn, args, iterations=5: (
        jax.block_until_ready(fn(*args)), FAKE_TIMES)[1])
    shape = bench.MoEShape("nemotron_h", 32, 8, 2, 16, 48, 2.5)
    row = bench.bench("tiny", shape, 2, copies=1, iterations=1, only=["sparse-shared"],
                      router_tilings=[{}, {"logits": "kernel", "num_warps": 8}])
    assert list(row.us) == ["sparse-shared", 'sparse-shared {"logits":"kernel","num_warps":8}']
    assert [r["impl"] for r in seen] == ["pallas", "pallas"]
    assert [(r["tiling"].logits, r["tiling"].num_warps) for r in seen] == [("xla", 4),
                                                                         ("kernel", 8)]
    routes = {k: v[2]["impl"] for k, v in bench.variants().items()}
    assert routes.pop("sparse-small") == "pallas" and set(routes.values()) - {"pallas"} == {"xla"}
    assert [k for k, impl in routes.items() if impl == "pallas"] == ["sparse-shared"]


def test_copies_run_one_after_another():
    """`chained` gives each layer's own output, and each copy's input waits on the copy before
    (an optimization barrier between them, so XLA cannot merge the copies' launches)."""
    layers = [lambda x, c=c: jnp.tanh(x) * (c + 1) for c in range(3)]
    xs = [jnp.full((2, 4), float(c)) for c in range(3)]
    run = jax.jit(lambda xs: bench.chained(layers, xs))
    for layer, x, y in zip(layers, xs, run(xs)):
        np.testing.assert_array_equal(y, layer(x))
    hlo = run.lower(xs).as_text()
    assert hlo.count("optimization_barrier") == 2
