"""Prints the HLO behind kernels of a profile trace: every instruction whose kernel name matches
a pattern, with the computations it calls (its fused body), from the HloProtos the trace holds.
For a kernel `replayjax profile` lists with no source (an instruction XLA made, carrying no
op_name): its operand and result shapes say what it moves.

    python scripts/hlo_of.py TRACE_DIR 'wrapped_concatenate.*'
"""

from __future__ import annotations

import argparse
import re

from replayjax.bench.trace import hlo_modules, kernel_name, xplane_file


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir")
    ap.add_argument("pattern", help="regular expression over kernel names (fusion_12, ...)")
    args = ap.parse_args(argv)
    pat = re.compile(args.pattern)
    for key, text in hlo_modules(xplane_file(args.trace_dir)).items():
        comps = dict(re.findall(r"(?ms)^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)^\}", text))
        for line in text.splitlines():
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
            if not m or not pat.fullmatch(kernel_name(m.group(1))):
                continue
            print(f"== {key}: {line.strip()[:600]}")
            for c in re.findall(r"calls=%?([\w.\-]+)", line):
                print(f"   -- {c}:\n" + "\n".join(f"      {x.strip()[:300]}"
                                                 for x in comps.get(c, "").splitlines()[:30]))


if __name__ == "__main__":
    main()
