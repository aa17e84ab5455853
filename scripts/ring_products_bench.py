"""The GDN verify's key products alone (Qwen3-Next shapes: Hk 16, K 128, L 16, fp32 ring; batch
256 over a pool of 2 x 256 slots): one Pallas launch (`ring_products.window_products`) at
several warp counts against XLA's (`gdn.buffers.verify_key_products(by="xla")`), at T = 1 (the
decode's ring products only) and T = 2 / 4 / 8; device us per call (CUPTI, median of 5) and the
bytes it must read (ring keys, k, q) against the copy bandwidth. GPU only.

    python3 scripts/ring_products_bench.py [--warps 1 2] [--tokens 1 2 4 8]
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.gdn.buffers import ring_key_products, verify_key_products
from pallas_kernels.ring_products import window_products
from replayjax import commandline as cli
from replayjax.bench.timing import copy_bandwidth, kernel_times

B, HK, K, L = 256, 16, 128, 16


def _us(fn, *args):
    """Median over 5 iterations of the summed device us of every kernel fn launches."""
    return float(np.median([sum(us for _, us in it) for it in kernel_times(fn, *args,
                                                                             iterations=5)]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args(argv)
    try:
        cli.require_gpu()
    except cli.UserError as e:
        ap.exit(2, f"{ap.prog}: {e}\n")
    bw = copy_bandwidth()
    keys = jax.random.split(jax.random.key(0), 3)
    ring = jax.random.normal(keys[0], (2 * B + 1, HK, L, K), jnp.float32)
    slots = jax.random.permutation(keys[1], 2 * B)[:B].astype(jnp.int32) + 1
    print(f"device: {jax.devices()[0].device_kind}; copy {bw / 1e12:.2f} TB/s\n"
          "| T | by | us | % of copy on its bytes |\n|---|---|---|---|")
    for T in args.tokens:
        k, q = (jax.random.normal(kk, (B, T, HK, K), jnp.float32)
                for kk in jax.random.split(keys[2], 2))
        nbytes = (B * HK * L * K + 2 * B * T * HK * K) * 4 + B * HK * T * (2 * L + 2 * T) * 4
        if T == 1:      # the decode: ring products only
            runs = {"xla": jax.jit(functools.partial(ring_key_products, by="xla"))}
            runs |= {f"pallas {w} warps": jax.jit(lambda r, s, k, q, w=w: window_products(
                r, s, (k, q), num_warps=w)) for w in args.warps}
        else:
            runs = {"xla": jax.jit(functools.partial(verify_key_products, by="xla"))}
            runs |= {f"pallas {w} warps": jax.jit(lambda r, s, k, q, w=w: window_products(
                r, s, (k, q), ((k, k), (k, q)), num_warps=w)) for w in args.warps}
        for name, fn in runs.items():
            try:
                us = _us(fn, ring, slots, k, q)
            except Exception as e:   # noqa: BLE001 -- a launch the compiler rejects is a row
                print(f"| {T} | {name} | failed: {str(e).splitlines()[0][:80]} | |", flush=True)
                continue
            print(f"| {T} | {name} | {us:.1f} | {100 * nbytes / us / 1e-6 / bw:.0f}% |",
                  flush=True)


if __name__ == "__main__":
    main()
