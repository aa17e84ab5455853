"""End-to-end A/B benchmark: the same requests through standard and ReplaySSM decoding, with and
without speculation, on one model.

    replayjax bench --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --new-tokens 128 \
        [--variants standard replay replay+ngram replay+mtp] [--json]
    replayjax bench --model DIR ...                       # a real or converted checkpoint
    replayjax bench --model DIR --trace requests.jsonl --batch 64 ...

Variants are MODE[+DRAFTER]: MODE standard | replay (how SSM layers decode), DRAFTER ngram (prompt
lookup on the host) | mtp (the model's MTP head, on device). Synthetic models have real dimensions
and random weights (bf16 by default, fp32 state); for +mtp they are built with a random MTP head
(Nemotron-H 8B has none: it gets a hypothetical depth-1 attention + MLP head). A variant the engine
refuses or that fails is reported as a failed row.

Requests: --batch random prompts of --prompt-len tokens generating --new-tokens each, or a JSONL
--trace, one request per line (blank lines skipped):

    {"prompt_ids": [1, 5, 9], "max_new_tokens": 64}
    {"prompt": "text", "max_new_tokens": 64, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
     "seed": 1, "stop_ids": [2], "id": "req-7"}

Text prompts need a tokenizer (--tokenizer, default MODEL/tokenizer.json; the `tokenizers`
package). All trace requests arrive at t = 0 and share --batch slots (continuous batching when
there are more). Every variant serves the same requests.

Per variant: steady-state decode (or speculative verify) step time, median over host visits after
a warm-up that compiles every prefill bucket; tokens/s; TTFT and per-request latency p50/p90;
time per output token (p50); for speculation, the accepted drafts per verify step (mean and
histogram of k = 0..K over requests x steps); peak device memory (process-wide: JAX cannot reset
it, so it never decreases from one variant to the next); failures; and, against `standard`, the
fraction of greedy requests with identical tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import zlib

import numpy as np

SYNTHETIC = {
    "nemotron-h-8b": dict(
        model_type="nemotron_h", vocab_size=131072, hidden_size=4096,
        hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, mamba_num_heads=128,
        mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
        intermediate_size=21504, layer_norm_epsilon=1e-5),
    "qwen3.5-9b": dict(
        model_type="qwen3_5_text", vocab_size=248320, hidden_size=4096, num_hidden_layers=32,
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        partial_rotary_factor=0.25, rope_theta=1e7, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, intermediate_size=12288, rms_norm_eps=1e-6,
        mtp_num_hidden_layers=1),
}
# Config fields added only when a variant drafts with MTP. Nemotron-H 8B ships no MTP head; this
# one mirrors Nemotron 3's "*E" (attention + FFN) with the 8B's dense MLP, as it has no experts.
SYNTHETIC_MTP = {
    "nemotron-h-8b": dict(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*-"),
}

MODES = ("standard", "replay")
DRAFTERS = ("ngram", "mtp")
TRACE_FIELDS = ("prompt_ids", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                "seed", "stop_ids", "id")
MAX_LEN_SLACK = 16      # cache room past prompt + max_new_tokens: drafts (K <= 7) and MTP chains


# ---------------------------------------------------------------------- models

def randomize(model, seed=0):
    """Random weights of realistic scale in place (never benchmark zeros): linear/expert/embedding
    weights N(0, 1/fan_in) (embeddings N(0, 1)), A_log ~ log U(1, 16), dt_bias = softplus^-1 of
    U(1e-3, 0.1); norms, D and biases keep their constructor values. Each param's key comes from
    its path, so adding an MTP head leaves the other weights unchanged."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    key = jax.random.key(seed)
    for path, var in nnx.iter_graph(model):
        if not isinstance(var, nnx.Param):
            continue
        name, x = str(path[-1]), var[...]
        k = jax.random.fold_in(key, zlib.crc32("/".join(map(str, path)).encode()) & 0x7FFFFFFF)
        if name == "A_log":
            var[...] = jnp.log(jax.random.uniform(k, x.shape, jnp.float32, 1.0, 16.0))
        elif name == "dt_bias":
            dt = jax.random.uniform(k, x.shape, jnp.float32, 1e-3, 0.1)
            var[...] = dt + jnp.log(-jnp.expm1(-dt))
        elif name in ("kernel", "up", "down", "gate", "conv_weight", "embeddings", "embed_tokens"):
            fan_in = 1 if name in ("embeddings", "embed_tokens") else x.shape[-2] if x.ndim > 1 else 1
            var[...] = (jax.random.normal(k, x.shape, jnp.float32) * fan_in ** -0.5).astype(x.dtype)
    return model


