#!/usr/bin/env bash
# The GPU study on a machine whose python3 has torch with CUDA but no package index (a lent GPU machine):
# installs .gpu-wheels (made by `make gpu-wheels` where an index is reachable) into a private folder, puts it and
# this repo on PYTHONPATH (nothing is installed into the image's environment) and runs
#   python3 -m benchmarks --gpu --study --out ${STUDY_OUT:-docs} "$@"
# e.g. scripts/gpu-study.sh --budget 420, or --only d12_peer,host_syncs to re-run steps (the other rows of
# <out>/gpu.json are kept). docs/DEVELOPMENT.md ("The GPU study") has the whole procedure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${GPTLAB_GPU_SITE:-/tmp/gptlab-gpu-site}
if [ -d .gpu-wheels ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu-wheels/*.whl
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m benchmarks --gpu --study --out "${STUDY_OUT:-docs}" "$@"
