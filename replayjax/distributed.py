"""Several processes, one mesh: `jax.distributed` set up from environment variables, so any
`replayjax` command runs as one process per GPU (`replayjax launch`, or by hand on each host).

Protocol (every process of the run sets all of them; docs/multi_host.md):

    REPLAYJAX_COORDINATOR        host:port of process 0's coordinator service (the same for all)
    REPLAYJAX_NUM_PROCESSES      processes in the run
    REPLAYJAX_PROCESS_ID         this process, 0 .. n-1
    REPLAYJAX_LOCAL_DEVICE_IDS   optional, comma-separated: the local GPUs this process drives
                                 (one per process: its index on the host)

    python -m replayjax.distributed COMMAND [ARGS...]   # = replayjax COMMAND ARGS, distributed

`jax.devices()` then lists the devices of every process, a `--tp` mesh spans them, and every
process runs the same deterministic host loop over its share of each step (the collectives are
XLA's: NCCL on GPUs, gloo on CPUs). Only process 0's output is printed (native libraries'
messages go to standard error).
"""

from __future__ import annotations

import os
import sys

ENV = ("REPLAYJAX_COORDINATOR", "REPLAYJAX_NUM_PROCESSES", "REPLAYJAX_PROCESS_ID")
LOCAL_DEVICES = "REPLAYJAX_LOCAL_DEVICE_IDS"


class LaunchError(ValueError):
    """A missing or malformed protocol variable (one line)."""


def settings(env=os.environ) -> dict:
    """jax.distributed.initialize's arguments from the protocol variables (LaunchError if one
    is missing or malformed)."""
    if missing := [k for k in ENV if not env.get(k)]:
        raise LaunchError(f"environment variable {missing[0]} is not set (a distributed run "
                          f"needs {', '.join(ENV)})")
    try:
        n, pid = int(env["REPLAYJAX_NUM_PROCESSES"]), int(env["REPLAYJAX_PROCESS_ID"])
        local = ([int(d) for d in env[LOCAL_DEVICES].split(",")] if env.get(LOCAL_DEVICES)
                 else None)
    except ValueError:
        raise LaunchError(f"REPLAYJAX_NUM_PROCESSES, REPLAYJAX_PROCESS_ID and {LOCAL_DEVICES} "
                          f"must be integers") from None
    if not 0 <= pid < n:
        raise LaunchError(f"REPLAYJAX_PROCESS_ID = {pid} must be in [0, {n - 1}]")
    return dict(coordinator_address=env["REPLAYJAX_COORDINATOR"], num_processes=n,
                process_id=pid, local_device_ids=local)


def initialize(env=os.environ) -> int:
    """Joins the run described by the protocol variables (before any JAX computation); returns
    this process's id. On a CPU-only run the collectives go through gloo."""
    import jax
    kw = settings(env)
    if env.get("JAX_PLATFORMS", "").strip() == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kw)
    return kw["process_id"]


def main(argv=None) -> int:
    """`replayjax COMMAND ...` as one process of a distributed run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        pid = initialize()
    except LaunchError as e:
        print(f"replayjax: error: {e}", file=sys.stderr)
        return 2
    # the command's output is process 0's Python prints; what native libraries write to the
    # standard output (gloo, NCCL) goes to standard error, so --json output stays parseable
    out = os.fdopen(os.dup(1), "w") if pid == 0 else open(os.devnull, "w")
    os.dup2(2, 1)
    sys.stdout = out
    from replayjax.cli import main as cli_main
    try:
        return cli_main(argv)
    finally:
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
