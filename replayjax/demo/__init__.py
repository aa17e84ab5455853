"""The demo model shipped with the package: what `replayjax generate` runs when no --model is given.

``model_dir()`` is a Hugging Face checkpoint directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json, provenance.json) of a tiny
Nemotron-H-style hybrid language model (``model_type: nemotron_h``): 8 layers in the pattern
``M*M-M*M-`` (Mamba-2, attention, relu^2 MLP; hidden size 256, 4 Mamba heads of 64 with state 32,
4 attention heads / 2 KV heads of 64) plus a one-block multi-token-prediction head (attention +
MLP, ``mtp.*`` tensors), about 2.6M parameters, ~5 MB in bf16. `generate` and `serve` run it
in float32 when they pick it (no --model; `DTYPE`).

The vocabulary is bytes: token id == UTF-8 byte value (256 ids, no special tokens); tokenizer.json
is a byte-level ``tokenizers`` tokenizer with exactly that mapping. It was trained on CPU in a few
minutes by ``scripts/train_demo.py`` (next-byte cross entropy, hand-written Adam, fixed seed) on the
licence texts in Debian's ``/usr/share/common-licenses`` (GPL, LGPL, Apache-2.0, MPL, ...; one held
out for validation); provenance.json lists the files with their sha256, the steps, losses, command
and sample outputs. So it continues licence-like English ("This program is free software; ...")
and little else: it is there to show the engine working without downloading anything.

transformers loads the same directory (``NemotronHForCausalLM.from_pretrained(model_dir())``; it
ignores the ``mtp.*`` tensors); ``scripts/train_demo.py --check-hf`` compares its logits with ours.
"""

from __future__ import annotations

import os

__all__ = ["model_dir", "DTYPE"]

# What the commands run the demo in when no --model is given: in bf16 its 256 byte logits tie
# often (steps of 1/16), and which of two tied tokens greedy decoding picks would then follow
# rounding (batch shape, speculation, prefill chunks); in float32 it does not. Its file stays
# bf16 (small); given as --model DIR it loads as stored, as any checkpoint.
DTYPE = "float32"


def model_dir() -> str:
    """Path of the shipped Hugging Face directory of the demo model."""
    try:
        from importlib.resources import files
        path = os.fspath(files(__name__) / "model")
    except (ImportError, TypeError):         # not a plain directory (e.g. zipped): use __file__
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
    return path
