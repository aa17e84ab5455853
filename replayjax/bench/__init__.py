"""Benchmarks and the profiler. The engine never imports this package.

Commands (each module has `main(argv)` and runs as `python -m replayjax.bench.<name>`):
`e2e` (`replayjax bench`), `kernels` (`replayjax bench kernels`), `verify`
(`replayjax bench verify`), `moe` (`replayjax bench moe`), `attention` (`replayjax bench
attention`), `conv` (`replayjax bench conv`), `prefill` (`replayjax bench prefill`),
`profile` (`replayjax profile`); their argument types, help, error handling and progress come
from `replayjax.commandline`.

Shared helpers, imported by the commands and never the other way round: `timing` (CUPTI device
times, copy bandwidth, bf16 peak by device, percentiles), `synthetic` (model presets with real
dimensions and random weights), `workload` (requests: traces, synthetic workloads, arrival
schedules), `roofline` (minimum bytes and FLOPs of a decode step, the ideal time they take) and
`trace` (profiler traces: per-kernel times classified by the HLO they come from).
"""
