#!/usr/bin/env bash
# One GPU machine, one call: the suite on CUDA, replay determinism, compute-sanitizer on the final kernels, then
# every kernel timed beside its peers and the read floor (the bench stops starting rows after its budget).
# Usage (on the GPU machine, repo root, $OUT set by the device tool; the checkout travels without .git):
#   INT4LAB_GIT_COMMIT=<sha> bash lab/gpu_run.sh [--with-sweep] [--with-pack]
# Give the sha literally (computed on this side: the GPU copy may carry a stale .git whose HEAD is wrong).
#   STAGES=checks bash lab/gpu_run.sh   then   STAGES=bench bash ...   (two calls of < 10 minutes)
#   TESTS_K="moe or gemv": the checks stage runs only those tests of tests/test_kernels.py (a shorter call)
#   STAGES=grouped,quick: the grouped MoE sweep (lab.tune.sweep --grouped) and a quick bench, a probe call
#   (GROUPED_TOKENS="4 16 64" limits the sweep's batches; GROUPED_BUDGET_S its seconds)
# Writes under $OUT: cuda_tests_h200.txt, replay_check.json, sanitizer_h200.txt, decode_h200.json (with the
# replay and sanitizer results attached), and kernel_sweep_dp4a.json / gptq_pack_h200.json when asked.
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Carried wheels (git-ignored): gemlite for the peer column.
wheels=$(ls .whl/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels || echo "wheel install failed"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
STAGES=${STAGES:-checks,bench}
if [[ $STAGES == *checks* ]]; then
echo "== 1. test suite on CUDA (the GPU-relevant files; lm-eval is not on the image)"
if [ -n "${TESTS_K:-}" ]; then   # a subset of tests/test_kernels.py (pytest -k), for a shorter call
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "$TESTS_K" 2>&1 \
    | tee "$OUT/cuda_tests_h200.txt" | tail -6
else
  timeout 230 python3 -m pytest -q -m "not notebook" -p no:cacheprovider tests/test_kernels.py \
    tests/test_w4a16_cutlass.py tests/test_format.py tests/test_bench.py 2>&1 | tee "$OUT/cuda_tests_h200.txt" | tail -6
fi
echo "== 2. 100 graph replays bit-identical, counters zero ($(( $(date +%s) - t0 )) s in)"
timeout 90 python3 -m lab.tune.replay_check --out "$OUT/replay_check.json" | tail -3
echo "== 3. compute-sanitizer memcheck + racecheck on the final kernels, small shapes ($(( $(date +%s) - t0 )) s in)"
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m lab.tune.replay_check --small \
    --replays 2 --out /tmp/san_$tool.json > /tmp/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_$tool.log | tail -1)" | tee -a "$OUT/sanitizer_h200.txt"
done
fi
if [ "${1:-}" = "--with-sweep" ]; then
  echo "== 3b. dp4a plan sweep ($(( $(date +%s) - t0 )) s in)"
  timeout 150 python3 -m lab.tune.sweep --kinds dp4a --no-moe --budget-s 120 --full 3 \
    --out "$OUT/kernel_sweep_dp4a.json"
  shift
fi
if [[ $STAGES == *grouped* ]]; then
  echo "== 3c. grouped MoE sweep: routed path vs grouped variants per (model, tokens) ($(( $(date +%s) - t0 )) s in)"
  timeout $(( ${GROUPED_BUDGET_S:-200} + 90 )) python3 -m lab.tune.sweep --grouped --budget-s ${GROUPED_BUDGET_S:-200} \
    --replays 20 ${GROUPED_TOKENS:+--tokens $GROUPED_TOKENS} --out "$OUT/grouped_sweep_h200.json"
fi
if [[ $STAGES == *quick* ]]; then
  echo "== 3d. quick bench (two GEMV shapes, Qwen3 MoE at 1 and 8 tokens) ($(( $(date +%s) - t0 )) s in)"
  timeout 150 python3 -m lab.bench --quick --out "$OUT/decode_quick_h200.json" | tail -12
fi
if [[ $STAGES == *bench* ]]; then
echo "== 4. side-by-side benchmark, committed plan table ($(( $(date +%s) - t0 )) s in)"
timeout 330 python3 -m lab.bench --budget-s ${BENCH_BUDGET_S:-270} --out "$OUT/decode_h200.json"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rec = json.load(open(f"{out}/decode_h200.json"))
import os
if os.path.exists(f"{out}/replay_check.json"):
    rec["replay_check"] = json.load(open(f"{out}/replay_check.json"))
if os.path.exists(f"{out}/sanitizer_h200.txt"):
    rec["sanitizer"] = open(f"{out}/sanitizer_h200.txt").read().strip().splitlines()
json.dump(rec, open(f"{out}/decode_h200.json", "w"), indent=1)
print("attached replay_check and sanitizer (where present) to decode_h200.json")
PY
fi
if [ "${1:-}" = "--with-pack" ]; then
  echo "== 5. GPTQ pack time ($(( $(date +%s) - t0 )) s in)"
  timeout 45 python3 -m lab.bench_pack --device cuda 2>&1 | tail -5
  cp data/receipts/gptq_pack_h200.json "$OUT/" 2>/dev/null || echo "no gptq_pack_h200.json written"
fi
echo "== done in $(( $(date +%s) - t0 )) s"
