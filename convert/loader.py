"""Loading a model: from a converted checkpoint (`load`) or straight from a Hugging Face directory
(`load_hf`); both return (config, model) with every param placed on `mesh`.

`load(out_dir, ...)` builds the model abstractly (`nnx.eval_shape`), restores its params with
orbax's `StandardCheckpointer` into `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` targets
(arrays arrive already placed and cast) and merges them into the NNX module.

`load_hf(hf_dir, ...)` runs the converter's checks (`convert.plan`) and name tables, then builds
one param at a time on the host from its source blocks (`convert.table.param_array`, in file
order) and places it with `jax.make_array_from_callback`, so each device receives only its shard
and the host holds one param at a time, never the whole model.

On a mesh with a "tp" axis of size > 1 both default to the family's tensor-parallel rules
(`models.sharding.TPRules`): per-param specs plus the device-major layout of fused projections,
applied on the host (`load_hf`) or on the devices after the sharded restore (`load`), one param
at a time; the model comes back laid out for that mesh (run it through `models.runner.Runner`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable

import numpy as np

from convert.converter import CONFIG_NAME, FORMAT, META_NAME, PARAMS_DIR
from convert.errors import ConvertError
from convert.plan import DTYPES, model_dtype, plan

HOST_BLOCK_BYTES = 64 << 20        # read size while assembling a param on the host

Partition = Callable[[tuple, tuple], object]   # (param path, shape) -> PartitionSpec


def read_metadata(out_dir) -> dict:
    """The provenance record (`convert.json`) of a converted checkpoint."""
    path = os.path.join(os.fspath(out_dir), META_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{out_dir} is not a converted checkpoint (no {META_NAME})") from None
    except (OSError, ValueError) as e:
        raise ConvertError(f"{path}: cannot read: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConvertError(f"{path}: unsupported format (expected format {FORMAT})")
    for key, ok, want in (("dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
                          ("mtp", lambda v: isinstance(v, bool), "true or false"),
                          ("params_dir", lambda v: isinstance(v, str) and v.strip(),
                           "a directory name")):
        if key in meta and not ok(meta[key]):         # the fields loading reads
            raise ConvertError(f"{path}: field {key!r} must be {want}, got {meta[key]!r:.60}")
    if "dtype" not in meta:
        raise ConvertError(f"{path}: missing field 'dtype'")
    return meta


def load_config_of(out_dir):
    from models.config import ConfigError, config_from_dict
    path = os.path.join(os.fspath(out_dir), CONFIG_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            return config_from_dict(json.load(f))
    except (OSError, ValueError, ConfigError) as e:
        raise ConvertError(f"{path}: cannot read the config: {e}") from None


def _placement(where, cfg, mesh, partition, experts="width"):
    """The rules that place each param: a `models.sharding.TPRules`, given or (partition None
    on a mesh whose "tp" axis is > 1) the family's; or any `partition` (path, shape) ->
    PartitionSpec, default P(), with no layout. Neither mesh nor partition: the first device
    (a single-device sharding, the one a step's outputs get: a cache made on the device and
    one coming out of a step then share a compilation). A model the mesh cannot split is a
    ConvertError naming `where`."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    from models import sharding
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ConvertError(f"{where}: mesh must be a jax.sharding.Mesh "
                           f"(`models.sharding.make_mesh`) or None, got a {type(mesh).__name__}")
    if partition is not None and not (isinstance(partition, sharding.TPRules)
                                      or callable(partition)):
        raise ConvertError(f"{where}: partition must be a models.sharding.TPRules or a "
                           f"function (path, shape) -> PartitionSpec, got a "
                           f"{type(partition).__name__}")
    if experts not in sharding.EXPERT_SPLITS:
        raise ConvertError(f"{where}: experts must be one of "
                           f"{', '.join(map(repr, sharding.EXPERT_SPLITS))}, got {experts!r}")
    if mesh is None and partition is None:
        device = SingleDeviceSharding(jax.devices()[0])
        return _Specs(lambda path, shape: device)
    if mesh is None:
        mesh = Mesh(np.array(jax.devices()[:1]), ("replica",))
    if partition is None and sharding.mesh_tp(mesh) > 1:
        try:
            partition = sharding.TPRules(cfg, mesh, experts)
        except ValueError as e:
            raise ConvertError(f"{where}: {e}") from None
    if isinstance(partition, sharding.TPRules):
        return partition
    return _Specs(lambda path, shape: NamedSharding(
        mesh, partition(path, shape) if partition else PartitionSpec()))


