#!/usr/bin/env bash
# On a lent GPU machine, carrying .gpu (made by benchmarks/gpu/gpu_pack.sh): bash .gpu/run.sh [bench_gpu.py options]
# (TESTS_S=0 skips step 1; the big models: bash .gpu/run.sh --parts big)
# 1. the GPU-marked tests (CUDA route = NumPy route; one card per job on the real cards; the variants
#    proven on the card give the host's verdicts), at most TESTS_S s;
# 2. the pack's benchmarks/bench_gpu.py on the packed sentences and model, at most BENCH_S s. gpu.json is written
#    after every measurement, so a part cut short by the limit keeps what it measured.
# Everything lands in $OUT (the device tool's folder; else .gpu/out): gpu.json, bench.log, pytest.log.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$HERE/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ENCMAP_CACHE=$(mktemp -d)
export ENCMAP_CACHE
{ nvidia-smi 2>&1 || echo "no nvidia-smi"; } > "$OUT/nvidia-smi.txt"
if [ "${TESTS_S:-150}" != 0 ]; then  # TESTS_S=0: the benchmark alone (a rerun's minutes)
  (cd "$HERE" && timeout -k 5 "${TESTS_S:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
     tests/test_pairs.py tests/test_device.py tests/test_running_checks.py) > "$OUT/pytest.log" 2>&1
  echo "gpu tests: rc=$?" >> "$OUT/pytest.log"
  tail -n 4 "$OUT/pytest.log"
fi
timeout -k 5 "${BENCH_S:-420}" "$PY" "$HERE/benchmarks/bench_gpu.py" --sentences "$HERE/data/sentences.txt" \
  --minilm "$HERE/models/minilm-l6" --out "$OUT/gpu.json" "$@" > "$OUT/bench.log" 2>&1
rc=$?
echo "bench_gpu: rc=$rc" >> "$OUT/bench.log"
grep -v "^embed \|it/s\]" "$OUT/bench.log" | tail -n 30
exit $rc
