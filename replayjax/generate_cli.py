"""`replayjax generate`: generation from the command line, every prompt in one batch."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

from replayjax import commandline as cli

PROG = "replayjax generate"
DESCRIPTION = """\
Generate from one or more prompts, run together as one batch. Without --model it runs the demo
model shipped with the package (a 2.6M-parameter byte-level Nemotron-H-style hybrid trained on
licence texts): CPU, seconds.

Sampling: --temperature 0 (the default) is greedy decoding, the most likely token at every step,
so --top-k, --top-p and --seed change nothing. With --temperature > 0 tokens are sampled, after
the --top-k and --top-p filters, with keys derived from --seed (default 0) and the position: the
same seed gives the same text, whatever else is in the batch. --speculative samples the same
distribution but draws its random numbers otherwise (a draft is accepted by chance), so a seed's
text differs with it, and with --num-draft.

Output: one prompt's completion as plain text; with several prompts a header before each one
("==> prompt 2/3: 'The licenses ' <=="). --jsonl: one JSON object per prompt. --json: one object
with every result and the timings; throughput excludes compilation, which a warm-up does first
and which is reported apart (compile_s). A summary line goes to stderr."""

DRAFTERS = ("none", "ngram", "mtp", "draft:DIR")
DEFAULT_NUM_DRAFT = 3


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt as given: `text` (--prompt) or `ids` (--prompt-ids)."""
    text: str | None = None
    ids: tuple = ()

    def label(self, width: int = 60) -> str:
        """The prompt as given, shortened: its text quoted (escapes shown), or its ids."""
        shown = repr(self.text) if self.text is not None else ",".join(map(str, self.ids))
        return shown if len(shown) <= width else shown[:width - 3] + "..."


def _text_prompt(text):
    try:        # bytes that are not UTF-8 reach argv as lone surrogates: no tokenizer takes them
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: byte "
                                         f"{text[e.start].encode('utf-8', 'surrogateescape')!r} "
                                         f"at character {e.start}") from None
    return Prompt(text=cli.nonempty(text))


def _ids_prompt(text):
    return Prompt(ids=tuple(cli.token_ids(text)))


def _speculative(text):
    """argparse type: --speculative none | ngram | mtp | draft:DIR -> (drafter or None, DIR or
    None)."""
    if text in ("none", "ngram", "mtp"):
        return (None if text == "none" else text), None
    if text.startswith("draft:") and text[len("draft:"):].strip():
        return "draft", text[len("draft:"):]
    hint = " (give the draft model's directory: draft:DIR)" if text.startswith("draft") else ""
    raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(DRAFTERS)}{hint}")


