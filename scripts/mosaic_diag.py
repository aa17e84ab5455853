"""The Mosaic GPU kernels, case by case, each in its own process, against the XLA implementation.

    python3 scripts/mosaic_diag.py                              # the whole matrix, on the GPU
    python3 scripts/mosaic_diag.py --shapes real --blocks 32 --stages 2 --json diag.json
    python3 scripts/mosaic_diag.py --interpret --shapes unit    # the Mosaic GPU interpreter

Cases: family (mamba2, gdn) x kernel (standard_decode; replay_decode, whose row 0 sits at
count L - 1 so the step folds; replay_verify, T = 4) x shape ("unit": the unit tests' Mosaic
dims, batch 3; "real": Nemotron-H-8B / Qwen3-Next at batch 256) x tiling (--blocks bound the
state chunk, block_n / block_k; --stages are num_stages; a block above the state dim is
skipped). Each case runs in a fresh subprocess (a CUDA error is sticky for its process, and a
crash takes no other case with it) on fresh random inputs: bf16 activations, fp32 state, the
family's ring dtype, one padding row. It prints one markdown row per case: OK and the worst
relative error over the outputs and the updated pools (||mosaic - xla|| / ||xla||, each array;
ring entries past the new counts are garbage and not compared), MISMATCH past --tol, NOT
FINITE, or the error's last line (never a traceback), and the case's seconds (compile
included). --json writes the rows after every case (a run cut short keeps its rows).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time

FAMILIES = ("mamba2", "gdn")
KERNELS = ("standard_decode", "replay_decode", "replay_verify")
# Per family: dims, batch and window L of each shape. "unit": the tests' MOSAIC_DIMS.
SHAPES = {
    "unit": {"mamba2": dict(batch=3, L=8, H=2, G=1, P=64, N=64),
             "gdn": dict(batch=3, L=8, Hk=1, Hv=2, K=64, V=64)},
    "real": {"mamba2": dict(batch=256, L=16, H=128, G=8, P=64, N=128),
             "gdn": dict(batch=256, L=16, Hk=16, Hv=32, K=128, V=128)},
}
T = 4                            # verify window
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 0
HEADER = "| family | kernel | shape | tiling | result | seconds |\n|---|---|---|---|---|---|"


def _inputs(family, kernel, dims, rng):
    """(op args before `slots`, slots) of one case: random pools and token inputs."""
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels import gdn, mamba2
    from pallas_kernels.ring import NULL_SLOT

    bf16, f32 = jnp.bfloat16, jnp.float32
    b, L = dims["batch"], dims["L"]
    S = b + 1
    lead = (b, T) if kernel == "replay_verify" else (b,)

    def rand(shape, dtype, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * scale, dtype)

    # Row r on slot r + 1, the last row padding; row 0 at count L - 1 (folds), row 1 at 0.
    slots = np.arange(1, b + 1, dtype=np.int32)
    slots[-1] = NULL_SLOT
    counts = rng.integers(0, L, S).astype(np.int32)
    counts[NULL_SLOT], counts[1] = 0, L - 1
    if b > 2:
        counts[2] = 0
    if family == "mamba2":
        H, G, P, N = (dims[k] for k in "HGPN")
        bufs = mamba2.init_replay_buffers(S, H, P, N, G, window=L)
        bufs = bufs._replace(checkpoint=rand(bufs.checkpoint.shape, f32, 0.5),
                             ring_x=rand(bufs.ring_x.shape, bf16),
                             ring_b=rand(bufs.ring_b.shape, bf16, N ** -0.5),
                             ring_dt=jnp.asarray(rng.uniform(0.005, 0.15, (S, H, L)), f32))
        token = (rand((*lead, H, P), bf16), rand((*lead, G, N), bf16, N ** -0.5),
                 rand((*lead, G, N), bf16, N ** -0.5),
                 jnp.asarray(rng.uniform(0.005, 0.15, (*lead, H)), f32))
        consts = (jnp.asarray(-np.exp(rng.uniform(-1, 1, H)), f32), rand((H,), f32))
        args = (*token, *consts)
    else:
        Hk, Hv, K, V = (dims[k] for k in ("Hk", "Hv", "K", "V"))
        bufs = gdn.init_gdn_buffers(S, Hk, Hv, K, V, window=L)
        bufs = bufs._replace(checkpoint=rand(bufs.checkpoint.shape, f32, 0.3),
                             ring_k=gdn.prepare_qk(rand(bufs.ring_k.shape, f32),
                                                   rand(bufs.ring_k.shape, f32))[1],
                             ring_d=rand(bufs.ring_d.shape, f32, 0.3),
                             ring_g=jnp.asarray(-rng.uniform(0.005, 0.5, (S, Hv, L)), f32))
        q, k = gdn.prepare_qk(rand((*lead, Hk, K), f32), rand((*lead, Hk, K), f32))
        args = (q.astype(bf16), k.astype(bf16), rand((*lead, Hv, V), bf16),
                jnp.asarray(-rng.uniform(0.005, 0.5, (*lead, Hv)), f32),
                jnp.asarray(rng.uniform(0.1, 0.9, (*lead, Hv)), f32))
    pool = bufs.checkpoint if kernel == "standard_decode" else (bufs, jnp.asarray(counts))
    pool = (pool,) if kernel == "standard_decode" else pool
    return (*pool, *args), jnp.asarray(slots)


def _committed(bufs, counts):
    """The buffers with ring entries at or past `counts` [S] zeroed: those are garbage by the
    ring contract (a decode fold writes the token at the old count, or not)."""
    import jax.numpy as jnp

    keep = jnp.arange(bufs.window) < counts[:, None]                   # [S, L]

    def ring(a):                                                       # [S, heads, L, ...]
        m = keep[:, None].reshape(keep.shape[0], 1, -1, *(1,) * (a.ndim - 3))
        return jnp.where(m, a, jnp.zeros((), a.dtype))
    return type(bufs)(bufs[0], *map(ring, bufs[1:]))


def _rel_errs(got, want):
    """Relative Frobenius error of every array in the pytrees `got` against `want` (on the
    device: the real pools are a GiB); NaN where `got` is not finite."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def rel(a, b):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        err = jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30)
        return jnp.where(jnp.isfinite(a).all(), err, jnp.nan)
    return [float(rel(a, b)) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                                              strict=True)]


