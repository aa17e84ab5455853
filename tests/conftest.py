"""Test set-up: CPU (4 devices) + Pallas interpret mode unless REPLAYJAX_TEST_BACKEND=gpu.

On a CUDA machine, `REPLAYJAX_TEST_BACKEND=gpu python -m pytest -m gpu` runs the kernel tests
compiled (Triton) against the same references; on CPU those tests run in interpret mode and the
`gpu`-marked ones are skipped.
"""

import os
import tempfile

if os.environ.get("REPLAYJAX_TEST_BACKEND", "cpu") == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
    # Tests compile many small programs and run them briefly: LLVM at -O0 compiles ~30% faster
    # (XLA:CPU uses no fast-math at either level; last-bit rounding may differ from -O2, inside
    # every tolerance). Child processes inherit it, except the server tests' (helpers.env).
    if os.environ.get("REPLAYJAX_TEST_FAST_COMPILE", "1") == "1":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_backend_optimization_level=0").strip()

import jax
import pytest

# 4 CPU devices for the tensor-parallel tests (tests/models/test_tp.py); everything else runs on
# the first one as before. Set before the backend starts (no effect on a GPU backend).
jax.config.update("jax_num_cpu_devices", 4)
ON_GPU = jax.default_backend() == "gpu"

# Many tests compile the same programs (a fixture model's steps at the same shapes): a persistent
# compilation cache shared by the test processes (pytest-xdist workers) compiles each once per
# machine. Keys include the jax version, flags and the program, so a stale entry cannot be hit.
jax.config.update("jax_compilation_cache_dir", os.environ.get(
    "REPLAYJAX_TEST_JAX_CACHE", os.path.join(tempfile.gettempdir(), "replayjax-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _devices_needed(item) -> int:
    """A test's `devices(n)` mark, else its `tp` parameter, else 1."""
    mark = item.get_closest_marker("devices")
    if mark is not None:
        return mark.args[0]
    tp = getattr(item, "callspec", None) and item.callspec.params.get("tp")
    return tp if isinstance(tp, int) else 1


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (REPLAYJAX_TEST_BACKEND=gpu)")
    visible = jax.device_count()       # 4 on CPU; a one-GPU machine skips the tp > 1 tests
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        if (need := _devices_needed(item)) > visible:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} devices, {visible} visible"))


@pytest.fixture(scope="session")
def interpret():
    """Pallas runs compiled on GPU, in interpret mode on CPU."""
    return not ON_GPU