def build_parser():
    ap = cli.parser(PROG, DESCRIPTION, [
        f'{PROG} --prompt "This program is free software; "',
        f'{PROG} --prompt "GNU " --prompt "The licenses " --temperature 0.8 --top-p 0.95 '
        "--seed 1 --jsonl",
        f"{PROG} --model DIR --prompt-ids 1,2,3 --speculative mtp --num-draft 3 --json"])
    p = ap.add_argument_group("prompts")
    p.add_argument("--model", metavar="DIR", type=cli.nonempty,
                   help="Hugging Face checkpoint directory or a `replayjax convert` output "
                        "(default: the demo model)")
    p.add_argument("--prompt", dest="prompts", action="append", default=[], type=_text_prompt,
                   metavar="TEXT", help="a text prompt, encoded by the model directory's "
                                        "tokenizer.json; repeat for several")
    p.add_argument("--prompt-ids", dest="prompts", action="append", type=_ids_prompt,
                   metavar="IDS", help="a prompt as comma-separated token ids, e.g. 1,2,3; "
                                       "repeat for several")
    p.add_argument("--max-new-tokens", type=cli.at_least(1), default=32, metavar="N",
                   help="tokens generated per prompt (fewer if a stop id comes first)")
    p.add_argument("--stop-ids", type=cli.token_ids, metavar="IDS",
                   help="comma-separated token ids that end a completion (kept in it) "
                        "(default: none)")
    s = ap.add_argument_group("sampling")
    s.add_argument("--temperature", type=cli.number(0, note=" (0 = greedy)"), default=0.0,
                   metavar="T", help="0 = greedy (the most likely token); > 0 samples, higher "
                                     "is more random")
    s.add_argument("--top-k", type=cli.at_least(0), default=0, metavar="K",
                   help="sample among the K most likely tokens only; 0 = off (as is K >= "
                        "the vocabulary)")
    s.add_argument("--top-p", type=cli.number(0, 1, lo_open=True), default=1.0, metavar="P",
                   help="sample among the most likely tokens whose probabilities add up to P; "
                        "1 = off")
    s.add_argument("--seed", type=cli.in_range(0, cli.INT32_MAX), default=0, metavar="S",
                   help="sampling seed; the same seed gives the same output with the same "
                        "--speculative and --num-draft")
    d = ap.add_argument_group("decoding")
    d.add_argument("--ssm-mode", choices=["replay", "standard"], default="replay",
                   help="how SSM layers decode: ReplaySSM or the standard recurrence")
    d.add_argument("--window", type=cli.window, default=16, metavar="L",
                   help="ReplaySSM ring window (a power of two)")
    d.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="SSM state (checkpoint) dtype")
    d.add_argument("--speculative", type=_speculative, default="none", metavar="DRAFTER",
                   help="speculative decoding: none | ngram (prompt lookup) | mtp (the model's "
                        "MTP head) | draft:DIR (a smaller model with the same vocabulary)")
    d.add_argument("--num-draft", type=cli.in_range(1, cli.MAX_VERIFY_TOKENS - 1), metavar="K",
                   help=f"tokens drafted per speculative step, < --window (default: "
                        f"{DEFAULT_NUM_DRAFT} with --speculative)")
    d.add_argument("--num-slots", type=cli.at_least(1), default=8, metavar="N",
                   help="prompts decoded at once (more wait for a free slot)")
    d.add_argument("--max-len", type=cli.at_least(2), default=2048, metavar="N",
                   help="cache length per slot: prompt + new tokens (+ drafts) must fit")
    d.add_argument("--steps-per-visit", type=cli.at_least(1), default=8, metavar="N",
                   help="decode steps (or speculative steps of a device drafter) run on the "
                        "device between two host visits")
    cli.add_prefix_arguments(d)
    cli.add_batching_argument(d)
    cli.add_tp_argument(d)
    o = ap.add_argument_group("output")
    o.add_argument("--stream", action="store_true",
                   help="print a single prompt's output as it is generated (every host visit)")
    o.add_argument("--json", action="store_true",
                   help="print one JSON object: every result, timings and peak memory")
    o.add_argument("--jsonl", action="store_true", help="print one JSON object per prompt")
    o.add_argument("--save-logits", metavar="FILE.npy", type=cli.nonempty,
                   help="write the fp32 logits each generated token was sampled from, "
                        "[prompts, max_new_tokens, vocab] (np.save format, to FILE as named); "
                        "rows past a prompt's last token are NaN")
    o.add_argument("--logprobs", type=cli.in_range(0, cli.MAX_TOP_LOGPROBS), metavar="N",
                   help="with --json / --jsonl: each generated token's log probability under "
                        "the model (log-softmax of its logits) and the N most likely tokens' "
                        "(a result's \"logprobs\": [[logprob, [[id, logprob], ...]], ...])")
    return ap


def parse_args(argv=None):
    """Parsed arguments, every flag and combination checked (exit 2 naming the flag); fills
    in args.drafter, args.draft_dir and args.num_draft."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.prompts:
        ap.error("argument --prompt: give at least one --prompt TEXT or --prompt-ids IDS")
    args.drafter, args.draft_dir = args.speculative
    if not args.drafter:
        if args.num_draft is not None:
            ap.error("argument --num-draft: needs --speculative ngram, mtp or draft:DIR")
        args.num_draft = 0
    elif args.num_draft is None:
        args.num_draft = DEFAULT_NUM_DRAFT
        if args.num_draft >= args.window:
            ap.error(f"argument --num-draft: the default K = {args.num_draft} must be < --window "
                     f"{args.window}; give --num-draft")
    elif args.num_draft >= args.window:
        ap.error(f"argument --num-draft: K = {args.num_draft} must be < --window {args.window}")
    if args.max_new_tokens + args.num_draft >= args.max_len:
        ap.error(f"argument --max-len: {args.max_len} leaves no room for a prompt: "
                 f"--max-new-tokens {args.max_new_tokens} + drafts {args.num_draft} must be "
                 f"< --max-len")
    if args.json and args.jsonl:
        ap.error("argument --jsonl: give --json (one object) or --jsonl (one line per prompt)")
    if args.stream and (args.json or args.jsonl):
        ap.error("argument --stream: prints text as it comes; not with --json / --jsonl")
    if args.logprobs is not None and not (args.json or args.jsonl):
        ap.error("argument --logprobs: they are printed in --json / --jsonl output")
    if args.logprobs is not None and args.save_logits:
        ap.error("argument --logprobs: not with --save-logits (the logits hold them: their "
                 "log-softmax)")
    if args.stream and len(args.prompts) > 1:
        ap.error(f"argument --stream: prints one prompt's output; got {len(args.prompts)} "
                 f"prompts")
    return args


# ---------------------------------------------------------------------- inputs

def _tokenizer(model_dir, required):
    """The model directory's tokenizer; None if it has none and `required` is false."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        if required:
            raise cli.UserError(f"--prompt needs {path}, which does not exist; use --prompt-ids "
                                f"instead")
        return None
    cli.existing_file("tokenizer", path)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise cli.UserError("--prompt: text prompts need the 'tokenizers' package "
                            "(pip install tokenizers), or use --prompt-ids") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:      # noqa: BLE001 -- the library raises plain Exceptions
        raise cli.UserError(f"{path}: not a valid tokenizer.json "
                            f"({' '.join(str(e).split())[:120]})") from None


