#!/usr/bin/env bash
# On a lent GPU machine, carrying a pack made with GPU_PACK_WORKFLOW=1 bash benchmarks/gpu/gpu_pack.sh:
#   bash .gpu-workflow/workflow.sh [gpu_workflow.py options]
# unpacks Snakemake's wheels (those the machine's Python lacks) into a temporary folder, then runs
# the pack's benchmarks/gpu_workflow.py: one real `snakemake --cores all` of a tiny project on the GPU route
# and one on the CPU route, compared within its tolerances. $OUT/workflow.json, $OUT/workflow.log.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=$(mktemp -d)
"$PY" "$HERE/wheels/gpu_wheels.py" unpack "$HERE/wheels" "$SITE" > "$OUT/workflow.log" 2>&1 || { cat "$OUT/workflow.log"; exit 2; }
export PYTHONPATH="$HERE/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ENCMAP_CACHE=$(mktemp -d)
export ENCMAP_CACHE
timeout -k 5 "${WORKFLOW_S:-420}" "$PY" "$HERE/benchmarks/gpu_workflow.py" --pack "$HERE" --out "$OUT/workflow.json" \
  "$@" >> "$OUT/workflow.log" 2>&1
rc=$?
echo "gpu_workflow: rc=$rc" >> "$OUT/workflow.log"
tail -n 8 "$OUT/workflow.log"
exit $rc
