"""Kernel benchmark: standard vs ReplaySSM decode per layer-step, on one GPU.

    python -m replayjax.kernel_bench --family mamba2 [--batches 1 8 256] [--json out.json]

Method (see docs/benchmarks.md):
  * per-kernel device time from CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`), inside one
    compiled `fori_loop` of steps, so launch gaps and host work are excluded for both kernels alike;
  * the state pool of every timing unit is >= 512 MiB (>> the 60 MB L2): disjoint random slot sets
    are used in turn, so a slot's state comes back to the kernel only after 512 MiB of other states;
  * replay is amortised over whole fold cycles: every set goes through ring positions 0..L-1, i.e.
    L - 1 non-fold steps and 1 fold step ("cycling"); a "staggered" variant starts every slot at a
    random count so each step mixes fold and non-fold rows;
  * minimum bytes: standard = state read + write + token inputs/outputs; replay = state read +
    state write / L + the (L - 1) / 2 ring entries held on average + ring append + token I/O;
  * copy bandwidth measured in the same process (x + 1 over 2 GiB, bytes read + written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import numpy as np

BATCHES = (1, 8, 32, 64, 128, 256, 512)
MIN_POOL_BYTES = 512 * 2**20

MAMBA2_SHAPES = {
    "nemotron-h-8b": dict(H=128, P=64, N=128, G=8),
    "nemotron-nano-9b-v2": dict(H=128, P=80, N=128, G=8),
}


def _device_times(fn, *args, name, iterations=3):
    """Per-launch device times (us) of kernels whose name contains `name`, per iteration."""
    from jax.experimental.mosaic.gpu import profiler
    _, timings = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    if iterations == 1:
        timings = [timings]
    return [np.array([ms * 1e3 for k, ms in it if name in k]) for it in timings]


def copy_bandwidth(nbytes=2 * 2**30):
    """Bytes read + written per second by a large elementwise pass (the practical HBM ceiling)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import profiler
    x = jnp.ones((nbytes // 4,), jnp.float32)
    _, timings = profiler.measure(jax.jit(lambda a: a + 1.0), iterations=5)(x)
    return 2 * nbytes / (float(np.median(timings)) * 1e-3)


@dataclasses.dataclass
class Row:
    shape: str
    batch: int
    standard_us: float
    replay_us: float
    nonfold_us: float
    fold_us: float
    staggered_us: float
    std_bytes: float
    rep_bytes: float
    copy_bw: float

    @property
    def speedup(self):
        return self.standard_us / self.replay_us

    def gbs(self, nbytes, us):
        return nbytes * self.batch / (us * 1e-6) / 1e9

    def line(self):
        s_gbs, r_gbs = self.gbs(self.std_bytes, self.standard_us), self.gbs(self.rep_bytes, self.replay_us)
        cb = self.copy_bw / 1e9
        return (f"| {self.shape} | {self.batch} | {self.standard_us:.1f} | {self.replay_us:.1f} | "
                f"{self.nonfold_us:.1f} / {self.fold_us:.1f} | {self.staggered_us:.1f} | "
                f"**{self.speedup:.2f}x** | {self.std_bytes / 1e6:.2f} / {self.rep_bytes / 1e6:.2f} | "
                f"{s_gbs:.0f} ({100 * s_gbs / cb:.0f}%) | {r_gbs:.0f} ({100 * r_gbs / cb:.0f}%) |")


HEADER = ("| shape | batch | standard us | replay us (amortised) | replay non-fold / fold us | "
          "replay staggered us | speedup | min MB per row (std / replay) | standard GB/s (% copy) | "
          "replay GB/s (% copy) |\n|---|---|---|---|---|---|---|---|---|---|")


def mamba2_bytes(H, P, N, G, L, state_bytes=4, act=2, ring=2):
    state = H * P * N * state_bytes
    token_io = H * P * act * 2 + 2 * G * N * act + H * 4          # x, y, B, C, dt
    entry = H * P * ring + G * N * ring + H * 4                    # one ring entry (x, B, dt)
    std = 2 * state + token_io
    rep = state + state / L + entry * (L - 1) / 2 + entry + token_io
    return std, rep


def bench_mamba2(shape_name, batch, *, L=16, std_kw=None, rep_kw=None, seed=0, iterations=3,
                 staggered=True):
    """Times both kernels at one shape and batch; tiling overrides in std_kw / rep_kw."""
    import jax
    import jax.numpy as jnp
    from pallas_kernels import mamba2

    dims = MAMBA2_SHAPES[shape_name]
    H, P, N, G = dims["H"], dims["P"], dims["N"], dims["G"]
    per_seq = H * P * N * 4
    n_sets = max(2, math.ceil(MIN_POOL_BYTES / (batch * per_seq)))
    S = n_sets * batch + 1
    rng = np.random.default_rng(seed)
    sets = jnp.asarray(rng.permutation(np.arange(1, S)).reshape(n_sets, batch), jnp.int32)
    key = jax.random.key(seed)
    k = jax.random.split(key, 8)
    x = jax.random.normal(k[0], (batch, H, P), jnp.bfloat16)
    B = (jax.random.normal(k[1], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16)
    C = (jax.random.normal(k[2], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16)
    dt = jax.random.uniform(k[3], (batch, H), jnp.float32, 0.005, 0.1)
    A = -jnp.exp(jax.random.uniform(k[4], (H,), jnp.float32, -1, 1))
    D = jax.random.normal(k[5], (H,), jnp.float32)
    bufs = mamba2.init_replay_buffers(S, H, P, N, G, window=L)
    bufs = bufs._replace(checkpoint=jax.random.normal(k[6], bufs.checkpoint.shape, jnp.float32))
    std_kw = dict(impl="pallas", **(std_kw or {}))
    rep_kw = dict(impl="pallas", **(rep_kw or {}))
    n_steps = n_sets * L

    @jax.jit
    def run_standard(state):
        def body(i, state):
            _, state = mamba2.standard_decode(state, x, B, C, dt, A, D, sets[i % n_sets], **std_kw)
            return state
        return jax.lax.fori_loop(0, n_steps, body, state)

    @jax.jit
    def run_replay(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            _, bufs = mamba2.replay_decode(bufs, counts, x, B, C, dt, A, D, slots, **rep_kw)
            return bufs, mamba2.advance_counts(counts, slots, L)
        return jax.lax.fori_loop(0, n_steps, body, (bufs, counts))

    std_t = _device_times(run_standard, bufs.checkpoint, name="standard", iterations=iterations)
    counts0 = jnp.zeros((S,), jnp.int32)
    rep_t = _device_times(run_replay, bufs, counts0, name="replay", iterations=iterations)
    stag_t = rep_t
    if staggered:
        stag = jnp.asarray(rng.integers(0, L, S), jnp.int32)
        stag_t = _device_times(run_replay, bufs, stag, name="replay", iterations=iterations)
    for t in std_t + rep_t + stag_t:
        assert len(t) == n_steps, f"expected {n_steps} kernel launches, got {len(t)}"
    # Cycling: step i runs at count (i // n_sets) % L; the last block of n_sets steps folds.
    per_count = np.median(np.stack(rep_t), axis=0).reshape(L, n_sets)
    std_b, rep_b = mamba2_bytes(H, P, N, G, L)
    return dict(
        standard_us=float(np.median([t.mean() for t in std_t])),
        replay_us=float(np.median([t.mean() for t in rep_t])),
        nonfold_us=float(per_count[:-1].mean()), fold_us=float(per_count[-1].mean()),
        staggered_us=float(np.median([t.mean() for t in stag_t])),
        std_bytes=std_b, rep_bytes=rep_b)


def _config(text):
    bp, bn, warps, stages = (int(v) for v in text.split(","))
    return dict(block_p=bp, block_n=bn, num_warps=warps, num_stages=stages)


def tune(shapes, batch, L):
    """Prints standard and replay times for a grid of tilings (cycling, amortised)."""
    print("| shape | batch | block_p | block_n | warps | fold | standard us | replay us "
          "(non-fold / fold) |\n|---|---|---|---|---|---|---|---|")
    configs = ((32, 64, 4), (64, 32, 2), (64, 64, 2), (64, 64, 4), (64, 128, 4))
    for shape in shapes:
        P = MAMBA2_SHAPES[shape]["P"]
        for bp, bn, warps in configs:
            if P % bp:
                continue
            for fold in ("dot",):
                    cfg = dict(block_p=bp, block_n=bn, num_warps=warps)
                    head = f"| {shape} | {batch} | {bp} | {bn} | {warps} | {fold} |"
                    try:
                        r = bench_mamba2(shape, batch, L=L, std_kw=cfg, rep_kw=cfg | {"fold": fold},
                                         iterations=1, staggered=False)
                        print(f"{head} {r['standard_us']:.1f} | {r['replay_us']:.1f} "
                              f"({r['nonfold_us']:.0f} / {r['fold_us']:.0f}) |", flush=True)
                    except Exception as e:  # a tiling the compiler rejects: report, go on
                        print(f"{head} failed: {type(e).__name__}: {str(e)[:100]} | |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="replayjax bench kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["mamba2"], default="mamba2")
    ap.add_argument("--shapes", nargs="+", default=list(MAMBA2_SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--std-config", type=_config, default={},
                    help="standard kernel tiling as BLOCK_P,BLOCK_N,NUM_WARPS,NUM_STAGES")
    ap.add_argument("--replay-config", type=_config, default={},
                    help="replay kernel tiling as BLOCK_P,BLOCK_N,NUM_WARPS,NUM_STAGES")
    ap.add_argument("--tune", action="store_true",
                    help="time tilings at the first batch instead of the table")
    ap.add_argument("--json", help="write the rows as JSON to this file")
    args = ap.parse_args(argv)

    import jax
    if jax.default_backend() != "gpu":
        sys.exit("replayjax bench kernels: needs a CUDA GPU (jax.default_backend() is "
                 f"{jax.default_backend()!r})")
    bw = copy_bandwidth()
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"L = {args.window}; fp32 state, bf16 activations and ring", flush=True)
    if args.tune:
        return tune(args.shapes, args.batches[0], args.window)
    print(HEADER, flush=True)
    rows = []
    for shape in args.shapes:
        for batch in args.batches:
            t0 = time.time()
            r = Row(shape=shape, batch=batch, copy_bw=bw, **bench_mamba2(
                shape, batch, L=args.window, std_kw=args.std_config, rep_kw=args.replay_config))
            rows.append(r)
            print(r.line() + f"  <!-- {time.time() - t0:.0f}s -->", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"speedup": r.speedup} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
