"""Timing helpers shared by the benchmarks: per-kernel device times from CUPTI, the copy
bandwidth and the bf16 peak that "% of copy", "% of peak" and ideal times are measured against,
percentiles."""

from __future__ import annotations

import time

import numpy as np

GPU_COPY_BYTES = 2 * 2**30      # >> the H200's 60 MB L2
CPU_COPY_BYTES = 256 * 2**20
# bf16 dense tensor-core peak (TFLOP/s) by device name (NVIDIA H100/H200 SXM datasheets).
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0}


def kernel_times(fn, *args, iterations: int = 3) -> list[list[tuple[str, float]]]:
    """Device time of every kernel `fn(*args)` launches, from CUPTI
    (`jax.experimental.mosaic.gpu.profiler.measure`, GPU only): one list per iteration of
    (kernel name, us) in launch order."""
    from jax.experimental.mosaic.gpu import profiler
    _, timings = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    if iterations == 1:
        timings = [timings]
    return [[(name, ms * 1e3) for name, ms in it] for it in timings]


def launches(times, name: str) -> list[np.ndarray]:
    """Per iteration of `kernel_times`: the us of each launch of kernels whose name contains
    `name`, in order."""
    return [np.array([us for k, us in it if name in k]) for it in times]


def from_first(times, name: str) -> list[list[tuple[str, float]]]:
    """Per iteration, the kernels from the first launch whose name contains `name` on (what came
    before is set-up, e.g. copies of non-donated inputs)."""
    out = []
    for it in times:
        start = next((i for i, (k, _) in enumerate(it) if name in k), None)
        if start is None:
            raise RuntimeError(f"no kernel named like {name!r} among {sorted({k for k, _ in it})}")
        out.append(it[start:])
    return out


def per_kernel(iteration, n_steps: int, top: int = 8) -> list[tuple[str, float]]:
    """The `top` kernel names of one iteration by total us per step (a breakdown)."""
    by = {}
    for k, us in iteration:
        by[k] = by.get(k, 0.0) + us / n_steps
    return sorted(by.items(), key=lambda kv: -kv[1])[:top]


def copy_bandwidth(nbytes: int | None = None) -> float:
    """Bytes read + written per second by a large elementwise pass (`x + 1`, fp32): the practical
    memory-bandwidth ceiling. On a GPU from CUPTI device times (median of 5, 2 GiB by default);
    elsewhere from wall-clock times of the same jitted pass (median of 5 after a warm-up, 256 MiB
    by default), so the whole roofline path also runs on a CPU."""
    import jax
    import jax.numpy as jnp
    gpu = jax.default_backend() == "gpu"
    nbytes = nbytes or (GPU_COPY_BYTES if gpu else CPU_COPY_BYTES)
    x = jnp.ones((nbytes // 4,), jnp.float32)
    if gpu:
        step = jax.jit(lambda a: a + 1.0)
        secs = [sum(us for _, us in it) * 1e-6 for it in kernel_times(step, x, iterations=5)]
    else:   # in place (donated): a fresh output each time would time the page faults
        step = jax.jit(lambda a: a + 1.0, donate_argnums=0)
        x = step(x).block_until_ready()
        secs = []
        for _ in range(5):
            t0 = time.perf_counter()
            x = step(x).block_until_ready()
            secs.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(secs))


def peak_tflops(device_kind: str) -> float | None:
    """The bf16 dense peak TFLOP/s of a device by its name (`jax.Device.device_kind`); None when
    unknown (a CPU, another GPU: give --peak-tflops)."""
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device_kind), None)


def add_sweep_arguments(ap, shapes, batches, what: str, tiling: str, example: str) -> None:
    """--shapes (of `shapes`, default all; `what` they name), --batches, --tune (overrides of
    the default `tiling`, e.g. `example`) and --json: a one-kernel benchmark's sweep."""
    from replayjax import commandline as cli
    ap.add_argument("--shapes", nargs="+", choices=sorted(shapes), default=list(shapes),
                    metavar="MODEL", help=f"{what}: {', '.join(shapes)}")
    ap.add_argument("--batches", nargs="+", type=cli.at_least(1), default=list(batches),
                    metavar="N", help="rows per call")
    ap.add_argument("--tune", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help=f"kernel tilings to time, as overrides of the default {tiling}, "
                         f"e.g. '{example}'")
    ap.add_argument("--json", metavar="FILE", type=cli.nonempty,
                    help="also write the rows as JSON to FILE")


def run_sweep(args, cases, run, *, stage, note: str, header: str):
    """The one-kernel benchmarks' loop (`bench attention`, `bench conv`): the copy bandwidth,
    a device line ending in `note`, the table `header`, then per case (a tuple) of `cases` the
    row `run(*case)` (a progress stage named `stage(*case)`), its `line(copy_bw)` printed as it
    comes. Returns (rows, copy bandwidth in bytes/s)."""
    import jax

    from replayjax import commandline as cli
    with cli.Progress(1 + len(cases), cli.interactive(args)) as progress:
        with progress.stage("copy bandwidth"):
            bw = copy_bandwidth()
        print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bw / 1e12:.2f} TB/s; "
              f"{note}", flush=True)
        print(header, flush=True)
        rows = []
        for case in cases:
            with progress.stage(stage(*case)):
                rows.append(run(*case))
            print(rows[-1].line(bw), flush=True)
    return rows, bw


def add_peak_argument(ap) -> None:
    """--peak-tflops: the bf16 dense peak per device that FLOP bounds are taken at
    (`peak_flops`)."""
    from replayjax import commandline as cli
    ap.add_argument("--peak-tflops", type=cli.number(0, lo_open=True), metavar="TF",
                    help="bf16 dense peak TFLOP/s per device for the FLOP bound (default: from "
                         "the device name, H100/H200: 989; none on other devices: the bytes "
                         "alone)")


def peak_flops(tflops: float | None = None) -> float | None:
    """FLOP/s the FLOP bound of a roofline is taken at: `tflops` (a --peak-tflops) if given,
    else the first device's `peak_tflops`; None when neither is known."""
    if tflops:
        return tflops * 1e12
    import jax
    known = peak_tflops(jax.devices()[0].device_kind)
    return known * 1e12 if known else None


def percentile(values, q: float) -> float:
    """The q-th percentile of `values`; NaN when there are none."""
    return float(np.percentile(values, q)) if len(values) else float("nan")
