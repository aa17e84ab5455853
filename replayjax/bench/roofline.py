"""Minimum bytes of a decode step, per kernel class, and the ideal time they take at a measured
copy bandwidth: the roofline `replayjax bench` and `replayjax profile` print beside measured
times.

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


def weight_bytes(model, batch: int) -> dict[str, float]:
    """Weight bytes a decode step of `batch` rows reads, per class (see the module docstring).
    Works on a real model or an abstract one (`nnx.eval_shape`). Parameters are classed by the
    modules holding them: experts and routers in a MoE module -> moe; Linear layers elsewhere
    -> gemm; the other parameters of SSM mixers (conv, A, D, dt bias, norm) -> ssm; norms and
    gathered embedding rows -> other."""
    E, k = expert_counts(model.cfg)
    hit = hit_experts(E, k, batch) / E if E else 0.0
    tied = getattr(model, "lm_head", True) is None
    out = dict.fromkeys(CLASSES, 0.0)
    for path, x, owners in model_params(model):
        if len(path) == 1 and path[0] in ("embeddings", "embed_tokens") and tied:
            out["gemm"] += _nbytes(x)          # also the LM head: read whole
        elif len(path) == 1 and path[0] in ("embeddings", "embed_tokens"):
            out["other"] += min(batch, x.shape[0]) * _nbytes(x) / x.shape[0]   # rows gathered
        elif in_moe(owners):
            out["moe"] += _nbytes(x) * (hit if is_routed(owners, x.shape, E) else 1.0)
        elif any(o.endswith("Linear") for o in owners):   # Linear, RowParallelLinear
            out["gemm"] += _nbytes(x)          # projections, MLPs, the LM head
        elif any(o in _SSM_MIXERS for o in owners):
            out["ssm"] += _nbytes(x)
        else:
            out["other"] += _nbytes(x)
    return out


def cache_bytes(model, batch: int, kv_len: float, *, mode: str, window: int,
                state_dtype) -> dict[str, float]:
    """State and KV-cache bytes of a decode step of `batch` rows whose caches hold `kv_len`
    tokens on average, per class: ssm (state, ring, conv state) and attention (KV read + the new
    position written). Shapes come from the model's own `init_cache` (abstractly evaluated)."""
    import jax
    from flax import nnx

    from models.cache import SSMCache
    from models.common import KVCache
    graphdef, params = nnx.split(model)     # traced, so an abstract model works too
    cache = jax.eval_shape(lambda p: nnx.merge(graphdef, p).init_cache(
        2, 1, window=window, state_dtype=state_dtype, ssm_mode="replay"), params)
    out = dict.fromkeys(CLASSES, 0.0)
    for lc in cache.layers:
        if isinstance(lc, SSMCache):
            per_slot = [_nbytes(b) / b.shape[0] for b in lc.buffers]
            state, entry = per_slot[0], sum(per_slot[1:]) / window
            conv = _nbytes(lc.conv) / lc.conv.shape[0]
            out["ssm"] += batch * (ssm_row_bytes(state, entry, window, mode) + 2 * conv)
        elif isinstance(lc, KVCache):
            position = 2 * _nbytes(lc.k) / (lc.k.shape[0] * lc.k.shape[1])
            out["attention"] += batch * (kv_len + 1) * position
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


def table(min_bytes: dict[str, float], copy_bw: float, measured_s: dict[str, float] | None,
          steps: int = 1) -> list[dict]:
    """Rows per class plus a "total" row: min MB per step, ideal us at `copy_bw` bytes/s and,
    with `measured_s` (seconds per class over `steps` steps), measured us per step and the
    fraction of the roofline achieved (ideal / measured)."""
    rows = []
    classes = list(CLASSES) + ["total"]
    for c in classes:
        b = sum(min_bytes.values()) if c == "total" else min_bytes.get(c, 0.0)
        row = dict(cls=c, min_mb=b / 1e6, ideal_us=b / copy_bw * 1e6)
        if measured_s is not None:
            s = sum(measured_s.values()) if c == "total" else measured_s.get(c, 0.0)
            row["measured_us"] = s / steps * 1e6
            row["of_roofline"] = row["ideal_us"] / row["measured_us"] if s else None
        rows.append(row)
    return rows