def _token_lists(args, tok, vocab):
    """Each prompt's token ids, checked against the vocabulary and --max-len (UserError naming
    the prompt)."""
    out = []
    for p in args.prompts:
        flag = "--prompt" if p.text is not None else "--prompt-ids"
        ids = tuple(tok.encode(p.text).ids) if p.text is not None else p.ids
        if not ids:
            raise cli.UserError(f"{flag} {p.label()}: encodes to no tokens")
        if bad := [t for t in ids if t >= vocab]:
            why = " (the tokenizer does not match the model)" if p.text is not None else ""
            raise cli.UserError(f"{flag} {p.label()}: token id {bad[0]} is outside the "
                                f"model's vocabulary [0, {vocab}){why}")
        need = len(ids) + args.max_new_tokens + args.num_draft
        if need > args.max_len:
            raise cli.UserError(f"{flag} {p.label()}: {len(ids)} prompt tokens + --max-new-tokens "
                                f"{args.max_new_tokens} + drafts {args.num_draft} = {need} "
                                f"exceed --max-len {args.max_len}")
        out.append(ids)
    if bad := [t for t in args.stop_ids or () if t >= vocab]:
        raise cli.UserError(f"--stop-ids: token id {bad[0]} is outside the model's vocabulary "
                            f"[0, {vocab})")
    return out


def check_inputs(args):
    """Every input before any heavy work (UserError naming the flag and file): the model and
    draft directories, the tokenizer, the prompts, the output path. Returns (model dir,
    tokenizer or None, token lists)."""
    from replayjax import demo
    model_dir = args.model or demo.model_dir()
    cfg, has_mtp = cli.model_dir("--model", model_dir)
    if args.drafter == "mtp" and not has_mtp:
        raise cli.UserError(f"--speculative mtp: the model in {model_dir} has no MTP head (no "
                            f"mtp.* tensors); use ngram or draft:DIR")
    if args.draft_dir:
        draft_cfg, _ = cli.model_dir("--speculative draft:DIR", args.draft_dir)
        if draft_cfg.vocab_size != cfg.vocab_size:
            raise cli.UserError(f"--speculative draft:{args.draft_dir}: vocabulary of "
                                f"{draft_cfg.vocab_size} tokens, the model's has "
                                f"{cfg.vocab_size}")
    experts = cli.expert_split(args)
    if args.tp > 1:
        cli.check_tp("--tp", args.tp, cfg, experts)
    tok = _tokenizer(model_dir, required=any(p.text is not None for p in args.prompts))
    prompts = _token_lists(args, tok, cfg.vocab_size)
    cli.output_path("--save-logits", args.save_logits)
    return model_dir, tok, prompts


# ---------------------------------------------------------------------- running

def _load(flag, path, mesh=None, experts="width", dtype=None):
    from convert import ConvertError
    from replayjax.loading import load_model
    try:
        return load_model(path, mesh=mesh, experts=experts, dtype=dtype)
    except ConvertError as e:
        raise cli.UserError(f"{flag}: {e}") from None


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


def _logits_array(results, max_new_tokens, vocab):
    """[prompts, max_new_tokens, vocab] fp32, NaN past each completion's length."""
    import numpy as np
    out = np.full((len(results), max_new_tokens, vocab), np.nan, np.float32)
    for i, c in enumerate(results):
        out[i, :len(c.logits)] = c.logits
    return out


