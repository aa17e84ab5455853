"""Opening a model directory: a Hugging Face checkpoint (config.json + safetensors) or one that
`replayjax convert` wrote (orbax)."""

from __future__ import annotations

import os

from models.config import load_config


class ModelDirError(ValueError):
    pass


def model_class(cfg):
    if cfg.family == "nemotron_h":
        from models.nemotron_h import NemotronH
        return NemotronH
    from models.qwen import QwenHybrid
    return QwenHybrid


def load_model(path: str):
    """Returns the NNX model stored at `path`."""
    if not os.path.isdir(path):
        raise ModelDirError(f"model directory {path!r} does not exist")
    hf = os.path.exists(os.path.join(path, "config.json")) and any(
        f.endswith(".safetensors") or f.endswith(".safetensors.index.json")
        for f in os.listdir(path))
    if hf:
        from models import weights
        cfg = load_config(path)
        tensors = weights.read_safetensors(path)
        # build the MTP head when the checkpoint ships one (HF-saved checkpoints never do)
        mtp = any(k.startswith("mtp.") for k in tensors) and (
            cfg.family != "nemotron_h" or cfg.num_mtp_layers > 0)
        model = model_class(cfg)(cfg, mtp=mtp)
        loader = weights.load_nemotron_h if cfg.family == "nemotron_h" else weights.load_qwen_hybrid
        return loader(model, tensors)
    try:
        import convert
        return convert.load(path)[1]
    except (ImportError, AttributeError):
        raise ModelDirError(f"{path!r} is neither a Hugging Face checkpoint (config.json + "
                            f"*.safetensors) nor a converted replayjax checkpoint") from None
