"""Opening a model directory: a Hugging Face checkpoint (config.json + safetensors), loaded
straight into the model through the converter's name tables (`convert.load_hf`), or one that
`replayjax convert` wrote (orbax, `convert.load`). Every problem is a one-line `ConvertError`.

`describe_model` runs the checks that need no weights (config, safetensors headers and name
tables, or the converted checkpoint's records) without importing jax, so commands refuse a broken
directory before any heavy work."""

from __future__ import annotations

import os

from convert import ConvertError, load, load_hf, read_metadata
from convert.converter import META_NAME, PARAMS_DIR


def _kind(path: str) -> str:
    """"converted" or "hf", or ConvertError for anything else."""
    if not os.path.exists(path):
        raise ConvertError(f"model directory {path!r} does not exist")
    if not os.path.isdir(path):
        raise ConvertError(f"{path!r} is not a directory (give the model's directory)")
    try:
        names = os.listdir(path)
    except OSError as e:
        raise ConvertError(f"model directory {path!r}: cannot list it ({e.strerror})") from None
    if META_NAME in names:
        return "converted"
    if "config.json" in names:
        return "hf"
    if not names:
        raise ConvertError(f"model directory {path!r} is empty")
    raise ConvertError(f"{path!r} is neither a Hugging Face checkpoint (config.json + safetensors) "
                       f"nor a converted one ({META_NAME})")


def describe_model(path):
    """(config, whether the model has an MTP head) of the model directory at `path`, after every
    check that reads no weights: a Hugging Face directory's config, safetensors headers and name
    tables (`convert.plan`); a converted one's provenance record, config and params directory.
    Raises ConvertError with a one-line message."""
    path = os.fspath(path)
    if _kind(path) == "hf":
        from convert.plan import plan
        p = plan(path)
        return p.cfg, p.mtp
    from convert.loader import load_config_of
    meta = read_metadata(path)
    cfg = load_config_of(path)
    if not os.path.isdir(os.path.join(path, meta.get("params_dir", PARAMS_DIR))):
        raise ConvertError(f"{path}: damaged checkpoint, no {PARAMS_DIR}/ directory")
    return cfg, bool(meta.get("mtp"))


def load_model(path, *, dtype=None, mesh=None, experts: str = "width"):
    """The NNX model stored at `path` (HF or converted directory), in the checkpoint's dtype
    unless `dtype` is given, placed on `mesh` (None: the first device; a tensor-parallel mesh,
    `models.sharding.make_mesh`: each param laid out and split by the family's rules, every
    device receiving only its shard; `experts` "width" or "experts": how the routed experts
    split, `models.sharding.TPRules`). HF checkpoints get their MTP head when they ship `mtp.*`
    tensors. Raises ConvertError with a one-line message (also for a model the mesh cannot
    split)."""
    path = os.fspath(path)
    if _kind(path) == "converted":
        return load(path, mesh=mesh, dtype=dtype, experts=experts)[1]
    return load_hf(path, dtype=dtype, mesh=mesh, experts=experts)[1]
