"""Loading Hugging Face directories straight into the model (`convert.load_hf`, and
`replayjax.loading.load_model` for generate / bench / profile): the name tables give the imperative
oracle's params bitwise for every fixture; HF layouts only the tables know (stacked Nemotron
experts, fused Qwen experts, text weights under `model.language_model.`) load; one-device mesh
placement; every broken directory is one line naming what is wrong, from `load_model` and from
`replayjax generate`."""

import json
import os
import re

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from convert import ConvertError, convert, load_hf
from models.config import load_config
from replayjax import generate_cli
from replayjax.loading import load_model
from tests.convert.helpers import (
    FIXTURES,
    assert_params_equal,
    fixture_dir,
    flat_params,
    make_checkpoint,
    reference_params,
    tensors_of,
)

ALL_FIXTURES = sorted(d for d in os.listdir(FIXTURES) if os.path.isdir(os.path.join(FIXTURES, d)))


@pytest.mark.parametrize("variant", ALL_FIXTURES)
def test_tables_match_the_imperative_oracle(variant):
    cfg, model = load_hf(fixture_dir(variant))
    assert cfg == load_config(fixture_dir(variant))
    assert_params_equal(flat_params(model), reference_params(variant))


def test_default_dtype_is_the_checkpoints(tmp_path):
    """bf16 safetensors load as a bf16 model (params the model keeps in fp32 stay fp32), as
    `convert` chooses; dtype= overrides it."""
    v = "nemotron_h_p80"
    src = make_checkpoint(tmp_path / "hf", v, {k: a.astype(ml_dtypes.bfloat16)
                                              for k, a in tensors_of(v).items()})
    got = flat_params(load_model(src))
    assert got[("embeddings",)].dtype == ml_dtypes.bfloat16
    assert got[("layers", 0, "mixer", "A_log")].dtype == np.float32
    assert flat_params(load_model(src, dtype=np.float32))[("embeddings",)].dtype == np.float32


def _stacked_nemotron(t, cfg):
    """HF 5.x in-memory expert layout: mixer.experts.{up,down}_proj [E, ...]."""
    out = {}
    for name, a in t.items():
        if ".mixer.experts." in name:
            continue
        out[name] = a
        if name.endswith(".mixer.gate.weight"):
            p = name[:-len("gate.weight")] + "experts."
            for proj in ("up_proj", "down_proj"):
                out[f"{p}{proj}"] = np.stack([t[f"{p}{e}.{proj}.weight"]
                                              for e in range(cfg.n_routed_experts)])
    return out


def _fused_qwen(t, cfg):
    """Qwen3.5-MoE release layout: experts.gate_up_proj [E, 2F, D] (gate rows first)."""
    out = {}
    for name, a in t.items():
        if ".mlp.experts." in name:
            continue
        out[name] = a
        if name.endswith(".mlp.gate.weight"):
            p = name[:-len("gate.weight")] + "experts."
            E = range(cfg.num_experts)
            out[f"{p}gate_up_proj"] = np.stack([np.concatenate(
                [t[f"{p}{e}.gate_proj.weight"], t[f"{p}{e}.up_proj.weight"]]) for e in E])
            out[f"{p}down_proj"] = np.stack([t[f"{p}{e}.down_proj.weight"] for e in E])
    return out


@pytest.mark.parametrize("variant,layout", [("nemotron_h", _stacked_nemotron),
                                            ("qwen3_5_moe", _fused_qwen)])
def test_generate_path_loads_stacked_and_fused_experts(tmp_path, variant, layout):
    t = layout(tensors_of(variant), load_config(fixture_dir(variant)))
    model = load_model(make_checkpoint(tmp_path / "hf", variant, t))
    assert_params_equal(flat_params(model), reference_params(variant))


