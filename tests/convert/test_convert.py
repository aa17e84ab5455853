"""`replayjax convert` on the HF-written fixtures: every family converts, loads and reproduces the
HF prefill logits (atol 1e-4, fp32); the converted params equal the imperative oracle's bitwise;
bf16; sharded input; fused / stacked experts; MTP tensors; --overwrite; --json.

bf16 tolerance: the params are exactly the fp32 params rounded to bf16 (fp32-kept params --
norms, A_log, D, dt_bias, routers -- bitwise equal); the bf16 model's prefill logits vs the HF fp32
reference (logit std ~1) are within mean |d| < 0.03 and max |d| < 0.1 for nemotron_h and mean
|d| < 0.05 for qwen3_5_moe (measured 0.009 / 0.056 and 0.018; the max there is set by bf16 MoE
routing flips, 0.36, so it is not asserted).
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from convert import load, load_hf, read_metadata
from convert.loader import load_config_of
from models.config import load_config
from models.runner import Runner
from replayjax import cli
from tests.convert.helpers import (
    VARIANTS,
    assert_params_equal,
    fixture_dir,
    flat_params,
    leftovers,
    make_checkpoint,
    reference_params,
    tensors_of,
)

ATOL = 1e-4


def run_cli(*args):
    return cli.main(["convert", *map(str, args)])


def prefill_logits(model, ref):
    runner = Runner(model)
    cache = runner.init_cache(6, 64, window=4)
    lens = jnp.asarray(ref["prompt_lens"])
    logits, _ = runner.prefill(cache, jnp.asarray(ref["prompts"]), lens,
                               jnp.asarray([4, 1, 3], jnp.int32))
    return [np.asarray(logits[i, :n]) for i, n in enumerate(np.asarray(lens))]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every fixture converted once (fp32) through the CLI with --json."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for v in VARIANTS:
        assert run_cli(fixture_dir(v), root / v, "--json", "--dtype", "float32") == 0
        out[v] = root / v
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_fixture_converts_loads_and_matches_hf(converted, variant):
    out = converted[variant]
    # + generation_config.json: the source's generator files are carried over verbatim
    assert sorted(os.listdir(out)) == ["config.json", "convert.json", "generation_config.json",
                                       "params"]
    assert (out / "generation_config.json").read_bytes() == \
        open(os.path.join(fixture_dir(variant), "generation_config.json"), "rb").read()
    cfg, model = load(out)
    assert cfg == load_config(fixture_dir(variant))
    assert_params_equal(flat_params(model), reference_params(variant))
    ref = np.load(os.path.join(fixture_dir(variant), "reference.npz"))
    for i, got in enumerate(prefill_logits(model, ref)):
        np.testing.assert_allclose(got, ref["prefill_logits"][i, :len(got)], atol=ATOL)
    meta = read_metadata(out)
    assert meta["converter_version"] and meta["dtype"] == "float32" and meta["mtp"] is False
    src = meta["source"]["files"][0]
    assert src["name"] == "model.safetensors"
    assert src["size"] == os.path.getsize(os.path.join(fixture_dir(variant), "model.safetensors"))
    if variant.startswith("qwen3_5"):
        assert meta["skipped"] == {"model.visual.": 21} and "vision tower" in meta["notes"][0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_direct_load_equals_converted_load(converted, variant):
    """`load_hf` (HF -> model, no orbax) and `load` of the converted checkpoint: same config,
    bitwise the same params."""
    cfg, direct = load_hf(fixture_dir(variant), dtype=jnp.float32)
    ccfg, restored = load(converted[variant])
    assert cfg == ccfg
    assert_params_equal(flat_params(direct), flat_params(restored))


def test_json_summary_and_quiet(tmp_path, capsys):
    assert run_cli(fixture_dir("qwen3_5"), tmp_path / "o", "--json") == 0
    captured = capsys.readouterr()
    assert captured.err == ""                      # no progress bar, no notes
    s = json.loads(captured.out)
    assert s["ok"] and s["family"] == "qwen3_5" and s["tensors"] == 56 and s["params"] == 47
    assert s["skipped"] == {"model.visual.": 21} and s["dtype"] == "float32"   # F32 fixture
    assert s["peak_rss_mb"] >= s["rss_before_mb"] > 0


@pytest.mark.parametrize("variant", ["nemotron_h", "qwen3_5_moe"])
def test_bfloat16(converted, tmp_path, variant):
    assert run_cli(fixture_dir(variant), tmp_path / "bf16", "--json", "--dtype", "bfloat16") == 0
    cfg, model = load(tmp_path / "bf16")
    got = flat_params(model)
    for k, want in reference_params(variant).items():
        if got[k].dtype == np.float32:             # kept in fp32 by the model
            np.testing.assert_array_equal(got[k], want, err_msg=str(k))
        else:
            assert got[k].dtype == ml_dtypes.bfloat16, k
            np.testing.assert_array_equal(got[k], want.astype(ml_dtypes.bfloat16), err_msg=str(k))
    # casting at load time (fp32 checkpoint, dtype=bf16) gives the same params, directly too
    _, cast = load(converted[variant], dtype=jnp.bfloat16)
    assert_params_equal(flat_params(cast), got)
    assert_params_equal(flat_params(load_hf(fixture_dir(variant), dtype=jnp.bfloat16)[1]), got)
    ref = np.load(os.path.join(fixture_dir(variant), "reference.npz"))
    d = np.concatenate([np.abs(g - ref["prefill_logits"][i, :len(g)]).ravel()
                        for i, g in enumerate(prefill_logits(model, ref))])
    # bf16 flips MoE routing near ties at a few positions (logit diffs ~1 there), so the
    # median: a broken bf16 path is off by ~1 everywhere (logits of std ~1)
    assert np.median(d) < 0.05, np.median(d)


def test_sharded_input(converted, tmp_path):
    v = "nemotron_h_latent_moe"
    src = make_checkpoint(tmp_path / "hf", v, shards=3)
    assert sorted(os.listdir(src)) == ["config.json", "model-00001-of-00003.safetensors",
                                       "model-00002-of-00003.safetensors",
                                       "model-00003-of-00003.safetensors",
                                       "model.safetensors.index.json"]
    assert run_cli(src, tmp_path / "out", "--json", "--sha256") == 0
    _, model = load(tmp_path / "out")
    _, single = load(converted[v])
    assert_params_equal(flat_params(model), flat_params(single))
    meta = read_metadata(tmp_path / "out")
    assert len(meta["source"]["files"]) == 3 and all(len(f["sha256"]) == 64
                                                    for f in meta["source"]["files"])
    assert "model.safetensors.index.json" in meta["source"]["sha256"]


def test_fused_gate_up_experts_qwen(converted, tmp_path):
    """Qwen3.5-MoE with fused experts (`experts.gate_up_proj` [E, 2F, D] gate rows first,
    `experts.down_proj` [E, D, F]) built from the per-expert fixture."""
    v = "qwen3_5_moe"
    t = tensors_of(v)
    cfg = load_config(fixture_dir(v))
    E = cfg.num_experts
    fused = {}
    for name, a in t.items():
        if ".mlp.experts." in name:
            continue
        fused[name] = a
        if name.endswith(".mlp.gate.weight"):
            p = name[:-len("gate.weight")] + "experts."
            g = [t[f"{p}{e}.gate_proj.weight"] for e in range(E)]
            u = [t[f"{p}{e}.up_proj.weight"] for e in range(E)]
            fused[f"{p}gate_up_proj"] = np.stack([np.concatenate([a, b]) for a, b in zip(g, u)])
            fused[f"{p}down_proj"] = np.stack([t[f"{p}{e}.down_proj.weight"] for e in range(E)])
    src = make_checkpoint(tmp_path / "hf", v, fused)
    assert run_cli(src, tmp_path / "out", "--json") == 0
    _, model = load(tmp_path / "out")
    _, per_expert = load(converted[v])
    assert_params_equal(flat_params(model), flat_params(per_expert))


def test_stacked_experts_nemotron(converted, tmp_path):
    """Nemotron-H has no gate projection, so HF's fused layout is its in-memory stacking
    (`mixer.experts.up_proj` [E, F, D], `mixer.experts.down_proj` [E, D, F]); accepted too."""
    v = "nemotron_h"
    t = tensors_of(v)
    E = load_config(fixture_dir(v)).n_routed_experts
    stacked = {}
    for name, a in t.items():
        if ".mixer.experts." in name:
            continue
        stacked[name] = a
        if name.endswith(".mixer.gate.weight"):
            p = name[:-len("gate.weight")] + "experts."
            for proj in ("up_proj", "down_proj"):
                stacked[f"{p}{proj}"] = np.stack([t[f"{p}{e}.{proj}.weight"] for e in range(E)])
    src = make_checkpoint(tmp_path / "hf", v, stacked)
    assert run_cli(src, tmp_path / "out", "--json") == 0
    _, model = load(tmp_path / "out")
    _, ref = load(converted[v])
    assert_params_equal(flat_params(model), flat_params(ref))


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _nemotron_mtp_tensors(v):
    """mtp.layers.{i}.* as Nemotron-3 checkpoints ship them, for the fixture's mtp pattern
    (attention, moe):
    the body's tensors of a layer of the same kind renamed, plus enorm / hnorm / eh_proj on
    layer 0 and final_layernorm on the last, all random."""
    t, cfg, rng = tensors_of(v), load_config(fixture_dir(v)), np.random.default_rng(0)
    D = cfg.hidden_size
    out = dict(t)
    for i, kind in enumerate(cfg.mtp_layer_kinds):
        body = f"backbone.layers.{cfg.layer_kinds.index(kind)}."
        for name, a in t.items():
            if name.startswith(body):
                out[f"mtp.layers.{i}." + name[len(body):]] = _rand(rng, a.shape)
    out["mtp.layers.0.enorm.weight"] = _rand(rng, (D,))
    out["mtp.layers.0.hnorm.weight"] = _rand(rng, (D,))
    out["mtp.layers.0.eh_proj.weight"] = _rand(rng, (D, 2 * D))
    out[f"mtp.layers.{len(cfg.mtp_layer_kinds) - 1}.final_layernorm.weight"] = _rand(rng, (D,))
    return out


def _qwen_mtp_tensors(v):
    """mtp.* as Qwen3-Next / Qwen3.5 checkpoints ship them: fc, three norms and one
    full-attention layer named like the body's attention layer (with its FFN), all random."""
    t, cfg, rng = tensors_of(v), load_config(fixture_dir(v)), np.random.default_rng(0)
    D = cfg.hidden_size
    body = f"{cfg.weight_prefix}layers.{cfg.layer_kinds.index('attention')}."
    out = dict(t)
    for name, a in t.items():
        if name.startswith(body):
            out["mtp.layers.0." + name[len(body):]] = _rand(rng, a.shape)
    out["mtp.fc.weight"] = _rand(rng, (D, 2 * D))
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = _rand(rng, (D,))
    return out


