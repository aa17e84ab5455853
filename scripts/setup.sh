#!/usr/bin/env bash
# Creates .venv with Python >= 3.12 and installs replayjax with its test extras.
# JAX 0.11.2 needs Python >= 3.12; this finds one even when `python3` is older.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local cands=(python3.13 python3.12 python3)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    for v in "$root"/versions/3.13* "$root"/versions/3.12*; do
      [ -x "$v/bin/python3" ] && cands+=("$v/bin/python3")
    done
  fi
  for p in "${cands[@]}"; do
    if command -v "$p" >/dev/null 2>&1 &&
       "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  return 1
}

PY=${PYTHON:-$(find_python || true)}
if [ -z "$PY" ]; then
  echo "setup.sh: no Python >= 3.12 found (tried python3.13, python3.12, python3, pyenv versions)." >&2
  echo "          JAX 0.11.2 needs Python >= 3.12: install one, or set PYTHON=/path/to/python3.12." >&2
  exit 1
fi
echo "setup.sh: using $PY ($("$PY" --version))"
"$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/python -c 'import jax, flax, orbax.checkpoint; print("setup.sh: jax", jax.__version__, "flax", flax.__version__)'
