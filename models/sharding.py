"""Tensor parallelism over the GPUs of a host (or of several processes): a 1-D `tp` mesh, the
per-family partition rules, the device-major layout of fused projections, cache shardings.

Megatron style. Each device holds 1/tp of the heads of every mixer and of every FFN's width:

* column-parallel in-projections (Mamba-2 / GDN `in_proj`, attention q/k/v, MLP up/gate, the
  experts' up/gate on their width F), row-parallel out-projections (`out_proj`, `o_proj`,
  `down_proj`, the experts' down), so each mixer and each FFN ends with one `psum` (`tp_sum`);
* Mamba-2 heads and groups, GDN key and value heads, attention query heads split across devices;
  KV heads too when tp divides their count, else (tp a multiple of it) replicated: every device
  keeps all KV heads and attends with the one its query heads share;
* MoE experts tensor-parallel inside (each device 1/tp of every expert's width; routing is
  replicated), so any expert count works; or (`experts="experts"`) expert-parallel: each device
  holds E / tp whole experts and computes only the (token, expert) pairs routed to them, and the
  same one psum sums the devices' parts;
* the LM head vocab-parallel (each device V / tp of its columns, so 1/tp of its memory and of
  its reads) when tp divides V; replicated otherwise, and when tied to the embedding
  (`tie_word_embeddings`: the logits come from the replicated embedding). Inside shard_map a head
  gives its shard's logits: the model's methods all-gather them (`parallel.gather_vocab`) where
  full logits are needed; the engine's all-greedy decode and verify steps and the MTP /
  draft-model drafts gather only each device's (max, argmax) (`parallel.vocab_argmax`).
  Measured on two H200s (scripts/tp_lm_head.py): 1.4-1.8x faster than a replicated head at
  batch 1-256, where gathering the fp32 logits [b, V] is no faster than replicated at large
  batch x vocab;
* embedding, norms, routers, MTP projections replicated (the MTP heads use the target's LM
  head, sharded with it).

Fused projections are laid out device-major at load time (`TPRules.layout`, the identity at
tp = 1): the columns of Mamba-2's in_proj [z | x | B | C | dt] become [z_0 | x_0 | B_0 | C_0 |
dt_0 | z_1 | ...] where _r is device r's heads' slice of each piece, likewise GDN's
[q | k | v | z | b | a] and the conv channels [x | B | C] / [q | k | v]. So a device's column
block of the weights is its own heads' pieces and the whole SSM mixer (in_proj -> conv -> kernel
-> gated norm -> out_proj) runs on local heads under `shard_map` with one psum: no state or
activation crosses devices inside it. The mixers read the layout through `split_fused`, which
also serves a laid-out model traced outside shard_map (shapes only, or GSPMD).

`models.runner.Runner` runs a sharded model's whole step under one `jax.shard_map` over the mesh:
params and caches with their specs (`state_specs`: heads on axis 1 of every SSM buffer, the
channel axis of conv states, KV heads when sharded; counts, lengths, state_rows replicated),
every other input and output replicated (`check_vma=False`: the outputs after a psum are the same
on every device).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from models.cache import ModelCache, SSMCache
from models.common import KVCache
from models.config import NemotronHConfig
from models.parallel import TP

# ---------------------------------------------------------------------- mesh

def make_mesh(tp: int, devices=None) -> Mesh:
    """A 1-D ("tp",) mesh over the first `tp` of `devices` (default: every device of every
    process, `jax.devices()`). Auto axis type: `shard_map` then accepts any input placement
    (jax.make_mesh defaults to Explicit). ValueError (one line) if tp exceeds the devices."""
    devices = jax.devices() if devices is None else list(devices)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel degree tp must be a positive integer, got {tp!r}")
    if tp > len(devices):
        raise ValueError(f"tp = {tp} exceeds the {len(devices)} visible "
                         f"{devices[0].platform.upper()} device(s)")
    return jax.make_mesh((tp,), (TP,), axis_types=(AxisType.Auto,), devices=devices[:tp])


def mesh_tp(mesh) -> int:
    """The tp degree of a mesh (1 for None or a mesh without a "tp" axis)."""
    return 1 if mesh is None else dict(mesh.shape).get(TP, 1)


# ---------------------------------------------------------------------- configs and layouts

EXPERT_SPLITS = ("width", "experts")     # tensor parallel inside every expert | expert parallel


def check_tp(cfg, tp: int, experts: str = "width"):
    """ValueError (one line) unless tp divides every count the rules split: query heads, Mamba
    heads and groups, GDN key and value heads, MLP widths, and the expert width (experts
    "width") or the expert count ("experts"); KV heads must divide or be divided by tp
    (replicated when fewer)."""
    if experts not in EXPERT_SPLITS:
        raise ValueError(f"experts must be one of {EXPERT_SPLITS}, got {experts!r}")
    if tp == 1:
        return
    if isinstance(cfg, NemotronHConfig):
        kinds = set(cfg.layer_kinds) | set(cfg.mtp_layer_kinds)
        routed = "n_routed_experts" if experts == "experts" else "moe_intermediate_size"
        need = {"mamba": ("mamba_num_heads", "n_groups"), "attention": ("num_attention_heads",),
                "mlp": ("intermediate_size",),
                "moe": (routed,) + (("moe_shared_expert_intermediate_size",)
                                    if cfg.n_shared_experts else ())}
    else:
        kinds = set(cfg.layer_kinds) | set(cfg.ffn_kinds) | {"attention"}
        if cfg.num_mtp_layers:
            kinds.add(cfg.mtp_ffn_kind)
        routed = "num_experts" if experts == "experts" else "moe_intermediate_size"
        need = {"gdn": ("linear_num_key_heads", "linear_num_value_heads"),
                "attention": ("num_attention_heads",), "mlp": ("intermediate_size",),
                "moe": (routed,) + (("shared_expert_intermediate_size",)
                                    if cfg.shared_expert_intermediate_size else ())}
    if experts == "experts" and "moe" not in kinds:
        raise ValueError("expert parallelism splits MoE experts; the model has no MoE layers")
    for kind in sorted(kinds & set(need)):
        for name in need[kind]:
            if getattr(cfg, name) % tp:
                raise ValueError(f"tp = {tp} does not divide the model's {name} "
                                 f"({getattr(cfg, name)})")
    kv = cfg.num_key_value_heads
    if "attention" in kinds and kv % tp and tp % kv:
        raise ValueError(f"tp = {tp} and the model's num_key_value_heads ({kv}) must divide "
                         f"one another")


def _segments(cfg):
    """{param path regex: (axis, piece sizes)} of the fused params of a family (natural order
    on disk; `TPRules.layout` makes them device-major)."""
    if isinstance(cfg, NemotronHConfig):
        DI, GN, H = cfg.mamba_intermediate_size, cfg.n_groups * cfg.ssm_state_size, \
            cfg.mamba_num_heads
        return {r"mixer/in_proj/kernel$": (1, (DI, DI, GN, GN, H)),
                r"mixer/in_proj/bias$": (0, (DI, DI, GN, GN, H)),
                r"mixer/conv_(weight|bias)$": (0, (DI, GN, GN))}
    KD, VD, Hv = cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.linear_num_value_heads
    return {r"mixer/in_proj/kernel$": (1, (KD, KD, VD, VD, Hv, Hv)),
            r"mixer/conv_weight$": (0, (KD, KD, VD))}


def device_major(sizes, tp: int) -> np.ndarray:
    """Index permutation natural -> device-major of pieces `sizes` (each divisible by tp)."""
    starts = np.cumsum((0,) + tuple(sizes))[:-1]
    return np.concatenate([np.arange(s + r * n // tp, s + (r + 1) * n // tp)
                           for r in range(tp) for s, n in zip(starts, sizes)])


# ---------------------------------------------------------------------- partition rules

_COL, _ROW, _VEC = P(None, TP), P(TP, None), P(TP)
_KV = "kv"              # column-parallel when tp divides the KV heads, else replicated
_VOCAB = "vocab"        # the LM head [D, V]: column-parallel when tp divides V, else replicated
# routed experts [E, din, F] / [E, F, din]: split on F (experts "width"), or on E ("experts")
_EXPERT_IN, _EXPERT_OUT = "expert_in", "expert_out"
_EXPERT_SPECS = {"width": {_EXPERT_IN: P(None, None, TP), _EXPERT_OUT: P(None, TP, None)},
                 "experts": {_EXPERT_IN: P(TP, None, None), _EXPERT_OUT: P(TP, None, None)}}

# (param path regex, spec), first match wins; paths are the "/"-joined keys of the model's
# pure-dict state; whatever matches nothing is replicated (embeddings, norms, routers, latent
# and MTP projections). Row-parallel biases are replicated: added on device 0 only. A tied
# Qwen head has no lm_head param: the embedding it reads stays replicated.
NEMOTRON_H_RULES = (
    (r"^lm_head/kernel$", _VOCAB),
    (r"mixer/in_proj/kernel$", _COL), (r"mixer/in_proj/bias$", _VEC),
    (r"mixer/conv_weight$", _ROW), (r"mixer/conv_bias$", _VEC),
    (r"mixer/(dt_bias|A_log|D|norm)$", _VEC), (r"mixer/out_proj/kernel$", _ROW),
    (r"mixer/q_proj/kernel$", _COL), (r"mixer/q_proj/bias$", _VEC),
    (r"mixer/[kv]_proj/(kernel|bias)$", _KV), (r"mixer/o_proj/kernel$", _ROW),
    (r"up_proj/kernel$", _COL), (r"up_proj/bias$", _VEC), (r"down_proj/kernel$", _ROW),
    (r"mixer/up$", _EXPERT_IN), (r"mixer/down$", _EXPERT_OUT),
)
QWEN_RULES = (
    (r"^lm_head/kernel$", _VOCAB),
    (r"mixer/in_proj/kernel$", _COL), (r"mixer/conv_weight$", _ROW),
    (r"mixer/(dt_bias|A_log)$", _VEC), (r"mixer/out_proj/kernel$", _ROW),
    (r"mixer/q_proj/kernel$", _COL), (r"mixer/q_proj/bias$", _VEC),
    (r"mixer/[kv]_proj/(kernel|bias)$", _KV), (r"mixer/o_proj/kernel$", _ROW),
    (r"(gate|up)_proj/kernel$", _COL), (r"down_proj/kernel$", _ROW),
    (r"mlp/(gate_w|up)$", _EXPERT_IN), (r"mlp/down$", _EXPERT_OUT),
)


class TPRules:
    """A family's partition rules on a mesh: `spec(path, shape)` -> PartitionSpec and
    `layout(path, array)` -> the array laid out device-major (fused params; others as given).
    Loaders take it as `partition=` (`convert.load`, `convert.load_hf`). experts: "width"
    (each device 1/tp of every routed expert's width) or "experts" (1/tp of the experts, whole;
    `models.moe.routed_experts` sees the local stack and dispatches only its own pairs)."""

    def __init__(self, cfg, mesh: Mesh, experts: str = "width"):
        self.cfg, self.mesh, self.tp = cfg, mesh, mesh_tp(mesh)
        check_tp(cfg, self.tp, experts)
        self.experts = experts
        self.rules = NEMOTRON_H_RULES if isinstance(cfg, NemotronHConfig) else QWEN_RULES
        self.segments = _segments(cfg)

    def spec(self, path, shape) -> P:
        if self.tp == 1:
            return P()
        name = "/".join(map(str, path))
        spec = next((s for pat, s in self.rules if re.search(pat, name)), P())
        if spec == _KV:
            kv = self.cfg.num_key_value_heads
            spec = P() if kv % self.tp else (_COL if len(shape) == 2 else _VEC)
        elif spec == _VOCAB:
            spec = P() if shape[1] % self.tp else _COL
        elif spec in (_EXPERT_IN, _EXPERT_OUT):
            spec = _EXPERT_SPECS[self.experts][spec]
        for axis, ax in enumerate(spec):
            if ax == TP and shape[axis] % self.tp:
                raise ValueError(f"param {name} {list(shape)}: axis {axis} is not divisible "
                                 f"by tp = {self.tp}")
        return spec

    __call__ = spec

    def sharding(self, path, shape) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(path, shape))

    def _fused(self, path):
        name = "/".join(map(str, path))
        return next((seg for pat, seg in self.segments.items() if re.search(pat, name)), None)

    def fused(self, path) -> bool:
        """Whether `layout` permutes this param (a fused projection, tp > 1)."""
        return self.tp > 1 and self._fused(path) is not None

    def placer(self, path, shape, donate: bool = False):
        """A jitted function: this param in natural order -> laid out (`layout`) and placed in
        its sharding. Shared by every param with the same layout and sharding (one program per
        shape for all the layers: a jit per param compiled ~1000 times on an 80B MoE model,
        minutes on a GPU)."""
        return _placer(self._fused(path) if self.fused(path) else None,
                       self.sharding(path, shape), donate)

    def layout(self, path, a):
        """a (numpy or jax, natural order) -> device-major for this tp (fused params only)."""
        if not self.fused(path):
            return a
        axis, sizes = self._fused(path)
        idx = device_major(sizes, self.tp)
        return np.take(a, idx, axis) if isinstance(a, np.ndarray) else \
            jnp.take(a, jnp.asarray(idx), axis=axis)


@functools.cache
def _placer(fused, sharding: NamedSharding, donate: bool):
    def place(a):
        if fused is None:
            return a
        axis, sizes = fused
        return jnp.take(a, jnp.asarray(device_major(sizes, mesh_tp(sharding.mesh))), axis=axis)
    return jax.jit(place, out_shardings=sharding, donate_argnums=(0,) if donate else ())


def param_path(kp) -> tuple:
    """A pytree key path of a model's pure-dict state as the rules see it ("layers", 0, ...)."""
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in kp)


