"""Model configs parsed from a Hugging Face ``config.json`` (stdlib only).

Two frozen dataclasses cover the supported families (fields as in transformers 5.24 configs):

- `NemotronHConfig` for ``model_type: nemotron_h`` (Nemotron-H, Nemotron-Nano-v2, Nemotron-3):
  per-layer kinds ``"mamba" | "attention" | "mlp" | "moe"``, one pre-norm mixer per layer.
- `QwenHybridConfig` for ``qwen3_next``, ``qwen3_5[_moe]`` (multimodal wrapper with ``text_config``)
  and ``qwen3_5[_moe]_text``: per-layer mixer kinds ``"gdn" | "attention"``, each followed by an FFN
  (`ffn_kinds`: ``"moe" | "mlp"``).

`parse_config` / `load_config` read HF configs, accept legacy field names, and refuse unknown model
types and inconsistent values with a `ConfigError` that names the field. Validation lives in
``__post_init__``, so direct construction and `config_from_dict` (our own serialisation, written by
the converter next to the weights) are checked the same way.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

__all__ = [
    "ConfigError", "NemotronHConfig", "QwenHybridConfig", "ModelConfig", "SUPPORTED_MODEL_TYPES",
    "parse_config", "load_config", "config_from_dict",
]

NEMOTRON_MODEL_TYPES = ("nemotron_h",)
QWEN_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
SUPPORTED_MODEL_TYPES = NEMOTRON_MODEL_TYPES + QWEN_MODEL_TYPES
_FORMAT = 1  # version of our own to_dict() layout


class ConfigError(ValueError):
    """A config.json that this library cannot or will not run."""


# ----------------------------------------------------------------------------- field reading


_REQUIRED = object()
_ABSENT = object()
_NONFINITE = {"inf": math.inf, "infinity": math.inf, "-inf": -math.inf, "-infinity": -math.inf,
              "nan": math.nan}


def _as_float(v: Any, what: str) -> float:
    """A float from a JSON value; accepts "inf"/"Infinity" and transformers'
    {"__float__": "Infinity"}."""
    if isinstance(v, Mapping) and set(v) == {"__float__"}:
        v = v["__float__"]
    if isinstance(v, str) and v.strip().lower() in _NONFINITE:
        return _NONFINITE[v.strip().lower()]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{what} must be a number, got {v!r}")
    return float(v)


_STATE_DTYPES = ("float32", "bfloat16", "float16")


class _Reader:
    """Typed access to one JSON object; `where` prefixes every error message."""

    def __init__(self, d: Mapping[str, Any], where: str):
        self.d, self.where = d, where

    def has(self, *names: str) -> bool:
        return any(self.d.get(n) is not None for n in names)

    def raw(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        """Value of `name` or one of its aliases (null counts as absent); aliases must agree."""
        found = [(k, self.d[k]) for k in (name, *aliases) if self.d.get(k) is not None]
        if not found:
            if default is _REQUIRED:
                alias = f" (or {', '.join(repr(a) for a in aliases)})" if aliases else ""
                raise ConfigError(f"{self.where}: missing required field {name!r}{alias}")
            return default
        (k0, v0), rest = found[0], found[1:]
        for k, v in rest:
            if v != v0:
                raise ConfigError(f"{self.where}: field {k0!r} = {v0!r} conflicts with its "
                                  f"alias {k!r} = {v!r}")
        return v0

    def _typed(self, check, kind: str, name: str, aliases: tuple[str, ...], default: Any) -> Any:
        v = self.raw(name, *aliases, default=_ABSENT)
        if v is _ABSENT:
            return self.raw(name, *aliases, default=default)  # raises if required
        ok, v = check(v)
        if not ok:
            raise ConfigError(f"{self.where}: field {name!r} must be {kind}, got {v!r}")
        return v

    def int(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        def check(v):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            return isinstance(v, int) and not isinstance(v, bool), v
        return self._typed(check, "an integer", name, aliases, default)

    def float(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        def check(v):
            try:
                return True, _as_float(v, name)
            except ConfigError:
                return False, v
        return self._typed(check, "a number", name, aliases, default)

    def bool(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        return self._typed(lambda v: (isinstance(v, bool), v), "true/false", name, aliases, default)

    def str(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        return self._typed(lambda v: (isinstance(v, str), v), "a string", name, aliases, default)

    def list(self, name: str, *aliases: str, default: Any = _REQUIRED) -> Any:
        def check(v):
            is_list = isinstance(v, (list, tuple))
            return is_list, list(v) if is_list else v
        return self._typed(check, "a list", name, aliases, default)


def _kinds(values: Any, table: Mapping[str, str], name: str, where: str) -> tuple[str, ...]:
    """Map a list of HF layer-type names to ours; names the offending index."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{where}: field {name!r} must be a list of strings, got {values!r}")
    out = []
    for i, v in enumerate(values):
        if v not in table:
            raise ConfigError(f"{where}: {name}[{i}] = {v!r} is not one of {sorted(table)}")
        out.append(table[v])
    return tuple(out)


