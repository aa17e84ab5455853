"""Kernel benchmark: standard vs ReplaySSM decode per layer-step, on one GPU.

Method (docs/benchmarks.md):
  * per-kernel device time from CUPTI, inside one compiled `fori_loop` of steps, so launch gaps
    and host work are excluded for both kernels alike;
  * the state pool of every timing unit is >= 512 MiB (>> the 60 MB L2): disjoint random slot
    sets are used in turn, so a slot's state comes back only after 512 MiB of other states;
  * headline, "staggered": every slot starts at a random ring count, so each step mixes fold and
    non-fold rows, as in a serving batch;
  * beside it, "amortised": every set goes through ring counts 0..L-1 together (L - 1 non-fold
    steps, then one fold step), averaged over whole cycles, with the non-fold and fold step
    times separately;
  * minimum bytes: standard = state read + write + token inputs/outputs; replay = state read +
    state write / L + the (L - 1) / 2 ring entries held on average + ring append + token I/O;
  * a step's time is its kernel plus the XLA ops its wrapper launches around it (e.g. the
    Mosaic Mamba-2 replay's ring B . C products, the GDN Triton replay's ring key products with
    ring_scalars="xla"): the replay loop's device time per step, every kernel from the first
    replay launch on, less the bench's own launches (`bench_us`): a loop of the ring counts'
    update alone (`advance_counts`, one op per model step shared by all SSM layers) and what
    the standard loop launches besides its kernel (the step's slot set, materialised for the
    kernel's operand); spread evenly over the steps (`wrapper_us` in the JSON rows);
  * copy bandwidth measured in the same process (x + 1 over 2 GiB, bytes read + written);
  * `--impls` times Pallas implementations side by side: "pallas" (Triton) and
    "pallas_mosaic_gpu" (Mosaic GPU), each from its own measured tilings.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.families import (
    FAMILIES,
    MIN_POOL_BYTES,
    Family,
    check_shape_names,
    pool_sets,
)
from replayjax.bench.timing import copy_bandwidth, from_first, kernel_times, launches

PROG = "replayjax bench kernels"
BATCHES = (1, 8, 32, 64, 128, 256, 512)
IMPLS = ("pallas", "pallas_mosaic_gpu")


def base_tilings(ops, impl):
    """The measured (standard, replay) tilings of a family's `impl`."""
    prefix = "MOSAIC_" if impl == "pallas_mosaic_gpu" else ""
    return tuple(getattr(ops, f"{prefix}{k}_TILING") for k in ("STANDARD", "REPLAY"))


# ---------------------------------------------------------------------- schedules

def cycling_counts(n_sets: int, L: int) -> np.ndarray:
    """Ring count of the rows of each step of the cycling schedule: step i runs set i % n_sets,
    whose rows start at count 0 and advance once per use, so at count i // n_sets; the last
    n_sets steps fold. [n_sets * L] int."""
    return np.arange(n_sets * L) // n_sets


def split_cycle(launch_us, n_sets: int, L: int) -> tuple[float, float]:
    """(mean non-fold step, mean fold step) us of one cycling run's launches [n_sets * L]."""
    per_count = np.asarray(launch_us, float).reshape(L, n_sets)
    return float(per_count[:-1].mean()), float(per_count[-1].mean())


def staggered_counts(S: int, L: int, seed: int) -> np.ndarray:
    """Starting ring count of every slot of a pool of S for the staggered schedule: uniform in
    [0, L), so every step mixes folding (count L - 1) and appending rows. [S] int32."""
    return np.random.default_rng(seed).integers(0, L, S).astype(np.int32)


# ---------------------------------------------------------------------- one row

@dataclasses.dataclass
class Row:
    impl: str
    shape: str
    batch: int
    standard_us: float
    staggered_us: float        # headline: rows at random ring counts
    amortised_us: float        # whole fold cycles in lockstep
    nonfold_us: float
    fold_us: float
    std_bytes: float
    rep_bytes: float
    copy_bw: float
    wrapper_us: float = 0.0    # the replay wrapper's XLA ops per step, in the replay times
    bench_us: float = 0.0      # the bench's own launches per step (slot set, counts), in neither

    @property
    def speedup(self):
        return self.standard_us / self.staggered_us

    @property
    def amortised_speedup(self):
        return self.standard_us / self.amortised_us

    def gbs(self, nbytes, us):
        return nbytes * self.batch / (us * 1e-6) / 1e9

    def line(self):
        s_gbs, r_gbs = (self.gbs(self.std_bytes, self.standard_us),
                        self.gbs(self.rep_bytes, self.staggered_us))
        cb = self.copy_bw / 1e9
        return (f"| {self.impl} | {self.shape} | {self.batch} | {self.standard_us:.1f} | "
                f"{self.staggered_us:.1f} | **{self.speedup:.2f}x** | {self.amortised_us:.1f} | "
                f"{self.amortised_speedup:.2f}x | {self.nonfold_us:.1f} / {self.fold_us:.1f} | "
                f"{self.std_bytes / 1e6:.2f} / {self.rep_bytes / 1e6:.2f} | "
                f"{s_gbs:.0f} ({100 * s_gbs / cb:.0f}%) | {r_gbs:.0f} ({100 * r_gbs / cb:.0f}%) |")


