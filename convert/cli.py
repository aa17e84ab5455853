"""`replayjax convert HF_DIR OUT_DIR [--dtype bfloat16|float32] [--overwrite] [--json] [--sha256]`.

Exit status: 0 converted, 1 refused or failed (one-line message on stderr; with --json also
``{"ok": false, "error": ...}`` on stdout), 2 bad arguments, 130 interrupted. Nothing is left
behind on failure: neither OUT_DIR nor the temporary directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

USAGE_EPILOG = """\
Output: OUT_DIR/{config.json, convert.json, params/} (orbax). Load it with
  from convert import load; cfg, model = load(OUT_DIR, mesh=None, dtype=None)
"""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="replayjax convert", epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert a Hugging Face checkpoint (config.json + model.safetensors or a sharded "
                    "index) of Nemotron-H / Nemotron-3 / Qwen3-Next / Qwen3.5 into an orbax "
                    "checkpoint, streaming one tensor at a time.")
    ap.add_argument("hf_dir", metavar="HF_DIR", help="Hugging Face checkpoint directory")
    ap.add_argument("out_dir", metavar="OUT_DIR", help="output directory (must not exist)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="param dtype (default: bfloat16 if the checkpoint is mostly 16-bit, "
                         "else float32); norms, A_log, D, dt_bias and routers stay float32")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    ap.add_argument("--json", action="store_true",
                    help="no progress bar; print a JSON summary on stdout")
    ap.add_argument("--sha256", action="store_true",
                    help="record sha256 of every source file in convert.json (reads the input "
                         "twice); default: size and mtime")
    ap.add_argument("--block-mb", type=int, default=8,
                    help="write block / zarr chunk size in MiB (default 8)")
    return ap


def _summary_text(s: dict) -> str:
    gb = s["bytes_read"] / 1e9
    return (f"converted {s['model_type']} ({s['files']} file(s), {s['tensors']} tensors, "
            f"{gb:.2f} GB) to {s['out_dir']} as {s['dtype']}{' with MTP' if s['mtp'] else ''} "
            f"in {s['seconds']:.1f} s ({s['mb_per_s']:.0f} MB/s, peak RSS {s['peak_rss_mb']:.0f} MB)")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("absl").setLevel(logging.CRITICAL)   # orbax logs the writer's errors again
    from convert.converter import convert
    from convert.errors import ConvertError

    def on_term(signum, frame):
        raise KeyboardInterrupt()

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:              # not the main thread
        old = None
    try:
        summary = convert(args.hf_dir, args.out_dir, dtype=args.dtype, overwrite=args.overwrite,
                          progress=(not args.json) and sys.stderr.isatty(), sha256=args.sha256,
                          block_bytes=max(1, args.block_mb) << 20)
    except ConvertError as e:
        return _fail(str(e), args.json, 1)
    except KeyboardInterrupt:
        return _fail("interrupted; nothing was written", args.json, 130)
    except Exception as e:          # a bug: still one line, still non-zero
        return _fail(f"internal error: {type(e).__name__}: {' '.join(str(e).split())}", args.json, 1)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if args.json:
        print(json.dumps(summary))
    else:
        for note in summary["notes"]:
            print(f"note: {note}", file=sys.stderr)
        print(_summary_text(summary))
    return 0


def _fail(msg: str, as_json: bool, code: int) -> int:
    print(f"replayjax convert: error: {msg}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "error": msg}))
    return code


if __name__ == "__main__":
    sys.exit(main())
