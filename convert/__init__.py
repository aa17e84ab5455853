"""Hugging Face safetensors -> orbax checkpoints, streaming (`replayjax convert`), and loading.

    from convert import convert, load
    summary = convert("hf/Nemotron-H-8B", "ckpt/nemotron-h-8b", dtype="bfloat16")
    cfg, model = load("ckpt/nemotron-h-8b", mesh=None, dtype=None)   # NNX model, params restored

Modules: `safetensors_io` (validated headers, block reads, writers for tests), `table` (the rule
types and their streaming execution), `mappings` (one declarative name table per family),
`writer` (orbax save that produces each param block by block), `converter` (checks, temp dir,
atomic rename, provenance), `loader` (restore with sharding targets), `cli`.
"""

from convert.converter import CONVERTER_VERSION, convert
from convert.errors import ConvertError
from convert.loader import load, read_metadata

__version__ = CONVERTER_VERSION
__all__ = ["convert", "load", "read_metadata", "ConvertError", "CONVERTER_VERSION"]
