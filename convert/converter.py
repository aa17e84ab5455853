"""`convert(hf_dir, out_dir)`: a Hugging Face checkpoint directory -> our orbax checkpoint.

Output directory layout:

    OUT_DIR/config.json     our parsed config (`models.config` `to_dict()`;
                            `config_from_dict` reads it)
    OUT_DIR/convert.json    provenance: converter version, source files (size + mtime, or sha256),
                            dtype, family, MTP, skipped tensors, notes, statistics
    OUT_DIR/params/         orbax checkpoint (OCDBT + zarr) of the model's pure-dict state
    OUT_DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json,
            generation_config.json, chat_template.jinja   copied as-is when the source has them

Everything is written into a hidden temporary directory next to OUT_DIR (`.OUT_DIR.tmp-*`),
fsynced and renamed into place only when complete; on any error or interrupt (SIGINT / SIGTERM
stop the writer at its next block) the temporary directory is removed. All checks
(config, headers, names, shapes, dtypes, disk space) run before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import resource
import shutil
import signal
import tempfile
import threading
import time

import numpy as np

from convert.errors import Cancelled, ConvertError
from convert.plan import model_dtype, plan
from convert.progress import Progress
from convert.safetensors_io import INDEX_NAME, Reader
from convert.table import chunk_shape, param_blocks, path_str

CONVERTER_VERSION = "0.1.0"
FORMAT = 1
BLOCK_BYTES = 8 << 20
PARAMS_DIR, CONFIG_NAME, META_NAME = "params", "config.json", "convert.json"
# files a generator needs next to the weights (text prompts, stop ids): carried over verbatim
CARRIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "chat_template.jinja")


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # KiB on Linux


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _os_error(e: OSError, where: str) -> ConvertError:
    if e.errno == errno.ENOSPC or "No space left" in str(e):
        return ConvertError(f"disk full while writing {where}: no space left on device")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ConvertError(f"cannot write {where}: {e.strerror}")
    return ConvertError(f"error while writing {where}: {e.strerror or e}")


def _check_paths(hf_dir: str, out_dir: str, overwrite: bool) -> None:
    if os.path.lexists(out_dir) and not overwrite:
        raise ConvertError(f"{out_dir} already exists (use --overwrite to replace it)")
    real_in, real_out = os.path.realpath(hf_dir), os.path.realpath(out_dir)
    if real_out == real_in or real_in.startswith(real_out + os.sep):
        raise ConvertError(f"{out_dir} would replace the input directory {hf_dir}")
    # --overwrite replaces an earlier output, never a directory of something else
    if os.path.lexists(out_dir) and not (
            os.path.isdir(out_dir) and (not os.listdir(out_dir)
                                        or os.path.isfile(os.path.join(out_dir, META_NAME)))):
        raise ConvertError(f"{out_dir} exists and is not a converted checkpoint (no {META_NAME}):"
                           f" --overwrite replaces only those; remove it or choose another "
                           f"output directory")
    parent = os.path.dirname(out_dir)
    if not os.path.isdir(parent):
        raise ConvertError(f"cannot write {out_dir}: parent directory {parent} does not exist")


def _nest(flat: dict) -> dict:
    tree: dict = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def convert(hf_dir, out_dir, *, dtype: str | None = None, overwrite: bool = False,
            progress: bool = False, sha256: bool = False, block_bytes: int = BLOCK_BYTES,
            cancel: threading.Event | None = None) -> dict:
    """Convert `hf_dir` (config.json + safetensors) into `out_dir`; returns a summary dict.

    dtype: "bfloat16" | "float32" | None (None: bfloat16 if the checkpoint is mostly 16-bit).
    Params that the model keeps in fp32 (norms, A_log, D, dt_bias, MoE router) stay fp32.
    Raises ConvertError (one-line message) on any problem, leaving nothing behind."""
    import jax  # noqa: F401  (imported before the RSS baseline is taken)
    import orbax.checkpoint  # noqa: F401

    t_start = time.monotonic()
    rss_before = _maxrss_mb()
    out_dir = os.path.abspath(os.path.normpath(os.fspath(out_dir)))
    p = plan(hf_dir, dtype=model_dtype(dtype))
    _check_paths(p.hf_dir, out_dir, overwrite)
    hf_dir, cfg, ck, table, targets = p.hf_dir, p.cfg, p.checkpoint, p.table, p.targets
    dtype_name, mtp, notes, skipped = p.dtype.name, p.mtp, p.notes, p.skipped

    sizes = {n: ck.tensors[n].nbytes for n in table.sources}
    in_bytes = sum(sizes.values())
    out_bytes = sum(math.prod(s) * np.dtype(d).itemsize for s, d in targets.values())
    parent = os.path.dirname(out_dir)
    free = shutil.disk_usage(parent).free
    need = out_bytes + (64 << 20)
    if free < need:
        raise ConvertError(f"not enough disk space in {parent}: the checkpoint needs "
                           f"{need / 1e9:.2f} GB, {free / 1e9:.2f} GB free")

    files = []
    for sf in ck.files:
        entry = {"name": sf.name, "size": sf.size}
        if sha256:
            entry["sha256"] = _sha256(sf.path)
        else:
            entry["mtime"] = sf.mtime
        files.append(entry)
    small = {"config.json": _sha256(os.path.join(hf_dir, "config.json"))}
    carried = [n for n in CARRIED_FILES if os.path.isfile(os.path.join(hf_dir, n))]
    small.update({n: _sha256(os.path.join(hf_dir, n)) for n in carried})
    if ck.index:
        small[INDEX_NAME] = _sha256(ck.index)

    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)          # mkdtemp makes it 0700; OUT_DIR is a normal dir
    except OSError as e:
        raise _os_error(e, out_dir) from None

    cancel = cancel or threading.Event()
    prog = Progress(sizes, progress)
    reader = Reader(on_read=prog.update)
    from convert.writer import PendingParam, save_params

    pending = {}           # the writer takes them in `read_order`: mostly sequential reads
    for rule in table.rules:
        shape, dt = targets[rule.path]
        chunks = chunk_shape(rule, shape, dt, block_bytes)
        pending[rule.path] = PendingParam(
            path_str(rule.path), shape, dt, chunks, p.read_order(rule),
            lambda r=rule, s=shape, d=dt, c=chunks: param_blocks(r, s, d, ck.tensors, reader, c,
                                                                 cancel.is_set))
    signalled: list[int] = []
    threads_before = set(threading.enumerate())
    try:
        try:
            with open(os.path.join(tmp, CONFIG_NAME), "w", encoding="utf-8") as f:
                json.dump(cfg.to_dict(), f, indent=2)
            for name in carried:
                shutil.copyfile(os.path.join(hf_dir, name), os.path.join(tmp, name))
            with _signals_cancel(cancel, signalled):
                save_params(os.path.join(tmp, PARAMS_DIR), _nest(pending))
            if signalled:
                raise KeyboardInterrupt()
        finally:
            reader.close()
            prog.close()
        seconds = time.monotonic() - t_start
        summary = {
            "ok": True, "out_dir": out_dir, "hf_dir": hf_dir, "model_type": p.model_type,
            "family": cfg.family, "dtype": dtype_name, "mtp": mtp,
            "files": len(ck.files), "tensors": len(table.sources), "params": len(table.rules),
            "bytes_read": in_bytes, "bytes_written": out_bytes,
            "largest_tensor_bytes": max(sizes.values()),
            "largest_param_bytes": max(math.prod(s) * np.dtype(d).itemsize
                                       for s, d in targets.values()),
            "seconds": round(seconds, 3), "mb_per_s": round(in_bytes / 1e6 / max(seconds, 1e-9), 1),
            "rss_before_mb": round(rss_before, 1), "peak_rss_mb": round(_maxrss_mb(), 1),
            "skipped": skipped, "notes": notes,
        }
        meta = {
            "format": FORMAT, "converter": "replayjax convert",
            "converter_version": CONVERTER_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": {"dir": hf_dir, "model_type": p.model_type, "files": files, "sha256": small,
                       "file_hash": "sha256" if sha256 else "size+mtime"},
            "family": cfg.family, "config_class": type(cfg).__name__, "dtype": dtype_name,
            "mtp": mtp, "params_dir": PARAMS_DIR,
            "stats": {k: summary[k] for k in ("tensors", "params", "bytes_read", "bytes_written",
                                              "seconds", "peak_rss_mb")},
            "skipped": skipped, "notes": notes,
        }
        with open(os.path.join(tmp, META_NAME), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        _fsync_tree(tmp)               # on disk before it gets its final name
        _move_into_place(tmp, out_dir, overwrite)
        _fsync_dir(parent)
        return summary
    except BaseException as e:
        cancel.set()
        # Let the writer thread (stops at its next block) and orbax's metadata / commit threads
        # finish before deleting the files they write.
        deadline = time.monotonic() + 60
        for t in set(threading.enumerate()) - threads_before:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for _ in range(5):
            _remove(tmp)
            if not os.path.lexists(tmp):
                break
            time.sleep(0.1)
        if isinstance(e, (ConvertError, KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(e, Cancelled):
            if signalled:
                raise KeyboardInterrupt() from None
            raise ConvertError("conversion cancelled; nothing was written") from None
        if isinstance(e, OSError):
            raise _os_error(e, out_dir) from None
        if "No space left" in str(e):
            raise ConvertError(f"disk full while writing {out_dir}: "
                               "no space left on device") from None
        raise


@contextlib.contextmanager
def _signals_cancel(cancel: threading.Event, signalled: list):
    """While orbax saves, SIGINT / SIGTERM set `cancel` (the writer thread stops at its next
    block) instead of raising: orbax waits for its writer inside `asyncio.run`, whose own SIGINT
    handling would only take effect after the whole save."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signalled.append(signum)
        cancel.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    for dirpath, _, names in os.walk(root):
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)


def _move_into_place(tmp: str, out_dir: str, overwrite: bool) -> None:
    if os.path.lexists(out_dir):
        if not overwrite:
            raise ConvertError(f"{out_dir} already exists (use --overwrite to replace it)")
        old = tmp + ".old"
        os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            os.rename(old, out_dir)
            raise
        _remove(old)
    else:
        os.rename(tmp, out_dir)
