"""Prefill benchmark: tokens/s of prefilling --batch prompts of --prompt-len tokens at once, per
SSM mode, beside its roofline.

Method: the model is built once (--synthetic: real dimensions, random weights; or --model).
Per --ssm-mode a fresh cache of batch + 1 slots (slot 0 is the null slot) x prompt-len
positions is made, then `models.runner.Runner.prefill` (jitted, cache donated, the LM head over
each prompt's last token only, as the engine prefills) runs on fresh random token ids
(uniform over the vocabulary, new ones every call) into slots 1..batch: one warm-up call that
compiles, then --iterations timed calls, each on the cache the previous one returned (a prefill
starts its slots afresh, so every call does the same work). Seconds per call: the median of
the wall-clock times to the results being ready (CUPTI's device timer repeats a call on the
same arguments, which a donated cache cannot be; at these sizes a call takes far longer than
its launches). "replay" also writes each layer's ReplaySSM checkpoint and ring, "standard" the
state alone.

Roofline (per call; with --tp N each device does 1/N of the FLOPs and bytes):
  * FLOPs, multiply-add = 2, b = batch, T = prompt-len, c = min(64, T) the scans' chunk:
      - matmuls: 2 x (active params per token) x b T -- every parameter except the embedding
        table (a gather) and the LM head; a MoE layer's routed experts count k / E (the k routed
        per token), its router and shared expert whole -- plus 2 x (LM head params) x b (last
        tokens only; a tied embedding is that head);
      - attention (causal), per attention layer: QK^T and PV, 2 x 2 heads head_dim T (T + 1) / 2
        per row, i.e. 2 heads head_dim T (T + 1) b;
      - Mamba-2 chunked scan (heads H, head dim P, state N, groups G) per token and layer:
        4 H P N (chunk states B^T x, inter-chunk output C S) + (c + 1) (G N + H P) (the causal
        intra-chunk C B^T and its product with x, (c + 1) / 2 positions on average);
      - Gated DeltaNet chunked scan (key heads Hk, value heads Hv, dims dk, dv) per token and
        layer: 6 Hv dk dv (w S, q S, the state update d k^T) + (c + 1) (2 Hk dk + Hv (dk + 2 dv))
        (the causal intra-chunk k k^T and q k^T, the triangular solve for u and w, attn x d);
    the rest (norms, gates, conv, softmax, cumsums) is left out: O(params) or less per token.
    Against the bf16 dense tensor-core peak (--peak-tflops; default from the device name, none
    on a CPU: then the FLOP bound is not reported).
  * bytes: the weights read once (`roofline.weight_bytes` at b T rows: every expert is hit),
    the cache's share of the b slots written once, the token ids read; activations are left
    out (they would stream through memory at most a few times per layer). Against the copy
    bandwidth measured in the same process (`timing.copy_bandwidth`).
  * ideal = max(FLOPs / peak, bytes / bandwidth); "of roofline" = ideal / measured; the bound
    is whichever term is larger.
The weights (`synthetic.check_fits`, or the loader) and each cache (`replayjax.memory`) are
checked against free memory before they are allocated; activations are not.

--profile: one more call per mode under a `jax.profiler` trace (kept, for Perfetto / XProf), its
kernels classed from the HLO they run as `replayjax profile` does (`replayjax.bench.trace`):
ssm (the chunked scans), conv (the prompt's causal conv), gemm, attention, moe, collective,
other; device time per class and the top kernels (on a CPU-only machine: XLA's host thunks).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.roofline import (
    bound,
    expert_counts,
    is_routed,
    model_params,
    weight_bytes,
)
from replayjax.bench.synthetic import add_model_source
from replayjax.bench.timing import add_peak_argument
from replayjax.bench.trace import PRIORITY, fresh_metadata, kernel_table

PROG = "replayjax bench prefill"
MODES = ("standard", "replay")
TOP = 10, 25            # kernels per mode with --profile: printed, kept (in --json)


# ---------------------------------------------------------------------- the roofline

def matmul_flops(model, batch: int, prompt_len: int) -> float:
    """FLOPs of the parameters of `model` (real or abstract) over a prefill of `batch` prompts
    of `prompt_len` tokens: 2 x active params per token, the LM head once per prompt (see the
    module docstring)."""
    E, k = expert_counts(model.cfg)
    tied = getattr(model, "lm_head", True) is None
    per_token = per_row = 0.0
    for path, x, owners in model_params(model):
        n = float(np.prod(x.shape))
        if path[0] in ("embeddings", "embed_tokens"):
            per_row += n if tied else 0.0
        elif path[0] == "lm_head":
            per_row += n
        elif is_routed(owners, x.shape, E):
            per_token += n * k / E
        else:
            per_token += n
    return 2 * (per_token * batch * prompt_len + per_row * batch)


def attention_flops(cfg, batch: int, prompt_len: int) -> float:
    """Causal QK^T and PV FLOPs of every attention layer over the prefill."""
    layers = cfg.layer_kinds.count("attention")
    return layers * 2.0 * cfg.num_attention_heads * cfg.head_dim * prompt_len * (
        prompt_len + 1) * batch


def ssm_flops(cfg, batch: int, prompt_len: int) -> float:
    """The chunked scans' dominant FLOPs over the prefill: Mamba-2 and Gated DeltaNet layers
    (formulas in the module docstring)."""
    from models.hybrid import PREFILL_CHUNK
    c = min(PREFILL_CHUNK, prompt_len)
    per_token = 0.0
    if n := cfg.layer_kinds.count("mamba"):
        H, P, N, G = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups
        per_token += n * (4 * H * P * N + (c + 1) * (G * N + H * P))
    if n := cfg.layer_kinds.count("gdn"):
        Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        per_token += n * (6 * Hv * dk * dv + (c + 1) * (2 * Hk * dk + Hv * (dk + 2 * dv)))
    return per_token * batch * prompt_len


def prefill_flops(model, batch: int, prompt_len: int) -> dict[str, float]:
    """FLOPs of a prefill of `batch` x `prompt_len` tokens by term: matmul, attention, ssm."""
    return dict(matmul=matmul_flops(model, batch, prompt_len),
                attention=attention_flops(model.cfg, batch, prompt_len),
                ssm=ssm_flops(model.cfg, batch, prompt_len))


def prefill_bytes(model, cache, batch: int, prompt_len: int) -> dict[str, float]:
    """Minimum bytes of the prefill by term: weights (read once), cache (the `batch` slots'
    share of `cache`, real or abstract, written once), tokens (int32 ids read)."""
    from replayjax import memory
    return dict(weights=sum(weight_bytes(model, batch * prompt_len).values()),
                cache=memory.tree_bytes(cache) * batch / cache.num_slots,
                tokens=4.0 * batch * prompt_len)


def roofline(flops: float, nbytes: float, seconds: float, peak: float | None,
             copy_bw: float) -> dict:
    """Ideal seconds of `flops` at `peak` FLOP/s (None: unknown) and `nbytes` at `copy_bw`
    bytes/s, the binding bound (`roofline.bound`), and the fraction of it `seconds` achieves."""
    r = bound(nbytes, flops, copy_bw, peak)
    return r | dict(of_roofline=r["ideal_s"] / seconds)


# ---------------------------------------------------------------------- measuring

def time_prefill(runner, model, mode: str, args, progress):
    """(seconds of each timed `Runner.prefill` call of --batch x --prompt-len fresh random
    tokens into a fresh `mode` cache, after a warm-up call that compiles; the cache's shape)."""
    import jax
    import jax.numpy as jnp

    from replayjax import memory
    b, T = args.batch, args.prompt_len
    make = lambda: model.init_cache(b + 1, T, window=args.window, ssm_mode=mode)   # noqa: E731
    shape = jax.eval_shape(make)
    need = memory.tree_bytes(shape) // args.tp
    if why := memory.shortfall(need):
        raise cli.UserError(f"--batch {b} x --prompt-len {T}: the {mode} cache {why}")
    cache = runner.place(make)
    rng = np.random.default_rng(args.seed)
    lengths = jnp.full((b,), T, jnp.int32)
    slots = jnp.arange(1, b + 1, dtype=jnp.int32)

    def call(cache):
        tokens = jax.block_until_ready(jnp.asarray(
            rng.integers(0, model.cfg.vocab_size, (b, T), dtype=np.int32)))
        t0 = time.perf_counter()
        logits, cache = runner.prefill(cache, tokens, lengths, slots, last_only=True)
        jax.block_until_ready((logits, cache))
        return time.perf_counter() - t0, cache

    with progress.stage(f"{mode}: compiling"):
        _, cache = call(cache)
    secs = []
    with progress.stage(f"{mode}: {args.iterations} timed calls"):
        for i in range(args.iterations):
            progress.note(f"{i}/{args.iterations}")
            s, cache = call(cache)
            secs.append(s)
    if not args.profile:
        return secs, shape, None
    with progress.stage(f"{mode}: tracing one call"):
        trace_dir = os.path.join(args.profile_dir, mode)
        jax.profiler.start_trace(trace_dir)
        try:
            call(cache)
        finally:
            jax.profiler.stop_trace()
    return secs, shape, kernel_profile(trace_dir, args.tp)


def kernel_profile(trace_dir: str, tp: int) -> dict:
    """The kernels of the trace in `trace_dir` (one prefill call): device ms per class (all
    `tp` devices' kernels / tp) with each class's share and launches, and the TOP[1] longest
    kernels (name, class, launches, total ms per device)."""
    kernels = [dict(name=k["name"], cls=k["cls"], count=k["count"],
                    total_ms=k["total_ns"] * 1e-6 / tp) for k in kernel_table(trace_dir)]
    total = sum(k["total_ms"] for k in kernels)
    classes = []
    for c in PRIORITY:
        ks = [k for k in kernels if k["cls"] == c]
        if ks:
            ms = sum(k["total_ms"] for k in ks)
            classes.append(dict(cls=c, ms=ms, share=ms / total if total else 0.0,
                                launches=sum(k["count"] for k in ks)))
    return dict(trace_dir=trace_dir, device_ms=total, classes=classes,
                kernels=kernels[:TOP[1]])


def bench(args, progress) -> dict:
    """Builds the model, measures the copy bandwidth and every --ssm-mode: the report dict."""
    import jax
    import jax.numpy as jnp

    from models.runner import Runner
    from replayjax.bench.synthetic import build
    from replayjax.bench.timing import copy_bandwidth, peak_tflops
    from replayjax.loading import load_model
    with progress.stage("building the model"):
        mesh, experts = cli.tp_placement(args)
        model = (load_model(args.model, mesh=mesh, experts=experts) if args.model else
                 build(args.synthetic, jnp.dtype(args.dtype), args.seed, mesh=mesh,
                       experts=experts))
    with progress.stage("copy bandwidth"):
        bw = copy_bandwidth()
    device = jax.devices()[0].device_kind
    peak = (args.peak_tflops or peak_tflops(device) or 0.0) * 1e12 or None
    runner = Runner(model)
    b, T, tp = args.batch, args.prompt_len, args.tp
    flops = prefill_flops(model, b, T)
    rows = []
    for mode in args.ssm_mode:
        secs, cache, prof = time_prefill(runner, model, mode, args, progress)
        nbytes = prefill_bytes(model, cache, b, T)
        s = float(np.median(secs))
        rows.append(dict(mode=mode, seconds=s, all_seconds=secs, tokens_per_s=b * T / s,
                         flops=flops, bytes=nbytes, tflops_per_s=sum(flops.values()) / s / 1e12,
                         **roofline(sum(flops.values()) / tp, sum(nbytes.values()) / tp, s,
                                    peak, bw)))
        if prof:
            rows[-1]["profile"] = prof
    return dict(model=args.model or args.synthetic, device=device, tp=tp, batch=b,
                prompt_len=T, window=args.window, timer="wall", copy_gbs=bw / 1e9,
                peak_tflops=peak / 1e12 if peak else None, rows=rows)


# ---------------------------------------------------------------------- command line

def print_report(r):
    peak = f"{r['peak_tflops']:g} TFLOP/s bf16 peak" if r["peak_tflops"] else \
        "no bf16 peak known (--peak-tflops): FLOP bound not reported"
    print(f"{r['model']}: prefill of {r['batch']} x {r['prompt_len']} tokens on {r['device']}"
          f" (tp = {r['tp']}); copy bandwidth {r['copy_gbs']:.0f} GB/s; {peak}")
    print("\n| mode | s per call | tokens/s | TFLOP | TFLOP/s | GB | ideal s (FLOPs; bytes) | "
          "of roofline | bound |\n|---|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        flop_s = "-" if row["flop_s"] is None else f"{row['flop_s']:.4g}"
        print(f"| {row['mode']} | {row['seconds']:.4g} | {row['tokens_per_s']:,.0f} | "
              f"{sum(row['flops'].values()) / 1e12:.4g} | {row['tflops_per_s']:.4g} | "
              f"{sum(row['bytes'].values()) / 1e9:.4g} | {row['ideal_s']:.4g} ({flop_s}; "
              f"{row['byte_s']:.4g}) | {row['of_roofline']:.1%} | {row['bound']} |")
    for row in r["rows"]:
        if "profile" in row:
            print_profile(row["mode"], row["seconds"], row["profile"])


def print_profile(mode: str, seconds: float, p: dict):
    """The class table and the top kernels of one mode's traced call."""
    print(f"\n{mode}: kernels of one traced call, {p['device_ms']:.4g} ms of device time "
          f"({p['device_ms'] / 1e3 / seconds:.0%} of the median call's wall time); trace: "
          f"{p['trace_dir']} (open with Perfetto / XProf)")
    print("\n| class | device ms | share | launches |\n|---|---|---|---|")
    for c in p["classes"]:
        print(f"| {c['cls']} | {c['ms']:.4g} | {c['share']:.1%} | {c['launches']} |")
    print("\n| kernel | class | launches | total ms |\n|---|---|---|---|")
    for k in p["kernels"][:TOP[0]]:
        print(f"| {k['name'][:80]} | {k['cls']} | {k['count']} | {k['total_ms']:.4g} |")


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --synthetic nemotron-h-8b",
        f"{PROG} --synthetic qwen3.5-9b --batch 8 --prompt-len 8192 --ssm-mode replay",
        f"{PROG} --model DIR --tp 2 --json"])
    add_model_source(ap)
    ap.add_argument("--batch", type=cli.at_least(1), default=32, metavar="N",
                    help="prompts prefilled together")
    ap.add_argument("--prompt-len", type=cli.at_least(1), default=2048, metavar="T",
                    help="tokens per prompt")
    ap.add_argument("--ssm-mode", nargs="+", choices=MODES, default=list(MODES),
                    help="cache layouts timed: standard (SSM state) and replay (ReplaySSM "
                         "checkpoint + ring)")
    ap.add_argument("--window", type=cli.window, default=16, metavar="L",
                    help="ReplaySSM ring window L")
    ap.add_argument("--iterations", type=cli.at_least(1), default=3, metavar="N",
                    help="timed calls per mode (their median is reported)")
    add_peak_argument(ap)
    ap.add_argument("--seed", type=cli.in_range(0, cli.INT32_MAX), default=0, metavar="S",
                    help="synthetic weights, prompt tokens")
    cli.add_tp_argument(ap)
    ap.add_argument("--profile", action="store_true",
                    help="also trace one call per mode: device time per kernel class and the "
                         "top kernels (the trace is kept in a new temporary directory)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    return ap


def parse_args(argv=None):
    """Parsed, checked arguments (exit 2 naming the flag)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if len(set(args.ssm_mode)) < len(args.ssm_mode):
        ap.error("argument --ssm-mode: a mode given twice")
    if args.model and args.dtype:
        ap.error("argument --dtype: sets --synthetic models' weights; --model DIR has its own")
    args.dtype = args.dtype or "bfloat16"
    return args


def _main(args):
    if args.model:
        cli.model_dir("--model", args.model)
    args.profile_dir = tempfile.mkdtemp(prefix="replayjax-prefill-trace-") if args.profile \
        else None
    try:
        # a profile names source lines: programs cached by another checkout must not be reused
        traced = fresh_metadata() if args.profile else contextlib.nullcontext()
        with traced, cli.Progress(2 + (2 + args.profile) * len(args.ssm_mode),
                                  cli.interactive(args)) as progress:
            r = bench(args, progress)
    except BaseException:
        if args.profile_dir:        # a failed run leaves no trace directory behind
            shutil.rmtree(args.profile_dir, ignore_errors=True)
        raise
    if args.json:
        print(json.dumps(r))
    else:
        print_report(r)


def main(argv=None):
    args = parse_args(argv)
    return cli.run(PROG, args, _main)


if __name__ == "__main__":
    sys.exit(main())
