#!/usr/bin/env python
"""Benchmark `replayjax convert` on a synthetic Nemotron-H checkpoint of >= 4 GB in several shards.

The checkpoint has the real dims of Nemotron-H-8B (hidden 4096, vocab 131072; Mamba-2 layers with
H=128 x P=64 (DI=8192), N=128, G=8, K=4) with only Mamba layers ("M" repeated), bf16, random finite
values written in 64 MB chunks (generation needs no more than that in RAM). The source files are
fsynced and evicted from the page cache (posix_fadvise DONTNEED) before converting, so the input is
read from disk. The converter runs as a subprocess (`python -m replayjax.cli convert --json`);
its own summary gives the conversion time (after imports) and its peak RSS (ru_maxrss), checked
against the parent's RUSAGE_CHILDREN. Everything is deleted afterwards unless --keep.

    PYTHONPATH=. python scripts/bench_convert.py --dir /tmp --size-gb 4.2 --shards 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
INDEX_NAME = "model.safetensors.index.json"
D, V, H, P, N, G, K = 4096, 131072, 128, 64, 128, 8, 4
DI = H * P
CONV = DI + 2 * G * N


def config(layers: int) -> dict:
    return {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "vocab_size": V, "hidden_size": D, "layers_block_type": ["mamba"] * layers,
        "num_hidden_layers": layers, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
        "mamba_num_heads": H, "mamba_head_dim": P, "n_groups": G, "ssm_state_size": N,
        "conv_kernel": K, "use_conv_bias": True, "use_bias": False, "chunk_size": 128,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 21504, "dtype": "bfloat16",
    }


def tensor_list(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    out = [("backbone.embeddings.weight", (V, D))]
    for i in range(layers):
        p = f"backbone.layers.{i}"
        out += [(f"{p}.norm.weight", (D,)),
                (f"{p}.mixer.in_proj.weight", (2 * DI + 2 * G * N + H, D)),
                (f"{p}.mixer.conv1d.weight", (CONV, 1, K)), (f"{p}.mixer.conv1d.bias", (CONV,)),
                (f"{p}.mixer.dt_bias", (H,)), (f"{p}.mixer.A_log", (H,)), (f"{p}.mixer.D", (H,)),
                (f"{p}.mixer.norm.weight", (DI,)), (f"{p}.mixer.out_proj.weight", (D, DI))]
    out += [("backbone.norm_f.weight", (D,)), ("lm_head.weight", (V, D))]
    return out


def encode_header(entries) -> bytes:
    """The 8-byte length + JSON header (padded to 8 bytes) of a safetensors file holding bf16
    tensors `entries` = [(name, shape)] back to back in that order; the data is streamed after it
    (safetensors' own writers need every tensor in memory)."""
    header, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in entries:
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [pos, pos + nbytes(shape)]}
        pos += nbytes(shape)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob


def nbytes(shape) -> int:
    return math.prod(shape) * BF16.itemsize


def layers_for(size_gb: float) -> int:
    fixed = nbytes((V, D)) * 2
    per = sum(nbytes(s) for _, s in tensor_list(1)) - fixed
    return max(1, math.ceil((size_gb * 1e9 - fixed) / per))


def write_checkpoint(directory: str, layers: int, shards: int, seed: int = 0) -> list[str]:
    """Shards of about equal size + index; random finite bf16 (|x| < 2) in 64 MB chunks."""
    tensors = tensor_list(layers)
    total = sum(nbytes(s) for _, s in tensors)
    groups: list[list] = [[] for _ in range(shards)]
    acc = 0
    for name, shape in tensors:
        groups[min(shards - 1, acc * shards // total)].append((name, shape))
        acc += nbytes(shape)
    rng = np.random.default_rng(seed)
    chunk = 32 << 20                                   # elements (64 MB of bf16)
    files, weight_map = [], {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        path = os.path.join(directory, fname)
        head = encode_header(group)
        with open(path, "wb") as f:
            f.write(head)
            for name, shape in group:
                left = math.prod(shape)
                while left:
                    n = min(left, chunk)
                    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16) & np.uint16(0xBFFF)
                    f.write(bits.tobytes())
                    left -= n
                weight_map[name] = fname
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
    with open(os.path.join(directory, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config(layers), f, indent=2)
    return files


def evict(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp", help="where to create the work directory")
    ap.add_argument("--size-gb", type=float, default=4.2, help="checkpoint size (>= 4)")
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--warm", action="store_true",
                    help="do not evict the input from the page cache")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="bench_convert-", dir=args.dir)
    hf, out = os.path.join(work, "hf"), os.path.join(work, "out")
    os.mkdir(hf)
    try:
        layers = layers_for(args.size_gb)
        t0 = time.monotonic()
        files = write_checkpoint(hf, layers, args.shards)
        gen_s = time.monotonic() - t0
        in_bytes = sum(os.path.getsize(f) for f in files)
        largest = max(nbytes(s) for _, s in tensor_list(layers))
        if not args.warm:
            evict(files)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
             os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "replayjax.cli", "convert", hf, out, "--json",
               "--dtype", args.dtype]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        s = json.loads(proc.stdout)
        child_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        res = {
            "input_gb": round(in_bytes / 1e9, 3), "shards": args.shards, "layers": layers,
            "tensors": s["tensors"], "largest_tensor_mb": round(largest / 1e6, 1),
            "output_gb": round(du(out) / 1e9, 3), "dtype": args.dtype,
            "cache": "warm" if args.warm else "cold (posix_fadvise DONTNEED)",
            "convert_s": s["seconds"], "mb_per_s": s["mb_per_s"],
            "wall_s_incl_startup": round(wall, 2),
            "mb_per_s_incl_startup": round(in_bytes / 1e6 / wall, 1),
            "peak_rss_mb": s["peak_rss_mb"], "rss_after_imports_mb": s["rss_before_mb"],
            "rss_children_mb": round(child_rss_mb, 1), "generate_s": round(gen_s, 1),
            "cpus": os.cpu_count(),
            "command": " ".join(cmd[1:3] + ["convert", "HF", "OUT", "--json",
                                            "--dtype", args.dtype]),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
