"""Shared helpers for the converter tests: fixture copies, variants and reference params."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
from flax import nnx

from convert.safetensors_io import write_safetensors, write_sharded
from models.config import load_config
from models.weights import load_nemotron_h, load_qwen_hybrid, read_safetensors

FIXTURES = "tests/fixtures/hf"
NEMOTRON = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]
QWEN = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]
VARIANTS = NEMOTRON + QWEN


def fixture_dir(variant: str) -> str:
    return os.path.join(FIXTURES, variant)


def tensors_of(variant: str) -> dict[str, np.ndarray]:
    """All tensors of a fixture, as owned arrays, in file order."""
    return {k: np.array(v) for k, v in read_safetensors(fixture_dir(variant)).items()}


def make_checkpoint(directory, variant: str, tensors=None, shards: int = 1, config=None) -> str:
    """A checkpoint dir with the fixture's config (or `config`) and `tensors` (default: the
    fixture's) as one file or `shards` files + index."""
    os.makedirs(directory, exist_ok=True)
    if config is None:
        shutil.copy(os.path.join(fixture_dir(variant), "config.json"), directory)
    else:
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f)
    tensors = tensors_of(variant) if tensors is None else tensors
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    else:
        write_sharded(str(directory), tensors, shards)
    return str(directory)


def flat_params(model) -> dict[tuple, np.ndarray]:
    pure = nnx.to_pure_dict(nnx.state(model))
    return {tuple(k.key for k in kp): np.asarray(v)
            for kp, v in jax.tree_util.tree_flatten_with_path(pure)[0]}


def reference_params(variant: str, tensors=None, mtp: bool = False) -> dict[tuple, np.ndarray]:
    """fp32 params from the imperative loaders in models.weights (the reference mapping)."""
    from models.nemotron_h import NemotronH
    from models.qwen import QwenHybrid
    cfg = load_config(fixture_dir(variant))
    tensors = read_safetensors(fixture_dir(variant)) if tensors is None else tensors
    kw = {"mtp": True} if mtp else {}
    if variant.startswith("nemotron"):
        model = load_nemotron_h(NemotronH(cfg, **kw), tensors)
    else:
        model = load_qwen_hybrid(QwenHybrid(cfg, **kw), tensors)
    return flat_params(model)


def assert_params_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for k in want:
        assert got[k].dtype == want[k].dtype, (k, got[k].dtype, want[k].dtype)
        np.testing.assert_array_equal(got[k], want[k], err_msg=str(k))


def leftovers(parent) -> list[str]:
    """Entries in `parent` (the output's parent directory), e.g. temp dirs."""
    return sorted(os.listdir(parent))
