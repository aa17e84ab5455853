"""What the server reads from a model directory besides the weights: the tokenizer
(tokenizer.json), the end-of-sequence ids and the default sampling settings
(generation_config.json, else config.json). Problems are a one-line `ModelFilesError`."""

from __future__ import annotations

import json
import os

from replayjax.commandline import UserError
from replayjax.sampling import SamplingParams


class ModelFilesError(UserError, ValueError):
    """A model directory file the server cannot use (message: the file and why)."""


def load_tokenizer(model_dir: str):
    """MODEL/tokenizer.json as a `tokenizers.Tokenizer`."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ModelFilesError(f"{path} does not exist; the server needs the model's tokenizer "
                              f"to read text prompts and write text")
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(path)
    except Exception as e:               # noqa: BLE001 -- tokenizers raises plain Exceptions
        raise ModelFilesError(f"{path}: cannot load it ({e})") from None


def synthetic_tokenizer(vocab: int):
    """A `tokenizers.Tokenizer` for models with random weights (`serve --synthetic`): token i is
    the word '<i>' (decoded with spaces between), so every id of a vocabulary of `vocab` has text
    and a streamed token is always a visible chunk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


def _json(path) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelFilesError(f"{path}: cannot read it ({e})") from None
    if not isinstance(obj, dict):
        raise ModelFilesError(f"{path}: expected a JSON object")
    return obj


def _ids(value, where) -> tuple:
    ids = [] if value is None else [value] if isinstance(value, int) else value
    if not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in ids)):
        raise ModelFilesError(f"{where}: eos_token_id must be an integer or a list of them, got "
                              f"{value!r}")
    return tuple(ids)


def generation_settings(model_dir: str) -> tuple[tuple, SamplingParams]:
    """(eos ids, default sampling) of a model directory. eos ids: generation_config.json's
    eos_token_id, else config.json's. Defaults for fields a request omits: greedy when
    generation_config.json says do_sample false; otherwise its temperature / top_p / top_k where
    it gives them, OpenAI's defaults (temperature 1, top_p 1, no top-k) where not."""
    gen_path = os.path.join(model_dir, "generation_config.json")
    gen = _json(gen_path)
    cfg_path = os.path.join(model_dir, "config.json")
    eos = (_ids(gen["eos_token_id"], gen_path) if gen.get("eos_token_id") is not None else
           _ids(_json(cfg_path).get("eos_token_id"), cfg_path))
    if gen.get("do_sample") is False:
        return eos, SamplingParams(temperature=0.0)
    given = {k: gen.get(k) for k in ("temperature", "top_k", "top_p") if gen.get(k) is not None}
    if isinstance(given.get("top_k"), float) and given["top_k"].is_integer():
        given["top_k"] = int(given["top_k"])
    defaults = SamplingParams(**{"temperature": 1.0, **given})
    try:
        defaults.check()
    except ValueError as e:     # "sampling.top_k must be ..., got ...": the file's field
        raise ModelFilesError(f"{gen_path}: {str(e).removeprefix('sampling.')}") from None
    return eos, defaults
