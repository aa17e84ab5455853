"""`replayjax launch`: a replayjax command as several processes on this host, one per GPU.

    replayjax launch --nproc 2 -- generate --model DIR --tp 2 --prompt-ids 1,2,3
    replayjax launch --nproc 2 --cpu -- generate --tp 2 --prompt "GNU "   # a CPU rehearsal

Starts N copies of `python -m replayjax.distributed COMMAND ...` with the protocol variables of
`replayjax.distributed` (a free coordinator port on 127.0.0.1, process ids 0..N-1, GPU i for
process i): `jax.devices()` in each lists all N devices, so `--tp N` spans them. Every process
runs the same host loop; process 0's standard output is the command's output (the others discard
theirs), every process's errors go to standard error. When one process fails the others are
stopped (they would wait for it in a collective); the exit status is the first failure's.
Several hosts: docs/multi_host.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from replayjax import commandline as cli
from replayjax.distributed import LOCAL_DEVICES

PROG = "replayjax launch"


def build_parser():
    ap = cli.parser(PROG, "Run a replayjax command as several processes on this host, one per "
                          "GPU, joined by\njax.distributed: process 0 prints the output; "
                          "several hosts: docs/multi_host.md.", [
                              f"{PROG} --nproc 2 -- generate --model DIR --tp 2 --prompt Hi",
                              f"{PROG} --nproc 2 --cpu -- generate --tp 2 --prompt GNU"])
    ap.add_argument("--nproc", type=cli.at_least(1), required=True, metavar="N",
                    help="processes, one per GPU")
    ap.add_argument("--coordinator", metavar="HOST:PORT", type=cli.nonempty,
                    help="the coordinator address (default: 127.0.0.1 and a free port)")
    ap.add_argument("--cpu", action="store_true",
                    help="run on CPUs (JAX_PLATFORMS=cpu, one CPU device per process, gloo "
                         "collectives): a rehearsal without GPUs")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then the replayjax command and its arguments")
    return ap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(base, *, coordinator: str, nproc: int, rank: int, cpu: bool) -> dict:
    """The environment of process `rank`: the protocol variables, one GPU (or the CPU)."""
    env = dict(base, REPLAYJAX_COORDINATOR=coordinator, REPLAYJAX_NUM_PROCESSES=str(nproc),
               REPLAYJAX_PROCESS_ID=str(rank))
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
        env.pop(LOCAL_DEVICES, None)
    else:
        env[LOCAL_DEVICES] = str(rank)
    return env


def run(procs, poll_s: float = 0.1) -> int:
    """Waits for every process; on the first failure stops the rest. Returns the exit status
    (the first failure's, else 0)."""
    status = 0
    live = list(procs)
    try:
        while live:
            for p in list(live):
                rc = p.poll()
                if rc is None:
                    continue
                live.remove(p)
                if rc and not status:
                    status = rc
                    for q in live:
                        q.terminate()
            time.sleep(poll_s)
    except KeyboardInterrupt:
        for q in live:
            q.terminate()
        status = 130
    for p in procs:
        p.wait()
    return status


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --, e.g. -- generate --tp 2 ...")
    if command[0] == "launch":
        ap.error("the command cannot be launch itself")
    from replayjax.cli import COMMANDS
    names = sorted({name.split()[0] for name in COMMANDS} - {"launch"})
    if command[0] not in names:          # refused once here, not by each of the N processes
        ap.error(f"unknown command {command[0]!r} (commands: {', '.join(names)})")
    coordinator = args.coordinator or f"127.0.0.1:{free_port()}"
    procs = []
    for rank in range(args.nproc):
        env = worker_env(os.environ, coordinator=coordinator, nproc=args.nproc, rank=rank,
                         cpu=args.cpu)
        procs.append(subprocess.Popen([sys.executable, "-m", "replayjax.distributed", *command],
                                      env=env))
    return run(procs)


if __name__ == "__main__":
    sys.exit(main())
