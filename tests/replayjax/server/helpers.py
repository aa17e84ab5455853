"""A `replayjax serve` subprocess on a free 127.0.0.1 port (the demo model), and SSE parsing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
MODEL = "replayjax-demo"
# one engine shape for every test server (and `replayjax generate` runs): the persistent
# compilation cache then compiles each step once per test session
ENGINE_FLAGS = ("--num-slots", "32", "--max-len", "256", "--steps-per-visit", "4")
MAX_LEN = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(cache_dir) -> dict:
    """The environment of a test subprocess: CPU, a shared persistent compilation cache, XLA's
    default optimisation level (the server tests compare greedy text across batch placements:
    the tests' -O0 changes how rows at different batch positions round)."""
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "")
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                XLA_FLAGS=flags.strip())


class ServerProcess:
    """`replayjax serve` with ENGINE_FLAGS plus `flags`, its stderr in `log`."""

    def __init__(self, cache_dir, log, *flags):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "replayjax.cli", "serve", "--port", str(self.port),
                 "--log-level", "warning", *ENGINE_FLAGS, *flags],
                cwd=REPO, env=env(cache_dir), stdout=subprocess.DEVNULL, stderr=err)

    def wait_ready(self, timeout=600.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: "
                                   f"{self.stderr()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not start in {timeout} s: {self.stderr()[-2000:]}")

    def stderr(self) -> str:
        with open(self.log) as f:
            return f.read()

    def stop(self, timeout=60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()


def sse_events(lines) -> list:
    """The JSON objects of `data:` lines up to `data: [DONE]` (then "[DONE]" last)."""
    out = []
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
            if data == "[DONE]":
                break
    return out


def metric(text: str, name: str, labels: str = "") -> float:
    """A sample's value in Prometheus text, e.g. metric(t, "replayjax_requests_total",
    'finish_reason="length"'); 0 when absent."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0
