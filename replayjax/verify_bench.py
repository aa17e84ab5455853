"""Speculative verify benchmark: ReplaySSM verify + commit vs the state-per-draft baseline.

    python -m replayjax.verify_bench --family mamba2|gdn [--tokens 2 4 8] [--batches 1 8 256]
        [--tune '[{"num_warps": 4}, {"block_p": 32}]'] [--breakdown] [--json FILE]

Per layer-step device time (CUPTI) of everything one verify step launches: for ReplaySSM the
verify kernel, the ring writes of the window and the count commit; for the baseline the kernel
that runs T standard steps and writes one full state per window token (rollback = continue from
the state of the last accepted token, a slot remap that costs nothing). Acceptance is random,
uniform in 1..T per row and step, so rows fold at their own pace (amortised over many steps).
Pools over 512 MiB as in `replayjax.kernel_bench`. Memory per sequence: ReplaySSM keeps one state
plus the ring; the baseline one state per window token plus the committed one.

Minimum bytes per row-step: baseline = state read + T states written + T tokens' inputs/outputs;
ReplaySSM = state read + state written on fold steps only + the committed ring entries read + T
entries written + T tokens' inputs/outputs, with the fold rate and mean committed count taken from
the commit rule under the same acceptance law (`fold_statistics`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

import numpy as np

from pallas_kernels.ring import commit_counts
from replayjax.kernel_bench import FAMILIES, MIN_POOL_BYTES, copy_bandwidth

BATCHES = (1, 8, 32, 64, 128, 256, 512)
BREAKDOWN = False


def fold_statistics(T, L, steps=100_000, seed=0):
    """(fraction of verify steps that fold, mean committed ring count before a step) when every
    step accepts n ~ U{1..T}, under the commit rule of `pallas_kernels.ring.commit_counts`."""
    n_acc = np.random.default_rng(seed).integers(1, T + 1, steps)
    c, folds, held = 0, 0, 0
    for n in n_acc:
        held += c
        fold = c + T >= L
        folds += fold
        c = n - 1 if fold else c + n
    return folds / steps, held / steps


def min_bytes(fam, dims, T, L, ring_itemsize):
    """(ReplaySSM, baseline) minimum bytes per row and verify step (see the module docstring)."""
    st, io, entry = fam.state_bytes(dims), fam.token_io(dims), fam.entry_bytes(dims, ring_itemsize)
    fold_rate, held = fold_statistics(T, L)
    return st + fold_rate * st + held * entry + T * entry + T * io, st + T * st + T * io


def _step_us(fn, args, first_kernel, n_steps, iterations=3):
    """Mean device time per loop step of every kernel from the first launch of `first_kernel`
    on (the copies of the non-donated inputs come before it)."""
    from jax.experimental.mosaic.gpu import profiler
    _, timings = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    timings = [timings] if iterations == 1 else timings
    per = []
    for it in timings:
        start = next(i for i, (k, _) in enumerate(it) if first_kernel in k)
        per.append(sum(ms for _, ms in it[start:]) * 1e3 / n_steps)
    if BREAKDOWN:                                   # --breakdown: us per step by kernel name
        by = {}
        for k, ms in timings[-1][start:]:
            by[k[:60]] = by.get(k[:60], 0.0) + ms * 1e3 / n_steps
        for k, us in sorted(by.items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {first_kernel}: {us:9.1f} us  {k}", flush=True)
    return float(np.median(per))


def _window(inputs, n_token_inputs, T):
    """Per-token inputs [b, ...] -> window inputs [b, T, ...] (the same token T times)."""
    import jax.numpy as jnp
    return tuple(jnp.repeat(t[:, None], T, axis=1) if i < n_token_inputs else t
                 for i, t in enumerate(inputs))


def bench_verify(fam, shape, batch, T, *, L=16, ring, seed=0, iterations=3,
                 min_pool_bytes=MIN_POOL_BYTES, steps_per_set=16, replay_kw=None):
    """One row: ReplaySSM verify + commit vs the state-per-draft baseline at (shape, batch, T).
    replay_kw: overrides of the family's `VERIFY_TILING` fields (block_p / block_n / block_v /
    block_k / block_k_long, num_warps, fold), default none (the tuned tiling)."""
    import jax
    import jax.numpy as jnp
    from pallas_kernels import gdn, mamba2

    ops = mamba2 if fam.name == "mamba2" else gdn
    n_tok = 4 if fam.name == "mamba2" else 5
    dims = fam.shapes[shape]
    per_seq = fam.state_bytes(dims)
    n_sets = max(2, math.ceil(min_pool_bytes / (batch * per_seq)))
    S = n_sets * batch * (1 + T) + 1                       # committed + T draft slots per row
    rng = np.random.default_rng(seed)
    perm = rng.permutation(np.arange(1, S)).reshape(n_sets, batch, 1 + T)
    sets, drafts = jnp.asarray(perm[..., 0], jnp.int32), jnp.asarray(perm[..., 1:], jnp.int32)
    inputs, bufs = fam.setup(dims, batch, S, L, jnp.dtype(ring), jax.random.key(seed))
    win = _window(inputs, n_tok, T)
    n_steps = n_sets * steps_per_set
    key = jax.random.key(seed + 1)
    tiling = dataclasses.replace(ops.VERIFY_TILING, **(replay_kw or {}))

    @jax.jit
    def run_replay(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            _, bufs = ops.replay_verify(bufs, counts, *win, slots, impl="pallas", tiling=tiling)
            n_acc = jax.random.randint(jax.random.fold_in(key, i), (batch,), 1, T + 1)
            return bufs, commit_counts(counts, slots, n_acc, T, L)
        return jax.lax.fori_loop(0, n_steps, body, (bufs, counts))

    @jax.jit
    def run_baseline(state):
        def body(i, state):
            k = i % n_sets
            _, state = ops.standard_verify(state, *win, sets[k], drafts[k], impl="pallas")
            return state
        return jax.lax.fori_loop(0, n_steps, body, state)

    rep = _step_us(run_replay, (bufs, jnp.zeros((S,), jnp.int32)), "replay_verify", n_steps,
                   iterations)
    base = _step_us(run_baseline, (bufs.checkpoint,), "standard_verify", n_steps, iterations)
    ring_bytes = sum(a.nbytes for a in bufs[1:]) / S
    rep_b, base_b = min_bytes(fam, dims, T, L, jnp.dtype(ring).itemsize)
    return dict(family=fam.name, shape=shape, batch=batch, T=T, replay_us=rep, baseline_us=base,
                speedup=base / rep, replay_mem_per_seq=per_seq + ring_bytes,
                baseline_mem_per_seq=per_seq * (1 + T), replay_bytes_per_row=rep_b,
                baseline_bytes_per_row=base_b, replay_gbs=rep_b * batch / rep / 1e3,
                baseline_gbs=base_b * batch / base / 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m replayjax.verify_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mamba2")
    ap.add_argument("--shapes", nargs="+")
    ap.add_argument("--tokens", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--ring-dtype", choices=["bfloat16", "float32"], default=None)
    ap.add_argument("--breakdown", action="store_true", help="print us per step by kernel")
    ap.add_argument("--tune", type=json.loads, default=[{}], metavar="CONFIGS",
                    help='JSON list of replay_verify tilings to time, e.g. '
                         '\'[{"block_p": 32, "num_warps": 4}, {"num_warps": 8}]\' (default: [{}], '
                         'the tuned one)')
    ap.add_argument("--json", help="write the rows as JSON to this file")
    args = ap.parse_args(argv)

    import jax
    if jax.default_backend() != "gpu":
        sys.exit("verify_bench: needs a CUDA GPU")
    global BREAKDOWN
    BREAKDOWN = args.breakdown
    fam = FAMILIES[args.family]()
    ring = args.ring_dtype or ("float32" if fam.name == "gdn" else "bfloat16")
    bw = copy_bandwidth() / 1e9
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e3:.2f} "
          f"TB/s; {fam.name}; L = {args.window}; {ring} ring; acceptance uniform in 1..T")
    print("| shape | batch | T | ReplaySSM verify+commit us | state-per-draft us | speedup | "
          "min MB per row-step (replay / baseline) | replay GB/s (% copy) | baseline GB/s (% copy) "
          "| MB per sequence (replay / baseline) |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in args.shapes or list(fam.shapes):
        for T in args.tokens:
            for batch in args.batches:
                for kw in args.tune:
                    r = bench_verify(fam, shape, batch, T, L=args.window, ring=ring, replay_kw=kw)
                    r.update(copy_gbs=bw, replay_kw=kw)
                    rows.append(r)
                    label = shape + (f" {json.dumps(kw)}" if kw else "")
                    print(f"| {label} | {batch} | {T} | {r['replay_us']:.1f} | "
                          f"{r['baseline_us']:.1f} | **{r['speedup']:.2f}x** | "
                          f"{r['replay_bytes_per_row'] / 1e6:.2f} / "
                          f"{r['baseline_bytes_per_row'] / 1e6:.2f} | {r['replay_gbs']:.0f} "
                          f"({100 * r['replay_gbs'] / bw:.0f}%) | {r['baseline_gbs']:.0f} "
                          f"({100 * r['baseline_gbs'] / bw:.0f}%) | "
                          f"{r['replay_mem_per_seq'] / 1e6:.2f} / "
                          f"{r['baseline_mem_per_seq'] / 1e6:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