def test_generate_path_loads_text_weights_under_language_model(tmp_path):
    """A text-only Qwen3.5 config (`qwen3_5_text`, prefix `model.`) whose tensors kept the
    multimodal `model.language_model.` prefix (and its vision tower, skipped)."""
    v = "qwen3_5"
    with open(os.path.join(fixture_dir(v), "config.json")) as f:
        text = json.load(f)["text_config"]
    src = make_checkpoint(tmp_path / "hf", v, config=text)
    assert load_config(src).weight_prefix == "model."
    assert any(n.startswith("model.visual.") for n in tensors_of(v))
    assert_params_equal(flat_params(load_model(src, dtype=np.float32)), reference_params(v))


def test_one_device_mesh_and_partition():
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    seen = []

    def partition(path, shape):
        seen.append(path)
        return P(None, "tp") if path == ("lm_head", "kernel") else P()

    _, model = load_hf(fixture_dir("nemotron_h"), mesh=mesh, partition=partition)
    k = model.lm_head.kernel[...]
    assert isinstance(k.sharding, NamedSharding) and k.sharding.spec == P(None, "tp")
    assert k.sharding.mesh.devices.tolist() == mesh.devices.tolist()
    assert model.embeddings[...].sharding.spec == P()
    assert ("layers", 0, "mixer", "in_proj", "kernel") in seen
    assert_params_equal(flat_params(model), reference_params("nemotron_h"))


# ----------------------------------------------------------------------------- broken directories

def _hf(tmp_path):
    return make_checkpoint(tmp_path / "hf", "nemotron_h_p80")


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)
    return path


def _random_bytes(tmp_path):
    d = _hf(tmp_path)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(np.random.default_rng(0).bytes(5000))
    return d


