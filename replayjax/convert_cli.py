"""`replayjax convert`: a Hugging Face checkpoint -> an orbax checkpoint, streaming.

Exit status: 0 converted, 1 refused or failed (one line on stderr; with --json also
``{"ok": false, "error": ...}`` on stdout), 2 bad arguments, 130 interrupted. Nothing is left
behind on failure: neither OUT_DIR nor the temporary directory.
"""

from __future__ import annotations

import json
import logging
import signal
import sys

from replayjax import commandline as cli

PROG = "replayjax convert"
DESCRIPTION = """\
Convert a Hugging Face checkpoint (config.json + model.safetensors or a sharded index) of
Nemotron-H / Nemotron-3 / Qwen3-Next / Qwen3.5 into an orbax checkpoint, streaming one tensor at a
time (the host never holds the whole model). tokenizer.json and generation_config.json are
carried over, so `replayjax generate --model OUT_DIR` works on the result.

Output: OUT_DIR/{config.json, convert.json, params/}. Load it from Python with
  from convert import load; cfg, model = load(OUT_DIR, mesh=None, dtype=None)"""


def build_parser():
    ap = cli.parser(PROG, DESCRIPTION, [
        f"{PROG} hf/Nemotron-H-8B-Base-8K ckpt/nemotron-h-8b",
        f"{PROG} hf/Qwen3.5-9B ckpt/qwen3.5-9b --dtype float32 --sha256",
        f"{PROG} hf/tiny ckpt/tiny --overwrite --json"])
    ap.add_argument("hf_dir", metavar="HF_DIR", type=cli.nonempty,
                    help="Hugging Face checkpoint directory")
    ap.add_argument("out_dir", metavar="OUT_DIR", type=cli.nonempty,
                    help="output directory; must not exist unless --overwrite")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="param dtype (default: bfloat16 if the checkpoint is mostly 16-bit, "
                         "else float32); norms, A_log, D, dt_bias and routers stay float32")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an existing OUT_DIR: an earlier converted checkpoint (with its "
                         "convert.json) or an empty directory")
    ap.add_argument("--json", action="store_true",
                    help="no progress bar; print a JSON summary on stdout")
    ap.add_argument("--sha256", action="store_true",
                    help="record sha256 of every source file in convert.json (reads the input "
                         "twice; default: size and mtime)")
    ap.add_argument("--block-mb", type=cli.in_range(1, 1024), default=8, metavar="MB",
                    help="write block / zarr chunk size in MiB")
    return ap


def _summary_text(s: dict) -> str:
    gb = s["bytes_read"] / 1e9
    return (f"converted {s['model_type']} ({s['files']} file(s), {s['tensors']} tensors, "
            f"{gb:.2f} GB) to {s['out_dir']} as {s['dtype']}{' with MTP' if s['mtp'] else ''} "
            f"in {s['seconds']:.1f} s ({s['mb_per_s']:.0f} MB/s, peak RSS "
            f"{s['peak_rss_mb']:.0f} MB)")


def _convert(args):
    """Runs the conversion (SIGTERM counts as Ctrl-C: the converter cleans up either way)."""
    logging.getLogger("absl").setLevel(logging.CRITICAL)   # orbax logs the writer's errors again
    from convert.converter import convert

    def on_term(signum, frame):
        raise KeyboardInterrupt()

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:              # not the main thread
        old = None
    try:
        summary = convert(args.hf_dir, args.out_dir, dtype=args.dtype, overwrite=args.overwrite,
                          progress=cli.interactive(args), sha256=args.sha256,
                          block_bytes=args.block_mb << 20)
    except KeyboardInterrupt:
        _json_error(args, "interrupted; nothing was written")
        raise KeyboardInterrupt("interrupted; nothing was written") from None
    except Exception as e:
        _json_error(args, cli.one_line(e))
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if args.json:
        print(json.dumps(summary))
    else:
        for note in summary["notes"]:
            print(f"note: {note}", file=sys.stderr)
        print(_summary_text(summary))


def _json_error(args, message):
    """With --json, a failure is also a JSON object on stdout (the line on stderr stays)."""
    if args.json:
        print(json.dumps({"ok": False, "error": message}))


def main(argv=None) -> int:
    return cli.run(PROG, build_parser().parse_args(argv), _convert)


if __name__ == "__main__":
    sys.exit(main())