def _pattern(s: Any, table: Mapping[str, str], name: str, where: str) -> tuple[str, ...]:
    """Map a per-layer pattern string such as "M-M*E" to layer kinds."""
    if not isinstance(s, str):
        raise ConfigError(f"{where}: field {name!r} must be a string, got {s!r}")
    for i, c in enumerate(s):
        if c not in table:
            raise ConfigError(f"{where}: {name} has unknown character {c!r} at position {i} "
                              f"(expected one of {', '.join(table)})")
    return tuple(table[c] for c in s)


# ----------------------------------------------------------------------------- shared base


class _ConfigBase:
    """to_dict / from_dict and checks shared by both families."""

    def _err(self, msg: str) -> ConfigError:
        return ConfigError(f"{self.family} config: {msg}")

    def _field_types(self) -> None:
        """Tuple fields given as lists become tuples (a frozen config must hash); anything else
        there, or a non-bool in a bool field (a truthy string would silently mean True), is an
        error."""
        for f in fields(self):
            v, t = getattr(self, f.name), str(f.type)
            if t.startswith("tuple"):
                if isinstance(v, list):
                    v = tuple(v)
                    object.__setattr__(self, f.name, v)
                if not (isinstance(v, tuple) or (v is None and t.endswith("| None"))):
                    raise self._err(f"field {f.name!r} must be a tuple (or list), got {v!r}")
            elif t == "bool" and not isinstance(v, bool):
                raise self._err(f"field {f.name!r} must be True or False, got {v!r}")

    def _pow2(self, name: str, why: str) -> None:
        """A positive integer field that the kernels need to be a power of two."""
        self._positive(name)
        v = getattr(self, name)
        if v & (v - 1):
            raise self._err(f"field {name!r} must be a power of two ({why}), got {v}")

    def _at_least(self, name: str, low: int, why: str) -> None:
        self._positive(name)
        if getattr(self, name) < low:
            raise self._err(f"field {name!r} must be >= {low} ({why}), got {getattr(self, name)}")

    def _positive(self, *names: str) -> None:
        for n in names:
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise self._err(f"field {n!r} must be a positive integer, got {v!r}")

    def _common_checks(self, state_dtype: str) -> None:
        """max_position_embeddings None or positive; the SSM state dtype field a known float
        dtype (informational: the state dtype is the engine's setting)."""
        if self.max_position_embeddings is not None:
            self._positive("max_position_embeddings")
        if getattr(self, state_dtype) not in _STATE_DTYPES:
            raise self._err(f"field {state_dtype!r} must be one of {', '.join(_STATE_DTYPES)}, "
                            f"got {getattr(self, state_dtype)!r}")

    def _supported(self, name: str, only: str, used: bool) -> None:
        if used and getattr(self, name) != only:
            raise self._err(f"field {name!r} is {getattr(self, name)!r}; only {only!r} is "
                            f"supported")

    def _multiple(self, big: str, small: str) -> None:
        if getattr(self, big) % getattr(self, small):
            raise self._err(f"field {big!r} ({getattr(self, big)}) must be a multiple of "
                            f"{small!r} ({getattr(self, small)})")

    def _moe_checks(self, experts: str, topk: str, sizes: tuple[str, ...]) -> None:
        self._positive(experts, topk, *sizes)
        if getattr(self, topk) > getattr(self, experts):
            raise self._err(f"field {topk!r} ({getattr(self, topk)}) exceeds {experts!r} "
                            f"({getattr(self, experts)})")

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON dict of every field (non-finite floats as "inf"/"-inf"/"nan")."""
        def enc(v):
            if isinstance(v, tuple):
                return [enc(x) for x in v]
            if isinstance(v, float) and not math.isfinite(v):
                return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return v
        out = {"config_class": type(self).__name__, "format": _FORMAT}
        out.update({f.name: enc(getattr(self, f.name)) for f in fields(self)})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """Inverse of `to_dict`; unknown or missing keys are errors."""
        d = dict(d)
        if (d.pop("config_class", cls.__name__) != cls.__name__
                or d.pop("format", _FORMAT) != _FORMAT):
            raise ConfigError(f"not a {cls.__name__} dict of format {_FORMAT}")
        known = {f.name: f for f in fields(cls)}
        if unknown := sorted(set(d) - set(known)):
            raise ConfigError(f"{cls.__name__}.from_dict: unknown fields {unknown}")

        def dec(v, is_float, name):
            if isinstance(v, list):
                return tuple(dec(x, is_float, name) for x in v)
            return (_as_float(v, f"{cls.__name__}.from_dict: field {name!r}")
                    if is_float and isinstance(v, str) else v)
        kwargs = {k: dec(v, "float" in str(known[k].type), k) for k, v in d.items()}
        try:
            return cls(**kwargs)
        except TypeError as e:  # missing required fields
            raise ConfigError(f"{cls.__name__}.from_dict: {e}") from None


# ----------------------------------------------------------------------------- Nemotron-H

_NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
# transformers 5.x names and the legacy ones it remaps ("mamba", "attention").
_NEMOTRON_NAMES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                   "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


@dataclass(frozen=True, kw_only=True)
class NemotronHConfig(_ConfigBase):
    """Nemotron-H / Nemotron-3 (`nemotron_h`). Checkpoint body under ``backbone.``; an lm_head
    unless ``tie_word_embeddings`` (then the embeddings are the head).

    Fields unused by the layer pattern are 0 (e.g. MoE sizes of a dense model). Attention has no
    RoPE (``rope_theta`` in a config is ignored). MoE routing is sigmoid +
    ``e_score_correction_bias`` (always present in the checkpoint, selection only), relu²
    experts, one shared expert.
    """

    family: ClassVar[str] = "nemotron_h"
    weight_prefix: ClassVar[str] = "backbone."

    vocab_size: int
    hidden_size: int                    # D
    layer_kinds: tuple[str, ...]        # per layer: "mamba" | "attention" | "mlp" | "moe"
    layer_norm_epsilon: float = 1e-5    # all RMSNorms, incl. the gated norm (alias norm_eps)
    tie_word_embeddings: bool = False
    residual_in_fp32: bool = False
    max_position_embeddings: int | None = None
    # attention ("*"): GQA, no positional encoding, scale head_dim^-0.5
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0                   # alias attention_head_dim; NOT hidden/heads (Nano-9B: 128)
    attention_bias: bool = False
    # Mamba-2 ("M")
    mamba_num_heads: int = 0            # H
    mamba_head_dim: int = 0             # P
    n_groups: int = 0                   # G (B/C groups and gated-norm groups); alias mamba_n_groups
    ssm_state_size: int = 0             # N
    conv_kernel: int = 4                # K; alias mamba_d_conv
    use_conv_bias: bool = True          # alias mamba_conv_bias
    use_bias: bool = False              # in/out_proj bias; mamba_proj_bias is HF's fallback
    mamba_hidden_act: str = "silu"      # conv activation
    chunk_size: int = 128               # SSD prefill chunk (math unchanged); alias mamba_chunk_size
    time_step_min: float = 1e-3         # alias mamba_dt_min; HF 5.x clamps dt >= it in prefill only
    time_step_max: float = 0.1          # alias mamba_dt_max (init only)
    time_step_floor: float = 1e-4       # alias mamba_dt_init_floor (init only)
    # alias mamba_dt_limit (vLLM / remote code)
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    mamba_ssm_cache_dtype: str = "float32"
    # dense MLP ("-"): down(relu(up(x))^2)
    intermediate_size: int = 0
    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    # MoE ("E")
    n_routed_experts: int = 0           # E; alias num_local_experts
    num_experts_per_tok: int = 0        # top-k
    moe_intermediate_size: int = 0      # routed expert width
    n_shared_experts: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_latent_size: int | None = None  # LatentMoE width (Nemotron-3 Super/Ultra); None = off
    routed_scaling_factor: float = 1.0  # multiplies the (renormalised) routed weights
    n_group: int = 1                    # group-limited routing (1 = off)
    topk_group: int = 1
    norm_topk_prob: bool = True
    # MTP (num_nextn_predict_layers; mtp_hybrid_override_pattern / mtp_layers_block_type)
    num_mtp_layers: int = 0
    mtp_layer_kinds: tuple[str, ...] = ()  # () when num_mtp_layers == 0

    def __post_init__(self):
        self._field_types()
        self._positive("vocab_size", "hidden_size")
        for name in ("layer_kinds", "mtp_layer_kinds"):
            if bad := [k for k in getattr(self, name) if k not in _NEMOTRON_PATTERN.values()]:
                raise self._err(f"field {name!r} has unknown kinds {bad}")
        if not self.layer_kinds:
            raise self._err("the layer pattern is empty")
        if self.num_mtp_layers < 0 or bool(self.num_mtp_layers) != bool(self.mtp_layer_kinds):
            raise self._err(f"num_mtp_layers = {self.num_mtp_layers} does not match "
                            f"mtp_layer_kinds = {self.mtp_layer_kinds}")
        if not self.layer_norm_epsilon > 0:
            raise self._err(f"field 'layer_norm_epsilon' must be > 0, "
                            f"got {self.layer_norm_epsilon}")
        kinds = set(self.layer_kinds) | set(self.mtp_layer_kinds)
        # the model implements these activations only: another would silently change meaning
        self._supported("mamba_hidden_act", "silu", "mamba" in kinds)
        self._supported("mlp_hidden_act", "relu2", bool(kinds & {"mlp", "moe"}))
        self._common_checks("mamba_ssm_cache_dtype")
        if "attention" in kinds:
            self._positive("num_attention_heads", "num_key_value_heads", "head_dim")
            self._multiple("num_attention_heads", "num_key_value_heads")
        if "mamba" in kinds:
            self._positive("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
                           "conv_kernel", "chunk_size")
            self._multiple("mamba_num_heads", "n_groups")
            self._pow2("ssm_state_size", "the Mamba-2 kernels' d_state N")
            self._at_least("conv_kernel", 2, "the conv kernels keep K - 1 inputs per slot")
            lo, hi = self.time_step_limit if len(self.time_step_limit) == 2 else (1, 0)
            if not 0 <= lo <= hi:
                raise self._err(f"field 'time_step_limit' must be (lo, hi) with 0 <= lo <= hi, "
                                f"got {self.time_step_limit}")
        if "mlp" in kinds:
            self._positive("intermediate_size")
        if "moe" in kinds:
            self._moe_checks("n_routed_experts", "num_experts_per_tok", ("moe_intermediate_size",))
            if self.n_shared_experts < 0 or (self.n_shared_experts and
                                             self.moe_shared_expert_intermediate_size <= 0):
                raise self._err("field 'moe_shared_expert_intermediate_size' must be positive "
                                "when n_shared_experts > 0")
            if self.moe_latent_size is not None:
                self._positive("moe_latent_size")
            self._positive("n_group", "topk_group")
            self._multiple("n_routed_experts", "n_group")
            if not self.routed_scaling_factor > 0:
                raise self._err(f"field 'routed_scaling_factor' must be > 0, "
                                f"got {self.routed_scaling_factor}")
            if self.topk_group > self.n_group:
                raise self._err(f"field 'topk_group' ({self.topk_group}) exceeds "
                                f"'n_group' ({self.n_group})")

    # derived values (the Mamba-2 paper's notation: H heads of dim P, G groups, state N)
    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def hybrid_override_pattern(self) -> str:
        inv = {v: k for k, v in _NEMOTRON_PATTERN.items()}
        return "".join(inv[k] for k in self.layer_kinds)

    @property
    def mamba_intermediate_size(self) -> int:
        """I = mamba_num_heads * mamba_head_dim (NOT expand * hidden_size)."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv over [x | B | C]: I + 2*G*N."""
        return self.mamba_intermediate_size + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_dim(self) -> int:
        """Rows of in_proj, split [z (I) | x (I) | B (GN) | C (GN) | dt (H)]."""
        return self.mamba_intermediate_size + self.mamba_conv_dim + self.mamba_num_heads

    @property
    def moe_expert_input_size(self) -> int:
        """Width the routed experts see: moe_latent_size if LatentMoE, else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    def layers_of(self, kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == kind)


def _parse_nemotron(d: Mapping[str, Any]) -> NemotronHConfig:
    r = _Reader(d, "nemotron_h config")
    where = r.where
    # Layer pattern: layers_block_type (HF 5.x; attribute_map alias layer_types) or the pattern.
    listed = r.raw("layers_block_type", "layer_types", default=None)
    pattern = r.raw("hybrid_override_pattern", default=None)
    if listed is not None:
        kinds = _kinds(listed, _NEMOTRON_NAMES, "layers_block_type", where)
        if pattern is not None and _pattern(pattern, _NEMOTRON_PATTERN,
                                            "hybrid_override_pattern", where) != kinds:
            raise ConfigError(f"{where}: hybrid_override_pattern disagrees with "
                              "layers_block_type")
    elif pattern is not None:
        kinds = _pattern(pattern, _NEMOTRON_PATTERN, "hybrid_override_pattern", where)
    else:
        raise ConfigError(f"{where}: missing required field 'hybrid_override_pattern' "
                          "(or 'layers_block_type')")
    n = r.int("num_hidden_layers", default=None)
    if n is not None and n != len(kinds):
        raise ConfigError(f"{where}: num_hidden_layers = {n} but the layer pattern has "
                          f"{len(kinds)} layers")

    num_mtp = r.int("num_nextn_predict_layers", default=0)
    mtp_kinds: tuple[str, ...] = ()
    if num_mtp > 0:
        mtp_list = r.raw("mtp_layers_block_type", default=None)
        mtp_pat = r.raw("mtp_hybrid_override_pattern", default=None)
        from_list = None if mtp_list is None else _kinds(mtp_list, _NEMOTRON_NAMES,
                                                         "mtp_layers_block_type", where)
        from_pat = None if mtp_pat is None else _pattern(mtp_pat, _NEMOTRON_PATTERN,
                                                         "mtp_hybrid_override_pattern", where)
        if from_list is not None and from_pat is not None and from_list != from_pat:
            raise ConfigError(f"{where}: mtp_hybrid_override_pattern disagrees with "
                              "mtp_layers_block_type")
        mtp_kinds = from_list or from_pat or ("attention", "moe")

    if r.raw("sliding_window", default=None) is not None:
        raise ConfigError(f"{where}: field 'sliding_window' is set; windowed attention is not "
                          "supported")
    need = set(kinds) | set(mtp_kinds)
    req = lambda kind: _REQUIRED if kind in need else 0  # noqa: E731
    limit = r.raw("time_step_limit", "mamba_dt_limit", default=None)
    if limit is None:
        limit = (0.0, math.inf)
    elif not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise ConfigError(f"{where}: field 'time_step_limit' must be a pair, got {limit!r}")
    ffn = r.raw("intermediate_size", default=req("mlp"))
    if isinstance(ffn, (list, tuple)):  # vLLM accepts a per-MLP-layer list
        if len(set(ffn)) != 1:
            raise ConfigError(f"{where}: per-layer 'intermediate_size' lists with differing values "
                              f"are not supported: {ffn}")
        ffn = ffn[0]
    heads = r.int("num_attention_heads", default=req("attention"))
    return NemotronHConfig(
        vocab_size=r.int("vocab_size"),
        hidden_size=r.int("hidden_size"),
        layer_kinds=kinds,
        layer_norm_epsilon=r.float("layer_norm_epsilon", "norm_eps", default=1e-5),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        residual_in_fp32=r.bool("residual_in_fp32", default=False),
        max_position_embeddings=r.int("max_position_embeddings", default=None),
        num_attention_heads=heads,
        num_key_value_heads=r.int("num_key_value_heads", default=heads),
        head_dim=r.int("head_dim", "attention_head_dim", default=req("attention")),
        attention_bias=r.bool("attention_bias", default=False),
        mamba_num_heads=r.int("mamba_num_heads", default=req("mamba")),
        mamba_head_dim=r.int("mamba_head_dim", default=req("mamba")),
        n_groups=r.int("n_groups", "mamba_n_groups", default=req("mamba")),
        ssm_state_size=r.int("ssm_state_size", default=req("mamba")),
        conv_kernel=r.int("conv_kernel", "mamba_d_conv", default=4),
        use_conv_bias=r.bool("use_conv_bias", "mamba_conv_bias", default=True),
        use_bias=r.bool("use_bias", default=r.bool("mamba_proj_bias", default=False)),
        mamba_hidden_act=r.str("mamba_hidden_act", default="silu"),
        chunk_size=r.int("chunk_size", "mamba_chunk_size", default=128),
        time_step_min=r.float("time_step_min", "mamba_dt_min", default=1e-3),
        time_step_max=r.float("time_step_max", "mamba_dt_max", default=0.1),
        time_step_floor=r.float("time_step_floor", "mamba_dt_init_floor", default=1e-4),
        time_step_limit=tuple(_as_float(x, f"{where}: field 'time_step_limit'") for x in limit),
        mamba_ssm_cache_dtype=r.str("mamba_ssm_cache_dtype", default="float32"),
        intermediate_size=_Reader({"intermediate_size": ffn}, where).int("intermediate_size"),
        mlp_hidden_act=r.str("mlp_hidden_act", default="relu2"),
        mlp_bias=r.bool("mlp_bias", default=False),
        n_routed_experts=r.int("n_routed_experts", "num_local_experts", default=req("moe")),
        num_experts_per_tok=r.int("num_experts_per_tok", default=req("moe")),
        moe_intermediate_size=r.int("moe_intermediate_size", default=req("moe")),
        n_shared_experts=r.int("n_shared_experts", default=1 if "moe" in need else 0),
        moe_shared_expert_intermediate_size=r.int("moe_shared_expert_intermediate_size", default=0),
        moe_latent_size=r.int("moe_latent_size", default=None),
        routed_scaling_factor=r.float("routed_scaling_factor", default=1.0),
        n_group=r.int("n_group", default=1),
        topk_group=r.int("topk_group", default=1),
        norm_topk_prob=r.bool("norm_topk_prob", default=True),
        num_mtp_layers=num_mtp,
        mtp_layer_kinds=mtp_kinds,
    )


# ----------------------------------------------------------------------------- Qwen3-Next / Qwen3.5

_QWEN_NAMES = {"linear_attention": "gdn", "full_attention": "attention", "attention": "attention"}
_QWEN_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@dataclass(frozen=True, kw_only=True)
class QwenHybridConfig(_ConfigBase):
    """Qwen3-Next / Qwen3.5 / Qwen3.5-MoE: per layer a mixer (GDN or gated attention) then an
    FFN.

    Layer, q/k, final and MTP norms are zero-centred (1+w); the GDN output norm is plain w.
    Attention uses partial NeoX RoPE on the first `rotary_dim` dims (M-RoPE reduces to it for
    text).
    """

    family: str                         # "qwen3_next" | "qwen3_5" | "qwen3_5_moe"
    # parsed from a wrapper with text_config (weights under model.language_model.)
    multimodal: bool = False
    vocab_size: int
    hidden_size: int
    layer_kinds: tuple[str, ...]        # per layer mixer: "gdn" | "attention"
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"            # MLP / experts / GDN conv activation
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    # gated attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool = False
    attn_output_gate: bool = True       # q_proj has per-head [q | gate]
    rope_theta: float = 10000.0         # top-level, rope_scaling or rope_parameters
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] | None = None  # Qwen3.5 M-RoPE sections (sum = rotary_dim / 2)
    mrope_interleaved: bool = False
    # Gated DeltaNet
    linear_num_key_heads: int           # Hk
    linear_num_value_heads: int         # Hv (value head j uses key head j // (Hv/Hk))
    linear_key_head_dim: int            # dk
    linear_value_head_dim: int          # dv
    linear_conv_kernel_dim: int = 4     # K
    mamba_ssm_dtype: str = "float32"    # recurrent state dtype
    # FFN
    intermediate_size: int = 0          # dense SwiGLU width (0 if no dense layer)
    num_experts: int = 0                # 0 = dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # sigmoid-gated shared expert (0 = none)
    norm_topk_prob: bool = True         # always True for qwen3_5_moe
    decoder_sparse_step: int = 1        # qwen3_next only
    mlp_only_layers: tuple[int, ...] = ()  # qwen3_next only
    # MTP (num_nextn_predict_layers in Qwen3-Next, mtp_num_hidden_layers in Qwen3.5; 0 if absent)
    num_mtp_layers: int = 0
    mtp_use_dedicated_embeddings: bool = False

    def __post_init__(self):
        if self.family not in _QWEN_FAMILIES:
            raise ConfigError(f"unknown Qwen family {self.family!r}; "
                              f"expected one of {_QWEN_FAMILIES}")
        self._field_types()
        self._positive("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                       "head_dim")
        self._multiple("num_attention_heads", "num_key_value_heads")
        if not self.layer_kinds or (bad := [k for k in self.layer_kinds
                                             if k not in ("gdn", "attention")]):
            raise self._err(f"field 'layer_kinds' must be a non-empty tuple of 'gdn'/'attention', "
                            f"got {self.layer_kinds}")
        if not self.rms_norm_eps > 0:
            raise self._err(f"field 'rms_norm_eps' must be > 0, got {self.rms_norm_eps}")
        self._common_checks("mamba_ssm_dtype")
        if "gdn" in self.layer_kinds:
            self._positive("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                           "linear_value_head_dim", "linear_conv_kernel_dim")
            self._multiple("linear_num_value_heads", "linear_num_key_heads")
            self._pow2("linear_key_head_dim", "the GDN kernels' key dim K")
            self._at_least("linear_conv_kernel_dim", 2,
                           "the conv kernels keep K - 1 inputs per slot")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise self._err(f"field 'rope_theta' must be > 0, got {theta!r}")
        rd = self.rotary_dim
        if not (0 < rd <= self.head_dim and rd % 2 == 0):
            raise self._err(f"partial_rotary_factor {self.partial_rotary_factor} gives "
                            f"rotary_dim {rd}; need an even value in (0, head_dim={self.head_dim}]")
        if self.mrope_section is not None and sum(self.mrope_section) != rd // 2:
            raise self._err(f"field 'mrope_section' {list(self.mrope_section)} must sum to "
                            f"rotary_dim/2 = {rd // 2}")
        if self.num_mtp_layers < 0:
            raise self._err(f"field 'num_mtp_layers' must be >= 0, got {self.num_mtp_layers}")
        if self.family == "qwen3_5" and self.num_experts:
            raise self._err("dense qwen3_5 must have num_experts = 0")
        if self.family == "qwen3_5_moe" and not (self.num_experts and self.norm_topk_prob):
            raise self._err("qwen3_5_moe needs num_experts > 0 and norm_topk_prob = True")
        self._positive("decoder_sparse_step")
        if bad := [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]:
            raise self._err(f"field 'mlp_only_layers' has indices out of range "
                            f"[0, {self.num_hidden_layers}): {bad}")
        if "moe" in self.ffn_kinds:
            self._moe_checks("num_experts", "num_experts_per_tok", ("moe_intermediate_size",))
            if self.shared_expert_intermediate_size < 0:
                raise self._err("field 'shared_expert_intermediate_size' must be >= 0")
        if "mlp" in self.ffn_kinds:
            self._positive("intermediate_size")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def ffn_kinds(self) -> tuple[str, ...]:
        """Per layer "moe" or "mlp" (Qwen3-Next: mlp_only_layers / decoder_sparse_step rule)."""
        if self.family == "qwen3_5":
            return ("mlp",) * self.num_hidden_layers
        if self.family == "qwen3_5_moe":
            return ("moe",) * self.num_hidden_layers
        return tuple("moe" if (i not in self.mlp_only_layers and self.num_experts > 0
                               and (i + 1) % self.decoder_sparse_step == 0) else "mlp"
                     for i in range(self.num_hidden_layers))

    @property
    def mtp_ffn_kind(self) -> str:
        """FFN of the MTP block: MoE for Qwen3-Next / Qwen3.5-MoE, dense SwiGLU for Qwen3.5."""
        return "mlp" if self.family == "qwen3_5" else "moe"

    @property
    def gdn_layout(self) -> str:
        """"interleaved": in_proj_qkvz/in_proj_ba grouped per key head (qwen3_next);
        "flat": in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (qwen3_5*)."""
        return "interleaved" if self.family == "qwen3_next" else "flat"

    @property
    def weight_prefix(self) -> str:
        """Prefix of the text-model tensors; lm_head.weight and mtp.* are always top-level."""
        return "model.language_model." if self.multimodal else "model."

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the GDN conv over flat [q | k | v]: 2*Hk*dk + Hv*dv."""
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    @property
    def gdn_heads_ratio(self) -> int:
        return self.linear_num_value_heads // self.linear_num_key_heads

    def layers_of(self, kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == kind)


