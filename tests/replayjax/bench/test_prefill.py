"""`replayjax bench prefill`: the FLOP and byte counts of its roofline against hand counts, and a
run end to end through the command line on the tiny Nemotron-H fixture (pattern M*M-ME, fp32,
hidden 32, vocab 128, Mamba H=4 P=16 N=16 G=4, attention 4 heads of 16, MoE 8 experts top-2 of
width 32 plus a shared expert of 48)."""

import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import parse_config
from models.registry import model_class
from models.runner import Runner
from replayjax import cli
from replayjax.bench import prefill
from replayjax.loading import load_model

NEMOTRON = "tests/fixtures/hf/nemotron_h"


@pytest.fixture(scope="module")
def model():
    return load_model(NEMOTRON)


def abstract(**config):
    cfg = parse_config(config)
    return nnx.eval_shape(lambda: model_class(cfg)(cfg, dtype=jnp.float32))


def test_flops_of_a_dense_model_by_hand():
    """An MLP layer and an attention layer, D = 8, F = 12, V = 50, 2 heads of 4, 1 KV head."""
    m = abstract(model_type="nemotron_h", vocab_size=50, hidden_size=8,
                 hybrid_override_pattern="-*", num_attention_heads=2, num_key_value_heads=1,
                 head_dim=4, intermediate_size=12)
    b, T = 3, 5
    per_token = (8 * 12 + 12 * 8          # MLP up, down
                 + 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8   # q, k, v, o
                 + 3 * 8)                 # two block norms and the final norm
    lm_head = 8 * 50                      # once per prompt; the embedding is a gather
    assert prefill.prefill_flops(m, b, T) == dict(
        matmul=2 * (per_token * b * T + lm_head * b),
        attention=2 * 2 * (2 * 4) * (T * (T + 1) / 2) * b,    # QK^T and PV, causal
        ssm=0)


def test_routed_experts_count_top_k_of_e(model):
    b, T = 2, 5
    full = sum(np.prod(n.get_value().shape) for p, n in nnx.iter_graph(model)
               if isinstance(n, nnx.Param) and p[0] not in ("embeddings", "lm_head"))
    routed = 2 * 8 * 32 * 32                              # up, down [8, 32, 32]
    per_token = full - routed + routed * 2 / 8            # router, bias, shared expert whole
    assert prefill.matmul_flops(model, b, T) == 2 * (per_token * b * T + 32 * 128 * b)


def test_ssm_scan_flops_by_hand(model):
    # Mamba-2: 3 layers, H=4 P=16 N=16 G=4, chunk c = T = 5 (< 64)
    per_token = 4 * 4 * 16 * 16 + (5 + 1) * (4 * 16 + 4 * 16)
    assert prefill.ssm_flops(model.cfg, 2, 5) == 3 * per_token * 2 * 5
    # Gated DeltaNet: 3 layers, Hk=4 Hv=8 dk=dv=16, chunk c = 64 (T = 100)
    cfg = load_model("tests/fixtures/hf/qwen3_5").cfg
    per_token = 6 * 8 * 16 * 16 + (64 + 1) * (2 * 4 * 16 + 8 * (16 + 2 * 16))
    assert prefill.ssm_flops(cfg, 2, 100) == 3 * per_token * 2 * 100
    assert prefill.attention_flops(cfg, 2, 100) == 2 * 4 * 32 * 100 * 101 * 2


def test_bytes_are_weights_once_and_the_slots_cache(model):
    cache = jax.eval_shape(lambda: model.init_cache(3, 5, window=4, ssm_mode="replay"))
    got = prefill.prefill_bytes(model, cache, 2, 5)
    weights = sum(np.prod(n.get_value().shape) * 4 for p, n in nnx.iter_graph(model)
                  if isinstance(n, nnx.Param) and p[0] != "embeddings")
    routed = 2 * 8 * 32 * 32 * 4          # of which the 10 tokens hit ~7.5 of the 8 experts
    hit = 1 - (1 - 2 / 8) ** 10
    assert got["weights"] == pytest.approx(weights - routed * (1 - hit)
                                           + 10 * 32 * 4)    # + the 10 embedding rows gathered
    slot = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(cache)) / 3
    assert got["cache"] == pytest.approx(2 * slot) and got["tokens"] == 4 * 2 * 5


def test_roofline_bound():
    r = prefill.roofline(flops=4e12, nbytes=1e9, seconds=8.0, peak=1e12, copy_bw=1e9)
    assert r == dict(flop_s=4.0, byte_s=1.0, ideal_s=4.0, of_roofline=0.5, bound="flops")
    r = prefill.roofline(flops=4e12, nbytes=1e9, seconds=2.0, peak=None, copy_bw=1e9)
    assert (r["flop_s"], r["ideal_s"], r["of_roofline"], r["bound"]) == (None, 1.0, 0.5, "bytes")


