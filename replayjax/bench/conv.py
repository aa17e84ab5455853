"""Decode conv benchmark: the Pallas `conv_update` kernel vs the XLA path, on one GPU.

One SSM layer's decode conv (T = 1) over a conv-state slot pool [S, K-1, C] at a real model's
width, bf16 pool and inputs (the models' activation dtype):
  * "xla": `pallas_kernels.conv.conv_update(impl="xla")`, what the models ran before the
    kernel (`ring.conv_window`'s gather + concat + conv, `ring.conv_commit`'s scatter);
  * "pallas": the Triton kernel (one launch, the pool updated in place), once per `--tune`
    tiling.
Method: device time of every kernel of one jitted call from CUPTI (median of 5), which runs the
op on `sets` disjoint slot sets of the pool in turn (the pool is >= 512 MiB, so a set's state
is not still in the 60 MB L2 from the call before), divided by `sets`. The pool is donated to
that call (in place, as in the models' step); the fresh pool it gets each time is made by one
elementwise kernel before it, which is left out of the time. Bytes: the state read and
written, the tokens and weights read, the fp32 output written; GB/s against the copy bandwidth
measured in the same process. Each row also reports the Pallas output's relative error against
the XLA one and whether the pools they leave are bitwise equal.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.families import MIN_POOL_BYTES
from replayjax.bench.kernels import check_tiling
from replayjax.bench.timing import add_sweep_arguments, run_sweep

PROG = "replayjax bench conv"
BATCHES = (1, 32, 256)
MAX_SETS = 16
K = 4
# (conv channels, conv bias) of the models' SSM layers (`replayjax.bench.synthetic` configs):
# Nemotron-H-8B x | B | C = 8192 + 2 x 8 x 128, biased; Qwen3.5-9B q | k | v = 2 x 2048 + 4096
SHAPES = {"nemotron-h-8b": (10240, True), "qwen3.5-9b": (8192, False)}


@dataclasses.dataclass
class Row:
    shape: str
    batch: int
    sets: int
    bytes: float                 # bytes per call a row must move (state r + w, token, out)
    us: dict                     # variant -> us per call
    rel_err: dict                # pallas variant -> relative error of the output against xla
    same_pool: dict              # pallas variant -> final pool bitwise equal to xla's

    def line(self, copy_bw):
        cells = []
        for name, us in self.us.items():
            gbs = self.bytes / (us * 1e-6) / 1e9
            extra = (f", err {self.rel_err[name]:.1e}, pool "
                     f"{'equal' if self.same_pool[name] else 'DIFFERS'}"
                     if name in self.rel_err else "")
            cells.append(f"{name}: **{us:.1f}** us, {gbs:.0f} GB/s = "
                         f"{100 * gbs * 1e9 / copy_bw:.0f}%{extra}")
        speedup = self.us["xla"] / min(v for k, v in self.us.items() if k != "xla")
        return (f"| {self.shape} | {self.batch} | {self.bytes / 1e6:.1f} | "
                + " | ".join(cells) + f" | {speedup:.2f}x |")


def problem(shape, batch, seed=0):
    """Random bf16 pool [S, K-1, C], windows [sets, b, 1, C], weight [C, K], bias [C] or None,
    slots [sets, b] (disjoint sets); returns them with the number of sets and the bytes per
    call."""
    import jax
    import jax.numpy as jnp
    C, biased = SHAPES[shape]
    slot_bytes = (K - 1) * C * 2
    sets = int(np.clip(-(-MIN_POOL_BYTES // (batch * slot_bytes)), 1, MAX_SETS))
    slots = (1 + np.arange(sets * batch, dtype=np.int32)).reshape(sets, batch)
    keys = jax.random.split(jax.random.key(seed), 4)
    pool = jax.random.normal(keys[0], (sets * batch + 1, K - 1, C), jnp.bfloat16)
    window = jax.random.normal(keys[1], (sets, batch, 1, C), jnp.bfloat16)
    weight = jax.random.normal(keys[2], (C, K), jnp.bfloat16)
    bias = jax.random.normal(keys[3], (C,), jnp.bfloat16) if biased else None
    nbytes = batch * C * (2 * (K - 1) * 2 + 2 + 4) + C * (K + biased) * 2
    return (pool, window, weight, bias, jnp.asarray(slots)), sets, float(nbytes)


def bench(shape, batch, tilings, iterations=5):
    """Times the XLA path and the kernel at every tiling; returns a Row."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels import conv
    from replayjax.bench.timing import kernel_times
    args, sets, nbytes = problem(shape, batch)
    fresh = jax.jit(lambda pool: jnp.where(jnp.isnan(pool), 0, pool))   # one kernel, not timed

    def variant(impl, tiling=None):
        @functools.partial(jax.jit, donate_argnums=0)
        def step(pool, window, weight, bias, slots):
            outs = []
            for s in range(sets):
                out, pool = conv.conv_update(pool, window[s], weight, bias, slots[s], impl=impl,
                                             tiling=tiling)
                outs.append(out)
            return outs, pool
        return lambda pool, *rest: step(fresh(pool), *rest)

    us, err, same, outs = {}, {}, {}, {}
    names = {"xla": ("xla", None)} | {
        "pallas" + (f" {cfg}" if cfg else ""): ("pallas", dataclasses.replace(conv.TILING, **cfg))
        for cfg in tilings}
    for name, (impl, tiling) in names.items():
        run = variant(impl, tiling)
        got, pool = run(*args)
        outs[name] = (np.asarray(got[0], np.float32), np.asarray(pool))
        times = kernel_times(run, *args, iterations=iterations)
        us[name] = float(np.median([sum(t for _, t in it[1:]) for it in times])) / sets
        if impl == "pallas":
            want = outs["xla"][0]
            err[name] = float(np.linalg.norm(outs[name][0] - want) / np.linalg.norm(want))
            same[name] = outs[name][1].tobytes() == outs["xla"][1].tobytes()
    return Row(shape=shape, batch=batch, sets=sets, bytes=nbytes, us=us, rel_err=err,
               same_pool=same)


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --batches 1 32 256",
        f"{PROG} --shapes nemotron-h-8b --tune '[{{}}, {{\"block_c\": 512}}, "
        f"{{\"grid_order\": \"row_slowest\"}}]' --json conv.json"])
    add_sweep_arguments(ap, SHAPES, BATCHES, "conv widths", "ConvTiling",
                        '[{}, {"block_c": 512, "num_warps": 2}]')
    return ap


def _run(args):
    cli.output_path("--json", args.json)
    from pallas_kernels import conv
    for cfg in args.tune:
        check_tiling("--tune", cfg, conv.TILING)
    cli.require_gpu()
    rows, bw = run_sweep(
        args, [(s, b) for s in args.shapes for b in args.batches],
        lambda shape, batch: bench(shape, batch, args.tune),
        stage=lambda shape, batch: f"{shape} batch {batch}", note=f"bf16 pools, K = {K}",
        header="| shape | batch | MB per call | per variant: us per call, GB/s (% of copy) | "
               "xla / best pallas |\n|---|---|---|---|---|")
    if args.json:
        cli.write_json(args.json, [dataclasses.asdict(r) | {"copy_bw": bw} for r in rows])


def main(argv=None):
    args = build_parser().parse_args(argv)
    return cli.run(PROG, args, _run)


if __name__ == "__main__":
    sys.exit(main())
