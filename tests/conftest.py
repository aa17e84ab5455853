"""Test set-up: CPU (4 devices) + Pallas interpret mode unless REPLAYJAX_TEST_BACKEND=gpu.

On a CUDA machine, `REPLAYJAX_TEST_BACKEND=gpu python -m pytest -m gpu` runs the kernel tests
compiled (Triton) against the same references; on CPU those tests run in interpret mode and the
`gpu`-marked ones are skipped.
"""

import os

if os.environ.get("REPLAYJAX_TEST_BACKEND", "cpu") == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import pytest

# 4 CPU devices for the tensor-parallel tests (tests/models/test_tp.py); everything else runs on
# the first one as before. Set before the backend starts (no effect on a GPU backend).
jax.config.update("jax_num_cpu_devices", 4)
ON_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (REPLAYJAX_TEST_BACKEND=gpu)")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def interpret():
    """Pallas runs compiled on GPU, in interpret mode on CPU."""
    return not ON_GPU