def set_layout(model, tp: int):
    """Records on the model's fused-projection mixers that their weights are device-major for
    tp (what `TPRules.layout` produced). Returns the model."""
    from flax import nnx
    for _, node in nnx.iter_graph(model):
        if hasattr(node, "tp_layout"):
            node.tp_layout = tp
    return model


def shard_model(model, mesh: Mesh, experts: str = "width"):
    """A model whose params sit on one device (natural layout), laid out and placed on `mesh`
    with its family's rules (`TPRules`), one param at a time. Returns the new model (the old
    one keeps its arrays until dropped)."""
    from flax import nnx
    rules = TPRules(model.cfg, mesh, experts)
    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)

    def place(kp, a):
        path = param_path(kp)
        return jax.device_put(rules.layout(path, a), rules.sharding(path, a.shape))

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(place, pure))
    return set_layout(nnx.merge(graphdef, state), rules.tp)


def params_mesh(params):
    """The tp mesh (tp > 1) all of `params`' arrays are placed on, or None when they are on a
    single device. ValueError for params split between meshes (a draft model on another one)."""
    meshes = {getattr(a.sharding, "mesh", None) for a in jax.tree.leaves(params)
              if isinstance(a, jax.Array)}
    tp_meshes = {m for m in meshes if m is not None and mesh_tp(m) > 1}
    if not tp_meshes:
        return None
    if len(meshes) > 1:
        raise ValueError("the models' params are on different meshes; place the target and the "
                         "draft model on the same tp mesh")
    mesh = tp_meshes.pop()
    if any(n > 1 for ax, n in dict(mesh.shape).items() if ax != TP):
        raise ValueError(f"only a 1-D ('tp',) mesh is supported, got {dict(mesh.shape)}")
    return mesh


