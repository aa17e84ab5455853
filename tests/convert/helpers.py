"""Shared helpers for the converter tests: fixture copies, variants and reference params."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from convert.safetensors_io import INDEX_NAME
from models.config import load_config
from tests.models.imperative_loader import load_nemotron_h, load_qwen_hybrid, read_safetensors

FIXTURES = "tests/fixtures/hf"
NEMOTRON = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]
QWEN = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]
VARIANTS = NEMOTRON + QWEN


def fixture_dir(variant: str) -> str:
    return os.path.join(FIXTURES, variant)


def tensors_of(variant: str) -> dict[str, np.ndarray]:
    """All tensors of a fixture, as owned arrays."""
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
        save_file(tensors, os.path.join(directory, "model.safetensors"))
    else:
        write_sharded(str(directory), tensors, shards)
    return str(directory)


def write_sharded(directory: str, tensors: dict[str, np.ndarray], num_shards: int) -> None:
    """`tensors` in `num_shards` files of about equal size plus the HF index
    (`model-0000i-of-0000n.safetensors`, `model.safetensors.index.json`)."""
    names = list(tensors)
    total = sum(tensors[n].nbytes for n in names)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    acc = 0
    for n in names:
        shards[min(num_shards - 1, acc * num_shards // max(total, 1))].append(n)
        acc += tensors[n].nbytes
    weight_map = {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, os.path.join(directory, fname))
        weight_map.update({n: fname for n in group})
    with open(os.path.join(directory, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def flat_params(model) -> dict[tuple, np.ndarray]:
    pure = nnx.to_pure_dict(nnx.state(model))
    return {tuple(k.key for k in kp): np.asarray(v)
            for kp, v in jax.tree_util.tree_flatten_with_path(pure)[0]}


def reference_params(variant: str, tensors=None, mtp: bool = False) -> dict[tuple, np.ndarray]:
    """fp32 params from the imperative loaders of tests/models/imperative_loader.py (the oracle)."""
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
