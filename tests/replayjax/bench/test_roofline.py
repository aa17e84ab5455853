"""The minimum-bytes and minimum-FLOPs model of a decode step on known inputs (the tiny
Nemotron-H fixture: pattern M*M-ME, fp32, hidden 32, vocab 128, Mamba H=4 P=16 N=16 G=4 conv 4,
attention 4 heads and 2 kv heads of 16, MLP 64, MoE 8 experts top-2 of width 32 plus a shared
expert of 48), and the roofline built from both."""

import json

import jax.numpy as jnp
import pytest
from flax import nnx

from models.config import parse_config
from models.registry import model_class
from replayjax.bench import roofline, timing
from replayjax.loading import load_model


@pytest.fixture(scope="module")
def model():
    return load_model("tests/fixtures/hf/nemotron_h")


def test_hit_experts():
    assert roofline.hit_experts(128, 6, 1) == pytest.approx(6)
    assert roofline.hit_experts(128, 6, 2) == pytest.approx(128 * (1 - (1 - 6 / 128) ** 2))
    assert roofline.hit_experts(512, 10, 256) == pytest.approx(512 * (1 - (1 - 10 / 512) ** 256))
    assert roofline.hit_experts(128, 6, 10_000) == pytest.approx(128)


def test_ssm_row_bytes():
    assert roofline.ssm_row_bytes(100.0, 10.0, 16, "standard") == 200
    assert roofline.ssm_row_bytes(100.0, 10.0, 16, "replay") == 100 + 100 / 16 + 10 * 7.5 + 10


def test_weights_read_by_one_row(model):
    b = roofline.weight_bytes(model, 1)
    # routed experts (up + down, 8 x 32 x 32 fp32) hit 2 of 8; router [8, 32] + bias; shared 32x48x2
    assert b["moe"] == 2 * 8 * 32 * 32 * 4 * 2 / 8 + 8 * 32 * 4 + 8 * 4 + 2 * 32 * 48 * 4
    # one embedding row + 7 RMSNorm weights of 32
    assert b["other"] == 32 * 4 + 7 * 32 * 4
    assert b["attention"] == 0 and b["sampling"] == 0
    assert roofline.weight_bytes(model, 64)["moe"] > b["moe"]     # more rows, more experts hit


def test_state_and_kv_bytes_of_a_step(model):
    std = roofline.cache_bytes(model, 2, 10, mode="standard", window=4, state_dtype=jnp.float32)
    rep = roofline.cache_bytes(model, 2, 10, mode="replay", window=4, state_dtype=jnp.float32)
    state, conv = 4 * 16 * 16 * 4, 3 * (64 + 2 * 4 * 16) * 4
    entry = 4 * 16 * 4 + 4 * 16 * 4 + 4 * 4     # x, B (fp32 ring here), dt
    assert std["ssm"] == 3 * 2 * (2 * state + 2 * conv)             # 3 Mamba layers, 2 rows
    assert rep["ssm"] == 3 * 2 * (state + state / 4 + entry * 1.5 + entry + 2 * conv)
    assert std["attention"] == rep["attention"] == 2 * 11 * 2 * 2 * 16 * 4   # 10 read + 1 written
    total = roofline.decode_step_bytes(model, 2, 10, mode="replay", window=4,
                                       state_dtype=jnp.float32)
    assert sum(total.values()) == pytest.approx(sum(rep.values()) + sum(
        roofline.weight_bytes(model, 2).values()) + 2 * 2 * 4)       # + token ids in and out


def test_decode_step_flops_by_hand(model):
    b, kv = 3, 10
    gemm = (3 * (32 * 260 + 64 * 32)              # Mamba in_proj, out_proj
            + 32 * 64 + 2 * 32 * 32 + 64 * 32     # q, k, v, o
            + 2 * 32 * 64                         # MLP up, down
            + 32 * 128)                           # LM head; the embedding rows are gathered
    moe = (2 * 32 * 32 * 2                        # 2 of the 8 routed experts (up, down)
           + 8 * 32 + 8 + 2 * 32 * 48)            # router and its bias, shared expert
    attention = 2 * 2 * 4 * 16 * (kv + 1)         # QK^T, PV: 4 heads of 16 at 10 + 1 positions
    state, entry, conv = 4 * 16 * 16, 4 * 16 + 4 * 16 + 4, 3 * (64 + 2 * 4 * 16)   # x, B, dt
    ssm = dict(standard=5 * state + 2 * conv, replay=4 * state + 2 * entry * 2.5 + 2 * conv)
    for mode in ("standard", "replay"):
        got = roofline.decode_step_flops(model, b, kv, mode=mode, window=4,
                                         state_dtype=jnp.float32)
        assert got == pytest.approx(dict(
            ssm=3 * b * ssm[mode], gemm=2 * b * gemm, attention=b * attention, moe=2 * b * moe,
            sampling=0, collective=0, other=0))


