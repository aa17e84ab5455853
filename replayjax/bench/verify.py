"""Speculative verify benchmark: ReplaySSM verify + commit vs the state-per-draft baseline.

Per layer-step device time (CUPTI) of everything one verify step launches: for ReplaySSM the
verify kernel, the ring writes of the window and the count commit; for the baseline the kernel
that runs T standard steps and writes one full state per window token (rollback = continue from
the state of the last accepted token: the engine's standard mode remaps the slot's state row, so
commit copies nothing). Both sides get the same tiling sweep: `--tune` for ReplaySSM's verify
kernel, `--tune-baseline` for the baseline's. `--impls` times ReplaySSM verify's Pallas
implementations side by side ("pallas": Triton, "pallas_mosaic_gpu": Mosaic GPU), each against
the Triton baseline. Acceptance is random,
uniform in 1..T per row and step, so rows fold at their own pace (amortised over many steps).
Pools over 512 MiB as in `replayjax bench kernels`. Memory per sequence: ReplaySSM keeps one
state plus the ring; the baseline one state per window token plus the committed one.

Minimum bytes per row-step: baseline = state read + T states written + T tokens' inputs/outputs;
ReplaySSM = state read + state written on fold steps only + the committed ring entries read + T
entries written + T tokens' inputs/outputs, with the fold rate and mean committed count taken from
the commit rule under the same acceptance law (`fold_statistics`).

`--split` also times ReplaySSM verify with every row held at one count (no commit): the mean count
of the non-fold steps (no row folds), then of the fold steps (every row folds), under the same
acceptance law (`held_counts`): the verify's non-fold and fold steps, and their mix at
the commit rule's fold rate beside the measured step (what fewer folds would gain; the held steps
launch no count commit, a one-op share of the measured step).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import json
import sys

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.families import FAMILIES, MIN_POOL_BYTES, check_shape_names, pool_sets
from replayjax.bench.kernels import IMPLS, check_tiling
from replayjax.bench.timing import copy_bandwidth, from_first, kernel_times, per_kernel

PROG = "replayjax bench verify"
BATCHES = (1, 8, 32, 64, 128, 256, 512)


def verify_tiling(ops, impl, T):
    """The measured replay_verify tiling of a family's `impl` for a window of T tokens (the
    Mosaic GPU kernels' are by window; the Triton kernels switch chunks inside)."""
    if impl == "pallas_mosaic_gpu":
        from pallas_kernels.validation import for_window  # jax: not at a parse error
        return for_window(ops.MOSAIC_VERIFY_TILINGS, T)
    return ops.VERIFY_TILING


@functools.cache
def _counts(T, L, steps, seed):
    """The committed count before each of `steps` verify steps [steps] (read-only: cached, as a
    row's bytes, fold rate and held counts all read it), from 0, when every step accepts
    n ~ U{1..T}, under the commit rule of `pallas_kernels.ring.commit_counts`."""
    n_acc = np.random.default_rng(seed).integers(1, T + 1, steps)
    c, out = 0, np.empty(steps, np.int64)
    for i, n in enumerate(n_acc):
        out[i] = c
        c = n - 1 if c + T >= L else c + n
    out.flags.writeable = False
    return out


def fold_statistics(T, L, steps=100_000, seed=0):
    """(fraction of verify steps that fold, mean committed ring count before a step) under random
    acceptance (`_counts`)."""
    c = _counts(T, L, steps, seed)
    return float(np.mean(c + T >= L)), float(np.mean(c))


def held_counts(T, L, steps=100_000, seed=0):
    """(non-fold, fold) counts for `--split`: the mean committed count of the non-fold steps and
    of the fold steps under random acceptance, rounded, so each held step walks as many ring
    entries as its kind does on average."""
    c = _counts(T, L, steps, seed)
    fold = c + T >= L
    return int(round(c[~fold].mean())), int(round(c[fold].mean()))