def synthetic_config(name, mtp=False):
    """The parsed config of synthetic model `name` (with its MTP fields when `mtp`)."""
    from models.config import parse_config
    return parse_config({**SYNTHETIC[name], **(SYNTHETIC_MTP.get(name, {}) if mtp else {})})


def build_model(args, mtp=False):
    """The model of `args.model` (MTP head iff the checkpoint ships one) or a randomised synthetic
    one (with an MTP head when `mtp`)."""
    import jax.numpy as jnp
    from models.registry import model_class
    from replayjax.loading import load_model
    if args.model:
        return load_model(args.model)
    cfg = synthetic_config(args.synthetic, mtp)
    return randomize(model_class(cfg)(cfg, dtype=jnp.dtype(args.dtype), mtp=mtp), args.seed)


def parse_variant(text):
    """argparse type: MODE[+DRAFTER] -> (mode, drafter or None)."""
    mode, plus, drafter = text.partition("+")
    if mode not in MODES or (plus and drafter not in DRAFTERS):
        raise argparse.ArgumentTypeError(
            f"variant {text!r} is not MODE[+DRAFTER] with MODE in {'|'.join(MODES)} and DRAFTER "
            f"in {'|'.join(DRAFTERS)}")
    return mode, drafter or None


def variant_name(variant):
    mode, drafter = variant
    return f"{mode}+{drafter}" if drafter else mode


# ---------------------------------------------------------------------- requests

@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One benchmark request; `where` ("FILE:LINE" or "synthetic") names it in errors."""
    where: str
    prompt: tuple
    max_new_tokens: int
    stop_ids: tuple = ()
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    id: object = None
    prompt_field: str = "prompt_ids"      # or "prompt" (text), for error messages

    def request(self, max_new_tokens=None):
        """A fresh engine Request (the engine fills in ids, so variants must not share them)."""
        from replayjax.engine import Request, SamplingParams
        return Request(prompt=list(self.prompt),
                       max_new_tokens=max_new_tokens or self.max_new_tokens,
                       stop_ids=self.stop_ids, id=self.id,
                       sampling=SamplingParams(self.temperature, self.top_k, self.top_p, self.seed))


class TraceError(ValueError):
    """A trace the bench cannot serve; the message names the file, line and field."""


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)     # JSON true is not a token id


def _is_number(x):
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


def _field_error(where, field, why):
    return TraceError(f"{where}: field {field!r} {why}")


def _int_list(obj, field, where, allow_empty):
    ids = obj[field]
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise _field_error(where, field, f"must be a list of integer token ids, got {ids!r:.80}")
    if not ids and not allow_empty:
        raise _field_error(where, field, "is empty")
    return tuple(ids)


def _checked(obj, field, where, ok, want, default):
    """obj[field] if present and ok(value), else `default` when absent; TraceError otherwise."""
    if field not in obj:
        return default
    if not ok(obj[field]):
        raise _field_error(where, field, f"must be {want}, got {obj[field]!r:.80}")
    return obj[field]


def parse_trace_line(line, where, encode):
    """One JSONL line -> TraceRequest. `encode(text, where)` tokenizes text prompts. Token ids are
    checked against the vocabulary later (`check_vocab`), once the model is known."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not valid JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if unknown := sorted(set(obj) - set(TRACE_FIELDS)):
        raise TraceError(f"{where}: unknown field(s) {unknown} (known: {', '.join(TRACE_FIELDS)})")
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise TraceError(f"{where}: give exactly one of 'prompt_ids' (token ids) or 'prompt' "
                         f"(text)")
    if "prompt" in obj:
        text = _checked(obj, "prompt", where, lambda v: isinstance(v, str) and v != "",
                        "a non-empty string", None)
        prompt, prompt_field = tuple(encode(text, where)), "prompt"
        if not prompt:
            raise _field_error(where, "prompt", "encodes to no tokens")
    else:
        prompt, prompt_field = _int_list(obj, "prompt_ids", where, allow_empty=False), "prompt_ids"
    if "max_new_tokens" not in obj:
        raise TraceError(f"{where}: missing field 'max_new_tokens'")
    return TraceRequest(
        where=where, prompt=prompt, prompt_field=prompt_field,
        max_new_tokens=_checked(obj, "max_new_tokens", where, lambda v: _is_int(v) and v >= 1,
                                "an integer >= 1", None),
        stop_ids=_int_list(obj, "stop_ids", where, True) if "stop_ids" in obj else (),
        temperature=float(_checked(obj, "temperature", where, lambda v: _is_number(v) and v >= 0,
                                   "a number >= 0 (0 = greedy)", 0.0)),
        top_k=_checked(obj, "top_k", where, lambda v: _is_int(v) and v >= 0,
                       "an integer >= 0 (0 = off)", 0),
        top_p=float(_checked(obj, "top_p", where, lambda v: _is_number(v) and 0 < v <= 1,
                             "a number in (0, 1]", 1.0)),
        seed=_checked(obj, "seed", where, lambda v: _is_int(v) and 0 <= v < 2 ** 31,
                      "an integer in [0, 2^31)", 0),        # the engine keys int32 seeds
        id=_checked(obj, "id", where, lambda v: isinstance(v, (str, int, float)),
                    "a string or a number", where))


