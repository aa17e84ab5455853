"""Profiler traces: per-kernel device times, each kernel classed (ssm, gemm, attention, moe,
sampling, collective, other) by the HLO instruction it comes from.

A `jax.profiler` trace (XSpace, `*.xplane.pb`) holds the device events, each carrying the
`hlo_module` / `hlo_op` it executes, and, in its metadata plane, the HloProto of every compiled
module. The HLO text of those modules carries each instruction's `op_name` (with any
`jax.named_scope` names) and its Python stack frames. A kernel's class is the first of
`PRIORITY` among the classes of the instructions it runs (a fusion runs its fused computation):
  * a collective (all-reduce, all-gather, ...: tensor parallelism's NCCL kernels) -> collective;
  * the innermost named scope equal to a class name ("ssm", "gemm", "attention", "moe",
    "sampling", "conv");
  * else its stack: `cached_attention` -> attention; a MoE module's methods -> moe;
    replayjax/sampling.py -> sampling;
  * else the instruction: a dot or a GEMM custom call -> gemm;
  * else the stack again: pallas_kernels/, Mamba2Mixer / GatedDeltaNet methods -> ssm;
  * else other.
A GPU event's instruction is looked up in its module by program id, else in the modules of its
name (a program compiled at two shapes has two ids: the one holding the instruction); a CUDA
graph's kernels, which name no instruction, by the kernel name XLA gives one (fusion.12 ->
fusion_12). A kernel matched to no instruction (a Pallas or cuBLAS kernel's) is classed by the
op_name GPU events carry (scopes), else by its name. Each kernel also gets its source: the
innermost frame in this checkout of its instruction's stack (`module_sources`).
On a CPU-only machine the "device" events are the host's XLA thunks (same stats,
same HLO). The GPU event stats used here (hlo_module, hlo_op, program_id, name) were read from an
H200 trace with jax 0.11.2.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import dataclasses
import functools
import glob
import os
import re
import warnings
from typing import NamedTuple

from replayjax.bench.roofline import CLASSES
from replayjax.commandline import UserError


@contextlib.contextmanager
def fresh_metadata():
    """Within it, programs key the persistent compilation cache by their metadata too: a program
    loaded from the cache otherwise keeps the source files and lines of whichever checkout (or
    earlier version of a file) compiled it first, and a profile would name those."""
    import jax
    keyed = jax.config.jax_compilation_cache_include_metadata_in_key
    jax.config.update("jax_compilation_cache_include_metadata_in_key", True)
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_include_metadata_in_key", keyed)


PRIORITY = ("collective", "attention", "moe", "sampling", "gemm", "conv", "ssm", "other")
# named scopes that class an instruction: the roofline's classes, and the prompt's causal conv
# (`models.hybrid.prefill_inputs`; prefill only, so decode tables never see it)
SCOPES = CLASSES + ("conv",)
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Framework Name Scope", "Framework Ops",
                  "Source code", "XLA TraceMe")


@dataclasses.dataclass(frozen=True)
class Event:
    name: str                 # kernel (or thunk) name
    ns: float                 # duration
    module: str | None        # hlo_module stat
    program_id: int | None
    op: str | None            # hlo_op stat: the HLO instruction it executes
    op_name: str = ""         # "name" stat on GPUs: the instruction's op_name (scopes)


def xplane_file(trace_dir: str) -> str:
    """The newest *.xplane.pb under trace_dir."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise UserError(f"no .xplane.pb under {trace_dir}")
    return max(files, key=os.path.getmtime)


def device_events(path: str) -> list[Event]:
    """The kernels of a trace: events of the device planes, or, without any (a CPU), the
    innermost XLA thunk events of the host plane (those with an hlo_op stat)."""
    import jax
    data = jax.profiler.ProfileData.from_file(path)
    planes = list(data.planes)
    device = [p for p in planes if p.name.startswith("/device:")]
    out = []
    with warnings.catch_warnings():      # jaxlib's stats type lacks __module__ (Python 3.13)
        warnings.simplefilter("ignore", DeprecationWarning)
        for plane in device or [p for p in planes if p.name.startswith("/host:CPU")]:
            for line in plane.lines:
                if line.name in _DERIVED_LINES:
                    continue
                evs = []
                for ev in line.events:
                    st = dict(ev.stats)
                    if device or "hlo_op" in st:
                        evs.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev, st))
                out += [Event(ev.name, ev.duration_ns, st.get("hlo_module"),
                              st.get("program_id"), st.get("hlo_op"), st.get("name", ""))
                        for _, _, ev, st in _innermost(evs)]
    return out