def run_case(case: dict) -> dict:
    """One case in this process: {"rel_err": worst relative error}."""
    import jax
    import numpy as np

    from pallas_kernels import gdn, mamba2

    ops = mamba2 if case["family"] == "mamba2" else gdn
    tiling_type = ops.Mamba2MosaicTiling if case["family"] == "mamba2" else ops.GDNMosaicTiling
    tiling = tiling_type(case["block"], num_stages=case["stages"])
    args, slots = _inputs(case["family"], case["kernel"],
                          SHAPES[case["shape"]][case["family"]], np.random.default_rng(SEED))
    fn = getattr(ops, case["kernel"])
    want = jax.block_until_ready(fn(*args, slots, impl="xla"))
    got = jax.block_until_ready(fn(*args, slots, impl="pallas_mosaic_gpu", tiling=tiling,
                                   interpret=case["interpret"]))
    if case["kernel"] == "replay_decode":
        counts = ops.advance_counts(args[1], slots, args[0].window)
        want, got = ((out, _committed(bufs, counts)) for out, bufs in (want, got))
    errs = _rel_errs(got, want)
    return {"rel_err": float("nan") if any(e != e for e in errs) else max(errs)}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run_isolated(case: dict, timeout: float, tol: float) -> dict:
    """`case` in a subprocess; the row: the case with "result" and "seconds"."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": REPO + (os.pathsep + path if path else "")}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**case, "result": f"TIMEOUT after {timeout:.0f} s", "seconds": timeout}
    seconds = round(time.perf_counter() - t0, 1)
    if p.returncode < 0:
        result = (f"CRASH ({signal.Signals(-p.returncode).name}): "
                  f"{_last_line(p.stderr) or 'no message'}")
    elif p.returncode != 0:
        result = f"ERROR: {_last_line(p.stderr) or f'exit {p.returncode}'}"
    else:
        err = json.loads(_last_line(p.stdout))["rel_err"]
        result = ("NOT FINITE (NaN / Inf in an output)" if err != err else
                  f"OK {err:.1e}" if err <= tol else f"MISMATCH {err:.1e}")
    return {**case, "result": result, "seconds": seconds}


def cases(args) -> list[dict]:
    out = []
    for family, kernel, shape, block, stages in itertools.product(
            args.families, args.kernels, args.shapes, args.blocks, args.stages):
        dims = SHAPES[shape][family]
        if block > dims["N" if family == "mamba2" else "K"]:
            continue
        out.append(dict(family=family, kernel=kernel, shape=shape, block=block, stages=stages,
                        interpret=args.interpret))
    return out


def row(r: dict) -> str:
    return (f"| {r['family']} | {r['kernel']} | {r['shape']} | block {r['block']}, "
            f"stages {r['stages']} | {r['result']} | {r['seconds']} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--blocks", nargs="+", type=int, default=[32, 64, 128])
    ap.add_argument("--stages", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--interpret", action="store_true",
                    help="run the Mosaic GPU interpreter (CPU) instead of compiling")
    ap.add_argument("--tol", type=float, default=2e-2,
                    help="largest relative error that is OK (bf16 outputs: ~4e-3)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per case")
    ap.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    ap.add_argument("--case", help=argparse.SUPPRESS)   # the child: run one case
    args = ap.parse_args(argv)
    if args.case:
        try:
            print(json.dumps(run_case(json.loads(args.case))))
        except Exception as e:  # noqa: BLE001 -- the row's message: the error itself, one line
            # (a traceback's last line would be JAX's note on filtered frames)
            first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
            print(f"{type(e).__name__}: {first}"[:300], file=sys.stderr)
            sys.exit(1)
        return
    print(HEADER, flush=True)
    rows = []
    for case in cases(args):
        rows.append(run_isolated(case, args.timeout, args.tol))
        print(row(rows[-1]), flush=True)
        if args.json:                 # after every case: a run cut short keeps its rows
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