# ---------------------------------------------------------------------- cache shardings

def cache_specs(cache: ModelCache, tp: int) -> ModelCache:
    """PartitionSpecs of a ModelCache (arrays or ShapeDtypeStructs, global shapes): SSM buffers
    on their head axis 1, conv states and pending windows on channels, KV caches on heads when
    tp divides them; counts, lengths, state_rows replicated."""
    heads, channels = P(None, TP), P(None, None, TP)

    def layer(lc):
        if isinstance(lc, SSMCache):
            return SSMCache(jax.tree.map(lambda _: heads, lc.buffers), channels,
                            None if lc.pending is None else channels)
        if isinstance(lc, KVCache):
            spec = channels if lc.k.shape[2] % tp == 0 else P()
            return KVCache(spec, spec)
        return None

    return cache.replace(counts=P(), lengths=P(), state_rows=P(),
                         layers=tuple(map(layer, cache.layers)), mtp=tuple(map(layer, cache.mtp)))


def state_specs(tree, tp: int):
    """Specs of any pytree holding ModelCaches (an engine state, a step's outputs): the caches'
    `cache_specs`, every other leaf replicated."""
    is_cache = lambda x: isinstance(x, ModelCache)
    return jax.tree.map(lambda x: cache_specs(x, tp) if is_cache(x) else P(), tree,
                        is_leaf=is_cache)


def place(build, mesh: Mesh):
    """build() -> a pytree holding caches, created in place on `mesh`: each device allocates
    only its shards of the caches (the other leaves replicated)."""
    specs = state_specs(jax.eval_shape(build), mesh_tp(mesh))
    return jax.jit(build, out_shardings=jax.tree.map(lambda s: NamedSharding(mesh, s),
                                                     specs))()


def replicate(tree, mesh: Mesh):
    """Host or single-device inputs as arrays replicated over `mesh` (what every process of a
    multi-process run passes identically)."""
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda a: jax.device_put(a, sharding), tree)
