"""`replayjax generate`: batch generation from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _ids(text):
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids takes comma-separated integers, got {text!r}")


def build_parser():
    ap = argparse.ArgumentParser(prog="replayjax generate",
                                 description="Generate from one or more prompts (run as a batch).")
    ap.add_argument("--model", required=True,
                    help="Hugging Face checkpoint dir or a `replayjax convert` output dir")
    ap.add_argument("--prompt", action="append", default=[],
                    help="text prompt (needs tokenizer.json in the model dir and `tokenizers`)")
    ap.add_argument("--prompt-ids", action="append", default=[], type=_ids,
                    help="comma-separated token ids; repeat for several prompts")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop-ids", type=_ids, default=[])
    ap.add_argument("--ssm-mode", choices=["replay", "standard"], default="replay")
    ap.add_argument("--window", type=int, default=16, help="ReplaySSM ring window L")
    ap.add_argument("--speculative", default="none", help="none | ngram | mtp (needs MTP weights)")
    ap.add_argument("--num-draft", type=int, default=3)
    ap.add_argument("--num-slots", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def _tokenizer(model_dir):
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        sys.exit(f"replayjax generate: --prompt needs {path}; use --prompt-ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("replayjax generate: text prompts need the 'tokenizers' package "
                 "(pip install tokenizers), or use --prompt-ids")
    return Tokenizer.from_file(path)


def main(argv=None):
    args = build_parser().parse_args(argv)
    from replayjax.engine import Engine, Request, RequestError, SamplingParams
    from replayjax.loading import ModelDirError, load_model

    if args.speculative not in ("none", "ngram", "mtp"):
        sys.exit(f"replayjax generate: --speculative {args.speculative!r} is not available "
                 "(this release has: none, ngram, mtp)")
    tok = _tokenizer(args.model) if args.prompt else None
    prompts = [tok.encode(p).ids for p in args.prompt] if tok else []
    prompts += args.prompt_ids
    if not prompts:
        sys.exit("replayjax generate: give at least one --prompt or --prompt-ids")
    try:
        model = load_model(args.model)
        t0 = time.perf_counter()
        engine = Engine(model, num_slots=args.num_slots, max_len=args.max_len,
                        ssm_mode=args.ssm_mode, window=args.window,
                        num_draft=0 if args.speculative == "none" else args.num_draft,
                        drafter="mtp" if args.speculative == "mtp" else "ngram")
        sp = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        results = engine.generate([Request(prompt=p, max_new_tokens=args.max_new_tokens,
                                           stop_ids=tuple(args.stop_ids), sampling=sp, id=i)
                                   for i, p in enumerate(prompts)])
        wall = time.perf_counter() - t0
    except (ModelDirError, RequestError, ValueError) as e:
        sys.exit(f"replayjax generate: {e}")
    rows = []
    for p, c in zip(prompts, results):
        row = dict(prompt_ids=list(p), tokens=c.tokens, finish_reason=c.finish_reason,
                   ttft_s=round(c.ttft_s, 4), completion_s=round(c.completion_s, 4),
                   tpot_s=round(c.tpot_s, 5), accepted_drafts=c.accepted_drafts)
        if tok:
            row["text"] = tok.decode(c.tokens)
        rows.append(row)
    total = sum(len(c.tokens) for c in results)
    if args.json:
        print(json.dumps(dict(results=rows, wall_s=round(wall, 3),
                              tokens_per_s=round(total / wall, 2))))
    else:
        for r in rows:
            print(r.get("text", " ".join(map(str, r["tokens"]))))
        print(f"[{total} tokens in {wall:.2f}s incl. compilation]", file=sys.stderr)
    return 0