def _header_cut_mid_json(tmp_path):
    d = _hf(tmp_path)
    path = os.path.join(d, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    _truncate(path, 8 + n // 2)
    return d


def _data_truncated(tmp_path):
    d = _hf(tmp_path)
    path = os.path.join(d, "model.safetensors")
    _truncate(path, os.path.getsize(path) - 100)
    return d


def _empty_file(tmp_path):
    d = _hf(tmp_path)
    _truncate(os.path.join(d, "model.safetensors"), 0)
    return d


def _no_weights(tmp_path):
    d = _hf(tmp_path)
    os.remove(os.path.join(d, "model.safetensors"))
    return d


def _weights_a_directory(tmp_path):
    d = _no_weights(tmp_path)
    os.mkdir(os.path.join(d, "model.safetensors"))
    return d


def _bad_config(tmp_path):
    d = _hf(tmp_path)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write("{not json")
    return d


def _missing_tensor(tmp_path):
    t = tensors_of("nemotron_h_p80")
    del t["lm_head.weight"]
    return make_checkpoint(tmp_path / "hf", "nemotron_h_p80", t)


def _nan_weight(tmp_path):
    t = tensors_of("nemotron_h_p80")
    w = t["backbone.layers.0.mixer.in_proj.weight"].copy()
    w.flat[7] = np.nan
    t["backbone.layers.0.mixer.in_proj.weight"] = w
    return make_checkpoint(tmp_path / "hf", "nemotron_h_p80", t)


def _params_garbage(tmp_path):
    """The largest array file's bytes replaced by random ones of the same length: uncompressed
    float32 chunks read as numbers, some of them NaN."""
    out = _converted(tmp_path)
    data = os.path.join(out, "params", "ocdbt.process_0", "d")
    largest = max((os.path.join(data, n) for n in os.listdir(data)), key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.write(np.full(os.path.getsize(largest) // 4, np.nan, np.float32).tobytes())
    return out


def _converted(tmp_path):
    out = str(tmp_path / "out")
    convert(fixture_dir("nemotron_h_p80"), out)
    return out


def _params_truncated(tmp_path):
    """The largest data file of a converted checkpoint cut in half."""
    out = _converted(tmp_path)
    files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(out, "params")) for n in ns]
    largest = max(files, key=os.path.getsize)
    _truncate(largest, os.path.getsize(largest) // 2)
    return out


def _params_all_truncated(tmp_path):
    """Every array data file (the process's, not the index's) cut in half: every array's read
    fails (asyncio would log each one's traceback at shutdown)."""
    out = _converted(tmp_path)
    data = os.path.join(out, "params", "ocdbt.process_0", "d")
    for n in os.listdir(data):
        _truncate(os.path.join(data, n), os.path.getsize(os.path.join(data, n)) // 2)
    return out


def _params_manifest_truncated(tmp_path):
    out = _converted(tmp_path)
    _truncate(os.path.join(out, "params", "manifest.ocdbt"), 10)
    return out


def _meta_dtype_unknown(tmp_path):
    """convert.json edited by hand: a dtype that no converter writes."""
    out = _converted(tmp_path)
    path = os.path.join(out, "convert.json")
    with open(path) as f:
        meta = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(meta, dtype="float16"), f)
    return out


def _empty_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    return str(tmp_path / "empty")


def _neither(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "weights.bin").write_bytes(b"\0" * 16)
    return str(tmp_path / "other")


BROKEN = {   # directory maker -> what the one-line message must say
    "missing dir": (lambda p: str(p / "nope"), "model directory '.*/nope' does not exist"),
    "empty dir": (_empty_dir, "model directory '.*/empty' is empty"),
    "neither format": (_neither, "/other' is neither a Hugging Face checkpoint"),
    "random bytes": (_random_bytes, r"model.safetensors \(5000 bytes\): not a safetensors file"),
    "header cut mid-JSON": (_header_cut_mid_json,
                            r"model.safetensors \(\d+ bytes\): truncated or corrupt: the header "
                            "length does not fit"),
    "data truncated": (_data_truncated, r"model.safetensors \(\d+ bytes\): truncated or corrupt: "
                                        "the tensors in its header"),
    "empty file": (_empty_file, r"model.safetensors \(0 bytes\): truncated"),
    "no safetensors": (_no_weights, "no model.safetensors or model.safetensors.index.json in"),
    "weights a directory": (_weights_a_directory, r"model.safetensors in .* is not a file$"),
    "bad config": (_bad_config, "config.json: .*config.json is not valid JSON"),
    "missing tensor": (_missing_tensor, "missing 1 tensor.* requires: lm_head.weight$"),
    "NaN weight": (_nan_weight, r"param layers/0/mixer/in_proj/kernel has NaN or infinite "
                                r"values \(1 param\(s\) in all\): a damaged or broken checkpoint$"),
    "params garbage": (_params_garbage, r"/out: param .* has NaN or infinite values"),
    "params truncated": (_params_truncated, r"/out: damaged checkpoint, cannot restore its "
                                            r"params: OUT_OF_RANGE: Error reading \""),
    "params all truncated": (_params_all_truncated, r"/out: damaged checkpoint, cannot restore "
                                                    r"its params: OUT_OF_RANGE: Error reading"),
    "convert.json dtype unknown": (_meta_dtype_unknown, r"/out/convert.json: field 'dtype' must "
                                                        r"be one of bfloat16, float32, got "
                                                        r"'float16'$"),
    "params manifest truncated": (_params_manifest_truncated,
                                  "/out: damaged checkpoint, orbax cannot read the metadata"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_directory_is_one_line(tmp_path, capsys, caplog, case):
    make, pattern = BROKEN[case]
    d = make(tmp_path)
    with pytest.raises(ConvertError, match=pattern) as raised:
        load_model(d)
    assert "\n" not in str(raised.value)
    capsys.readouterr()
    assert generate_cli.main(["--model", d, "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err          # nothing else: no traceback, no orbax log lines
    # (which of a damaged checkpoint's failing reads is named can differ between loads)
    assert err.startswith("replayjax generate: error: --model: ") and err.count("\n") == 1, err
    assert re.search(pattern, err), err
    # (pytest takes log records off stderr: asyncio's are looked for here)
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text[:500]


def test_without_a_mesh_params_sit_on_the_default_device_like_a_fresh_cache():
    """A jitted step over (params, cache) must see one sharding for both, or it compiles again
    once the cache it returns (on the params' sharding) comes back."""
    _, model = load_hf(fixture_dir("qwen3_5"))
    cache = model.init_cache(3, 8)
    want = cache.counts.sharding
    assert all(leaf.sharding == want for leaf in jax.tree.leaves(nnx.state(model)))
