#!/usr/bin/env bash
# One lent-GPU session: pick the dp4a GEMV plan, time everything beside the peers, run the suite on CUDA.
# Usage (on the GPU machine, repo root, $OUT set by the device tool):
#   INT4LAB_GIT_COMMIT=<sha> bash scripts/h200_session.sh
# Writes under $OUT: kernel_sweep_dp4a.json, decode_h200.json, cuda_tests_h200.txt, gptq_pack_h200.json.
set -uo pipefail
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Carried wheels (git-ignored): gemlite for the peer column; transformers at the pinned version.
wheels=$(ls .whl/*.whl .carry/whl/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels || echo "wheel install failed"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
echo "== 1. dp4a plan sweep (dense shapes, time-boxed)"
timeout 120 python3 -m int4lab.kernels.sweep --kinds dp4a --no-moe --budget-s 85 --full 3 \
  --out "$OUT/kernel_sweep_dp4a.json"
PLAN=$(python3 -m int4lab.kernels.sweep --pick --out "$OUT/kernel_sweep_dp4a.json" 2>/dev/null | tail -1)
if [ -n "$PLAN" ] && [ "$PLAN" != "null" ]; then export INT4LAB_GEMV_PLAN="$PLAN"; fi
echo "INT4LAB_GEMV_PLAN=${INT4LAB_GEMV_PLAN:-<table>}" | tee "$OUT/plan.txt"
echo "== 2. side-by-side benchmark ($(( $(date +%s) - t0 )) s in)"
timeout 240 python3 -m int4lab.bench --out "$OUT/decode_h200.json"
echo "== 3. test suite on CUDA ($(( $(date +%s) - t0 )) s in)"
timeout 120 python3 -m pytest -q -m "not notebook" -p no:cacheprovider tests/test_kernels.py \
  tests/test_w4a16_cutlass.py tests/test_cutlass_layout.py tests/test_format.py tests/test_gptq.py \
  tests/test_quantize.py 2>&1 | tee "$OUT/cuda_tests_h200.txt" | tail -25
echo "== 4. GPTQ pack time ($(( $(date +%s) - t0 )) s in)"
timeout 45 python3 -m int4lab.bench_pack --device cuda 2>&1 | tail -5
cp data/receipts/gptq_pack_h200.json "$OUT/" 2>/dev/null || echo "no gptq_pack_h200.json written"
echo "== done in $(( $(date +%s) - t0 )) s"
