"""Replicated or vocab-parallel LM head at TP = N: the measurement the choice rests on.

    python3 scripts/tp_lm_head.py --tp 2 --batches 1 64 256      # on a 2-GPU machine

Per decode step each device turns hidden states h [b, D] into the next tokens. Replicated: every
device reads the whole head [D, V] and has every logit. Vocab-parallel: each device reads 1/N of
the head's columns; then either all-gathers the fp32 logits (what sampling with top-k / top-p
needs: every logit on every device) or, for greedy rows, all-gathers only each device's (max,
argmax) and picks the best (ties to the lowest id, as `argmax` over the whole vocabulary does).

Measured on two H200s (us per step at batch 1 / 64 / 256; replicated, gather logits, gather
argmax): nemotron-h-8b 262.5 / 283.0 / 413.6, 152.5 / 226.6 / 394.1, 148.1 / 170.1 / 238.0;
qwen3-next-80b-a3b 162.3 / 181.6 / 257.5, 109.7 / 182.6 / 352.7, 114.9 / 120.4 / 165.3;
qwen3.5-9b 476.0 / 502.3 / 746.7, 268.9 / 373.7 / 724.0, 273.3 / 285.7 / 422.1. So
`models.sharding` makes the head vocab-parallel and the decode loop and speculative verify take
the (max, argmax) gather for all-greedy batches (`models.parallel.vocab_argmax`, 1.4-1.8x faster
than replicated at every batch); batches with a sampling row gather the logits (no better than
replicated at large batch x vocab, worse for the 80B's).

Each variant runs `--steps` heads in one jitted loop under `shard_map` (bf16 head, fp32 logits,
random h and head); the table gives us per step, the minimum bytes of the head one device reads
and its copy-bandwidth time (the roofline of the GEMM; the collectives' bytes are not in it).
A fourth variant, the replicated head with its argmax as two plain reductions (max, then the
first index holding it), asks whether XLA's (value, index) reduction is the slow part of greedy
sampling (an old decode profile had a 231 us reduction per step at batch 256 x 131072). Greedy
tokens of all variants are checked equal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

# (hidden D, vocabulary V) of the presets' LM heads (replayjax.bench.synthetic)
SHAPES = {"nemotron-h-8b": (4096, 131072), "qwen3.5-9b": (4096, 248320),
          "qwen3-next-80b-a3b": (2048, 151936)}


def variants(tp: int):
    """{name: step(h [b, D] replicated, w [D, V] per its spec) -> greedy ids [b]} and the spec
    of w each wants."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    f32 = jnp.float32

    def replicated(h, w):
        return jnp.argmax((h @ w).astype(f32), axis=-1).astype(jnp.int32)

    def gather_logits(h, w):
        logits = lax.all_gather((h @ w).astype(f32), "tp", axis=1, tiled=True)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def gather_argmax(h, w):
        logits = (h @ w).astype(f32)
        best = jnp.max(logits, axis=-1)
        idx = jnp.argmax(logits, axis=-1).astype(jnp.int32) + lax.axis_index("tp") * w.shape[1]
        bests = lax.all_gather(best, "tp", axis=1, tiled=False)             # [b, tp]
        idxs = lax.all_gather(idx, "tp", axis=1, tiled=False)
        return jnp.take_along_axis(idxs, jnp.argmax(bests, axis=-1)[:, None], axis=1)[:, 0]

    def replicated_two_pass(h, w):
        # argmax as two plain reductions (max, then the first index holding it; NaN as argmax
        # takes it): XLA's variadic (value, index) reduction may not run at copy bandwidth
        logits = (h @ w).astype(f32)
        best = jnp.max(logits, axis=-1, keepdims=True)
        hit = (logits == best) | jnp.isnan(logits)
        iota = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        return jnp.min(jnp.where(hit, iota, logits.shape[1]), axis=-1)

    return {"replicated": (replicated, P()), "vocab, gather logits": (gather_logits, P(None, "tp")),
            "vocab, gather argmax": (gather_argmax, P(None, "tp")),
            "replicated, two-pass argmax": (replicated_two_pass, P())}


def time_variant(fn, spec, mesh, h, w, steps: int, repeats: int = 3) -> tuple[float, np.ndarray]:
    """(us per step, greedy ids of the last step): `steps` heads in one jitted loop, each on h
    shifted by the step (so no step is hoisted), median of `repeats` timed runs after a warm-up."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def loop(h, w):
        def body(i, ids):
            return fn(h + i.astype(h.dtype), w)
        return lax.fori_loop(0, steps, body, jnp.zeros(h.shape[:1], jnp.int32))

    run = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=(P(), spec), out_specs=P(),
                                check_vma=False))
    w = jax.device_put(w, NamedSharding(mesh, spec))
    h = jax.device_put(h, NamedSharding(mesh, P()))
    ids = np.asarray(run(h, w))                                       # compile + warm-up
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(h, w).block_until_ready()
        took.append(time.perf_counter() - t0)
    return float(np.median(took)) / steps * 1e6, ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1,
                    help="divide D and V by this (a CPU smoke run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from models.sharding import make_mesh
    from replayjax.bench.timing import copy_bandwidth
    try:
        mesh = make_mesh(args.tp)
    except ValueError as e:
        print(f"tp_lm_head: error: --tp {args.tp}: {e}", file=sys.stderr)
        return 1
    bw = copy_bandwidth()
    rows = []
    for name in args.shapes:
        D, V = (s // args.scale for s in SHAPES[name])
        key = jax.random.key(0)
        w = (jax.random.normal(key, (D, V), jnp.float32) * D ** -0.5).astype(jnp.bfloat16)
        for b in args.batches:
            h = jax.random.normal(jax.random.fold_in(key, b), (b, D), jnp.float32)
            h = h.astype(jnp.bfloat16)
            ids = {}
            for label, (fn, spec) in variants(args.tp).items():
                us, ids[label] = time_variant(fn, spec, mesh, h, w, args.steps)
                head = D * V * 2 / (1 if label.startswith("replicated") else args.tp)
                rows.append(dict(shape=name, batch=b, tp=args.tp, variant=label, us=us,
                                 head_mb=head / 1e6, ideal_us=head / bw * 1e6))
            same = all(np.array_equal(v, ids["replicated"]) for v in ids.values())
            for r in rows[-len(ids):]:
                r["greedy_equal"] = same
    if args.json:
        print(json.dumps(dict(copy_gbs=bw / 1e9, rows=rows)))
        return 0
    print(f"tp = {args.tp}, copy bandwidth {bw / 1e9:.0f} GB/s, {args.steps} steps per run\n")
    print("| shape | batch | variant | us per step | head MB per device | ideal us | greedy = |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['batch']} | {r['variant']} | {r['us']:.1f} | "
              f"{r['head_mb']:.0f} | {r['ideal_us']:.1f} | {r['greedy_equal']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
