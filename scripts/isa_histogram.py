"""Opcode histogram of the kernels in dumped PTX / SASS files (what a kernel spends its issue
slots on, beside Nsight Compute's "instructions per element"):

    MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=/tmp/d python3 ...    # a Mosaic GPU kernel's PTX
    python3 scripts/isa_histogram.py /tmp/d/*.ptx --top 30

(MOSAIC_GPU_DUMP_SASS=1 dumps SASS where nvdisasm is installed; the H200 image has none.)

Counts static instructions (the code's lines, not executed ones), by opcode without modifiers
("FFMA", "ld"); loops are where the executed count diverges, so read it with the source.
"""

from __future__ import annotations

import argparse
import collections
import re

SASS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
PTX = re.compile(r"^\s+(?:@%?!?\w+\s+)?([a-z][a-z0-9_]*)[.\s]")


def histogram(text: str) -> collections.Counter:
    sass = SASS.findall(text)
    if sass:
        return collections.Counter(sass)
    return collections.Counter(m[1] for line in text.splitlines() if (m := PTX.match(line)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="dumped PTX / SASS files (none: says so)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if not args.files:
        print("no dumped files matched")
    for f in args.files:
        counts = histogram(open(f, errors="replace").read())
        total = sum(counts.values())
        print(f"== {f}: {total} instructions")
        print("  " + ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top)))


if __name__ == "__main__":
    main()
