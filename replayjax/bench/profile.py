"""`replayjax profile`: a jax.profiler trace of decode steps, a per-kernel time table with each
kernel's class (ssm, gemm, attention, moe, sampling, other; from the HLO it runs,
`replayjax.bench.trace`), and the roofline per class (`replayjax.bench.roofline`): the minimum
bytes and FLOPs of a decode step, their ideal time -- the larger of the bytes at the copy
bandwidth measured in the same process and the FLOPs at the bf16 dense peak (--peak-tflops;
default from the device name, none on a CPU: then the bytes alone) -- and which of the two binds,
beside the measured device time.

The trace (open it in Perfetto or XProf) covers one host visit of --steps decode steps of --batch
requests of --prompt-len tokens, after a warm-up that compiles everything, without the prompts'
prefill. Device time sums the kernels of the trace (on a CPU-only machine: XLA's host thunks).
With --drafter (ngram, or mtp: the model's MTP head; --synthetic models get a random one) it
traces speculative verify steps of --num-draft drafts instead, by class and kernel; their
roofline is not modelled (its columns read "-").
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from replayjax import commandline as cli
from replayjax.bench.roofline import (
    CLASSES,
    decode_step_bytes,
    decode_step_flops,
    peak_note,
    table,
)
from replayjax.bench.synthetic import add_model_source, build
from replayjax.bench.timing import add_peak_argument, copy_bandwidth, peak_flops
from replayjax.bench.trace import fresh_metadata, kernel_table

PROG = "replayjax profile"


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --synthetic nemotron-h-8b --batch 256 --prompt-len 128 --steps 16",
        f"{PROG} --synthetic nemotron-h-8b --batch 64 --drafter mtp --num-draft 3",
        f"{PROG} --model DIR --batch 8 --trace-dir traces/run1 --json"])
    add_model_source(ap)
    ap.add_argument("--batch", type=cli.at_least(1), default=8, metavar="N",
                    help="requests decoded together")
    ap.add_argument("--prompt-len", type=cli.at_least(1), default=64, metavar="P",
                    help="prompt tokens")
    ap.add_argument("--steps", type=cli.at_least(1), default=16, metavar="N",
                    help="decode steps traced")
    ap.add_argument("--mode", choices=["replay", "standard"], default="replay",
                    help="how SSM layers decode")
    ap.add_argument("--window", type=cli.window, default=16, metavar="L",
                    help="ReplaySSM ring window L")
    ap.add_argument("--drafter", choices=["ngram", "mtp"],
                    help="trace speculative verify steps with this drafter (default: decode)")
    ap.add_argument("--num-draft", type=cli.at_least(1), metavar="K",
                    help="drafts per verify step, with --drafter (default: 3)")
    ap.add_argument("--seed", type=cli.in_range(0, cli.INT32_MAX), default=0, metavar="S",
                    help="synthetic weights, prompts")
    add_peak_argument(ap)
    cli.add_tp_argument(ap)
    ap.add_argument("--top", type=cli.at_least(1), default=25, metavar="N",
                    help="kernels listed")
    ap.add_argument("--trace-dir", metavar="DIR", type=cli.nonempty,
                    help="where the trace goes (default: a new temporary directory, kept)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    return ap


def parse_args(argv=None):
    """Parsed, checked arguments (exit 2 naming the flag)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.model and args.dtype:
        ap.error("argument --dtype: sets --synthetic models' weights; --model DIR has its own")
    args.dtype = args.dtype or "bfloat16"
    if args.num_draft is not None and not args.drafter:
        ap.error("argument --num-draft: needs --drafter (ngram or mtp)")
    args.num_draft = args.num_draft or 3
    if args.drafter and args.num_draft >= args.window:
        ap.error(f"argument --num-draft: must be < --window = {args.window}, got "
                 f"{args.num_draft}")
    return args


