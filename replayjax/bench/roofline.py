"""Minimum bytes and FLOPs of a decode step, per kernel class, and the ideal time they take: the
roofline `replayjax bench` and `replayjax profile` print beside measured times.

A decode step of `batch` rows must at least move (each counted once):
  * weights: every parameter the step touches -- the embedding rows it gathers, all dense
    weights (mixer projections, MLPs, attention projections, norms), the LM head; for MoE layers
    the router, shared expert and the routed experts actually hit, E (1 - (1 - k/E)^batch) of E
    when each row picks k experts uniformly; the MTP head is not part of a decode step;
  * SSM state per row and SSM layer: standard = state read + written; replay = state read +
    written once per L steps + the (L - 1) / 2 ring entries held on average + one appended; plus
    the conv state read and written;
  * the KV cache read at the rows' actual lengths and the new position written;
  * token I/O: one token id in and one out per row.
Sampling needs no bytes of its own (a fused LM head + argmax never stores the logits), so any
time it takes is overhead by this model.

and must at least compute (multiply-add = 2 FLOPs):
  * gemm: 2 x batch x the params of the Linear layers outside MoE layers (mixer, MLP and
    attention projections, the LM head or the tied embedding read as it; not the gathered
    embedding rows);
  * moe: 2 x batch x (the k of E routed experts each row uses + the shared expert + the router);
  * attention: QK^T and PV over the kv_len cached positions + the new one, 2 x 2 x batch x heads
    x head_dim x (kv_len + 1) per attention layer;
  * ssm, rough (small beside the GEMMs; per row and SSM layer, S state elements, e elements of
    one ring entry, c conv-state elements): standard 5 S (decay, rank-1 update, readout; Gated
    DeltaNet's S^T k is left out) + 2 c (the conv); replay 4 S (the readout from the checkpoint,
    and the fold of L entries into it every L steps) + 2 e (L + 1) / 2 (a dot product and a
    weighted sum per ring entry held, on average, plus the new token) + 2 c;
  * norms, gates, sampling, collectives: 0.
The ideal time of a class is the larger of its bytes at the copy bandwidth and its FLOPs at the
bf16 dense peak (`bound`); the step's is the sum over classes. Without a known peak the FLOPs
bind nothing: the ideal is the bytes' alone.
"""

from __future__ import annotations

import math

CLASSES = ("ssm", "gemm", "attention", "moe", "sampling", "collective", "other")
_SSM_MIXERS = ("Mamba2Mixer", "GatedDeltaNet")


def ssm_row_bytes(state: float, entry: float, window: int, mode: str) -> float:
    """Minimum state bytes of one row, SSM layer and decode step: `state` bytes of state, ring
    entries of `entry` bytes, ring window L = `window`."""
    if mode == "standard":
        return 2 * state
    return state + state / window + entry * (window - 1) / 2 + entry


def hit_experts(num_experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts hit when `rows` rows each pick `top_k` of `num_experts`
    uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** rows)


def _nbytes(x) -> int:
    return math.prod(x.shape) * x.dtype.itemsize


def expert_counts(cfg) -> tuple[int, int]:
    """(routed experts E, experts per token k) of a config, (0, 0) without MoE."""
    return (getattr(cfg, "n_routed_experts", 0) or getattr(cfg, "num_experts", 0),
            cfg.num_experts_per_tok)


def model_params(model):
    """(path, value, type names of the modules holding it, outermost first) of every param of
    `model` (real or abstract, `nnx.eval_shape`) outside the MTP head."""
    from flax import nnx
    nodes = list(nnx.iter_graph(model))          # children come before their module
    types = {tuple(p): type(n).__name__ for p, n in nodes if isinstance(n, nnx.Module)}
    for path, node in nodes:
        if isinstance(node, nnx.Param) and path[0] != "mtp":
            yield path, node.get_value(), [types.get(tuple(path[:i]), "")
                                           for i in range(len(path))]


def in_moe(owners) -> bool:
    """Whether a param with these owners (`model_params`) belongs to a MoE layer."""
    return any("moe" in o.lower() for o in owners)


def is_routed(owners, shape, num_experts: int) -> bool:
    """Whether a param is a MoE layer's stack of routed experts [E, ...]."""
    return in_moe(owners) and len(shape) == 3 and shape[0] == num_experts