def generate(args, tok, model_dir, prompts):
    """Loads, builds the engine, warms up (compiles), generates. Returns (completions, engine,
    timings {load_s, compile_s, generate_s})."""

    from replayjax import demo
    from replayjax.engine import Engine, Request, SamplingParams
    progress = cli.Progress(3 + bool(args.draft_dir) + (not args.stream), cli.interactive(args))
    try:
        t0 = time.perf_counter()
        mesh, experts = cli.tp_placement(args)
        with progress.stage("loading the model"):
            model = _load("--model", model_dir, mesh, experts,
                          dtype=None if args.model else demo.DTYPE)
        draft_model = None
        if args.draft_dir:
            with progress.stage("loading the draft model"):
                draft_model = _load("--speculative draft:DIR", args.draft_dir, mesh, experts)
        with progress.stage("allocating the cache"):
            try:
                engine = Engine(model, draft_model=draft_model,
                                return_logits=bool(args.save_logits), logprobs=args.logprobs,
                                **cli.engine_settings(args))
            except MemoryError as e:
                raise cli.UserError(f"--num-slots {args.num_slots}, --max-len {args.max_len}: "
                                    f"{e}") from None
            except ValueError as e:     # settings this model cannot serve
                raise cli.engine_error(e) from None
        load_s = time.perf_counter() - t0
        sp = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        requests = [Request(prompt=list(p), max_new_tokens=args.max_new_tokens,
                            stop_ids=tuple(args.stop_ids or ()), sampling=sp, id=i)
                    for i, p in enumerate(prompts)]
        with progress.stage("compiling (warm-up)"):
            compile_s = engine.warm_up(requests)
        engine.clear_prefix_cache()         # what the warm-up cached would flatter the run
        t0 = time.perf_counter()
        if args.stream:
            progress.close()
            results = engine.generate(requests, on_tokens=_Printer(tok))
        else:
            total, done = args.max_new_tokens * len(requests), [0]

            def count(_id, tokens, finished):
                done[0] += len(tokens)
                progress.note(f"{done[0]}/{total} tokens")
            with progress.stage(f"generating {len(requests)} prompt(s)"):
                results = engine.generate(requests, on_tokens=count)
        generate_s = time.perf_counter() - t0
        if failed := [i for i, c in enumerate(results) if c.finish_reason == "error"]:
            raise cli.UserError(f"prompt {failed[0] + 1} of {len(results)}: "
                                f"{results[failed[0]].error}")
    finally:
        progress.close()
    return results, engine, dict(load_s=load_s, compile_s=compile_s, generate_s=generate_s)


# ---------------------------------------------------------------------- output

def _row(i, p, ids, c, tok):
    row = dict(index=i, prompt=p.text, prompt_ids=list(ids), tokens=c.tokens,
               finish_reason=c.finish_reason, ttft_s=round(c.ttft_s, 4),
               completion_s=round(c.completion_s, 4), tpot_s=round(c.tpot_s, 5),
               accepted_drafts=c.accepted_drafts, cached_tokens=c.cached_tokens)
    if tok:
        row["text"] = tok.decode(c.tokens)
    if c.logprobs is not None:
        row["logprobs"] = [[lp, [list(a) for a in alts]] for lp, alts in c.logprobs]
    return row


def _peak_memory_gb():
    import jax
    peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")   # None on CPU
    return round(peak / 1e9, 3) if peak else None


def _main(args):
    logging.getLogger("absl").setLevel(logging.CRITICAL)   # orbax logs what load_model raises
    model_dir, tok, prompts = check_inputs(args)
    results, engine, times = generate(args, tok, model_dir, prompts)
    if args.save_logits:
        import numpy as np
        with cli.atomic_output(args.save_logits, "wb") as f:   # np.save(name) appends ".npy"
            np.save(f, _logits_array(results, args.max_new_tokens, engine.vocab))
    rows = [_row(i, p, ids, c, tok)
            for i, (p, ids, c) in enumerate(zip(args.prompts, prompts, results))]
    total = sum(len(c.tokens) for c in results)
    rate = total / times["generate_s"] if times["generate_s"] > 0 else None
    if args.json:
        print(json.dumps(dict(results=rows, tokens=total,
                              tokens_per_s=round(rate, 2) if rate else None,
                              generate_s=round(times["generate_s"], 4),
                              compile_s=round(times["compile_s"], 3),
                              load_s=round(times["load_s"], 3),
                              peak_device_mem_gb=_peak_memory_gb(),
                              prefix_cache=engine.prefix_stats() or None)))
        return
    if args.jsonl:
        for r in rows:
            print(json.dumps(r), flush=True)
    elif not args.stream:                                   # streamed already
        for r, p in zip(rows, args.prompts):
            if len(rows) > 1:           # a header per prompt: completions span lines
                if r["index"]:
                    print()
                print(f"==> prompt {r['index'] + 1}/{len(rows)}: "
                      f"{'' if p.text is not None else 'ids '}{p.label()} <==")
            print(r.get("text", " ".join(map(str, r["tokens"]))), flush=True)
    print(f"[{total} tokens in {times['generate_s']:.2f} s"
          f"{f', {rate:.1f} tokens/s' if rate else ''}; before that: loading "
          f"{times['load_s']:.1f} s, compiling {times['compile_s']:.1f} s]", file=sys.stderr)


def main(argv=None):
    args = parse_args(argv)
    return cli.run(PROG, args, _main)


if __name__ == "__main__":
    sys.exit(main())
