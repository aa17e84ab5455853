"""Prefill attention over the slot pool: the dense path (`attention.reference`, scores over every
pool position) against the blocked one (`attention.prefill_attention`) at model shapes, with
their agreement. Prints one markdown row per case (ms per call, median of --reps after a
warm-up; the device's peak memory is not reset between cases, so the dense path goes last).

    PYTHONPATH=. python scripts/prefill_attention_bench.py            # a GPU, or small on a CPU
    PYTHONPATH=. python scripts/prefill_attention_bench.py --blocks 256,256 512,512 1024,512
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import attention

# name -> (rows, new tokens T, cached positions before them, query heads, KV heads, head dim)
CASES = {
    "nemotron-h-8b 8 x 2048": (8, 2048, 0, 32, 8, 128),
    "nemotron-h-8b 1 x 16384": (1, 16384, 0, 32, 8, 128),
    "qwen3.5-9b 8 x 2048": (8, 2048, 0, 16, 4, 256),
    "qwen3.5-9b 64 x 256 after 1792": (64, 256, 1792, 16, 4, 256),
    "cpu 4 x 512": (4, 512, 0, 8, 2, 64),
}
MAX_LEN_SLACK = 128


def _time(fn, args, reps):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=None, choices=sorted(CASES))
    ap.add_argument("--blocks", nargs="+", default=["512,512"], metavar="Q,K")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-dense", action="store_true", help="skip the dense path")
    args = ap.parse_args(argv)
    gpu = jax.default_backend() == "gpu"
    cases = args.cases or [c for c in CASES if c.startswith("cpu") != gpu]
    print(f"{jax.devices()[0].device_kind}\n| case | blocks (q, k) | blocked ms | dense ms | "
          f"dense / blocked | max rel. dev. |\n|---|---|---|---|---|---|")
    for name in cases:
        b, T, start, nh, kv, hd = CASES[name]
        max_len = start + T + MAX_LEN_SLACK
        keys = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(keys[0], (b, T, nh, hd), jnp.bfloat16)
        pool = [jax.random.normal(k, (b + 1, max_len, kv, hd), jnp.bfloat16) for k in keys[1:]]
        slots = jnp.arange(1, b + 1, dtype=jnp.int32)
        starts = jnp.full((b,), start, jnp.int32)
        inputs = (q, *pool, slots, starts)
        dense_ms, want = float("nan"), None
        if not args.no_dense:
            dense = jax.jit(lambda *a: attention.reference.attention(*a))
            try:
                want = np.asarray(dense(*inputs), np.float32)
                dense_ms = _time(dense, inputs, args.reps)
            except Exception as e:  # noqa: BLE001 -- its scores past memory: a result
                print(f"| {name} | dense | failed: {str(e).splitlines()[0][:80]} |", flush=True)
        for blocks in args.blocks:
            bq, bk = map(int, blocks.split(","))
            fn = jax.jit(lambda *a, bq=bq, bk=bk: attention.prefill_attention(
                *a, block_q=bq, block_k=bk))
            ms = _time(fn, inputs, args.reps)
            err = "-" if want is None else np.abs(np.asarray(fn(*inputs), np.float32) - want)
            dev = "-" if want is None else f"{err.max() / np.abs(want).max():.1e}"
            print(f"| {name} | {bq}, {bk} | {ms:.2f} | {dense_ms:.2f} | {dense_ms / ms:.2f}x | "
                  f"{dev} |", flush=True)


if __name__ == "__main__":
    main()
