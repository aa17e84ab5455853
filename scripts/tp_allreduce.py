"""What one block's all-reduce costs at TP = N, and which collective implementation is cheapest.

    python3 scripts/tp_allreduce.py --tp 2 --batches 1 64 256      # on a 2-GPU machine

A TP decode step ends every mixer and every FFN with one all-reduce of the residual stream
[b, D] bf16 (52 a step on Nemotron-H-8B): latency-bound collectives on the critical path. Each
setting below runs in its own process (XLA flags and NCCL variables are read once at start):

* default: XLA's NCCL all-reduce (NCCL_NVLS_ENABLE=0: never NVLink multicast);
* one-shot: `--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true`, XLA's own kernel
  (each device reads its peers' buffers over NVLink and reduces: one launch, no NCCL protocol);
* NCCL_PROTO=LL128 and NCCL_PROTO=LL: NCCL's low-latency protocols.

Each times `--count` dependent all-reduces (x <- psum(x / 2 + 1) / N, so none is combined or
hoisted) in one jitted loop under shard_map: wall-clock us per all-reduce (median of 5 runs after
a warm-up), the bus bandwidth that is (2 (N-1)/N bytes per all-reduce), and the sum checked
against its exact value. A setting that fails prints its error's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SETTINGS = {
    "default": ({}, []),
    "one-shot": ({}, ["--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true"]),
    "NCCL_PROTO=LL128": ({"NCCL_PROTO": "LL128"}, []),
    "NCCL_PROTO=LL": ({"NCCL_PROTO": "LL"}, []),
}


def measure(tp: int, batches, hidden: int, count: int) -> list[dict]:
    """Rows {batch, us, bus_gbs, exact} for this process's settings."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from models.sharding import make_mesh

    jax.config.update("jax_num_cpu_devices", tp)    # a CPU smoke run (GPUs are unaffected)
    mesh = make_mesh(tp)

    def loop(x):
        def body(i, x):
            # x = 2 is the fixed point (exact in bf16), unknown to XLA: nothing is hoisted, and
            # an all-reduce that does not sum over the tp devices gives 2 / tp
            return lax.psum(x * 0.5 + 1, "tp") / tp
        return lax.fori_loop(0, count, body, x)

    run = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P(), out_specs=P(),
                                check_vma=False))
    rows = []
    for b in batches:
        x = jax.device_put(jnp.full((b, hidden), 2.0, jnp.bfloat16), NamedSharding(mesh, P()))
        got = np.asarray(run(x), np.float32)                    # compile + warm-up
        ref = np.full((b, hidden), 2.0, np.float32)
        took = []
        for _ in range(5):
            t0 = time.perf_counter()
            run(x).block_until_ready()
            took.append(time.perf_counter() - t0)
        us = float(np.median(took)) / count * 1e6
        nbytes = b * hidden * 2
        rows.append(dict(batch=b, us=us, bus_gbs=2 * (tp - 1) / tp * nbytes / us / 1e3,
                         exact=bool(np.array_equal(got, ref))))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--hidden", type=int, default=4096, help="D of the residual stream")
    ap.add_argument("--count", type=int, default=520, help="all-reduces per timed loop")
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--only", help=argparse.SUPPRESS)          # a child: one setting
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    if args.only:
        print(json.dumps(measure(args.tp, args.batches, args.hidden, args.count)))
        return 0
    rows = []
    for name in args.settings:
        env_add, flags = SETTINGS[name]
        env = dict(os.environ, **env_add)
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *flags]).strip()
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # for `models`
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        child = ["--tp", str(args.tp), "--batches", *map(str, args.batches), "--hidden",
                 str(args.hidden), "--count", str(args.count), "--only", name]
        proc = subprocess.run([sys.executable, __file__, *child], capture_output=True, text=True,
                              env=env)
        if proc.returncode == 0:
            rows += [dict(r, setting=name) for r in json.loads(proc.stdout.splitlines()[-1])]
        else:
            lines = (proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()
            rows.append(dict(setting=name, error=lines[-1][:160]))
    if args.json:
        print(json.dumps(dict(tp=args.tp, hidden=args.hidden, rows=rows)))
        return 0
    print(f"tp = {args.tp}, all-reduce of [batch, {args.hidden}] bf16, {args.count} per loop\n")
    print("| setting | batch | us per all-reduce | bus GB/s | exact |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['setting']} | failed: {r['error']} | | | |")
        else:
            print(f"| {r['setting']} | {r['batch']} | {r['us']:.1f} | {r['bus_gbs']:.0f} | "
                  f"{r['exact']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