def text_encoder(tokenizer_path):
    """`encode(text, where)` -> token ids, loading the tokenizer on first use (id-only traces
    need neither the file nor the `tokenizers` package)."""
    loaded = []

    def tokenizer(where):
        if tokenizer_path is None:
            raise TraceError(f"{where}: field 'prompt' (text) needs a tokenizer: --model DIR with "
                             f"a tokenizer.json, or --tokenizer FILE; or use 'prompt_ids'")
        if not os.path.isfile(tokenizer_path):
            raise TraceError(f"{where}: field 'prompt' (text) needs {tokenizer_path}, which does "
                             f"not exist (give --tokenizer FILE, or use 'prompt_ids')")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TraceError(f"{where}: text prompts need the 'tokenizers' package (pip install "
                             f"tokenizers); or use 'prompt_ids'") from None
        return Tokenizer.from_file(tokenizer_path)

    def encode(text, where):
        if not loaded:
            loaded.append(tokenizer(where))
        return loaded[0].encode(text).ids

    return encode


def load_trace(path, tokenizer_path=None):
    """The requests of a JSONL trace, every line validated (TraceError names file:line, field)."""
    encode = text_encoder(tokenizer_path)
    try:
        with open(path, encoding="utf-8") as f:
            reqs = [parse_trace_line(line, f"{path}:{n}", encode)
                    for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not reqs:
        raise TraceError(f"{path}: no requests (one JSON object per line)")
    return reqs


def check_vocab(reqs, vocab):
    """TraceError for the first request with a prompt or stop id outside [0, vocab) (a text
    prompt's means the tokenizer does not belong to the model)."""
    for r in reqs:
        for field, ids in ((r.prompt_field, r.prompt), ("stop_ids", r.stop_ids)):
            if bad := [t for t in ids if not 0 <= t < vocab]:
                raise _field_error(r.where, field, f"has token ids {bad[:5]} outside the model's "
                                                   f"vocabulary [0, {vocab})")


def synthetic_requests(args, vocab):
    """--batch random prompts (ids >= 3: clear of pad/bos/eos) of --prompt-len tokens."""
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(3, vocab, (args.batch, args.prompt_len)).tolist()
    return [TraceRequest("synthetic", tuple(p), args.new_tokens, id=i)
            for i, p in enumerate(prompts)]


# ---------------------------------------------------------------------- running a variant

def _pct(v, q):
    return float(np.percentile(v, q)) if len(v) else float("nan")


def _without_mtp(model, keep):
    """Hides the model's MTP head (unless `keep`) while an engine is built, so variants that do
    not draft with it run the plain model's graph and cache. Returns a function that restores it."""
    head = getattr(model, "mtp", None)
    if keep or head is None:
        return lambda: None
    model.mtp = None
    return lambda: setattr(model, "mtp", head)


def accepted_per_step(c):
    """Accepted drafts of each speculative step of Completion `c` (needs Engine.record_drafts):
    the cache length recorded before each step grows by that step's emitted tokens (accepted + 1);
    the last step, whose tokens may be cut at a stop id or max_new_tokens, gets what remains of
    `accepted_drafts` (counted before the cut)."""
    lengths = [n for n, _ in c.drafts]
    steps = [b - a - 1 for a, b in zip(lengths, lengths[1:])]
    return steps + [c.accepted_drafts - sum(steps)] if lengths else []


def acceptance_histogram(completions, num_draft):
    """Counts of k = 0..num_draft accepted drafts over (request, speculative step); None if the
    completions' records do not add up (an engine whose bookkeeping changed: no histogram rather
    than a wrong one)."""
    steps = [k for c in completions for k in accepted_per_step(c)]
    if any(not 0 <= k <= num_draft for k in steps):
        return None
    return np.bincount(np.asarray(steps, int), minlength=num_draft + 1).tolist()


def _warm_up(engine, reqs, steps_per_visit):
    """Compiles every prefill length bucket the requests will hit (one request each: a group's
    bucket is its longest prompt's) plus the decode / verify step."""
    from replayjax.engine import _bucket
    first = {}
    for r in reqs:
        first.setdefault(_bucket(len(r.prompt)), r)
    for r in first.values():
        engine.generate([r.request(min(r.max_new_tokens, 2 * steps_per_visit))])


def run_variant(model, variant, args, reqs, max_len):
    """Serves `reqs` with one engine configuration. Returns (row, completions or None)."""
    import jax
    import jax.numpy as jnp

    from replayjax.engine import Engine
    mode, drafter = variant
    name = variant_name(variant)
    K = args.num_draft if drafter else 0
    try:        # a variant the engine refuses or that crashes is a result, not an abort
        restore = _without_mtp(model, keep=drafter == "mtp")
        try:    # ssm_mode goes through unchanged: the engine decides what it supports
            engine = Engine(model, num_slots=args.batch, max_len=max_len, ssm_mode=mode,
                            window=args.window, state_dtype=jnp.dtype(args.state_dtype),
                            steps_per_visit=args.steps_per_visit,
                            num_draft=K, drafter=drafter or "ngram")
        finally:
            restore()
        _warm_up(engine, reqs, args.steps_per_visit)
        engine.visits.clear()
        engine.record_drafts = bool(K)  # per-step cache lengths: the acceptance histogram
        t0 = time.perf_counter()
        out = engine.generate([r.request() for r in reqs])
        wall = time.perf_counter() - t0
    except Exception as e:
        print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return dict(variant=name, requests=len(reqs), completed=0, failures=len(reqs),
                    error=f"{type(e).__name__}: {e}"), None
    kind = "verify" if K else "decode"
    step = [s / n for k, n, s in engine.visits if k == kind and n]
    tokens = sum(len(c.tokens) for c in out)
    mem = jax.devices()[0].memory_stats() or {}
    row = dict(
        variant=name, requests=len(reqs), completed=sum(c is not None for c in out),
        tokens=tokens, step_kind=kind,
        step_ms=1e3 * float(np.median(step)) if step else float("nan"),
        tokens_per_s=tokens / wall, completion_s=wall,
        ttft_p50_s=_pct([c.ttft_s for c in out], 50), ttft_p90_s=_pct([c.ttft_s for c in out], 90),
        latency_p50_s=_pct([c.completion_s for c in out], 50),
        latency_p90_s=_pct([c.completion_s for c in out], 90),
        tpot_ms=1e3 * _pct([c.tpot_s for c in out], 50),
        accepted_per_verify=None, accept_hist=None,
        peak_mem_gb=mem.get("peak_bytes_in_use", 0) / 1e9 or None, failures=0)
    if K:
        hist = acceptance_histogram(out, K)
        row.update(accept_hist=hist, accepted_per_verify=(
            sum(k * c for k, c in enumerate(hist)) / sum(hist) if hist and sum(hist) else None))
    return row, out


def compare_to_standard(rows, outputs, reqs):
    """Adds to every successful row its step time and tokens/s relative to `standard`, and the
    fraction of greedy requests whose tokens match standard's (ReplaySSM and speculation must not
    change greedy output, up to numerics)."""
    base = next((r for r in rows if r["variant"] == "standard" and "step_ms" in r), None)
    if base is None:
        return
    greedy = [i for i, r in enumerate(reqs) if r.temperature == 0]
    ref = outputs["standard"]
    for r in rows:
        if "step_ms" not in r:
            continue
        r["step_speedup_vs_standard"] = base["step_ms"] / r["step_ms"]
        r["tokens_per_s_vs_standard"] = r["tokens_per_s"] / base["tokens_per_s"]
        out = outputs[r["variant"]]
        r["greedy_match_vs_standard"] = (sum(out[i].tokens == ref[i].tokens for i in greedy) /
                                         len(greedy)) if greedy else None


def run(args):
    """The benchmark: (rows, {variant name: completions}) -- the latter for tests and scripts."""
    model = build_model(args, mtp=any(d == "mtp" for _, d in args.variants) and not args.model)
    vocab = model.cfg.vocab_size
    reqs = args.requests if args.trace else synthetic_requests(args, vocab)
    check_vocab(reqs, vocab)
    max_len = max(len(r.prompt) + r.max_new_tokens for r in reqs) + MAX_LEN_SLACK
    rows, outputs = [], {}
    for v in args.variants:
        row, out = run_variant(model, v, args, reqs, max_len)
        rows.append(row)
        outputs[row["variant"]] = out
    compare_to_standard(rows, outputs, reqs)
    return rows, outputs


# ---------------------------------------------------------------------- command line

def build_parser():
    ap = argparse.ArgumentParser(prog="replayjax bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (HF or converted)")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="real dims, random weights")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="synthetic models' weights")
    ap.add_argument("--batch", type=int, default=32,
                    help="engine slots (concurrent requests); synthetic: also the request count")
    ap.add_argument("--prompt-len", type=int, help="synthetic requests' prompt length (128)")
    ap.add_argument("--new-tokens", type=int, help="synthetic requests' new tokens (128)")
    ap.add_argument("--trace", metavar="FILE.jsonl",
                    help="requests from a JSONL trace instead of synthetic ones (format above)")
    ap.add_argument("--tokenizer", metavar="FILE",
                    help="tokenizer.json for a trace's text prompts (default MODEL/tokenizer.json)")
    ap.add_argument("--variants", nargs="+", type=parse_variant, default=["standard", "replay"],
                    metavar="MODE[+DRAFTER]",
                    help="MODE standard|replay, DRAFTER ngram|mtp (default: standard replay)")
    ap.add_argument("--num-draft", type=int, default=3, help="drafts K per speculative step")
    ap.add_argument("--window", type=int, default=16, help="ReplaySSM ring window L")
    ap.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="SSM state (checkpoint) dtype")
    ap.add_argument("--steps-per-visit", type=int, default=16,
                    help="decode steps per host visit (non-speculative variants)")
    ap.add_argument("--seed", type=int, default=0, help="synthetic weights and prompts")
    ap.add_argument("--json", action="store_true", help="one JSON object: config and rows")
    return ap


