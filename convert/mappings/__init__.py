"""Per-family name tables (`TABLES`, keyed by `models.registry` family name) and the models they
fill.

`build(cfg, available, dtype, mtp)` returns the table plus the param shapes/dtypes
({path: (shape, dtype)}) of the model built with that dtype (params the model keeps in fp32,
such as norms, A_log or the MoE router, stay fp32).
"""

from __future__ import annotations

from convert.mappings import nemotron_h as _nemotron_h
from convert.mappings import qwen as _qwen
from convert.table import Path, Table, TableBuilder
from models.registry import family_for

TABLES = {"nemotron_h": _nemotron_h.build_table, "qwen_hybrid": _qwen.build_table}


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
    """The table for a model with (`mtp`) or without an MTP head; without one, any `mtp.*`
    tensors are skipped with a note."""
    targets = param_targets(abstract_model(cfg, dtype, mtp))
    b = TableBuilder({p: s for p, (s, _) in targets.items()}, available)
    TABLES[family_for(cfg).name](cfg, b, mtp)
    if not mtp:
        b.skip("mtp.", "MTP head not loaded")
    return b.build(), targets