def profile(args, progress):
    """Runs the profile: a dict of the trace dir, kernels, classes (roofline rows) and times."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replayjax.drafters import make_drafter
    from replayjax.engine import Engine, Request
    from replayjax.loading import load_model

    with progress.stage("building the model"):
        mesh, experts = cli.tp_placement(args)
        model = (load_model(args.model, mesh=mesh, experts=experts) if args.model else
                 build(args.synthetic, jnp.dtype(args.dtype), args.seed,
                       args.drafter == "mtp", mesh=mesh, experts=experts))
    K = args.num_draft if args.drafter else 0
    if args.drafter:        # the drafter's own check first: its refusal names --drafter
        try:
            make_drafter(args.drafter, model, num_draft=K)
        except ValueError as e:
            raise cli.UserError(f"--drafter {args.drafter}: {e}") from None
    try:        # before the prompts: the cache check bounds --batch x --prompt-len
        engine = Engine(model, num_slots=args.batch,
                        max_len=args.prompt_len + (args.steps + 1) * (K + 1) + 16,
                        ssm_mode=args.mode, window=args.window, steps_per_visit=args.steps,
                        num_draft=K, drafter=args.drafter)
    except MemoryError as e:
        raise cli.UserError(f"--batch {args.batch}, --prompt-len {args.prompt_len}: {e}") from None
    except ValueError as e:     # settings this model cannot serve, named by their flags
        raise cli.engine_error(e) from None
    kind = "verify" if K else "decode"
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(3, model.cfg.vocab_size, (args.batch, args.prompt_len)).tolist()
    new_tokens = (args.steps + 1) * (K + 1)       # enough for --steps steps at any acceptance
    reqs = lambda: [Request(prompt=p, max_new_tokens=new_tokens) for p in prompts]  # noqa: E731
    with progress.stage("warm-up (compiling)"):
        t0 = time.perf_counter()
        engine.generate(reqs())
        compile_s = time.perf_counter() - t0
    # before the trace: the copy timing's CUPTI session fails ("activity records were dropped",
    # an abort) once jax.profiler's has run in the process
    with progress.stage("copy bandwidth"):
        bw = copy_bandwidth()
    peak = peak_flops(args.peak_tflops)
    trace_dir = args.trace_dir
    engine.visits.clear()
    # prefill stays outside the trace: every visit waits for its results, so nothing of the
    # prefill is still running when tracing starts at the first decode (verify) visit; it stops
    # once --steps steps of that kind have run (a visit runs up to --steps of them; with a host
    # drafter one), and the rest drains untraced
    with progress.stage(f"tracing {args.steps} {kind} steps"):
        visits, start, end = engine.serve(reqs()), None, None
        traced = lambda: [v for v in engine.visits[start:end] if v[0] == kind]  # noqa: E731
        try:
            for visit in visits:
                if start is not None and end is None and sum(
                        n for _, n, _ in traced()) >= args.steps:
                    end = len(engine.visits)
                    jax.profiler.stop_trace()
                if visit == kind and start is None:
                    start = len(engine.visits)
                    jax.profiler.start_trace(trace_dir)
        finally:
            if start is not None and end is None:
                end = len(engine.visits)
                jax.profiler.stop_trace()
    with progress.stage("classifying kernels"):
        kernels = kernel_table(trace_dir)
    steps = sum(n for _, n, _ in traced())
    visit_s = sum(s for _, _, s in traced())
    # with --tp: per device (kernel time of all tp devices / tp, bytes and FLOPs split evenly)
    # the conv class (the prompt's causal conv) counts as ssm here, as its state bytes do
    cls = lambda k: "ssm" if k["cls"] == "conv" else k["cls"]           # noqa: E731
    measured = {c: sum(k["total_ns"] for k in kernels if cls(k) == c) * 1e-9 / args.tp
                for c in CLASSES}
    if K:                   # verify steps: measured per class, no roofline modelled
        per_step = {c: s / max(steps, 1) * 1e6 for c, s in measured.items()}
        classes = [dict(cls=c, measured_us=us, min_mb=None, min_gflop=None, ideal_us=None,
                        bound=None, of_roofline=None)
                   for c, us in [*per_step.items(), ("total", sum(per_step.values()))]]
    else:
        kw = dict(mode=args.mode, window=args.window, state_dtype=jnp.float32)
        kv_len = args.prompt_len + (steps - 1) / 2
        min_bytes = decode_step_bytes(model, args.batch, kv_len, **kw)
        min_flops = decode_step_flops(model, args.batch, kv_len, **kw)
        classes = table({c: b / args.tp for c, b in min_bytes.items()}, bw, measured,
                        max(steps, 1), {c: f / args.tp for c, f in min_flops.items()}, peak)
    return dict(trace_dir=trace_dir, kind=kind, steps=steps, compile_s=compile_s,
                host_ms_per_step=visit_s / max(steps, 1) * 1e3, copy_gbs=bw / 1e9,
                peak_tflops=peak / 1e12 if peak else None,
                kernels=[dict(name=k["name"], cls=k["cls"], count=k["count"],
                              total_us=k["total_ns"] / 1e3, source=k["source"], by=k["by"])
                         for k in kernels],
                classes=classes)


def print_report(args, r):
    drafts = f" + {args.drafter} drafts of {args.num_draft}" if args.drafter else ""
    print(f"trace: {r['trace_dir']} (open with Perfetto / XProf); {r['steps']} "
          f"{r.get('kind', 'decode')} steps of {args.batch} rows, {args.mode}{drafts}, "
          f"tp = {args.tp}; "
          f"host visit {r['host_ms_per_step']:.2f} ms per step; "
          f"compile {r['compile_s']:.1f} s; copy bandwidth {r['copy_gbs']:.0f} GB/s; "
          f"{peak_note(r['peak_tflops'])}")
    print("\n| class | measured us per step | min MB per step | min GFLOP per step | "
          "ideal us (bound) | of roofline |\n|---|---|---|---|---|---|")
    for c in r["classes"]:
        frac = "-" if c["of_roofline"] is None else f"{c['of_roofline']:.0%}"
        if c["ideal_us"] is None:           # verify steps: no roofline
            print(f"| {c['cls']} | {c['measured_us']:.1f} | - | - | - | - |")
            continue
        print(f"| {c['cls']} | {c['measured_us']:.1f} | {c['min_mb']:.2f} | "
              f"{c['min_gflop']:.3g} | {c['ideal_us']:.1f} ({c['bound']}) | {frac} |")
    print("\n| kernel | class | launches | total us | us per step | source |\n"
          "|---|---|---|---|---|---|")
    for k in r["kernels"][:args.top]:
        # a kernel whose instruction the trace lacks was classed by its name: "(by name)"
        source = k["source"] or ("(by name)" if k["by"] == "name" else "")
        print(f"| {k['name'][:80]} | {k['cls']} | {k['count']} | {k['total_us']:.1f} | "
              f"{k['total_us'] / max(r['steps'], 1):.2f} | {source[:100]} |")


def _main(args):
    if args.model:
        cli.model_dir("--model", args.model)
    cli.output_path("--trace-dir", args.trace_dir, directory=True)
    created = args.trace_dir is None or not os.path.exists(args.trace_dir)
    args.trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="replayjax-trace-")
    try:
        with fresh_metadata(), cli.Progress(6, cli.interactive(args)) as progress:
            r = profile(args, progress)
    except BaseException:
        if created:         # a failed run leaves no trace directory behind
            shutil.rmtree(args.trace_dir, ignore_errors=True)
        raise
    if args.json:
        print(json.dumps(r | dict(kernels=r["kernels"][:args.top])))
    else:
        print_report(args, r)


def main(argv=None):
    args = parse_args(argv)
    return cli.run(PROG, args, _main)


if __name__ == "__main__":
    sys.exit(main())
