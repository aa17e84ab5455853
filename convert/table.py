"""Declarative name tables: our param path <- HF tensor block(s) + a transform.

A `Part` is one contiguous block of an HF tensor: the whole tensor, ``src[lead]`` (an index into
its leading axes, e.g. one expert of a fused ``gate_up_proj``) and optionally a row range of the
next axis (``src[lead][a:b]``, e.g. the gate half, or one key-head group of Qwen3-Next's
interleaved ``in_proj_qkvz``). A `Rule` fills one param of the model from parts with one op:

    copy      param = part, reshaped (same element order; conv1d (C, 1, K) -> (C, K))
    T         param = part.T                           (nn.Linear weight (out, in) -> kernel)
    stack_T   param[e] = part_e.T                      (per-expert or fused experts -> [E, ...])
    cols_T    param[:, c0:c1] = part.T for each (part, (c0, c1))   (fused GDN in_proj)

The family tables (`convert.mappings.*`) are written with `TableBuilder`, which derives the
expected HF shape of every tensor from the model's param shapes (i.e. from the config), and
checks that every param is filled exactly once and every declared tensor consumed exactly once.

`param_blocks` executes one rule streaming: it yields the param block by block (the chunks of the
written array, ~8 MiB): along axis 1 for `T` (a block of kernel columns is a contiguous block of
source rows), along axis 0 otherwise. Memory per step: one block plus one source block (`copy`,
`T`), one expert (`stack_T`) or the param itself (`cols_T`, the fused GDN in_proj only); a whole
source tensor is never held, however large. `param_array` assembles one whole param from its
blocks (direct loading into a model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from convert.errors import Cancelled

# keys into the model's pure-dict state, e.g. ("layers", 0, "mixer", "in_proj", "kernel")
Path = tuple
OPS = ("copy", "T", "stack_T", "cols_T")


@dataclass(frozen=True)
class Part:
    src: str
    lead: tuple[int, ...] = ()
    rows: tuple[int, int] | None = None

    def shape(self, src_shape: tuple[int, ...]) -> tuple[int, ...]:
        s = tuple(src_shape[len(self.lead):])
        if self.rows is not None:
            s = (self.rows[1] - self.rows[0],) + s[1:]
        return s

    def sub_rows(self, r0: int, r1: int) -> tuple[int, int]:
        """Rows [r0, r1) of the block as rows of ``src[lead]``."""
        base = self.rows[0] if self.rows is not None else 0
        return base + r0, base + r1


@dataclass(frozen=True)
class Rule:
    path: Path
    op: str
    parts: tuple[Part, ...]
    cols: tuple[tuple[int, int], ...] = ()


@dataclass
class Table:
    rules: list[Rule]
    sources: dict[str, tuple[int, ...]]          # HF name -> expected shape
    skipped: dict[str, str] = field(default_factory=dict)   # HF name prefix -> why it is skipped
    notes: list[str] = field(default_factory=list)


def path_str(path: Path) -> str:
    return "/".join(str(k) for k in path)


class TableBuilder:
    """Collects rules for a model whose params have the shapes `targets` ({path: shape})."""

    def __init__(self, targets: Mapping[Path, tuple[int, ...]], available: set[str]):
        self.targets = dict(targets)
        self.available = available
        self.rules: list[Rule] = []
        self.sources: dict[str, tuple[int, ...]] = {}
        self.skipped: dict[str, str] = {}
        self.notes: list[str] = []

    # ------------------------------------------------------------------ helpers
    def has(self, name: str) -> bool:
        return name in self.available

    def has_param(self, path: Path) -> bool:
        return path in self.targets

    def shape(self, path: Path) -> tuple[int, ...]:
        if path not in self.targets:
            raise KeyError(f"table error: the model has no param {path_str(path)}")
        return self.targets[path]

    def source(self, name: str, shape: tuple[int, ...]) -> str:
        shape = tuple(int(d) for d in shape)
        old = self.sources.setdefault(name, shape)
        assert old == shape, f"table error: {name} declared with shapes {old} and {shape}"
        return name

    def _add(self, path, op, parts, cols=()):
        assert op in OPS, op
        self.shape(path)
        self.rules.append(Rule(tuple(path), op, tuple(parts), tuple(cols)))

    # ------------------------------------------------------------------ rule kinds
    def copy(self, path: Path, name: str, src_shape: tuple[int, ...] | None = None):
        """param = tensor (src_shape: the HF shape when it differs by unit axes, e.g. conv1d)."""
        shape = self.shape(path)
        src_shape = shape if src_shape is None else tuple(src_shape)
        assert math.prod(src_shape) == math.prod(shape), (name, src_shape, shape)
        self._add(path, "copy", [Part(self.source(name, src_shape))])

    def conv(self, path: Path, name: str):
        """Depthwise conv1d weight (C, 1, K) -> (C, K)."""
        C, K = self.shape(path)
        self.copy(path, name, (C, 1, K))

    def linear(self, path: Path, name: str):
        """nn.Linear `name.weight` (out, in) -> path/kernel (in, out); `name.bias` if the model
        has one."""
        din, dout = self.shape(path + ("kernel",))
        self._add(path + ("kernel",), "T", [Part(self.source(f"{name}.weight", (dout, din)))])
        if self.has_param(path + ("bias",)):
            self.copy(path + ("bias",), f"{name}.bias")

    def stack_T(self, path: Path, names: list[str]):
        """param[e] = names[e].T (per-expert nn.Linear weights)."""
        E, a, b = self.shape(path)
        assert len(names) == E
        self._add(path, "stack_T", [Part(self.source(n, (b, a))) for n in names])

    def fused_T(self, path: Path, name: str, src_shape: tuple[int, ...],
                rows: tuple[int, int] | None = None):
        """param[e] = name[e][rows].T for a fused [E, out, in] tensor (optionally a row slice)."""
        E = self.shape(path)[0]
        self.source(name, src_shape)
        self._add(path, "stack_T", [Part(name, (e,), rows) for e in range(E)])

    def cols_T(self, path: Path, pieces: list[tuple[Part, tuple[int, int]]]):
        """param[:, c0:c1] = part.T for each piece (sources must be declared with `source`)."""
        self._add(path, "cols_T", [p for p, _ in pieces], [c for _, c in pieces])

    def skip(self, prefix: str, why: str):
        self.skipped[prefix] = why

    # ------------------------------------------------------------------ finish
    def build(self) -> Table:
        """Check that the rules fill every param exactly once and consume every tensor once."""
        paths = [r.path for r in self.rules]
        dup = {p for p in paths if paths.count(p) > 1}
        assert not dup, f"table error: params filled twice: {sorted(map(path_str, dup))}"
        missing = set(self.targets) - set(paths)
        assert not missing, f"table error: params without a rule: {sorted(map(path_str, missing))}"
        used = dict.fromkeys(self.sources, 0)
        for r in self.rules:
            n = 0
            for p in r.parts:
                size = math.prod(p.shape(self.sources[p.src]))
                used[p.src] += size
                n += size
            assert n == math.prod(self.targets[r.path]), f"table error: {path_str(r.path)} coverage"
        for name, n in used.items():
            assert n == math.prod(self.sources[name]), f"table error: {name} consumed {n} elements"
        return Table(self.rules, self.sources, self.skipped, self.notes)


# ----------------------------------------------------------------------------- execution


def chunk_shape(rule: Rule, shape: tuple[int, ...], dtype, block_bytes: int) -> tuple[int, ...]:
    """Shape of one written block (= the zarr chunk): about `block_bytes`, split along axis 1
    for `T` (a block of output columns = a contiguous block of source rows) and along axis 0
    otherwise."""
    if not shape:
        return ()
    axis = 1 if rule.op == "T" else 0
    slab = max(1, math.prod(shape) // shape[axis] * np.dtype(dtype).itemsize)
    n = max(1, min(shape[axis], block_bytes // slab))
    n = -(-shape[axis] // -(-shape[axis] // n))     # equal chunks: zarr pads the last one
    return tuple(n if i == axis else d for i, d in enumerate(shape))


def _transpose(a: np.ndarray, dtype, out: np.ndarray | None = None) -> np.ndarray:
    """a.T (2-D) cast to `dtype`, into `out` if given. Copies slabs of a few source rows at a
    time (about 3 GB/s for bf16 vs 0.3 GB/s for numpy's plain strided `.T` copy of a large
    matrix); same-width dtypes move as unsigned ints."""
    R, C = a.shape
    if out is None:
        out = np.empty((C, R), dtype)
    src, dst = a, out
    if a.dtype == out.dtype and a.dtype.itemsize in (2, 4, 8):
        u = np.dtype(f"u{a.dtype.itemsize}")
        src, dst = a.view(u), out.view(u)
    t = max(4, 32 // a.dtype.itemsize)
    for i in range(0, R, t):
        dst[:, i:i + t] = src[i:i + t].T
    return out


def param_blocks(rule: Rule, shape: tuple[int, ...], dtype, tensors, reader,
                 chunks: tuple[int, ...], cancel: Callable[[], bool] = lambda: False
                 ) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
    """Yield (index, block) with block = param[index] in `dtype`, one chunk (`chunk_shape`) at a
    time; `reader.read(info, lead, rows)` supplies ``src[lead][r0:r1]``. Memory: one block plus
    one source block (`copy`, `T`), one expert (`stack_T`) or the param itself (`cols_T`)."""
    dtype = np.dtype(dtype)

    def read(p: Part, rows=None) -> np.ndarray:
        return reader.read(tensors[p.src], p.lead, p.rows if rows is None else rows)

    def check():
        if cancel():
            raise Cancelled()

    def steps(n, k):
        for a in range(0, n, k):
            yield a, min(n, a + k)

    if rule.op == "copy":
        (p,) = rule.parts                               # same leading axis (conv: (C, 1, K))
        for r0, r1 in steps(shape[0], chunks[0]):
            check()
            a = read(p, p.sub_rows(r0, r1)).reshape((r1 - r0,) + tuple(shape[1:]))
            yield (slice(r0, r1),), a.astype(dtype, copy=False)
    elif rule.op == "T":
        (p,) = rule.parts                               # source [out, in] -> param [in, out]
        out = None
        for c0, c1 in steps(shape[1], chunks[1]):       # param columns = source rows
            check()
            a = read(p, p.sub_rows(c0, c1))
            if out is None or out.shape[1] != c1 - c0:
                out = np.empty((shape[0], c1 - c0), dtype)    # reused: no page faults per block
            yield (slice(None), slice(c0, c1)), _transpose(a, dtype, out)
            del a
    elif rule.op == "stack_T":
        for r0, r1 in steps(shape[0], chunks[0]):
            block = np.empty((r1 - r0,) + tuple(shape[1:]), dtype)
            for e in range(r0, r1):
                check()
                _transpose(read(rule.parts[e]), dtype, block[e - r0])
            yield (slice(r0, r1),), block
    elif rule.op == "cols_T":
        full = np.empty(shape, dtype)
        for p, (c0, c1) in zip(rule.parts, rule.cols):
            check()
            _transpose(read(p), dtype, full[:, c0:c1])
        for r0, r1 in steps(shape[0], chunks[0]):
            yield (slice(r0, r1),), full[r0:r1]
    else:
        raise ValueError(f"unknown op {rule.op!r}")


def param_array(rule: Rule, shape: tuple[int, ...], dtype, tensors, reader,
                block_bytes: int) -> np.ndarray:
    """The whole param on the host, assembled from `param_blocks` (for loading into a model)."""
    out = np.empty(shape, dtype)
    for index, block in param_blocks(rule, shape, dtype, tensors, reader,
                                     chunk_shape(rule, shape, dtype, block_bytes)):
        out[index] = block
    return out
