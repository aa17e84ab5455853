"""`replayjax generate`: batch generation from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np


def _ids(text):
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids takes comma-separated integers, got {text!r}")


def build_parser():
    ap = argparse.ArgumentParser(prog="replayjax generate",
                                 description="Generate from one or more prompts (run as a batch).")
    ap.add_argument("--model", help="Hugging Face checkpoint dir or a `replayjax convert` output "
                    "dir (default: the demo model shipped with the package, a tiny byte-level "
                    "Nemotron-H-style hybrid trained on licence texts)")
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
    ap.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="SSM state (checkpoint) dtype")
    ap.add_argument("--speculative", default="none",
                    help="none | ngram | mtp (needs MTP weights) | draft:DIR (a smaller model "
                         "with the same vocabulary, loaded like --model)")
    ap.add_argument("--num-draft", type=int,
                    help="tokens drafted per speculative step (default 3; needs --speculative)")
    ap.add_argument("--num-slots", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--save-logits", metavar="FILE.npy",
                    help="write the fp32 logits each generated token was sampled from as an "
                         "array [prompts, max_new_tokens, vocab] (np.save format, written to FILE "
                         "as named); rows past a prompt's last token (it stopped early) are NaN")
    ap.add_argument("--stream", action="store_true",
                    help="print the text (or ids) of a single prompt as it is generated, every "
                         "host visit (--steps-per-visit decode steps)")
    ap.add_argument("--steps-per-visit", type=int, default=8,
                    help="decode steps run on device between two host visits")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel degree: split the model over this many devices (this "
                         "host's GPUs, or those of every process under `replayjax launch`)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def _speculative(spec):
    """--speculative value -> (drafter or None, draft model dir or None); exits on a bad one."""
    if spec in ("none", "ngram", "mtp"):
        return (None if spec == "none" else spec), None
    if spec.startswith("draft:") and spec[len("draft:"):]:
        return "draft", spec[len("draft:"):]
    hint = " (give the draft model's directory: draft:DIR)" if spec.startswith("draft") else ""
    sys.exit(f"replayjax generate: --speculative {spec!r} is not available{hint} "
             "(this release has: none, ngram, mtp, draft:DIR)")


def _check_output(path):
    """Fail before any model loads if FILE's directory is missing."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        sys.exit(f"replayjax generate: --save-logits {path!r}: directory {d!r} does not exist")


def _logits_array(results, max_new_tokens, vocab):
    """[prompts, max_new_tokens, vocab] fp32, NaN past each completion's length."""
    out = np.full((len(results), max_new_tokens, vocab), np.nan, np.float32)
    for i, c in enumerate(results):
        out[i, :len(c.logits)] = c.logits
    return out


class _Printer:
    """--stream: writes a request's tokens as they arrive, as text through the tokenizer
    (re-decoding the whole output and writing what is new, so multi-token characters come out
    whole) or as ids."""

    def __init__(self, tok, out=None):
        self.tok, self.out, self.tokens, self.text = tok, out or sys.stdout, [], ""

    def __call__(self, _id, tokens, finished):
        before, self.tokens = len(self.tokens), self.tokens + list(tokens)
        if self.tok is None:
            self.out.write("".join(f"{' ' if before + i else ''}{t}" for i, t in enumerate(tokens)))
        else:
            text = self.tok.decode(self.tokens)
            if text.startswith(self.text) and (finished or not text.endswith("\ufffd")):
                self.out.write(text[len(self.text):])
                self.text = text
            elif finished:      # a decoder that rewrote earlier text: the rest from where it did
                self.out.write(text[len(os.path.commonprefix([text, self.text])):])
        if finished:
            self.out.write("\n")
        self.out.flush()


def _tokenizer(model_dir, required):
    """The model dir's tokenizer; None if it has none and `required` is false."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        if not required:
            return None
        sys.exit(f"replayjax generate: --prompt needs {path}; use --prompt-ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("replayjax generate: text prompts need the 'tokenizers' package "
                 "(pip install tokenizers), or use --prompt-ids")
    return Tokenizer.from_file(path)


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.CRITICAL)   # orbax logs what load_model raises
    import jax.numpy as jnp

    from replayjax.engine import Engine, Request, RequestError, SamplingParams
    from convert import ConvertError
    from replayjax.loading import load_model

    drafter, draft_dir = _speculative(args.speculative)
    if args.num_draft is not None and not drafter:
        sys.exit("replayjax generate: --num-draft needs --speculative ngram, mtp or draft:DIR")
    num_draft = (3 if args.num_draft is None else args.num_draft) if drafter else 0
    if args.save_logits:
        _check_output(args.save_logits)
    from replayjax import demo
    model_dir = args.model or demo.model_dir()
    tok = _tokenizer(model_dir, required=bool(args.prompt))
    prompts = [tok.encode(p).ids for p in args.prompt] if args.prompt else []
    prompts += args.prompt_ids
    if not prompts:
        sys.exit("replayjax generate: give at least one --prompt or --prompt-ids")
    if args.stream and (args.json or len(prompts) != 1):
        sys.exit("replayjax generate: --stream prints one prompt's output as text; give a single "
                 "prompt and no --json")
    from models.sharding import make_mesh
    try:
        mesh = make_mesh(args.tp) if args.tp != 1 else None
    except ValueError as e:
        ap.error(f"argument --tp: {e}")
    try:
        model = load_model(model_dir, mesh=mesh)
        try:
            draft_model = load_model(draft_dir, mesh=mesh) if draft_dir else None
        except ConvertError as e:
            raise ConvertError(f"--speculative draft: {e}") from None
        t0 = time.perf_counter()
        engine = Engine(model, num_slots=args.num_slots, max_len=args.max_len,
                        ssm_mode=args.ssm_mode, window=args.window,
                        state_dtype=jnp.dtype(args.state_dtype),
                        steps_per_visit=args.steps_per_visit,
                        num_draft=num_draft, drafter=drafter,
                        draft_model=draft_model, return_logits=bool(args.save_logits))
        sp = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        results = engine.generate([Request(prompt=p, max_new_tokens=args.max_new_tokens,
                                           stop_ids=tuple(args.stop_ids), sampling=sp, id=i)
                                   for i, p in enumerate(prompts)],
                                  on_tokens=_Printer(tok) if args.stream else None)
        wall = time.perf_counter() - t0
    except (ConvertError, RequestError, ValueError) as e:
        sys.exit(f"replayjax generate: {e}")
    if args.save_logits:        # whole or not at all: write beside it, then rename
        tmp = f"{args.save_logits}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:                      # np.save(name) would append ".npy"
            np.save(f, _logits_array(results, args.max_new_tokens, engine.vocab))
        os.replace(tmp, args.save_logits)
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
        import jax
        mem = jax.local_devices()[0].memory_stats() or {}       # None on CPU
        peak = mem.get("peak_bytes_in_use")
        print(json.dumps(dict(results=rows, wall_s=round(wall, 3),
                              tokens_per_s=round(total / wall, 2),
                              peak_device_mem_gb=round(peak / 1e9, 3) if peak else None)))
    else:
        for r in rows if not args.stream else ():            # streamed already
            print(r.get("text", " ".join(map(str, r["tokens"]))))
        print(f"[{total} tokens in {wall:.2f}s incl. compilation]", file=sys.stderr)
    return 0
