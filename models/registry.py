"""The model families: which config class goes with which model class, and how many MTP layers
a config declares. Loading (`replayjax.loading`), the converter's name tables (`convert.mappings`,
keyed by `Family.name`) and the benchmarks look families up here.

    fam = family_for(cfg)                  # Family("nemotron_h" | "qwen_hybrid", ...)
    model = model_class(cfg)(cfg, dtype=jnp.bfloat16, mtp=fam.declared_mtp(cfg) > 0)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from models.config import ModelConfig, NemotronHConfig, QwenHybridConfig


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    model_path: str                               # "module:Class", imported on first use (jax)
    declared_mtp: Callable[[ModelConfig], int]    # cfg -> MTP layers the config declares

    def model_class(self) -> type:
        module, _, cls = self.model_path.partition(":")
        return getattr(importlib.import_module(module), cls)


FAMILIES = {f.name: f for f in (
    Family("nemotron_h", NemotronHConfig, "models.nemotron_h:NemotronH",
           lambda c: len(c.mtp_layer_kinds) if c.num_mtp_layers else 0),
    Family("qwen_hybrid", QwenHybridConfig, "models.qwen:QwenHybrid",
           lambda c: c.num_mtp_layers),
)}


def family_for(cfg: ModelConfig) -> Family:
    """The family of a parsed config; ValueError for a config class no family has."""
    for f in FAMILIES.values():
        if isinstance(cfg, f.config_class):
            return f
    raise ValueError(f"no model family for {type(cfg).__name__}")


def model_class(cfg: ModelConfig) -> type:
    """The NNX model class for `cfg`: call it as `cls(cfg, dtype=..., mtp=...)`."""
    return family_for(cfg).model_class()
