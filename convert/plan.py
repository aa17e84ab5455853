"""What a Hugging Face checkpoint directory holds and how it maps onto our model, checked before
anything is read or written: `plan(hf_dir, dtype=None, mtp=None) -> Plan`.

Shared by `convert` (HF -> orbax) and `load_hf` (HF -> model): both refuse the same things with
the same one-line `ConvertError`s (no directory, no config.json, config errors, malformed
safetensors files or index, missing / misshapen / non-float / unused tensors).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from convert import mappings
from convert.errors import ConvertError, name_list
from convert.safetensors_io import FLOAT_DTYPES, Checkpoint, open_checkpoint
from convert.table import Path, Rule, Table, path_str
from models.config import ConfigError, ModelConfig, load_config
from models.registry import family_for

DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32)}


def model_dtype(dtype) -> np.dtype | None:
    """A model dtype given by name ("bfloat16", "float32") or as a dtype object, as a numpy
    dtype; None stays None (the checkpoint's). ConvertError for anything else (integer weights
    would load as truncated integers; float16 and float64 do not run)."""
    if dtype is None:
        return None
    try:
        dt = DTYPES.get(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in DTYPES.values():
        raise ConvertError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dt


@dataclass(frozen=True)
class Plan:
    hf_dir: str                             # absolute
    cfg: ModelConfig
    model_type: str | None                  # config.json's model_type
    checkpoint: Checkpoint
    mtp: bool                               # the model gets its MTP head
    dtype: np.dtype                         # the model dtype (fp32-kept params stay fp32)
    table: Table
    targets: dict[Path, tuple]              # {param path: (shape, dtype)}
    notes: list[str]
    skipped: dict[str, int]                 # skipped tensors per skipped name prefix

    def read_order(self, rule: Rule) -> tuple:
        """Sort key of a rule: where its first source tensor lies in the files, so that params
        taken in this order read the files mostly sequentially."""
        info = self.checkpoint.tensors[rule.parts[0].src]
        rank = [f.path for f in self.checkpoint.files].index(info.file)
        return rank, info.start, path_str(rule.path)


def _check_tensors(table: Table, ck: Checkpoint, family: str) -> tuple[list[str], dict[str, int]]:
    """Missing, misshapen, non-float and unused tensors -> ConvertError. Returns notes and the
    count of skipped tensors per skipped prefix."""
    tensors = ck.tensors
    missing = [n for n in table.sources if n not in tensors]
    if missing:
        raise ConvertError(f"missing {len(missing)} tensor(s) that the config requires: "
                           f"{name_list(missing)}")
    bad = [(n, s, tensors[n]) for n, s in table.sources.items() if tensors[n].shape != s]
    if bad:
        n, s, info = bad[0]
        more = f" (and {len(bad) - 1} more mismatched tensors)" if len(bad) > 1 else ""
        raise ConvertError(f"shape mismatch for {n}: expected {list(s)} from config.json, found "
                           f"{list(info.shape)} in {os.path.basename(info.file)}{more}")
    nonfloat = [n for n in table.sources if tensors[n].dtype not in FLOAT_DTYPES]
    if nonfloat:
        n = nonfloat[0]
        raise ConvertError(f"tensor {n} has dtype {tensors[n].dtype}; expected one of "
                           f"{', '.join(FLOAT_DTYPES)}")
    skipped: dict[str, int] = {}
    unused = []
    for n in tensors:
        if n in table.sources:
            continue
        prefix = next((p for p in table.skipped if n.startswith(p)), None)
        if prefix is None:
            unused.append(n)
        else:
            skipped[prefix] = skipped.get(prefix, 0) + 1
    if unused:
        raise ConvertError(f"{len(unused)} unused tensor(s) that a {family} model with this config "
                           f"does not have: {name_list(unused)}")
    notes = [f"skipped {k} tensor(s) {p}{'*' if p.endswith('.') else ''}: {table.skipped[p]}"
             for p, k in skipped.items()]
    return notes, skipped


def _default_dtype(ck: Checkpoint) -> np.dtype:
    """bfloat16 when most bytes of the text model's float tensors are 16-bit, else float32."""
    by: dict[str, int] = {}
    for n, info in ck.tensors.items():
        if info.dtype in FLOAT_DTYPES and not n.startswith("model.visual."):
            by[info.dtype] = by.get(info.dtype, 0) + info.nbytes
    top = max(by, key=by.get) if by else "F32"
    return DTYPES["bfloat16" if top in ("BF16", "F16") else "float32"]


def plan(hf_dir, *, dtype=None, mtp: bool | None = None) -> Plan:
    """Check `hf_dir` (config.json + safetensors) against the model its config describes.

    dtype: the model dtype; None = bfloat16 if the checkpoint is mostly 16-bit, else float32.
    mtp: build the MTP head; None = when the checkpoint has `mtp.*` tensors (and, for
        Nemotron-H, the config declares MTP layers); True requires them; False skips them."""
    hf_dir = os.path.abspath(os.fspath(hf_dir))
    if not os.path.isdir(hf_dir):
        raise ConvertError(f"{hf_dir} is not a directory")
    config = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config):
        raise ConvertError(f"no config.json in {hf_dir}")
    try:
        cfg = load_config(config)
    except ConfigError as e:
        raise ConvertError(f"config.json: {e}") from None
    with open(config, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")

    ck = open_checkpoint(hf_dir)
    family = family_for(cfg)
    declared = family.declared_mtp(cfg)
    has_mtp = any(n.startswith("mtp.") for n in ck.tensors)
    notes: list[str] = []
    if mtp is None:
        mtp = has_mtp and (family.name != "nemotron_h" or declared > 0)
        if declared and not has_mtp:
            notes.append(f"config declares {declared} MTP layer(s) but the checkpoint has no "
                         "mtp.* tensors: no MTP head")
    elif mtp and not has_mtp:
        raise ConvertError(f"mtp=True but {hf_dir} has no mtp.* tensors (load it with mtp=False)")
    dtype = _default_dtype(ck) if dtype is None else model_dtype(dtype)
    try:
        table, targets = mappings.build(cfg, set(ck.tensors), dtype, bool(mtp))
    except ValueError as e:
        raise ConvertError(f"unsupported model: {e}") from None
    skip_notes, skipped = _check_tensors(table, ck, cfg.family)
    return Plan(hf_dir, cfg, model_type, ck, bool(mtp), dtype, table, targets,
                notes + table.notes + skip_notes, skipped)
