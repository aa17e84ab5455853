"""`replayjax profile`: a jax.profiler trace of decode steps plus a per-kernel time table.

    replayjax profile --synthetic nemotron-h-8b --batch 256 --steps 32 [--mode replay] \
        [--trace-dir DIR] [--json]

The trace (open it in Perfetto or XProf) covers `--steps` decode steps (one host visit) after a
warm-up, without the prompts' prefill; the table sums the device events of the trace per kernel
name (on a CPU-only machine: the host events).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
import tempfile


def kernel_table(trace_dir):
    """{event name: (count, total ns)} over the device planes of the trace (host if none)."""
    import jax
    files = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    if not files:
        raise FileNotFoundError(f"no .xplane.pb under {trace_dir}")
    data = jax.profiler.ProfileData.from_file(max(files))
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    planes = planes or [p for p in data.planes if p.name.startswith("/host:CPU")]
    table = collections.defaultdict(lambda: [0, 0.0])
    for plane in planes:
        for line in plane.lines:
            if not plane.name.startswith("/device:") and line.name == "python":
                continue
            for ev in line.events:
                table[ev.name][0] += 1
                table[ev.name][1] += ev.duration_ns
    return dict(table)


def main(argv=None):
    from replayjax.e2e_bench import SYNTHETIC, build_model
    ap = argparse.ArgumentParser(prog="replayjax profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--mode", choices=["replay", "standard"], default="replay")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace-dir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    from replayjax.engine import Engine, Request
    model = build_model(args)
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(3, model.cfg.vocab_size, (args.batch, args.prompt_len)).tolist()
    engine = Engine(model, num_slots=args.batch, max_len=args.prompt_len + 2 * args.steps + 8,
                    ssm_mode=args.mode, window=args.window, steps_per_visit=args.steps)
    reqs = lambda: [Request(prompt=p, max_new_tokens=args.steps + 1) for p in prompts]  # noqa: E731
    engine.generate(reqs())                                    # compile and warm up
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="replayjax-trace-")
    # prefill outside the trace: it covers the one decode visit of --steps steps (every visit
    # waits for its results, so nothing of the prefill is still running when the trace starts)
    visits, tracing = engine.serve(reqs()), False
    try:
        for kind in visits:
            if kind == "decode" and not tracing:
                jax.profiler.start_trace(trace_dir)
                tracing = True
    finally:
        if tracing:
            jax.profiler.stop_trace()
    table = sorted(kernel_table(trace_dir).items(), key=lambda kv: -kv[1][1])[:args.top]
    if args.json:
        print(json.dumps(dict(trace_dir=trace_dir, kernels=[
            dict(name=n, count=c, total_us=t / 1e3) for n, (c, t) in table])))
        return 0
    print(f"trace: {trace_dir} (open with Perfetto / XProf)")
    print("| kernel | launches | total us | us per launch |\n|---|---|---|---|")
    for name, (count, total) in table:
        print(f"| {name[:80]} | {count} | {total / 1e3:.1f} | {total / 1e3 / max(count, 1):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
