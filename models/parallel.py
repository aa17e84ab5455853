"""What model code needs to run on 1/tp of the heads (see `models.sharding` for the rules that
place the weights): the "tp" axis inside the Runner's `shard_map`, its all-reduce, local head
counts, the device-major layout of fused projections, and the vocab-parallel LM head's logits
(`gather_vocab`, `vocab_argmax`). Outside shard_map every helper is the single-device identity
(tp = 1)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from models.config import NemotronHConfig

TP = "tp"


def tp_size() -> int:
    """Devices the current trace is split over: the "tp" axis size inside the Runner's
    shard_map, 1 elsewhere."""
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.shape[TP] if TP in mesh.manual_axes else 1


def tp_index():
    """This device's index on the "tp" axis (0 outside shard_map)."""
    return lax.axis_index(TP) if tp_size() > 1 else 0


def tp_sum(x):
    """The all-reduce closing a row-parallel block (a plain all-reduce through XLA / NCCL)."""
    return lax.psum(x, TP) if tp_size() > 1 else x


def gather_vocab(logits, vocab: int):
    """All the logits of a vocab-parallel LM head: logits [..., Vl] fp32 are this device's
    vocabulary shard (columns [r * Vl, (r + 1) * Vl) on tp device r, Vl = vocab / tp), or already
    the whole vocabulary (Vl = vocab: a replicated head, tp = 1), returned as given.
    Returns [..., vocab], the same on every device (an all-gather of b x V fp32 per row)."""
    if logits.shape[-1] == vocab:
        return logits
    return lax.all_gather(logits, TP, axis=logits.ndim - 1, tiled=True)


def vocab_argmax(logits, vocab: int):
    """argmax over the whole vocabulary of `gather_vocab`'s input without gathering the logits:
    each device takes its shard's (max, argmax), all-gathers those [..., tp] and picks the
    best, ties to the lowest token id (lower shards hold lower ids), exactly as `jnp.argmax`
    over [..., vocab] (NaN included: the first NaN). logits [..., Vl] fp32 -> [...] int32."""
    if logits.shape[-1] == vocab:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    best = jnp.max(logits, axis=-1)
    ids = jnp.argmax(logits, axis=-1).astype(jnp.int32) + tp_index() * logits.shape[-1]
    bests, ids = (lax.all_gather(x, TP, axis=x.ndim) for x in (best, ids))     # [..., tp]
    shard = jnp.argmax(bests, axis=-1)                  # the first (lowest) shard on ties
    return jnp.take_along_axis(ids, shard[..., None], axis=-1)[..., 0]


def kv_head(num_heads: int, kv_heads: int):
    """GQA under tp: None when the KV heads are split (tp divides them); else the index of the
    one replicated KV head this device's query heads share (tp is then a multiple of kv)."""
    tp = tp_size()
    if kv_heads % tp == 0:
        return None
    return tp_index() * (num_heads // tp) // (num_heads // kv_heads)


@functools.cache
def local_config(cfg, tp: int):
    """The config of 1/tp of the SSM heads: Mamba-2 heads and groups, GDN key and value heads
    divided by tp (cfg itself at tp = 1), so its derived widths are one device's."""
    if tp == 1:
        return cfg
    if isinstance(cfg, NemotronHConfig):
        return dataclasses.replace(cfg, mamba_num_heads=cfg.mamba_num_heads // tp,
                                   n_groups=cfg.n_groups // tp)
    return dataclasses.replace(cfg, linear_num_key_heads=cfg.linear_num_key_heads // tp,
                               linear_num_value_heads=cfg.linear_num_value_heads // tp)


def fused_view(cfg, tp_layout: int):
    """How a fused projection's output is laid out on this device, for weights laid out
    device-major for tp_layout devices (`models.sharding.TPRules.layout`): (blocks, block cfg,
    device cfg). The columns hold `blocks` = tp_layout / tp blocks, each the pieces of
    1/tp_layout of the heads (`local_config(cfg, tp_layout)`); the device holds 1/tp of the
    heads (`local_config(cfg, tp)`)."""
    tp = tp_size()
    if tp_layout % tp:
        raise ValueError(f"the model's weights are laid out for tp = {tp_layout}, the step runs "
                         f"over tp = {tp}")
    return tp_layout // tp, local_config(cfg, tp_layout), local_config(cfg, tp)


def split_fused(x, sizes, blocks: int):
    """Splits a fused projection's output laid out device-major: x [..., blocks * sum(sizes)]
    holds `blocks` blocks, each [piece_0 (sizes[0]) | piece_1 | ...] of its heads. Returns the
    pieces [..., blocks * size], each in head order (blocks = 1: a plain split)."""
    lead = x.shape[:-1]
    xb = x.reshape(lead + (blocks, sum(sizes)))
    bounds = np.cumsum((0,) + tuple(sizes))
    return [xb[..., a:b].reshape(lead + (blocks * int(b - a),))
            for a, b in zip(bounds, bounds[1:])]
