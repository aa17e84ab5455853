"""Tensor parallelism on GPUs: the same greedy tokens and logits at tp = 1 and tp = N.

    python3 scripts/tp_check.py --synthetic nemotron-h-8b --tp 2            # random weights
    python3 scripts/tp_check.py --model tests/fixtures/hf/qwen3_next --tp 2   # a checkpoint

Builds (or loads) the model on one device, generates --new-tokens greedy tokens for --batch
random prompts through the engine (plain decode, or --num-draft K n-gram speculation) with their
logits, frees it, does the same split over --tp devices (`models.sharding`), and prints one JSON
line: whether the tokens are equal, the first position they differ at, and the largest logit
difference up to there (logits at a position depend on the tokens before it only). Synthetic
weights are the same bits at every tp (`replayjax.bench.synthetic.random_model`); use
--dtype float32 for a tight comparison.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np


def run(args, tp):
    import jax.numpy as jnp

    from models.sharding import make_mesh
    from replayjax.bench.synthetic import build
    from replayjax.engine import Engine, Request
    from replayjax.loading import load_model
    mesh = make_mesh(tp) if tp > 1 else None
    t0 = time.perf_counter()
    model = (load_model(args.model, mesh=mesh) if args.model else
             build(args.synthetic, jnp.dtype(args.dtype), args.seed, mesh=mesh))
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(3, model.cfg.vocab_size, (args.batch, args.prompt_len)).tolist()
    engine = Engine(model, num_slots=args.batch, max_len=args.prompt_len + args.new_tokens + 16,
                    ssm_mode=args.mode, num_draft=args.num_draft, return_logits=True)
    out = engine.generate([Request(prompt=p, max_new_tokens=args.new_tokens) for p in prompts])
    seconds = time.perf_counter() - t0
    tokens = np.array([c.tokens for c in out])
    logits = np.stack([c.logits for c in out])
    del engine, model
    gc.collect()
    return tokens, logits, seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR")
    src.add_argument("--synthetic", metavar="NAME")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--mode", default="replay", choices=["replay", "standard"])
    ap.add_argument("--num-draft", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t1, l1, s1 = run(args, 1)
    tn, ln, sn = run(args, args.tp)
    same = t1 == tn
    first = int(np.argmin(same.all(0))) if not same.all() else None
    agree = slice(0, None if first is None else first + 1)   # logits up to the first mismatch
    print(json.dumps(dict(
        source=args.model or args.synthetic, dtype=args.dtype, mode=args.mode,
        num_draft=args.num_draft, tp=args.tp, tokens_equal=bool(same.all()),
        rows_equal=int(same.all(1).sum()), rows=len(same), first_mismatch=first,
        max_logit_diff=float(np.abs(l1[:, agree] - ln[:, agree]).max()),
        seconds_tp1=round(s1, 1), seconds_tpn=round(sn, 1))))
    return 0 if same.all() else 1


if __name__ == "__main__":
    sys.exit(main())