def _innermost(evs):
    """The events of one line that contain no other (nested thunks: keep the leaves)."""
    evs = sorted(evs, key=lambda e: (e[0], -e[1]))
    return [e for i, e in enumerate(evs)
            if not (i + 1 < len(evs) and evs[i + 1][0] < e[1] and evs[i + 1][1] <= e[1])]


# ---------------------------------------------------------------------- HLO in the trace

def _varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def _fields(b):
    """(field number, value) of a protobuf message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        wire = key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield key >> 3, v


class _HloTexts(collections.abc.Mapping):
    """{"module(program_id)": HLO text with metadata}, each text printed from its HloProto when
    read (every read prints it again: the readers read a module once): the metadata plane holds
    every module the process compiled, and a long-lived process (a benchmark's variants, a test
    worker) has thousands; a profile reads those that ran."""

    def __init__(self, protos: dict[str, bytes]):
        self._protos = protos

    def __getitem__(self, key):
        from jaxlib import xla_client
        opts = xla_client.hlo.HloPrintOptions()
        opts.print_metadata = True
        module = xla_client.hlo.HloModule.from_serialized_hlo_module_proto(self._protos[key])
        return module.to_string(opts)

    def __contains__(self, key):        # (Mapping's would print the module to find out)
        return key in self._protos

    def __iter__(self):
        return iter(self._protos)

    def __len__(self):
        return len(self._protos)


def hlo_modules(path: str) -> collections.abc.Mapping[str, str]:
    """{"module(program_id)": HLO text with metadata} of every module in the trace's metadata
    plane (each printed when first read). Field numbers from tsl/profiler/protobuf/xplane.proto
    (XSpace.planes = 1; XPlane.name = 2, event_metadata = 4, stat_metadata = 5;
    XEventMetadata.name = 2, stats = 5; XStatMetadata.name = 2; XStat.metadata_id = 1,
    bytes_value = 6) and xla/service/hlo.proto (HloProto.hlo_module = 1)."""
    with open(path, "rb") as f:
        space = f.read()
    protos = {}
    for field, plane in _fields(space):
        pf = list(_fields(plane)) if field == 1 else []
        if (2, b"/host:metadata") not in pf:
            continue
        # map entries are messages {1: key, 2: value}
        stat_meta = [dict(_fields(dict(_fields(v))[2])) for f, v in pf if f == 5]
        hlo_stat = next((m.get(1) for m in stat_meta if m.get(2) == b"Hlo Proto"), None)
        for f, v in pf:
            if f != 4:
                continue
            meta = list(_fields(dict(_fields(v))[2]))
            name = next((x.decode() for k, x in meta if k == 2), "")
            stats = [dict(_fields(x)) for k, x in meta if k == 5]
            for st in stats:
                if st.get(1) == hlo_stat and 6 in st:
                    protos[name] = dict(_fields(st[6]))[1]           # HloProto.hlo_module
    return _HloTexts(protos)


# ---------------------------------------------------------------------- classification

_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s*\b([a-z][a-z0-9\-]*)\((.*)$")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_TABLE = re.compile(r'^(\d+)\s+(?:"(.*)"|\{(.*)\})\s*$')


def _stack_tables(text):
    """frame id -> [(file, function, line), ...] from the innermost frame out."""
    tables, section = collections.defaultdict(dict), None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        m = _TABLE.match(line) if section else None
        if not m:
            section = None if not line.strip() or line.startswith(("%", "ENTRY")) else section
            continue
        value = m.group(2) if m.group(2) is not None else dict(
            kv.split("=") for kv in m.group(3).split())
        tables[section][int(m.group(1))] = value
    files, funcs = tables["FileNames"], tables["FunctionNames"]
    locs, frames = tables["FileLocations"], tables["StackFrames"]

    def chain(fid):
        out, seen = [], set()
        while fid in frames and fid not in seen:   # printed parent = parent id + 1; 1 = none
            seen.add(fid)
            loc = locs.get(int(frames[fid]["file_location_id"]), {})
            out.append((files.get(int(loc.get("file_name_id", 0)), ""),
                        funcs.get(int(loc.get("function_name_id", 0)), ""),
                        int(loc.get("line", 0))))
            fid = int(frames[fid]["parent_frame_id"]) - 1
        return out
    return {fid: chain(fid) for fid in frames}


def instruction_class(opcode: str, op_name: str, frames, target: str = "") -> str:
    """The class of one HLO instruction (rules in the module docstring)."""
    if opcode.startswith(_COLLECTIVES):     # tensor parallelism's all-reduces, in any scope
        return "collective"
    for scope in reversed(op_name.split("/")):       # the innermost named scope decides
        if scope in SCOPES:
            return scope
    funcs = [f for _, f in frames]
    files = [f.replace(os.sep, "/") for f, _ in frames]
    if "cached_attention" in funcs:
        return "attention"
    if any(f.split(".")[0].lower() == "moe" for f in funcs):
        return "moe"
    if any(f.endswith("replayjax/sampling.py") for f in files):
        return "sampling"
    if opcode in ("dot", "convolution") or "gemm" in target or "matmul" in target:
        return "gemm"
    if any("pallas_kernels/" in f for f in files) or any(
            f.split(".")[0] in ("Mamba2Mixer", "GatedDeltaNet") for f in funcs):
        return "ssm"
    return "other"


class _Instruction(NamedTuple):
    comp: str               # the computation holding it
    name: str
    opcode: str
    rest: str               # its line after the opcode's "("
    shape: str              # its result shape, layouts dropped
    root: bool              # its computation's ROOT


def _instructions(text):
    """The `_Instruction`s of an HLO module's text."""
    comp = None
    for line in text.splitlines():
        if (h := _HEADER.match(line)) and " = " not in line:
            comp = h.group(1)
            continue
        m = _INSTR.match(line)
        if m and comp is not None:
            root, name, shape, opcode, rest = m.groups()
            yield _Instruction(comp, name, opcode, rest, re.sub(r"\{[^}]*\}", "", shape),
                               bool(root))