@pytest.mark.parametrize("variant,make", [("nemotron_h", _nemotron_mtp_tensors),
                                          ("qwen3_next", _qwen_mtp_tensors)])
def test_mtp_weights_converted_when_present(tmp_path, variant, make):
    tensors = make(variant)
    src = make_checkpoint(tmp_path / "hf", variant, tensors)
    assert run_cli(src, tmp_path / "out", "--json") == 0
    assert read_metadata(tmp_path / "out")["mtp"] is True
    _, model = load(tmp_path / "out")
    got = flat_params(model)
    assert any(k[0] == "mtp" for k in got)
    assert_params_equal(got, reference_params(variant, tensors, mtp=True))


def test_overwrite(converted, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert run_cli(fixture_dir("nemotron_h_p80"), out, "--json") == 1
    assert "already exists (use --overwrite" in capsys.readouterr().err
    assert os.listdir(out) == ["keep.txt"]                      # untouched
    # --overwrite replaces an earlier output or an empty directory, never other files
    assert run_cli(fixture_dir("nemotron_h_p80"), out, "--json", "--overwrite") == 1
    assert "is not a converted checkpoint (no convert.json)" in capsys.readouterr().err
    assert os.listdir(out) == ["keep.txt"]
    os.remove(out / "keep.txt")
    assert run_cli(fixture_dir("nemotron_h_p80"), out, "--json", "--overwrite") == 0
    assert sorted(os.listdir(out)) == ["config.json", "convert.json", "generation_config.json",
                                       "params"]
    assert leftovers(tmp_path) == ["out"]
    _, model = load(out)
    assert_params_equal(flat_params(model), reference_params("nemotron_h_p80"))
    # replacing a converted checkpoint with another model
    assert run_cli(fixture_dir("qwen3_5"), out, "--json", "--overwrite") == 0
    assert load_config_of(out).family == "qwen3_5" and leftovers(tmp_path) == ["out"]


def test_load_with_mesh_and_partition(converted):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    seen = []

    def partition(path, shape):
        seen.append(path)
        return P(None, "tp") if path == ("lm_head", "kernel") else P()

    _, model = load(converted["nemotron_h"], mesh=mesh, partition=partition)
    k = model.lm_head.kernel[...]
    assert isinstance(k.sharding, NamedSharding) and k.sharding.spec == P(None, "tp")
    assert ("layers", 0, "mixer", "in_proj", "kernel") in seen
    assert model.embeddings[...].sharding.spec == P()


def test_tied_embeddings_skip_lm_head(tmp_path):
    """A tied Qwen3.5 config with an lm_head.weight in the checkpoint: converted without a head
    (the model uses embed_tokens), the tensor skipped with a note."""
    v = "qwen3_5"
    cfg = json.load(open(os.path.join(fixture_dir(v), "config.json")))
    cfg["tie_word_embeddings"] = cfg["text_config"]["tie_word_embeddings"] = True
    src = make_checkpoint(tmp_path / "hf", v, config=cfg)
    assert run_cli(src, tmp_path / "out", "--json") == 0
    meta = read_metadata(tmp_path / "out")
    assert meta["skipped"] == {"model.visual.": 21, "lm_head.weight": 1}
    assert any("tied word embeddings" in n for n in meta["notes"])
    _, model = load(tmp_path / "out")
    assert model.lm_head is None


def test_tied_nemotron_head_is_the_embedding(tmp_path):
    """A tied Nemotron-H config: its lm_head.weight in the checkpoint is skipped, and without
    one the checkpoint still loads; the logits are the hidden states against the embeddings,
    as an untied model whose head is the embeddings' transpose gives them."""
    v = "nemotron_h"
    cfg = dict(json.load(open(os.path.join(fixture_dir(v), "config.json"))),
               tie_word_embeddings=True)
    with_head = make_checkpoint(tmp_path / "with", v, config=cfg)
    tensors = {k: a for k, a in tensors_of(v).items() if k != "lm_head.weight"}
    without = make_checkpoint(tmp_path / "without", v, tensors=tensors, config=cfg)
    _, untied = load_hf(make_checkpoint(tmp_path / "untied", v, tensors=dict(
        tensors, **{"lm_head.weight": tensors["backbone.embeddings.weight"]})))
    hidden = jax.random.normal(jax.random.key(0), (3, untied.cfg.hidden_size))
    want = np.asarray(untied.local_logits(hidden))
    for d in (with_head, without):
        _, model = load_hf(d)
        assert model.lm_head is None
        np.testing.assert_allclose(np.asarray(model.local_logits(hidden)), want, rtol=1e-6)


def test_progress_line_without_tqdm():
    import io

    from convert.progress import Progress
    buf = io.StringIO()
    p = Progress({"a": 100, "b": 50}, enabled=True, stream=buf)
    p._bar = None                                  # the plain line even if tqdm is installed
    p.update("a", 60)
    p.update("a", 40)
    p.update("b", 50)
    p.close()
    last = buf.getvalue().rstrip("\n").split("\r")[-1]
    assert "2/2 tensors" in last and "150 B / 150 B" in last
    quiet = io.StringIO()
    q = Progress({"a": 10}, enabled=False, stream=quiet)
    q.update("a", 10)
    q.close()
    assert quiet.getvalue() == "" and q.tensors == 1 and q.bytes == 10
