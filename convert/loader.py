"""Loading a converted checkpoint: `load(out_dir, mesh=None, dtype=None)` -> (config, model).

The model is built abstractly (`nnx.eval_shape`), its params are restored by orbax's
`StandardCheckpointer` into `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))`
targets (arrays arrive already placed and cast), and merged back into the NNX module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np

from convert.converter import CONFIG_NAME, DTYPES, FORMAT, META_NAME, PARAMS_DIR
from convert.errors import ConvertError


def read_metadata(out_dir) -> dict:
    """The provenance record (`convert.json`) of a converted checkpoint."""
    path = os.path.join(os.fspath(out_dir), META_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{out_dir} is not a converted checkpoint (no {META_NAME})") from None
    if meta.get("format") != FORMAT:
        raise ConvertError(f"{path}: unsupported format {meta.get('format')!r} (expected {FORMAT})")
    return meta


def load_config_of(out_dir):
    from models.config import config_from_dict
    with open(os.path.join(os.fspath(out_dir), CONFIG_NAME), encoding="utf-8") as f:
        return config_from_dict(json.load(f))


def load(out_dir, mesh=None, dtype=None, *,
         partition: Callable[[tuple, tuple], object] | None = None):
    """Restore a converted checkpoint. Returns (config, model).

    mesh: a `jax.sharding.Mesh`; None = a one-device mesh on `jax.devices()[0]`.
    dtype: the model dtype (None = the dtype it was converted to); params the model keeps in
        fp32 stay fp32, the others are cast while restoring.
    partition: optional `(path, shape) -> PartitionSpec` per param; default replicated (`P()`).
    """
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from convert import mappings

    out_dir = os.path.abspath(os.fspath(out_dir))
    meta = read_metadata(out_dir)
    cfg = load_config_of(out_dir)
    if dtype is None:
        dtype = DTYPES[meta["dtype"]]
    if mesh is None:
        mesh = Mesh(np.array(jax.devices()[:1]), ("replica",))
    model = mappings.abstract_model(cfg, dtype, bool(meta.get("mtp")))
    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)

    ckptr = ocp.StandardCheckpointer()
    params_dir = os.path.join(out_dir, meta.get("params_dir", PARAMS_DIR))
    saved = {tuple(_key(k) for k in kp): m for kp, m in
             jax.tree_util.tree_flatten_with_path(ckptr.metadata(params_dir).item_metadata.tree)[0]}

    def target(kp, leaf):
        path = tuple(k.key for k in kp)
        m = saved.get(tuple(str(k) for k in path))
        if m is None:
            raise ConvertError(f"{out_dir}: param {'/'.join(map(str, path))} is not in the checkpoint")
        if tuple(m.shape) != tuple(leaf.shape):
            raise ConvertError(f"{out_dir}: param {'/'.join(map(str, path))} has shape "
                               f"{list(m.shape)}, the model expects {list(leaf.shape)}")
        spec = partition(path, tuple(leaf.shape)) if partition else PartitionSpec()
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    targets = jax.tree_util.tree_map_with_path(target, pure)
    if len(saved) != len(jax.tree_util.tree_leaves(targets)):
        raise ConvertError(f"{out_dir}: the checkpoint has {len(saved)} params, the model "
                           f"{len(jax.tree_util.tree_leaves(targets))}")
    restored = ckptr.restore(params_dir, targets)
    nnx.replace_by_pure_dict(state, restored)
    return cfg, nnx.merge(graphdef, state)


def _key(k):
    return str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