class _Specs:
    """Placement by a plain spec function: no layout (tp = 1)."""
    tp = 1

    def __init__(self, sharding):
        self.sharding = sharding

    def fused(self, path):
        return False

    def layout(self, path, a):
        return a


def _path(kp) -> tuple:
    return tuple(k.key for k in kp)


def load(out_dir, mesh=None, dtype=None, *, partition: Partition | None = None,
         experts: str = "width"):
    """Restore a converted checkpoint. Returns (config, model).

    mesh: a `jax.sharding.Mesh`; None = `jax.devices()[0]`.
    dtype: the model dtype (None = the dtype it was converted to); params the model keeps in
        fp32 stay fp32, the others are cast while restoring.
    partition: a `models.sharding.TPRules`, or `(path, shape) -> PartitionSpec` per param;
        default: the family's TP rules on a mesh with a "tp" axis > 1, else replicated (`P()`).
    experts: how the default TP rules split the routed experts: "width" (tensor parallel inside
        each expert) or "experts" (expert parallel), see `models.sharding.TPRules`.
    Raises ConvertError (one line naming the checkpoint), also for a damaged `params/` or a
    model the mesh cannot split.
    """
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from convert import mappings
    from models.sharding import set_layout

    out_dir = os.path.abspath(os.fspath(out_dir))
    meta = read_metadata(out_dir)
    cfg = load_config_of(out_dir)
    dtype = DTYPES[meta["dtype"]] if dtype is None else model_dtype(dtype)
    model = mappings.abstract_model(cfg, dtype, bool(meta.get("mtp")))
    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)
    rules = _placement(out_dir, cfg, mesh, partition, experts)

    ckptr = ocp.StandardCheckpointer()
    params_dir = os.path.join(out_dir, meta.get("params_dir", PARAMS_DIR))
    try:
        with _quiet_asyncio():
            item = ckptr.metadata(params_dir).item_metadata
    except Exception as e:       # orbax / tensorstore / OS errors of a damaged checkpoint
        raise _damaged(out_dir, e) from None
    if item is None:
        raise ConvertError(f"{out_dir}: damaged checkpoint, orbax cannot read the metadata of "
                           f"{params_dir}")
    tree = item.tree
    saved = {tuple(_key(k) for k in kp): m
             for kp, m in jax.tree_util.tree_flatten_with_path(tree)[0]}

    def target(kp, leaf):
        path = _path(kp)
        m = saved.get(tuple(str(k) for k in path))
        if m is None:
            raise ConvertError(f"{out_dir}: param {'/'.join(map(str, path))} "
                               "is not in the checkpoint")
        if tuple(m.shape) != tuple(leaf.shape):
            raise ConvertError(f"{out_dir}: param {'/'.join(map(str, path))} has shape "
                               f"{list(m.shape)}, the model expects {list(leaf.shape)}")
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                    sharding=rules.sharding(path, leaf.shape))

    targets = jax.tree_util.tree_map_with_path(target, pure)
    if len(saved) != len(jax.tree_util.tree_leaves(targets)):
        raise ConvertError(f"{out_dir}: the checkpoint has {len(saved)} params, the model "
                           f"{len(jax.tree_util.tree_leaves(targets))}")
    try:
        with _quiet_asyncio():
            restored = ckptr.restore(params_dir, targets)
    except Exception as e:
        raise _damaged(out_dir, e) from None

    _check_finite(out_dir, {_path(kp): a for kp, a in
                            jax.tree_util.tree_flatten_with_path(restored)[0]})

    def relayout(kp, a):        # fused params: device-major on the devices, in place
        path = _path(kp)
        return rules.placer(path, a.shape, donate=True)(a) if rules.fused(path) else a

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(relayout, restored))
    return cfg, set_layout(nnx.merge(graphdef, state), rules.tp)