def param_classes(model):
    """(class, use, value) of every param of `model` (real or abstract, `nnx.eval_shape`) outside
    the MTP head, classed by the modules holding it: experts and routers in a MoE module -> moe;
    Linear layers elsewhere -> gemm; the other parameters of SSM mixers (conv, A, D, dt bias,
    norm) -> ssm; norms and the embedding -> other, or gemm when it is the tied LM head. `use`:
    "rows" (an embedding: the step gathers a row per token), "routed" (a MoE layer's stack of
    routed experts [E, ...]: a row uses k of E) or "whole"."""
    E, _ = expert_counts(model.cfg)
    tied = getattr(model, "lm_head", True) is None
    for path, x, owners in model_params(model):
        if len(path) == 1 and path[0] in ("embeddings", "embed_tokens"):
            yield ("gemm", "whole", x) if tied else ("other", "rows", x)
        elif in_moe(owners):
            yield "moe", "routed" if is_routed(owners, x.shape, E) else "whole", x
        elif any(o.endswith("Linear") for o in owners):   # Linear, RowParallelLinear
            yield "gemm", "whole", x           # projections, MLPs, the LM head
        elif any(o in _SSM_MIXERS for o in owners):
            yield "ssm", "whole", x
        else:
            yield "other", "whole", x


def weight_bytes(model, batch: int) -> dict[str, float]:
    """Weight bytes a decode step of `batch` rows reads, per class (`param_classes`; see the
    module docstring): gathered embedding rows, the routed experts hit, everything else whole.
    Works on a real model or an abstract one (`nnx.eval_shape`)."""
    E, k = expert_counts(model.cfg)
    hit = hit_experts(E, k, batch) / E if E else 0.0
    out = dict.fromkeys(CLASSES, 0.0)
    for cls, use, x in param_classes(model):
        if use == "rows":
            out[cls] += _nbytes(x) * min(batch, x.shape[0]) / x.shape[0]
        else:
            out[cls] += _nbytes(x) * (hit if use == "routed" else 1.0)
    return out


def weight_flops(model, batch: int) -> dict[str, float]:
    """FLOPs of the matmuls with the weights in a decode step of `batch` rows, per class: 2 x
    batch x the gemm and moe params a row uses (a routed expert stack k / E of it; gathered
    embedding rows, norms and SSM mixer params do no matmul)."""
    E, k = expert_counts(model.cfg)
    out = dict.fromkeys(CLASSES, 0.0)
    for cls, use, x in param_classes(model):
        if cls in ("gemm", "moe"):
            out[cls] += 2.0 * batch * math.prod(x.shape) * (k / E if use == "routed" else 1.0)
    return out


def _abstract_cache(model, window: int, state_dtype):
    """The shapes of a 2-slot, 1-position replay-mode cache of `model` (its own `init_cache`,
    abstractly evaluated: a real or abstract model)."""
    import jax
    from flax import nnx
    graphdef, params = nnx.split(model)     # traced, so an abstract model works too
    return jax.eval_shape(lambda p: nnx.merge(graphdef, p).init_cache(
        2, 1, window=window, state_dtype=state_dtype, ssm_mode="replay"), params)


def _slot_bytes(x) -> float:
    """Bytes of one slot of a pool [S, ...]."""
    return _nbytes(x) / x.shape[0]


def _slot_size(x) -> int:
    """Elements of one slot of a pool [S, ...]."""
    return math.prod(x.shape[1:])


def cache_bytes(model, batch: int, kv_len: float, *, mode: str, window: int,
                state_dtype) -> dict[str, float]:
    """State and KV-cache bytes of a decode step of `batch` rows whose caches hold `kv_len`
    tokens on average, per class: ssm (state, ring, conv state) and attention (KV read + the new
    position written). Shapes come from the model's own `init_cache` (abstractly evaluated)."""
    from models.cache import SSMCache
    from models.common import KVCache
    out = dict.fromkeys(CLASSES, 0.0)
    for lc in _abstract_cache(model, window, state_dtype).layers:
        if isinstance(lc, SSMCache):
            per_slot = [_slot_bytes(b) for b in lc.buffers]
            state, entry = per_slot[0], sum(per_slot[1:]) / window
            out["ssm"] += batch * (ssm_row_bytes(state, entry, window, mode)
                                   + 2 * _slot_bytes(lc.conv))
        elif isinstance(lc, KVCache):
            position = 2 * _nbytes(lc.k) / (lc.k.shape[0] * lc.k.shape[1])
            out["attention"] += batch * (kv_len + 1) * position
    return out


def ssm_row_flops(state: float, entry: float, conv: float, window: int, mode: str) -> float:
    """Rough FLOPs of one row, SSM layer and decode step (module docstring): `state` elements of
    state, ring entries of `entry` elements, `conv` conv-state elements, ring window L =
    `window`."""
    if mode == "standard":
        return 5 * state + 2 * conv
    return 4 * state + 2 * entry * (window + 1) / 2 + 2 * conv


