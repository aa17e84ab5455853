"""End-to-end A/B benchmark: the same requests through standard and ReplaySSM decoding, with and
without speculation, on one model.

Variants are MODE[+DRAFTER][@IMPL]: MODE standard | replay (how SSM layers decode), DRAFTER ngram
(prompt lookup on the host) | mtp (the model's MTP head, on device), IMPL the variant's kernels
(--impl's choices; default --impl): `--variants standard@xla standard@pallas` checks the Pallas
decode attention end to end by its greedy agreement with the XLA path. Synthetic models have real
dimensions and random weights (bf16 by default, fp32 state); for +mtp they get a random MTP head
(models whose release has none get a hypothetical depth-1 head, see `synthetic.SYNTHETIC_MTP`). A
variant the engine refuses or that fails is reported as a failed row; when every one failed the
exit status is 1.

Requests (every variant serves the same ones, all arriving at t = 0 and sharing --batch slots,
continuous batching when there are more):
  * --workload mixed (default): --batch random prompts of log-uniform lengths in
    [--prompt-len / 4, 4 x --prompt-len], seeded, each generating --new-tokens;
  * --workload sync: all prompts --prompt-len long (the synchronous equal-length case);
  * --workload agents: --batch requests of agents in multi-turn conversations sharing a system
    prompt of --prompt-len tokens (`workload.agent_requests`), later turns arriving later;
    with --prefix-cache-gb X every variant also runs with X GB of prefix cache (a row
    VARIANT+prefix: its TTFT beside the row without, and the cache's hit rate);
  * --trace FILE.jsonl: one request per line, e.g.
        {"prompt_ids": [1, 5, 9], "max_new_tokens": 64}
        {"prompt": "text", "max_new_tokens": 64, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
         "seed": 1, "stop_ids": [2], "id": "req-7"}
    (text prompts need a tokenizer: --tokenizer, default MODEL/tokenizer.json).

Per variant: steady-state decode (or speculative verify) step time, median over host visits;
tokens/s of the measured run, after a warm-up that compiles every prefill bucket and the step
(its time is reported apart, as compile s); TTFT and per-request latency p50/p90; time per
output token (p50); for speculation, the accepted drafts per verify step (mean and histogram of
k = 0..K over requests x steps); peak device memory of the variant alone (each variant runs in a
fresh process when a GPU is present, --isolate); failures; against `standard`, the fraction of
greedy requests with identical tokens and the mean fraction of their tokens equal before the first
difference (`greedy_agreement`); and for decode variants the roofline
(`replayjax.bench.roofline`): the minimum bytes and FLOPs of a decode step, the time the bytes
take at the copy bandwidth measured in the same process and the FLOPs at the bf16 dense peak
(--peak-tflops; default from the device name, none on a CPU: then the bytes alone), per kernel
class the larger of the two, the step's ideal their sum, beside the measured step, with the bound
that binds (flops or bytes: of the classes making up most of the ideal).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.roofline import (
    decode_step_bytes,
    decode_step_flops,
    peak_note,
    step_roofline,
)
from replayjax.bench.synthetic import add_model_source, build
from replayjax.bench.timing import add_peak_argument, copy_bandwidth, peak_flops, percentile
from replayjax.bench.workload import (
    AGENT_TURNS,
    ARRIVALS,
    WORKLOAD_HELP,
    WORKLOADS,
    Workload,
    arrival_times,
    arrival_unit,
    check_vocab,
    load_trace,
    synthetic_requests,
)

PROG = "replayjax bench"
MODES = ("standard", "replay")
DRAFTERS = ("ngram", "mtp")
# pallas_kernels.dispatch.IMPLS, spelled out: importing it would import jax before any parsing
KERNEL_IMPLS = ("auto", "pallas", "pallas_triton", "pallas_mosaic_gpu", "xla")
MAX_LEN_SLACK = 16      # cache room past prompt + max_new_tokens: drafts (K <= 7) and MTP chains


def parse_variant(text):
    """argparse type: MODE[+DRAFTER][@IMPL] -> (mode, drafter or None, impl or None)."""
    spec, at, impl = text.partition("@")
    mode, plus, drafter = spec.partition("+")
    if mode not in MODES or (plus and drafter not in DRAFTERS) or (at and impl not in
                                                                     KERNEL_IMPLS):
        raise argparse.ArgumentTypeError(
            f"variant {text!r} is not MODE[+DRAFTER][@IMPL] with MODE in {'|'.join(MODES)}, "
            f"DRAFTER in {'|'.join(DRAFTERS)} and IMPL in {'|'.join(KERNEL_IMPLS)}")
    return mode, drafter or None, impl or None


def variant_name(variant):
    mode, drafter, impl = variant
    return mode + (f"+{drafter}" if drafter else "") + (f"@{impl}" if impl else "")


# ---------------------------------------------------------------------- requests and model

def make_workload(args, vocab) -> Workload:
    """The run's requests: the parsed --trace, or --batch synthetic ones (--workload)."""
    if args.trace:
        reqs, what = args.requests, f"trace {args.trace} ({len(args.requests)} requests)"
    else:
        reqs = synthetic_requests(args.batch, args.prompt_len, args.new_tokens, vocab,
                                  seed=args.seed, workload=args.workload)
        what = (f"{args.workload} prompts (mean {np.mean([len(r.prompt) for r in reqs]):.0f} "
                f"tokens, {min(len(r.prompt) for r in reqs)}-"
                f"{max(len(r.prompt) for r in reqs)}), {args.new_tokens} new tokens")
    check_vocab(reqs, vocab)
    # staggered: arrivals spread over the visits one request's generation takes
    span = -(-max(r.max_new_tokens for r in reqs) // args.steps_per_visit)
    arrivals = arrival_times(len(reqs), args.rate, args.arrivals, args.seed, span)
    if not args.trace and args.workload == "agents":     # turn-major: later turns later
        arrivals = np.sort(arrivals)
        if arrival_unit(args.arrivals) == "visit":          # a turn after the previous one's
            turn = np.arange(len(reqs)) // -(-len(reqs) // AGENT_TURNS)
            arrivals = arrivals + turn * span
    what += f", {args.arrivals} arrivals" + (f" ({args.rate:g}/s)" if args.rate else "")
    return Workload(tuple(reqs), tuple(arrivals), what, arrival_unit(args.arrivals))


def build_model(args, mtp=False):
    """The model of --model (with an MTP head iff the checkpoint ships one) or the randomised
    --synthetic preset (with an MTP head when `mtp`), split over --tp devices."""
    import jax.numpy as jnp

    from replayjax.loading import load_model
    mesh, experts = cli.tp_placement(args)
    if args.model:
        return load_model(args.model, mesh=mesh, experts=experts)
    return build(args.synthetic, jnp.dtype(args.dtype), args.seed, mtp, mesh=mesh,
                 experts=experts)


# ---------------------------------------------------------------------- serving

def serve(engine, workload: Workload) -> list:
    """Feeds the workload to the engine as it arrives and returns a Completion per request, in
    order: request i is submitted once the engine has made `workload.arrivals[i]` host visits
    (unit "visit") or that many seconds have passed (unit "s"); the engine steps in between
    (`Engine.submit` / `Engine.step`: live admission between host visits). TTFT and latency run
    from each request's submission, i.e. its arrival."""
    reqs = [r.request() for r in workload.requests]
    if not any(workload.arrivals):
        return engine.generate(reqs)
    order = deque(sorted(range(len(reqs)), key=lambda i: workload.arrivals[i]))
    ids, done = [None] * len(reqs), {}
    t0, visits = time.perf_counter(), 0

    def due(i):
        clock = visits if workload.unit == "visit" else time.perf_counter() - t0
        return workload.arrivals[i] <= clock

    while order or engine.has_work:
        while order and due(order[0]):
            i = order.popleft()
            ids[i] = engine.submit(reqs[i])
        if not engine.has_work:               # idle until the next arrival
            if workload.unit == "visit":
                visits = int(workload.arrivals[order[0]])
            else:
                time.sleep(max(0.0, workload.arrivals[order[0]] - (time.perf_counter() - t0)))
            continue
        for ev in engine.step():
            if ev.completion is not None:
                done[ev.id] = ev.completion
        visits += 1
    return [done[i] for i in ids]


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


def run_variant(model, variant, args, workload, progress, prefix_cache_gb=0.0):
    """Serves the workload with one engine configuration (with a prefix cache of
    prefix_cache_gb: a row named VARIANT+prefix). Returns (row, completions or None)."""
    import jax
    import jax.numpy as jnp

    from replayjax.engine import Engine
    mode, drafter, impl = variant
    name = variant_name(variant) + ("+prefix" if prefix_cache_gb else "")
    K = args.num_draft if drafter else 0
    n = len(workload.requests)
    try:        # a variant the engine refuses or that crashes is a result, not an abort
        restore = _without_mtp(model, keep=drafter == "mtp")
        try:    # ssm_mode goes through unchanged: the engine decides what it supports
            engine = Engine(model, num_slots=args.batch, max_len=workload.max_len + MAX_LEN_SLACK,
                            ssm_mode=mode, window=args.window,
                            state_dtype=jnp.dtype(args.state_dtype),
                            steps_per_visit=args.steps_per_visit, num_draft=K,
                            drafter=drafter, prefix_cache_gb=prefix_cache_gb,
                            prefix_block=cli.prefix_block(args),
                            prefix_host_gb=args.prefix_cache_host_gb if prefix_cache_gb else 0.0,
                            batch_invariant=not args.dynamic_batch, impl=impl or args.impl)
        finally:
            restore()
        with progress.stage(f"{name}: warm-up (compiling)"):
            compile_s = engine.warm_up([r.request() for r in workload.requests])
        engine.visits.clear()
        engine.clear_prefix_cache()     # what the warm-up cached would flatter the run
        engine.record_drafts = bool(K)  # per-step cache lengths: the acceptance histogram
        with progress.stage(f"{name}: serving {n} requests"):
            t0 = time.perf_counter()
            out = serve(engine, workload)
            wall = time.perf_counter() - t0
    except Exception as e:   # noqa: BLE001 -- the row records the failure
        return dict(variant=name, requests=n, completed=0, failures=n,
                    error=cli.one_line(e)), None
    if bad := [c for c in out if c is not None and c.finish_reason == "error"]:
        return dict(variant=name, requests=n, completed=n - len(bad), failures=len(bad),
                    error=f"{len(bad)} of {n} requests failed: {bad[0].error}"), None
    kind = "verify" if K else "decode"
    step = [s / k for what, k, s in engine.visits if what == kind and k]
    tokens = sum(len(c.tokens) for c in out)
    mem = jax.local_devices()[0].memory_stats() or {}
    row = dict(
        variant=name, requests=n, completed=sum(c is not None for c in out),
        tokens=tokens, step_kind=kind,
        step_ms=1e3 * float(np.median(step)) if step else float("nan"),
        tokens_per_s=tokens / wall, completion_s=wall, compile_s=compile_s,
        ttft_p50_s=percentile([c.ttft_s for c in out], 50),
        ttft_p90_s=percentile([c.ttft_s for c in out], 90),
        latency_p50_s=percentile([c.completion_s for c in out], 50),
        latency_p90_s=percentile([c.completion_s for c in out], 90),
        tpot_ms=1e3 * percentile([c.tpot_s for c in out], 50),
        accepted_per_verify=None, accept_hist=None,
        peak_mem_gb=mem.get("peak_bytes_in_use", 0) / 1e9 or None,
        peak_mem_scope="process", failures=0)
    if prefix_cache_gb:
        stats = engine.prefix_stats()
        row.update(prefix_hit_rate=stats["hit_rate"], prefix_hit_tokens=stats["hit_tokens"],
                   prefix_evictions=stats["evictions"],
                   prefix_pool_gb=stats["capacity"] * stats["entry_bytes"] / 1e9,
                   prefix_used_gb=stats["bytes"] / 1e9)
    if K:
        hist = acceptance_histogram(out, K)
        row.update(accept_hist=hist, accepted_per_verify=(
            sum(k * c for k, c in enumerate(hist)) / sum(hist) if hist and sum(hist) else None))
    return row, out


def add_roofline(row, model, args, workload, copy_bw, peak):
    """Decode rows: the minimum bytes and FLOPs of a decode step at the run's batch and mean KV
    length, per class and in all; the ideal step (`roofline.step_roofline`: per class the
    larger of bytes at `copy_bw` bytes/s and FLOPs at `peak` FLOP/s, None: bytes only), the
    bytes' and the FLOPs' alone, the bound that binds and the fraction of the ideal the measured
    step achieves. With --tp both are taken as split evenly over the devices (replicated
    embedding and LM head make the real share a little larger)."""
    row.update(copy_gbs=copy_bw / 1e9, peak_tflops=peak / 1e12 if peak else None)
    if row.get("step_kind") != "decode":
        return
    import jax.numpy as jnp
    rows = min(args.batch, len(workload.requests))
    mode = row["variant"].partition("+")[0].partition("@")[0]
    kw = dict(mode=mode, window=args.window, state_dtype=jnp.dtype(args.state_dtype))
    by_bytes = decode_step_bytes(model, rows, workload.kv_len, **kw)
    by_flops = decode_step_flops(model, rows, workload.kv_len, **kw)
    roof = step_roofline({c: b / args.tp for c, b in by_bytes.items()},
                         {c: f / args.tp for c, f in by_flops.items()}, copy_bw, peak)
    total = roof.pop("total")
    row.update(roofline_mb={c: b / 1e6 for c, b in by_bytes.items()},
               roofline_gflop={c: f / 1e9 for c, f in by_flops.items()},
               roofline_bound={c: r["bound"] for c, r in roof.items()},
               min_mb_per_step=sum(by_bytes.values()) / 1e6,
               min_gflop_per_step=sum(by_flops.values()) / 1e9,
               ideal_step_ms=total["ideal_s"] * 1e3, ideal_bytes_ms=total["byte_s"] * 1e3,
               ideal_flops_ms=None if total["flop_s"] is None else total["flop_s"] * 1e3,
               bound=total["bound"], of_roofline=total["ideal_s"] * 1e3 / row["step_ms"])


def greedy_agreement(out, ref, greedy):
    """How far the greedy requests' tokens agree with the reference's: (match, prefix), match
    the fraction of requests (indices `greedy`) whose tokens equal the reference's, prefix the
    mean over them of the tokens equal before the first difference over the tokens generated
    (the longer of the two), so a late divergence (near-tied logits of a random-weight model)
    reads near 1 and a wrong first token 0. (None, None) without greedy requests.
    out, ref: lists of token lists, one per request."""
    if not greedy:
        return None, None
    match, prefix = 0, 0.0
    for i in greedy:
        a, b = out[i], ref[i]
        same = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        match += list(a) == list(b)
        prefix += same / max(len(a), len(b)) if a or b else 1.0
    return match / len(greedy), prefix / len(greedy)


def compare_to_standard(rows, tokens, greedy):
    """Adds to every successful row its step time and tokens/s relative to `standard` (the first
    successful standard row, maybe standard@IMPL), and how far its greedy requests' (indices
    `greedy`) tokens agree with standard's (`greedy_agreement`: ReplaySSM, speculation and the
    kernels must not change greedy output, up to numerics). tokens: {variant: [tokens of each
    request]}."""
    base = next((r for r in rows if r["variant"].partition("@")[0] == "standard"
                 and "step_ms" in r), None)
    if base is None:
        return
    ref = tokens[base["variant"]]
    for r in rows:
        if "step_ms" not in r:
            continue
        r["step_speedup_vs_standard"] = base["step_ms"] / r["step_ms"]
        r["tokens_per_s_vs_standard"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["greedy_match_vs_standard"], r["greedy_prefix_vs_standard"] = greedy_agreement(
            tokens[r["variant"]], ref, greedy)


# ---------------------------------------------------------------------- in process / isolated

def run_in_process(args, progress):
    """All variants in this process on one model: (rows, {variant: completions}). Peak memory is
    the process's (JAX cannot reset it), so only the first variant's is its own."""
    with progress.stage("building the model"):
        model = build_model(args, mtp=any(d == "mtp" for _, d, _ in args.variants)
                            and not args.model)
    workload = make_workload(args, model.cfg.vocab_size)
    rows, outputs = [], {}
    for v in args.variants:
        for gb in (0.0, args.prefix_cache_gb) if args.prefix_cache_gb else (0.0,):
            row, out = run_variant(model, v, args, workload, progress, gb)
            rows.append(row)
            outputs[row["variant"]] = out
    with progress.stage("copy bandwidth"):
        bw = copy_bandwidth()
    peak = peak_flops(args.peak_tflops)
    for row in rows:
        add_roofline(row, model, args, workload, bw, peak)
    return rows, outputs, workload.description


class _Stopped(Exception):
    """SIGTERM reached the parent of isolated variants (a `timeout` ran out)."""


def _stop(signum, frame):
    raise _Stopped


def run_isolated(args, argv, progress):
    """Each variant in a fresh `python -m replayjax.bench.e2e` process (same arguments, one
    variant), so its peak memory is its own: (rows, {variant: tokens per request}). A child that
    fails gives a failed row (the whole run is refused only when the first one refuses it); a
    SIGTERM (e.g. `timeout`) stops the running child and returns the rows so far, the stopped
    and unstarted variants as failed rows, so finished variants are never lost."""
    rows, tokens, what = [], {}, ""
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for i, v in enumerate(args.variants):
            name = variant_name(v)
            try:
                got = _run_child(name, argv, progress)
            except _Stopped:
                rows += [dict(variant=variant_name(u), error="stopped (SIGTERM) before it ended",
                              failures=None) for u in args.variants[i:]]
                break
            except cli.UserError as e:
                if not rows:
                    raise
                rows.append(dict(variant=name, error=str(e), failures=None))
                continue
            for row in got["rows"]:
                row["peak_mem_scope"] = "variant"
            rows += got["rows"]
            tokens.update(got["tokens"])
            what = got["workload"]
    finally:
        signal.signal(signal.SIGTERM, previous)
    return rows, tokens, what


def _run_child(name, argv, progress):
    """One variant's child process: its result dict (rows, tokens, workload); UserError with the
    child's last stderr line if it wrote none; _Stopped (the child killed) on SIGTERM."""
    with progress.stage(f"{name}: fresh process"), \
            tempfile.TemporaryDirectory(prefix="replayjax-bench-") as tmp:
        result = os.path.join(tmp, "result.json")
        proc = subprocess.Popen(
            [sys.executable, "-m", "replayjax.bench.e2e", *argv, "--only-variant", name,
             "--result-file", result], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        last = ""
        try:
            for line in proc.stderr:              # the child's stage lines pass through
                last = line.strip() or last
                if cli.log_stages():
                    sys.stderr.write(line)
            proc.wait()
        except _Stopped:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stderr.close()
        if not os.path.exists(result):   # the child refused the run (or crashed)
            last = last or f"exit status {proc.returncode}"
            raise cli.UserError(last.removeprefix(f"{PROG}: error: "))
        with open(result) as f:
            return json.load(f)


def run(args, argv=()):
    """The benchmark: (rows, {variant: completions (in process) or token lists (isolated)},
    workload description)."""
    isolated = args.isolate == "process" or (args.isolate == "auto" and
                                             cli.gpu_plugin_installed())
    runs = len(args.variants) * (2 if args.prefix_cache_gb else 1)
    stages = len(args.variants) if isolated else 2 + 2 * runs
    progress = cli.Progress(stages, cli.interactive(args) and not args.result_file)
    try:
        if isolated:
            rows, outputs, what = run_isolated(args, argv, progress)
            tokens = outputs
        else:
            rows, outputs, what = run_in_process(args, progress)
            tokens = {k: [c.tokens for c in v] for k, v in outputs.items() if v is not None}
    finally:
        progress.close()
    reqs = args.requests if args.trace else None
    greedy = [i for i, r in enumerate(reqs) if r.temperature == 0] if reqs else \
        list(range(args.batch))
    compare_to_standard(rows, tokens, greedy)
    return rows, outputs, what


# ---------------------------------------------------------------------- command line

def build_parser():
    ap = cli.parser(PROG, __doc__ + "\nOther benchmarks: replayjax bench kernels | verify | moe | "
                    "attention | prefill (--help for each).", [
                        f"{PROG} --synthetic nemotron-h-8b --batch 256 --variants standard replay",
                        f"{PROG} --synthetic qwen3.5-9b --batch 64 --workload sync --variants "
                        "replay+mtp standard+mtp",
                        f"{PROG} --model DIR --trace requests.jsonl --batch 64 --json"])
    add_model_source(ap)
    ap.add_argument("--batch", type=cli.at_least(1), default=32, metavar="N",
                    help="engine slots (concurrent requests); synthetic: also the request count")
    ap.add_argument("--workload", choices=WORKLOADS,
                    help=WORKLOAD_HELP + " (default: mixed)")
    ap.add_argument("--arrivals", choices=ARRIVALS, default="staggered",
                    help="when requests arrive: staggered (each at a random host visit within "
                         "one generation's length: rows start and fold at different steps), "
                         "burst (all at t = 0, the synchronous case), poisson or uniform at "
                         "--rate requests/s (default: %(default)s)")
    ap.add_argument("--rate", type=cli.number(0, lo_open=True), metavar="R",
                    help="requests per second for --arrivals poisson|uniform")
    ap.add_argument("--prompt-len", type=cli.at_least(1), metavar="P",
                    help="synthetic prompts' (geometric mean) length (default: 128)")
    ap.add_argument("--new-tokens", type=cli.at_least(1), metavar="N",
                    help="synthetic requests' new tokens (default: 128)")
    ap.add_argument("--trace", metavar="FILE.jsonl", type=cli.nonempty,
                    help="requests from a JSONL trace instead of synthetic ones (format above)")
    ap.add_argument("--tokenizer", metavar="FILE", type=cli.nonempty,
                    help="tokenizer.json for a --trace's text prompts (default: "
                         "MODEL/tokenizer.json)")
    ap.add_argument("--variants", nargs="+", type=parse_variant,
                    default=["standard", "replay"], metavar="MODE[+DRAFTER][@IMPL]",
                    help="MODE standard|replay, DRAFTER ngram|mtp, IMPL: --impl for this variant "
                         "(e.g. standard@xla standard@pallas: the kernels' greedy agreement)")
    ap.add_argument("--num-draft", type=cli.in_range(1, 7), metavar="K",
                    help="drafts per speculative step, < --window (default: 3)")
    ap.add_argument("--window", type=cli.window, default=16, metavar="L",
                    help="ReplaySSM ring window L")
    ap.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="SSM state (checkpoint) dtype")
    ap.add_argument("--steps-per-visit", type=cli.at_least(1), default=16, metavar="N",
                    help="decode steps per host visit (non-speculative variants)")
    ap.add_argument("--impl", choices=KERNEL_IMPLS, default="auto",
                    help="the kernels the model steps run (pallas_kernels.dispatch): auto = Pallas "
                    "Triton SSM kernels and XLA attention on a GPU, XLA elsewhere; pallas also "
                    "the decode attention kernel; pallas_mosaic_gpu the Mosaic GPU SSM kernels")
    cli.add_prefix_arguments(ap)
    cli.add_batching_argument(ap)
    ap.add_argument("--seed", type=cli.in_range(0, cli.INT32_MAX), metavar="S",
                    help="synthetic weights and prompts (default: 0)")
    add_peak_argument(ap)
    cli.add_tp_argument(ap)
    ap.add_argument("--isolate", choices=("auto", "process", "none"), default="auto",
                    help="process: each variant in a fresh process, so its peak memory is its "
                         "own (the model is built again for each); none: all in this process; "
                         "auto: process when a GPU is present")
    ap.add_argument("--json", action="store_true", help="print one JSON object: config and rows")
    ap.add_argument("--only-variant", type=parse_variant, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    return ap


def parse_args(argv=None):
    """Parsed, checked arguments (exit 2 naming the flag). Flags that would not apply are
    refused rather than ignored."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.variants = [v if isinstance(v, tuple) else parse_variant(v) for v in args.variants]
    if args.only_variant:                        # a child of --isolate process
        args.variants, args.isolate = [args.only_variant], "none"
    names = [variant_name(v) for v in args.variants]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        ap.error(f"argument --variants: {', '.join(dup)} given twice")
    drafts = any(d for _, d, _ in args.variants)
    if args.num_draft is not None and not drafts:
        ap.error("argument --num-draft: no variant drafts (add +ngram or +mtp to --variants)")
    args.num_draft = 3 if args.num_draft is None else args.num_draft
    if drafts and args.num_draft >= args.window:
        ap.error(f"argument --num-draft: K = {args.num_draft} must be < --window "
                 f"{args.window}")
    if (args.rate is None) != (args.arrivals in ("staggered", "burst")):
        ap.error(f"argument --rate: arrivals {args.arrivals} " + (
            "take no rate" if args.rate is not None else "need a rate in requests per second"))
    if args.trace:
        for flag, value in (("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens),
                            ("--workload", args.workload)):
            if value is not None:
                ap.error(f"argument {flag}: describes synthetic requests; --trace gives its own")
    elif args.tokenizer:
        ap.error("argument --tokenizer: encodes a --trace's text prompts; give --trace too")
    if args.model and args.dtype:
        ap.error("argument --dtype: sets --synthetic models' weights; --model DIR has its own")
    if args.model and args.trace and args.seed is not None:
        ap.error("argument --seed: seeds synthetic weights and prompts; --model with --trace "
                 "has neither")
    args.dtype = args.dtype or "bfloat16"
    args.workload = args.workload or "mixed"
    args.seed = args.seed or 0
    args.prompt_len = 128 if args.prompt_len is None else args.prompt_len
    args.new_tokens = 128 if args.new_tokens is None else args.new_tokens
    args.requests = None
    return args


def check_inputs(args):
    """Input files and directories, before any heavy work (UserError: exit 1, one line); with
    --trace, `args.requests` holds the validated trace (naming file, line and field)."""
    cli.prefix_block(args)
    if args.model:
        cli.model_dir("--model", args.model)
    if args.tokenizer:
        cli.existing_file("--tokenizer", args.tokenizer)
    if args.trace:
        cli.existing_file("--trace", args.trace)
        tok = args.tokenizer or (os.path.join(args.model, "tokenizer.json") if args.model
                                 else None)
        args.requests = load_trace(args.trace, tok)


def _fmt(x, spec):
    return "-" if x is None or x != x else format(x, spec)


def print_table(args, rows, what):
    """The rows as a markdown table."""
    measured = next((r for r in rows if "copy_gbs" in r), {})
    print(f"{args.model or args.synthetic}: {what}; {args.batch} slots, L = {args.window}, "
          f"K = {args.num_draft}, tp = {args.tp}; copy bandwidth "
          f"{_fmt(measured.get('copy_gbs'), '.0f')} GB/s; {peak_note(measured.get('peak_tflops'))}")
    print("| variant | step ms | vs standard | ideal ms (of roofline, bound) | tokens/s "
          "| compile s | TTFT p50/p90 s | latency p50/p90 s | TPOT ms | drafts accepted / verify "
          "| k = 0..K | greedy = standard | greedy prefix | peak GB | failures |\n"
          + "|---" * 15 + "|")
    for r in rows:
        if "step_ms" not in r:
            print(f"| {r['variant']} | failed: {r['error']} |" + " |" * 12
                  + f" {_fmt(r['failures'], 'd')} |")
            continue
        if "prefix_hit_rate" in r:
            r = dict(r, variant=f"{r['variant']} (hit {r['prefix_hit_rate']:.0%}, cache "
                     f"{r['prefix_used_gb']:.1f} of {r['prefix_pool_gb']:.1f} GB)")
        hist = r["accept_hist"]
        share = "/".join(f"{100 * c / max(sum(hist), 1):.0f}" for c in hist) + "%" if hist else "-"
        ideal = (f"{r['ideal_step_ms']:.2f} ({r['of_roofline']:.0%}, {r['bound']})"
                 if "ideal_step_ms" in r else "-")
        peak = _fmt(r["peak_mem_gb"], ".2f") + (" (process)" if r["peak_mem_scope"] == "process"
                                                and r["peak_mem_gb"] else "")
        print(f"| {r['variant']} | {r['step_ms']:.2f} ({r['step_kind']}) | "
              f"{r.get('step_speedup_vs_standard', 1):.2f}x | {ideal} | {r['tokens_per_s']:.0f} | "
              f"{r['compile_s']:.1f} | {r['ttft_p50_s']:.3f}/{r['ttft_p90_s']:.3f} | "
              f"{r['latency_p50_s']:.2f}/{r['latency_p90_s']:.2f} | {r['tpot_ms']:.2f} | "
              f"{_fmt(r['accepted_per_verify'], '.2f')} | {share} | "
              f"{_fmt(r.get('greedy_match_vs_standard'), '.0%')} | "
              f"{_fmt(r.get('greedy_prefix_vs_standard'), '.0%')} | {peak} | {r['failures']} |")


def _main(args, argv):
    check_inputs(args)
    rows, outputs, what = run(args, argv)
    if args.result_file:                         # a child of --isolate process: hand back
        with open(args.result_file, "w") as f:
            json.dump(dict(rows=rows, workload=what, tokens={
                name: [c.tokens for c in out] if out else None
                for name, out in outputs.items()}), f, default=str)
    elif args.json:
        config = {k: v for k, v in vars(args).items()
                  if k not in ("requests", "only_variant", "result_file", "debug")}
        config["variants"] = [variant_name(v) for v in args.variants]
        print(json.dumps(dict(config=config, workload=what, rows=rows), default=str))
    else:
        print_table(args, rows, what)
    if not args.result_file and all("error" in r for r in rows):   # nothing was measured
        raise cli.UserError(f"every variant failed (first: {rows[0]['variant']}: "
                            f"{rows[0]['error']})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return cli.run(PROG, args, lambda a: _main(a, argv))


if __name__ == "__main__":
    sys.exit(main())
