"""Implementation registry: each public op maps backend names to implementations.

Backends: "xla" (pure jnp over the slot pool), "pallas_triton" (Pallas kernels, Triton
lowering; interpret mode off the GPU) and "pallas_mosaic_gpu" (Mosaic GPU kernels for Hopper;
the Mosaic GPU interpreter off the GPU; only some ops have them). `impl` may also be "auto"
(Pallas Triton on an NVIDIA GPU, XLA elsewhere) or "pallas" (= "pallas_triton").
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax

from pallas_kernels.validation import check

BACKENDS = ("xla", "pallas_triton", "pallas_mosaic_gpu")
_SHORT_NAMES = {"pallas": "pallas_triton"}
IMPLS = ("auto", *_SHORT_NAMES, *BACKENDS)


@functools.cache
def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def resolve_impl(impl: str) -> str:
    """The backend `impl` names: "auto" is Pallas Triton on an NVIDIA GPU and XLA elsewhere."""
    check(impl in IMPLS, f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "pallas_triton" if on_gpu() else "xla"
    return _SHORT_NAMES.get(impl, impl)


def resolve_interpret(interpret: bool | None) -> bool:
    """Pallas runs compiled on GPU and in interpret mode everywhere else (CPU CI)."""
    return (not on_gpu()) if interpret is None else bool(interpret)


@dataclasses.dataclass(frozen=True)
class Op:
    """A public op's implementations by backend name. The XLA one takes the op's (validated)
    arguments; a Pallas one also takes `tiling` (None: its measured default) and `interpret`."""
    name: str
    impls: Mapping[str, Callable]

    def __call__(self, *args, impl="auto", tiling=None, interpret=None):
        backend = resolve_impl(impl)
        check(backend in self.impls, f"{self.name} has no {backend} implementation")
        if backend == "xla":
            return self.impls[backend](*args)
        return self.impls[backend](*args, tiling=tiling, interpret=resolve_interpret(interpret))


def family_ops(family: str, names, **backends) -> dict[str, Op]:
    """The ops `names` of a kernel family, by name; `backends` maps a backend name to the module
    that implements ops as functions of the op's name (an op it lacks has no such backend)."""
    return {n: Op(f"{family}.{n}", {b: getattr(m, n) for b, m in backends.items()
                                    if hasattr(m, n)})
            for n in names}
