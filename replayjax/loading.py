"""Opening a model directory: a Hugging Face checkpoint (config.json + safetensors), loaded
straight into the model through the converter's name tables (`convert.load_hf`), or one that
`replayjax convert` wrote (orbax, `convert.load`). Every problem is a one-line `ConvertError`."""

from __future__ import annotations

import os

from convert import ConvertError, load, load_hf
from convert.converter import META_NAME


def load_model(path, *, dtype=None, mesh=None):
    """The NNX model stored at `path` (HF or converted directory), in the checkpoint's dtype
    unless `dtype` is given, placed on `mesh` (None: the first device; a tensor-parallel mesh,
    `models.sharding.make_mesh`: each param laid out and split by the family's rules, every
    device receiving only its shard). HF checkpoints get their MTP head when they ship `mtp.*`
    tensors. Raises ConvertError with a one-line message (also for a model the mesh cannot
    split)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ConvertError(f"model directory {path!r} does not exist")
    names = os.listdir(path)
    if META_NAME in names:
        return load(path, mesh=mesh, dtype=dtype)[1]
    if "config.json" in names:
        return load_hf(path, dtype=dtype, mesh=mesh)[1]
    if not names:
        raise ConvertError(f"model directory {path!r} is empty")
    raise ConvertError(f"{path!r} is neither a Hugging Face checkpoint (config.json + safetensors) "
                       f"nor a converted one ({META_NAME})")