def test_routed_experts_cost_k_of_e_flops_per_row(model):
    one, many = roofline.weight_flops(model, 1), roofline.weight_flops(model, 1000)
    routed = 2 * 8 * 32 * 32
    assert one["moe"] == 2 * (routed * 2 / 8 + 8 * 32 + 8 + 2 * 32 * 48)
    assert many["moe"] == 1000 * one["moe"]       # each row uses k experts, however many rows
    # while the bytes stop growing once every expert is hit
    assert roofline.weight_bytes(model, 1000)["moe"] == pytest.approx(
        (routed + 8 * 32 + 8 + 2 * 32 * 48) * 4)


def test_a_tied_embedding_is_the_lm_heads_gemm():
    """Qwen3-Next fixture with and without tied embeddings (abstract): the head's FLOPs are the
    same either way, under gemm; only the untied model gathers embedding rows."""
    config = json.load(open("tests/fixtures/hf/qwen3_next/config.json"))
    models = {}
    for tie in (False, True):
        cfg = parse_config(dict(config, tie_word_embeddings=tie))
        models[tie] = nnx.eval_shape(lambda cfg=cfg: model_class(cfg)(cfg, dtype=jnp.float32))
    flops = {t: roofline.weight_flops(m, 3) for t, m in models.items()}
    assert flops[True] == flops[False] and flops[True]["gemm"] > 2 * 3 * 128 * 32
    other = {t: roofline.weight_bytes(m, 3)["other"] for t, m in models.items()}
    assert other[False] - other[True] == 3 * 32 * 4            # 3 gathered rows of 32, fp32


def test_bound_is_the_larger_of_bytes_and_flops():
    assert roofline.bound(2e9, 3e12, 1e9, 1e12) == dict(byte_s=2.0, flop_s=3.0, ideal_s=3.0,
                                                        bound="flops")
    assert roofline.bound(4e9, 3e12, 1e9, 1e12)["bound"] == "bytes"
    assert roofline.bound(2e9, 3e12, 1e9, None) == dict(byte_s=2.0, flop_s=None, ideal_s=2.0,
                                                        bound="bytes")     # no peak: bytes alone
    assert roofline.bound(0, 0, 1e9, 1e12)["bound"] == "bytes"             # nothing to do


def test_table_rows():
    rows = roofline.table({"ssm": 2e6, "gemm": 1e6}, 1e9, {"ssm": 4e-3, "gemm": 1e-3}, steps=2)
    by = {r["cls"]: r for r in rows}
    assert by["ssm"]["ideal_us"] == pytest.approx(2000) and by["ssm"]["measured_us"] == 2000
    assert by["ssm"]["of_roofline"] == pytest.approx(1.0)
    assert by["total"]["min_mb"] == 3 and by["total"]["measured_us"] == 2500
    assert by["moe"]["of_roofline"] is None
    # no FLOPs or no peak: the bytes-only roofline, unchanged
    no_peak = roofline.table({"ssm": 2e6, "gemm": 1e6}, 1e9, None, min_flops={"gemm": 1e15})
    for r in (rows, no_peak):
        assert [(x["ideal_us"], x["flops_us"], x["bound"]) for x in r] == [
            (pytest.approx(x["min_mb"] * 1e6 / 1e9 * 1e6), None, "bytes") for x in r]


def test_table_takes_the_binding_bound_per_class_and_sums_them():
    """gemm: 1 MB (1000 us at 1 GB/s) but 6 GFLOP (3000 us at 2 TFLOP/s) -> flops; ssm: 2 MB
    (2000 us), 1 GFLOP (500 us) -> bytes; the step: 5000 us, most of it flops-bound."""
    rows = roofline.table({"ssm": 2e6, "gemm": 1e6}, 1e9, {"ssm": 4e-3, "gemm": 6e-3}, 1,
                          {"ssm": 1e9, "gemm": 6e9}, 2e12)
    by = {r["cls"]: r for r in rows}
    assert (by["gemm"]["ideal_us"], by["gemm"]["bound"]) == (pytest.approx(3000), "flops")
    assert (by["ssm"]["ideal_us"], by["ssm"]["bound"]) == (pytest.approx(2000), "bytes")
    assert by["gemm"]["bytes_us"] == pytest.approx(1000) and by["gemm"]["min_gflop"] == 6
    assert by["gemm"]["of_roofline"] == pytest.approx(0.5)
    total = by["total"]
    assert total["ideal_us"] == pytest.approx(5000) and total["bound"] == "flops"
    assert total["bytes_us"] == pytest.approx(3000) and total["flops_us"] == pytest.approx(3500)
    assert total["of_roofline"] == pytest.approx(0.5) and total["min_gflop"] == 7
    assert roofline.step_roofline({"ssm": 4e6, "gemm": 1e6}, {"gemm": 6e9}, 1e9, 2e12)[
        "total"]["bound"] == "bytes"     # 4000 us of bytes-bound ssm, 3000 of flops-bound gemm


def test_peak_by_device_and_flag():
    assert timing.peak_tflops("NVIDIA H200") == 989.0 and timing.peak_tflops("cpu") is None
    assert timing.peak_flops(2.5) == 2.5e12
    assert timing.peak_flops() is None                  # the CPU test backend: none known
