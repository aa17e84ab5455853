"""Safetensors headers, block reads and writes with numpy + ml_dtypes (no torch, no safetensors).

Format (models.md C): an 8-byte little-endian header length n, n bytes of UTF-8 JSON
``{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`` with offsets
relative to the end of the header, then the raw row-major little-endian bytes.

`open_checkpoint(dir)` validates every header up front (JSON, dtypes, shapes, offsets inside the
file, no overlaps; for a sharded checkpoint also the index) and returns `TensorInfo`s with absolute
file offsets. `Reader.read` / `Reader.read_elems` then pull one contiguous block at a time with
``os.preadv`` into a fresh numpy buffer, so nothing is memory-mapped and nothing stays resident.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from convert.errors import ConvertError

DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64),
          "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
          "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20          # the safetensors crate's limit
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str                   # absolute path of its shard
    dtype: str                  # safetensors dtype string ("BF16", "F32", ...)
    shape: tuple[int, ...]
    start: int                  # absolute byte offsets in `file`
    end: int

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SourceFile:
    name: str                   # relative to the checkpoint directory
    path: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Checkpoint:
    directory: str
    files: tuple[SourceFile, ...]
    tensors: Mapping[str, TensorInfo]
    index: str | None           # path of model.safetensors.index.json, if sharded


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parse and validate one safetensors file's header; raises ConvertError naming the file."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ConvertError(f"{name}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise ConvertError(f"{name}: corrupt safetensors header (header length {n} "
                                   f"does not fit in the file of {size} bytes)")
            blob = f.read(n)
    except OSError as e:
        raise ConvertError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{name}: corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{name}: corrupt safetensors header (not a JSON object)")
    base, data_size = 8 + n, size - 8 - n
    out, spans = {}, []
    for tname, meta in header.items():
        if tname == "__metadata__":
            continue
        bad = _check_entry(meta)
        if bad:
            raise ConvertError(f"{name}: corrupt safetensors header entry for {tname}: {bad}")
        (b, e), dtype, shape = meta["data_offsets"], meta["dtype"], tuple(meta["shape"])
        want = math.prod(shape) * DTYPES[dtype].itemsize
        if e - b != want:
            raise ConvertError(f"{name}: corrupt safetensors header entry for {tname}: "
                               f"{e - b} bytes for {dtype} {list(shape)} (expected {want})")
        if e > data_size:
            raise ConvertError(f"{name}: truncated or corrupt file: tensor {tname} ends at byte "
                               f"{base + e}, past the end of the file ({size} bytes)")
        out[tname] = TensorInfo(tname, os.path.abspath(path), dtype, shape, base + b, base + e)
        spans.append((b, e, tname))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ConvertError(f"{name}: corrupt safetensors header: tensors {n0} and {n1} overlap")
    return out


def _check_entry(meta) -> str | None:
    if not isinstance(meta, dict):
        return "not an object"
    if meta.get("dtype") not in DTYPES:
        return f"unsupported dtype {meta.get('dtype')!r}"
    shape, offs = meta.get("shape"), meta.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                            and d >= 0 for d in shape)):
        return f"bad shape {shape!r}"
    if not (isinstance(offs, list) and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            and 0 <= offs[0] <= offs[1]):
        return f"bad data_offsets {offs!r}"
    return None


def open_checkpoint(directory: str) -> Checkpoint:
    """All tensors of `model.safetensors` or of the shards in `model.safetensors.index.json`."""
    index = os.path.join(directory, INDEX_NAME)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str)
                                                           for v in weight_map.values()):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            raise ConvertError(f"{INDEX_NAME}: not a valid safetensors index "
                               "(expected a JSON object with a 'weight_map')") from None
        names = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(directory, SINGLE_NAME)):
        weight_map, names, index = None, [SINGLE_NAME], None
    else:
        raise ConvertError(f"no {SINGLE_NAME} or {INDEX_NAME} in {directory}")
    files, tensors = [], {}
    for fname in names:
        path = os.path.join(directory, fname)
        if os.path.dirname(os.path.normpath(fname)) or fname.startswith(".."):
            raise ConvertError(f"{INDEX_NAME}: shard name {fname!r} is not a plain file name")
        if not os.path.isfile(path):
            raise ConvertError(f"shard {fname} listed in {INDEX_NAME} does not exist")
        for tname, info in read_header(path).items():
            if tname in tensors:
                raise ConvertError(f"tensor {tname} is stored twice ({os.path.basename(tensors[tname].file)} "
                                   f"and {fname})")
            tensors[tname] = info
        st = os.stat(path)
        files.append(SourceFile(fname, os.path.abspath(path), st.st_size, st.st_mtime))
    if weight_map is not None:
        for tname, fname in weight_map.items():
            info = tensors.get(tname)
            if info is None or os.path.basename(info.file) != fname:
                raise ConvertError(f"{INDEX_NAME} maps {tname} to {fname}, which does not contain it")
    return Checkpoint(os.path.abspath(directory), tuple(files), tensors, index)


class Reader:
    """Contiguous block reads by absolute offset with os.preadv into fresh numpy buffers.
    `on_read(name, nbytes)` is called after every read (progress)."""

    def __init__(self, on_read=None):
        self._fds: dict[str, int] = {}
        self.on_read = on_read

    def _fd(self, path):
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def read_bytes(self, info: TensorInfo, start: int, nbytes: int) -> np.ndarray:
        """`nbytes` bytes at byte `start` of tensor `info` as a uint8 array."""
        buf = np.empty(nbytes, np.uint8)
        fd, off, done = self._fd(info.file), info.start + start, 0
        while done < nbytes:
            n = os.preadv(fd, [memoryview(buf)[done:]], off + done)
            if n <= 0:
                raise ConvertError(f"{os.path.basename(info.file)}: truncated file: tensor "
                                   f"{info.name} could not be read to its end")
            done += n
        if self.on_read is not None:
            self.on_read(info.name, nbytes)
        return buf

    def read_elems(self, info: TensorInfo, e0: int, e1: int) -> np.ndarray:
        """Flat elements [e0, e1) of the tensor, in its own dtype."""
        it = info.np_dtype.itemsize
        return self.read_bytes(info, e0 * it, (e1 - e0) * it).view(info.np_dtype)

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# ----------------------------------------------------------------------------- writing (tests, bench)


def encode_header(entries: Iterable[tuple[str, np.dtype, tuple[int, ...]]],
                  metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[tuple[int, int]]]:
    """The 8-byte length + JSON header (padded to 8 bytes) for tensors stored back to back in
    the given order, and their data offsets."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offsets, pos = [], 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _NAMES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [pos, pos + nbytes]}
        offsets.append((pos, pos + nbytes))
        pos += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob, offsets


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write `tensors` (in the mapping's order) as one safetensors file."""
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    head, _ = encode_header((k, v.dtype, v.shape) for k, v in arrays.items())
    with open(path, "wb") as f:
        f.write(head)
        for v in arrays.values():
            f.write(v.tobytes())


def write_sharded(directory: str, tensors: Mapping[str, np.ndarray], num_shards: int) -> list[str]:
    """Split `tensors` into `num_shards` files of about equal size plus the HF index
    (`model-0000i-of-0000n.safetensors`, `model.safetensors.index.json`)."""
    names = list(tensors)
    total = sum(np.asarray(tensors[n]).nbytes for n in names)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    acc = 0
    for n in names:
        shards[min(num_shards - 1, acc * num_shards // max(total, 1))].append(n)
        acc += np.asarray(tensors[n]).nbytes
    files, weight_map = [], {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        write_safetensors(os.path.join(directory, fname), {n: tensors[n] for n in group})
        weight_map.update({n: fname for n in group})
        files.append(fname)
    with open(os.path.join(directory, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return files