HEADER = ("| impl | shape | batch | standard us | replay us (staggered) | speedup "
          "| replay us (amortised) | amortised speedup | replay non-fold / fold us "
          "| min MB per row (std / replay) "
          "| standard GB/s (% copy) | replay staggered GB/s (% copy) |\n"
          + "|---" * 12 + "|")


def bench(fam: Family, shape, batch, *, L=16, ring="bfloat16", std_kw=None, rep_kw=None,
          seed=0, iterations=3, cycling=True, min_pool_bytes=MIN_POOL_BYTES, impl="pallas",
          state="float32"):
    """Times both kernels of a family's Pallas `impl` at one shape and batch (tiling overrides
    in std_kw / rep_kw): standard, replay staggered and (with `cycling`) replay amortised over
    whole fold cycles. Returns the Row fields other than impl, shape, batch and copy_bw (us,
    bytes per row)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.ring import advance_counts

    dims = fam.shapes[shape]
    state_dtype = jnp.dtype(state)
    n_sets, S, ids = pool_sets(fam, dims, batch, 1, min_pool_bytes, seed, state_dtype.itemsize)
    sets = jnp.asarray(ids[..., 0], jnp.int32)
    ring_dtype = jnp.dtype(ring)
    inputs, bufs = fam.setup(dims, batch, S, L, ring_dtype, jax.random.key(seed), state_dtype)
    # the tilings tiling=None runs at these dims and batch; overrides replace their fields
    std_base, rep_base = (fam.for_dims(t, dims, batch) for t in base_tilings(fam.ops(), impl))
    std_kw = dict(impl=impl, tiling=dataclasses.replace(std_base, **(std_kw or {})))
    rep_kw = dict(impl=impl, tiling=dataclasses.replace(rep_base, **(rep_kw or {})))
    n_steps = n_sets * L

    @jax.jit
    def run_standard(state):
        body = lambda i, st: fam.standard(st, inputs, sets[i % n_sets], **std_kw)  # noqa: E731
        return jax.lax.fori_loop(0, n_steps, body, state)

    @jax.jit
    def run_replay(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            bufs = fam.replay(bufs, counts, inputs, slots, **rep_kw)
            return bufs, advance_counts(counts, slots, L)
        return jax.lax.fori_loop(0, n_steps, body, (bufs, counts))

    @jax.jit
    def run_counts(counts):     # what a replay step launches besides the layer's own work
        body = lambda i, c: advance_counts(c, sets[i % n_sets], L)  # noqa: E731
        return jax.lax.fori_loop(0, n_steps, body, counts)

    def step_total(times, name=None):
        """Median us per step of every kernel (from the first `name` launch on, if given)."""
        runs = from_first(times, name) if name else times
        return float(np.median([sum(us for _, us in it) / n_steps for it in runs]))

    def per_launch(fn, *args, name):
        """(per iteration: the `name` launches' us [n_steps], us per step of the other
        kernels the loop launches)."""
        times = kernel_times(fn, *args, iterations=iterations)
        t = launches(times, name)
        if any(len(x) != n_steps for x in t):
            raise RuntimeError(f"expected {n_steps} {name} launches, got {[len(x) for x in t]}")
        return t, step_total(times, name) - float(np.median([x.mean() for x in t]))

    counts_us = step_total(kernel_times(run_counts, jnp.zeros((S,), jnp.int32),
                                        iterations=iterations))
    # What a loop launches besides its kernel and is the bench's own, not the layer's: the
    # count update (a model step's, shared by its layers) and the step's slot set (the engine's;
    # a custom call's operand, so its own launch, which the count-only loop fuses away and the
    # standard loop launches too: at batch 1 ~1.5 us, a third of a step, was charged to replay
    # alone until the ninth session).
    std, slots_us = per_launch(run_standard, bufs.checkpoint, name="standard")
    bench_us = counts_us + slots_us
    stag, stag_other = per_launch(run_replay, bufs,
                                  jnp.asarray(staggered_counts(S, L, seed + 1)), name="replay")
    wrapper = max(stag_other - bench_us, 0.0)       # clamp: timing noise around an empty wrapper
    out = dict(standard_us=float(np.median([t.mean() for t in std])),
               staggered_us=float(np.median([t.mean() for t in stag])) + wrapper,
               amortised_us=float("nan"), nonfold_us=float("nan"), fold_us=float("nan"),
               wrapper_us=wrapper, bench_us=bench_us)
    if cycling:
        cyc, cyc_other = per_launch(run_replay, bufs, jnp.zeros((S,), jnp.int32), name="replay")
        extra = max(cyc_other - bench_us, 0.0)
        nonfold, fold = split_cycle(np.median(np.stack(cyc), axis=0), n_sets, L)
        out.update(amortised_us=float(np.median([t.mean() for t in cyc])) + extra,
                   nonfold_us=nonfold + extra, fold_us=fold + extra)
    out["std_bytes"], out["rep_bytes"] = fam.min_bytes(dims, L, ring_dtype.itemsize,
                                                        state_dtype.itemsize)
    return out


def tune(fam, shapes, batch, L, ring, configs, progress, impls=IMPLS[:1], state="float32"):
    """Times a list of tilings (staggered replay, the headline) of each of `impls`; prints a
    table, returns the results. A tiling the compiler rejects is reported and skipped."""
    results = []
    print("| impl | shape | batch | tiling | standard us | replay us (staggered) |\n"
          + "|---" * 6 + "|")
    for impl, shape, cfg in ((i, s, c) for i in impls for s in shapes for c in configs):
        std_keys = {f.name for f in dataclasses.fields(base_tilings(fam.ops(), impl)[0])}
        std_cfg = {k: v for k, v in cfg.items() if k in std_keys}
        head = f"| {impl} | {shape} | {batch} | {json.dumps(cfg)} |"
        with progress.stage(f"{impl} {shape} batch {batch} {json.dumps(cfg)}"):
            try:
                r = bench(fam, shape, batch, L=L, ring=ring, std_kw=std_cfg, rep_kw=cfg,
                          iterations=1, cycling=False, impl=impl, state=state)
            except Exception as e:   # noqa: BLE001 -- a rejected tiling is a result
                print(f"{head} failed: {cli.one_line(e)[:100]} | |", flush=True)
                continue
        print(f"{head} {r['standard_us']:.1f} | {r['staggered_us']:.1f} |", flush=True)
        results.append(dict(impl=impl, shape=shape, batch=batch, config=cfg,
                            std_config=std_cfg, **r))
    return results


# ---------------------------------------------------------------------- command line

def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --family mamba2 --batches 1 32 256",
        f"{PROG} --family mamba2 --batches 256 --impls pallas pallas_mosaic_gpu",
        f"{PROG} --family mamba2 --batches 256 --tune '[{{}}, {{\"block_n\": 32}}]'"])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mamba2",
                    help="kernel family")
    ap.add_argument("--shapes", nargs="+", metavar="SHAPE",
                    help="layer shapes (mamba2: nemotron-h-8b, nemotron-nano-9b-v2; gdn: "
                         "qwen3-next); default: every shape of the family")
    ap.add_argument("--batches", nargs="+", type=cli.at_least(1), metavar="N",
                    help=f"rows per step (default: {' '.join(map(str, BATCHES))}; with --tune: "
                         f"{BATCHES[0]})")
    ap.add_argument("--window", type=cli.window, default=16, metavar="L",
                    help="ring window L")
    ap.add_argument("--ring-dtype", choices=["bfloat16", "float32"], default=None,
                    help="ring dtype (default: bfloat16 for mamba2, float32 for gdn)")
    ap.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="SSM state (checkpoint) dtype")
    ap.add_argument("--std-config", type=cli.json_of(dict, "a JSON object"), default={},
                    metavar="JSON",
                    help='standard kernel tiling, e.g. \'{"block_p": 32, "num_warps": 8}\'')
    ap.add_argument("--replay-config", type=cli.json_of(dict, "a JSON object"), default={},
                    metavar="JSON",
                    help="replay kernel tiling as JSON")
    ap.add_argument("--tune", type=cli.tilings, default=None, metavar="CONFIGS",
                    help="JSON list of tilings to time at one batch instead of the table")
    ap.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS[:1]),
                    help="Pallas implementations to time, side by side (default: pallas, the "
                         "Triton kernels; pallas_mosaic_gpu: Mosaic GPU)")
    ap.add_argument("--json", metavar="FILE", type=cli.nonempty,
                    help="also write the rows as JSON to FILE")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    check_shape_names(ap, args)
    if args.tune is not None:
        if args.std_config or args.replay_config:
            ap.error("argument --tune: times its own tilings; drop --std-config / "
                     "--replay-config (or put them into each --tune entry)")
        if args.batches and len(args.batches) > 1:
            ap.error(f"argument --batches: --tune times one batch, got {args.batches}")
    args.batches = args.batches or ([BATCHES[0]] if args.tune is not None else list(BATCHES))
    return args


def check_tiling(flag: str, overrides: dict, base):
    """UserError unless `overrides` name fields of the tiling dataclass instance `base`, with
    values of their types (integers > 0, or >= 0 for `validation.ZERO_FIELDS`)."""
    from pallas_kernels.validation import ZERO_FIELDS
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    if unknown := sorted(set(overrides) - set(fields)):
        raise cli.UserError(f"{flag}: unknown tiling field(s) {unknown} (fields of "
                            f"{type(base).__name__}: {', '.join(fields)})")
    for k, v in overrides.items():
        want = type(fields[k])
        low = 0 if k in ZERO_FIELDS else 1
        if want is int and (type(v) is not int or v < low):
            raise cli.UserError(f"{flag}: field {k!r} must be an integer >= {low}, got {v!r}")
        if want is not int and not isinstance(v, want):
            raise cli.UserError(f"{flag}: field {k!r} must be a {want.__name__}, got {v!r}")


def check_tilings(args):
    """UserError unless --std-config, --replay-config and every --tune entry name fields of their
    tilings (no GPU needed: the dry run of `scripts/gpu_session.sh` checks its sweeps with it)."""
    for impl in args.impls:
        bases = base_tilings(FAMILIES[args.family]().ops(), impl)
        check_tiling("--std-config", args.std_config, bases[0])
        check_tiling("--replay-config", args.replay_config, bases[1])
        for cfg in args.tune or ():
            check_tiling("--tune", cfg, bases[1])


def _run(args):
    import jax
    cli.output_path("--json", args.json)
    fam = FAMILIES[args.family]()
    check_tilings(args)
    cli.require_gpu()
    shapes = args.shapes or list(fam.shapes)
    ring = args.ring_dtype or fam.default_ring
    units = len(args.impls) * len(shapes) * (
        len(args.tune) if args.tune is not None else len(args.batches))
    progress = cli.Progress(units + 1, cli.interactive(args))
    with progress.stage("copy bandwidth"):
        bw = copy_bandwidth()
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"{fam.name}; L = {args.window}; {args.state_dtype} state, bf16 activations, {ring} "
          "ring", flush=True)
    if args.tune is not None:
        rows = tune(fam, shapes, args.batches[0], args.window, ring, args.tune, progress,
                    args.impls, args.state_dtype)
    else:
        print(HEADER, flush=True)
        rows = []
        for shape in shapes:
            for batch, impl in ((b, i) for b in args.batches for i in args.impls):
                t0 = time.time()
                try:
                    with progress.stage(f"{impl} {shape} batch {batch}"):
                        r = Row(impl=impl, shape=shape, batch=batch, copy_bw=bw, **bench(
                            fam, shape, batch, L=args.window, ring=ring,
                            std_kw=args.std_config, rep_kw=args.replay_config, impl=impl,
                            state=args.state_dtype))
                except ValueError as e:     # a kernel that does not take the shape or
                    # tiling: a row saying so, and the other shapes still run
                    print(f"| {impl} | {shape} | {batch} | not taken: {e} |" + " |" * 8,
                          flush=True)
                    rows.append(dict(impl=impl, shape=shape, batch=batch, family=fam.name,
                                     error=str(e)))
                    continue
                print(r.line() + f"  <!-- {time.time() - t0:.0f}s -->", flush=True)
                rows.append(dataclasses.asdict(r) | dict(
                    speedup=r.speedup, amortised_speedup=r.amortised_speedup, family=fam.name,
                    ring=ring, state=args.state_dtype))
    progress.close()
    if args.json:
        cli.write_json(args.json, rows)


def main(argv=None):
    args = parse_args(argv)
    return cli.run(PROG, args, _run)


if __name__ == "__main__":
    sys.exit(main())