def decode_step_flops(model, batch: int, kv_len: float, *, mode: str, window: int,
                      state_dtype) -> dict[str, float]:
    """Minimum FLOPs of one decode step of `batch` rows whose caches hold `kv_len` tokens on
    average, per class (`CLASSES`; module docstring): gemm and moe (`weight_flops`), attention
    (QK^T and PV at kv_len + 1 positions), ssm (`ssm_row_flops`, rough); 0 for the rest. Works
    on a real model or an abstract one; arguments as `decode_step_bytes`."""
    from models.cache import SSMCache
    cfg = model.cfg
    out = weight_flops(model, batch)
    out["attention"] = (cfg.layer_kinds.count("attention") * 2.0 * 2 * batch
                        * cfg.num_attention_heads * cfg.head_dim * (kv_len + 1))
    for lc in _abstract_cache(model, window, state_dtype).layers:
        if isinstance(lc, SSMCache):
            sizes = [_slot_size(b) for b in lc.buffers]
            out["ssm"] += batch * ssm_row_flops(sizes[0], sum(sizes[1:]) / window,
                                                _slot_size(lc.conv), window, mode)
    return out


def decode_step_bytes(model, batch: int, kv_len: float, *, mode: str, window: int,
                      state_dtype) -> dict[str, float]:
    """Minimum bytes of one decode step per class (`CLASSES`): weights, state, KV cache and
    token I/O (one int32 id in and one out per row, under "other")."""
    out = weight_bytes(model, batch)
    for c, b in cache_bytes(model, batch, kv_len, mode=mode, window=window,
                            state_dtype=state_dtype).items():
        out[c] += b
    out["other"] += 2 * 4 * batch
    return out


def bound(nbytes: float, flops: float, copy_bw: float, peak: float | None) -> dict:
    """The roofline of `nbytes` moved at `copy_bw` bytes/s and `flops` done at `peak` FLOP/s
    (None: no peak known, the bytes alone): byte_s, flop_s (None without a peak), ideal_s (the
    larger) and bound ("flops" when the FLOPs take longer, else "bytes")."""
    byte_s = nbytes / copy_bw
    flop_s = flops / peak if peak else None
    flops_bind = flop_s is not None and flop_s > byte_s
    return dict(byte_s=byte_s, flop_s=flop_s, ideal_s=flop_s if flops_bind else byte_s,
                bound="flops" if flops_bind else "bytes")


def step_roofline(min_bytes: dict[str, float], min_flops: dict[str, float] | None,
                  copy_bw: float, peak: float | None) -> dict[str, dict]:
    """`bound` per class of `CLASSES` (`min_flops` None: no FLOPs) and a "total": the sums of
    byte_s, flop_s and ideal_s (the step's ideal is the sum of the classes' ideals), bound the
    bound of the classes that make up most of that ideal."""
    flops = min_flops or {}
    out = {c: bound(min_bytes.get(c, 0.0), flops.get(c, 0.0), copy_bw, peak) for c in CLASSES}
    by_bound = {b: sum(r["ideal_s"] for r in out.values() if r["bound"] == b)
                for b in ("bytes", "flops")}
    out["total"] = dict(
        byte_s=sum(min_bytes.values()) / copy_bw,
        flop_s=sum(flops.values()) / peak if peak else None,
        ideal_s=sum(by_bound.values()),
        bound="flops" if by_bound["flops"] > by_bound["bytes"] else "bytes")
    return out


def peak_note(tflops: float | None) -> str:
    """A report header's word on the FLOP bound: the peak TFLOP/s it is taken at, or that none
    is known (the ideal is the bytes' alone)."""
    return (f"bf16 peak {tflops:g} TFLOP/s" if tflops else
            "no bf16 peak known (--peak-tflops): ideal from bytes alone")


def table(min_bytes: dict[str, float], copy_bw: float, measured_s: dict[str, float] | None,
          steps: int = 1, min_flops: dict[str, float] | None = None,
          peak: float | None = None) -> list[dict]:
    """Rows per class plus a "total" row (`step_roofline`): min MB and GFLOP per step, ideal us
    (the binding bound) with the bytes' at `copy_bw` bytes/s and the FLOPs' at `peak` FLOP/s (None
    without a peak: the ideal is the bytes') and which binds; with `measured_s` (seconds per
    class over `steps` steps), measured us per step and the fraction of the roofline achieved
    (ideal / measured)."""
    flops = min_flops or {}
    rows = []
    for c, r in step_roofline(min_bytes, flops, copy_bw, peak).items():
        total = c == "total"
        b = sum(min_bytes.values()) if total else min_bytes.get(c, 0.0)
        f = sum(flops.values()) if total else flops.get(c, 0.0)
        row = dict(cls=c, min_mb=b / 1e6, min_gflop=f / 1e9, ideal_us=r["ideal_s"] * 1e6,
                   bytes_us=r["byte_s"] * 1e6,
                   flops_us=None if r["flop_s"] is None else r["flop_s"] * 1e6, bound=r["bound"])
        if measured_s is not None:
            s = sum(measured_s.values()) if total else measured_s.get(c, 0.0)
            row["measured_us"] = s / steps * 1e6
            row["of_roofline"] = row["ideal_us"] / row["measured_us"] if s else None
        rows.append(row)
    return rows