def classify_module(text: str) -> dict[str, str]:
    """{instruction name: class} for every instruction of an HLO module's text; a fusion (or
    call) takes the first of PRIORITY among its own and its called computations' classes."""
    stacks = _stack_tables(text)
    comps, own, calls = collections.defaultdict(list), {}, {}
    for comp, name, opcode, rest, *_ in _instructions(text):
        op_name = re.search(r'op_name="([^"]*)"', rest)
        frame = re.search(r"stack_frame_id=(\d+)", rest)
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        frames = stacks.get(int(frame.group(1)), []) if frame else []
        own[name] = instruction_class(opcode, op_name.group(1) if op_name else "",
                                      [(f, fn) for f, fn, _ in frames],
                                      target.group(1).lower() if target else "")
        calls[name] = re.findall(r"calls=%?([\w.\-]+)", rest)
        comps[comp].append(name)

    def resolved(name, seen=()):
        found = {own[name]}
        for c in calls.get(name, []):
            if c not in seen:
                found |= {resolved(i, seen + (c,)) for i in comps.get(c, [])}
        return next(c for c in PRIORITY if c in found)
    return {name: resolved(name) for name in own}


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def module_sources(text: str) -> dict[str, str]:
    """{instruction name: "file.py:line function (op)"}: the innermost frame in this checkout
    (path relative to it) of the instruction's stack and the last part of its op_name (a fusion
    carries its root's), so a kernel named fusion_123 says which line of ours it comes from; an
    instruction with neither (XLA made it: a fused concatenation of weights, say) says what it
    computes, "XLA <opcode> <shape>" (a fusion's: its fused computation's root opcode)."""
    stacks, out, instrs = _stack_tables(text), {}, list(_instructions(text))
    roots = {i.comp: i.opcode for i in instrs if i.root}
    for _, name, opcode, rest, shape, _ in instrs:
        frame = re.search(r"stack_frame_id=(\d+)", rest)
        op_name = re.search(r'op_name="([^"]*)"', rest)
        ours = [(f[len(_ROOT):], fn, line) for f, fn, line in
                (stacks.get(int(frame.group(1)), []) if frame else []) if f.startswith(_ROOT)]
        op = op_name.group(1).split("/")[-1] if op_name else ""
        if ours:
            f, fn, line = ours[0]
            out[name] = f"{f}:{line} {fn}" + (f" ({op})" if op else "")
        elif op:
            out[name] = op
        else:
            called = re.search(r"calls=%?([\w.\-]+)", rest)
            out[name] = f"XLA {roots.get(called.group(1), opcode) if called else opcode} {shape}"
    return out


