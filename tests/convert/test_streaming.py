"""Streaming: bf16 sources read without torch, params split into many chunks along either axis,
and the converter's own allocations bounded by the block size rather than the largest tensor
(tracemalloc; process RSS is measured by scripts/bench_convert.py)."""

import json
import os
import tracemalloc

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from convert import load, mappings, read_metadata
from convert.converter import convert
from convert.safetensors_io import open_checkpoint
from convert.table import chunk_shape
from models.config import load_config
from tests.convert.helpers import (
    assert_params_equal,
    fixture_dir,
    flat_params,
    make_checkpoint,
    reference_params,
    tensors_of,
)

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_bf16_source_checkpoint(tmp_path):
    """A BF16 safetensors file (as hub releases ship) converts by default to bfloat16; params
    the model keeps in fp32 are the bf16 values widened."""
    v = "qwen3_next"
    t = {k: a.astype(BF16) for k, a in tensors_of(v).items()}
    src = make_checkpoint(tmp_path / "hf", v, t)
    assert {i.dtype for i in open_checkpoint(src).tensors.values()} == {"BF16"}
    s = convert(src, tmp_path / "out")
    assert s["dtype"] == "bfloat16" and s["bytes_read"] == sum(a.nbytes for a in t.values())
    _, model = load(tmp_path / "out")
    want = reference_params(v, {k: a.astype(np.float32) for k, a in t.items()})
    got = flat_params(model)
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w.astype(got[k].dtype), err_msg=str(k))
    # and to fp32 on request: exact widening
    convert(src, tmp_path / "out32", dtype="float32")
    _, m32 = load(tmp_path / "out32")
    assert_params_equal(flat_params(m32), want)


def test_many_small_chunks(tmp_path):
    """block_bytes = 300: every param is written as many chunks (axis 1 for transposed linears,
    axis 0 otherwise, one expert per chunk), and the result is unchanged."""
    v = "nemotron_h_latent_moe"
    convert(fixture_dir(v), tmp_path / "out", block_bytes=300)
    _, model = load(tmp_path / "out")
    assert_params_equal(flat_params(model), reference_params(v))
    cfg = load_config(fixture_dir(v))
    table, targets = mappings.build(cfg, set(open_checkpoint(fixture_dir(v)).tensors),
                                    jnp.float32, False)
    chunks = {r.op: (chunk_shape(r, *targets[r.path], 300), targets[r.path][0])
              for r in table.rules}
    (c, shape) = chunks["T"]                       # kernels: split along axis 1 only
    assert c[0] == shape[0] and c[1] < shape[1]
    (c, shape) = chunks["stack_T"]                 # experts: one per chunk here
    assert c[0] == 1 and c[1:] == shape[1:]


def test_allocations_bounded_by_block_not_tensor(tmp_path):
    """Embedding and lm_head of 32 MB each (vocab 262144 x hidden 32, fp32), written with 1 MB
    blocks: the converter's numpy allocations peak at a few blocks (2.5 MB measured), far below
    one tensor."""
    v = "nemotron_h"
    cfg = json.load(open(os.path.join(fixture_dir(v), "config.json")))
    V = 262144
    cfg["vocab_size"] = V
    t = tensors_of(v)
    rng = np.random.default_rng(0)
    for name in ("backbone.embeddings.weight", "lm_head.weight"):
        t[name] = rng.standard_normal((V, 32), dtype=np.float32)
    src = make_checkpoint(tmp_path / "hf", v, t, config=cfg)
    largest = V * 32 * 4
    del t
    convert(fixture_dir("nemotron_h_p80"), tmp_path / "warmup")   # imports, caches
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        s = convert(src, tmp_path / "out", block_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s["largest_tensor_bytes"] == largest
    print(f"peak numpy/python allocations {(peak - base) / 1e6:.1f} MB")
    assert peak - base < largest / 4, (peak - base, largest)
    assert read_metadata(tmp_path / "out")["stats"]["bytes_read"] == s["bytes_read"]
    _, model = load(tmp_path / "out")
    rng = np.random.default_rng(0)
    emb, head = (rng.standard_normal((V, 32), dtype=np.float32) for _ in range(2))
    np.testing.assert_array_equal(np.asarray(model.embeddings[...]), emb)
    np.testing.assert_array_equal(np.asarray(model.lm_head.kernel[...]), head.T)