def min_bytes(fam, dims, T, L, ring_itemsize):
    """(ReplaySSM, baseline) minimum bytes per row and verify step (see the module docstring)."""
    st, io, entry = fam.state_bytes(dims), fam.token_io(dims), fam.entry_bytes(dims, ring_itemsize)
    fold_rate, held = fold_statistics(T, L)
    return st + fold_rate * st + held * entry + T * entry + T * io, st + T * st + T * io


def window_inputs(inputs, n_token_inputs, T):
    """Per-token inputs [b, ...] -> window inputs [b, T, ...] (the same token T times)."""
    import jax.numpy as jnp
    return tuple(jnp.repeat(t[:, None], T, axis=1) if i < n_token_inputs else t
                 for i, t in enumerate(inputs))


def _step_us(fn, args, first_kernel, n_steps, iterations, breakdown):
    """Median over iterations of the device us per loop step of every kernel from the first
    launch of `first_kernel` on (the copies of non-donated inputs come before it); with
    `breakdown`, the top kernels of the last iteration too."""
    runs = from_first(kernel_times(fn, *args, iterations=iterations), first_kernel)
    if breakdown:
        for name, us in per_kernel(runs[-1], n_steps):
            print(f"    {first_kernel}: {us:9.1f} us  {name[:60]}", flush=True)
    return float(np.median([sum(us for _, us in it) / n_steps for it in runs]))


