#!/usr/bin/env bash
# GPU: time a list of tilings at batch 256 (staggered replay, the headline), then the full table
# with the best one of each kernel.
# Usage: scripts/tune_then_table.sh FAMILY OUT_PREFIX 'JSON_LIST_OF_CONFIGS' [bench args...]
set -euo pipefail
fam=$1 out=$2 configs=$3; shift 3
python3 -m replayjax.bench.kernels --family "$fam" --batches 256 --tune "$configs" \
  --json "$out.tune.json" "$@" 2>>"$out.log"
best() { python3 -c "import json,sys; r=json.load(open('$out.tune.json'));
print(json.dumps(min(r, key=lambda x: x[sys.argv[1]])[sys.argv[2]]))" "$1" "$2"; }
std=$(best standard_us std_config) rep=$(best staggered_us config)
echo "best standard tiling: $std; best replay tiling: $rep"
python3 -m replayjax.bench.kernels --family "$fam" --std-config "$std" --replay-config "$rep" \
  --json "$out.json" "$@" 2>>"$out.log"