def parse_args(argv=None):
    """Parsed, checked arguments; with --trace, `args.requests` holds the validated trace."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.variants = [v if isinstance(v, tuple) else parse_variant(v) for v in args.variants]
    if args.trace:
        if args.prompt_len is not None or args.new_tokens is not None:
            ap.error("--prompt-len / --new-tokens describe synthetic requests; a --trace gives "
                     "its own")
        tok = args.tokenizer or (os.path.join(args.model, "tokenizer.json") if args.model else None)
        try:        # before building the model: a bad trace should fail fast
            args.requests = load_trace(args.trace, tok)
        except TraceError as e:
            sys.exit(f"replayjax bench: {e}")
    args.prompt_len = 128 if args.prompt_len is None else args.prompt_len
    args.new_tokens = 128 if args.new_tokens is None else args.new_tokens
    return args


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(args, rows):
    """The rows as a markdown table."""
    what = (f"trace {args.trace} ({rows[0]['requests']} requests)" if args.trace else
            f"prompt {args.prompt_len}, {args.new_tokens} new tokens")
    print(f"{args.model or args.synthetic}: {what}, {args.batch} slots, L = {args.window}, "
          f"K = {args.num_draft}")
    print("| variant | step ms | vs standard | tokens/s | TTFT p50/p90 s | latency p50/p90 s "
          "| TPOT ms | drafts accepted / verify | k = 0..K | greedy = standard | peak GB "
          "| failures |\n" + "|---" * 12 + "|")
    for r in rows:
        if "step_ms" not in r:
            print(f"| {r['variant']} | failed: {r['error']} |" + " |" * 9 + f" {r['failures']} |")
            continue
        hist = r["accept_hist"]
        share = "/".join(f"{100 * c / max(sum(hist), 1):.0f}" for c in hist) + "%" if hist else "-"
        print(f"| {r['variant']} | {r['step_ms']:.2f} ({r['step_kind']}) | "
              f"{r.get('step_speedup_vs_standard', 1):.2f}x | {r['tokens_per_s']:.0f} | "
              f"{r['ttft_p50_s']:.3f}/{r['ttft_p90_s']:.3f} | "
              f"{r['latency_p50_s']:.2f}/{r['latency_p90_s']:.2f} | {r['tpot_ms']:.2f} | "
              f"{_fmt(r['accepted_per_verify'], '.2f')} | {share} | "
              f"{_fmt(r.get('greedy_match_vs_standard'), '.0%')} | "
              f"{_fmt(r['peak_mem_gb'], '.2f')} | {r['failures']} |")


def main(argv=None):
    args = parse_args(argv)
    try:
        rows, _ = run(args)
    except TraceError as e:
        sys.exit(f"replayjax bench: {e}")
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "requests"}
        config["variants"] = [variant_name(v) for v in args.variants]
        print(json.dumps(dict(config=config, rows=rows), default=str))
    else:
        print_table(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