def bench_verify(fam, shape, batch, T, *, L=16, ring, seed=0, iterations=3,
                 min_pool_bytes=MIN_POOL_BYTES, steps_per_set=16, replay_kw=None,
                 baseline_kw=None, breakdown=False, impl="pallas", split=False):
    """One row: ReplaySSM verify + commit (Pallas implementation `impl`) vs the state-per-draft
    baseline at (shape, batch, T). replay_kw: overrides of the fields of `impl`'s verify tiling
    at T (`verify_tiling`; Triton: block_p / block_n / block_v, block_k / block_k_long, num_warps,
    fold; Mosaic GPU: block_n / block_k, num_stages), default none (the measured tiling); the
    baseline_kw: the same for the baseline's tiling at T (`standard_verify_tiling`: block_p /
    block_n / block_v, num_warps, grid_order). split: also the non-fold and fold steps
    (`nonfold_us`, `fold_us`; module docstring)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.ring import commit_counts

    ops = fam.ops()
    dims = fam.shapes[shape]
    per_seq = fam.state_bytes(dims)
    n_sets, S, ids = pool_sets(fam, dims, batch, 1 + T, min_pool_bytes, seed)  # + T drafts
    sets, drafts = jnp.asarray(ids[..., 0], jnp.int32), jnp.asarray(ids[..., 1:], jnp.int32)
    inputs, bufs = fam.setup(dims, batch, S, L, jnp.dtype(ring), jax.random.key(seed))
    win = window_inputs(inputs, fam.token_inputs, T)
    n_steps = n_sets * steps_per_set
    key = jax.random.key(seed + 1)
    tiling = dataclasses.replace(verify_tiling(ops, impl, T), **(replay_kw or {}))
    base_tiling = dataclasses.replace(ops.standard_verify_tiling(T), **(baseline_kw or {}))

    @jax.jit
    def run_replay(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            _, bufs = ops.replay_verify(bufs, counts, *win, slots, impl=impl, tiling=tiling)
            n_acc = jax.random.randint(jax.random.fold_in(key, i), (batch,), 1, T + 1)
            return bufs, commit_counts(counts, slots, n_acc, T, L)
        return jax.lax.fori_loop(0, n_steps, body, (bufs, counts))

    @jax.jit
    def run_baseline(state):
        def body(i, state):
            k = i % n_sets
            _, state = ops.standard_verify(state, *win, sets[k], drafts[k], impl="pallas",
                                           tiling=base_tiling)
            return state
        return jax.lax.fori_loop(0, n_steps, body, state)

    @jax.jit
    def run_held(bufs, counts):         # counts held: every row folds, or none does
        def body(i, bufs):
            return ops.replay_verify(bufs, counts, *win, sets[i % n_sets], impl=impl,
                                     tiling=tiling)[1]
        return jax.lax.fori_loop(0, n_steps, body, bufs)

    rep = _step_us(run_replay, (bufs, jnp.zeros((S,), jnp.int32)), "replay_verify", n_steps,
                   iterations, breakdown)
    held = {}
    if split:
        for name, count in zip(("nonfold_us", "fold_us"), held_counts(T, L)):
            held[name] = _step_us(run_held, (bufs, jnp.full((S,), count, jnp.int32)),
                                  "replay_verify", n_steps, iterations, False)
    base = _step_us(run_baseline, (bufs.checkpoint,), "standard_verify", n_steps, iterations,
                    breakdown)
    ring_bytes = sum(a.nbytes for a in bufs[1:]) / S
    rep_b, base_b = min_bytes(fam, dims, T, L, jnp.dtype(ring).itemsize)
    return dict(family=fam.name, impl=impl, shape=shape, batch=batch, T=T, replay_us=rep,
                baseline_us=base, speedup=base / rep, replay_mem_per_seq=per_seq + ring_bytes,
                baseline_mem_per_seq=per_seq * (1 + T), replay_bytes_per_row=rep_b,
                baseline_bytes_per_row=base_b, replay_gbs=rep_b * batch / rep / 1e3,
                baseline_gbs=base_b * batch / base / 1e3, fold_rate=fold_statistics(T, L)[0],
                **held)


HEADER = ("| shape | batch | T | ReplaySSM verify+commit us | state-per-draft us | speedup | "
          "min MB per row-step (replay / baseline) | replay GB/s (% copy) | baseline GB/s "
          "(% copy) | MB per sequence (replay / baseline) |\n" + "|---" * 10 + "|")


def line(r, copy_gbs):
    impl = "" if r["impl"] == "pallas" else f"{r['impl']} "
    label = impl + r["shape"] + "".join(f" {who} {json.dumps(r[k])}" for who, k in (
        ("replay", "replay_kw"), ("baseline", "baseline_kw")) if r.get(k))
    split = ""
    if "fold_us" in r:      # the step's parts, and their mix at the commit rule's fold rate
        f = r["fold_rate"]
        mix = (1 - f) * r["nonfold_us"] + f * r["fold_us"]
        split = (f" (non-fold {r['nonfold_us']:.1f}, fold {r['fold_us']:.1f}: at {f:.0%} "
                 f"folds {mix:.1f})")
    return (f"| {label} | {r['batch']} | {r['T']} | {r['replay_us']:.1f}{split} | "
            f"{r['baseline_us']:.1f} | **{r['speedup']:.2f}x** | "
            f"{r['replay_bytes_per_row'] / 1e6:.2f} / {r['baseline_bytes_per_row'] / 1e6:.2f} | "
            f"{r['replay_gbs']:.0f} ({100 * r['replay_gbs'] / copy_gbs:.0f}%) | "
            f"{r['baseline_gbs']:.0f} ({100 * r['baseline_gbs'] / copy_gbs:.0f}%) | "
            f"{r['replay_mem_per_seq'] / 1e6:.2f} / {r['baseline_mem_per_seq'] / 1e6:.2f} |")


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --family gdn --tokens 2 4 8 --batches 1 32 256",
        f"{PROG} --family mamba2 --tokens 4 --batches 256 --impls pallas pallas_mosaic_gpu",
        f"{PROG} --family mamba2 --tokens 4 --batches 256 --tune '[{{}}, {{\"block_n\": 32}}]'"])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mamba2", help="kernel family")
    ap.add_argument("--shapes", nargs="+", metavar="SHAPE",
                    help="layer shapes (as for bench kernels); default: every shape of the family")
    ap.add_argument("--tokens", nargs="+", type=cli.in_range(1, cli.MAX_VERIFY_TOKENS),
                    default=[2, 4, 8], metavar="T",
                    help="verify window tokens T (drafts + 1), each <= --window")
    ap.add_argument("--batches", nargs="+", type=cli.at_least(1), default=list(BATCHES),
                    metavar="N", help="rows per step")
    ap.add_argument("--window", type=cli.window, default=16, metavar="L",
                    help="ring window L")
    ap.add_argument("--ring-dtype", choices=["bfloat16", "float32"], default=None,
                    help="ring dtype (default: bfloat16 for mamba2, float32 for gdn)")
    ap.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS[:1]),
                    help="ReplaySSM verify implementations to time, each against the baseline "
                         "(default: pallas, the Triton kernel; pallas_mosaic_gpu: Mosaic GPU)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also print us per step by kernel name")
    ap.add_argument("--split", action="store_true",
                    help="also time ReplaySSM verify with no row folding and with every row "
                         "folding (counts held), and their mix at the commit rule's fold rate")
    ap.add_argument("--tune", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help='JSON list of replay_verify tilings to time, e.g. '
                         '\'[{"block_p": 32, "num_warps": 4}, {"num_warps": 8}]\'; [{}] is the '
                         'tuned default')
    ap.add_argument("--tune-baseline", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help='the same for the baseline\'s standard_verify tilings, e.g. '
                         '\'[{}, {"block_n": 32}, {"num_warps": 4}]\'; every pair of --tune and '
                         '--tune-baseline configs is timed')
    ap.add_argument("--json", metavar="FILE", type=cli.nonempty,
                    help="also write the rows as JSON to FILE")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    check_shape_names(ap, args)
    if bad := [T for T in args.tokens if T > args.window]:
        ap.error(f"argument --tokens: T = {bad} exceeds --window {args.window} (T <= L)")
    return args


def check_tilings(args):
    """UserError unless every --tune / --tune-baseline entry names fields of its tiling (no GPU
    needed: the dry run of `scripts/gpu_session.sh` checks its sweeps with it)."""
    ops = FAMILIES[args.family]().ops()
    for impl in args.impls:
        for cfg, T in itertools.product(args.tune, args.tokens):
            check_tiling("--tune", cfg, verify_tiling(ops, impl, T))
    for cfg in args.tune_baseline:
        check_tiling("--tune-baseline", cfg, ops.STANDARD_VERIFY_TILING)


def _run(args):
    import jax
    cli.output_path("--json", args.json)
    fam = FAMILIES[args.family]()
    check_tilings(args)
    cli.require_gpu()
    ring = args.ring_dtype or fam.default_ring
    shapes = args.shapes or list(fam.shapes)
    grid = [(s, T, b, i, kw, bkw) for s in shapes for T in args.tokens for b in args.batches
            for i in args.impls for kw in args.tune for bkw in args.tune_baseline]
    progress = cli.Progress(len(grid) + 1, cli.interactive(args))
    with progress.stage("copy bandwidth"):
        bw = copy_bandwidth() / 1e9
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e3:.2f} "
          f"TB/s; {fam.name}; L = {args.window}; {ring} ring; acceptance uniform in 1..T")
    print(HEADER, flush=True)
    rows = []
    for shape, T, batch, impl, kw, bkw in grid:
        gc.collect()            # the last row's pools (up to 1 + T states a row) freed first
        try:
            with progress.stage(f"{impl} {shape} T {T} batch {batch}"):
                r = bench_verify(fam, shape, batch, T, L=args.window, ring=ring, replay_kw=kw,
                                 baseline_kw=bkw, breakdown=args.breakdown, impl=impl,
                                 split=args.split)
        except Exception as e:   # noqa: BLE001 -- a row that does not fit is a result
            if not cli.out_of_memory(e):
                raise
            # the baseline's T + 1 states per row did not fit: a row saying so, the rest runs
            error = cli.one_line(e)
            print(f"| {shape} | {batch} | {T} | {error[:120]} |" + " |" * 6, flush=True)
            rows.append(dict(family=fam.name, impl=impl, shape=shape, batch=batch, T=T,
                             replay_kw=kw, baseline_kw=bkw, error=error))
            continue
        r.update(copy_gbs=bw, replay_kw=kw, baseline_kw=bkw)
        rows.append(r)
        print(line(r, bw), flush=True)
    progress.close()
    if args.json:
        cli.write_json(args.json, rows)


def main(argv=None):
    args = parse_args(argv)
    return cli.run(PROG, args, _run)


if __name__ == "__main__":
    sys.exit(main())
