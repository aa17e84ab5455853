"""The minimum-bytes model of a decode step on known inputs (the tiny Nemotron-H fixture:
pattern M*M-ME, fp32, hidden 32, Mamba H=4 P=16 N=16 G=4, attention 2 kv heads of 16, MoE 8
experts top-2 of width 32 plus a shared expert of 48)."""

import jax.numpy as jnp
import pytest

from replayjax.bench import roofline
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


def test_table_rows():
    rows = roofline.table({"ssm": 2e6, "gemm": 1e6}, 1e9, {"ssm": 4e-3, "gemm": 1e-3}, steps=2)
    by = {r["cls"]: r for r in rows}
    assert by["ssm"]["ideal_us"] == pytest.approx(2000) and by["ssm"]["measured_us"] == 2000
    assert by["ssm"]["of_roofline"] == pytest.approx(1.0)
    assert by["total"]["min_mb"] == 3 and by["total"]["measured_us"] == 2500
    assert by["moe"]["of_roofline"] is None