def _parse_qwen(top: Mapping[str, Any], model_type: str) -> QwenHybridConfig:
    multimodal = model_type in ("qwen3_5", "qwen3_5_moe")
    family = model_type.removesuffix("_text")
    if multimodal:
        text = top.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError(f"{model_type} config: missing required field 'text_config'")
        inner = text.get("model_type")
        if inner is not None and inner != f"{model_type}_text":
            raise ConfigError(f"{model_type} config: text_config.model_type is {inner!r}, "
                              f"expected {model_type + '_text'!r}")
        r = _Reader(text, f"{model_type} config (text_config)")
        tie = r.bool("tie_word_embeddings", default=_Reader(top, model_type).bool(
            "tie_word_embeddings", default=False))
    else:
        r = _Reader(top, f"{model_type} config")
        tie = r.bool("tie_word_embeddings", default=False)
    where = r.where

    n = r.int("num_hidden_layers", default=None)
    if r.has("layer_types"):
        kinds = _kinds(r.raw("layer_types"), _QWEN_NAMES, "layer_types", where)
        if n is not None and n != len(kinds):
            raise ConfigError(f"{where}: layer_types has {len(kinds)} entries but "
                              f"num_hidden_layers = {n}")
    else:
        if n is None:
            raise ConfigError(f"{where}: missing required field 'num_hidden_layers' "
                              "(or 'layer_types')")
        interval = r.int("full_attention_interval", default=4)
        if interval <= 0:
            raise ConfigError(f"{where}: field 'full_attention_interval' must be positive, "
                              f"got {interval}")
        kinds = tuple("attention" if (i + 1) % interval == 0 else "gdn" for i in range(n))

    # RoPE: top-level keys < rope_scaling < rope_parameters (transformers 5 folds them into the
    # latter).
    rope: dict[str, Any] = {k: r.d[k] for k in ("rope_theta", "partial_rotary_factor")
                            if r.d.get(k) is not None}
    for key in ("rope_scaling", "rope_parameters"):
        sub = r.d.get(key)
        if sub is not None and not isinstance(sub, Mapping):
            raise ConfigError(f"{where}: field {key!r} must be an object, got {sub!r}")
        if isinstance(sub, Mapping) and isinstance(sub.get("full_attention"), Mapping):
            sub = sub["full_attention"]  # per-layer-type form
        if isinstance(sub, Mapping):
            rope.update({k: v for k, v in sub.items() if v is not None})
    rr = _Reader(rope, f"{where} rope_parameters")
    theta = rr.float("rope_theta", default=10000.0)     # > 0: checked by QwenHybridConfig
    rope_type = rr.str("rope_type", "type", default="default")
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
    mrope = rr.list("mrope_section", default=None)

    is_moe = family != "qwen3_5"
    experts = r.int("num_experts") if is_moe else 0
    req_moe = _REQUIRED if experts > 0 else 0
    return QwenHybridConfig(
        family=family,
        multimodal=multimodal,
        vocab_size=r.int("vocab_size"),
        hidden_size=r.int("hidden_size"),
        layer_kinds=kinds,
        rms_norm_eps=r.float("rms_norm_eps", default=1e-6),
        hidden_act=r.str("hidden_act", default="silu"),
        tie_word_embeddings=tie,
        max_position_embeddings=r.int("max_position_embeddings", default=None),
        num_attention_heads=r.int("num_attention_heads"),
        num_key_value_heads=r.int("num_key_value_heads"),
        head_dim=r.int("head_dim"),
        attention_bias=r.bool("attention_bias", default=False),
        attn_output_gate=r.bool("attn_output_gate", default=True),
        rope_theta=theta,
        partial_rotary_factor=rr.float("partial_rotary_factor", default=0.25),
        mrope_section=None if mrope is None else tuple(
            _Reader({"mrope_section": x}, where).int("mrope_section") for x in mrope),
        mrope_interleaved=rr.bool("mrope_interleaved", default=False),
        linear_num_key_heads=r.int("linear_num_key_heads"),
        linear_num_value_heads=r.int("linear_num_value_heads"),
        linear_key_head_dim=r.int("linear_key_head_dim"),
        linear_value_head_dim=r.int("linear_value_head_dim"),
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim", default=4),
        mamba_ssm_dtype=r.str("mamba_ssm_dtype", default="float32"),
        intermediate_size=r.int("intermediate_size",
                                default=_REQUIRED if family == "qwen3_5" else 0),
        num_experts=experts,
        num_experts_per_tok=r.int("num_experts_per_tok", default=req_moe) if is_moe else 0,
        moe_intermediate_size=r.int("moe_intermediate_size", default=req_moe) if is_moe else 0,
        shared_expert_intermediate_size=(r.int("shared_expert_intermediate_size", default=0)
                                         if is_moe else 0),
        norm_topk_prob=(True if family == "qwen3_5_moe"
                        else r.bool("norm_topk_prob", default=True)),
        decoder_sparse_step=(r.int("decoder_sparse_step", default=1)
                             if family == "qwen3_next" else 1),
        mlp_only_layers=(tuple(r.list("mlp_only_layers", default=[]))
                         if family == "qwen3_next" else ()),
        num_mtp_layers=r.int("mtp_num_hidden_layers", "num_nextn_predict_layers", default=0),
        mtp_use_dedicated_embeddings=r.bool("mtp_use_dedicated_embeddings", default=False),
    )


