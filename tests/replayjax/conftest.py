"""A `replayjax serve` of the demo model shared by the server and bench tests (started on first
use, stopped at the end of the session)."""

import pytest

from tests.replayjax.server.helpers import ServerProcess


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    """A persistent compilation cache shared by the test subprocesses (each step compiles once)."""
    return tmp_path_factory.mktemp("jax-cache")


@pytest.fixture(scope="session")
def demo_server(jax_cache, tmp_path_factory):
    server = ServerProcess(jax_cache, tmp_path_factory.mktemp("serve") / "stderr.log",
                           "--max-logprobs", "5")
    try:
        yield server.wait_ready()
    finally:
        server.stop()
