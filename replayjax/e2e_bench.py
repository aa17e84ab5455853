"""End-to-end A/B benchmark: the same requests through standard and ReplaySSM decoding (and with
and without speculation), on one model.

    python -m replayjax.e2e_bench --synthetic nemotron-h-8b --batch 256 --prompt-len 128 \
        --new-tokens 128 [--variants standard replay replay+ngram] [--json]
    python -m replayjax.e2e_bench --model DIR ...          # a real or converted checkpoint

Synthetic models have real dimensions and random weights (bf16 by default, fp32 state). Per
variant: steady-state decode step time (median over decode visits, after a warm-up run that
compiles everything), tokens/s, TTFT and per-request latency p50/p90, time per output token,
accepted drafts per verify step, peak device memory, failures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

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
        linear_conv_kernel_dim=4, intermediate_size=12288, rms_norm_eps=1e-6),
}


def randomize(model, seed=0):
    """Random weights of realistic scale in place (never benchmark zeros): linear/expert/embedding
    weights N(0, 1/fan_in) (embeddings N(0, 1)), A_log ~ log U(1, 16), dt_bias = softplus^-1 of
    U(1e-3, 0.1); norms, D and biases keep their constructor values."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    key = jax.random.key(seed)
    for i, (path, var) in enumerate(nnx.iter_graph(model)):
        if not isinstance(var, nnx.Param):
            continue
        name, x = str(path[-1]), var[...]
        k = jax.random.fold_in(key, i)
        if name == "A_log":
            var[...] = jnp.log(jax.random.uniform(k, x.shape, jnp.float32, 1.0, 16.0))
        elif name == "dt_bias":
            dt = jax.random.uniform(k, x.shape, jnp.float32, 1e-3, 0.1)
            var[...] = dt + jnp.log(-jnp.expm1(-dt))
        elif name in ("kernel", "up", "down", "gate", "conv_weight", "embeddings", "embed_tokens"):
            fan_in = 1 if name in ("embeddings", "embed_tokens") else x.shape[-2] if x.ndim > 1 else 1
            var[...] = (jax.random.normal(k, x.shape, jnp.float32) * fan_in ** -0.5).astype(x.dtype)
    return model


def build_model(args):
    import jax.numpy as jnp
    from models.config import parse_config
    from replayjax.loading import load_model, model_class
    if args.model:
        return load_model(args.model)
    cfg = parse_config(SYNTHETIC[args.synthetic])
    return randomize(model_class(cfg)(cfg, dtype=jnp.dtype(args.dtype)), args.seed)


def _pct(v, q):
    return float(np.percentile(v, q)) if len(v) else float("nan")


def run_variant(model, variant, args, requests):
    import jax
    from replayjax.engine import Engine
    mode, _, spec = variant.partition("+")
    engine = Engine(model, num_slots=args.batch, max_len=args.prompt_len + args.new_tokens + 16,
                    ssm_mode=mode, window=args.window, steps_per_visit=args.steps_per_visit,
                    num_draft=args.num_draft if spec == "ngram" else 0)
    engine.generate(requests(min(args.batch, 2), 2 * args.steps_per_visit))   # compile, warm up
    engine.visits.clear()
    failures = 0
    t0 = time.perf_counter()
    try:
        out = engine.generate(requests(args.batch, args.new_tokens))
    except Exception as e:          # reported, not hidden: a variant that fails is a result
        print(f"{variant}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return dict(variant=variant, failures=args.batch)
    wall = time.perf_counter() - t0
    step = [s / n for kind, n, s in engine.visits if kind in ("decode", "verify") and n]
    tokens = sum(len(c.tokens) for c in out)
    verify = [c for c in out if c.verify_steps]
    mem = jax.devices()[0].memory_stats() or {}
    return dict(
        variant=variant, step_ms=1e3 * float(np.median(step)) if step else float("nan"),
        tokens_per_s=tokens / wall, completion_s=wall,
        ttft_p50_s=_pct([c.ttft_s for c in out], 50), ttft_p90_s=_pct([c.ttft_s for c in out], 90),
        latency_p50_s=_pct([c.completion_s for c in out], 50),
        latency_p90_s=_pct([c.completion_s for c in out], 90),
        tpot_ms=1e3 * _pct([c.tpot_s for c in out], 50),
        accepted_per_verify=(sum(c.accepted_drafts for c in verify) /
                             max(sum(c.verify_steps for c in verify), 1)) if verify else None,
        peak_mem_gb=mem.get("peak_bytes_in_use", 0) / 1e9 or None, failures=failures)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="replayjax bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (HF or converted)")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="real dims, random weights")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--variants", nargs="+", default=["standard", "replay"],
                    help="standard | replay | replay+ngram")
    ap.add_argument("--num-draft", type=int, default=3)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--steps-per-visit", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from replayjax.engine import Request
    model = build_model(args)
    rng = np.random.default_rng(args.seed)
    vocab = model.cfg.vocab_size
    prompts = rng.integers(3, vocab, (args.batch, args.prompt_len)).tolist()

    def requests(n, new):
        return [Request(prompt=prompts[i], max_new_tokens=new, id=i) for i in range(n)]

    rows = [run_variant(model, v, args, requests) for v in args.variants]
    base = next((r for r in rows if r["variant"] == "standard" and "step_ms" in r), None)
    for r in rows:
        if base and "step_ms" in r:
            r["step_speedup_vs_standard"] = base["step_ms"] / r["step_ms"]
            r["tokens_per_s_vs_standard"] = r["tokens_per_s"] / base["tokens_per_s"]
    if args.json:
        print(json.dumps(dict(config=vars(args), rows=rows), default=str))
        return 0
    print(f"{args.model or args.synthetic}: batch {args.batch}, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, L = {args.window}")
    print("| variant | decode step ms | vs standard | tokens/s | TTFT p50/p90 s | latency p50/p90 s "
          "| TPOT ms | drafts accepted / verify | peak GB | failures |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "step_ms" not in r:
            print(f"| {r['variant']} | failed | | | | | | | | {r['failures']} |")
            continue
        print(f"| {r['variant']} | {r['step_ms']:.2f} | {r.get('step_speedup_vs_standard', 1):.2f}x | "
              f"{r['tokens_per_s']:.0f} | {r['ttft_p50_s']:.3f}/{r['ttft_p90_s']:.3f} | "
              f"{r['latency_p50_s']:.2f}/{r['latency_p90_s']:.2f} | {r['tpot_ms']:.2f} | "
              f"{'-' if r['accepted_per_verify'] is None else format(r['accepted_per_verify'], '.2f')} | "
              f"{r['peak_mem_gb'] or '-'} | {r['failures']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
