"""Memory before allocating: what is free for new arrays, and what a pytree of (abstract) arrays
takes, so that commands refuse a model or cache that does not fit in one line instead of being
killed by the operating system halfway through."""

from __future__ import annotations

import math


def free_memory(host: bool = False) -> tuple[int, str]:
    """(bytes free, where) for new arrays: the allocator's limit minus what is in use on a GPU;
    the host's available memory when the device is the CPU or `host` is asked for."""
    if not host:
        import jax
        stats = jax.local_devices()[0].memory_stats() or {}
        if "bytes_limit" in stats:
            return stats["bytes_limit"] - stats.get("bytes_in_use", 0), "the device"
    import psutil
    return psutil.virtual_memory().available, "the host"


def tree_bytes(tree) -> int:
    """Bytes of every array leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s)."""
    import jax
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def shortfall(need: int, host: bool = False) -> str | None:
    """None if `need` bytes fit in free memory (of the device, or of the host with `host`), else
    the why, e.g. "needs ~21.3 GB; the host has 19.8 GB free"."""
    free, where = free_memory(host)
    if need <= free:
        return None
    return f"needs ~{need / 1e9:.1f} GB; {where} has {free / 1e9:.1f} GB free"
