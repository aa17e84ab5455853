"""Runs one SSM decode kernel in a loop with no timer of its own, for Nsight Compute.

    PYTHONPATH=. ncu --launch-skip 40 --launch-count 4 --section SpeedOfLight ... \\
        python3 scripts/ncu_kernels.py --family gdn --impl pallas_mosaic_gpu --kernel replay

(from the repository root; PYTHONPATH=. unless the package is installed, as in
`scripts/gpu_session.sh ncu`)

`replayjax bench kernels` times with CUPTI, which Nsight Compute cannot share a process with;
this runs the same kernels on the same inputs (`replayjax.bench.families`: real shapes, random
inputs, a pool of >= 512 MiB of state, staggered ring counts) for --steps steps of one jitted
loop. The loop's launches are the kernel and, for the replay kernel, the ring counts' update;
`--kernel verify` runs ReplaySSM verify of --tokens window tokens as `replayjax bench verify`
does (its XLA ring products and ring writes, the commit of a random 1..T accepted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from replayjax.bench.families import FAMILIES, MIN_POOL_BYTES, SHAPES, pool_sets

DEFAULT_SHAPE = {"mamba2": "nemotron-h-8b", "gdn": "qwen3-next"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), required=True)
    ap.add_argument("--shape", help="a shape of the family (default: its 8B / Qwen3-Next one)")
    ap.add_argument("--impl", default="pallas", choices=["pallas", "pallas_mosaic_gpu"])
    ap.add_argument("--kernel", default="replay", choices=["standard", "replay", "verify"])
    ap.add_argument("--tokens", type=int, default=4, help="verify window T (--kernel verify)")
    ap.add_argument("--tiling", type=json.loads, default={}, metavar="JSON",
                    help='fields of the kernel\'s measured tiling to change, e.g. '
                         '\'{"block_k": 32, "num_stages": 3}\'')
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--ring-dtype", choices=["bfloat16", "float32"],
                    help="ring dtype (default: the family's, as `bench kernels`)")
    args = ap.parse_args(argv)
    shape = args.shape or DEFAULT_SHAPE[args.family]
    if shape not in SHAPES[args.family]:
        ap.error(f"--shape: {shape!r} is not a {args.family} shape "
                 f"({', '.join(SHAPES[args.family])})")

    import jax
    import jax.numpy as jnp

    from pallas_kernels.ring import advance_counts, commit_counts
    from replayjax.bench.kernels import staggered_counts
    from replayjax.bench.verify import verify_tiling, window_inputs

    fam = FAMILIES[args.family]()
    dims, L = fam.shapes[shape], args.window
    n_sets, S, ids = pool_sets(fam, dims, args.batch, 1, MIN_POOL_BYTES, 0)
    sets = jnp.asarray(ids[..., 0], jnp.int32)
    ring = jnp.dtype(args.ring_dtype or fam.default_ring)
    inputs, bufs = fam.setup(dims, args.batch, S, L, ring, jax.random.key(0))
    T = args.tokens
    ops = fam.ops()
    prefix = "MOSAIC_" if args.impl == "pallas_mosaic_gpu" else ""
    measured = (verify_tiling(ops, args.impl, T) if args.kernel == "verify"
                else getattr(ops, f"{prefix}{args.kernel.upper()}_TILING"))
    tiling = dataclasses.replace(measured, **args.tiling) if args.tiling else None  # as measured
    window = window_inputs(inputs, fam.token_inputs, T)

    @jax.jit
    def run(bufs, counts):
        def body(i, carry):
            bufs, counts = carry
            slots = sets[i % n_sets]
            if args.kernel == "standard":
                return bufs._replace(checkpoint=fam.standard(
                    bufs.checkpoint, inputs, slots, impl=args.impl, tiling=tiling)), counts
            if args.kernel == "verify":
                _, bufs = ops.replay_verify(bufs, counts, *window, slots, impl=args.impl,
                                            tiling=tiling)
                n_acc = jax.random.randint(jax.random.key(i), (args.batch,), 1, T + 1)
                return bufs, commit_counts(counts, slots, n_acc, T, L)
            bufs = fam.replay(bufs, counts, inputs, slots, impl=args.impl, tiling=tiling)
            return bufs, advance_counts(counts, slots, L)
        return jax.lax.fori_loop(0, args.steps, body, (bufs, counts))

    jax.block_until_ready(run(bufs, jnp.asarray(staggered_counts(S, L, 1))))
    print(f"{args.family} {shape} {args.impl} {args.kernel}: {args.steps} steps of batch "
          f"{args.batch} ran", flush=True)


if __name__ == "__main__":
    main()