def _fallback_class(ev: Event) -> str:
    """A kernel whose HLO the trace lacks: its op_name's scopes, else its name."""
    if (cls := instruction_class("", ev.op_name, [])) != "other":
        return cls
    k = ev.name.lower()
    if k.startswith("moe_"):                  # the MoE kernels (moe_gate_up, moe_down, moe_route)
        return "moe"
    if "attention" in k:                      # the Pallas decode attention (decode_attention)
        return "attention"
    if k.startswith("conv_"):                 # the Pallas decode conv (conv_update)
        return "conv"
    if any(s in k for s in ("replay", "standard_decode", "mamba", "gdn", "ssm")):
        return "ssm"
    if any(s in k for s in ("gemm", "nvjet", "cublas", "cutlass", "matmul")):
        return "gemm"
    if "nccl" in k:
        return "collective"
    return "other"


def kernel_name(instruction: str) -> str:
    """The name XLA's GPU backend gives the kernel of an instruction (fusion.12 -> fusion_12)."""
    return instruction.replace(".", "_").replace("-", "_")


def kernel_table(trace_dir: str) -> list[dict]:
    """One row per kernel name and class: launches, total ns, `source` (`module_sources` of its
    first launch's instruction; "" when unknown) and `by`: "hlo" (classed by the instruction the
    event names), "kernel" (the event names none, as kernels of a CUDA graph do: the
    instruction whose kernel name it has, in its module, else in the largest module that has
    one) or "name" (no such instruction, a Pallas kernel's: classed by scopes, else its name);
    sorted by time."""
    path = xplane_file(trace_dir)
    texts, named = hlo_modules(path), collections.defaultdict(list)
    for key in texts:
        named[key.split("(")[0]].append(key)

    @functools.cache
    def module(key):          # (classes, sources, kernels) of a module, read when first needed
        text = texts[key]
        classes = classify_module(text)
        return classes, module_sources(text), {kernel_name(i): i for i in classes}

    @functools.cache
    def largest():
        return sorted((module(k) for k in texts), key=lambda m: -len(m[0]))

    rows = {}
    for ev in device_events(path):
        # its module by id, else those of its name (a program compiled twice, e.g. at two
        # shapes, has two ids: the one holding its instruction), else every module
        exact = f"{ev.module}({ev.program_id})"
        keys = ([exact] if exact in texts else []) + named.get(ev.module, [])
        own = next((m for m in map(module, keys) if ev.op in m[0]), None)
        if own:
            (classes, sources, _), op, by = own, ev.op, "hlo"
        else:
            found = next((m for m in map(module, keys) if ev.name in m[2]), None) or next(
                (m for m in largest() if ev.name in m[2]), None)
            classes, sources, kernels = found or ({}, {}, {})
            op, by = kernels.get(ev.name), "kernel" if found else "name"
        cls = classes[op] if op else _fallback_class(ev)
        row = rows.setdefault((ev.name, cls), dict(name=ev.name, cls=cls, count=0, total_ns=0.0,
                                                   source=sources.get(op, ""), by=by))
        row["count"] += 1
        row["total_ns"] += ev.ns
    return sorted(rows.values(), key=lambda r: -r["total_ns"])
