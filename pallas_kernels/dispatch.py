"""Implementation registry: each public op maps backend names to implementations.

Backends: "xla" (pure jnp over the slot pool), "pallas_triton" (Pallas kernels, Triton
lowering; interpret mode off the GPU) and "pallas_mosaic_gpu" (Mosaic GPU kernels for Hopper;
the Mosaic GPU interpreter off the GPU; only some ops have them). `impl` may also be "pallas"
(= "pallas_triton") or "auto": XLA off the GPU; on an NVIDIA GPU Pallas Triton, except on
Hopper (sm90) for the ops whose Mosaic GPU kernel measured faster there and takes the arguments
(its module's `takes(op_name, args)`), with the default tiling.
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


@functools.cache
def on_hopper() -> bool:
    """Whether the default device is an sm90 GPU (H100 / H200): the Mosaic GPU kernels' target."""
    return on_gpu() and getattr(jax.devices()[0], "compute_capability", None) == "9.0"


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
    arguments; a Pallas one also takes `tiling` (None: its measured default) and `interpret`.
    `mosaic_takes(args)`: whether "auto" runs the Mosaic GPU kernel on sm90 (None: never)."""
    name: str
    impls: Mapping[str, Callable]
    mosaic_takes: Callable | None = None

    def backend(self, args, impl="auto", tiling=None) -> str:
        """The backend `impl` runs for `args`. A tiling belongs to one backend: "auto" given one
        stays on Pallas Triton."""
        backend = resolve_impl(impl)
        if (impl == "auto" and tiling is None and self.mosaic_takes is not None and on_hopper()
                and self.mosaic_takes(args)):
            return "pallas_mosaic_gpu"
        return backend

    def __call__(self, *args, impl="auto", tiling=None, interpret=None, **options):
        """Runs the op's `impl` on args; `options` (an op's static keywords) go to every
        backend, tiling and interpret to the Pallas ones."""
        backend = self.backend(args, impl, tiling)
        check(backend in self.impls, f"{self.name} has no {backend} implementation")
        if backend == "xla":
            return self.impls[backend](*args, **options)
        return self.impls[backend](*args, tiling=tiling, interpret=resolve_interpret(interpret),
                                   **options)


def family_ops(family: str, names, **backends) -> dict[str, Op]:
    """The ops `names` of a kernel family, by name; `backends` maps a backend name to the module
    that implements ops as functions of the op's name (an op it lacks has no such backend). A
    Mosaic GPU module's `takes(name, args)` says which calls "auto" gives it on sm90."""
    mosaic = backends.get("pallas_mosaic_gpu")
    takes = getattr(mosaic, "takes", None)
    return {n: Op(f"{family}.{n}", {b: getattr(m, n) for b, m in backends.items()
                                    if hasattr(m, n)},
                  functools.partial(takes, n) if takes and hasattr(mosaic, n) else None)
            for n in names}
