"""Hugging Face safetensors -> our models: streamed into an orbax checkpoint (`replayjax convert`)
or straight into the model, through one set of name tables.

    from convert import convert, load, load_hf
    summary = convert("hf/Nemotron-H-8B", "ckpt/nemotron-h-8b", dtype="bfloat16")
    cfg, model = load("ckpt/nemotron-h-8b", mesh=None, dtype=None)   # NNX model, params restored
    cfg, model = load_hf("hf/Nemotron-H-8B", dtype=None, mtp=None, mesh=None)   # no orbax

Modules: `safetensors_io` (headers validated by the `safetensors` package, block reads), `table`
(the rule types and their streaming execution), `mappings` (one declarative name table per
family), `plan` (the checks shared by converting and loading), `writer` (orbax save that produces
each param block by block), `converter` (temp dir, atomic rename, provenance), `loader` (restore
with sharding targets; direct HF loading). The command line is `replayjax convert`
(`replayjax.convert_cli`).
"""

from convert.converter import CONVERTER_VERSION, convert
from convert.errors import ConvertError
from convert.loader import load, load_hf, read_metadata

__version__ = CONVERTER_VERSION
__all__ = ["convert", "load", "load_hf", "read_metadata", "ConvertError", "CONVERTER_VERSION"]