@contextlib.contextmanager
def _quiet_asyncio():
    """orbax reads each array in an asyncio task: in a damaged checkpoint they all fail, and
    asyncio logs every one's traceback at shutdown (~10k lines) besides the exception the
    restore raises, which the caller reports in one line."""
    log = logging.getLogger("asyncio")
    level, log.level = log.level, logging.CRITICAL
    try:
        yield
    finally:
        log.level = level


def _damaged(out_dir: str, e: Exception) -> ConvertError:
    """One line for an orbax / tensorstore failure: its innermost cause names the array."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return ConvertError(f"{out_dir}: damaged checkpoint, cannot restore its params: {first[:300]}")


def load_hf(hf_dir, *, dtype=None, mtp: bool | None = None, mesh=None,
            partition: Partition | None = None, experts: str = "width"):
    """Load a Hugging Face checkpoint directory straight into the model. Returns (config, model).

    dtype: the model dtype; None = the checkpoint's (bfloat16 if it is mostly 16-bit, else
        float32), as `convert` chooses; params the model keeps in fp32 stay fp32.
    mtp: build the MTP head; None = when the checkpoint ships `mtp.*` tensors (see
        `convert.plan.plan`).
    mesh, partition, experts: as for `load`.
    Raises ConvertError (one line) for everything `replayjax convert` refuses, and for a model
    the mesh cannot split.
    """
    import jax
    from flax import nnx

    from convert import mappings
    from convert.safetensors_io import Reader
    from convert.table import param_array
    from models.sharding import set_layout

    p = plan(hf_dir, dtype=dtype, mtp=mtp)
    graphdef, state = nnx.split(mappings.abstract_model(p.cfg, p.dtype, p.mtp))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
    rules = _placement(hf_dir, p.cfg, mesh, partition, experts)
    tensors = p.checkpoint.tensors
    placed = {}
    reader = Reader()
    try:
        for rule in sorted(p.table.rules, key=p.read_order):
            shape, dt = p.targets[rule.path]
            host = rules.layout(rule.path, param_array(rule, shape, dt, tensors, reader,
                                                       HOST_BLOCK_BYTES))
            placed[rule.path] = jax.make_array_from_callback(
                shape, rules.sharding(rule.path, shape), lambda index, a=host: a[index])
    finally:
        reader.close()
    _check_finite(hf_dir, placed)
    arrays = [placed[_path(kp)] for kp, _ in leaves]
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, arrays))
    return p.cfg, set_layout(nnx.merge(graphdef, state), rules.tp)


def _check_finite(where: str, params: dict) -> None:
    """ConvertError naming the first param (path -> array) holding a NaN or an infinity: the
    bytes of a damaged checkpoint are not otherwise checked (an uncompressed array's garbage
    reads as numbers), and a model with them would emit token 0 or garbage without a word.
    One launch over all of them, where they are (a GPU reads an 8B model's in milliseconds)."""
    import jax
    import jax.numpy as jnp
    names = list(params)
    ok = np.asarray(jax.jit(lambda xs: jnp.stack([jnp.isfinite(x).all() for x in xs]))(
        [params[n] for n in names]))
    if bad := [n for n, good in zip(names, ok, strict=True) if not good]:
        raise ConvertError(f"{where}: param {'/'.join(map(str, bad[0]))} has NaN or infinite "
                           f"values ({len(bad)} param(s) in all): a damaged or broken "
                           f"checkpoint")


def _key(k):
    return str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
