"""The `replayjax` command line."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Decode hybrid SSM/attention models (Nemotron-H, Qwen3-Next, Qwen3.5) in JAX with ReplaySSM.

Available now:
  bench kernels   standard vs ReplaySSM decode kernels on a GPU (per layer-step, amortised)

Planned (not in this release): generate, convert, bench (end-to-end A/B), profile.
"""


def main(argv=None):
    ap = argparse.ArgumentParser(prog="replayjax", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="what", metavar="WHAT")
    bench_sub.add_parser("kernels", help="kernel benchmark (GPU); see --help", add_help=False)
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench" and args.what == "kernels":
        from replayjax import kernel_bench
        return kernel_bench.main(rest)
    if args.command == "bench":
        bench.print_help()
        return 2
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    ap.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
