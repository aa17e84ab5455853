"""Streaming orbax writer: each param is produced block by block while orbax saves it.

`save_params(path, leaves)` saves a pytree whose leaves are `PendingParam`s through orbax's
`PyTreeCheckpointHandler` with one extra `TypeHandler`. Instead of receiving finished arrays
(orbax's `NumpyHandler` deep-copies every value and writes all of them concurrently), the handler
writes the leaves one after another, each as a zarr array whose chunks are the blocks (about
`block_bytes`, 8 MiB by default), pulling the blocks from the leaf's generator (see
`convert.table.param_blocks`); at most MAX_INFLIGHT block commits overlap the production of the next
block. Only a few blocks are in memory at any time; nothing is staged on disk. The leaves are
written in the order of their `order` key (the position of their first source tensor in the files).

Only orbax's public API is used (`ocp.type_handlers`: `NumpyHandler`, `ArrayHandler`,
`get_json_tspec_write`, `create_type_handler_registry`, `SaveArgs`; `ocp.future`;
`PyTreeCheckpointHandler`). The handler subclasses `NumpyHandler`, so the checkpoint records its
leaves as ``np.ndarray``. Each array's tensorstore spec is the public `get_json_tspec_write` plus
what orbax's own `NumpyHandler` adds through its private `ArrayWriteSpec`: the dtype and
`store_data_equal_to_fill_value` (all-zero chunks are written too), without the read option
`fill_missing_data_reads`; then the chunk shape is set to the block shape. On orbax 0.12.4 the
spec equals the private one and the checkpoint equals what the earlier private-API writer wrote
(same keys, `.zarray` metadata, data and `_METADATA`). `get_json_tspec_write` carries an orbax
TODO to be replaced by `build_array_tspec_write`: recheck this when orbax is upgraded. The result
is a normal orbax checkpoint (OCDBT + zarr): `StandardCheckpointer` restores it with
`jax.ShapeDtypeStruct(..., sharding=...)` targets (see `convert.loader`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

import numpy as np

MAX_INFLIGHT = 2      # block writes committing while the next block is produced


class PendingParam:
    """A param not computed yet: shape, dtype, chunk shape and a factory of a generator of
    (index, block) pairs covering it chunk by chunk."""

    def __init__(self, name: str, shape, dtype, chunks: tuple[int, ...], order: tuple,
                 blocks: Callable[[], Iterator[tuple[tuple[slice, ...], np.ndarray]]]):
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)
        self.chunks, self.order, self.blocks = tuple(chunks), order, blocks

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def _write_block(store, index: tuple[slice, ...], block: np.ndarray):
    """One block write (an awaitable); tests replace this to simulate a full disk."""
    return store[index].write(block)


async def _write_param(store, value: PendingParam) -> None:
    """Write the blocks of one param, up to MAX_INFLIGHT commits overlapping the production of
    the next block. On any error the pending commits are awaited first, so that nothing writes
    into the directory after the caller removes it."""
    inflight = collections.deque()
    try:
        for index, block in value.blocks():
            w = _write_block(store, index, block)
            if hasattr(w, "copy"):           # tensorstore WriteFutures
                await w.copy                 # block copied: the producer may reuse its buffer
                inflight.append(w.commit)
            else:
                inflight.append(w)
            del block
            while len(inflight) > MAX_INFLIGHT:
                await inflight.popleft()
        while inflight:
            await inflight.popleft()
    except BaseException:
        for f in inflight:
            try:
                await f
            except BaseException:
                pass
        raise


def _handler_class():
    import jax
    import orbax.checkpoint as ocp
    import tensorstore as ts

    class StreamingHandler(ocp.type_handlers.NumpyHandler):
        """Writes `PendingParam`s sequentially, block by block (restores as np.ndarray)."""

        async def _write_all(self, values, infos, args):
            for i in sorted(range(len(values)), key=lambda i: values[i].order):
                value, info, arg = values[i], infos[i], args[i]
                await info.await_path_creation()
                ocdbt = info.is_ocdbt_checkpoint
                spec = ocp.type_handlers.get_json_tspec_write(
                    info, use_ocdbt=ocdbt, global_shape=value.shape, local_shape=value.shape,
                    dtype=value.dtype, process_index=jax.process_index() if ocdbt else None,
                    arg=arg)
                # as orbax's NumpyHandler writes it (see the module docstring), chunks = blocks
                spec["dtype"] = np.dtype(value.dtype).name
                spec["store_data_equal_to_fill_value"] = True
                del spec["fill_missing_data_reads"]
                spec["metadata"]["chunks"] = list(value.chunks)
                store = await ts.open(ts.Spec(spec), create=True, open=True,
                                      context=info.ts_context)
                await _write_param(store, value)

        async def serialize(self, values, infos, args=None):
            args = args or [ocp.type_handlers.SaveArgs()] * len(values)
            return [ocp.future.CommitFutureAwaitingContractedSignals(
                self._write_all(values, infos, args), name="replayjax_convert")]

    return StreamingHandler


def save_params(path: str, tree) -> None:
    """Save a pytree of `PendingParam`s to the orbax checkpoint directory `path` (must not
    exist). The blocks are produced in orbax's writer thread, in the order of `order`."""
    import jax
    import orbax.checkpoint as ocp

    registry = ocp.type_handlers.create_type_handler_registry(
        (PendingParam, _handler_class()()),
        # no jax.Array is saved; without a handler for it orbax warns on every save
        (jax.Array, ocp.type_handlers.ArrayHandler()))
    handler = ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_compression=False)
    with ocp.Checkpointer(handler) as ckptr:
        ckptr.save(path, args=ocp.args.PyTreeSave(tree))