def test_command_line_end_to_end(model, monkeypatch, capsys):
    """Both modes through `replayjax bench prefill --json`, each call on fresh random tokens."""
    seen = []
    real = Runner.prefill

    def recording(self, cache, tokens, lengths, slots, **kw):
        seen.append((np.asarray(tokens), np.asarray(lengths), np.asarray(slots), kw))
        return real(self, cache, tokens, lengths, slots, **kw)
    monkeypatch.setattr(Runner, "prefill", recording)
    assert cli.main(["bench", "prefill", "--model", NEMOTRON, "--batch", "2", "--prompt-len",
                     "6", "--window", "4", "--iterations", "2", "--peak-tflops", "1e-6",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["batch"], out["prompt_len"], out["timer"]) == (2, 6, "wall")
    assert [r["mode"] for r in out["rows"]] == ["standard", "replay"]
    for r in out["rows"]:
        assert len(r["all_seconds"]) == 2 and r["seconds"] == pytest.approx(
            np.median(r["all_seconds"]))
        assert r["tokens_per_s"] == pytest.approx(12 / r["seconds"])
        assert r["flops"] == pytest.approx(prefill.prefill_flops(model, 2, 6))
        assert r["flop_s"] == pytest.approx(sum(r["flops"].values()) / 1e6)
        assert r["byte_s"] == pytest.approx(sum(r["bytes"].values()) / (out["copy_gbs"] * 1e9))
        assert r["bound"] == "flops" and r["ideal_s"] == r["flop_s"]
        assert r["of_roofline"] == pytest.approx(r["ideal_s"] / r["seconds"])
    std, rep = out["rows"]
    assert rep["bytes"]["cache"] > std["bytes"]["cache"]          # + checkpoint and ring
    assert len(seen) == 6                                         # warm-up + 2, per mode
    tokens = [t for t, *_ in seen]
    assert all(t.shape == (2, 6) and t.any() and t.max() < 128 for t in tokens)
    assert all(not np.array_equal(a, b) for a, b in zip(tokens, tokens[1:]))
    assert all((lengths == 6).all() and (slots == [1, 2]).all() and kw == dict(last_only=True)
               for _, lengths, slots, kw in seen)


def test_report_table(capsys):
    assert prefill.main(["--model", NEMOTRON, "--batch", "1", "--prompt-len", "3",
                         "--ssm-mode", "replay", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    assert "no bf16 peak known" in out and "| replay |" in out and "| bytes |" in out


def test_tensor_parallel_roofline_is_per_device(capsys):
    """--tp 2 (virtual CPU devices): the same counts, each device doing half of them."""
    qwen = "tests/fixtures/hf/qwen3_5"
    assert prefill.main(["--model", qwen, "--tp", "2", "--batch", "2", "--prompt-len", "4",
                         "--ssm-mode", "replay", "--iterations", "1", "--peak-tflops", "1",
                         "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    (row,) = r["rows"]
    assert r["tp"] == 2 and row["flops"] == pytest.approx(
        prefill.prefill_flops(load_model(qwen), 2, 4))
    assert row["flop_s"] == pytest.approx(sum(row["flops"].values()) / 2 / 1e12)
    assert row["byte_s"] == pytest.approx(sum(row["bytes"].values()) / 2 / (r["copy_gbs"] * 1e9))


def test_profile_classes_one_traced_call(capsys):
    """--profile: one more call per mode under a jax.profiler trace (CPU: XLA's host thunks),
    its kernels classed from the HLO: the scans are ssm, the prompt's causal conv is conv, the
    projections gemm; the class times add up to the kernels' and the table follows the rows."""
    assert prefill.main(["--model", NEMOTRON, "--batch", "2", "--prompt-len", "6",
                         "--ssm-mode", "standard", "--iterations", "1", "--profile",
                         "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    p = row["profile"]
    assert list(glob.glob(f"{p['trace_dir']}/**/*.xplane.pb", recursive=True))
    classes = {c["cls"]: c for c in p["classes"]}
    assert {"ssm", "conv", "gemm", "attention", "moe"} <= set(classes)
    assert all(c["ms"] > 0 and c["launches"] > 0 for c in classes.values())
    assert sum(c["ms"] for c in classes.values()) == pytest.approx(p["device_ms"])
    assert sum(c["share"] for c in classes.values()) == pytest.approx(1.0)
    assert p["kernels"] and all(k["cls"] in classes for k in p["kernels"])
    shutil.rmtree(os.path.dirname(p["trace_dir"]))

    assert prefill.main(["--model", NEMOTRON, "--batch", "1", "--prompt-len", "3",
                         "--ssm-mode", "replay", "--iterations", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    assert out.index("| replay |") < out.index("| class | device ms |") < out.index(
        "| kernel | class |")
    assert "| conv |" in out and "| ssm |" in out
    shutil.rmtree(out.split("trace: ")[1].split(" (open")[0].rsplit("/", 1)[0])