# ----------------------------------------------------------------------------- entry points

ModelConfig = NemotronHConfig | QwenHybridConfig


def parse_config(obj: Mapping[str, Any] | str | os.PathLike) -> ModelConfig:
    """Parse a Hugging Face config (dict, config.json path or checkpoint directory)."""
    if isinstance(obj, (str, os.PathLike)):
        return load_config(obj)
    if not isinstance(obj, Mapping):
        raise ConfigError(f"expected a config dict or path, got {type(obj).__name__}")
    model_type = obj.get("model_type")
    if model_type in NEMOTRON_MODEL_TYPES:
        return _parse_nemotron(obj)
    if model_type in QWEN_MODEL_TYPES:
        return _parse_qwen(obj, model_type)
    raise ConfigError(f"unsupported model_type {model_type!r}; "
                      f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")


def load_config(path: str | os.PathLike) -> ModelConfig:
    """Read ``config.json`` (or ``<dir>/config.json``) and parse it."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no config file at {p}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON: {e}") from None
    return parse_config(d)


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    """Rebuild a config from our own `to_dict()` output (dispatches on ``config_class``)."""
    classes = {c.__name__: c for c in (NemotronHConfig, QwenHybridConfig)}
    cls = classes.get(d.get("config_class"))
    if cls is None:
        raise ConfigError(f"config_class {d.get('config_class')!r} is not one of {sorted(classes)}")
    return cls.from_dict(d)
