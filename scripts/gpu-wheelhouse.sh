#!/usr/bin/env bash
# Build .gpu-wheels/ from scripts/gpu-wheels.txt (pinned; pure-Python wheels, no dependencies pulled in) on a
# machine that reaches a package index, for a GPU machine that does not. `make gpu-wheels` runs it; the result
# travels with the working tree (name .gpu-wheels in the device tool's carry) and scripts/gpu-study.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .gpu-wheels && mkdir .gpu-wheels
grep -v '^\s*#' scripts/gpu-wheels.txt | grep -v '^\s*$' >.gpu-wheels/requirements.txt
"$PY" -m pip wheel -q --no-deps --wheel-dir .gpu-wheels -r .gpu-wheels/requirements.txt
count=$(ls .gpu-wheels/*.whl | wc -l)
want=$(wc -l <.gpu-wheels/requirements.txt)
[ "$count" -eq "$want" ] || { echo "error: built $count wheels for $want pins in scripts/gpu-wheels.txt" >&2; exit 1; }
echo "wrote .gpu-wheels: $count wheels, $(du -sh .gpu-wheels | cut -f1)"
