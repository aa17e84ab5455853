#!/usr/bin/env python3
"""Why greedy outputs of random-weight models differ between ReplaySSM and standard decoding
(docs/benchmarks.md): rounding or a defect?

The same random model of a `--synthetic` preset's dimensions (scaled down on a CPU: the first
--layers layers, --hidden; real SSM and attention heads and vocabulary; `replayjax.bench.synthetic`)
decodes the same greedy requests in both SSM modes, once with fp32 weights and once with those
weights rounded to bf16, with the decode attention of `--attention` (xla: the dense reference;
pallas: the Pallas kernel, interpret mode off the GPU). Per weight dtype it reports:
  * the largest relative difference of replay vs standard logits, ||l_r - l_s|| / ||l_s|| per
    token, over every step up to a request's first differing token;
  * how many requests' greedy tokens are identical;
  * the bf16 model's own difference from the fp32 one, on the first token's (the prompt's) logits;
  * at each first differing token, the gap between the standard logits' top two entries, in bf16
    ulps of the top logit (a tie or one ulp means the argmax flips on rounding).

    PYTHONPATH=. python scripts/greedy_divergence.py                 # Qwen3.5-9B, CPU: 8 layers
    PYTHONPATH=. python scripts/greedy_divergence.py --synthetic nemotron-h-8b --attention pallas
    PYTHONPATH=. python scripts/greedy_divergence.py --full          # GPU: the real dimensions
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def config(args):
    """The preset (--full) or a scaled copy: its first --layers layers, --hidden (MLP 3x
    hidden), --vocab; the preset's SSM and attention heads either way."""
    from models.config import parse_config
    from replayjax.bench.synthetic import SYNTHETIC
    c = dict(SYNTHETIC[args.synthetic])
    if not args.full:
        c.update(hidden_size=args.hidden, intermediate_size=3 * args.hidden)
        if args.vocab:
            c.update(vocab_size=args.vocab)
        if "hybrid_override_pattern" in c:          # Nemotron-H: one character per layer
            c.update(hybrid_override_pattern=c["hybrid_override_pattern"][:args.layers])
        else:
            c.update(num_hidden_layers=args.layers)
    return parse_config(c)


def force_attention(impl):
    """Every model's decode attention runs `impl` (the engine's `impl` would change the SSM
    kernels too)."""
    from models import common
    run = common.attention.decode_attention

    def forced(*args, **kwargs):
        return run(*args, **{**kwargs, "impl": impl})     # the caller passes impl="auto"
    common.attention.decode_attention = forced


def decode(cfg, dtype, mode, prompts, args):
    """Greedy tokens and the logits each was chosen from, per request (lists of arrays)."""
    import jax.numpy as jnp

    from models.registry import model_class
    from replayjax.bench.synthetic import randomize
    from replayjax.engine import Engine, Request
    # randomize draws fp32 values keyed by parameter path, then casts: the bf16 model is the
    # fp32 model rounded
    model = randomize(model_class(cfg)(cfg, dtype=jnp.dtype(dtype)), args.seed)
    engine = Engine(model, num_slots=len(prompts), max_len=args.prompt_len + args.new_tokens + 16,
                    ssm_mode=mode, window=args.window, steps_per_visit=16, return_logits=True)
    out = engine.generate([Request(prompt=p, max_new_tokens=args.new_tokens) for p in prompts])
    return [np.asarray(c.tokens) for c in out], [np.asarray(c.logits, np.float64) for c in out]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def top2_gap_ulps(logits):
    """Gap between the two largest logits, in bf16 ulps (8 significant bits) of the largest."""
    top = np.sort(logits)[-2:]
    ulp = 2.0 ** (np.floor(np.log2(abs(top[1]))) - 7)
    return (top[1] - top[0]) / ulp


def compare(runs, prompts):
    """Rows of the report, one per weight dtype."""
    rows = []
    for dtype in ("float32", "bfloat16"):
        (tok_s, log_s), (tok_r, log_r) = runs[dtype, "standard"], runs[dtype, "replay"]
        dev, equal, gaps = 0.0, 0, []
        for ts, tr, ls, lr in zip(tok_s, tok_r, log_s, log_r):
            differ = np.flatnonzero(ts != tr)
            upto = differ[0] + 1 if len(differ) else len(ts)   # the first differing token's
            dev = max(dev, max(rel(lr[i], ls[i]) for i in range(upto)))   # logits still count
            equal += not len(differ)
            if len(differ):
                gaps.append(top2_gap_ulps(ls[differ[0]]))
        vs_fp32 = max(rel(a[0], b[0]) for a, b in zip(runs[dtype, "standard"][1],
                                                       runs["float32", "standard"][1]))
        rows.append(dict(weights=dtype, max_rel_dev=dev, equal=equal, requests=len(prompts),
                         vs_fp32=vs_fp32, gaps=gaps))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", default="qwen3.5-9b",
                    choices=("qwen3.5-9b", "nemotron-h-8b"), help="the preset")
    ap.add_argument("--attention", default="xla", choices=("xla", "pallas"),
                    help="decode attention implementation")
    ap.add_argument("--full", action="store_true", help="the preset's dimensions (a GPU)")
    ap.add_argument("--layers", type=int, default=8, help="layers when scaled down")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size when scaled down")
    ap.add_argument("--vocab", type=int, default=0,
                    help="vocabulary when scaled down (0: the preset's)")
    ap.add_argument("--requests", type=int, default=8, help="greedy requests")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=48, help="tokens generated per request")
    ap.add_argument("--window", type=int, default=16, help="ReplaySSM ring window L")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompts")
    args = ap.parse_args(argv)

    cfg = config(args)
    force_attention(args.attention)
    prompts = np.random.default_rng(args.seed).integers(
        3, cfg.vocab_size, (args.requests, args.prompt_len)).tolist()
    runs = {(d, m): decode(cfg, d, m, prompts, args)
            for d in ("float32", "bfloat16") for m in ("standard", "replay")}
    print(f"{args.synthetic}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab "
          f"{cfg.vocab_size}, {args.attention} attention; {args.requests} greedy requests x "
          f"{args.new_tokens} tokens, L = {args.window}")
    print("| weights | max rel. dev. replay vs standard | greedy tokens equal | model vs fp32 "
          "(first token's logits) | top-2 gap at first difference (bf16 ulps) |\n"
          "|---|---|---|---|---|")
    for r in compare(runs, prompts):
        gaps = ", ".join(f"{g:.1f}" for g in r["gaps"]) or "-"
        print(f"| {r['weights']} | {r['max_rel_dev']:.1e} | {r['equal']} of {r['requests']} | "
              f"{r['vs_fp32']:.1e} | {gaps} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
