"""Decode attention benchmark: the Pallas kernel over the slot pool vs the XLA path, on one GPU.

One attention layer's decode (T = 1) or verify (T > 1) attention over a bf16 KV pool at a real
model's head layout, rows at mixed lengths (cached tokens uniform in [0, max_len - T)):
  * "xla": `pallas_kernels.attention.decode_attention(impl="xla")`, what the models ran before
    the kernel (every row's whole max_len gathered from the pool, fp32 HIGHEST einsums);
  * "pallas": the Triton kernel (the K/V of each row's valid positions read straight from the
    pool), once per `--tune` tiling.
Method: device time of every kernel of one jitted call from CUPTI (median of 5), which runs the
op on `sets` disjoint slot sets of the pool in turn (the pool is >= 512 MiB, so a set's K/V is
not still in the 60 MB L2 from the call before), divided by `sets`. Bytes: the K and V of the
valid positions (what a row must read); GB/s against the copy bandwidth measured in the same
process. Each row also reports the Pallas output's relative error against the XLA one.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.families import MIN_POOL_BYTES
from replayjax.bench.kernels import check_tiling
from replayjax.bench.timing import add_sweep_arguments, run_sweep

PROG = "replayjax bench attention"
BATCHES = (1, 32, 256)
MAX_SETS = 16
# (query heads, KV heads, head dim) of the models' attention layers (their config.json files)
SHAPES = {"nemotron-h-8b": (32, 8, 128), "qwen3.5-9b": (16, 4, 256)}


@dataclasses.dataclass
class Row:
    shape: str
    batch: int
    tokens: int
    sets: int
    bytes: float                 # valid K/V bytes per call (mean over the sets)
    us: dict                     # variant -> us per call
    rel_err: dict                # pallas variant -> relative error against xla

    def line(self, copy_bw):
        cells = []
        for name, us in self.us.items():
            gbs = self.bytes / (us * 1e-6) / 1e9
            err = f", err {self.rel_err[name]:.1e}" if name in self.rel_err else ""
            cells.append(f"{name}: **{us:.1f}** us, {gbs:.0f} GB/s = "
                         f"{100 * gbs * 1e9 / copy_bw:.0f}%{err}")
        speedup = self.us["xla"] / min(v for k, v in self.us.items() if k != "xla")
        return (f"| {self.shape} | {self.batch} | {self.tokens} | {self.bytes / 1e6:.1f} | "
                + " | ".join(cells) + f" | {speedup:.2f}x |")


def problem(shape, batch, tokens, max_len, seed=0):
    """Random bf16 q [sets, b, T, nh, hd] and pools [S, max_len, kv, hd], slots [sets, b]
    (disjoint sets), starts [sets, b]; returns them with the number of sets and the valid K/V
    bytes per call."""
    import jax
    import jax.numpy as jnp
    nh, kv, hd = SHAPES[shape]
    slot_bytes = 2 * max_len * kv * hd * 2
    sets = int(np.clip(-(-MIN_POOL_BYTES // (batch * slot_bytes)), 1, MAX_SETS))
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, max_len - tokens, (sets, batch)).astype(np.int32)
    slots = (1 + np.arange(sets * batch, dtype=np.int32)).reshape(sets, batch)
    keys = jax.random.split(jax.random.key(seed), 3)
    pool = (sets * batch + 1, max_len, kv, hd)
    k_pool = jax.random.normal(keys[0], pool, jnp.bfloat16)
    v_pool = jax.random.normal(keys[1], pool, jnp.bfloat16)
    q = jax.random.normal(keys[2], (sets, batch, tokens, nh, hd), jnp.bfloat16)
    valid = float(np.mean(np.sum(starts + tokens, axis=1))) * kv * hd * 2 * 2
    return (q, k_pool, v_pool, jnp.asarray(slots), jnp.asarray(starts)), sets, valid


def bench(shape, batch, tokens, max_len, tilings, iterations=5):
    """Times the XLA path and the kernel at every tiling; returns a Row."""
    import jax

    from pallas_kernels import attention
    from replayjax.bench.timing import kernel_times
    args, sets, nbytes = problem(shape, batch, tokens, max_len)

    def variant(impl, tiling=None):
        @jax.jit
        def run(q, k_pool, v_pool, slots, starts):
            return [attention.decode_attention(q[s], k_pool, v_pool, slots[s], starts[s],
                                               impl=impl, tiling=tiling) for s in range(sets)]
        return run

    us, err, outs = {}, {}, {}
    names = {"xla": ("xla", None)} | {
        "pallas" + (f" {cfg}" if cfg else ""): ("pallas", attention.AttentionTiling(
            **dataclasses.asdict(attention.default_tiling(args[1].shape[3])) | cfg))
        for cfg in tilings}
    for name, (impl, tiling) in names.items():
        run = variant(impl, tiling)
        outs[name] = np.asarray(run(*args)[0], np.float32)
        times = kernel_times(run, *args, iterations=iterations)
        us[name] = float(np.median([sum(t for _, t in it) for it in times])) / sets
        if impl == "pallas":
            want = outs["xla"]
            err[name] = float(np.linalg.norm(outs[name] - want) / np.linalg.norm(want))
    return Row(shape=shape, batch=batch, tokens=tokens, sets=sets, bytes=nbytes, us=us,
               rel_err=err)


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --batches 1 32 256",
        f"{PROG} --shapes qwen3.5-9b --tokens 4 --max-len 4096",
        f"{PROG} --tune '[{{}}, {{\"block_k\": 32}}, {{\"num_warps\": 8}}]' --json attn.json"])
    add_sweep_arguments(ap, SHAPES, BATCHES, "head layouts", "AttentionTiling",
                        '[{}, {"block_k": 32}]')
    ap.add_argument("--tokens", nargs="+", type=cli.in_range(1, 8), default=[1], metavar="T",
                    help="new tokens per row (1: decode, > 1: speculative verify)")
    ap.add_argument("--max-len", type=cli.at_least(16), default=8192, metavar="N",
                    help="pool positions per slot (cached tokens per row uniform in [0, N - T))")
    return ap


def _run(args):
    cli.output_path("--json", args.json)
    from pallas_kernels import attention
    for cfg in args.tune:
        check_tiling("--tune", cfg, attention.TILING)
    if args.max_len <= max(args.tokens):
        raise cli.UserError(f"--max-len {args.max_len} must exceed --tokens {max(args.tokens)}")
    cli.require_gpu()
    rows, bw = run_sweep(
        args, [(s, b, t) for s in args.shapes for t in args.tokens for b in args.batches],
        lambda shape, batch, tokens: bench(shape, batch, tokens, args.max_len, args.tune),
        stage=lambda shape, batch, tokens: f"{shape} batch {batch} T {tokens}",
        note=f"bf16 pools, max_len {args.max_len}",
        header="| shape | batch | T | valid K/V MB | per variant: us per call, GB/s (% of copy) | "
               "xla / best pallas |\n|---|---|---|---|---|---|")
    if args.json:
        cli.write_json(args.json, [dataclasses.asdict(r) | {"copy_bw": bw,
                                                            "max_len": args.max_len}
                                   for r in rows])


def main(argv=None):
    args = build_parser().parse_args(argv)
    return cli.run(PROG, args, _run)


if __name__ == "__main__":
    sys.exit(main())
