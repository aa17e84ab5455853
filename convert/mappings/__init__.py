"""Per-family name tables and the models they fill.

`family_for(cfg)` gives the `Family`: how to build the (abstract) model and its table.
`build(cfg, available, dtype, mtp)` returns the table plus the param shapes/dtypes
({path: (shape, dtype)}) of the model built with that dtype (params the model keeps in fp32,
such as norms, A_log or the MoE router, stay fp32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from convert.mappings import nemotron_h as _nemotron_h
from convert.mappings import qwen as _qwen
from convert.table import Path, Table, TableBuilder


@dataclass(frozen=True)
class Family:
    name: str
    model_class: Callable[[], type]          # imported lazily (jax/flax)
    build_table: Callable
    declares_mtp: Callable                   # cfg -> number of MTP layers the config declares


def _nemotron_cls():
    from models.nemotron_h import NemotronH
    return NemotronH


def _qwen_cls():
    from models.qwen import QwenHybrid
    return QwenHybrid


FAMILIES = {
    "NemotronHConfig": Family("nemotron_h", _nemotron_cls, _nemotron_h.build_table,
                              lambda c: c.num_mtp_layers and len(c.mtp_layer_kinds)),
    "QwenHybridConfig": Family("qwen_hybrid", _qwen_cls, _qwen.build_table,
                               lambda c: c.num_mtp_layers),
}


def family_for(cfg) -> Family:
    try:
        return FAMILIES[type(cfg).__name__]
    except KeyError:
        raise ValueError(f"no converter table for {type(cfg).__name__}") from None


def abstract_model(cfg, dtype, mtp: bool):
    """The model as ShapeDtypeStructs (no memory): nnx.eval_shape of its constructor."""
    from flax import nnx
    cls = family_for(cfg).model_class()
    kw = {"mtp": True} if mtp else {}
    return nnx.eval_shape(lambda: cls(cfg, dtype=dtype, **kw))


def param_targets(model) -> dict[Path, tuple]:
    """{path: (shape, dtype)} of every param in the model's pure-dict state."""
    import jax
    from flax import nnx
    pure = nnx.to_pure_dict(nnx.state(model))
    out = {}
    for kp, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
        out[tuple(k.key for k in kp)] = (tuple(leaf.shape), leaf.dtype)
    return out


def build(cfg, available: set[str], dtype, mtp: bool) -> tuple[Table, dict[Path, tuple]]:
    model = abstract_model(cfg, dtype, mtp)
    targets = param_targets(model)
    b = TableBuilder({p: s for p, (s, _) in targets.items()}, available)
    family_for(cfg).build_table(cfg, b, mtp)
    return b.build(), targets
