"""Kernel benchmark: standard vs ReplaySSM decode per layer-step, on one GPU.

    python -m replayjax.kernel_bench --family mamba2|gdn [--batches 1 8 256] [--json out.json]

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

from pallas_kernels.ring import advance_counts

BATCHES = (1, 8, 32, 64, 128, 256, 512)
MIN_POOL_BYTES = 512 * 2**20



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


@dataclasses.dataclass(frozen=True)
class Family:
    """What the driver needs to time one kernel family at one shape."""
    name: str
    shapes: dict
    state_bytes: callable      # dims -> bytes of one sequence's fp32 state
    token_io: callable         # dims -> bytes of one token's kernel inputs + outputs (bf16 acts)
    entry_bytes: callable      # (dims, ring itemsize) -> bytes of one ring entry
    setup: callable            # (dims, batch, S, L, ring_dtype, key) -> (inputs, buffers)
    standard: callable         # (state, inputs, slots, **kw) -> state
    replay: callable           # (buffers, counts, inputs, slots, **kw) -> buffers
    standard_tiling: object    # the measured tilings, which the overrides replace fields of
    replay_tiling: object

    def min_bytes(self, d, L, ring):
        """(standard, replay) minimum bytes per row-step: the state read + written vs the state
        read, written once per L steps, the (L - 1) / 2 ring entries held on average read and one
        appended; token inputs/outputs for both."""
        st, io, entry = self.state_bytes(d), self.token_io(d), self.entry_bytes(d, ring)
        return 2 * st + io, st + st / L + entry * (L - 1) / 2 + entry + io


def _mamba2_family():
    import jax
    import jax.numpy as jnp
    from pallas_kernels import mamba2

    def setup(d, batch, S, L, ring_dtype, key):
        H, P, N, G = d["H"], d["P"], d["N"], d["G"]
        k = jax.random.split(key, 8)
        inputs = (jax.random.normal(k[0], (batch, H, P), jnp.bfloat16),
                  (jax.random.normal(k[1], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16),
                  (jax.random.normal(k[2], (batch, G, N)) * N ** -0.5).astype(jnp.bfloat16),
                  jax.random.uniform(k[3], (batch, H), jnp.float32, 0.005, 0.1),
                  -jnp.exp(jax.random.uniform(k[4], (H,), jnp.float32, -1, 1)),
                  jax.random.normal(k[5], (H,), jnp.float32))
        bufs = mamba2.init_replay_buffers(S, H, P, N, G, window=L, ring_dtype=ring_dtype)
        ck = jax.random.normal(k[6], bufs.checkpoint.shape, jnp.float32)
        return inputs, bufs._replace(checkpoint=ck)

    return Family(
        name="mamba2",
        shapes={"nemotron-h-8b": dict(H=128, P=64, N=128, G=8),
                "nemotron-nano-9b-v2": dict(H=128, P=80, N=128, G=8)},
        state_bytes=lambda d: d["H"] * d["P"] * d["N"] * 4,
        # x, y, B, C (bf16), dt (fp32); a ring entry holds x, B (ring dtype) and dt (fp32)
        token_io=lambda d: d["H"] * d["P"] * 2 * 2 + 2 * d["G"] * d["N"] * 2 + d["H"] * 4,
        entry_bytes=lambda d, ring: d["H"] * d["P"] * ring + d["G"] * d["N"] * ring + d["H"] * 4,
        setup=setup,
        standard=lambda st, inp, slots, **kw: mamba2.standard_decode(st, *inp, slots, **kw)[1],
        replay=lambda b, c, inp, slots, **kw: mamba2.replay_decode(b, c, *inp, slots, **kw)[1],
        standard_tiling=mamba2.STANDARD_TILING, replay_tiling=mamba2.REPLAY_TILING)


def _gdn_family():
    import jax
    import jax.numpy as jnp
    from pallas_kernels import gdn

    def setup(d, batch, S, L, ring_dtype, key):
        Hk, Hv, K, V = d["Hk"], d["Hv"], d["K"], d["V"]
        k = jax.random.split(key, 8)
        q, kk = gdn.prepare_qk(jax.random.normal(k[0], (batch, Hk, K)),
                               jax.random.normal(k[1], (batch, Hk, K)))
        g, beta = gdn.gates(jax.random.normal(k[2], (batch, Hv)),
                            jax.random.normal(k[3], (batch, Hv)),
                            jax.random.uniform(k[4], (Hv,), jnp.float32, 0, 2.7), jnp.zeros((Hv,)))
        inputs = (q.astype(jnp.bfloat16), kk.astype(jnp.bfloat16),
                  jax.random.normal(k[5], (batch, Hv, V), jnp.bfloat16), g, beta)
        bufs = gdn.init_gdn_buffers(S, Hk, Hv, K, V, window=L, ring_dtype=ring_dtype)
        ck = jax.random.normal(k[6], bufs.checkpoint.shape, jnp.float32) * 0.1
        return inputs, bufs._replace(checkpoint=ck)

    return Family(
        name="gdn",
        shapes={"qwen3-next": dict(Hk=16, Hv=32, K=128, V=128)},
        state_bytes=lambda d: d["Hv"] * d["V"] * d["K"] * 4,
        # q, k, v, o (bf16), g, beta (fp32); a ring entry holds k, d (ring dtype) and g (fp32)
        token_io=lambda d: 2 * d["Hk"] * d["K"] * 2 + 2 * d["Hv"] * d["V"] * 2 + d["Hv"] * 8,
        entry_bytes=lambda d, ring: d["Hk"] * d["K"] * ring + d["Hv"] * d["V"] * ring + d["Hv"] * 4,
        setup=setup,
        standard=lambda st, inp, slots, **kw: gdn.standard_decode(st, *inp, slots, **kw)[1],
        replay=lambda b, c, inp, slots, **kw: gdn.replay_decode(b, c, *inp, slots, **kw)[1],
        standard_tiling=gdn.STANDARD_TILING, replay_tiling=gdn.REPLAY_TILING)


FAMILIES = {"mamba2": _mamba2_family, "gdn": _gdn_family}


def bench(fam: Family, shape_name, batch, *, L=16, ring="bfloat16", std_kw=None, rep_kw=None,
          seed=0, iterations=3, staggered=True, min_pool_bytes=MIN_POOL_BYTES):
    """Times both kernels of a family at one shape and batch; tiling overrides in std_kw /
    rep_kw. Returns the Row fields (times in us, bytes per row-step)."""
    import jax
    import jax.numpy as jnp

    dims = fam.shapes[shape_name]
    n_sets = max(2, math.ceil(min_pool_bytes / (batch * fam.state_bytes(dims))))
    S = n_sets * batch + 1
    rng = np.random.default_rng(seed)
    sets = jnp.asarray(rng.permutation(np.arange(1, S)).reshape(n_sets, batch), jnp.int32)
    ring_dtype = jnp.dtype(ring)
    inputs, bufs = fam.setup(dims, batch, S, L, ring_dtype, jax.random.key(seed))
    std_kw = dict(impl="pallas", tiling=dataclasses.replace(fam.standard_tiling, **(std_kw or {})))
    rep_kw = dict(impl="pallas", tiling=dataclasses.replace(fam.replay_tiling, **(rep_kw or {})))
    n_steps = n_sets * L

    @jax.jit
    def run_standard(state):
        body = lambda i, st: fam.standard(st, inputs, sets[i % n_sets], **std_kw)
        return jax.lax.fori_loop(0, n_steps, body, state)

    @jax.jit
    def run_replay(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            bufs = fam.replay(bufs, counts, inputs, slots, **rep_kw)
            return bufs, advance_counts(counts, slots, L)
        return jax.lax.fori_loop(0, n_steps, body, (bufs, counts))

    std_t = _device_times(run_standard, bufs.checkpoint, name="standard", iterations=iterations)
    rep_t = _device_times(run_replay, bufs, jnp.zeros((S,), jnp.int32), name="replay",
                          iterations=iterations)
    stag_t = rep_t
    if staggered:
        stag = jnp.asarray(rng.integers(0, L, S), jnp.int32)
        stag_t = _device_times(run_replay, bufs, stag, name="replay", iterations=iterations)
    for t in std_t + rep_t + stag_t:
        assert len(t) == n_steps, f"expected {n_steps} kernel launches, got {len(t)}"
    # Cycling: step i runs at count (i // n_sets) % L; the last block of n_sets steps folds.
    per_count = np.median(np.stack(rep_t), axis=0).reshape(L, n_sets)
    std_b, rep_b = fam.min_bytes(dims, L, ring_dtype.itemsize)
    return dict(
        standard_us=float(np.median([t.mean() for t in std_t])),
        replay_us=float(np.median([t.mean() for t in rep_t])),
        nonfold_us=float(per_count[:-1].mean()), fold_us=float(per_count[-1].mean()),
        staggered_us=float(np.median([t.mean() for t in stag_t])),
        std_bytes=std_b, rep_bytes=rep_b)


def tune(fam, shapes, batch, L, ring, configs):
    """Times a list of tilings (cycling, amortised); prints a table, returns the results."""
    results = []
    print("| shape | batch | tiling | standard us | replay us (non-fold / fold) |\n|---|---|---|---|---|")
    for shape in shapes:
        for cfg in configs:
            std_cfg = {k: v for k, v in cfg.items()
                       if k in {f.name for f in dataclasses.fields(fam.standard_tiling)}}
            head = f"| {shape} | {batch} | {cfg} |"
            try:
                r = bench(fam, shape, batch, L=L, ring=ring, std_kw=std_cfg, rep_kw=cfg,
                          iterations=1, staggered=False)
                print(f"{head} {r['standard_us']:.1f} | {r['replay_us']:.1f} "
                      f"({r['nonfold_us']:.0f} / {r['fold_us']:.0f}) |", flush=True)
                results.append(dict(shape=shape, batch=batch, config=cfg, std_config=std_cfg, **r))
            except Exception as e:  # a tiling the compiler rejects: report, go on
                print(f"{head} failed: {type(e).__name__}: {str(e)[:100]} | |", flush=True)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="replayjax bench kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mamba2")
    ap.add_argument("--shapes", nargs="+", help="default: every shape of the family")
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--ring-dtype", choices=["bfloat16", "float32"], default=None,
                    help="ring dtype (default: bfloat16 for mamba2, float32 for gdn)")
    ap.add_argument("--std-config", type=json.loads, default={},
                    help='standard kernel tiling as JSON, e.g. \'{"block_p": 32, "num_warps": 8}\'')
    ap.add_argument("--replay-config", type=json.loads, default={},
                    help="replay kernel tiling as JSON")
    ap.add_argument("--tune", type=json.loads, default=None, metavar="CONFIGS",
                    help="JSON list of tilings to time at the first batch instead of the table")
    ap.add_argument("--json", help="write the rows as JSON to this file")
    args = ap.parse_args(argv)

    import jax
    if jax.default_backend() != "gpu":
        sys.exit("replayjax bench kernels: needs a CUDA GPU (jax.default_backend() is "
                 f"{jax.default_backend()!r})")
    fam = FAMILIES[args.family]()
    shapes = args.shapes or list(fam.shapes)
    ring = args.ring_dtype or ("float32" if fam.name == "gdn" else "bfloat16")
    bw = copy_bandwidth()
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"{fam.name}; L = {args.window}; fp32 state, bf16 activations, {ring} ring", flush=True)
    if args.tune is not None:
        results = tune(fam, shapes, args.batches[0], args.window, ring, args.tune)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    print(HEADER, flush=True)
    rows = []
    for shape in shapes:
        for batch in args.batches:
            t0 = time.time()
            r = Row(shape=shape, batch=batch, copy_bw=bw, **bench(
                fam, shape, batch, L=args.window, ring=ring, std_kw=args.std_config,
                rep_kw=args.replay_config))
            rows.append(r)
            print(r.line() + f"  <!-- {time.time() - t0:.0f}s -->", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"speedup": r.speedup, "family": fam.name,
                                                "ring": ring} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
